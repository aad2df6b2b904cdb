//! The table of every configuration key: its type, allowed values and meaning.
//!
//! Profile files, `DSV4_*` environment variables and `--set` arguments are all checked against [`KEYS`]
//! before figment merges them, so every bad key or value is reported with where it came from and what
//! would have been accepted. Adding a knob means adding a field to [`crate::Profile`] and a row here.

mod keys;
mod suggest;

pub use keys::KEYS;
pub(crate) use suggest::levenshtein;
pub use suggest::{suggest_key, suggest_section, unknown_key_hint, unknown_section_hint};

use figment::value::{Empty, Value};

/// Registry names of the backends the project defines (the registry says which are built into a binary).
pub const BACKEND_KINDS: &[&str] = &["reference", "cpu", "wgpu", "cuda-sm120", "cuda-emu"];

/// Keys whose values are secrets: shown as [`REDACTED`] by `profile show/explain/diff`.
pub const SECRET_KEYS: &[&str] = &["server.api_key"];

/// What a secret value is displayed as.
pub const REDACTED: &str = "<redacted>";

/// What values a key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// Any string.
    Text,
    /// Any string; the empty string leaves the key unset.
    OptionalText,
    /// A non-negative integer.
    Unsigned,
    /// The string `auto` (the component's own choice) or a non-negative integer.
    AutoOrUnsigned,
    /// An integer in `min..=max`.
    Range(u64, u64),
    /// `true` or `false`.
    Bool,
    /// A finite number greater than zero (an integer is accepted as a number).
    PositiveFloat,
    /// One of a fixed list of strings.
    OneOf(&'static [&'static str]),
    /// A list of distinct strings from a fixed set; written `a,b` in the environment and `--set`.
    ListOf(&'static [&'static str]),
}

impl ValueKind {
    /// A phrase describing the accepted values, for error messages and docs.
    pub fn expected(&self) -> String {
        match self {
            ValueKind::Text => "a string".to_string(),
            ValueKind::OptionalText => "a string (empty to unset)".to_string(),
            ValueKind::Unsigned => "a non-negative integer".to_string(),
            ValueKind::AutoOrUnsigned => "\"auto\" or a non-negative integer".to_string(),
            ValueKind::Range(min, max) => format!("an integer from {min} to {max}"),
            ValueKind::Bool => "true or false".to_string(),
            ValueKind::PositiveFloat => "a number greater than 0".to_string(),
            ValueKind::OneOf(names) => format!("one of: {}", names.join(", ")),
            ValueKind::ListOf(names) => format!(
                "a list of distinct names from: {} (comma-separated in the environment and \
                 --set; empty for none)",
                names.join(", ")
            ),
        }
    }

    /// The type column of the docs table.
    pub fn type_name(&self) -> &'static str {
        match self {
            ValueKind::Text | ValueKind::OneOf(_) => "string",
            ValueKind::OptionalText => "string, optional",
            ValueKind::Unsigned | ValueKind::Range(..) => "integer",
            ValueKind::AutoOrUnsigned => "integer or `auto`",
            ValueKind::Bool => "bool",
            ValueKind::PositiveFloat => "float",
            ValueKind::ListOf(_) => "list of strings",
        }
    }

    /// Parse the text of an environment variable or `--set` value into a typed value.
    pub fn parse_text(&self, raw: &str) -> Option<Value> {
        let raw = raw.trim();
        match self {
            ValueKind::Text => Some(Value::from(raw)),
            ValueKind::OptionalText if raw.is_empty() => Some(Value::from(Empty::None)),
            ValueKind::OptionalText => Some(Value::from(raw)),
            ValueKind::Unsigned => raw.parse::<u64>().ok().map(Value::from),
            ValueKind::AutoOrUnsigned if raw == "auto" => Some(Value::from(raw)),
            ValueKind::AutoOrUnsigned => raw.parse::<u64>().ok().map(Value::from),
            ValueKind::Range(min, max) => raw
                .parse::<u64>()
                .ok()
                .filter(|v| (*min..=*max).contains(v))
                .map(Value::from),
            ValueKind::Bool => match raw {
                "true" => Some(Value::from(true)),
                "false" => Some(Value::from(false)),
                _ => None,
            },
            ValueKind::PositiveFloat => raw
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(Value::from),
            ValueKind::OneOf(names) => names.contains(&raw).then(|| Value::from(raw)),
            ValueKind::ListOf(names) => {
                let items: Vec<&str> = raw
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                list_ok(names, &items).then(|| Value::from(items))
            }
        }
    }

    /// Whether a value that came typed from a TOML file is acceptable.
    pub fn accepts(&self, value: &Value) -> bool {
        match (self, value) {
            (ValueKind::Text | ValueKind::OptionalText, Value::String(_, _)) => true,
            (ValueKind::AutoOrUnsigned, Value::String(_, s)) => s == "auto",
            (ValueKind::Unsigned | ValueKind::AutoOrUnsigned, Value::Num(_, n)) => {
                n.to_u128_lossy().is_some_and(|v| v <= u128::from(u64::MAX))
            }
            (ValueKind::Range(min, max), Value::Num(_, n)) => n
                .to_u128_lossy()
                .is_some_and(|v| (u128::from(*min)..=u128::from(*max)).contains(&v)),
            (ValueKind::Bool, Value::Bool(_, _)) => true,
            (ValueKind::PositiveFloat, Value::Num(_, n)) => {
                let v = n.to_f64().or_else(|| n.to_i128().map(|i| i as f64));
                let v = v.or_else(|| n.to_u128_lossy().map(|u| u as f64));
                v.is_some_and(|v| v.is_finite() && v > 0.0)
            }
            (ValueKind::OneOf(names), Value::String(_, s)) => names.contains(&s.as_str()),
            (ValueKind::ListOf(names), Value::Array(_, items)) => {
                let strings: Option<Vec<&str>> = items.iter().map(|v| v.as_str()).collect();
                strings.is_some_and(|s| list_ok(names, &s))
            }
            _ => false,
        }
    }
}

/// Whether every item is an allowed name and none repeats.
fn list_ok(names: &[&str], items: &[&str]) -> bool {
    items
        .iter()
        .enumerate()
        .all(|(i, item)| names.contains(item) && !items[..i].contains(item))
}

/// One configuration key.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    /// Dotted name, `section.key`.
    pub key: &'static str,
    /// Accepted values.
    pub kind: ValueKind,
    /// The built-in default, as written in a profile file (empty: unset).
    pub default: &'static str,
    /// What the key does.
    pub doc: &'static str,
}

impl KeySpec {
    /// The section part of the key (`numerics` in `numerics.kv_cache_dtype`).
    pub fn section(&self) -> &'static str {
        self.key.split_once('.').map_or(self.key, |(s, _)| s)
    }

    /// The key within its section (`kv_cache_dtype` in `numerics.kv_cache_dtype`).
    pub fn name(&self) -> &'static str {
        self.key.split_once('.').map_or(self.key, |(_, n)| n)
    }

    /// Whether the value is a secret (never displayed).
    pub fn is_secret(&self) -> bool {
        SECRET_KEYS.contains(&self.key)
    }
}

/// The spec of a dotted key, if it exists.
pub fn find_key(key: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.key == key)
}

/// The section names, in display order, without repeats.
pub fn sections() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for k in KEYS {
        if !out.contains(&k.section()) {
            out.push(k.section());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Profile;

    #[test]
    fn keys_match_the_profile_struct() {
        let json = serde_json::to_value(Profile::default()).unwrap();
        let mut from_struct = Vec::new();
        for (section, fields) in json.as_object().unwrap() {
            for (name, value) in fields.as_object().unwrap() {
                from_struct.push(format!("{section}.{name}"));
                let spec = find_key(&format!("{section}.{name}")).expect("key in KEYS");
                let default = match value {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                };
                assert_eq!(spec.default, default, "documented default of {}", spec.key);
                let typed = spec.kind.parse_text(&default).or_else(|| {
                    // a list default is written `[]` in KEYS and parsed from its comma form
                    (default == "[]")
                        .then(|| spec.kind.parse_text(""))
                        .flatten()
                });
                let typed = typed.unwrap_or_else(|| panic!("default of {} parses", spec.key));
                // an unset default has no TOML spelling; every other default is a valid file value
                let unset = matches!(typed, Value::Empty(..));
                assert!(
                    unset || spec.kind.accepts(&typed),
                    "default of {} accepted",
                    spec.key
                );
            }
        }
        let mut from_table: Vec<String> = KEYS.iter().map(|k| k.key.to_string()).collect();
        from_struct.sort();
        from_table.sort();
        assert_eq!(from_struct, from_table);
    }

    #[test]
    fn every_section_has_keys_in_one_block() {
        let mut seen: Vec<&str> = Vec::new();
        for k in KEYS {
            if seen.last() != Some(&k.section()) {
                assert!(!seen.contains(&k.section()), "{} is split", k.section());
                seen.push(k.section());
            }
        }
        assert_eq!(
            seen,
            [
                "model",
                "backend",
                "numerics",
                "exec",
                "cache",
                "scheduler",
                "server",
                "debug",
                "disagg"
            ]
        );
    }

    #[test]
    fn text_values_are_typed() {
        let threads = find_key("exec.threads").unwrap().kind;
        assert_eq!(threads.parse_text("4"), Some(Value::from(4u64)));
        assert_eq!(threads.parse_text("-1"), None);
        let kv = find_key("numerics.kv_cache_dtype").unwrap().kind;
        assert_eq!(kv.parse_text("fp8"), Some(Value::from("fp8")));
        assert_eq!(kv.parse_text("fp16"), None);
        assert!(kv.expected().contains("bf16, fp8"));
        let dev = find_key("backend.device").unwrap().kind;
        assert_eq!(dev.parse_text(""), Some(Value::from(Empty::None)));
        let graphs = find_key("exec.cuda_graph").unwrap().kind;
        assert_eq!(graphs.parse_text("true"), Some(Value::from(true)));
        assert_eq!(graphs.parse_text("yes"), None);
        let ratio = find_key("cache.hicache_ratio").unwrap().kind;
        assert_eq!(ratio.parse_text("2.5"), Some(Value::from(2.5)));
        for bad in ["0", "-1", "nan", "inf", "x"] {
            assert_eq!(ratio.parse_text(bad), None, "{bad}");
        }
        let port = find_key("server.port").unwrap().kind;
        assert_eq!(port.parse_text("8080"), Some(Value::from(8080u64)));
        assert_eq!(port.parse_text("0"), None);
        assert_eq!(port.parse_text("65536"), None);
        let inject = find_key("debug.inject").unwrap().kind;
        assert_eq!(
            inject.parse_text(" skip-index-k-transfer-wait , "),
            Some(Value::from(vec!["skip-index-k-transfer-wait"]))
        );
        assert_eq!(inject.parse_text(""), Some(Value::from(Vec::<&str>::new())));
        assert_eq!(inject.parse_text("nope"), None);
        let twice = "stale-page-reuse,stale-page-reuse";
        assert_eq!(inject.parse_text(twice), None);
        let pages = find_key("backend.cuda_page_cache_mib").unwrap().kind;
        assert_eq!(pages.parse_text(" auto "), Some(Value::from("auto")));
        assert_eq!(pages.parse_text("0"), Some(Value::from(0u64)));
        assert_eq!(pages.parse_text("2048"), Some(Value::from(2048u64)));
        for bad in ["-1", "1.5", "Auto", "1G", ""] {
            assert_eq!(pages.parse_text(bad), None, "{bad}");
        }
        let canary = find_key("debug.canary").unwrap().kind;
        assert_eq!(
            canary.parse_text("index_k,kv"),
            Some(Value::from(vec!["index_k", "kv"]))
        );
        assert_eq!(canary.parse_text("true"), None);
    }

    #[test]
    fn file_values_are_checked() {
        let threads = ValueKind::Unsigned;
        assert!(threads.accepts(&Value::from(2u64)));
        assert!(threads.accepts(&Value::from(2i64)));
        assert!(!threads.accepts(&Value::from(-2i64)));
        assert!(!threads.accepts(&Value::from("2")));
        assert!(!ValueKind::OneOf(&["a"]).accepts(&Value::from("b")));
        assert!(ValueKind::Bool.accepts(&Value::from(false)));
        assert!(!ValueKind::Bool.accepts(&Value::from("false")));
        assert!(ValueKind::PositiveFloat.accepts(&Value::from(2i64)));
        assert!(ValueKind::PositiveFloat.accepts(&Value::from(0.5)));
        assert!(!ValueKind::PositiveFloat.accepts(&Value::from(0.0)));
        assert!(!ValueKind::PositiveFloat.accepts(&Value::from(f64::NAN)));
        assert!(!ValueKind::Range(1, 9).accepts(&Value::from(10u64)));
        let pages = ValueKind::AutoOrUnsigned;
        assert!(pages.accepts(&Value::from("auto")));
        assert!(pages.accepts(&Value::from(512i64)));
        assert!(!pages.accepts(&Value::from(-1i64)));
        assert!(!pages.accepts(&Value::from("512")));
        assert!(!pages.accepts(&Value::from(true)));
        let list = ValueKind::ListOf(&["a", "b"]);
        assert!(list.accepts(&Value::from(vec!["b", "a"])));
        assert!(!list.accepts(&Value::from(vec!["a", "a"])));
        assert!(!list.accepts(&Value::from(vec![1u64])));
        assert!(!list.accepts(&Value::from("a")));
    }
}

#[cfg(test)]
mod doc_tests {
    use super::*;

    #[test]
    fn docs_profiles_md_lists_every_key_with_type_and_default() {
        let doc = include_str!("../../../../docs/profiles.md");
        for spec in KEYS {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", spec.key)))
                .unwrap_or_else(|| panic!("docs/profiles.md has no row for `{}`", spec.key));
            let default = if spec.default.is_empty() {
                "unset".to_string()
            } else {
                format!("`{}`", spec.default)
            };
            assert!(
                row.contains(&format!("| {default} |")),
                "default of {}: {row}",
                spec.key
            );
            assert!(
                row.contains(&format!("| {} |", spec.kind.type_name())),
                "type of {} should be `{}`: {row}",
                spec.key,
                spec.kind.type_name()
            );
            if let ValueKind::OneOf(names) | ValueKind::ListOf(names) = spec.kind {
                for n in names {
                    assert!(
                        row.contains(&format!("`{n}`")),
                        "{} lacks `{n}`: {row}",
                        spec.key
                    );
                }
            }
        }
    }
}
