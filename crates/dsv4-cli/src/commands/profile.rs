//! `dsv4 profile ...`: list profiles, show or explain a resolved configuration (every value with its
//! source and its why), diff two, and export one to an SGLang launch command.

use anyhow::bail;
use dsv4_config::export::render::{Format, render};
use dsv4_config::schema::find_key;
use dsv4_config::{Profile, ResolveOptions, Resolved, Severity};
use serde::Serialize;

/// Subcommands of `dsv4 profile`.
#[derive(Debug, clap::Subcommand)]
pub enum ProfileCommand {
    /// List every profile that can be named: where it lives, what it extends, what it is for.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print every resolved key with its value and source (default, file:line, env var, --set).
    Show {
        /// Profile name or path (defaults to --profile).
        name: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print every key with value, source, the profile's comment on it, and what it does; then the
    /// validation findings.
    Explain {
        /// Profile name or path (defaults to --profile).
        name: Option<String>,
        /// Explain only this key (repeatable); the findings stay the whole profile's.
        #[arg(long = "key", value_name = "KEY")]
        keys: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print only the keys whose values differ between two profiles, with both values and sources.
    Diff {
        /// The first profile (name or path).
        a: String,
        /// The second profile (name or path).
        b: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the command that reproduces a profile on another engine.
    Export(ExportArgs),
}

/// Arguments of `dsv4 profile export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Profile name or path (defaults to --profile).
    name: Option<String>,
    /// The engine to export to.
    #[arg(long, value_enum)]
    target: Target,
    /// Output format: a shell script, systemd `[Service]` lines, or JSON.
    #[arg(long, value_enum, default_value_t = FormatArg::Sh)]
    format: FormatArg,
}

/// Engines a profile can be exported to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Target {
    /// `python3 -m sglang.launch_server` with environment variables.
    Sglang,
}

/// `--format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FormatArg {
    /// A #!/bin/sh script that exports the environment and execs SGLang.
    Sh,
    /// Environment= and ExecStart= lines of a systemd `[Service]` section.
    Systemd,
    /// One JSON document: argv, env, warnings, and how every key was handled.
    Json,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Sh => Format::Sh,
            FormatArg::Systemd => Format::Systemd,
            FormatArg::Json => Format::Json,
        }
    }
}

/// Run a `dsv4 profile` subcommand. `options` builds the resolution options for a profile name (the
/// process environment, --profile-dir and --set applied); `default` is the --profile value.
pub fn run(
    cmd: &ProfileCommand,
    options: &dyn Fn(&str) -> ResolveOptions,
    default: &str,
) -> anyhow::Result<()> {
    let name = |n: &Option<String>| n.clone().unwrap_or_else(|| default.to_string());
    match cmd {
        ProfileCommand::List { json } => list(&options(default), default, *json),
        ProfileCommand::Show { name: n, json } => {
            let resolved = dsv4_config::assemble(&options(&name(n)))?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&show_json(&resolved))?);
            } else {
                print!("{}", show_text(&resolved));
            }
            fail_if_invalid(&resolved)
        }
        ProfileCommand::Explain {
            name: n,
            keys,
            json,
        } => {
            if let Some(key) = n.as_deref().filter(|n| find_key(n).is_some()) {
                bail!(
                    "`{key}` is a configuration key, not a profile: explain it with \
                     `dsv4 profile explain --key {key}` (after a profile name, in that profile)"
                );
            }
            if let Some(bad) = keys.iter().find(|k| find_key(k).is_none()) {
                bail!(
                    "unknown key `{bad}` in --key: {}",
                    dsv4_config::schema::unknown_key_hint(bad)
                );
            }
            let resolved = dsv4_config::assemble(&options(&name(n)))?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&document(&resolved, true, keys))?
                );
            } else {
                print!("{}", explain_text(&resolved, keys));
            }
            fail_if_invalid(&resolved)
        }
        ProfileCommand::Diff { a, b, json } => {
            let ra = dsv4_config::assemble(&options(a))?;
            let rb = dsv4_config::assemble(&options(b))?;
            let differences = dsv4_config::compare::diff(&ra, &rb);
            if *json {
                let doc = DiffJson {
                    a: &ra.requested,
                    b: &rb.requested,
                    files_a: &ra.files,
                    files_b: &rb.files,
                    differences: differences.iter().map(DiffEntry::from).collect(),
                };
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print!("{}", diff_text(&ra, &rb, &differences));
            }
            Ok(())
        }
        ProfileCommand::Export(args) => {
            let resolved = Profile::resolve(&options(&name(&args.name)))?;
            let Target::Sglang = args.target;
            let cmd = dsv4_config::export::sglang(&resolved);
            for b in &cmd.blockers {
                eprintln!(
                    "warning: the exported command cannot run: {} = {}: {}",
                    b.key, b.value, b.message
                );
            }
            for w in &cmd.warnings {
                eprintln!(
                    "warning: not reproduced on SGLang: {} = {}: {}",
                    w.key, w.value, w.message
                );
            }
            print!("{}", render(&cmd, args.format.into()));
            Ok(())
        }
    }
}

/// Exit with an error (after the output was printed) when validation found errors.
fn fail_if_invalid(resolved: &Resolved) -> anyhow::Result<()> {
    let errors = resolved.findings_of(Severity::Error).count();
    if errors > 0 {
        bail!(
            "profile `{}` is invalid: {errors} validation error(s), listed with the output; change \
             the keys they name (e.g. with --set)",
            resolved.requested
        );
    }
    Ok(())
}

/// One profile in `profile list --json`.
#[derive(Debug, Serialize)]
struct ListEntry {
    name: String,
    source: String,
    extends: Option<String>,
    summary: String,
    default: bool,
}

fn list(opts: &ResolveOptions, default: &str, json: bool) -> anyhow::Result<()> {
    let entries: Vec<ListEntry> = opts
        .search
        .list()?
        .into_iter()
        .map(|e| ListEntry {
            default: e.name == default,
            source: e.location.to_string(),
            name: e.name,
            extends: e.extends,
            summary: e.summary,
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            let name = if e.default {
                format!("{} (default)", e.name)
            } else {
                e.name.clone()
            };
            let extends = e.extends.clone().unwrap_or_else(|| "-".to_string());
            [name, e.source.clone(), extends, e.summary.clone()]
        })
        .collect();
    print!(
        "{}",
        columns(&["NAME", "SOURCE", "EXTENDS", "SUMMARY"], &rows)
    );
    Ok(())
}

/// Left-aligned columns separated by two spaces (the last column is not padded).
fn columns<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:w$}  ", w = widths[i]));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The findings, errors first, each with the keys it names, values and sources.
fn findings_text(resolved: &Resolved) -> String {
    let mut out = String::new();
    for (severity, title) in [(Severity::Error, "errors"), (Severity::Warning, "warnings")] {
        let items: Vec<String> = resolved
            .findings_of(severity)
            .map(|f| format!("  - {}\n", resolved.describe(f).replace('\n', "\n  ")))
            .collect();
        if !items.is_empty() {
            out.push_str(&format!("\n{title} ({}):\n{}", items.len(), items.concat()));
        }
    }
    out
}

/// The text of `profile show`: a header, one aligned `key value source` row per key, findings.
fn show_text(resolved: &Resolved) -> String {
    let mut out = format!(
        "profile {} (files, base first: {})\n",
        resolved.requested,
        resolved.files.join(" <- ")
    );
    let rows: Vec<[String; 3]> = resolved
        .settings
        .iter()
        .map(|s| [s.key.to_string(), s.value_text(), s.origin.to_string()])
        .collect();
    out.push_str(&columns(&["KEY", "VALUE", "SOURCE"], &rows));
    out.push_str(&findings_text(resolved));
    out
}

/// One key in `profile show --json` and `profile explain --json`.
#[derive(Debug, Serialize)]
struct SettingJson<'a> {
    key: &'a str,
    value: &'a serde_json::Value,
    /// The origin as structured data.
    origin: &'a dsv4_config::Origin,
    /// The origin as one line of text.
    source: String,
    /// The comment next to the key in the file that set it (explain only).
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'a str>,
    /// What the key does (explain only).
    #[serde(skip_serializing_if = "Option::is_none")]
    what: Option<&'a str>,
    /// The validated ledger record that justifies this value, "ID: title" (explain only, when
    /// the current directory holds a ledger).
    #[serde(skip_serializing_if = "Option::is_none")]
    ledger: Option<String>,
}

/// The JSON document of `profile show --json` and `profile explain --json`.
#[derive(Debug, Serialize)]
struct ShowJson<'a> {
    /// The profile as asked for.
    profile: &'a str,
    /// What the profile is for (explain only).
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    /// Profile files applied, base first.
    files: &'a [String],
    /// Every key with value and origin.
    settings: Vec<SettingJson<'a>>,
    /// The resolved configuration as nested sections (secrets redacted).
    resolved: serde_json::Value,
    /// Validation errors and warnings.
    findings: &'a [dsv4_config::Finding],
}

fn show_json(resolved: &Resolved) -> ShowJson<'_> {
    document(resolved, false, &[])
}

/// The profile a file-origin value was set by: the file name without directory or `.toml`.
fn origin_profile(origin: &dsv4_config::Origin) -> Option<String> {
    match origin {
        dsv4_config::Origin::File { file, .. } => {
            let name = file.rsplit(['/', ':']).next().unwrap_or(file);
            Some(name.trim_end_matches(".toml").to_string())
        }
        _ => None,
    }
}

/// The validated ledger record justifying each key's value ("ID: title"), looked up in the ledger
/// of the current directory (`ledger/entries`); empty when there is none or it cannot be read.
fn justifications(resolved: &Resolved) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let ledger = match dsv4_ledger::store::Ledger::load(std::path::Path::new(".")) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("cannot read the ledger for profile explain: {e}");
            return out;
        }
    };
    for s in &resolved.settings {
        let value = s.value_text();
        let candidates = [Some(resolved.requested.clone()), origin_profile(&s.origin)];
        let found = candidates
            .iter()
            .flatten()
            .find_map(|p| dsv4_ledger::verify::justifying_record(&ledger, p, s.key, &value));
        if let Some(r) = found {
            out.insert(s.key.to_string(), format!("{}: {}", r.id, r.title));
        }
    }
    out
}

/// Whether `key` is one of `keys`, or `keys` is empty (every key).
fn asked(keys: &[String], key: &str) -> bool {
    keys.is_empty() || keys.iter().any(|k| k == key)
}

/// The JSON document of `profile show` or (`explain`) `profile explain`, with the settings of
/// `keys` only unless it is empty.
fn document<'a>(resolved: &'a Resolved, explain: bool, keys: &[String]) -> ShowJson<'a> {
    let justified = if explain {
        justifications(resolved)
    } else {
        Default::default()
    };
    ShowJson {
        profile: &resolved.requested,
        description: explain.then_some(resolved.description.as_str()),
        files: &resolved.files,
        settings: resolved
            .settings
            .iter()
            .filter(|s| asked(keys, s.key))
            .map(|s| SettingJson {
                key: s.key,
                value: &s.value,
                origin: &s.origin,
                source: s.origin.to_string(),
                why: s.comment.as_deref().filter(|_| explain),
                what: find_key(s.key).map(|k| k.doc).filter(|_| explain),
                ledger: justified.get(s.key).cloned(),
            })
            .collect(),
        resolved: resolved.nested_json(),
        findings: &resolved.findings,
    }
}

/// The text of `profile explain`: purpose, files, then each key (of `keys` only unless it is
/// empty) with source, why and what, then the profile's findings.
fn explain_text(resolved: &Resolved, keys: &[String]) -> String {
    let mut out = format!("profile {}\n", resolved.requested);
    for line in resolved.description.lines() {
        out.push_str(format!("  {line}").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "files, base first: {}\n",
        resolved.files.join(" <- ")
    ));
    let justified = justifications(resolved);
    let mut section = "";
    for s in resolved.settings.iter().filter(|s| asked(keys, s.key)) {
        let spec = find_key(s.key);
        let this = spec.map_or("", |k| k.section());
        if this != section {
            out.push_str(&format!("\n[{this}]\n"));
            section = this;
        }
        out.push_str(&format!("{} = {}\n", s.key, s.value_text()));
        out.push_str(&format!("    source: {}\n", s.origin));
        if let Some(why) = &s.comment {
            out.push_str(&format!("    why:    {why}\n"));
        }
        if let Some(spec) = spec {
            out.push_str(&format!("    what:   {}\n", spec.doc));
        }
        if let Some(record) = justified.get(s.key) {
            out.push_str(&format!("    ledger: {record}\n"));
        }
    }
    out.push_str(&findings_text(resolved));
    out
}

/// One side of a difference in `profile diff --json`.
#[derive(Debug, Serialize)]
struct SideJson<'a> {
    value: &'a serde_json::Value,
    origin: &'a dsv4_config::Origin,
    source: String,
}

/// One differing key in `profile diff --json`.
#[derive(Debug, Serialize)]
struct DiffEntry<'a> {
    key: &'a str,
    a: SideJson<'a>,
    b: SideJson<'a>,
}

impl<'a> From<&'a dsv4_config::compare::Difference> for DiffEntry<'a> {
    fn from(d: &'a dsv4_config::compare::Difference) -> Self {
        let side = |s: &'a dsv4_config::compare::Side| SideJson {
            value: &s.value,
            origin: &s.origin,
            source: s.origin.to_string(),
        };
        DiffEntry {
            key: d.key,
            a: side(&d.a),
            b: side(&d.b),
        }
    }
}

/// The JSON document of `profile diff --json`.
#[derive(Debug, Serialize)]
struct DiffJson<'a> {
    a: &'a str,
    b: &'a str,
    files_a: &'a [String],
    files_b: &'a [String],
    differences: Vec<DiffEntry<'a>>,
}

/// The text of `profile diff`: a count, then one row per differing key with both values and sources.
fn diff_text(
    a: &Resolved,
    b: &Resolved,
    differences: &[dsv4_config::compare::Difference],
) -> String {
    if differences.is_empty() {
        return format!("{} and {}: no differences\n", a.requested, b.requested);
    }
    let mut out = format!(
        "{} -> {}: {} key(s) differ\n",
        a.requested,
        b.requested,
        differences.len()
    );
    let rows: Vec<[String; 3]> = differences
        .iter()
        .map(|d| {
            let cell = |s: &dsv4_config::compare::Side| {
                format!(
                    "{}  ({})",
                    dsv4_config::resolve::value_text(&s.value),
                    s.origin
                )
            };
            [d.key.to_string(), cell(&d.a), cell(&d.b)]
        })
        .collect();
    out.push_str(&columns(&["KEY", &a.requested, &b.requested], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_do_not_pad_the_last() {
        let rows = [
            ["a".to_string(), "bb".to_string(), "c".to_string()],
            ["aaa".to_string(), "b".to_string(), "cc".to_string()],
        ];
        assert_eq!(
            columns(&["X", "Y", "Z"], &rows),
            "X    Y   Z\na    bb  c\naaa  b   cc\n"
        );
    }
}
