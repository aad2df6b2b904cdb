//! The overlap scheduler's "device": a worker thread that runs launched steps one at a time, in
//! launch order, while the scheduler thread prepares the next one. A step's inputs that are the
//! previous step's sampled tokens are [`Slot::Future`] placeholders; the worker resolves them
//! from its future map (filled by the previous step's sampling) before the forward reads them,
//! then samples the step's own rows and publishes those tokens as the next futures.

use crate::error::EngineError;
use crate::request::{RequestId, SamplingParams, TokenLogprob};
use crate::sampler::{Choice, ChoiceJob, SamplerState, choose_all};
use crate::sequence::{PromptRows, last_row, logit_rows};
use dsv4_model::forward::{StepReport, Taps};
use dsv4_model::{ForwardError, LogitRows, Model, SequenceState, StepOutputs};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// Names a token that a launched step will sample (valid for the next step only).
pub(crate) type FutureId = u64;

/// One input token of a launched step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Known when the step was prepared.
    Known(u32),
    /// Sampled by the previous step; resolved on the worker through the future map.
    Future(FutureId),
}

/// What a member needs to choose its next token on the worker.
pub(crate) struct Sampler {
    pub params: SamplingParams,
    /// The request's sampling state, away from its `Seq` until the step comes back.
    pub state: SamplerState,
    /// (end-of-sequence id, ignore it).
    pub eos: (u32, bool),
    /// Alternatives with the token's log-probability (None: no log-probability).
    pub logprobs: Option<usize>,
    /// Tokens whose log-probabilities come with the token's (`logprob_token_ids`).
    pub token_ids: Vec<u32>,
    /// Send the logits row back (`return_logits`).
    pub keep_row: bool,
    /// Where the chosen token is published.
    pub future: FutureId,
}

/// One request's part of a launched step.
pub(crate) struct Member {
    pub id: RequestId,
    pub state: SequenceState,
    pub slots: Vec<Slot>,
    /// Present when the step's last row is sampled.
    pub sampler: Option<Sampler>,
    /// Rows that score prompt tokens (`prompt_logprobs`).
    pub prompt: Option<PromptRows>,
}

/// A launched step.
pub(crate) struct Job {
    pub step: u64,
    pub members: Vec<Member>,
}

/// One member after its step: its state and sampler handed back, the token chosen (or the
/// constraint's error) with its log-probability, and the logits row it was chosen from when
/// the request wants it.
pub(crate) struct MemberDone {
    pub id: RequestId,
    pub state: SequenceState,
    pub sampler: Option<Sampler>,
    /// Tokens the member ran.
    pub rows: usize,
    pub choice: Option<Choice>,
    pub row: Vec<f32>,
    /// The prompt entries scored: (first prompt position, entries).
    pub prompt: Option<(usize, Vec<TokenLogprob>)>,
}

/// A finished step.
pub(crate) struct Done {
    pub step: u64,
    pub members: Vec<MemberDone>,
    pub result: Result<StepReport, ForwardError>,
    /// How long the worker sat idle waiting for this step after finishing the previous one
    /// (scheduling time not hidden behind execution), ms; 0 for the first step.
    pub idle_ms: f64,
    /// The forward and sampling time, ms.
    pub run_ms: f64,
}

/// The worker thread and its channels.
pub(crate) struct Device {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    /// Start the worker for `model`; `choice_threads` as [`crate::EngineConfig`]'s.
    pub fn spawn(model: Arc<Model>, choice_threads: usize) -> Result<Self, EngineError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("dsv4-device".into())
            .spawn(move || work(&model, choice_threads, &rx, &tx))
            .map_err(EngineError::Spawn)?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Queue a step behind the one running; the job comes back when the worker is gone.
    pub fn launch(&self, job: Job) -> Result<(), Box<Job>> {
        match &self.jobs {
            Some(tx) => tx.send(job).map_err(|e| Box::new(e.0)),
            None => Err(Box::new(job)),
        }
    }

    /// The oldest launched step's results (None when the worker is gone).
    pub fn wait(&self) -> Option<Done> {
        self.done.recv().ok()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the overlap scheduler's device thread panicked");
        }
    }
}

/// The worker loop: resolve, run, sample, publish, report.
fn work(model: &Model, choice_threads: usize, jobs: &Receiver<Job>, done: &Sender<Done>) {
    let mut futures: HashMap<FutureId, u32> = HashMap::new();
    let mut last: Option<Instant> = None;
    while let Ok(job) = jobs.recv() {
        let idle_ms = last.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let t0 = Instant::now();
        let out = run(model, choice_threads, job, &mut futures);
        let d = Done {
            idle_ms,
            run_ms: t0.elapsed().as_secs_f64() * 1e3,
            ..out
        };
        last = Some(Instant::now());
        if done.send(d).is_err() {
            return;
        }
    }
}

/// Run one job: futures are consumed by the step after the one that made them, so the map is
/// emptied once they are resolved and refilled with this step's tokens.
fn run(
    model: &Model,
    choice_threads: usize,
    job: Job,
    futures: &mut HashMap<FutureId, u32>,
) -> Done {
    let Job { step, mut members } = job;
    let mut tokens: Vec<Vec<u32>> = Vec::with_capacity(members.len());
    let mut unresolved = None;
    for m in &members {
        let t: Vec<u32> = m
            .slots
            .iter()
            .map(|s| match *s {
                Slot::Known(t) => t,
                Slot::Future(f) => futures.get(&f).copied().unwrap_or_else(|| {
                    unresolved = Some(f);
                    0
                }),
            })
            .collect();
        tokens.push(t);
    }
    futures.clear();
    let result = match unresolved {
        Some(f) => Err(ForwardError::Plan {
            message: format!(
                "overlap scheduler: future token {f} was never sampled (its step failed)"
            ),
        }),
        None => {
            let toks: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
            let want: Vec<usize> = members
                .iter()
                .zip(&toks)
                .map(|(m, t)| logit_rows(t.len(), m.prompt.as_ref(), m.sampler.is_some()))
                .collect();
            let mut states: Vec<&mut SequenceState> =
                members.iter_mut().map(|m| &mut m.state).collect();
            model.forward_step(
                &mut states,
                &toks,
                StepOutputs {
                    logits: LogitRows::Last(&want),
                    residual: false,
                },
                model.exec(),
                &mut Taps::none(),
            )
        }
    };
    let (outs, result) = match result {
        Ok((outs, report)) => (Some(outs), Ok(report)),
        Err(e) => (None, Err(e)),
    };
    let outs = outs.unwrap_or_default();
    // Prompt entries, then every sampled member's token (chosen in parallel).
    let prompts: Vec<Option<(usize, Vec<TokenLogprob>)>> = members
        .iter_mut()
        .zip(&outs)
        .map(|(m, o)| {
            let rows = m.prompt.take()?;
            Some((rows.first, rows.score(&o.logits, o.vocab, choice_threads)))
        })
        .collect();
    let last_row = |k: usize| last_row(&outs[k].logits, outs[k].vocab);
    let count = members.len();
    let mut choices: Vec<Option<Choice>> = {
        let mut jobs = Vec::new();
        let mut at = Vec::new();
        for (k, m) in members.iter_mut().enumerate().take(outs.len()) {
            if let Some(s) = m.sampler.as_mut() {
                at.push(k);
                jobs.push(ChoiceJob {
                    state: &mut s.state,
                    params: &s.params,
                    eos: s.eos,
                    logprobs: s.logprobs,
                    token_ids: &s.token_ids,
                    row: last_row(k),
                    out: None,
                });
            }
        }
        choose_all(&mut jobs, choice_threads);
        let mut choices = vec![None; count];
        for (k, j) in at.into_iter().zip(jobs) {
            choices[k] = j.out;
        }
        choices
    };
    let mut out_members = Vec::with_capacity(members.len());
    let mut prompts = prompts.into_iter();
    for (k, (m, t)) in members.into_iter().zip(&tokens).enumerate() {
        let Member {
            id, state, sampler, ..
        } = m;
        let choice = choices[k].take();
        if let (Some(s), Some(Choice { token: Ok(tok), .. })) = (&sampler, &choice) {
            futures.insert(s.future, *tok);
        }
        let row = match &sampler {
            Some(s) if s.keep_row && choice.is_some() => last_row(k).to_vec(),
            _ => Vec::new(),
        };
        out_members.push(MemberDone {
            id,
            state,
            sampler,
            rows: t.len(),
            choice,
            row,
            prompt: prompts.next().flatten(),
        });
    }
    Done {
        step,
        members: out_members,
        result,
        idle_ms: 0.0,
        run_ms: 0.0,
    }
}
