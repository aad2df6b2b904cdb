//! Errors of the op layer and the registry.

/// What went wrong creating a backend or preparing an op's inputs.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No backend of that name is registered.
    #[error("unknown backend `{name}` (registered: {known}); set [backend] kind to one of them")]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// Comma-separated registered names.
        known: String,
    },
    /// The backend is registered but cannot run on this machine.
    #[error("backend `{name}` is not available here: {reason}")]
    Unavailable {
        /// Backend name.
        name: String,
        /// Why (no GPU, no Vulkan, …).
        reason: String,
    },
    /// A weight's bytes do not match its declared format and shape.
    #[error("weight `{name}`: {what}")]
    BadWeight {
        /// Tensor name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// A device-resident op failed or was given inconsistent buffers.
    #[error("device: {message}")]
    Device {
        /// What went wrong.
        message: String,
    },
}
