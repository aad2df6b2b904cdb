//! Times the host-side snapshot a device backend's attention and indexer take of cached rows
//! (`PagedRows::copy_rows`) at DeepSeek-V4's KV geometry (fp8, head dim 512, 64 entries a page):
//! a top-k selection scattered over a long context, and every entry (the indexer's keys).
//!
//! `cargo run --release -p dsv4-model --example copy_rows -- [ENTRIES] [K]` (defaults 65536, 512:
//! the ratio-4 entries of a 256k-token context and V4-Flash's top-k).

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::KvLayout;
use dsv4_core::{KvCacheDtype, SplitMix64};
use dsv4_kernels::RowFormat;
use dsv4_model::forward::state::{CopiedPages, PagedRows};
use std::time::Instant;

fn arg(i: usize, default: usize) -> Result<usize, String> {
    std::env::args().nth(i).map_or(Ok(default), |a| {
        a.parse().ok().filter(|&n| n > 0).ok_or(format!(
            "argument {i} must be a positive integer, got `{a}`"
        ))
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (entries, k) = (arg(1, 65536)?, arg(2, 512)?);
    let kv = KvLayout::from_head_dims(KvCacheDtype::Fp8, 512, 64, 64)?;
    let mut store = PagedRows::growing(RowFormat::Kv(kv), 512);
    let row: Vec<f32> = (0..512).map(|i| (i % 7) as f32 * 0.1).collect();
    for _ in 0..entries {
        store.push(&ReferenceBackend, &row)?;
    }
    let mut rng = SplitMix64::new(1);
    let mut topk: Vec<usize> = (0..k).map(|_| rng.below(entries as u64) as usize).collect();
    topk.sort_unstable();
    let every: Vec<usize> = (0..entries).collect();
    println!(
        "{entries} entries on {} pages of {} bytes",
        entries.div_ceil(64),
        kv.page_bytes()
    );
    for (what, rows) in [
        (format!("top-{k}"), topk),
        ("every entry".to_string(), every),
    ] {
        let reps = 5;
        let (t, mut bytes) = (Instant::now(), 0);
        for _ in 0..reps {
            let (mut pages, mut picks) = (CopiedPages::default(), Vec::new());
            store.copy_rows(rows.iter().copied(), &mut pages, &mut picks)?;
            bytes = pages.bytes.iter().map(Vec::len).sum::<usize>();
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(reps);
        println!("{what}: {ms:.2} ms a copy, {bytes} bytes copied");
    }
    Ok(())
}
