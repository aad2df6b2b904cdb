//! [`KEYS`]: every configuration key, section by section, with its type, default and meaning.
//! docs/profiles.md documents the same keys at more length (a test keeps the two in step).

use super::{BACKEND_KINDS, KeySpec, ValueKind};
use crate::values::{
    CanaryPool, CpuSums, CudaLinear, CudaSums, DeviceOrHost, DisaggMode, ExecutorChoice, Fault,
    ReasoningParser, RequestPriority, SchedulePolicy, ToolCallParser,
};
use dsv4_core::numerics::{ActQuant, IndexKDtype, KvCacheDtype};

/// Most worker threads `exec.threads` may ask for: above any machine's cores (the largest
/// two-socket servers have 768 hardware threads), and low enough that starting the pool is
/// quick (each thread is spawned and joined; 20 000 took minutes).
pub const MAX_THREADS: u64 = 1024;

/// Shorthand for one row.
const fn key(
    key: &'static str,
    kind: ValueKind,
    default: &'static str,
    doc: &'static str,
) -> KeySpec {
    KeySpec {
        key,
        kind,
        default,
        doc,
    }
}

/// Every configuration key, in display order (section by section).
pub const KEYS: &[KeySpec] = &[
    // [model]
    key(
        "model.path",
        ValueKind::Text,
        "tiny",
        "\"tiny\" for the embedded tiny model, otherwise a checkpoint directory \
         (config.json, safetensors, tokenizer.json)",
    ),
    key(
        "model.seed",
        ValueKind::Unsigned,
        "0",
        "seed of the embedded tiny model's weights; ignored for checkpoint directories",
    ),
    // [backend]
    key(
        "backend.kind",
        ValueKind::OneOf(BACKEND_KINDS),
        "reference",
        "registry name of the backend that runs the ops",
    ),
    key(
        "backend.device",
        ValueKind::OptionalText,
        "",
        "backend-specific device selector (e.g. a GPU index); unset lets the backend choose",
    ),
    key(
        "backend.cpu_sums",
        ValueKind::OneOf(CpuSums::NAMES),
        "f64",
        "what the cpu backend sums its linear layers' products in (other backends ignore it): \
         f64 (the reference's bits) or f32 (the same order in f32: within f32 tolerance, up to \
         twice as fast)",
    ),
    key(
        "backend.cuda_sums",
        ValueKind::OneOf(CudaSums::NAMES),
        "auto",
        "how the CUDA kernels sum dot products (cuda-sm120, cuda-emu; other backends ignore \
         it): f64 (the reference's bits), f32 (within f32 tolerance), or auto (f64 where FP64 \
         runs at full rate: sm_80/90/100 and the emulator)",
    ),
    key(
        "backend.cuda_linear",
        ValueKind::OneOf(CudaLinear::NAMES),
        "auto",
        "which kernels run the CUDA backends' linears: simt, mma (tensor cores, f32 sums, \
         sm_80+; bf16/fp8/MXFP4 weights), or auto (the backend's choice: simt today)",
    ),
    key(
        "backend.cuda_routing",
        ValueKind::OneOf(DeviceOrHost::NAMES),
        "auto",
        "where the CUDA backends rank a MoE layer's experts and group its rows: device (the \
         router's scores are never read back), host (read back and ranked on the host, as the \
         other backends do), or auto (the backend's choice: device); the same bits either way",
    ),
    key(
        "backend.cuda_attention",
        ValueKind::OneOf(DeviceOrHost::NAMES),
        "auto",
        "where the CUDA backends attend: device (attention's and the indexer's queries stay in \
         device memory and attention's output is written there), host (the queries read back, \
         the output written up again, as the other backends do), or auto (the backend's \
         choice: device); the same bits either way",
    ),
    key(
        "backend.cuda_page_cache_mib",
        ValueKind::AutoOrUnsigned,
        "auto",
        "most device memory (MiB) for KV and index-K cache pages the CUDA backends keep \
         across calls, per entry layout (grown as calls need): 0 keeps none, auto takes the \
         backend's default (an eighth of the GPU's memory, 1024 where the driver does not say; \
         64 on the emulator); other backends ignore it",
    ),
    key(
        "backend.cuda_decode",
        ValueKind::Text,
        "auto",
        "shapes of the CUDA backends' one-row linear kernels per weight format, as \
         fp8=c2w8p3,mxfp4=c1w8p3 (cCwW or cCwWpD: C output columns a warp, W warps a block, D \
         rounds of weight loads in flight, 1 unless given; the backend lists the compiled \
         ones), or auto (the backend's defaults); the same bits in every shape, only \
         the speed differs (dsv4 bench times each); other backends ignore it",
    ),
    // [numerics]
    key(
        "numerics.kv_cache_dtype",
        ValueKind::OneOf(KvCacheDtype::NAMES),
        "bf16",
        "storage of SWA/C4/C128 KV cache entries: bf16, or fp8 (e4m3 nope part with ue8m0 \
         scales per 64, bf16 rope part)",
    ),
    key(
        "numerics.index_k_dtype",
        ValueKind::OneOf(IndexKDtype::NAMES),
        "bf16",
        "storage of indexer keys and rounding of indexer queries: bf16, fp8 (e4m3, f32 scale \
         per entry) or fp4 (e2m1, ue8m0 scale per 32)",
    ),
    key(
        "numerics.act_quant",
        ValueKind::OneOf(ActQuant::NAMES),
        "none",
        "activation quantization in front of fp8/fp4-weight linears: none, or fp8 (1x128 \
         blocks, power-of-two scales)",
    ),
    // [exec]
    key(
        "exec.cuda_graph",
        ValueKind::Bool,
        "false",
        "decode steps run as captured plans (buffers fixed per batch-size bucket, replayed) \
         instead of eagerly",
    ),
    key(
        "exec.cuda_graph_max_bs",
        ValueKind::Unsigned,
        "0",
        "largest batch size with a captured plan; larger batches run eagerly; 0 lets the \
         backend choose",
    ),
    key(
        "exec.multi_stream_overlap",
        ValueKind::Bool,
        "false",
        "the KV, compressor and indexer chains run on side streams, overlapping the main stream",
    ),
    key(
        "exec.executor",
        ValueKind::OneOf(ExecutorChoice::NAMES),
        "auto",
        "which executor runs a step's plan: serial (one launch at a time; on a device the host \
         launches as late as their readers allow, so a run of them waits once, each launch on \
         its plan stream), interleaved (a seeded order respecting only streams and events: \
         cross-stream races reproduce exactly), threaded (a thread per stream; verified plans \
         only), or auto (serial without side streams; with them, serial where they are the \
         device's own streams (cuda-sm120, cuda-emu) and interleaved where the executor is \
         what makes them streams (reference, cpu, wgpu))",
    ),
    key(
        "exec.host_activations",
        ValueKind::Bool,
        "false",
        "keep each step's activations in host memory even on a backend with device memory \
         (every op uploads its inputs and reads its output back); for diffing the \
         device-resident path",
    ),
    key(
        "exec.overlap_schedule",
        ValueKind::Bool,
        "false",
        "the scheduler prepares the next step while the current one runs",
    ),
    key(
        "exec.threads",
        ValueKind::Range(0, MAX_THREADS),
        "0",
        "worker threads; 0 means one per available core",
    ),
    // [cache]
    key(
        "cache.page_size",
        ValueKind::Unsigned,
        "64",
        "tokens per KV cache page (a power of two)",
    ),
    key(
        "cache.prefix_cache",
        ValueKind::Bool,
        "true",
        "finished requests leave their KV pages in a prefix cache that later requests reuse",
    ),
    key(
        "cache.hicache",
        ValueKind::Bool,
        "false",
        "pages evicted from the device pool move to a host-memory tier instead of being dropped",
    ),
    key(
        "cache.hicache_ratio",
        ValueKind::PositiveFloat,
        "2.0",
        "size of the host tier as a multiple of the device pool (must exceed 1 with hicache on)",
    ),
    key(
        "cache.max_total_tokens",
        ValueKind::Unsigned,
        "0",
        "capacity of the device KV pool in tokens; 0 sizes it from free memory",
    ),
    // [scheduler]
    key(
        "scheduler.max_running_requests",
        ValueKind::Unsigned,
        "0",
        "most requests in one running batch; 0 derives it from the pool size",
    ),
    key(
        "scheduler.chunked_prefill_size",
        ValueKind::Unsigned,
        "0",
        "prompt tokens prefilled per step for one request; 0 lets the engine choose",
    ),
    key(
        "scheduler.schedule_policy",
        ValueKind::OneOf(SchedulePolicy::NAMES),
        "fcfs",
        "order in which waiting requests are admitted: fcfs, or lpm (longest cached prefix \
         first)",
    ),
    key(
        "scheduler.in_batch_prefix_caching",
        ValueKind::Bool,
        "true",
        "hold back a waiting request while a running one prefills prompt pages both share, so \
         it reuses that request's prefix snapshots instead of computing them again",
    ),
    key(
        "scheduler.priority_preemption",
        ValueKind::Bool,
        "false",
        "when every running slot is taken, preempt the lowest-priority running request (cache \
         freed, recomputed later) to admit a waiting one whose priority is higher by more than \
         scheduler.priority_preemption_threshold; false: a request waits for a free slot",
    ),
    key(
        "scheduler.priority_preemption_threshold",
        ValueKind::Range(0, 4_294_967_295),
        "10",
        "how much higher (strictly more) a waiting request's priority must be than a running \
         one's for scheduler.priority_preemption to preempt it",
    ),
    key(
        "scheduler.max_queued_requests",
        ValueKind::Range(0, 1_000_000),
        "0",
        "requests waiting for a running slot at which the server refuses new ones with a 503 \
         and Retry-After, unless one of higher priority can take a waiting request's place \
         (that one is refused instead); batch lines still queue and never give way; 0: no limit",
    ),
    // [server]
    key(
        "server.host",
        ValueKind::Text,
        "127.0.0.1",
        "address the HTTP server listens on",
    ),
    key(
        "server.port",
        ValueKind::Range(1, 65535),
        "8000",
        "TCP port the HTTP server listens on",
    ),
    key(
        "server.api_key",
        ValueKind::OptionalText,
        "",
        "bearer token clients must send; unset accepts every client (never displayed)",
    ),
    key(
        "server.tool_call_parser",
        ValueKind::OneOf(ToolCallParser::NAMES),
        "deepseek-v4",
        "how tool calls are parsed out of generated text: deepseek-v4 (DSML), or none",
    ),
    key(
        "server.reasoning_parser",
        ValueKind::OneOf(ReasoningParser::NAMES),
        "deepseek-v4",
        "how reasoning is split from the answer: deepseek-v4 (reasoning_content), or none",
    ),
    key(
        "server.thinking_token_budget",
        ValueKind::AutoOrUnsigned,
        "auto",
        "most reasoning tokens of a thinking-mode answer whose request sets no budget \
         (thinking_token_budget on chat and completions, budget_tokens on /v1/messages, \
         thinking_budget on /generate; /v1/responses has no field for one; a raw prompt is in \
         reasoning when it ends with <think>): then the server writes </think> and the answer goes on; auto sets none \
         (the model ends its reasoning)",
    ),
    key(
        "server.max_request_bytes",
        ValueKind::Range(1, u64::MAX),
        "16777216",
        "largest accepted request body in bytes",
    ),
    key(
        "server.health_stall_s",
        ValueKind::Range(1, 86400),
        "60",
        "/health answers 503 when requests are pending and the engine has completed no step for \
         this many seconds",
    ),
    key(
        "server.responses_store",
        ValueKind::Range(0, 1_000_000),
        "256",
        "most /v1/responses answers kept in memory for previous_response_id and GET \
         /v1/responses/{id} (the oldest goes first), and most background responses running at \
         once; 0 stores none",
    ),
    key(
        "server.responses_store_mib",
        ValueKind::Range(1, 1_048_576),
        "256",
        "most MiB the stored /v1/responses answers hold of their own JSON and text (the oldest \
         goes first past it; an answer bigger than all of it is not kept)",
    ),
    key(
        "server.responses_dir",
        ValueKind::OptionalText,
        "",
        "directory where the stored /v1/responses answers are also kept as files, so \
         previous_response_id and GET /v1/responses/{id} survive a restart (created if missing, \
         read back at start); unset keeps them in memory only",
    ),
    key(
        "server.grammar_cache",
        ValueKind::Range(0, 65_536),
        "64",
        "compiled constrained-decoding grammars (JSON schemas, tool sets, regexes, grammars, \
         structural tags) kept for later requests with the same grammar; the least recently \
         used goes first; 0 keeps none (requests at the same time still share one compile)",
    ),
    key(
        "server.files_mib",
        ValueKind::Range(0, 1_048_576),
        "1024",
        "most MiB of files kept in memory for the Files and Batch APIs (/v1/files uploads and \
         the output and error files of /v1/batches); an upload may be this large; uploads and \
         new batches are refused while it is full; 0 turns both APIs off",
    ),
    key(
        "server.files_dir",
        ValueKind::OptionalText,
        "",
        "directory where the Files and Batch APIs keep their files (on disk instead of in \
         memory, within server.files_mib) and their batches, so both survive a restart (created \
         if missing, read back at start; a batch still running when the server stopped goes on \
         from its last answered line once the model is loaded); unset keeps them in memory only",
    ),
    key(
        "server.batch_max_running",
        ValueKind::Range(0, 65_536),
        "0",
        "most lines of /v1/batches batches in flight together (all batches share it): fewer \
         leave interactive requests beside a running batch faster steps, at the batch's \
         expense; 0 or more than scheduler.max_running_requests: as many as that",
    ),
    key(
        "server.batch_fill_idle_ms",
        ValueKind::Range(0, 3_600_000),
        "0",
        "once no interactive request (one that is not a batch line) has been in flight for this \
         many milliseconds, batch lines may fill every running slot past \
         server.batch_max_running; when one comes, the lines past the share pause at once \
         (preempted, outputs unchanged) until the slots are idle again; the idle time doubles \
         when a fill is cut short (up to 32 times this) and halves back when one lasts; 0: the \
         share is fixed",
    ),
    key(
        "server.request_priority",
        ValueKind::OneOf(RequestPriority::NAMES),
        "use",
        "what a request's priority field does: use (it runs at that priority), ignore (every \
         request runs at the server's own: 0, batch lines -1), or refuse (a request that sets \
         it is a 400)",
    ),
    key(
        "server.ssl_certfile",
        ValueKind::OptionalText,
        "",
        "PEM certificate chain (the server's certificate first); with server.ssl_keyfile the \
         server answers HTTPS only, read at start; unset serves plain HTTP",
    ),
    key(
        "server.ssl_keyfile",
        ValueKind::OptionalText,
        "",
        "PEM private key (PKCS#8, PKCS#1 or SEC1) of server.ssl_certfile; both or neither",
    ),
    key(
        "server.ssl_ca_certs",
        ValueKind::OptionalText,
        "",
        "PEM CA certificates: every client must present a certificate one of them signed \
         (mutual TLS); needs server.ssl_certfile and server.ssl_keyfile; unset asks no client \
         certificate",
    ),
    key(
        "server.ssl_refresh_s",
        ValueKind::Range(0, 86_400),
        "0",
        "seconds between checks of the three TLS files for changes: changed files are read and \
         checked, and new connections get the new certificate (open ones keep theirs); a bad \
         file is logged and counted and the one in use stays; 0 never re-reads them",
    ),
    // [debug]
    key(
        "debug.canary",
        ValueKind::ListOf(CanaryPool::NAMES),
        "[]",
        "pools (index_k, kv, state) whose page checksums are compared, around each step, with \
         the step's declared write set; a page changed outside it is logged and counted \
         (with kv or index_k, the CUDA backends also check their device copies of the pages)",
    ),
    key(
        "debug.canary_abort",
        ValueKind::Bool,
        "false",
        "a canary finding also fails the step's requests",
    ),
    key(
        "debug.inject",
        ValueKind::ListOf(Fault::NAMES),
        "[]",
        "faults to inject, each rehearsing one incident class (results are wrong on purpose)",
    ),
    // [disagg]
    key(
        "disagg.mode",
        ValueKind::OneOf(DisaggMode::NAMES),
        "none",
        "role in prefill/decode disaggregation: none, prefill or decode",
    ),
    key(
        "disagg.bootstrap",
        ValueKind::OptionalText,
        "",
        "host:port of the prefill server's bootstrap endpoint, where KV transfers are arranged",
    ),
];
