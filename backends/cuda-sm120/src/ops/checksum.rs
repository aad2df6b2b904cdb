//! The canary's page checksums (`kernels/checksum.cu`): one thread per page computes exactly
//! [`dsv4_core::cache::page_checksum`].

use crate::device::blocks_for;
use crate::{Core, CudaError, DevPtr, KArg};

/// Threads per block of `page_checksums`.
const THREADS: u32 = 128;

/// The checksum of each `page_bytes`-byte page of `bytes` (a whole number of pages).
pub fn page_checksums(c: &Core, bytes: &[u8], page_bytes: usize) -> Result<Vec<u64>, CudaError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    if page_bytes == 0 || !bytes.len().is_multiple_of(page_bytes) {
        return Err(CudaError::BadOperands(format!(
            "page_checksums: {} bytes are not a whole number of {page_bytes}-byte pages",
            bytes.len()
        )));
    }
    let bb = c.dev.temp_upload(bytes)?;
    page_checksums_at(c, bb.at(), page_bytes)
}

/// The checksum of each `page_bytes`-byte page of the device memory `src` (a whole number of
/// pages, 8-aligned where `page_bytes` is a multiple of 8): the page cache's check of its
/// copies.
pub fn page_checksums_at(c: &Core, src: DevPtr, page_bytes: usize) -> Result<Vec<u64>, CudaError> {
    if src.bytes == 0 {
        return Ok(Vec::new());
    }
    if page_bytes == 0 || !src.bytes.is_multiple_of(page_bytes) {
        return Err(CudaError::BadOperands(format!(
            "page_checksums: {} bytes are not a whole number of {page_bytes}-byte pages",
            src.bytes
        )));
    }
    let pages = src.bytes / page_bytes;
    let dev = &c.dev;
    let ob = dev.temp(pages * 8)?;
    let args = [
        KArg::Ptr(src),
        KArg::Buf(&ob),
        KArg::U64(page_bytes as u64),
        KArg::U64(pages as u64),
    ];
    let grid = (blocks_for(pages, THREADS as usize), 1, 1);
    // SAFETY: src holds pages·page_bytes bytes, out pages u64.
    unsafe { dev.launch("page_checksums", grid, (THREADS, 1, 1), &args)? };
    let mut raw = vec![0u8; pages * 8];
    dev.download(&ob, &mut raw)?;
    Ok(raw
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .collect())
}
