//! Where profiles are found: `--profile-dir` / `DSV4_PROFILE_DIR`, then `./profiles`, then the profiles
//! embedded in the binary (so `dsv4` works from any directory). A profile may also be given as a path.

use crate::error::ConfigError;
use crate::schema::levenshtein;
use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

/// The profile used when none is named.
pub const DEFAULT_PROFILE: &str = "dev-cpu";

/// The shipped profiles, compiled into the binary: (name, TOML text).
pub const EMBEDDED_PROFILES: &[(&str, &str)] = &[
    ("dev-cpu", include_str!("../../../profiles/dev-cpu.toml")),
    (
        "reference",
        include_str!("../../../profiles/reference.toml"),
    ),
    ("prod-fp8", include_str!("../../../profiles/prod-fp8.toml")),
    (
        "rehearsal",
        include_str!("../../../profiles/rehearsal.toml"),
    ),
    (
        "prod-bf16",
        include_str!("../../../profiles/prod-bf16.toml"),
    ),
];

/// The environment variable that names a profile directory when `--profile-dir` is not given.
pub const PROFILE_DIR_ENV: &str = "DSV4_PROFILE_DIR";

/// Where one profile file lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileLocation {
    /// A file on disk.
    File(PathBuf),
    /// A profile compiled into the binary, by name.
    Embedded(&'static str),
}

impl ProfileLocation {
    /// The profile's name: the embedded name, or the file stem.
    pub fn stem(&self) -> String {
        match self {
            ProfileLocation::File(p) => p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            ProfileLocation::Embedded(name) => (*name).to_string(),
        }
    }

    /// A key that is equal for two locations exactly when they are the same file.
    fn identity(&self) -> String {
        match self {
            ProfileLocation::File(p) => {
                let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                format!("file:{}", canon.display())
            }
            ProfileLocation::Embedded(name) => format!("embedded:{name}"),
        }
    }
}

impl fmt::Display for ProfileLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileLocation::File(p) => write!(f, "{}", p.display()),
            ProfileLocation::Embedded(name) => write!(f, "embedded:{name}.toml"),
        }
    }
}

/// A profile file's location and text.
#[derive(Debug, Clone)]
pub struct ProfileFile {
    /// Where it was found.
    pub location: ProfileLocation,
    /// Its TOML text.
    pub text: Cow<'static, str>,
}

impl ProfileFile {
    /// The directory that relative `extends` paths are resolved against.
    pub fn base_dir(&self) -> Option<&Path> {
        match &self.location {
            ProfileLocation::File(p) => p.parent(),
            ProfileLocation::Embedded(_) => None,
        }
    }
}

/// One available profile, as listed for the user.
#[derive(Debug, Clone)]
pub struct ProfileEntry {
    /// Its name (the file stem).
    pub name: String,
    /// The file that the name resolves to.
    pub location: ProfileLocation,
    /// The first line of its leading comment block.
    pub summary: String,
    /// The profile it extends, if any (as written in the file).
    pub extends: Option<String>,
}

/// The places searched for profiles by name, in order.
#[derive(Debug, Clone)]
pub struct ProfileSearch {
    /// An explicit directory (`--profile-dir` or `DSV4_PROFILE_DIR`); it must exist when given.
    pub profile_dir: Option<PathBuf>,
    /// The working directory's `profiles/` (skipped when it does not exist).
    pub local_dir: Option<PathBuf>,
    /// Whether the profiles compiled into the binary are searched last.
    pub embedded: bool,
}

impl ProfileSearch {
    /// The standard order: `profile_dir` if given, then `./profiles`, then the embedded profiles.
    pub fn standard(profile_dir: Option<PathBuf>) -> Self {
        ProfileSearch {
            profile_dir,
            local_dir: Some(PathBuf::from("profiles")),
            embedded: true,
        }
    }

    /// The directories to search, in order; errors when the explicit directory is missing.
    fn dirs(&self) -> Result<Vec<&Path>, ConfigError> {
        let mut dirs = Vec::new();
        if let Some(d) = &self.profile_dir {
            if !d.is_dir() {
                return Err(ConfigError::MissingProfileDir { path: d.clone() });
            }
            dirs.push(d.as_path());
        }
        if let Some(d) = self.local_dir.as_deref().filter(|d| d.is_dir()) {
            dirs.push(d);
        }
        Ok(dirs)
    }

    /// Describes the searched places, for error messages.
    fn describe(&self) -> String {
        let mut places: Vec<String> = Vec::new();
        if let Some(d) = &self.profile_dir {
            places.push(d.display().to_string());
        }
        if let Some(d) = &self.local_dir {
            let shown = d.display().to_string();
            places.push(if d.is_relative() && !shown.starts_with('.') {
                format!("./{shown}")
            } else {
                shown
            });
        }
        if self.embedded {
            places.push("the profiles embedded in the binary".to_string());
        }
        places.join(", ")
    }

    /// Find a profile by name, or by path when `spec` looks like one (relative paths are resolved against
    /// `base_dir` when given, e.g. the directory of the file whose `extends` names it).
    pub fn find(&self, spec: &str, base_dir: Option<&Path>) -> Result<ProfileFile, ConfigError> {
        if is_path(spec) {
            let path = match base_dir {
                Some(base) if Path::new(spec).is_relative() => base.join(spec),
                _ => PathBuf::from(spec),
            };
            return read_file(path);
        }
        if spec.is_empty()
            || !spec
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::BadProfileName {
                name: spec.to_string(),
            });
        }
        for dir in self.dirs()? {
            let path = dir.join(format!("{spec}.toml"));
            if path.is_file() {
                return read_file(path);
            }
        }
        let mut embedded = EMBEDDED_PROFILES.iter().filter(|_| self.embedded);
        if let Some((name, text)) = embedded.find(|(n, _)| *n == spec) {
            return Ok(ProfileFile {
                location: ProfileLocation::Embedded(name),
                text: Cow::Borrowed(text),
            });
        }
        let names: Vec<String> = self.list()?.into_iter().map(|e| e.name).collect();
        let hint = names
            .iter()
            .map(|n| (levenshtein(spec, n), n))
            .filter(|(d, _)| *d <= (spec.len() / 3).max(2))
            .min_by_key(|(d, _)| *d)
            .map(|(_, n)| format!(" (did you mean `{n}`?)"))
            .unwrap_or_default();
        Err(ConfigError::UnknownProfile {
            name: spec.to_string(),
            hint,
            available: if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(", ")
            },
            searched: self.describe(),
        })
    }

    /// Every profile reachable by name, each from the first place that has it, sorted by name.
    pub fn list(&self) -> Result<Vec<ProfileEntry>, ConfigError> {
        let mut out: Vec<ProfileEntry> = Vec::new();
        for dir in self.dirs()? {
            let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::Read {
                path: dir.to_path_buf(),
                source,
            })?;
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths {
                let is_toml = path.extension().is_some_and(|e| e == "toml");
                let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                if !is_toml || out.iter().any(|e| e.name == name) {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                out.push(ProfileEntry {
                    name: name.to_string(),
                    summary: summary(&text),
                    extends: extends_in(&text),
                    location: ProfileLocation::File(path.clone()),
                });
            }
        }
        if self.embedded {
            for (name, text) in EMBEDDED_PROFILES {
                if !out.iter().any(|e| e.name == *name) {
                    out.push(ProfileEntry {
                        name: name.to_string(),
                        location: ProfileLocation::Embedded(name),
                        summary: summary(text),
                        extends: extends_in(text),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Whether a profile argument is a path rather than a name.
pub fn is_path(spec: &str) -> bool {
    spec.ends_with(".toml") || spec.contains('/') || spec.contains('\\')
}

/// Read a profile file from disk.
fn read_file(path: PathBuf) -> Result<ProfileFile, ConfigError> {
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(ProfileFile {
            location: ProfileLocation::File(path),
            text: Cow::Owned(text),
        }),
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// The first non-empty line of the leading comment block, without the `#`.
fn summary(text: &str) -> String {
    text.lines()
        .map_while(|l| l.trim().strip_prefix('#'))
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// The whole leading comment block, without the `#` marks, blank edges trimmed (paragraphs kept).
pub fn description(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map_while(|l| l.trim().strip_prefix('#'))
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end())
        .collect();
    lines.join("\n").trim().to_string()
}

/// The `extends` value of a profile text, when it parses and has one (for listings).
fn extends_in(text: &str) -> Option<String> {
    let table: toml::Table = toml::from_str(text).ok()?;
    table.get("extends")?.as_str().map(str::to_string)
}

/// The profile files of an `extends` chain, base first, ending with the requested one.
pub fn load_chain(search: &ProfileSearch, spec: &str) -> Result<Vec<ProfileFile>, ConfigError> {
    let mut chain: Vec<ProfileFile> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut next: Option<(String, Option<PathBuf>)> = Some((spec.to_string(), None));
    while let Some((name, base)) = next.take() {
        let file = search.find(&name, base.as_deref())?;
        let id = file.location.identity();
        labels.push(name);
        if seen.contains(&id) {
            return Err(ConfigError::ExtendsCycle {
                cycle: labels.join(" -> "),
            });
        }
        seen.push(id);
        if let Some(parent) = extends_of(&file)? {
            next = Some((parent, file.base_dir().map(Path::to_path_buf)));
        }
        chain.push(file);
    }
    chain.reverse();
    Ok(chain)
}

/// The `extends` value of a profile file, if it has one.
fn extends_of(file: &ProfileFile) -> Result<Option<String>, ConfigError> {
    let table: toml::Table = toml::from_str(&file.text).map_err(|e| ConfigError::Syntax {
        file: file.location.to_string(),
        message: e.to_string(),
    })?;
    match table.get("extends") {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ConfigError::BadExtends {
            file: file.location.to_string(),
            found: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names_are_told_apart() {
        assert!(is_path("x.toml"));
        assert!(is_path("dir/x"));
        assert!(!is_path("dev-cpu"));
    }

    #[test]
    fn summary_is_first_comment_line() {
        assert_eq!(
            summary("#\n# Hello there.\n# more\n[model]\n"),
            "Hello there."
        );
        assert_eq!(summary("[model]\n# late\n"), "");
        assert_eq!(
            description("#\n# Hello there.\n#\n#   indented\n[model]\n# late\n"),
            "Hello there.\n\n  indented"
        );
        assert_eq!(extends_in("extends = \"a\"\n"), Some("a".to_string()));
        assert_eq!(extends_in("extends = 3\n"), None);
    }

    #[test]
    fn embedded_only_search_finds_shipped_profiles() {
        let search = ProfileSearch {
            profile_dir: None,
            local_dir: None,
            embedded: true,
        };
        let names: Vec<String> = search.list().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            ["dev-cpu", "prod-bf16", "prod-fp8", "reference", "rehearsal"]
        );
        let f = search.find("dev-cpu", None).unwrap();
        assert_eq!(f.location.to_string(), "embedded:dev-cpu.toml");
        let e = search.find("dev-cpo", None).unwrap_err().to_string();
        assert!(
            e.contains("did you mean `dev-cpu`")
                && e.contains("dev-cpu, prod-bf16, prod-fp8, reference"),
            "{e}"
        );
        let e = search.find("bad name!", None).unwrap_err().to_string();
        assert!(e.contains("invalid profile name"), "{e}");
    }
}
