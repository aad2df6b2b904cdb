//! Tool definitions (OpenAI function tools) and JSON Schema validation of call arguments.
//!
//! A [`ToolSet`] is built once per request from the `tools` array; every tool's `parameters`
//! is compiled with the `jsonschema` crate (draft from `$schema`, 2020-12 by default), so an
//! invalid schema is reported before anything is generated. The set keeps each tool's
//! `function` object in its original key order, because the prompt shows it verbatim.

use std::fmt;

use crate::error::ToolError;
use crate::pyjson::OrderedJson;

/// One function tool: its name, its `function` object as given, and its compiled schema.
#[derive(Clone)]
pub struct ToolDef {
    name: String,
    function: OrderedJson,
    validator: Option<jsonschema::Validator>,
}

impl fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDef")
            .field("name", &self.name)
            .field("has_schema", &self.validator.is_some())
            .finish()
    }
}

impl ToolDef {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the tool asks for strict calls (`"strict": true`, as OpenAI's structured
    /// function calling and `pydantic_function_tool` send it): its arguments are then generated
    /// under its `parameters` schema, whatever `tool_choice` is.
    pub fn strict(&self) -> bool {
        matches!(self.function.get("strict"), Some(OrderedJson::Bool(true)))
    }

    /// The `function` object exactly as given (what the prompt shows).
    pub fn function(&self) -> &OrderedJson {
        &self.function
    }

    /// Checks call arguments against the tool's `parameters` schema; the error says where and
    /// why the first violation is. A tool without `parameters` accepts any object.
    pub fn validate(&self, arguments: &serde_json::Value) -> Result<(), String> {
        match &self.validator {
            Some(v) => v.validate(arguments).map_err(|e| {
                let path = e.instance_path().to_string();
                let at = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                format!("arguments of `{}` at {at}: {e}", self.name)
            }),
            None => Ok(()),
        }
    }
}

/// The tools of one request, in order, with unique names.
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    tools: Vec<ToolDef>,
}

impl ToolSet {
    /// Parses a JSON array of OpenAI function tools.
    pub fn from_json_str(text: &str) -> Result<Self, ToolError> {
        let value = OrderedJson::parse(text).map_err(|e| ToolError::Json(e.to_string()))?;
        Self::from_ordered(&value)
    }

    /// Builds the set from an already parsed JSON array of OpenAI function tools.
    pub fn from_ordered(value: &OrderedJson) -> Result<Self, ToolError> {
        let OrderedJson::Array(items) = value else {
            return Err(ToolError::Shape {
                index: 0,
                reason: format!("tools must be an array, not {}", value.type_name()),
            });
        };
        let mut tools: Vec<ToolDef> = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let def = tool_def(index, item)?;
            if tools.iter().any(|t| t.name == def.name) {
                return Err(ToolError::DuplicateName {
                    index,
                    name: def.name,
                });
            }
            tools.push(def);
        }
        Ok(Self { tools })
    }

    /// The tools in order.
    pub fn tools(&self) -> &[ToolDef] {
        &self.tools
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Whether the set has no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tool names, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name.as_str()).collect()
    }
}

fn shape(index: usize, reason: impl Into<String>) -> ToolError {
    ToolError::Shape {
        index,
        reason: reason.into(),
    }
}

fn tool_def(index: usize, item: &OrderedJson) -> Result<ToolDef, ToolError> {
    if !matches!(item, OrderedJson::Object(_)) {
        return Err(shape(
            index,
            format!("a tool must be an object, not {}", item.type_name()),
        ));
    }
    match item.get("type") {
        None => {}
        Some(t) if t.as_str() == Some("function") => {}
        Some(t) => {
            return Err(shape(
                index,
                format!("unsupported tool type {}", t.to_python_json()),
            ));
        }
    }
    let function = item
        .get("function")
        .ok_or_else(|| shape(index, "missing `function`"))?;
    if !matches!(function, OrderedJson::Object(_)) {
        return Err(shape(index, "`function` must be an object"));
    }
    let name = function
        .get("name")
        .and_then(OrderedJson::as_str)
        .ok_or_else(|| shape(index, "`function.name` must be a string"))?;
    if name.is_empty() || name.contains(['"', '<', '>']) {
        return Err(shape(
            index,
            format!("tool name {name:?} must be non-empty and free of '\"', '<' and '>'"),
        ));
    }
    match function.get("strict") {
        None | Some(OrderedJson::Null | OrderedJson::Bool(_)) => {}
        Some(other) => {
            return Err(shape(
                index,
                format!(
                    "`function.strict` must be true or false, not {}",
                    other.type_name()
                ),
            ));
        }
    }
    let validator = match function.get("parameters") {
        None | Some(OrderedJson::Null) => None,
        Some(schema @ (OrderedJson::Object(_) | OrderedJson::Bool(_))) => {
            let compiled = jsonschema::validator_for(&schema.to_value()).map_err(|e| {
                ToolError::InvalidSchema {
                    name: name.to_owned(),
                    reason: e.to_string(),
                }
            })?;
            Some(compiled)
        }
        Some(other) => {
            return Err(ToolError::InvalidSchema {
                name: name.to_owned(),
                reason: format!(
                    "a schema is an object or a boolean, not {}",
                    other.type_name()
                ),
            });
        }
    };
    Ok(ToolDef {
        name: name.to_owned(),
        function: function.clone(),
        validator,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const WEATHER: &str = r#"[{"type":"function","function":{"name":"get_weather",
        "description":"Weather","parameters":{"type":"object",
        "properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},
        "required":["city"],"additionalProperties":false}}}]"#;

    #[test]
    fn validates_arguments_against_the_schema() {
        let set = ToolSet::from_json_str(WEATHER).unwrap();
        let tool = set.get("get_weather").expect("tool is there");
        assert!(tool.validate(&json!({"city": "Paris", "days": 2})).is_ok());
        let err = tool
            .validate(&json!({"city": "Paris", "days": 0}))
            .unwrap_err();
        assert!(err.contains("/days"), "{err}");
        assert!(
            tool.validate(&json!({"days": 2})).is_err(),
            "city is required"
        );
        assert!(tool.validate(&json!({"city": 3})).is_err());
        assert!(tool.validate(&json!({"city": "x", "extra": 1})).is_err());
        assert_eq!(set.names(), ["get_weather"]);
    }

    #[test]
    fn an_invalid_schema_is_a_clear_error() {
        let bad = r#"[{"type":"function","function":{"name":"f","parameters":{"type":"strnig"}}}]"#;
        let err = ToolSet::from_json_str(bad).unwrap_err();
        assert!(
            matches!(err, ToolError::InvalidSchema { ref name, .. } if name == "f"),
            "{err}"
        );
        let bad = r#"[{"type":"function","function":{"name":"f","parameters":{"minimum":"one"}}}]"#;
        assert!(matches!(
            ToolSet::from_json_str(bad),
            Err(ToolError::InvalidSchema { .. })
        ));
        let bad = r#"[{"type":"function","function":{"name":"f","parameters":[1]}}]"#;
        assert!(matches!(
            ToolSet::from_json_str(bad),
            Err(ToolError::InvalidSchema { .. })
        ));
    }

    #[test]
    fn shape_errors_name_the_problem() {
        for (text, needle) in [
            ("{}", "must be an array"),
            ("[1]", "must be an object"),
            (r#"[{"type":"retrieval"}]"#, "unsupported tool type"),
            (r#"[{"type":"function"}]"#, "missing `function`"),
            (
                r#"[{"function":{"name":"a","strict":"yes"}}]"#,
                "`function.strict` must be true or false",
            ),
            (r#"[{"function":{"name":7}}]"#, "`function.name`"),
            (r#"[{"function":{"name":"a\"b"}}]"#, "free of"),
        ] {
            let err = ToolSet::from_json_str(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let dup = r#"[{"function":{"name":"a"}},{"function":{"name":"a"}}]"#;
        assert!(matches!(
            ToolSet::from_json_str(dup),
            Err(ToolError::DuplicateName { index: 1, .. })
        ));
        assert!(matches!(
            ToolSet::from_json_str("[{"),
            Err(ToolError::Json(_))
        ));
    }

    #[test]
    fn strict_is_read_from_the_function() {
        let set = ToolSet::from_json_str(
            r#"[{"function":{"name":"a","strict":true}},{"function":{"name":"b","strict":false}},
                {"function":{"name":"c"}}]"#,
        )
        .unwrap();
        let strict: Vec<bool> = set.tools().iter().map(ToolDef::strict).collect();
        assert_eq!(strict, [true, false, false]);
    }

    #[test]
    fn a_tool_without_parameters_accepts_any_arguments() {
        let set =
            ToolSet::from_json_str(r#"[{"type":"function","function":{"name":"now"}}]"#).unwrap();
        assert!(set.get("now").unwrap().validate(&json!({"x": 1})).is_ok());
        assert!(set.get("later").is_none());
    }
}
