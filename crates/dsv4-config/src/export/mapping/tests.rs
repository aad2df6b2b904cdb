//! The mapping table is complete (every key, every value) and consistent with the schema.

use super::*;
use crate::schema::{ValueKind, find_key};
use serde_json::{Value, json};

/// Values that exercise every row kind for a key of this kind.
fn samples(kind: ValueKind) -> Vec<Value> {
    match kind {
        ValueKind::Text => vec![json!("tiny"), json!("/models/x")],
        ValueKind::OptionalText => vec![Value::Null, json!("x"), json!("h:1")],
        ValueKind::Unsigned | ValueKind::Range(..) => vec![json!(0), json!(1), json!(7)],
        ValueKind::AutoOrUnsigned => vec![json!("auto"), json!(0), json!(7)],
        ValueKind::Bool => vec![json!(true), json!(false)],
        ValueKind::PositiveFloat => vec![json!(0.5), json!(2.0)],
        ValueKind::OneOf(names) => names.iter().map(|n| json!(n)).collect(),
        ValueKind::ListOf(names) => vec![json!([]), json!([names[0]])],
    }
}

#[test]
fn rows_name_known_keys_in_schema_order_and_spell_allowed_values() {
    let mut last_index = 0;
    for r in SGLANG_MAP {
        let index = KEYS.iter().position(|k| k.key == r.key).expect("known key");
        assert!(index >= last_index, "{} is out of KEYS order", r.key);
        last_index = index;
        let mut tests = vec![(r.key, r.when)];
        if let Some((other, test)) = r.guard {
            tests.push((other, test));
        }
        for (key, test) in tests {
            let spec = find_key(key).unwrap_or_else(|| panic!("guard key {key}"));
            if let When::Is(text) = test {
                let ok = match spec.kind {
                    ValueKind::OneOf(names) => names.contains(&text),
                    ValueKind::Bool => text == "true" || text == "false",
                    ValueKind::Text | ValueKind::OptionalText => true,
                    ValueKind::AutoOrUnsigned => text == "auto",
                    _ => false,
                };
                assert!(ok, "{key}: `{text}` is not a value it can take");
            }
        }
    }
}

#[test]
fn every_value_of_every_key_has_a_row() {
    let defaults = serde_json::to_value(crate::Profile::default()).unwrap();
    let default_of = |key: &str| {
        let spec = find_key(key).unwrap();
        defaults[spec.section()][spec.name()].clone()
    };
    for spec in KEYS {
        let guards: Vec<&str> = SGLANG_MAP
            .iter()
            .filter(|r| r.key == spec.key)
            .filter_map(|r| r.guard.map(|(g, _)| g))
            .collect();
        for v in samples(spec.kind) {
            let mut combos: Vec<Option<(&str, Value)>> = vec![None];
            for g in &guards {
                for gv in samples(find_key(g).unwrap().kind) {
                    combos.push(Some((g, gv)));
                }
            }
            for combo in combos {
                let owned: Vec<(String, Value)> = KEYS
                    .iter()
                    .map(|k| {
                        let value = if k.key == spec.key {
                            v.clone()
                        } else {
                            match &combo {
                                Some((g, gv)) if *g == k.key => gv.clone(),
                                _ => default_of(k.key),
                            }
                        };
                        (k.key.to_string(), value)
                    })
                    .collect();
                let value_of = |key: &str| {
                    &owned
                        .iter()
                        .find(|(k, _)| k == key)
                        .expect("every key has a value")
                        .1
                };
                assert!(
                    lookup(spec.key, value_of).is_some(),
                    "no row for {} = {v} with {combo:?}",
                    spec.key
                );
            }
        }
    }
}

#[test]
fn the_issue_examples_map_as_specified() {
    let find = |key: &str, v: Value| {
        let owned = v;
        let null = Value::Null;
        lookup(key, |k| if k == key { &owned } else { &null })
            .map(|r| r.action)
            .unwrap()
    };
    assert_eq!(
        find("exec.multi_stream_overlap", json!(false)),
        Action::Env("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "0")
    );
    assert_eq!(
        find("exec.overlap_schedule", json!(false)),
        Action::Flag("--disable-overlap-schedule")
    );
    assert_eq!(
        find("numerics.kv_cache_dtype", json!("fp8")),
        Action::FlagConst("--kv-cache-dtype", "fp8_e4m3")
    );
    assert_eq!(
        find("numerics.index_k_dtype", json!("fp4")),
        Action::Flag("--enable-deepseek-v4-fp4-indexer")
    );
    assert!(matches!(
        find("numerics.index_k_dtype", json!("bf16")),
        Action::Unmapped(_)
    ));
    assert_eq!(
        find("exec.cuda_graph", json!(false)),
        Action::Flag("--disable-cuda-graph")
    );
    assert_eq!(
        find("server.tool_call_parser", json!("deepseek-v4")),
        Action::FlagConst("--tool-call-parser", "deepseekv4")
    );
    assert_eq!(
        find("server.reasoning_parser", json!("deepseek-v4")),
        Action::FlagConst("--reasoning-parser", "deepseek-v4")
    );
    assert_eq!(
        find("disagg.mode", json!("prefill")),
        Action::FlagValue("--disaggregation-mode")
    );
}

#[test]
fn markdown_has_a_row_per_mapping() {
    let table = markdown_table();
    assert_eq!(table.lines().count(), SGLANG_MAP.len() + 2);
    assert!(table.contains(
        "| `exec.multi_stream_overlap` | `true` | env `SGLANG_OPT_USE_MULTI_STREAM_OVERLAP=1` |"
    ));
    assert!(table.contains("| `exec.cuda_graph_max_bs` | exec.cuda_graph = `false` | (nothing) | no graphs are captured |"));
}
