//! `POST /reset_prefix_cache` (vLLM's name) and `POST /flush_cache` (SGLang's): drop every
//! prefix snapshot, device and host tier, and answer once they are gone, so the next request
//! starts cold (benchmarks flush between runs). Running requests keep the pages they share
//! with a snapshot; nothing they compute changes.

use super::{json_response, loaded_model};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::response::Response;
use serde::Serialize;

/// The answer: how many snapshots were dropped.
#[derive(Debug, Serialize)]
struct Flushed {
    status: &'static str,
    snapshots_dropped: usize,
}

/// The handler (both paths).
pub async fn reset_prefix_cache(State(state): State<AppState>) -> Result<Response, ApiError> {
    let loaded = loaded_model(&state)?;
    let dropped = loaded
        .engine
        .flush_prefix_cache()
        .await
        .map_err(|e| ApiError::unavailable(format!("the engine is not running: {e}")))?;
    tracing::info!(dropped, "prefix cache flushed");
    Ok(json_response(&Flushed {
        status: "ok",
        snapshots_dropped: dropped,
    }))
}
