//! The canary (`debug.canary`): around every forward round, checksums of every page of the
//! watched pools are taken before and after, and the pages that changed are compared with the
//! round's declared write set (the pages its store launches were given). A page that changed
//! outside the set is a write nobody declared — the signature of a race or an aliasing bug
//! ("32 index-K pages changed, 2 expected"). Under the overlap scheduler the declared writes are
//! also checked against page ownership: every page a step writes must be held, per the
//! allocator, by one of the step's own requests; a page written for a request that no longer
//! holds it (freed, perhaps handed to another request) is a stale page reuse. Findings are
//! logged, counted in the metrics and, when asked, fail the round's requests.

use crate::pool::{Pool, PoolKind};
use dsv4_model::forward::PageWrite;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Which pools a canary watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryPools {
    /// SWA, C4 and C128 KV pages.
    Kv,
    /// Index-K pages.
    IndexK,
    /// Compressor ring pages.
    State,
}

impl CanaryPools {
    /// Every class.
    pub const ALL: [CanaryPools; 3] = [CanaryPools::Kv, CanaryPools::IndexK, CanaryPools::State];

    /// The class of a pool.
    pub fn of(kind: PoolKind) -> CanaryPools {
        match kind {
            PoolKind::SwaKv | PoolKind::C4Kv | PoolKind::C128Kv => CanaryPools::Kv,
            PoolKind::C4IndexK => CanaryPools::IndexK,
            PoolKind::C4State | PoolKind::C128State | PoolKind::C4IndexState => CanaryPools::State,
        }
    }
}

/// Canary options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryConfig {
    /// Pools watched.
    pub pools: BTreeSet<CanaryPools>,
    /// Fail the round's requests when a page changed outside the write set.
    pub abort: bool,
}

impl Default for CanaryConfig {
    /// Every pool, logging only.
    fn default() -> Self {
        Self {
            pools: CanaryPools::ALL.into_iter().collect(),
            abort: false,
        }
    }
}

/// Run-time checks and injected faults of an engine (`debug.*` of a profile).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DebugOptions {
    /// The cache-page canary, when on.
    pub canary: Option<CanaryConfig>,
}

/// What a canary finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryCheck {
    /// Pages changed outside the step's declared write set.
    WriteSet,
    /// Pages the step declares it writes that none of its requests holds.
    Ownership,
}

/// One pool's finding in one round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CanaryFinding {
    /// Which check fired.
    pub check: CanaryCheck,
    /// The engine step.
    pub step: u64,
    /// The pool.
    pub pool: &'static str,
    /// Layers of the round's declared writes to this pool.
    pub layers: Vec<usize>,
    /// Pages the round declared it writes.
    pub expected: usize,
    /// Pages that changed (for [`CanaryCheck::Ownership`]: declared pages held by no request
    /// of the step).
    pub changed: usize,
    /// The offending pages (at most 32 listed): changed outside the declared set, or written
    /// without being held by the writer.
    pub unexpected: Vec<u32>,
    /// How many pages offend.
    pub unexpected_total: usize,
    /// For [`CanaryCheck::Ownership`]: of the offending pages, how many are free in the
    /// allocator (the rest are held by other requests or prefix snapshots).
    pub free: usize,
}

impl std::fmt::Display for CanaryFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.check == CanaryCheck::Ownership {
            return write!(
                f,
                "step {}: pool {}: {} pages written, {} of them held by none of the step's \
                 requests ({} free, {} held by other requests or snapshots; declared writes in \
                 layers {:?}): {:?}",
                self.step,
                self.pool,
                self.expected,
                self.unexpected_total,
                self.free,
                self.unexpected_total - self.free,
                self.layers,
                self.unexpected
            );
        }
        write!(
            f,
            "step {}: pool {}: {} pages changed, {} expected (declared writes in layers {:?}); \
             {} changed outside the write set: {:?}",
            self.step,
            self.pool,
            self.changed,
            self.expected,
            self.layers,
            self.unexpected_total,
            self.unexpected
        )
    }
}

/// Checksums of every page of the watched pools, taken before a round.
pub struct Snapshot {
    sums: Vec<(Arc<Pool>, Vec<u64>)>,
}

impl Snapshot {
    /// Checksums of the watched pools now.
    pub fn take(pools: &[Arc<Pool>], cfg: &CanaryConfig) -> Self {
        let sums = pools
            .iter()
            .filter(|p| cfg.pools.contains(&CanaryPools::of(p.kind())))
            .map(|p| (Arc::clone(p), p.page_checksums()))
            .collect();
        Self { sums }
    }

    /// Compare with the pools now: one finding per pool with pages changed outside `writes`.
    pub fn compare(&self, step: u64, writes: &BTreeSet<PageWrite>) -> Vec<CanaryFinding> {
        self.compare_except(step, writes, &BTreeMap::new())
    }

    /// [`Self::compare`], also allowing the pages in `except` (pool name → pages) to change:
    /// the overlap scheduler's own writes while the step ran (the fresh pages of requests it
    /// admitted meanwhile).
    pub fn compare_except(
        &self,
        step: u64,
        writes: &BTreeSet<PageWrite>,
        except: &BTreeMap<&'static str, BTreeSet<u32>>,
    ) -> Vec<CanaryFinding> {
        let mut declared = declared(writes);
        for (name, pages) in except {
            declared.entry(name).or_default().0.extend(pages);
        }
        let mut out = Vec::new();
        for (pool, before) in &self.sums {
            let after = pool.page_checksums();
            let changed: Vec<u32> = before
                .iter()
                .zip(&after)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, _)| i as u32)
                .collect();
            let name = pool.kind().name();
            let (expected, layers) = declared.get(name).cloned().unwrap_or_default();
            let unexpected: Vec<u32> = changed
                .iter()
                .copied()
                .filter(|p| !expected.contains(p))
                .collect();
            if unexpected.is_empty() {
                continue;
            }
            out.push(CanaryFinding {
                check: CanaryCheck::WriteSet,
                step,
                pool: name,
                layers: layers.into_iter().collect(),
                expected: expected.len(),
                changed: changed.len(),
                unexpected_total: unexpected.len(),
                unexpected: unexpected.into_iter().take(32).collect(),
                free: 0,
            });
        }
        out
    }
}

/// Pool name → (declared pages, layers of the declarations).
fn declared(writes: &BTreeSet<PageWrite>) -> BTreeMap<&str, (BTreeSet<u32>, BTreeSet<usize>)> {
    let mut out: BTreeMap<&str, (BTreeSet<u32>, BTreeSet<usize>)> = BTreeMap::new();
    for w in writes {
        let e = out.entry(w.store.as_str()).or_default();
        e.0.insert(w.page);
        e.1.extend(w.layer);
    }
    out
}

/// The ownership check of one step of the watched `pools`: one finding per pool with declared
/// writes to pages that none of the step's requests holds (`held`: pool name → pages the
/// step's requests hold, with a reference, after the step).
pub fn ownership(
    step: u64,
    pools: &[Arc<Pool>],
    cfg: &CanaryConfig,
    writes: &BTreeSet<PageWrite>,
    held: &BTreeMap<&'static str, BTreeSet<u32>>,
) -> Vec<CanaryFinding> {
    let declared = declared(writes);
    let mut out = Vec::new();
    for pool in pools
        .iter()
        .filter(|p| cfg.pools.contains(&CanaryPools::of(p.kind())))
    {
        let name = pool.kind().name();
        let Some((pages, layers)) = declared.get(name) else {
            continue;
        };
        let mine = held.get(name);
        let stray: Vec<u32> = pages
            .iter()
            .copied()
            .filter(|p| !mine.is_some_and(|m| m.contains(p)))
            .collect();
        if stray.is_empty() {
            continue;
        }
        out.push(CanaryFinding {
            check: CanaryCheck::Ownership,
            step,
            pool: name,
            layers: layers.iter().copied().collect(),
            expected: pages.len(),
            changed: stray.len(),
            unexpected_total: stray.len(),
            free: stray
                .iter()
                .filter(|&&p| dsv4_model::forward::pages::PageStore::refs(&**pool, p) == 0)
                .count(),
            unexpected: stray.into_iter().take(32).collect(),
        });
    }
    out
}
