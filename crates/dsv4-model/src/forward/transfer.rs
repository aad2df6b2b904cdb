//! Load-back synchronisation for a host cache tier (SGLang's `LayerDoneCounter`, per pool):
//! pages a sequence's state names may still be arriving from host memory, copied layer by
//! layer by a transfer worker. A [`LayerDoneCounter`] counts, per store slot, the layers whose
//! pages are on the device; a [`LoadTag`] on a [`super::pages::PooledPages`] names the counter,
//! the slot and the layer, and every read of those pages through the model's read path waits
//! on it first (`wait_until(slot, layer)`).
//!
//! The counter also records what readers asked for: `demanded` (a reader is blocked on the
//! layer: the transfer worker may use it to pace itself) and `waited` (the layers a reader
//! synchronised with: the engine declares the load-back's writes to those layers as part of
//! the round's write set, so the cache-page canary stays silent when every read waits).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Store slots of a sequence's caches, in [`super::pages::CacheStores::all`] order.
pub const STORE_SLOTS: usize = 7;

/// The slot of the index-K store (the read the `skip-index-k-transfer-wait` fault skips).
pub const INDEX_K_SLOT: usize = 3;

/// What a counter knows, per slot.
#[derive(Debug, Default)]
struct Counts {
    /// Layers 0..done are on the device.
    done: [usize; STORE_SLOTS],
    /// A reader wants layers 0..demand.
    demand: [usize; STORE_SLOTS],
    /// Readers synchronised with layers 0..waited.
    waited: [usize; STORE_SLOTS],
}

/// Per-slot, per-layer done counters of one load-back.
pub struct LayerDoneCounter {
    layers: usize,
    counts: Mutex<Counts>,
    changed: Condvar,
    complete: AtomicBool,
    bell: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for LayerDoneCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerDoneCounter")
            .field("layers", &self.layers)
            .field("counts", &*self.lock())
            .finish()
    }
}

impl LayerDoneCounter {
    /// A counter over `layers` layers with nothing loaded; `bell` is rung (without any lock of
    /// the counter held) whenever a reader starts waiting, to wake the transfer worker.
    pub fn new(layers: usize, bell: Box<dyn Fn() + Send + Sync>) -> Self {
        Self {
            layers,
            counts: Mutex::new(Counts::default()),
            changed: Condvar::new(),
            complete: AtomicBool::new(layers == 0),
            bell,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Every update is a plain store of counts, so a poisoned lock is consistent.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Layers the counter covers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Block until `layer`'s pages of `slot` are on the device (a reader's wait).
    pub fn wait_until(&self, slot: usize, layer: usize) {
        if slot >= STORE_SLOTS {
            return;
        }
        // Recorded even when the layer is long done: the engine declares the load-back's
        // writes by what readers synchronised with.
        let mut c = self.lock();
        c.waited[slot] = c.waited[slot].max(layer + 1);
        if c.done[slot] > layer {
            return;
        }
        c.demand[slot] = c.demand[slot].max(layer + 1);
        drop(c);
        (self.bell)();
        let mut c = self.lock();
        while c.done[slot] <= layer {
            c = self.changed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Block until every layer of every slot is on the device, without counting as a reader.
    pub fn wait_all(&self) {
        let mut c = self.lock();
        while c.done.iter().any(|&d| d < self.layers) {
            c = self.changed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether `layer`'s pages of `slot` are on the device.
    pub fn is_done(&self, slot: usize, layer: usize) -> bool {
        self.complete.load(Ordering::Acquire)
            || self.lock().done.get(slot).is_some_and(|&d| d > layer)
    }

    /// Whether every layer of every slot is on the device.
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// The transfer worker: layers 0..=layer of `slot` are on the device.
    pub fn mark_done(&self, slot: usize, layer: usize) {
        let mut c = self.lock();
        if let Some(d) = c.done.get_mut(slot) {
            *d = (*d).max(layer + 1).min(self.layers);
        }
        if c.done.iter().all(|&d| d >= self.layers) {
            self.complete.store(true, Ordering::Release);
        }
        drop(c);
        self.changed.notify_all();
    }

    /// Per slot: layers a reader is blocked on or has asked for (0..demand).
    pub fn demanded(&self) -> [usize; STORE_SLOTS] {
        self.lock().demand
    }

    /// Per slot: layers readers synchronised with (0..waited).
    pub fn waited(&self) -> [usize; STORE_SLOTS] {
        self.lock().waited
    }
}

/// The pending load of one store's pages of one layer: read them only after
/// [`LoadTag::wait`].
#[derive(Debug, Clone)]
pub struct LoadTag {
    counter: Arc<LayerDoneCounter>,
    slot: usize,
    layer: usize,
}

impl LoadTag {
    /// The pages of `slot` of `layer`, loaded under `counter`.
    pub fn new(counter: Arc<LayerDoneCounter>, slot: usize, layer: usize) -> Self {
        Self {
            counter,
            slot,
            layer,
        }
    }

    /// Block until the pages are on the device.
    pub fn wait(&self) {
        self.counter.wait_until(self.slot, self.layer);
    }

    /// Whether the pages are on the device.
    pub fn is_done(&self) -> bool {
        self.counter.is_done(self.slot, self.layer)
    }

    /// The store slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The layer.
    pub fn layer(&self) -> usize {
        self.layer
    }
}

impl super::SequenceState {
    /// Every list of pooled page ids of the state with its layer, for a host tier to spill
    /// and load back (the store a list lives in tells its pool).
    pub fn pooled_pages_mut(&mut self) -> Vec<(usize, &mut super::pages::PooledPages)> {
        self.layers
            .iter_mut()
            .enumerate()
            .flat_map(|(l, st)| st.pooled_pages_mut().into_iter().map(move |p| (l, p)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_reader_waits_for_its_layer_and_is_recorded() {
        let rung = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&rung);
        let c = Arc::new(LayerDoneCounter::new(
            2,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        ));
        let worker = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                while c.demanded()[INDEX_K_SLOT] < 2 {
                    std::thread::yield_now();
                }
                for slot in 0..STORE_SLOTS {
                    c.mark_done(slot, 1);
                }
            })
        };
        let tag = LoadTag::new(Arc::clone(&c), INDEX_K_SLOT, 1);
        assert!(!tag.is_done());
        tag.wait();
        worker.join().unwrap();
        assert!(tag.is_done() && c.is_complete());
        assert_eq!(c.waited()[INDEX_K_SLOT], 2);
        assert_eq!(c.waited()[0], 0, "nobody read slot 0");
        assert!(rung.load(Ordering::SeqCst) >= 1, "the worker was woken");
        c.wait_all();
    }

    #[test]
    fn a_pooled_page_read_waits_for_its_load_back() {
        use super::super::pages::{HeapStore, PageStore, PooledPages};
        let store: Arc<dyn PageStore> = Arc::new(HeapStore::new("c4_index_k", 8));
        let counter = Arc::new(LayerDoneCounter::new(1, Box::new(|| {})));
        let id = store.alloc().unwrap();
        let mut pages = PooledPages::new(Arc::clone(&store));
        pages.rehome(
            Arc::clone(&store),
            vec![id],
            Some(LoadTag::new(Arc::clone(&counter), INDEX_K_SLOT, 0)),
        );
        // The "transfer worker" writes the page only once a reader asks for it, so a read
        // that did not wait would see zeros.
        let worker = {
            let (store, counter) = (Arc::clone(&store), Arc::clone(&counter));
            std::thread::spawn(move || {
                while counter.demanded()[INDEX_K_SLOT] == 0 {
                    std::thread::yield_now();
                }
                store.write(id, &mut |b| b.fill(7));
                (0..STORE_SLOTS).for_each(|s| counter.mark_done(s, 0));
            })
        };
        assert_eq!(pages.page_bytes(0).unwrap(), vec![7; 8]);
        worker.join().unwrap();
        assert_eq!(
            pages.clone().page_bytes(0).unwrap(),
            vec![7; 8],
            "clones keep the tag"
        );
    }
}
