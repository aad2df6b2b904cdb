//! Errors of the CUDA backend and its emulator.

/// Why the CUDA backend cannot run, or why a device call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The backend cannot run on this machine (no libcuda, no GPU, built without `cuda`, no C++
    /// compiler for the emulator); the reason says what is missing and how to get it.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// NVRTC (or the emulator's C++ compiler) rejected the kernels; `log` is its output.
    #[error("compiling the kernels for {target} failed:\n{log}")]
    Compile {
        /// "sm_90", or "cuda-emu (c++)".
        target: String,
        /// The compiler's log.
        log: String,
    },
    /// A launch named a kernel the module does not have.
    #[error("no kernel named `{0}` in the compiled module")]
    NoSuchKernel(String),
    /// A copy larger than its buffer.
    #[error("{what} of {len} bytes does not fit a {bytes}-byte device buffer")]
    OutOfBounds {
        /// "write" or "download".
        what: &'static str,
        /// Bytes asked for.
        len: usize,
        /// Bytes in the buffer.
        bytes: usize,
    },
    /// Something does not fit the device.
    #[error("{what}; the model does not fit this device")]
    TooLarge {
        /// What, with sizes.
        what: String,
    },
    /// An op was called with operands it cannot take (sizes, widths).
    #[error("{0}")]
    BadOperands(String),
    /// A copy the backend keeps on the device differs from the host bytes it stands for (the
    /// page cache's check).
    #[error("{0}")]
    StaleCopy(String),
}
