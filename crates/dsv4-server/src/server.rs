//! [`Server`]: the listening socket (plain HTTP, or HTTPS through [`crate::tls`]) and the serve
//! loop with graceful shutdown — when the shutdown future completes (SIGTERM or Ctrl-C with
//! [`shutdown_signal`]) `/health` turns 503 "draining", no new connections are accepted, and the
//! loop returns once every request in flight (streams included) has been answered and the
//! batches running have written the lines in flight (with `server.files_dir` they go on from
//! there at the next start).

use crate::error::ServerError;
use crate::routes::router;
use crate::state::AppState;
use crate::tls::{TlsFiles, TlsListener};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_rustls::rustls::ServerConfig as TlsConfig;

/// A bound server, not yet serving.
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    state: AppState,
    /// HTTPS: the files (`ServerConfig::tls`) and the configuration checked from them.
    tls: Option<(TlsFiles, Arc<TlsConfig>)>,
}

impl Server {
    /// Listen on the state's `host:port` (port 0 picks a free one), over TLS when the state's
    /// configuration names a certificate (read and checked here, before anything listens).
    pub async fn bind(state: AppState) -> Result<Self, ServerError> {
        let cfg = state.cfg();
        let tls = match &cfg.tls {
            Some(files) => Some((files.clone(), crate::tls::server_config(files)?)),
            None => None,
        };
        let host = if cfg.host.contains(':') && !cfg.host.starts_with('[') {
            format!("[{}]", cfg.host)
        } else {
            cfg.host.clone()
        };
        let wanted = format!("{host}:{}", cfg.port);
        let listener = TcpListener::bind(&wanted)
            .await
            .map_err(|source| ServerError::Bind {
                addr: wanted.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: wanted,
            source,
        })?;
        Ok(Self {
            listener,
            addr,
            state,
            tls,
        })
    }

    /// The server's base URL: `https://` with TLS, else `http://`, and the bound address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (to set the model when it is loaded).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serve until `shutdown` completes, then drain: answer what is in flight and return.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let (state, state_after) = (self.state.clone(), self.state.clone());
        let drain = async move {
            shutdown.await;
            state.start_draining();
            tracing::info!(
                in_flight = state.in_flight(),
                "shutting down: no new connections; draining the requests in flight"
            );
        };
        tracing::info!(url = %self.url(), "serving");
        let app = router(self.state.clone());
        match self.tls {
            None => axum::serve(self.listener, app)
                .with_graceful_shutdown(drain)
                .await
                .map_err(ServerError::Serve)?,
            Some((files, config)) => {
                let counters = self.state.stats().tls_counters();
                let listener = TlsListener::new(self.listener, files, config, counters)
                    .map_err(ServerError::Serve)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(drain)
                    .await
                    .map_err(ServerError::Serve)?
            }
        }
        state_after.batches().stop().await;
        tracing::info!("drained; server stopped");
        Ok(())
    }
}

/// Completes on SIGTERM or Ctrl-C (SIGINT); a second signal exits the process at once.
pub async fn shutdown_signal() {
    wait_for_signal().await;
    tokio::spawn(async {
        wait_for_signal().await;
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(130);
    });
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
