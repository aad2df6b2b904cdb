//! Which decode kernel shape to pin on this GPU, read from the bench's timings of every
//! compiled shape (`decode_shapes`). The H200 runs of 2026-12-04 (docs/performance.md) showed
//! why a rule is needed: a shape that wins one case can lose another (MXFP4 `c2w8` with f32
//! sums ran the single expert 1.22x and the grouped experts, which the model runs, 0.90x the
//! default's speed). So a shape is suggested only where its slowest case beats the backend's
//! shape by [`MARGIN`]: of the shapes, the one whose smallest speedup over the format's cases is
//! largest (maximin), kept only when that speedup is at least the margin.

use super::ShapeTiming;
use crate::ops::decode_shape::format_key;
use crate::{DecodeShape, DecodeShapes};
use dsv4_kernels::WeightFormat;
use serde::Serialize;

/// How much faster than the backend's shape, in every case of its format, another shape must
/// run to be suggested: a smaller gain is not worth pinning. It is not above the noise of one
/// run: the same unchanged kernel (the bf16 head GEMV, f32 sums) timed 3% apart in the H200's
/// two runs of 2026-12-04, so a suggestion close to the margin wants a second run to agree.
pub const MARGIN: f64 = 1.02;

/// The shape suggested for one weight format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeChoice {
    /// The format's `backend.cuda_decode` key (`fp8`, `mxfp4`).
    pub format: String,
    /// The shape the backend ran (`c2w8`).
    pub current: String,
    /// The suggested shape: the current one unless another beat it by [`MARGIN`] in every case.
    pub shape: String,
    /// The suggested shape's smallest speedup over the current one across the format's cases
    /// (1 when it is the current one).
    pub worst_speedup: f64,
    /// The best other shape, whether or not it reached the margin (none when only the current
    /// shape was timed).
    pub runner_up: Option<RunnerUp>,
    /// Decode cases of the format the choice rests on.
    pub cases: usize,
}

/// The best shape other than the backend's, for one format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunnerUp {
    /// The shape (`c2w8p2`).
    pub shape: String,
    /// Its smallest speedup over the backend's shape across the format's cases.
    pub worst_speedup: f64,
}

/// The bench's suggestion: the `backend.cuda_decode` value with each timed format's choice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeSuggestion {
    /// What to pin in a profile (`backend.cuda_decode`) or `DSV4_CUDA_DECODE`: the backend's
    /// shapes with each format's suggested one; [`DecodeShapes::parse`] reads it back.
    pub cuda_decode: String,
    /// Whether any format's suggestion differs from the shape the backend ran.
    pub changed: bool,
    /// One choice per timed format, fp8 first.
    pub formats: Vec<ShapeChoice>,
}

/// The suggestion from `rows` (the bench's `decode_shapes`; `selected` the shapes the backend
/// ran). None when no format has timings of more than one shape. A shape missing from some case
/// of its format, whose speedups are not finite and positive, or that this build does not
/// compile, is not a candidate.
pub fn suggest(rows: &[ShapeTiming], selected: DecodeShapes) -> Option<DecodeSuggestion> {
    let mut shapes = selected;
    let mut formats = Vec::new();
    for format in [WeightFormat::Fp8Block, WeightFormat::Mxfp4] {
        let key = format_key(format);
        let mine: Vec<&ShapeTiming> = rows.iter().filter(|r| r.format == key).collect();
        let mut cases: Vec<&str> = Vec::new();
        for r in &mine {
            if !cases.contains(&r.case.as_str()) {
                cases.push(&r.case);
            }
        }
        let current = selected.of(format).name();
        // Each shape's smallest speedup over the cases, in the order the bench timed them.
        let mut worst: Vec<(String, f64)> = Vec::new();
        for r in &mine {
            if worst.iter().any(|(s, _)| *s == r.shape) {
                continue;
            }
            let own: Vec<f64> = mine
                .iter()
                .filter(|o| o.shape == r.shape)
                .map(|o| o.speedup)
                .collect();
            let runnable = DecodeShape::parse(&r.shape).and_then(|s| selected.with(format, s));
            if runnable.is_ok()
                && own.len() == cases.len()
                && own.iter().all(|x| x.is_finite() && *x > 0.0)
            {
                worst.push((
                    r.shape.clone(),
                    own.into_iter().fold(f64::INFINITY, f64::min),
                ));
            }
        }
        let Some(best) = worst
            .iter()
            .filter(|(s, _)| *s != current)
            .max_by(|a, b| a.1.total_cmp(&b.1))
        else {
            continue;
        };
        let (shape, worst_speedup) = if best.1 >= MARGIN {
            best.clone()
        } else {
            (current.clone(), 1.0)
        };
        let runner_up = Some(RunnerUp {
            shape: best.0.clone(),
            worst_speedup: best.1,
        });
        if let Ok(next) = DecodeShape::parse(&shape).and_then(|s| shapes.with(format, s)) {
            shapes = next;
        }
        formats.push(ShapeChoice {
            format: key.to_string(),
            current,
            shape,
            worst_speedup,
            runner_up,
            cases: cases.len(),
        });
    }
    if formats.is_empty() {
        return None;
    }
    Some(DecodeSuggestion {
        cuda_decode: shapes.describe(),
        changed: formats.iter().any(|f| f.shape != f.current),
        formats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(format: &str, case: &str, shape: &str, selected: bool, speedup: f64) -> ShapeTiming {
        ShapeTiming {
            case: case.to_string(),
            format: format.to_string(),
            shape: shape.to_string(),
            selected,
            seconds: 1e-5 / speedup,
            of_copy_bandwidth: 0.3 * speedup,
            speedup,
        }
    }

    /// The H200's timings of 2026-12-04 with f32 sums (docs/performance.md), the backend on
    /// the old defaults (fp8 c2w4, MXFP4 c4w4), for the shapes compiled then (MXFP4 c4w4 had an
    /// 8-warp sibling c4w8, no longer compiled).
    fn h200_f32() -> Vec<ShapeTiming> {
        let mut rows = Vec::new();
        for (case, speeds) in [
            ("fp8 4096x4096", [1.00, 1.07, 0.86, 1.07]),
            ("fp8 wq_b", [1.00, 1.03, 0.94, 0.87]),
        ] {
            for (shape, s) in ["c2w4", "c2w8", "c4w4", "c1w8"].into_iter().zip(speeds) {
                rows.push(row("fp8", case, shape, shape == "c2w4", s));
            }
        }
        for (case, speeds) in [
            ("mxfp4 expert", [0.89, 1.00, 1.19, 1.22]),
            ("mxfp4 grouped", [1.00, 1.00, 0.91, 0.90]),
        ] {
            for (shape, s) in ["c4w8", "c4w4", "c2w4", "c2w8"].into_iter().zip(speeds) {
                rows.push(row("mxfp4", case, shape, shape == "c4w4", s));
            }
        }
        rows
    }

    fn runner(shape: &str, worst_speedup: f64) -> RunnerUp {
        RunnerUp {
            shape: shape.to_string(),
            worst_speedup,
        }
    }

    fn old_defaults() -> DecodeShapes {
        DecodeShapes::parse("fp8=c2w4").unwrap()
    }

    #[test]
    fn a_shape_faster_in_every_case_is_suggested_and_one_that_loses_a_case_is_not() {
        let s = suggest(&h200_f32(), old_defaults()).unwrap();
        // fp8 c2w8 won both cases (1.07x, 1.03x), as the team concluded by hand; MXFP4 c2w8
        // won the single expert by 1.22x but lost the grouped experts, so c4w4 stays; the best
        // other shape in its slowest case is c2w4 (c4w8 is not compiled, so no candidate).
        assert_eq!(s.cuda_decode, "fp8=c2w8,mxfp4=c4w4");
        assert!(s.changed);
        let fp8 = &s.formats[0];
        assert_eq!((fp8.format.as_str(), fp8.current.as_str()), ("fp8", "c2w4"));
        assert_eq!((fp8.shape.as_str(), fp8.worst_speedup), ("c2w8", 1.03));
        assert_eq!(fp8.cases, 2);
        let mx = &s.formats[1];
        assert_eq!((mx.shape.as_str(), mx.worst_speedup), ("c4w4", 1.0));
        assert_eq!(mx.runner_up, Some(runner("c2w4", 0.91)));
        assert_eq!(
            DecodeShapes::parse(&s.cuda_decode).unwrap().describe(),
            s.cuda_decode,
            "the value reads back"
        );
    }

    #[test]
    fn the_rows_order_does_not_matter() {
        let mut rows = h200_f32();
        rows.reverse();
        rows.sort_by(|a, b| a.shape.cmp(&b.shape));
        assert_eq!(
            suggest(&rows, old_defaults()),
            suggest(&h200_f32(), old_defaults())
        );
    }

    #[test]
    fn a_gain_inside_the_margin_keeps_the_backends_shape() {
        let mut rows = h200_f32();
        for r in rows
            .iter_mut()
            .filter(|r| r.shape == "c2w8" && r.format == "fp8")
        {
            r.speedup = 1.015;
        }
        let s = suggest(&rows, old_defaults()).unwrap();
        assert_eq!(s.cuda_decode, "fp8=c2w4,mxfp4=c4w4");
        assert!(!s.changed);
        assert_eq!(s.formats[0].runner_up, Some(runner("c2w8", 1.015)));
    }

    #[test]
    fn shapes_missing_a_case_or_with_broken_timings_are_not_candidates() {
        let mut rows = h200_f32();
        // c2w8 lost its wq_b row; c1w8 timed NaN in one case and a huge speedup in the other.
        rows.retain(|r| !(r.format == "fp8" && r.shape == "c2w8" && r.case == "fp8 wq_b"));
        for r in rows
            .iter_mut()
            .filter(|r| r.format == "fp8" && r.shape == "c1w8")
        {
            r.speedup = if r.case == "fp8 wq_b" { f64::NAN } else { 9.0 };
        }
        let s = suggest(&rows, old_defaults()).unwrap();
        assert_eq!(s.formats[0].shape, "c2w4");
        assert_eq!(s.formats[0].runner_up, Some(runner("c4w4", 0.86)));
    }

    #[test]
    fn no_rows_no_suggestion_and_one_format_alone_keeps_the_others_shape() {
        assert_eq!(suggest(&[], DecodeShapes::default()), None);
        let mx: Vec<ShapeTiming> = h200_f32()
            .into_iter()
            .filter(|r| r.format == "mxfp4")
            .map(|mut r| {
                if r.shape == "c2w4" {
                    r.speedup = 1.3;
                }
                r
            })
            .collect();
        let s = suggest(&mx, old_defaults()).unwrap();
        assert_eq!(s.formats.len(), 1);
        assert_eq!(s.cuda_decode, "fp8=c2w4,mxfp4=c2w4");
        assert_eq!(s.formats[0].worst_speedup, 1.3);
    }
}
