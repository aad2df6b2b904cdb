//! Resolution: merge built-in defaults < profile files (`extends` chain, base first) < `DSV4_*`
//! environment < `--set` with figment, record for every key which layer its value came from (and the
//! comment that explains it), then validate the combination.

use crate::catalog::{self, PROFILE_DIR_ENV, ProfileSearch};
use crate::error::ConfigError;
use crate::layers::{self, Layer, LayerKind};
use crate::profile::Profile;
use crate::schema::{KEYS, KeySpec, REDACTED, find_key};
use crate::validate::{self, Finding, Severity};
use figment::Figment;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

/// What to resolve: a profile name or path, where to look, and the higher layers.
#[derive(Debug, Clone)]
pub struct ResolveOptions {
    /// Profile name (searched as described in [`ProfileSearch`]) or path to a .toml file.
    pub profile: String,
    /// Where named profiles are looked up.
    pub search: ProfileSearch,
    /// The environment, as (name, value) pairs; only `DSV4_*__*` variables are configuration.
    pub env: Vec<(String, String)>,
    /// `--set section.key=value` arguments, in order.
    pub sets: Vec<String>,
}

impl ResolveOptions {
    /// Resolve `profile` with the standard search, no environment and no `--set`.
    pub fn new(profile: impl Into<String>) -> Self {
        ResolveOptions {
            profile: profile.into(),
            search: ProfileSearch::standard(None),
            env: Vec::new(),
            sets: Vec::new(),
        }
    }

    /// Options for a real run: the process environment, and `profile_dir` falling back to
    /// `DSV4_PROFILE_DIR` when not given.
    pub fn from_process(profile: &str, profile_dir: Option<PathBuf>, sets: &[String]) -> Self {
        // vars_os: std::env::vars panics on non-UTF-8 variables; a mangled DSV4_ value is then
        // reported by validation like any other bad value.
        let env: Vec<(String, String)> = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        let profile_dir = profile_dir.or_else(|| {
            env.iter()
                .find(|(k, v)| k == PROFILE_DIR_ENV && !v.is_empty())
                .map(|(_, v)| PathBuf::from(v))
        });
        ResolveOptions {
            profile: profile.to_string(),
            search: ProfileSearch::standard(profile_dir),
            env,
            sets: sets.to_vec(),
        }
    }
}

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Origin {
    /// The built-in default.
    Default,
    /// A profile file (an embedded one shows as `embedded:NAME.toml`).
    File {
        /// The file as displayed.
        file: String,
        /// 1-based line of the key, when it could be located.
        line: Option<usize>,
    },
    /// An environment variable.
    Env {
        /// Its name.
        var: String,
    },
    /// A `--set` argument.
    Set {
        /// The argument as given.
        arg: String,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File {
                file,
                line: Some(l),
            } => write!(f, "{file}:{l}"),
            Origin::File { file, line: None } => f.write_str(file),
            Origin::Env { var } => write!(f, "env {var}"),
            Origin::Set { arg } => write!(f, "--set {arg}"),
        }
    }
}

/// One resolved key: its value, where the value came from, and the comment that explains it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// Dotted key.
    pub key: &'static str,
    /// The value (`null` when unset; [`REDACTED`] for a set secret).
    pub value: serde_json::Value,
    /// Its source.
    pub origin: Origin,
    /// The comment next to the key in the profile file that set it (the "why"), if any.
    pub comment: Option<String>,
}

impl Setting {
    /// The value as a profile file would spell it (strings unquoted, `(unset)` for null, lists as
    /// `[a, b]`).
    pub fn value_text(&self) -> String {
        value_text(&self.value)
    }
}

/// A value as a profile file would spell it (strings unquoted, `(unset)` for null, lists as `[a, b]`).
pub fn value_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "(unset)".to_string(),
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(value_text).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The outcome of resolution: the configuration, the provenance of every key, and the findings of
/// validation.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The resolved configuration.
    pub profile: Profile,
    /// The profile as it was asked for (name or path).
    pub requested: String,
    /// The profile files applied, base first (the `extends` chain).
    pub files: Vec<String>,
    /// The leading comment block of the requested profile file: what the profile is for.
    pub description: String,
    /// Every key of [`KEYS`], in that order, with value and origin.
    pub settings: Vec<Setting>,
    /// What validation found: warnings only after [`resolve`]; errors too after [`assemble`].
    pub findings: Vec<Finding>,
}

impl Resolved {
    /// The setting of a dotted key, if the key exists.
    pub fn setting(&self, key: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.key == key)
    }

    /// The findings of one severity.
    pub fn findings_of(&self, severity: Severity) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.severity == severity)
    }

    /// The resolved configuration as nested sections (`{section: {key: value}}`), secrets redacted.
    pub fn nested_json(&self) -> serde_json::Value {
        let mut root = serde_json::Map::new();
        for s in &self.settings {
            let spec = find_key(s.key);
            let (section, name) = spec.map_or((s.key, s.key), |k| (k.section(), k.name()));
            let entry = root
                .entry(section.to_string())
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let serde_json::Value::Object(fields) = entry {
                fields.insert(name.to_string(), s.value.clone());
            }
        }
        serde_json::Value::Object(root)
    }

    /// A finding with each key it names, its value and its source on separate indented lines.
    pub fn describe(&self, finding: &Finding) -> String {
        let mut out = format!("[{}] {}", finding.rule, finding.message);
        for key in finding.keys {
            if let Some(s) = self.setting(key) {
                out.push_str(&format!("\n    {key} = {}  ({})", s.value_text(), s.origin));
            }
        }
        out
    }
}

impl Profile {
    /// Resolve and validate a configuration: defaults < profile files < environment < `--set`.
    pub fn resolve(opts: &ResolveOptions) -> Result<Resolved, ConfigError> {
        resolve(opts)
    }
}

/// Resolve and validate a configuration: defaults < profile files < environment < `--set`.
///
/// A validation error fails with [`ConfigError::Invalid`], naming every problem with the values and
/// sources of the keys involved; warnings stay in [`Resolved::findings`].
pub fn resolve(opts: &ResolveOptions) -> Result<Resolved, ConfigError> {
    let resolved = assemble(opts)?;
    let errors: Vec<String> = resolved
        .findings_of(Severity::Error)
        .map(|f| format!("  - {}", resolved.describe(f).replace('\n', "\n  ")))
        .collect();
    if errors.is_empty() {
        Ok(resolved)
    } else {
        Err(ConfigError::Invalid {
            profile: resolved.requested.clone(),
            count: errors.len(),
            problems: errors.join("\n"),
        })
    }
}

/// Merge the layers and run validation, keeping error findings in [`Resolved::findings`] instead of
/// failing (for commands that display an invalid configuration, like `profile explain`). Unknown
/// keys, bad values and profile lookup still fail.
pub fn assemble(opts: &ResolveOptions) -> Result<Resolved, ConfigError> {
    let chain = catalog::load_chain(&opts.search, &opts.profile)?;
    let mut layers: Vec<Layer> = vec![layers::defaults_layer()];
    for file in &chain {
        layers.push(layers::file_layer(file)?);
    }
    layers.extend(layers::env_layers(&opts.env)?);
    layers.extend(layers::set_layers(&opts.sets)?);

    let mut figment = Figment::new();
    for layer in &layers {
        figment = figment.merge(layer);
    }
    let profile: Profile = figment.extract().map_err(|e| ConfigError::Assemble {
        message: e.to_string(),
    })?;

    let json = serde_json::to_value(&profile).map_err(|e| ConfigError::Assemble {
        message: e.to_string(),
    })?;
    let settings = KEYS
        .iter()
        .map(|spec| {
            let mut value = json
                .get(spec.section())
                .and_then(|s| s.get(spec.name()))
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            if spec.is_secret() && !value.is_null() {
                value = serde_json::Value::from(REDACTED);
            }
            let layer = figment
                .find_metadata(spec.key)
                .and_then(|meta| layers.iter().find(|l| l.name == meta.name));
            let (origin, comment) = layer.map_or((Origin::Default, None), |layer| {
                (origin_of(layer, spec), comment_of(layer, spec.key))
            });
            Setting {
                key: spec.key,
                value,
                origin,
                comment,
            }
        })
        .collect();
    let names: Vec<String> = chain.iter().map(|f| f.location.stem()).collect();
    let mut findings: Vec<Finding> = validate::check_lineage(&profile, &names)
        .into_iter()
        .collect();
    findings.extend(validate::check(&profile));
    Ok(Resolved {
        profile,
        requested: opts.profile.clone(),
        files: chain.iter().map(|f| f.location.to_string()).collect(),
        description: chain
            .last()
            .map(|f| catalog::description(&f.text))
            .unwrap_or_default(),
        settings,
        findings,
    })
}

/// The origin of `spec`'s key in a layer that provided it (a secret in `--set` is redacted).
fn origin_of(layer: &Layer, spec: &KeySpec) -> Origin {
    match &layer.kind {
        LayerKind::Default => Origin::Default,
        LayerKind::File { file, lines, .. } => Origin::File {
            file: file.clone(),
            line: lines.get(spec.key).copied(),
        },
        LayerKind::Env { var } => Origin::Env { var: var.clone() },
        LayerKind::Set { arg } if spec.is_secret() => Origin::Set {
            arg: format!(
                "{}={REDACTED}",
                arg.split_once('=').map_or(arg.as_str(), |(k, _)| k)
            ),
        },
        LayerKind::Set { arg } => Origin::Set { arg: arg.clone() },
    }
}

/// The comment that explains `key` in a file layer.
fn comment_of(layer: &Layer, key: &str) -> Option<String> {
    match &layer.kind {
        LayerKind::File { comments, .. } => comments.get(key).cloned(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_alone_come_from_default() {
        let mut opts = ResolveOptions::new("dev-cpu");
        opts.search.local_dir = None;
        let r = resolve(&opts).unwrap();
        assert_eq!(r.files, ["embedded:dev-cpu.toml"]);
        assert_eq!(r.settings.len(), KEYS.len());
        let device = r.setting("backend.device").unwrap();
        assert_eq!(device.origin, Origin::Default);
        assert_eq!(device.value_text(), "(unset)");
        assert!(
            r.description.starts_with("Development on any machine"),
            "{}",
            r.description
        );
    }

    #[test]
    fn secrets_are_redacted_everywhere_but_the_profile() {
        let mut opts = ResolveOptions::new("dev-cpu");
        opts.search.local_dir = None;
        opts.sets = vec!["server.api_key=hunter2".into()];
        let r = resolve(&opts).unwrap();
        assert_eq!(r.profile.server.api_key.as_deref(), Some("hunter2"));
        let s = r.setting("server.api_key").unwrap();
        assert_eq!(s.value_text(), REDACTED);
        assert_eq!(
            s.origin.to_string(),
            format!("--set server.api_key={REDACTED}")
        );
        let nested = r.nested_json().to_string();
        assert!(
            !nested.contains("hunter2") && nested.contains(REDACTED),
            "{nested}"
        );
    }

    #[test]
    fn value_text_spells_lists_and_numbers() {
        assert_eq!(value_text(&serde_json::json!(["a", "b"])), "[a, b]");
        assert_eq!(value_text(&serde_json::json!([])), "[]");
        assert_eq!(value_text(&serde_json::json!(2.0)), "2.0");
        assert_eq!(value_text(&serde_json::json!(true)), "true");
    }
}
