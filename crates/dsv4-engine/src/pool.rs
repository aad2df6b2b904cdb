//! One cache pool: a fixed arena of equally sized byte pages (allocated once, so memory is
//! bounded) with a free list and a reference count per page. It implements the model's
//! [`PageStore`], so the forward pass reads and writes rows straight in the arena.

use dsv4_model::forward::pages::{PageId, PageStore, PageTag};
use serde::{Deserialize, Serialize};
use std::sync::{Mutex, MutexGuard};

/// The kinds of cache pools (spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// SWA KV ring pages (every layer).
    SwaKv,
    /// Compressed KV entries of ratio-4 layers.
    C4Kv,
    /// Compressed KV entries of ratio-128 layers.
    C128Kv,
    /// Indexer key rows of ratio-4 layers.
    C4IndexK,
    /// Attention compressor rings of ratio-4 layers.
    C4State,
    /// Attention compressor rings of ratio-128 layers.
    C128State,
    /// Indexer compressor rings of ratio-4 layers.
    C4IndexState,
}

impl PoolKind {
    /// Every kind, in table order.
    pub const ALL: [PoolKind; 7] = [
        PoolKind::SwaKv,
        PoolKind::C4Kv,
        PoolKind::C128Kv,
        PoolKind::C4IndexK,
        PoolKind::C4State,
        PoolKind::C128State,
        PoolKind::C4IndexState,
    ];

    /// The pool's name in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::SwaKv => "swa_kv",
            PoolKind::C4Kv => "c4_kv",
            PoolKind::C128Kv => "c128_kv",
            PoolKind::C4IndexK => "c4_index_k",
            PoolKind::C4State => "c4_state",
            PoolKind::C128State => "c128_state",
            PoolKind::C4IndexState => "c4_index_state",
        }
    }

    /// The name of the pool's host-tier counterpart.
    pub fn host_name(self) -> &'static str {
        match self {
            PoolKind::SwaKv => "host_swa_kv",
            PoolKind::C4Kv => "host_c4_kv",
            PoolKind::C128Kv => "host_c128_kv",
            PoolKind::C4IndexK => "host_c4_index_k",
            PoolKind::C4State => "host_c4_state",
            PoolKind::C128State => "host_c128_state",
            PoolKind::C4IndexState => "host_c4_index_state",
        }
    }

    /// The kind of a device pool's name.
    pub fn from_name(name: &str) -> Option<PoolKind> {
        PoolKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Position in [`PoolKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

struct Arena {
    bytes: Vec<u8>,
    refs: Vec<u32>,
    /// Each page's content tag (`PageStore::read_tagged`).
    tags: Vec<PageTag>,
    free: Vec<PageId>,
}

/// A pool of `pages` pages of `page_bytes` bytes, each holding `rows_per_page` rows.
pub struct Pool {
    kind: PoolKind,
    name: &'static str,
    page_bytes: usize,
    rows_per_page: usize,
    pages: usize,
    arena: Mutex<Arena>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("kind", &self.kind)
            .field("pages", &self.pages)
            .field("used", &self.used_pages())
            .finish()
    }
}

impl Pool {
    /// An arena of `pages` zeroed pages, all free (page 0 is handed out first).
    pub fn new(kind: PoolKind, pages: usize, page_bytes: usize, rows_per_page: usize) -> Self {
        Self::named(kind, kind.name(), pages, page_bytes, rows_per_page)
    }

    /// Like [`Pool::new`], for the host tier's counterpart of `kind` (named e.g. "host_c4_kv").
    pub fn host(kind: PoolKind, pages: usize, page_bytes: usize, rows_per_page: usize) -> Self {
        Self::named(kind, kind.host_name(), pages, page_bytes, rows_per_page)
    }

    fn named(
        kind: PoolKind,
        name: &'static str,
        pages: usize,
        page_bytes: usize,
        rows_per_page: usize,
    ) -> Self {
        let free = (0..pages as PageId).rev().collect();
        Self {
            kind,
            name,
            page_bytes,
            rows_per_page,
            pages,
            arena: Mutex::new(Arena {
                bytes: vec![0u8; pages * page_bytes],
                refs: vec![0; pages],
                tags: (0..pages).map(|_| PageTag::fresh(0)).collect(),
                free,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Arena> {
        // A panic while the lock was held cannot leave the arena's bookkeeping half-done
        // (every method finishes its updates before calling out), so a poisoned lock is usable.
        self.arena.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn range(&self, page: PageId) -> Option<std::ops::Range<usize>> {
        let p = page as usize;
        (p < self.pages).then(|| p * self.page_bytes..(p + 1) * self.page_bytes)
    }

    /// Run `f` on `page`'s bytes for writing, its tag moved by `retag` first (same lock).
    fn write_retagged(
        &self,
        page: PageId,
        retag: impl FnOnce(PageTag) -> PageTag,
        f: &mut dyn FnMut(&mut [u8]),
    ) {
        let mut a = self.lock();
        match self.range(page) {
            Some(r) => {
                a.tags[page as usize] = retag(a.tags[page as usize]);
                f(&mut a.bytes[r])
            }
            None => f(&mut []),
        }
    }

    /// The pool's kind.
    pub fn kind(&self) -> PoolKind {
        self.kind
    }

    /// Pages in the arena.
    pub fn capacity(&self) -> usize {
        self.pages
    }

    /// Rows one page holds.
    pub fn rows_per_page(&self) -> usize {
        self.rows_per_page
    }

    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        self.lock().free.len()
    }

    /// Pages in use now.
    pub fn used_pages(&self) -> usize {
        self.pages - self.free_pages()
    }

    /// A 64-bit checksum of every page's bytes, in page order (for the canary).
    pub fn page_checksums(&self) -> Vec<u64> {
        let a = self.lock();
        a.bytes
            .chunks(self.page_bytes.max(1))
            .take(self.pages)
            .map(dsv4_core::cache::page_checksum)
            .collect()
    }

    /// A copy of page `page`'s raw bytes (None for an id outside the arena).
    pub fn raw_page(&self, page: PageId) -> Option<Vec<u8>> {
        let r = self.range(page)?;
        Some(self.lock().bytes[r].to_vec())
    }
}

impl PageStore for Pool {
    fn name(&self) -> &str {
        self.name
    }

    fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn capacity(&self) -> usize {
        self.pages
    }

    fn alloc(&self) -> Option<PageId> {
        let mut a = self.lock();
        let id = a.free.pop()?;
        a.refs[id as usize] = 1;
        let r = self.range(id)?;
        a.bytes[r].fill(0);
        a.tags[id as usize] = PageTag::fresh(0);
        Some(id)
    }

    fn retain(&self, page: PageId) {
        let mut a = self.lock();
        if let Some(r) = a.refs.get_mut(page as usize) {
            debug_assert!(*r > 0, "retain of free page {page} in {}", self.name);
            *r += 1;
        }
    }

    fn release(&self, page: PageId) {
        let mut a = self.lock();
        let Some(r) = a.refs.get_mut(page as usize) else {
            return;
        };
        debug_assert!(*r > 0, "release of free page {page} in {}", self.name);
        if *r == 0 {
            tracing::error!(pool = self.name, page, "release of a free page ignored");
            return;
        }
        *r -= 1;
        if *r == 0 {
            a.free.push(page);
        }
    }

    fn refs(&self, page: PageId) -> u32 {
        self.lock().refs.get(page as usize).copied().unwrap_or(0)
    }

    fn read(&self, page: PageId, f: &mut dyn FnMut(&[u8])) {
        let a = self.lock();
        match self.range(page) {
            Some(r) => f(&a.bytes[r]),
            None => f(&[]),
        }
    }

    fn read_tagged(&self, page: PageId, f: &mut dyn FnMut(&[u8], PageTag)) {
        let a = self.lock();
        match self.range(page) {
            Some(r) => f(&a.bytes[r], a.tags[page as usize]),
            None => f(&[], PageTag::UNTAGGED),
        }
    }

    fn write(&self, page: PageId, f: &mut dyn FnMut(&mut [u8])) {
        self.write_retagged(page, |_| PageTag::fresh_whole(), f);
    }

    fn write_entry(&self, page: PageId, slot: usize, f: &mut dyn FnMut(&mut [u8])) {
        self.write_retagged(page, |t| t.after_entry_write(slot), f);
    }

    fn copy(&self, from: PageId, to: PageId) {
        if let (Some(src), Some(dst)) = (self.range(from), self.range(to)) {
            let mut a = self.lock();
            a.bytes.copy_within(src, dst.start);
            a.tags[to as usize] = PageTag::fresh(a.tags[from as usize].settled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tag `read_tagged` gives `page` of `p`, with its bytes.
    fn tagged(p: &dyn PageStore, page: PageId) -> (Vec<u8>, PageTag) {
        let mut out = (Vec::new(), PageTag::UNTAGGED);
        p.read_tagged(page, &mut |b, t| out = (b.to_vec(), t));
        out
    }

    #[test]
    fn every_change_of_a_page_gives_it_a_fresh_tag() {
        let p = Pool::new(PoolKind::C4Kv, 2, 8, 1);
        let other = Pool::new(PoolKind::C4Kv, 2, 8, 1);
        let a = p.alloc().unwrap();
        let (bytes, t0) = tagged(&p, a);
        assert_eq!(
            (bytes, tagged(&p, a).1),
            (vec![0; 8], t0),
            "reads keep the tag"
        );
        assert!(t0.is_tagged());
        p.write(a, &mut |b| b[0] = 1);
        let t1 = tagged(&p, a).1;
        let b = p.alloc().unwrap();
        let t2 = tagged(&p, b).1;
        p.copy(a, b);
        let t3 = tagged(&p, b).1;
        p.release(a);
        let c = p.alloc().unwrap();
        assert_eq!(c, a);
        let t4 = tagged(&p, c).1;
        let o = other.alloc().unwrap();
        let t5 = tagged(&other, o).1;
        let all = [t0, t1, t2, t3, t4, t5].map(|t| t.lineage);
        let distinct: std::collections::HashSet<u64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "lineages {all:?}");
        assert_eq!(
            tagged(&p, 9),
            (Vec::new(), PageTag::UNTAGGED),
            "unknown ids are untagged"
        );
    }

    #[test]
    fn entry_writes_append_under_one_lineage_until_one_goes_back() {
        let p = Pool::new(PoolKind::SwaKv, 1, 8, 4);
        let a = p.alloc().unwrap();
        let t0 = tagged(&p, a).1;
        assert_eq!(t0.settled, 0);
        p.write_entry(a, 0, &mut |b| b[0] = 1);
        p.write_entry(a, 1, &mut |b| b[2] = 1);
        assert_eq!(
            tagged(&p, a),
            (
                vec![1, 0, 1, 0, 0, 0, 0, 0],
                PageTag {
                    lineage: t0.lineage,
                    settled: 2
                }
            )
        );
        // The ring comes back to entry 0: the bytes before it may change, so a new lineage.
        p.write_entry(a, 0, &mut |b| b[0] = 2);
        let t1 = tagged(&p, a).1;
        assert_ne!(t1.lineage, t0.lineage);
        assert_eq!(t1.settled, 1);
        p.write(a, &mut |b| b[7] = 3);
        let t2 = tagged(&p, a).1;
        assert_ne!(t2.lineage, t1.lineage);
        assert_eq!(
            t2.settled,
            u32::MAX,
            "a whole-page write settles every entry"
        );
    }

    #[test]
    fn pages_are_reference_counted_and_zeroed_when_reused() {
        let p = Pool::new(PoolKind::C4Kv, 2, 8, 1);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_ne!(a, b);
        assert!(p.alloc().is_none(), "only two pages");
        p.write(a, &mut |bytes| bytes.fill(7));
        p.retain(a);
        p.release(a);
        assert_eq!(p.refs(a), 1);
        assert_eq!(p.free_pages(), 0);
        p.copy(a, b);
        assert_eq!(p.raw_page(b).unwrap(), vec![7; 8]);
        p.release(a);
        assert_eq!(p.free_pages(), 1);
        let c = p.alloc().unwrap();
        assert_eq!(c, a, "the freed page is reused");
        assert_eq!(p.raw_page(c).unwrap(), vec![0; 8], "and zeroed");
        assert!(p.raw_page(9).is_none());
        let mut len = usize::MAX;
        p.read(9, &mut |b| len = b.len());
        assert_eq!(len, 0, "unknown ids read as empty pages");
    }
}
