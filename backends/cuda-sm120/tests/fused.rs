//! The fused host ops on the CPU emulator (`dsv4_kernels::row_check`), with f64 and f32
//! accumulation, each against the trait's composition on the same backend and in one
//! submission that reads back only its result:
//! - `indexer_topk_rows`: index for index what `indexer_scores_rows` then `topk_rows` choose,
//!   the scores never read back;
//! - `paged_indexer_topk_ranges`: what `paged_indexer_topk_rows` chooses over the expanded
//!   ranges, each row uploaded once however many ranges read it;
//! - `paged_indexer_topk_rows`: index for index what `cache_load_rows` then
//!   `indexer_topk_rows` choose, neither the decoded keys nor the scores read back; the same
//!   layout errors;
//! - `paged_attention_rows`: bit for bit what `cache_load_rows` then `sparse_attention_rows`
//!   give, the decoded keys never read back; the same layout errors.
//! - `paged_attention_indexed`: bit for bit what `paged_attention_rows` gives over the rows laid
//!   out id by id, each row uploaded once however many queries read it;
//! - the indexer's in-place variants (`attn_indexer_scores_<format>`, which
//!   `paged_indexer_topk_rows` launches on the entries): bit for bit the format's decoder then
//!   `attn_indexer_scores`, launched directly on the emulated device.
//!
//! Both panic where the composition does.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::emu_available;
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, KArg, emu};
use dsv4_core::SplitMix64;
use dsv4_kernels::{Backend, row_check};

/// Every call that returns something ran in one submission and read back only what it returns
/// (4 bytes per index or output float; `only` names that, for messages). With `keyed`, only
/// calls with keys to score are held to it (over zero-width keys the indexer chooses without
/// scoring).
fn one_submission_reading_back_only(
    calls: &[row_check::FusedCall],
    acc_f64: bool,
    keyed: bool,
    only: &str,
) {
    for c in calls
        .iter()
        .filter(|c| c.selected > 0 && (c.keys > 0 || !keyed))
    {
        let what = format!("acc_f64={acc_f64} {}", c.what);
        assert_eq!(c.stats.submissions, 1, "{what}: {:?}", c.stats);
        assert_eq!(c.stats.read_bytes, c.selected as u64 * 4, "{what}: {only}");
    }
}

#[test]
fn the_selection_equals_scores_then_topk_in_one_submission() {
    if !emu_available("the_selection_equals_scores_then_topk_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls = row_check::indexer_topk_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        one_submission_reading_back_only(&calls, acc_f64, true, "the indices only");
        row_check::indexer_topk_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn paged_attention_equals_load_then_attend_in_one_submission() {
    if !emu_available("paged_attention_equals_load_then_attend_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls = row_check::paged_attention_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls.iter().any(|c| c.keys > 0), "no case with keys");
        one_submission_reading_back_only(&calls, acc_f64, false, "the output only");
        row_check::paged_attention_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_paged_selection_equals_load_then_select_in_one_submission() {
    if !emu_available("the_paged_selection_equals_load_then_select_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls =
            row_check::paged_indexer_topk_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls.iter().any(|c| c.selected > 0), "no case selects");
        one_submission_reading_back_only(&calls, acc_f64, true, "the indices only");
        row_check::paged_indexer_topk_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn shared_key_ranges_choose_as_the_expanded_rows_uploading_each_row_once() {
    if !emu_available("shared_key_ranges_choose_as_the_expanded_rows_uploading_each_row_once") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls =
            row_check::paged_indexer_topk_ranges(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        one_submission_reading_back_only(&calls, acc_f64, true, "the indices only");
        row_check::paged_indexer_topk_ranges_panics(&be).unwrap_or_else(|e| panic!("{e}"));
        // Nested prefixes of 64 fp8 index-K rows, as a prefill chunk's 16 rows of one sequence
        // score them: the shared call uploads each row once, the expanded call each time a
        // range reads it.
        let layout = dsv4_core::cache::IndexKLayout::new(dsv4_core::IndexKDtype::Fp8, 64, 64)
            .expect("a layout");
        let fmt = dsv4_kernels::RowFormat::IndexK(layout);
        let mut page = vec![0u8; fmt.page_bytes()];
        for slot in 0..64 {
            let v: Vec<f32> = (0..64)
                .map(|i| ((i * 7 + slot * 3) % 11) as f32 - 5.0)
                .collect();
            be.cache_store(&fmt, &mut page, slot, &v).expect("a slot");
        }
        let rows: Vec<(usize, usize)> = (0..64).map(|s| (0, s)).collect();
        let ranges: Vec<(usize, usize)> = (0..16).map(|r| (0, 4 * r + 4)).collect();
        let (q, w) = (vec![0.5f32; 16 * 2 * 64], vec![1.0f32; 16 * 2]);
        let before = stats();
        let shared = be
            .paged_indexer_topk_ranges(&q, &w, &fmt, &[&page], &[], &rows, &ranges, 8)
            .expect("shared");
        let moved = stats().since(&before);
        let (picks, starts) = dsv4_kernels::operands::expand_ranges(&rows, &ranges);
        let before = stats();
        let expanded = be
            .paged_indexer_topk_rows(&q, &w, &fmt, &[&page], &picks, &starts, 8)
            .expect("expanded");
        let moved_expanded = stats().since(&before);
        assert_eq!(shared, expanded, "acc_f64={acc_f64}");
        let entry = fmt.entry_bytes() as u64;
        let saved = (picks.len() - rows.len()) as u64 * entry;
        eprintln!(
            "acc_f64={acc_f64}: 16 nested prefixes of 64 rows: {} bytes uploaded shared, {} \
             expanded",
            moved.write_bytes, moved_expanded.write_bytes
        );
        assert!(
            moved.write_bytes + saved <= moved_expanded.write_bytes + 4 * 16,
            "acc_f64={acc_f64}: {} bytes uploaded shared, {} expanded ({saved} to save)",
            moved.write_bytes,
            moved_expanded.write_bytes
        );
    }
}

#[test]
fn shared_key_ids_attend_as_the_laid_out_rows_uploading_each_row_once() {
    if !emu_available("shared_key_ids_attend_as_the_laid_out_rows_uploading_each_row_once") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls =
            row_check::paged_attention_indexed(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        one_submission_reading_back_only(&calls, acc_f64, false, "the output only");
        row_check::paged_attention_indexed_panics(&be).unwrap_or_else(|e| panic!("{e}"));
        // A prefill chunk's 16 rows of one sequence over a 32-row sliding window of 47 fp8 KV
        // rows: the shared call uploads each row once, the laid-out call each time a row reads
        // it.
        let layout =
            dsv4_core::cache::KvLayout::from_head_dims(dsv4_core::KvCacheDtype::Fp8, 192, 64, 64)
                .expect("a layout");
        let fmt = dsv4_kernels::RowFormat::Kv(layout);
        let mut page = vec![0u8; fmt.page_bytes()];
        for slot in 0..47 {
            let v: Vec<f32> = (0..192)
                .map(|i| ((i * 7 + slot * 3) % 11) as f32 - 5.0)
                .collect();
            be.cache_store(&fmt, &mut page, slot, &v).expect("a slot");
        }
        let rows: Vec<(usize, usize)> = (0..47).map(|s| (0, s)).collect();
        let ids: Vec<usize> = (0..16).flat_map(|r| r..r + 32).collect();
        let starts: Vec<usize> = (0..=16).map(|r| 32 * r).collect();
        let (q, sink) = (vec![0.05f32; 16 * 2 * 192], [0.5f32, -1.0]);
        let mut shared = vec![0f32; q.len()];
        let before = stats();
        be.paged_attention_indexed(
            &q,
            &fmt,
            &[&page],
            &[],
            &[],
            &rows,
            &ids,
            &starts,
            &sink,
            0.1,
            &mut shared,
        )
        .expect("shared");
        let moved = stats().since(&before);
        let picks: Vec<(usize, usize)> = ids.iter().map(|&i| rows[i]).collect();
        let mut laid_out = vec![0f32; q.len()];
        let before = stats();
        be.paged_attention_rows(
            &q,
            &fmt,
            &[&page],
            &picks,
            &starts,
            &sink,
            0.1,
            &mut laid_out,
        )
        .expect("laid out");
        let moved_laid_out = stats().since(&before);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&shared), bits(&laid_out), "acc_f64={acc_f64}");
        let entry = fmt.entry_bytes() as u64;
        let saved = (picks.len() - rows.len()) as u64 * entry;
        eprintln!(
            "acc_f64={acc_f64}: 16 sliding windows of 32 of 47 rows: {} bytes uploaded shared, \
             {} laid out",
            moved.write_bytes, moved_laid_out.write_bytes
        );
        // The ids (4 bytes per key) are all the shared call adds.
        assert!(
            moved.write_bytes + saved <= moved_laid_out.write_bytes + 4 * ids.len() as u64,
            "acc_f64={acc_f64}: {} bytes uploaded shared, {} laid out ({saved} to save)",
            moved.write_bytes,
            moved_laid_out.write_bytes
        );
    }
}

/// One in-place reader variant of the indexer: its kernel name suffix and decoder, the sizes
/// a, b both take, values per key, and `keys` entries of random bytes in that format (NaN codes
/// and scales included, ordinary ones mostly).
struct EntryFormat {
    suffix: &'static str,
    decoder: &'static str,
    a: u32,
    b: u32,
    width: usize,
    entries: Vec<Vec<u8>>,
}

fn entry_formats(rng: &mut SplitMix64, keys: usize) -> Vec<EntryFormat> {
    let mut byte = |lo: u64, hi: u64| (lo + rng.below(hi - lo + 1)) as u8;
    // An e4m3 code that is not NaN (0x7f / 0xff), and a bf16 value of magnitude 2^-7 .. 2^2.
    let code = |b: &mut dyn FnMut(u64, u64) -> u8| match b(0, 254) {
        0x7f => 0x7e,
        c => c,
    };
    let bf16 = |b: &mut dyn FnMut(u64, u64) -> u8| [b(0, 255), b(0x3c, 0x40) | (b(0, 1) << 7)];
    let (mut b16, mut kv, mut i8, mut i4) = (vec![], vec![], vec![], vec![]);
    for k in 0..keys {
        b16.push((0..40).flat_map(|_| bf16(&mut byte)).collect());
        // KV fp8: 128 e4m3 codes (key 1 holds a NaN code), 16 bf16, 2 scale codes, a pad byte.
        let mut e: Vec<u8> = (0..128).map(|_| code(&mut byte)).collect();
        if k == 1 {
            e[3] = 0x7f;
        }
        e.extend((0..16).flat_map(|_| bf16(&mut byte)));
        e.extend([byte(118, 132), byte(118, 132), 0]);
        kv.push(e);
        // Index-K fp8: 64 codes, then an f32 scale (key 2's is NaN).
        let mut e: Vec<u8> = (0..64).map(|_| code(&mut byte)).collect();
        let scale = if k == 2 {
            f32::NAN
        } else {
            0.001 + f32::from(byte(0, 255)) / 2560.0
        };
        e.extend(scale.to_le_bytes());
        i8.push(e);
        // Index-K fp4: 64 values in 32 bytes, then 2 ue8m0 codes (key 3's second is 255: NaN).
        let mut e: Vec<u8> = (0..32).map(|_| byte(0, 255)).collect();
        e.extend([byte(120, 134), if k == 3 { 255 } else { byte(120, 134) }]);
        i4.push(e);
    }
    let format = |suffix, decoder, a, b, width, entries| EntryFormat {
        suffix,
        decoder,
        a,
        b,
        width,
        entries,
    };
    vec![
        format("bf16", "cache_decode_bf16", 40, 0, 40, b16),
        format("kv_fp8", "cache_decode_kv_fp8", 128, 16, 144, kv),
        format("index_fp8", "cache_decode_index_fp8", 64, 0, 64, i8),
        format("index_fp4", "cache_decode_index_fp4", 64, 0, 64, i4),
    ]
}

/// The indexer's in-place variants (`attn_indexer_scores_<format>`) give bit for bit the scores
/// of the format's decoder followed by `attn_indexer_scores` over the decoded keys, for every
/// format, both accumulation settings, three queries over ranges of 0, 150 and 61 keys (blocks
/// with idle threads), and 11 heads (a full and a partial 8-head group).
#[test]
fn in_place_indexer_scores_equal_decode_then_score_bitwise() {
    if !emu_available("in_place_indexer_scores_equal_decode_then_score_bitwise") {
        return;
    }
    let starts: [u32; 4] = [0, 0, 150, 211];
    let (keys, heads, queries) = (211usize, 11usize, 3usize);
    let mut rng = SplitMix64::new(0x1d3e);
    let formats = entry_formats(&mut rng, keys);
    for acc_f64 in [true, false] {
        let d = emu::open(acc_f64).expect("open the emulator");
        for f in &formats {
            let dim = f.width;
            let q: Vec<f32> = (0..queries * heads * dim)
                .map(|_| rng.uniform_sym(1.0))
                .collect();
            let w: Vec<f32> = (0..queries * heads)
                .map(|_| rng.next_f64() as f32)
                .collect();
            let stride = f.entries[0].len();
            let bytes: Vec<u8> = f.entries.concat();
            let (qb, wb) = (d.upload_f32(&q).unwrap(), d.upload_f32(&w).unwrap());
            let eb = d.upload(&bytes).unwrap();
            let sb = d
                .upload(
                    &starts
                        .iter()
                        .flat_map(|s| s.to_le_bytes())
                        .collect::<Vec<u8>>(),
                )
                .unwrap();
            let decoded = d.alloc(keys * dim * 4).unwrap();
            let (want, got) = (d.alloc(keys * 4).unwrap(), d.alloc(keys * 4).unwrap());
            let (dim32, h32) = (dim as u32, heads as u32);
            let grid = (keys.div_ceil(128) as u32, queries as u32, 1);
            let mut decoder_args = vec![KArg::Buf(&eb), KArg::Buf(&decoded)];
            decoder_args.extend(match f.suffix {
                "kv_fp8" => vec![KArg::U32(f.a), KArg::U32(f.b)],
                _ => vec![KArg::U32(f.a)],
            });
            decoder_args.extend([KArg::U32(keys as u32), KArg::U32(stride as u32)]);
            // SAFETY: every buffer holds what the kernels read and write: `eb` keys entries of
            // `stride` bytes, `decoded` keys × dim f32, q/w/starts (also the bases)/out per the
            // indexer's shapes.
            unsafe {
                let values = (keys * dim).div_ceil(256) as u32;
                d.launch(f.decoder, (values, 1, 1), (256, 1, 1), &decoder_args)
                    .unwrap();
                let common = |keys_buf, out| {
                    vec![
                        KArg::Buf(&qb),
                        KArg::Buf(&wb),
                        KArg::Buf(keys_buf),
                        KArg::Buf(&sb),
                        KArg::Buf(&sb),
                        // No key ids: key row j is row j.
                        KArg::Ptr(dsv4_backend_cuda::DevPtr { ptr: 0, bytes: 0 }),
                        KArg::Buf(out),
                        KArg::U32(dim32),
                        KArg::U32(h32),
                        KArg::U32(0),
                    ]
                };
                d.launch(
                    "attn_indexer_scores",
                    grid,
                    (128, 1, 1),
                    &common(&decoded, &want),
                )
                .unwrap();
                let mut args = common(&eb, &got);
                args.extend([KArg::U32(stride as u32), KArg::U32(f.a), KArg::U32(f.b)]);
                let kernel = format!("attn_indexer_scores_{}", f.suffix);
                d.launch(&kernel, grid, (128, 1, 1), &args).unwrap();
            }
            let (mut a, mut b) = (vec![0f32; keys], vec![0f32; keys]);
            d.download_f32(&want, &mut a).unwrap();
            d.download_f32(&got, &mut b).unwrap();
            let first = (0..keys).find(|&j| a[j].to_bits() != b[j].to_bits());
            assert!(
                first.is_none(),
                "{} acc_f64={acc_f64}: key {first:?} scores {:?} decoded, {:?} in place",
                f.suffix,
                first.map(|j| a[j]),
                first.map(|j| b[j])
            );
            assert!(
                a.iter().filter(|x| x.is_finite() && **x != 0.0).count() > keys / 2,
                "{}: mostly finite, nonzero scores",
                f.suffix
            );
        }
    }
}
