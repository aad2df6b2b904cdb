//! End-to-end tests of the HTTP server on the embedded tiny model (the `cpu` backend when it is
//! registered, else `reference`), over real sockets on 127.0.0.1 with raw HTTP/1.1: every kind
//! of bad input, the API surface (chat, streaming, tools with constrained decoding, JSON
//! answers, completions (fill in the middle with `suffix`), models, usage, metrics), `n` > 1 choices (seeds, usage, interleaved
//! streams, cancellation), per-token log-probabilities, `echo` with prompt log-probabilities
//! (scored as generation would), sampling options
//! (logit bias, penalties, min_tokens, ignore_eos, min_p), canary findings on /metrics, 64
//! concurrent streams against solo runs, health (loading, injected stall, draining), client
//! disconnects and graceful shutdown, `/tokenize` / `/detokenize`, `prompt_logprobs`, chat prefix
//! completion (`prefix`, `continue_final_message`), beam search (`use_beam_search`), and the
//! prefix-cache flush, vLLM's token-id outputs (`return_token_ids`, `stop_reason`, continuous
//! usage) and `truncate_prompt_tokens`, SGLang's native `/generate` and `/abort_request`, and
//! OpenAI's Responses API (`/v1/responses`, stored responses), Anthropic's Messages API
//! (`/v1/messages`, omitted thinking), SageMaker's `/ping` and `/invocations`, OpenAI Batch API files run
//! in process and over HTTP (`/v1/files`, `/v1/batches`), structured outputs beyond
//! JSON (regex, choice, GBNF and Lark grammars) on every endpoint, thinking budgets, and request ids
//! with the log lines that name them.

mod abort;
mod api;
mod bad_input;
mod batch;
mod batch_share;
mod batches;
mod batches_disk;
mod beam;
mod cache;
mod canary;
mod choices;
mod common;
mod concurrency;
mod echo;
mod fim;
mod generate;
mod health;
mod logprobs;
mod message_batches;
mod messages;
mod messages_omitted;
mod prefix;
mod priority;
mod prompt_logprobs;
mod queue_limit;
mod request_id;
mod responses;
mod sagemaker;
mod sampling;
mod server_info;
mod sglang_fields;
mod structured;
mod thinking_budget;
mod tls;
mod token_ids;
mod tokenize;
