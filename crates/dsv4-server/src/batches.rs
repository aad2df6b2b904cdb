//! OpenAI's Batch API (`/v1/batches`): a batch is an uploaded input file run in the background
//! through [`crate::batch::run`], its answers and failures then kept as output and error files in
//! the [`crate::files::FileStore`]. [`BatchStore`] holds the batches; [`Batch`] one batch's
//! state, which its task (`task.rs`) updates as lines finish (`request_counts` moves while it
//! runs).
//!
//! Lines of every batch share one limit of requests in flight ([`AppState::batch_share`]: the
//! engine's `max_running_requests`, or fewer with `server.batch_max_running`, filling the rest
//! while interactive requests are idle with `server.batch_fill_idle_ms`), so batches together
//! never hold more of the engine than one batch.
//!
//! With `server.files_dir` a batch survives its server: its lines are written to part files as
//! they are answered, a shutdown lets the lines in flight finish and stops there, and the next
//! server goes on from the last whole line (`resume.rs`) once its model is ready.

pub mod messages;
pub mod resume;
mod task;

use crate::api::common::{random_hex, unix_now};
use crate::batch::{MESSAGES_ENDPOINT, Share, Summary};
use crate::files::StoredFile;
use crate::files_disk::FilesDir;
use crate::state::AppState;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Most batches kept; past it the oldest finished one is forgotten (its files stay).
pub const MAX_BATCHES: usize = 10_000;

/// Seconds a batch has to finish by OpenAI's only `completion_window`, "24h": past it, its
/// lines not yet started are written to its error file as `batch_expired` and it ends
/// `expired`.
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
    /// Its completion window ended first: the lines that finished have their output lines, the
    /// others are `batch_expired` lines of its error file.
    Expired,
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
            Status::Expired => "expired",
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
            Status::Expired,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Whether the batch has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Failed | Status::Completed | Status::Cancelled | Status::Expired
        )
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
    /// Seconds its output and error files live after they are written (`output_expires_after`),
    /// or for ever.
    pub output_expires_after: Option<u64>,
}

/// One batch: what it was asked and where it is.
#[derive(Debug)]
pub struct Batch {
    /// `batch_…`.
    pub id: String,
    asked: NewBatch,
    created_at: u64,
    state: Mutex<Record>,
    /// Turns true when the batch must start no more lines: a cancel, or the server stopping.
    stop: watch::Sender<bool>,
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
    /// When its completion window ended with lines not yet started (it ends `expired`).
    expired_at: Option<u64>,
    /// How many of its failed lines are those the window's end left unstarted.
    expired_lines: usize,
    /// The ids its output and error files get, chosen as it starts keeping them (kept on disk,
    /// so a server stopped part-way finishes with the same ids).
    outputs: Option<[String; 2]>,
}

impl Record {
    /// A new batch's record: validating, nothing counted.
    fn new() -> Self {
        Self {
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
            expired_at: None,
            expired_lines: 0,
            outputs: None,
        }
    }
}

/// The key of a batch's record on disk naming its output files while it keeps them.
const OUTPUTS_KEY: &str = "dsv4_outputs";
/// The key of a batch's record on disk keeping its `output_expires_after` seconds.
const OUTPUT_EXPIRY_KEY: &str = "dsv4_output_expires_after";
/// The key of a batch's record on disk counting the lines its window's end left unstarted.
const EXPIRED_LINES_KEY: &str = "dsv4_expired_lines";

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
            "expired_at": r.expired_at,
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

    /// Keep the batch's object in `server.files_dir`, when there is one (with the ids its
    /// output files get while it keeps them).
    pub fn save(&self, disk: Option<&FilesDir>) {
        let Some(dir) = disk else {
            return;
        };
        let mut object = self.object();
        if let Some(ids) = self.lock().outputs.clone() {
            object[OUTPUTS_KEY] = json!(ids);
        }
        if let Some(seconds) = self.asked.output_expires_after {
            object[OUTPUT_EXPIRY_KEY] = json!(seconds);
        }
        let expired = self.lock().expired_lines;
        if expired > 0 {
            object[EXPIRED_LINES_KEY] = json!(expired);
        }
        if let Err(e) = dir.write_batch(&self.id, &object) {
            tracing::warn!(id = self.id, error = %e, "server.files_dir: cannot write a batch");
        }
    }

    /// A batch read back from what [`Batch::save`] wrote; one that had not ended goes on once
    /// the model is ready ([`BatchStore::resume`]).
    fn from_object(v: &Value) -> Option<Self> {
        let text = |k: &str| v[k].as_str().map(str::to_string);
        let at = |k: &str| v[k].as_u64();
        let count = |k: &str| v["request_counts"][k].as_u64().unwrap_or(0) as usize;
        let status = Status::from_name(v["status"].as_str()?)?;
        let usage = &v["usage"];
        let (succeeded, failed) = (count("completed"), count("failed"));
        let outputs = match v[OUTPUTS_KEY].as_array().map(Vec::as_slice) {
            Some([Value::String(o), Value::String(e)]) => Some([o.clone(), e.clone()]),
            _ => None,
        };
        let record = Record {
            status,
            counts: Summary {
                total: count("total"),
                done: succeeded + failed,
                succeeded,
                failed,
                tokens: crate::batch::Tokens {
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
            expired_at: at("expired_at"),
            expired_lines: at(EXPIRED_LINES_KEY).unwrap_or(0) as usize,
            outputs,
        };
        Some(Self {
            id: text("id")?,
            asked: NewBatch {
                input_file_id: text("input_file_id")?,
                endpoint: text("endpoint")?,
                completion_window: text("completion_window")?,
                metadata: v["metadata"].clone(),
                model: text("model").unwrap_or_default(),
                output_expires_after: at(OUTPUT_EXPIRY_KEY),
            },
            created_at: at("created_at")?,
            state: Mutex::new(record),
            stop: watch::channel(status == Status::Cancelling).0,
        })
    }

    /// The prefix of its output lines' ids (`{prefix}_{line}`).
    fn id_prefix(&self) -> String {
        let serial = self.id.rsplit('_').next().unwrap_or_default();
        format!("batch_req_{serial}")
    }

    /// Whether it is a Message Batch (`/v1/messages/batches`) rather than an OpenAI batch.
    pub fn is_messages(&self) -> bool {
        self.asked.endpoint == MESSAGES_ENDPOINT
    }

    /// When its completion window ends (Unix seconds).
    fn deadline(&self) -> u64 {
        self.created_at + WINDOW_S
    }

    /// Its completion window has ended: start no more lines (unless it is being cancelled,
    /// which ends it first).
    fn expire(&self) {
        let mut r = self.lock();
        if matches!(r.status, Status::Validating | Status::InProgress) && r.expired_at.is_none() {
            r.expired_at = Some(unix_now());
            drop(r);
            self.stop.send_replace(true);
        }
    }

    /// End the batch `failed` with `error` (an entry of its `errors`).
    fn fail(&self, error: Value, disk: Option<&FilesDir>) {
        self.update(|r| {
            r.status = Status::Failed;
            r.failed_at = Some(unix_now());
            r.outputs = None;
            r.errors.push(error);
        });
        self.save(disk);
    }

    /// Where the batch is.
    pub fn status(&self) -> Status {
        self.record().status
    }

    /// Ask the batch to stop starting lines: `Ok` with the batch now cancelling (or already
    /// ended cancelled), `Err` with its status when it has ended otherwise.
    pub fn cancel(&self) -> Result<(), Status> {
        let mut r = self.lock();
        if r.expired_at.is_some() {
            return Err(Status::Expired);
        }
        match r.status {
            Status::Validating | Status::InProgress => {
                r.status = Status::Cancelling;
                r.cancelling_at = Some(unix_now());
                drop(r);
                self.stop.send_replace(true);
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

/// The batches, oldest first, the one limit their lines share, and their tasks.
#[derive(Debug, Default)]
pub struct BatchStore {
    batches: Mutex<BTreeMap<u64, Arc<Batch>>>,
    next: Mutex<u64>,
    share: OnceLock<Arc<Share>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
}

impl BatchStore {
    /// A batch by id.
    pub fn get(&self, id: &str) -> Option<Arc<Batch>> {
        self.lock().values().find(|b| b.id == id).cloned()
    }

    /// Take the batches a previous run kept in `server.files_dir` (oldest first), as they were;
    /// those that had not ended go on at [`BatchStore::resume`]. Objects that cannot be read
    /// are returned.
    pub fn restore(&self, objects: Vec<Value>, disk: Option<&FilesDir>) -> Vec<String> {
        let mut bad = Vec::new();
        for v in objects {
            match Batch::from_object(&v) {
                Some(batch) => {
                    self.insert(Arc::new(batch), disk);
                }
                None => bad.push(format!("batch {}: not a batch object", v["id"])),
            }
        }
        bad
    }

    /// Every batch, oldest first.
    pub fn all(&self) -> Vec<Arc<Batch>> {
        self.lock().values().cloned().collect()
    }

    /// Set the one limit of lines in flight that all batches share (before any batch starts;
    /// a second call is ignored).
    pub fn set_share(&self, share: Share) {
        let _ = self.share.set(Arc::new(share));
    }

    /// The limit all batches share: the one set, or one line at a time until then (no batch
    /// starts before the model is ready, which sets it).
    pub(crate) fn share(&self) -> Arc<Share> {
        self.share.get_or_init(|| Arc::new(Share::fixed(1))).clone()
    }

    /// Lines of batches in flight now.
    pub fn lines_in_flight(&self) -> usize {
        self.share.get().map_or(0, |s| s.in_flight())
    }

    /// The most lines of batches that may be in flight now (0 before the model is ready).
    pub fn lines_limit(&self) -> usize {
        self.share.get().map_or(0, |s| s.limit())
    }

    /// The idle time in force before lines may fill idle running slots (`None` without a fill,
    /// or before the model is ready).
    pub fn fill_idle(&self) -> Option<std::time::Duration> {
        self.share.get().and_then(|s| s.fill_idle())
    }

    /// Batches that have not ended.
    pub fn running(&self) -> usize {
        self.lock()
            .values()
            .filter(|b| !b.status().is_final())
            .count()
    }

    /// Start `asked` over `input` in the background on `state` (whose model is loaded); the new
    /// batch, validating.
    pub fn start(&self, state: &AppState, asked: NewBatch, input: Arc<StoredFile>) -> Arc<Batch> {
        let prefix = if asked.endpoint == MESSAGES_ENDPOINT {
            "msgbatch"
        } else {
            "batch"
        };
        let batch = Arc::new(Batch {
            id: format!("{prefix}_{}", random_hex(state.next_serial())),
            asked,
            created_at: unix_now(),
            state: Mutex::new(Record::new()),
            stop: watch::channel(false).0,
        });
        let disk = state.files().disk();
        batch.save(disk);
        for old in self.insert(batch.clone(), disk) {
            if old.is_messages() {
                // Its results went with it: nothing reads its files any more.
                for file in old.file_ids() {
                    state.files().delete(&file);
                }
            }
        }
        self.spawn(state, batch.clone(), Some(input));
        batch
    }

    /// Go on with the batches read back that had not ended (the model of `state` is ready); how
    /// many.
    pub fn resume(&self, state: &AppState) -> usize {
        let unfinished: Vec<Arc<Batch>> = self
            .all()
            .into_iter()
            .filter(|b| !b.status().is_final())
            .collect();
        for batch in &unfinished {
            tracing::info!(
                id = batch.id,
                status = batch.status().name(),
                "batch goes on"
            );
            self.spawn(state, batch.clone(), None);
        }
        unfinished.len()
    }

    /// Run `batch`'s task (reading `input`, or its input file from the store when resumed).
    fn spawn(&self, state: &AppState, batch: Arc<Batch>, input: Option<Arc<StoredFile>>) {
        let share = self.share();
        let stop = batch.stop.subscribe();
        // Listed before this check, so a concurrent `stop` either signals it or is seen here.
        if self.stopping.load(Ordering::SeqCst) {
            batch.stop.send_replace(true);
        }
        let handle = tokio::spawn(task::run(state.clone(), batch, input, share, stop));
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    /// The server is stopping: batches start no more lines, and this returns once the lines in
    /// flight are answered and written. With `server.files_dir` the batches go on from there at
    /// the next start; without, they end with the process.
    pub async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for batch in self.all() {
            batch.stop.send_replace(true);
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "a batch task failed");
            }
        }
    }

    /// Forget an ended batch (and its record on disk); the batch, or `None` when there is no
    /// such batch. Its files are the caller's to delete.
    pub fn remove(&self, id: &str, disk: Option<&FilesDir>) -> Option<Arc<Batch>> {
        let mut batches = self.lock();
        let key = *batches.iter().find(|(_, b)| b.id == id)?.0;
        let batch = batches.remove(&key)?;
        drop(batches);
        if let Some(dir) = disk {
            dir.remove_batch(&batch.id);
        }
        Some(batch)
    }

    /// List a batch; past [`MAX_BATCHES`] the oldest ended one is forgotten.
    /// The batches forgotten are returned (a Message Batch's files go with it).
    fn insert(&self, batch: Arc<Batch>, disk: Option<&FilesDir>) -> Vec<Arc<Batch>> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let mut batches = self.lock();
        batches.insert(*next, batch);
        *next += 1;
        let mut forgotten = Vec::new();
        while batches.len() > MAX_BATCHES {
            let Some(old) = batches
                .iter()
                .find(|(_, b)| b.status().is_final())
                .map(|(k, _)| *k)
            else {
                break;
            };
            let Some(b) = batches.remove(&old) else {
                break;
            };
            if let Some(dir) = disk {
                dir.remove_batch(&b.id);
            }
            forgotten.push(b);
        }
        forgotten
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Batch>>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }
}
