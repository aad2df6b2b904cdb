//! Every relative link in README.md and docs/*.md reaches a file that exists and, when it names
//! an `#anchor`, a heading of that file (GitHub's slugs), so moving or renaming a section cannot
//! leave a dead link behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository root (two levels above this crate).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The lines of `text` outside ``` code fences, numbered from 1.
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(i, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((i + 1, line))
    })
}

/// GitHub's anchor of a heading: lower case, only letters, digits, spaces, `-` and `_` kept,
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown text's headings; a repeated heading gets `-1`, `-2` ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let s = slug(title);
        let n = seen.entry(s.clone()).or_default();
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links on a line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = &after[..end];
        if !target.is_empty() && !target.contains(char::is_whitespace) {
            out.push(target);
        }
        rest = &after[end..];
    }
    out
}

/// The dead links of the markdown file at `path`: (line, target, why).
fn dead_links(path: &Path) -> Vec<(usize, String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let dir = path.parent().unwrap();
    let mut dead = Vec::new();
    for (n, line) in prose(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let linked = if file.is_empty() {
                path.to_path_buf()
            } else {
                dir.join(file)
            };
            if !linked.exists() {
                dead.push((n, target.to_string(), "no such file".to_string()));
                continue;
            }
            let is_md = linked.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && is_md {
                let heads = anchors(&std::fs::read_to_string(&linked).unwrap());
                if !heads.contains(anchor) {
                    dead.push((n, target.to_string(), "no such heading".to_string()));
                }
            }
        }
    }
    dead
}

#[test]
fn links_in_the_readme_and_docs_reach_their_files_and_headings() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() > 5, "docs/ has its markdown files");
    files.extend(docs);
    let mut report = String::new();
    for f in &files {
        for (n, target, why) in dead_links(f) {
            report.push_str(&format!("{}:{n}: {target}: {why}\n", f.display()));
        }
    }
    assert!(report.is_empty(), "dead links:\n{report}");
}

#[test]
fn anchors_follow_githubs_slugs() {
    let text = "# The HTTP server: `dsv4 serve`\n## Choices (`n`)\n```\n# not a heading\n```\n\
                ## Tests\n### Tests\n#not one either\n";
    let a = anchors(text);
    let want = [
        "the-http-server-dsv4-serve",
        "choices-n",
        "tests",
        "tests-1",
    ];
    assert_eq!(a, want.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        link_targets("see [a](x.md#y) and [b](#z), not [c] (d)"),
        ["x.md#y", "#z"]
    );
}
