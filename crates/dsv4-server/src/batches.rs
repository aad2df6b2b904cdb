//! OpenAI's Batch API (`/v1/batches`): a batch is an uploaded input file run in the background
//! through [`crate::batch::run`], its answers and failures then kept as output and error files in
//! the [`crate::files::FileStore`]. [`BatchStore`] holds the batches; [`Batch`] one batch's
//! state, which its task updates as lines finish (`request_counts` moves while it runs).
//!
//! Lines of every batch share one limit of requests in flight, the engine's
//! `max_running_requests`, so batches together never hold more of the engine than one batch.

use crate::api::common::{random_hex, unix_now};
use crate::batch::{self, BatchFileError, Options, Sinks, Summary, Tokens};
use crate::files::StoredFile;
use crate::files_disk::FilesDir;
use crate::state::AppState;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::{Semaphore, watch};

/// Most batches kept; past it the oldest finished one is forgotten (its files stay).
pub const MAX_BATCHES: usize = 10_000;

/// Seconds a batch has to finish by OpenAI's only `completion_window`, "24h" (dsv4 runs every
/// batch to its end; `expires_at` is reported, nothing expires).
const WINDOW_S: u64 = 24 * 3600;

/// Where a batch is in its life (OpenAI's statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The input file is being read and checked.
    Validating,
    /// The file could not run; `errors` says why.
    Failed,
    /// Lines are running.
    InProgress,
    /// The output files are being written.
    Finalizing,
    /// Every line has its output line.
    Completed,
    /// A cancel arrived; the lines in flight finish.
    Cancelling,
    /// Cancelled; the lines that finished have their output lines.
    Cancelled,
}

impl Status {
    /// OpenAI's name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status of an OpenAI name.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Status::Validating,
            Status::Failed,
            Status::InProgress,
            Status::Finalizing,
            Status::Completed,
            Status::Cancelling,
            Status::Cancelled,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Whether the batch has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Failed | Status::Completed | Status::Cancelled)
    }
}

/// What a new batch asks for (its create request, checked).
#[derive(Debug, Clone)]
pub struct NewBatch {
    /// The uploaded input file's id.
    pub input_file_id: String,
    /// One of [`batch::ENDPOINTS`].
    pub endpoint: String,
    /// `"24h"`.
    pub completion_window: String,
    /// Up to 16 string pairs, or null.
    pub metadata: Value,
    /// The served model (the batch object's `model`).
    pub model: String,
}

/// One batch: what it was asked and where it is.
#[derive(Debug)]
pub struct Batch {
    /// `batch_…`.
    pub id: String,
    asked: NewBatch,
    created_at: u64,
    state: Mutex<Record>,
    cancel: watch::Sender<bool>,
}

/// The parts of a batch that change.
#[derive(Debug, Clone)]
struct Record {
    status: Status,
    counts: Summary,
    errors: Vec<Value>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    in_progress_at: Option<u64>,
    finalizing_at: Option<u64>,
    completed_at: Option<u64>,
    failed_at: Option<u64>,
    cancelling_at: Option<u64>,
    cancelled_at: Option<u64>,
}

impl Batch {
    /// OpenAI's batch object.
    pub fn object(&self) -> Value {
        let r = self.record();
        let errors = if r.errors.is_empty() {
            Value::Null
        } else {
            json!({"object": "list", "data": r.errors})
        };
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.asked.endpoint,
            "errors": errors,
            "input_file_id": self.asked.input_file_id,
            "completion_window": self.asked.completion_window,
            "status": r.status.name(),
            "output_file_id": r.output_file_id,
            "error_file_id": r.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": r.in_progress_at,
            "expires_at": self.created_at + WINDOW_S,
            "finalizing_at": r.finalizing_at,
            "completed_at": r.completed_at,
            "failed_at": r.failed_at,
            "expired_at": null,
            "cancelling_at": r.cancelling_at,
            "cancelled_at": r.cancelled_at,
            "request_counts": {
                "total": r.counts.total,
                "completed": r.counts.succeeded,
                "failed": r.counts.failed,
            },
            "metadata": self.asked.metadata,
            "model": self.asked.model,
            "usage": r.counts.tokens.usage(),
        })
    }

    /// Keep the batch's object in `server.files_dir`, when there is one.
    pub fn save(&self, disk: Option<&FilesDir>) {
        if let Some(dir) = disk
            && let Err(e) = dir.write_batch(&self.id, &self.object())
        {
            tracing::warn!(id = self.id, error = %e, "server.files_dir: cannot write a batch");
        }
    }

    /// A batch read back from its object; one that had not ended ends `failed`
    /// (`server_restarted`), since its lines in flight were lost with the server.
    fn from_object(v: &Value) -> Option<Self> {
        let text = |k: &str| v[k].as_str().map(str::to_string);
        let at = |k: &str| v[k].as_u64();
        let count = |k: &str| v["request_counts"][k].as_u64().unwrap_or(0) as usize;
        let status = Status::from_name(v["status"].as_str()?)?;
        let usage = &v["usage"];
        let (succeeded, failed) = (count("completed"), count("failed"));
        let mut record = Record {
            status,
            counts: Summary {
                total: count("total"),
                done: succeeded + failed,
                succeeded,
                failed,
                tokens: Tokens {
                    input: usage["input_tokens"].as_u64().unwrap_or(0),
                    cached: usage["input_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                    output: usage["output_tokens"].as_u64().unwrap_or(0),
                    reasoning: usage["output_tokens_details"]["reasoning_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                },
            },
            errors: v["errors"]["data"].as_array().cloned().unwrap_or_default(),
            output_file_id: text("output_file_id"),
            error_file_id: text("error_file_id"),
            in_progress_at: at("in_progress_at"),
            finalizing_at: at("finalizing_at"),
            completed_at: at("completed_at"),
            failed_at: at("failed_at"),
            cancelling_at: at("cancelling_at"),
            cancelled_at: at("cancelled_at"),
        };
        if !status.is_final() {
            record.status = Status::Failed;
            record.failed_at = Some(unix_now());
            record.errors.push(json!({
                "code": "server_restarted",
                "message": "the server stopped while this batch ran; its answers were lost (run \
                            the batch again)",
                "param": null,
                "line": null,
            }));
        }
        Some(Self {
            id: text("id")?,
            asked: NewBatch {
                input_file_id: text("input_file_id")?,
                endpoint: text("endpoint")?,
                completion_window: text("completion_window")?,
                metadata: v["metadata"].clone(),
                model: text("model").unwrap_or_default(),
            },
            created_at: at("created_at")?,
            state: Mutex::new(record),
            cancel: watch::channel(false).0,
        })
    }

    /// Where the batch is.
    pub fn status(&self) -> Status {
        self.record().status
    }

    /// Ask the batch to stop starting lines: `Ok` with the batch now cancelling (or already
    /// ended cancelled), `Err` with its status when it has ended otherwise.
    pub fn cancel(&self) -> Result<(), Status> {
        let mut r = self.lock();
        match r.status {
            Status::Validating | Status::InProgress => {
                r.status = Status::Cancelling;
                r.cancelling_at = Some(unix_now());
                drop(r);
                self.cancel.send_replace(true);
                Ok(())
            }
            Status::Cancelling | Status::Cancelled => Ok(()),
            other => Err(other),
        }
    }

    fn record(&self) -> Record {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Record)) {
        f(&mut self.lock());
    }
}

/// The batches, oldest first, and the one limit their lines share.
#[derive(Debug, Default)]
pub struct BatchStore {
    batches: Mutex<BTreeMap<u64, Arc<Batch>>>,
    next: Mutex<u64>,
    permits: OnceLock<Arc<Semaphore>>,
}

impl BatchStore {
    /// A batch by id.
    pub fn get(&self, id: &str) -> Option<Arc<Batch>> {
        self.lock().values().find(|b| b.id == id).cloned()
    }

    /// Take the batches a previous run kept in `server.files_dir` (oldest first); those that
    /// had not ended are saved back failed. Objects that cannot be read are returned.
    pub fn restore(&self, objects: Vec<Value>, disk: Option<&FilesDir>) -> Vec<String> {
        let mut bad = Vec::new();
        for v in objects {
            let Some(batch) = Batch::from_object(&v) else {
                bad.push(format!("batch {}: not a batch object", v["id"]));
                continue;
            };
            let ended = Status::from_name(v["status"].as_str().unwrap_or_default())
                .is_some_and(Status::is_final);
            if !ended {
                batch.save(disk);
            }
            self.insert(Arc::new(batch), disk);
        }
        bad
    }

    /// Every batch, oldest first.
    pub fn all(&self) -> Vec<Arc<Batch>> {
        self.lock().values().cloned().collect()
    }

    /// Batches that have not ended.
    pub fn running(&self) -> usize {
        self.lock()
            .values()
            .filter(|b| !b.status().is_final())
            .count()
    }

    /// Start `asked` over `input` in the background on `state` (whose model is loaded, with
    /// `max_running` requests at once); the new batch, validating.
    pub fn start(
        &self,
        state: &AppState,
        asked: NewBatch,
        input: Arc<StoredFile>,
        max_running: usize,
    ) -> Arc<Batch> {
        let (cancel, cancelled) = watch::channel(false);
        let batch = Arc::new(Batch {
            id: format!("batch_{}", random_hex(state.next_serial())),
            asked,
            created_at: unix_now(),
            state: Mutex::new(Record {
                status: Status::Validating,
                counts: Summary::default(),
                errors: Vec::new(),
                output_file_id: None,
                error_file_id: None,
                in_progress_at: None,
                finalizing_at: None,
                completed_at: None,
                failed_at: None,
                cancelling_at: None,
                cancelled_at: None,
            }),
            cancel,
        });
        let disk = state.files().disk();
        batch.save(disk);
        self.insert(batch.clone(), disk);
        let permits = self
            .permits
            .get_or_init(|| Arc::new(Semaphore::new(max_running.max(1))))
            .clone();
        tokio::spawn(run(state.clone(), batch.clone(), input, permits, cancelled));
        batch
    }

    /// List a batch; past [`MAX_BATCHES`] the oldest ended one is forgotten.
    fn insert(&self, batch: Arc<Batch>, disk: Option<&FilesDir>) {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let mut batches = self.lock();
        batches.insert(*next, batch);
        *next += 1;
        while batches.len() > MAX_BATCHES {
            let Some(old) = batches
                .iter()
                .find(|(_, b)| b.status().is_final())
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let (Some(b), Some(dir)) = (batches.remove(&old), disk) {
                dir.remove_batch(&b.id);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Batch>>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }
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

/// A batch's life: check the file, run its lines, keep the output and error files.
async fn run(
    state: AppState,
    batch: Arc<Batch>,
    input: Arc<StoredFile>,
    permits: Arc<Semaphore>,
    cancelled: watch::Receiver<bool>,
) {
    let disk = state.files().disk();
    let fail = |error: Value| {
        batch.update(|r| {
            r.status = Status::Failed;
            r.failed_at = Some(unix_now());
            r.errors.push(error);
        });
        batch.save(disk);
    };
    // Reading a file as large as server.files_mib takes a while: off the runtime's workers.
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
    let items = match checked {
        Ok(Ok(items)) => items,
        Ok(Err(error)) => {
            fail(error);
            return;
        }
        Err(e) => {
            fail(json!({"code": "internal_error", "message": format!(
                "reading the input file failed: {e}"), "param": null, "line": null}));
            return;
        }
    };
    batch.update(|r| {
        if r.status == Status::Validating {
            r.status = Status::InProgress;
        }
        r.in_progress_at = Some(unix_now());
        r.counts.total = items.len();
    });
    batch.save(disk);
    let opts = Options {
        permits,
        id_prefix: format!("batch_req_{}", batch.id.trim_start_matches("batch_")),
        cancel: Some(cancelled),
    };
    let (mut output, mut errors) = (Vec::new(), Vec::new());
    let sinks = Sinks {
        output: &mut output,
        errors: Some(&mut errors),
    };
    // Writing to memory cannot fail.
    let summary = batch::run(&state, items, &opts, sinks, |s| {
        batch.update(|r| r.counts = *s);
    })
    .await
    .unwrap_or_default();
    batch.update(|r| r.finalizing_at = Some(unix_now()));
    // With server.files_dir the outputs are written to disk: off the runtime's workers.
    let ids = [
        format!("file-{}", random_hex(state.next_serial())),
        format!("file-{}", random_hex(state.next_serial())),
    ];
    let (keeper, name) = (state.clone(), batch.id.clone());
    let kept = tokio::task::spawn_blocking(move || {
        let [output_id, error_id] = ids;
        let keep = |id: String, bytes: Vec<u8>, kind: &str| {
            (!bytes.is_empty()).then(|| {
                let file = format!("{name}_{kind}.jsonl");
                keeper
                    .files()
                    .put_output(id, file, bytes.into(), unix_now())
                    .id
                    .clone()
            })
        };
        (
            keep(output_id, output, "output"),
            keep(error_id, errors, "error"),
        )
    })
    .await;
    let (output_id, error_id) = kept.unwrap_or_else(|e| {
        tracing::error!(batch = batch.id, error = %e, "the batch's output files were lost");
        (None, None)
    });
    batch.update(|r| {
        r.counts = summary;
        r.output_file_id = output_id;
        r.error_file_id = error_id;
        if r.status == Status::Cancelling {
            r.status = Status::Cancelled;
            r.cancelled_at = Some(unix_now());
        } else {
            r.status = Status::Completed;
            r.completed_at = Some(unix_now());
        }
    });
    batch.save(disk);
}
