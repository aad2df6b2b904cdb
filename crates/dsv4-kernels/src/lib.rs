//! dsv4-kernels: the op set every backend implements (the [`Backend`] trait), the weight types the
//! ops consume ([`Linear`]), RoPE frequency tables, and the backend registry (`inventory`).

pub mod backend;
pub mod cache_format;
pub mod error;
pub mod linear;
pub mod mhc;
pub mod registry;
pub mod rope;

pub use backend::{Backend, HcParams, MhcPre};
pub use cache_format::RowFormat;
pub use error::KernelError;
pub use linear::{Linear, WeightFormat, WeightKey};
pub use registry::{BackendFactory, BackendOptions};
pub use rope::RopeTable;
