//! The configuration layers as figment providers: profile files, `DSV4_*` environment variables and
//! `--set` arguments, each validated against [`crate::schema::KEYS`] before it is merged.

use crate::catalog::ProfileFile;
use crate::error::ConfigError;
use crate::schema::{self, KeySpec};
use figment::value::{Dict, Map, Value};
use figment::{Metadata, Provider};
use std::collections::HashMap;

/// The prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "DSV4_";

/// Separator of levels in configuration environment variables (`DSV4_NUMERICS__KV_CACHE_DTYPE`).
pub const ENV_SEPARATOR: &str = "__";

/// Where a layer's values come from.
#[derive(Debug, Clone)]
pub(crate) enum LayerKind {
    /// The built-in defaults ([`crate::Profile::default`]).
    Default,
    /// A profile file, with the line of each key found in it and the comment next to it.
    File {
        /// The file as displayed.
        file: String,
        /// Dotted key → 1-based line.
        lines: HashMap<String, usize>,
        /// Dotted key → the comment directly above its line and/or at its end.
        comments: HashMap<String, String>,
    },
    /// One environment variable.
    Env {
        /// Its name.
        var: String,
    },
    /// One `--set` argument.
    Set {
        /// The argument as given.
        arg: String,
    },
}

/// One layer: a name (unique within a resolution; figment reports it as the metadata name) and values.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    /// Unique, human-readable name.
    pub name: String,
    /// The source of the values.
    pub kind: LayerKind,
    /// Nested values (`section → key → value`).
    pub dict: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> Result<Map<figment::Profile, Dict>, figment::Error> {
        let mut map = Map::new();
        map.insert(figment::Profile::Default, self.dict.clone());
        Ok(map)
    }
}

/// The layer of built-in defaults: every key of [`crate::Profile::default`].
pub(crate) fn defaults_layer() -> Layer {
    let dict = Value::serialize(crate::Profile::default())
        .ok()
        .and_then(Value::into_dict)
        .unwrap_or_default();
    Layer {
        name: "built-in defaults".to_string(),
        kind: LayerKind::Default,
        dict,
    }
}

/// Insert a leaf value at `section.key`.
fn insert(dict: &mut Dict, spec: &KeySpec, value: Value) {
    let section = dict
        .entry(spec.section().to_string())
        .or_insert_with(|| Value::from(Dict::new()));
    if let Value::Dict(_, d) = section {
        d.insert(spec.name().to_string(), value);
    }
}

/// A short rendering of a value for error messages.
fn show(value: &Value) -> String {
    match value {
        Value::String(_, s) => s.clone(),
        Value::Dict(_, _) => "a table".to_string(),
        Value::Array(_, _) => "an array".to_string(),
        other => serde_json::to_string(other).unwrap_or_else(|_| format!("{other:?}")),
    }
}

/// Locate each key of a TOML profile: dotted key → 1-based line (section headers map their own name).
/// Handles `[section]` headers and `key = ...` / `section.key = ...` lines; keys it cannot place are absent.
pub(crate) fn key_lines(text: &str) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    let mut section = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with("[[") {
            section.clear();
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            if let Some(end) = rest.find(']') {
                section = unquote_path(&rest[..end]);
                out.entry(section.clone()).or_insert(i + 1);
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if let Some((key, _)) = line.split_once('=') {
            let key = unquote_path(key);
            let full = if section.is_empty() {
                key
            } else {
                format!("{section}.{key}")
            };
            if let Some((s, _)) = full.split_once('.') {
                out.entry(s.to_string()).or_insert(i + 1);
            }
            out.entry(full).or_insert(i + 1);
        }
    }
    out
}

/// The comments that explain keys: for each `key = value` line, the `#` lines directly above it (no
/// blank line between) followed by a comment at the end of the line, joined with spaces.
pub(crate) fn key_comments(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut section = String::new();
    let mut above: Vec<&str> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(comment) = line.strip_prefix('#') {
            above.push(comment.trim());
            continue;
        }
        let pending = std::mem::take(&mut above);
        if line.starts_with("[[") {
            section.clear();
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            if let Some(end) = rest.find(']') {
                section = unquote_path(&rest[..end]);
            }
            continue;
        }
        let (code, trailing) = split_comment(line);
        let Some((key, _)) = code.split_once('=') else {
            continue;
        };
        let key = unquote_path(key);
        let full = if section.is_empty() {
            key
        } else {
            format!("{section}.{key}")
        };
        let mut parts: Vec<&str> = pending.into_iter().filter(|c| !c.is_empty()).collect();
        parts.extend(trailing.filter(|c| !c.is_empty()));
        if !parts.is_empty() {
            out.entry(full).or_insert_with(|| parts.join(" "));
        }
    }
    out
}

/// Split a TOML line into code and the text of a trailing `#` comment (a `#` inside a string is not
/// a comment).
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match quote {
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' => return (&line[..i], Some(line[i + 1..].trim())),
            None => {}
        }
    }
    (line, None)
}

/// Normalise a TOML key path: trim each dotted part and strip quotes.
fn unquote_path(path: &str) -> String {
    path.split('.')
        .map(|p| p.trim().trim_matches('"').trim_matches('\''))
        .collect::<Vec<_>>()
        .join(".")
}

/// Build the layer of one profile file, rejecting unknown keys and bad values (naming file and line).
pub(crate) fn file_layer(file: &ProfileFile) -> Result<Layer, ConfigError> {
    let shown = file.location.to_string();
    let mut dict: Dict = toml::from_str(&file.text).map_err(|e| ConfigError::Syntax {
        file: shown.clone(),
        message: e.to_string(),
    })?;
    dict.remove("extends");
    let lines = key_lines(&file.text);
    let at = |key: &str| match lines.get(key) {
        Some(line) => format!("{shown}:{line}"),
        None => shown.clone(),
    };
    let sections = schema::sections();
    for (section, body) in &dict {
        if !sections.contains(&section.as_str()) {
            return Err(ConfigError::UnknownKey {
                key: section.clone(),
                origin: at(section),
                hint: schema::unknown_section_hint(section),
            });
        }
        let Value::Dict(_, fields) = body else {
            return Err(ConfigError::BadValue {
                key: section.clone(),
                value: show(body),
                origin: at(section),
                expected: format!("a table `[{section}]`"),
            });
        };
        for (name, value) in fields {
            let key = format!("{section}.{name}");
            let Some(spec) = schema::find_key(&key) else {
                return Err(ConfigError::UnknownKey {
                    origin: at(&key),
                    hint: schema::unknown_key_hint(&key),
                    key,
                });
            };
            if !spec.kind.accepts(value) {
                return Err(ConfigError::BadValue {
                    value: show(value),
                    origin: at(&key),
                    expected: spec.kind.expected(),
                    key,
                });
            }
        }
    }
    Ok(Layer {
        name: format!("profile file {shown}"),
        kind: LayerKind::File {
            file: shown,
            lines,
            comments: key_comments(&file.text),
        },
        dict,
    })
}

/// Parse one textual `key = value` (from the environment or `--set`) into a one-key dict.
fn text_value(key: &str, raw: &str, origin: &str) -> Result<Dict, ConfigError> {
    let Some(spec) = schema::find_key(key) else {
        return Err(ConfigError::UnknownKey {
            key: key.to_string(),
            origin: origin.to_string(),
            hint: schema::unknown_key_hint(key),
        });
    };
    let Some(value) = spec.kind.parse_text(raw) else {
        return Err(ConfigError::BadValue {
            key: key.to_string(),
            value: raw.to_string(),
            origin: origin.to_string(),
            expected: spec.kind.expected(),
        });
    };
    let mut dict = Dict::new();
    insert(&mut dict, spec, value);
    Ok(dict)
}

/// The configuration key an environment variable sets, if it is a configuration variable.
///
/// The rule: a variable is configuration exactly when its name starts with `DSV4_` and contains `__`
/// after the prefix; `DSV4_NUMERICS__KV_CACHE_DTYPE` sets `numerics.kv_cache_dtype`. Other `DSV4_`
/// variables (`DSV4_LOG`, `DSV4_PROFILE_DIR`, ...) are left to whoever reads them.
pub fn env_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    rest.contains(ENV_SEPARATOR)
        .then(|| rest.to_ascii_lowercase().replace(ENV_SEPARATOR, "."))
}

/// One layer per configuration environment variable, sorted by variable name.
pub(crate) fn env_layers(env: &[(String, String)]) -> Result<Vec<Layer>, ConfigError> {
    let mut vars: Vec<&(String, String)> =
        env.iter().filter(|(k, _)| env_key(k).is_some()).collect();
    vars.sort();
    vars.into_iter()
        .map(|(var, raw)| {
            let key = env_key(var).unwrap_or_default();
            let origin = format!("environment variable {var}");
            Ok(Layer {
                dict: text_value(&key, raw, &origin)?,
                name: origin,
                kind: LayerKind::Env { var: var.clone() },
            })
        })
        .collect()
}

/// One layer per `--set section.key=value` argument, in the order given (later ones win).
pub(crate) fn set_layers(sets: &[String]) -> Result<Vec<Layer>, ConfigError> {
    sets.iter()
        .enumerate()
        .map(|(i, arg)| {
            let Some((key, raw)) = arg.split_once('=') else {
                return Err(ConfigError::BadSet { arg: arg.clone() });
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(ConfigError::BadSet { arg: arg.clone() });
            }
            let origin = format!("--set {arg}");
            Ok(Layer {
                dict: text_value(key, raw, &origin)?,
                // Two identical --set arguments would otherwise share a figment metadata name.
                name: format!("{origin} (#{})", i + 1),
                kind: LayerKind::Set { arg: arg.clone() },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_rule_only_takes_double_underscore_vars() {
        assert_eq!(
            env_key("DSV4_NUMERICS__KV_CACHE_DTYPE").as_deref(),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(env_key("DSV4_LOG"), None);
        assert_eq!(env_key("DSV4_PROFILE_DIR"), None);
        assert_eq!(env_key("OTHER_A__B"), None);
    }

    #[test]
    fn key_lines_follow_sections_and_dotted_keys() {
        let text = "# c\nextends = \"x\"\n\n[model]\npath = \"tiny\"\n\n[ \"numerics\" ]\n\
                    kv_cache_dtype = \"fp8\" # why\nexec.threads = 2\n";
        let lines = key_lines(text);
        assert_eq!(lines["extends"], 2);
        assert_eq!(lines["model"], 4);
        assert_eq!(lines["model.path"], 5);
        assert_eq!(lines["numerics.kv_cache_dtype"], 8);
        assert_eq!(lines["numerics.exec.threads"], 9);
    }

    #[test]
    fn comments_above_and_after_a_key_explain_it() {
        let text = "# Profile purpose.\n\n[exec]\n# Graphs on:\n# see the ledger.\ncuda_graph = true\n\n\
                    # detached comment\n\nthreads = 2 # one per socket\n\
                    [server]\nhost = \"a#b\" # not 'quoted # here'\nport = 1\n";
        let c = key_comments(text);
        assert_eq!(c["exec.cuda_graph"], "Graphs on: see the ledger.");
        assert_eq!(c["exec.threads"], "one per socket");
        assert_eq!(c["server.host"], "not 'quoted # here'");
        assert!(!c.contains_key("server.port"));
        assert_eq!(
            split_comment(r##"a = "x\"#y" # z"##),
            (r##"a = "x\"#y" "##, Some("z"))
        );
    }

    #[test]
    fn set_arguments_need_an_equals_sign() {
        let e = set_layers(&["numerics.kv_cache_dtype".into()]).unwrap_err();
        assert!(e.to_string().contains("expected section.key=value"), "{e}");
        let e = set_layers(&["=fp8".into()]).unwrap_err();
        assert!(matches!(e, ConfigError::BadSet { .. }), "{e}");
    }
}
