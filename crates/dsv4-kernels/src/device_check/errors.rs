//! The conformance checks of inconsistent inputs (errors, not panics), fresh buffers (zeroed)
//! and the traffic counters.

use super::{Check, R, panic_text};
use crate::device::{DevBufId, DevSlice, DeviceStats};
use dsv4_core::IndexKDtype;
use std::panic::{AssertUnwindSafe, catch_unwind};

impl Check<'_> {
    /// `f` must return an error (and not panic); its buffers are freed afterwards.
    pub(super) fn must_fail(&mut self, label: &str, f: impl FnOnce(&mut Self) -> R<R<()>>) {
        let r = catch_unwind(AssertUnwindSafe(|| f(self)));
        match r {
            Ok(Ok(Ok(()))) => self
                .fails
                .push(format!("{label}: accepted (an error was expected)")),
            Ok(Ok(Err(_))) => {}
            Ok(Err(e)) => self
                .fails
                .push(format!("{label}: setting up failed: device error: {e}")),
            Err(p) => self.fails.push(format!(
                "{label}: panicked instead of returning an error: {}",
                panic_text(&p)
            )),
        }
        for (b, _) in std::mem::take(&mut self.bufs) {
            self.dev.free(b);
        }
    }

    pub(super) fn error_cases(&mut self) {
        self.must_fail("write of 99 words into a 100-word slice", |c| {
            let s = c.out(100)?;
            Ok(c.dev.write(s, &[0.0; 99]))
        });
        self.must_fail("read past the end of a buffer", |c| {
            let s = c.out(100)?;
            let total = c.bufs[&s.buf];
            Ok(c.dev.read(DevSlice::whole(s.buf, total + 1)).map(|_| ()))
        });
        self.must_fail("add with an output one word short", |c| {
            let (a, b, out) = (c.out(256)?, c.out(256)?, c.out(255)?);
            Ok(c.dev.add(a, b, out))
        });
        self.must_fail("add with inputs of different lengths", |c| {
            let (a, b, out) = (c.out(256)?, c.out(128)?, c.out(256)?);
            Ok(c.dev.add(a, b, out))
        });
        self.must_fail("rms_norm with x not a multiple of dim", |c| {
            let (x, out) = (c.out(300)?, c.out(300)?);
            Ok(c.dev.rms_norm(x, None, 128, 1e-6, out))
        });
        self.must_fail("rms_norm with out longer than x", |c| {
            let (x, out) = (c.out(256)?, c.out(384)?);
            Ok(c.dev.rms_norm(x, None, 128, 1e-6, out))
        });
        self.must_fail("linear with x of the wrong length", |c| {
            let w = super::build_linear(&mut c.rng, crate::WeightFormat::F32, 128, 128)?;
            let (x, out) = (c.out(3 * 128 - 1)?, c.out(3 * 128)?);
            Ok(c.dev.linear(&w, x, 3, out))
        });
        self.must_fail("copy2d reading past the source", |c| {
            let (src, dst) = (c.out(256)?, c.out(512)?);
            let sh = crate::Copy2d {
                rows: 2,
                width: 100,
                src_stride: 128,
                src_col: 29,
                dst_stride: 256,
                dst_col: 0,
            };
            Ok(c.dev.copy2d(src, dst, sh))
        });
        self.must_fail("gather_rows with an index past the source", |c| {
            let (src, dst) = (c.out(4 * 128)?, c.out(2 * 128)?);
            Ok(c.dev.gather_rows(src, &[1, 4], 128, dst))
        });
        self.must_fail("router_scores into a shorter output", |c| {
            let (x, out) = (c.out(256)?, c.out(255)?);
            Ok(c.dev.router_scores(x, out))
        });
        self.must_fail("swiglu_rows with one weight too many", |c| {
            let (g, u, out) = (c.out(256)?, c.out(256)?, c.out(256)?);
            Ok(c.dev.swiglu_rows(g, u, 7.0, &[1.0, 1.0, 1.0], 128, out))
        });
        self.must_fail("round_index_rows with x not a multiple of dim", |c| {
            let x = c.out(200)?;
            Ok(c.dev.round_index_rows(IndexKDtype::Fp8, x, 128))
        });
        if self.dev.offset_alignment() > 4 {
            self.must_fail("add at a misaligned offset", |c| {
                let (a, b, out) = (c.out(257)?, c.out(256)?, c.out(256)?);
                Ok(c.dev.add(a.sub(1, 256), b, out))
            });
            self.must_fail("rms_norm writing at a misaligned offset", |c| {
                let (x, out) = (c.out(128)?, c.out(129)?);
                Ok(c.dev.rms_norm(x, None, 128, 1e-6, out.sub(1, 128)))
            });
        }
        self.must_fail("read of a freed buffer", |c| {
            let b = c.dev.alloc(64)?;
            c.dev.free(b);
            Ok(c.dev.read(DevSlice::whole(b, 64)).map(|_| ()))
        });
        self.must_fail("read of a never-allocated buffer", |c| {
            Ok(c.dev
                .read(DevSlice::whole(DevBufId(u64::MAX), 1))
                .map(|_| ()))
        });
        self.must_fail("add into a freed buffer", |c| {
            let (a, b) = (c.out(64)?, c.out(64)?);
            let dead = c.dev.alloc(64)?;
            c.dev.free(dead);
            Ok(c.dev.add(a, b, DevSlice::whole(dead, 64)))
        });
        self.case("free of a never-allocated buffer", |c| {
            c.dev.free(DevBufId(u64::MAX - 1));
            Ok(())
        });
    }

    /// `read_many` gives what one `read` per slice gives (an empty slice, two slices of one
    /// buffer, a slice at an offset) in one submission; a bad slice among good ones is an error.
    pub(super) fn read_many_case(&mut self) {
        self.case("read_many", |c| {
            let (a, b) = (c.vec(300, 1.0), c.vec(7, 2.0));
            let (da, db) = (c.put(&a)?, c.put(&b)?);
            let srcs = [da, db.sub(0, 0), db, da.sub(64, 100)];
            let s0 = c.dev.stats();
            let got = c.dev.read_many(&srcs)?;
            let s1 = c.dev.stats();
            let want = [&a[..], &[][..], &b[..], &a[64..164]];
            if got.len() != want.len() {
                c.fails.push(format!(
                    "read_many of {} slices returned {}",
                    want.len(),
                    got.len()
                ));
            }
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                c.cmp(&format!("read_many slice {i}"), w, g);
            }
            let submits = s1.submissions.saturating_sub(s0.submissions);
            if submits != 1 {
                c.fails.push(format!(
                    "read_many of four slices counted {submits} submissions, not 1"
                ));
            }
            Ok(())
        });
        self.must_fail("read_many with a freed buffer among live ones", |c| {
            let live = c.out(64)?;
            let dead = c.dev.alloc(64)?;
            c.dev.free(dead);
            let srcs = [live, DevSlice::whole(dead, 64), live];
            Ok(c.dev.read_many(&srcs).map(|_| ()))
        });
    }

    /// Fresh buffers are zeroed; the counters move as documented.
    pub(super) fn stats_case(&mut self) {
        self.case("alloc/write/read/stats", |c| {
            let n = 300;
            let s0 = c.dev.stats();
            let buf = c.dev.alloc(n)?;
            c.bufs.insert(buf, n);
            let s1 = c.dev.stats();
            let zeros = c.dev.read(DevSlice::whole(buf, n))?;
            if zeros.iter().any(|v| v.to_bits() != 0) {
                c.fails
                    .push(format!("alloc({n}): a fresh buffer is not all +0.0"));
            }
            let s2 = c.dev.stats();
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
            c.dev.write(DevSlice::whole(buf, n), &data)?;
            let s3 = c.dev.stats();
            c.dev.scale(DevSlice::whole(buf, n), 2.0)?;
            let s4 = c.dev.stats();
            let back = c.dev.read(DevSlice::whole(buf, n).sub(64, 200))?;
            let s5 = c.dev.stats();
            let host: Vec<f32> = data[64..264].iter().map(|v| v * 2.0).collect();
            c.cmp("write→scale→read at offset 64", &host, &back);
            let mut bad = Vec::new();
            for (a, b, what) in [
                (&s0, &s1, "alloc"),
                (&s1, &s2, "read"),
                (&s2, &s3, "write"),
                (&s3, &s4, "scale"),
                (&s4, &s5, "read"),
            ] {
                if let Some(f) = decreased(a, b) {
                    bad.push(format!("{f} decreased across {what}"));
                }
            }
            if s1.allocs != s0.allocs + 1 {
                bad.push(format!(
                    "allocs +{} for one alloc",
                    s1.allocs.saturating_sub(s0.allocs)
                ));
            }
            let (reads, bytes) = (
                s5.reads.saturating_sub(s4.reads),
                s5.read_bytes.saturating_sub(s4.read_bytes),
            );
            if reads != 1 || bytes != 800 {
                bad.push(format!(
                    "a read of 200 words counted {reads} reads, {bytes} bytes"
                ));
            }
            if s3.writes <= s2.writes || s3.write_bytes < s2.write_bytes + 4 * n as u64 {
                bad.push(format!(
                    "a write of {n} words counted {} writes, {} bytes",
                    s3.writes.saturating_sub(s2.writes),
                    s3.write_bytes.saturating_sub(s2.write_bytes)
                ));
            }
            if s4.dispatches <= s3.dispatches {
                bad.push("a scale counted no dispatch".into());
            }
            if s5.submissions < s4.submissions + u64::from(s4.dispatches > s3.dispatches) {
                bad.push("a read after queued work counted no submission".into());
            }
            for b in bad {
                c.fails.push(format!("stats: {b}"));
            }
            Ok(())
        });
    }
}

/// The name of a counter that went down from `a` to `b`.
fn decreased(a: &DeviceStats, b: &DeviceStats) -> Option<&'static str> {
    a.named()
        .into_iter()
        .zip(b.named())
        .find(|((_, x), (_, y))| y < x)
        .map(|((n, _), _)| n)
}
