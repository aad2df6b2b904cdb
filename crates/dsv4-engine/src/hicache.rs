//! The host cache tier (`cache.hicache`), after SGLang's HiCache: a prefix snapshot evicted
//! from the device pools is not dropped but spilled — every page of every pool it holds (KV,
//! index-K, compressor state) is copied into the host pools and the snapshot keeps host page
//! ids. A later request that hits it loads it back: device pages are allocated at once and the
//! state names them, each list tagged with the load-back's [`LayerDoneCounter`]; the bytes are
//! copied by the transfer worker thread, pool by pool and layer by layer, and every read of a
//! page through the model's read path waits on its (pool, layer) counter first.
//!
//! A load-back starts when its first reader waits (inside the forward round that uses it). At
//! the end of every round [`HostTier::settle`] finishes the started load-backs and returns the
//! pages they wrote in the (pool, layer)s some reader waited for: those writes are part of the
//! round's declared write set. A read that skipped its wait (the `skip-index-k-transfer-wait`
//! fault) leaves its pool's load-back writes undeclared, so the canary reports them.

use crate::config::{HostTierConfig, TransferPace};
use crate::metrics::EngineMetrics;
use crate::pool::{Pool, PoolKind};
use crate::pools::{CachePools, PoolPages};
use crate::prefix::{Hit, PrefixCache, Spill};
use dsv4_model::SequenceState;
use dsv4_model::forward::PageWrite;
use dsv4_model::forward::pages::{PageId, PageStore, PooledPages};
use dsv4_model::forward::transfer::{LayerDoneCounter, LoadTag, STORE_SLOTS};
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

/// Counters of the host tier (totals since start).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct HostTierStats {
    /// Snapshots spilled from the device pools to the host tier.
    pub spilled_snapshots: u64,
    /// Pages copied device → host by spills.
    pub spilled_pages: u64,
    /// Prefix hits served from the host tier (loaded back).
    pub hits: u64,
    /// Pages copied host → device by load-backs (counted when the load-back is issued).
    pub loaded_pages: u64,
    /// Host hits that could not be loaded back (no device room) and were recomputed.
    pub load_failures: u64,
    /// Snapshots dropped from the host tier to make room.
    pub dropped_snapshots: u64,
}

/// One list of pages a load-back copies.
struct Item {
    /// The host pages (released once copied).
    host: PooledPages,
    /// The device pool and its page ids (one reference each, held until copied).
    device: Arc<Pool>,
    ids: Vec<PageId>,
}

/// A load-back the worker runs: items per (layer, slot), a cursor per slot.
struct Job {
    counter: Arc<LayerDoneCounter>,
    items: Vec<[Vec<Item>; STORE_SLOTS]>,
    cursor: [usize; STORE_SLOTS],
    flush: bool,
}

impl Job {
    fn done(&self) -> bool {
        self.cursor.iter().all(|&c| c >= self.items.len())
    }

    /// The next (slot, layer) to copy under `pace`, if any may be copied now.
    fn next(&self, pace: TransferPace) -> Option<(usize, usize)> {
        let demand = self.counter.demanded();
        let started = self.flush || demand.iter().any(|&d| d > 0);
        if !started {
            return None;
        }
        let open = |s: usize| self.cursor[s] < self.items.len();
        let slot = if self.flush || pace == TransferPace::Eager {
            // Layer by layer: the slot furthest behind first.
            (0..STORE_SLOTS)
                .filter(|&s| open(s))
                .min_by_key(|&s| self.cursor[s])
        } else {
            // Only what a reader is waiting for.
            (0..STORE_SLOTS).find(|&s| open(s) && self.cursor[s] < demand[s])
        };
        slot.map(|s| (s, self.cursor[s]))
    }
}

#[derive(Default)]
struct WorkerState {
    jobs: Vec<Job>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<WorkerState>,
    wake: Condvar,
    pace: TransferPace,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, WorkerState> {
        // The worker updates cursors only after a copy completes, so a poisoned lock is
        // consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ring(&self) {
        let _g = self.lock();
        self.wake.notify_all();
    }
}

/// Copy one list of host pages to its device pages.
fn copy_item(item: Item) {
    for (i, &id) in item.ids.iter().enumerate() {
        // Copy through a buffer: the host and device pool locks are never held together.
        if let Ok(bytes) = item.host.page_bytes(i) {
            item.device.write(id, &mut |b| {
                let n = b.len().min(bytes.len());
                b[..n].copy_from_slice(&bytes[..n]);
            });
        }
        item.device.release(id);
    }
}

/// The transfer worker: copies load-backs' pages as its pace and the readers allow.
fn work(shared: Arc<Shared>) {
    loop {
        let (items, counter, slot, layer) = {
            let mut st = shared.lock();
            loop {
                st.jobs.retain(|j| !j.done());
                if st.shutdown {
                    st.jobs.iter_mut().for_each(|j| j.flush = true);
                }
                let pick = st
                    .jobs
                    .iter()
                    .enumerate()
                    .find_map(|(i, j)| j.next(shared.pace).map(|n| (i, n)));
                if let Some((i, (slot, layer))) = pick {
                    let job = &mut st.jobs[i];
                    job.cursor[slot] += 1;
                    let items = std::mem::take(&mut job.items[layer][slot]);
                    break (items, Arc::clone(&job.counter), slot, layer);
                }
                if st.shutdown {
                    return;
                }
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        items.into_iter().for_each(copy_item);
        counter.mark_done(slot, layer);
    }
}

/// A load-back the engine has issued: its counter and the device pages it writes, per
/// (slot, layer).
struct Issued {
    counter: Arc<LayerDoneCounter>,
    writes: Vec<(usize, usize, PageWrite)>,
}

/// The host pools, the transfer worker and the load-backs in flight.
pub struct HostTier {
    host: Vec<Arc<Pool>>,
    device: Vec<Arc<Pool>>,
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    issued: Vec<Issued>,
    stats: HostTierStats,
}

/// The pool of a store by its name (device or host).
fn kind_of(store: &dyn PageStore) -> Option<PoolKind> {
    PoolKind::ALL
        .into_iter()
        .find(|k| k.name() == store.name() || k.host_name() == store.name())
}

/// Pages of each pool a state holds; None when a list lives outside the engine's pools.
fn pages_of(st: &mut SequenceState) -> Option<PoolPages> {
    let mut need = [0; 7];
    for (_, p) in st.pooled_pages_mut() {
        need[kind_of(p.store().as_ref())?.index()] += p.ids().len();
    }
    Some(need)
}

fn fits(need: &PoolPages, free: &PoolPages) -> bool {
    need.iter().zip(free).all(|(n, f)| n <= f)
}

impl HostTier {
    /// The tier over `pools` (whose host pools [`CachePools::new`] sized) with its worker.
    pub fn new(pools: &CachePools, cfg: &HostTierConfig) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(WorkerState::default()),
            wake: Condvar::new(),
            pace: cfg.pace,
        });
        let s = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("dsv4-hicache".into())
            .spawn(move || work(s))?;
        Ok(Self {
            host: pools.host().to_vec(),
            device: pools.all().to_vec(),
            shared,
            worker: Some(worker),
            issued: Vec::new(),
            stats: HostTierStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> HostTierStats {
        self.stats
    }

    /// Fill the host-tier fields of `m`.
    pub fn fill(&self, m: &mut EngineMetrics) {
        let s = self.stats;
        m.host_tier_used_pages = self.host.iter().map(|p| p.used_pages()).sum();
        m.host_tier_pages = self.host.iter().map(|p| p.capacity()).sum();
        m.host_tier_spilled_pages_total = s.spilled_pages;
        m.host_tier_loaded_pages_total = s.loaded_pages;
        m.host_tier_hits_total = s.hits;
        m.host_tier_load_failures_total = s.load_failures;
        m.host_tier_dropped_snapshots_total = s.dropped_snapshots;
    }

    fn free(&self) -> PoolPages {
        std::array::from_fn(|i| self.host[i].free_pages())
    }

    /// Copy the device state `st` into host pages and make it name them (its device pages are
    /// released); nothing changes unless it fits.
    pub fn spill(&mut self, st: &mut SequenceState) -> Spill {
        let Some(need) = pages_of(st) else {
            return Spill::Unsupported;
        };
        if !fits(&need, &self.free()) {
            return Spill::NoRoom;
        }
        let mut pages = 0u64;
        for (_, p) in st.pooled_pages_mut() {
            let Some(kind) = kind_of(p.store().as_ref()) else {
                continue;
            };
            let host = &self.host[kind.index()];
            let mut ids = Vec::with_capacity(p.ids().len());
            for i in 0..p.ids().len() {
                // Waits for a load-back of the page still in flight.
                let bytes = p.page_bytes(i).unwrap_or_default();
                let id = host.alloc().expect("room was checked");
                host.write(id, &mut |b| {
                    let n = b.len().min(bytes.len());
                    b[..n].copy_from_slice(&bytes[..n]);
                });
                ids.push(id);
            }
            p.wait_loaded();
            pages += ids.len() as u64;
            let store: Arc<dyn PageStore> = host.clone();
            p.rehome(store, ids, None);
        }
        self.stats.spilled_snapshots += 1;
        self.stats.spilled_pages += pages;
        Spill::Done
    }

    /// Device pages of each pool loading the host state `st` back takes.
    pub fn pages_to_load(&self, st: &mut SequenceState) -> Option<PoolPages> {
        pages_of(st)
    }

    /// Load the host state `st` back: device pages are allocated now and `st` names them,
    /// tagged with a new load-back the worker copies once a reader waits; None (and `st` is
    /// dropped) when the device pools lack room.
    pub fn load(&mut self, mut st: SequenceState, free: &PoolPages) -> Option<SequenceState> {
        let need = pages_of(&mut st)?;
        if !fits(&need, free) {
            return None;
        }
        let layers = st.layers.len();
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let counter = Arc::new(LayerDoneCounter::new(
            layers,
            Box::new(move || {
                if let Some(s) = weak.upgrade() {
                    s.ring();
                }
            }),
        ));
        let mut items: Vec<[Vec<Item>; STORE_SLOTS]> =
            (0..layers).map(|_| Default::default()).collect();
        let mut writes = Vec::new();
        let mut pages = 0u64;
        for (layer, p) in st.pooled_pages_mut() {
            let Some(kind) = kind_of(p.store().as_ref()) else {
                continue;
            };
            let device = &self.device[kind.index()];
            let ids: Vec<PageId> = (0..p.ids().len())
                .map(|_| device.alloc().expect("room was checked"))
                .collect();
            for &id in &ids {
                // The job's own reference, released once the page is copied.
                device.retain(id);
                writes.push((
                    kind.index(),
                    layer,
                    PageWrite {
                        store: kind.name().to_string(),
                        layer: Some(layer),
                        page: id,
                    },
                ));
            }
            pages += ids.len() as u64;
            let host = p.clone();
            let store: Arc<dyn PageStore> = device.clone();
            let tag = LoadTag::new(Arc::clone(&counter), kind.index(), layer);
            p.rehome(store, ids.clone(), Some(tag));
            items[layer][kind.index()].push(Item {
                host,
                device: Arc::clone(device),
                ids,
            });
        }
        self.shared.lock().jobs.push(Job {
            counter: Arc::clone(&counter),
            items,
            cursor: [0; STORE_SLOTS],
            flush: false,
        });
        self.issued.push(Issued { counter, writes });
        self.stats.hits += 1;
        self.stats.loaded_pages += pages;
        Some(st)
    }

    /// End of a forward round: finish every started load-back and return the device pages
    /// they wrote in the (pool, layer)s a reader waited for (the round's declared transfer
    /// writes). Load-backs nobody has read yet stay parked.
    pub fn settle(&mut self) -> BTreeSet<PageWrite> {
        let started = |c: &LayerDoneCounter| c.demanded().iter().any(|&d| d > 0);
        {
            let mut st = self.shared.lock();
            for j in st.jobs.iter_mut().filter(|j| started(&j.counter)) {
                j.flush = true;
            }
            self.shared.wake.notify_all();
        }
        let mut out = BTreeSet::new();
        for i in self.issued.iter().filter(|i| started(&i.counter)) {
            i.counter.wait_all();
            let waited = i.counter.waited();
            out.extend(
                i.writes
                    .iter()
                    .filter(|(slot, layer, _)| *layer < waited[*slot])
                    .map(|(_, _, w)| w.clone()),
            );
        }
        self.issued.retain(|i| !i.counter.is_complete());
        out
    }
}

impl Drop for HostTier {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.ring();
        if let Some(w) = self.worker.take()
            && w.join().is_err()
        {
            tracing::error!("the host-tier transfer worker panicked");
        }
    }
}

/// Make device room by evicting the least recently used device snapshot: spilled to the host
/// tier when there is one (dropping host snapshots for room), else dropped.
pub(crate) fn evict(prefix: &mut PrefixCache, tier: Option<&mut HostTier>) -> bool {
    let Some(tier) = tier else {
        return prefix.evict_lru();
    };
    let dropped = prefix.host_dropped();
    let r = prefix.evict_lru_with(&mut |st| tier.spill(st));
    tier.stats.dropped_snapshots += prefix.host_dropped() - dropped;
    r
}

/// Serve a prefix hit: a device hit as it is; a host hit loaded back (making device room by
/// evicting other snapshots), its node then holding the device state. None when a host hit
/// cannot be loaded back (the request starts fresh).
pub(crate) fn serve_hit(
    prefix: &mut PrefixCache,
    mut tier: Option<&mut HostTier>,
    pools: &CachePools,
    hit: Hit,
) -> Option<(usize, SequenceState)> {
    if !hit.on_host {
        return Some((hit.len, hit.state));
    }
    let mut state = hit.state;
    let need = tier.as_mut()?.pages_to_load(&mut state)?;
    while !fits(&need, &pools.free()) {
        if !evict(prefix, tier.as_deref_mut()) {
            break;
        }
    }
    let tier = tier?;
    match tier.load(state, &pools.free()) {
        Some(st) => {
            prefix.promote(hit.node, &st);
            Some((hit.len, st))
        }
        None => {
            tier.stats.load_failures += 1;
            None
        }
    }
}
