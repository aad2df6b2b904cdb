//! The conformance checks of [`DeviceOps::grouped_linear`](crate::device::DeviceOps): every
//! group's rows bitwise the host `linear` of its weight (decode-sized groups of one row, prefill
//! groups of several, empty groups); [`DeviceOps::scatter_add_groups`](crate::device::DeviceOps)
//! adding rows a destination gets from several groups in group order; inconsistent groups are
//! errors.

use super::{Check, FORMATS, build_linear, scatter_add_host};
use crate::{Linear, WeightFormat};

impl Check<'_> {
    pub(super) fn grouped_cases(&mut self) {
        for format in FORMATS {
            let (out_dim, in_dim) = (160, 256);
            let ws: Result<Vec<Linear>, _> = (0..4)
                .map(|_| build_linear(&mut self.rng, format, out_dim, in_dim))
                .collect();
            let ws = match ws {
                Ok(ws) => ws,
                Err(e) => {
                    self.fails.push(format!("building {format:?} weights: {e}"));
                    continue;
                }
            };
            // One row per group (decode), and groups of 3, 0, 9 and 1 rows (prefill).
            for starts in [vec![0usize, 1, 2, 3, 4], vec![0, 3, 3, 12, 13]] {
                let label =
                    format!("grouped_linear {format:?} [{out_dim}, {in_dim}] starts={starts:?}");
                let refs: Vec<&Linear> = ws.iter().collect();
                self.case(&label, |c| {
                    let rows = starts[refs.len()];
                    let x = c.vec(rows * in_dim, 1.0);
                    let mut host = vec![0f32; rows * out_dim];
                    for (g, w) in refs.iter().enumerate() {
                        let (s, e) = (starts[g], starts[g + 1]);
                        c.be.linear(
                            w,
                            &x[s * in_dim..e * in_dim],
                            e - s,
                            &mut host[s * out_dim..e * out_dim],
                        );
                    }
                    let (dx, dout) = (c.put(&x)?, c.out(rows * out_dim)?);
                    c.dev.grouped_linear(&refs, dx, &starts, dout)?;
                    c.expect(&label, dout, &host)
                });
            }
        }
        for width in [128usize, 100] {
            let label = format!("scatter_add_groups n=7 width={width}");
            self.case(&label, |c| {
                // Rows 0 and 5 get rows from three groups, row 2 from two; group 1 is empty.
                let n = 7;
                let idx: Vec<u32> = vec![5, 0, 2, 0, 5, 3, 0, 5, 6, 2];
                let starts = [0usize, 3, 3, 5, 10];
                let src = c.vec(idx.len() * width, 1.0);
                let mut host = c.vec(n * width, 2.0);
                let (dsrc, ddst) = (c.put(&src)?, c.put(&host)?);
                scatter_add_host(&mut host, &src, &idx, width);
                c.dev.scatter_add_groups(dsrc, &idx, &starts, width, ddst)?;
                c.expect(&label, ddst, &host)
            });
        }
        self.grouped_error_cases();
    }

    fn grouped_error_cases(&mut self) {
        let bad: [(&str, &[usize], usize); 4] = [
            ("grouped_linear with one start too few", &[0, 2], 2),
            (
                "grouped_linear with starts not beginning at 0",
                &[1, 2, 3],
                2,
            ),
            ("grouped_linear with decreasing starts", &[0, 3, 2], 3),
            ("grouped_linear with x of the wrong length", &[0, 1, 2], 3),
        ];
        for (label, starts, rows) in bad {
            self.must_fail(label, |c| {
                let w = build_linear(&mut c.rng, WeightFormat::Bf16, 128, 128)?;
                let v = build_linear(&mut c.rng, WeightFormat::Bf16, 128, 128)?;
                let (x, out) = (c.put(&vec![0.5; rows * 128])?, c.out(rows * 128)?);
                Ok(c.dev.grouped_linear(&[&w, &v], x, starts, out))
            });
        }
        self.must_fail("grouped_linear over weights of two shapes", |c| {
            let w = build_linear(&mut c.rng, WeightFormat::Bf16, 128, 128)?;
            let v = build_linear(&mut c.rng, WeightFormat::Bf16, 160, 128)?;
            let (x, out) = (c.put(&[0.5; 2 * 128])?, c.out(2 * 160)?);
            Ok(c.dev.grouped_linear(&[&w, &v], x, &[0, 1, 2], out))
        });
        self.must_fail("grouped_linear over weights of two formats", |c| {
            let w = build_linear(&mut c.rng, WeightFormat::Bf16, 128, 128)?;
            let v = build_linear(&mut c.rng, WeightFormat::F32, 128, 128)?;
            let (x, out) = (c.put(&[0.5; 2 * 128])?, c.out(2 * 128)?);
            Ok(c.dev.grouped_linear(&[&w, &v], x, &[0, 1, 2], out))
        });
        let bad_scatter: [(&str, &[u32], &[usize]); 4] = [
            (
                "scatter_add_groups with a row index given twice in a group",
                &[1, 1],
                &[0, 2],
            ),
            (
                "scatter_add_groups with a row index past dst",
                &[1, 7],
                &[0, 1, 2],
            ),
            (
                "scatter_add_groups with starts not ending at the rows",
                &[1, 2],
                &[0, 1],
            ),
            (
                "scatter_add_groups with decreasing starts",
                &[1, 2],
                &[0, 2, 1, 2],
            ),
        ];
        for (label, idx, starts) in bad_scatter {
            self.must_fail(label, |c| {
                let (src, dst) = (c.put(&vec![0.5; idx.len() * 128])?, c.out(7 * 128)?);
                Ok(c.dev.scatter_add_groups(src, idx, starts, 128, dst))
            });
        }
        self.must_fail("grouped_linear without weights", |c| {
            let (x, out) = (c.put(&[0.5; 128])?, c.out(128)?);
            Ok(c.dev.grouped_linear(&[], x, &[0], out))
        });
    }
}
