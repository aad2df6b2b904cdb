//! Execution context of the cpu backend: the owned rayon pool, the thread count and the
//! instruction set the kernels use. Work is only ever split over independent outputs (rows,
//! columns, heads, keys), so how it is split never changes a result.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Which kernel implementations run. All compute bitwise identical results: every kernel is
/// written with exactly rounded operations (f64 fused multiply-adds whose f32×f32 products are
/// exact, adds, multiplies) applied in the same order per output element; only the vector width
/// differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust loops (any target).
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2Fma,
    /// x86-64 AVX-512F on top of AVX2 + FMA + F16C.
    Avx512,
}

impl Isa {
    /// The fastest instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                return if has!("avx512f") {
                    Isa::Avx512
                } else {
                    Isa::Avx2Fma
                };
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2Fma, Isa::Avx512]
            .into_iter()
            .filter(|&i| i <= Isa::detect())
            .collect()
    }
}

/// Work (multiply-adds, roughly) below which a call runs on the calling thread alone: waking
/// the pool costs a few microseconds.
const INLINE_WORK: usize = 1 << 18;

/// The pool, thread count and instruction set every op runs with.
pub(crate) struct Exec {
    /// Helper workers (threads − 1); the calling thread is the remaining one.
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    /// Kernel implementations in use.
    pub isa: Isa,
}

impl Exec {
    /// A context with `threads` workers (0 = one per core) and the given instruction set.
    pub fn new(threads: usize, isa: Isa) -> Result<Self, rayon::ThreadPoolBuildError> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads - 1)
                    .thread_name(|i| format!("dsv4-cpu-{i}"))
                    .build()?,
            )
        } else {
            None
        };
        Ok(Self { pool, threads, isa })
    }

    /// Worker threads (the calling thread included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// A context with the same instruction set that runs everything on the calling thread: for
    /// the work of one item of a parallel split over rows.
    pub fn serial(&self) -> Exec {
        Exec {
            pool: None,
            threads: 1,
            isa: self.isa,
        }
    }

    /// Run `f(i)` for every i < `items`: on the calling thread alone when `work` (multiply-adds,
    /// roughly) is small, else on the calling thread and the helpers, each taking the next
    /// unclaimed item. Each item must write disjoint outputs.
    pub fn for_each(&self, items: usize, work: usize, f: impl Fn(usize) + Sync + Send) {
        match &self.pool {
            Some(pool) if items > 1 && work >= INLINE_WORK => {
                let next = AtomicUsize::new(0);
                let run = || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= items {
                            break;
                        }
                        f(i);
                    }
                };
                let helpers = (self.threads - 1).min(items - 1);
                pool.in_place_scope(|s| {
                    for _ in 0..helpers {
                        s.spawn(|_| run());
                    }
                    run();
                });
            }
            _ => (0..items).for_each(f),
        }
    }

    /// Run `f(first_row, rows)` over `out` cut into whole rows of width `dim`, in chunks;
    /// `work_per_row` sizes the decision to use the helpers. `dim` must be positive.
    pub fn rows_mut<T: Send>(
        &self,
        out: &mut [T],
        dim: usize,
        work_per_row: usize,
        f: impl Fn(usize, &mut [T]) + Sync + Send,
    ) {
        let rows = out.len() / dim;
        let work = rows.saturating_mul(work_per_row.max(1));
        if self.pool.is_none() || rows < 2 || work < INLINE_WORK {
            f(0, out);
            return;
        }
        let per = rows.div_ceil(self.threads * 4).max(1);
        let chunks = out.len().div_ceil(per * dim);
        let (len, base) = (out.len(), SharedOut(out.as_mut_ptr()));
        self.for_each(chunks, work, |c| {
            let start = c * per * dim;
            let end = len.min(start + per * dim);
            // SAFETY: chunks are disjoint ranges of `out`, which is borrowed mutably for the
            // whole call.
            let chunk =
                unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(c * per, chunk);
        });
    }

    /// [`Exec::rows_mut`] for rows whose own work can split too: `f(ex, first_row, rows)`. With
    /// at least as many rows as threads each chunk of whole rows runs on one thread with a
    /// serial `ex`; with fewer, all rows run here with this context, whose ops then split each
    /// row's work instead (a row's result does not depend on either split).
    pub fn rows_or_within<T: Send>(
        &self,
        out: &mut [T],
        dim: usize,
        work_per_row: usize,
        f: impl Fn(&Exec, usize, &mut [T]) + Sync + Send,
    ) {
        if out.len() / dim < self.threads {
            return f(self, 0, out);
        }
        let one = self.serial();
        self.rows_mut(out, dim, work_per_row, |first, rows| f(&one, first, rows));
    }
}

/// A raw output pointer shared by parallel items that write disjoint elements.
pub(crate) struct SharedOut<T = f32>(pub *mut T);

impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The pointer (a method, so closures capture the Sync wrapper, not the raw field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: every user writes through the pointer only to elements no other item touches, and the
// buffer outlives the parallel section (it is a `&mut` borrowed for the whole call); the
// elements themselves may move between threads.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}
