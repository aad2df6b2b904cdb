//! Export of a resolved profile to other engines. Today one target: an SGLang launch command
//! (environment variables + `python3 -m sglang.launch_server` arguments), built from the single
//! mapping table in [`mapping`] and rendered as a shell script, systemd lines or JSON by [`render`].
//! Knobs without an upstream equivalent become warnings in the output, never silent omissions.

pub mod mapping;
pub mod render;

use crate::resolve::{Resolved, value_text};
use crate::schema::{KEYS, REDACTED, find_key};
use crate::validate::{Finding, Severity};
use mapping::{Action, lookup};
use serde::Serialize;

/// The Python interpreter the exported command runs.
pub const PYTHON: &str = "python3";

/// The SGLang module that starts the server.
pub const SGLANG_MODULE: &str = "sglang.launch_server";

/// One launch flag, with its value when it takes one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arg {
    /// The flag, e.g. `--kv-cache-dtype`.
    pub flag: String,
    /// Its value, e.g. `fp8_e4m3`.
    pub value: Option<String>,
}

/// A knob the command does not reproduce (a warning) or cannot run with (a blocker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// Dotted key.
    pub key: &'static str,
    /// Its value as displayed (secrets redacted).
    pub value: String,
    /// Why, and what to do.
    pub message: String,
}

/// How one key was exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyExport {
    /// Dotted key.
    pub key: &'static str,
    /// Its value as displayed (secrets redacted).
    pub value: String,
    /// Where the value came from.
    pub source: String,
    /// What the command contains for it: flags, an environment variable, or why nothing.
    pub sglang: String,
}

/// An SGLang launch command that reproduces a resolved profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SglangCommand {
    /// The profile as asked for.
    pub profile: String,
    /// Its files, base first.
    pub files: Vec<String>,
    /// Environment variables to set, in key order.
    pub env: Vec<(String, String)>,
    /// Launch flags, in key order.
    pub args: Vec<Arg>,
    /// Knobs with no SGLang equivalent.
    pub warnings: Vec<Note>,
    /// Knobs the command cannot run with.
    pub blockers: Vec<Note>,
    /// Validation warnings of the profile itself.
    pub profile_warnings: Vec<Finding>,
    /// How every key was handled.
    pub keys: Vec<KeyExport>,
}

impl SglangCommand {
    /// The full argument vector: interpreter, `-m`, module, then every flag and value.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec![
            PYTHON.to_string(),
            "-m".to_string(),
            SGLANG_MODULE.to_string(),
        ];
        for a in &self.args {
            argv.push(a.flag.clone());
            argv.extend(a.value.clone());
        }
        argv
    }

    /// Whether the command can run as exported (no blockers).
    pub fn runnable(&self) -> bool {
        self.blockers.is_empty()
    }
}

/// Build the SGLang command for a resolved profile.
pub fn sglang(resolved: &Resolved) -> SglangCommand {
    let real = serde_json::to_value(&resolved.profile).unwrap_or(serde_json::Value::Null);
    let null = serde_json::Value::Null;
    let value_of = |key: &str| -> &serde_json::Value {
        find_key(key)
            .and_then(|spec| real.get(spec.section())?.get(spec.name()))
            .unwrap_or(&null)
    };
    let mut cmd = SglangCommand {
        profile: resolved.requested.clone(),
        files: resolved.files.clone(),
        env: Vec::new(),
        args: Vec::new(),
        warnings: Vec::new(),
        blockers: Vec::new(),
        profile_warnings: resolved.findings_of(Severity::Warning).cloned().collect(),
        keys: Vec::new(),
    };
    for spec in KEYS {
        let raw = value_text(value_of(spec.key));
        let shown = match resolved.setting(spec.key) {
            Some(s) => s.value_text(),
            None => raw.clone(),
        };
        let source = resolved
            .setting(spec.key)
            .map_or_else(|| "default".to_string(), |s| s.origin.to_string());
        let fill = |text: &str| text.replace("{value}", &shown);
        let note = |message: String| Note {
            key: spec.key,
            value: shown.clone(),
            message,
        };
        // What human-facing text shows for the value (a secret never appears in it).
        let visible = if spec.is_secret() {
            REDACTED.to_string()
        } else {
            raw.clone()
        };
        let sglang = match lookup(spec.key, value_of).map(|r| r.action) {
            Some(Action::Flag(f)) => {
                cmd.args.push(arg(f, None));
                f.to_string()
            }
            Some(Action::FlagValue(f)) => {
                cmd.args.push(arg(f, Some(raw.clone())));
                format!("{f} {visible}")
            }
            Some(Action::FlagConst(f, v)) => {
                cmd.args.push(arg(f, Some(v.to_string())));
                format!("{f} {v}")
            }
            Some(Action::FlagPort(f)) => match crate::sections::parse_host_port(&raw) {
                Some((_, port)) => {
                    cmd.args.push(arg(f, Some(port.to_string())));
                    format!("{f} {port}")
                }
                None => {
                    let m = format!("`{raw}` is not host:port, so {f} cannot be derived");
                    cmd.blockers.push(note(m.clone()));
                    format!("blocked: {m}")
                }
            },
            Some(Action::Env(name, v)) => {
                cmd.env.push((name.to_string(), v.to_string()));
                format!("env {name}={v}")
            }
            Some(Action::EnvValue(name)) => {
                cmd.env.push((name.to_string(), raw.clone()));
                format!("env {name}={visible}")
            }
            Some(Action::Same(why)) => format!("nothing to pass: {}", fill(why)),
            Some(Action::Unmapped(why)) => {
                cmd.warnings.push(note(fill(why)));
                format!("warning: {}", fill(why))
            }
            Some(Action::Blocker(why)) => {
                cmd.blockers.push(note(fill(why)));
                format!("blocked: {}", fill(why))
            }
            None => {
                let m = "no row in the SGLang mapping table; this is a bug in dsv4_config";
                cmd.warnings.push(note(m.to_string()));
                format!("warning: {m}")
            }
        };
        cmd.keys.push(KeyExport {
            key: spec.key,
            value: shown,
            source,
            sglang,
        });
    }
    cmd
}

/// Build one flag.
fn arg(flag: &str, value: Option<String>) -> Arg {
    Arg {
        flag: flag.to_string(),
        value,
    }
}
