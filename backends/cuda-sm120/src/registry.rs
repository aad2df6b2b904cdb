//! The backend registry entries of this crate: `cuda-sm120` (the kernels on an NVIDIA GPU through
//! the CUDA driver) and `cuda-emu` (the same kernels on the CPU emulator, for tests).

use crate::ops::page_cache::{PAGE_CACHE_ENV, mib_bytes, mib_from_env};
use crate::{CudaBackend, CudaError, DECODE_ENV, DecodeShapes, EMU_NAME, LinearPath, NAME, emu};
use dsv4_kernels::{Backend, BackendFactory, BackendOptions, KernelError};
use std::sync::Arc;

/// Environment variable choosing the accumulation type of the kernels: `f64` or `f32`, as
/// `backend.cuda_sums` does in a profile. The GPU default is f64 on devices with full-rate FP64
/// (sm_80, sm_90, sm_100), f32 elsewhere; the emulator's default is f64.
pub(crate) const ACC_ENV: &str = "DSV4_CUDA_ACC";

/// What the backend knob in environment variable `var` asks for, read by `parse` from its
/// trimmed value: None when it is unset or empty, and a value `parse` rejects is an error
/// naming the variable and the value (`DSV4_CUDA_ACC=f16: expected f64 or f32`).
pub(crate) fn env_knob<T>(
    var: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, CudaError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => parse(v.trim())
            .map(Some)
            .map_err(|e| CudaError::BadOperands(format!("{var}={}: {e}", v.trim()))),
    }
}

/// The accumulation `DSV4_CUDA_ACC` asks for (true = f64), None when unset.
pub(crate) fn acc_override() -> Result<Option<bool>, CudaError> {
    env_knob(ACC_ENV, |v| match v {
        "f64" => Ok(true),
        "f32" => Ok(false),
        _ => Err("expected f64 or f32".to_string()),
    })
}

/// Environment variable choosing where a MoE layer is routed: `device` (the default) or `host`,
/// as `backend.cuda_routing` does in a profile.
pub(crate) const ROUTING_ENV: &str = "DSV4_CUDA_ROUTING";
/// Environment variable choosing where attention reads its queries and writes its output:
/// `device` (the default) or `host`, as `backend.cuda_attention` does in a profile.
pub(crate) const ATTENTION_ENV: &str = "DSV4_CUDA_ATTENTION";

/// What a `device`/`host` variable `env` asks for (true = on the device), None when unset.
fn placement_override(env: &str) -> Result<Option<bool>, CudaError> {
    env_knob(env, |v| match v {
        "device" => Ok(true),
        "host" => Ok(false),
        _ => Err("expected device or host".to_string()),
    })
}

fn placement_name(on_device: bool) -> &'static str {
    if on_device { "device" } else { "host" }
}

/// Whether a part of the step with a device form runs it: the profile's `key` (`chosen`) or
/// the variable `env`, which must agree when both are set, else on the device.
fn placement_choice(key: &str, chosen: Option<bool>, env: &str) -> Result<bool, CudaError> {
    let chosen = agree(key, chosen, env, placement_override(env)?, placement_name)?;
    Ok(chosen.unwrap_or(true))
}

/// Whether the backend routes on the device: `backend.cuda_routing` (`opts.device_routing`)
/// or `DSV4_CUDA_ROUTING`, else on the device.
pub(crate) fn routing_choice(opts: &BackendOptions) -> Result<bool, CudaError> {
    placement_choice("backend.cuda_routing", opts.device_routing, ROUTING_ENV)
}

/// Whether the backend attends on device-resident queries: `backend.cuda_attention`
/// (`opts.device_attention`) or `DSV4_CUDA_ATTENTION`, else on the device.
pub(crate) fn attention_choice(opts: &BackendOptions) -> Result<bool, CudaError> {
    placement_choice(
        "backend.cuda_attention",
        opts.device_attention,
        ATTENTION_ENV,
    )
}

/// Environment variable choosing the linear kernels: `simt` (the default) or `mma` (tensor
/// cores, sm_80+; see [`LinearPath`]), as `backend.cuda_linear` does in a profile.
pub(crate) const LINEAR_ENV: &str = "DSV4_CUDA_LINEAR";

/// The linear kernels `DSV4_CUDA_LINEAR` asks for, None when unset.
fn linear_override() -> Result<Option<LinearPath>, CudaError> {
    env_knob(LINEAR_ENV, LinearPath::parse)
}

/// A knob set by the profile (`key`) or by an environment variable (`var`): whichever is set;
/// both set must agree, since a run has one resolved configuration.
fn agree<T: PartialEq + Copy, N: std::fmt::Display>(
    key: &str,
    profile: Option<T>,
    var: &str,
    env: Option<T>,
    name: fn(T) -> N,
) -> Result<Option<T>, CudaError> {
    match (profile, env) {
        (Some(p), Some(e)) if p != e => Err(CudaError::BadOperands(format!(
            "{key} = {} but {var}={}: unset one of them or make them agree",
            name(p),
            name(e)
        ))),
        (Some(p), _) => Ok(Some(p)),
        (None, e) => Ok(e),
    }
}

fn sums_name(f64_sums: bool) -> &'static str {
    if f64_sums { "f64" } else { "f32" }
}

/// The sums the backend runs with, when asked for: `backend.cuda_sums` (`opts.f64_sums`) or
/// `DSV4_CUDA_ACC`; None leaves the choice to the device.
pub(crate) fn sums_choice(opts: &BackendOptions) -> Result<Option<bool>, CudaError> {
    agree(
        "backend.cuda_sums",
        opts.f64_sums,
        ACC_ENV,
        acc_override()?,
        sums_name,
    )
}

/// The linear kernels the backend runs: `backend.cuda_linear` (`opts.tensor_core_linears`) or
/// `DSV4_CUDA_LINEAR`, else SIMT.
pub(crate) fn linear_choice(opts: &BackendOptions) -> Result<LinearPath, CudaError> {
    let profile = opts.tensor_core_linears.map(|on| {
        if on {
            LinearPath::Mma
        } else {
            LinearPath::Simt
        }
    });
    let chosen = agree(
        "backend.cuda_linear",
        profile,
        LINEAR_ENV,
        linear_override()?,
        LinearPath::name,
    )?;
    Ok(chosen.unwrap_or_default())
}

/// The MiB of each page arena, when asked for: `backend.cuda_page_cache_mib`
/// (`opts.page_cache_mib`) or `DSV4_CUDA_PAGE_CACHE_MIB`; None leaves the backend's default.
pub(crate) fn page_cache_choice(opts: &BackendOptions) -> Result<Option<u64>, CudaError> {
    agree(
        "backend.cuda_page_cache_mib",
        opts.page_cache_mib,
        PAGE_CACHE_ENV,
        mib_from_env()?,
        |mib| mib,
    )
}

/// The one-row linear kernels' shapes: `backend.cuda_decode` (`opts.decode_shapes`) or
/// `DSV4_CUDA_DECODE`, else the defaults.
pub(crate) fn decode_choice(opts: &BackendOptions) -> Result<DecodeShapes, CudaError> {
    let profile = match opts.decode_shapes.as_deref() {
        None => None,
        Some(spec) => Some(DecodeShapes::parse(spec).map_err(|e| {
            CudaError::BadOperands(format!("backend.cuda_decode = {}: {e}", spec.trim()))
        })?),
    };
    let chosen = agree(
        "backend.cuda_decode",
        profile,
        DECODE_ENV,
        env_knob(DECODE_ENV, DecodeShapes::parse)?,
        |s| s.describe(),
    )?;
    Ok(chosen.unwrap_or_default())
}

/// `backend` with page arenas of `mib` MiB when the profile or the environment asked for it,
/// checked when `opts` asks for it, routing where `routing_choice` says, attending where
/// `attention_choice` says, and with the decode shapes `decode_choice` says.
fn with_budget(
    backend: CudaBackend,
    mib: Option<u64>,
    opts: &BackendOptions,
) -> Result<CudaBackend, CudaError> {
    let backend = match mib {
        Some(mib) => backend.with_page_cache(mib_bytes(mib)),
        None => backend,
    };
    backend.check_page_cache(opts.check_cached_pages);
    Ok(backend
        .with_device_routing(routing_choice(opts)?)
        .with_device_attention(attention_choice(opts)?)
        .with_decode_shapes(decode_choice(opts)?))
}

fn unavailable(name: &str, e: CudaError) -> KernelError {
    KernelError::Unavailable {
        name: name.to_string(),
        reason: e.to_string(),
    }
}

/// The GPU index `opts.device` selects (default 0).
fn device_index(opts: &BackendOptions) -> Result<usize, KernelError> {
    match opts.device.as_deref().map(str::trim) {
        None | Some("") => Ok(0),
        Some(s) => s.parse().map_err(|_| KernelError::Unavailable {
            name: NAME.to_string(),
            reason: format!("device selector `{s}` is not a CUDA device index (0, 1, …)"),
        }),
    }
}

#[cfg(feature = "cuda")]
fn gpu_probe() -> Result<(), String> {
    crate::cuda::probe()
}

#[cfg(not(feature = "cuda"))]
fn gpu_probe() -> Result<(), String> {
    Err("dsv4 was built without the `cuda` feature of dsv4-backend-cuda".to_string())
}

/// The backend registered as `name` ([`NAME`] or [`EMU_NAME`]) as its concrete type, for
/// callers that need more than the `Backend` trait (the device bench of `dsv4 bench`).
pub fn open_backend(name: &str, opts: &BackendOptions) -> Result<CudaBackend, KernelError> {
    match name {
        NAME => open_gpu(opts),
        EMU_NAME => {
            let acc_f64 = sums_choice(opts)
                .map_err(|e| unavailable(EMU_NAME, e))?
                .unwrap_or(true);
            let linear = linear_choice(opts).map_err(|e| unavailable(EMU_NAME, e))?;
            let budget = page_cache_choice(opts).map_err(|e| unavailable(EMU_NAME, e))?;
            let dev = emu::open(acc_f64).map_err(|e| unavailable(EMU_NAME, e))?;
            with_budget(
                CudaBackend::with_linear(EMU_NAME, dev, linear),
                budget,
                opts,
            )
            .map_err(|e| unavailable(EMU_NAME, e))
        }
        other => Err(KernelError::UnknownBackend {
            name: other.to_string(),
            known: format!("{NAME}, {EMU_NAME}"),
        }),
    }
}

fn open_gpu(opts: &BackendOptions) -> Result<CudaBackend, KernelError> {
    let index = device_index(opts)?;
    #[cfg(feature = "cuda")]
    {
        let linear = linear_choice(opts).map_err(|e| unavailable(NAME, e))?;
        let sums = sums_choice(opts).map_err(|e| unavailable(NAME, e))?;
        let budget = page_cache_choice(opts).map_err(|e| unavailable(NAME, e))?;
        let dev = crate::cuda::open(index, sums).map_err(|e| unavailable(NAME, e))?;
        with_budget(CudaBackend::with_linear(NAME, dev, linear), budget, opts)
            .map_err(|e| unavailable(NAME, e))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = index;
        Err(unavailable(
            NAME,
            CudaError::Unavailable(gpu_probe().unwrap_err()),
        ))
    }
}

fn gpu_create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    Ok(Arc::new(open_backend(NAME, opts)?))
}

fn emu_create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    Ok(Arc::new(open_backend(EMU_NAME, opts)?))
}

inventory::submit! {
    BackendFactory {
        name: NAME,
        summary: "CUDA C++ kernels on an NVIDIA GPU (sm_80 and newer), compiled at run time by NVRTC; needs the NVIDIA driver and libnvrtc",
        probe: gpu_probe,
        create: gpu_create,
    }
}

inventory::submit! {
    BackendFactory {
        name: EMU_NAME,
        summary: "the cuda-sm120 kernels on a CPU emulator (one fiber per CUDA thread), for tests without a GPU; slow; needs a C++ compiler",
        probe: emu::probe,
        create: emu_create,
    }
}

/// Call from a binary or test so the linker keeps this crate's registry entries.
pub fn link() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knob_comes_from_the_profile_or_the_environment_and_both_must_agree() {
        let pick = |p, e| agree("backend.cuda_sums", p, ACC_ENV, e, sums_name);
        assert_eq!(pick(None, None).unwrap(), None);
        assert_eq!(pick(Some(false), None).unwrap(), Some(false));
        assert_eq!(pick(None, Some(true)).unwrap(), Some(true));
        assert_eq!(pick(Some(true), Some(true)).unwrap(), Some(true));
        let e = pick(Some(false), Some(true)).unwrap_err().to_string();
        assert!(
            e.contains("backend.cuda_sums = f32 but DSV4_CUDA_ACC=f64"),
            "{e}"
        );
        let mib = |p, e| agree("backend.cuda_page_cache_mib", p, PAGE_CACHE_ENV, e, |m| m);
        assert_eq!(mib(Some(0), Some(0)).unwrap(), Some(0));
        let e = mib(Some(512), Some(0)).unwrap_err().to_string();
        assert!(
            e.contains("backend.cuda_page_cache_mib = 512 but DSV4_CUDA_PAGE_CACHE_MIB=0"),
            "{e}"
        );
        let route = |p, e| agree("backend.cuda_routing", p, ROUTING_ENV, e, placement_name);
        let e = route(Some(false), Some(true)).unwrap_err().to_string();
        assert!(
            e.contains("backend.cuda_routing = host but DSV4_CUDA_ROUTING=device"),
            "{e}"
        );
    }
}
