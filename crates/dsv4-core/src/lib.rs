//! dsv4-core: the host tensor type, dtypes, the number codecs every other crate shares
//! (bf16, f16, e4m3, ue8m0, e2m1), a deterministic random generator, RFC 3339 time and the
//! shared error type.

pub mod cache;
pub mod codec;
pub mod dtype;
pub mod error;
pub mod numerics;
pub mod quant;
pub mod rng;
pub mod sys;
pub mod tensor;
pub mod time;

pub use dtype::DType;
pub use error::CoreError;
pub use numerics::{ActQuant, IndexKDtype, KvCacheDtype, Numerics};
pub use rng::SplitMix64;
pub use tensor::Tensor;
