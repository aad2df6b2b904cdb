//! The progress bar on stderr (indicatif): sessions done, failed sessions, output tokens per
//! second; then the solo replay. Hidden unless asked for and stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Progress of one run.
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    tokens: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    /// A bar over `sessions`, drawn only when `show` and stderr is a terminal.
    pub fn new(show: bool, sessions: usize) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(sessions as u64),
            if show && std::io::stderr().is_terminal() {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} sessions, {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        let p = Self {
            bar,
            start: Instant::now(),
            tokens: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        };
        p.update();
        p
    }

    fn update(&self) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!(
            "{} failed, {:.1} tok/s",
            self.failed.load(Ordering::Relaxed),
            self.tokens.load(Ordering::Relaxed) as f64 / secs
        ));
    }

    /// `n` more output tokens arrived.
    pub fn tokens(&self, n: u64) {
        self.tokens.fetch_add(n, Ordering::Relaxed);
        self.update();
    }

    /// A session ended.
    pub fn session_done(&self, failed: bool) {
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.bar.inc(1);
        self.update();
    }

    /// The solo replay of `requests` turns begins.
    pub fn start_replay(&self, requests: usize) {
        self.bar.set_position(0);
        self.bar.set_length(requests as u64);
        self.bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} turns replayed alone",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
    }

    /// One turn was replayed.
    pub fn replayed(&self) {
        self.bar.inc(1);
    }

    /// Remove the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
