//! Fuzz target for reading back a stopped batch's part files (`server.files_dir`): what a killed
//! server left in `batches/{id}.output.jsonl.part` and `batches/{id}.error.jsonl.part`.
//!
//! Input layout: byte 0 picks the number of items (1 to 64, on input lines 1, 3, 5, …), byte 1
//! where the rest splits into the output part and the error part. Reading them must never
//! panic; what is kept is a prefix of each file ending at a newline, whose lines are whole JSON
//! output lines of this batch answering exactly the first `lines` items, each once, in order
//! within each file, and the counts add up.
#![no_main]

use dsv4_server::batches::resume::kept;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const PREFIX: &str = "batch_req_ab";

fuzz_target!(|data: &[u8]| {
    let [n, split, rest @ ..] = data else {
        return;
    };
    let items = usize::from(*n) % 64 + 1;
    let item_lines: Vec<usize> = (0..items).map(|i| 2 * i + 1).collect();
    let at = rest.len() * usize::from(*split) / 256;
    let parts = [&rest[..at], &rest[at..]];
    let (mut o, mut e) = (parts[0], parts[1]);
    let k = kept(PREFIX, &item_lines, [&mut o, &mut e]).expect("reading a slice cannot fail");
    assert!(k.lines <= items, "{} of {items}", k.lines);
    let s = k.summary;
    assert_eq!((s.total, s.done), (k.lines, k.lines));
    assert_eq!(s.succeeded + s.failed, k.lines);
    let mut seen = vec![false; items];
    for (part, len) in parts.iter().zip(k.lens) {
        let len = usize::try_from(len).unwrap();
        assert!(len <= part.len());
        assert!(len == 0 || part[len - 1] == b'\n', "cut at a newline");
        let mut last = None;
        for line in part[..len].split_inclusive(|b| *b == b'\n') {
            let v: Value = serde_json::from_slice(line).expect("a kept line is JSON");
            let id = v["id"].as_str().expect("with an id");
            let number: usize = id
                .strip_prefix(PREFIX)
                .and_then(|r| r.strip_prefix('_'))
                .and_then(|r| r.parse().ok())
                .expect("of this batch");
            let index = item_lines
                .iter()
                .position(|l| *l == number)
                .expect("an item");
            assert!(index < k.lines, "line {number} is past the kept prefix");
            assert!(last.is_none_or(|l| l < index), "in order");
            assert!(!seen[index], "line {number} kept twice");
            seen[index] = true;
            last = Some(index);
        }
    }
    assert!(
        seen[..k.lines].iter().all(|s| *s),
        "every kept item has its line"
    );
});
