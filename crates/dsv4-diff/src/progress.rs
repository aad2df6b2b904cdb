//! The progress bar of a long diff on stderr (indicatif): op cases done, or the model's forward
//! calls on each side, with what runs now. Drawn only when asked for and stderr is a terminal,
//! so pipes, `--json` consumers and tests see nothing.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Progress of one mode of a diff.
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `len` steps named `unit`, drawn only when `show` and stderr is a terminal.
    pub fn new(show: bool, len: usize, unit: &str) -> Self {
        let target = if show && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(len as u64), target);
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit}: {{msg}}"
            ))
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Self { bar }
    }

    /// Step `what` begins.
    pub fn start(&self, what: String) {
        self.bar.set_message(what);
    }

    /// The step that began is done.
    pub fn done(&self) {
        self.bar.inc(1);
    }

    #[cfg(test)]
    fn state(&self) -> (u64, String) {
        (self.bar.position(), self.bar.message())
    }
}

impl Drop for Progress {
    /// The bar leaves no line behind, also when the diff stops on an error.
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_advance_and_say_what_runs() {
        let p = Progress::new(true, 4, "forward calls");
        p.start("oracle prefill (64 tokens)".into());
        assert_eq!(p.state(), (0, "oracle prefill (64 tokens)".into()));
        p.done();
        p.start("candidate prefill (64 tokens)".into());
        p.done();
        assert_eq!(p.state(), (2, "candidate prefill (64 tokens)".into()));
    }
}
