//! A batch's life in the background: check its input file, run its lines through
//! [`crate::batch::run`], keep its output and error files. With `server.files_dir` the lines go
//! to part files as they are answered, and a batch read back after a restart goes on from the
//! last whole line the part files kept ([`super::resume`]).

use super::resume::{Kept, kept};
use super::{Batch, Status};
use crate::api::common::{random_hex, unix_now};
use crate::batch::{self, AbortOnDrop, BatchFileError, Item, Options, Share, Sinks, Summary};
use crate::files::{FileInfo, MESSAGE_OUTPUT_PURPOSE, OUTPUT_PURPOSE, StoredFile};
use crate::files_disk::{FilesDir, PART_KINDS};
use crate::state::AppState;
use serde_json::{Value, json};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where a batch's lines go while it runs.
enum Outputs {
    /// In memory (no `server.files_dir`): output, error.
    Memory([Vec<u8>; 2]),
    /// The part files in `server.files_dir`: output, error.
    Disk([BufWriter<File>; 2]),
}

impl Outputs {
    /// The sinks [`batch::run`] writes to: answered lines to the first, failed to the second.
    fn sinks(&mut self) -> Sinks<'_> {
        match self {
            Outputs::Memory([o, e]) => Sinks {
                output: o,
                errors: Some(e),
            },
            Outputs::Disk([o, e]) => Sinks {
                output: o,
                errors: Some(e),
            },
        }
    }
}

/// The `errors` entry of a batch whose output could not be written.
fn write_failed(message: String) -> Value {
    json!({"code": "output_write_failed", "message": message, "param": null, "line": null})
}

/// A batch's task: from wherever it is (validating, running, keeping its files) to its end,
/// or until `stop` turns true without a cancel (the server stopping).
pub(super) async fn run(
    state: AppState,
    batch: Arc<Batch>,
    input: Option<Arc<StoredFile>>,
    share: Arc<Share>,
    stop: watch::Receiver<bool>,
) {
    let disk = state.files().disk();
    let keeping = batch.record().outputs;
    if let Some(ids) = keeping {
        // A server stopped while keeping this batch's files: finish keeping them.
        keep_outputs(&state, &batch, ids, None).await;
        return;
    }
    let items = match validate(&state, &batch, input).await {
        Ok(items) => items,
        Err(error) => return batch.fail(error, disk),
    };
    // Stopped by the server stopping, not by a cancel or the completion window's end.
    let stopping = || {
        let r = batch.record();
        *stop.borrow() && r.status != Status::Cancelling && r.expired_at.is_none()
    };
    if stopping() {
        // Validated again at the next start.
        return;
    }
    let total = items.len();
    let (kept, mut outputs) = match open_outputs(disk, &batch, &items).await {
        Ok(opened) => opened,
        Err(e) => {
            let message =
                format!("the batch's part files in server.files_dir cannot be opened: {e}");
            return batch.fail(write_failed(message), disk);
        }
    };
    // The lines an earlier server answered, then this run's (whose total is the rest).
    let base = kept.summary;
    batch.update(|r| {
        if r.status == Status::Validating {
            r.status = Status::InProgress;
        }
        r.in_progress_at.get_or_insert_with(unix_now);
        r.counts = Summary { total, ..base };
    });
    batch.save(disk);
    // Past its completion window no line starts; until then a timer watches it.
    let now = unix_now();
    let _timer = if now >= batch.deadline() {
        batch.expire();
        None
    } else {
        let (b, wait) = (batch.clone(), batch.deadline() - now);
        Some(AbortOnDrop(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(wait)).await;
            b.expire();
        })))
    };
    let rest: Vec<Item> = items.into_iter().skip(kept.lines).collect();
    let unstarted: Vec<(usize, Option<String>)> =
        rest.iter().map(|i| (i.line, i.custom_id.clone())).collect();
    let opts = Options {
        share,
        id_prefix: batch.id_prefix(),
        cancel: Some(stop.clone()),
    };
    let progress = |s: &Summary| batch.update(|r| r.counts = base + *s);
    let ran = batch::run(&state, rest, &opts, outputs.sinks(), progress).await;
    let ran = ran.and_then(|s| {
        let expired = &unstarted[s.done.min(unstarted.len())..];
        if batch.record().expired_at.is_none() || expired.is_empty() {
            return Ok(base + s);
        }
        write_expired(&mut outputs, &batch.id_prefix(), expired)?;
        let n = expired.len();
        batch.update(|r| r.expired_lines += n);
        Ok(base
            + Summary {
                done: s.done + n,
                failed: s.failed + n,
                ..s
            })
    });
    let summary = match ran {
        Ok(s) => s,
        Err(e) => {
            let message = format!("writing the batch's output failed: {e}");
            return batch.fail(write_failed(message), disk);
        }
    };
    if summary.done < summary.total && stopping() {
        // The server is stopping: what was answered is written; the rest runs at the next
        // start (with server.files_dir).
        batch.update(|r| r.counts = summary);
        batch.save(disk);
        tracing::info!(
            id = batch.id,
            answered = summary.done,
            total = summary.total,
            "batch stopped with the server; with server.files_dir it goes on at the next start"
        );
        return;
    }
    let ids = [
        format!("file-{}", random_hex(state.next_serial())),
        format!("file-{}", random_hex(state.next_serial())),
    ];
    batch.update(|r| {
        r.counts = summary;
        r.finalizing_at = Some(unix_now());
        r.outputs = Some(ids.clone());
        if r.status == Status::InProgress {
            r.status = Status::Finalizing;
        }
    });
    batch.save(disk);
    let memory = match outputs {
        Outputs::Memory(bytes) => Some(bytes),
        // Closed (and flushed by `batch::run`) before they are moved into place.
        Outputs::Disk(files) => {
            drop(files);
            None
        }
    };
    keep_outputs(&state, &batch, ids, memory).await;
}

/// Write the lines of `unstarted` (input line, `custom_id`) to the error output as
/// `batch_expired`: the completion window ended before they started.
fn write_expired(
    outputs: &mut Outputs,
    id_prefix: &str,
    unstarted: &[(usize, Option<String>)],
) -> std::io::Result<()> {
    let Sinks { output, errors } = outputs.sinks();
    let sink = errors.unwrap_or(output);
    for (line, custom_id) in unstarted {
        let error = json!({"code": "batch_expired", "message": format!(
            "line {line}: the batch's 24h completion window ended before this request started"),
            "line": line});
        let out = batch::line_json(
            &format!("{id_prefix}_{line}"),
            custom_id,
            Value::Null,
            error,
        );
        serde_json::to_writer(&mut *sink, &out)?;
        sink.write_all(b"\n")?;
    }
    sink.flush()
}

/// The batch's items: its input file (`input`, or read back from the store when resumed), read
/// and checked off the runtime's workers; the `errors` entry when it cannot run.
async fn validate(
    state: &AppState,
    batch: &Batch,
    input: Option<Arc<StoredFile>>,
) -> Result<Vec<Item>, Value> {
    let id = &batch.asked.input_file_id;
    let Some(input) = input.or_else(|| state.files().get(id)) else {
        return Err(json!({"code": "server_restarted", "message": format!(
            "the server restarted while this batch ran and its input file {id} is gone, so it \
             cannot go on"), "param": "input_file_id", "line": null}));
    };
    let (served, endpoint) = (state.cfg().model_id.clone(), batch.asked.endpoint.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let content = input.content.read().map_err(|e| {
            json!({"code": "invalid_file", "message": format!(
                "the input file {} cannot be read: {e}", input.id),
                "param": "input_file_id", "line": null})
        })?;
        let Ok(text) = std::str::from_utf8(&content) else {
            return Err(json!({"code": "invalid_file", "message": format!(
                "the input file {} is not UTF-8 text; a batch file is JSONL", input.id),
                "param": "input_file_id", "line": null}));
        };
        batch::parse(text, &served, Some(&endpoint)).map_err(|e| validation_error(&e))
    })
    .await;
    checked.unwrap_or_else(|e| {
        Err(json!({"code": "internal_error", "message": format!(
            "reading the input file failed: {e}"), "param": null, "line": null}))
    })
}

/// A validation failure as an entry of the batch's `errors`.
fn validation_error(e: &BatchFileError) -> Value {
    let (code, line) = match e {
        BatchFileError::Empty => ("empty_file", None),
        BatchFileError::DuplicateId { again, .. } => ("duplicate_custom_id", Some(*again)),
        BatchFileError::WrongEndpoint { line, .. } => ("mismatched_endpoint", Some(*line)),
        BatchFileError::WrongModel { line, .. } => ("model_not_found", Some(*line)),
    };
    json!({"code": code, "message": e.to_string(), "param": null, "line": line})
}

/// Where the batch's lines go, and what an earlier server already wrote there: in memory, or
/// its part files in `server.files_dir`, cut to their last whole lines and opened to append.
async fn open_outputs(
    disk: Option<&FilesDir>,
    batch: &Batch,
    items: &[Item],
) -> std::io::Result<(Kept, Outputs)> {
    let Some(dir) = disk else {
        let none = Kept {
            lines: 0,
            lens: [0, 0],
            summary: Summary::default(),
        };
        return Ok((none, Outputs::Memory([Vec::new(), Vec::new()])));
    };
    let paths = PART_KINDS.map(|kind| dir.part_path(&batch.id, kind));
    let (prefix, lines) = (
        batch.id_prefix(),
        items.iter().map(|i| i.line).collect::<Vec<_>>(),
    );
    let opened = tokio::task::spawn_blocking(move || {
        let open =
            |p: &std::path::Path| File::options().read(true).append(true).create(true).open(p);
        let files = [open(&paths[0])?, open(&paths[1])?];
        let k = {
            let (mut o, mut e) = (BufReader::new(&files[0]), BufReader::new(&files[1]));
            kept(&prefix, &lines, [&mut o, &mut e])?
        };
        for (file, len) in files.iter().zip(k.lens) {
            file.set_len(len)?;
        }
        if k.lines > 0 {
            tracing::info!(
                lines = k.lines,
                "batch goes on after the lines already written"
            );
        }
        Ok((k, Outputs::Disk(files.map(BufWriter::new))))
    })
    .await;
    opened.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Keep the batch's output and error files under `ids` (from `memory`, or from its part files)
/// and end it: completed, cancelled after a cancel, or expired when its window ended first.
/// Done again after a stop part-way.
async fn keep_outputs(
    state: &AppState,
    batch: &Arc<Batch>,
    ids: [String; 2],
    memory: Option<[Vec<u8>; 2]>,
) {
    let disk = state.files().disk();
    let (keeper, name) = (state.clone(), batch.id.clone());
    let lives = batch.asked.output_expires_after;
    let purpose = if batch.is_messages() {
        MESSAGE_OUTPUT_PURPOSE
    } else {
        OUTPUT_PURPOSE
    };
    let kept = tokio::task::spawn_blocking(move || {
        let files = keeper.files();
        let mut memory = memory.map(|m| m.map(Some));
        let mut kept = [None, None];
        for (i, kind) in PART_KINDS.iter().enumerate() {
            let created_at = unix_now();
            let info = FileInfo {
                id: ids[i].clone(),
                filename: format!("{name}_{kind}.jsonl"),
                created_at,
                expires_at: lives.map(|s| created_at + s),
            };
            kept[i] = match (&mut memory, files.disk()) {
                (Some(m), _) => m[i]
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| files.put_output(info, purpose, b.into())),
                (None, Some(dir)) => {
                    let part = dir.part_path(&name, kind);
                    files.adopt_output(info, purpose, &part)?
                }
                (None, None) => None,
            }
            .map(|f| f.id.clone());
        }
        Ok::<_, std::io::Error>(kept)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let [output_id, error_id] = match kept {
        Ok(ids) => ids,
        Err(e) => {
            let message = format!("the batch's output files cannot be kept: {e}");
            return batch.fail(write_failed(message), disk);
        }
    };
    batch.update(|r| {
        r.output_file_id = output_id;
        r.error_file_id = error_id;
        r.outputs = None;
        if r.status == Status::Cancelling {
            r.status = Status::Cancelled;
            r.cancelled_at = Some(unix_now());
        } else if r.expired_at.is_some() {
            r.status = Status::Expired;
        } else {
            r.status = Status::Completed;
            r.completed_at = Some(unix_now());
        }
    });
    batch.save(disk);
}
