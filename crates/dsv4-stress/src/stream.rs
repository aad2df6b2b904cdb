//! Reading one streamed answer: a [`Pump`] feeds a response's server-sent events to its API's
//! accumulator, timing the tokens. On the Responses API the accumulator also keeps the
//! response's id and the last whole event's `sequence_number`, so a background stream can be
//! dropped after some tokens and resumed after that event on a new connection (a partly
//! received event is dropped with the old connection and comes again).

use crate::answer::Answer;
use crate::chat_answer::{Fed, StreamAccumulator, next_event};
use crate::client::error_chain;
use crate::options::Api;
use crate::responses::ResponsesAccumulator;
use futures_util::StreamExt;
use std::time::Instant;

/// The stream assembler of an API.
enum Accumulator {
    Chat(StreamAccumulator),
    Responses(ResponsesAccumulator),
}

impl Accumulator {
    fn new(api: Api) -> Self {
        match api {
            Api::Chat => Self::Chat(StreamAccumulator::default()),
            Api::Responses | Api::ResponsesBackground => {
                Self::Responses(ResponsesAccumulator::default())
            }
        }
    }

    fn answer(&mut self) -> &mut Answer {
        match self {
            Self::Chat(a) => &mut a.answer,
            Self::Responses(a) => &mut a.answer,
        }
    }

    fn feed(&mut self, data: &str) -> Result<Fed, (Option<String>, String)> {
        match self {
            Self::Chat(a) => a.feed(data),
            Self::Responses(a) => a.feed(data),
        }
    }

    fn finish(self) -> Result<Answer, String> {
        match self {
            Self::Chat(a) => a.finish(),
            Self::Responses(a) => a.finish(),
        }
    }
}

/// How reading one connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Pumped {
    /// The answer is complete ([`Pump::finish`]).
    Done,
    /// The asked number of tokens came; the connection was dropped.
    Cut,
    /// The connection ended before the answer did.
    Ended,
}

/// One streamed answer, read over one or more connections.
pub struct Pump {
    acc: Accumulator,
    start: Instant,
    last_token: Option<Instant>,
    tokens: usize,
}

impl Pump {
    /// An answer of `api` requested at `start`.
    pub fn new(api: Api, start: Instant) -> Self {
        Self {
            acc: Accumulator::new(api),
            start,
            last_token: None,
            tokens: 0,
        }
    }

    /// The response's id (the Responses API, once an event named it).
    pub fn id(&self) -> Option<&str> {
        match &self.acc {
            Accumulator::Responses(a) => a.id.as_deref(),
            Accumulator::Chat(_) => None,
        }
    }

    /// The `sequence_number` of the last whole event read (the Responses API).
    pub fn last_seq(&self) -> Option<u64> {
        match &self.acc {
            Accumulator::Responses(a) => a.last_seq,
            Accumulator::Chat(_) => None,
        }
    }

    /// Read `resp` until the answer is complete, the connection ends, or (with `cut`) the
    /// `cut`-th token of the answer came, whichever is first. Errors are `(type, message)`.
    pub async fn pump(
        &mut self,
        resp: reqwest::Response,
        cut: Option<usize>,
    ) -> Result<Pumped, (Option<String>, String)> {
        let mut bytes = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(piece) = bytes.next().await {
            let piece = piece.map_err(|e| (None, error_chain(&e)))?;
            buf.extend_from_slice(&piece);
            while let Some((event, used)) = next_event(&buf).map_err(|m| (None, m))? {
                buf.drain(..used);
                let now = Instant::now();
                match self.acc.feed(&event)? {
                    Fed::Done => return Ok(Pumped::Done),
                    Fed::Token => {
                        let answer = self.acc.answer();
                        match self.last_token {
                            None => answer.ttft = Some((now - self.start).as_secs_f64()),
                            Some(t) => answer.itl.push((now - t).as_secs_f64()),
                        }
                        self.last_token = Some(now);
                        self.tokens += 1;
                        if cut == Some(self.tokens) {
                            return Ok(Pumped::Cut);
                        }
                    }
                    Fed::Other => {}
                }
            }
        }
        Ok(Pumped::Ended)
    }

    /// The assembled answer (after [`Pumped::Done`]).
    pub fn finish(self) -> Result<Answer, String> {
        self.acc.finish()
    }
}
