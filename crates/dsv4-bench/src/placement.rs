//! The placement A/B of `dsv4 bench`: a device backend that routes or attends on its device,
//! against siblings of itself with one of those paths back on the host (`backend.cuda_routing`,
//! `backend.cuda_attention` = "host"), on the same batch-16 captured decode, measured back to
//! back, so what each on-device path saves is a ratio from one run and not two runs' difference.

use crate::e2e::{CAPTURED, decode_mode, push_traffic};
use dsv4_core::{Numerics, Tensor};
use dsv4_kernels::registry::BackendOptions;
use dsv4_kernels::{Backend, KernelError};
use dsv4_model::{Model, ModelConfig};
use std::collections::HashMap;
use std::sync::Arc;

/// A sibling of a device backend with one of its on-device paths on the host.
pub struct Sibling {
    /// What runs on the host in it ("host attention", "host routing").
    pub label: &'static str,
    /// The path the sibling turns off, as the speedup row names it ("attention on device").
    pub path: &'static str,
    /// The sibling: the same backend kind and options, less that path.
    pub backend: Arc<dyn Backend>,
}

/// The siblings of `backend` (created with `opts`): one per on-device path its device takes
/// (routing, attention), each made by `create` from `opts` with that path turned off. A
/// sibling `create` refuses (an environment variable pinning the path on the device) is left
/// out, and the reason is the second list's line for it.
pub fn siblings(
    backend: &dyn Backend,
    opts: &BackendOptions,
    create: impl Fn(&BackendOptions) -> Result<Arc<dyn Backend>, KernelError>,
) -> (Vec<Sibling>, Vec<String>) {
    let Some(dev) = backend.device() else {
        return (Vec::new(), Vec::new());
    };
    let mut wanted = Vec::new();
    if dev.routes_on_device() {
        let o = BackendOptions {
            device_routing: Some(false),
            ..opts.clone()
        };
        wanted.push(("host routing", "routing on device", o));
    }
    if dev.attends_on_device() {
        let o = BackendOptions {
            device_attention: Some(false),
            ..opts.clone()
        };
        wanted.push(("host attention", "attention on device", o));
    }
    let (mut made, mut skipped) = (Vec::new(), Vec::new());
    for (label, path, o) in wanted {
        match create(&o) {
            Ok(backend) => made.push(Sibling {
                label,
                path,
                backend,
            }),
            Err(e) => skipped.push(format!(
                "{} {label} sibling not measured: {e}",
                backend.name()
            )),
        }
    }
    (made, skipped)
}

/// What a bench row is pushed with: metric, value, unit.
pub type Push<'a> = dyn FnMut(String, f64, &'static str) + 'a;

/// Batch-16 captured decode after `prompt_len`-token prompts on `model` (the backend as
/// configured), `e2e::MODE_STEPS` steps, then the same on each sibling loaded with the
/// same config and weights: each rate and traffic per step, and each path's speedup (the
/// configured rate over the sibling's), as rows through `push`. Nothing is measured without
/// siblings.
pub fn run(
    model: &Model,
    (cfg, tensors): (&ModelConfig, &HashMap<String, Tensor>),
    siblings: &[Sibling],
    prompt_len: usize,
    push: &mut Push<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    if siblings.is_empty() {
        return Ok(());
    }
    let (base, traffic) = decode_mode(model, prompt_len, CAPTURED)?;
    push(
        "decode batch 16, captured, as configured".into(),
        base,
        "tokens/s",
    );
    push_traffic(push, "as configured", &traffic);
    for s in siblings {
        let m = Model::load(cfg.clone(), tensors, s.backend.clone(), Numerics::default())?;
        let (rate, traffic) = decode_mode(&m, prompt_len, CAPTURED)?;
        push(
            format!("decode batch 16, captured, {}", s.label),
            rate,
            "tokens/s",
        );
        push_traffic(push, s.label, &traffic);
        push(format!("  {}: speedup", s.path), base / rate, "x");
    }
    Ok(())
}
