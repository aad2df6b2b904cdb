//! Device-resident execution on CPU: the tiny model on `HostResident` (the reference backend
//! behind a device op set whose buffers live in host memory) keeps its activations "on the
//! device" and must give bitwise what the same model gives through host slices — prefill,
//! decode, batches, captured replays, side streams, the threaded executor, taps and MTP — while
//! reading back only at the launches that touch host state, and leaking no device buffer.

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{Numerics, SplitMix64};
use dsv4_kernels::{Backend, HostResident};
use dsv4_model::forward::{ExecOptions, Executor, ForwardOutput, SequenceState, StepReport, Taps};
use dsv4_model::{LogitRows, Model, ModelConfig, ModelSource, load_model};
use std::sync::Arc;

fn model(backend: Arc<dyn Backend>, numerics: Numerics) -> Model {
    load_model(&ModelSource::Tiny { seed: 3 }, backend, numerics).expect("tiny model loads")
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 2 + g.below(380) as u32).collect()
}

/// The reference backend behind a host-memory device op set, routing and attending on that
/// device (`on`) or not.
fn device(on: bool) -> HostResident {
    let d = HostResident::new(Arc::new(ReferenceBackend));
    if on {
        d.with_device_routing().with_device_attention()
    } else {
        d
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Two sequences: prefills of 24 and 9 tokens in one step, then `decode` batched decode steps.
/// Returns every step's outputs and reports.
fn session(m: &Model, exec: &ExecOptions, decode: usize) -> Vec<(Vec<ForwardOutput>, StepReport)> {
    let (mut a, mut b): (SequenceState, SequenceState) = (m.new_sequence(), m.new_sequence());
    let (pa, pb) = (tokens(24, 1), tokens(9, 2));
    let mut out = vec![
        m.forward_step(
            &mut [&mut a, &mut b],
            &[&pa, &pb],
            LogitRows::All,
            exec,
            &mut Taps::none(),
        )
        .expect("prefill step"),
    ];
    let next = tokens(2 * decode, 3);
    for s in 0..decode {
        let (ta, tb) = ([next[2 * s]], [next[2 * s + 1]]);
        out.push(
            m.forward_step(
                &mut [&mut a, &mut b],
                &[&ta, &tb],
                LogitRows::All,
                exec,
                &mut Taps::none(),
            )
            .expect("decode step"),
        );
    }
    out
}

fn assert_same(
    host: &[(Vec<ForwardOutput>, StepReport)],
    dev: &[(Vec<ForwardOutput>, StepReport)],
    what: &str,
) {
    assert_eq!(host.len(), dev.len());
    for (step, ((ho, hr), (do_, dr))) in host.iter().zip(dev).enumerate() {
        // HostResident's host ops run on the wrapped backend: the host path moves nothing.
        assert_eq!(
            hr.device.map(|d| d.reads + d.writes + d.dispatches),
            Some(0),
            "{what}: step {step}: the host path's traffic"
        );
        let stats = dr
            .device
            .unwrap_or_else(|| panic!("{what}: step {step}: no traffic count"));
        assert_eq!(hr.launches, dr.launches, "{what}: step {step}: same plan");
        assert!(
            stats.reads < dr.launches as u64 / 2,
            "{what}: step {step}: {} read-backs for {} launches — the row-wise launches must \
             stay on the device",
            stats.reads,
            dr.launches
        );
        for (s, (h, d)) in ho.iter().zip(do_).enumerate() {
            assert_eq!(
                bits(&h.logits),
                bits(&d.logits),
                "{what}: step {step} seq {s}: logits"
            );
            assert_eq!(
                bits(&h.residual),
                bits(&d.residual),
                "{what}: step {step} seq {s}: residual"
            );
            assert_eq!(
                h.topk, d.topk,
                "{what}: step {step} seq {s}: indexer selections"
            );
        }
    }
}

#[test]
fn resident_steps_equal_host_steps_bitwise_in_every_numerics_and_mode() {
    let host_exec = |e: &ExecOptions| ExecOptions {
        host_activations: true,
        ..e.clone()
    };
    let modes = [
        ("eager serial", ExecOptions::default()),
        (
            "captured",
            ExecOptions {
                captured: true,
                ..ExecOptions::default()
            },
        ),
        (
            // What `exec.executor = "auto"` runs with side streams on a CUDA backend: the
            // host-last order, a layer's host launches reading across streams in one wait.
            "captured overlap serial",
            ExecOptions {
                captured: true,
                overlap: true,
                executor: Executor::Serial,
                ..ExecOptions::default()
            },
        ),
        (
            "captured overlap interleaved",
            ExecOptions {
                captured: true,
                overlap: true,
                executor: Executor::Interleaved { seed: 9 },
                ..ExecOptions::default()
            },
        ),
        (
            "overlap threaded",
            ExecOptions {
                overlap: true,
                executor: Executor::Threaded,
                ..ExecOptions::default()
            },
        ),
    ];
    for (numerics, routing) in Numerics::all()
        .into_iter()
        .flat_map(|n| [(n, false), (n, true)])
    {
        let resident = Arc::new(device(routing));
        let m = model(resident.clone(), numerics);
        for (name, exec) in &modes {
            // The oracle runs on the same backend with activations kept in host memory.
            let host = session(&m, &host_exec(exec), 3);
            let dev = session(&m, exec, 3);
            let what =
                format!("{numerics} {name} (routing and attention on the device: {routing})");
            assert_same(&host, &dev, &what);
            if exec.captured {
                // Replays of a captured bucket reuse its arena and scratch: no allocation.
                let last = dev.last().and_then(|(_, r)| r.device).unwrap();
                assert!(dev.last().unwrap().1.captured);
                assert_eq!(last.allocs, 0, "{what}: a replay allocated");
            }
        }
        drop(m);
        assert_eq!(
            resident.live_buffers(),
            0,
            "{numerics} (routing and attention on the device: {routing}): device buffers leaked"
        );
    }
}

#[test]
fn routed_experts_add_in_ascending_order_on_the_device_with_four_per_token() {
    // The device form runs every routed expert of a layer in grouped launches and then adds
    // each expert's rows into the output in ascending expert order, as the host form sums
    // them. With two experts per token (the tiny config) any order gives the same bits
    // (0 + a + b = 0 + b + a); with four it does not, so this config checks the order.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ModelConfig::tiny();
    cfg.num_experts_per_tok = 4;
    dsv4_model::tiny::init_random(dir.path(), &cfg, 5).expect("write the checkpoint");
    for routing in [false, true] {
        let m = load_model(
            &ModelSource::Dir(dir.path().to_path_buf()),
            Arc::new(device(routing)),
            Numerics::default(),
        )
        .expect("the checkpoint loads");
        assert_eq!(m.cfg.num_experts_per_tok, 4);
        let exec = ExecOptions::default();
        let host = session(
            &m,
            &ExecOptions {
                host_activations: true,
                ..exec.clone()
            },
            2,
        );
        let dev = session(&m, &exec, 2);
        let what =
            format!("four experts per token (routing and attention on the device: {routing})");
        assert_same(&host, &dev, &what);
    }
}

#[test]
fn resident_path_equals_the_plain_reference_backend() {
    // Not only the host path of the wrapper: the reference backend itself.
    let numerics = Numerics::default();
    let plain = model(Arc::new(ReferenceBackend), numerics);
    let resident = model(
        Arc::new(HostResident::new(Arc::new(ReferenceBackend))),
        numerics,
    );
    let exec = ExecOptions::default();
    let (p, r) = (session(&plain, &exec, 2), session(&resident, &exec, 2));
    for ((po, pr), (ro, rr)) in p.iter().zip(&r) {
        assert!(
            pr.device.is_none(),
            "a host backend counts no device traffic"
        );
        assert!(rr.device.is_some());
        for (a, b) in po.iter().zip(ro) {
            assert_eq!(bits(&a.logits), bits(&b.logits));
        }
    }
}

#[test]
fn taps_and_mtp_read_the_same_values_from_the_device() {
    let numerics = Numerics::default();
    let host = model(Arc::new(ReferenceBackend), numerics);
    let toks = tokens(20, 5);
    let collect = |m: &Model| {
        let mut seen: Vec<(String, String, Vec<u32>)> = Vec::new();
        let mut f = |l: &str, op: &str, v: &[f32]| seen.push((l.into(), op.into(), bits(v)));
        let mut st = m.new_sequence();
        let out = m
            .forward_with_taps(&mut st, &toks, &mut Taps::new(&mut f))
            .expect("prefill with taps");
        let mut mtp = m.new_mtp_state().expect("the tiny model has an MTP layer");
        let draft = m
            .mtp_forward(&mut mtp, &out.residual, &tokens(20, 6))
            .expect("MTP draft");
        (seen, bits(&draft))
    };
    let h = collect(&host);
    assert!(!h.0.is_empty());
    for routing in [false, true] {
        let d = collect(&model(Arc::new(device(routing)), numerics));
        assert_eq!(
            h.0.len(),
            d.0.len(),
            "same taps (routing and attention on the device: {routing})"
        );
        for (a, b) in h.0.iter().zip(&d.0) {
            assert_eq!(
                a, b,
                "tap {} {} (routing and attention on the device: {routing})",
                a.0, a.1
            );
        }
        assert_eq!(
            h.1, d.1,
            "MTP draft logits (routing and attention on the device: {routing})"
        );
    }
}

#[test]
fn a_refused_step_on_the_device_changes_nothing_and_leaks_nothing() {
    let resident = Arc::new(HostResident::new(Arc::new(ReferenceBackend)));
    let m = model(resident.clone(), Numerics::default());
    let mut st = m.new_sequence();
    let bad = [5u32, u32::MAX];
    let e = m
        .forward_step(
            &mut [&mut st],
            &[&bad],
            LogitRows::All,
            &ExecOptions::default(),
            &mut Taps::none(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    assert_eq!(st.pos, 0);
    assert_eq!(resident.live_buffers(), 0);
}

#[test]
fn selections_scattered_over_many_pages_attend_as_on_the_plain_backend() {
    // At 300 tokens a ratio-4 layer holds 75 compressed entries on two 64-entry pages, and a
    // token's 16 selected entries sit on both: the device path packs them into one page
    // before the attention call. Its bits must be the plain backend's.
    let numerics = Numerics::default();
    let plain = model(Arc::new(ReferenceBackend), numerics);
    let run = |m: &Model| {
        let mut s = m.new_sequence();
        let mut outs = vec![m.forward(&mut s, &tokens(300, 21)).expect("prefill")];
        for t in tokens(2, 22) {
            outs.push(m.forward(&mut s, &[t]).expect("decode"));
        }
        outs
    };
    let p = run(&plain);
    // Attending from host copies, and on the device (the packed page's entries named by
    // their origins in the device call).
    for on in [false, true] {
        let r = run(&model(Arc::new(device(on)), numerics));
        assert_scattered_selections_match(&p, &r, on);
    }
}

fn assert_scattered_selections_match(p: &[ForwardOutput], r: &[ForwardOutput], on: bool) {
    let last = &r.last().unwrap().topk;
    assert!(
        last.values()
            .flatten()
            .any(|sel| sel.iter().any(|&i| i < 64) && sel.iter().any(|&i| i >= 64)),
        "no decode selection spans two pages: {last:?}"
    );
    for (step, (a, b)) in p.iter().zip(r).enumerate() {
        assert_eq!(
            bits(&a.logits),
            bits(&b.logits),
            "step {step} (attention on the device: {on}): logits"
        );
        assert_eq!(
            a.topk, b.topk,
            "step {step} (attention on the device: {on}): selections"
        );
    }
}

#[test]
fn a_decode_layer_waits_for_the_device_once_for_its_cache_launches_and_once_for_its_router() {
    // The serial executor runs a layer's host launches (SWA store, pooling, top-k, attention)
    // back to back after the projections they do not depend on, and reads all their operands
    // back in one wait; the router reads its scores back in another; the step's end reads its
    // two results (logits, final residual) back in one more. The values are the plan order's
    // (the test above). In the plan's own order each host launch waits on its own.
    let layers = ModelConfig::tiny().num_hidden_layers as u64;
    assert_decode_waits(device(false), "host routing", |_| 2 * layers + 1);
}

#[test]
fn routing_on_the_device_leaves_one_wait_a_decode_layer() {
    // Where the device routes, the router's scores stay there: the routes are computed on the
    // device (the hash layer's experts looked up from the token ids' host copy) and the routed
    // experts group their rows there. Only the cache launches' wait is left per layer.
    let layers = ModelConfig::tiny().num_hidden_layers as u64;
    let d = HostResident::new(Arc::new(ReferenceBackend)).with_device_routing();
    assert_decode_waits(d, "device routing", |_| layers + 1);
}

#[test]
fn the_attention_side_on_the_device_waits_for_what_it_reads_back_alone() {
    // Where the device attends, attention waits for nothing. A layer's host launches read
    // their operands back in one wait, and the SWA store's entries, encoded on the device,
    // come back in it (a ratio-0 layer reads nothing else); the indexer waits for its chosen
    // ids, and a compressor whose window completes for its encoded entries. This host
    // device's host ops needed neither of the last two waits (a GPU's host ops had each, and
    // more for the compressor's pooling, norm and RoPE, and one for the SWA encoding). In the
    // session's third decode step a window of 4 completes (position 11), on both chains of
    // each ratio-4 layer.
    let cfg = ModelConfig::tiny();
    let layers = cfg.num_hidden_layers as u64;
    let indexed = (0..cfg.num_hidden_layers)
        .filter(|&l| cfg.compress_ratio(l) == 4)
        .count() as u64;
    let base = layers + indexed + 1;
    assert_decode_waits(device(true), "device routing and attention", |step| {
        if step == 3 { base + 2 * indexed } else { base }
    });
}

#[test]
fn attention_on_the_device_moves_no_queries_and_no_output() {
    // Where the device attends, a layer's queries stay on the device and its output is
    // written there; the indexer's queries and head weights stay there too (only its chosen
    // ids come back); and the SWA rows are encoded there (only their entries come back). In
    // the session's first two decode steps no compressor window completes, so each step reads
    // back exactly that much less, and writes one attention output per layer less.
    let cfg = ModelConfig::tiny();
    let run = |attend: bool| {
        let d = HostResident::new(Arc::new(ReferenceBackend)).with_device_routing();
        let d = if attend { d.with_device_attention() } else { d };
        let m = model(Arc::new(d), Numerics::default());
        let entry = m.kv_layout().entry_bytes() as u64;
        (session(&m, &ExecOptions::default(), 2), entry)
    };
    let ((host, _), (dev, entry)) = (run(false), run(true));
    let (rows, f) = (2u64, 4u64);
    let attn = rows * (cfg.num_attention_heads * cfg.head_dim) as u64 * f;
    let index = rows * (cfg.index_n_heads * (cfg.index_head_dim + 1)) as u64 * f;
    let swa = rows * (cfg.head_dim as u64 * f - entry);
    for (step, ((ho, h), (do_, d))) in host.iter().zip(&dev).enumerate() {
        for (a, b) in ho.iter().zip(do_) {
            assert_eq!(bits(&a.logits), bits(&b.logits), "step {step}: logits");
        }
        if step == 0 {
            continue;
        }
        // The session's two sequences decode at positions 24 and 9 on, one a step: no window
        // of 4 completes at 24, 25, 9 or 10.
        let ids: u64 = [24 + step - 1, 9 + step - 1]
            .iter()
            .map(|p| ((p + 1) / 4).min(cfg.index_topk) as u64 * f)
            .sum();
        let layers = cfg.num_hidden_layers as u64;
        let indexed = (0..cfg.num_hidden_layers)
            .filter(|&l| cfg.compress_ratio(l) == 4)
            .count() as u64;
        assert!(indexed > 0, "the tiny model has indexer layers");
        let (h, d) = (h.device.unwrap(), d.device.unwrap());
        assert_eq!(
            h.read_bytes - d.read_bytes,
            layers * (attn + swa) + indexed * (index - ids),
            "decode step {step}: bytes read back"
        );
        assert_eq!(
            h.write_bytes - d.write_bytes,
            layers * attn,
            "decode step {step}: bytes written"
        );
    }
}

/// Every decode step s of a session on `d`, eager, captured, and captured with side streams
/// on the serial executor, waits for the device `want(s)` times (`what` names the device's
/// ops). With side streams a layer's host launches are on four streams (the KV, compressor,
/// indexer and main streams), yet wait once together: issued by one thread, every launch
/// before them has been issued, and the read waits for every stream.
fn assert_decode_waits(d: HostResident, what: &str, want: impl Fn(usize) -> u64) {
    let m = model(Arc::new(d), Numerics::all()[0]);
    let captured = ExecOptions {
        captured: true,
        ..ExecOptions::default()
    };
    for (name, exec) in [
        ("eager", ExecOptions::default()),
        ("captured", captured.clone()),
        (
            "captured with side streams",
            ExecOptions {
                overlap: true,
                executor: Executor::Serial,
                ..captured
            },
        ),
    ] {
        let steps = session(&m, &exec, 3);
        for (step, (_, report)) in steps.iter().enumerate().skip(1) {
            assert_eq!(
                report.device.map(|d| d.submissions),
                Some(want(step)),
                "{name}: decode step {step} ({what}): waits for the device"
            );
        }
    }
}

#[test]
fn routing_on_the_device_reports_and_follows_the_choices_as_the_host_does() {
    // The router's own choice read back when the call records it; pinned experts given to the
    // device as fixed, beside the recorded own choice: the plain backend's bits and choices.
    use dsv4_model::forward::ChoiceControl;
    let numerics = Numerics::default();
    let plain = model(Arc::new(ReferenceBackend), numerics);
    let dev = model(Arc::new(device(true)), numerics);
    let toks = tokens(24, 8);
    let run = |m: &Model, control: ChoiceControl<'_>| {
        let mut st = m.new_sequence();
        m.forward_with_taps(&mut st, &toks, &mut Taps::none().with_choices(control))
            .expect("prefill")
    };
    let record = ChoiceControl {
        record_experts: true,
        ..ChoiceControl::default()
    };
    let (p, d) = (run(&plain, record), run(&dev, record));
    assert_eq!(bits(&p.logits), bits(&d.logits));
    assert_eq!(p.experts, d.experts, "recorded choices");
    assert_eq!(d.experts.keys().count(), 3, "the biased-routing layers");
    // Layer 2 steered to experts it did not choose.
    let (e, k) = (plain.cfg.n_routed_experts, plain.cfg.num_experts_per_tok);
    let away: Vec<Vec<u32>> = p.experts[&2]
        .iter()
        .map(|c| (0..e as u32).filter(|j| !c.contains(j)).take(k).collect())
        .collect();
    let pins = std::collections::BTreeMap::from([(2usize, away)]);
    let steer = ChoiceControl {
        pinned_experts: Some(&pins),
        ..record
    };
    let (ps, ds) = (run(&plain, steer), run(&dev, steer));
    assert_ne!(
        bits(&ps.logits),
        bits(&p.logits),
        "the pins change the logits"
    );
    assert_eq!(bits(&ps.logits), bits(&ds.logits));
    assert_eq!(ps.experts, ds.experts, "the own choice is still reported");
    // Pins the step cannot use are the host's errors.
    let short = std::collections::BTreeMap::from([(2usize, vec![vec![0u32; k]; 3])]);
    let bad = ChoiceControl {
        pinned_experts: Some(&short),
        ..ChoiceControl::default()
    };
    let mut st = dev.new_sequence();
    let err = dev
        .forward_with_taps(&mut st, &toks, &mut Taps::none().with_choices(bad))
        .unwrap_err();
    assert!(
        err.to_string().contains("pinned experts cover 3 tokens"),
        "{err}"
    );
}
