//! Validation of combinations: rules that look at several keys (and at the backend's capabilities)
//! after the layers are merged. An error stops resolution; a warning is carried with the resolved
//! configuration and printed by every command.
//!
//! Every rule has a stable id, the keys it reads, and a message that names those keys with their
//! values and says what to change. docs/profiles.md lists every rule (a test keeps it in step).

mod rules;

pub use rules::RULES;

use crate::caps::{BackendCaps, caps_of};
use crate::profile::Profile;
use serde::Serialize;
use std::fmt;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The configuration cannot run as written.
    Error,
    /// Legal, but risky or pointless.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// A check over a whole configuration and its backend's capabilities.
pub type Check = fn(&Profile, &BackendCaps) -> Option<String>;

/// One validation rule.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Stable identifier, e.g. `overlap-needs-graphs`.
    pub id: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// The keys the rule reads (the ones a finding names).
    pub keys: &'static [&'static str],
    /// One line for docs: when the rule fires.
    pub summary: &'static str,
    /// Returns the message when the rule fires.
    pub check: Check,
}

/// One rule that fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The rule's id.
    pub rule: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// The keys involved.
    pub keys: &'static [&'static str],
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.rule, self.message)
    }
}

/// Check a configuration against every rule, with the capabilities of its `backend.kind`.
pub fn check(profile: &Profile) -> Vec<Finding> {
    match caps_of(&profile.backend.kind) {
        Some(caps) => check_with(profile, caps),
        None => vec![Finding {
            rule: "backend-known",
            severity: Severity::Error,
            keys: &["backend.kind"],
            message: format!(
                "backend.kind = {} has no row in the capability table (dsv4_config::caps); \
                 use one of: {}",
                profile.backend.kind,
                crate::schema::BACKEND_KINDS.join(", ")
            ),
        }],
    }
}

/// Check a configuration against every rule with the given capabilities (tests use made-up rows).
pub fn check_with(profile: &Profile, caps: &BackendCaps) -> Vec<Finding> {
    RULES
        .iter()
        .filter_map(|rule| {
            (rule.check)(profile, caps).map(|message| Finding {
                rule: rule.id,
                severity: rule.severity,
                keys: rule.keys,
                message,
            })
        })
        .collect()
}

/// Id of the rule that refuses injected faults in a production profile.
pub const FAULTS_IN_PRODUCTION: &str = "faults-in-production";

/// Keys of [`FAULTS_IN_PRODUCTION`].
const FAULTS_IN_PRODUCTION_KEYS: &[&str] = &["debug.inject"];

/// Whether a profile of this name is a production profile: its name starts with `prod`.
/// A profile that extends one (at any depth) is one too.
pub fn is_production_name(name: &str) -> bool {
    name.starts_with("prod")
}

/// The finding for faults injected into a profile whose `extends` chain (`names`, base first)
/// contains a production profile, if any: faults are for rehearsals on dev profiles only.
pub fn check_lineage(profile: &Profile, names: &[String]) -> Option<Finding> {
    let prod = names.iter().find(|n| is_production_name(n))?;
    if profile.debug.inject.is_empty() {
        return None;
    }
    let faults: Vec<&str> = profile.debug.inject.iter().map(|f| f.as_str()).collect();
    Some(Finding {
        rule: FAULTS_IN_PRODUCTION,
        severity: Severity::Error,
        keys: FAULTS_IN_PRODUCTION_KEYS,
        message: format!(
            "debug.inject = [{}] in a production profile (`{prod}` is in its chain {}): faults make \
             results wrong on purpose and are refused there; rehearse them on a dev profile, \
             e.g. --profile dev-cpu --set debug.inject={}",
            faults.join(", "),
            names.join(" → "),
            faults.join(",")
        ),
    })
}

/// The rules as a Markdown table (printed in docs/profiles.md).
pub fn markdown_table() -> String {
    let mut out = String::from("| rule | severity | keys | fires on |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| `{FAULTS_IN_PRODUCTION}` | {} | `debug.inject` | faults injected into a profile named \
         `prod*` or extending one |\n",
        Severity::Error
    ));
    for r in RULES {
        let keys: Vec<String> = r.keys.iter().map(|k| format!("`{k}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.id,
            r.severity,
            keys.join(", "),
            r.summary
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::find_key;

    #[test]
    fn rules_have_unique_ids_and_known_keys() {
        let mut ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), RULES.len());
        for r in RULES {
            assert!(!r.keys.is_empty(), "{}", r.id);
            for k in r.keys {
                assert!(find_key(k).is_some(), "{}: unknown key {k}", r.id);
            }
        }
    }

    #[test]
    fn defaults_pass_every_rule() {
        assert_eq!(check(&Profile::default()), []);
    }

    #[test]
    fn an_unknown_backend_is_an_error_not_a_panic() {
        let mut p = Profile::default();
        p.backend.kind = "tpu".into();
        let f = check(&p);
        assert_eq!(f.len(), 1);
        assert!(f[0].message.contains("backend.kind = tpu"), "{}", f[0]);
    }
}
