//! What the crate's tests share: skipping a test when the machine lacks what it needs.
#![allow(dead_code)] // each test binary uses its own subset

pub mod selftest;

use dsv4_backend_cuda::CudaBackend;
use dsv4_core::cache::KvLayout;
use dsv4_core::{KvCacheDtype, SplitMix64};
use dsv4_kernels::{Backend, DeviceStats, EntryOrigin, Linear, PageTag, RowFormat, WeightFormat};

/// Whether `what` (the emulator, NVRTC) is available, `probe` being its probe's answer. Prints the
/// reason and skips (false), except under CI=true, where a missing requirement fails the test.
pub fn can_run(test: &str, what: &str, probe: Result<(), String>) -> bool {
    match probe {
        Ok(()) => true,
        Err(reason) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and {what} cannot run: {reason}");
            }
            eprintln!("SKIP {test}: {reason}");
            false
        }
    }
}

/// Whether the CPU emulator can run here (see [`can_run`]).
pub fn emu_available(test: &str) -> bool {
    can_run(test, "the cuda emulator", dsv4_backend_cuda::emu::probe())
}

/// The logits' bits of a 16-token prefill and four decode steps of the tiny model `m` under
/// `exec`, and the device traffic of each decode step.
pub fn tiny_decode(
    m: &dsv4_model::Model,
    exec: &dsv4_model::forward::ExecOptions,
) -> (Vec<u32>, Vec<dsv4_kernels::DeviceStats>) {
    let mut seq = m.new_sequence();
    let (mut bits, mut stats) = (Vec::new(), Vec::new());
    let prompt: Vec<u32> = (0..16).map(|i| 3 + 7 * i).collect();
    for (i, step) in [&prompt[..], &[11], &[12], &[13], &[14]].iter().enumerate() {
        let (out, report) = m
            .forward_step(
                &mut [&mut seq],
                &[step],
                dsv4_model::LogitRows::All,
                exec,
                &mut dsv4_model::forward::Taps::none(),
            )
            .expect("step");
        bits.extend(out[0].logits.iter().map(|x| x.to_bits()));
        if i > 0 {
            stats.push(report.device.expect("device traffic is reported"));
        }
    }
    (bits, stats)
}

/// The execution modes a decode test compares, named: eager (serial, not captured), captured
/// (graphs on a device backend), and captured with overlap streams on the threaded executor
/// and on the serial one (what `exec.executor = "auto"` runs on CUDA: a layer's host launches,
/// on several streams, read their operands back after waiting for every stream).
pub fn exec_modes() -> [(&'static str, dsv4_model::forward::ExecOptions); 4] {
    use dsv4_model::forward::{ExecOptions, Executor};
    let eager = ExecOptions {
        captured: false,
        executor: Executor::Serial,
        ..Default::default()
    };
    let captured = ExecOptions {
        captured: true,
        ..eager.clone()
    };
    let threaded = ExecOptions {
        overlap: true,
        executor: Executor::Threaded,
        ..captured.clone()
    };
    let serial = ExecOptions {
        overlap: true,
        ..captured.clone()
    };
    [
        ("eager", eager),
        ("captured", captured),
        ("threaded overlap", threaded),
        ("serial overlap", serial),
    ]
}

/// A random weight: f32/bf16 from uniform values; fp8 and MXFP4 from random codes (every code
/// but NaN) and random scales, so subnormal and saturated codes appear.
pub fn random_weight(rng: &mut SplitMix64, format: WeightFormat, out: usize, inp: usize) -> Linear {
    let n = out * inp;
    let mut byte = |lo: u8, hi: u8| lo + (rng.next_u64() % (u64::from(hi - lo) + 1)) as u8;
    let (data, scale): (Vec<u8>, Vec<u8>) = match format {
        WeightFormat::F32 => {
            let mut r = SplitMix64::new(n as u64);
            let v: Vec<u8> = (0..n)
                .flat_map(|_| r.uniform_sym(0.1).to_le_bytes())
                .collect();
            (v, vec![])
        }
        WeightFormat::Bf16 => (
            (0..n)
                .flat_map(|_| [byte(0, 255), byte(0x3a, 0x3e) | (byte(0, 1) << 7)])
                .collect(),
            vec![],
        ),
        WeightFormat::Fp8Block => {
            let data = (0..n)
                .map(|_| {
                    let c = byte(0, 255);
                    if c & 0x7f == 0x7f { c - 1 } else { c }
                })
                .collect();
            let scale = (0..out.div_ceil(128) * inp.div_ceil(128))
                .map(|_| byte(118, 126))
                .collect();
            (data, scale)
        }
        WeightFormat::Mxfp4 => {
            let data = (0..n / 2).map(|_| byte(0, 255)).collect();
            let scale = (0..n / 32).map(|_| byte(120, 126)).collect();
            (data, scale)
        }
    };
    Linear::new(format!("{format:?}"), out, inp, format, data, scale).expect("valid weight")
}

/// Weights that take every scale byte (subnormal, overflowing and NaN scales among them): fp8
/// [512, 8184] in 4 × 64 blocks of 128×128, block (rb, cb) scaled by byte rb·64 + cb (a partial
/// last block; NaN codes in some rows), and MXFP4 [64, 4608], row o's 32-value chunk ch scaled
/// by byte (4·o + ch) mod 256. Both rows are wider than one staged input tile of the decode
/// kernels (128 chunks; kernels/linear.cu).
pub fn every_scale_byte_weights(rng: &mut SplitMix64) -> [Linear; 2] {
    // fp8: 4 × 64 blocks of 128×128, block (rb, cb) scaled by byte rb·64 + cb; inputs 8184 wide.
    let (out, inp) = (512, 128 * 64 - 8);
    let mut data: Vec<u8> = (0..out * inp)
        .map(|_| (rng.next_u64() % 256) as u8)
        .map(|c| if c & 0x7f == 0x7f { c - 1 } else { c })
        .collect();
    for o in (5..out).step_by(37) {
        data[o * inp + (rng.next_u64() as usize % inp)] = 0x7f | ((o as u8 & 1) << 7);
    }
    let scale: Vec<u8> = (0..4 * 64).map(|b| b as u8).collect();
    let fp8 = Linear::new("fp8", out, inp, WeightFormat::Fp8Block, data, scale).expect("fp8");
    // MXFP4: row o's 32-value chunk ch scaled by byte (4·o + ch) mod 256.
    let (out4, inp4) = (64, 32 * 144);
    let data4: Vec<u8> = (0..out4 * inp4 / 2)
        .map(|_| (rng.next_u64() % 256) as u8)
        .collect();
    let chunks = inp4 / 32;
    let scale4: Vec<u8> = (0..out4 * chunks)
        .map(|i| ((4 * (i / chunks) + i % chunks) % 256) as u8)
        .collect();
    let mx = Linear::new("mxfp4", out4, inp4, WeightFormat::Mxfp4, data4, scale4).expect("mxfp4");
    [fp8, mx]
}

/// Three fp8 KV pages of `per` (≥ 8) entries (head dim 192, rope 64), slots 0..8 written by
/// `be` (the rest zero).
pub fn kv_pages(be: &CudaBackend, per: usize) -> (RowFormat, Vec<Vec<u8>>) {
    let layout = KvLayout::from_head_dims(KvCacheDtype::Fp8, 192, 64, per).expect("a layout");
    let fmt = RowFormat::Kv(layout);
    let pages = (0..3)
        .map(|p| {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..8 {
                let v: Vec<f32> = (0..192)
                    .map(|i| ((i * 5 + slot * 3 + p * 7) % 13) as f32 * 0.25 - 1.5)
                    .collect();
                be.cache_store(&fmt, &mut page, slot, &v).expect("a slot");
            }
            page
        })
        .collect();
    (fmt, pages)
}

/// Attention of two queries over slots 0..8 of each of `pages` (two or more; query 1 skips the
/// first page's), with `tags`: the output's bits and the bytes uploaded.
pub fn attend(
    be: &CudaBackend,
    fmt: &RowFormat,
    pages: &[Vec<u8>],
    tags: &[PageTag],
) -> (Vec<u32>, u64) {
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let (rows, ids, q, starts) = attend_operands(pages.len());
    let keys = PagedCall {
        pages: &refs,
        tags,
        origins: &[],
        rows: &rows,
        ids: &ids,
    };
    attend_keys(be, fmt, &keys, &q, &starts)
}

/// [`attend_operands`]' result: rows, key ids, queries, key starts.
pub type AttendOperands = (Vec<(usize, usize)>, Vec<usize>, Vec<f32>, [usize; 3]);

/// [`attend`]'s operands over `pages` pages of 8 slots: the rows (every slot, page by page),
/// each key's row (query 0 every row, query 1 all but the first page's), the queries (two of
/// two heads of 192) and the key starts.
pub fn attend_operands(pages: usize) -> AttendOperands {
    let n = 8 * pages;
    let rows: Vec<(usize, usize)> = (0..n).map(|i| (i / 8, i % 8)).collect();
    let ids: Vec<usize> = (0..n).chain(8..n).collect();
    let q: Vec<f32> = (0..2 * 2 * 192)
        .map(|i| (i % 9) as f32 * 0.1 - 0.4)
        .collect();
    (rows, ids, q, [0, n, 2 * n - 8])
}

/// The keys of one `paged_attention_indexed` call: pages, their tags and origins, rows, and
/// the row each key reads.
pub struct PagedCall<'a> {
    pub pages: &'a [&'a [u8]],
    pub tags: &'a [PageTag],
    pub origins: &'a [&'a [EntryOrigin]],
    pub rows: &'a [(usize, usize)],
    pub ids: &'a [usize],
}

/// Attention of queries `q` (two heads of 192, sinks 0.5 and −0.5, scale 0.07) over `keys`,
/// query r over keys `starts[r] .. starts[r+1]`: the output's bits and the bytes uploaded.
pub fn attend_keys(
    be: &CudaBackend,
    fmt: &RowFormat,
    keys: &PagedCall<'_>,
    q: &[f32],
    starts: &[usize],
) -> (Vec<u32>, u64) {
    let mut out = vec![0f32; q.len()];
    let before = stats(be);
    be.paged_attention_indexed(
        q,
        fmt,
        keys.pages,
        keys.tags,
        keys.origins,
        keys.rows,
        keys.ids,
        starts,
        &[0.5, -0.5],
        0.07,
        &mut out,
    )
    .expect("valid pages");
    let moved = stats(be).since(&before);
    (bits(&out), moved.write_bytes)
}

/// A CUDA backend on the CPU emulator, accumulating in f64 or f32.
pub fn backend(acc_f64: bool) -> CudaBackend {
    let dev = dsv4_backend_cuda::emu::open(acc_f64).expect("open the emulator");
    CudaBackend::new(dsv4_backend_cuda::EMU_NAME, dev)
}

/// The bits of `v`, for bitwise comparisons that print where values differ.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The device traffic `be` has counted so far.
pub fn stats(be: &CudaBackend) -> DeviceStats {
    Backend::device(be).expect("device ops").stats()
}
