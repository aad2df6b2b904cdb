//! Profiles: the current value of a key with its provenance (resolved by dsv4-config from the
//! repository's profile files, with no environment and no `--set`), and a format-preserving edit of
//! one key in a profile file (toml_edit keeps comments and layout).

use crate::error::LedgerError;
use dsv4_config::catalog::ProfileSearch;
use dsv4_config::schema::{ValueKind, find_key};
use dsv4_config::{ResolveOptions, Resolved, assemble, resolve};
use std::path::Path;

/// The repository-relative path of profile `name`'s file.
pub fn profile_path(name: &str) -> Result<String, LedgerError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.');
    if !ok {
        return Err(LedgerError::Invalid(format!(
            "profile {name:?}: expected a profile name like prod-bf16 (a file profiles/<name>.toml)"
        )));
    }
    Ok(format!("profiles/{name}.toml"))
}

/// Resolve and validate profile `name` from `root/profiles` (then the embedded profiles for
/// `extends`), with `sets` applied and no environment.
pub fn resolve_in(root: &Path, name: &str, sets: &[String]) -> Result<Resolved, LedgerError> {
    resolve(&options(root, name, sets)?).map_err(|e| LedgerError::Profile {
        profile: name.to_string(),
        message: e.to_string(),
    })
}

/// Like [`resolve_in`] but without failing on validation errors: values and provenance only.
pub fn assemble_in(root: &Path, name: &str) -> Result<Resolved, LedgerError> {
    assemble(&options(root, name, &[])?).map_err(|e| LedgerError::Profile {
        profile: name.to_string(),
        message: e.to_string(),
    })
}

/// The resolution options for profile `name` of the repository at `root`.
fn options(root: &Path, name: &str, sets: &[String]) -> Result<ResolveOptions, LedgerError> {
    let file = root.join(profile_path(name)?);
    let opts = ResolveOptions {
        profile: file.display().to_string(),
        search: ProfileSearch {
            profile_dir: None,
            local_dir: Some(root.join("profiles")),
            embedded: true,
        },
        env: Vec::new(),
        sets: sets.to_vec(),
    };
    Ok(opts)
}

/// The current value of `key` in profile `name` as a profile file spells it, and its origin.
pub fn current_value(root: &Path, name: &str, key: &str) -> Result<(String, String), LedgerError> {
    let resolved = assemble_in(root, name)?;
    let setting = resolved.setting(key).ok_or_else(|| {
        LedgerError::Invalid(format!("unknown key {key:?} (see `dsv4 profile explain`)"))
    })?;
    Ok((setting.value_text(), setting.origin.to_string()))
}

/// The value `to` would have for `key` once resolved (checked against the schema), spelled as a
/// profile file spells it.
pub fn normalized_value(
    root: &Path,
    name: &str,
    key: &str,
    to: &str,
) -> Result<String, LedgerError> {
    let resolved = resolve_in(root, name, &[format!("{key}={to}")])
        .map_err(|e| LedgerError::Invalid(format!("{key}={to} is not a valid setting: {e}")))?;
    resolved
        .setting(key)
        .map(|s| s.value_text())
        .ok_or_else(|| LedgerError::Invalid(format!("unknown key {key:?}")))
}

/// `text` (a profile file) with `key` set to `to`, keeping comments, order and layout; the comment
/// after an existing value stays with the new value, and a key the file did not have gets `note`
/// as its comment (the "why" that `dsv4 profile explain` shows).
pub fn set_key(text: &str, key: &str, to: &str, note: &str) -> Result<String, LedgerError> {
    let spec = find_key(key).ok_or_else(|| {
        LedgerError::Invalid(format!("unknown key {key:?} (see `dsv4 profile explain`)"))
    })?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| LedgerError::Invalid(format!("profile file does not parse: {e}")))?;
    let mut value = typed_value(&spec.kind, to)?;
    let (section, name) = (spec.section(), spec.name());
    if !doc.contains_table(section) {
        doc.insert(section, toml_edit::Item::Table(toml_edit::Table::new()));
    }
    let table = doc[section].as_table_like_mut().ok_or_else(|| {
        LedgerError::Invalid(format!("[{section}] in the profile is not a table"))
    })?;
    // Replace the value in place so the key (and the comment lines above it, which toml_edit keeps
    // in the key's decor) stays; the comment after the old value moves to the new one.
    match table.get_mut(name).and_then(|item| item.as_value_mut()) {
        Some(old) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        None => {
            let note = note.replace(['\n', '\r'], " ");
            if !note.trim().is_empty() {
                value.decor_mut().set_suffix(format!(" # {}", note.trim()));
            }
            table.insert(name, toml_edit::Item::Value(value));
        }
    }
    Ok(doc.to_string())
}

/// The TOML value of `to` for a key of this kind.
fn typed_value(kind: &ValueKind, to: &str) -> Result<toml_edit::Value, LedgerError> {
    let bad = || LedgerError::Invalid(format!("{to:?} is not {}", kind.expected()));
    Ok(match kind {
        ValueKind::Bool => to.parse::<bool>().map_err(|_| bad())?.into(),
        ValueKind::Unsigned | ValueKind::Range(..) => to.parse::<i64>().map_err(|_| bad())?.into(),
        ValueKind::AutoOrUnsigned if to == "auto" => to.into(),
        ValueKind::AutoOrUnsigned => to.parse::<i64>().map_err(|_| bad())?.into(),
        ValueKind::PositiveFloat => match to.parse::<i64>() {
            Ok(i) => i.into(),
            Err(_) => to.parse::<f64>().map_err(|_| bad())?.into(),
        },
        ValueKind::ListOf(_) => {
            let inner = to.trim().trim_start_matches('[').trim_end_matches(']');
            let items = inner.split(',').map(str::trim).filter(|s| !s.is_empty());
            toml_edit::Value::Array(items.collect())
        }
        ValueKind::Text | ValueKind::OptionalText | ValueKind::OneOf(_) => to.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_key_keeps_comments_and_layout() {
        let text = "# header\nextends = \"prod-fp8\"\n\n[numerics]\n# above\nindex_k_dtype = \"bf16\" # why\n";
        let out = set_key(text, "numerics.index_k_dtype", "fp8", "unused").unwrap();
        assert_eq!(
            out,
            "# header\nextends = \"prod-fp8\"\n\n[numerics]\n# above\nindex_k_dtype = \"fp8\" # why\n"
        );
        assert!(set_key(text, "no.such_key", "1", "").is_err());
        let added = set_key(text, "exec.multi_stream_overlap", "false", "ledger X: off").unwrap();
        assert!(
            added.ends_with("\n[exec]\nmulti_stream_overlap = false # ledger X: off\n"),
            "{added}"
        );
        assert!(profile_path("../x").is_err());
    }

    #[test]
    fn auto_or_integer_keys_are_written_typed() {
        let text = "[backend]\nkind = \"cuda-sm120\"\n";
        let key = "backend.cuda_page_cache_mib";
        let pinned = set_key(text, key, "512", "").unwrap();
        assert!(pinned.ends_with("cuda_page_cache_mib = 512\n"), "{pinned}");
        let auto = set_key(&pinned, key, "auto", "").unwrap();
        assert!(auto.ends_with("cuda_page_cache_mib = \"auto\"\n"), "{auto}");
        let e = set_key(text, key, "1G", "").unwrap_err().to_string();
        assert!(e.contains("\"auto\" or a non-negative integer"), "{e}");
    }
}
