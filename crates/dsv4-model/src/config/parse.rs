//! Turning config.json text into a [`ModelConfig`], with errors that name the field the JSON
//! parser stopped at (serde reports only a line and column for type errors).

use super::ModelConfig;
use crate::error::ModelError;

/// Parse config text (no validation); `origin` names the source in errors.
pub(super) fn parse_config(text: &str, origin: &str) -> Result<ModelConfig, ModelError> {
    serde_json::from_str::<ModelConfig>(text).map_err(|e| to_model_error(&e, text, origin))
}

fn to_model_error(e: &serde_json::Error, text: &str, origin: &str) -> ModelError {
    let message = e.to_string();
    if let Some(field) = missing_field(&message) {
        // serde reports a missing field just after the closing brace of its object, so the
        // key path there is the path of that object (none at the top level).
        let field = match field_path_at(text, e.line(), e.column()) {
            Some(parent) => format!("{parent}.{field}"),
            None => field,
        };
        return ModelError::ConfigMissingField {
            origin: origin.to_string(),
            field,
        };
    }
    ModelError::ConfigParse {
        origin: origin.to_string(),
        field: field_path_at(text, e.line(), e.column()),
        message,
    }
}

/// The field named by serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_string())
}

/// The dotted path of the last object key that starts before (line, column) (1-based, as
/// serde_json reports them), e.g. `rope_scaling.factor`; None when no key precedes it.
fn field_path_at(text: &str, line: usize, column: usize) -> Option<String> {
    if line == 0 {
        return None;
    }
    let line_start: usize = text
        .split_inclusive('\n')
        .take(line - 1)
        .map(str::len)
        .sum();
    let end = (line_start + column).min(text.len());
    let prefix = text.get(..end).unwrap_or(text);
    last_key_path(prefix)
}

/// Scan a JSON prefix, tracking one "current key" per open object; return the open objects'
/// current keys joined with dots.
fn last_key_path(prefix: &str) -> Option<String> {
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut last_string: Option<String> = None;
    let mut chars = prefix.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        other => s.push(other),
                    }
                }
                last_string = Some(s);
            }
            ':' => {
                if let (Some(top), Some(key)) = (stack.last_mut(), last_string.take()) {
                    *top = Some(key);
                }
            }
            '{' => stack.push(None),
            '}' => {
                stack.pop();
            }
            c if c.is_whitespace() => {}
            _ => last_string = None,
        }
    }
    let keys: Vec<String> = stack.into_iter().flatten().collect();
    (!keys.is_empty()).then(|| keys.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_path_tracks_nesting() {
        assert_eq!(last_key_path(r#"{"a": 1, "b": "#).as_deref(), Some("b"));
        assert_eq!(
            last_key_path(r#"{"a": 1, "r": {"x": 2, "factor": "#).as_deref(),
            Some("r.factor")
        );
        assert_eq!(
            last_key_path(r#"{"r": {"x": 2}, "v": "#).as_deref(),
            Some("v")
        );
        assert_eq!(last_key_path(r#"{"s": "a:b\"c", "#).as_deref(), Some("s"));
        assert_eq!(last_key_path("{"), None);
    }

    #[test]
    fn wrong_type_names_the_field() {
        let text =
            ModelConfig::tiny_json().replace("\"hidden_size\": 256", "\"hidden_size\": \"big\"");
        let err = parse_config(&text, "test").unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
    }

    #[test]
    fn nested_wrong_type_names_the_path() {
        let text = ModelConfig::tiny_json().replace("\"factor\": 16", "\"factor\": \"x\"");
        let err = parse_config(&text, "test").unwrap_err();
        assert!(err.to_string().contains("rope_scaling.factor"), "{err}");
    }

    #[test]
    fn missing_field_is_named() {
        let text = ModelConfig::tiny_json().replace("\"vocab_size\": 384,", "");
        let err = parse_config(&text, "test").unwrap_err();
        assert!(
            matches!(&err, ModelError::ConfigMissingField { field, .. } if field == "vocab_size"),
            "{err}"
        );
        let text = ModelConfig::tiny_json().replace("\"beta_slow\": 1", "\"extra\": 1");
        let err = parse_config(&text, "test").unwrap_err();
        assert!(
            matches!(&err, ModelError::ConfigMissingField { field, .. } if field == "rope_scaling.beta_slow"),
            "{err}"
        );
    }

    #[test]
    fn syntax_error_is_a_parse_error() {
        let err = parse_config("{\"vocab_size\": 3,,}", "here").unwrap_err();
        assert!(matches!(err, ModelError::ConfigParse { .. }), "{err}");
        assert!(err.to_string().starts_with("here:"), "{err}");
    }
}
