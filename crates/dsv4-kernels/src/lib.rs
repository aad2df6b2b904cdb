//! dsv4-kernels: the op set every backend implements (the [`Backend`] trait), the weight types the
//! ops consume ([`Linear`]), RoPE frequency tables, and the backend registry (`inventory`).

pub mod attention_device;
pub mod backend;
pub mod cache_format;
pub mod device;
pub mod device_check;
pub mod error;
pub mod host_device;
pub mod linear;
pub mod mhc;
pub mod moe_device;
pub mod operands;
pub mod page_tag;
pub mod per_row;
pub mod registry;
pub mod rope;
pub mod row_check;

pub use attention_device::{PagedAttention, PagedIndexer};
pub use backend::{Backend, HcParams, MhcPre};
pub use cache_format::RowFormat;
pub use device::{Copy2d, DevBufId, DevSlice, DeviceOps, DeviceStats, DeviceStreams};
pub use error::KernelError;
pub use host_device::HostResident;
pub use linear::{Linear, WeightFormat, WeightKey};
pub use moe_device::{RouteChoice, RoutedExperts};
pub use operands::{AttentionRows, IndexerRows};
pub use page_tag::{EntryOrigin, PageTag};
pub use per_row::PerRow;
pub use registry::{BackendFactory, BackendOptions};
pub use rope::RopeTable;
