//! `dsv4 profile ...`: show the resolved configuration of a profile and where each value came from.

use dsv4_config::Resolved;
use serde::Serialize;

/// Subcommands of `dsv4 profile`.
#[derive(Debug, clap::Subcommand)]
pub enum ProfileCommand {
    /// Print every resolved key with its value and source (default, file:line, env var, --set).
    Show {
        /// Profile name or path (defaults to --profile).
        name: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

impl ProfileCommand {
    /// The profile this command names itself, overriding `--profile`.
    pub fn profile_name(&self) -> Option<&str> {
        match self {
            ProfileCommand::Show { name, .. } => name.as_deref(),
        }
    }
}

/// The JSON document of `profile show --json`.
#[derive(Debug, Serialize)]
struct ShowJson<'a> {
    /// The profile as asked for.
    profile: &'a str,
    /// Profile files applied, base first.
    files: &'a [String],
    /// Every key with value and origin.
    settings: Vec<SettingJson<'a>>,
    /// The resolved configuration as nested sections.
    resolved: &'a dsv4_config::Profile,
}

/// One key in `profile show --json`.
#[derive(Debug, Serialize)]
struct SettingJson<'a> {
    key: &'a str,
    value: &'a serde_json::Value,
    /// The origin as structured data.
    origin: &'a dsv4_config::Origin,
    /// The origin as one line of text.
    source: String,
}

/// Run a `dsv4 profile` subcommand on an already resolved profile.
pub fn run(cmd: &ProfileCommand, resolved: &Resolved) -> anyhow::Result<()> {
    match cmd {
        ProfileCommand::Show { json: true, .. } => {
            let doc = ShowJson {
                profile: &resolved.requested,
                files: &resolved.files,
                settings: resolved
                    .settings
                    .iter()
                    .map(|s| SettingJson {
                        key: s.key,
                        value: &s.value,
                        origin: &s.origin,
                        source: s.origin.to_string(),
                    })
                    .collect(),
                resolved: &resolved.profile,
            };
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        ProfileCommand::Show { json: false, .. } => print!("{}", table(resolved)),
    }
    Ok(())
}

/// The text of `profile show`: a header, then one aligned `key value source` row per key.
fn table(resolved: &Resolved) -> String {
    let mut out = format!(
        "profile {} (files, base first: {})\n",
        resolved.requested,
        resolved.files.join(" <- ")
    );
    let rows: Vec<(&str, String, String)> = resolved
        .settings
        .iter()
        .map(|s| (s.key, s.value_text(), s.origin.to_string()))
        .collect();
    let kw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(3);
    let vw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(5);
    out.push_str(&format!("{:kw$}  {:vw$}  SOURCE\n", "KEY", "VALUE"));
    for (k, v, s) in rows {
        out.push_str(&format!("{k:kw$}  {v:vw$}  {s}\n"));
    }
    out
}
