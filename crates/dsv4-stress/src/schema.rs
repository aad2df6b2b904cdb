//! A small JSON Schema checker for tool-call arguments: the keywords tool schemas use in practice
//! (`type`, `properties`, `required`, `additionalProperties`, `enum`, `minimum`, `maximum`,
//! `minLength`, `maxLength`, `pattern`, `items`, `minItems`, `maxItems`). Other keywords are ignored, so a
//! schema the checker does not understand never produces a false violation.

use serde_json::Value;

/// Every way `value` breaks `schema`, each as `PATH: what` (empty when it conforms).
pub fn violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, value, "$", &mut out);
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    let have = type_name(v);
    have == want || (want == "number" && have == "integer")
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        if schema == &Value::Bool(false) {
            out.push(format!("{path}: not allowed here"));
        }
        return;
    };
    match s.get("type") {
        Some(Value::String(t)) if !type_matches(t, value) => {
            out.push(format!("{path}: expected {t}, got {}", type_name(value)));
            return;
        }
        Some(Value::Array(ts))
            if !ts
                .iter()
                .any(|t| t.as_str().is_some_and(|t| type_matches(t, value))) =>
        {
            out.push(format!(
                "{path}: {} is none of the allowed types",
                type_name(value)
            ));
            return;
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.contains(value)
    {
        out.push(format!(
            "{path}: {value} is not one of {}",
            Value::Array(allowed.clone())
        ));
    }
    if let Some(x) = value.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && x < min
        {
            out.push(format!("{path}: {x} is below the minimum {min}"));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && x > max
        {
            out.push(format!("{path}: {x} is above the maximum {max}"));
        }
    }
    if let Some(text) = value.as_str() {
        let n = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && n < min
        {
            out.push(format!(
                "{path}: {n} characters, fewer than minLength {min}"
            ));
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && n > max
        {
            out.push(format!("{path}: {n} characters, more than maxLength {max}"));
        }
        // An invalid pattern is the schema's problem, not the answer's: it is skipped.
        if let Some(p) = s.get("pattern").and_then(Value::as_str)
            && let Ok(re) = regex::Regex::new(p)
            && !re.is_match(text)
        {
            out.push(format!("{path}: {text:?} does not match the pattern {p:?}"));
        }
    }
    if let Some(items) = value.as_array() {
        let n = items.len() as u64;
        if let Some(min) = s.get("minItems").and_then(Value::as_u64)
            && n < min
        {
            out.push(format!("{path}: {n} items, fewer than minItems {min}"));
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
            && n > max
        {
            out.push(format!("{path}: {n} items, more than maxItems {max}"));
        }
        if let Some(item_schema) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(item_schema, item, &format!("{path}[{i}]"), out);
            }
        }
    }
    if let Some(obj) = value.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = s.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(name) {
                    out.push(format!("{path}: the required property `{name}` is missing"));
                }
            }
        }
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => check(sub, v, &format!("{path}.{k}"), out),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        out.push(format!("{path}: the property `{k}` is not in the schema"))
                    }
                    Some(extra @ Value::Object(_)) => check(extra, v, &format!("{path}.{k}"), out),
                    _ => {}
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "pattern": "^[a-z.]+$"},
                "lines": {"type": "integer", "minimum": 1, "maximum": 100},
                "mode": {"type": "string", "enum": ["r", "w"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "ratio": {"type": "number"}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    #[test]
    fn conforming_arguments_have_no_violations() {
        let v = json!({"path": "a.rs", "lines": 3, "mode": "r", "tags": ["x"], "ratio": 2});
        assert_eq!(violations(&schema(), &v), Vec::<String>::new());
        assert!(violations(&schema(), &json!({"path": "b", "ratio": 0.5})).is_empty());
    }

    #[test]
    fn each_kind_of_violation_is_reported_with_its_path() {
        let cases = [
            (json!({}), "required property `path`"),
            (json!({"path": 3}), "$.path: expected string"),
            (json!({"path": ""}), "minLength"),
            (json!({"path": "A.rs"}), "does not match the pattern"),
            (json!({"path": "a", "lines": 0}), "below the minimum"),
            (json!({"path": "a", "lines": 101}), "above the maximum"),
            (json!({"path": "a", "lines": 1.5}), "expected integer"),
            (json!({"path": "a", "mode": "x"}), "is not one of"),
            (
                json!({"path": "a", "tags": [1]}),
                "$.tags[0]: expected string",
            ),
            (json!({"path": "a", "tags": ["a", "b", "c"]}), "maxItems"),
            (
                json!({"path": "a", "extra": true}),
                "`extra` is not in the schema",
            ),
            (json!([1]), "expected object"),
        ];
        for (v, want) in cases {
            let got = violations(&schema(), &v);
            assert!(got.iter().any(|m| m.contains(want)), "{v}: {got:?}");
        }
    }
}
