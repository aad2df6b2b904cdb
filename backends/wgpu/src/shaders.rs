//! The WGSL sources: one file per op family under `src/shaders/`, each compiled together with
//! `common.wgsl` and an `acc` alias (f64 where the device has SHADER_F64, else f32).

const COMMON: &str = include_str!("shaders/common.wgsl");
const LINEAR: &str = include_str!("shaders/linear.wgsl");
const ROWS: &str = include_str!("shaders/rows.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const MHC: &str = include_str!("shaders/mhc.wgsl");
const CACHE: &str = include_str!("shaders/cache.wgsl");
const RESIDENT: &str = include_str!("shaders/resident.wgsl");

/// Every kernel: (name, source file, entry point).
pub const KERNELS: &[(&str, &str, &str)] = &[
    ("linear", LINEAR, "main"),
    ("act_quant", ROWS, "act_quant"),
    ("rms_norm", ROWS, "rms_norm"),
    ("rope", ROWS, "rope"),
    ("hadamard", ROWS, "hadamard"),
    ("router_scores", ROWS, "router_scores"),
    ("swiglu", ROWS, "swiglu"),
    ("swiglu_rows", ROWS, "swiglu_rows"),
    ("softmax_pool", ATTENTION, "softmax_pool"),
    ("indexer_scores", ATTENTION, "indexer_scores"),
    ("topk", ATTENTION, "topk"),
    ("attn_logits", ATTENTION, "attn_logits"),
    ("attn_weights", ATTENTION, "attn_weights"),
    ("attn_out", ATTENTION, "attn_out"),
    ("mhc_mix", MHC, "mhc_mix"),
    ("mhc_coef", MHC, "mhc_coef"),
    ("mhc_weighted", MHC, "mhc_weighted"),
    ("mhc_post", MHC, "mhc_post"),
    ("cache_encode", CACHE, "cache_encode"),
    ("cache_decode", CACHE, "cache_decode"),
    ("round_index", CACHE, "round_index"),
    ("copy2d", RESIDENT, "copy2d"),
    ("gather_rows", RESIDENT, "gather_rows"),
    ("scatter_add_rows", RESIDENT, "scatter_add_rows"),
    ("add", RESIDENT, "add"),
    ("scale", RESIDENT, "scale"),
];

fn find(kernel: &str) -> &'static (&'static str, &'static str, &'static str) {
    KERNELS
        .iter()
        .find(|k| k.0 == kernel)
        .unwrap_or_else(|| panic!("no WGSL kernel named {kernel}"))
}

/// The full WGSL module of `kernel`.
pub fn module_source(kernel: &str, f64_acc: bool) -> String {
    let acc = if f64_acc { "f64" } else { "f32" };
    format!("alias acc = {acc};\n{COMMON}\n{}", find(kernel).1)
}

/// The entry point of `kernel` in its module.
pub fn entry_point(kernel: &str) -> &'static str {
    find(kernel).2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module parses and validates with naga for both accumulation types (no device
    /// needed), so shader errors show up in `cargo test` on any machine.
    #[test]
    fn every_module_validates() {
        for f64_acc in [true, false] {
            for (name, _, _) in KERNELS {
                let src = module_source(name, f64_acc);
                let module = naga::front::wgsl::parse_str(&src)
                    .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
                naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    // What wgpu grants a device with SHADER_F64 and nothing else.
                    naga::valid::Capabilities::FLOAT64,
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("{name} (f64 {f64_acc}): {e:?}"));
            }
        }
    }
}
