//! The Local API's decision stream over HTTP/1.1 (hyper): one connection per
//! pull, so a restarted Local API is met afresh every time.
//!
//! What enters: the Local API's URL, the bouncer key, whether to ask for the
//! whole set (`startup=true`). What leaves: the stream's answer, or why not,
//! in words for the log.

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{Request, StatusCode, Uri, body::Bytes};
use hyper_util::rt::TokioIo;

use super::decision::Stream;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole pull may take: the first one of a Local API with the
/// community blocklist is some 10 MB of JSON.
const PULL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest answer read (some 500 000 decisions).
const MAX_ANSWER: usize = 128 << 20;

/// Where the Local API is, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lapi {
    /// `HOST:PORT`, to connect to.
    authority: String,
    /// The base path, without its last `/` (empty for `/`).
    base: String,
    /// The URL as the operator gave it, for messages.
    pub url: String,
}

impl Lapi {
    /// Reads `url` (`http://127.0.0.1:8080`, `http://lapi.internal:8080/`); a
    /// message says what is wrong with it.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| {
            format!(
                "{url:?} is not a URL ({e}); write http://HOST:PORT, like http://127.0.0.1:8080"
            )
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "{url:?}: https is not supported yet; give the Local API's plain http address (it listens on http://127.0.0.1:8080 by default), or reach a remote one through a local TLS tunnel"
                ));
            }
            _ => {
                return Err(format!(
                    "{url:?} is not an http:// URL; write http://HOST:PORT, like http://127.0.0.1:8080"
                ));
            }
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url:?} names no host; write http://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "{url:?}: no user or password in the URL; the bouncer key goes in --crowdsec-key-file"
            ));
        }
        let authority = match authority.port_u16() {
            Some(_) => authority.to_string(),
            None => format!("{}:80", authority.host()),
        };
        Ok(Self {
            authority,
            base: uri.path().trim_end_matches('/').to_string(),
            url: url.to_string(),
        })
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
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
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
            StatusCode::OK => serde_json::from_slice(&body)
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
            (l.authority.as_str(), l.base.as_str()),
            ("127.0.0.1:8080", "")
        );
        let l = Lapi::parse("http://lapi.internal/crowdsec/").unwrap();
        assert_eq!(
            (l.authority.as_str(), l.base.as_str()),
            ("lapi.internal:80", "/crowdsec")
        );
        let l = Lapi::parse("http://[::1]:8080/").unwrap();
        assert_eq!(l.authority, "[::1]:8080");
        for (bad, says) in [
            ("https://127.0.0.1:8080", "https is not supported"),
            ("127.0.0.1:8080", "not an http:// URL"),
            ("http://user:pw@127.0.0.1:8080", "--crowdsec-key-file"),
            ("http://", "not a URL"),
        ] {
            let e = Lapi::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
