//! Graphs for captured plans (`DeviceOps::graphs`), on the CPU emulator, which runs a graph's
//! launches as one queued item from the launch list copied when the graph was built: a run of
//! launches that repeats is built into a graph the second time and replayed after that, each
//! replay reading the parameters staged for it (not the ones it was built with); a run that
//! differs in any launch runs launch by launch; and on the tiny model captured decode steps
//! replay graphs and give the eager plan's bits, in serial issue order and on the threaded
//! executor with overlap streams.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, emu_available, exec_modes, tiny_decode};
use dsv4_core::Numerics;
use dsv4_kernels::{Backend, DevSlice, DeviceOps};
use dsv4_model::{ModelSource, load_model};
use std::sync::Arc;

fn buffer(d: &dyn DeviceOps, words: usize) -> DevSlice {
    DevSlice::whole(d.alloc(words).expect("alloc"), words)
}

/// out = s · src[idx] + b over rows of 4 words (gather with staged indices, scale, add), read
/// back; in a graph span when `span`.
fn gather_scale_add(
    d: &dyn DeviceOps,
    bufs: [DevSlice; 4],
    idx: &[u32],
    s: f64,
    span: bool,
) -> Vec<f32> {
    let [src, dst, b, out] = bufs;
    if span {
        d.graphs(true).unwrap();
    }
    d.gather_rows(src, idx, 4, dst).unwrap();
    d.scale(dst, s).unwrap();
    d.add(dst, b, out).unwrap();
    let v = d.read(out).unwrap();
    if span {
        d.graphs(false).unwrap();
    }
    v
}

/// What [`gather_scale_add`] computes, on the host.
fn expected(src: &[f32], idx: &[u32], s: f32, b: &[f32]) -> Vec<f32> {
    idx.iter()
        .flat_map(|&r| &src[r as usize * 4..r as usize * 4 + 4])
        .zip(b)
        .map(|(x, y)| x * s + y)
        .collect()
}

#[test]
fn a_repeated_run_becomes_a_graph_whose_replays_read_their_own_parameters() {
    if !emu_available("a_repeated_run_becomes_a_graph_whose_replays_read_their_own_parameters") {
        return;
    }
    let be = backend(true);
    let d = Backend::device(&be).expect("device op set");
    let src_v: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
    let b_v: Vec<f32> = (0..12).map(|i| 100.0 + i as f32).collect();
    let bufs = [buffer(d, 16), buffer(d, 12), buffer(d, 12), buffer(d, 12)];
    d.write(bufs[0], &src_v).unwrap();
    d.write(bufs[2], &b_v).unwrap();
    let start = d.stats();
    // Each replay gathers different rows: the indices are staged per call, not baked in.
    let orders: [[u32; 3]; 5] = [[0, 1, 2], [3, 2, 1], [1, 1, 0], [2, 0, 3], [3, 3, 3]];
    for (i, idx) in orders.iter().enumerate() {
        let got = gather_scale_add(d, bufs, idx, 2.0, true);
        assert_eq!(got, expected(&src_v, idx, 2.0, &b_v), "replay {i}");
    }
    let s = d.stats().since(&start);
    assert_eq!(s.graphs_built, 1, "built the second time it ran: {s:?}");
    assert_eq!(
        s.graph_launches, 4,
        "launched from the second run on: {s:?}"
    );
    assert_eq!(s.graph_kernels, 4 * 3, "three kernels a replay: {s:?}");
    // A different scalar is a different run: launch by launch, then a graph of its own.
    let before = d.stats();
    let got = gather_scale_add(d, bufs, &orders[0], 3.0, true);
    assert_eq!(got, expected(&src_v, &orders[0], 3.0, &b_v));
    assert_eq!(d.stats().since(&before).graph_launches, 0);
    // Outside a span nothing is recorded, and the results are the same bits.
    let before = d.stats();
    let eager = gather_scale_add(d, bufs, &orders[1], 2.0, false);
    let graphed = gather_scale_add(d, bufs, &orders[1], 2.0, true);
    assert_eq!(
        eager.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        graphed.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let s = d.stats().since(&before);
    assert_eq!((s.graph_launches, s.graphs_built), (1, 0), "{s:?}");
    bufs.iter().for_each(|b| d.free(b.buf));
}

#[test]
fn closing_a_span_issues_held_work_and_an_unmatched_close_is_an_error() {
    if !emu_available("closing_a_span_issues_held_work_and_an_unmatched_close_is_an_error") {
        return;
    }
    let be = backend(true);
    let d = Backend::device(&be).expect("device op set");
    let a = buffer(d, 4);
    d.write(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    d.graphs(true).unwrap();
    d.graphs(true).unwrap();
    d.scale(a, 10.0).unwrap();
    d.scale(a, 10.0).unwrap();
    // The inner close leaves the work held; the outer one issues it.
    d.graphs(false).unwrap();
    d.graphs(false).unwrap();
    assert_eq!(d.read(a).unwrap(), [100.0, 200.0, 300.0, 400.0]);
    let e = d.graphs(false).expect_err("no span is open");
    assert!(e.to_string().contains("without an open graph span"), "{e}");
    // A buffer freed while launches on it are held stays alive until they have run.
    d.graphs(true).unwrap();
    let t = buffer(d, 4);
    d.add(a, a, t).unwrap();
    d.scale(t, 0.5).unwrap();
    d.free(t.buf);
    assert_eq!(d.read(a).unwrap(), [100.0, 200.0, 300.0, 400.0]);
    d.graphs(false).unwrap();
    d.free(a.buf);
}

#[test]
fn captured_decode_steps_replay_graphs_with_the_eager_bits() {
    if !emu_available("captured_decode_steps_replay_graphs_with_the_eager_bits") {
        return;
    }
    let be: Arc<dyn Backend> = Arc::new(backend(true));
    let m = load_model(&ModelSource::Tiny { seed: 0 }, be, Numerics::default()).unwrap();
    let [(_, eager), captured, threaded, serial] = exec_modes();
    let (want, eager_stats) = tiny_decode(&m, &eager);
    assert!(eager_stats.iter().all(|s| s.graph_launches == 0));
    for (what, exec) in [captured, threaded, serial] {
        let (bits, stats) = tiny_decode(&m, &exec);
        assert!(
            bits == want,
            "{what}: captured with graphs gives the eager bits"
        );
        let last = stats.last().unwrap();
        eprintln!(
            "{what}: the fourth decode step ran {} of {} kernels inside {} graph launches",
            last.graph_kernels, last.dispatches, last.graph_launches
        );
        assert!(
            last.graph_launches > 0 && last.graph_kernels >= 2 * last.graph_launches,
            "{what}: the fourth decode step replays graphs: {stats:?}"
        );
        // The host ops' launches (cache reads, attention, routing, top-k) use buffers of
        // their own each call, so only the resident runs between them repeat exactly.
        assert!(
            what != "captured" || last.graph_kernels * 2 > last.dispatches,
            "{what}: most of a replayed step's kernels run inside graphs: {last:?}"
        );
    }
}

#[test]
fn a_prefill_gathers_the_rows_it_needs_logits_for_on_the_device() {
    if !emu_available("a_prefill_gathers_the_rows_it_needs_logits_for_on_the_device") {
        return;
    }
    use dsv4_model::LogitRows;
    use dsv4_model::forward::Taps;
    let be: Arc<dyn Backend> = Arc::new(backend(true));
    let m = load_model(&ModelSource::Tiny { seed: 0 }, be, Numerics::default()).unwrap();
    let prompts: [Vec<u32>; 2] = [(0..16).map(|i| 3 + 7 * i).collect(), vec![9, 4, 11]];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (what, exec) in exec_modes() {
        let step = |want: LogitRows<'_>| {
            let (mut a, mut b) = (m.new_sequence(), m.new_sequence());
            let toks: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            let (outs, report) = m
                .forward_step(&mut [&mut a, &mut b], &toks, want, &exec, &mut Taps::none())
                .expect("prefill step");
            assert!(
                report.device.is_some(),
                "{what}: the activations are on the device"
            );
            outs
        };
        let all = step(LogitRows::All);
        // Two runs of rows: the first prompt's last 3, the second's last 1.
        let some = step(LogitRows::Last(&[3, 1]));
        for (s, (a, g)) in all.iter().zip(&some).enumerate() {
            let tail = &a.logits[a.logits.len() - g.logits.len()..];
            assert!(
                !g.logits.is_empty() && bits(&g.logits) == bits(tail),
                "{what}: sequence {s}: the gathered rows' logits are the every-row step's"
            );
        }
    }
}
