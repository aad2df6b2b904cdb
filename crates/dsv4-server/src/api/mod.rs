//! The OpenAI request and response bodies: [`chat`] (`/v1/chat/completions`), [`completion`]
//! (`/v1/completions`) and what both share ([`common`]: body parsing with the path of a bad
//! field, sampling fields, stop strings, usage).

pub mod chat;
pub mod common;
pub mod completion;
