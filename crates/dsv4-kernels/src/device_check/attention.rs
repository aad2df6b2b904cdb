//! The conformance checks of attention on device-resident queries
//! ([`DeviceOps::paged_attention`](crate::device::DeviceOps)), where the device offers it: the
//! output bitwise [`crate::Backend::paged_attention_indexed`]'s over the same pages, for fp8 and
//! bf16 KV entries, untagged and tagged pages, a tagged page called again (a device may keep it)
//! and then rewritten under a new tag (a kept copy must not be read), and no keys at all;
//! inconsistent operands and a page without the format's layout are errors. The indexer's
//! selection ([`DeviceOps::paged_indexer_topk`](crate::device::DeviceOps)) likewise: the ids
//! the host op chooses, for every index-K format, over overlapping ranges (an empty one, k
//! above a range), untagged and tagged. The cache encoder's bytes equal the host encoder's
//! for every KV and index-K format, and the compressor's pooling is bitwise the host's
//! (windows with −∞ logits included). Where the device does not attend, all four ops must be
//! errors.

use super::Check;
use crate::attention_device::{encoded_words, words_bytes};
use crate::{PageTag, PagedAttention, PagedIndexer, RowFormat};
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype};

/// Key rows of a case, picked from its pages.
const ROWS: usize = 12;
/// Each key's row (ids repeat: queries share keys), and where each query's keys start (four
/// queries; the third has none).
const KEY_IDS: [usize; 14] = [0, 1, 2, 3, 4, 2, 3, 5, 6, 7, 11, 10, 9, 8];
const KEY_STARTS: [usize; 5] = [0, 5, 9, 9, 14];

impl Check<'_> {
    pub(super) fn attention_cases(&mut self) {
        if !self.dev.attends_on_device() {
            self.must_fail("paged_attention where the device does not attend", |c| {
                let (fmt, pages) = c.kv_pages(KvCacheDtype::Bf16, 10, 4, 2)?;
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let keys = attention_keys(&fmt, &refs, &[], &[(0, 0)], &[0], &[0, 1], &[0.5]);
                let (q, o) = (c.put(&[0.25; 10])?, c.out(10)?);
                Ok(c.dev.paged_attention(&keys, q, o))
            });
            self.must_fail("paged_indexer_topk where the device does not attend", |c| {
                let (fmt, pages) = c.index_pages(IndexKDtype::Fp8, 32, 4)?;
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let keys = indexer_keys(&fmt, &refs, &[], &[(0, 0)], &[(0, 1)], 1);
                let (q, w) = (c.put(&[0.25; 32])?, c.put(&[1.0])?);
                Ok(c.dev.paged_indexer_topk(&keys, q, w).map(|_| ()))
            });
            self.must_fail("cache_encode_into where the device does not attend", |c| {
                let (fmt, _) = c.index_pages(IndexKDtype::Fp8, 32, 4)?;
                let (x, o) = (c.put(&[0.25; 32])?, c.out(encoded_words(&fmt, 1))?);
                Ok(c.dev.cache_encode_into(&fmt, x, o))
            });
            self.must_fail("softmax_pool_rows where the device does not attend", |c| {
                let (a, z, o) = (c.put(&[0.5; 8])?, c.put(&[0.5; 8])?, c.out(4)?);
                Ok(c.dev.softmax_pool_rows(a, z, 1, 2, 4, o))
            });
            return;
        }
        // (dtype, head dim, rope dims, entries a page, heads)
        let shapes = [
            (KvCacheDtype::Fp8, 192, 64, 4, 3),
            (KvCacheDtype::Bf16, 10, 4, 2, 2),
            (KvCacheDtype::Bf16, 128, 64, 4, 8),
        ];
        for (dtype, hd, rd, per, heads) in shapes {
            self.attention_case(dtype, hd, rd, per, heads);
        }
        self.attention_error_cases();
        for dtype in [IndexKDtype::Fp8, IndexKDtype::Bf16, IndexKDtype::Fp4] {
            self.indexer_case(dtype);
        }
        self.indexer_error_cases();
        self.encode_cases();
        self.pool_cases();
    }

    /// The cache encoder over 1 and 5 rows of every KV and index-K format: the host's bytes.
    fn encode_cases(&mut self) {
        let kv = |d, hd, rd| KvLayout::from_head_dims(d, hd, rd, 4).map(RowFormat::Kv);
        let ik = |d, dim| IndexKLayout::new(d, dim, 4).map(RowFormat::IndexK);
        let formats = [
            kv(KvCacheDtype::Fp8, 192, 64),
            kv(KvCacheDtype::Bf16, 10, 4),
            ik(IndexKDtype::Fp8, 64),
            ik(IndexKDtype::Bf16, 64),
            ik(IndexKDtype::Fp4, 64),
        ];
        for fmt in formats {
            let fmt = match fmt {
                Ok(f) => f,
                Err(e) => {
                    return self
                        .fails
                        .push(format!("cache_encode_into: a bad layout: {e}"));
                }
            };
            for rows in [1usize, 5] {
                let label = format!("cache_encode_into {fmt:?} rows={rows}");
                self.case(&label, |c| {
                    // Values over a wide range of magnitudes, so every scale is exercised.
                    let mut x = c.vec(rows * fmt.width(), 1.0);
                    x.iter_mut()
                        .enumerate()
                        .for_each(|(i, v)| *v *= [1e-3, 1.0, 40.0][i % 3]);
                    let host = c.be.cache_encode_rows(&fmt, &x).map_err(|e| {
                        crate::KernelError::Device {
                            message: format!("the host encoder: {e}"),
                        }
                    })?;
                    let (dx, o) = (c.put(&x)?, c.out(encoded_words(&fmt, rows))?);
                    c.dev.cache_encode_into(&fmt, dx, o)?;
                    let got = words_bytes(&c.get(&label, o)?, host.len());
                    if got != host {
                        let first = got.iter().zip(&host).position(|(a, b)| a != b);
                        c.fails.push(format!(
                            "{label}: {} bytes, the host's {}; first difference at {first:?}",
                            got.len(),
                            host.len()
                        ));
                    }
                    Ok(())
                });
            }
        }
        self.must_fail("cache_encode_into of a part row", |c| {
            let fmt =
                RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp8, 32, 4).map_err(|e| {
                    crate::KernelError::Device {
                        message: e.to_string(),
                    }
                })?);
            let (x, o) = (c.put(&[0.25; 33])?, c.out(encoded_words(&fmt, 2))?);
            Ok(c.dev.cache_encode_into(&fmt, x, o))
        });
        self.must_fail("cache_encode_into with out one word short", |c| {
            let fmt =
                RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp8, 32, 4).map_err(|e| {
                    crate::KernelError::Device {
                        message: e.to_string(),
                    }
                })?);
            let (x, o) = (c.put(&[0.25; 64])?, c.out(encoded_words(&fmt, 2) - 1)?);
            Ok(c.dev.cache_encode_into(&fmt, x, o))
        });
    }

    /// The compressor's pooling: 1 and 3 windows of 8 and 4 rows, some logits −∞ (a ratio-4
    /// window's absent first half), bitwise the host op.
    fn pool_cases(&mut self) {
        for (windows, rows) in [(1usize, 8usize), (3, 8), (3, 4)] {
            let label = format!("softmax_pool_rows windows={windows} rows={rows}");
            self.case(&label, |c| {
                let width = 96;
                let n = windows * rows * width;
                let a = c.vec(n, 1.0);
                let mut z = c.vec(n, 2.0);
                // Window 0's first half pools nothing.
                z[..(rows / 2) * width].fill(f32::NEG_INFINITY);
                let mut host = vec![0f32; windows * width];
                c.be.softmax_pool_rows(&a, &z, windows, rows, width, &mut host);
                let (da, dz, o) = (c.put(&a)?, c.put(&z)?, c.out(windows * width)?);
                c.dev.softmax_pool_rows(da, dz, windows, rows, width, o)?;
                c.expect(&label, o, &host)
            });
        }
        self.must_fail("softmax_pool_rows with a short z", |c| {
            let (a, z, o) = (c.put(&[0.5; 8])?, c.put(&[0.5; 7])?, c.out(4)?);
            Ok(c.dev.softmax_pool_rows(a, z, 1, 2, 4, o))
        });
        self.must_fail("softmax_pool_rows with out of the wrong length", |c| {
            let (a, z, o) = (c.put(&[0.5; 8])?, c.put(&[0.5; 8])?, c.out(5)?);
            Ok(c.dev.softmax_pool_rows(a, z, 1, 2, 4, o))
        });
    }

    /// Pages of `dtype` index-K entries (`dim` wide, `per` a page).
    fn index_pages(
        &mut self,
        dtype: IndexKDtype,
        dim: usize,
        per: usize,
    ) -> super::R<(RowFormat, Vec<Vec<u8>>)> {
        let layout = IndexKLayout::new(dtype, dim, per).map_err(bad_layout)?;
        self.written_pages(RowFormat::IndexK(layout))
    }

    /// The indexer's selection over 12 rows of `dtype` entries, four heads, five queries over
    /// overlapping ranges (one empty, one shorter than k): untagged, then tagged twice.
    fn indexer_case(&mut self, dtype: IndexKDtype) {
        let label = format!("paged_indexer_topk {dtype:?}");
        self.case(&label, |c| {
            let (dim, per, heads, k) = (64, 4, 4, 3);
            let (fmt, pages) = c.index_pages(dtype, dim, per)?;
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let rows: Vec<(usize, usize)> = (0..ROWS)
                .map(|i| ((i * 7 + 1) % 3, (i * 5 + 2) % per))
                .collect();
            let ranges = [(0, 5), (0, 9), (4, 4), (6, 8), (2, 12)];
            let q = c.vec(ranges.len() * heads * dim, 1.0);
            let w = c.vec(ranges.len() * heads, 0.5);
            let tags: Vec<PageTag> = (0..3).map(|_| PageTag::fresh_whole()).collect();
            for pass in 0..3 {
                let t: &[PageTag] = if pass == 0 { &[] } else { &tags };
                let keys = indexer_keys(&fmt, &refs, t, &rows, &ranges, k);
                let host = keys.host(c.be, &q, &w)?;
                let (dq, dw) = (c.put(&q)?, c.put(&w)?);
                let got = c.dev.paged_indexer_topk(&keys, dq, dw)?;
                if got != host {
                    c.fails.push(format!(
                        "{label} pass {pass}: chose {got:?}, the host op {host:?}"
                    ));
                }
            }
            Ok(())
        });
    }

    fn indexer_error_cases(&mut self) {
        // (label, ranges, q words, w words, a row past its page)
        type Bad = (&'static str, &'static [(usize, usize)], usize, usize, bool);
        let cases: [Bad; 5] = [
            ("paged_indexer_topk with a short q", &[(0, 2)], 63, 2, false),
            (
                "paged_indexer_topk with w not heads per query",
                &[(0, 2), (0, 1)],
                128,
                3,
                false,
            ),
            (
                "paged_indexer_topk with a range past the rows",
                &[(0, 3)],
                64,
                2,
                false,
            ),
            (
                "paged_indexer_topk with a decreasing range",
                &[(2, 1)],
                64,
                2,
                false,
            ),
            (
                "paged_indexer_topk over a slot past its page",
                &[(0, 2)],
                64,
                2,
                true,
            ),
        ];
        for (label, ranges, qn, wn, past) in cases {
            self.must_fail(label, |c| {
                let (fmt, pages) = c.index_pages(IndexKDtype::Fp8, 32, 4)?;
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let rows = [(0, 1), (2, if past { 4 } else { 0 })];
                let keys = indexer_keys(&fmt, &refs, &[], &rows, ranges, 1);
                let (q, w) = (c.put(&vec![0.25; qn])?, c.put(&vec![1.0; wn])?);
                Ok(c.dev.paged_indexer_topk(&keys, q, w).map(|_| ()))
            });
        }
        self.must_fail("paged_indexer_topk with no queries", |c| {
            let (fmt, pages) = c.index_pages(IndexKDtype::Fp8, 32, 4)?;
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let keys = indexer_keys(&fmt, &refs, &[], &[(0, 0)], &[], 1);
            let (q, w) = (c.put(&[0.25; 32])?, c.put(&[1.0])?);
            Ok(c.dev.paged_indexer_topk(&keys, q, w).map(|_| ()))
        });
    }

    /// Pages of `dtype` KV entries (head dim `hd`, `rd` rope dims, `per` a page).
    fn kv_pages(
        &mut self,
        dtype: KvCacheDtype,
        hd: usize,
        rd: usize,
        per: usize,
    ) -> super::R<(RowFormat, Vec<Vec<u8>>)> {
        let layout = KvLayout::from_head_dims(dtype, hd, rd, per).map_err(bad_layout)?;
        self.written_pages(RowFormat::Kv(layout))
    }

    /// Three pages of `fmt`, every slot written through the host backend's `cache_store`.
    fn written_pages(&mut self, fmt: RowFormat) -> super::R<(RowFormat, Vec<Vec<u8>>)> {
        let mut pages = Vec::new();
        for _ in 0..3 {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..fmt.page_entries() {
                let v = self.vec(fmt.width(), 1.0);
                self.be
                    .cache_store(&fmt, &mut page, slot, &v)
                    .map_err(|e| crate::KernelError::Device {
                        message: format!("writing a case page: {e}"),
                    })?;
            }
            pages.push(page);
        }
        Ok((fmt, pages))
    }

    /// One shape: untagged pages; tagged pages twice; one page rewritten under a new tag; no
    /// keys at all. Each against the host op.
    fn attention_case(
        &mut self,
        dtype: KvCacheDtype,
        hd: usize,
        rd: usize,
        per: usize,
        heads: usize,
    ) {
        let label = format!("paged_attention {dtype:?} hd={hd} heads={heads}");
        self.case(&label, |c| {
            let (fmt, mut pages) = c.kv_pages(dtype, hd, rd, per)?;
            let rows: Vec<(usize, usize)> = (0..ROWS)
                .map(|i| ((i * 7 + 1) % 3, (i * 5 + 2) % per))
                .collect();
            let queries = KEY_STARTS.len() - 1;
            let q = c.vec(queries * heads * hd, 1.0);
            let sink = c.vec(heads, 1.0);
            let mut tags: Vec<PageTag> = (0..3).map(|_| PageTag::fresh_whole()).collect();
            for pass in 0..4 {
                if pass == 3 {
                    // Page 1 rewritten under a new lineage: a copy kept from before is stale.
                    let v = c.vec(hd, 2.0);
                    c.be.cache_store(&fmt, &mut pages[1], 0, &v).map_err(|e| {
                        crate::KernelError::Device {
                            message: format!("rewriting a case page: {e}"),
                        }
                    })?;
                    tags[1] = PageTag::fresh_whole();
                }
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let t: &[PageTag] = if pass == 0 { &[] } else { &tags };
                let keys = attention_keys(&fmt, &refs, t, &rows, &KEY_IDS, &KEY_STARTS, &sink);
                let host = keys.host(c.be, &q)?;
                let (dq, dout) = (c.put(&q)?, c.out(q.len())?);
                c.dev.paged_attention(&keys, dq, dout)?;
                c.expect(&format!("{label} pass {pass}"), dout, &host)?;
            }
            // Queries without keys: the sink alone.
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let keys = attention_keys(&fmt, &refs, &tags, &rows, &[], &[0, 0], &sink);
            let q1 = &q[..heads * hd];
            let host = keys.host(c.be, q1)?;
            let (dq, dout) = (c.put(q1)?, c.out(q1.len())?);
            c.dev.paged_attention(&keys, dq, dout)?;
            c.expect(&format!("{label} without keys"), dout, &host)
        });
    }

    fn attention_error_cases(&mut self) {
        // (label, key ids, key starts, q words, out words, a row past its page, out over q)
        type Bad = (
            &'static str,
            &'static [usize],
            &'static [usize],
            usize,
            usize,
            bool,
            bool,
        );
        let cases: [Bad; 6] = [
            (
                "paged_attention with a short q",
                &[0, 1],
                &[0, 2],
                19,
                20,
                false,
                false,
            ),
            (
                "paged_attention with a long out",
                &[0, 1],
                &[0, 2],
                20,
                21,
                false,
                false,
            ),
            (
                "paged_attention with a key id past the rows",
                &[0, 9],
                &[0, 2],
                20,
                20,
                false,
                false,
            ),
            (
                "paged_attention with decreasing key starts",
                &[0, 1],
                &[0, 2, 1],
                40,
                40,
                false,
                false,
            ),
            (
                "paged_attention over a slot past its page",
                &[0, 1],
                &[0, 2],
                20,
                20,
                true,
                false,
            ),
            (
                "paged_attention with out over q",
                &[0, 1],
                &[0, 2],
                20,
                20,
                false,
                true,
            ),
        ];
        for (label, ids, starts, qn, on, past, over) in cases {
            self.must_fail(label, |c| {
                let (fmt, pages) = c.kv_pages(KvCacheDtype::Bf16, 10, 4, 2)?;
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let rows = [(0, 1), (2, if past { 2 } else { 0 })];
                let sink = [0.5, -0.5];
                let keys = attention_keys(&fmt, &refs, &[], &rows, ids, starts, &sink);
                let q = c.put(&vec![0.25; qn.max(on)])?;
                let (q, o) = if over {
                    (q, q)
                } else {
                    (q.prefix(qn), c.out(on)?)
                };
                Ok(c.dev.paged_attention(&keys, q, o))
            });
        }
        self.must_fail("paged_attention with no key starts", |c| {
            let (fmt, pages) = c.kv_pages(KvCacheDtype::Bf16, 10, 4, 2)?;
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let keys = attention_keys(&fmt, &refs, &[], &[(0, 0)], &[], &[], &[0.5]);
            let (q, o) = (c.put(&[0.25; 10])?, c.out(10)?);
            Ok(c.dev.paged_attention(&keys, q, o))
        });
    }
}

/// The keys of a case, with the logits' scale 1/√dim.
fn attention_keys<'a>(
    fmt: &'a RowFormat,
    pages: &'a [&'a [u8]],
    tags: &'a [PageTag],
    rows: &'a [(usize, usize)],
    key_ids: &'a [usize],
    key_starts: &'a [usize],
    sink: &'a [f32],
) -> PagedAttention<'a> {
    PagedAttention {
        fmt,
        pages,
        tags,
        origins: &[],
        rows,
        key_ids,
        key_starts,
        sink,
        scale: 1.0 / (fmt.width() as f32).sqrt(),
    }
}

/// The keys of an indexer case.
fn indexer_keys<'a>(
    fmt: &'a RowFormat,
    pages: &'a [&'a [u8]],
    tags: &'a [PageTag],
    rows: &'a [(usize, usize)],
    key_ranges: &'a [(usize, usize)],
    k: usize,
) -> PagedIndexer<'a> {
    PagedIndexer {
        fmt,
        pages,
        tags,
        rows,
        key_ranges,
        k,
    }
}

/// A case's layout the cache format refuses, as the case's error.
fn bad_layout(e: dsv4_core::cache::CacheLayoutError) -> crate::KernelError {
    crate::KernelError::Device {
        message: format!("a bad case layout: {e}"),
    }
}
