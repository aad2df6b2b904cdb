//! The server's shared state: its configuration, the loaded model ([`Loaded`]: engine handle,
//! tokenizer, vocabulary bytes, grammar compiler) once it is ready, statistics, the count of
//! generation requests in flight, and the step-loop progress watch behind `/health`.

use crate::abort::AbortRegistry;
use crate::batch::{Activity, Share};
use crate::batches::BatchStore;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::files::FileStore;
use crate::files_disk::FilesDir;
use crate::grammar::GrammarCompiler;
use crate::metrics::Stats;
use crate::responses_store::ResponseStore;
use crate::thinking_budget::ThinkEnd;
use crate::vocab::Vocab;
use dsv4_chat::Tokenizer;
use dsv4_engine::{DebugOptions, Detokenizer, Engine, EngineConfig, EngineHandle};
use dsv4_model::Model;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A model being served: its engine and what requests are encoded and decoded with.
pub struct Loaded {
    /// The engine running the model.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// Token id → bytes.
    pub vocab: Arc<Vocab>,
    /// The end of reasoning, for thinking budgets.
    pub think_end: Arc<ThinkEnd>,
    /// Compiles constrained-decoding grammars over the vocabulary.
    pub grammars: Arc<GrammarCompiler>,
    /// The model's context limit in tokens.
    pub context: usize,
    /// The beginning-of-sequence token id.
    pub bos: u32,
    /// The end-of-sequence token id (the engine ends a request on it unless `ignore_eos`).
    pub eos: u32,
    /// Requests the engine runs at once (`scheduler.max_running_requests`): the most lines of
    /// `/v1/batches` batches in flight together ([`AppState::batch_share`]).
    pub max_running: usize,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("context", &self.context)
            .field("vocab", &self.vocab.len())
            .finish_non_exhaustive()
    }
}

impl Loaded {
    /// Start an engine on `model` under `cfg` with the run-time checks of `debug`, with
    /// `tokenizer` for prompts, stop strings and grammars, keeping up to `grammar_cache`
    /// compiled grammars (`server.grammar_cache`).
    pub fn new(
        model: Arc<Model>,
        tokenizer: Tokenizer,
        cfg: EngineConfig,
        debug: DebugOptions,
        grammar_cache: usize,
    ) -> Result<Self, ServerError> {
        let vocab = Arc::new(Vocab::new(&tokenizer, model.cfg.vocab_size)?);
        let think_end = Arc::new(ThinkEnd::new(&tokenizer, Arc::clone(&vocab))?);
        let env = vocab.tok_env(tokenizer.clone());
        let grammars = GrammarCompiler::new(&env, tokenizer.clone(), grammar_cache)
            .map(Arc::new)
            .map_err(ServerError::Grammar)?;
        let detok: Arc<dyn Detokenizer> = {
            let tok = tokenizer.clone();
            Arc::new(move |ids: &[u32]| tok.decode(ids).unwrap_or_default())
        };
        let (context, bos, eos) = (
            model.cfg.max_position_embeddings,
            model.cfg.bos_token_id,
            model.cfg.eos_token_id,
        );
        let max_running = cfg.max_running_requests;
        let engine = Engine::spawn_debug(model, cfg, Some(detok), debug)?;
        Ok(Self {
            engine,
            tokenizer,
            vocab,
            think_end,
            grammars,
            context,
            bos,
            eos,
            max_running,
        })
    }
}

/// Last observed step count and when the loop last made progress (or was idle).
#[derive(Debug)]
struct Progress {
    steps: u64,
    at: Instant,
}

/// The Files and Batch APIs' stores: in memory, or read back from `server.files_dir`.
fn open_files(cfg: &ServerConfig) -> Result<(FileStore, BatchStore), ServerError> {
    let Some(dir) = &cfg.files_dir else {
        return Ok((FileStore::new(cfg.files_bytes), BatchStore::default()));
    };
    let config_error = |e: std::io::Error| ServerError::Config {
        option: "server.files_dir",
        message: format!("{}: {e}", dir.display()),
    };
    if cfg.files_bytes == 0 {
        return Err(ServerError::Config {
            option: "server.files_dir",
            message: "it keeps the Files and Batch APIs' files, but server.files_mib = 0 turns \
                      those APIs off; leave it empty or give them room"
                .into(),
        });
    }
    let disk = FilesDir::open(dir).map_err(config_error)?;
    let (files, objects, mut skipped) =
        FileStore::open(cfg.files_bytes, disk).map_err(config_error)?;
    let batches = BatchStore::default();
    skipped.extend(batches.restore(objects, files.disk()));
    if !skipped.is_empty() {
        tracing::warn!(dir = %dir.display(), entries = ?skipped, "server.files_dir: entries left as they were");
    }
    tracing::info!(
        dir = %dir.display(),
        files = files.len(),
        batches = batches.all().len(),
        "server.files_dir: files and batches read back"
    );
    Ok((files, batches))
}

/// Everything handlers share.
#[derive(Debug)]
pub struct Shared {
    /// The configuration.
    pub cfg: ServerConfig,
    /// Counters and histograms.
    pub stats: Stats,
    /// When the server started, in seconds since the Unix epoch (the model's `created`).
    pub started: i64,
    loaded: OnceLock<Arc<Loaded>>,
    in_flight: AtomicU64,
    draining: AtomicBool,
    serial: AtomicU64,
    progress: Mutex<Progress>,
    aborts: Arc<AbortRegistry>,
    responses: ResponseStore,
    files: FileStore,
    batches: BatchStore,
    interactive: Arc<Activity>,
}

/// The state handed to every handler (cheap to clone).
#[derive(Debug, Clone)]
pub struct AppState(pub Arc<Shared>);

/// What `/health` reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// The model is still loading.
    Loading,
    /// Requests are pending and the step loop has not completed a step for `stalled_for`.
    Stalled {
        /// Time since the last step.
        stalled_for: Duration,
        /// Generation requests waiting on the engine.
        pending: u64,
    },
    /// A shutdown is draining the requests in flight.
    Draining,
    /// Serving.
    Ok,
}

impl AppState {
    /// A state with no model yet (`/health` answers 503 "loading"); with
    /// `server.responses_dir`, the stored responses a previous run left there are read back.
    pub fn new(cfg: ServerConfig) -> Result<Self, ServerError> {
        let (capacity, bytes) = (cfg.responses_store, cfg.responses_store_bytes);
        let (files, batches) = open_files(&cfg)?;
        let responses = match &cfg.responses_dir {
            None => ResponseStore::new(capacity, bytes),
            Some(_) if capacity == 0 => {
                return Err(ServerError::Config {
                    option: "server.responses_dir",
                    message:
                        "it keeps stored responses, but server.responses_store = 0 stores none; \
                              leave it empty or store some"
                            .into(),
                });
            }
            Some(dir) => {
                let (store, skipped) =
                    ResponseStore::open(capacity, bytes, dir).map_err(|e| ServerError::Config {
                        option: "server.responses_dir",
                        message: format!("{}: {e}", dir.display()),
                    })?;
                if !skipped.is_empty() {
                    tracing::warn!(
                        dir = %dir.display(),
                        files = ?skipped,
                        "server.responses_dir: files left as they were (unreadable, or \
                         continuing a response whose file is missing)"
                    );
                }
                tracing::info!(
                    dir = %dir.display(),
                    stored = store.len(),
                    "server.responses_dir: stored responses read back"
                );
                store
            }
        };
        Ok(Self(Arc::new(Shared {
            cfg,
            stats: Stats::default(),
            started: dsv4_core::time::now_unix(),
            loaded: OnceLock::new(),
            in_flight: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            serial: AtomicU64::new(0),
            progress: Mutex::new(Progress {
                steps: 0,
                at: Instant::now(),
            }),
            aborts: Arc::default(),
            responses,
            files,
            batches,
            interactive: Arc::default(),
        })))
    }

    /// The model is ready: start serving requests, watching the step loop's progress and
    /// deleting expired files, and go on with the batches read back from `server.files_dir`
    /// that had not ended (call inside a tokio runtime). A second call is ignored.
    pub fn set_ready(&self, loaded: Loaded) {
        // Before the model is visible, so every batch sees it.
        self.0.batches.set_share(self.batch_share(&loaded));
        if self.0.loaded.set(Arc::new(loaded)).is_err() {
            tracing::warn!("the model was already set; ignoring the second one");
            return;
        }
        let weak = Arc::downgrade(&self.0);
        let tick =
            (self.0.cfg.health_stall / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(watch_progress(weak.clone(), tick));
        if self.0.files.enabled() {
            tokio::spawn(sweep_files(weak, FILE_SWEEP));
        }
        tracing::info!(model = %self.0.cfg.model_id, "model ready");
        self.0.batches.resume(self);
        // With idle slots to fill, the engine pauses the lines past the share while
        // interactive requests come. Ends with the server.
        let (share, weak) = (self.0.batches.share(), Arc::downgrade(&self.0));
        tokio::spawn(async move {
            share
                .track(|cap| {
                    let Some(loaded) = weak.upgrade().and_then(|s| s.loaded.get().cloned()) else {
                        return false;
                    };
                    loaded.engine.set_yield_cap(cap);
                    true
                })
                .await;
        });
    }

    /// Lines of `/v1/batches` batches in flight together on `loaded`: its `max_running`, or
    /// `server.batch_max_running` when that is fewer (and not 0), then every running slot
    /// once no interactive request has been in flight for `server.batch_fill_idle_ms`.
    pub fn batch_share(&self, loaded: &Loaded) -> Share {
        let slots = loaded.max_running;
        let lines = match self.0.cfg.batch_max_running {
            0 => slots,
            n => n.min(slots),
        };
        match self.0.cfg.batch_fill_idle {
            Some(idle) => Share::filling(lines, slots, idle, self.0.interactive.clone()),
            None => Share::fixed(lines),
        }
    }

    /// The interactive generation requests (not batch lines) in flight.
    pub fn interactive(&self) -> &Arc<Activity> {
        &self.0.interactive
    }

    /// The loaded model, or 503 while it loads.
    pub fn loaded(&self) -> Option<Arc<Loaded>> {
        self.0.loaded.get().cloned()
    }

    /// The configuration.
    pub fn cfg(&self) -> &ServerConfig {
        &self.0.cfg
    }

    /// The statistics.
    pub fn stats(&self) -> &Stats {
        &self.0.stats
    }

    /// Generation requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Count a generation request until the guard is dropped.
    pub fn begin_request(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(&self.0))
    }

    /// The runs in flight, for `/abort_request`.
    pub fn aborts(&self) -> &Arc<AbortRegistry> {
        &self.0.aborts
    }

    /// The Files API's files.
    pub fn files(&self) -> &FileStore {
        &self.0.files
    }

    /// The Batch API's batches.
    pub fn batches(&self) -> &BatchStore {
        &self.0.batches
    }

    /// The stored responses of `/v1/responses`.
    pub fn responses(&self) -> &ResponseStore {
        &self.0.responses
    }

    /// A number unique to this server process (ids, default seeds).
    pub fn next_serial(&self) -> u64 {
        self.0.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Mark the server as shutting down (`/health` answers 503 "draining").
    pub fn start_draining(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }

    /// The server's health now.
    pub fn health(&self) -> Health {
        if self.0.loaded.get().is_none() {
            return Health::Loading;
        }
        if self.0.draining.load(Ordering::SeqCst) {
            return Health::Draining;
        }
        let pending = self.in_flight();
        let at = self.0.progress.lock().unwrap_or_else(|e| e.into_inner()).at;
        let stalled_for = at.elapsed();
        if pending > 0 && stalled_for >= self.0.cfg.health_stall {
            return Health::Stalled {
                stalled_for,
                pending,
            };
        }
        Health::Ok
    }
}

/// Update the progress mark every `tick`: the loop progressed when its step count moved, and
/// cannot be stalled while nothing is in flight. Ends with the server.
async fn watch_progress(state: Weak<Shared>, tick: Duration) {
    let mut interval = tokio::time::interval(tick);
    loop {
        interval.tick().await;
        let Some(shared) = state.upgrade() else {
            return;
        };
        let Some(loaded) = shared.loaded.get() else {
            continue;
        };
        let steps = loaded.engine.metrics().steps_total;
        let busy = shared.in_flight.load(Ordering::SeqCst) > 0;
        let mut p = shared.progress.lock().unwrap_or_else(|e| e.into_inner());
        if !busy || steps != p.steps {
            p.steps = steps;
            p.at = Instant::now();
        }
    }
}

/// How often files past their `expires_at` are deleted (they are not served from that second).
const FILE_SWEEP: Duration = Duration::from_secs(60);

/// Delete the files that have expired every `every`, starting now. Ends with the server.
async fn sweep_files(state: Weak<Shared>, every: Duration) {
    let mut interval = tokio::time::interval(every);
    loop {
        interval.tick().await;
        let Some(shared) = state.upgrade() else {
            return;
        };
        // With server.files_dir this deletes files on disk: off the runtime's workers.
        let swept = tokio::task::spawn_blocking(move || {
            shared.files.expire(crate::api::common::unix_now())
        })
        .await;
        match swept {
            Ok(ids) if !ids.is_empty() => tracing::info!(files = ?ids, "expired files deleted"),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "deleting expired files failed"),
        }
    }
}

/// Counts one generation request in flight while it lives.
#[derive(Debug)]
pub struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
