//! One test per rule: a configuration that fires it (and whose message names every key the rule
//! reads) and a near miss that does not.

use super::super::{Finding, check_with};
use crate::caps::{BackendCaps, caps_of};
use crate::profile::Profile;
use crate::values::{DisaggMode, ExecutorChoice, Fault, SchedulePolicy};
use dsv4_core::numerics::{IndexKDtype, KvCacheDtype};

fn caps(kind: &str) -> &'static BackendCaps {
    caps_of(kind).unwrap()
}

/// A profile on `kind` with everything else at the defaults.
fn on(kind: &str) -> Profile {
    let mut p = Profile::default();
    p.backend.kind = kind.to_string();
    p
}

fn findings(p: &Profile) -> Vec<Finding> {
    check_with(p, caps(&p.backend.kind))
}

/// Assert that `rule` fires on `p`, naming all its keys, and return its message.
fn fires(rule: &str, p: &Profile) -> String {
    let all = findings(p);
    let f = all
        .iter()
        .find(|f| f.rule == rule)
        .unwrap_or_else(|| panic!("{rule} did not fire; got {all:?}"));
    for k in f.keys {
        assert!(
            f.message.contains(k),
            "{rule} message lacks {k}: {}",
            f.message
        );
    }
    f.message.clone()
}

fn quiet(rule: &str, p: &Profile) {
    let all = findings(p);
    assert!(all.iter().all(|f| f.rule != rule), "{rule} fired: {all:?}");
}

#[test]
fn index_k_dtype_unsupported() {
    let no_fp4 = BackendCaps {
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8],
        ..*caps("wgpu")
    };
    let mut p = on("wgpu");
    p.numerics.index_k_dtype = IndexKDtype::Fp4;
    let all = check_with(&p, &no_fp4);
    let f = all
        .iter()
        .find(|f| f.rule == "index-k-dtype-unsupported")
        .unwrap();
    let m = &f.message;
    assert!(
        m.contains("fp4") && m.contains("wgpu") && m.contains("bf16, fp8"),
        "{m}"
    );
    // Every shipped backend stores fp4 index keys.
    for kind in ["reference", "cpu", "wgpu", "cuda-sm120"] {
        p.backend.kind = kind.into();
        quiet("index-k-dtype-unsupported", &p);
    }
}

#[test]
fn kv_cache_dtype_unsupported() {
    let bf16_only = BackendCaps {
        kv_cache_dtypes: &[KvCacheDtype::Bf16],
        ..*caps("cpu")
    };
    let mut p = on("cpu");
    p.numerics.kv_cache_dtype = KvCacheDtype::Fp8;
    let all = check_with(&p, &bf16_only);
    let f = all
        .iter()
        .find(|f| f.rule == "kv-cache-dtype-unsupported")
        .unwrap();
    assert!(
        f.message.contains("numerics.kv_cache_dtype = fp8"),
        "{}",
        f.message
    );
    assert!(check_with(&p, caps("cpu")).is_empty());
}

#[test]
fn graphs_unsupported() {
    let mut p = on("reference");
    p.exec.cuda_graph = true;
    fires("graphs-unsupported", &p);
    p.backend.kind = "cpu".into();
    quiet("graphs-unsupported", &p);
}

#[test]
fn streams_unsupported() {
    let mut p = on("wgpu");
    p.exec.multi_stream_overlap = true;
    p.exec.cuda_graph = true;
    fires("streams-unsupported", &p);
    p.backend.kind = "cpu".into();
    quiet("streams-unsupported", &p);
}

#[test]
fn overlap_needs_graphs_only_where_streams_need_capture() {
    let mut p = on("cuda-sm120");
    p.exec.multi_stream_overlap = true;
    let m = fires("overlap-needs-graphs", &p);
    assert!(m.contains("exec.cuda_graph=true"), "{m}");
    p.exec.cuda_graph = true;
    quiet("overlap-needs-graphs", &p);
    // The cpu backend has side streams in eager plans too.
    let mut p = on("cpu");
    p.exec.multi_stream_overlap = true;
    quiet("overlap-needs-graphs", &p);
}

#[test]
fn hicache_needs_prefix_cache() {
    let mut p = on("cuda-sm120");
    p.cache.hicache = true;
    p.cache.prefix_cache = false;
    fires("hicache-needs-prefix-cache", &p);
    p.cache.prefix_cache = true;
    quiet("hicache-needs-prefix-cache", &p);
}

#[test]
fn hicache_ratio_too_small() {
    let mut p = on("cuda-sm120");
    p.cache.hicache = true;
    p.cache.hicache_ratio = 1.0;
    assert!(fires("hicache-ratio-too-small", &p).contains("= 1 "));
    p.cache.hicache_ratio = 1.5;
    quiet("hicache-ratio-too-small", &p);
    p.cache.hicache = false;
    p.cache.hicache_ratio = 0.5;
    quiet("hicache-ratio-too-small", &p);
}

#[test]
fn lpm_needs_prefix_cache() {
    let mut p = on("cpu");
    p.scheduler.schedule_policy = SchedulePolicy::Lpm;
    p.cache.prefix_cache = false;
    fires("lpm-needs-prefix-cache", &p);
    p.scheduler.schedule_policy = SchedulePolicy::Fcfs;
    quiet("lpm-needs-prefix-cache", &p);
}

#[test]
fn page_size_power_of_two() {
    let mut p = on("cpu");
    for bad in [0, 3, 48, 100] {
        p.cache.page_size = bad;
        fires("page-size-power-of-two", &p);
    }
    p.cache.page_size = 48;
    assert!(fires("page-size-power-of-two", &p).contains("use e.g. 64"));
    p.cache.page_size = u64::MAX;
    fires("page-size-power-of-two", &p);
    for good in [1, 64, 256] {
        p.cache.page_size = good;
        quiet("page-size-power-of-two", &p);
    }
}

#[test]
fn pool_smaller_than_chunk() {
    let mut p = on("cpu");
    p.cache.max_total_tokens = 4096;
    p.scheduler.chunked_prefill_size = 8192;
    fires("pool-smaller-than-chunk", &p);
    p.scheduler.chunked_prefill_size = 0;
    quiet("pool-smaller-than-chunk", &p);
    p.scheduler.chunked_prefill_size = 4096;
    quiet("pool-smaller-than-chunk", &p);
}

#[test]
fn disagg_needs_bootstrap() {
    let mut p = on("cuda-sm120");
    p.disagg.mode = DisaggMode::Decode;
    fires("disagg-needs-bootstrap", &p);
    p.disagg.bootstrap = Some("10.0.0.2:8998".into());
    quiet("disagg-needs-bootstrap", &p);
    quiet("bootstrap-address", &p);
}

#[test]
fn bootstrap_address() {
    let mut p = on("cuda-sm120");
    p.disagg.mode = DisaggMode::Prefill;
    p.disagg.bootstrap = Some("10.0.0.2".into());
    assert!(fires("bootstrap-address", &p).contains("`10.0.0.2`"));
    p.disagg.bootstrap = Some("[fe80::1]:8998".into());
    quiet("bootstrap-address", &p);
}

#[test]
fn fault_needs_overlap() {
    let mut p = on("cpu");
    p.debug.inject = vec![Fault::ArenaIgnoresStreams];
    fires("fault-needs-overlap", &p);
    p.exec.multi_stream_overlap = true;
    assert!(fires("fault-needs-overlap", &p).contains("exec.cuda_graph = false"));
    p.exec.cuda_graph = true;
    quiet("fault-needs-overlap", &p);
}

#[test]
fn fault_needs_streams() {
    let mut p = on("cpu");
    p.debug.inject = vec![Fault::MissingStreamEvent];
    assert!(fires("fault-needs-streams", &p).contains("exec.multi_stream_overlap=true"));
    p.exec.multi_stream_overlap = true;
    quiet("fault-needs-streams", &p);
}

#[test]
fn threaded_with_plan_fault() {
    let mut p = on("cpu");
    p.exec.multi_stream_overlap = true;
    p.exec.executor = ExecutorChoice::Threaded;
    quiet("threaded-with-plan-fault", &p);
    p.debug.inject = vec![Fault::StalePageReuse];
    quiet("threaded-with-plan-fault", &p);
    for fault in [Fault::ArenaIgnoresStreams, Fault::MissingStreamEvent] {
        p.debug.inject = vec![Fault::StalePageReuse, fault];
        let m = fires("threaded-with-plan-fault", &p);
        assert!(
            m.contains(&fault.to_string()) && m.contains("exec.executor=interleaved"),
            "{m}"
        );
    }
    // Without side streams the fault cannot fire, and the other executors run such plans.
    p.exec.executor = ExecutorChoice::Interleaved;
    quiet("threaded-with-plan-fault", &p);
    p.exec.executor = ExecutorChoice::Threaded;
    p.exec.multi_stream_overlap = false;
    quiet("threaded-with-plan-fault", &p);
}

#[test]
fn fault_needs_overlap_schedule() {
    let mut p = on("cpu");
    p.debug.inject = vec![Fault::StalePageReuse];
    assert!(fires("fault-needs-overlap-schedule", &p).contains("exec.overlap_schedule=true"));
    p.exec.overlap_schedule = true;
    quiet("fault-needs-overlap-schedule", &p);
}

#[test]
fn fault_needs_hicache() {
    let mut p = on("cpu");
    p.debug.inject = vec![Fault::SkipIndexKTransferWait];
    fires("fault-needs-hicache", &p);
    p.cache.hicache = true;
    quiet("fault-needs-hicache", &p);
}

#[test]
fn graph_max_bs_without_graphs() {
    let mut p = on("cpu");
    p.exec.cuda_graph_max_bs = 32;
    fires("graph-max-bs-without-graphs", &p);
    p.exec.cuda_graph = true;
    quiet("graph-max-bs-without-graphs", &p);
}

#[test]
fn batches_beyond_graphs() {
    let mut p = on("cuda-sm120");
    p.exec.cuda_graph = true;
    p.exec.cuda_graph_max_bs = 64;
    p.scheduler.max_running_requests = 80;
    assert!(fires("batches-beyond-graphs", &p).contains("batches of 65-80"));
    p.scheduler.max_running_requests = 64;
    quiet("batches-beyond-graphs", &p);
    p.scheduler.max_running_requests = 80;
    p.exec.cuda_graph_max_bs = 0;
    quiet("batches-beyond-graphs", &p);
}

#[test]
fn incident_combination() {
    let mut p = on("cuda-sm120");
    p.exec.cuda_graph = true;
    p.exec.multi_stream_overlap = true;
    p.numerics.index_k_dtype = IndexKDtype::Bf16;
    fires("incident-combination", &p);
    p.numerics.index_k_dtype = IndexKDtype::Fp8;
    quiet("incident-combination", &p);
    p.numerics.index_k_dtype = IndexKDtype::Bf16;
    p.exec.multi_stream_overlap = false;
    quiet("incident-combination", &p);
}

#[test]
fn overlap_schedule_with_disagg() {
    let mut p = on("cuda-sm120");
    p.exec.overlap_schedule = true;
    p.disagg.mode = DisaggMode::Prefill;
    p.disagg.bootstrap = Some("h:1".into());
    fires("overlap-schedule-with-disagg", &p);
    p.exec.overlap_schedule = false;
    quiet("overlap-schedule-with-disagg", &p);
}

#[test]
fn bootstrap_without_disagg() {
    let mut p = on("cpu");
    p.disagg.bootstrap = Some("h:1".into());
    fires("bootstrap-without-disagg", &p);
    p.disagg.mode = DisaggMode::Prefill;
    quiet("bootstrap-without-disagg", &p);
}

#[test]
fn faults_injected() {
    let mut p = on("cpu");
    quiet("faults-injected", &p);
    p.debug.inject = vec![Fault::ArenaIgnoresStreams];
    p.exec.multi_stream_overlap = true;
    assert!(fires("faults-injected", &p).contains("[arena-ignores-streams]"));
}

#[test]
fn open_without_api_key() {
    let mut p = on("cpu");
    p.server.host = "0.0.0.0".into();
    fires("open-without-api-key", &p);
    p.server.api_key = Some("k".into());
    quiet("open-without-api-key", &p);
    p.server.api_key = None;
    p.server.ssl_ca_certs = Some("ca.pem".into());
    quiet("open-without-api-key", &p);
    p.server.ssl_ca_certs = None;
    p.server.host = "localhost".into();
    quiet("open-without-api-key", &p);
}

#[test]
fn ssl_refresh_without_tls() {
    let mut p = on("cpu");
    p.server.ssl_refresh_s = 30;
    assert!(fires("ssl-refresh-without-tls", &p).contains("= 30"));
    p.server.ssl_certfile = Some("cert.pem".into());
    p.server.ssl_keyfile = Some("key.pem".into());
    quiet("ssl-refresh-without-tls", &p);
    p.server.ssl_refresh_s = 0;
    p.server.ssl_certfile = None;
    p.server.ssl_keyfile = None;
    quiet("ssl-refresh-without-tls", &p);
}

#[test]
fn tls_needs_cert_and_key() {
    let mut p = on("cpu");
    quiet("tls-needs-cert-and-key", &p);
    p.server.ssl_certfile = Some("cert.pem".into());
    assert!(fires("tls-needs-cert-and-key", &p).contains("server.ssl_keyfile = unset"));
    p.server.ssl_keyfile = Some("key.pem".into());
    quiet("tls-needs-cert-and-key", &p);
    p.server.ssl_ca_certs = Some("ca.pem".into());
    quiet("tls-needs-cert-and-key", &p);
    p.server.ssl_certfile = None;
    assert!(fires("tls-needs-cert-and-key", &p).contains("server.ssl_certfile = unset"));
    p.server.ssl_keyfile = None;
    assert!(fires("tls-needs-cert-and-key", &p).contains("server.ssl_ca_certs = \"ca.pem\""));
}

#[test]
fn hicache_on_host_backend() {
    let mut p = on("cpu");
    p.cache.hicache = true;
    fires("hicache-on-host-backend", &p);
    p.backend.kind = "cuda-sm120".into();
    quiet("hicache-on-host-backend", &p);
}

#[test]
fn device_without_selector() {
    let mut p = on("cpu");
    p.backend.device = Some("1".into());
    let m = fires("device-without-selector", &p);
    assert!(m.contains("\"1\""), "{m}");
    p.backend.kind = "wgpu".into();
    quiet("device-without-selector", &p);
    p.backend.kind = "reference".into();
    p.backend.device = None;
    quiet("device-without-selector", &p);
}

#[test]
fn every_rule_has_a_test_here() {
    let text = include_str!("tests.rs");
    for rule in super::RULES {
        assert!(
            text.contains(&format!("\"{}\"", rule.id)),
            "no test names rule {}",
            rule.id
        );
    }
}
