//! HostResident: its device ops conform bitwise to the host ops of the reference and cpu
//! backends; inconsistent inputs are errors, not panics; the counters count as documented; and
//! the conformance checker catches a device that is one ulp off.

use dsv4_backend_cpu::CpuBackend;
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::IndexKDtype;
use dsv4_kernels::device_check::{conformance, conformance_of};
use dsv4_kernels::{
    Backend, Copy2d, DevBufId, DevSlice, DeviceOps, DeviceStats, HcParams, HostResident,
    KernelError, Linear, PagedAttention, PagedIndexer, RopeTable,
};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn assert_conforms(be: &HostResident) {
    let t = Instant::now();
    let fails = conformance(be);
    println!("conformance over {}: {:?}", be.inner().name(), t.elapsed());
    assert!(fails.is_empty(), "{}", fails.join("\n"));
    assert_eq!(be.live_buffers(), 0, "the checker leaked device buffers");
}

#[test]
fn conformance_over_reference_is_empty() {
    assert_conforms(&HostResident::new(Arc::new(ReferenceBackend)));
}

#[test]
fn conformance_with_routing_and_attention_on_the_device_is_empty() {
    // The routing ops' and attention's own cases run only where the device offers them.
    assert_conforms(&HostResident::new(Arc::new(ReferenceBackend)).with_device_attention());
    assert_conforms(&HostResident::new(Arc::new(ReferenceBackend)).with_device_routing());
    assert_conforms(
        &HostResident::new(Arc::new(CpuBackend::new(2).unwrap())).with_device_routing(),
    );
}

#[test]
fn conformance_over_cpu_is_empty() {
    assert_conforms(&HostResident::new(Arc::new(CpuBackend::new(2).unwrap())));
}

#[test]
fn a_backend_without_device_ops_is_reported() {
    assert_eq!(
        conformance(&ReferenceBackend),
        vec!["backend has no device op set".to_string()]
    );
}

fn is_device_err<T: std::fmt::Debug>(r: Result<T, KernelError>) -> bool {
    matches!(r, Err(KernelError::Device { .. }))
}

#[test]
fn inconsistent_inputs_are_errors() {
    let be = HostResident::new(Arc::new(ReferenceBackend));
    let dev = be.device().unwrap();
    assert_eq!(dev.offset_alignment(), 256);
    let b = dev.alloc(512).unwrap();
    let s = DevSlice::whole(b, 128);
    let at = |off, len| DevSlice { buf: b, off, len };
    // Misaligned offsets: 16 words is 64 bytes.
    assert!(is_device_err(dev.add(at(16, 128), s, at(256, 128))));
    assert!(is_device_err(dev.write(at(1, 4), &[0.0; 4])));
    assert!(is_device_err(dev.read(at(32, 4))));
    // Aligned (64 words = 256 bytes) is fine, also in place.
    dev.add(at(64, 128), s, at(64, 128)).unwrap();
    // Wrong lengths.
    assert!(is_device_err(dev.write(s, &[0.0; 127])));
    assert!(is_device_err(dev.add(s, at(128, 64), at(256, 128))));
    assert!(is_device_err(dev.rms_norm(
        s,
        None,
        100,
        1e-6,
        at(256, 128)
    )));
    assert!(is_device_err(dev.rms_norm(
        s,
        Some(&[1.0; 3]),
        128,
        1e-6,
        at(256, 128)
    )));
    assert!(is_device_err(dev.hadamard(at(0, 96), 96)));
    assert!(is_device_err(dev.rope(
        s,
        64,
        &[0],
        &RopeTable::plain(64, 1e4),
        false
    )));
    assert!(is_device_err(dev.swiglu_rows(s, s, 1.0, &[1.0], 64, s)));
    let w = Linear::from_f32("w", 2, 64, &[0.5; 128]).unwrap();
    assert!(is_device_err(dev.linear(&w, s, 1, at(256, 2))));
    let cp = Copy2d {
        src_col: 1,
        ..Copy2d::contiguous(128)
    };
    assert!(is_device_err(dev.copy2d(s, at(256, 128), cp)));
    assert!(is_device_err(dev.gather_rows(s, &[2], 64, at(256, 64))));
    assert!(is_device_err(dev.scatter_add_rows(at(0, 64), &[2], 64, s)));
    let p = HcParams {
        fn_w: &[0.0; 10],
        base: &[0.0; 24],
        scale: &[1.0; 3],
        m: 4,
        d: 32,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 2,
    };
    let (u, post, comb) = (at(256, 32), at(320, 4), at(384, 16));
    assert!(is_device_err(dev.mhc_pre(&p, s, 1, u, post, comb)));
    // Out of range, unknown and freed buffers.
    assert!(is_device_err(dev.read(at(256, 257))));
    assert!(is_device_err(dev.read(DevSlice::whole(DevBufId(9999), 1))));
    dev.free(b);
    assert!(is_device_err(dev.read(s)));
    assert!(is_device_err(dev.scale(s, 2.0)));
    dev.free(b); // a second free is harmless
}

#[test]
fn stats_count_as_documented() {
    let be = HostResident::new(Arc::new(ReferenceBackend));
    let dev = be.device().unwrap();
    let s0 = dev.stats();
    let b = dev.alloc(256).unwrap();
    let x = DevSlice::whole(b, 128);
    let y = DevSlice {
        buf: b,
        off: 128,
        len: 128,
    };
    dev.write(x, &[1.5; 128]).unwrap();
    dev.flush().unwrap(); // nothing queued: no submission
    dev.scale(x, 2.0).unwrap();
    dev.rms_norm(x, None, 64, 1e-6, y).unwrap();
    assert!(dev.add(x, y, DevSlice::whole(b, 1)).is_err()); // failures count nothing
    dev.flush().unwrap();
    dev.flush().unwrap();
    let v = dev.read(y).unwrap();
    assert_eq!(v.len(), 128);
    assert_eq!(dev.read(x).unwrap(), vec![3.0; 128]);
    let d = dev.stats().since(&s0);
    assert_eq!(
        d,
        DeviceStats {
            submissions: 3,
            dispatches: 2,
            reads: 2,
            read_bytes: 1024,
            writes: 1,
            write_bytes: 512,
            allocs: 1,
            ..DeviceStats::default()
        }
    );
    assert_eq!(be.live_buffers(), 1);
    dev.free(b);
    assert_eq!(be.live_buffers(), 0);
}

#[test]
fn host_ops_delegate_and_the_name_is_fixed() {
    let be = HostResident::new(Arc::new(ReferenceBackend));
    assert_eq!(be.name(), "host-resident");
    let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    let (mut a, mut b) = (vec![0f32; 256], vec![0f32; 256]);
    be.rms_norm(&x, None, 128, 1e-6, &mut a);
    ReferenceBackend.rms_norm(&x, None, 128, 1e-6, &mut b);
    assert_eq!(a, b);
}

/// A deliberate bug in a device, to show the checker can fail.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// `add` is one ulp off in its last word.
    AddUlp,
    /// `add` panics on outputs of the wrong length instead of returning an error.
    AddPanics,
    /// `scale` also scales the word after its slice.
    ScalePastEnd,
    /// `paged_attention` keeps the pages of its first call with tags (per page size) and
    /// reads those ever after, whatever the tags say (a page cache that misses a retag).
    StalePages,
    /// `paged_indexer_topk` drops each query's last chosen id.
    IndexerDropsLast,
    /// `cache_encode_into` flips the low bit of its first byte.
    EncodeFlipsABit,
}

/// The reference backend's HostResident with one [`Fault`] (and, for
/// [`Fault::StalePages`], the pages it kept).
struct Faulty(HostResident, Fault, Mutex<Option<Vec<Vec<u8>>>>);

impl DeviceOps for Faulty {
    fn offset_alignment(&self) -> usize {
        self.d().offset_alignment()
    }
    fn alloc(&self, words: usize) -> Result<DevBufId, KernelError> {
        self.d().alloc(words)
    }
    fn free(&self, buf: DevBufId) {
        self.d().free(buf)
    }
    fn write(&self, dst: DevSlice, src: &[f32]) -> Result<(), KernelError> {
        self.d().write(dst, src)
    }
    fn read(&self, src: DevSlice) -> Result<Vec<f32>, KernelError> {
        self.d().read(src)
    }
    fn flush(&self) -> Result<(), KernelError> {
        self.d().flush()
    }
    fn stats(&self) -> DeviceStats {
        self.d().stats()
    }
    fn copy2d(&self, src: DevSlice, dst: DevSlice, shape: Copy2d) -> Result<(), KernelError> {
        self.d().copy2d(src, dst, shape)
    }
    fn gather_rows(
        &self,
        s: DevSlice,
        i: &[u32],
        w: usize,
        d: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().gather_rows(s, i, w, d)
    }
    fn scatter_add_rows(
        &self,
        s: DevSlice,
        i: &[u32],
        w: usize,
        d: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().scatter_add_rows(s, i, w, d)
    }
    fn add(&self, a: DevSlice, b: DevSlice, out: DevSlice) -> Result<(), KernelError> {
        if self.1 == Fault::AddPanics {
            assert_eq!(a.len, out.len, "add: lengths differ");
        }
        self.d().add(a, b, out)?;
        if self.1 == Fault::AddUlp {
            let mut v = self.d().read(out)?;
            if let Some(last) = v.last_mut() {
                *last = f32::from_bits(last.to_bits() + 1);
            }
            self.d().write(out, &v)?;
        }
        Ok(())
    }
    fn read_many(&self, srcs: &[DevSlice]) -> Result<Vec<Vec<f32>>, KernelError> {
        self.d().read_many(srcs)
    }
    fn router_scores(&self, logits: DevSlice, out: DevSlice) -> Result<(), KernelError> {
        self.d().router_scores(logits, out)
    }
    fn scale(&self, x: DevSlice, s: f64) -> Result<(), KernelError> {
        self.d().scale(x, s)?;
        if self.1 == Fault::ScalePastEnd {
            // Only when the word after the slice exists (the checker's guard words).
            let wider = DevSlice {
                len: x.len + 1,
                ..x
            };
            if let Ok(mut v) = self.d().read(wider) {
                v[x.len] *= s as f32;
                self.d().write(wider, &v)?;
            }
        }
        Ok(())
    }
    fn linear(
        &self,
        w: &Linear,
        x: DevSlice,
        rows: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().linear(w, x, rows, out)
    }
    fn act_quant_fp8(&self, x: DevSlice, dim: usize) -> Result<(), KernelError> {
        self.d().act_quant_fp8(x, dim)
    }
    fn rms_norm(
        &self,
        x: DevSlice,
        w: Option<&[f32]>,
        dim: usize,
        eps: f32,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().rms_norm(x, w, dim, eps, out)
    }
    fn rope(
        &self,
        x: DevSlice,
        dim: usize,
        pos: &[usize],
        t: &RopeTable,
        inv: bool,
    ) -> Result<(), KernelError> {
        self.d().rope(x, dim, pos, t, inv)
    }
    fn hadamard(&self, x: DevSlice, dim: usize) -> Result<(), KernelError> {
        self.d().hadamard(x, dim)
    }
    fn round_index_rows(&self, t: IndexKDtype, x: DevSlice, dim: usize) -> Result<(), KernelError> {
        self.d().round_index_rows(t, x, dim)
    }
    fn mhc_pre(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        u: DevSlice,
        post: DevSlice,
        comb: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().mhc_pre(p, x, t, u, post, comb)
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
    ) -> Result<(), KernelError> {
        self.d().mhc_post(x, y, post, comb, m, d, out)
    }
    fn hc_head(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        o: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().hc_head(p, x, t, o)
    }
    fn swiglu_rows(
        &self,
        g: DevSlice,
        u: DevSlice,
        limit: f32,
        weights: &[f32],
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().swiglu_rows(g, u, limit, weights, width, out)
    }
    fn attends_on_device(&self) -> bool {
        self.d().attends_on_device()
    }
    fn cache_encode_into(
        &self,
        fmt: &dsv4_kernels::RowFormat,
        x: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().cache_encode_into(fmt, x, out)?;
        if self.1 == Fault::EncodeFlipsABit && out.len > 0 {
            let first = out.prefix(1);
            let w = self.d().read(first)?[0];
            self.d().write(first, &[f32::from_bits(w.to_bits() ^ 1)])?;
        }
        Ok(())
    }
    fn softmax_pool_rows(
        &self,
        a: DevSlice,
        z: DevSlice,
        windows: usize,
        rows: usize,
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.d().softmax_pool_rows(a, z, windows, rows, width, out)
    }
    fn paged_indexer_topk(
        &self,
        keys: &PagedIndexer<'_>,
        q: DevSlice,
        w: DevSlice,
    ) -> Result<Vec<Vec<usize>>, KernelError> {
        let mut chosen = self.d().paged_indexer_topk(keys, q, w)?;
        if self.1 == Fault::IndexerDropsLast {
            chosen.iter_mut().for_each(|c| {
                c.pop();
            });
        }
        Ok(chosen)
    }
    fn paged_attention(
        &self,
        keys: &PagedAttention<'_>,
        q: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        if self.1 != Fault::StalePages || keys.tags.is_empty() {
            return self.d().paged_attention(keys, q, out);
        }
        let mut kept = self.2.lock().unwrap();
        // Kept per layout: pages of another size replace them.
        let same =
            |k: &Vec<Vec<u8>>| k.first().map(Vec::len) == keys.pages.first().map(|p| p.len());
        if !kept.as_ref().is_some_and(same) {
            *kept = Some(keys.pages.iter().map(|p| p.to_vec()).collect());
        }
        let pages = kept.as_ref().unwrap();
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let stale = PagedAttention {
            pages: &refs,
            ..*keys
        };
        self.d().paged_attention(&stale, q, out)
    }
}

impl Faulty {
    fn d(&self) -> &dyn DeviceOps {
        self.0.device().unwrap()
    }
}

fn faulty(fault: Fault) -> Vec<String> {
    let be = HostResident::new(Arc::new(ReferenceBackend));
    let be = match fault {
        Fault::StalePages | Fault::IndexerDropsLast | Fault::EncodeFlipsABit => {
            be.with_device_attention()
        }
        _ => be,
    };
    let broken = Faulty(be, fault, Mutex::new(None));
    let fails = conformance_of(&broken.0, &broken);
    println!("{}", fails.join("\n"));
    fails
}

#[test]
fn a_device_one_ulp_off_in_add_is_caught() {
    let fails = faulty(Fault::AddUlp);
    assert!(
        fails
            .iter()
            .any(|f| f.starts_with("add n=384: 1 of 384 words differ, first at 383")),
        "{fails:#?}"
    );
    // Only add and the chain that uses it fail.
    assert!(
        fails
            .iter()
            .all(|f| f.starts_with("add ") || f.starts_with("chain ")),
        "{fails:#?}"
    );
}

#[test]
fn a_device_that_panics_on_bad_input_is_caught() {
    let fails = faulty(Fault::AddPanics);
    assert_eq!(
        fails,
        vec![
            "add with an output one word short: panicked instead of returning an error: \
             assertion `left == right` failed: add: lengths differ\n  left: 256\n right: 255"
                .to_string()
        ]
    );
}

#[test]
fn a_device_that_writes_outside_its_slice_is_caught() {
    let fails = faulty(Fault::ScalePastEnd);
    assert!(!fails.is_empty());
    assert!(
        fails
            .iter()
            .all(|f| (f.starts_with("scale ") || f.starts_with("chain "))
                && f.contains("outside the slice")),
        "{fails:#?}"
    );
}

#[test]
fn a_device_that_reads_stale_pages_is_caught() {
    let fails = faulty(Fault::StalePages);
    // Every shape's call after the page was rewritten under a new tag, and only that call.
    assert_eq!(fails.len(), 3, "{fails:#?}");
    assert!(
        fails
            .iter()
            .all(|f| f.starts_with("paged_attention ") && f.contains(" pass 3: ")),
        "{fails:#?}"
    );
}

#[test]
fn a_device_whose_indexer_drops_an_id_is_caught() {
    let fails = faulty(Fault::IndexerDropsLast);
    // Each index-K format's three passes.
    assert_eq!(fails.len(), 9, "{fails:#?}");
    assert!(
        fails
            .iter()
            .all(|f| f.starts_with("paged_indexer_topk ") && f.contains(": chose ")),
        "{fails:#?}"
    );
}

#[test]
fn a_device_whose_encoder_flips_a_bit_is_caught() {
    let fails = faulty(Fault::EncodeFlipsABit);
    // Five formats, two row counts.
    assert_eq!(fails.len(), 10, "{fails:#?}");
    assert!(
        fails
            .iter()
            .all(|f| f.starts_with("cache_encode_into ") && f.contains("first difference")),
        "{fails:#?}"
    );
}
