//! The op wrappers: check operand sizes, upload inputs, launch the kernels of `kernels/*.cu`,
//! read results back (the `launch_*` functions are what the device-resident ops of `resident/`
//! call on their own buffers). One file per kernel file, and `paged_attention.rs` for the
//! attention kernels' paged callers.

pub mod attention;
pub mod cache;
pub mod checksum;
pub mod decode_shape;
pub mod indexer;
pub mod linear;
pub mod mhc;
pub mod moe;
pub mod page_cache;
pub mod paged_attention;
pub mod resident;
pub mod rows;
