//! Where the time of a forward pass goes, per op: the cpu backend wrapped in a timing backend,
//! a prefill of the small config, then 32 decode steps, each with its own table (not a test).
//! The decode also gets a table of its 1-row linears by weight format and shape.
//!
//! `cargo run --release -p dsv4-backend-cpu --example op_profile [threads] [tokens] [f64|f32]`
//! (the last: the linears' sums, `backend.cpu_sums`; default f64)

use dsv4_backend_cpu::{CpuBackend, Sums};
use dsv4_core::cache::CacheLayoutError;
use dsv4_core::{IndexKDtype, Numerics, SplitMix64, Tensor};
use dsv4_kernels::{Backend, HcParams, Linear, MhcPre, RopeTable, RowFormat, WeightFormat};
use dsv4_model::{Model, ModelConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// 1-row linears by (format, out, in): seconds, calls, stored bytes read per call.
type GemvTimes = HashMap<(WeightFormat, usize, usize), (f64, usize, usize)>;

/// The cpu backend with a per-op wall-clock account: seconds, calls and (linear only) flops.
struct Timed {
    inner: CpuBackend,
    t: Mutex<HashMap<&'static str, (f64, usize, f64)>>,
    /// The decode's 1-row linears by shape.
    gemv: Mutex<GemvTimes>,
}
impl Timed {
    /// Run `f`, charging its time to `name`.
    fn rec<R>(&self, name: &'static str, f: impl FnOnce() -> R) -> R {
        self.rec_flops(name, 0.0, f)
    }
    /// [`Self::rec`] for an op of `flops` floating-point operations.
    fn rec_flops<R>(&self, name: &'static str, flops: f64, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let r = f();
        let e = t.elapsed().as_secs_f64();
        let mut m = self.t.lock().unwrap();
        let x = m.entry(name).or_default();
        x.0 += e;
        x.1 += 1;
        x.2 += flops;
        r
    }
}
impl Backend for Timed {
    fn name(&self) -> &'static str {
        "timed"
    }
    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        let name = match rows {
            1 => "linear 1 row",
            2..=12 => "linear 2-12 rows",
            _ => "linear 13+ rows",
        };
        let flops = 2.0 * (rows * w.in_dim * w.out_dim) as f64;
        let t = Instant::now();
        self.rec_flops(name, flops, || self.inner.linear(w, x, rows, out));
        if rows == 1 {
            let mut m = self.gemv.lock().unwrap();
            let e = m.entry((w.format, w.out_dim, w.in_dim)).or_default();
            e.0 += t.elapsed().as_secs_f64();
            e.1 += 1;
            e.2 = w.stored_bytes();
        }
    }
    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        self.rec("act_quant", || self.inner.act_quant_fp8(x, dim))
    }
    fn rms_norm(&self, x: &[f32], w: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        self.rec("rms_norm", || self.inner.rms_norm(x, w, dim, eps, out))
    }
    fn rope(&self, x: &mut [f32], dim: usize, p: &[usize], t: &RopeTable, inv: bool) {
        self.rec("rope", || self.inner.rope(x, dim, p, t, inv))
    }
    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        self.rec("mhc_pre", || self.inner.mhc_pre(p, x, t))
    }
    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        self.rec("mhc_post", || self.inner.mhc_post(x, y, pre, m, d, out))
    }
    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        self.rec("hc_head", || self.inner.hc_head(p, x, t, out))
    }
    fn softmax_pool(&self, a: &[f32], z: &[f32], r: usize, w: usize, out: &mut [f32]) {
        self.rec("softmax_pool", || self.inner.softmax_pool(a, z, r, w, out))
    }
    fn hadamard(&self, x: &mut [f32], dim: usize) {
        self.rec("hadamard", || self.inner.hadamard(x, dim))
    }
    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, k: &[f32], out: &mut [f32]) {
        self.rec("indexer_scores", || {
            self.inner.indexer_scores(q, w, dim, k, out)
        })
    }
    fn topk(&self, s: &[f32], k: usize) -> Vec<usize> {
        self.rec("topk", || self.inner.topk(s, k))
    }
    fn sparse_attention(
        &self,
        q: &[f32],
        dim: usize,
        k: &[f32],
        s: &[f32],
        sc: f32,
        out: &mut [f32],
    ) {
        self.rec("sparse_attention", || {
            self.inner.sparse_attention(q, dim, k, s, sc, out)
        })
    }
    fn sparse_attention_indexed(
        &self,
        q: &[f32],
        dim: usize,
        k: &[f32],
        ids: &[usize],
        starts: &[usize],
        s: &[f32],
        sc: f32,
        out: &mut [f32],
    ) {
        self.rec("sparse_attention_indexed", || {
            self.inner
                .sparse_attention_indexed(q, dim, k, ids, starts, s, sc, out)
        })
    }
    fn indexer_topk_ranges(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        ranges: &[(usize, usize)],
        k: usize,
    ) -> Vec<Vec<usize>> {
        self.rec("indexer_topk_ranges", || {
            self.inner.indexer_topk_ranges(q, w, dim, keys, ranges, k)
        })
    }
    fn router_scores(&self, l: &[f32], out: &mut [f32]) {
        self.rec("router", || self.inner.router_scores(l, out))
    }
    fn swiglu(&self, g: &[f32], u: &[f32], l: f32, w: f32, out: &mut [f32]) {
        self.rec("swiglu", || self.inner.swiglu(g, u, l, w, out))
    }
    fn cache_store(
        &self,
        f: &RowFormat,
        p: &mut [u8],
        s: usize,
        v: &[f32],
    ) -> Result<(), CacheLayoutError> {
        self.rec("cache_store", || self.inner.cache_store(f, p, s, v))
    }
    fn cache_load(
        &self,
        f: &RowFormat,
        p: &[u8],
        s: usize,
        o: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        self.rec("cache_load", || self.inner.cache_load(f, p, s, o))
    }
    fn round_index_rows(&self, d: IndexKDtype, x: &mut [f32], dim: usize) {
        self.rec("round_index", || self.inner.round_index_rows(d, x, dim))
    }
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let tokens: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let sums = match std::env::args().nth(3).as_deref() {
        None | Some("f64") => Sums::F64,
        Some("f32") => Sums::F32,
        Some(other) => panic!("unknown sums `{other}` (allowed: f64, f32)"),
    };
    let cfg = ModelConfig::small();
    let weights: HashMap<String, Tensor> = dsv4_model::tiny::generate_weights(&cfg, 0)
        .unwrap()
        .into_iter()
        .collect();
    let be = Arc::new(Timed {
        inner: CpuBackend::new(threads).unwrap().with_sums(sums),
        t: Mutex::new(HashMap::new()),
        gemv: Mutex::new(HashMap::new()),
    });
    let model = Model::load(cfg.clone(), &weights, be.clone(), Numerics::default()).unwrap();
    let mut g = SplitMix64::new(5);
    let toks: Vec<u32> = (0..tokens)
        .map(|_| 2 + g.below(cfg.vocab_size as u64 - 2) as u32)
        .collect();
    model.forward(&mut model.new_sequence(), &toks).unwrap();
    be.t.lock().unwrap().clear();
    be.gemv.lock().unwrap().clear();
    let t = Instant::now();
    let mut st = model.new_sequence();
    model.forward(&mut st, &toks).unwrap();
    let total = t.elapsed().as_secs_f64();
    let prefill = std::mem::take(&mut *be.t.lock().unwrap());
    be.gemv.lock().unwrap().clear();
    let t = Instant::now();
    for i in 0..32 {
        model.forward(&mut st, &toks[i..i + 1]).unwrap();
    }
    let dec = t.elapsed().as_secs_f64() / 32.0;
    println!("prefill {tokens}: {:.1} ms", total * 1e3);
    print_ops(&prefill);
    println!("decode: {:.2} ms/token over 32 steps", dec * 1e3);
    print_ops(&be.t.lock().unwrap());
    print_gemv(&be.gemv.lock().unwrap());
}

/// The decode's 1-row linears by format and shape, slowest first, with the stored bytes they
/// read per second.
fn print_gemv(m: &GemvTimes) {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| b.1.0.partial_cmp(&a.1.0).unwrap());
    println!("  1-row linears by shape");
    for ((f, o, i), (s, n, bytes)) in v {
        let each = s / *n as f64;
        let rate = *bytes as f64 / each / 1e9;
        let shape = format!("{f:?} {o}x{i}");
        println!(
            "{shape:>22}: {:8.1} ms {n:7} calls {:7.1} us/call {rate:6.1} GB/s",
            s * 1e3,
            each * 1e6
        );
    }
}

/// One table of per-op seconds, calls and rates, slowest first.
fn print_ops(m: &HashMap<&'static str, (f64, usize, f64)>) {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| b.1.0.partial_cmp(&a.1.0).unwrap());
    let ops: f64 = v.iter().map(|x| x.1.0).sum();
    println!("  ops total {:.1} ms", ops * 1e3);
    for (k, (s, n, flops)) in v {
        let rate = if *flops > 0.0 {
            format!(" {:7.1} GFLOP/s", flops / s / 1e9)
        } else {
            String::new()
        };
        println!("{k:>18}: {:8.1} ms {:7} calls{rate}", s * 1e3, n);
    }
}
