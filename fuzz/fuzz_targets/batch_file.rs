//! Fuzz target for OpenAI Batch API input files (`dsv4 run-batch`, `POST /v1/batches`).
//!
//! Input layout: byte 0 picks the batch's endpoint (none, as `dsv4 run-batch` reads a file, or
//! one of the three a `/v1/batches` batch may name); the rest is the file. Reading it must never
//! panic; a file that is accepted has one item per non-empty line, in order, each with the line
//! number it came from, and an item that can be sent goes to an allowed URL with an object body;
//! a file that is refused names lines that exist.
#![no_main]

use dsv4_server::batch::{BatchFileError, ENDPOINTS, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let endpoint = match pick % 4 {
        0 => None,
        k => Some(ENDPOINTS[usize::from(k) - 1]),
    };
    let lines = text.lines().count();
    match parse(text, "dsv4-tiny", endpoint) {
        Ok(items) => {
            let non_empty: Vec<usize> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, _)| i + 1)
                .collect();
            let numbers: Vec<usize> = items.iter().map(|i| i.line).collect();
            assert_eq!(numbers, non_empty, "one item per non-empty line, in order");
            for item in &items {
                if let Ok(call) = &item.call {
                    assert!(ENDPOINTS.contains(&call.url.as_str()), "{}", call.url);
                    assert!(endpoint.is_none_or(|e| e == call.url));
                    assert!(call.body.is_object());
                    assert!(item.custom_id.is_some());
                }
            }
        }
        Err(BatchFileError::Empty) => {
            assert!(text.lines().all(|l| l.trim().is_empty()));
        }
        Err(BatchFileError::DuplicateId { first, again, .. }) => {
            assert!(
                first < again && again <= lines,
                "{first} {again} of {lines}"
            );
        }
        Err(
            BatchFileError::WrongEndpoint { line, .. } | BatchFileError::WrongModel { line, .. },
        ) => {
            assert!((1..=lines).contains(&line), "{line} of {lines}");
        }
    }
});
