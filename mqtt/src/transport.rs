//! The byte stream under a connection: plain TCP, or TLS (rustls, ring provider) over TCP.
//!
//! [`TlsOptions`] is built once from PEM files, before anything connects, so a missing or
//! unreadable file is a configuration error naming the file, not a failed dial. Without a CA
//! file the Mozilla roots (`webpki-roots`) verify the broker; a client certificate is optional.
//! The server name checked is the broker's host (a DNS name or an IP address).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::error::MqttError;

/// What a connection reads and writes: either transport, boxed.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The stream a connection owns.
pub(crate) type Stream = Box<dyn Io>;
/// Its reading half (the reader task's).
pub(crate) type StreamReader = ReadHalf<Stream>;
/// Its writing half (the writer task's).
pub(crate) type StreamWriter = WriteHalf<Stream>;

/// How to verify the broker, and who we are to it.
#[derive(Clone)]
pub struct TlsOptions {
    config: Arc<ClientConfig>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsOptions { .. }")
    }
}

impl TlsOptions {
    /// Reads the PEM files: `ca_file` (the broker's CA; the Mozilla roots when `None`) and an
    /// optional client certificate chain with its private key.
    pub fn from_files(
        ca_file: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<Self, MqttError> {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let mut roots = RootCertStore::empty();
        match ca_file {
            Some(path) => {
                for cert in read_certificates(path)? {
                    roots
                        .add(cert)
                        .map_err(|e| tls_file(path, &e.to_string()))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert_file, key_file)) => {
                let chain = read_certificates(cert_file)?;
                let key = PrivateKeyDer::from_pem_file(key_file)
                    .map_err(|e| tls_file(key_file, &format!("no usable private key: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| tls_file(cert_file, &e.to_string()))?
            }
        };
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// Runs the TLS handshake over `tcp` for `host`.
    pub(crate) async fn wrap(&self, host: &str, tcp: TcpStream) -> Result<Stream, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| format!("\"{host}\" is not a valid TLS server name"))?;
        let stream = TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        Ok(Box::new(stream))
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, MqttError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_file(path, &e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_file(path, &e.to_string()))?;
    if certs.is_empty() {
        return Err(tls_file(path, "it holds no PEM certificate"));
    }
    Ok(certs)
}

fn tls_file(path: &Path, reason: &str) -> MqttError {
    MqttError::TlsFile {
        file: path.display().to_string(),
        reason: reason.to_owned(),
    }
}
