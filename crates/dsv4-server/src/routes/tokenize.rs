//! `POST /tokenize` and `POST /detokenize` (vLLM's extensions): the token ids the server would
//! run for a text prompt (BOS prepended as `/v1/completions` does) or for chat messages
//! (encoded exactly as `/v1/chat/completions` encodes them: tools, tool choice, thinking), and
//! the text of token ids. Clients count tokens and check context room with them.

use super::chat_prompt::chat_prompt;
use super::{body_bytes, check_model, json_response, loaded_model};
use crate::api::chat::ChatRequest;
use crate::api::common::parse_body;
use crate::api::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use crate::error::ApiError;
use crate::state::{AppState, Loaded};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use dsv4_chat::markers;
use serde_json::Value;

/// The `/tokenize` handler.
pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let value: Value = parse_body(&body)?;
    let chat = value.get("messages").is_some();
    let (ids, strs) = if chat {
        chat_ids(&state, &loaded, value)?
    } else {
        let req: TokenizeRequest = parse_body(&body)?;
        check(&state, req.model.as_deref())?;
        let mut ids = Vec::new();
        if req.add_special_tokens.unwrap_or(true) && !req.prompt.starts_with(markers::BOS) {
            ids.push(loaded.bos);
        }
        ids.extend(
            loaded
                .tokenizer
                .encode(&req.prompt)
                .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?,
        );
        (ids, req.return_token_strs.unwrap_or(false))
    };
    let token_strs = strs.then(|| {
        ids.iter()
            .map(|&t| String::from_utf8_lossy(loaded.vocab.bytes(t)).into_owned())
            .collect()
    });
    Ok(json_response(&TokenizeResponse {
        count: ids.len(),
        max_model_len: loaded.context,
        tokens: ids,
        token_strs,
    }))
}

/// The prompt ids of a chat body (`model` may be left out; `return_token_strs` is accepted
/// besides the chat fields), and whether each token's text is wanted.
fn chat_ids(
    state: &AppState,
    loaded: &Loaded,
    mut value: Value,
) -> Result<(Vec<u32>, bool), ApiError> {
    let obj = value
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let strs = match obj.remove("return_token_strs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(ApiError::bad_param(
                "return_token_strs",
                format!("`return_token_strs` must be true or false, not {other}"),
            ));
        }
    };
    if !obj.contains_key("model") {
        obj.insert("model".into(), Value::String(state.cfg().model_id.clone()));
    }
    let body = serde_json::to_vec(&value)
        .map_err(|e| ApiError::internal(format!("re-encoding the request: {e}")))?;
    let req: ChatRequest = parse_body(&body)?;
    check_model(state, &req.model)?;
    Ok((chat_prompt(loaded, &req, &body)?.ids, strs))
}

/// The `/detokenize` handler.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let req: DetokenizeRequest = parse_body(&body)?;
    check(&state, req.model.as_deref())?;
    let vocab = loaded.vocab.len();
    if let Some((k, &id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= vocab)
    {
        return Err(ApiError::bad_param(
            format!("tokens[{k}]"),
            format!(
                "token id {id} is outside the model's vocabulary (ids 0 to {})",
                vocab.saturating_sub(1)
            ),
        ));
    }
    let bytes: Vec<u8> = req
        .tokens
        .iter()
        .flat_map(|&t| loaded.vocab.bytes(t).iter().copied())
        .collect();
    Ok(json_response(&DetokenizeResponse {
        prompt: String::from_utf8_lossy(&bytes).into_owned(),
    }))
}

/// Check `model` when given.
fn check(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    model.map_or(Ok(()), |m| check_model(state, m))
}
