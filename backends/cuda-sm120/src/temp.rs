//! Stream-ordered temporary buffers for the host ops (`Device::temp`, `Device::temp_upload`).
//!
//! A host op uploads its inputs, launches, and reads its output back, all on the calling
//! thread's stream. Allocating and freeing its buffers through the driver would cost a device
//! allocation per buffer and, worse, a device-wide synchronisation per free (a buffer may be in
//! use on any stream), stalling every other stream of the plan. Instead a dropped temporary
//! goes back to a free list of the stream it was taken on, by size class (powers of two), and
//! the next temporary of that class on that stream reuses it: work on one stream runs in
//! issue order, so the new user's copies and kernels run after the old user's. Nothing waits.
//! A reused buffer is zeroed on the stream first (a fresh allocation is zero too). Past
//! [`POOL_MAX`] pooled bytes a returned buffer is freed instead.

use crate::device::{RawDevice, StreamHandle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Smallest size class in bytes.
const MIN_CLASS: usize = 256;
/// Bytes the free lists may hold before returned buffers are freed instead.
pub const POOL_MAX: usize = 512 << 20;

/// The size class (capacity) that holds `bytes`.
pub fn class_of(bytes: usize) -> usize {
    bytes.max(MIN_CLASS).next_power_of_two()
}

#[derive(Default)]
struct Lists {
    /// (stream, class) -> free addresses, most recently returned last.
    free: HashMap<(StreamHandle, usize), Vec<u64>>,
    bytes: usize,
}

/// The free lists of one device's temporaries.
pub struct TempPool {
    raw: Arc<dyn RawDevice>,
    lists: Mutex<Lists>,
}

impl TempPool {
    /// An empty pool over `raw`.
    pub fn new(raw: Arc<dyn RawDevice>) -> Self {
        Self {
            raw,
            lists: Mutex::default(),
        }
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free buffer of `class` bytes last used on `stream`, if there is one.
    pub fn take(&self, stream: StreamHandle, class: usize) -> Option<u64> {
        let mut l = self.lists();
        let ptr = l.free.get_mut(&(stream, class))?.pop()?;
        l.bytes -= class;
        Some(ptr)
    }

    /// Give back `ptr` (`class` bytes, last used on `stream`); false when the pool is full and
    /// the caller must free it.
    pub fn give(&self, stream: StreamHandle, class: usize, ptr: u64) -> bool {
        let mut l = self.lists();
        if l.bytes + class > POOL_MAX {
            return false;
        }
        l.bytes += class;
        l.free.entry((stream, class)).or_default().push(ptr);
        true
    }

    /// Bytes held in the free lists.
    pub fn pooled_bytes(&self) -> usize {
        self.lists().bytes
    }
}

impl Drop for TempPool {
    fn drop(&mut self) {
        let lists = std::mem::take(&mut *self.lists());
        for ptr in lists.free.into_values().flatten() {
            // SAFETY: every pooled address came from raw.alloc and has no owner any more.
            unsafe { self.raw.free(ptr) };
        }
    }
}
