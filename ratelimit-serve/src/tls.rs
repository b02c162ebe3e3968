//! TLS for both listeners (`--tls-cert`, `--tls-key`), with rustls and
//! ring: the certificate chain and its key read from PEM files at start.

use std::{path::Path, sync::Arc};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

use crate::error::{Error, Result};

/// The certificate chain and key as PEM text, what [`server_config`] is
/// built from.
struct Pem {
    /// The chain, leaf first.
    cert: Vec<u8>,
    /// Its private key.
    key: Vec<u8>,
}

/// Each listener's TLS: one identity, offered by ALPN as the listener's own
/// protocol.
pub(super) struct Tls {
    /// The HTTP API's: `http/1.1`.
    pub http: Arc<rustls::ServerConfig>,
    /// The gRPC listener's: `h2` (gRPC clients insist on it).
    pub grpc: Arc<rustls::ServerConfig>,
}

/// Reads `cert` and `key` (PEM) and checks that they make a server's
/// identity.
pub(super) fn read(cert: &Path, key: &Path) -> Result<Tls> {
    let read = |flag: &str, p: &Path| {
        std::fs::read(p)
            .map_err(|e| Error::invalid(flag, format!("cannot read {}: {e}", p.display())))
    };
    let pem = Pem {
        cert: read("--tls-cert", cert)?,
        key: read("--tls-key", key)?,
    };
    let http = server_config(&pem, cert, key)?;
    let mut grpc = http.clone();
    grpc.alpn_protocols = vec![b"h2".to_vec()];
    let mut http = http;
    http.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        http: Arc::new(http),
        grpc: Arc::new(grpc),
    })
}

fn server_config(pem: &Pem, cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::invalid(
                "--tls-cert",
                format!("{}: not a PEM certificate chain: {e}", cert.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(Error::invalid(
            "--tls-cert",
            format!(
                "{} holds no certificate (-----BEGIN CERTIFICATE-----)",
                cert.display()
            ),
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| {
        Error::invalid(
            "--tls-key",
            format!("{}: not a PEM private key: {e}", key.display()),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid("--tls-cert", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| {
            Error::invalid(
                "--tls-key",
                format!("{} does not go with {}: {e}", key.display(), cert.display()),
            )
        })
}
