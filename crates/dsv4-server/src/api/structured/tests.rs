//! The spellings of a structured output, their refusals, and closed objects.

use super::*;
use serde_json::json;

fn so(v: Value) -> StructuredOutputs {
    serde_json::from_value(v).unwrap()
}

/// A demand for compact JSON under `schema`.
fn compact_json(schema: Value) -> Structured {
    Structured::Json {
        schema,
        whitespace: None,
    }
}

#[test]
fn each_spelling_becomes_one_shape_naming_its_field() {
    let rf: ResponseFormat = serde_json::from_value(json!({"type": "json_object"})).unwrap();
    let cases = [
        (
            Fields {
                response_format: Some(&rf),
                ..Default::default()
            },
            compact_json(json!({"type": "object"})),
            "response_format",
        ),
        (
            Fields {
                regex: Some("[0-9]+"),
                ..Default::default()
            },
            Structured::Regex("[0-9]+".into()),
            "regex",
        ),
        (
            Fields {
                ebnf: Some("root ::= \"a\""),
                ..Default::default()
            },
            Structured::Grammar("root ::= \"a\"".into()),
            "ebnf",
        ),
    ];
    for (fields, what, field) in cases {
        let shape = fields.resolve().unwrap().unwrap();
        assert_eq!((shape.what, shape.field.as_str()), (what, field));
    }
    let text: ResponseFormat = serde_json::from_value(json!({"type": "text"})).unwrap();
    let none = Fields {
        response_format: Some(&text),
        ..Default::default()
    };
    assert_eq!(none.resolve().unwrap(), None);
    for (v, what, field) in [
        (
            json!({"json": "{\"type\": \"integer\"}"}),
            compact_json(json!({"type": "integer"})),
            "structured_outputs.json",
        ),
        (
            json!({"choice": ["yes", "no"], "disable_fallback": true}),
            Structured::Choice(vec!["yes".into(), "no".into()]),
            "structured_outputs.choice",
        ),
        (
            json!({"grammar": "start: \"x\""}),
            Structured::Grammar("start: \"x\"".into()),
            "structured_outputs.grammar",
        ),
        (
            json!({"json_object": true, "disable_any_whitespace": true}),
            compact_json(json!({"type": "object"})),
            "structured_outputs.json_object",
        ),
        (
            json!({"json_object": true, "whitespace_pattern": "[ \n]*"}),
            Structured::Json {
                schema: json!({"type": "object"}),
                whitespace: Some("[ \n]*".into()),
            },
            "structured_outputs.json_object",
        ),
    ] {
        let s = so(v);
        let fields = Fields {
            structured_outputs: Some(&s),
            ..Default::default()
        };
        let shape = fields.resolve().unwrap().unwrap();
        assert_eq!((shape.what, shape.field.as_str()), (what, field));
    }
}

#[test]
fn two_demands_or_bad_ones_are_refused_naming_the_field() {
    let rf: ResponseFormat = serde_json::from_value(json!({"type": "json_object"})).unwrap();
    let s = so(json!({"regex": "a+"}));
    let both = Fields {
        response_format: Some(&rf),
        structured_outputs: Some(&s),
        ..Default::default()
    };
    let e = both.resolve().unwrap_err().body().to_string();
    assert!(
        e.contains("`response_format` and `structured_outputs.regex`"),
        "{e}"
    );
    for (v, param) in [
        (
            json!({"regex": "a", "choice": ["a"]}),
            "structured_outputs.choice",
        ),
        (json!({}), "structured_outputs"),
        (json!({"choice": []}), "structured_outputs.choice"),
        (json!({"choice": ["a", ""]}), "structured_outputs.choice"),
        (json!({"regex": ""}), "structured_outputs.regex"),
        (json!({"grammar": "  \n"}), "structured_outputs.grammar"),
        (json!({"json": "{not json"}), "structured_outputs.json"),
        (json!({"json": 3}), "structured_outputs.json"),
        (
            json!({"json": {}, "whitespace_pattern": "\\s*"}),
            "structured_outputs.whitespace_pattern",
        ),
        (
            json!({"regex": "a", "whitespace_pattern": " "}),
            "structured_outputs.whitespace_pattern",
        ),
        (
            json!({"json": {}, "whitespace_pattern": " ", "disable_any_whitespace": true}),
            "structured_outputs.whitespace_pattern",
        ),
        (
            json!({"structural_tag": {"type": "x"}}),
            "structured_outputs.structural_tag",
        ),
        (
            json!({"regex": "a", "disable_additional_properties": true}),
            "structured_outputs.disable_additional_properties",
        ),
    ] {
        let s = so(v.clone());
        let fields = Fields {
            structured_outputs: Some(&s),
            ..Default::default()
        };
        let body = fields.resolve().unwrap_err().body();
        assert_eq!(body["error"]["param"], param, "{v}: {body}");
    }
    let many: Vec<String> = (0..=MAX_CHOICES).map(|i| i.to_string()).collect();
    assert!(choice(&many, "c").is_err());
}

#[test]
fn disable_additional_properties_closes_every_open_object() {
    let s = so(json!({"json": {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "free": {"type": "object", "additionalProperties": true},
            "list": {"type": "array", "items": {"properties": {"b": {}}}},
            "fixed": {"const": {"properties": 1}}
        }
    }, "disable_additional_properties": true}));
    let fields = Fields {
        structured_outputs: Some(&s),
        ..Default::default()
    };
    let Structured::Json { schema, .. } = fields.resolve().unwrap().unwrap().what else {
        panic!("a json shape");
    };
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["inner"]["additionalProperties"], false);
    assert_eq!(schema["properties"]["free"]["additionalProperties"], true);
    assert_eq!(
        schema["properties"]["list"]["items"]["additionalProperties"],
        false
    );
    assert!(
        schema["properties"]["list"]
            .get("additionalProperties")
            .is_none()
    );
    assert_eq!(
        schema["properties"]["fixed"]["const"],
        json!({"properties": 1}),
        "data is not a schema"
    );
}
