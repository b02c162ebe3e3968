//! The Local API's decision stream over HTTP/1.1 (hyper), plain or over TLS
//! (rustls, for an `https://` Local API): one connection per pull, so a
//! restarted Local API is met afresh every time.
//!
//! What enters: the Local API's URL, the CA certificates trusted for it
//! (https only), the bouncer key, whether to ask for the whole set
//! (`startup=true`). What leaves: the stream's answer, or why not, in words
//! for the log.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{Request, StatusCode, Uri, body::Bytes};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use tokio::io::{AsyncRead, AsyncWrite};

use super::decision::Stream;

/// How long connecting (and the TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole pull may take: the first one of a Local API with the
/// community blocklist is some 10 MB of JSON.
const PULL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest answer read (some 500 000 decisions).
const MAX_ANSWER: usize = 128 << 20;
/// The CA certificates trusted for an `https://` Local API when
/// `--crowdsec-ca` is not given: the system's (Debian's `ca-certificates`).
pub const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where the Local API is, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lapi {
    /// `HOST:PORT`, to connect to.
    authority: String,
    /// The host alone (no brackets around an IPv6 address), the name TLS
    /// checks the certificate against.
    host: String,
    /// The base path, without its last `/` (empty for `/`).
    base: String,
    /// The URL as the operator gave it, for messages.
    pub url: String,
    /// `https://`: the TLS it is spoken over, once [`Lapi::trusting`] gave
    /// it the CA certificates.
    tls: Option<Tls>,
    /// Whether the URL is `https://`.
    https: bool,
}

/// TLS towards the Local API: a client trusting the given CA certificates.
#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    /// Where the trusted CA certificates were read from, for messages.
    cas: PathBuf,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .field("cas", &self.cas)
            .finish()
    }
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, &self.cas) == (&other.name, &other.cas)
    }
}

impl Eq for Tls {}

impl Lapi {
    /// `HOST:PORT`, as it is connected to.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Reads `url` (`http://127.0.0.1:8080`, `https://lapi.internal:8080/`);
    /// a message says what is wrong with it. An `https://` one needs
    /// [`Lapi::trusting`] before it can be pulled.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| {
            format!(
                "{url:?} is not a URL ({e}); write http://HOST:PORT, like http://127.0.0.1:8080"
            )
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(format!(
                    "{url:?} is not an http:// or https:// URL; write http://HOST:PORT, like http://127.0.0.1:8080"
                ));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url:?} names no host; write http://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "{url:?}: no user or password in the URL; the bouncer key goes in --crowdsec-key-file"
            ));
        }
        let host = authority.host();
        let default_port = if https { 443 } else { 80 };
        Ok(Self {
            authority: format!("{host}:{}", authority.port_u16().unwrap_or(default_port)),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            base: uri.path().trim_end_matches('/').to_string(),
            url: url.to_string(),
            tls: None,
            https,
        })
    }

    /// Whether it is spoken to over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// An `https://` Local API whose certificate must be signed by one of
    /// the CA certificates in `pem` (read from `cas`); a message says what
    /// is wrong with them.
    pub fn trusting(mut self, cas: &Path, pem: &[u8]) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("{}: not PEM certificates: {e}", cas.display()))?;
            // A bundle may hold a certificate webpki cannot use; the others
            // still count.
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            return Err(format!(
                "{} holds no CA certificate (-----BEGIN CERTIFICATE-----); give the PEM file of the CA that signed the Local API's certificate",
                cas.display()
            ));
        }
        let name = ServerName::try_from(self.host.clone()).map_err(|e| {
            format!(
                "{:?}: {:?} is not a name a certificate can be checked against ({e})",
                self.url, self.host
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        self.tls = Some(Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
            cas: cas.to_path_buf(),
        });
        Ok(self)
    }

    /// Pulls the stream: the whole set with `startup`, else what changed
    /// since the last pull of this bouncer key.
    pub async fn pull(&self, key: &str, startup: bool) -> Result<Stream, String> {
        tokio::time::timeout(PULL_TIMEOUT, self.pull_inner(key, startup))
            .await
            .map_err(|_| format!("no whole answer within {} s", PULL_TIMEOUT.as_secs()))?
    }

    async fn pull_inner(&self, key: &str, startup: bool) -> Result<Stream, String> {
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| format!("connecting to {} timed out", self.authority))?
        .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
        let _ = stream.set_nodelay(true);
        match (&self.tls, self.https) {
            (None, false) => self.exchange(stream, key, startup).await,
            (None, true) => Err(format!(
                "{}: no CA certificates to check its certificate with",
                self.url
            )),
            (Some(tls), _) => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tls.connector.connect(tls.name.clone(), stream),
                )
                .await
                .map_err(|_| format!("TLS with {} timed out", self.authority))?
                .map_err(|e| self.tls_failed(tls, &e))?;
                self.exchange(stream, key, startup).await
            }
        }
    }

    /// Why the TLS handshake failed, and what to do when it is the
    /// certificate.
    fn tls_failed(&self, tls: &Tls, e: &std::io::Error) -> String {
        let certificate = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|r| matches!(r, rustls::Error::InvalidCertificate(_)));
        if certificate {
            format!(
                "TLS with {}: {e}; the Local API's certificate must name {:?} and be signed by a CA in {} (--crowdsec-ca)",
                self.authority,
                self.host,
                tls.cas.display()
            )
        } else {
            format!("TLS with {}: {e}", self.authority)
        }
    }

    /// One request on `io`, and its answer read whole.
    async fn exchange<S>(&self, io: S, key: &str, startup: bool) -> Result<Stream, String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP with {}: {e}", self.authority))?;
        let conn = tokio::spawn(conn);
        let path = format!(
            "{}/v1/decisions/stream{}",
            self.base,
            if startup { "?startup=true" } else { "" }
        );
        let request = Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .header("X-Api-Key", key)
            .header(
                hyper::header::USER_AGENT,
                concat!("ratelimit-bouncer/v", env!("CARGO_PKG_VERSION")),
            )
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("building the request: {e}"))?;
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP with {}: {e}", self.authority))?;
        let status = answer.status();
        let body = Limited::new(answer.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        conn.abort();
        match status {
            // Tens of megabytes from a big feed: read off the runtime's
            // threads.
            StatusCode::OK => tokio::task::spawn_blocking(move || serde_json::from_slice(&body))
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .map_err(|e| format!("the answer is not a decision stream ({e})")),
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => Err(format!(
                "the bouncer key was refused ({status}): check --crowdsec-key-file against `cscli bouncers list`"
            )),
            other => Err(format!(
                "answered {other}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let l = Lapi::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (l.authority.as_str(), l.base.as_str(), l.is_https()),
            ("127.0.0.1:8080", "", false)
        );
        let l = Lapi::parse("http://lapi.internal/crowdsec/").unwrap();
        assert_eq!(
            (l.authority.as_str(), l.base.as_str()),
            ("lapi.internal:80", "/crowdsec")
        );
        let l = Lapi::parse("http://[::1]:8080/").unwrap();
        assert_eq!(
            (l.authority.as_str(), l.host.as_str()),
            ("[::1]:8080", "::1")
        );
        let l = Lapi::parse("https://lapi.internal").unwrap();
        assert_eq!(
            (l.authority.as_str(), l.host.as_str(), l.is_https()),
            ("lapi.internal:443", "lapi.internal", true)
        );
        for (bad, says) in [
            ("ftp://127.0.0.1:8080", "not an http:// or https:// URL"),
            ("127.0.0.1:8080", "not an http:// or https:// URL"),
            ("http://user:pw@127.0.0.1:8080", "--crowdsec-key-file"),
            ("http://", "not a URL"),
        ] {
            let e = Lapi::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn an_https_local_api_takes_pem_ca_certificates_only() {
        let l = Lapi::parse("https://127.0.0.1:8443").unwrap();
        let cas = Path::new("/etc/ratelimit/lapi-ca.pem");
        let e = l
            .clone()
            .trusting(cas, b"no certificate here\n")
            .unwrap_err();
        assert!(e.contains("holds no CA certificate"), "{e}");
        let e = l
            .clone()
            .trusting(
                cas,
                b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
            )
            .unwrap_err();
        assert!(e.contains("lapi-ca.pem"), "{e}");
    }
}
