//! Where a call's entries come from ([`Sources`]): the pages as given and, for entries of packed
//! pages whose origin is tagged ([`EntryOrigin`]), their source pages. A packed entry is read
//! as its source page's entry, so an arena that holds the source page's lineage serves it
//! without an upload, and one that does not brings it up into that lineage's slot, where the
//! next call's selection (mostly the same entries) finds it.

use super::super::cache::gathered_entries;
use super::arena::slot_entries;
use dsv4_kernels::{EntryOrigin, PageTag, RowFormat};
use std::collections::HashMap;

/// A call's sources: the given pages (index < `pages.len()`), then one per source page
/// (lineage and settled count) of packed entries.
pub(super) struct Sources<'p> {
    fmt: &'p RowFormat,
    pages: &'p [&'p [u8]],
    /// Each source's tag.
    tags: Vec<PageTag>,
    /// Each source page's entries the call reads: slot in the source page → (packed page, slot).
    entries: Vec<HashMap<usize, (usize, usize)>>,
}

impl<'p> Sources<'p> {
    /// The sources of `rows` ((page, slot) of `pages`), and the rows as (source, slot): a row of
    /// an untagged page whose entry has a tagged origin reads that origin instead.
    pub(super) fn new(
        fmt: &'p RowFormat,
        pages: &'p [&'p [u8]],
        tags: &[PageTag],
        origins: &[&[EntryOrigin]],
        rows: &[(usize, usize)],
    ) -> (Self, Vec<(usize, usize)>) {
        let mut src = Sources {
            fmt,
            pages,
            tags: tags.to_vec(),
            entries: Vec::new(),
        };
        let per = fmt.page_entries();
        let mut by_tag: HashMap<PageTag, usize> = HashMap::new();
        let rows = rows
            .iter()
            .map(|&(p, e)| {
                let origin = origins
                    .get(p)
                    .and_then(|o| o.get(e))
                    .filter(|o| !tags[p].is_tagged() && o.tag.is_tagged())
                    .filter(|o| (o.slot as usize) < per);
                let Some(o) = origin else {
                    return (p, e);
                };
                let v = *by_tag.entry(o.tag).or_insert_with(|| {
                    src.tags.push(o.tag);
                    src.entries.push(HashMap::new());
                    src.tags.len() - 1
                });
                let slot = o.slot as usize;
                src.entries[v - pages.len()].entry(slot).or_insert((p, e));
                (v, slot)
            })
            .collect();
        (src, rows)
    }

    /// Source `i`'s tag.
    pub(super) fn tag(&self, i: usize) -> PageTag {
        self.tags[i]
    }

    /// Whether source `i` has the format's page size (a source page's entries come from
    /// packed pages, which the rows' layout check covered).
    pub(super) fn page_sized(&self, i: usize) -> bool {
        i >= self.pages.len() || self.pages[i].len() == self.fmt.page_bytes()
    }

    /// Entries `from .. to` of source `i` in the kernels' entry layout, end to end; None when a
    /// page lacks the format's layout or a source page's entry was not packed.
    pub(super) fn entries(&self, i: usize, from: usize, to: usize) -> Option<Vec<u8>> {
        if i < self.pages.len() {
            return slot_entries(self.fmt, self.pages[i], from..to);
        }
        let packed = &self.entries[i - self.pages.len()];
        let picks: Vec<(usize, usize)> = (from..to)
            .map(|e| packed.get(&e).copied())
            .collect::<Option<_>>()?;
        let values = picks.len() * self.fmt.width();
        gathered_entries(self.fmt, self.pages, &picks, values).ok()
    }
}
