//! Helpers shared by the wgpu backend's tests: opening the backend (skip with the reason when no
//! adapter exists, fail under CI=true), its traffic counters, deterministic test values and the
//! cache formats the cache op tests sweep.
#![allow(dead_code)]

use dsv4_backend_wgpu::WgpuBackend;
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype};
use dsv4_kernels::{Backend, DeviceStats, RowFormat};

/// The backend on the default adapter (`allow_f64 = false` forces f32 accumulation), or None
/// after printing why it cannot run here; under CI=true that is a failure.
pub fn backend(allow_f64: bool) -> Option<WgpuBackend> {
    match WgpuBackend::new(None, allow_f64) {
        Ok(b) => {
            eprintln!("wgpu adapter: {}", b.adapter());
            Some(b)
        }
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and the wgpu backend cannot run: {e}");
            }
            eprintln!("SKIP: the wgpu backend cannot run here: {e}");
            None
        }
    }
}

/// Deterministic values in about [-2, 2] with varied magnitudes.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (u - 0.5) * 4.0 * if s & 0x100 != 0 { 0.01 } else { 1.0 }
        })
        .collect()
}

/// The backend's device traffic counters.
pub fn stats(b: &WgpuBackend) -> DeviceStats {
    b.device().expect("wgpu has device ops").stats()
}

/// The formats of the cache op tests: KV bf16/fp8 (128 wide, 64 rope) and index-K
/// bf16/fp8/fp4 (128 wide), 16 entries a page.
pub fn formats() -> Vec<(String, RowFormat)> {
    let mut f = Vec::new();
    for dt in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        let l = KvLayout::from_head_dims(dt, 128, 64, 16).unwrap();
        f.push((format!("KV {dt:?}"), RowFormat::Kv(l)));
    }
    for dt in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        let l = IndexKLayout::new(dt, 128, 16).unwrap();
        f.push((format!("index-K {dt:?}"), RowFormat::IndexK(l)));
    }
    f
}
