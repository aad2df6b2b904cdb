//! [`DeviceOps`] of the wgpu backend: each op checks its slices, then records the same
//! dispatches as the host op of the same name (the `enc_*` functions of ops.rs / ops_attn.rs)
//! into the pending encoder, over ranges of the resident buffers. In-place ops whose kernel
//! reads a whole block before writing (act_quant, index rounding) read from a copy in a
//! persistent scratch buffer; per-call host data (positions, row indices, row weights) is
//! written into persistent scratch buffers in order with the dispatches.

use crate::WgpuBackend;
use crate::gpu::{copy_f32, grid};
use crate::ops::{
    check_hadamard, enc_act_quant, enc_hadamard, enc_linear, enc_rms_norm, enc_rope,
    enc_round_index, rope_aux, split3,
};
use crate::ops_attn::{
    acc_bytes, check_streams, coef_table, enc_hc_head, enc_mhc_post, enc_mhc_pre, mhc_nout,
};
use crate::resident::{Held, dev_err};
use dsv4_core::IndexKDtype;
use dsv4_kernels::device::{check_len, check_mhc_post, check_mhc_pre, check_rope, ensure, rows_of};
use dsv4_kernels::{
    Copy2d, DevBufId, DevSlice, DeviceOps, DeviceStats, HcParams, KernelError, Linear, RopeTable,
};

type R<T> = Result<T, KernelError>;

/// The HcParams table sizes an mHC op needs.
fn check_hc(op: &str, p: &HcParams<'_>, n_out: usize, n_scale: usize) -> R<()> {
    check_streams(p.m).map_err(dev_err)?;
    ensure(
        p.d > 0
            && p.fn_w.len() == n_out * p.m * p.d
            && p.base.len() == n_out
            && p.scale.len() == n_scale,
        op,
        || {
            format!(
                "HcParams M={} D={} have tables of the wrong sizes",
                p.m, p.d
            )
        },
    )
}

fn u32_bytes(v: &[u32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl WgpuBackend {
    /// A checked slice that a dispatch binds.
    fn bound(&self, op: &str, what: &str, s: DevSlice) -> R<Held> {
        self.resident.slice(&self.gpu, op, what, s, true)
    }

    /// Copy `x` into a persistent scratch buffer, then run `f(step, copy, x)` (in-place ops
    /// whose threads read more than their own element).
    fn via_copy(
        &self,
        tag: &'static str,
        x: &Held,
        f: impl FnOnce(&mut crate::gpu::Step<'_>, crate::setup::Bind<'_>, crate::setup::Bind<'_>),
    ) -> R<()> {
        let tmp = self
            .resident
            .scratch(&self.gpu, tag, x.bind().size as usize)?;
        self.resident.encode(&self.gpu, |st| {
            st.copy(x.bind(), tmp.bind(), x.bind().size);
            f(st, tmp.bind(), x.bind())
        });
        Ok(())
    }

    /// The persistent scratch buffer that per-call words (`bytes` of them) are written to, in
    /// the same `encode` as the dispatch that reads them.
    fn words_buf(&self, tag: &'static str, bytes: &[u8]) -> R<Held> {
        self.resident.scratch(&self.gpu, tag, bytes.len())
    }

    /// `x = (f64(x)·s) as f32` on the host: read, scale, write (devices without f64).
    /// An element-wise kernel over device slices, bound as the host ops bind it (ops.rs
    /// `elementwise`): `a` at 1, `b` (if any) at 2, `out` at 3, one thread per value.
    fn elementwise_dev(
        &self,
        kernel: &'static str,
        a: DevSlice,
        b: Option<DevSlice>,
        out: DevSlice,
    ) -> R<()> {
        if let Some(b) = b {
            check_len(kernel, "b", b, a.len)?;
        }
        check_len(kernel, "out", out, a.len)?;
        let ah = self.bound(kernel, "a", a)?;
        let bh = b.map(|b| self.bound(kernel, "b", b)).transpose()?;
        let oh = self.bound(kernel, "out", out)?;
        if a.len == 0 {
            return Ok(());
        }
        let mut binds = vec![(1, ah.bind())];
        if let Some(bh) = &bh {
            binds.push((2, bh.bind()));
        }
        binds.push((3, oh.bind()));
        self.resident.encode(&self.gpu, |st| {
            st.dispatch(kernel, &[a.len as u32], &binds, grid(a.len, 256))
        });
        Ok(())
    }

    fn scale_on_host(&self, x: DevSlice, s: f64) -> R<()> {
        let mut v = self.read(x)?;
        v.iter_mut().for_each(|e| *e = (f64::from(*e) * s) as f32);
        self.write(x, &v)
    }
}

impl DeviceOps for WgpuBackend {
    fn offset_alignment(&self) -> usize {
        self.gpu.limits().min_storage_buffer_offset_alignment as usize
    }

    fn alloc(&self, words: usize) -> R<DevBufId> {
        self.resident.alloc(&self.gpu, words)
    }

    fn free(&self, buf: DevBufId) {
        self.resident.free(&self.gpu, buf)
    }

    fn write(&self, dst: DevSlice, src: &[f32]) -> R<()> {
        check_len("write", "dst", dst, src.len())?;
        let h = self.resident.slice(&self.gpu, "write", "dst", dst, false)?;
        if !src.is_empty() {
            self.resident.encode(&self.gpu, |st| {
                st.write(bytemuck::cast_slice(src), h.bind())
            });
        }
        Ok(())
    }

    fn read(&self, src: DevSlice) -> R<Vec<f32>> {
        Ok(self.read_many(&[src])?.remove(0))
    }

    fn read_many(&self, srcs: &[DevSlice]) -> R<Vec<Vec<f32>>> {
        let held = srcs
            .iter()
            .map(|&s| self.resident.slice(&self.gpu, "read", "src", s, false))
            .collect::<R<Vec<_>>>()?;
        let wanted: Vec<&_> = held
            .iter()
            .zip(srcs)
            .filter(|(_, s)| s.len > 0)
            .map(|(h, _)| h)
            .collect();
        if wanted.is_empty() {
            self.flush()?;
            return Ok(vec![Vec::new(); srcs.len()]);
        }
        let mut bytes = self.resident.read(&self.gpu, &wanted)?.into_iter();
        let mut out = Vec::with_capacity(srcs.len());
        for s in srcs {
            let mut v = vec![0f32; s.len];
            if s.len > 0 {
                let b = bytes.next().ok_or_else(|| KernelError::Device {
                    message: "read: fewer ranges came back than were read".into(),
                })?;
                copy_f32(&b, &mut v);
            }
            out.push(v);
        }
        Ok(out)
    }

    fn flush(&self) -> R<()> {
        self.resident.flush(&self.gpu)
    }

    fn stats(&self) -> DeviceStats {
        self.gpu.stats()
    }

    fn copy2d(&self, src: DevSlice, dst: DevSlice, sh: Copy2d) -> R<()> {
        ensure(sh.fits(src.len, dst.len), "copy2d", || {
            format!(
                "{sh:?} does not fit a source of {} and a destination of {} words",
                src.len, dst.len
            )
        })?;
        let (s, d) = (
            self.bound("copy2d", "src", src)?,
            self.bound("copy2d", "dst", dst)?,
        );
        if sh.rows == 0 || sh.width == 0 {
            return Ok(());
        }
        let params = [sh.rows, sh.width, sh.src_stride, sh.src_col]
            .into_iter()
            .chain([sh.dst_stride, sh.dst_col])
            .map(|v| v as u32)
            .collect::<Vec<_>>();
        self.resident.encode(&self.gpu, |st| {
            st.dispatch(
                "copy2d",
                &params,
                &[(1, s.bind()), (3, d.bind())],
                grid(sh.rows * sh.width, 256),
            )
        });
        Ok(())
    }

    fn gather_rows(&self, src: DevSlice, idx: &[u32], width: usize, dst: DevSlice) -> R<()> {
        let op = "gather_rows";
        let n = rows_of(op, "src", src, width)?;
        check_len(op, "dst", dst, idx.len() * width)?;
        ensure(idx.iter().all(|&i| (i as usize) < n), op, || {
            format!("an index is past the {n} source rows")
        })?;
        let (s, d) = (self.bound(op, "src", src)?, self.bound(op, "dst", dst)?);
        if dst.len == 0 {
            return Ok(());
        }
        let ib = self.words_buf("gather indices", u32_bytes(idx))?;
        self.resident.encode(&self.gpu, |st| {
            st.write(u32_bytes(idx), ib.bind());
            st.dispatch(
                "gather_rows",
                &[idx.len() as u32, width as u32],
                &[(1, s.bind()), (2, ib.bind()), (3, d.bind())],
                grid(dst.len, 256),
            )
        });
        Ok(())
    }

    fn scatter_add_rows(&self, src: DevSlice, idx: &[u32], width: usize, dst: DevSlice) -> R<()> {
        let op = "scatter_add_rows";
        let n = rows_of(op, "dst", dst, width)?;
        check_len(op, "src", src, idx.len() * width)?;
        ensure(idx.iter().all(|&i| (i as usize) < n), op, || {
            format!("an index is past the {n} destination rows")
        })?;
        let mut seen = vec![false; n];
        ensure(
            idx.iter()
                .all(|&i| !std::mem::replace(&mut seen[i as usize], true)),
            op,
            || "the indices are not distinct".to_string(),
        )?;
        let (s, d) = (self.bound(op, "src", src)?, self.bound(op, "dst", dst)?);
        if src.len == 0 {
            return Ok(());
        }
        let ib = self.words_buf("scatter indices", u32_bytes(idx))?;
        self.resident.encode(&self.gpu, |st| {
            st.write(u32_bytes(idx), ib.bind());
            st.dispatch(
                "scatter_add_rows",
                &[idx.len() as u32, width as u32],
                &[(1, s.bind()), (2, ib.bind()), (3, d.bind())],
                grid(src.len, 256),
            )
        });
        Ok(())
    }

    fn add(&self, a: DevSlice, b: DevSlice, out: DevSlice) -> R<()> {
        self.elementwise_dev("add", a, Some(b), out)
    }

    fn router_scores(&self, logits: DevSlice, out: DevSlice) -> R<()> {
        self.elementwise_dev("router_scores", logits, None, out)
    }

    fn scale(&self, x: DevSlice, s: f64) -> R<()> {
        let h = self.bound("scale", "x", x)?;
        if x.len == 0 {
            return Ok(());
        }
        // With f64 the kernel forms s from three f32 parts (exact when their sum is s) and
        // computes what the host does. With f32 `acc` it computes round_f32(x·s), which equals
        // (f64(x)·s) as f32 when s is an f32 (x·s is then exact in f64): other factors are
        // scaled on the host (read, scale, write; counted as a read and a write).
        let parts = split3(s);
        let finite = parts.iter().all(|p| p.is_finite());
        let usable = if self.gpu.report().f64_accumulation {
            let sum = (f64::from(parts[0]) + f64::from(parts[1])) + f64::from(parts[2]);
            finite && sum.to_bits() == s.to_bits()
        } else {
            // (-0.0 excepted: the shader's part sum -0 + 0 + 0 is +0.)
            finite && f64::from(parts[0]).to_bits() == s.to_bits() && s.to_bits() != 1 << 63
        };
        if !usable {
            return self.scale_on_host(x, s);
        }
        let params = [
            x.len as u32,
            parts[0].to_bits(),
            parts[1].to_bits(),
            parts[2].to_bits(),
        ];
        self.resident.encode(&self.gpu, |st| {
            st.dispatch("scale", &params, &[(3, h.bind())], grid(x.len, 256))
        });
        Ok(())
    }

    fn linear(&self, w: &Linear, x: DevSlice, rows: usize, out: DevSlice) -> R<()> {
        check_len("linear", "x", x, rows * w.in_dim)?;
        check_len("linear", "out", out, rows * w.out_dim)?;
        let (xh, oh) = (
            self.bound("linear", "x", x)?,
            self.bound("linear", "out", out)?,
        );
        if out.len == 0 {
            return Ok(());
        }
        let dw = self
            .weight(w)
            .map_err(|e| dev_err(format!("linear {}: {e}", w.name)))?;
        let (o, i) = (w.out_dim, w.in_dim);
        self.resident.encode(&self.gpu, |st| {
            enc_linear(st, &dw, o, i, rows, xh.bind(), oh.bind())
        });
        Ok(())
    }

    fn act_quant_fp8(&self, x: DevSlice, dim: usize) -> R<()> {
        rows_of("act_quant_fp8", "x", x, dim)?;
        let h = self.bound("act_quant_fp8", "x", x)?;
        if x.len > 0 {
            self.via_copy("act_quant copy", &h, |st, tmp, x_| {
                enc_act_quant(st, x.len, dim, tmp, x_)
            })?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: DevSlice,
        weight: Option<&[f32]>,
        dim: usize,
        eps: f32,
        out: DevSlice,
    ) -> R<()> {
        let op = "rms_norm";
        let rows = rows_of(op, "x", x, dim)?;
        check_len(op, "out", out, x.len)?;
        ensure(weight.is_none_or(|w| w.len() == dim), op, || {
            format!(
                "weight has {} words, dim {dim}",
                weight.map_or(0, <[f32]>::len)
            )
        })?;
        let (xh, oh) = (self.bound(op, "x", x)?, self.bound(op, "out", out)?);
        if rows == 0 {
            return Ok(());
        }
        let wh = self
            .resident
            .constant(&self.gpu, weight.unwrap_or(&[0.0]))?;
        self.resident.encode(&self.gpu, |st| {
            let binds = [xh.bind(), wh.bind(), oh.bind()];
            enc_rms_norm(st, rows, dim, eps, weight.is_some(), binds)
        });
        Ok(())
    }

    fn rope(
        &self,
        x: DevSlice,
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) -> R<()> {
        let rows = check_rope(x, dim, positions, table)?;
        let h = self.bound("rope", "x", x)?;
        if rows == 0 || table.rd == 0 {
            return Ok(());
        }
        let (aux, f32_angles) = rope_aux(&self.gpu, rows, positions, table).map_err(dev_err)?;
        let aux: &[u8] = bytemuck::cast_slice(&aux);
        let ah = self.words_buf("rope table", aux)?;
        self.resident.encode(&self.gpu, |st| {
            st.write(aux, ah.bind());
            let binds = [h.bind(), ah.bind(), h.bind()];
            enc_rope(st, rows, dim, table.rd, inverse, f32_angles, binds)
        });
        Ok(())
    }

    fn hadamard(&self, x: DevSlice, dim: usize) -> R<()> {
        check_hadamard(dim).map_err(dev_err)?;
        let rows = rows_of("hadamard", "x", x, dim)?;
        let h = self.bound("hadamard", "x", x)?;
        if rows > 0 {
            self.resident.encode(&self.gpu, |st| {
                enc_hadamard(st, rows, dim, h.bind(), h.bind())
            });
        }
        Ok(())
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: DevSlice, dim: usize) -> R<()> {
        rows_of("round_index_rows", "x", x, dim)?;
        let h = self.bound("round_index_rows", "x", x)?;
        if x.len > 0 {
            self.via_copy("round_index copy", &h, |st, tmp, x_| {
                enc_round_index(st, dtype, dim, x.len, tmp, x_)
            })?;
        }
        Ok(())
    }

    fn mhc_pre(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        u: DevSlice,
        post: DevSlice,
        comb: DevSlice,
    ) -> R<()> {
        let (op, m, d) = ("mhc_pre", p.m, p.d);
        let nout = mhc_nout(m);
        check_hc(op, p, nout, 3)?;
        check_mhc_pre(x, t, (m, d), u, post, comb)?;
        let hs = [
            self.bound(op, "x", x)?,
            self.bound(op, "u", u)?,
            self.bound(op, "post", post)?,
            self.bound(op, "comb", comb)?,
        ];
        if t == 0 {
            return Ok(());
        }
        let fh = self.resident.constant(&self.gpu, p.fn_w)?;
        let ch = self.resident.constant(&self.gpu, &coef_table(p))?;
        let mix = self
            .resident
            .scratch(&self.gpu, "mhc mix", t * nout * acc_bytes(&self.gpu))?;
        self.resident.encode(&self.gpu, |st| {
            let [xh, uh, ph, cbh] = &hs;
            let binds = [
                xh.bind(),
                fh.bind(),
                ch.bind(),
                mix.bind(),
                uh.bind(),
                ph.bind(),
                cbh.bind(),
            ];
            enc_mhc_pre(st, p, t, binds)
        });
        Ok(())
    }

    fn mhc_post(
        &self,
        x: DevSlice,
        y: DevSlice,
        post: DevSlice,
        comb: DevSlice,
        m: usize,
        d: usize,
        out: DevSlice,
    ) -> R<()> {
        let op = "mhc_post";
        let t = check_mhc_post((x, y, post, comb), m, d, out)?;
        let hs = [
            self.bound(op, "x", x)?,
            self.bound(op, "y", y)?,
            self.bound(op, "post", post)?,
            self.bound(op, "comb", comb)?,
            self.bound(op, "out", out)?,
        ];
        if t == 0 || m == 0 {
            return Ok(());
        }
        self.resident.encode(&self.gpu, |st| {
            enc_mhc_post(st, t, m, d, hs.each_ref().map(Held::bind))
        });
        Ok(())
    }

    fn hc_head(&self, p: &HcParams<'_>, x: DevSlice, t: usize, out: DevSlice) -> R<()> {
        let op = "hc_head";
        check_hc(op, p, p.m, 1)?;
        check_len(op, "x", x, t * p.m * p.d)?;
        check_len(op, "out", out, t * p.d)?;
        let (xh, oh) = (self.bound(op, "x", x)?, self.bound(op, "out", out)?);
        if t == 0 {
            return Ok(());
        }
        let fh = self.resident.constant(&self.gpu, p.fn_w)?;
        let ch = self.resident.constant(&self.gpu, &coef_table(p))?;
        let mix = self
            .resident
            .scratch(&self.gpu, "head mix", t * p.m * acc_bytes(&self.gpu))?;
        self.resident.encode(&self.gpu, |st| {
            let binds = [xh.bind(), fh.bind(), ch.bind(), mix.bind(), oh.bind()];
            enc_hc_head(st, p, t, binds)
        });
        Ok(())
    }

    fn swiglu_rows(
        &self,
        g: DevSlice,
        u: DevSlice,
        limit: f32,
        weights: &[f32],
        width: usize,
        out: DevSlice,
    ) -> R<()> {
        let op = "swiglu_rows";
        let n = weights.len() * width;
        check_len(op, "g", g, n)?;
        check_len(op, "u", u, n)?;
        check_len(op, "out", out, n)?;
        let (gh, uh, oh) = (
            self.bound(op, "g", g)?,
            self.bound(op, "u", u)?,
            self.bound(op, "out", out)?,
        );
        if n == 0 {
            return Ok(());
        }
        let wb: &[u8] = bytemuck::cast_slice(weights);
        let wh = self.words_buf("swiglu weights", wb)?;
        self.resident.encode(&self.gpu, |st| {
            st.write(wb, wh.bind());
            st.dispatch(
                "swiglu_rows",
                &[n as u32, limit.to_bits(), width as u32],
                &[
                    (1, gh.bind()),
                    (2, uh.bind()),
                    (3, oh.bind()),
                    (4, wh.bind()),
                ],
                grid(n, 256),
            )
        });
        Ok(())
    }
}
