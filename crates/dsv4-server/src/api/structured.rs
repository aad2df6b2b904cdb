//! Structured outputs: what a request asks its answer to follow beyond free text — a JSON
//! schema, a regular expression, one of a list of choices, or a grammar (Lark, or GBNF as
//! llama.cpp, xgrammar and SGLang's `ebnf` write it) — from whichever field spells it:
//! OpenAI's `response_format`, vLLM's `structured_outputs` object, SGLang's `regex` and
//! `ebnf` extensions, or `/generate`'s `json_schema`, `regex` and `ebnf` sampling parameters.
//! A request may ask for one; two are refused, naming both.
//!
//! vLLM's field names and meanings: <https://docs.vllm.ai/en/latest/features/structured_outputs/>
//! (its older `guided_*` fields were removed in vLLM 0.12 and are not taken here).

use crate::error::ApiError;
use crate::grammar::Target;
use crate::grammar::structural::{Format, StructuralTag};
use serde::Deserialize;
use serde_json::Value;

mod whitespace;

/// Most entries of a `choice` list.
pub const MAX_CHOICES: usize = 1024;

/// What the answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Structured {
    /// One JSON value valid under this schema.
    Json {
        /// The schema.
        schema: Value,
        /// A regular expression for the whitespace between the JSON text's tokens, matching
        /// only JSON whitespace (None: compact, with Python's separators).
        whitespace: Option<String>,
    },
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this grammar: Lark, or GBNF (some rule defined with `::=`, start rule `root`).
    Grammar(String),
    /// Text of this structural-tag format.
    Structural(Format),
}

/// A structured-output demand and the request field that made it (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// What the answer must be.
    pub what: Structured,
    /// The field, e.g. `response_format` or `structured_outputs.regex`.
    pub field: String,
}

impl Shape {
    /// A demand for JSON under `schema`, made by `field`.
    pub fn json(schema: Value, field: &str) -> Self {
        Self {
            what: Structured::Json {
                schema,
                whitespace: None,
            },
            field: field.to_string(),
        }
    }

    /// What the grammar compiler makes of it.
    pub fn target(&self) -> Target<'_> {
        match &self.what {
            Structured::Json { schema, whitespace } => Target::Json {
                schema,
                whitespace: whitespace.as_deref(),
            },
            Structured::Regex(rx) => Target::Regex(rx),
            Structured::Choice(c) => Target::Choice(c),
            Structured::Grammar(g) => Target::Grammar(g),
            Structured::Structural(f) => Target::Structural(f),
        }
    }
}

/// `response_format` of chat and text completions.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
    /// Text following a structural tag (vLLM's and SGLang's extension).
    StructuralTag(StructuralTag),
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: String,
    /// What the schema is for.
    pub description: Option<String>,
    /// The JSON Schema (default: any JSON value).
    pub schema: Option<Value>,
    /// Always enforced here.
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// The schema this format asks for (None: free text or a structural tag).
    pub fn schema(&self) -> Option<Value> {
        match self {
            ResponseFormat::Text | ResponseFormat::StructuralTag(_) => None,
            ResponseFormat::JsonObject => Some(serde_json::json!({"type": "object"})),
            ResponseFormat::JsonSchema { json_schema } => Some(
                json_schema
                    .schema
                    .clone()
                    .unwrap_or_else(|| serde_json::json!({})),
            ),
        }
    }
}

/// vLLM's `structured_outputs` object (one of `json`, `regex`, `choice`, `grammar`,
/// `json_object`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or its JSON text).
    pub json: Option<Value>,
    /// A regular expression the whole answer matches.
    pub regex: Option<String>,
    /// The answer is exactly one of these strings.
    pub choice: Option<Vec<String>>,
    /// A grammar: Lark, or GBNF (xgrammar's EBNF).
    pub grammar: Option<String>,
    /// true: any JSON object.
    pub json_object: Option<bool>,
    /// Accepted: there is no other grammar backend to fall back to.
    pub disable_fallback: Option<bool>,
    /// Accepted: JSON answers are compact here unless `whitespace_pattern` is given
    /// (Python's separators, no other whitespace), which is what `true` asks for.
    pub disable_any_whitespace: Option<bool>,
    /// true: objects of the `json` schema that do not say otherwise take no properties
    /// beyond those they list.
    pub disable_additional_properties: Option<bool>,
    /// A regular expression for the whitespace between the tokens of a `json` or
    /// `json_object` answer (outlines' whitespace pattern); it may match only JSON whitespace.
    pub whitespace_pattern: Option<String>,
    /// A structural tag (an object, or its JSON text).
    pub structural_tag: Option<Value>,
}

/// The structured-output fields of a chat or text completion request.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fields<'a> {
    /// OpenAI's `response_format`.
    pub response_format: Option<&'a ResponseFormat>,
    /// vLLM's `structured_outputs`.
    pub structured_outputs: Option<&'a StructuredOutputs>,
    /// SGLang's `regex`.
    pub regex: Option<&'a str>,
    /// SGLang's `ebnf`.
    pub ebnf: Option<&'a str>,
}

impl Fields<'_> {
    /// The one demand these fields make, if any; two or more are refused, naming them.
    pub fn resolve(&self) -> Result<Option<Shape>, ApiError> {
        let mut shapes = Vec::new();
        match self.response_format {
            Some(ResponseFormat::StructuralTag(tag)) => {
                shapes.push(structural(tag, "response_format")?);
            }
            Some(f) => {
                if let Some(schema) = f.schema() {
                    shapes.push(Shape::json(schema, "response_format"));
                }
            }
            None => {}
        }
        if let Some(so) = self.structured_outputs {
            shapes.extend(structured_outputs(so)?);
        }
        if let Some(rx) = self.regex {
            shapes.push(regex(rx, "regex")?);
        }
        if let Some(g) = self.ebnf {
            shapes.push(grammar(g, "ebnf")?);
        }
        one(shapes)
    }
}

/// At most one of `shapes`.
pub fn one(mut shapes: Vec<Shape>) -> Result<Option<Shape>, ApiError> {
    if shapes.len() > 1 {
        let names: Vec<String> = shapes.iter().map(|s| format!("`{}`", s.field)).collect();
        return Err(ApiError::bad_param(
            shapes[1].field.clone(),
            format!(
                "{} each constrain the answer; send only one",
                names.join(" and ")
            ),
        ));
    }
    Ok(shapes.pop())
}

/// The demands of a `structured_outputs` object (several are refused by [`one`]).
fn structured_outputs(so: &StructuredOutputs) -> Result<Vec<Shape>, ApiError> {
    let field = |k: &str| format!("structured_outputs.{k}");
    let whitespace = so.whitespace_pattern.clone();
    if let Some(p) = &whitespace {
        whitespace::check(p).map_err(|why| {
            ApiError::bad_param(
                field("whitespace_pattern"),
                format!("`whitespace_pattern` {p:?} cannot be used: {why}"),
            )
        })?;
        if so.disable_any_whitespace == Some(true) {
            return Err(ApiError::bad_param(
                field("whitespace_pattern"),
                "`disable_any_whitespace: true` and `whitespace_pattern` each say what \
                 whitespace JSON answers have; send one",
            ));
        }
    }
    let json_shape = |schema: Value, name: &str| Shape {
        what: Structured::Json {
            schema,
            whitespace: whitespace.clone(),
        },
        field: field(name),
    };
    let mut shapes = Vec::new();
    if let Some(v) = so.structural_tag.as_ref().filter(|v| !v.is_null()) {
        shapes.push(structural_value(v, &field("structural_tag"))?);
    }
    if let Some(v) = so.json.as_ref().filter(|v| !v.is_null()) {
        let mut schema = schema(v, &field("json"))?;
        if so.disable_additional_properties == Some(true) {
            close_objects(&mut schema);
        }
        shapes.push(json_shape(schema, "json"));
    } else if so.disable_additional_properties == Some(true) {
        return Err(ApiError::bad_param(
            field("disable_additional_properties"),
            "disable_additional_properties applies to a `json` schema; send one",
        ));
    }
    if so.json_object == Some(true) {
        shapes.push(json_shape(
            serde_json::json!({"type": "object"}),
            "json_object",
        ));
    }
    if whitespace.is_some()
        && shapes
            .iter()
            .all(|s| !matches!(s.what, Structured::Json { .. }))
    {
        return Err(ApiError::bad_param(
            field("whitespace_pattern"),
            "whitespace_pattern applies to a `json` schema or `json_object: true`; send one",
        ));
    }
    if let Some(rx) = &so.regex {
        shapes.push(regex(rx, &field("regex"))?);
    }
    if let Some(c) = &so.choice {
        shapes.push(choice(c, &field("choice"))?);
    }
    if let Some(g) = &so.grammar {
        shapes.push(grammar(g, &field("grammar"))?);
    }
    if shapes.is_empty() {
        return Err(ApiError::bad_param(
            "structured_outputs",
            "structured_outputs names nothing to follow; give one of `json`, `regex`, \
             `choice`, `grammar`, `structural_tag` or `json_object: true`",
        ));
    }
    Ok(shapes)
}

/// A JSON schema given as an object (or `true`/`false`) or as its JSON text.
pub fn schema(v: &Value, field: &str) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::bad_param(field, format!("`{field}` is not valid JSON: {e}"))),
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        other => Err(ApiError::bad_param(
            field,
            format!("`{field}` is a JSON schema (an object, or its JSON text), not {other}"),
        )),
    }
}

/// A structural-tag demand made by `field`; its shape is checked here, its strings and
/// schemas when the grammar is compiled.
fn structural(tag: &StructuralTag, field: &str) -> Result<Shape, ApiError> {
    let format = tag
        .resolve()
        .map_err(|e| ApiError::bad_param(field, format!("`{field}`: {e}")))?;
    Ok(Shape {
        what: Structured::Structural(format),
        field: field.to_string(),
    })
}

/// A structural tag given as an object or as its JSON text (vLLM's
/// `structured_outputs.structural_tag`, SGLang's `sampling_params.structural_tag`), with or
/// without `"type": "structural_tag"`.
pub fn structural_value(v: &Value, field: &str) -> Result<Shape, ApiError> {
    let bad = |m: String| ApiError::bad_param(field, format!("`{field}`: {m}"));
    let mut v = match v {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| bad(format!("not valid JSON: {e}")))?
        }
        other => other.clone(),
    };
    let Value::Object(o) = &mut v else {
        return Err(bad("a structural tag is a JSON object".into()));
    };
    match o.remove("type") {
        None => {}
        Some(Value::String(t)) if t == "structural_tag" => {}
        Some(t) => {
            return Err(bad(format!(
                "type is {t}; a structural tag's is \"structural_tag\""
            )));
        }
    }
    let tag: StructuralTag = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
    structural(&tag, field)
}

/// A regular-expression demand (its syntax is checked when the grammar is compiled).
pub fn regex(rx: &str, field: &str) -> Result<Shape, ApiError> {
    if rx.is_empty() {
        return Err(ApiError::bad_param(
            field,
            format!("`{field}` is empty; give a regular expression"),
        ));
    }
    Ok(Shape {
        what: Structured::Regex(rx.to_string()),
        field: field.to_string(),
    })
}

/// A grammar demand (its syntax is checked when it is compiled).
pub fn grammar(g: &str, field: &str) -> Result<Shape, ApiError> {
    if g.trim().is_empty() {
        return Err(ApiError::bad_param(
            field,
            format!("`{field}` is empty; give a grammar (Lark, or GBNF with a `root` rule)"),
        ));
    }
    Ok(Shape {
        what: Structured::Grammar(g.to_string()),
        field: field.to_string(),
    })
}

/// A choice demand: 1 to [`MAX_CHOICES`] strings, none empty.
fn choice(c: &[String], field: &str) -> Result<Shape, ApiError> {
    let bad = |m: String| Err(ApiError::bad_param(field, m));
    if c.is_empty() || c.len() > MAX_CHOICES {
        return bad(format!(
            "`{field}` must list 1 to {MAX_CHOICES} strings, not {}",
            c.len()
        ));
    }
    if let Some(i) = c.iter().position(String::is_empty) {
        return bad(format!(
            "`{field}[{i}]` is empty; every choice is a non-empty string"
        ));
    }
    Ok(Shape {
        what: Structured::Choice(c.to_vec()),
        field: field.to_string(),
    })
}

/// Give every object schema in `schema` that does not say otherwise
/// `"additionalProperties": false` (vLLM's `disable_additional_properties`). Only schema
/// keywords are walked, so `const`, `enum` and `default` values stay as given.
fn close_objects(schema: &mut Value) {
    let Value::Object(o) = schema else {
        return;
    };
    let is_object = o.get("type").is_some_and(|t| t == "object") || o.contains_key("properties");
    if is_object && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, v) in o.iter_mut() {
        match (key.as_str(), v) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(close_objects)
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => {
                a.iter_mut().for_each(close_objects)
            }
            ("items" | "additionalProperties" | "not" | "if" | "then" | "else", v) => {
                close_objects(v)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
