//! Seeded random inputs — marker fragments, attribute text, JSON, quotes, fences and raw
//! (often invalid UTF-8) bytes — fed in random chunks: the parser never panics, and the
//! outcome (message or error, offset included) never depends on the chunking.

use std::sync::Arc;

use std::collections::BTreeSet;

use dsv4_chat::{ErrorClass, ParserOptions, ToolSet, parse_completion_chunked};

/// xorshift64*: small, deterministic, good enough to pick pieces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "<｜DSML｜tool_calls>",
    "</｜DSML｜tool_calls>",
    "<｜DSML｜function_calls>",
    "</｜DSML｜function_calls>",
    "<｜DSML｜invoke",
    "</｜DSML｜invoke>",
    "<｜DSML｜parameter",
    "</｜DSML｜parameter>",
    "｜DSML｜",
    "<｜DSML",
    " name=\"f\">",
    " name=\"g\"",
    " string=\"true\">",
    " string=\"false\">",
    " string=\"maybe\">",
    ">",
    "\"",
    "`",
    "```",
    "\n",
    "\n\n",
    " ",
    "<think>",
    "</think>",
    "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "{\"a\": [1, 2]}",
    "1.5",
    "[1,",
    "null",
    "hello",
    "é",
    "🙂",
    "｜",
    "<",
    "</",
];

/// Whole parameters: inserted into an invoke they repeat a name or break the schema.
const PARAMS: &[&str] = &[
    "<｜DSML｜parameter name=\"c\" string=\"true\">v</｜DSML｜parameter>",
    "<｜DSML｜parameter name=\"a\" string=\"false\">[0]</｜DSML｜parameter>",
    "<｜DSML｜parameter name=\"b\" string=\"true\">7</｜DSML｜parameter>",
];

fn random_input(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(40) {
        match rng.below(10) {
            0 => out.push(rng.next() as u8),
            1 => out.extend_from_slice(&rng.next().to_le_bytes()[..rng.below(4) + 1]),
            _ => out.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes()),
        }
    }
    out
}

const VALID: &[&str] = &[
    "Hi \"q\".\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
     <｜DSML｜parameter name=\"a\" string=\"false\">[1, 2]</｜DSML｜parameter>\n\
     <｜DSML｜parameter name=\"b\" string=\"false\">7</｜DSML｜parameter>\n\
     </｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
    "```\n<｜DSML｜invoke>\n```\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n\
     </｜DSML｜invoke>\n</｜DSML｜function_calls>",
];

/// A valid completion with a few pieces inserted, ranges deleted or segments repeated, at
/// character boundaries: inputs that reach deep into the grammar before going wrong.
fn mutated_input(rng: &mut Rng, thinking: bool) -> Vec<u8> {
    let reasoning = if thinking { "r</think>" } else { "" };
    let mut text = format!("{reasoning}{}", VALID[rng.below(VALID.len())]);
    for _ in 0..rng.below(3) {
        let bounds: Vec<usize> = if rng.below(2) == 0 {
            text.match_indices('\n').map(|(i, _)| i + 1).collect()
        } else {
            text.char_indices()
                .map(|(i, _)| i)
                .chain([text.len()])
                .collect()
        };
        let i = rng.below(bounds.len());
        let j = (i + rng.below(8)).min(bounds.len() - 1);
        let (a, lo, hi) = (bounds[i], bounds[i], bounds[j]);
        match rng.below(4) {
            0 => text.insert_str(a, PIECES[rng.below(PIECES.len())]),
            1 => text.insert_str(a, PARAMS[rng.below(PARAMS.len())]),
            2 => text.replace_range(lo..hi, ""),
            _ => {
                let seg = text[lo..hi].to_owned();
                text.insert_str(hi, &seg);
            }
        }
    }
    text.into_bytes()
}

#[test]
fn random_inputs_never_panic_and_ignore_chunking() {
    let tools = Arc::new(
        ToolSet::from_json_str(
            r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object",
                "properties":{"a":{"type":"array"},"b":{"type":"integer"}},
                "additionalProperties":false}}}]"#,
        )
        .expect("tools are valid"),
    );
    let mut rng = Rng(0x5EED_D5F4_C0DE_0001);
    let mut outcomes = [0usize; 2];
    let mut classes = BTreeSet::new();
    for round in 0..4000 {
        let options = ParserOptions {
            thinking: rng.below(2) == 0,
            tools: (rng.below(2) == 0).then(|| Arc::clone(&tools)),
            verbatim_content: false,
            stream_arguments: rng.below(2) == 0,
        };
        let input = if round % 2 == 0 {
            random_input(&mut rng)
        } else {
            mutated_input(&mut rng, options.thinking)
        };
        let whole = parse_completion_chunked(&input, usize::MAX, options.clone());
        // Streaming the arguments changes what is sent, never the outcome.
        let other = ParserOptions {
            stream_arguments: !options.stream_arguments,
            ..options.clone()
        };
        assert_eq!(
            parse_completion_chunked(&input, usize::MAX, other),
            whole,
            "round {round}, input {input:?}"
        );
        outcomes[usize::from(whole.is_ok())] += 1;
        if let Err(e) = &whole {
            classes.insert(e.class.as_str());
        }
        for _ in 0..3 {
            let chunk = rng.below(12) + 1;
            let chunked = parse_completion_chunked(&input, chunk, options.clone());
            assert_eq!(
                chunked, whole,
                "round {round}, chunk {chunk}, input {input:?}"
            );
        }
    }
    // Both outcomes must be exercised for the property to mean anything.
    assert!(
        outcomes[0] > 100 && outcomes[1] > 100,
        "errors/successes: {outcomes:?}"
    );
    let all: BTreeSet<&str> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(classes, all, "every error class is reached");
}
