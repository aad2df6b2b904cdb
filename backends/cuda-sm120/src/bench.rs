//! Device measurements for `dsv4 bench --backend cuda-sm120`: the device's own limits measured
//! in the same run (copy bandwidth, SIMT f32 and f64 FMA rates, mma.sync bf16/fp8 rates), the
//! linear kernels timed on device-resident operands, reported as fractions of those limits, and
//! the compute-bound attention-side kernels (the paged indexer, paged attention, mHC mixing) as
//! fractions of the FMA rate of the backend's sums, and a MoE layer with the routing on the
//! device against the same layer from host-built groups.
//!
//! Kernel times are wall-clock around a batch of launches followed by one synchronize (launches
//! are asynchronous on a GPU), the median of several batches. The linear cases are timed twice:
//! launched from the host one by one, and replayed as one CUDA graph (the device's time for the
//! kernels back to back, which a captured plan's decode sees; the host's cost per launch can
//! exceed a small GEMV's time). On the emulator the same code runs
//! with tiny sizes so the path is tested; its numbers mean nothing and are marked `emulated`.

mod routing;
mod suggest;
mod timing;

pub use routing::RoutingTiming;
pub use suggest::{DecodeSuggestion, MARGIN, RunnerUp, ShapeChoice, suggest};
pub use timing::{CallTimes, time_launches};
pub(crate) use timing::{time_graphed, time_op};

use crate::ops::attention::time_paged_attention;
use crate::ops::indexer::time_paged_scores;
use crate::ops::linear::{time_grouped, time_linear};
use crate::ops::mhc::time_mix;
use crate::{
    CudaBackend, CudaError, DecodeShape, DecodeShapes, Device, DeviceInfo, KArg, LinearPath,
};
use dsv4_kernels::{Linear, WeightFormat};
use serde::Serialize;

/// The device's limits, measured in this run.
#[derive(Debug, Clone, Serialize)]
pub struct DevicePeaks {
    /// The device, as [`crate::DeviceInfo`] prints it.
    pub device: String,
    /// True on the CPU emulator (numbers are meaningless).
    pub emulated: bool,
    /// Device-to-device copy bandwidth, bytes read + written per second / 1e9.
    pub copy_gbs: f64,
    /// SIMT f32 FMA rate, TFLOP/s.
    pub fma_f32_tflops: f64,
    /// SIMT f64 FMA rate, TFLOP/s.
    pub fma_f64_tflops: f64,
    /// Whether the backend's kernels sum in f64 (`DSV4_CUDA_ACC`, else by capability).
    pub f64_sums: bool,
    /// mma.sync m16n8k16 bf16 rate with f32 accumulation, TFLOP/s (None on the emulator).
    pub mma_bf16_tflops: Option<f64>,
    /// mma.sync m16n8k32 e4m3 rate (sm_89+; None elsewhere and on the emulator), TFLOP/s.
    pub mma_fp8_tflops: Option<f64>,
}

/// One linear case timed on the device.
#[derive(Debug, Clone, Serialize)]
pub struct LinearTiming {
    /// What was timed ("gemv_fp8 decode 4096x4096").
    pub case: String,
    /// The kernels timed: SIMT, or tensor cores (`DSV4_CUDA_LINEAR=mma`).
    pub path: LinearPath,
    /// The one-row SIMT kernels' shape (`c2w4`: columns a warp, warps a block; the backend's,
    /// from `DSV4_CUDA_DECODE` or the default); None for other kernels.
    pub shape: Option<String>,
    /// Rows (tokens) per call, per weight.
    pub rows: usize,
    /// Weights the call runs in one grouped launch (a layer's routed experts), else 1.
    pub groups: usize,
    /// Seconds per call (median), the calls replayed back to back as one CUDA graph (the
    /// device's time, as a captured plan runs the kernel); `launched_seconds` where the graph
    /// replay was not available (`graphed` false).
    pub seconds: f64,
    /// Whether `seconds` comes from graph replays.
    pub graphed: bool,
    /// Seconds per call (median) with each call launched from the host, the host's launch
    /// cost included where it exceeds the kernel's time.
    pub launched_seconds: f64,
    /// Weight bytes read per call (every group's).
    pub weight_bytes: usize,
    /// Weight bytes per second / 1e9.
    pub weight_gbs: f64,
    /// 2·rows·out·in / seconds / 1e12.
    pub tflops: f64,
    /// weight_gbs / copy_gbs (decode cases).
    pub of_copy_bandwidth: f64,
    /// The same fraction for `launched_seconds`.
    pub launched_of_copy_bandwidth: f64,
    /// Copies of the weight the calls took in turn (so the weights read exceed the L2 cache).
    pub copies: usize,
    /// tflops / the matching matrix rate, when measured: for SIMT cases bf16 mma for bf16/f32
    /// weights and fp8 mma for fp8/fp4; for tensor-core cases the bf16 mma rate their tiles
    /// run at (three mma per product, one per part of x: at most 1/3).
    pub of_matrix_rate: Option<f64>,
}

/// One decode case on one shape of the one-row SIMT kernels (every shape compiled for the
/// case's format, the backend's among them).
#[derive(Debug, Clone, Serialize)]
pub struct ShapeTiming {
    /// The case, as in [`LinearTiming::case`].
    pub case: String,
    /// The weight format's `backend.cuda_decode` key (`fp8`, `mxfp4`).
    pub format: String,
    /// The shape (`c2w8`).
    pub shape: String,
    /// Whether this is the shape the backend runs (its row of `linear`).
    pub selected: bool,
    /// Seconds per call (median; graph replays where available, as `LinearTiming::seconds`).
    pub seconds: f64,
    /// Weight bytes per second over the copy bandwidth.
    pub of_copy_bandwidth: f64,
    /// The selected shape's seconds over this shape's: above 1, this shape is faster.
    pub speedup: f64,
}

/// One compute-bound attention-side case timed on the device.
#[derive(Debug, Clone, Serialize)]
pub struct KernelTiming {
    /// What was timed ("indexer fp8 paged 64x128, 8 queries x 16384 keys").
    pub case: String,
    /// Seconds per call (median).
    pub seconds: f64,
    /// Multiply-adds per call (every dot product's).
    pub multiplies: f64,
    /// multiplies / seconds / 1e12.
    pub tera_multiplies: f64,
    /// 2·multiplies/s over the SIMT FMA rate of the backend's sums (f64 or f32).
    pub of_fma_rate: f64,
}

/// Everything the device bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceBenchReport {
    /// Device limits of this run.
    pub peaks: DevicePeaks,
    /// Linear cases (decode GEMV and prefill GEMM).
    pub linear: Vec<LinearTiming>,
    /// The fp8 and MXFP4 decode cases on every compiled shape of the one-row kernels.
    pub decode_shapes: Vec<ShapeTiming>,
    /// The decode shapes to pin on this GPU with these sums, from `decode_shapes` (none when no
    /// format has more than one shape).
    pub decode_suggestion: Option<DecodeSuggestion>,
    /// Attention-side cases.
    pub kernels: Vec<KernelTiming>,
    /// A MoE layer's routed experts with the routing on the device and from host-built groups.
    pub routing: RoutingTiming,
}

/// `n` values uniform in [-1, 1) from `g`: the timed kernels' operands.
pub(crate) fn seeded(g: &mut dsv4_core::SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| g.uniform_sym(1.0)).collect()
}

/// Rows of `values` encoded by `backend` as cache entries of `fmt`, laid end to end.
pub(crate) fn encoded_entries(
    backend: &CudaBackend,
    fmt: &dsv4_kernels::RowFormat,
    values: &[f32],
) -> Result<Vec<u8>, CudaError> {
    use dsv4_kernels::Backend;
    backend
        .cache_encode_rows(fmt, values)
        .map_err(|e| CudaError::BadOperands(e.to_string()))
}

/// Sizes of the peak measurements: real ones on a GPU, tiny ones on the emulator.
struct PeakSizes {
    copy_bytes: usize,
    fma_blocks: u32,
    fma_iters: u32,
    mma_blocks: u32,
    mma_iters: u32,
    batches: usize,
}

impl PeakSizes {
    fn for_device(emulated: bool) -> Self {
        if emulated {
            PeakSizes {
                copy_bytes: 64 << 10,
                fma_blocks: 2,
                fma_iters: 16,
                mma_blocks: 0,
                mma_iters: 0,
                batches: 1,
            }
        } else {
            PeakSizes {
                copy_bytes: 512 << 20,
                fma_blocks: 8192,
                fma_iters: 4096,
                mma_blocks: 4096,
                mma_iters: 512,
                batches: 5,
            }
        }
    }
}

/// Measure the device's copy bandwidth and arithmetic rates.
pub fn peaks(dev: &Device) -> Result<DevicePeaks, CudaError> {
    let info = dev.info();
    let s = PeakSizes::for_device(info.emulated);
    let src = dev.alloc(s.copy_bytes)?;
    let dst = dev.alloc(s.copy_bytes)?;
    let n_vec = (s.copy_bytes / 16) as u64;
    let copy_blocks = u32::try_from((n_vec / 256).clamp(1, 65_535)).unwrap_or(65_535);
    let copy_s = time_launches(dev, 4, s.batches, || unsafe {
        dev.launch(
            "bench_copy",
            (copy_blocks, 1, 1),
            (256, 1, 1),
            &[KArg::Buf(&src), KArg::Buf(&dst), KArg::U64(n_vec)],
        )
    })?;
    let copy_gbs = 2.0 * s.copy_bytes as f64 / copy_s / 1e9;

    let threads = 256u32;
    let out = dev.alloc(s.fma_blocks.max(s.mma_blocks) as usize * threads as usize * 4)?;
    let fma_s = time_launches(dev, 2, s.batches, || unsafe {
        dev.launch(
            "bench_fma",
            (s.fma_blocks, 1, 1),
            (threads, 1, 1),
            &[
                KArg::Buf(&out),
                KArg::U32(s.fma_iters),
                KArg::F32(0.999_9),
                KArg::F32(1e-4),
            ],
        )
    })?;
    let fma_flops = 16.0 * f64::from(s.fma_iters) * f64::from(s.fma_blocks * threads);
    let out64 = dev.alloc(s.fma_blocks as usize * threads as usize * 8)?;
    let fma64_s = time_launches(dev, 2, s.batches, || unsafe {
        dev.launch(
            "bench_fma64",
            (s.fma_blocks, 1, 1),
            (threads, 1, 1),
            &[
                KArg::Buf(&out64),
                KArg::U32(s.fma_iters),
                KArg::F64(0.999_9),
                KArg::F64(1e-4),
            ],
        )
    })?;

    let mma = |kernel: &str, flops_per_warp_step: f64| -> Result<Option<f64>, CudaError> {
        if info.emulated || s.mma_blocks == 0 {
            return Ok(None);
        }
        let secs = time_launches(dev, 2, s.batches, || unsafe {
            dev.launch(
                kernel,
                (s.mma_blocks, 1, 1),
                (threads, 1, 1),
                &[KArg::Buf(&out), KArg::U32(s.mma_iters)],
            )
        })?;
        let warps = f64::from(s.mma_blocks * threads / 32);
        Ok(Some(
            warps * f64::from(s.mma_iters) * 4.0 * flops_per_warp_step / secs / 1e12,
        ))
    };
    let (major, minor) = info.capability;
    let mma_bf16_tflops = mma("bench_mma_bf16", 4096.0)?;
    let mma_fp8_tflops = if (major, minor) >= (8, 9) {
        mma("bench_mma_fp8", 8192.0)?
    } else {
        None
    };
    Ok(DevicePeaks {
        device: info.to_string(),
        emulated: info.emulated,
        copy_gbs,
        fma_f32_tflops: fma_flops / fma_s / 1e12,
        fma_f64_tflops: fma_flops / fma64_s / 1e12,
        f64_sums: info.f64_accumulation,
        mma_bf16_tflops,
        mma_fp8_tflops,
    })
}

/// One linear case: name, rows per weight, out, in, format, and how many weights of that shape
/// one grouped launch runs (1: a plain launch).
type Case = (&'static str, usize, usize, usize, WeightFormat, usize);

/// The linear cases: DSV4-Flash decode GEMV shapes, the routed experts' grouped GEMV, and a
/// prefill GEMM (tiny shapes on the emulator).
fn linear_cases(emulated: bool) -> Vec<Case> {
    use WeightFormat::{Bf16, Fp8Block, Mxfp4};
    if emulated {
        return vec![
            ("gemv_fp8 decode 256x256", 1, 256, 256, Fp8Block, 1),
            (
                "gemv_fp8 decode 2 experts grouped 256x256",
                1,
                256,
                256,
                Fp8Block,
                2,
            ),
            ("gemv_mxfp4 decode 256x256", 1, 256, 256, Mxfp4, 1),
            ("gemm_bf16 prefill 16x128x128", 16, 128, 128, Bf16, 1),
        ];
    }
    vec![
        ("gemv_fp8 decode 4096x4096", 1, 4096, 4096, Fp8Block, 1),
        (
            "gemv_fp8 decode wq_b 1024->32768",
            1,
            32768,
            1024,
            Fp8Block,
            1,
        ),
        (
            "gemv_mxfp4 decode expert w1 4096->2048",
            1,
            2048,
            4096,
            Mxfp4,
            1,
        ),
        (
            "gemv_mxfp4 decode 6 experts grouped w1 4096->2048",
            1,
            2048,
            4096,
            Mxfp4,
            6,
        ),
        (
            "gemv_bf16 decode head 4096->129280",
            1,
            129_280,
            4096,
            Bf16,
            1,
        ),
        (
            "gemm_fp8 prefill 512x4096->4096",
            512,
            4096,
            4096,
            Fp8Block,
            1,
        ),
        ("gemm_bf16 prefill 512x4096->4096", 512, 4096, 4096, Bf16, 1),
    ]
}

/// Deterministic weights of a format (bytes from a fixed LCG; scales near 1).
fn bench_weight(
    name: &str,
    out: usize,
    inp: usize,
    fmt: WeightFormat,
) -> Result<Linear, CudaError> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = |n: usize, mask: u8, or: u8| -> Vec<u8> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                ((state >> 56) as u8 & mask) | or
            })
            .collect()
    };
    let (data, scale) = match fmt {
        WeightFormat::F32 => (bytes(out * inp * 4, 0x3f, 0), vec![]),
        WeightFormat::Bf16 => (bytes(out * inp * 2, 0x3f, 0), vec![]),
        WeightFormat::Fp8Block => (
            bytes(out * inp, 0x77, 0),
            vec![127u8; out.div_ceil(128) * inp.div_ceil(128)],
        ),
        WeightFormat::Mxfp4 => (bytes(out * inp / 2, 0x77, 0), vec![127u8; out * inp / 32]),
    };
    Linear::new(name, out, inp, fmt, data, scale).map_err(|e| CudaError::BadOperands(e.to_string()))
}

/// Device memory a linear case's weight copies cover together: 8 times the largest L2 cache of
/// current NVIDIA GPUs (128 MB), so repeated calls read their weights from device memory.
const ROTATE_BYTES: usize = 1 << 30;

/// How many copies of a `weight_bytes` weight a case rotates through: enough to cover
/// ROTATE_BYTES (at most 256, and within an eighth of the device's memory when it is known);
/// two on the emulator, which has no cache to defeat but runs the rotation.
fn weight_copies(info: &DeviceInfo, weight_bytes: usize) -> usize {
    if info.emulated {
        return 2;
    }
    let mut cover = ROTATE_BYTES;
    if info.memory_bytes > 0 {
        cover = cover.min(usize::try_from(info.memory_bytes / 8).unwrap_or(usize::MAX));
    }
    cover.div_ceil(weight_bytes.max(1)).clamp(1, 256)
}

/// Measure the peaks, then time each linear case on device-resident operands (the fp8 and
/// MXFP4 decode cases on every compiled shape too).
pub fn run(backend: &CudaBackend) -> Result<DeviceBenchReport, CudaError> {
    let dev = backend.device();
    let peaks = peaks(dev)?;
    let selected = backend.decode_shapes();
    let mut linear = Vec::new();
    let mut decode_shapes = Vec::new();
    for (case, rows, out, inp, fmt, groups) in linear_cases(peaks.emulated) {
        let w = bench_weight(case, out, inp, fmt)?;
        let batches = if peaks.emulated { 1 } else { 5 };
        let weight_bytes = groups * (w.data.len() + w.scale.len());
        let copies = weight_copies(&dev.info(), weight_bytes);
        // Separate weights with the same bytes: the weight cache keys a weight by its host
        // address, so each gets its own resident copy, as a layer's experts do.
        let ws = if groups > 1 {
            (0..groups)
                .map(|g| bench_weight(&format!("{case} [{g}]"), out, inp, fmt))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let time = |path: LinearPath, decode: DecodeShapes| {
            if groups > 1 {
                time_grouped(backend, path, decode, &ws, rows, batches, copies)
            } else {
                time_linear(backend, path, decode, &w, rows, batches, copies)
            }
        };
        let gbs = |s: f64| weight_bytes as f64 / s / 1e9;
        // Every case on the SIMT kernels and, for the formats it serves, on tensor cores.
        let paths: &[LinearPath] = if fmt == WeightFormat::F32 {
            &[LinearPath::Simt]
        } else {
            &[LinearPath::Simt, LinearPath::Mma]
        };
        for &path in paths {
            let times = time(path, selected)?;
            let seconds = times.graphed.unwrap_or(times.launched);
            let weight_gbs = gbs(seconds);
            let tflops = 2.0 * (groups * rows * out * inp) as f64 / seconds / 1e12;
            let matrix = match (path, fmt) {
                (LinearPath::Mma, _) => peaks.mma_bf16_tflops,
                (_, WeightFormat::Fp8Block | WeightFormat::Mxfp4) => peaks.mma_fp8_tflops,
                (_, WeightFormat::Bf16 | WeightFormat::F32) => peaks.mma_bf16_tflops,
            };
            let one_row_simt = rows == 1 && !path.uses_mma(fmt);
            linear.push(LinearTiming {
                case: case.to_string(),
                path,
                shape: one_row_simt.then(|| selected.of(fmt).name()),
                rows,
                groups,
                seconds,
                graphed: times.graphed.is_some(),
                launched_seconds: times.launched,
                weight_bytes,
                weight_gbs,
                tflops,
                of_copy_bandwidth: weight_gbs / peaks.copy_gbs,
                launched_of_copy_bandwidth: gbs(times.launched) / peaks.copy_gbs,
                of_matrix_rate: matrix.map(|m| tflops / m),
                copies,
            });
            let shapes = DecodeShape::compiled(fmt);
            if !one_row_simt || shapes.len() < 2 {
                continue;
            }
            for &shape in shapes {
                let is_selected = shape == selected.of(fmt);
                let secs = if is_selected {
                    seconds
                } else {
                    let decode = selected.with(fmt, shape).map_err(CudaError::BadOperands)?;
                    let t = time(path, decode)?;
                    t.graphed.unwrap_or(t.launched)
                };
                decode_shapes.push(ShapeTiming {
                    case: case.to_string(),
                    format: crate::ops::decode_shape::format_key(fmt).to_string(),
                    shape: shape.name(),
                    selected: is_selected,
                    seconds: secs,
                    of_copy_bandwidth: gbs(secs) / peaks.copy_gbs,
                    speedup: seconds / secs,
                });
            }
        }
    }
    let kernels = kernel_cases(backend, &peaks)?;
    let routing = routing::time_routing(backend)?;
    let decode_suggestion = suggest(&decode_shapes, selected);
    Ok(DeviceBenchReport {
        peaks,
        linear,
        decode_suggestion,
        decode_shapes,
        kernels,
        routing,
    })
}

/// Time the attention-side cases (DSV4-Flash shapes; tiny ones on the emulator): the paged
/// indexer's scores over fp8 index-K entries, paged sparse attention over fp8 KV entries, and a
/// sublayer's mHC mixing logits.
fn kernel_cases(
    backend: &CudaBackend,
    peaks: &DevicePeaks,
) -> Result<Vec<KernelTiming>, CudaError> {
    let (batches, queries, index_keys, attn_keys, tokens, d) = if peaks.emulated {
        (1, 2, 40, 20, 5, 64)
    } else {
        (5, 8, 16384, 640, 256, 7168)
    };
    let (index_heads, index_dim, heads, (nd, rd), m) = (64, 128, 64, (448, 64), 4);
    let fma = if peaks.f64_sums {
        peaks.fma_f64_tflops
    } else {
        peaks.fma_f32_tflops
    };
    let timing = |case: String, seconds: f64, multiplies: f64| KernelTiming {
        case,
        seconds,
        multiplies,
        tera_multiplies: multiplies / seconds / 1e12,
        of_fma_rate: 2.0 * multiplies / seconds / 1e12 / fma,
    };
    let index = time_paged_scores(
        backend,
        queries,
        index_keys,
        index_heads,
        index_dim,
        batches,
    )?;
    let attn = time_paged_attention(backend, queries, attn_keys, heads, (nd, rd), batches)?;
    let mix = time_mix(backend, tokens, m, d, batches)?;
    let per = |q: usize, n: usize, h: usize, w: usize| (q * n * h * w) as f64;
    Ok(vec![
        timing(
            format!(
                "indexer fp8 paged {index_heads}x{index_dim}, {queries} queries x {index_keys} keys"
            ),
            index,
            per(queries, index_keys, index_heads, index_dim),
        ),
        timing(
            format!(
                "attention fp8 paged {heads}x{}, {queries} queries x {attn_keys} keys",
                nd + rd
            ),
            attn,
            // q·k for the logits and w·v for the output.
            2.0 * per(queries, attn_keys, heads, nd + rd),
        ),
        timing(
            format!("mhc_mix {tokens} tokens, M={m}, D={d}"),
            mix,
            // The (2 + M)·M dot products and the squares, per token.
            (tokens * ((2 + m) * m + 1) * m * d) as f64,
        ),
    ])
}
