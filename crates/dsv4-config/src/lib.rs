//! dsv4 profiles: the schema of the resolved configuration, figment layering (built-in defaults <
//! profile files with `extends` < `DSV4_*` environment < `--set`), the provenance of every value,
//! validation of combinations (with a capability table per backend kind), comparison of two
//! profiles, and export to an SGLang launch command.
//!
//! ```
//! use dsv4_config::{Profile, ResolveOptions};
//! let mut opts = ResolveOptions::new("reference");
//! opts.sets.push("numerics.kv_cache_dtype=fp8".into());
//! let resolved = Profile::resolve(&opts).unwrap();
//! assert_eq!(resolved.profile.numerics.kv_cache_dtype.to_string(), "fp8");
//! assert_eq!(resolved.setting("numerics.kv_cache_dtype").unwrap().origin.to_string(),
//!            "--set numerics.kv_cache_dtype=fp8");
//! ```

pub mod caps;
pub mod catalog;
pub mod compare;
pub mod error;
pub mod export;
pub mod layers;
pub mod profile;
pub mod resolve;
pub mod schema;
pub mod sections;
pub mod validate;
pub mod values;

pub use catalog::{DEFAULT_PROFILE, ProfileEntry, ProfileLocation, ProfileSearch};
pub use error::ConfigError;
pub use profile::{
    BackendSection, ExecSection, ModelSection, ModelSource, NumericsSection, Profile,
};
pub use resolve::{Origin, ResolveOptions, Resolved, Setting, assemble, resolve};
pub use sections::{CacheSection, DebugSection, DisaggSection, SchedulerSection, ServerSection};
pub use validate::{Finding, Severity};
pub use values::{
    AutoOrCount, CanaryPool, CpuSums, CudaLinear, CudaSums, DeviceOrHost, DisaggMode,
    ExecutorChoice, Fault, ReasoningParser, RequestPriority, SchedulePolicy, ToolCallParser,
};
