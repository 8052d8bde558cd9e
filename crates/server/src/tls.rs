//! HTTPS: PEM certificate/key files or a self-signed certificate, served through rustls (ring).
//!
//! Browsers only allow microphone capture and AudioWorklets in a secure context (HTTPS or
//! localhost), so a server meant for remote browsers needs TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{rustls, TlsAcceptor};

use crate::error::ServerError;
use crate::socket::tune_socket;

/// Where the certificate chain and private key (PEM) are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1), PEM.
    pub key: PathBuf,
}

/// Writes a self-signed certificate for `localhost`, `127.0.0.1`, `::1` and `extra_names` into
/// `dir` (`cert.pem`, `key.pem`) unless both files already exist, and returns their paths.
pub fn self_signed(dir: &Path, extra_names: &[String]) -> Result<TlsFiles, ServerError> {
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    if files.cert.is_file() && files.key.is_file() {
        return Ok(files);
    }
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(extra_names.iter().filter(|n| !n.is_empty()).cloned());
    names.dedup();
    let ck = rcgen::generate_simple_self_signed(names)
        .map_err(|e| ServerError::Tls(format!("generating a certificate: {e}")))?;
    std::fs::create_dir_all(dir).map_err(|source| ServerError::Io {
        context: format!("creating {}", dir.display()),
        source,
    })?;
    let write = |p: &Path, s: String| {
        std::fs::write(p, s).map_err(|source| ServerError::Io {
            context: format!("writing {}", p.display()),
            source,
        })
    };
    write(&files.cert, ck.cert.pem())?;
    write(&files.key, ck.key_pair.serialize_pem())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600));
    }
    Ok(files)
}

/// A rustls server configuration from PEM files (HTTP/1.1 only: WebSocket upgrades need it).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| ServerError::Tls(format!("{}: {e}", files.cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Tls(format!("{}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(ServerError::Tls(format!(
            "{}: no certificate",
            files.cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| ServerError::Tls(format!("{}: {e}", files.key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A listener that completes TLS handshakes in the background (a slow client never blocks
/// accepting the others) and hands established streams to axum.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Wraps a bound TCP listener. Must be called inside a tokio runtime.
    pub fn new(tcp: TcpListener, files: &TlsFiles) -> Result<TlsListener, ServerError> {
        Self::with_config(tcp, server_config(files)?)
    }

    /// Wraps a bound TCP listener with a configuration already read ([`server_config`]). Must be
    /// called inside a tokio runtime.
    pub fn with_config(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> Result<TlsListener, ServerError> {
        let acceptor = TlsAcceptor::from(config);
        let addr = tcp.local_addr().map_err(|source| ServerError::Io {
            context: "local address".into(),
            source,
        })?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                tune_socket(&stream);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("tls handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("tls handshake with {peer}: timeout"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
