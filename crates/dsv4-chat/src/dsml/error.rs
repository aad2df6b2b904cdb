//! Parse errors of the DSML parser: a class a client can act on, a message and a byte offset.

use std::fmt;

/// What kind of problem a completion has (the `class` of the error object).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A parameter name appears twice in one invoke.
    DuplicateParam,
    /// A parameter's `string` attribute is missing or not "true"/"false".
    BadStringFlag,
    /// A `string="false"` value is not strict JSON.
    BadJson,
    /// An invoke names a tool the request did not declare.
    UnknownTool,
    /// The arguments violate the tool's JSON Schema.
    SchemaViolation,
    /// A tool-call block, invoke or parameter is still open at the end of the completion.
    UnclosedInvoke,
    /// Any other structural problem (markup out of place, bad tags, text after the end, ...).
    Malformed,
}

impl ErrorClass {
    /// Every class, in documentation order.
    pub const ALL: [ErrorClass; 7] = [
        ErrorClass::DuplicateParam,
        ErrorClass::BadStringFlag,
        ErrorClass::BadJson,
        ErrorClass::UnknownTool,
        ErrorClass::SchemaViolation,
        ErrorClass::UnclosedInvoke,
        ErrorClass::Malformed,
    ];

    /// The snake_case name used in error objects (`"duplicate_param"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::DuplicateParam => "duplicate_param",
            ErrorClass::BadStringFlag => "bad_string_flag",
            ErrorClass::BadJson => "bad_json",
            ErrorClass::UnknownTool => "unknown_tool",
            ErrorClass::SchemaViolation => "schema_violation",
            ErrorClass::UnclosedInvoke => "unclosed_invoke",
            ErrorClass::Malformed => "malformed",
        }
    }

    /// The class with snake_case name `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a completion could not be parsed, and where (byte offset in the whole completion).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class} at byte {offset}: {message}")]
pub struct ParseError {
    /// The kind of problem.
    pub class: ErrorClass,
    /// What was wrong, in words.
    pub message: String,
    /// Byte offset (from the start of the completion) of the construct at fault.
    pub offset: usize,
}

impl ParseError {
    /// An error of `class` at `offset`.
    pub fn new(class: ErrorClass, offset: usize, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            offset,
        }
    }

    /// The OpenAI-style error object: `{"error": {"class", "message", "offset"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "class": self.class.as_str(),
                "message": self.message,
                "offset": self.offset,
            }
        })
    }
}
