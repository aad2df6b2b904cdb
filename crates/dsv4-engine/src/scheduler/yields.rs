//! The yield cap: at most so many running requests that yield ([`Request::yields`], the lines
//! of a server's batches). Lowering it preempts the latest admitted of them at the next
//! admission (cache freed, requeued, output unchanged), and while it is reached the waiting
//! ones are passed over; raising it lets them in again. A server lowers it when interactive
//! requests come, so the batch lines past their share pause at once instead of running to
//! their end beside them.

use super::Scheduler;
#[cfg(doc)]
use crate::request::Request;

impl Scheduler {
    /// Let at most `cap` requests that yield run (`usize::MAX`, the default: no cap; at least
    /// 1, so the loop never holds work it may not run). It takes effect at the next step.
    pub fn set_yield_cap(&mut self, cap: usize) {
        self.yield_cap = cap.max(1);
    }

    /// Running requests that yield.
    pub(super) fn yielding(&self) -> usize {
        self.running.iter().filter(|s| s.req.yields).count()
    }

    /// Preempt the latest admitted running requests that yield past the cap.
    pub(super) fn enforce_yield_cap(&mut self) {
        while self.yielding() > self.yield_cap {
            let latest = (0..self.running.len())
                .filter(|&i| self.running[i].req.yields)
                .max_by_key(|&i| self.running[i].admit_order)
                .expect("more yielding requests than the cap, so at least one");
            tracing::debug!(id = %self.running[latest].id, cap = self.yield_cap, "yielded");
            self.counters.yield_preemptions += 1;
            self.preempt(latest);
        }
    }
}
