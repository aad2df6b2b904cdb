//! [`RULES`]: every combination rule, with its check. Each message names every key it reads with its
//! value, and says what to change.

use super::{Rule, Severity};
use crate::caps::{BackendCaps, Streams};
use crate::profile::Profile;
use crate::values::{DisaggMode, ExecutorChoice, Fault, SchedulePolicy};
use dsv4_core::numerics::IndexKDtype;

/// Shorthand for an error rule.
const fn error(
    id: &'static str,
    keys: &'static [&'static str],
    summary: &'static str,
    check: super::Check,
) -> Rule {
    Rule {
        id,
        severity: Severity::Error,
        keys,
        summary,
        check,
    }
}

/// Shorthand for a warning rule.
const fn warning(
    id: &'static str,
    keys: &'static [&'static str],
    summary: &'static str,
    check: super::Check,
) -> Rule {
    Rule {
        id,
        severity: Severity::Warning,
        keys,
        summary,
        check,
    }
}

/// Every rule, errors first.
pub const RULES: &[Rule] = &[
    error(
        "index-k-dtype-unsupported",
        &["numerics.index_k_dtype", "backend.kind"],
        "the backend does not store that indexer key format",
        index_k_dtype_unsupported,
    ),
    error(
        "kv-cache-dtype-unsupported",
        &["numerics.kv_cache_dtype", "backend.kind"],
        "the backend does not store that KV cache format",
        kv_cache_dtype_unsupported,
    ),
    error(
        "graphs-unsupported",
        &["exec.cuda_graph", "backend.kind"],
        "captured plans on a backend that only runs eagerly",
        graphs_unsupported,
    ),
    error(
        "streams-unsupported",
        &["exec.multi_stream_overlap", "backend.kind"],
        "multi-stream overlap on a backend with a single stream",
        streams_unsupported,
    ),
    error(
        "overlap-needs-graphs",
        &[
            "exec.multi_stream_overlap",
            "exec.cuda_graph",
            "backend.kind",
        ],
        "multi-stream overlap without captured plans on a backend whose side streams exist only \
         under capture",
        overlap_needs_graphs,
    ),
    error(
        "threaded-with-plan-fault",
        &["exec.executor", "debug.inject", "exec.multi_stream_overlap"],
        "the threaded executor with a fault that breaks the plan's stream ordering: it runs only \
         plans the verifier passes, so every step would be refused",
        threaded_with_plan_fault,
    ),
    error(
        "hicache-needs-prefix-cache",
        &["cache.hicache", "cache.prefix_cache"],
        "a host tier without the prefix cache whose evicted pages it holds",
        hicache_needs_prefix_cache,
    ),
    error(
        "hicache-ratio-too-small",
        &["cache.hicache_ratio", "cache.hicache"],
        "a host tier no larger than the device pool",
        hicache_ratio_too_small,
    ),
    error(
        "lpm-needs-prefix-cache",
        &["scheduler.schedule_policy", "cache.prefix_cache"],
        "longest-prefix-match scheduling without a prefix cache",
        lpm_needs_prefix_cache,
    ),
    error(
        "page-size-power-of-two",
        &["cache.page_size"],
        "a page size that is not a power of two",
        page_size_power_of_two,
    ),
    error(
        "pool-smaller-than-chunk",
        &["cache.max_total_tokens", "scheduler.chunked_prefill_size"],
        "a KV pool smaller than one prefill chunk",
        pool_smaller_than_chunk,
    ),
    error(
        "disagg-needs-bootstrap",
        &["disagg.mode", "disagg.bootstrap"],
        "a prefill or decode server without a bootstrap address",
        disagg_needs_bootstrap,
    ),
    error(
        "bootstrap-address",
        &["disagg.bootstrap"],
        "a bootstrap address that is not host:port",
        bootstrap_address,
    ),
    error(
        "tls-needs-cert-and-key",
        &[
            "server.ssl_certfile",
            "server.ssl_keyfile",
            "server.ssl_ca_certs",
        ],
        "a TLS certificate without its key, a key without its certificate, or client CA \
         certificates without either",
        tls_needs_cert_and_key,
    ),
    warning(
        "fault-needs-overlap",
        &[
            "debug.inject",
            "exec.multi_stream_overlap",
            "exec.cuda_graph",
        ],
        "the arena fault without side streams or without captured plans (it could never fire)",
        fault_needs_overlap,
    ),
    warning(
        "fault-needs-streams",
        &["debug.inject", "exec.multi_stream_overlap"],
        "the missing-event fault without side streams (it could never fire)",
        fault_needs_streams,
    ),
    warning(
        "fault-needs-overlap-schedule",
        &["debug.inject", "exec.overlap_schedule"],
        "the early-free fault of the overlap scheduler with overlap scheduling off (it could \
         never fire)",
        fault_needs_overlap_schedule,
    ),
    warning(
        "fault-needs-hicache",
        &["debug.inject", "cache.hicache"],
        "a host-tier fault without a host tier (it could never fire)",
        fault_needs_hicache,
    ),
    warning(
        "graph-max-bs-without-graphs",
        &["exec.cuda_graph_max_bs", "exec.cuda_graph"],
        "a captured batch-size limit with captured plans off (it has no effect)",
        graph_max_bs_without_graphs,
    ),
    warning(
        "batches-beyond-graphs",
        &["scheduler.max_running_requests", "exec.cuda_graph_max_bs"],
        "batches larger than the largest captured plan run eagerly: one deployment mixes two \
         execution modes",
        batches_beyond_graphs,
    ),
    warning(
        "incident-combination",
        &[
            "numerics.index_k_dtype",
            "exec.multi_stream_overlap",
            "exec.cuda_graph",
        ],
        "bf16 index keys + multi-stream overlap + captured plans: the combination of the \
         DSV4-Flash tool-call corruption incident",
        incident_combination,
    ),
    warning(
        "overlap-schedule-with-disagg",
        &["exec.overlap_schedule", "disagg.mode"],
        "the overlap scheduler on a disaggregated server (a known prefill/decode deadlock)",
        overlap_schedule_with_disagg,
    ),
    warning(
        "bootstrap-without-disagg",
        &["disagg.bootstrap", "disagg.mode"],
        "a bootstrap address on a server that is not disaggregated (it is ignored)",
        bootstrap_without_disagg,
    ),
    warning(
        "faults-injected",
        &["debug.inject"],
        "faults are injected: results are wrong on purpose",
        faults_injected,
    ),
    warning(
        "open-without-api-key",
        &["server.host", "server.api_key", "server.ssl_ca_certs"],
        "listening beyond loopback without an API key or client certificates",
        open_without_api_key,
    ),
    warning(
        "ssl-refresh-without-tls",
        &["server.ssl_refresh_s", "server.ssl_certfile"],
        "TLS files to re-read on a server that serves plain HTTP (it is ignored)",
        ssl_refresh_without_tls,
    ),
    warning(
        "hicache-on-host-backend",
        &["cache.hicache", "backend.kind"],
        "a host tier on a backend whose memory already is host memory",
        hicache_on_host_backend,
    ),
    warning(
        "device-without-selector",
        &["backend.device", "backend.kind"],
        "a device selector on a backend that has no device to select (it is ignored)",
        device_without_selector,
    ),
];

fn index_k_dtype_unsupported(p: &Profile, caps: &BackendCaps) -> Option<String> {
    let dtype = p.numerics.index_k_dtype;
    (!caps.index_k_dtypes.contains(&dtype)).then(|| {
        let stored: Vec<String> = caps.index_k_dtypes.iter().map(|d| d.to_string()).collect();
        format!(
            "numerics.index_k_dtype = {dtype} is not stored by backend.kind = {} (it stores: {}); \
             choose one of those or another backend",
            caps.kind,
            stored.join(", ")
        )
    })
}

fn kv_cache_dtype_unsupported(p: &Profile, caps: &BackendCaps) -> Option<String> {
    let dtype = p.numerics.kv_cache_dtype;
    (!caps.kv_cache_dtypes.contains(&dtype)).then(|| {
        let stored: Vec<String> = caps.kv_cache_dtypes.iter().map(|d| d.to_string()).collect();
        format!(
            "numerics.kv_cache_dtype = {dtype} is not stored by backend.kind = {} (it stores: \
             {}); choose one of those or another backend",
            caps.kind,
            stored.join(", ")
        )
    })
}

fn graphs_unsupported(p: &Profile, caps: &BackendCaps) -> Option<String> {
    (p.exec.cuda_graph && !caps.captured_plans).then(|| {
        format!(
            "exec.cuda_graph = true needs captured plans, which backend.kind = {} does not run \
             ({}); set exec.cuda_graph=false or use another backend",
            caps.kind, caps.note
        )
    })
}

fn streams_unsupported(p: &Profile, caps: &BackendCaps) -> Option<String> {
    (p.exec.multi_stream_overlap && caps.streams == Streams::Single).then(|| {
        format!(
            "exec.multi_stream_overlap = true needs side streams, which backend.kind = {} does \
             not have ({}); set exec.multi_stream_overlap=false or use another backend",
            caps.kind, caps.note
        )
    })
}

fn overlap_needs_graphs(p: &Profile, caps: &BackendCaps) -> Option<String> {
    let fires =
        p.exec.multi_stream_overlap && !p.exec.cuda_graph && caps.streams == Streams::CaptureOnly;
    fires.then(|| {
        format!(
            "exec.multi_stream_overlap = true with exec.cuda_graph = false: on backend.kind = {} \
             side streams exist only in captured plans, so nothing would overlap; set \
             exec.cuda_graph=true or exec.multi_stream_overlap=false",
            caps.kind
        )
    })
}

fn threaded_with_plan_fault(p: &Profile, _: &BackendCaps) -> Option<String> {
    let plan_faults = [Fault::ArenaIgnoresStreams, Fault::MissingStreamEvent];
    let fault = plan_faults
        .into_iter()
        .find(|f| p.debug.inject.contains(f))?;
    (p.exec.executor == ExecutorChoice::Threaded && p.exec.multi_stream_overlap).then(|| {
        format!(
            "exec.executor = threaded with debug.inject containing {fault} and \
             exec.multi_stream_overlap = true: the fault gives the verifier findings in every \
             side-stream plan and the threaded executor refuses those; rehearse it with \
             exec.executor=interleaved (the rehearsal profile's) or serial"
        )
    })
}

fn hicache_needs_prefix_cache(p: &Profile, _: &BackendCaps) -> Option<String> {
    (p.cache.hicache && !p.cache.prefix_cache).then(|| {
        "cache.hicache = true with cache.prefix_cache = false: the host tier holds pages evicted \
         from the prefix cache, so there is nothing to hold; set cache.prefix_cache=true or \
         cache.hicache=false"
            .to_string()
    })
}

fn hicache_ratio_too_small(p: &Profile, _: &BackendCaps) -> Option<String> {
    (p.cache.hicache && p.cache.hicache_ratio <= 1.0).then(|| {
        format!(
            "cache.hicache_ratio = {} with cache.hicache = true: the host tier must be larger than \
             the device pool (ratio above 1) to hold what the device pool evicts; raise \
             cache.hicache_ratio (SGLang's default is 2)",
            p.cache.hicache_ratio
        )
    })
}

fn lpm_needs_prefix_cache(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fires = p.scheduler.schedule_policy == SchedulePolicy::Lpm && !p.cache.prefix_cache;
    fires.then(|| {
        "scheduler.schedule_policy = lpm ranks requests by their cached prefix, but \
         cache.prefix_cache = false; set scheduler.schedule_policy=fcfs or \
         cache.prefix_cache=true"
            .to_string()
    })
}

fn page_size_power_of_two(p: &Profile, _: &BackendCaps) -> Option<String> {
    let size = p.cache.page_size;
    (!size.is_power_of_two()).then(|| {
        let hint = size.checked_next_power_of_two().unwrap_or(64).max(1);
        format!("cache.page_size = {size} is not a power of two; use e.g. {hint}")
    })
}

fn pool_smaller_than_chunk(p: &Profile, _: &BackendCaps) -> Option<String> {
    let (pool, chunk) = (p.cache.max_total_tokens, p.scheduler.chunked_prefill_size);
    (pool > 0 && chunk > 0 && pool < chunk).then(|| {
        format!(
            "cache.max_total_tokens = {pool} is smaller than scheduler.chunked_prefill_size = \
             {chunk}: one prefill chunk could never fit in the pool; raise \
             cache.max_total_tokens or lower scheduler.chunked_prefill_size"
        )
    })
}

fn disagg_needs_bootstrap(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fires = p.disagg.mode != DisaggMode::None && p.disagg.bootstrap.is_none();
    fires.then(|| {
        format!(
            "disagg.mode = {} needs disagg.bootstrap (host:port of the prefill server's \
             bootstrap endpoint); set disagg.bootstrap or disagg.mode=none",
            p.disagg.mode
        )
    })
}

fn bootstrap_address(p: &Profile, _: &BackendCaps) -> Option<String> {
    let text = p.disagg.bootstrap.as_deref()?;
    crate::sections::parse_host_port(text).is_none().then(|| {
        format!(
            "disagg.bootstrap = `{text}` is not host:port (port 1-65535, IPv6 hosts in \
             brackets), e.g. 10.0.0.2:8998"
        )
    })
}

fn fault_needs_overlap(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fault = Fault::ArenaIgnoresStreams;
    (p.debug.inject.contains(&fault) && !(p.exec.multi_stream_overlap && p.exec.cuda_graph)).then(
        || {
            format!(
                "debug.inject contains {fault}, which only fires in the arena of captured plans \
                 across side streams, but exec.multi_stream_overlap = {} and exec.cuda_graph = {}; \
                 set both to true or remove the fault",
                p.exec.multi_stream_overlap, p.exec.cuda_graph
            )
        },
    )
}

fn fault_needs_streams(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fault = Fault::MissingStreamEvent;
    (p.debug.inject.contains(&fault) && !p.exec.multi_stream_overlap).then(|| {
        format!(
            "debug.inject contains {fault}, which drops a wait between side streams, but \
             exec.multi_stream_overlap = false (one stream, no events); set \
             exec.multi_stream_overlap=true or remove the fault"
        )
    })
}

fn fault_needs_overlap_schedule(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fault = Fault::StalePageReuse;
    (p.debug.inject.contains(&fault) && !p.exec.overlap_schedule).then(|| {
        format!(
            "debug.inject contains {fault}, which only fires when the scheduler prepares the next \
             step while one runs, but exec.overlap_schedule = false; set \
             exec.overlap_schedule=true or remove the fault"
        )
    })
}

fn fault_needs_hicache(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fault = Fault::SkipIndexKTransferWait;
    (p.debug.inject.contains(&fault) && !p.cache.hicache).then(|| {
        format!(
            "debug.inject contains {fault}, which only fires in the host tier, but cache.hicache \
             = false; set cache.hicache=true or remove the fault"
        )
    })
}

fn graph_max_bs_without_graphs(p: &Profile, _: &BackendCaps) -> Option<String> {
    (!p.exec.cuda_graph && p.exec.cuda_graph_max_bs > 0).then(|| {
        format!(
            "exec.cuda_graph_max_bs = {} has no effect with exec.cuda_graph = false; set it to 0 \
             or turn captured plans on",
            p.exec.cuda_graph_max_bs
        )
    })
}

fn batches_beyond_graphs(p: &Profile, _: &BackendCaps) -> Option<String> {
    let (running, max_bs) = (p.scheduler.max_running_requests, p.exec.cuda_graph_max_bs);
    (p.exec.cuda_graph && max_bs > 0 && running > max_bs).then(|| {
        format!(
            "scheduler.max_running_requests = {running} exceeds exec.cuda_graph_max_bs = \
             {max_bs}: batches of {}-{running} run eagerly while smaller ones replay captured \
             plans, so one deployment mixes two execution modes; raise exec.cuda_graph_max_bs or \
             lower scheduler.max_running_requests",
            max_bs + 1
        )
    })
}

fn incident_combination(p: &Profile, _: &BackendCaps) -> Option<String> {
    let fires = p.numerics.index_k_dtype == IndexKDtype::Bf16
        && p.exec.multi_stream_overlap
        && p.exec.cuda_graph;
    fires.then(|| {
        "numerics.index_k_dtype = bf16 with exec.multi_stream_overlap = true and \
         exec.cuda_graph = true is the combination under which DSV4-Flash corrupted tool calls \
         on SGLang (the indexer's side-stream scratch aliased main-stream tensors in the \
         captured graph's memory pool); set exec.multi_stream_overlap=false (the fix that took \
         failures to 0% with no throughput loss), or keep debug.canary=index_k,kv,state and verify the plan"
            .to_string()
    })
}

fn overlap_schedule_with_disagg(p: &Profile, _: &BackendCaps) -> Option<String> {
    (p.exec.overlap_schedule && p.disagg.mode != DisaggMode::None).then(|| {
        format!(
            "exec.overlap_schedule = true with disagg.mode = {}: the overlap scheduler caused a \
             prefill/decode deadlock in production; set exec.overlap_schedule=false unless this \
             deployment has been stress-tested with it",
            p.disagg.mode
        )
    })
}

fn bootstrap_without_disagg(p: &Profile, _: &BackendCaps) -> Option<String> {
    let text = p.disagg.bootstrap.as_deref()?;
    (p.disagg.mode == DisaggMode::None).then(|| {
        format!(
            "disagg.bootstrap = {text} is ignored with disagg.mode = none; unset it or set \
             disagg.mode"
        )
    })
}

fn faults_injected(p: &Profile, _: &BackendCaps) -> Option<String> {
    (!p.debug.inject.is_empty()).then(|| {
        let names: Vec<&str> = p.debug.inject.iter().map(Fault::as_str).collect();
        format!(
            "debug.inject = [{}]: these faults make results wrong on purpose; never serve real \
             traffic with them",
            names.join(", ")
        )
    })
}

fn open_without_api_key(p: &Profile, _: &BackendCaps) -> Option<String> {
    let s = &p.server;
    (!s.is_loopback() && s.api_key.is_none() && s.ssl_ca_certs.is_none()).then(|| {
        format!(
            "server.host = {} accepts connections from other machines and neither \
             server.api_key nor server.ssl_ca_certs is set, so anyone who can reach the port can \
             use the server; set server.api_key (e.g. DSV4_SERVER__API_KEY), require client \
             certificates with server.ssl_ca_certs, or listen on 127.0.0.1",
            s.host
        )
    })
}

fn ssl_refresh_without_tls(p: &Profile, _: &BackendCaps) -> Option<String> {
    let s = &p.server;
    (s.ssl_refresh_s > 0 && s.ssl_certfile.is_none()).then(|| {
        format!(
            "server.ssl_refresh_s = {} re-reads the TLS files, but server.ssl_certfile is unset, \
             so the server speaks plain HTTP and there is nothing to re-read; set \
             server.ssl_refresh_s=0 or configure TLS",
            s.ssl_refresh_s
        )
    })
}

fn tls_needs_cert_and_key(p: &Profile, _: &BackendCaps) -> Option<String> {
    let s = &p.server;
    let shown = |v: &Option<String>| {
        v.as_deref()
            .map_or("unset".to_string(), |f| format!("{f:?}"))
    };
    let (cert, key, ca) = (
        shown(&s.ssl_certfile),
        shown(&s.ssl_keyfile),
        shown(&s.ssl_ca_certs),
    );
    match (&s.ssl_certfile, &s.ssl_keyfile, &s.ssl_ca_certs) {
        (Some(_), Some(_), _) | (None, None, None) => None,
        (None, None, Some(_)) => Some(format!(
            "server.ssl_ca_certs = {ca} asks clients for certificates, but server.ssl_certfile and \
             server.ssl_keyfile are unset, so the server does not speak TLS; set both, or unset \
             server.ssl_ca_certs"
        )),
        _ => Some(format!(
            "server.ssl_certfile = {cert} and server.ssl_keyfile = {key} (server.ssl_ca_certs = \
             {ca}): HTTPS needs both the certificate and its private key; set the missing one, or \
             unset all three for plain HTTP"
        )),
    }
}

fn hicache_on_host_backend(p: &Profile, caps: &BackendCaps) -> Option<String> {
    (p.cache.hicache && caps.host_memory).then(|| {
        format!(
            "cache.hicache = true on backend.kind = {}, whose device memory already is host \
             memory: the host tier only copies pages within host memory (useful to rehearse \
             transfers, not to gain capacity)",
            caps.kind
        )
    })
}

fn device_without_selector(p: &Profile, caps: &BackendCaps) -> Option<String> {
    let device = p
        .backend
        .device
        .as_deref()
        .filter(|d| !d.trim().is_empty())?;
    caps.device_selector.is_none().then(|| {
        format!(
            "backend.device = \"{device}\" has no effect on backend.kind = {}, which runs on this \
             machine's CPU (exec.threads sets how many cores); unset it or choose a device \
             backend",
            caps.kind
        )
    })
}

#[cfg(test)]
mod tests;
