//! Conformance of a backend's [`DeviceOps`] to its host [`Backend`] ops: every device op runs on
//! deterministic pseudo-random inputs (operands placed at a nonzero aligned offset inside a
//! bigger, guard-filled buffer) and its result must be bitwise equal to the host op's. Also
//! checked: inconsistent inputs (wrong lengths, misaligned offsets, unknown buffers) are errors,
//! not panics; nothing is written outside an output slice; the read/write/alloc counters move.

use crate::device::{Copy2d, DevBufId, DevSlice, DeviceOps};
use crate::rope::Yarn;
use crate::{Backend, HcParams, KernelError, Linear, MhcPre, RopeTable, WeightFormat};
use dsv4_core::codec::{f32_to_bf16, f32_to_e4m3, pack_e2m1};
use dsv4_core::{IndexKDtype, SplitMix64};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Every weight format, for the linear cases.
const FORMATS: [WeightFormat; 4] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Mxfp4,
];

/// Words of guard after every operand (before it: the aligned offset itself).
const TAIL: usize = 64;

/// The value every guard word and every fresh output word holds: finite and small (≈ 1.09e-3),
/// so an add, a scale or a copy that strays onto it changes its bits (a NaN would not).
const GUARD: u32 = 0x3A8F_5C29;

/// Check `be.device()` against `be`'s host ops; one line per failure, empty when it conforms.
pub fn conformance(be: &dyn Backend) -> Vec<String> {
    match be.device() {
        Some(dev) => conformance_of(be, dev),
        None => vec!["backend has no device op set".into()],
    }
}

/// Check the device op set `dev` against the host ops of `be` (normally `be.device()`; a test
/// may pair a backend with a deliberately broken op set); one line per failure.
pub fn conformance_of(be: &dyn Backend, dev: &dyn DeviceOps) -> Vec<String> {
    let align = dev.offset_alignment();
    if align == 0 || !align.is_multiple_of(4) || !256usize.is_multiple_of(align) {
        return vec![format!(
            "offset_alignment() = {align} bytes: must be a nonzero multiple of 4 that divides 256 \
             (plan arena offsets are multiples of 256)"
        )];
    }
    let mut c = Check {
        be,
        dev,
        off: 64usize.next_multiple_of(align / 4),
        rng: SplitMix64::new(0x5eed_d5c4),
        bufs: HashMap::new(),
        fails: Vec::new(),
    };
    c.run_all();
    c.fails
}

type R<T> = Result<T, KernelError>;

/// The state of one conformance run.
struct Check<'a> {
    be: &'a dyn Backend,
    dev: &'a dyn DeviceOps,
    /// Word offset of every operand inside its buffer (aligned, nonzero).
    off: usize,
    rng: SplitMix64,
    /// Live buffers of the current case: total words.
    bufs: HashMap<DevBufId, usize>,
    fails: Vec<String>,
}

impl Check<'_> {
    fn run_all(&mut self) {
        self.elementwise_cases();
        self.row_cases();
        self.rope_cases();
        self.mhc_cases();
        self.linear_cases();
        self.grouped_cases();
        self.routing_cases();
        self.attention_cases();
        self.chain_case();
        self.error_cases();
        self.stats_case();
        self.read_many_case();
    }

    // ---- plumbing -------------------------------------------------------------------------

    /// Run one case: device errors and panics become failure lines; its buffers are freed.
    fn case(&mut self, label: &str, f: impl FnOnce(&mut Self) -> R<()>) {
        let r = catch_unwind(AssertUnwindSafe(|| f(self)));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fails.push(format!("{label}: device error: {e}")),
            Err(p) => self
                .fails
                .push(format!("{label}: panicked: {}", panic_text(&p))),
        }
        for (b, _) in std::mem::take(&mut self.bufs) {
            self.dev.free(b);
        }
    }

    fn vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.normalish(std)).collect()
    }

    /// A fresh buffer holding `data` at the aligned offset, guard words around it.
    fn put(&mut self, data: &[f32]) -> R<DevSlice> {
        let total = self.off + data.len() + TAIL;
        let buf = self.dev.alloc(total)?;
        self.bufs.insert(buf, total);
        let g = f32::from_bits(GUARD);
        let mut all = vec![g; total];
        all[self.off..self.off + data.len()].copy_from_slice(data);
        self.dev.write(DevSlice::whole(buf, total), &all)?;
        Ok(DevSlice {
            buf,
            off: self.off,
            len: data.len(),
        })
    }

    /// A fresh output slice of `n` guard words.
    fn out(&mut self, n: usize) -> R<DevSlice> {
        self.put(&vec![f32::from_bits(GUARD); n])
    }

    /// Read `s` back, and check its buffer's guard words are untouched.
    fn get(&mut self, label: &str, s: DevSlice) -> R<Vec<f32>> {
        let v = self.dev.read(s)?;
        if v.len() != s.len {
            self.fails.push(format!(
                "{label}: read of {} words returned {}",
                s.len,
                v.len()
            ));
        }
        if let Some(&total) = self.bufs.get(&s.buf) {
            let all = self.dev.read(DevSlice::whole(s.buf, total))?;
            let bad = (0..total)
                .filter(|&i| (i < s.off || i >= s.off + s.len) && all[i].to_bits() != GUARD)
                .collect::<Vec<_>>();
            if let Some(&first) = bad.first() {
                self.fails.push(format!(
                    "{label}: {} words outside the slice [{}, {}) changed, first at {first}: 0x{:08x}",
                    bad.len(),
                    s.off,
                    s.off + s.len,
                    all[first].to_bits()
                ));
            }
        }
        Ok(v)
    }

    /// Compare bits; one line on a mismatch.
    fn cmp(&mut self, label: &str, host: &[f32], dev: &[f32]) {
        if let Some(line) = diff_line(label, host, dev) {
            self.fails.push(line);
        }
    }

    /// Read `s` and compare it with `host`.
    fn expect(&mut self, label: &str, s: DevSlice, host: &[f32]) -> R<()> {
        let d = self.get(label, s)?;
        self.cmp(label, host, &d);
        Ok(())
    }

    // ---- cases ----------------------------------------------------------------------------

    fn elementwise_cases(&mut self) {
        for n in [1usize, 384, 1000] {
            let label = format!("add n={n}");
            self.case(&label, |c| {
                let a = c.vec(n, 1.0);
                let b = c.vec(n, 3.0);
                let host: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
                let (da, db, dout) = (c.put(&a)?, c.put(&b)?, c.out(n)?);
                c.dev.add(da, db, dout)?;
                c.expect(&label, dout, &host)
            });
            let label = format!("router_scores n={n}");
            self.case(&label, |c| {
                // Logits from −60 to 60: softplus's both branches and its saturation.
                let x = c.vec(n, 60.0);
                let mut host = vec![0f32; n];
                c.be.router_scores(&x, &mut host);
                let (dx, dout) = (c.put(&x)?, c.out(n)?);
                c.dev.router_scores(dx, dout)?;
                c.expect(&label, dout, &host)
            });
            for s in [0.088_388_347_648_318_44f64, -3.0, 1.0 / 3.0] {
                let label = format!("scale n={n} s={s}");
                self.case(&label, |c| {
                    let x = c.vec(n, 2.0);
                    let host: Vec<f32> = x.iter().map(|&v| (f64::from(v) * s) as f32).collect();
                    let dx = c.put(&x)?;
                    c.dev.scale(dx, s)?;
                    c.expect(&label, dx, &host)
                });
            }
        }
        let shapes = [
            Copy2d::contiguous(300),
            Copy2d {
                rows: 5,
                width: 100,
                src_stride: 128,
                src_col: 0,
                dst_stride: 256,
                dst_col: 0,
            },
            Copy2d {
                rows: 4,
                width: 64,
                src_stride: 192,
                src_col: 128,
                dst_stride: 96,
                dst_col: 17,
            },
        ];
        for sh in shapes {
            let label = format!("copy2d {sh:?}");
            self.case(&label, |c| {
                let src = c.vec(sh.rows * sh.src_stride, 1.0);
                let mut host = c.vec(sh.rows * sh.dst_stride, 1.0);
                let (dsrc, ddst) = (c.put(&src)?, c.put(&host)?);
                for r in 0..sh.rows {
                    let (s0, d0) = (
                        r * sh.src_stride + sh.src_col,
                        r * sh.dst_stride + sh.dst_col,
                    );
                    host[d0..d0 + sh.width].copy_from_slice(&src[s0..s0 + sh.width]);
                }
                c.dev.copy2d(dsrc, ddst, sh)?;
                c.expect(&label, ddst, &host)
            });
        }
        let label = "gather_rows n=7 rows=5 width=256";
        self.case(label, |c| {
            let (n, width) = (7, 256);
            let src = c.vec(n * width, 1.0);
            let idx: Vec<u32> = vec![3, 0, 6, 3, 1];
            let host: Vec<f32> = idx
                .iter()
                .flat_map(|&i| src[i as usize * width..(i as usize + 1) * width].to_vec())
                .collect();
            let (dsrc, ddst) = (c.put(&src)?, c.out(idx.len() * width)?);
            c.dev.gather_rows(dsrc, &idx, width, ddst)?;
            c.expect(label, ddst, &host)
        });
        let label = "scatter_add_rows n=7 rows=4 width=128";
        self.case(label, |c| {
            let (n, width) = (7, 128);
            let idx: Vec<u32> = vec![5, 0, 2, 6];
            let src = c.vec(idx.len() * width, 1.0);
            let mut host = c.vec(n * width, 2.0);
            let (dsrc, ddst) = (c.put(&src)?, c.put(&host)?);
            scatter_add_host(&mut host, &src, &idx, width);
            c.dev.scatter_add_rows(dsrc, &idx, width, ddst)?;
            c.expect(label, ddst, &host)
        });
    }

    fn row_cases(&mut self) {
        for rows in [1usize, 3] {
            for dim in [128usize, 256] {
                let n = rows * dim;
                for weighted in [false, true] {
                    let label = format!("rms_norm rows={rows} dim={dim} weight={weighted}");
                    self.case(&label, |c| {
                        let x = c.vec(n, 1.5);
                        let w = weighted.then(|| c.vec(dim, 1.0));
                        let mut host = vec![0f32; n];
                        c.be.rms_norm(&x, w.as_deref(), dim, 1e-6, &mut host);
                        let (dx, dout) = (c.put(&x)?, c.out(n)?);
                        c.dev.rms_norm(dx, w.as_deref(), dim, 1e-6, dout)?;
                        c.expect(&label, dout, &host)
                    });
                }
                let label = format!("act_quant_fp8 rows={rows} dim={dim}");
                self.case(&label, |c| {
                    let mut x = c.vec(n, 4.0);
                    x[0] = 0.0;
                    if n > 200 {
                        x[200] = 900.0; // a block with a large max
                    }
                    let dx = c.put(&x)?;
                    c.be.act_quant_fp8(&mut x, dim);
                    c.dev.act_quant_fp8(dx, dim)?;
                    c.expect(&label, dx, &x)
                });
                for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
                    let label = format!("round_index_rows {dtype:?} rows={rows} dim={dim}");
                    self.case(&label, |c| {
                        let mut x = c.vec(n, 1.0);
                        let dx = c.put(&x)?;
                        c.be.round_index_rows(dtype, &mut x, dim);
                        c.dev.round_index_rows(dtype, dx, dim)?;
                        c.expect(&label, dx, &x)
                    });
                }
                let label = format!("swiglu_rows rows={rows} width={dim}");
                self.case(&label, |c| {
                    let (g, u) = (c.vec(n, 6.0), c.vec(n, 6.0));
                    let weights: Vec<f32> = (0..rows).map(|_| c.rng.uniform_sym(2.0)).collect();
                    let limit = 7.0;
                    let mut host = vec![0f32; n];
                    for (r, &w) in weights.iter().enumerate() {
                        let s = r * dim..(r + 1) * dim;
                        c.be.swiglu(&g[s.clone()], &u[s.clone()], limit, w, &mut host[s]);
                    }
                    let (dg, du, dout) = (c.put(&g)?, c.put(&u)?, c.out(n)?);
                    c.dev.swiglu_rows(dg, du, limit, &weights, dim, dout)?;
                    c.expect(&label, dout, &host)
                });
            }
            for dim in [128usize, 256] {
                let label = format!("hadamard rows={rows} dim={dim}");
                self.case(&label, |c| {
                    let mut x = c.vec(rows * dim, 1.0);
                    let dx = c.put(&x)?;
                    c.be.hadamard(&mut x, dim);
                    c.dev.hadamard(dx, dim)?;
                    c.expect(&label, dx, &x)
                });
            }
        }
    }

    fn rope_cases(&mut self) {
        let yarn = Yarn {
            factor: 16.0,
            original_max_position: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let tables = [
            ("plain", RopeTable::plain(64, 10000.0)),
            ("yarn", RopeTable::yarn(64, 160000.0, yarn)),
        ];
        for (kind, table) in &tables {
            for inverse in [false, true] {
                for (rows, dim) in [(1usize, 128usize), (5, 128), (3, 192)] {
                    let label =
                        format!("rope {kind} inverse={inverse} rows={rows} dim={dim} rd=64");
                    self.case(&label, |c| {
                        let mut x = c.vec(rows * dim, 1.0);
                        let positions: Vec<usize> =
                            (0..rows).map(|r| [5, 0, 7, 4095, 70_001][r % 5]).collect();
                        let dx = c.put(&x)?;
                        c.be.rope(&mut x, dim, &positions, table, inverse);
                        c.dev.rope(dx, dim, &positions, table, inverse)?;
                        c.expect(&label, dx, &x)
                    });
                }
            }
        }
    }

    fn mhc_cases(&mut self) {
        let m = 4;
        for (d, t) in [(128usize, 1usize), (128, 3), (256, 2)] {
            let label = format!("mhc_pre M={m} D={d} t={t}");
            self.case(&label, |c| {
                let (fw, base, scale) = c.hc_weights(m, d, (2 + m) * m, 3);
                let p = hc(&fw, &base, &scale, m, d);
                let x = c.vec(t * m * d, 1.0);
                let host = c.be.mhc_pre(&p, &x, t);
                let dx = c.put(&x)?;
                let (du, dp, dc) = (c.out(t * d)?, c.out(t * m)?, c.out(t * m * m)?);
                c.dev.mhc_pre(&p, dx, t, du, dp, dc)?;
                c.expect(&format!("{label} u"), du, &host.u)?;
                c.expect(&format!("{label} post"), dp, &host.post)?;
                c.expect(&format!("{label} comb"), dc, &host.comb)
            });
            let label = format!("mhc_post M={m} D={d} t={t}");
            self.case(&label, |c| {
                let (fw, base, scale) = c.hc_weights(m, d, (2 + m) * m, 3);
                let p = hc(&fw, &base, &scale, m, d);
                let x = c.vec(t * m * d, 1.0);
                let y = c.vec(t * d, 1.0);
                let pre = c.be.mhc_pre(&p, &x, t);
                let pre = MhcPre {
                    u: vec![],
                    post: pre.post,
                    comb: pre.comb,
                };
                let mut host = vec![0f32; t * m * d];
                c.be.mhc_post(&x, &y, &pre, m, d, &mut host);
                let (dx, dy) = (c.put(&x)?, c.put(&y)?);
                let (dp, dc, dout) = (c.put(&pre.post)?, c.put(&pre.comb)?, c.out(t * m * d)?);
                c.dev.mhc_post(dx, dy, dp, dc, m, d, dout)?;
                c.expect(&label, dout, &host)
            });
            let label = format!("hc_head M={m} D={d} t={t}");
            self.case(&label, |c| {
                let (fw, base, scale) = c.hc_weights(m, d, m, 1);
                let p = hc(&fw, &base, &scale, m, d);
                let x = c.vec(t * m * d, 1.0);
                let mut host = vec![0f32; t * d];
                c.be.hc_head(&p, &x, t, &mut host);
                let (dx, dout) = (c.put(&x)?, c.out(t * d)?);
                c.dev.hc_head(&p, dx, t, dout)?;
                c.expect(&label, dout, &host)
            });
        }
    }

    /// Random `fn_w` [n_out, M·D], `base` [n_out], `scale` [n_scale].
    fn hc_weights(
        &mut self,
        m: usize,
        d: usize,
        n_out: usize,
        n_scale: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let fw = self.vec(n_out * m * d, 0.05);
        let base: Vec<f32> = (0..n_out).map(|_| self.rng.uniform_sym(1.0)).collect();
        let scale: Vec<f32> = (0..n_scale)
            .map(|_| 0.5 + self.rng.next_f64() as f32)
            .collect();
        (fw, base, scale)
    }

    fn linear_cases(&mut self) {
        for format in FORMATS {
            for (out_dim, in_dim) in [(160usize, 256usize), (128, 128)] {
                let w = match build_linear(&mut self.rng, format, out_dim, in_dim) {
                    Ok(w) => w,
                    Err(e) => {
                        self.fails
                            .push(format!("building a {format:?} weight: {e}"));
                        continue;
                    }
                };
                for rows in [1usize, 3, 9] {
                    let label = format!("linear {format:?} [{out_dim}, {in_dim}] rows={rows}");
                    self.case(&label, |c| {
                        let x = c.vec(rows * in_dim, 1.0);
                        let mut host = vec![0f32; rows * out_dim];
                        c.be.linear(&w, &x, rows, &mut host);
                        let (dx, dout) = (c.put(&x)?, c.out(rows * out_dim)?);
                        c.dev.linear(&w, dx, rows, dout)?;
                        c.expect(&label, dout, &host)
                    });
                }
            }
        }
    }

    /// Several dependent ops queued back to back with one read at the end.
    fn chain_case(&mut self) {
        let label = "chain add→scale→rms_norm→hadamard→linear (one read)";
        self.case(label, |c| {
            let (rows, dim) = (3, 128);
            let w = build_linear(&mut c.rng, WeightFormat::Bf16, 128, dim)?;
            let (a, b) = (c.vec(rows * dim, 1.0), c.vec(rows * dim, 1.0));
            let mut h: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            h.iter_mut().for_each(|v| *v = (f64::from(*v) * 0.5) as f32);
            let mut n = vec![0f32; rows * dim];
            c.be.rms_norm(&h, None, dim, 1e-6, &mut n);
            c.be.hadamard(&mut n, dim);
            let mut host = vec![0f32; rows * 128];
            c.be.linear(&w, &n, rows, &mut host);
            let (da, db, dsum) = (c.put(&a)?, c.put(&b)?, c.out(rows * dim)?);
            let (dn, dout) = (c.out(rows * dim)?, c.out(rows * 128)?);
            c.dev.add(da, db, dsum)?;
            c.dev.scale(dsum, 0.5)?;
            c.dev.rms_norm(dsum, None, dim, 1e-6, dn)?;
            c.dev.hadamard(dn, dim)?;
            c.dev.flush()?;
            c.dev.linear(&w, dn, rows, dout)?;
            c.expect(label, dout, &host)
        });
    }
}

/// What a scatter-add computes, on the host: `dst[idx[r]] += src[r]` (rows of `width`, f32
/// adds) for r in order.
fn scatter_add_host(dst: &mut [f32], src: &[f32], idx: &[u32], width: usize) {
    for (r, &i) in idx.iter().enumerate() {
        let row = &mut dst[i as usize * width..(i as usize + 1) * width];
        for (d, s) in row.iter_mut().zip(&src[r * width..(r + 1) * width]) {
            *d += s;
        }
    }
}

/// `HcParams` over the given weights with the model's usual eps and Sinkhorn iterations.
fn hc<'a>(fw: &'a [f32], base: &'a [f32], scale: &'a [f32], m: usize, d: usize) -> HcParams<'a> {
    HcParams {
        fn_w: fw,
        base,
        scale,
        m,
        d,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 20,
    }
}

/// A pseudo-random weight [out_dim, in_dim] stored in `format`.
pub fn build_linear(
    rng: &mut SplitMix64,
    format: WeightFormat,
    out_dim: usize,
    in_dim: usize,
) -> Result<Linear, KernelError> {
    let n = out_dim * in_dim;
    let name = format!("check.{format:?}");
    let mut vals = |std: f32| -> Vec<f32> { (0..n).map(|_| rng.normalish(std)).collect() };
    match format {
        WeightFormat::F32 => Linear::from_f32(name, out_dim, in_dim, &vals(0.05)),
        WeightFormat::Bf16 => {
            let data = vals(0.05)
                .iter()
                .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
                .collect();
            Linear::new(name, out_dim, in_dim, format, data, Vec::new())
        }
        WeightFormat::Fp8Block => {
            let data = vals(100.0).iter().map(|&v| f32_to_e4m3(v)).collect();
            let ns = out_dim.div_ceil(128) * in_dim.div_ceil(128);
            let scale = (0..ns).map(|_| 118 + rng.below(4) as u8).collect();
            Linear::new(name, out_dim, in_dim, format, data, scale)
        }
        WeightFormat::Mxfp4 => {
            let codes: Vec<u8> = (0..n).map(|_| rng.below(16) as u8).collect();
            let scale = (0..n / 32).map(|_| 121 + rng.below(4) as u8).collect();
            Linear::new(name, out_dim, in_dim, format, pack_e2m1(&codes), scale)
        }
    }
}

/// "label: k of n words differ, first at i: host 0x.. device 0x.." or None when bitwise equal.
pub fn diff_line(label: &str, host: &[f32], dev: &[f32]) -> Option<String> {
    if host.len() != dev.len() {
        return Some(format!(
            "{label}: host has {} words, device {}",
            host.len(),
            dev.len()
        ));
    }
    let mut differ = host
        .iter()
        .zip(dev)
        .enumerate()
        .filter(|(_, (h, d))| h.to_bits() != d.to_bits());
    let (first, (h, d)) = differ.next()?;
    let count = 1 + differ.count();
    Some(format!(
        "{label}: {count} of {} words differ, first at {first}: host 0x{:08x} ({h:e}) device 0x{:08x} ({d:e})",
        host.len(),
        h.to_bits(),
        d.to_bits()
    ))
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

mod attention;
mod errors;
mod grouped;
mod routing;
