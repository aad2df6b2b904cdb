//! Errors of profile lookup, parsing, layering and validation; each says what was wrong and what to do.

use std::path::PathBuf;

/// Everything that can go wrong while resolving a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No profile of that name in any searched place.
    #[error(
        "unknown profile `{name}`{hint}; available profiles: {available} (searched: {searched}); \
         pass one of those names or a path to a .toml file"
    )]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// A " (did you mean `x`?)" fragment, or empty.
        hint: String,
        /// Comma-separated names that exist.
        available: String,
        /// The places that were searched.
        searched: String,
    },
    /// A profile name with characters that cannot name a file.
    #[error(
        "invalid profile name `{name}`: use letters, digits, `-` and `_`, or give a path ending in .toml"
    )]
    BadProfileName {
        /// The rejected name.
        name: String,
    },
    /// `--profile-dir` / `DSV4_PROFILE_DIR` names a directory that does not exist.
    #[error("profile directory {} does not exist; fix --profile-dir / DSV4_PROFILE_DIR", path.display())]
    MissingProfileDir {
        /// The directory.
        path: PathBuf,
    },
    /// A profile file could not be read.
    #[error("cannot read profile file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A profile file is not valid TOML.
    #[error("{file} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// The parser's description, with line and column.
        message: String,
    },
    /// A key that is not part of the schema.
    #[error("unknown key `{key}` in {origin}; {hint}")]
    UnknownKey {
        /// The dotted key as given.
        key: String,
        /// Where it was given (file:line, environment variable, --set).
        origin: String,
        /// A "did you mean" suggestion or the list of known keys.
        hint: String,
    },
    /// A value of the wrong type or outside the allowed set.
    #[error("bad value `{value}` for `{key}` in {origin}: expected {expected}")]
    BadValue {
        /// The dotted key.
        key: String,
        /// The value as given.
        value: String,
        /// Where it was given.
        origin: String,
        /// The accepted values.
        expected: String,
    },
    /// Profiles extend each other in a loop.
    #[error("profile `extends` cycle: {cycle}; remove one of these `extends` lines")]
    ExtendsCycle {
        /// The loop, e.g. `a -> b -> a`.
        cycle: String,
    },
    /// `extends` is not a string.
    #[error("{file}: `extends` must be a profile name or a path to a .toml file, found {found}")]
    BadExtends {
        /// The file.
        file: String,
        /// What was there instead.
        found: String,
    },
    /// A `--set` argument without `=`.
    #[error(
        "bad --set argument `{arg}`: expected section.key=value, e.g. --set numerics.kv_cache_dtype=fp8"
    )]
    BadSet {
        /// The argument.
        arg: String,
    },
    /// Validation found combinations that cannot run.
    #[error(
        "invalid configuration for profile `{profile}` ({count} problem(s); change the keys named \
         below, e.g. with --set):\n{problems}"
    )]
    Invalid {
        /// The profile as asked for.
        profile: String,
        /// How many error findings.
        count: usize,
        /// One indented entry per finding, each naming its keys with values and sources.
        problems: String,
    },
    /// figment could not turn the merged layers into a [`crate::Profile`] (should not happen after validation).
    #[error("could not assemble the configuration: {message}")]
    Assemble {
        /// figment's description.
        message: String,
    },
}
