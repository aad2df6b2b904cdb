//! A tool call being assembled: its parameters, the strict checks on each value, and the
//! OpenAI `arguments` JSON string it becomes.
//!
//! The arguments string is built as the reference `decode_dsml_to_arguments` builds it:
//! `{"key": value, ...}` in parameter order with Python `json.dumps` separators, a
//! `string="true"` value written as a JSON string, a `string="false"` value written as the
//! model wrote it (surrounding whitespace trimmed) after it was checked to be strict JSON.
//!
//! A number too large for a double (`1e400`, a 400-digit integer) is valid JSON that a JSON
//! schema grammar lets through; `json.loads` reads it as infinity. The arguments keep the
//! model's digits, and the schema check sees the largest finite double of its sign.

use serde_json::{Map, Value};

use super::ToolCall;
use super::error::{ErrorClass, ParseError};
use crate::pyjson::{parse_value, write_python_str};
use crate::tools::ToolSet;

/// A parameter whose value is being read.
#[derive(Debug)]
pub(crate) struct PendingParam {
    name: String,
    is_string: bool,
    /// The raw value text so far.
    pub value: String,
    /// Stream offset of the first value byte.
    pub value_start: usize,
}

impl PendingParam {
    /// A parameter opened by a tag; its value starts at stream offset `value_start`.
    pub fn new(name: String, is_string: bool, value_start: usize) -> Self {
        Self {
            name,
            is_string,
            value: String::new(),
            value_start,
        }
    }
}

/// An invoke whose parameters are being read.
#[derive(Debug)]
pub(crate) struct PendingCall {
    pub name: String,
    /// Stream offset of the `<｜DSML｜invoke` tag.
    pub start: usize,
    /// (name, JSON text of the value, parsed value).
    params: Vec<(String, String, Value)>,
}

impl PendingCall {
    /// A call of tool `name` whose tag starts at stream offset `start`.
    pub fn new(name: String, start: usize) -> Self {
        Self {
            name,
            start,
            params: Vec::new(),
        }
    }

    /// Whether a parameter named `name` was already read.
    pub fn has_param(&self, name: &str) -> bool {
        self.params.iter().any(|(n, _, _)| n == name)
    }

    /// Adds a finished parameter; a `string="false"` value must be strict JSON.
    pub fn push(&mut self, param: PendingParam) -> Result<(), ParseError> {
        let (text, value) = if param.is_string {
            let mut text = String::with_capacity(param.value.len() + 2);
            write_python_str(&param.value, &mut text);
            (text, Value::String(param.value))
        } else {
            let trimmed = param.value.trim_matches(|c: char| c.is_ascii_whitespace());
            let value = parse_value(trimmed).map_err(|e| {
                ParseError::new(
                    ErrorClass::BadJson,
                    param.value_start,
                    format!(
                        "parameter `{}` of `{}` has string=\"false\" but its value is not strict JSON ({e}); \
                         write JSON, or set string=\"true\" for text",
                        param.name, self.name
                    ),
                )
            })?;
            (trimmed.to_owned(), value)
        };
        self.params.push((param.name, text, value));
        Ok(())
    }

    /// The finished call (number `index` in the completion), checked against its tool's
    /// schema when the request declared tools.
    pub fn finish(self, index: usize, tools: Option<&ToolSet>) -> Result<ToolCall, ParseError> {
        if let Some(tool) = tools.and_then(|t| t.get(&self.name)) {
            let object: Map<String, Value> = self
                .params
                .iter()
                .map(|(k, _, v)| (k.clone(), v.clone()))
                .collect();
            tool.validate(&Value::Object(object))
                .map_err(|why| ParseError::new(ErrorClass::SchemaViolation, self.start, why))?;
        }
        let mut arguments = String::from("{");
        for (i, (key, text, _)) in self.params.iter().enumerate() {
            if i > 0 {
                arguments.push_str(", ");
            }
            write_python_str(key, &mut arguments);
            arguments.push_str(": ");
            arguments.push_str(text);
        }
        arguments.push('}');
        Ok(ToolCall {
            index,
            name: self.name,
            arguments,
        })
    }
}
