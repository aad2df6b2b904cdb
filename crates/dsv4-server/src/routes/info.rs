//! `GET /v1/models` (the one served model), `GET /health` (200 when serving; 503 while
//! loading, draining, or when requests are pending and the step loop has stalled) and
//! `GET /metrics` (Prometheus text).

use crate::error::ApiError;
use crate::state::{AppState, Health};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The model object of the served model; with a profile, a `dsv4` object names it and its
/// SHA-256 (`{"profile": NAME, "profile_sha256": HEX}`).
fn model_object(state: &AppState) -> serde_json::Value {
    let cfg = state.cfg();
    let mut m = json!({
        "id": cfg.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "dsv4",
        "max_model_len": state.loaded().map(|l| l.context),
    });
    if cfg.profile_name.is_some() || cfg.profile_sha256.is_some() {
        m["dsv4"] = json!({"profile": cfg.profile_name, "profile_sha256": cfg.profile_sha256});
    }
    m
}

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&state)]})).into_response()
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

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let engine = state.loaded().map(|l| l.engine.metrics());
    let text = state.stats().render(engine.as_ref(), state.in_flight());
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
        let plain = AppState::new(ServerConfig::default());
        assert!(model_object(&plain).get("dsv4").is_none());
        let named = AppState::new(ServerConfig {
            profile_name: Some("dev-cpu".into()),
            profile_sha256: Some("ab12".into()),
            ..Default::default()
        });
        let m = model_object(&named);
        assert_eq!(
            m["dsv4"],
            json!({"profile": "dev-cpu", "profile_sha256": "ab12"})
        );
        assert_eq!(m["id"], "dsv4-tiny");
    }
}
