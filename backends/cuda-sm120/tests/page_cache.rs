//! The device page cache on the CPU emulator: paged attention and the indexer's selection with
//! page tags give bit for bit what they give without, and upload a page only when the cache
//! does not hold its tag: a repeated call uploads no page, a page with a new tag is uploaded
//! alone, a call needing more pages than the arena holds takes the untagged path, and a page
//! evicted for another is uploaded again when it is read next. The tiny model decodes at a
//! 300-token context with the same logits bits with and without the cache, uploading less.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{PagedCall, attend, attend_keys, emu_available, kv_pages, stats};
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, PAGE_CACHE_ENV, emu, open_backend};
use dsv4_core::IndexKDtype;
use dsv4_core::cache::IndexKLayout;
use dsv4_kernels::{Backend, BackendOptions, EntryOrigin, PageTag, RowFormat, row_check};
use dsv4_model::{ModelSource, load_model};
use std::sync::Arc;

#[test]
fn tagged_pages_are_uploaded_once_and_read_bitwise() {
    if !emu_available("tagged_pages_are_uploaded_once_and_read_bitwise") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let (fmt, mut pages) = kv_pages(&be, 8);
        let page = fmt.entry_bytes() as u64 * 8;
        let (want, untagged) = attend(&be, &fmt, &pages, &[]);
        let mut tags = row_check::fresh_tags(3);
        let (first, first_bytes) = attend(&be, &fmt, &pages, &tags);
        let (again, again_bytes) = attend(&be, &fmt, &pages, &tags);
        assert_eq!(first, want, "acc_f64={acc_f64}: the first tagged call");
        assert_eq!(
            again, want,
            "acc_f64={acc_f64}: the call served from the cache"
        );
        assert!(
            first_bytes >= 3 * page && again_bytes + 3 * page <= first_bytes,
            "acc_f64={acc_f64}: {first_bytes} bytes uploaded first, {again_bytes} again"
        );
        // Page 2 changes (a new row appended): only it is uploaded, and the output follows.
        let v = vec![0.75f32; 192];
        be.cache_store(&fmt, &mut pages[2], 7, &v).expect("a slot");
        tags[2] = row_check::fresh_tags(1)[0];
        let (changed, changed_bytes) = attend(&be, &fmt, &pages, &tags);
        let (want_changed, _) = attend(&be, &fmt, &pages, &[]);
        assert_eq!(
            changed, want_changed,
            "acc_f64={acc_f64}: the changed page is read"
        );
        assert_ne!(changed, want, "acc_f64={acc_f64}: the change shows");
        assert_eq!(
            changed_bytes,
            again_bytes + page,
            "acc_f64={acc_f64}: one page uploaded"
        );
        eprintln!(
            "acc_f64={acc_f64}: {untagged} bytes uploaded untagged, {first_bytes} tagged first, \
             {again_bytes} again, {changed_bytes} with one page changed"
        );
    }
}

#[test]
fn appended_entries_alone_are_uploaded_under_one_lineage() {
    if !emu_available("appended_entries_alone_are_uploaded_under_one_lineage") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, mut pages) = kv_pages(&be, 8);
    let entry = fmt.entry_bytes() as u64;
    // Page 2 holds entries 0..5 so far (a store appending to it); its entries 5..8 are unwritten.
    pages[2] = {
        let mut p = vec![0u8; fmt.page_bytes()];
        for slot in 0..5 {
            fmt.copy_entry(&pages[2], slot, &mut p, slot)
                .expect("an entry");
        }
        p
    };
    let mut tags = row_check::fresh_tags(3);
    tags[2] = PageTag::fresh(5);
    attend(&be, &fmt, &pages, &tags);
    let (_, again_bytes) = attend(&be, &fmt, &pages, &tags);
    // Entry 5 is appended: the lineage stays, and only entry 5 goes up again (6 and 7, read
    // but unwritten, were not written since).
    let before_append = (pages[2].clone(), tags[2]);
    be.cache_store(&fmt, &mut pages[2], 5, &[0.75f32; 192])
        .expect("a slot");
    tags[2] = tags[2].after_entry_write(5);
    assert_eq!(tags[2].lineage, before_append.1.lineage);
    let (got, bytes) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(
        got,
        attend(&be, &fmt, &pages, &[]).0,
        "the appended entry is read"
    );
    assert_eq!(bytes, again_bytes + entry, "entry 5 uploaded");
    // A snapshot taken before the append (a call that gathered earlier) reads its own bytes.
    let old = vec![pages[0].clone(), pages[1].clone(), before_append.0];
    let old_tags = [tags[0], tags[1], before_append.1];
    let (got_old, _) = attend(&be, &fmt, &old, &old_tags);
    assert_eq!(
        got_old,
        attend(&be, &fmt, &old, &[]).0,
        "the earlier snapshot"
    );
    // The ring comes back to entry 0: a new lineage, the page's read span goes up whole.
    be.cache_store(&fmt, &mut pages[2], 0, &[-0.5f32; 192])
        .expect("a slot");
    tags[2] = tags[2].after_entry_write(0);
    let (got, bytes) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(
        got,
        attend(&be, &fmt, &pages, &[]).0,
        "the rewritten entry is read"
    );
    assert_eq!(bytes, again_bytes + 8 * entry, "page 2 uploaded whole");
}

#[test]
fn copies_of_one_page_in_a_call_read_from_the_latest() {
    if !emu_available("copies_of_one_page_in_a_call_read_from_the_latest") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, full) = kv_pages(&be, 8);
    // A chunk that stores each row before reading its window gathers page 2 twice: before
    // and after entry 5 is appended (one lineage, settled 5 then 6).
    let upto = |n: usize| {
        let mut p = vec![0u8; fmt.page_bytes()];
        for slot in 0..n {
            fmt.copy_entry(&full[2], slot, &mut p, slot)
                .expect("an entry");
        }
        p
    };
    let pages = [full[0].clone(), upto(5), upto(6)];
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let old = PageTag::fresh(5);
    let tags = [row_check::fresh_tags(1)[0], old, old.after_entry_write(5)];
    let call = |tags: &[PageTag], rows: &[(usize, usize)]| {
        let ids: Vec<usize> = (0..rows.len()).collect();
        let q: Vec<f32> = (0..2 * 192).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let keys = PagedCall {
            pages: &refs,
            tags,
            origins: &[],
            rows,
            ids: &ids,
        };
        attend_keys(&be, &fmt, &keys, &q, &[0, rows.len()])
    };
    // Each copy read at its settled entries: served from one slot, the latest copy's.
    let rows: Vec<(usize, usize)> = (0..8)
        .map(|s| (0, s))
        .chain((0..5).map(|s| (1, s)))
        .chain((0..6).map(|s| (2, s)))
        .collect();
    let (want, untagged) = call(&[], &rows);
    let (got, tagged) = call(&tags, &rows);
    assert_eq!(got, want);
    assert!(
        tagged < untagged,
        "{tagged} bytes tagged, {untagged} untagged"
    );
    // The old copy read at entry 5, unwritten there and written in the newer copy (a ring's
    // old entry, overwritten later in the chunk): the old copy is detached into a slot of its
    // own and reads what it holds, while page 0 and the newer copy stay cached.
    let (_, served) = call(&tags, &rows);
    let mut rows = rows;
    rows.push((1, 5));
    let (want, untagged) = call(&[], &rows);
    assert_eq!(call(&tags, &rows).0, want);
    let (again, detached_only) = call(&tags, &rows);
    assert_eq!(again, want);
    let entry = fmt.entry_bytes() as u64;
    assert_eq!(
        detached_only,
        served + 6 * entry + 4,
        "beyond a fully served call: the detached copy's 6 entries and one more row id \
         ({untagged} bytes untagged)"
    );
}

#[test]
fn the_backend_options_size_the_arenas() {
    if !emu_available("the_backend_options_size_the_arenas") {
        return;
    }
    // `backend.cuda_page_cache_mib` reaches the backend as `page_cache_mib`.
    let opts = |mib| BackendOptions {
        page_cache_mib: mib,
        ..BackendOptions::default()
    };
    let sized = open_backend(EMU_NAME, &opts(Some(3))).expect("the emulator");
    assert_eq!(sized.page_cache_budget(), 3 << 20);
    let off = open_backend(EMU_NAME, &opts(Some(0))).expect("the emulator");
    assert_eq!(off.page_cache_budget(), 0);
    if std::env::var_os(PAGE_CACHE_ENV).is_none() {
        let default = open_backend(EMU_NAME, &opts(None)).expect("the emulator");
        assert_eq!(
            default.page_cache_budget(),
            64 << 20,
            "the emulator's default"
        );
    }
}

#[test]
fn an_arena_grows_when_a_call_does_not_fit_and_stays_bitwise() {
    if !emu_available("an_arena_grows_when_a_call_does_not_fit_and_stays_bitwise") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, mut pages) = kv_pages(&be, 8);
    let page = fmt.entry_bytes() * 8;
    // Arenas start at one page slot and may grow to six.
    let be = be.with_growing_page_cache(page, 6 * page);
    assert_eq!(
        be.page_cache_held(),
        0,
        "nothing held before the first call"
    );
    let mut tags = row_check::fresh_tags(3);
    let (want, first_bytes) = attend(&be, &fmt, &pages, &[]);
    let (got, first) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(got, want);
    assert_eq!(
        be.page_cache_held(),
        3 * page,
        "as much as the first call needs"
    );
    let (_, again) = attend(&be, &fmt, &pages, &tags);
    assert!(
        again < first && first_bytes > again,
        "{first} then {again} bytes"
    );
    // Page 2 changes whole: no free slot, so the arena doubles, its slots copied over on the
    // device, and the call uploads the changed page alone (checked against the pages).
    be.check_page_cache(true);
    be.cache_store(&fmt, &mut pages[2], 3, &[0.25f32; 192])
        .expect("a slot");
    tags[2] = row_check::fresh_tags(1)[0];
    let (got, grown) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(
        got,
        attend(&be, &fmt, &pages, &[]).0,
        "the grown arena's keys"
    );
    assert_eq!(be.page_cache_held(), 6 * page);
    assert_eq!(grown, again + page as u64, "the pages held were kept");
    // Now there is room: the next changed page alone goes up, and nothing is evicted.
    tags[1] = row_check::fresh_tags(1)[0];
    let (_, one) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(one, again + page as u64);
    assert_eq!(be.page_cache_held(), 6 * page, "within the budget");
}

#[test]
fn an_arena_the_device_cannot_hold_leaves_the_upload_path() {
    if !emu_available("an_arena_the_device_cannot_hold_leaves_the_upload_path") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, pages) = kv_pages(&be, 8);
    let (want, untagged) = attend(&be, &fmt, &pages, &[]);
    // An arena of the whole address space: its allocation fails, and the call uploads its
    // rows as without tags instead of failing.
    let huge = be.with_growing_page_cache(usize::MAX, usize::MAX);
    let tags = row_check::fresh_tags(3);
    assert_eq!(attend(&huge, &fmt, &pages, &tags), (want, untagged));
    assert_eq!(huge.page_cache_held(), 0);
}

#[test]
fn the_check_catches_a_page_changed_without_a_new_tag() {
    if !emu_available("the_check_catches_a_page_changed_without_a_new_tag") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, mut pages) = kv_pages(&be, 8);
    let tags = row_check::fresh_tags(3);
    be.check_page_cache(true);
    // Checked calls over pages the cache holds, and over a changed page with its new tag.
    let (cached, _) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, cached);
    // A store bug: entry 3 of page 2 changes, the tag does not. Unchecked, the cache serves
    // its stale copy: the output is the old one, not what the pages now hold.
    be.cache_store(&fmt, &mut pages[2], 3, &[0.25f32; 192])
        .expect("a slot");
    let fresh = attend(&be, &fmt, &pages, &[]).0;
    be.check_page_cache(false);
    let (stale, _) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(stale, cached, "the stale copy is read unchecked");
    assert_ne!(stale, fresh);
    // Checked, the call fails, naming the entry.
    be.check_page_cache(true);
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        attend(&be, &fmt, &pages, &tags)
    }))
    .expect_err("the check fails the call");
    let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("page cache check: arena slot") && text.contains("entry 3 differs"),
        "{text}"
    );
    // The slot was forgotten: the next call uploads the page again and reads it right.
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, fresh);
}

#[test]
fn a_small_arena_falls_back_or_evicts_and_stays_bitwise() {
    if !emu_available("a_small_arena_falls_back_or_evicts_and_stays_bitwise") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, pages) = kv_pages(&be, 8);
    let page = fmt.entry_bytes() * 8;
    let (want, untagged) = attend(&be, &fmt, &pages, &[]);
    let tags = row_check::fresh_tags(3);
    // Two page slots: a call over three pages takes the untagged path.
    let small = be.with_page_cache(2 * page);
    assert_eq!(small.page_cache_budget(), 2 * page);
    let (got, bytes) = attend(&small, &fmt, &pages, &tags);
    assert_eq!((got, bytes), (want.clone(), untagged), "the untagged path");
    // Three slots: a call over pages 0 and 1 only, then one over page 2 evicts page 0 (the
    // least recently used), so the next full call uploads page 0 again but not page 1.
    let three = small.with_page_cache(3 * page);
    let (_, full_bytes) = attend(&three, &fmt, &pages, &tags);
    let (_, again_bytes) = attend(&three, &fmt, &pages, &tags);
    let two: Vec<Vec<u8>> = vec![pages[1].clone(), vec![0u8; fmt.page_bytes()]];
    let other = row_check::fresh_tags(1)[0];
    // Page 1 again (same tag), and a fresh page: three slots hold pages 0, 1 and 2, so the
    // fresh one evicts page 0, the least recently used.
    let refs: Vec<&[u8]> = two.iter().map(Vec::as_slice).collect();
    let q = vec![0.1f32; 2 * 192];
    let mut out = vec![0f32; q.len()];
    three
        .paged_attention_indexed(
            &q,
            &fmt,
            &refs,
            &[tags[1], other],
            &[],
            &[(0, 0), (1, 0)],
            &[0, 1],
            &[0, 2],
            &[0.5, -0.5],
            0.07,
            &mut out,
        )
        .expect("valid pages");
    let (got, evicted_bytes) = attend(&three, &fmt, &pages, &tags);
    assert_eq!(got, want, "after the eviction");
    let p = page as u64;
    assert!(
        full_bytes >= again_bytes + 3 * p,
        "{full_bytes} then {again_bytes}"
    );
    assert_eq!(
        evicted_bytes,
        again_bytes + p,
        "page 0 alone uploaded again"
    );
}

#[test]
fn tagged_index_k_pages_choose_as_untagged_ones() {
    if !emu_available("tagged_index_k_pages_choose_as_untagged_ones") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let layout = IndexKLayout::new(IndexKDtype::Fp8, 64, 16).expect("a layout");
    let fmt = RowFormat::IndexK(layout);
    let pages: Vec<Vec<u8>> = (0..2)
        .map(|p| {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..16 {
                let v: Vec<f32> = (0..64)
                    .map(|i| ((i * 3 + slot * 7 + p) % 17) as f32 - 8.0)
                    .collect();
                be.cache_store(&fmt, &mut page, slot, &v).expect("a slot");
            }
            page
        })
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let rows: Vec<(usize, usize)> = (0..32).map(|i| (i / 16, i % 16)).collect();
    // Nested prefixes, as a prefill chunk's rows score them.
    let ranges: Vec<(usize, usize)> = (1..=4).map(|r| (0, 8 * r)).collect();
    let (q, w) = (vec![0.5f32; 4 * 2 * 64], vec![1.0f32; 4 * 2]);
    let run = |tags: &[PageTag]| {
        let before = stats(&be);
        let chosen = be
            .paged_indexer_topk_ranges(&q, &w, &fmt, &refs, tags, &rows, &ranges, 5)
            .expect("valid pages");
        (chosen, stats(&be).since(&before).write_bytes)
    };
    let (want, _) = run(&[]);
    let tags = row_check::fresh_tags(2);
    let (first, first_bytes) = run(&tags);
    let (again, again_bytes) = run(&tags);
    assert_eq!((&first, &again), (&want, &want));
    let pages_bytes = 2 * 16 * fmt.entry_bytes() as u64;
    assert_eq!(first_bytes, again_bytes + pages_bytes, "both pages once");
}

#[test]
fn the_model_decodes_the_same_bits_uploading_less_with_the_cache() {
    if !emu_available("the_model_decodes_the_same_bits_uploading_less_with_the_cache") {
        return;
    }
    let run = |budget: usize| {
        let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"))
            .with_page_cache(budget);
        let be: Arc<dyn Backend> = Arc::new(be);
        let m = load_model(
            &ModelSource::Tiny { seed: 0 },
            be.clone(),
            Default::default(),
        )
        .expect("the tiny model");
        let mut seq = m.new_sequence();
        let prompt: Vec<u32> = (0..300).map(|i| 2 + (i * 37 % 300)).collect();
        let mut bits: Vec<u32> = Vec::new();
        let out = m.forward(&mut seq, &prompt).expect("prefill");
        bits.extend(out.logits.iter().map(|x| x.to_bits()));
        let before = be.device().expect("device ops").stats();
        for t in [5u32, 6, 7] {
            let out = m.forward(&mut seq, &[t]).expect("decode");
            bits.extend(out.logits.iter().map(|x| x.to_bits()));
        }
        let moved = be.device().expect("device ops").stats().since(&before);
        (bits, moved.write_bytes)
    };
    let (want, without) = run(0);
    let (got, with) = run(64 << 20);
    assert!(got == want, "the cache changes no logit bit");
    eprintln!(
        "three decode steps at 300 tokens: {with} bytes uploaded with the cache, {without} without"
    );
    assert!(
        with < without,
        "{with} bytes with the cache, {without} without"
    );
}

/// Attention of one query over packed entries `picks` ((page, slot) of `pages`) copied into
/// fresh untagged pages, as a long context's top-k selection is: with `origins`, each packed
/// entry names its source page's tag and slot. The output's bits and the bytes uploaded.
fn attend_packed(
    be: &CudaBackend,
    fmt: &RowFormat,
    pages: &[Vec<u8>],
    tags: &[PageTag],
    picks: &[(usize, usize)],
    origins: bool,
) -> (Vec<u32>, u64) {
    let per = fmt.page_entries();
    let mut packed = vec![vec![0u8; fmt.page_bytes()]; picks.len().div_ceil(per)];
    let mut from = vec![Vec::new(); packed.len()];
    for (r, &(p, s)) in picks.iter().enumerate() {
        fmt.copy_entry(&pages[p], s, &mut packed[r / per], r % per)
            .expect("an entry");
        from[r / per].push(EntryOrigin {
            tag: tags[p],
            slot: s as u32,
        });
    }
    let refs: Vec<&[u8]> = packed.iter().map(Vec::as_slice).collect();
    let from: Vec<&[EntryOrigin]> = from.iter().map(Vec::as_slice).collect();
    let untagged = vec![PageTag::UNTAGGED; packed.len()];
    let rows: Vec<(usize, usize)> = (0..picks.len()).map(|r| (r / per, r % per)).collect();
    let ids: Vec<usize> = (0..rows.len()).collect();
    let q: Vec<f32> = (0..2 * 192).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
    let keys = PagedCall {
        pages: &refs,
        tags: &untagged,
        origins: if origins { &from } else { &[] },
        rows: &rows,
        ids: &ids,
    };
    attend_keys(be, fmt, &keys, &q, &[0, rows.len()])
}

#[test]
fn packed_entries_are_read_from_the_cached_source_pages() {
    if !emu_available("packed_entries_are_read_from_the_cached_source_pages") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    be.check_page_cache(true);
    let (fmt, mut pages) = kv_pages(&be, 8);
    let entry = fmt.entry_bytes() as u64;
    let mut tags = row_check::fresh_tags(3);
    let a = [(0, 1), (2, 7), (0, 6), (1, 3), (2, 0)];
    let run = |pages: &[Vec<u8>], tags: &[PageTag], picks: &[(usize, usize)]| {
        let (want, plain) = attend_packed(&be, &fmt, pages, tags, picks, false);
        let (got, bytes) = attend_packed(&be, &fmt, pages, tags, picks, true);
        assert_eq!(got, want, "{picks:?}: the packed entries' bits");
        (plain, bytes)
    };
    // The first call brings the five entries up into their source pages' slots (and sends
    // their row ids, 4 bytes each); a repeat uploads none of them, where without origins the
    // packed entries go up every time.
    let (plain, first) = run(&pages, &tags, &a);
    let (_, again) = run(&pages, &tags, &a);
    assert_eq!(
        first,
        again + 5 * entry,
        "the first call uploads the entries"
    );
    assert_eq!(first, plain + 5 * 4, "the entries and their row ids");
    // The next selection shares three entries: only the two new ones go up.
    let b = [(0, 1), (1, 4), (1, 3), (2, 2), (2, 7)];
    let (_, next) = run(&pages, &tags, &b);
    assert_eq!(next, again + 2 * entry, "two new entries uploaded");
    // Source page 2 is rewritten (a new lineage): its entries go up again, the others not.
    be.cache_store(&fmt, &mut pages[2], 7, &[0.25f32; 192])
        .expect("a slot");
    tags[2] = PageTag::fresh_whole();
    let (_, rewritten) = run(&pages, &tags, &b);
    assert_eq!(rewritten, again + 2 * entry, "page 2's two entries again");
    // A page read whole and packed entries of the same page in one call share its slot.
    let (got, _) = attend(&be, &fmt, &pages, &tags);
    assert_eq!(got, attend(&be, &fmt, &pages, &[]).0, "whole pages after");
    let (_, served) = run(&pages, &tags, &a);
    assert_eq!(served, again, "every entry of `a` is held now");
}
