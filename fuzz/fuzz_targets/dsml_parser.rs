//! Fuzz target for the DSML streaming parser: arbitrary bytes fed in arbitrary chunks.
//!
//! Input layout: byte 0 selects the options (bit 0: thinking mode, bit 1: declare a tool
//! with a JSON Schema); bytes 1..5 seed the chunk sizes (1..=16 bytes each); the rest is the
//! completion. The parser must never panic, and the outcome (message or error, offset
//! included) must equal parsing the same bytes in one piece.
#![no_main]

use std::sync::{Arc, OnceLock};

use dsv4_chat::{
    AssistantMessage, DsmlParser, ParseError, ParserOptions, ToolSet, parse_completion_chunked,
};
use libfuzzer_sys::fuzz_target;

fn tools() -> Arc<ToolSet> {
    static TOOLS: OnceLock<Arc<ToolSet>> = OnceLock::new();
    Arc::clone(TOOLS.get_or_init(|| {
        let json = r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object",
            "properties":{"a":{"type":"array"},"b":{"type":"integer"}},"additionalProperties":false}}}]"#;
        Arc::new(ToolSet::from_json_str(json).expect("the fuzz tools are valid"))
    }))
}

fn chunked(
    input: &[u8],
    mut seed: u32,
    options: ParserOptions,
) -> Result<AssistantMessage, ParseError> {
    let mut msg = AssistantMessage::new(options.thinking);
    let mut parser = DsmlParser::new(options);
    let mut rest = input;
    while !rest.is_empty() {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let n = ((seed >> 24) as usize % 16 + 1).min(rest.len());
        let (piece, tail) = rest.split_at(n);
        parser
            .feed_bytes(piece)?
            .into_iter()
            .for_each(|e| msg.apply(e));
        rest = tail;
    }
    parser.finish()?.into_iter().for_each(|e| msg.apply(e));
    Ok(msg)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (head, input) = data.split_at(5);
    let options = ParserOptions {
        thinking: head[0] & 1 == 1,
        tools: (head[0] & 2 == 2).then(tools),
        verbatim_content: head[0] & 4 == 4,
    };
    let seed = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let whole = parse_completion_chunked(input, usize::MAX, options.clone());
    assert_eq!(chunked(input, seed, options), whole);
});
