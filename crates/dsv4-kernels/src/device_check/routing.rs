//! The conformance checks of MoE routing on the device
//! ([`DeviceOps::route_experts`](crate::device::DeviceOps) and `routed_experts`), where the
//! device offers it: routes bitwise [`crate::moe_device::routes_host`] (the host backend's
//! `topk` of the biased scores, ties and NaN included, and f64 weights); the routed experts
//! bitwise [`crate::moe_device::routed_host`] (each expert's rows through the host linears and
//! SwiGLU, added per token from zero in ascending expert order, a repeated id counted once),
//! with and without fp8 activations; inconsistent operands are errors. Where the device does
//! not route, both ops must be errors.

use super::{Check, FORMATS, build_linear};
use crate::moe_device::{routed_host, routes_host};
use crate::{Linear, RouteChoice, RoutedExperts};

/// Experts of the routing cases.
const E: usize = 8;
/// The routed-experts cases' widths: model dim and expert inter dim.
const DIM: usize = 128;
const INTER: usize = 160;

impl Check<'_> {
    pub(super) fn routing_cases(&mut self) {
        if !self.dev.routes_on_device() {
            self.must_fail("route_experts where the device does not route", |c| {
                let (s, r) = (c.put(&[0.5; E])?, c.out(4)?);
                Ok(c.dev
                    .route_experts(s, E, 2, RouteChoice::Biased(&[0.0; E]), 1.0, r))
            });
            return;
        }
        for rows in [1usize, 5] {
            self.route_case(rows, None);
            // Fixed ids: a repeat, and one past the experts (wrapped).
            let fixed: Vec<u32> = (0..rows as u32)
                .flat_map(|r| [r % 8, (r + 3) % 8, if r == 2 { r % 8 } else { 9 + r }])
                .collect();
            self.route_case(rows, Some(fixed));
        }
        for format in FORMATS {
            for quant in [false, true] {
                for rows in [1usize, 5] {
                    self.routed_case(format, quant, rows);
                }
            }
        }
        // More tokens than a GPU block has threads: several tokens to a thread's chunk.
        self.routed_case(crate::WeightFormat::Bf16, false, 300);
        self.routing_error_cases();
    }

    /// route_experts over `rows` rows of E scores with k = 3: biased (with a tie and a NaN),
    /// or the `fixed` ids.
    fn route_case(&mut self, rows: usize, fixed: Option<Vec<u32>>) {
        let k = 3;
        let label = format!(
            "route_experts rows={rows} k={k} {}",
            if fixed.is_some() { "fixed" } else { "biased" }
        );
        self.case(&label, |c| {
            let logits = c.vec(rows * E, 3.0);
            let mut s = vec![0f32; rows * E];
            c.be.router_scores(&logits, &mut s);
            let mut bias = c.vec(E, 0.3);
            // Experts 2 and 5 tie in every row; ranked, expert 7's score is NaN in the last
            // row (never chosen, so no NaN weight, whose bits a GPU need not keep).
            bias[5] = bias[2];
            for r in 0..rows {
                s[r * E + 5] = s[r * E + 2];
            }
            if fixed.is_none() {
                s[rows * E - 1] = f32::NAN;
            }
            let choice = match &fixed {
                Some(f) => RouteChoice::Fixed(f),
                None => RouteChoice::Biased(&bias),
            };
            let host = routes_host(c.be, &s, E, k, choice, 2.5);
            let (ds, dr) = (c.put(&s)?, c.out(rows * 2 * k)?);
            c.dev.route_experts(ds, E, k, choice, 2.5, dr)?;
            c.expect(&label, dr, &host)
        });
    }

    /// routed_experts of `rows` tokens through E experts of `format` with k = 2 (token 1 names
    /// one expert twice), against the host form.
    fn routed_case(&mut self, format: crate::WeightFormat, quant: bool, rows: usize) {
        let k = 2;
        let label = format!("routed_experts {format:?} quant={quant} rows={rows} k={k}");
        let ws = (0..3 * E)
            .map(|i| {
                let (o, n) = if i < 2 * E {
                    (INTER, DIM)
                } else {
                    (DIM, INTER)
                };
                build_linear(&mut self.rng, format, o, n)
            })
            .collect::<Result<Vec<Linear>, _>>();
        let ws = match ws {
            Ok(ws) => ws,
            Err(e) => return self.fails.push(format!("{label}: building weights: {e}")),
        };
        let refs: Vec<&Linear> = ws.iter().collect();
        let (w1, rest) = refs.split_at(E);
        let (w3, w2) = rest.split_at(E);
        self.case(&label, |c| {
            let x = c.vec(rows * DIM, 1.0);
            let ids: Vec<[u32; 2]> = (0..rows as u32)
                .map(|r| {
                    if r == 1 {
                        [3, 3]
                    } else {
                        [(5 * r + 1) % 8, (3 * r + 6) % 8]
                    }
                })
                .collect();
            let weights: Vec<[f32; 2]> = (0..rows).map(|_| [c.rng.normalish(0.5), 0.75]).collect();
            let routes: Vec<f32> = ids
                .iter()
                .zip(&weights)
                .flat_map(|(i, w)| [f32::from_bits(i[0]), f32::from_bits(i[1]), w[0], w[1]])
                .collect();
            let spec = RoutedExperts {
                w1,
                w3,
                w2,
                k,
                limit: 7.0,
                quant,
            };
            let host = routed_host(c.be, &spec, &x, &routes)?;
            let (dx, dr) = (c.put(&x)?, c.put(&routes)?);
            let work = c.out(spec.work_words(rows, DIM, INTER))?;
            let dy = c.out(rows * DIM)?;
            c.dev.routed_experts(&spec, dx, dr, work, dy)?;
            c.expect(&label, dy, &host)
        });
    }

    fn routing_error_cases(&mut self) {
        let bias = [0.0f32; E];
        let cases: [(&str, usize, usize, usize); 4] = [
            ("route_experts with k = 0", 0, E, 0),
            (
                "route_experts with k past the experts",
                E + 1,
                E,
                2 * (E + 1),
            ),
            (
                "route_experts with scores not rows of the experts",
                2,
                E + 1,
                4,
            ),
            ("route_experts with routes of the wrong length", 2, E, 5),
        ];
        for (label, k, scores, routes) in cases {
            self.must_fail(label, |c| {
                let (s, r) = (c.put(&vec![0.5; scores])?, c.out(routes.max(1))?);
                Ok(c.dev
                    .route_experts(s, E, k, RouteChoice::Biased(&bias), 1.0, r))
            });
        }
        self.must_fail("route_experts with a bias of the wrong length", |c| {
            let (s, r) = (c.put(&[0.5; E])?, c.out(4)?);
            Ok(c.dev
                .route_experts(s, E, 2, RouteChoice::Biased(&bias[..3]), 1.0, r))
        });
        self.must_fail("route_experts with too few fixed ids", |c| {
            let (s, r) = (c.put(&[0.5; E])?, c.out(4)?);
            Ok(c.dev
                .route_experts(s, E, 2, RouteChoice::Fixed(&[1]), 1.0, r))
        });
        self.must_fail("routed_experts over experts of two shapes", |c| {
            let a = build_linear(&mut c.rng, crate::WeightFormat::Bf16, INTER, DIM)?;
            let b = build_linear(&mut c.rng, crate::WeightFormat::Bf16, DIM, INTER)?;
            let spec = RoutedExperts {
                w1: &[&a, &a],
                w3: &[&a, &b],
                w2: &[&b, &b],
                k: 1,
                limit: 7.0,
                quant: false,
            };
            let (x, r) = (c.put(&[0.5; DIM])?, c.put(&[f32::from_bits(1), 1.0])?);
            let (work, y) = (c.out(spec.work_words(1, DIM, INTER))?, c.out(DIM)?);
            Ok(c.dev.routed_experts(&spec, x, r, work, y))
        });
        self.must_fail("routed_experts with a work slice too small", |c| {
            let a = build_linear(&mut c.rng, crate::WeightFormat::Bf16, INTER, DIM)?;
            let b = build_linear(&mut c.rng, crate::WeightFormat::Bf16, DIM, INTER)?;
            let spec = RoutedExperts {
                w1: &[&a],
                w3: &[&a],
                w2: &[&b],
                k: 1,
                limit: 7.0,
                quant: false,
            };
            let (x, r) = (c.put(&[0.5; DIM])?, c.put(&[f32::from_bits(0), 1.0])?);
            let (work, y) = (c.out(DIM)?, c.out(DIM)?);
            Ok(c.dev.routed_experts(&spec, x, r, work, y))
        });
    }
}
