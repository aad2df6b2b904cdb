//! [`PageTag`]: what a page store says about a cache page's bytes, so that a device backend may
//! keep a copy of the page across calls and upload only the entries that changed.
//!
//! A tag has a lineage and a settled count. Every allocation, copy and whole-page write gives
//! the page a fresh lineage from one process-wide counter. A write of one entry keeps the
//! lineage when the entry lies past every entry written under it (an append: a ring's next
//! row, a compressed store's next entry) and moves `settled` past it; any other entry write
//! starts a fresh lineage. So under one lineage:
//! - entries below `settled` never change again;
//! - entries at or past `settled` have not been written since the lineage began.
//!
//! A copy of entry e taken under lineage L at settled s0 is therefore still the page's entry
//! while the page is at L with settled s1, unless s0 ≤ e < s1 (written since).

use std::sync::atomic::{AtomicU64, Ordering};

/// The content tag of a cache page (see the module docs); [`PageTag::UNTAGGED`] promises
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PageTag {
    /// Identity of the page's contents since its last allocation, copy or whole-page write;
    /// 0 for bytes that carry no tag.
    pub lineage: u64,
    /// Entries below this one never change while the lineage lasts.
    pub settled: u32,
}

impl PageTag {
    /// The tag of bytes that carry none: a backend uploads them on every call.
    pub const UNTAGGED: PageTag = PageTag {
        lineage: 0,
        settled: 0,
    };

    /// A lineage no page has had before in this process, with `settled` entries that will not
    /// change under it.
    pub fn fresh(settled: u32) -> PageTag {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PageTag {
            lineage: NEXT.fetch_add(1, Ordering::Relaxed),
            settled,
        }
    }

    /// A fresh lineage whose every entry is settled: the tag of bytes changed in unknown places
    /// (a whole-page write), or of pages whose bytes never change.
    pub fn fresh_whole() -> PageTag {
        PageTag::fresh(u32::MAX)
    }

    /// Whether the tag promises anything.
    pub fn is_tagged(&self) -> bool {
        self.lineage != 0
    }

    /// The tag after entry `slot` of the page is written: the same lineage with the entry
    /// settled when it lies at or past `settled` (an append), else a fresh lineage.
    pub fn after_entry_write(self, slot: usize) -> PageTag {
        let next = u32::try_from(slot).ok().and_then(|s| s.checked_add(1));
        match next {
            Some(next) if self.is_tagged() && slot >= self.settled as usize => PageTag {
                lineage: self.lineage,
                settled: next,
            },
            Some(next) => PageTag::fresh(next),
            None => PageTag::fresh_whole(),
        }
    }
}

/// Where one entry of a packed page (entries copied out of several pages into a fresh,
/// untagged one) came from: the source page's tag when it was copied, and the entry's slot
/// there. A backend that keeps pages may read the entry from its own copy of the source page
/// instead of uploading the packed one; the entry's bytes are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EntryOrigin {
    /// The source page's tag at the copy ([`PageTag::UNTAGGED`]: no origin).
    pub tag: PageTag,
    /// The entry's slot in the source page.
    pub slot: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_keep_the_lineage_and_rewrites_start_a_new_one() {
        let t = PageTag::fresh(0);
        assert!(t.is_tagged());
        assert!(!PageTag::UNTAGGED.is_tagged());
        // Appends, skipping entry 3: the lineage stays, entries up to the last write settle.
        let t1 = t
            .after_entry_write(0)
            .after_entry_write(1)
            .after_entry_write(4);
        assert_eq!(
            t1,
            PageTag {
                lineage: t.lineage,
                settled: 5
            }
        );
        // A write below `settled` (a ring wrapping onto the page) starts a new lineage.
        let t2 = t1.after_entry_write(2);
        assert_ne!(t2.lineage, t1.lineage);
        assert_eq!(t2.settled, 3);
        // An untagged page's write gets a lineage; a whole-page change settles everything, so
        // any later entry write starts a new lineage.
        assert!(PageTag::UNTAGGED.after_entry_write(7).is_tagged());
        let whole = PageTag::fresh_whole();
        assert_ne!(whole.after_entry_write(9).lineage, whole.lineage);
        assert_ne!(PageTag::fresh(0).lineage, PageTag::fresh(0).lineage);
    }
}
