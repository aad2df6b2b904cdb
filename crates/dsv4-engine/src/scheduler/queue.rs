//! Load shedding at the queue, as SGLang's `--max-queued-requests` does it under priority
//! scheduling: a request with a [`Request::queue_limit`] is refused when that many requests
//! already wait for a running slot, unless a waiting request of lower priority gives up its
//! place. Only a request that has a limit itself and was never admitted gives way (a batch
//! line has none; a preempted request has already streamed). Among those, the one admission
//! would take last goes: the lowest priority, the latest of its priority.

use super::Scheduler;
use crate::request::{FinishReason, Request};
use crate::sequence::Seq;
use tokio::sync::oneshot;

/// The start of the error message of a request refused at a full queue
/// ([`Request::queue_limit`]).
pub const QUEUE_FULL: &str = "queue full: ";

/// The channel that tells a request with a queue limit that it was queued: the engine's end
/// and the stream's end; none without a limit.
pub(crate) fn queued_channel(
    req: &Request,
) -> (Option<oneshot::Sender<()>>, Option<oneshot::Receiver<()>>) {
    match req.queue_limit {
        Some(_) => {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    }
}

impl Scheduler {
    /// Requests that wait for a running slot and do not yield ([`Request::yields`]): those
    /// queued, less the slots free now (the next admission fills them first).
    pub fn queued(&self) -> usize {
        let free = self
            .cfg
            .max_running_requests
            .saturating_sub(self.running.len());
        let waiting = self.waiting.iter().filter(|s| !s.req.yields).count();
        waiting.saturating_sub(free)
    }

    /// Make room for `seq` under its queue limit: Ok when it may queue (a waiting request of
    /// lower priority may have been refused for it); the refusal's message when it may not.
    pub(super) fn make_room(&mut self, seq: &Seq) -> Result<(), String> {
        let Some(limit) = seq.req.queue_limit else {
            return Ok(());
        };
        let queued = self.queued();
        if queued < limit {
            return Ok(());
        }
        self.counters.queue_refusals += 1;
        let gives_way = self
            .waiting
            .iter()
            .rposition(|s| s.req.queue_limit.is_some() && s.admitted.is_none())
            .filter(|&i| self.waiting[i].req.priority < seq.req.priority);
        let Some(i) = gives_way else {
            return Err(format!(
                "{QUEUE_FULL}{queued} requests wait for a running slot; the limit is {limit}"
            ));
        };
        let out = self.waiting.remove(i).expect("index from rposition");
        self.counters.queue_displacements += 1;
        let why = format!(
            "{QUEUE_FULL}a request of higher priority ({}, this one {}) took its place among the \
             {queued} waiting for a running slot; the limit is {limit}",
            seq.req.priority, out.req.priority
        );
        self.retire(out, FinishReason::Error, Some(why));
        self.settle();
        Ok(())
    }
}
