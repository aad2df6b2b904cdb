//! `dsv4 run-batch` with http(s) URLs, as vLLM's `run-batch` takes them: the input file is
//! downloaded (GET) before the model loads; an output or error file is written to a local file
//! first and uploaded (PUT, e.g. to a presigned object-store URL, streamed from disk) once the
//! batch has run. A failure that may pass is tried again, as vLLM does (`--upload-retries`); an
//! upload that still fails leaves the local file in place and names it, so no answer is lost.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long connecting to the URL's host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest wait before trying an upload again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// The URL `path` names, when it is an http(s) URL rather than a file.
pub fn url(path: &Path) -> Option<&str> {
    path.to_str()
        .filter(|s| s.starts_with("http://") || s.starts_with("https://"))
}

fn client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .context("cannot start an HTTP client")
}

/// The bytes at `url` (GET; a status other than 2xx is an error naming it).
pub async fn download(url: &str) -> anyhow::Result<Vec<u8>> {
    let response = client()?
        .get(url)
        .send()
        .await
        .with_context(|| format!("cannot fetch the batch file {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("cannot fetch the batch file {url}: the server answered {status}");
    }
    let bytes = response
        .bytes()
        .await
        .with_context(|| format!("the batch file {url} was cut off while downloading"))?;
    Ok(bytes.to_vec())
}

/// An output or error file bound for `url`: written to `local` while the batch runs.
#[derive(Debug)]
pub struct Upload {
    /// Where the file goes.
    pub url: String,
    /// Where it is written meanwhile (the system's temporary directory).
    pub local: PathBuf,
}

impl Upload {
    /// The local file for the upload named by `flag` (`output` or `error`) to `url`.
    pub fn new(flag: &str, url: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "dsv4-run-batch-{}-{:x}.{flag}.jsonl",
            std::process::id(),
            nanos & 0xffff_ffff_ffff
        );
        Self {
            url: url.to_string(),
            local: std::env::temp_dir().join(name),
        }
    }

    /// PUT the local file to the URL, streamed from disk, trying again up to `retries` times
    /// after a failure that may pass (no answer, 408, 429 or 5xx), 1 s after the first and
    /// twice as long after each next (at most 30 s), each announced by `retrying`. The local
    /// file is removed once it is there, and kept (the error names it) when it is not.
    pub async fn send(&self, retries: u32, mut retrying: impl FnMut(&str)) -> anyhow::Result<()> {
        let kept = || {
            format!(
                "the file is kept in {} (upload it yourself or run again)",
                self.local.display()
            )
        };
        let client = client()?;
        let mut delay = Duration::from_secs(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let failure = match self.put(&client).await {
                Ok(()) => break,
                Err(f) => f,
            };
            let tries = if attempt == 1 {
                String::new()
            } else {
                format!(" after {attempt} attempts")
            };
            if !failure.passing || attempt > retries {
                bail!(
                    "cannot upload to {}: {}{tries}; {}",
                    self.url,
                    failure.why,
                    kept()
                );
            }
            retrying(&format!(
                "upload to {} failed ({}); trying again in {} s ({} of {} retries)",
                self.url,
                failure.why,
                delay.as_secs(),
                attempt,
                retries
            ));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
        // Uploaded: the local copy has done its job.
        let _ = tokio::fs::remove_file(&self.local).await;
        Ok(())
    }

    /// One PUT of the local file, streamed from disk with its length.
    async fn put(&self, client: &reqwest::Client) -> Result<(), Failure> {
        let file = tokio::fs::File::open(&self.local)
            .await
            .map_err(|e| Failure {
                why: format!("cannot read back {}: {e}", self.local.display()),
                passing: false,
            })?;
        let length = file
            .metadata()
            .await
            .map(|m| m.len())
            .map_err(|e| Failure {
                why: format!("cannot read back {}: {e}", self.local.display()),
                passing: false,
            })?;
        let sent = client
            .put(&self.url)
            .header("content-type", "application/jsonl")
            .header("content-length", length)
            .body(reqwest::Body::from(file))
            .send()
            .await;
        let response = sent.map_err(|e| Failure {
            why: e.to_string(),
            passing: true,
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        Err(Failure {
            why: format!("the server answered {status}"),
            passing: status.is_server_error()
                || status == reqwest::StatusCode::REQUEST_TIMEOUT
                || status == reqwest::StatusCode::TOO_MANY_REQUESTS,
        })
    }
}

/// Why an upload attempt failed, and whether trying again may help.
#[derive(Debug)]
struct Failure {
    why: String,
    passing: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_and_https_are_urls() {
        assert_eq!(
            url(Path::new("https://bucket.example/in.jsonl?sig=x")),
            Some("https://bucket.example/in.jsonl?sig=x")
        );
        assert_eq!(url(Path::new("http://h:9/a")), Some("http://h:9/a"));
        for path in ["in.jsonl", "-", "ftp://h/a", "./http://x", "s3://b/k"] {
            assert_eq!(url(Path::new(path)), None, "{path}");
        }
    }

    #[test]
    fn uploads_of_one_run_write_to_distinct_local_files() {
        let (a, b) = (
            Upload::new("output", "http://h/o"),
            Upload::new("error", "http://h/e"),
        );
        assert_ne!(a.local, b.local);
        assert!(a.local.starts_with(std::env::temp_dir()));
        assert!(a.local.to_string_lossy().ends_with(".output.jsonl"));
    }
}
