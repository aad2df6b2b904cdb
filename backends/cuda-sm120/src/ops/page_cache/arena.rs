//! One entry layout's page slots on the device ([`Arena`]) and their bookkeeping: which page
//! lineage each slot holds, which of its entries were brought up, the settled count they were
//! brought up at, and the least recently used order slots are reused in.

use crate::{Core, CudaError, DevBuf, DevPtr};
use dsv4_core::cache::page_checksum;
use dsv4_kernels::RowFormat;
use std::collections::{BTreeSet, HashMap};

/// Page slots of one entry layout on the device.
pub(super) struct Arena {
    /// Bytes of one entry, entries of one page.
    pub(super) entry: usize,
    pub(super) per: usize,
    /// Slots it may grow to: the budget's, or its size once an allocation to grow failed.
    pub(super) ceiling: usize,
    pub(super) buf: DevBuf,
    /// Each slot's page lineage (0: none), which of its entries hold that page's (a bitmap of
    /// `words` u64s per slot, entry e at bit e % 64 of word e / 64), the page's settled count
    /// when the slot was last brought up to date, and the call that last used it (0: never,
    /// or freed).
    pub(super) tag: Vec<u64>,
    valid: Vec<u64>,
    words: usize,
    pub(super) settled: Vec<u32>,
    pub(super) used: Vec<u64>,
    /// Every slot by (last use, slot): the front is reused first.
    pub(super) by_age: BTreeSet<(u64, usize)>,
    /// The slot holding each lineage.
    pub(super) slot_of: HashMap<u64, usize>,
    /// Calls so far.
    pub(super) clock: u64,
}

impl Arena {
    /// An arena of `slots` free page slots of `per` entries of `entry` bytes, which may grow
    /// to `ceiling` slots.
    pub(super) fn new(
        c: &Core,
        entry: usize,
        per: usize,
        slots: usize,
        ceiling: usize,
    ) -> Result<Arena, CudaError> {
        let bytes = slots
            .checked_mul(entry * per)
            .ok_or_else(|| CudaError::TooLarge {
                what: format!("a page arena of {slots} slots"),
            })?;
        // The device buffer first: the bookkeeping below is small beside it.
        let buf = c.dev.alloc(bytes)?;
        Ok(Arena {
            entry,
            per,
            ceiling,
            buf,
            tag: vec![0; slots],
            valid: vec![0; slots * per.div_ceil(64)],
            words: per.div_ceil(64),
            settled: vec![0; slots],
            used: vec![0; slots],
            by_age: (0..slots).map(|s| (0, s)).collect(),
            slot_of: HashMap::new(),
            clock: 0,
        })
    }

    /// Take `old`'s slots (this arena being at least as large, same layout): their bytes
    /// copied on the device (after the work issued so far on this stream), then their
    /// bookkeeping; slot s stays slot s. Err leaves this arena's bookkeeping empty.
    pub(super) fn take_over(&mut self, c: &Core, old: &Arena) -> Result<(), CudaError> {
        let bytes = old.tag.len() * old.entry * old.per;
        if !bytes.is_multiple_of(4) {
            return Err(CudaError::BadOperands(format!(
                "a page arena of {bytes} bytes is not a whole number of words"
            )));
        }
        super::super::resident::launch_copy_words(c, old.buf.at(), self.buf.at(), bytes / 4)?;
        let n = old.tag.len();
        self.tag[..n].copy_from_slice(&old.tag);
        self.valid[..n * self.words].copy_from_slice(&old.valid);
        self.settled[..n].copy_from_slice(&old.settled);
        self.used[..n].copy_from_slice(&old.used);
        self.by_age = old.by_age.clone();
        self.by_age.extend((n..self.tag.len()).map(|s| (0, s)));
        self.slot_of = old.slot_of.clone();
        self.clock = old.clock;
        Ok(())
    }

    /// Whether entry `e` of slot `s` holds its page's entry.
    pub(super) fn is_valid(&self, s: usize, e: usize) -> bool {
        self.valid[s * self.words + e / 64] >> (e % 64) & 1 == 1
    }

    /// Entry `e` of slot `s` now holds its page's entry.
    pub(super) fn set_valid(&mut self, s: usize, e: usize) {
        self.valid[s * self.words + e / 64] |= 1 << (e % 64);
    }

    /// Entries `from .. to` of slot `s` no longer hold their page's.
    pub(super) fn invalidate(&mut self, s: usize, from: usize, to: usize) {
        for e in from..to.min(self.per) {
            self.valid[s * self.words + e / 64] &= !(1 << (e % 64));
        }
    }

    /// Check that slot `s` holds the entries `host` lists ((entry, its bytes in the kernels'
    /// layout), in ascending entry order): Err names the first that differs.
    pub(super) fn check(&self, c: &Core, s: usize, host: &[(usize, &[u8])]) -> Result<(), String> {
        let (Some(&(lo, _)), Some(&(hi, _))) = (host.first(), host.last()) else {
            return Ok(());
        };
        let at = (s * self.per + lo) * self.entry;
        let src = DevPtr {
            ptr: self.buf.at().ptr + at as u64,
            bytes: (hi + 1 - lo) * self.entry,
        };
        let device = super::super::checksum::page_checksums_at(c, src, self.entry)
            .map_err(|e| format!("page cache check: {e}"))?;
        match host
            .iter()
            .find(|(e, bytes)| device[e - lo] != page_checksum(bytes))
        {
            None => Ok(()),
            Some((e, _)) => Err(format!(
                "page cache check: arena slot {s} entry {e} differs from the host page"
            )),
        }
    }

    /// Slots no page holds (never used, or freed).
    pub(super) fn free_slots(&self) -> usize {
        self.by_age.range(..(1, 0)).count()
    }

    /// Mark slot `s` used by call `now`.
    pub(super) fn touch(&mut self, s: usize, now: u64) {
        self.by_age.remove(&(self.used[s], s));
        self.used[s] = now;
        self.by_age.insert((now, s));
    }

    /// Free slot `s`: no tag, reused first.
    pub(super) fn forget(&mut self, s: usize) {
        if self.tag[s] != 0 {
            self.slot_of.remove(&self.tag[s]);
        }
        self.tag[s] = 0;
        self.invalidate(s, 0, self.per);
        self.settled[s] = 0;
        self.touch(s, 0);
    }
}

/// The entries (data bytes, then scale bytes) of `page`'s slots `slots`, end to end; None when
/// the page does not have the format's layout.
pub(super) fn slot_entries(
    fmt: &RowFormat,
    page: &[u8],
    slots: std::ops::Range<usize>,
) -> Option<Vec<u8>> {
    let picks: Vec<(usize, usize)> = slots.map(|s| (0, s)).collect();
    super::super::cache::gathered_entries(fmt, &[page], &picks, picks.len() * fmt.width()).ok()
}
