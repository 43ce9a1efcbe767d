//! TLS (rustls, with the ring provider) for the one port a node serves, the client API and Raft
//! RPC alike, and the HTTP client a node uses to call its peers.
//!
//! A node serves TLS when it has a certificate and key (`--tls-cert`, `--tls-key`, PEM). It
//! calls a peer over TLS when the peer's URL is `https://`, trusting only the CA certificates of
//! `--tls-ca` (PEM, one or more). Certificates are read at start; replacing them needs a
//! restart.
//!
//! Handshakes run in tasks of their own, so a slow or silent client never holds up the accept
//! loop, and each must finish within [`HANDSHAKE_TIMEOUT`]; at most [`MAX_HANDSHAKES`] are under
//! way at once, further connections wait in the kernel's accept queue.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most TLS handshakes under way at once (a pending handshake holds a few tens of KiB).
pub const MAX_HANDSHAKES: usize = 1024;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file, with a message naming the file when it has none.
pub fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read the certificate file {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "{}: no certificate in it (expected PEM \"BEGIN CERTIFICATE\" blocks)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The server side of TLS from a certificate chain and its private key (PEM files).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = read_certs(cert)?;
    let pem = std::fs::read(key)
        .with_context(|| format!("cannot read the private key file {}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow!(
            "{}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .with_context(|| {
            format!(
                "the key {} does not go with the certificate {}",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener that hands out connections only once their TLS handshake is done. It plugs into
/// `axum::serve` in place of a plain `TcpListener`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx));
        Ok(TlsListener {
            ready,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The HTTP client a node uses to call its peers: `https://` peers are trusted only through
/// the CA certificates of `ca` (when given), and no system roots.
pub fn peer_client(ca: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_millis(500));
    if let Some(ca) = ca {
        for cert in read_certs(ca)? {
            let cert = reqwest::Certificate::from_der(&cert)
                .with_context(|| format!("{}: unusable CA certificate", ca.display()))?;
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().context("building the peer HTTP client")
}
