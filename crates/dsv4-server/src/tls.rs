//! HTTPS for `dsv4 serve` (`server.ssl_certfile` and `server.ssl_keyfile`, and with
//! `server.ssl_ca_certs` client certificates: mutual TLS). [`server_config`] reads and checks
//! the files at start, so a bad certificate or key stops the server before the model loads;
//! [`TlsListener`] hands the serve loop only connections whose handshake has completed. Each
//! handshake runs on its own task under a deadline, so a slow or silent client holds up no
//! other; a failed one is logged at debug level and counted
//! (`dsv4:tls_handshake_failures_total`). With `server.ssl_refresh_s` the listener re-reads the
//! files when they change: new connections get the new configuration, and a file that cannot
//! be used leaves the one in use in place (logged and counted).

use crate::error::ServerError;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its TLS handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// Connections handshaken and not yet taken by the serve loop.
const READY_QUEUE: usize = 64;

/// The TLS files of `[server]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first (`server.ssl_certfile`).
    pub certfile: PathBuf,
    /// PEM private key of that certificate (`server.ssl_keyfile`).
    pub keyfile: PathBuf,
    /// PEM CA certificates that must have signed every client's certificate
    /// (`server.ssl_ca_certs`); None asks clients for none.
    pub ca_certs: Option<PathBuf>,
    /// How often the files are checked for changes (`server.ssl_refresh_s`); None: never.
    pub refresh: Option<Duration>,
}

/// What TLS has done, for `/metrics`.
#[derive(Debug, Default)]
pub struct TlsCounters {
    /// Connections dropped in or before their handshake.
    pub handshake_failures: AtomicU64,
    /// Changed files read and put in use.
    pub reloads: AtomicU64,
    /// Changed files that could not be used (the configuration in use stayed).
    pub reload_failures: AtomicU64,
}

impl TlsFiles {
    /// The bytes of the files now (None for one that cannot be read), to tell a change.
    fn contents(&self) -> Vec<Option<Vec<u8>>> {
        [
            Some(&self.certfile),
            Some(&self.keyfile),
            self.ca_certs.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| std::fs::read(p).ok())
        .collect()
    }
}

/// A configuration error about `option`.
fn bad(option: &'static str, message: String) -> ServerError {
    ServerError::Config { option, message }
}

/// Every certificate of a PEM file, which must hold at least one.
fn certificates(
    option: &'static str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(option, format!("{shown}: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            option,
            format!("{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(certs)
}

/// The rustls server configuration of `files`: HTTP/1.1 over TLS 1.2 or 1.3, with the ring
/// provider, asking for client certificates when `ca_certs` is set.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, ServerError> {
    let chain = certificates("server.ssl_certfile", &files.certfile)?;
    let key = PrivateKeyDer::from_pem_file(&files.keyfile).map_err(|e| {
        bad(
            "server.ssl_keyfile",
            format!(
                "{}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                files.keyfile.display()
            ),
        )
    })?;
    let provider: Arc<CryptoProvider> = Arc::new(ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("server.ssl_certfile", format!("TLS setup: {e}")))?;
    let builder = match &files.ca_certs {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates("server.ssl_ca_certs", path)? {
                roots.add(cert).map_err(|e| {
                    bad(
                        "server.ssl_ca_certs",
                        format!("{}: not a usable CA certificate: {e}", path.display()),
                    )
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad("server.ssl_ca_certs", format!("{}: {e}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        bad(
            "server.ssl_keyfile",
            format!(
                "{} cannot serve {}'s certificate: {e}",
                files.keyfile.display(),
                files.certfile.display()
            ),
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener for `axum::serve` whose connections have completed their TLS handshake.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Accept on `listener` and handshake under `config` (built from `files`, which are
    /// re-read when they change if `files.refresh` is set), counting into `counters`. The
    /// accepting task ends (closing the socket) once the listener is dropped.
    pub fn new(
        listener: TcpListener,
        files: TlsFiles,
        config: Arc<ServerConfig>,
        counters: Arc<TlsCounters>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let watched = Watched {
            seen: files.contents(),
            files,
        };
        tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(config),
            watched,
            tx,
            counters,
        ));
        Ok(Self { ready, addr })
    }
}

/// The TLS files and their bytes when last read.
struct Watched {
    files: TlsFiles,
    seen: Vec<Option<Vec<u8>>>,
}

impl Watched {
    /// If the files changed since last read, the configuration they make now (Err when it
    /// cannot be used); None when they did not change.
    fn changed(&mut self) -> Option<Result<Arc<ServerConfig>, ServerError>> {
        let now = self.files.contents();
        if now == self.seen {
            return None;
        }
        self.seen = now;
        Some(server_config(&self.files))
    }
}

/// Completes at the next refresh tick; never without one.
async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Accept TCP connections until the listener's receiving end is gone, each handshaken on a
/// task of its own; between connections, re-read the files at each refresh tick.
async fn accept_loop(
    listener: TcpListener,
    mut acceptor: TlsAcceptor,
    mut watched: Watched,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    counters: Arc<TlsCounters>,
) {
    let mut tick = watched.files.refresh.map(|every| {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let (tcp, peer) = tokio::select! {
            _ = tx.closed() => return,
            _ = next_tick(&mut tick) => {
                match watched.changed() {
                    None => {}
                    Some(Ok(config)) => {
                        acceptor = TlsAcceptor::from(config);
                        counters.reloads.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("TLS files changed: new connections get the new certificate");
                    }
                    Some(Err(e)) => {
                        counters.reload_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "TLS files changed but cannot be used; the certificate in use stays");
                    }
                }
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (acceptor, tx, counters) = (acceptor.clone(), tx.clone(), counters.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task ended: no connection comes any more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name)
    }

    fn files(cert: &str, key: &str, ca: Option<&str>) -> TlsFiles {
        TlsFiles {
            certfile: fixture(cert),
            keyfile: fixture(key),
            ca_certs: ca.map(fixture),
            refresh: None,
        }
    }

    fn refused(f: &TlsFiles) -> (&'static str, String) {
        match server_config(f) {
            Err(ServerError::Config { option, message }) => (option, message),
            other => panic!("{f:?} was not refused as a setting: {other:?}"),
        }
    }

    #[test]
    fn a_certificate_and_its_key_make_a_configuration_with_or_without_client_certificates() {
        let c = server_config(&files("server.pem", "server.key", None)).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"http/1.1".to_vec()]);
        server_config(&files("server.pem", "server.key", Some("ca.pem"))).unwrap();
    }

    #[test]
    fn bad_files_are_refused_naming_the_setting_and_the_file() {
        let (option, message) = refused(&files("missing.pem", "server.key", None));
        assert_eq!(option, "server.ssl_certfile");
        assert!(message.contains("missing.pem"), "{message}");

        let (option, message) = refused(&files("server.key", "server.key", None));
        assert_eq!(option, "server.ssl_certfile");
        assert!(message.contains("no PEM certificate"), "{message}");

        let (option, message) = refused(&files("server.pem", "server.pem", None));
        assert_eq!(option, "server.ssl_keyfile");
        assert!(message.contains("no usable PEM private key"), "{message}");

        let (option, message) = refused(&files("server.pem", "other.key", None));
        assert_eq!(option, "server.ssl_keyfile");
        assert!(message.contains("cannot serve"), "{message}");

        let (option, message) = refused(&files("server.pem", "server.key", Some("client.key")));
        assert_eq!(option, "server.ssl_ca_certs");
        assert!(message.contains("no PEM certificate"), "{message}");
    }
}
