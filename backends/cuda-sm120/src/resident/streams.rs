//! A plan's streams and events on the device ([`DeviceStreams`]): plan stream `i` is a
//! non-blocking device stream, plan event `j` a device event (timing off); a thread entering a
//! plan stream from the default stream makes it wait for the default stream's earlier work. Sets are pooled by
//! the op set and reused by later executions (creating streams is a driver call each), one set
//! per execution at a time, so concurrent executions never share an event.

use super::{State, sync_and_drain};
use crate::device::DEFAULT_STREAM;
use crate::{CudaError, Device};
use dsv4_kernels::{DeviceStreams, KernelError};
use std::sync::{Arc, Mutex};

/// Device streams and events owned by a pool.
struct Handles {
    streams: Vec<u64>,
    events: Vec<u64>,
    /// The event a thread records on the default stream when it enters a plan stream from it,
    /// for the plan stream to wait on (see [`CudaStreams::enter`]); created with the set.
    fork: Option<u64>,
    /// One event per stream, recorded there for another stream to wait on all of them
    /// ([`DeviceStreams::wait_for_all`]).
    joins: Vec<u64>,
}

/// The op set's idle stream sets.
#[derive(Default)]
pub(crate) struct StreamPool {
    idle: Mutex<Vec<Handles>>,
}

impl StreamPool {
    /// A set of at least `streams` streams and `events` events on `dev`, from the pool when
    /// one is idle (grown as needed).
    pub(crate) fn take(
        self: &Arc<Self>,
        dev: &Device,
        state: Arc<Mutex<State>>,
        streams: usize,
        events: usize,
    ) -> Result<CudaStreams, KernelError> {
        let mut h = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or(Handles {
                streams: Vec::new(),
                events: Vec::new(),
                fork: None,
                joins: Vec::new(),
            });
        let err = |e: CudaError| KernelError::Device {
            message: format!("creating plan streams: {e}"),
        };
        let grown = (|| {
            while h.streams.len() < streams {
                h.streams.push(dev.stream_create()?);
            }
            while h.joins.len() < h.streams.len() {
                h.joins.push(dev.event_create()?);
            }
            while h.events.len() < events {
                h.events.push(dev.event_create()?);
            }
            if h.fork.is_none() {
                h.fork = Some(dev.event_create()?);
            }
            Ok(())
        })();
        let set = CudaStreams {
            dev: dev.clone(),
            handles: Some(h),
            pool: Arc::clone(self),
            state,
        };
        grown.map_err(err)?;
        Ok(set)
    }

    /// Destroy every idle set (when the op set goes away).
    pub(crate) fn destroy(&self, dev: &Device) {
        for h in self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            destroy(dev, h);
        }
    }
}

fn destroy(dev: &Device, h: Handles) {
    for s in h.streams {
        // SAFETY: created by this device and no longer referenced by any set.
        unsafe { dev.stream_destroy(s) };
    }
    for e in h.events.into_iter().chain(h.fork).chain(h.joins) {
        // SAFETY: as above.
        unsafe { dev.event_destroy(e) };
    }
}

/// One execution's streams and events, returned to the pool when dropped.
pub(crate) struct CudaStreams {
    dev: Device,
    handles: Option<Handles>,
    pool: Arc<StreamPool>,
    /// The op set's state: the join rewinds its parameter arena and drops its pending frees.
    state: Arc<Mutex<State>>,
}

impl CudaStreams {
    fn handles(&self) -> &Handles {
        self.handles.as_ref().expect("handles live until drop")
    }

    fn event(&self, event: usize) -> Result<u64, KernelError> {
        let h = self.handles();
        h.events
            .get(event)
            .copied()
            .ok_or_else(|| KernelError::Device {
                message: format!(
                    "plan event {event} does not exist (the execution asked for {})",
                    h.events.len()
                ),
            })
    }
}

fn run(what: &str, r: Result<(), CudaError>) -> Result<(), KernelError> {
    r.map_err(|e| KernelError::Device {
        message: format!("{what}: {e}"),
    })
}

impl DeviceStreams for CudaStreams {
    fn enter(&self, stream: usize) -> Result<(), KernelError> {
        let h = self.handles();
        let s = *h.streams.get(stream).ok_or_else(|| KernelError::Device {
            message: format!(
                "plan stream {stream} does not exist (the execution asked for {})",
                h.streams.len()
            ),
        })?;
        let fork = h.fork.filter(|_| self.dev.stream() == DEFAULT_STREAM);
        let Some(fork) = fork else {
            self.dev.set_stream(s);
            return Ok(());
        };
        // From the default stream: the plan stream's work must come after what was issued
        // there before (buffers zeroed or written on it). A non-blocking stream does not wait
        // for the legacy stream by itself, so on a GPU it could run first.
        run(
            "ordering a plan stream after the default stream",
            self.dev.event_record(fork),
        )?;
        self.dev.set_stream(s);
        run(
            "ordering a plan stream after the default stream",
            self.dev.wait_event(fork),
        )
    }

    fn record(&self, event: usize) -> Result<(), KernelError> {
        let e = self.event(event)?;
        run("recording a plan event", self.dev.event_record(e))
    }

    fn wait(&self, event: usize) -> Result<(), KernelError> {
        let e = self.event(event)?;
        run("waiting for a plan event", self.dev.wait_event(e))
    }

    fn wait_for_all(&self) -> Result<(), KernelError> {
        let h = self.handles();
        let here = self.dev.stream();
        for (&s, &e) in h.streams.iter().zip(&h.joins) {
            if s == here {
                continue;
            }
            // Recorded on stream s (which issues what s holds back for a graph first), waited
            // for on the calling thread's stream.
            self.dev.set_stream(s);
            let recorded = self.dev.event_record(e);
            self.dev.set_stream(here);
            run("waiting for every plan stream", recorded)?;
            run("waiting for every plan stream", self.dev.wait_event(e))?;
        }
        Ok(())
    }

    fn leave(&self) {
        self.dev.set_stream(DEFAULT_STREAM);
    }

    fn join(&self) -> Result<(), KernelError> {
        // Reads on plan streams wait for their stream only; here everything has finished, so
        // the op set's parameter arena can be rewound and its pending frees dropped.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        run(
            "finishing the plan streams",
            sync_and_drain(&self.dev, &mut st),
        )
    }
}

impl Drop for CudaStreams {
    fn drop(&mut self) {
        let Some(h) = self.handles.take() else {
            return;
        };
        // Only finished streams go back to the pool; if a stream cannot be finished, its
        // handles are destroyed (the driver finishes their work first).
        let finished = h
            .streams
            .iter()
            .all(|&s| self.dev.stream_synchronize(s).is_ok());
        if finished {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push(h);
        } else {
            destroy(&self.dev, h);
        }
    }
}
