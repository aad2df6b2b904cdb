//! Grammar-constrained decoding with llguidance: `tool_choice` "required" or a named tool
//! becomes a Lark grammar of the DSML tool-call block (each tool's JSON Schema constraining its
//! arguments); a structured output (see [`crate::api::structured`]) a grammar of one JSON
//! value, of a regular expression, of a list of choices, or the request's own grammar (Lark,
//! or GBNF converted by [`gbnf`]); the compiled grammar drives an engine [`TokenConstraint`]
//! that masks every sampled token.
//!
//! The block is written exactly as the DSV4 encoder writes history tool calls (one tag per
//! line). DSML markers that are single tokens of the vocabulary are named by id (`<[ID]>`), so
//! the model emits them as the special tokens it was trained on. A parameter whose schema is a
//! plain `{"type": "string"}` is written `string="true"` with raw text (which cannot contain
//! the closing tag); every other parameter `string="false"` with JSON generated under its
//! sub-schema (with the schema's `$defs`/`definitions`), compact, with Python's separators.
//! Required parameters come in schema order; optional ones may be left out. Parallel calls are
//! capped at [`MAX_PARALLEL_CALLS`].

use dsv4_chat::markers;
use dsv4_chat::tools::ToolDef;
use dsv4_chat::{Tokenizer, ToolSet};
use dsv4_engine::{Constraint, ConstraintState, TokenConstraint};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory, regex_to_lark};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use toktrie::TokEnv;

mod cache;
mod dsml;
pub(crate) mod gbnf;
pub mod structural;

/// An answer's content (`CONTENT`), and content a tool-call block may follow (`CALLS_PREFIX`).
/// Content is text without the DSV4 markup the parser refuses in it (`<｜…`, `</｜…`, `<think>`,
/// `</think>`). Before a block, the parser must be outside code and quotes, or it reads the
/// block as content: every code fence (a run of three or more backticks) closed, and the text
/// ending with a newline (which ends inline code and quotes), as the DSV4 encoder writes it.
const CONTENT_RULES: &str = r#"CONTENT: /(?s:.+)/ & ~/(?s:.*)(<｜|<\/｜|<think>|<\/think>)(?s:.*)/
NO_FENCE: ~/(?s:.*)```(?s:.*)/
FENCE: /`{3,}/
FIRST: NO_FENCE & /((?s:.*)[^`])?/
BETWEEN: NO_FENCE & /[^`]((?s:.*)[^`])?/
LAST: NO_FENCE & /([^`](?s:.*))?/
CALLS_PREFIX: CONTENT & /(?s:.*)\n/ & (NO_FENCE | FIRST FENCE BETWEEN FENCE (BETWEEN FENCE BETWEEN FENCE)* LAST)
"#;
/// Reasoning before `</think>` in thinking mode: text without `<` (so no markup).
const REASONING: &str = "/[^<]+/";

/// Most tool calls one constrained answer may make (so a model that keeps calling stops).
pub const MAX_PARALLEL_CALLS: usize = 16;

/// Compiles request grammars over one tokenizer's vocabulary, on threads of its own (see
/// [`GrammarCompiler::constraint`]).
pub struct GrammarCompiler {
    factory: ParserFactory,
    tok: Tokenizer,
    /// One permit a compile running: at most one a core, the others wait their turn without
    /// holding a thread. The compile thread holds its permit, so a request dropped while its
    /// grammar compiles does not free a compiler early. Requests whose grammar is being
    /// compiled wait for that compile and take no permit.
    compiling: Arc<Semaphore>,
    /// Compiled grammars kept for later requests with the same grammar, and those in flight.
    cache: cache::GrammarCache,
}

/// A request's constraint, and whether it came from the cache rather than a compile.
#[derive(Debug)]
pub struct Constrained {
    /// The constraint, or what in the request cannot be turned into a grammar.
    pub constraint: Result<Constraint, String>,
    /// Not compiled for this request: taken from the cache or from a concurrent compile.
    pub cached: bool,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrammarCompiler")
    }
}

/// What the constrained completion must be.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Free content, then optionally a DSML tool-call block (`tool_choice` auto with a strict
    /// tool): strict tools' arguments follow their schemas, other tools' are free.
    ContentOrCalls {
        /// Allow more than one call.
        parallel: bool,
    },
    /// A DSML tool-call block (one call, or several when `parallel`).
    ToolCalls {
        /// Only this tool may be called (None: any of the request's tools).
        only: Option<&'a str>,
        /// Allow more than one call.
        parallel: bool,
    },
    /// One JSON value valid under this schema.
    Json {
        /// The schema.
        schema: &'a serde_json::Value,
        /// The whitespace allowed between tokens of the JSON text, as a regular expression
        /// matching only JSON whitespace (None: compact, with Python's separators).
        whitespace: Option<&'a str>,
    },
    /// Text matching this regular expression (Rust `regex` syntax).
    Regex(&'a str),
    /// Exactly one of these strings.
    Choice(&'a [String]),
    /// Text of this grammar: Lark, or GBNF (see [`gbnf`]), told apart by [`gbnf::is_gbnf`].
    Grammar(&'a str),
    /// Text of this structural-tag format (see [`structural`]).
    Structural(&'a structural::Format),
}

/// Longest regular expression or grammar text a request may give: a grammar compiles in time
/// and stack that grow with its size.
pub const MAX_GRAMMAR_BYTES: usize = 64 << 10;

/// Stack of the thread that compiles a grammar. llguidance compiles rules recursively (about
/// 3 KiB of stack a nested rule in optimized code, about three times that unoptimized), and a
/// request's grammar may nest as deep as [`MAX_GRAMMAR_BYTES`] allows (a Lark chain of 3,000
/// rules compiles in an unoptimized build on half of it); pages are only touched as deep as a
/// grammar goes.
pub(crate) const COMPILE_STACK: usize = 64 << 20;

/// The name the request's own grammar goes by inside the constraint grammar.
const USER_GRAMMAR: &str = "user_grammar";

impl GrammarCompiler {
    /// A compiler over `env` (see [`crate::vocab::Vocab::tok_env`]) for `tok`'s markers,
    /// keeping up to `cached` compiled grammars for reuse (`server.grammar_cache`).
    pub fn new(env: &TokEnv, tok: Tokenizer, cached: usize) -> Result<Self, String> {
        let mut factory = ParserFactory::new_simple(env).map_err(|e| e.to_string())?;
        factory.quiet();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            factory,
            tok,
            compiling: Arc::new(Semaphore::new(cores)),
            cache: cache::GrammarCache::new(cached),
        })
    }

    /// How many compiled grammars the cache holds.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The constraint for `target`; in thinking mode the completion starts with reasoning and
    /// `</think>`. The error says what in the request cannot be turned into a grammar.
    pub async fn constraint(
        self: &Arc<Self>,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Result<Constraint, String> {
        self.constrain(target, tools, thinking).await.constraint
    }

    /// [`Self::constraint`], saying whether it came from the cache.
    ///
    /// A grammar not in the cache compiles on a thread of its own with a [`COMPILE_STACK`]
    /// stack, so that no grammar a request can send overflows a stack, and the caller's task
    /// waits without holding its runtime worker: a big grammar (or a big vocabulary) takes
    /// milliseconds to seconds, in which the worker goes on streaming other requests' tokens.
    /// At most one grammar a core compiles at once, and each grammar once at a time: a request
    /// whose grammar another is compiling waits for that result (and counts as `cached`).
    pub async fn constrain(
        self: &Arc<Self>,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Constrained {
        let hit = |constraint| Constrained {
            constraint,
            cached: true,
        };
        let miss = |constraint| Constrained {
            constraint,
            cached: false,
        };
        let (key, top) = match self.grammar(target, tools, thinking) {
            Ok(g) => g,
            Err(e) => return miss(Err(e)),
        };
        loop {
            let lead = match self.cache.lookup(&key) {
                cache::Lookup::Hit(c) => return hit(c),
                cache::Lookup::Follow(f) => match f.result().await {
                    Some(c) => return hit(c),
                    // Its leader went before compiling: look again (maybe lead).
                    None => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                },
                cache::Lookup::Lead(lead) => lead,
            };
            let Ok(permit) = Arc::clone(&self.compiling).acquire_owned().await else {
                return miss(Err("the grammar compiler has shut down".into()));
            };
            return miss(
                self.compile_off_worker(top, permit, lead)
                    .await
                    .and_then(|c| c),
            );
        }
    }

    /// [`Self::compile`] on a [`COMPILE_STACK`] thread, which keeps the result for `lead`'s
    /// grammar (handing it to the requests waiting for it), then returns `permit`. The thread
    /// finishes the flight even when the request is gone (its client left). The outer error
    /// is the server's (no thread, a compile that panicked), the inner the grammar's.
    async fn compile_off_worker(
        self: &Arc<Self>,
        top: TopLevelGrammar,
        permit: OwnedSemaphorePermit,
        lead: cache::Lead,
    ) -> Result<Result<Constraint, String>, String> {
        let (tx, rx) = oneshot::channel();
        let this = Arc::clone(self);
        std::thread::Builder::new()
            .name("dsv4-grammar".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                let compiled = this.compile(top).map(|matcher| {
                    Constraint::new(LlgConstraint {
                        proto: Mutex::new(matcher),
                    })
                });
                this.cache.finish(lead, compiled.clone());
                drop(permit);
                let _ = tx.send(compiled);
            })
            .map_err(|e| format!("cannot start the grammar compiler's thread: {e}"))?;
        rx.await
            .map_err(|_| "the grammar compiler failed".to_string())
    }

    /// The grammar of `target` (see [`Self::constraint`]), not yet compiled, with its cache
    /// key (its whole text).
    fn grammar(
        &self,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Result<(String, TopLevelGrammar), String> {
        let size = match target {
            Target::Regex(text) | Target::Grammar(text) => text.len(),
            Target::Choice(choices) => choices.iter().map(String::len).sum(),
            Target::Structural(format) => format.text_bytes(),
            Target::Json { whitespace, .. } => whitespace.map_or(0, str::len),
            Target::ToolCalls { .. } | Target::ContentOrCalls { .. } => 0,
        };
        if size > MAX_GRAMMAR_BYTES {
            return Err(format!(
                "it is {size} bytes long; at most {MAX_GRAMMAR_BYTES} bytes are accepted"
            ));
        }
        // Sub-grammars the body refers to with `@name`.
        let mut subs: Vec<(String, String)> = Vec::new();
        let body = match target {
            Target::ToolCalls { only, parallel } => {
                let chosen: Vec<&ToolDef> = tools
                    .tools()
                    .iter()
                    .filter(|t| only.is_none_or(|n| t.name() == n))
                    .collect();
                "start_body: tool_block\n".to_string()
                    + &self.tool_calls(&chosen, parallel, false)?
            }
            Target::ContentOrCalls { parallel } => {
                let all: Vec<&ToolDef> = tools.tools().iter().collect();
                format!("start_body: CONTENT? | CALLS_PREFIX? tool_block\n{CONTENT_RULES}")
                    + &self.tool_calls(&all, parallel, true)?
            }
            Target::Json { schema, whitespace } => format!(
                "start_body: %json {}\n",
                json_options(schema.clone(), whitespace)
            ),
            Target::Choice(choices) => {
                let alts: Vec<String> = choices.iter().map(|c| lark_str(c)).collect();
                format!("start_body: {}\n", alts.join(" | "))
            }
            Target::Regex(rx) => format!("start_body: /{}/\n", regex_to_lark(rx, "")),
            Target::Grammar(src) => {
                subs.push((USER_GRAMMAR.to_string(), user_lark(src)?));
                format!("start_body: @{USER_GRAMMAR}\n")
            }
            Target::Structural(format) => {
                let emitted = structural::Emitter::new(format, &user_lark)?;
                subs = emitted.grammars;
                emitted.rules
            }
        };
        let start = if thinking {
            format!(
                "start: REASONING? {} start_body\nREASONING: {REASONING}\n",
                self.marker(markers::THINK_END)
            )
        } else {
            "start: start_body\n".to_string()
        };
        let lark = format!("{start}{body}");
        tracing::debug!(grammar = %lark, subs = ?subs, "constraint grammar");
        let mut key = lark.clone();
        for (name, sub) in &subs {
            key.push_str(&format!("\0@{name}\0{sub}"));
        }
        let mut top = TopLevelGrammar::from_lark(lark);
        for (name, sub) in subs {
            let mut g = GrammarWithLexer::from_lark(sub);
            g.name = Some(name);
            top.grammars.push(g);
        }
        Ok((key, top))
    }

    /// Compile `top`, with its first token mask: a grammar the lexer cannot even start (a
    /// regex too big to build) is then a refused request rather than a failed one. Runs on a
    /// [`COMPILE_STACK`] thread.
    fn compile(&self, top: TopLevelGrammar) -> Result<Matcher, String> {
        let parser = self.factory.create_parser(top).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        matcher
            .compute_mask_or_eos()
            .map_err(|e| first_line(&e.to_string()))?;
        Ok(matcher)
    }

    /// A marker as a grammar atom: its token id when the vocabulary has it as one special
    /// token, else its literal text.
    fn marker(&self, text: &str) -> String {
        match self.tok.token_id(text) {
            Some(id) if self.tok.is_special(id) => format!("<[{id}]>"),
            _ => lark_str(text),
        }
    }
}

/// `schema` with llguidance's options for compact JSON with Python's separators (what the DSV4
/// encoder writes), as JSON text.
fn compact(schema: serde_json::Value) -> String {
    json_options(schema, None)
}

/// `schema` with llguidance's options for its JSON text, as JSON text: compact with Python's
/// separators (what the DSV4 encoder writes), or bare separators and `whitespace` (a regular
/// expression) between any two tokens, as outlines places its whitespace pattern.
fn json_options(mut schema: serde_json::Value, whitespace: Option<&str>) -> String {
    let options = match whitespace {
        None => serde_json::json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        }),
        Some(ws) => serde_json::json!({
            "whitespace_flexible": false,
            "whitespace_pattern": ws,
            "item_separator": ",",
            "key_separator": ":",
        }),
    };
    match &mut schema {
        serde_json::Value::Object(o) => {
            o.insert("x-guidance".into(), options);
        }
        serde_json::Value::Bool(true) => {
            schema = serde_json::json!({ "x-guidance": options });
        }
        _ => {}
    }
    schema.to_string()
}

/// `s` as a Lark string literal: JSON, with DEL escaped too (Lark's lexer refuses it raw).
fn lark_str(s: &str) -> String {
    serde_json::Value::String(s.to_string())
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

/// A request's grammar text as Lark: GBNF converted (see [`gbnf`]), Lark as given.
fn user_lark(src: &str) -> Result<String, String> {
    if gbnf::is_gbnf(src) {
        gbnf::gbnf_to_lark(src).map_err(|e| format!("GBNF: {e}"))
    } else {
        Ok(src.to_string())
    }
}

/// A compiled grammar; every request gets its own copy of the matcher.
struct LlgConstraint {
    proto: Mutex<Matcher>,
}

impl TokenConstraint for LlgConstraint {
    fn start(&self) -> Box<dyn ConstraintState> {
        let m = self.proto.lock().unwrap_or_else(|e| e.into_inner());
        Box::new(LlgState(m.deep_clone()))
    }
}

/// One request's position in the grammar.
struct LlgState(Matcher);

/// The first line of an llguidance error (the lines after it dump the parser's state; they
/// are logged, not sent to clients).
fn first_line(e: &str) -> String {
    if e.contains('\n') {
        tracing::debug!(error = %e, "grammar engine error");
    }
    e.lines().next().unwrap_or(e).to_string()
}

impl ConstraintState for LlgState {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self
            .0
            .compute_mask_or_eos()
            .map_err(|e| first_line(&e.to_string()))?;
        for (id, v) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *v = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<(), String> {
        self.0
            .consume_token(token)
            .map_err(|e| first_line(&e.to_string()))
    }
}

#[cfg(test)]
mod tests;
