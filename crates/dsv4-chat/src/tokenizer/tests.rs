//! Tests of the tiny tokenizer and of loading tokenizer.json files.

use super::*;
use crate::markers::{
    ASSISTANT, BOS, DSML, EOS, INVOKE_END, INVOKE_START, THINK_END, THINK_START, TOOL_CALLS_END,
    TOOL_CALLS_START, USER,
};

fn tiny() -> Tokenizer {
    Tokenizer::tiny().expect("the embedded tokenizer loads")
}

/// Ids the tiny tokenizer must give to the UTF-8 bytes of `s`.
fn byte_ids(s: &str) -> Vec<u32> {
    s.bytes().map(|b| 128 + u32::from(b)).collect()
}

#[test]
fn byte_chars_are_gpt2_bytes_to_unicode() {
    assert_eq!(byte_char(b'A'), 'A');
    assert_eq!(byte_char(b' '), 'Ġ', "space is U+0120");
    assert_eq!(byte_char(b'\n'), 'Ċ', "newline is U+010A");
    assert_eq!(byte_char(0), 'Ā');
    assert_eq!(
        byte_char(0xAD),
        'Ń',
        "soft hyphen is the 68th remapped byte, U+0143"
    );
    assert_eq!(byte_char(0xFF), 'ÿ');
    let all: HashSet<char> = (0..=255u8).map(byte_char).collect();
    assert_eq!(all.len(), 256, "the mapping is one-to-one");
}

#[test]
fn layout_specials_then_bytes() {
    let t = tiny();
    assert_eq!(t.vocab_size(), 384);
    assert_eq!((t.bos_id(), t.eos_id()), (0, 1));
    assert_eq!(t.token_id(BOS), Some(0));
    assert_eq!(t.token_id(EOS), Some(1));
    let specials = markers::tiny_special_tokens();
    assert_eq!(specials.len(), 128);
    assert_eq!(
        specials.iter().collect::<HashSet<_>>().len(),
        128,
        "specials are distinct"
    );
    for (id, s) in specials.iter().enumerate() {
        assert_eq!(t.token_id(s), Some(id as u32), "{s}");
        assert_eq!(t.id_to_token(id as u32).as_deref(), Some(s.as_str()));
        assert!(t.is_special(id as u32), "{s}");
    }
    assert_eq!(specials[127], "<｜reserved_127｜>");
    for b in 0..=255u8 {
        let id = 128 + u32::from(b);
        assert_eq!(t.token_id(&byte_char(b).to_string()), Some(id), "byte {b}");
        assert!(!t.is_special(id));
    }
    assert_eq!(t.id_to_token(384), None);
}

#[test]
fn ascii_bytes_encode_to_128_plus_byte() {
    let t = tiny();
    let ascii: String = (0u8..128).map(char::from).collect();
    assert_eq!(t.encode(&ascii).unwrap(), (128..256).collect::<Vec<u32>>());
    assert_eq!(t.encode("Hi there\n").unwrap(), byte_ids("Hi there\n"));
}

#[test]
fn round_trips_are_exact() {
    let t = tiny();
    for text in [
        "",
        "hello, world",
        "héllo 世界 🙂",
        "  leading and trailing spaces  ",
        "tabs\tand\r\nnewlines\n\n",
        "Ġ Ċ literal byte-level characters",
        "\u{0}\u{7f}\u{80}\u{ffff}\u{10ffff}",
    ] {
        let ids = t.encode(text).unwrap();
        assert_eq!(ids, byte_ids(text), "{text:?}");
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    assert!(t.encode("").unwrap().is_empty());
    assert_eq!(t.decode(&[]).unwrap(), "");
}

#[test]
fn special_markers_in_text_encode_to_one_id() {
    let t = tiny();
    let ids = t
        .encode(&format!("{BOS}{USER}hi{ASSISTANT}{THINK_START}"))
        .unwrap();
    assert_eq!(
        ids,
        vec![0, 3, 128 + u32::from(b'h'), 128 + u32::from(b'i'), 4, 5]
    );
    let think = t.encode(&format!("a{THINK_END}b")).unwrap();
    assert_eq!(think, vec![128 + 97, 6, 128 + 98]);
    // The longest marker wins: a whole closing tag is one token, an invoke tag is its prefix
    // token plus bytes, and a bare ｜DSML｜ is its own token.
    let call =
        format!("{TOOL_CALLS_START}\n{INVOKE_START} name=\"f\">\n{INVOKE_END}\n{TOOL_CALLS_END}");
    let ids = t.encode(&call).unwrap();
    let want: Vec<u32> = [
        vec![t.token_id(TOOL_CALLS_START).unwrap()],
        byte_ids("\n"),
        vec![t.token_id(INVOKE_START).unwrap()],
        byte_ids(" name=\"f\">\n"),
        vec![t.token_id(INVOKE_END).unwrap()],
        byte_ids("\n"),
        vec![t.token_id(TOOL_CALLS_END).unwrap()],
    ]
    .concat();
    assert_eq!(ids, want);
    assert_eq!(
        t.decode(&ids).unwrap(),
        call,
        "special tokens decode as their text"
    );
    assert_eq!(t.encode(&format!("x{DSML}y")).unwrap()[1], 8);
    // Decoding keeps special tokens as text.
    assert_eq!(
        t.decode(&[0, 128 + 104, 1]).unwrap(),
        format!("{BOS}h{EOS}")
    );
}

#[test]
fn invalid_utf8_decodes_lossily_and_unknown_ids_are_errors() {
    let t = tiny();
    // A lone continuation byte and a truncated 3-byte sequence.
    assert_eq!(t.decode(&[128 + 0x80]).unwrap(), "\u{FFFD}");
    let euro = byte_ids("€");
    assert!(t.decode(&euro[..2]).unwrap().contains('\u{FFFD}'));
    let all: Vec<u32> = (128..384).collect();
    let text = t.decode(&all).unwrap();
    assert!(text.starts_with('\u{0}') && text.contains('~'));
    // Splitting a multi-byte character between calls is a caller concern; together it is exact.
    assert_eq!(t.decode(&euro).unwrap(), "€");
    match t.decode(&[128, 384]) {
        Err(ChatError::UnknownTokenId {
            id: 384,
            vocab_size: 384,
        }) => {}
        other => panic!("expected UnknownTokenId, got {other:?}"),
    }
}

#[test]
fn malformed_tokenizer_json_is_an_error() {
    for bad in ["", "{", "[1, 2]", "{\"model\": 1}", "not json"] {
        match Tokenizer::from_json_str(bad) {
            Err(e @ ChatError::InvalidTokenizer { .. }) => {
                assert!(e.to_string().starts_with("malformed tokenizer.json"), "{e}");
            }
            other => panic!("{bad:?}: expected InvalidTokenizer, got {other:?}"),
        }
    }
    // Valid JSON for `tokenizers`, but without the DSV4 BOS token.
    let json = tiny_tokenizer_json().replace(BOS, "<s>");
    match Tokenizer::from_json_str(&json) {
        Err(e @ ChatError::MissingSpecialToken { .. }) => {
            assert!(e.to_string().contains(BOS), "{e}");
        }
        other => panic!("expected MissingSpecialToken, got {other:?}"),
    }
}

#[test]
fn file_round_trip_gives_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tiny_tokenizer_json()).unwrap();
    let from_file = Tokenizer::from_file(&path).unwrap();
    let text = format!("{BOS}{USER}héllo 世界 🙂{ASSISTANT}{THINK_END}ok{EOS}");
    assert_eq!(
        from_file.encode(&text).unwrap(),
        tiny().encode(&text).unwrap()
    );
    assert_eq!(from_file.vocab_size(), 384);
    // What `tokenizers` writes back loads to the same tokenizer.
    let resaved = dir.path().join("resaved.json");
    from_file.inner().save(&resaved, true).unwrap();
    let again = Tokenizer::from_file(&resaved).unwrap();
    assert_eq!(again.encode(&text).unwrap(), tiny().encode(&text).unwrap());
    let missing = dir.path().join("nope.json");
    match Tokenizer::from_file(&missing) {
        Err(e @ ChatError::ReadTokenizer { .. }) => assert!(e.to_string().contains("nope.json")),
        other => panic!("expected ReadTokenizer, got {other:?}"),
    }
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    match Tokenizer::from_file(&bad) {
        Err(ChatError::InvalidTokenizer { origin, .. }) => assert!(origin.contains("bad.json")),
        other => panic!("expected InvalidTokenizer, got {other:?}"),
    }
}

#[test]
fn embedded_json_is_deterministic() {
    assert_eq!(tiny_tokenizer_json(), tiny_tokenizer_json());
    let v: serde_json::Value = serde_json::from_str(&tiny_tokenizer_json()).unwrap();
    assert_eq!(v["model"]["vocab"].as_object().unwrap().len(), 384);
    assert_eq!(v["added_tokens"].as_array().unwrap().len(), 128);
    assert_eq!(v["model"]["merges"].as_array().unwrap().len(), 0);
}
