//! `GET /v1/models` (the one served model), `GET /health` (200 when serving; 503 while
//! loading, draining, or when requests are pending and the step loop has stalled),
//! `GET /health_generate` (SGLang's: one token generated through the engine), `GET /version`
//! and `GET /metrics` (Prometheus text).

use crate::error::ApiError;
use crate::state::{AppState, Health};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use dsv4_engine::{Event, FinishReason, Request};
use serde_json::json;
use std::time::Instant;

/// The model object of the served model, in OpenAI's shape and Anthropic's at once (`type`,
/// `display_name`, `created_at`: the `anthropic` SDK's `models.list()` reads those). It was
/// "created" when the server started (vLLM and SGLang say the time of the request, which
/// changes on every call); with a
/// profile, a `dsv4` object names it and its SHA-256 (`{"profile": NAME, "profile_sha256":
/// HEX}`).
fn model_object(state: &AppState) -> serde_json::Value {
    let cfg = state.cfg();
    let created = state.0.started;
    let mut m = json!({
        "id": cfg.model_id,
        "object": "model",
        "created": created,
        "owned_by": "dsv4",
        "max_model_len": state.loaded().map(|l| l.context),
        "type": "model",
        "display_name": cfg.model_id,
        "created_at": dsv4_core::time::rfc3339(created),
    });
    if cfg.profile_name.is_some() || cfg.profile_sha256.is_some() {
        m["dsv4"] = json!({"profile": cfg.profile_name, "profile_sha256": cfg.profile_sha256});
    }
    m
}

/// `GET /v1/models`: OpenAI's list, with Anthropic's paging fields (one page).
pub async fn models(State(state): State<AppState>) -> Response {
    let id = &state.cfg().model_id;
    axum::Json(json!({"object": "list", "data": [model_object(&state)],
                      "has_more": false, "first_id": id, "last_id": id}))
    .into_response()
}

/// `GET /v1/models/{id}`.
pub async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if id == state.cfg().model_id {
        axum::Json(model_object(&state)).into_response()
    } else {
        ApiError::not_found(format!(
            "the model `{id}` does not exist; this server serves `{}`",
            state.cfg().model_id
        ))
        .with_code("model_not_found")
        .into_response()
    }
}

/// `GET /health`.
pub async fn health(State(state): State<AppState>) -> Response {
    let (status, body) = match state.health() {
        Health::Ok => (StatusCode::OK, json!({"status": "ok"})),
        Health::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading", "message": "the model is loading"}),
        ),
        Health::Draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining", "message": "shutting down; finishing the requests in flight"}),
        ),
        Health::Stalled {
            stalled_for,
            pending,
        } => {
            tracing::warn!(?stalled_for, pending, "health: the step loop is stalled");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "status": "stalled",
                    "message": format!(
                        "{pending} requests are pending and the engine has completed no step for \
                         {:.1} s (server.health_stall_s = {})",
                        stalled_for.as_secs_f64(),
                        state.cfg().health_stall.as_secs_f64()
                    ),
                }),
            )
        }
    };
    (status, axum::Json(body)).into_response()
}

/// `GET /health_generate` (SGLang's probe): generate one token from BOS through the engine and
/// answer 200 once it comes back, 503 when the server is loading, draining or stalled, or when
/// the token does not come within `server.health_stall_s`. A liveness probe that a wedged
/// engine cannot pass while its idle step loop looks fine.
pub async fn health_generate(State(state): State<AppState>) -> Response {
    let unavailable = |status: &str, message: String| {
        let body = json!({"status": status, "message": message});
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    };
    let Some(loaded) = state.loaded() else {
        return unavailable("loading", "the model is loading".into());
    };
    match state.health() {
        Health::Ok => {}
        Health::Stalled { .. } => {
            return unavailable("stalled", "the engine's step loop is stalled".into());
        }
        Health::Draining | Health::Loading => {
            return unavailable("draining", "shutting down".into());
        }
    }
    let started = Instant::now();
    let probe = Request {
        prompt: vec![loaded.bos],
        max_tokens: 1,
        ..Default::default()
    };
    let mut stream = match loaded.engine.submit(probe) {
        Ok(s) => s,
        Err(e) => return unavailable("failed", format!("the engine refused the probe: {e}")),
    };
    let finished = async {
        while let Some(ev) = stream.next().await {
            if let Event::Finished(f) = ev {
                return Some(f);
            }
        }
        None
    };
    let limit = state.cfg().health_stall;
    match tokio::time::timeout(limit, finished).await {
        Ok(Some(f)) if matches!(f.reason, FinishReason::Eos | FinishReason::Length) => {
            let ms = started.elapsed().as_secs_f64() * 1e3;
            axum::Json(json!({"status": "ok", "generate_ms": ms})).into_response()
        }
        Ok(Some(f)) => unavailable(
            "failed",
            format!(
                "the probe ended `{}`: {}",
                f.reason.as_str(),
                f.error.as_deref().unwrap_or("no reason given")
            ),
        ),
        Ok(None) => unavailable("failed", "the engine stopped".into()),
        Err(_) => unavailable(
            "stalled",
            format!(
                "no token within {:.1} s (server.health_stall_s)",
                limit.as_secs_f64()
            ),
        ),
    }
}

/// `GET /version` (vLLM's): the server's version.
pub async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let loaded = state.loaded();
    let engine = loaded.as_ref().map(|l| l.engine.metrics());
    let mut text = state.stats().render(engine.as_ref(), state.in_flight());
    let store = state.responses();
    crate::metrics::render_responses(&mut text, store.len(), store.bytes(), store.running());
    let files = state.files();
    crate::metrics::render_batches(
        &mut text,
        files.len(),
        files.bytes(),
        state.batches().running(),
        crate::metrics::ShareNow {
            lines: state.batches().lines_in_flight(),
            limit: state.batches().lines_limit(),
            interactive: state.interactive().in_flight(),
            fill_idle: state.batches().fill_idle(),
        },
    );
    if let Some(l) = &loaded {
        crate::metrics::render_grammar_cache(&mut text, l.grammars.cached());
        crate::metrics::render_thinking_budget_cuts(&mut text, l.think_end.cuts());
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerConfig;

    #[test]
    fn the_model_object_names_the_profile_when_it_is_known() {
        let plain = AppState::new(ServerConfig::default()).unwrap();
        assert!(model_object(&plain).get("dsv4").is_none());
        let named = AppState::new(ServerConfig {
            profile_name: Some("dev-cpu".into()),
            profile_sha256: Some("ab12".into()),
            ..Default::default()
        })
        .unwrap();
        let m = model_object(&named);
        assert_eq!(
            m["dsv4"],
            json!({"profile": "dev-cpu", "profile_sha256": "ab12"})
        );
        assert_eq!(m["id"], "dsv4-tiny");
    }
}
