//! The raw bytes of the pools hold exactly the spec §4 layouts: rows pushed through the
//! backend's cache ops land in pool pages byte-identical to `KvLayout::write` /
//! `IndexKLayout::write` of the same values, and a whole forward pass leaves the same bytes in
//! the pools as in owned pages, SWA pages equal to the layout of the pass's K vectors, and
//! compressor rings as f32 rows [a | z].

use super::*;
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_engine::pool::Pool;
use dsv4_engine::pools::CachePools;
use dsv4_engine::{CacheBudget, EngineConfig, PoolKind};
use dsv4_kernels::RowFormat;
use dsv4_model::forward::Taps;
use dsv4_model::forward::state::PagedRows;
use std::collections::BTreeMap;

fn rows(n: usize, width: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut g = SplitMix64::new(seed);
    (0..n)
        .map(|_| (0..width).map(|_| g.normalish(2.0)).collect())
        .collect()
}

#[test]
fn kv_ring_rows_land_in_pool_pages_in_the_spec_layout() {
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        let kv = KvLayout::from_head_dims(dtype, 128, 64, 64).unwrap();
        let pool = Arc::new(Pool::new(PoolKind::SwaKv, 3, kv.page_bytes(), 64));
        // A ring of 64 rows (one page) written 80 times: slots 0..16 hold rows 64..80.
        let mut store = PagedRows::ring(RowFormat::Kv(kv), 128, 16).in_store(pool.clone());
        let values = rows(80, 128, 3);
        for v in &values {
            store.push(&ReferenceBackend, v).unwrap();
        }
        let mut expected = vec![0u8; kv.page_bytes()];
        for (r, v) in values.iter().enumerate() {
            kv.write(&mut expected, r % 64, v).unwrap();
        }
        let ids = store.pooled_pages().unwrap().ids().to_vec();
        assert_eq!(ids.len(), 1, "{dtype:?}: the ring takes one page");
        assert_eq!(pool.used_pages(), 1);
        assert!(
            pool.raw_page(ids[0]).unwrap() == expected,
            "{dtype:?}: pool bytes differ from KvLayout::write"
        );
        drop(store);
        assert_eq!(pool.used_pages(), 0, "dropping the store frees its page");
    }
}

#[test]
fn index_k_rows_land_in_pool_pages_of_64_in_the_spec_layout() {
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        let ik = IndexKLayout::new(dtype, 128, 64).unwrap();
        let pool = Arc::new(Pool::new(PoolKind::C4IndexK, 4, ik.page_bytes(), 64));
        let mut store = PagedRows::growing(RowFormat::IndexK(ik), 128).in_store(pool.clone());
        let values = rows(70, 128, 4);
        for v in &values {
            store.push(&ReferenceBackend, v).unwrap();
        }
        let ids = store.pooled_pages().unwrap().ids().to_vec();
        assert_eq!(ids.len(), 2, "{dtype:?}: 70 rows take two pages of 64");
        for (p, id) in ids.iter().enumerate() {
            let mut expected = vec![0u8; ik.page_bytes()];
            for (r, v) in values.iter().enumerate().skip(p * 64).take(64) {
                ik.write(&mut expected, r % 64, v).unwrap();
            }
            assert!(
                pool.raw_page(*id).unwrap() == expected,
                "{dtype:?}: page {p} differs from IndexKLayout::write"
            );
        }
    }
}

#[test]
fn a_forward_pass_leaves_spec_bytes_in_the_pools() {
    let m = model();
    let pools = CachePools::new(
        &m,
        &EngineConfig {
            cache: CacheBudget::Tokens(1024),
            ..Default::default()
        },
    )
    .unwrap();
    let mut prompt = vec![0];
    prompt.extend(tokens(139, 21));
    let mut kv_taps: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut owned = m.new_sequence();
    let out_owned = {
        let mut f = |layer: &str, op: &str, v: &[f32]| {
            if op == "attn.kv" {
                kv_taps.insert(layer.to_string(), v.to_vec());
            }
        };
        let mut taps = Taps::new(&mut f);
        m.forward_with_taps(&mut owned, &prompt, &mut taps).unwrap()
    };
    let mut pooled = m.new_sequence_in(pools.stores()).unwrap();
    let out_pooled = m.forward(&mut pooled, &prompt).unwrap();
    assert!(
        out_owned.logits == out_pooled.logits,
        "same logits either way"
    );

    let kv = *m.kv_layout();
    let hd = m.cfg.head_dim;
    let swa_pool = pools.pool(PoolKind::SwaKv);
    for (l, (o, p)) in owned.layers.iter().zip(&pooled.layers).enumerate() {
        assert_eq!(o.swa.pages(), p.swa.pages(), "layer {l}: SWA bytes");
        // The SWA ring's page holds the layer's K vectors of the last 64 positions.
        let k = &kv_taps[&format!("layers.{l}.")];
        let mut expected = vec![0u8; kv.page_bytes()];
        for (pos, row) in k.chunks(hd).enumerate().skip(prompt.len() - 64) {
            kv.write(&mut expected, pos % 64, row).unwrap();
        }
        let id = p.swa.pooled_pages().unwrap().ids()[0];
        assert!(
            swa_pool.raw_page(id).unwrap() == expected,
            "layer {l}: raw SWA pool bytes differ from KvLayout::write of the K vectors"
        );
        for (a, b, what) in [
            (&o.compressor, &p.compressor, "compressor"),
            (&o.indexer, &p.indexer, "indexer"),
        ] {
            let (Some(a), Some(b)) = (a, b) else {
                assert!(a.is_none() && b.is_none());
                continue;
            };
            assert!(!b.entries.is_empty(), "layer {l}: {what} has entries");
            assert_eq!(
                a.entries.pages(),
                b.entries.pages(),
                "layer {l}: {what} entries"
            );
            let (wa, wz) = b.ring.window();
            assert_eq!(
                (a.ring.window().0, a.ring.window().1),
                (wa.clone(), wz.clone())
            );
            // Raw ring bytes: rows of [a | z] f32 little-endian.
            let ring_id = b.ring.pooled_pages().unwrap().ids()[0];
            let kind = match (what, m.layer_ratios()[l]) {
                ("indexer", _) => PoolKind::C4IndexState,
                (_, 4) => PoolKind::C4State,
                _ => PoolKind::C128State,
            };
            let raw = pools.pool(kind).raw_page(ring_id).unwrap();
            let w = b.ring.width;
            let mut expected = Vec::new();
            for r in 0..b.ring.rows {
                for v in wa[r * w..(r + 1) * w].iter().chain(&wz[r * w..(r + 1) * w]) {
                    expected.extend_from_slice(&v.to_le_bytes());
                }
            }
            assert!(
                raw == expected,
                "layer {l}: {what} ring bytes are not rows [a | z]"
            );
        }
    }
    assert!(!pools.all_free());
    drop(pooled);
    assert!(pools.all_free(), "a dropped sequence frees every page");
}
