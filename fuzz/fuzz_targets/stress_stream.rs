//! Fuzz target for what `dsv4 stress` reads from the server under test: a server-sent event
//! stream of `chat.completion.chunk` objects, cut into reads at arbitrary places, assembled
//! into an answer, then scanned by every corruption detector. Any server (ours, SGLang, vLLM,
//! a broken one) may send anything: nothing may panic, and the outcome (the answer, or the
//! error) must not depend on where the reads were cut.
//!
//! Input: bytes 0..4 seed the read sizes (1..=32 bytes), the rest is the response body.
//! Seeds: `fuzz/seeds/stress_stream/`.
#![no_main]

use dsv4_stress::Answer;
use dsv4_stress::client::{Fed, StreamAccumulator, next_event};
use dsv4_stress::signatures::{DeclaredTool, Expectation, detect};
use libfuzzer_sys::fuzz_target;

/// Read the body in pieces of the sizes `sizes` gives; the answer after `[DONE]`, or the error.
fn assemble(body: &[u8], mut sizes: impl FnMut() -> usize) -> Result<Answer, String> {
    let mut acc = StreamAccumulator::default();
    let mut buf = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(sizes().min(rest.len()));
        rest = tail;
        buf.extend_from_slice(piece);
        while let Some((event, used)) = next_event(&buf)? {
            buf.drain(..used);
            if acc.feed(&event).map_err(|(_, m)| m)? == Fed::Done {
                return acc.finish();
            }
        }
    }
    Err("the stream ended without `data: [DONE]`".into())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, body) = data.split_at(4);
    let mut seed = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let chunked = assemble(body, || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 24) as usize % 32 + 1
    });
    let whole = assemble(body, || usize::MAX);
    assert_eq!(chunked, whole);
    if let Ok(answer) = whole {
        let tools = [DeclaredTool {
            name: "get_weather".into(),
            parameters: serde_json::json!({"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }];
        for (required, named) in [(false, None), (true, Some("get_weather"))] {
            let expect = Expectation {
                tools: &tools,
                required,
                named,
                repeat_threshold: 8,
            };
            let _ = detect(&answer, &expect);
        }
    }
});
