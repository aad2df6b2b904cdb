//! The OpenAI request and response bodies: [`chat`] (`/v1/chat/completions`), [`completion`]
//! (`/v1/completions`) and what both share ([`common`]: body parsing with the path of a bad
//! field, stop strings, usage; [`sampling`]: the sampling fields and their checks;
//! [`logprobs`]: per-token log-probabilities in each endpoint's format; [`structured`]: the
//! structured outputs an answer must follow), [`tokenize`]
//! (`/tokenize`, `/detokenize`), the Responses API's [`responses`] and [`responses_input`]
//! (`/v1/responses`), Anthropic's Messages API's [`messages`] and [`messages_input`]
//! (`/v1/messages`) with its thinking blocks' [`signature`], and SGLang's native [`generate`] (`/generate`).

pub mod chat;
pub mod common;
pub mod completion;
pub mod generate;
pub mod logprobs;
pub mod messages;
pub mod messages_input;
pub mod responses;
pub mod responses_input;
pub mod sampling;
pub mod signature;
pub mod structured;
pub mod tokenize;
