//! Comparison of two resolved configurations: the keys whose values differ, with both values and
//! both sources (`dsv4 profile diff A B`).

use crate::resolve::{Origin, Resolved, Setting};
use crate::schema::KEYS;
use serde::Serialize;

/// One side of a difference: the value as displayed (secrets redacted) and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// The value (`null` when unset).
    pub value: serde_json::Value,
    /// Its source.
    pub origin: Origin,
}

/// One key whose value differs between the two configurations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// Dotted key.
    pub key: &'static str,
    /// The first configuration's side.
    pub a: Side,
    /// The second configuration's side.
    pub b: Side,
}

/// The keys whose resolved values differ, in [`KEYS`] order. Values are compared unredacted, so two
/// different secrets count as a difference even though both display as redacted.
pub fn diff(a: &Resolved, b: &Resolved) -> Vec<Difference> {
    let (ja, jb) = (real_values(a), real_values(b));
    KEYS.iter()
        .filter_map(|spec| {
            let get = |j: &serde_json::Value| {
                j.get(spec.section())
                    .and_then(|s| s.get(spec.name()))
                    .cloned()
            };
            if get(&ja) == get(&jb) {
                return None;
            }
            let (sa, sb) = (a.setting(spec.key)?, b.setting(spec.key)?);
            Some(Difference {
                key: spec.key,
                a: side(sa),
                b: side(sb),
            })
        })
        .collect()
}

/// The unredacted values of a configuration, as nested JSON.
fn real_values(r: &Resolved) -> serde_json::Value {
    serde_json::to_value(&r.profile).unwrap_or(serde_json::Value::Null)
}

fn side(s: &Setting) -> Side {
    Side {
        value: s.value.clone(),
        origin: s.origin.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResolveOptions;

    fn embedded(name: &str, sets: &[&str]) -> Resolved {
        let mut o = ResolveOptions::new(name);
        o.search.local_dir = None;
        o.sets = sets.iter().map(|s| s.to_string()).collect();
        crate::assemble(&o).unwrap()
    }

    #[test]
    fn identical_configurations_have_no_differences() {
        let a = embedded("reference", &[]);
        assert_eq!(diff(&a, &a), []);
    }

    #[test]
    fn differences_carry_both_values_and_sources() {
        let a = embedded("reference", &[]);
        let b = embedded("reference", &["exec.threads=4"]);
        let d = diff(&a, &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].key, "exec.threads");
        assert_eq!(d[0].a.value, serde_json::json!(1));
        assert_eq!(d[0].b.value, serde_json::json!(4));
        assert!(
            d[0].a
                .origin
                .to_string()
                .starts_with("embedded:reference.toml:")
        );
        assert_eq!(d[0].b.origin.to_string(), "--set exec.threads=4");
    }

    #[test]
    fn different_secrets_differ_but_stay_redacted() {
        let a = embedded("reference", &["server.api_key=one"]);
        let b = embedded("reference", &["server.api_key=two"]);
        let d = diff(&a, &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].a.value, d[0].b.value);
        assert!(!format!("{d:?}").contains("one"));
    }
}
