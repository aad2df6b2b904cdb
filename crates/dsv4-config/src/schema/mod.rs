//! The table of every configuration key: its type, allowed values and meaning.
//!
//! Profile files, `DSV4_*` environment variables and `--set` arguments are all checked against [`KEYS`]
//! before figment merges them, so every bad key or value is reported with where it came from and what
//! would have been accepted. Adding a knob means adding a field to [`crate::Profile`] and a row here.

use dsv4_core::numerics::{ActQuant, IndexKDtype, KvCacheDtype};
use figment::value::{Empty, Value};

/// Registry names of the backends the project defines (the registry says which are built into a binary).
pub const BACKEND_KINDS: &[&str] = &["reference", "cpu", "wgpu", "cuda-sm120"];

/// What values a key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// Any string.
    Text,
    /// Any string; the empty string leaves the key unset.
    OptionalText,
    /// A non-negative integer.
    Unsigned,
    /// One of a fixed list of strings.
    OneOf(&'static [&'static str]),
}

impl ValueKind {
    /// A phrase describing the accepted values, for error messages and docs.
    pub fn expected(&self) -> String {
        match self {
            ValueKind::Text => "a string".to_string(),
            ValueKind::OptionalText => "a string (empty to unset)".to_string(),
            ValueKind::Unsigned => "a non-negative integer".to_string(),
            ValueKind::OneOf(names) => format!("one of: {}", names.join(", ")),
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
            ValueKind::OneOf(names) => names.contains(&raw).then(|| Value::from(raw)),
        }
    }

    /// Whether a value that came typed from a TOML file is acceptable.
    pub fn accepts(&self, value: &Value) -> bool {
        match (self, value) {
            (ValueKind::Text | ValueKind::OptionalText, Value::String(_, _)) => true,
            (ValueKind::Unsigned, Value::Num(_, n)) => {
                n.to_u128_lossy().is_some_and(|v| v <= u128::from(u64::MAX))
            }
            (ValueKind::OneOf(names), Value::String(_, s)) => names.contains(&s.as_str()),
            _ => false,
        }
    }
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
}

/// Every configuration key, in display order (section by section).
pub const KEYS: &[KeySpec] = &[
    KeySpec {
        key: "model.path",
        kind: ValueKind::Text,
        default: "tiny",
        doc: "\"tiny\" for the embedded tiny model, otherwise a checkpoint directory \
              (config.json, safetensors, tokenizer.json)",
    },
    KeySpec {
        key: "model.seed",
        kind: ValueKind::Unsigned,
        default: "0",
        doc: "seed of the embedded tiny model's weights; ignored for checkpoint directories",
    },
    KeySpec {
        key: "backend.kind",
        kind: ValueKind::OneOf(BACKEND_KINDS),
        default: "reference",
        doc: "registry name of the backend that runs the ops",
    },
    KeySpec {
        key: "backend.device",
        kind: ValueKind::OptionalText,
        default: "",
        doc: "backend-specific device selector (e.g. a GPU index); unset lets the backend choose",
    },
    KeySpec {
        key: "numerics.kv_cache_dtype",
        kind: ValueKind::OneOf(KvCacheDtype::NAMES),
        default: "bf16",
        doc: "storage of SWA/C4/C128 KV cache entries: bf16, or fp8 (e4m3 nope part with ue8m0 \
              scales per 64, bf16 rope part)",
    },
    KeySpec {
        key: "numerics.index_k_dtype",
        kind: ValueKind::OneOf(IndexKDtype::NAMES),
        default: "bf16",
        doc: "storage of indexer keys and rounding of indexer queries: bf16, fp8 (e4m3, f32 scale \
              per entry) or fp4 (e2m1, ue8m0 scale per 32)",
    },
    KeySpec {
        key: "numerics.act_quant",
        kind: ValueKind::OneOf(ActQuant::NAMES),
        default: "none",
        doc: "activation quantization in front of fp8/fp4-weight linears: none, or fp8 (1x128 \
              blocks, power-of-two scales)",
    },
    KeySpec {
        key: "exec.threads",
        kind: ValueKind::Unsigned,
        default: "0",
        doc: "worker threads; 0 means one per available core",
    },
];

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

/// Edit distance between two strings (insertions, deletions, substitutions).
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The nearest candidate to `word`, if it is close enough to be a plausible typo.
fn nearest<'a>(
    word: &str,
    candidates: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<&'a str> {
    let limit = (word.len() / 3).max(2);
    candidates
        .map(|(compare, answer)| (levenshtein(word, compare), answer))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, answer)| answer)
}

/// The known key most likely meant by an unknown dotted key (matching the whole key or its last part).
pub fn suggest_key(unknown: &str) -> Option<&'static str> {
    let leaf = unknown.rsplit('.').next().unwrap_or(unknown);
    let whole = nearest(unknown, KEYS.iter().map(|k| (k.key, k.key)));
    // A truncated name (`numerics.kv_cache`, `exec.thr`) is a prefix of the key that was meant.
    let prefix = || {
        KEYS.iter()
            .filter(|k| leaf.len() >= 3 && k.name().starts_with(leaf))
            .min_by_key(|k| (!unknown.starts_with(k.section()), k.key.len()))
            .map(|k| k.key)
    };
    whole
        .or_else(prefix)
        .or_else(|| nearest(leaf, KEYS.iter().map(|k| (k.name(), k.key))))
}

/// The known section most likely meant by an unknown section name.
pub fn suggest_section(unknown: &str) -> Option<&'static str> {
    nearest(unknown, sections().into_iter().map(|s| (s, s)))
}

/// The advice that follows "unknown key `key`": a suggestion, or the keys that exist.
pub fn unknown_key_hint(key: &str) -> String {
    if sections().contains(&key) {
        let keys: Vec<&str> = KEYS
            .iter()
            .filter(|k| k.section() == key)
            .map(|k| k.key)
            .collect();
        return format!(
            "`{key}` is a section; set one of its keys: {}",
            keys.join(", ")
        );
    }
    match suggest_key(key) {
        Some(s) => format!("did you mean `{s}`? (every key is listed in docs/profiles.md)"),
        None => {
            let all: Vec<&str> = KEYS.iter().map(|k| k.key).collect();
            format!("known keys: {}", all.join(", "))
        }
    }
}

/// The advice that follows "unknown section `name`": a suggestion, or the sections that exist.
pub fn unknown_section_hint(name: &str) -> String {
    match suggest_section(name) {
        Some(s) => format!("did you mean `[{s}]`? (every key is listed in docs/profiles.md)"),
        None => format!("known sections: {}", sections().join(", ")),
    }
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
            }
        }
        let mut from_table: Vec<String> = KEYS.iter().map(|k| k.key.to_string()).collect();
        from_struct.sort();
        from_table.sort();
        assert_eq!(from_struct, from_table);
    }

    #[test]
    fn levenshtein_counts_edits() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("same", "same"), 0);
    }

    #[test]
    fn suggestions_find_typos_and_misplaced_keys() {
        assert_eq!(
            suggest_key("numerics.kv_cache_dtyp"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(
            suggest_key("exec.kv_cache_dtype"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(suggest_key("exec.thread"), Some("exec.threads"));
        assert_eq!(
            suggest_key("numerics.kv_cache"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(suggest_key("index_k"), Some("numerics.index_k_dtype"));
        assert_eq!(suggest_key("zzzz.qqqqqqq"), None);
        assert_eq!(suggest_section("numeric"), Some("numerics"));
        assert!(unknown_key_hint("numerics").contains("numerics.act_quant"));
        assert!(unknown_key_hint("zzzz.qqqqqqq").contains("known keys: model.path"));
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
    }

    #[test]
    fn file_values_are_checked() {
        let threads = ValueKind::Unsigned;
        assert!(threads.accepts(&Value::from(2u64)));
        assert!(threads.accepts(&Value::from(2i64)));
        assert!(!threads.accepts(&Value::from(-2i64)));
        assert!(!threads.accepts(&Value::from("2")));
        assert!(!ValueKind::OneOf(&["a"]).accepts(&Value::from("b")));
    }
}

#[cfg(test)]
mod doc_tests {
    use super::*;

    #[test]
    fn docs_profiles_md_lists_every_key_with_its_default() {
        let doc = include_str!("../../../docs/profiles.md");
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
            if let ValueKind::OneOf(names) = spec.kind {
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
