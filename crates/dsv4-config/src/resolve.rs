//! Resolution: merge built-in defaults < profile files (`extends` chain, base first) < `DSV4_*`
//! environment < `--set` with figment, and record for every key which layer its value came from.

use crate::catalog::{self, PROFILE_DIR_ENV, ProfileSearch};
use crate::error::ConfigError;
use crate::layers::{self, Layer, LayerKind};
use crate::profile::Profile;
use crate::schema::KEYS;
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

/// One resolved key: its value and where the value came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// Dotted key.
    pub key: &'static str,
    /// The value (`null` when unset).
    pub value: serde_json::Value,
    /// Its source.
    pub origin: Origin,
}

impl Setting {
    /// The value as a profile file would spell it (strings unquoted, `(unset)` for null).
    pub fn value_text(&self) -> String {
        match &self.value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "(unset)".to_string(),
            other => other.to_string(),
        }
    }
}

/// The outcome of resolution: the configuration and the provenance of every key.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The resolved configuration.
    pub profile: Profile,
    /// The profile as it was asked for (name or path).
    pub requested: String,
    /// The profile files applied, base first (the `extends` chain).
    pub files: Vec<String>,
    /// Every key of [`KEYS`], in that order, with value and origin.
    pub settings: Vec<Setting>,
}

impl Resolved {
    /// The setting of a dotted key, if the key exists.
    pub fn setting(&self, key: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.key == key)
    }
}

impl Profile {
    /// Resolve a configuration: defaults < profile files < environment < `--set`.
    pub fn resolve(opts: &ResolveOptions) -> Result<Resolved, ConfigError> {
        resolve(opts)
    }
}

/// Resolve a configuration: defaults < profile files < environment < `--set`.
pub fn resolve(opts: &ResolveOptions) -> Result<Resolved, ConfigError> {
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
            let value = json
                .get(spec.section())
                .and_then(|s| s.get(spec.name()))
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            let origin = figment
                .find_metadata(spec.key)
                .and_then(|meta| layers.iter().find(|l| l.name == meta.name))
                .map_or(Origin::Default, |layer| origin_of(layer, spec.key));
            Setting {
                key: spec.key,
                value,
                origin,
            }
        })
        .collect();
    Ok(Resolved {
        profile,
        requested: opts.profile.clone(),
        files: chain.iter().map(|f| f.location.to_string()).collect(),
        settings,
    })
}

/// The origin of `key` in a layer that provided it.
fn origin_of(layer: &Layer, key: &str) -> Origin {
    match &layer.kind {
        LayerKind::Default => Origin::Default,
        LayerKind::File { file, lines } => Origin::File {
            file: file.clone(),
            line: lines.get(key).copied(),
        },
        LayerKind::Env { var } => Origin::Env { var: var.clone() },
        LayerKind::Set { arg } => Origin::Set { arg: arg.clone() },
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
    }
}
