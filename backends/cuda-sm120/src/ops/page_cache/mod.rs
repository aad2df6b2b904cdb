//! Cache pages kept on the device across calls: the paged attention and indexer ops take each
//! page's content tag ([`PageTag`], `Backend::paged_attention_indexed`), and the entries of a
//! page whose lineage the cache holds are not uploaded again, except those written since (an
//! append settles one more entry under the same lineage). A decode step then uploads the
//! entries appended since the last step, not every page a row reads; a prefill chunk the
//! entries the chunks before it did not already bring.
//!
//! One arena per entry layout (entry bytes, entries a page), growing by doubling from 16 MiB
//! (or what a call needs) up to the budget when a call's pages do not fit in its free slots,
//! its slots copied into the new one on the device: `slots` page slots of
//! `per · entry` bytes, each holding a page's entries end to end in the kernels' entry layout,
//! so row `slot · per + s` of the arena is slot s of the page in `slot`, and the kernels read
//! a call's keys through those row ids. A slot holds the entries calls have read under its
//! lineage (a bitmap): a call uploads the entries it reads that the slot lacks; when the page's
//! settled count moved, the held entries between the two counts are dropped (entries below
//! both never changed between the calls, and those at or past both were not written). An
//! entry of a packed page (a top-k selection copied out of many pages) whose origin is tagged
//! is read as its source page's entry, so the next step's selection finds most of its entries
//! held.
//! Slots are reused least recently used first, never within the call that placed them. The
//! arena's lock is held until the call has read its result back (a blocking download on the
//! calling thread's stream, after its launches), so no other call overwrites a slot while a
//! launch may still read it. A call that reads nothing back (attention into device memory,
//! `DeviceOps::paged_attention`) instead records an event on its stream after its launches
//! ([`Placed::release_after_reads`]), and every later call first makes its own stream wait for
//! the events of the other streams that read this way, so its uploads and copies into the
//! arenas run after those launches (work on one stream runs in order anyway). Arenas leave a
//! reserve of device memory free (see [`default_reserve`]).

mod arena;
mod sources;

use super::mhc::u32_arg;
use crate::device::StreamHandle;
use crate::{Core, CudaError, DevBuf, DevPtr, Device};
use arena::Arena;
use dsv4_kernels::{EntryOrigin, PageTag, RowFormat};
use sources::Sources;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Environment variable: MiB of device memory each entry layout's arena may take (0 turns the
/// cache off), as `backend.cuda_page_cache_mib` does in a profile.
pub const PAGE_CACHE_ENV: &str = "DSV4_CUDA_PAGE_CACHE_MIB";
/// The MiB [`PAGE_CACHE_ENV`] asks for (None when unset or empty); a value that is not a whole
/// number of MiB is an error naming the variable.
pub fn mib_from_env() -> Result<Option<u64>, CudaError> {
    crate::registry::env_knob(PAGE_CACHE_ENV, |v| {
        v.parse::<u64>().map_err(|_| {
            "expected MiB of device memory per page arena, e.g. 1024 (0 keeps no page)".to_string()
        })
    })
}

/// Bytes of `mib` MiB (saturating).
pub fn mib_bytes(mib: u64) -> usize {
    usize::try_from(mib)
        .unwrap_or(usize::MAX)
        .saturating_mul(1 << 20)
}

/// The arena ceiling without [`PAGE_CACHE_ENV`] on a GPU: this fraction of its memory per
/// entry layout (a choice, not a measurement: two layouts, KV and index-K, then take at most a
/// quarter, and only as calls need it)...
const GPU_DEFAULT_SHARE: u64 = 8;
/// ... or this many MiB where the driver does not say how much memory the GPU has.
const GPU_DEFAULT_MIB: usize = 1024;
/// The same on the emulator, where device memory is this machine's.
const EMU_DEFAULT_MIB: usize = 64;

/// The default arena ceiling, bytes: see [`GPU_DEFAULT_SHARE`].
pub fn default_budget(emulated: bool, memory_bytes: u64) -> usize {
    if emulated {
        EMU_DEFAULT_MIB << 20
    } else if memory_bytes == 0 {
        GPU_DEFAULT_MIB << 20
    } else {
        usize::try_from(memory_bytes / GPU_DEFAULT_SHARE).unwrap_or(usize::MAX)
    }
}

/// The device memory arenas leave free when they are made or grow, on a GPU: this fraction of
/// its memory (a choice, not a measurement: room for a step's temporaries and a larger batch's,
/// which would otherwise fail for memory the cache took first).
const GPU_RESERVE_SHARE: u64 = 16;

/// The default memory reserve, bytes: see [`GPU_RESERVE_SHARE`] (none on the emulator, whose
/// device memory is this machine's, or where the GPU's memory is unknown).
pub fn default_reserve(emulated: bool, memory_bytes: u64) -> usize {
    if emulated {
        0
    } else {
        usize::try_from(memory_bytes / GPU_RESERVE_SHARE).unwrap_or(usize::MAX)
    }
}

/// What an arena takes at first, at most (it doubles from there, up to the budget, when a
/// call's pages do not fit in its free slots).
const FIRST_BYTES: usize = 16 << 20;

/// The device's page arenas and their budget.
pub(crate) struct PageCache {
    budget: usize,
    first: usize,
    /// Check every call's copies against its pages ([`PageCache::set_check`]).
    check: AtomicBool,
    /// Device memory an arena must leave free when it is made or grows
    /// ([`PageCache::set_reserve`]), and how often one was not made or did not grow for it.
    reserve: AtomicUsize,
    short: AtomicU64,
    arenas: Mutex<Vec<Arena>>,
    /// Streams whose launches may still read the arenas with nobody waiting for them: each
    /// with the event recorded after its last such launches. Locked inside `arenas`.
    readers: Mutex<Readers>,
}

/// The streams reading the arenas without a wait ([`Placed::release_after_reads`]).
#[derive(Default)]
struct Readers {
    /// The device the events belong to (set with the first).
    dev: Option<Device>,
    /// (stream, its event).
    events: Vec<(StreamHandle, u64)>,
}

impl Drop for Readers {
    fn drop(&mut self) {
        if let Some(dev) = &self.dev {
            for &(_, e) in &self.events {
                // SAFETY: the event came from this device's event_create and goes with the
                // cache; a wait already issued on it is unaffected.
                unsafe { dev.event_destroy(e) };
            }
        }
    }
}

/// A call's keys placed in an arena: the arena stays locked until this is dropped, which the
/// caller does after reading its result back, or until [`Placed::release_after_reads`].
pub(crate) struct Placed<'a> {
    arenas: MutexGuard<'a, Vec<Arena>>,
    readers: &'a Mutex<Readers>,
    index: usize,
    /// Each requested row's row id in the arena's buffer.
    pub rows: Vec<usize>,
}

impl Placed<'_> {
    /// The arena's buffer: entries end to end, the kernels' keys.
    pub fn keys(&self) -> &DevBuf {
        &self.arenas[self.index].buf
    }

    /// Unlock the arena without reading anything back: the calling stream records its event
    /// after the launches issued so far (those reading the keys), and later calls on other
    /// streams wait for it before they write into the arenas.
    pub fn release_after_reads(self, c: &Core) -> Result<(), CudaError> {
        let mut r = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let stream = c.dev.stream();
        let event = match r.events.iter().find(|(s, _)| *s == stream) {
            Some(&(_, e)) => e,
            None => {
                let e = c.dev.event_create()?;
                r.dev.get_or_insert_with(|| c.dev.clone());
                r.events.push((stream, e));
                e
            }
        };
        c.dev.event_record(event)
    }
}

impl PageCache {
    /// A cache with arenas of the default ceiling for a GPU of `memory_bytes` (0: unknown)
    /// or, with `emulated`, the emulator.
    pub fn with_default_budget(emulated: bool, memory_bytes: u64) -> Self {
        let cache = Self::with_budget(default_budget(emulated, memory_bytes));
        cache.set_reserve(default_reserve(emulated, memory_bytes));
        cache
    }

    /// A cache with arenas of at most `budget` bytes each (0: never keeps a page), each
    /// starting at 16 MiB at most.
    pub fn with_budget(budget: usize) -> Self {
        Self::growing(FIRST_BYTES, budget)
    }

    /// A cache whose arenas start at `first` bytes (or what a call's pages need) and double,
    /// when a call's pages do not fit in their free slots, up to `budget` bytes each.
    pub fn growing(first: usize, budget: usize) -> Self {
        Self {
            budget,
            first,
            check: AtomicBool::new(false),
            reserve: AtomicUsize::new(0),
            short: AtomicU64::new(0),
            arenas: Mutex::new(Vec::new()),
            readers: Mutex::default(),
        }
    }

    /// With `on`, every call checks the entries it reads from the arena against its pages (a
    /// checksum per entry on the device, read back and compared with the host's) and fails
    /// with [`CudaError::StaleCopy`] on a difference: a store that changed a page without a
    /// new tag, or a slot the cache failed to refresh. One launch and read-back per page.
    pub fn set_check(&self, on: bool) {
        self.check.store(on, Ordering::Relaxed);
    }

    /// Leave at least `bytes` of device memory free: an arena is not made, or does not grow,
    /// where the device says less would be left (the call takes the upload path, or reuses the
    /// arena's slots; a later call tries again). Devices that do not say are not limited.
    pub fn set_reserve(&self, bytes: usize) {
        self.reserve.store(bytes, Ordering::Relaxed);
    }

    /// The memory reserve ([`PageCache::set_reserve`]).
    pub fn reserve(&self) -> usize {
        self.reserve.load(Ordering::Relaxed)
    }

    /// Times an arena was not made, or grew less than it would have (or not at all), for the
    /// memory reserve.
    pub fn short_of_memory(&self) -> u64 {
        self.short.load(Ordering::Relaxed)
    }

    /// The largest of `sizes` (slot counts, largest first) whose arena of `slot_bytes` slots
    /// leaves the reserve free (all fit on a device that does not say how much memory it has
    /// free); one question to the device, and a refusal counted unless the first fits.
    fn fitting(&self, c: &Core, slot_bytes: usize, sizes: &[usize]) -> Option<usize> {
        let room = c
            .dev
            .free_memory()
            .map(|free| (free as u128).saturating_sub(self.reserve() as u128));
        let fits = |n: usize| room.is_none_or(|r| n as u128 * slot_bytes as u128 <= r);
        let found = sizes.iter().copied().find(|&n| fits(n));
        if found != sizes.first().copied() {
            self.short.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Bytes each entry layout's arena may take.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of device memory the arenas hold now.
    pub fn held(&self) -> usize {
        let arenas = self.arenas.lock().unwrap_or_else(|e| e.into_inner());
        arenas.iter().map(|a| a.tag.len() * a.entry * a.per).sum()
    }

    /// Place the pages holding `rows` ((page, slot) of `pages`, in `fmt`) in the arena,
    /// uploading the entries it does not hold; `None` when the cache cannot serve the call (no
    /// tags or only untagged pages, more pages than slots, a page of the wrong size, no memory
    /// for an arena), and the caller uploads the rows itself. `tags` has one entry per page;
    /// untagged pages are uploaded each call, except entries `origins` (empty, or one slice per
    /// page) gives a tagged source for, which are read as that source page's ([`Sources`]).
    /// The rows must have passed the format's layout check.
    pub fn place<'a>(
        &'a self,
        c: &Core,
        fmt: &RowFormat,
        pages: &[&[u8]],
        tags: &[PageTag],
        origins: &[&[EntryOrigin]],
        rows: &[(usize, usize)],
    ) -> Result<Option<Placed<'a>>, CudaError> {
        let (entry, per) = (fmt.entry_bytes(), fmt.page_entries());
        let slot_bytes = entry * per;
        if tags.len() != pages.len() || slot_bytes == 0 {
            return Ok(None);
        }
        let (src, rows) = Sources::new(fmt, pages, tags, origins, rows);
        if !rows.iter().any(|&(p, _)| src.tag(p).is_tagged()) {
            return Ok(None);
        }
        // The sources the rows are on, in first-use order, and each row's source in that order
        // (looked up once here, not per row in each pass below).
        let mut local: HashMap<usize, usize> = HashMap::new();
        let mut order = Vec::new();
        let at: Vec<usize> = rows
            .iter()
            .map(|&(p, _)| {
                *local.entry(p).or_insert_with(|| {
                    order.push(p);
                    order.len() - 1
                })
            })
            .collect();
        let most = self.budget / slot_bytes;
        if order.len() > most || order.iter().any(|&p| !src.page_sized(p)) {
            return Ok(None);
        }
        // Copies of one page (one lineage) gathered at different times in this call (a chunk
        // that stores each row before reading its window) share one slot, brought up to the
        // copy with the most entries settled: it holds every entry another copy is read at,
        // as long as that entry was settled in that copy (never to change) or is unwritten in
        // all of them. A copy read at an entry it had not settled but the latest copy has (a
        // ring's old entry, overwritten later in the chunk) is detached instead: it takes a
        // slot of its own, uploaded as an untagged page is.
        let mut best: HashMap<u64, usize> = HashMap::new();
        for (i, &p) in order.iter().enumerate() {
            let t = src.tag(p);
            if t.is_tagged() {
                let b = best.entry(t.lineage).or_insert(i);
                if src.tag(order[*b]).settled < t.settled {
                    *b = i;
                }
            }
        }
        let mut detached = vec![false; order.len()];
        for (&(p, e), &i) in rows.iter().zip(&at) {
            let t = src.tag(p);
            if t.is_tagged() && e >= t.settled as usize {
                let latest = src.tag(order[best[&t.lineage]]).settled as usize;
                detached[i] |= e < latest;
            }
        }
        // Each source's tag in this call (a detached copy's promises nothing) and its primary
        // copy (itself when untagged or detached), whose slot the others share.
        let tag_of: Vec<PageTag> = (0..order.len())
            .map(|i| {
                if detached[i] {
                    PageTag::UNTAGGED
                } else {
                    src.tag(order[i])
                }
            })
            .collect();
        let primary: Vec<usize> = (0..order.len())
            .map(|i| {
                let t = tag_of[i];
                if t.is_tagged() { best[&t.lineage] } else { i }
            })
            .collect();
        let mut arenas = self.arenas.lock().unwrap_or_else(|e| e.into_inner());
        self.after_other_readers(c)?;
        let index = match arenas.iter().position(|a| a.entry == entry && a.per == per) {
            Some(i) => i,
            None => {
                let slots = (self.first / slot_bytes).clamp(order.len(), most);
                // No device memory for it, or not without taking the reserve: the call takes
                // the upload path (which fails in turn if the device is out of memory), and a
                // later call tries again.
                if self.fitting(c, slot_bytes, &[slots]).is_none() {
                    return Ok(None);
                }
                let Ok(arena) = Arena::new(c, entry, per, slots, most) else {
                    return Ok(None);
                };
                arenas.push(arena);
                arenas.len() - 1
            }
        };
        let a = &mut arenas[index];
        let primaries: Vec<usize> = (0..order.len()).filter(|&i| primary[i] == i).collect();
        // Pages this call must bring (a lineage the arena does not hold, or none): when they
        // do not fit in the free slots and the arena may grow, it doubles (or grows to what the
        // call needs), its slots copied over on the device.
        let bring = primaries
            .iter()
            .filter(|&&i| {
                let t = tag_of[i];
                !t.is_tagged() || !a.slot_of.contains_key(&t.lineage)
            })
            .count();
        let (slots, free) = (a.tag.len(), a.free_slots());
        // The old arena is dropped only once the new one is allocated, so growing takes the
        // new size in free memory. Where that would eat into the reserve the arena grows only
        // as far as this call needs, or not at all this time (a later call tries again);
        // without the device memory for it, it keeps its size for good.
        if bring > free && slots < a.ceiling {
            let needed = (slots - free + bring).min(a.ceiling);
            let doubled = (2 * slots).max(needed).min(a.ceiling);
            let grown = self.fitting(c, slot_bytes, &[doubled, needed]);
            if let Some(grown) = grown {
                match Arena::new(c, entry, per, grown, a.ceiling) {
                    Ok(mut bigger) => {
                        // A failed copy leaves the bigger arena's bookkeeping empty: its pages
                        // go up again, as into a new arena.
                        let _ = bigger.take_over(c, a);
                        *a = bigger;
                    }
                    Err(_) => a.ceiling = slots,
                }
            }
        }
        // A slot for each page this call reads (its copies share one): an arena that could not
        // grow to that many leaves the call on the upload path, as no slot this call reads may
        // be reused within it.
        if primaries.len() > a.tag.len() {
            return Ok(None);
        }
        a.clock += 1;
        let now = a.clock;
        // The held slots: the entries written between the settled count a slot was brought
        // up to date at and the page's are no longer its (entries below both never changed,
        // and those at or past both were not written since either).
        let mut slot_of_page = vec![0usize; order.len()];
        let mut missing = Vec::new();
        for &i in &primaries {
            let tag = tag_of[i];
            match a.slot_of.get(&tag.lineage) {
                Some(&s) if tag.is_tagged() => {
                    a.touch(s, now);
                    let (held, settled) = (a.settled[s] as usize, tag.settled as usize);
                    a.invalidate(s, held.min(settled), held.max(settled));
                    slot_of_page[i] = s;
                }
                _ => missing.push(i),
            }
        }
        // Free slots first, then the least recently used: the front of `by_age`, where no slot
        // this call uses is (they are at `now`, the back), as there are enough slots for all.
        for &i in &missing {
            let Some(&(_, s)) = a.by_age.first() else {
                return Ok(None);
            };
            a.forget(s);
            let tag = tag_of[i];
            a.tag[s] = tag.lineage;
            a.touch(s, now);
            if tag.is_tagged() {
                a.slot_of.insert(tag.lineage, s);
            }
            slot_of_page[i] = s;
        }
        for i in 0..order.len() {
            slot_of_page[i] = slot_of_page[primary[i]];
        }
        // The entries each slot must hold for this call, with a copy that reads each (any
        // copy's bytes of an entry it reads are the primary's, as above); those the slot lacks
        // go up, fetched from that copy, at their place in the arena, in order, and runs that
        // meet in the arena go up as one upload.
        let mut need: Vec<std::collections::BTreeMap<usize, usize>> =
            vec![Default::default(); order.len()];
        for (&(_, e), &i) in rows.iter().zip(&at) {
            need[primary[i]].entry(e).or_insert(i);
        }
        let mut plan: Vec<(usize, usize, usize, usize)> = Vec::new();
        for &i in &primaries {
            let s = slot_of_page[i];
            for (&e, &reader) in &need[i] {
                if a.is_valid(s, e) {
                    continue;
                }
                match plan.last_mut() {
                    Some((ps, _, to, r)) if *ps == s && *to == e && *r == reader => *to = e + 1,
                    _ => plan.push((s, e, e + 1, reader)),
                }
            }
        }
        plan.sort_unstable();
        let mut staged: Vec<(usize, Vec<u8>)> = Vec::new();
        for &(s, from, to, reader) in &plan {
            let Some(bytes) = src.entries(order[reader], from, to) else {
                // A page without the format's layout: nothing is uploaded, and the slots placed
                // for missing pages are forgotten (their bytes are stale).
                for &i in &missing {
                    a.forget(slot_of_page[i]);
                }
                return Ok(None);
            };
            let at = s * slot_bytes + from * entry;
            match staged.last_mut() {
                Some((start, run)) if *start + run.len() == at => run.extend_from_slice(&bytes),
                _ => staged.push((at, bytes)),
            }
        }
        for (at, run) in &staged {
            let dst = DevPtr {
                ptr: a.buf.at().ptr + *at as u64,
                bytes: run.len(),
            };
            c.dev.upload_to(dst, run)?;
        }
        for &(s, from, to, _) in &plan {
            (from..to).for_each(|e| a.set_valid(s, e));
        }
        for &i in &primaries {
            a.settled[slot_of_page[i]] = tag_of[i].settled;
        }
        if self.check.load(Ordering::Relaxed) {
            self.check_copies(c, a, &src, &order, &slot_of_page, &rows, &at)?;
        }
        let rows = rows
            .iter()
            .zip(&at)
            .map(|(&(_, s), &i)| slot_of_page[i] * per + s)
            .collect::<Vec<usize>>();
        // The kernels take u32 row ids.
        if let Some(&last) = rows.iter().max() {
            u32_arg("page cache rows", last)?;
        }
        Ok(Some(Placed {
            arenas,
            readers: &self.readers,
            index,
            rows,
        }))
    }

    /// Make the calling stream wait for the launches other streams issued reading the arenas
    /// without a wait ([`Placed::release_after_reads`]); called with the arenas locked, before
    /// anything is written into them.
    fn after_other_readers(&self, c: &Core) -> Result<(), CudaError> {
        let r = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let stream = c.dev.stream();
        for &(s, e) in &r.events {
            if s != stream {
                c.dev.wait_event(e)?;
            }
        }
        Ok(())
    }

    /// [`PageCache::set_check`]'s check: every entry each source is read at equals its slot's.
    #[allow(clippy::too_many_arguments)]
    fn check_copies(
        &self,
        c: &Core,
        a: &mut Arena,
        src: &Sources<'_>,
        order: &[usize],
        slot_of_page: &[usize],
        rows: &[(usize, usize)],
        at: &[usize],
    ) -> Result<(), CudaError> {
        let mut read: Vec<std::collections::BTreeSet<usize>> =
            vec![Default::default(); order.len()];
        for (&(_, e), &i) in rows.iter().zip(at) {
            read[i].insert(e);
        }
        for (i, entries) in read.iter().enumerate() {
            let (s, p) = (slot_of_page[i], order[i]);
            let bytes: Option<Vec<(usize, Vec<u8>)>> = entries
                .iter()
                .map(|&e| src.entries(p, e, e + 1).map(|b| (e, b)))
                .collect();
            let Some(bytes) = bytes else {
                continue; // a page without the layout: the upload path reports it
            };
            let host: Vec<(usize, &[u8])> = bytes.iter().map(|(e, b)| (*e, &b[..])).collect();
            if let Err(e) = a.check(c, s, &host) {
                a.forget(s);
                let t = src.tag(p);
                return Err(CudaError::StaleCopy(format!(
                    "{e}, page lineage {} settled {} (a store changed the page without a new \
                     tag, or the cache did not refresh the slot)",
                    t.lineage, t.settled
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ceiling_scales_with_the_gpu() {
        assert_eq!(default_budget(true, 0), 64 << 20, "the emulator");
        assert_eq!(default_budget(false, 0), 1024 << 20, "memory unknown");
        let h200 = 150_109_880_320u64;
        assert_eq!(default_budget(false, h200) as u64, h200 / 8);
    }
}
