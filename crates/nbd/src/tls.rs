//! TLS for NBD_OPT_STARTTLS: an x509 certificate and key in PEM files,
//! as qemu-nbd's `--tls-creds` takes them.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// Whether clients must use TLS before negotiating an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// TLS is offered; plain clients are served too.
    Allow,
    /// Every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT is refused
    /// with NBD_REP_ERR_TLS_REQD until TLS is up.
    Require,
}

/// The server's TLS credentials and mode.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    pub mode: TlsMode,
}

fn invalid(what: &str, path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} {}: {e}", path.display()),
    )
}

impl Tls {
    /// Loads a certificate chain and its private key from PEM files.
    pub fn from_pem_files(cert: &Path, key: &Path, mode: TlsMode) -> io::Result<Tls> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| invalid("reading certificates from", cert, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| invalid("reading certificates from", cert, e))?;
        if chain.is_empty() {
            return Err(invalid("no certificate in", cert, "empty"));
        }
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("reading the key", key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid("the certificate and key of", cert, e))?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            mode,
        })
    }

    /// The files of a qemu-style credentials directory:
    /// `server-cert.pem` and `server-key.pem`.
    pub fn from_dir(dir: &Path, mode: TlsMode) -> io::Result<Tls> {
        Tls::from_pem_files(
            &dir.join("server-cert.pem"),
            &dir.join("server-key.pem"),
            mode,
        )
    }
}
