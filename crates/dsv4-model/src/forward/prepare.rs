//! Host-side preparation of a step (what a scheduler does before launching): every page the
//! step's store launches will write is allocated, or copied first when it is shared, and each
//! row's write locations are laid out per block as the plan's `loc` buffers. The same
//! locations, as pages, are the step's declared write set (checked by the canary).

use super::ForwardError;
use super::build::loc_width;
use super::exec::PageWrite;
use super::state::{LayerState, NO_LOCATION, PagedRows};
use std::collections::BTreeSet;

/// The write locations of one step.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// Per block: `[rows × loc_width(ratio)]` location words.
    pub locs: Vec<Vec<u32>>,
    /// The pages those locations (and the rings) name.
    pub writes: BTreeSet<PageWrite>,
}

/// One sequence's part of a step: its layer states, first position and row count.
pub(crate) struct SeqRows<'s> {
    /// The sequence's layer states (one per block of the plan).
    pub layers: Vec<&'s mut LayerState>,
    /// Position of its first row.
    pub pos: usize,
    /// Rows it runs.
    pub rows: usize,
}

fn note(writes: &mut BTreeSet<PageWrite>, rows: &PagedRows, layer: Option<usize>, loc: u32) {
    if loc == NO_LOCATION {
        return;
    }
    if let Some(store) = rows.store() {
        writes.insert(PageWrite {
            store: store.name().to_string(),
            layer,
            page: loc / rows.layout().page_entries() as u32,
        });
    }
}

/// Reserve the step's rows in every store of every block; `layer_of(b)` names block b's main
/// layer (None for MTP). Rows are laid out sequence by sequence, as the step's rows are.
pub(crate) fn prepare(
    seqs: &mut [SeqRows<'_>],
    ratios: &[usize],
    layer_of: impl Fn(usize) -> Option<usize>,
) -> Result<Prepared, ForwardError> {
    let mut out = Prepared::default();
    for (b, &ratio) in ratios.iter().enumerate() {
        let width = loc_width(ratio);
        let mut locs = Vec::with_capacity(width * seqs.iter().map(|s| s.rows).sum::<usize>());
        let layer = layer_of(b);
        for s in seqs.iter_mut() {
            let st = &mut *s.layers[b];
            let swa = st.swa.reserve(s.rows)?;
            for &l in &swa {
                note(&mut out.writes, &st.swa, layer, l);
            }
            let mut chains = Vec::new();
            for c in [st.compressor.as_mut(), st.indexer.as_mut()]
                .into_iter()
                .flatten()
            {
                let ring = c.ring.prepare_page()?;
                if let Some(store) = c.ring.pooled_pages().map(|p| p.store()) {
                    out.writes.insert(PageWrite {
                        store: store.name().to_string(),
                        layer,
                        page: ring,
                    });
                }
                let r = if chains.is_empty() { ratio } else { 4 };
                let mut entries = Vec::with_capacity(s.rows);
                for p in s.pos..s.pos + s.rows {
                    let loc = if (p + 1).is_multiple_of(r) {
                        c.entries.reserve(1)?[0]
                    } else {
                        NO_LOCATION
                    };
                    note(&mut out.writes, &c.entries, layer, loc);
                    entries.push(loc);
                }
                chains.push((ring, entries));
            }
            for (k, &sw) in swa.iter().enumerate() {
                locs.push(sw);
                for (ring, entries) in &chains {
                    locs.extend([*ring, entries[k]]);
                }
            }
        }
        debug_assert_eq!(locs.len() % width, 0);
        out.locs.push(locs);
    }
    Ok(out)
}
