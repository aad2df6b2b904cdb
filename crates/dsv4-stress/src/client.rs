//! The HTTP side: one OpenAI-compatible chat request (or, with [`Api::Responses`], a Responses
//! API request: [`crate::responses`]), streamed (SSE, read by [`crate::stream::Pump`]) or not,
//! turned into an [`Answer`] with timings, or a [`RequestFailure`]; background responses
//! ([`Api::ResponsesBackground`]) polled, or streamed with a dropped and resumed connection,
//! then deleted; and the server's identity from `GET /v1/models`.

use crate::answer::{Answer, Outcome, RequestFailure};
use crate::chat_answer::{clip, error_object, parse_message};
use crate::error::StressError;
use crate::options::Api;
use crate::report::ServerIdentity;
use crate::responses::parse_response;
use crate::stream::{Pump, Pumped};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The API root (`…/v1`) of a user-given URL: `http(s)://host[:port]` with or without `/v1`.
pub fn base_url(url: &str) -> Result<String, StressError> {
    let trimmed = url.trim().trim_end_matches('/');
    if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
        return Err(StressError::Options {
            option: "url",
            message: format!("`{url}` is not an http:// or https:// URL"),
        });
    }
    Ok(if trimmed.ends_with("/v1") {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1")
    })
}

/// A reqwest client builder that trusts, besides the bundled web roots, the PEM CA
/// certificates in `ca_cert` (for an `https://` server with a private CA); a file that cannot
/// be read or holds no certificate is an error naming `--ca-cert`.
pub fn http_builder(
    ca_cert: Option<&std::path::Path>,
) -> Result<reqwest::ClientBuilder, StressError> {
    let mut builder = reqwest::Client::builder();
    let Some(path) = ca_cert else {
        return Ok(builder);
    };
    let bad = |message: String| StressError::Options {
        option: "ca-cert",
        message: format!("{}: {message}", path.display()),
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    for cert in certs {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

/// A client for one server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    api: String,
    api_key: Option<String>,
    /// The per-request timeout, also the longest a background response is polled.
    timeout: Duration,
}

impl Client {
    /// A client for `url` (see [`base_url`]) with a per-request timeout, trusting the CA
    /// certificates in `ca_cert` too ([`http_builder`]).
    pub fn new(
        url: &str,
        api_key: Option<String>,
        timeout: Duration,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Self, StressError> {
        let api = base_url(url)?;
        let http = http_builder(ca_cert)?
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|e| StressError::Server {
                url: api.clone(),
                message: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            api,
            api_key,
            timeout,
        })
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// `GET /v1/models`: the server's identity, with `model` (or the first listed id) as the
    /// model to use. Unreachable servers and unusable answers are errors.
    pub async fn identity(&self, model: Option<&str>) -> Result<ServerIdentity, StressError> {
        let err = |message: String| StressError::Server {
            url: self.api.clone(),
            message,
        };
        let resp = self
            .auth(self.http.get(format!("{}/models", self.api)))
            .send()
            .await
            .map_err(|e| {
                err(format!(
                    "cannot reach GET /v1/models ({}); is the server running at this address?",
                    error_chain(&e)
                ))
            })?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| err(format!("reading GET /v1/models: {e}")))?;
        if !status.is_success() {
            let hint = if status.as_u16() == 401 {
                " (pass --api-key)"
            } else {
                ""
            };
            return Err(err(format!(
                "GET /v1/models answered {status}{hint}: {}",
                clip(&body)
            )));
        }
        let models: Value = serde_json::from_str(&body)
            .map_err(|e| err(format!("GET /v1/models is not JSON ({e}): {}", clip(&body))))?;
        let list = models["data"].as_array().cloned().unwrap_or_default();
        let chosen = match model {
            Some(m) => m.to_owned(),
            None => list
                .iter()
                .find_map(|m| m["id"].as_str())
                .ok_or_else(|| err("GET /v1/models lists no model; pass --model".into()))?
                .to_owned(),
        };
        let object = list.iter().find(|m| m["id"].as_str() == Some(&chosen));
        if object.is_none() && !list.is_empty() {
            // Some servers answer any model name (SGLang), so this is a warning, not an error.
            let ids: Vec<&str> = list.iter().filter_map(|m| m["id"].as_str()).collect();
            tracing::warn!(
                "--model `{chosen}` is not among the models {} lists ({}); a server that checks \
                 the name will refuse every request",
                self.api,
                ids.join(", ")
            );
        }
        let field = |k: &str| {
            object
                .and_then(|o| o["dsv4"][k].as_str())
                .map(str::to_owned)
        };
        Ok(ServerIdentity {
            url: self.api.clone(),
            model: chosen.clone(),
            max_model_len: object.and_then(|o| o["max_model_len"].as_u64()),
            dsv4_profile: field("profile"),
            dsv4_profile_sha256: field("profile_sha256"),
            models,
        })
    }

    /// Send one chat completion request (its `stream` field decides the mode).
    pub async fn chat(&self, body: &Value) -> Outcome {
        self.send(Api::Chat, body).await
    }

    /// Send one request to `api` (its `stream` field decides the mode).
    pub async fn send(&self, api: Api, body: &Value) -> Outcome {
        let stream = body["stream"].as_bool().unwrap_or(false);
        let background = api == Api::ResponsesBackground;
        let path = match api {
            Api::Chat => "chat/completions",
            Api::Responses | Api::ResponsesBackground => "responses",
        };
        let start = Instant::now();
        let fail =
            |status: Option<u16>, error_type: Option<String>, message: String| RequestFailure {
                status,
                error_type,
                message,
                e2el: start.elapsed().as_secs_f64(),
            };
        let resp = self
            .auth(self.http.post(format!("{}/{path}", self.api)))
            .json(body)
            .send()
            .await
            .map_err(|e| fail(None, None, error_chain(&e)))?;
        let resp = self
            .success(resp)
            .await
            .map_err(|(s, t, m)| fail(s, t, m))?;
        let (answer, id) = if stream {
            self.read_stream(api, body, resp, start).await
        } else {
            self.read_plain(api, resp, start).await
        };
        let mut a = match answer {
            Ok(a) => a,
            Err((s, t, m)) => {
                // A background response that failed its turn is not left running or stored.
                if let Some(id) = id.filter(|_| background) {
                    self.abandon(&id).await;
                }
                return Err(fail(s, t, m));
            }
        };
        a.e2el = start.elapsed().as_secs_f64();
        Ok(a)
    }

    /// The answer of a plain request (a background one polled to its end, then deleted), and
    /// the response's id once known.
    async fn read_plain(
        &self,
        api: Api,
        resp: reqwest::Response,
        start: Instant,
    ) -> (Result<Answer, Failed>, Option<String>) {
        let v = match self.json(resp).await {
            Ok(v) => v,
            Err(f) => return (Err(f), None),
        };
        let id = v["id"].as_str().map(str::to_owned);
        let answer = async {
            if api != Api::ResponsesBackground {
                let parsed = match api {
                    Api::Chat => parse_message(&v),
                    _ => parse_response(&v),
                };
                return parsed.map_err(|m| (None, None, m));
            }
            let done = self.poll(&v, start).await?;
            let a = parse_response(&done).map_err(|m| (None, None, m))?;
            self.forget(id.as_deref().unwrap_or_default()).await?;
            Ok(a)
        }
        .await;
        (answer, id)
    }

    /// The answer of a streamed request (a background stream dropped after a few tokens, how
    /// many varying with the body, and resumed after its last whole event, then deleted), and
    /// the response's id once known.
    async fn read_stream(
        &self,
        api: Api,
        body: &Value,
        resp: reqwest::Response,
        start: Instant,
    ) -> (Result<Answer, Failed>, Option<String>) {
        let background = api == Api::ResponsesBackground;
        let mut pump = Pump::new(api, start);
        let mut cut = background.then(|| 1 + body.to_string().len() % 4);
        let (mut resp, mut resumed) = (resp, 0);
        let read: Result<(), Failed> = loop {
            match pump.pump(resp, cut.take()).await {
                Err((ty, m)) => break Err((None, ty, m)),
                Ok(Pumped::Done) => break Ok(()),
                Ok(Pumped::Cut) => {
                    resumed += 1;
                    match self.resume(&pump).await {
                        Ok(next) => resp = next,
                        Err(f) => break Err(f),
                    }
                }
                Ok(Pumped::Ended) => {
                    let end = match api {
                        Api::Chat => "`data: [DONE]`",
                        _ => "response.completed or response.incomplete",
                    };
                    break Err((None, None, format!("the stream ended without {end}")));
                }
            }
        };
        let id = pump.id().map(str::to_owned);
        let answer = match read {
            Err(f) => Err(f),
            Ok(()) if background => match self.forget(id.as_deref().unwrap_or_default()).await {
                Err(f) => Err(f),
                Ok(()) => pump.finish().map_err(|m| (None, None, m)),
            },
            Ok(()) => pump.finish().map_err(|m| (None, None, m)),
        };
        let answer = answer.map(|mut a| {
            a.resumed = resumed;
            a
        });
        (answer, id)
    }

    /// `resp` if it succeeded, else its status, error type and message.
    async fn success(&self, resp: reqwest::Response) -> Result<reqwest::Response, Failed> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let (ty, msg) = error_object(&text);
        Err((Some(status.as_u16()), ty, msg))
    }

    /// The JSON body of a successful answer.
    async fn json(&self, resp: reqwest::Response) -> Result<Value, Failed> {
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| (Some(status), None, error_chain(&e)))?;
        serde_json::from_str(&text)
            .map_err(|e| (None, None, format!("the answer is not JSON ({e})")))
    }

    /// Poll the background response `queued` (as created) until it left `queued` and
    /// `in_progress`; at most the request timeout after `start`.
    async fn poll(&self, queued: &Value, start: Instant) -> Result<Value, Failed> {
        if queued["background"] != true || queued["status"] != "queued" {
            return Err((
                None,
                None,
                format!(
                    "a background request was not answered queued in the background: status                      {}, background {}",
                    queued["status"], queued["background"]
                ),
            ));
        }
        let id = queued["id"].as_str().unwrap_or_default();
        loop {
            let resp = self
                .auth(self.http.get(format!("{}/responses/{id}", self.api)))
                .send()
                .await
                .map_err(|e| (None, None, error_chain(&e)))?;
            let v = self.json(self.success(resp).await?).await?;
            if !matches!(v["status"].as_str(), Some("queued" | "in_progress")) {
                return Ok(v);
            }
            if start.elapsed() > self.timeout {
                return Err((
                    None,
                    None,
                    format!(
                        "background response {id} still {} after the timeout",
                        v["status"]
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Resume the background stream `pump` read after its last whole event.
    async fn resume(&self, pump: &Pump) -> Result<reqwest::Response, Failed> {
        let id = pump.id().ok_or((
            None,
            None,
            "the stream was cut before response.created named its id".to_owned(),
        ))?;
        let after = pump
            .last_seq()
            .map(|n| format!("&starting_after={n}"))
            .unwrap_or_default();
        let url = format!("{}/responses/{id}?stream=true{after}", self.api);
        let resp = self
            .auth(self.http.get(url))
            .send()
            .await
            .map_err(|e| (None, None, error_chain(&e)))?;
        self.success(resp).await
    }

    /// Cancel and delete the background response `id` whose turn failed, as far as the server
    /// lets us (errors are ignored: the turn already failed with its own reason).
    async fn abandon(&self, id: &str) {
        let url = format!("{}/responses/{id}", self.api);
        let _ = self
            .auth(self.http.post(format!("{url}/cancel")))
            .send()
            .await;
        let _ = self.auth(self.http.delete(url)).send().await;
    }

    /// Delete the finished background response `id`.
    async fn forget(&self, id: &str) -> Result<(), Failed> {
        let resp = self
            .auth(self.http.delete(format!("{}/responses/{id}", self.api)))
            .send()
            .await
            .map_err(|e| (None, None, error_chain(&e)))?;
        self.success(resp).await.map(|_| ())
    }
}

/// Why a request failed: its HTTP status, error type and message.
type Failed = (Option<u16>, Option<String>, String);

/// An error with its causes (reqwest hides "connection refused" two levels down).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_one_v1() {
        assert_eq!(base_url("http://h:1").unwrap(), "http://h:1/v1");
        assert_eq!(base_url("http://h:1/v1/").unwrap(), "http://h:1/v1");
        assert!(base_url("h:1").is_err());
    }
}
