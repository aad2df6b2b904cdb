//! Waiting for a server to be ready before the workload starts (`--ready-timeout`, as vLLM's
//! `bench serve --ready-check-timeout-sec`): a server that is still loading its model answers
//! 503, and a run started then would count every session as failed.
//!
//! Readiness is `GET /health` (dsv4, vLLM and SGLang all serve it at the root, beside `/v1`)
//! answering 200. A server without the route (404 or 405) or one that wants a key for it (401,
//! 403) is taken as ready: the `GET /v1/models` check that follows says what is wrong, if
//! anything. Refused connections and other answers are waited out.

use crate::error::StressError;
use std::time::{Duration, Instant};

/// What one `GET /health` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// 200: the server serves.
    Ready,
    /// No `/health` here (404, 405) or it needs a key (401, 403): readiness cannot be told.
    Unknown(u16),
    /// Not yet: the status and the start of the body, or why no answer came.
    Waiting(String),
}

/// The `/health` URL of a server whose API root (`…/v1`) or base URL is `url`.
pub fn health_url(url: &str) -> String {
    let base = url.trim().trim_end_matches('/');
    format!("{}/health", base.strip_suffix("/v1").unwrap_or(base))
}

/// Asks `health` once.
pub async fn probe(http: &reqwest::Client, health: &str) -> Probe {
    match http.get(health).send().await {
        Ok(r) if r.status().is_success() => Probe::Ready,
        Ok(r) if matches!(r.status().as_u16(), 401 | 403 | 404 | 405) => {
            Probe::Unknown(r.status().as_u16())
        }
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            let body: String = body.trim().chars().take(120).collect();
            Probe::Waiting(format!("HTTP {status} {body}").trim_end().to_owned())
        }
        Err(e) => Probe::Waiting(crate::client::error_chain(&e)),
    }
}

/// Polls the server at `url` until it is ready or `timeout` passes (zero: not at all),
/// trusting the CA certificates in `ca_cert` too. With `progress`, says on stderr what it waits
/// for, every few seconds. Returns the seconds waited.
pub async fn wait_ready(
    url: &str,
    timeout: Duration,
    progress: bool,
    ca_cert: Option<&std::path::Path>,
) -> Result<f64, StressError> {
    if timeout.is_zero() {
        return Ok(0.0);
    }
    let health = health_url(url);
    let err = |message: String| StressError::Server {
        url: health.clone(),
        message,
    };
    let http = crate::client::http_builder(ca_cert)?
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| err(format!("cannot build an HTTP client: {e}")))?;
    let start = Instant::now();
    let mut told = None::<Instant>;
    loop {
        let why = match probe(&http, &health).await {
            Probe::Ready | Probe::Unknown(_) => {
                let waited = start.elapsed().as_secs_f64();
                if progress && told.is_some() {
                    eprintln!("dsv4 stress: the server is ready after {waited:.1} s");
                }
                return Ok(waited);
            }
            Probe::Waiting(why) => why,
        };
        if start.elapsed() >= timeout {
            return Err(err(format!(
                "not ready within {} s (last: {why}); start the server first, or raise \
                 --ready-timeout for a model that loads longer",
                timeout.as_secs_f64()
            )));
        }
        if progress && told.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            eprintln!(
                "dsv4 stress: waiting for {health} to answer 200 ({why}; {:.0} s of {} s)",
                start.elapsed().as_secs_f64(),
                timeout.as_secs_f64()
            );
            told = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_sits_beside_the_api_root() {
        for url in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/v1",
            "http://h:1/v1/",
            " http://h:1/v1 ",
        ] {
            assert_eq!(health_url(url), "http://h:1/health", "{url}");
        }
        assert_eq!(health_url("https://h/api/v1"), "https://h/api/health");
    }
}
