//! The `signature` of a Messages API thinking block. DSV4 signs nothing (an answer's reasoning
//! is the client's to keep or change), so a signature is empty — except under `thinking.display:
//! "omitted"`, where the block's text is left out and the signature carries it instead: `dsv4:1:`
//! and the reasoning in standard base64. A client that sends such a block back (empty
//! `thinking`, that signature) gets the reasoning restored into the prompt, as Anthropic's
//! omitted thinking keeps multi-turn continuity. Signatures without the prefix (another
//! server's, or empty) are not read.

use crate::error::ApiError;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// What starts a signature that holds its block's reasoning.
const PREFIX: &str = "dsv4:1:";

/// The signature that holds `reasoning`.
pub fn sign(reasoning: &str) -> String {
    format!("{PREFIX}{}", STANDARD.encode(reasoning))
}

/// The reasoning a signature holds: None for one without the prefix; an error naming `at`
/// (the signature's path) for a prefixed one that is not base64 of UTF-8 text.
pub fn read(signature: &str, at: &str) -> Result<Option<String>, ApiError> {
    let Some(encoded) = signature.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        ApiError::bad_param(
            at,
            format!("a {PREFIX} signature holds its block's reasoning in base64, but {why}"),
        )
    };
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|e| bad(&format!("this one is not base64 ({e})")))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| bad("this one is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_gives_back_the_reasoning_it_holds() {
        let reasoning = "Add 2 and 2: 4. Ünïcode, \"quotes\" and\nnewlines stay.";
        let signature = sign(reasoning);
        assert!(signature.starts_with("dsv4:1:"));
        assert!(!signature.contains('\n'), "a signature is one line");
        assert_eq!(read(&signature, "s").unwrap().as_deref(), Some(reasoning));
        assert_eq!(read(&sign(""), "s").unwrap().as_deref(), Some(""));
    }

    #[test]
    fn other_signatures_are_not_read_and_broken_ones_are_refused() {
        assert_eq!(read("", "s").unwrap(), None);
        assert_eq!(read("EqQBCkgIARABGAIiQL...", "s").unwrap(), None);
        let e = read("dsv4:1:not base64!", "messages[1].content[0].signature").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].content[0].signature"));
        assert!(e.to_string().contains("not base64"), "{e}");
        let latin1 = format!("dsv4:1:{}", STANDARD.encode([0xff, 0xfe]));
        let e = read(&latin1, "s").unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}
