//! What a stopped batch's partial output files hold (`server.files_dir`), so a restarted server
//! goes on from there instead of running the batch again.
//!
//! While a batch runs on disk its output lines go to `batches/{id}.output.jsonl.part` and its
//! failed lines to `batches/{id}.error.jsonl.part`, in input order, each line flushed when the
//! lines before it are written. A process that dies can leave, in either file, a last line cut
//! short, or whole lines past a line the other file never received (the two files are flushed
//! one after the other). [`kept`] finds the longest run of the batch's first lines that are all
//! there, whole, and where each file's share of it ends; the rest is cut off and run again.

use crate::batch::{Summary, Tokens};
use serde_json::Value;
use std::collections::HashMap;
use std::io::BufRead;

/// What a batch's part files keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The batch's first lines that have their output line (input order).
    pub lines: usize,
    /// Bytes of each part file (output, error) that hold those lines; what follows is cut.
    pub lens: [u64; 2],
    /// Counts and tokens of those lines (`total` is `lines`).
    pub summary: Summary,
}

/// One whole output line found in a part file.
struct Found {
    /// The item it answers (its index in the batch).
    index: usize,
    /// Where the line ends in its file (after its newline).
    end: u64,
    /// Whether its request answered 200.
    ok: bool,
    /// Its answer's tokens.
    tokens: Tokens,
}

/// Scan the part files (`parts`: output, error) of a batch whose items have the input line
/// numbers `item_lines` and whose output line ids are `{id_prefix}_{line}`.
pub fn kept(
    id_prefix: &str,
    item_lines: &[usize],
    parts: [&mut dyn BufRead; 2],
) -> std::io::Result<Kept> {
    let index_of: HashMap<usize, usize> = item_lines
        .iter()
        .enumerate()
        .map(|(i, line)| (*line, i))
        .collect();
    let mut seen = vec![false; item_lines.len()];
    let mut found: [Vec<Found>; 2] = [Vec::new(), Vec::new()];
    for (part, into) in parts.into_iter().zip(found.iter_mut()) {
        scan(part, id_prefix, &index_of, &mut seen, into)?;
    }
    let lines = seen.iter().position(|s| !s).unwrap_or(seen.len());
    let mut summary = Summary {
        total: lines,
        done: lines,
        ..Summary::default()
    };
    let mut lens = [0u64; 2];
    for (of_part, len) in found.iter().zip(lens.iter_mut()) {
        for f in of_part.iter().take_while(|f| f.index < lines) {
            *len = f.end;
            if f.ok {
                summary.succeeded += 1;
                summary.tokens += f.tokens;
            } else {
                summary.failed += 1;
            }
        }
    }
    Ok(Kept {
        lines,
        lens,
        summary,
    })
}

/// The whole lines of one part file, up to the first that is cut short, unreadable, of another
/// batch, out of order or already seen.
fn scan(
    part: &mut dyn BufRead,
    id_prefix: &str,
    index_of: &HashMap<usize, usize>,
    seen: &mut [bool],
    into: &mut Vec<Found>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut end = 0u64;
    loop {
        buf.clear();
        let n = part.read_until(b'\n', &mut buf)?;
        if n == 0 || buf.last() != Some(&b'\n') {
            return Ok(());
        }
        end += n as u64;
        let Ok(v) = serde_json::from_slice::<Value>(&buf) else {
            return Ok(());
        };
        let index = v["id"]
            .as_str()
            .and_then(|id| id.strip_prefix(id_prefix)?.strip_prefix('_')?.parse().ok())
            .and_then(|line: usize| index_of.get(&line).copied());
        let Some(index) = index else {
            return Ok(());
        };
        if seen[index] || into.last().is_some_and(|f| f.index >= index) {
            return Ok(());
        }
        seen[index] = true;
        into.push(Found {
            index,
            end,
            ok: v["response"]["status_code"] == 200,
            tokens: Tokens::of(&v["response"]["body"]),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(line: usize, status: u16, tokens: u64) -> String {
        let body = json!({"usage": {"prompt_tokens": 2, "completion_tokens": tokens}});
        format!(
            "{}\n",
            json!({"id": format!("batch_req_ab_{line}"), "custom_id": null,
                   "response": {"status_code": status, "body": body}, "error": null})
        )
    }

    fn scan_parts(output: &str, error: &str, items: &[usize]) -> Kept {
        let (mut o, mut e) = (output.as_bytes(), error.as_bytes());
        kept("batch_req_ab", items, [&mut o, &mut e]).unwrap()
    }

    #[test]
    fn whole_lines_of_both_files_make_the_kept_prefix() {
        // Items on input lines 1, 2, 4, 5 (line 3 was blank); line 2 failed.
        let items = [1, 2, 4, 5];
        let output = line(1, 200, 3) + &line(4, 200, 5);
        let error = line(2, 400, 0);
        let k = scan_parts(&output, &error, &items);
        assert_eq!(k.lines, 3);
        assert_eq!(k.lens, [output.len() as u64, error.len() as u64]);
        assert_eq!((k.summary.succeeded, k.summary.failed), (2, 1));
        assert_eq!(k.summary.tokens.output, 8);
        assert_eq!(
            k.summary.tokens.input, 4,
            "a refused line's tokens do not count"
        );
    }

    #[test]
    fn a_cut_line_and_lines_past_a_gap_are_dropped() {
        let items = [1, 2, 3, 4];
        let first = line(1, 200, 3);
        // The output file got lines 1 and 3 (flushed) but the error file never got line 2,
        // and line 4 was cut short by the kill.
        let output = first.clone() + &line(3, 200, 1) + &line(4, 200, 1)[..20];
        let k = scan_parts(&output, "", &items);
        assert_eq!(k.lines, 1);
        assert_eq!(k.lens, [first.len() as u64, 0]);
        assert_eq!(k.summary.done, 1);
        // A line without its newline is not whole either.
        let k = scan_parts(first.trim_end(), "", &items);
        assert_eq!((k.lines, k.lens), (0, [0, 0]));
    }

    #[test]
    fn foreign_repeated_or_unordered_lines_end_a_file() {
        let items = [1, 2, 3];
        let foreign = line(2, 200, 1).replace("batch_req_ab", "batch_req_cd");
        let k = scan_parts(&(line(1, 200, 1) + &foreign), "", &items);
        assert_eq!(k.lines, 1);
        let backwards = line(2, 200, 1) + &line(1, 200, 1);
        let k = scan_parts(&backwards, "", &items);
        assert_eq!(k.lines, 0, "line 1 after line 2 is not trusted");
        let both = line(1, 200, 1);
        let k = scan_parts(&both, &both, &items);
        assert_eq!((k.lines, k.summary.succeeded), (1, 1), "counted once");
        assert_eq!(k.lens[1], 0);
        let all = line(1, 200, 1) + &line(2, 200, 1) + &line(3, 200, 1);
        let k = scan_parts(&all, "not json\n", &items);
        assert_eq!((k.lines, k.summary.total), (3, 3));
    }
}
