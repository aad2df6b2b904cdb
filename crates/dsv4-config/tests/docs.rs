//! docs/profiles.md prints tables generated from code (the SGLang mapping, the validation rules, the
//! backend capabilities); this test checks each printed table is identical to what the code
//! generates. `DSV4_BLESS=1 cargo test -p dsv4-config --test docs` rewrites them.

use std::path::PathBuf;

fn docs_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/profiles.md")
}

/// Replace (bless) or compare the block between `<!-- generated:NAME begin -->` and
/// `<!-- generated:NAME end -->`; returns the possibly updated text and a mismatch message.
fn check_block(text: &str, name: &str, generated: &str, bless: bool) -> (String, Option<String>) {
    let begin = format!("<!-- generated:{name} begin -->\n");
    let end = format!("<!-- generated:{name} end -->");
    let Some(b) = text.find(&begin) else {
        return (
            text.to_string(),
            Some(format!("docs/profiles.md lacks the marker {begin}")),
        );
    };
    let start = b + begin.len();
    let Some(len) = text[start..].find(&end) else {
        return (
            text.to_string(),
            Some(format!("docs/profiles.md lacks the marker {end}")),
        );
    };
    let current = &text[start..start + len];
    if current == generated {
        return (text.to_string(), None);
    }
    if bless {
        let updated = format!("{}{generated}{}", &text[..start], &text[start + len..]);
        return (updated, None);
    }
    let msg = format!(
        "the `{name}` table in docs/profiles.md differs from the code; run \
         `DSV4_BLESS=1 cargo test -p dsv4-config --test docs` to regenerate it.\n\
         --- docs ---\n{current}--- code ---\n{generated}"
    );
    (text.to_string(), Some(msg))
}

#[test]
fn generated_tables_in_docs_match_the_code() {
    let bless = std::env::var("DSV4_BLESS").is_ok_and(|v| v == "1");
    let path = docs_path();
    let mut text = std::fs::read_to_string(&path).expect("docs/profiles.md is readable");
    let blocks = [
        (
            "sglang-mapping",
            dsv4_config::export::mapping::markdown_table(),
        ),
        ("validation-rules", dsv4_config::validate::markdown_table()),
        ("backend-capabilities", dsv4_config::caps::markdown_table()),
    ];
    let mut problems = Vec::new();
    for (name, generated) in &blocks {
        let (updated, problem) = check_block(&text, name, generated, bless);
        text = updated;
        problems.extend(problem);
    }
    if bless {
        std::fs::write(&path, &text).expect("docs/profiles.md is writable");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn a_changed_block_is_reported_and_blessing_replaces_it() {
    let text = "a\n<!-- generated:t begin -->\nold\n<!-- generated:t end -->\nb\n";
    let (same, problem) = check_block(text, "t", "new\n", false);
    assert_eq!(same, text);
    assert!(problem.unwrap().contains("DSV4_BLESS=1"));
    let (blessed, problem) = check_block(text, "t", "new\n", true);
    assert!(problem.is_none());
    assert_eq!(
        blessed,
        "a\n<!-- generated:t begin -->\nnew\n<!-- generated:t end -->\nb\n"
    );
    let (_, problem) = check_block("no markers", "t", "x", false);
    assert!(problem.unwrap().contains("lacks the marker"));
}
