//! "Did you mean" suggestions for unknown keys and sections, by edit distance and prefix.

use super::{KEYS, sections};

/// Edit distance between two strings (insertions, deletions, substitutions).
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The nearest candidate to `word`, if it is close enough to be a plausible typo: at most
/// `min_limit` edits, or a third of the word's length if that is more.
fn nearest<'a>(
    word: &str,
    min_limit: usize,
    candidates: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<&'a str> {
    let limit = (word.len() / 3).max(min_limit);
    candidates
        .map(|(compare, answer)| (levenshtein(word, compare), answer))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, answer)| answer)
}

/// The known key most likely meant by an unknown dotted key (matching the whole key or its last part).
pub fn suggest_key(unknown: &str) -> Option<&'static str> {
    let leaf = unknown.rsplit('.').next().unwrap_or(unknown);
    let whole = nearest(unknown, 2, KEYS.iter().map(|k| (k.key, k.key)));
    // A truncated name (`numerics.kv_cache`, `exec.thr`) is a prefix of the key that was meant.
    let prefix = || {
        KEYS.iter()
            .filter(|k| leaf.len() >= 3 && k.name().starts_with(leaf))
            .min_by_key(|k| (!unknown.starts_with(k.section()), k.key.len()))
            .map(|k| k.key)
    };
    // A key name alone is short: two edits would turn `nope` into `mode`.
    whole
        .or_else(prefix)
        .or_else(|| nearest(leaf, 1, KEYS.iter().map(|k| (k.name(), k.key))))
}

/// The known section most likely meant by an unknown section name.
pub fn suggest_section(unknown: &str) -> Option<&'static str> {
    nearest(unknown, 2, sections().into_iter().map(|s| (s, s)))
}

/// The keys of `section`, comma-separated.
fn section_keys(section: &str) -> String {
    let keys: Vec<&str> = KEYS
        .iter()
        .filter(|k| k.section() == section)
        .map(|k| k.key)
        .collect();
    keys.join(", ")
}

/// The advice that follows "unknown key `key`": a suggestion, or the keys that exist.
pub fn unknown_key_hint(key: &str) -> String {
    if sections().contains(&key) {
        return format!(
            "`{key}` is a section; set one of its keys: {}",
            section_keys(key)
        );
    }
    let section = key
        .split_once('.')
        .map(|(s, _)| s)
        .filter(|s| sections().contains(s));
    match (suggest_key(key), section) {
        (Some(s), _) => format!("did you mean `{s}`? (every key is listed in docs/profiles.md)"),
        (None, Some(section)) => format!(
            "[{section}] has: {} (every key is listed in docs/profiles.md)",
            section_keys(section)
        ),
        (None, None) => {
            let all: Vec<&str> = KEYS.iter().map(|k| k.key).collect();
            format!("known keys: {}", all.join(", "))
        }
    }
}

/// The advice that follows "unknown section `name`": a suggestion, or the sections that exist.
pub fn unknown_section_hint(name: &str) -> String {
    match suggest_section(name) {
        Some(s) => format!("did you mean `[{s}]`? (every key is listed in docs/profiles.md)"),
        None => format!("known sections: {}", sections().join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levenshtein_counts_edits() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("same", "same"), 0);
    }

    #[test]
    fn suggestions_find_typos_and_misplaced_keys() {
        assert_eq!(
            suggest_key("numerics.kv_cache_dtyp"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(
            suggest_key("exec.kv_cache_dtype"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(suggest_key("exec.thread"), Some("exec.threads"));
        assert_eq!(
            suggest_key("numerics.kv_cache"),
            Some("numerics.kv_cache_dtype")
        );
        assert_eq!(suggest_key("index_k"), Some("numerics.index_k_dtype"));
        assert_eq!(suggest_key("exec.cuda_graphs"), Some("exec.cuda_graph"));
        assert_eq!(
            suggest_key("exec.multi_stream"),
            Some("exec.multi_stream_overlap")
        );
        assert_eq!(suggest_key("cache.hi_cache"), Some("cache.hicache"));
        assert_eq!(
            suggest_key("scheduler.max_running_request"),
            Some("scheduler.max_running_requests")
        );
        assert_eq!(suggest_key("zzzz.qqqqqqq"), None);
        assert_eq!(suggest_section("numeric"), Some("numerics"));
        assert_eq!(suggest_section("schedular"), Some("scheduler"));
        assert!(unknown_key_hint("numerics").contains("numerics.act_quant"));
        assert!(unknown_key_hint("zzzz.qqqqqqq").contains("known keys: model.path"));
        // A short name two edits from a key of another section is no typo of it.
        assert_eq!(suggest_key("exec.nope"), None);
        assert_eq!(suggest_key("nope"), None);
        assert_eq!(suggest_key("server.prot"), Some("server.port"));
        // Then the hint lists the keys of the section that was named.
        let hint = unknown_key_hint("exec.nope");
        assert!(hint.starts_with("[exec] has: exec.cuda_graph,"), "{hint}");
        assert!(!hint.contains("disagg"), "{hint}");
    }
}
