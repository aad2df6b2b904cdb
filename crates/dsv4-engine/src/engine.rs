//! The step loop on its own thread, and [`EngineHandle`], the one interface to it: submit a
//! [`Request`] and read its [`RequestStream`] (usable from async code or with blocking reads),
//! cancel by id, read [`EngineMetrics`]. Dropping the last handle stops the loop and cancels
//! what is left.

use crate::canary::DebugOptions;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::metrics::EngineMetrics;
use crate::pools::PoolReport;
use crate::request::{Event, Request, RequestId, RequestStream};
use crate::scheduler::{Limits, Scheduler, queued_channel};
use crate::sequence::Detokenizer;
use dsv4_model::Model;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

/// What the handle tells the loop.
enum Command {
    Submit {
        id: RequestId,
        /// Boxed: a request is far larger than the other commands.
        req: Box<Request>,
        tx: UnboundedSender<Event>,
        /// Told once the request is queued (a request with a queue limit).
        queued: Option<tokio::sync::oneshot::Sender<()>>,
    },
    Cancel(RequestId),
    YieldCap(usize),
    ClearPrefixCache(Option<tokio::sync::oneshot::Sender<usize>>),
    /// Block the loop until the sender is dropped (fault injection).
    Stall(Receiver<()>),
    Shutdown,
}

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Size the pools for `model` under `cfg` and start the step loop on its own thread.
    pub fn spawn(model: Arc<Model>, cfg: EngineConfig) -> Result<EngineHandle, EngineError> {
        Self::spawn_with(model, cfg, None)
    }

    /// [`Engine::spawn`] with a detokenizer, which enables stop strings and final text.
    pub fn spawn_with(
        model: Arc<Model>,
        cfg: EngineConfig,
        detok: Option<Arc<dyn Detokenizer>>,
    ) -> Result<EngineHandle, EngineError> {
        Self::spawn_debug(model, cfg, detok, DebugOptions::default())
    }

    /// [`Engine::spawn_with`] with run-time checks (the cache-page canary) on.
    pub fn spawn_debug(
        model: Arc<Model>,
        cfg: EngineConfig,
        detok: Option<Arc<dyn Detokenizer>>,
        debug: DebugOptions,
    ) -> Result<EngineHandle, EngineError> {
        let mut sched = Scheduler::new(model, cfg, detok)?.with_debug(debug);
        let limits = sched.limits().clone();
        let report = sched.pools().report().clone();
        let metrics = Arc::new(Mutex::new(sched.metrics()));
        sched.publish_to(Arc::clone(&metrics));
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("dsv4-engine".into())
            .spawn(move || run(sched, rx))
            .map_err(EngineError::Spawn)?;
        Ok(EngineHandle {
            inner: Arc::new(Inner {
                cmd: tx,
                limits,
                report,
                metrics,
                next_id: AtomicU64::new(0),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }
}

/// Apply a command; false on shutdown.
fn apply(sched: &mut Scheduler, cmd: Command) -> bool {
    match cmd {
        Command::Submit {
            id,
            req,
            tx,
            queued,
        } => sched.enqueue(id, *req, tx, queued),
        Command::Cancel(id) => {
            sched.cancel(id);
        }
        Command::YieldCap(cap) => sched.set_yield_cap(cap),
        Command::ClearPrefixCache(done) => {
            let dropped = sched.clear_prefix_cache();
            if let Some(done) = done {
                // A closed channel only means the caller stopped waiting.
                let _ = done.send(dropped);
            }
        }
        Command::Stall(release) => {
            tracing::warn!("step loop stalled on purpose (fault injection)");
            // Returns when the guard's sender is dropped.
            let _ = release.recv();
            tracing::warn!("step loop released");
        }
        Command::Shutdown => return false,
    }
    true
}

/// The loop: wait for work when idle, take every pending command, run one step.
fn run(mut sched: Scheduler, rx: Receiver<Command>) {
    tracing::info!("engine loop started");
    'outer: loop {
        if sched.is_idle() {
            let Ok(cmd) = rx.recv() else {
                break;
            };
            if !apply(&mut sched, cmd) {
                break;
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if !apply(&mut sched, cmd) {
                        break 'outer;
                    }
                }
                Err(TryRecvError::Disconnected) => break 'outer,
                Err(TryRecvError::Empty) => break,
            }
        }
        sched.step();
    }
    sched.cancel_all();
    tracing::info!("engine loop stopped");
}

struct Inner {
    cmd: Sender<Command>,
    limits: Limits,
    report: PoolReport,
    metrics: Arc<Mutex<EngineMetrics>>,
    next_id: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.cmd.send(Command::Shutdown);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread
            && t.join().is_err()
        {
            tracing::error!("the engine thread panicked");
        }
    }
}

/// A cheap, cloneable handle to a running engine (Send + Sync).
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

impl EngineHandle {
    /// Check and queue a request; its events arrive on the returned stream (dropping the
    /// stream cancels the request).
    pub fn submit(&self, req: Request) -> Result<RequestStream, EngineError> {
        self.inner.limits.check(&req)?;
        let id = RequestId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = unbounded_channel();
        let (queued, told) = queued_channel(&req);
        let sent = self.inner.cmd.send(Command::Submit {
            id,
            req: Box::new(req),
            tx,
            queued,
        });
        if sent.is_err() {
            return Err(EngineError::Stopped);
        }
        Ok(RequestStream {
            id,
            rx,
            queued: told,
        })
    }

    /// Cancel a request (its pages are freed before the next step; its stream ends with
    /// `Cancelled`). Unknown or finished ids are ignored.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.inner.cmd.send(Command::Cancel(id));
    }

    /// Let at most `cap` requests that yield run ([`Request::yields`]; at least 1; before the
    /// next step).
    pub fn set_yield_cap(&self, cap: usize) {
        let _ = self.inner.cmd.send(Command::YieldCap(cap));
    }

    /// Drop every prefix snapshot (before the next step; does not wait).
    pub fn clear_prefix_cache(&self) {
        let _ = self.inner.cmd.send(Command::ClearPrefixCache(None));
    }

    /// Drop every prefix snapshot, device and host tier, and wait until they are gone: the
    /// number dropped. Pages a running request shares with a snapshot stay with the request.
    pub async fn flush_prefix_cache(&self) -> Result<usize, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner
            .cmd
            .send(Command::ClearPrefixCache(Some(tx)))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// The metrics as of the last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.inner
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fault injection: the step loop stops before its next step and waits, with requests
    /// queued or running, until the returned guard is dropped (a wedged engine, for testing
    /// health checks). Drop the guard before the last handle, or dropping the engine waits.
    pub fn stall(&self) -> StallGuard {
        let (tx, rx) = mpsc::channel();
        let _ = self.inner.cmd.send(Command::Stall(rx));
        StallGuard { _release: tx }
    }

    /// The pool table of start-up.
    pub fn pool_report(&self) -> &PoolReport {
        &self.inner.report
    }

    /// What requests are checked against.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}

/// Keeps the step loop stalled (see [`EngineHandle::stall`]); dropping it releases the loop.
#[must_use = "the loop is released as soon as the guard is dropped"]
pub struct StallGuard {
    _release: Sender<()>,
}
