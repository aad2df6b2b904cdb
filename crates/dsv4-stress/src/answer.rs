//! [`Answer`]: one chat completion as the client saw it (streamed chunks already assembled), with
//! its timings; and [`Outcome`]: an answer or the reason there is none.

use serde::{Deserialize, Serialize};

/// One tool call of an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the server gave (`call_…`); differs between requests.
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments exactly as sent (a JSON text when the server behaves).
    pub arguments: String,
}

/// One assistant answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// Whether it was streamed.
    pub stream: bool,
    /// `content` (streamed deltas concatenated); empty when null.
    pub content: String,
    /// `reasoning_content`, when the server sent any.
    pub reasoning: Option<String>,
    /// Tool calls in index order.
    pub tool_calls: Vec<ToolCall>,
    /// `finish_reason`.
    pub finish_reason: Option<String>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// Token-bearing chunks received (streaming; 0 otherwise).
    pub chunks: usize,
    /// Seconds to the first token-bearing chunk (streaming only).
    pub ttft: Option<f64>,
    /// Seconds between successive token-bearing chunks (streaming only).
    pub itl: Vec<f64>,
    /// Seconds from sending the request to the end of the answer.
    pub e2el: f64,
    /// Each generated token's log-probability as sent (`logprobs.content[].logprob`, streamed
    /// chunks joined); empty when the request did not ask for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<f64>,
    /// Times the stream was dropped and resumed (background responses).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumed: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Answer {
    /// Output tokens: the usage count, else the number of token-bearing chunks.
    pub fn output_tokens(&self) -> u64 {
        self.completion_tokens.unwrap_or(self.chunks as u64)
    }

    /// What must be identical between two runs of the same greedy request: text, reasoning,
    /// tool names and arguments, finish reason, token count and, when both carry them, every
    /// token's log-probability, exactly (not ids or timings). None when they agree, else which
    /// part differs first and how.
    pub fn difference(&self, other: &Answer) -> Option<String> {
        fn first_diff(a: &str, b: &str) -> String {
            let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
            let tail = |s: &str| s.chars().skip(at).take(24).collect::<String>();
            format!("from character {at}: {:?} vs {:?}", tail(a), tail(b))
        }
        if self.content != other.content {
            return Some(format!(
                "content differs {}",
                first_diff(&self.content, &other.content)
            ));
        }
        if self.reasoning != other.reasoning {
            let (a, b) = (
                self.reasoning.as_deref().unwrap_or(""),
                other.reasoning.as_deref().unwrap_or(""),
            );
            return Some(format!("reasoning_content differs {}", first_diff(a, b)));
        }
        if self.tool_calls.len() != other.tool_calls.len() {
            return Some(format!(
                "{} tool calls vs {}",
                self.tool_calls.len(),
                other.tool_calls.len()
            ));
        }
        for (i, (a, b)) in self.tool_calls.iter().zip(&other.tool_calls).enumerate() {
            if a.name != b.name {
                return Some(format!("tool call {i}: `{}` vs `{}`", a.name, b.name));
            }
            if a.arguments != b.arguments {
                return Some(format!(
                    "tool call {i} arguments differ {}",
                    first_diff(&a.arguments, &b.arguments)
                ));
            }
        }
        if self.finish_reason != other.finish_reason {
            return Some(format!(
                "finish_reason {:?} vs {:?}",
                self.finish_reason, other.finish_reason
            ));
        }
        if let (Some(a), Some(b)) = (self.completion_tokens, other.completion_tokens)
            && a != b
        {
            return Some(format!("completion_tokens {a} vs {b}"));
        }
        if self.logprobs.is_empty() || other.logprobs.is_empty() {
            return None;
        }
        if self.logprobs.len() != other.logprobs.len() {
            return Some(format!(
                "{} token logprobs vs {}",
                self.logprobs.len(),
                other.logprobs.len()
            ));
        }
        let (i, (a, b)) = self
            .logprobs
            .iter()
            .zip(&other.logprobs)
            .enumerate()
            .find(|(_, (a, b))| a.to_bits() != b.to_bits())?;
        Some(format!(
            "logprob of token {i}: {a} vs {b} (same tokens; the numbers moved by {:.3e})",
            (a - b).abs()
        ))
    }
}

/// Why a request produced no answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFailure {
    /// The HTTP status, when one came.
    pub status: Option<u16>,
    /// The OpenAI error `type` (e.g. `model_output_error`), when the server sent an error object.
    pub error_type: Option<String>,
    /// What happened.
    pub message: String,
    /// Seconds until the failure was seen.
    pub e2el: f64,
}

impl RequestFailure {
    /// The server itself refused the model's output (dsv4's strict parser:
    /// `model_output_error`), as opposed to a transport or request problem.
    pub fn is_model_output_error(&self) -> bool {
        self.error_type.as_deref() == Some("model_output_error")
    }
}

/// The result of one request.
pub type Outcome = Result<Answer, RequestFailure>;
