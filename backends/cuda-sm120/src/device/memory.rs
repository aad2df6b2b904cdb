//! Device and page-locked host memory owned by Rust values: [`DevBuf`] (freed, or given back to
//! its stream's pool, when dropped), [`HostBuf`], and borrowed ranges ([`DevPtr`]).

use super::StreamHandle;
use crate::CudaError;
use crate::graphs::Recorder;
use crate::temp::TempPool;
use std::sync::Arc;

/// Device memory: `bytes` bytes at a device address, freed when dropped (or, for a
/// temporary, given back to its stream's pool).
pub struct DevBuf {
    pub(super) ptr: u64,
    pub(super) bytes: usize,
    pub(super) owner: Arc<Recorder>,
    /// A temporary's pool, stream and size class.
    pub(super) home: Option<(Arc<TempPool>, StreamHandle, usize)>,
}

impl DevBuf {
    /// Size in bytes as requested.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The whole buffer as a [`DevPtr`].
    pub fn at(&self) -> DevPtr {
        DevPtr {
            ptr: self.ptr,
            bytes: self.bytes,
        }
    }
}

/// Page-locked host memory of a device (the source of asynchronous parameter copies), freed
/// when dropped.
pub struct HostBuf {
    pub(super) ptr: u64,
    pub(super) bytes: usize,
    pub(super) owner: Arc<Recorder>,
}

impl HostBuf {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Overwrite bytes `off..off + data.len()`. A copy issued from that range before and not
    /// yet run would read the new bytes: the caller writes only ranges no issued copy reads.
    pub fn write(&mut self, off: usize, data: &[u8]) -> Result<(), CudaError> {
        if off
            .checked_add(data.len())
            .is_none_or(|end| end > self.bytes)
        {
            return Err(CudaError::OutOfBounds {
                what: "host write",
                len: off.saturating_add(data.len()),
                bytes: self.bytes,
            });
        }
        // SAFETY: the range lies inside this allocation (checked above), which we own mutably.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.ptr as usize + off) as *mut u8,
                data.len(),
            )
        };
        Ok(())
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // Held copies may read it: issue them before it goes (host_free waits for them).
        self.owner.flush_all_deferred();
        // SAFETY: ptr came from owner.host_alloc and this is its only owner.
        unsafe { self.owner.raw().host_free(self.ptr) }
    }
}

/// A range of device memory that something else keeps alive (a whole [`DevBuf`] or part of
/// one): its address and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevPtr {
    /// The device address.
    pub ptr: u64,
    /// Bytes from `ptr`.
    pub bytes: usize,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // A temporary's next user is ordered after its last on the same stream.
        if let Some((pool, stream, class)) = &self.home
            && pool.give(*stream, *class, self.ptr)
        {
            return;
        }
        // Held launches may use the buffer: issue them before it goes.
        self.owner.flush_all_deferred();
        // SAFETY: ptr came from owner.alloc and this is its only owner.
        unsafe { self.owner.raw().free(self.ptr) }
    }
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}
