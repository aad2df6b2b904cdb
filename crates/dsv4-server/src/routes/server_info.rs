//! SGLang's informational endpoints, so a dsv4 server can sit behind SGLang's router (the
//! model gateway) and its tools: `GET /get_model_info` and `GET /get_server_info` (also at
//! `/server_info`, SGLang's newer name), which adds the resolved profile. Shapes follow
//! SGLang's `http_server.py` (github.com/sgl-project/sglang); fields SGLang has and dsv4 does
//! not are left out rather than faked. The load endpoints are in [`super::loads`].

use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// `GET /get_model_info`: what model is served. The tokenizer is the checkpoint's own
/// (`tokenizer.json` beside the weights), so `tokenizer_path` is `model_path`.
pub async fn get_model_info(State(state): State<AppState>) -> Response {
    let cfg = state.cfg();
    axum::Json(json!({
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.model_id,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "deepseek_v4",
        "architectures": [dsv4_model::config::ARCHITECTURE],
    }))
    .into_response()
}

/// `GET /get_server_info`: the server's limits and state now, and under `dsv4` the profile
/// that pins every setting (secrets redacted), so a report can say what answered.
pub async fn get_server_info(State(state): State<AppState>) -> Response {
    let cfg = state.cfg();
    let loaded = state.loaded();
    let m = loaded.as_ref().map(|l| l.engine.metrics());
    let internal = m.as_ref().map_or_else(Vec::new, |m| {
        vec![json!({
            "last_gen_throughput": m.generated_tokens_per_s,
            "num_running_reqs": m.running_requests,
            "num_waiting_reqs": m.queued_requests,
            "num_running_tokens": m.running_tokens,
            "num_waiting_tokens": m.queued_tokens,
            "cache_hit_rate": m.prefix_hit_rate,
            // Null, as SGLang without speculative decoding: scripts index it directly.
            "avg_spec_accept_length": null,
        })]
    });
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.model_id,
        "host": cfg.host,
        "port": cfg.port,
        "tp_size": 1,
        "dp_size": 1,
        "context_length": loaded.as_ref().map(|l| l.context),
        "max_running_requests": loaded.as_ref().map(|l| l.max_running),
        "max_queued_requests": (cfg.max_queued_requests > 0).then_some(cfg.max_queued_requests),
        "status": if loaded.is_some() { "ready" } else { "loading" },
        "internal_states": internal,
        "dsv4": {
            "profile": cfg.profile_name,
            "profile_sha256": cfg.profile_sha256,
            "settings": cfg.profile_settings,
        },
    }))
    .into_response()
}
