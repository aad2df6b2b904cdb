//! [`Metrics`]: latency and throughput with the names and semantics of vLLM's `bench serve`
//! (`vllm/benchmarks/serve.py`): TTFT, TPOT, ITL and E2EL as mean / median / std / p90 / p99 in
//! milliseconds (percentiles interpolated linearly, as `numpy.percentile`; 0 when there is no
//! sample, as vLLM), throughputs over the run's duration.
//!
//! Differences from vLLM, which always streams: TTFT, TPOT and ITL come from streamed requests
//! only (a non-streamed answer has no first token to time), E2EL from all. TTFT is measured to
//! the first chunk that carries text, reasoning or a tool call (not the role-only first chunk).

use crate::answer::Answer;
use serde::{Deserialize, Serialize};

/// The vLLM-named metrics of one run (serialised flat into the report's top level).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the names are vLLM's; see the module doc for their meaning
pub struct Metrics {
    /// Seconds of the concurrent phase (the solo replay is not counted).
    pub duration: f64,
    /// Prompt tokens of the completed requests.
    pub total_input_tokens: u64,
    /// Output tokens of the completed requests.
    pub total_output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Input plus output tokens per second.
    pub total_token_throughput: f64,
    /// Sessions (hence requests) in flight at most.
    pub max_concurrency: usize,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub std_ttft_ms: f64,
    pub p90_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub std_tpot_ms: f64,
    pub p90_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub std_itl_ms: f64,
    pub p90_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub mean_e2el_ms: f64,
    pub median_e2el_ms: f64,
    pub std_e2el_ms: f64,
    pub p90_e2el_ms: f64,
    pub p99_e2el_ms: f64,
}

/// Linear-interpolation percentile (`numpy.percentile`'s default) of sorted samples.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let pos = q / 100.0 * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// mean, median, population std, p90, p99 of samples in seconds, in milliseconds.
fn summary(mut xs: Vec<f64>) -> [f64; 5] {
    if xs.is_empty() {
        return [0.0; 5];
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    [
        mean,
        percentile(&xs, 50.0),
        var.sqrt(),
        percentile(&xs, 90.0),
        percentile(&xs, 99.0),
    ]
    .map(|s| s * 1000.0)
}

impl Metrics {
    /// The metrics of the completed answers of a run that took `duration` seconds with at most
    /// `max_concurrency` sessions at once.
    pub fn compute<'a>(
        answers: impl IntoIterator<Item = &'a Answer>,
        duration: f64,
        max_concurrency: usize,
    ) -> Self {
        let (mut ttft, mut tpot, mut itl, mut e2el) = (vec![], vec![], vec![], vec![]);
        let (mut input, mut output, mut completed) = (0u64, 0u64, 0usize);
        for a in answers {
            completed += 1;
            input += a.prompt_tokens.unwrap_or(0);
            let out = a.output_tokens();
            output += out;
            e2el.push(a.e2el);
            if let Some(t) = a.ttft {
                ttft.push(t);
                if out > 1 {
                    tpot.push((a.e2el - t) / (out - 1) as f64);
                }
                itl.extend_from_slice(&a.itl);
            }
        }
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let [
            mean_ttft_ms,
            median_ttft_ms,
            std_ttft_ms,
            p90_ttft_ms,
            p99_ttft_ms,
        ] = summary(ttft);
        let [
            mean_tpot_ms,
            median_tpot_ms,
            std_tpot_ms,
            p90_tpot_ms,
            p99_tpot_ms,
        ] = summary(tpot);
        let [
            mean_itl_ms,
            median_itl_ms,
            std_itl_ms,
            p90_itl_ms,
            p99_itl_ms,
        ] = summary(itl);
        let [
            mean_e2el_ms,
            median_e2el_ms,
            std_e2el_ms,
            p90_e2el_ms,
            p99_e2el_ms,
        ] = summary(e2el);
        Self {
            duration,
            total_input_tokens: input,
            total_output_tokens: output,
            request_throughput: per_s(completed as f64),
            output_throughput: per_s(output as f64),
            total_token_throughput: per_s((input + output) as f64),
            max_concurrency,
            mean_ttft_ms,
            median_ttft_ms,
            std_ttft_ms,
            p90_ttft_ms,
            p99_ttft_ms,
            mean_tpot_ms,
            median_tpot_ms,
            std_tpot_ms,
            p90_tpot_ms,
            p99_tpot_ms,
            mean_itl_ms,
            median_itl_ms,
            std_itl_ms,
            p90_itl_ms,
            p99_itl_ms,
            mean_e2el_ms,
            median_e2el_ms,
            std_e2el_ms,
            p90_e2el_ms,
            p99_e2el_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&xs, 50.0), 2.5);
        assert!((percentile(&xs, 90.0) - 3.7).abs() < 1e-12);
        assert!((percentile(&xs, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn vllm_definitions_of_ttft_tpot_itl_e2el_and_throughput() {
        let streamed = Answer {
            stream: true,
            prompt_tokens: Some(10),
            completion_tokens: Some(5),
            ttft: Some(0.1),
            itl: vec![0.05, 0.05, 0.1, 0.2],
            e2el: 0.5,
            ..Default::default()
        };
        let plain = Answer {
            prompt_tokens: Some(20),
            completion_tokens: Some(3),
            e2el: 0.3,
            ..Default::default()
        };
        let m = Metrics::compute([&streamed, &plain], 2.0, 2);
        assert_eq!(m.total_input_tokens, 30);
        assert_eq!(m.total_output_tokens, 8);
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(m.output_throughput, 4.0);
        assert_eq!(m.total_token_throughput, 19.0);
        assert!(
            (m.mean_ttft_ms - 100.0).abs() < 1e-9,
            "only streamed requests have a TTFT"
        );
        // TPOT = (e2el - ttft) / (output - 1) = 0.4 / 4.
        assert!((m.mean_tpot_ms - 100.0).abs() < 1e-9);
        assert!((m.median_itl_ms - 75.0).abs() < 1e-9);
        assert!((m.mean_e2el_ms - 400.0).abs() < 1e-9);
        assert!((m.std_e2el_ms - 100.0).abs() < 1e-9);
        let empty = Metrics::compute([], 0.0, 0);
        assert_eq!(empty.mean_ttft_ms, 0.0);
        assert_eq!(empty.request_throughput, 0.0);
    }
}
