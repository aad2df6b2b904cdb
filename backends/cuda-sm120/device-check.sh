#!/usr/bin/env bash
# The cuda-sm120 device check: on a machine with an NVIDIA GPU, prove the backend against the
# reference and time it, in under 8 minutes, writing a JSON summary.
#
#   backends/cuda-sm120/device-check.sh [OUT_DIR]        (default OUT_DIR: target/device-check)
#
# Steps (each one's full output is kept as OUT_DIR/<step>.log, JSON reports beside it):
#   ops            dsv4 diff --backend reference --against cuda-sm120 --ops
#   model-tiny     dsv4 diff ... --model on the tiny model (136 prompt tokens: C128 entries and a
#                  selecting indexer top-k; + 4 decode steps) with f64 sums (backend.cuda_sums=f64,
#                  the reference's bits on any GPU, so the top-k sets must be identical)
#   page-cache     the model-tiny diff again with the page cache off (backend.cuda_page_cache_mib
#                  = 0): the same logits against the reference as with it on, and the bytes
#                  uploaded either way ("page_cache" in the summary)
#   model-f32      the same model with f32 sums (136 + 4 tokens; a near-tied indexer choice
#                  broken the other way is judged against the reference's scores, docs/diff.md;
#                  not on the emulated driver, whose kernels are built for one kind of sums per
#                  process)
#   model-small    dsv4 diff ... --model on the small config (random weights, 64 + 4)
#   ops-mma        the op sweep with the tensor-core linears (backend.cuda_linear=mma)
#   model-mma      the tiny-model diff with the tensor-core linears (136 + 4 tokens)
#   plan           dsv4 plan check under the rehearsal profile on cuda-sm120
#   canary         a batch of concurrent requests under the rehearsal profile (captured plans,
#                  side streams, canary on every pool, abort on a finding; the canary on the KV
#                  and index-K pools also checks the page cache's device copies at every call)
#   solo           the same requests one at a time; each must get the concurrent run's tokens
#                  (batch invariance; a difference records a batch-invariance FAIL)
#   captured       dsv4 diff --mode captured-vs-eager --backend cuda-sm120 (bitwise; the captured
#                  side must replay CUDA graphs, else a captured-graphs FAIL is recorded)
#   overlap        dsv4 diff --mode overlap-vs-serial --backend cuda-sm120 (bitwise)
#   resident       dsv4 diff --mode resident-vs-host --backend cuda-sm120 under captured plans
#                  (device-resident activations against host slices, bitwise)
#   batched        dsv4 diff --mode batched-vs-solo under captured plans and side streams: a
#                  sequence alone against the same sequence batched with 3 others, op by op
#                  (bitwise)
#   bench          dsv4 bench --backend cuda-sm120 (device peaks, GEMV/GEMM fractions, every
#                  linear case on the SIMT and on the tensor-core kernels; on a GPU the tiny
#                  model end to end, with the placement A/B: the captured decode against the
#                  backend with attention, then routing, on the host)
#   bench-f32      its device section again with f32 sums (DSV4_CUDA_ACC=f32)
#   profile-*      Nsight Compute on the decode GEMVs (linear_fp8_r1, linear_mxfp4_g1) where ncu
#                  reads the counters; "skip", not a failure, where it cannot
# The summary (OUT_DIR/summary.json) names the GPU, the date, each step's status and seconds,
# each model diff's logits and indexer agreement ("models", from OUT_DIR/model-*.json),
# each linear case's fraction of the device's own limits ("linear" from bench.json,
# "linear_f32" from bench-f32.json), the fp8/MXFP4 decode GEMVs on every compiled kernel shape
# ("decode_shapes", "decode_shapes_f32": each shape's speed over the backend's) and the shapes
# the bench suggests pinning ("decode_suggestion", "decode_suggestion_f32": the
# backend.cuda_decode value, per format the shape, its slowest case's speedup and the best
# other shape's; null where none), each attention-side kernel's fraction of the FMA rate
# of its sums ("kernels", "kernels_f32"), and the placement A/B's rows ("placement": each
# on-device path's speedup, side streams' speedup over one stream, and each side's traffic
# per step; [] where the bench ran no e2e), and the decode GEMVs' Nsight Compute figures
# ("profiles": duration, DRAM and SM throughput, instructions issued per scheduler and
# cycle, registers, waves, achieved warps; [] where ncu could not profile).
#
# The binary: $DSV4_BIN if set (e.g. a release build carried from another machine), else
# `cargo build --release -p dsv4-cli` here. NVRTC comes from the CUDA toolkit or the PyPI wheel
# nvidia-cuda-nvrtc-cu12; see docs/cuda.md. DSV4_CHECK_BACKEND=cuda-emu runs every step on the
# CPU emulator instead (a dry run of this script without a GPU; the numbers mean nothing), and
# DSV4_CUDA_DRIVER=emu runs the cuda-sm120 backend itself on the emulated CUDA driver (its driver
# calls, NVRTC's CUBIN, graphs and streams checked, the kernels on the CPU; any failed driver
# call fails the driver-calls step).
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:-target/device-check}
mkdir -p "$out"
start_all=$(date +%s)

if [ -n "${DSV4_BIN:-}" ]; then
    dsv4=$DSV4_BIN
else
    echo "building dsv4 (release)…"
    cargo build --release -q -p dsv4-cli || { echo "build failed" >&2; exit 1; }
    dsv4=target/release/dsv4
fi
backend=${DSV4_CHECK_BACKEND:-cuda-sm120}
# On the CPU (the emulator, or the emulated driver) fewer requests and a smaller bench: the path
# is what is checked there, not the speed.
on_cpu=0
if [ "$backend" = cuda-emu ] || [ "${DSV4_CUDA_DRIVER:-}" = emu ]; then on_cpu=1; fi

# NVRTC: cudarc (built for CUDA 12.8) loads libnvrtc by the names CUDA 12 uses (libnvrtc.so,
# libnvrtc.so.12). A machine with only a newer toolkit (CUDA 13: libnvrtc.so.13) gets a
# libnvrtc.so symlink to it on LD_LIBRARY_PATH; the NVRTC C API is the same.
# With DSV4_CUDA_KERNELS=cached the kernels come from DSV4_CACHE_DIR and NVRTC is not needed.
if [ "$backend" = cuda-sm120 ] && [ "${DSV4_CUDA_KERNELS:-}" != cached ] &&
    ! ldconfig -p 2>/dev/null | grep -qE 'libnvrtc\.so(\.12)? '; then
    lib=$(ls /usr/local/cuda/lib64/libnvrtc.so.* /usr/local/cuda/targets/*/lib/libnvrtc.so.* \
        /usr/lib/x86_64-linux-gnu/libnvrtc.so.* 2>/dev/null | grep -v -e builtins -e alt | sort -V | tail -n 1)
    if [ -z "$lib" ]; then
        lib=$(python3 -c 'import glob, site, sys
hits = [p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libnvrtc.so.*", recursive=True)
        if "builtins" not in p and ".alt." not in p]
print(sorted(hits)[-1] if hits else "")' 2>/dev/null)
    fi
    if [ -n "$lib" ]; then
        shim=$(mktemp -d)
        ln -sf "$lib" "$shim/libnvrtc.so"
        export LD_LIBRARY_PATH="$shim:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "NVRTC: $lib"
    elif ls "${DSV4_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv4}"/cuda-kernels/*.cubin >/dev/null 2>&1; then
        # No NVRTC here, but CUBINs compiled elsewhere were carried along (docs/cuda.md).
        export DSV4_CUDA_KERNELS=cached
        echo "NVRTC: not found; running the cached CUBINs (DSV4_CUDA_KERNELS=cached)"
    else
        echo "NVRTC: not found, and no cached CUBINs: cuda-sm120 will be unavailable (docs/cuda.md)"
    fi
fi

gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ "${DSV4_CUDA_DRIVER:-}" = emu ] && gpu="the emulated CUDA driver (DSV4_CUDA_DRIVER=emu, CPU)"
echo "GPU: ${gpu:-unknown (nvidia-smi not found)}"

steps=()
record() { # name status seconds
    steps+=("{\"step\":\"$1\",\"status\":\"$2\",\"seconds\":$3}")
    printf '%-12s %-5s %4ss\n' "$1" "$2" "$3"
}
run_step() { # name command...
    local name=$1; shift
    local t0; t0=$(date +%s)
    if "$@" >"$out/$name.log" 2>&1; then
        record "$name" pass $(( $(date +%s) - t0 ))
    else
        record "$name" FAIL $(( $(date +%s) - t0 ))
        tail -n 15 "$out/$name.log" | sed 's/^/    /'
    fi
}

cuda=(--set backend.kind="$backend")
small=${DSV4_SMALL_DIR:-target/small-model} # kept out of OUT_DIR: it is 100+ MB
[ -f "$small/model.safetensors" ] || "$dsv4" model init-random --config small --out "$small" >/dev/null

run_step ops "$dsv4" diff --backend reference --against "$backend" --ops
run_step model-tiny "$dsv4" --set backend.cuda_sums=f64 diff --backend reference --against "$backend" \
    --model --tokens 136 --decode 4 --out "$out/model-tiny.json"
# The page cache changes traffic, never results: with it off every call uploads the rows it
# reads, and the logits must be those of model-tiny (which ran with it on, the default).
run_step page-cache-off "$dsv4" --set backend.cuda_sums=f64 --set backend.cuda_page_cache_mib=0 \
    diff --backend reference --against "$backend" --model --tokens 136 --decode 4 \
    --out "$out/page-cache-off.json"
page_cache=$(python3 - "$out" 2>"$out/page-cache.log" <<'PY' || echo null
import json, os, sys
read = lambda name: json.load(open(os.path.join(sys.argv[1], name)))["model"]
on, off = read("model-tiny.json"), read("page-cache-off.json")
row = {
    "same_logits": on["logits"] == off["logits"],
    "bytes_uploaded_on": on["candidate_device"]["write_bytes"],
    "bytes_uploaded_off": off["candidate_device"]["write_bytes"],
}
print(f"page cache: {row['bytes_uploaded_on']} bytes uploaded with it, "
      f"{row['bytes_uploaded_off']} without; logits the same: {row['same_logits']}", file=sys.stderr)
print(json.dumps(row))
PY
)
sed 's/^/  /' "$out/page-cache.log"
case $page_cache in
*'"same_logits": true'*) record page-cache pass 0 ;;
*) record page-cache FAIL 0 ;;
esac
if [ "${DSV4_CUDA_DRIVER:-}" != emu ]; then
    run_step model-f32 "$dsv4" --set backend.cuda_sums=f32 diff --backend reference \
        --against "$backend" --model --tokens 136 --decode 4 --out "$out/model-f32.json"
fi
run_step model-small "$dsv4" --set model.path="$small" diff --backend reference --against "$backend" \
    --model --tokens 64 --decode 4 --out "$out/model-small.json"
mma=(--set backend.cuda_linear=mma)
run_step ops-mma "$dsv4" "${mma[@]}" diff --backend reference --against "$backend" --ops
run_step model-mma "$dsv4" "${mma[@]}" diff --backend reference --against "$backend" \
    --model --tokens 136 --decode 4 --out "$out/model-mma.json"
# Indexer or router near-ties a model step broke the other way (within what the taps allow,
# judged on the reference's scores while the step follows the reference's choice; docs/diff.md):
# shown, not failed.
grep -H 'near-tie' "$out"/model-*.log 2>/dev/null | sed "s|^$out/|    |" || true
run_step plan "$dsv4" --profile rehearsal "${cuda[@]}" plan check
requests=24
[ "$on_cpu" = 1 ] && requests=6
python3 - "$out/requests.jsonl" "$requests" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": i, "prompt": f"request {i}: " + "tool call " * (i % 7), "max_tokens": 24}) + "\n")
PY
run_step canary "$dsv4" --profile rehearsal "${cuda[@]}" --set debug.canary_abort=true \
    generate --batch "$out/requests.jsonl" --output "$out/canary-out.jsonl"
if [ -f "$out/canary-out.jsonl" ] && grep -q '"finish_reason":"error"' "$out/canary-out.jsonl"; then
    record canary-errors FAIL 0
fi
# Batch invariance on the device: the same requests one at a time (bucket-1 plans, no batch
# neighbours) must give each request the tokens it got in the concurrent run above.
run_step solo "$dsv4" --profile rehearsal "${cuda[@]}" --set scheduler.max_running_requests=1 \
    generate --batch "$out/requests.jsonl" --output "$out/solo-out.jsonl"
if ! python3 - "$out/canary-out.jsonl" "$out/solo-out.jsonl" >"$out/batch-invariance.log" 2>&1 <<'PY'
import json, sys
runs = [{r["id"]: r.get("tokens") for r in map(json.loads, open(p))} for p in sys.argv[1:]]
concurrent, solo = runs
differ = sorted(i for i in concurrent if concurrent[i] is None or concurrent[i] != solo.get(i))
print(f"{len(concurrent) - len(differ)}/{len(concurrent)} requests: the same tokens alone and concurrently")
if differ:
    print(f"differing or failed: {differ}")
sys.exit(1 if differ or len(solo) != len(concurrent) else 0)
PY
then
    record batch-invariance FAIL 0
    sed 's/^/    /' "$out/batch-invariance.log"
fi
run_step captured "$dsv4" "${cuda[@]}" diff --mode captured-vs-eager --backend "$backend" --tokens 64 --decode 8
# The captured side's decode steps must have replayed device graphs (docs/cuda.md, CUDA graphs).
if ! grep -Eq '^candidate device: [0-9]+ kernels \([0-9]+ inside [1-9][0-9]* graph launches' "$out/captured.log"; then
    record captured-graphs FAIL 0
fi
run_step overlap "$dsv4" "${cuda[@]}" --set exec.cuda_graph=true diff --mode overlap-vs-serial --backend "$backend" --tokens 64 --decode 8
run_step resident "$dsv4" "${cuda[@]}" --set exec.cuda_graph=true diff --mode resident-vs-host --backend "$backend" --tokens 64 --decode 8
run_step batched "$dsv4" "${cuda[@]}" --set exec.cuda_graph=true --set exec.multi_stream_overlap=true \
    diff --mode batched-vs-solo --backend "$backend" --tokens 64 --decode 8
if [ "$on_cpu" = 1 ]; then
    bench_scope=(--no-machine --no-ops --no-e2e) # only the device section's path on the CPU
else
    bench_scope=(--configs tiny)
fi
run_step bench "$dsv4" bench --backend "$backend" "${bench_scope[@]}" --no-serving --out "$out/bench.json"
# The device section again with f32 sums (DSV4_CUDA_ACC=f32: the default on sm_86/89/120, where
# FP64 is slow), so one run on an f64 device (sm_80/90/100) times both kernel sets.
run_step bench-f32 env DSV4_CUDA_ACC=f32 "$dsv4" bench --backend "$backend" --no-machine --no-ops \
    --no-e2e --no-serving --out "$out/bench-f32.json"
# Nsight Compute on the decode GEMVs, as the bench launches them (the first launch of each):
# whether they are memory-, issue- or latency-bound. Only where ncu can read the counters
# (on gVisor it cannot); otherwise recorded as skipped, never failed.
profiles='[]'
if [ "$on_cpu" = 0 ] && command -v ncu >/dev/null 2>&1; then
    rows=()
    for k in linear_fp8_r1 linear_mxfp4_g1; do
        t0=$(date +%s)
        ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section SchedulerStats -k "regex:^$k\$" -c 1 "$dsv4" bench --backend "$backend" \
            --no-machine --no-ops --no-e2e --no-serving >"$out/profile-$k.log" 2>&1
        row=$(python3 - "$out/profile-$k.log" "$k" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
names = {"duration_us": r"Duration\s+us", "dram_pct": r"DRAM Throughput\s+%",
         "sm_pct": r"Compute \(SM\) Throughput\s+%", "issued_per_scheduler": r"Issued Warp Per Scheduler",
         "registers": r"Registers Per Thread\s+register/thread", "waves_per_sm": r"Waves Per SM",
         "achieved_warps_per_sm": r"Achieved Active Warps Per SM\s+warp"}
row = {"kernel": sys.argv[2]}
for key, pat in names.items():
    m = re.search(r"^\s+" + pat + r"\s+([0-9.,]+)\s*$", text, re.M)
    row[key] = float(m.group(1).replace(",", "")) if m else None
if row["duration_us"] is None:
    sys.exit(1)
print(json.dumps(row))
PY
        )
        if [ -n "$row" ]; then
            record "profile-$k" pass $(( $(date +%s) - t0 ))
            rows+=("$row")
            printf '    %s\n' "$row"
        else
            record "profile-$k" skip $(( $(date +%s) - t0 ))
            grep -m 2 -E 'ERR|rror' "$out/profile-$k.log" | sed 's/^/    /'
        fi
    done
    [ "${#rows[@]}" -gt 0 ] && profiles="[$(IFS=,; printf '%s' "${rows[*]}")]"
fi
# The linear kernels against the device's own limits, into the summary: each decode GEMV's
# weight bandwidth as a fraction of the copy bandwidth (target >= 60%), each prefill GEMM's
# TFLOP/s as a fraction of the matching mma rate.
linear_of() { # bench.json label -> the cases as a JSON array ([] when unreadable); a table on stderr
    python3 - "$1" "$2" <<'PY' || echo '[]'
import json, sys
cases = json.load(open(sys.argv[1]))["device"][0]["linear"]
keys = ("case", "path", "shape", "rows", "seconds", "graphed", "launched_seconds", "weight_gbs", "of_copy_bandwidth",
        "launched_of_copy_bandwidth", "tflops", "of_matrix_rate", "copies")
print(f"  linear kernels, {sys.argv[2]} (calls replayed as a CUDA graph; launched one by one in brackets):", file=sys.stderr)
for t in cases:
    share = f"{t['of_copy_bandwidth']:.0%} of copy bandwidth ({t['launched_of_copy_bandwidth']:.0%})" if t["rows"] == 1 else \
        f"{t['of_matrix_rate']:.0%} of the mma rate" if t["of_matrix_rate"] is not None else "no mma rate"
    print(f"    {t['case']:<42} {t['path']:<4} {share}", file=sys.stderr)
for path in ("simt", "mma"):
    gemv = [t["of_copy_bandwidth"] for t in cases if t["rows"] == 1 and t["path"] == path]
    print(f"    decode GEMV ({path}) >= 60% of copy bandwidth: {'yes' if gemv and min(gemv) >= 0.6 else 'no'}", file=sys.stderr)
simt = {t["case"]: t["seconds"] for t in cases if t["path"] == "simt"}
for t in cases:
    if t["path"] == "mma" and t["case"] in simt:
        print(f"    {t['case']:<42} mma runs {simt[t['case']] / t['seconds']:.2f}x the simt speed", file=sys.stderr)
print(json.dumps([{k: t.get(k) for k in keys} for t in cases]))
PY
}
# The fp8 and MXFP4 decode GEMVs on every compiled shape of the one-row kernels (columns a
# warp, warps a block, rounds of loads in flight; DSV4_CUDA_DECODE picks one): which is fastest
# on this GPU.
shapes_of() { # bench.json label -> the rows as a JSON array ([] when unreadable); a table on stderr
    python3 - "$1" "$2" <<'PY' || echo '[]'
import json, sys
rows = json.load(open(sys.argv[1]))["device"][0].get("decode_shapes", [])
print(f"  decode kernel shapes, {sys.argv[2]} (speed over the backend's shape):", file=sys.stderr)
for case in dict.fromkeys(r["case"] for r in rows):
    mine = [r for r in rows if r["case"] == case]
    best = max(mine, key=lambda r: r["speedup"])
    cells = "  ".join(f"{r['shape']}{'*' if r['selected'] else ''} {r['speedup']:.2f}x {r['of_copy_bandwidth']:.0%}" for r in mine)
    print(f"    {case:<42} {cells}  fastest {best['shape']}", file=sys.stderr)
bests = [max(r["of_copy_bandwidth"] for r in rows if r["case"] == c) for c in dict.fromkeys(r["case"] for r in rows)]
if bests:
    print(f"    every fp8/MXFP4 decode GEMV at its fastest shape >= 60% of copy bandwidth: {'yes' if min(bests) >= 0.6 else 'no'}", file=sys.stderr)
print(json.dumps([{k: r[k] for k in ("case", "shape", "selected", "seconds", "of_copy_bandwidth", "speedup")} for r in rows]))
PY
}
# The shapes the bench suggests pinning on this GPU (bench/suggest.rs: another shape only
# where it is faster in every case of its format by the margin); null when it made none.
suggestion_of() { # bench.json label -> the suggestion as JSON (null when none); a line on stderr
    python3 - "$1" "$2" <<'PY' || echo 'null'
import json, sys
s = json.load(open(sys.argv[1]))["device"][0].get("decode_suggestion")
if s:
    print(f"  suggested for {sys.argv[2]}: backend.cuda_decode = \"{s['cuda_decode']}\"" +
          ("" if s["changed"] else " (the shapes it ran)"), file=sys.stderr)
print(json.dumps(s))
PY
}
linear=$(linear_of "$out/bench.json" "default sums")
linear_f32=$(linear_of "$out/bench-f32.json" "f32 sums")
decode_shapes=$(shapes_of "$out/bench.json" "default sums")
decode_shapes_f32=$(shapes_of "$out/bench-f32.json" "f32 sums")
decode_suggestion=$(suggestion_of "$out/bench.json" "default sums")
decode_suggestion_f32=$(suggestion_of "$out/bench-f32.json" "f32 sums")
# The attention-side kernels (paged indexer, paged attention, mHC mixing) against the FMA rate
# of their sums.
kernels_of() { # bench.json label -> the cases as a JSON array ([] when unreadable); a table on stderr
    python3 - "$1" "$2" <<'PY' || echo '[]'
import json, sys
cases = json.load(open(sys.argv[1]))["device"][0]["kernels"]
print(f"  attention-side kernels, {sys.argv[2]}:", file=sys.stderr)
for k in cases:
    print(f"    {k['case']:<54} {k['of_fma_rate']:.0%} of the FMA rate", file=sys.stderr)
print(json.dumps([{key: k[key] for key in ("case", "tera_multiplies", "of_fma_rate")} for k in cases]))
PY
}
# The model diffs against the reference, from their JSON reports: the logits' agreement, each
# layer's indexer and router agreement (near-ties included) and the first divergence, if any.
models=$(python3 - "$out" <<'PY' || echo '[]'
import json, os, sys
rows = []
for step in ("model-tiny", "model-f32", "model-small", "model-mma"):
    path = os.path.join(sys.argv[1], step + ".json")
    if not os.path.exists(path):
        continue
    m = json.load(open(path))["model"]
    first = m["first_divergence"]
    rows.append({
        "step": step, "passed": m["passed"], "tokens": m["prefill_tokens"] + m["decode_steps"],
        "logits": m["logits"],
        "indexer": [{k: a[k] for k in ("layer", "tokens", "agreeing", "tied", "worst_tie")} for a in m["indexer"]],
        "router": [{k: a[k] for k in ("layer", "tokens", "agreeing", "tied", "worst_tie")} for a in m.get("router", [])],
        "first_divergence": None if first is None else f"{first['call']} {first['layer']}{first['op']}",
    })
print(json.dumps(rows))
PY
)
kernels=$(kernels_of "$out/bench.json" "default sums")
kernels_f32=$(kernels_of "$out/bench-f32.json" "f32 sums")
# The placement A/B of the bench's end-to-end section (docs/cuda.md): the captured batch-16
# decode as configured against siblings with attention or routing on the host, and with side
# streams against one stream.
placement=$(python3 - "$out/bench.json" <<'PY' || echo '[]'
import json, sys
sides = ("as configured", "host attention", "host routing", "captured, side streams")
rows = [e for e in json.load(open(sys.argv[1]))["e2e"]
        if e["metric"].startswith("decode batch 16, captured")
        or ": speedup" in e["metric"]
        or any(e["metric"].startswith(f"  {side}: ") for side in sides)]
if rows:
    print("  placement and side-stream A/B (captured batch-16 decode):", file=sys.stderr)
for e in rows:
    print(f"    {e['config']:<6} {e['metric']:<46} {e['value']:>10.2f} {e['unit']}", file=sys.stderr)
print(json.dumps([{k: e[k] for k in ("config", "metric", "value", "unit")} for e in rows]))
PY
)
# The emulated driver prints every call it refuses; a clean run has none.
if [ "${DSV4_CUDA_DRIVER:-}" = emu ]; then
    refused=$(grep -h 'dsv4 emulated driver:' "$out"/*.log | head -n 5)
    if [ -n "$refused" ]; then
        record driver-calls FAIL 0
        printf '%s\n' "$refused" | sed 's/^/    /'
    fi
fi

total=$(( $(date +%s) - start_all ))
failed=$(printf '%s\n' "${steps[@]}" | grep -c '"FAIL"')
{
    printf '{"schema":"dsv4.device-check/1","date":"%s","backend":"%s","gpu":"%s","seconds":%s,"failed":%s,"steps":[' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$backend" "${gpu//\"/}" "$total" "$failed"
    (IFS=,; printf '%s' "${steps[*]}")
    printf '],"models":%s,"page_cache":%s,"linear":%s,"linear_f32":%s,"decode_shapes":%s,"decode_shapes_f32":%s,"decode_suggestion":%s,"decode_suggestion_f32":%s,"kernels":%s,"kernels_f32":%s,"placement":%s,"profiles":%s}\n' \
        "$models" "$page_cache" "$linear" "$linear_f32" "$decode_shapes" "$decode_shapes_f32" "$decode_suggestion" "$decode_suggestion_f32" "$kernels" "$kernels_f32" "$placement" "$profiles"
} >"$out/summary.json"
echo "summary: $out/summary.json ($failed failed, ${total}s)"
[ "$failed" -eq 0 ]
