//! The running slots batch lines may take ([`Share`]): a fixed number of lines in flight, and,
//! with `server.batch_fill_idle_ms`, every running slot once no interactive request has been in
//! flight for that long ([`Activity`]). When interactive requests come back, no further line
//! starts past the fixed number, and the lines past it pause in the engine ([`Share::track`]
//! sets its yield cap) until the slots are idle again.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Interactive generation requests (those that are not batch lines) in flight, and when the
/// last one ended.
#[derive(Debug)]
pub struct Activity {
    /// Requests in flight; when the count last fell to 0 (or the server started).
    state: Mutex<(usize, Instant)>,
    /// Wakes the lines waiting for an idle slot whenever the count changes.
    changed: Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            state: Mutex::new((0, Instant::now())),
            changed: Notify::new(),
        }
    }
}

impl Activity {
    /// Count an interactive request in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Interactive {
        self.lock().0 += 1;
        self.changed.notify_waiters();
        Interactive(Arc::clone(self))
    }

    /// Interactive requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().0
    }

    /// When the last interactive request ended (or the server started); `None` while one is in
    /// flight.
    pub fn quiet_since(&self) -> Option<Instant> {
        let (n, at) = *self.lock();
        (n == 0).then_some(at)
    }

    fn lock(&self) -> MutexGuard<'_, (usize, Instant)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counts one interactive request in flight while it lives.
#[derive(Debug)]
pub struct Interactive(Arc<Activity>);

impl Drop for Interactive {
    fn drop(&mut self) {
        {
            let mut s = self.0.lock();
            s.0 -= 1;
            if s.0 == 0 {
                s.1 = Instant::now();
            }
        }
        self.0.changed.notify_waiters();
    }
}

/// The lines of batches in flight together: one permit per line.
#[derive(Debug)]
pub struct Share {
    /// Lines that may always be in flight.
    lines: usize,
    permits: Arc<Semaphore>,
    /// The running slots past `lines` that lines may take while interactive requests are idle.
    fill: Option<Fill>,
}

/// How many times the configured idle time the idle time in force may grow to.
const MAX_BACKOFF: u32 = 32;

/// The idle running slots lines may fill, and when they are idle.
#[derive(Debug)]
struct Fill {
    extra: usize,
    permits: Arc<Semaphore>,
    /// The configured idle time (`server.batch_fill_idle_ms`), the least the wait may be.
    base: Duration,
    /// How long no interactive request must have been in flight now: doubled each time a fill
    /// ends sooner than that (traffic whose gaps are just past it would otherwise fill and
    /// pause the lines at every gap), halved back when a fill lasts four times as long.
    idle: Mutex<Duration>,
    activity: Arc<Activity>,
}

impl Fill {
    /// When lines may take these slots: the idle time after the last interactive request
    /// ended; `None` while one is in flight.
    fn at(&self) -> Option<Instant> {
        let idle = *self.idle.lock().unwrap_or_else(|p| p.into_inner());
        self.activity.quiet_since().map(|t| t + idle)
    }

    /// A fill that lasted `lasted` ended: adapt the idle time to the traffic.
    fn ended(&self, lasted: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let was = *idle;
        if lasted < was {
            *idle = (was * 2).min(self.base * MAX_BACKOFF);
        } else if lasted >= was * 4 {
            *idle = (was / 2).max(self.base);
        }
        if *idle != was {
            tracing::info!(
                lasted_ms = lasted.as_millis() as u64,
                idle_ms = idle.as_millis() as u64,
                "batch fill: idle time now {} ms (the last fill lasted {} ms)",
                idle.as_millis(),
                lasted.as_millis()
            );
        }
    }

    /// Whether lines may take these slots now.
    fn open(&self) -> bool {
        self.at().is_some_and(|at| at <= Instant::now())
    }
}

impl Share {
    /// At most `lines` lines in flight (at least 1).
    pub fn fixed(lines: usize) -> Self {
        let lines = lines.max(1);
        Self {
            lines,
            permits: Arc::new(Semaphore::new(lines)),
            fill: None,
        }
    }

    /// At most `lines` lines in flight (at least 1), and up to `slots` in all once no
    /// interactive request of `activity` has been in flight for `idle`.
    pub fn filling(lines: usize, slots: usize, idle: Duration, activity: Arc<Activity>) -> Self {
        let mut share = Self::fixed(lines);
        let extra = slots.saturating_sub(share.lines);
        if extra > 0 {
            share.fill = Some(Fill {
                extra,
                permits: Arc::new(Semaphore::new(extra)),
                base: idle,
                idle: Mutex::new(idle),
                activity,
            });
        }
        share
    }

    /// Lines in flight now.
    pub fn in_flight(&self) -> usize {
        let used = |n: usize, p: &Semaphore| n.saturating_sub(p.available_permits());
        used(self.lines, &self.permits)
            + self.fill.as_ref().map_or(0, |f| used(f.extra, &f.permits))
    }

    /// The idle time in force before lines may fill idle slots (it adapts to the traffic);
    /// `None` without idle slots to fill.
    pub fn fill_idle(&self) -> Option<Duration> {
        self.fill
            .as_ref()
            .map(|f| *f.idle.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The most lines that may be in flight now: the fixed number, or every running slot while
    /// interactive requests are idle.
    pub fn limit(&self) -> usize {
        match &self.fill {
            Some(f) if f.open() => self.lines + f.extra,
            _ => self.lines,
        }
    }

    /// Call `set` with [`Self::limit`] now and each time it changes, until `set` returns false
    /// (a server passes it to its engine's yield cap, so the lines past the fixed share pause
    /// at once when an interactive request comes), adapting the idle time to how long each
    /// fill lasted. Returns at once without idle slots.
    pub async fn track(&self, mut set: impl FnMut(usize) -> bool) {
        let Some(fill) = &self.fill else {
            return;
        };
        let (mut last, mut opened) = (None, None);
        loop {
            let changed = fill.activity.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let limit = self.limit();
            if last != Some(limit) {
                if limit > self.lines {
                    opened = Some(Instant::now());
                } else if let Some(at) = opened.take() {
                    fill.ended(at.elapsed());
                }
                if !set(limit) {
                    return;
                }
                last = Some(limit);
            }
            match fill.at() {
                Some(at) if at > Instant::now() => tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(at) => {}
                },
                _ => changed.await,
            }
        }
    }

    /// Wait until one more line may start; the permit holds its place until dropped.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        let Some(fill) = &self.fill else {
            return acquire(&self.permits).await;
        };
        loop {
            // Registered before the activity is read, so no change between the two is missed.
            let changed = fill.activity.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let idle_slot = async {
                match fill.at() {
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        acquire(&fill.permits).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                p = acquire(&self.permits) => return p,
                () = &mut changed => {}
                p = idle_slot => {
                    // An interactive request may have come while this waited for the permit.
                    if fill.open() {
                        return p;
                    }
                }
            }
        }
    }
}

/// A permit of `permits`, which is never closed.
async fn acquire(permits: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    permits
        .clone()
        .acquire_owned()
        .await
        .expect("the batch share's semaphores are never closed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    const IDLE: Duration = Duration::from_millis(500);

    /// Whether `f` is ready after the runtime has run everything else it can.
    async fn ready<T>(f: &mut std::pin::Pin<&mut impl Future<Output = T>>) -> Option<T> {
        tokio::task::yield_now().await;
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_share_holds_its_lines() {
        let share = Share::fixed(2);
        let (_a, _b) = (share.acquire().await, share.acquire().await);
        assert_eq!((share.in_flight(), share.limit()), (2, 2));
        tokio::time::advance(Duration::from_secs(60)).await;
        let mut third = pin!(share.acquire());
        assert!(ready(&mut third).await.is_none(), "a third line waits");
        drop(_a);
        assert!(ready(&mut third).await.is_some(), "a freed place is taken");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_slots_fill_only_after_the_idle_time_without_interactive_requests() {
        let activity = Arc::new(Activity::default());
        let share = Share::filling(1, 3, IDLE, activity.clone());
        let busy = activity.begin();
        let first = share.acquire().await;
        assert_eq!(share.limit(), 1);
        let mut second = pin!(share.acquire());
        tokio::time::advance(IDLE * 4).await;
        assert!(
            ready(&mut second).await.is_none(),
            "no idle slot while an interactive request runs"
        );
        drop(busy);
        tokio::time::advance(IDLE / 2).await;
        assert!(ready(&mut second).await.is_none(), "not idle long enough");
        tokio::time::advance(IDLE).await;
        let second = ready(&mut second).await.expect("an idle slot is taken");
        assert_eq!((share.in_flight(), share.limit()), (2, 3));
        let third = share.acquire().await;
        let mut fourth = pin!(share.acquire());
        assert!(ready(&mut fourth).await.is_none(), "every slot is taken");
        assert_eq!(share.in_flight(), 3);

        // An interactive request: the lines running go on, none starts past the fixed share.
        let busy = activity.begin();
        assert_eq!(share.limit(), 1);
        drop((second, third));
        tokio::time::advance(IDLE * 4).await;
        assert!(ready(&mut fourth).await.is_none(), "idle slots close");
        assert_eq!(share.in_flight(), 1);
        drop(first);
        assert!(
            ready(&mut fourth).await.is_some(),
            "the fixed share still runs"
        );
        drop(busy);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_arriving_during_the_wait_restarts_it() {
        let activity = Arc::new(Activity::default());
        let share = Share::filling(1, 2, IDLE, activity.clone());
        let _first = share.acquire().await;
        let mut second = pin!(share.acquire());
        tokio::time::advance(IDLE / 2).await;
        assert!(ready(&mut second).await.is_none());
        drop(activity.begin());
        tokio::time::advance(IDLE * 3 / 4).await;
        assert!(
            ready(&mut second).await.is_none(),
            "idle is counted from the last request's end"
        );
        tokio::time::advance(IDLE / 2).await;
        assert!(ready(&mut second).await.is_some());
        assert_eq!(activity.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn track_reports_each_change_of_the_limit_until_told_to_stop() {
        let activity = Arc::new(Activity::default());
        let share = Arc::new(Share::filling(2, 8, IDLE, activity.clone()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (share, seen) = (share.clone(), seen.clone());
            async move {
                share
                    .track(|limit| {
                        let mut seen = seen.lock().unwrap();
                        seen.push(limit);
                        seen.len() < 4
                    })
                    .await
            }
        });
        let seen = async || {
            tokio::task::yield_now().await;
            seen.lock().unwrap().clone()
        };
        assert_eq!(seen().await, [2], "not idle long enough at start");
        tokio::time::advance(IDLE).await;
        assert_eq!(seen().await, [2, 8]);
        // A fill that lasts keeps the idle time as it is.
        tokio::time::advance(IDLE * 4).await;
        let busy = activity.begin();
        assert_eq!(seen().await, [2, 8, 2]);
        tokio::time::advance(IDLE * 4).await;
        drop(busy);
        tokio::time::advance(IDLE / 2).await;
        assert_eq!(seen().await, [2, 8, 2], "the idle time counts from the end");
        tokio::time::advance(IDLE / 2).await;
        assert_eq!(seen().await, [2, 8, 2, 8]);
        task.await.unwrap();
        // Without idle slots there is nothing to track.
        Share::fixed(2)
            .track(|_| panic!("no limit to report"))
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_fill_cut_short_doubles_the_idle_time_and_a_long_one_halves_it() {
        let activity = Arc::new(Activity::default());
        let share = Arc::new(Share::filling(2, 8, IDLE, activity.clone()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn({
            let (share, seen) = (share.clone(), seen.clone());
            async move {
                share
                    .track(|limit| {
                        seen.lock().unwrap().push(limit);
                        true
                    })
                    .await
            }
        });
        let seen = async || {
            tokio::task::yield_now().await;
            seen.lock().unwrap().clone()
        };
        assert_eq!(seen().await, [2]);
        assert_eq!(share.fill_idle(), Some(IDLE));
        // Traffic whose gaps are just past the idle time: the first fill is cut short.
        tokio::time::advance(IDLE).await;
        assert_eq!(seen().await, [2, 8]);
        tokio::time::advance(IDLE / 5).await;
        drop(activity.begin());
        assert_eq!(seen().await, [2, 8, 2]);
        // So the next gap of the same length does not fill: the idle time is twice as long.
        assert_eq!(share.fill_idle(), Some(IDLE * 2));
        tokio::time::advance(IDLE * 6 / 5).await;
        assert_eq!(seen().await, [2, 8, 2], "no fill after one idle time");
        tokio::time::advance(IDLE * 4 / 5).await;
        assert_eq!(seen().await, [2, 8, 2, 8], "a fill after two");
        // A long quiet spell halves it back: one idle time is enough again.
        tokio::time::advance(IDLE * 8).await;
        drop(activity.begin());
        assert_eq!(seen().await, [2, 8, 2, 8, 2]);
        assert_eq!(share.fill_idle(), Some(IDLE));
        tokio::time::advance(IDLE).await;
        assert_eq!(seen().await, [2, 8, 2, 8, 2, 8]);
    }

    #[test]
    fn no_idle_slots_when_the_share_is_every_slot() {
        let share = Share::filling(4, 4, IDLE, Arc::default());
        assert!(share.fill.is_none());
        assert_eq!(share.fill_idle(), None);
        assert_eq!(share.limit(), 4);
        assert_eq!(Share::fixed(0).limit(), 1);
    }
}
