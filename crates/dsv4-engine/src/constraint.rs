//! Grammar-constrained decoding hook. A [`Constraint`] on a [`crate::Request`] restricts which
//! tokens the request may generate: when the request is queued the engine asks the
//! [`TokenConstraint`] for a fresh [`ConstraintState`]; before each token is chosen the state
//! masks the logits row (disallowed tokens become −∞, which the sampler never draws), and after
//! it is chosen the state advances past it. A failing state ends the request with an error.
//! The engine knows nothing about grammars; a server plugs in e.g. an llguidance matcher.

use std::fmt;
use std::sync::Arc;

/// Builds the per-request state of a token constraint (shared, immutable; Send + Sync).
pub trait TokenConstraint: Send + Sync {
    /// A fresh state for one request, positioned before its first generated token.
    fn start(&self) -> Box<dyn ConstraintState>;
}

/// The state of one request's constraint, owned by the engine while the request runs.
pub trait ConstraintState: Send {
    /// Set the logits of the tokens that may not come next to −∞ (`logits` covers the model's
    /// vocabulary); an error ends the request with the message.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;

    /// Advance past `token`, the one chosen from the masked row (the end-of-sequence token that
    /// ends a request is not passed); an error ends the request with the message.
    fn advance(&mut self, token: u32) -> Result<(), String>;
}

/// A shared [`TokenConstraint`]; requests compare equal when they share the same one.
#[derive(Clone)]
pub struct Constraint(pub Arc<dyn TokenConstraint>);

impl Constraint {
    /// Wrap a constraint.
    pub fn new(c: impl TokenConstraint + 'static) -> Self {
        Self(Arc::new(c))
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint(..)")
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How the error of a request whose token constraint failed starts (the rest says why), so
/// that a server can tell a constraint the request gave from a failure of the engine.
pub const CONSTRAINT_FAILED: &str = "token constraint: ";

/// Mask `row` with `state` and check that some token is left.
pub(crate) fn apply(state: &mut dyn ConstraintState, row: &[f32]) -> Result<Vec<f32>, String> {
    let mut masked = row.to_vec();
    state.mask(&mut masked)?;
    if !masked.iter().any(|v| *v > f32::NEG_INFINITY) {
        return Err("the token constraint allows no next token".into());
    }
    Ok(masked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig, Event, FinishReason, Request, SamplingParams, Scheduler};
    use dsv4_backend_reference::ReferenceBackend;
    use dsv4_core::Numerics;
    use dsv4_model::{Model, ModelSource, load_model};
    use std::sync::Mutex;

    fn model() -> Arc<Model> {
        Arc::new(
            load_model(
                &ModelSource::Tiny { seed: 0 },
                Arc::new(ReferenceBackend),
                Numerics::default(),
            )
            .unwrap(),
        )
    }

    /// Allows exactly `script` (then only EOS); records what it was advanced with.
    struct Script {
        script: Vec<u32>,
        eos: u32,
        seen: Arc<Mutex<Vec<u32>>>,
    }

    struct ScriptState {
        script: Vec<u32>,
        eos: u32,
        at: usize,
        seen: Arc<Mutex<Vec<u32>>>,
    }

    impl TokenConstraint for Script {
        fn start(&self) -> Box<dyn ConstraintState> {
            Box::new(ScriptState {
                script: self.script.clone(),
                eos: self.eos,
                at: 0,
                seen: Arc::clone(&self.seen),
            })
        }
    }

    impl ConstraintState for ScriptState {
        fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
            let want = self.script.get(self.at).copied().unwrap_or(self.eos);
            if want == u32::MAX {
                return Err("scripted failure".into());
            }
            for (i, v) in logits.iter_mut().enumerate() {
                if i as u32 != want {
                    *v = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }

        fn advance(&mut self, token: u32) -> Result<(), String> {
            self.seen.lock().unwrap().push(token);
            self.at += 1;
            Ok(())
        }
    }

    fn scripted(script: Vec<u32>, eos: u32, seen: &Arc<Mutex<Vec<u32>>>) -> Option<Constraint> {
        Some(Constraint::new(Script {
            script,
            eos,
            seen: Arc::clone(seen),
        }))
    }

    #[test]
    fn a_constraint_decides_every_token_even_when_sampling() {
        let m = model();
        let eos = m.cfg.eos_token_id;
        let mut s = Scheduler::new(Arc::clone(&m), EngineConfig::default(), None).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = vec![200, 131, 250, 131];
        let stream = s
            .submit(Request {
                prompt: vec![0, 140, 141],
                max_tokens: 10,
                sampling: SamplingParams {
                    temperature: 1.5,
                    seed: 9,
                    ..Default::default()
                },
                constraint: scripted(script.clone(), eos, &seen),
                ..Default::default()
            })
            .unwrap();
        while s.step() {}
        let c = stream.collect_blocking();
        assert_eq!(c.tokens, script);
        assert_eq!(c.finished.reason, FinishReason::Eos);
        assert_eq!(
            *seen.lock().unwrap(),
            script,
            "EOS is not passed to advance"
        );
    }

    #[test]
    fn a_failing_constraint_ends_only_its_request_with_the_message() {
        let m = model();
        let mut s = Scheduler::new(Arc::clone(&m), EngineConfig::default(), None).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let bad = s
            .submit(Request {
                prompt: vec![0, 140],
                max_tokens: 5,
                constraint: scripted(vec![150, u32::MAX], m.cfg.eos_token_id, &seen),
                ..Default::default()
            })
            .unwrap();
        let good = s
            .submit(Request {
                prompt: vec![0, 140],
                max_tokens: 3,
                ignore_eos: true,
                ..Default::default()
            })
            .unwrap();
        while s.step() {}
        let (bad, good) = (bad.collect_blocking(), good.collect_blocking());
        assert_eq!(bad.tokens, vec![150]);
        assert_eq!(bad.finished.reason, FinishReason::Error);
        let e = bad.finished.error.unwrap();
        assert!(e.contains("scripted failure"), "{e}");
        assert_eq!(good.tokens.len(), 3);
        assert!(s.pools().all_free());
    }

    #[test]
    fn a_stalled_loop_makes_no_progress_until_released() {
        let engine = Engine::spawn(model(), EngineConfig::default()).unwrap();
        let guard = engine.stall();
        let steps = engine.metrics().steps_total;
        let mut stream = engine
            .submit(Request {
                prompt: vec![0, 140],
                max_tokens: 2,
                ignore_eos: true,
                ..Default::default()
            })
            .unwrap();
        // The stall is queued before the request, so the request cannot run before release.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let m = engine.metrics();
        assert_eq!(m.steps_total, steps);
        assert_eq!(m.requests_finished, 0);
        drop(guard);
        let mut tokens = 0;
        while let Some(ev) = stream.blocking_next() {
            match ev {
                Event::Prompt(_) => {}
                Event::Token(_) => tokens += 1,
                Event::Finished(f) => {
                    assert_eq!(f.reason, FinishReason::Length);
                    break;
                }
            }
        }
        assert_eq!(tokens, 2);
        assert!(engine.metrics().steps_total > steps);
    }
}
