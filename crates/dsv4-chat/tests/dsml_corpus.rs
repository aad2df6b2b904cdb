//! The corpus in `tests/corpus/`: for each `NAME.txt` (the raw completion, exact bytes) a
//! `NAME.json` says the mode (`thinking`), whether `tools.json` is declared (`tools`), and
//! the outcome: `{"error": {"class", "offset", "at"}}` (`at`: the text found at the offset,
//! null for byte-level errors) or `{"message": <OpenAI assistant message>}`. Each case is also
//! fed in 1-, 2-, 3- and 7-byte chunks, which must not change the outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dsv4_chat::{ErrorClass, ParserOptions, ToolSet, parse_completion_chunked};
use serde_json::Value;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn cases() -> Vec<(String, Vec<u8>, Value)> {
    let mut names: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("corpus directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".txt").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let dir = corpus_dir();
            let input = std::fs::read(dir.join(format!("{name}.txt"))).expect("input file");
            let expected = std::fs::read_to_string(dir.join(format!("{name}.json")))
                .unwrap_or_else(|e| panic!("{name}.json: {e}"));
            let expected: Value = serde_json::from_str(&expected).expect("expected JSON");
            (name, input, expected)
        })
        .collect()
}

#[test]
fn every_corpus_case_has_its_expected_outcome() {
    let tools = Arc::new(
        ToolSet::from_json_str(&std::fs::read_to_string(corpus_dir().join("tools.json")).unwrap())
            .expect("corpus tools are valid"),
    );
    let cases = cases();
    assert!(cases.len() >= 40, "corpus has {} cases", cases.len());
    let mut classes_seen = std::collections::BTreeSet::new();
    for (name, input, expected) in &cases {
        let options = ParserOptions {
            thinking: expected["thinking"].as_bool().expect("thinking flag"),
            tools: expected["tools"]
                .as_bool()
                .expect("tools flag")
                .then(|| Arc::clone(&tools)),
            verbatim_content: false,
            stream_arguments: false,
        };
        let outcome = parse_completion_chunked(input, usize::MAX, options.clone());
        match (&outcome, expected.get("error"), expected.get("message")) {
            (Err(e), Some(want), None) => {
                let class = want["class"].as_str().and_then(ErrorClass::from_name);
                assert_eq!(Some(e.class), class, "{name}: {e}");
                assert_eq!(
                    Some(e.offset as u64),
                    want["offset"].as_u64(),
                    "{name}: {e}"
                );
                if let Some(at) = want["at"].as_str() {
                    assert!(
                        input[e.offset..].starts_with(at.as_bytes()),
                        "{name}: `at` text"
                    );
                }
                assert!(!e.message.is_empty(), "{name}");
                classes_seen.insert(e.class.as_str());
            }
            (Ok(msg), None, Some(want)) => assert_eq!(&msg.to_openai_json(), want, "{name}"),
            _ => panic!("{name}: got {outcome:?}, expected {expected}"),
        }
        for chunk in [1, 2, 3, 7] {
            let chunked = parse_completion_chunked(input, chunk, options.clone());
            assert_eq!(chunked, outcome, "{name}: {chunk}-byte chunks");
        }
    }
    assert_eq!(
        classes_seen.len(),
        ErrorClass::ALL.len(),
        "every class has a corpus case"
    );
}
