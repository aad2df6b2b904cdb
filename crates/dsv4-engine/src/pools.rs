//! The engine's cache pools, one per [`PoolKind`]: their sizing from the model's cache geometry
//! and the [`CacheBudget`], the start-up table (pool, layers, pages, rows, bytes), and how many
//! fresh pages a step of a sequence takes.

use crate::config::{CacheBudget, EngineConfig};
use crate::error::EngineError;
use crate::pool::{Pool, PoolKind};
use dsv4_model::forward::pages::{CacheStores, PageStore};
use dsv4_model::forward::state::{CompressorRing, KV_PAGE_ENTRIES, ring_coff, ring_rows};
use dsv4_model::{Model, SequenceState};
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// Pages needed per pool, indexed by [`PoolKind::index`].
pub type PoolPages = [usize; 7];

/// Token budget of the `Pages` sizing for pools a [`CacheBudget::Pages`] map does not name.
const DEFAULT_POOL_TOKENS: usize = 65536;

/// The sizes of one model's caches that the pools are built from.
#[derive(Debug, Clone, Serialize)]
pub struct CacheGeometry {
    /// Main layers of each kind: [all, ratio 4, ratio 128].
    pub layers: [usize; 3],
    /// SWA ring pages per layer (the window rounded up to whole pages).
    pub swa_ring_pages: usize,
    /// Bytes of a page of each pool.
    pub page_bytes: PoolPages,
    /// Rows of a page of each pool (KV and index-K entries, or ring rows).
    pub rows_per_page: PoolPages,
    /// The model's context limit.
    pub max_position: usize,
}

impl CacheGeometry {
    /// The geometry of `model`'s caches.
    pub fn of(model: &Model) -> Self {
        let ratios = model.layer_ratios();
        let count = |r: usize| ratios.iter().filter(|&&x| x == r).count();
        let cfg = &model.cfg;
        let kv = model.kv_layout();
        let ik = model.index_k_layout();
        let ring = |r: usize, d: usize| CompressorRing::page_bytes(ring_rows(r), ring_coff(r) * d);
        Self {
            layers: [ratios.len(), count(4), count(128)],
            swa_ring_pages: cfg.sliding_window.div_ceil(KV_PAGE_ENTRIES).max(1),
            page_bytes: [
                kv.page_bytes(),
                kv.page_bytes(),
                kv.page_bytes(),
                ik.page_bytes(),
                ring(4, cfg.head_dim),
                ring(128, cfg.head_dim),
                ring(4, ik.dim()),
            ],
            rows_per_page: [
                kv.page_entries(),
                kv.page_entries(),
                kv.page_entries(),
                ik.page_entries(),
                ring_rows(4),
                ring_rows(128),
                ring_rows(4),
            ],
            max_position: cfg.max_position_embeddings,
        }
    }

    /// Layers that have a store of this pool.
    pub fn layers_of(&self, kind: PoolKind) -> usize {
        match kind {
            PoolKind::SwaKv => self.layers[0],
            PoolKind::C4Kv | PoolKind::C4IndexK | PoolKind::C4State | PoolKind::C4IndexState => {
                self.layers[1]
            }
            PoolKind::C128Kv | PoolKind::C128State => self.layers[2],
        }
    }

    /// Pages of each pool one sequence of `len` tokens holds.
    pub fn pages_for_len(&self, len: usize) -> PoolPages {
        let per = KV_PAGE_ENTRIES;
        let mut out = [0; 7];
        for kind in PoolKind::ALL {
            let per_layer = match kind {
                PoolKind::SwaKv => len.div_ceil(per).min(self.swa_ring_pages),
                PoolKind::C4Kv => (len / 4).div_ceil(per),
                PoolKind::C4IndexK => (len / 4).div_ceil(self.rows_per_page[kind.index()]),
                PoolKind::C128Kv => (len / 128).div_ceil(per),
                _ => 1,
            };
            out[kind.index()] = per_layer * self.layers_of(kind);
        }
        out
    }

    /// Pool pages for a budget of `tokens` tokens and `slots` sequence slots.
    pub fn pages_for_tokens(&self, tokens: usize, slots: usize) -> PoolPages {
        let mut out = [0; 7];
        for kind in PoolKind::ALL {
            let per_layer = match kind {
                PoolKind::SwaKv => slots * self.swa_ring_pages,
                PoolKind::C4Kv => (tokens / 4).div_ceil(KV_PAGE_ENTRIES) + slots,
                PoolKind::C4IndexK => {
                    (tokens / 4).div_ceil(self.rows_per_page[kind.index()]) + slots
                }
                PoolKind::C128Kv => (tokens / 128).div_ceil(KV_PAGE_ENTRIES) + slots,
                _ => slots,
            };
            out[kind.index()] = per_layer * self.layers_of(kind);
        }
        out
    }

    /// Bytes of pools of the given page counts.
    pub fn bytes(&self, pages: &PoolPages) -> u64 {
        pages
            .iter()
            .zip(&self.page_bytes)
            .map(|(&p, &b)| p as u64 * b as u64)
            .sum()
    }
}

/// One line of the start-up pool table.
#[derive(Debug, Clone, Serialize)]
pub struct PoolRow {
    /// Pool name.
    pub pool: &'static str,
    /// Layers with a store in this pool.
    pub layers: usize,
    /// Pages.
    pub pages: usize,
    /// Rows the pages hold (entries, or ring rows).
    pub rows: usize,
    /// Bytes per page.
    pub page_bytes: usize,
    /// Bytes of the whole pool.
    pub bytes: u64,
}

/// The pools as sized at start-up.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReport {
    /// One row per pool.
    pub pools: Vec<PoolRow>,
    /// Bytes of all pools.
    pub total_bytes: u64,
    /// The token budget the pools were sized for (None for explicit page counts).
    pub max_total_tokens: Option<usize>,
    /// Sequence slots (running requests and prefix snapshots) the fixed pools are sized for.
    pub sequence_slots: usize,
    /// The host tier's pools (`cache.hicache`), one row per pool; None when it is off.
    pub host_tier: Option<HostTierReport>,
}

/// The host tier as sized at start-up.
#[derive(Debug, Clone, Serialize)]
pub struct HostTierReport {
    /// Host pages per device page (`cache.hicache_ratio`).
    pub ratio: f64,
    /// One row per host pool.
    pub pools: Vec<PoolRow>,
    /// Bytes of all host pools.
    pub total_bytes: u64,
}

impl fmt::Display for PoolReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<16} {:>6} {:>10} {:>12} {:>10} {:>14}",
            "pool", "layers", "pages", "rows", "page B", "bytes"
        )?;
        for r in &self.pools {
            writeln!(
                f,
                "{:<16} {:>6} {:>10} {:>12} {:>10} {:>14}",
                r.pool, r.layers, r.pages, r.rows, r.page_bytes, r.bytes
            )?;
        }
        write!(f, "{:<16} {:>69}", "total", self.total_bytes)?;
        if let Some(h) = &self.host_tier {
            write!(f, "\nhost tier (cache.hicache, ratio {}):", h.ratio)?;
            for r in &h.pools {
                write!(
                    f,
                    "\n{:<16} {:>6} {:>10} {:>12} {:>10} {:>14}",
                    r.pool, r.layers, r.pages, r.rows, r.page_bytes, r.bytes
                )?;
            }
            write!(f, "\n{:<16} {:>69}", "host total", h.total_bytes)?;
        }
        Ok(())
    }
}

/// Usage of one pool now.
#[derive(Debug, Clone, Serialize)]
pub struct PoolUsage {
    /// Pool name.
    pub pool: &'static str,
    /// Pages in use.
    pub used_pages: usize,
    /// Pages in the pool.
    pub total_pages: usize,
    /// Bytes in use.
    pub used_bytes: u64,
}

/// The largest token budget whose pools fit in `budget` bytes.
fn tokens_for_bytes(
    geom: &CacheGeometry,
    slots: usize,
    budget: u64,
    cap: usize,
) -> Result<usize, EngineError> {
    let least = geom.bytes(&geom.pages_for_tokens(0, slots));
    if least > budget {
        return Err(EngineError::Config {
            option: "cache.max_total_tokens",
            message: format!(
                "a byte budget of {budget} B cannot hold the {slots} sequence slots' fixed pages \
                 ({least} B); give more memory or lower scheduler.max_running_requests"
            ),
        });
    }
    let (mut lo, mut hi) = (0usize, cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if geom.bytes(&geom.pages_for_tokens(mid, slots)) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// Page counts per pool for `cfg`, and the token budget they were sized for.
pub fn plan_pools(
    geom: &CacheGeometry,
    cfg: &EngineConfig,
) -> Result<(PoolPages, Option<usize>), EngineError> {
    let slots = cfg.sequence_slots();
    let cap = slots.saturating_mul(geom.max_position);
    let (pages, tokens) = match &cfg.cache {
        CacheBudget::Tokens(t) => (geom.pages_for_tokens(*t, slots), Some(*t)),
        CacheBudget::Bytes(b) => {
            let t = tokens_for_bytes(geom, slots, *b, cap)?;
            (geom.pages_for_tokens(t, slots), Some(t))
        }
        CacheBudget::Auto => {
            let b = dsv4_core::sys::mem_available().map_or(1 << 30, |m| m / 4);
            let t = tokens_for_bytes(geom, slots, b, cap)?;
            (geom.pages_for_tokens(t, slots), Some(t))
        }
        CacheBudget::Pages(map) => {
            let mut pages = geom.pages_for_tokens(DEFAULT_POOL_TOKENS, slots);
            for (kind, &n) in map {
                pages[kind.index()] = n;
            }
            (pages, None)
        }
    };
    page_ids_fit(&pages, "cache.max_total_tokens", PoolKind::name)?;
    Ok((pages, tokens))
}

/// Every pool of `pages` has at most as many pages as a page id (u32) can name; the error
/// names the pool (by `name`) and `option`, the knob to lower.
fn page_ids_fit(
    pages: &PoolPages,
    option: &'static str,
    name: fn(PoolKind) -> &'static str,
) -> Result<(), EngineError> {
    match PoolKind::ALL
        .into_iter()
        .find(|k| pages[k.index()] > u32::MAX as usize)
    {
        Some(kind) => Err(EngineError::Config {
            option,
            message: format!(
                "pool {} would need {} pages, more than a page id can name; lower {option}",
                name(kind),
                pages[kind.index()]
            ),
        }),
        None => Ok(()),
    }
}

/// Refuse pools that cannot be allocated, before allocating any: a host-tier pool with more
/// pages than a page id can name, or device and host pools together needing more than the
/// memory `available` (None: not checked). Pools are host memory on every backend, and an
/// oversized pool would fail at allocation or be killed under load, not at start.
pub fn check_memory(
    geom: &CacheGeometry,
    pages: &PoolPages,
    host_pages: &PoolPages,
    available: Option<u64>,
) -> Result<(), EngineError> {
    page_ids_fit(host_pages, "cache.hicache_ratio", PoolKind::host_name)?;
    let (device, host) = (geom.bytes(pages), geom.bytes(host_pages));
    match available {
        Some(free) if device.saturating_add(host) > free => {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            let (option, lower) = if device > free {
                ("cache.max_total_tokens", "cache.max_total_tokens")
            } else {
                (
                    "cache.hicache_ratio",
                    "cache.hicache_ratio or cache.max_total_tokens",
                )
            };
            Err(EngineError::Config {
                option,
                message: format!(
                    "the cache pools need {:.1} GiB (device pools {:.1} GiB, host tier {:.1} \
                     GiB) but {:.1} GiB of memory is available; lower {lower} (0 sizes the \
                     pools from the memory available)",
                    gib(device + host),
                    gib(device),
                    gib(host),
                    gib(free)
                ),
            })
        }
        _ => Ok(()),
    }
}

/// The engine's pools and the stores a pooled sequence is built on.
pub struct CachePools {
    pools: Vec<Arc<Pool>>,
    host: Vec<Arc<Pool>>,
    stores: CacheStores,
    geom: CacheGeometry,
    report: PoolReport,
}

impl CachePools {
    /// Size and allocate the pools for `model` under `cfg`, and log the pool table.
    pub fn new(model: &Model, cfg: &EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let geom = CacheGeometry::of(model);
        let (pages, tokens) = plan_pools(&geom, cfg)?;
        let host_pages: PoolPages = match &cfg.hicache {
            // `as` saturates: a ratio too large for any machine becomes usize::MAX pages, which
            // check_memory refuses.
            Some(h) => std::array::from_fn(|i| (pages[i] as f64 * h.ratio).ceil() as usize),
            None => [0; 7],
        };
        check_memory(&geom, &pages, &host_pages, dsv4_core::sys::mem_available())?;
        let pools: Vec<Arc<Pool>> = PoolKind::ALL
            .into_iter()
            .map(|k| {
                let i = k.index();
                Arc::new(Pool::new(
                    k,
                    pages[i],
                    geom.page_bytes[i],
                    geom.rows_per_page[i],
                ))
            })
            .collect();
        let store = |k: PoolKind| -> Arc<dyn PageStore> { pools[k.index()].clone() };
        let stores = CacheStores {
            swa: store(PoolKind::SwaKv),
            c4: store(PoolKind::C4Kv),
            c128: store(PoolKind::C128Kv),
            index_k: store(PoolKind::C4IndexK),
            c4_ring: store(PoolKind::C4State),
            c128_ring: store(PoolKind::C128State),
            index_ring: store(PoolKind::C4IndexState),
        };
        let host: Vec<Arc<Pool>> = match &cfg.hicache {
            Some(_) => PoolKind::ALL
                .into_iter()
                .map(|k| {
                    let i = k.index();
                    Arc::new(Pool::host(
                        k,
                        host_pages[i],
                        geom.page_bytes[i],
                        geom.rows_per_page[i],
                    ))
                })
                .collect(),
            None => Vec::new(),
        };
        let row = |k: PoolKind, name: &'static str, n: usize| {
            let i = k.index();
            PoolRow {
                pool: name,
                layers: geom.layers_of(k),
                pages: n,
                rows: n * geom.rows_per_page[i],
                page_bytes: geom.page_bytes[i],
                bytes: n as u64 * geom.page_bytes[i] as u64,
            }
        };
        let rows: Vec<PoolRow> = PoolKind::ALL
            .into_iter()
            .map(|k| row(k, k.name(), pages[k.index()]))
            .collect();
        let host_tier = cfg.hicache.map(|h| HostTierReport {
            ratio: h.ratio,
            pools: PoolKind::ALL
                .into_iter()
                .map(|k| row(k, k.host_name(), host_pages[k.index()]))
                .collect(),
            total_bytes: geom.bytes(&host_pages),
        });
        let report = PoolReport {
            total_bytes: geom.bytes(&pages),
            pools: rows,
            max_total_tokens: tokens,
            sequence_slots: cfg.sequence_slots(),
            host_tier,
        };
        for r in &report.pools {
            tracing::info!(
                pool = r.pool,
                layers = r.layers,
                pages = r.pages,
                rows = r.rows,
                page_bytes = r.page_bytes,
                bytes = r.bytes,
                "cache pool"
            );
        }
        tracing::info!(
            total_bytes = report.total_bytes,
            max_total_tokens = ?report.max_total_tokens,
            sequence_slots = report.sequence_slots,
            "cache pools allocated"
        );
        if let Some(h) = &report.host_tier {
            for r in &h.pools {
                tracing::info!(
                    pool = r.pool,
                    pages = r.pages,
                    bytes = r.bytes,
                    "host tier pool"
                );
            }
            tracing::info!(
                ratio = h.ratio,
                total_bytes = h.total_bytes,
                "host tier allocated"
            );
        }
        Ok(Self {
            pools,
            host,
            stores,
            geom,
            report,
        })
    }

    /// The stores pooled sequences are built on.
    pub fn stores(&self) -> &CacheStores {
        &self.stores
    }

    /// Every pool, in [`PoolKind::ALL`] order.
    pub fn all(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// The host tier's pools, in [`PoolKind::ALL`] order (empty when it is off).
    pub fn host(&self) -> &[Arc<Pool>] {
        &self.host
    }

    /// The pool of `kind`.
    pub fn pool(&self, kind: PoolKind) -> &Arc<Pool> {
        &self.pools[kind.index()]
    }

    /// The cache geometry the pools were sized from.
    pub fn geometry(&self) -> &CacheGeometry {
        &self.geom
    }

    /// The start-up table.
    pub fn report(&self) -> &PoolReport {
        &self.report
    }

    /// Free pages of every pool.
    pub fn free(&self) -> PoolPages {
        std::array::from_fn(|i| self.pools[i].free_pages())
    }

    /// Whether every page of every pool is free.
    pub fn all_free(&self) -> bool {
        self.pools.iter().all(|p| p.used_pages() == 0)
    }

    /// Usage of every pool now.
    pub fn usage(&self) -> Vec<PoolUsage> {
        self.pools
            .iter()
            .map(|p| PoolUsage {
                pool: p.kind().name(),
                used_pages: p.used_pages(),
                total_pages: p.capacity(),
                used_bytes: p.used_pages() as u64 * p.page_bytes() as u64,
            })
            .collect()
    }

    /// The first pool a sequence of `len` tokens would not fit in even alone:
    /// (pool, pages needed, pages held).
    pub fn too_small_for(&self, len: usize) -> Option<(PoolKind, usize, usize)> {
        let need = self.geom.pages_for_len(len);
        PoolKind::ALL.into_iter().find_map(|k| {
            let cap = self.pools[k.index()].capacity();
            (need[k.index()] > cap).then_some((k, need[k.index()], cap))
        })
    }
}

/// Fresh pages per pool that running the next `n` tokens of `st` takes (new pages, and copies
/// of pages shared with prefix snapshots); `ratios` are the model's layer ratios.
pub fn fresh_pages(st: &SequenceState, ratios: &[usize], n: usize) -> PoolPages {
    let mut need = [0; 7];
    if n == 0 {
        return need;
    }
    let p = st.pos;
    for (layer, &r) in st.layers.iter().zip(ratios) {
        need[PoolKind::SwaKv.index()] += layer.swa.fresh_pages_for(n);
        if let Some(c) = &layer.compressor {
            let (kv, ring) = if r == 4 {
                (PoolKind::C4Kv, PoolKind::C4State)
            } else {
                (PoolKind::C128Kv, PoolKind::C128State)
            };
            need[kv.index()] += c.entries.fresh_pages_for((p + n) / r - p / r);
            need[ring.index()] += c.ring.fresh_pages();
        }
        if let Some(c) = &layer.indexer {
            need[PoolKind::C4IndexK.index()] += c.entries.fresh_pages_for((p + n) / 4 - p / 4);
            need[PoolKind::C4IndexState.index()] += c.ring.fresh_pages();
        }
    }
    need
}
