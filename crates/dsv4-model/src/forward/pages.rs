//! Cache pages that live outside a sequence, in a store (an engine's pools, or the model's own
//! growable [`HeapStore`]s): the [`PageStore`] trait, and [`PooledPages`], a list of page ids
//! with shared ownership (clone retains, drop releases) and copy-on-write before any page
//! shared with another holder is written. Pages a host tier is still loading carry a
//! [`LoadTag`]; every read through [`PooledPages`] waits on it first.
//!
//! A store may tag page contents ([`PageStore::read_tagged`], [`PageTag`]): every allocation,
//! copy or whole-page write gives the page a fresh lineage from one process-wide counter, and a
//! write of one entry past every entry written under the lineage ([`PageStore::write_entry`],
//! an append) keeps it and settles the entry. A device backend keeps copies of tagged pages
//! across calls and uploads only the entries written since its copy.

use super::ForwardError;
use super::transfer::LoadTag;
pub use dsv4_kernels::PageTag;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Index of a page inside one [`PageStore`].
pub type PageId = u32;

/// A pool of equally sized byte pages with reference counts (implemented by the engine).
///
/// A page id handed out by `alloc` stays valid until its last reference is released. The
/// forward pass never writes a page that has more than one reference.
pub trait PageStore: Send + Sync + fmt::Debug {
    /// The pool's name, for errors and logs (e.g. "c4_kv").
    fn name(&self) -> &str;
    /// Bytes of every page.
    fn page_bytes(&self) -> usize;
    /// Page ids the store can name (ids are 0..capacity).
    fn capacity(&self) -> usize;
    /// A free page with one reference, its bytes zeroed; None when the pool is full.
    fn alloc(&self) -> Option<PageId>;
    /// Add a reference to `page`.
    fn retain(&self, page: PageId);
    /// Drop a reference to `page`; it is free again once no reference is left.
    fn release(&self, page: PageId);
    /// References currently held on `page`.
    fn refs(&self, page: PageId) -> u32;
    /// Run `f` on the bytes of `page` (an empty slice for an id the store never handed out).
    fn read(&self, page: PageId, f: &mut dyn FnMut(&[u8]));
    /// [`PageStore::read`], with the page's content tag taken under the same lock as the
    /// bytes: a fresh lineage since each allocation, copy and [`PageStore::write`], settled
    /// past each [`PageStore::write_entry`] append. A store that does not tag pages gives
    /// [`PageTag::UNTAGGED`] (the default).
    fn read_tagged(&self, page: PageId, f: &mut dyn FnMut(&[u8], PageTag)) {
        self.read(page, &mut |b| f(b, PageTag::UNTAGGED));
    }
    /// Run `f` on the bytes of `page` for writing (an empty slice for an unknown id).
    fn write(&self, page: PageId, f: &mut dyn FnMut(&mut [u8]));
    /// [`PageStore::write`] where `f` changes entry `slot` of the page only (one cache row),
    /// so a tagging store moves the page's tag by [`PageTag::after_entry_write`] instead of
    /// giving it a fresh lineage (the default writes the page as a whole).
    fn write_entry(&self, page: PageId, slot: usize, f: &mut dyn FnMut(&mut [u8])) {
        let _ = slot;
        self.write(page, f);
    }
    /// Copy all bytes of page `from` into page `to`.
    fn copy(&self, from: PageId, to: PageId);
}

/// Page ids in one store, held with one reference each.
pub struct PooledPages {
    store: Arc<dyn PageStore>,
    ids: Vec<PageId>,
    pending: Option<LoadTag>,
}

impl PooledPages {
    /// No pages yet, in `store`.
    pub fn new(store: Arc<dyn PageStore>) -> Self {
        Self {
            store,
            ids: Vec::new(),
            pending: None,
        }
    }

    /// The pending load-back of these pages, if a host tier put them here.
    pub fn pending(&self) -> Option<&LoadTag> {
        self.pending.as_ref()
    }

    /// Block until the pages are on the device (at once when no load-back is pending): the
    /// wait every read of the pages goes through.
    pub fn wait_loaded(&self) {
        if let Some(t) = &self.pending {
            t.wait();
        }
    }

    /// A copy of logical page `index`'s bytes, after [`Self::wait_loaded`].
    pub fn page_bytes(&self, index: usize) -> Result<Vec<u8>, ForwardError> {
        let id = self.readable(index)?;
        self.wait_loaded();
        let mut v = Vec::new();
        self.store.read(id, &mut |b| v = b.to_vec());
        Ok(v)
    }

    /// Move these pages to other pages: release the current ids and hold `ids` of `store`
    /// instead (each already holding one reference for this list), with `pending` naming the
    /// load-back that fills them, if any. A host tier spills and loads back through this.
    pub fn rehome(
        &mut self,
        store: Arc<dyn PageStore>,
        ids: Vec<PageId>,
        pending: Option<LoadTag>,
    ) {
        for &id in &self.ids {
            self.store.release(id);
        }
        self.store = store;
        self.ids = ids;
        self.pending = pending;
    }

    /// The store the pages live in.
    pub fn store(&self) -> &Arc<dyn PageStore> {
        &self.store
    }

    /// The page ids, in logical order.
    pub fn ids(&self) -> &[PageId] {
        &self.ids
    }

    /// Whether writing logical page `index` would allocate (it is missing, or it is shared).
    pub fn needs_fresh(&self, index: usize) -> bool {
        self.ids
            .get(index)
            .is_none_or(|&id| self.store.refs(id) > 1)
    }

    /// The id of logical page `index`, ready to be written: allocated when it is the next page,
    /// copied first when it is shared with another holder (after a pending load-back of the
    /// pages is done).
    pub fn writable(&mut self, index: usize) -> Result<PageId, ForwardError> {
        let exhausted = || ForwardError::PoolExhausted {
            pool: self.store.name().to_string(),
        };
        if index == self.ids.len() {
            let id = self.store.alloc().ok_or_else(exhausted)?;
            self.ids.push(id);
            return Ok(id);
        }
        let Some(&old) = self.ids.get(index) else {
            return Err(ForwardError::MissingPage {
                pool: self.store.name().to_string(),
                index,
                held: self.ids.len(),
            });
        };
        // A page still being loaded is neither written nor copied before it has arrived.
        self.wait_loaded();
        if self.store.refs(old) <= 1 {
            return Ok(old);
        }
        let new = self.store.alloc().ok_or_else(exhausted)?;
        self.store.copy(old, new);
        self.store.release(old);
        self.ids[index] = new;
        Ok(new)
    }

    /// The id of logical page `index` for reading.
    pub fn readable(&self, index: usize) -> Result<PageId, ForwardError> {
        self.ids
            .get(index)
            .copied()
            .ok_or_else(|| ForwardError::MissingPage {
                pool: self.store.name().to_string(),
                index,
                held: self.ids.len(),
            })
    }
}

impl Clone for PooledPages {
    /// Share the same pages (one more reference each); the first write copies a shared page.
    fn clone(&self) -> Self {
        for &id in &self.ids {
            self.store.retain(id);
        }
        Self {
            store: Arc::clone(&self.store),
            ids: self.ids.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl Drop for PooledPages {
    fn drop(&mut self) {
        for &id in &self.ids {
            self.store.release(id);
        }
    }
}

impl fmt::Debug for PooledPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledPages")
            .field("store", &self.store.name())
            .field("ids", &self.ids)
            .field(
                "pending",
                &self.pending.as_ref().map(|t| (t.slot(), t.layer())),
            )
            .finish()
    }
}

/// The stores a pooled sequence's caches live in, one per cache kind (spec §4).
#[derive(Debug, Clone)]
pub struct CacheStores {
    /// SWA KV ring pages (every layer).
    pub swa: Arc<dyn PageStore>,
    /// Compressed KV entries of ratio-4 layers.
    pub c4: Arc<dyn PageStore>,
    /// Compressed KV entries of ratio-128 layers.
    pub c128: Arc<dyn PageStore>,
    /// Index-K rows of ratio-4 layers.
    pub index_k: Arc<dyn PageStore>,
    /// Attention compressor rings of ratio-4 layers (one page per ring).
    pub c4_ring: Arc<dyn PageStore>,
    /// Attention compressor rings of ratio-128 layers (one page per ring).
    pub c128_ring: Arc<dyn PageStore>,
    /// Indexer compressor rings of ratio-4 layers (one page per ring).
    pub index_ring: Arc<dyn PageStore>,
}

/// Pages of a [`HeapStore`].
#[derive(Debug, Default)]
struct HeapPages {
    pages: Vec<Vec<u8>>,
    refs: Vec<u32>,
    /// Each page's content tag.
    tags: Vec<PageTag>,
    free: Vec<PageId>,
}

/// A growable, unbounded page store in host memory: where sequences made with
/// `Model::new_sequence` keep their caches (an engine uses its fixed pools instead).
#[derive(Debug)]
pub struct HeapStore {
    name: &'static str,
    page_bytes: usize,
    inner: Mutex<HeapPages>,
}

impl HeapStore {
    /// An empty store of pages of `page_bytes` bytes.
    pub fn new(name: &'static str, page_bytes: usize) -> Self {
        Self {
            name,
            page_bytes,
            inner: Mutex::new(HeapPages::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HeapPages> {
        // Every method completes its bookkeeping before calling out, so a poisoned lock is
        // still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on `page`'s bytes for writing, its tag moved by `retag` first (same lock).
    fn write_retagged(
        &self,
        page: PageId,
        retag: impl FnOnce(PageTag) -> PageTag,
        f: &mut dyn FnMut(&mut [u8]),
    ) {
        let mut h = self.lock();
        if let Some(t) = h.tags.get_mut(page as usize) {
            *t = retag(*t);
        }
        match h.pages.get_mut(page as usize) {
            Some(p) => f(p),
            None => f(&mut []),
        }
    }
}

impl PageStore for HeapStore {
    fn name(&self) -> &str {
        self.name
    }

    fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn capacity(&self) -> usize {
        self.lock().pages.len()
    }

    fn alloc(&self) -> Option<PageId> {
        let mut h = self.lock();
        let id = match h.free.pop() {
            Some(id) => {
                h.pages[id as usize].fill(0);
                id
            }
            None => {
                let id = PageId::try_from(h.pages.len()).ok()?;
                h.pages.push(vec![0; self.page_bytes]);
                h.refs.push(0);
                h.tags.push(PageTag::UNTAGGED);
                id
            }
        };
        h.refs[id as usize] = 1;
        h.tags[id as usize] = PageTag::fresh(0);
        Some(id)
    }

    fn retain(&self, page: PageId) {
        if let Some(r) = self.lock().refs.get_mut(page as usize) {
            *r += 1;
        }
    }

    fn release(&self, page: PageId) {
        let mut h = self.lock();
        let freed = match h.refs.get_mut(page as usize) {
            Some(r) if *r > 0 => {
                *r -= 1;
                *r == 0
            }
            _ => false,
        };
        if freed {
            h.free.push(page);
        }
    }

    fn refs(&self, page: PageId) -> u32 {
        self.lock().refs.get(page as usize).copied().unwrap_or(0)
    }

    fn read(&self, page: PageId, f: &mut dyn FnMut(&[u8])) {
        let h = self.lock();
        f(h.pages.get(page as usize).map_or(&[][..], Vec::as_slice));
    }

    fn read_tagged(&self, page: PageId, f: &mut dyn FnMut(&[u8], PageTag)) {
        let h = self.lock();
        match (h.pages.get(page as usize), h.tags.get(page as usize)) {
            (Some(p), Some(&tag)) => f(p, tag),
            _ => f(&[], PageTag::UNTAGGED),
        }
    }

    fn write(&self, page: PageId, f: &mut dyn FnMut(&mut [u8])) {
        self.write_retagged(page, |_| PageTag::fresh_whole(), f);
    }

    fn write_entry(&self, page: PageId, slot: usize, f: &mut dyn FnMut(&mut [u8])) {
        self.write_retagged(page, |t| t.after_entry_write(slot), f);
    }

    fn copy(&self, from: PageId, to: PageId) {
        let mut h = self.lock();
        if (from as usize) < h.pages.len() && (to as usize) < h.pages.len() && from != to {
            let src = h.pages[from as usize].clone();
            h.pages[to as usize].copy_from_slice(&src);
            h.tags[to as usize] = PageTag::fresh(h.tags[from as usize].settled);
        }
    }
}

impl CacheStores {
    /// Heap stores for every cache kind, with page sizes `[kv, index_k, c4 ring, c128 ring,
    /// index ring]` bytes, named like an engine's pools.
    pub fn heap(kv: usize, index_k: usize, rings: [usize; 3]) -> Self {
        let h = |name, bytes| -> Arc<dyn PageStore> { Arc::new(HeapStore::new(name, bytes)) };
        Self {
            swa: h("swa_kv", kv),
            c4: h("c4_kv", kv),
            c128: h("c128_kv", kv),
            index_k: h("c4_index_k", index_k),
            c4_ring: h("c4_state", rings[0]),
            c128_ring: h("c128_state", rings[1]),
            index_ring: h("c4_index_state", rings[2]),
        }
    }

    /// Every store, in the engine's pool order.
    pub fn all(&self) -> [&Arc<dyn PageStore>; 7] {
        [
            &self.swa,
            &self.c4,
            &self.c128,
            &self.index_k,
            &self.c4_ring,
            &self.c128_ring,
            &self.index_ring,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heap_page_is_tagged_afresh_by_each_allocation_write_and_copy() {
        let h = HeapStore::new("kv", 4);
        let tag = |page| {
            let mut t = PageTag::UNTAGGED;
            h.read_tagged(page, &mut |_, tag| t = tag);
            t
        };
        let a = h.alloc().unwrap();
        let t0 = tag(a);
        assert_eq!(tag(a), t0, "a read keeps the tag");
        h.write(a, &mut |b| b[1] = 9);
        let t1 = tag(a);
        let b = h.alloc().unwrap();
        let t2 = tag(b);
        h.copy(a, b);
        let t3 = tag(b);
        h.release(a);
        let t4 = tag(h.alloc().unwrap());
        let all = [t0, t1, t2, t3, t4].map(|t| t.lineage);
        assert!(!all.contains(&0), "{all:?}");
        let distinct: std::collections::HashSet<u64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "lineages {all:?}");
        assert_eq!(tag(7), PageTag::UNTAGGED, "an unknown id is untagged");
    }

    #[test]
    fn heap_entry_writes_append_under_one_lineage_until_one_goes_back() {
        let h = HeapStore::new("kv", 8);
        let a = h.alloc().unwrap();
        let tag = || {
            let mut t = PageTag::UNTAGGED;
            h.read_tagged(a, &mut |_, tag| t = tag);
            t
        };
        let t0 = tag();
        assert_eq!(t0.settled, 0, "a fresh page has nothing settled");
        h.write_entry(a, 0, &mut |b| b[0] = 1);
        h.write_entry(a, 2, &mut |b| b[2] = 1);
        assert_eq!(
            tag(),
            PageTag {
                lineage: t0.lineage,
                settled: 3
            }
        );
        // A write that goes back (a ring wrapping onto the page) starts a new lineage, and the
        // copy of a page keeps what its source had settled under a lineage of its own.
        h.write_entry(a, 1, &mut |b| b[1] = 1);
        let t1 = tag();
        assert_ne!(t1.lineage, t0.lineage);
        assert_eq!(t1.settled, 2);
        let b = h.alloc().unwrap();
        h.copy(a, b);
        let mut tb = PageTag::UNTAGGED;
        h.read_tagged(b, &mut |_, t| tb = t);
        assert_ne!(tb.lineage, t1.lineage);
        assert_eq!(tb.settled, 2);
    }
}
