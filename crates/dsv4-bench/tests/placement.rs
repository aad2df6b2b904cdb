//! The placement A/B (`dsv4_bench::placement`): which siblings a device backend gets, and the
//! rows measuring it against them in one run (no timing is asserted; the traffic is).

use dsv4_backend_reference::ReferenceBackend;
use dsv4_bench::e2e;
use dsv4_bench::placement::{self, Sibling};
use dsv4_core::Numerics;
use dsv4_kernels::{Backend, BackendOptions, HostResident, KernelError};
use dsv4_model::Model;
use std::sync::{Arc, Mutex};

fn reference() -> Arc<dyn Backend> {
    Arc::new(ReferenceBackend)
}

/// A host-resident reference backend with routing and attention on its device as `opts` say
/// (None: on).
fn resident(opts: &BackendOptions) -> Arc<dyn Backend> {
    let mut b = HostResident::new(reference());
    if opts.device_routing != Some(false) {
        b = b.with_device_routing();
    }
    if opts.device_attention != Some(false) {
        b = b.with_device_attention();
    }
    Arc::new(b)
}

#[test]
fn each_on_device_path_gets_a_sibling_with_only_that_path_on_the_host() {
    let opts = BackendOptions {
        threads: 3,
        page_cache_mib: Some(7),
        ..Default::default()
    };
    let asked = Mutex::new(Vec::new());
    let create = |o: &BackendOptions| {
        asked.lock().unwrap().push(o.clone());
        Ok(resident(o))
    };
    let (made, skipped) = placement::siblings(resident(&opts).as_ref(), &opts, create);
    assert!(skipped.is_empty(), "{skipped:?}");
    let labels: Vec<_> = made.iter().map(|s| (s.label, s.path)).collect();
    assert_eq!(
        labels,
        [
            ("host routing", "routing on device"),
            ("host attention", "attention on device")
        ]
    );
    // Each made with the caller's options, less its own path.
    let asked = asked.into_inner().unwrap();
    let less = |routing, attention| BackendOptions {
        device_routing: routing,
        device_attention: attention,
        ..opts.clone()
    };
    assert_eq!(asked, [less(Some(false), None), less(None, Some(false))]);
    let dev = |s: &Sibling| {
        let d = s.backend.device().expect("a device");
        (d.routes_on_device(), d.attends_on_device())
    };
    assert_eq!(dev(&made[0]), (false, true));
    assert_eq!(dev(&made[1]), (true, false));

    // A device with neither path, or no device, has none to measure against.
    let plain = Arc::new(HostResident::new(reference()));
    for b in [plain as Arc<dyn Backend>, reference()] {
        let (made, skipped) = placement::siblings(b.as_ref(), &opts, |_| {
            panic!("{} has no on-device path to turn off", b.name())
        });
        assert!(made.is_empty() && skipped.is_empty());
    }
}

#[test]
fn a_sibling_the_backend_refuses_is_reported_and_the_others_are_kept() {
    let opts = BackendOptions::default();
    let create = |o: &BackendOptions| {
        if o.device_attention == Some(false) {
            Err(KernelError::Device {
                message: "backend.cuda_attention = host but DSV4_CUDA_ATTENTION=device".into(),
            })
        } else {
            Ok(resident(o))
        }
    };
    let (made, skipped) = placement::siblings(resident(&opts).as_ref(), &opts, create);
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].label, "host routing");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("host attention sibling not measured")
            && skipped[0].contains("but DSV4_CUDA_ATTENTION=device"),
        "{skipped:?}"
    );
}

#[test]
fn the_configured_backend_is_measured_against_its_sibling_in_one_run() {
    let cfg = e2e::config("tiny").unwrap();
    let tensors = e2e::weights(&cfg).unwrap();
    let opts = BackendOptions::default();
    let model = Model::load(cfg.clone(), &tensors, resident(&opts), Numerics::default()).unwrap();
    let host_attention = BackendOptions {
        device_attention: Some(false),
        ..opts
    };
    let sibling = Sibling {
        label: "host attention",
        path: "attention on device",
        backend: resident(&host_attention),
    };
    let mut rows = Vec::new();
    let mut measure = |siblings: &[Sibling]| {
        let mut push = |metric: String, value: f64, _unit: &'static str| rows.push((metric, value));
        placement::run(&model, (&cfg, &tensors), siblings, 8, &mut push).unwrap();
    };
    // No sibling: nothing is measured.
    measure(&[]);
    measure(&[sibling]);
    assert!(
        !rows.is_empty() && rows[0].0 == "decode batch 16, captured, as configured",
        "no rows without a sibling, the configured backend's first with one: {rows:?}"
    );
    let row = |m: &str| {
        rows.iter()
            .find(|(metric, _)| metric == m)
            .unwrap_or_else(|| panic!("no row `{m}` in {rows:?}"))
            .1
    };
    let base = row("decode batch 16, captured, as configured");
    let host = row("decode batch 16, captured, host attention");
    assert!(base > 0.0 && host > 0.0, "{rows:?}");
    assert_eq!(row("  attention on device: speedup"), base / host);
    // The two runs took different paths: attention from host copies reads its queries (and
    // every other operand of the layer's attention) back.
    let back = |who: &str| row(&format!("  {who}: KiB read back/step (mean)"));
    assert!(back("host attention") > back("as configured"), "{rows:?}");
}

#[test]
fn a_device_backends_end_to_end_rows_compare_its_modes_within_the_run() {
    let cfg = e2e::config("tiny").unwrap();
    let tensors = e2e::weights(&cfg).unwrap();
    let opts = BackendOptions::default();
    let sibling = Sibling {
        label: "host attention",
        path: "attention on device",
        backend: resident(&BackendOptions {
            device_attention: Some(false),
            ..opts.clone()
        }),
    };
    let plan = e2e::E2ePlan {
        configs: vec!["tiny".into()],
        prefill_tokens: 8,
        contexts: Vec::new(),
    };
    let (rows, _) = e2e::run(
        resident(&opts),
        "tiny",
        &cfg,
        &tensors,
        &plan,
        false,
        &[sibling],
    )
    .unwrap();
    let row = |m: &str| {
        rows.iter()
            .find(|r| r.metric == m)
            .unwrap_or_else(|| panic!("no row `{m}` in {rows:?}"))
            .value
    };
    let (one, side) = (
        row("decode batch 16, captured"),
        row("decode batch 16, captured, side streams"),
    );
    assert_eq!(row("  side streams: speedup over one stream"), side / one);
    // With side streams a layer's host launches, on four streams, still wait once together.
    assert_eq!(
        row("  captured, side streams: read-backs/step (mean)"),
        row("  captured: read-backs/step (mean)"),
    );
    // The placement A/B follows the modes.
    assert!(row("  attention on device: speedup") > 0.0);
}
