//! One row of [`super::SGLANG_MAP`]: the test on a key's value, what a matching row contributes
//! to the SGLang command, and the shorthands the table is written with.

/// A test on one key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Any value.
    Always,
    /// The value spelled exactly so (`true`, `fp8`, `none`, ...).
    Is(&'static str),
    /// The number 0.
    Zero,
    /// No value (an unset optional key).
    Unset,
    /// An empty list.
    Empty,
}

impl When {
    /// Whether `value` passes the test.
    pub fn matches(&self, value: &serde_json::Value) -> bool {
        match self {
            When::Always => true,
            When::Is(text) => match value {
                serde_json::Value::String(s) => s == text,
                // `true`, `false`, numbers: compare with the text read as JSON
                other => serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v == *other),
            },
            When::Zero => value.as_u64() == Some(0),
            When::Unset => value.is_null(),
            When::Empty => value.as_array().is_some_and(Vec::is_empty),
        }
    }

    /// The test as written in the docs table.
    pub(super) fn describe(&self, first: bool) -> String {
        match self {
            When::Always if first => "any".to_string(),
            When::Always => "any other".to_string(),
            When::Is(text) => format!("`{text}`"),
            When::Zero => "`0`".to_string(),
            When::Unset => "unset".to_string(),
            When::Empty => "`[]`".to_string(),
        }
    }
}

/// What a matching row contributes to the SGLang command. In messages, `{value}` is replaced by the
/// key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A flag without a value.
    Flag(&'static str),
    /// A flag followed by the key's value.
    FlagValue(&'static str),
    /// A flag followed by a fixed value.
    FlagConst(&'static str, &'static str),
    /// A flag followed by the port of the key's `host:port` value.
    FlagPort(&'static str),
    /// An environment variable with a fixed value.
    Env(&'static str, &'static str),
    /// An environment variable set to the key's value.
    EnvValue(&'static str),
    /// Nothing to pass: SGLang already behaves so, or the knob does not apply (the reason).
    Same(&'static str),
    /// No SGLang equivalent: reported as a warning (the reason).
    Unmapped(&'static str),
    /// The command cannot run with this value: reported, and `dsv4 serve` refuses (the reason).
    Blocker(&'static str),
}

impl Action {
    /// The docs table's SGLang and note cells for this action.
    pub(super) fn describe(&self) -> (String, String) {
        match *self {
            Action::Flag(f) => (format!("`{f}`"), String::new()),
            Action::FlagValue(f) => (format!("`{f} VALUE`"), String::new()),
            Action::FlagConst(f, v) => (format!("`{f} {v}`"), String::new()),
            Action::FlagPort(f) => (format!("`{f} PORT`"), "PORT of host:port".to_string()),
            Action::Env(name, v) => (format!("env `{name}={v}`"), String::new()),
            Action::EnvValue(name) => (format!("env `{name}=VALUE`"), String::new()),
            Action::Same(why) => ("(nothing)".to_string(), why.to_string()),
            Action::Unmapped(why) => ("**warning**".to_string(), why.replace("{value}", "VALUE")),
            Action::Blocker(why) => ("**blocked**".to_string(), why.replace("{value}", "VALUE")),
        }
    }
}

/// One row: for `key`, when its value passes `when` (and the `guard` key's value passes its test),
/// do `action`. The first matching row of a key wins.
#[derive(Debug, Clone, Copy)]
pub struct MapRow {
    /// Dotted key.
    pub key: &'static str,
    /// The test on the key's own value.
    pub when: When,
    /// A test on another key's value that must also pass.
    pub guard: Option<(&'static str, When)>,
    /// What to emit.
    pub action: Action,
}

/// Shorthand for a row without a guard.
pub(super) const fn row(key: &'static str, when: When, action: Action) -> MapRow {
    MapRow {
        key,
        when,
        guard: None,
        action,
    }
}

/// Shorthand for a row with a guard on another key.
pub(super) const fn guarded(
    key: &'static str,
    other: &'static str,
    test: When,
    action: Action,
) -> MapRow {
    MapRow {
        key,
        when: When::Always,
        guard: Some((other, test)),
        action,
    }
}
