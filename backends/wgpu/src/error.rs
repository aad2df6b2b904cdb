//! Errors of the wgpu backend.

/// Why the wgpu backend cannot run, or cannot hold something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WgpuError {
    /// wgpu found no adapter at all.
    #[error(
        "no wgpu adapter found (no Vulkan/Metal/DX12/GL driver); on Debian/Ubuntu install Mesa's lavapipe with `apt-get install mesa-vulkan-drivers libvulkan1`"
    )]
    NoAdapter,
    /// `backend.device` matched no adapter.
    #[error("no wgpu adapter matches backend.device = `{selector}` (adapters: {known})")]
    NoSuchAdapter {
        /// The selector given.
        selector: String,
        /// The adapters found, as "index: name".
        known: String,
    },
    /// The adapter refused to open a device.
    #[error("wgpu could not open a device: {0}")]
    Device(String),
    /// Something does not fit the device's limits.
    #[error("{what}; the model does not fit this device")]
    TooLarge {
        /// What, with sizes.
        what: String,
    },
}
