#!/usr/bin/env bash
# End-to-end incident rehearsal (docs/incident-rehearsal.md): inject the multi-stream aliasing fault,
# watch `dsv4 stress` find corrupted sessions, record a wrong hypothesis and falsify it with an A/B,
# validate the real fix (exec.multi_stream_overlap=false) with `dsv4 ab`, commit it with
# `dsv4 ledger record`, and generate the incident document. Everything runs against real servers on
# loopback; every number in the output is measured by this run.
#
# Usage: examples/incident-rehearsal/run.sh [SCRATCH_DIR]
#   SCRATCH_DIR  an empty or missing directory for the scratch git repository (default: a new temp dir)
# Environment:
#   DSV4      the dsv4 binary (default: build it with cargo and use target/debug/dsv4)
#   SESSIONS  sessions per arm and repeat (default 16), REPEAT repeats per A/B (default 2),
#   TURNS     turns per session (default 2), CONCURRENCY sessions at a time (default 16)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
scratch="${1:-$(mktemp -d -t dsv4-rehearsal.XXXXXX)}"
SESSIONS="${SESSIONS:-16}"
REPEAT="${REPEAT:-2}"
TURNS="${TURNS:-2}"
CONCURRENCY="${CONCURRENCY:-16}"
INCIDENT="rehearsal-multi-stream-aliasing"

if [[ -z "${DSV4:-}" ]]; then
    echo "== building dsv4 (cargo build -p dsv4-cli)" >&2
    (cd "$repo_root" && cargo build -q -p dsv4-cli)
    DSV4="$repo_root/target/debug/dsv4"
fi
command -v python3 >/dev/null || { echo "error: python3 is needed to read JSON" >&2; exit 2; }

mkdir -p "$scratch"
if [[ -n "$(ls -A "$scratch")" ]]; then
    echo "error: $scratch is not empty; give an empty or missing directory" >&2
    exit 2
fi
cd "$scratch"
echo "== scratch repository: $scratch"
git init -q -b main .
git config user.name >/dev/null || git config user.name "dsv4 rehearsal"
git config user.email >/dev/null || git config user.email "rehearsal@dsv4.invalid"
mkdir -p profiles
cat > profiles/drill.toml <<'TOML'
# Drill: the shipped `rehearsal` profile (captured plans, multi-stream overlap, bf16 index keys,
# the canary on every pool) with the incident's aliasing allocator injected.
extends = "rehearsal"

[exec]
multi_stream_overlap = true # the knob under suspicion

[debug]
inject = ["arena-ignores-streams"] # the bug being rehearsed: arena lifetimes ignore streams
TOML
git add profiles/drill.toml
git commit -q -m "drill profile: rehearsal + the arena-ignores-streams fault"

# Short free-text answers (the tiny model's forced tool calls need ~200 tokens to finish), every
# turn replayed alone afterwards: the solo oracle is what sees the corruption.
workload=(--sessions "$SESSIONS" --concurrency "$CONCURRENCY" --turns "$TURNS" --seed 7
          --max-tokens 16 --growth-chars 60 --forced-tool-rate 0 --oracle solo --stop-before-markup)
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

echo
echo "== 1. dsv4 stress against the drill profile (the fault is live)"
"$DSV4" serve --profile drill --port 0 > serve.out 2> serve.err &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 600); do
    url="$(grep -o 'http://[0-9.:]*' serve.out | head -1 || true)"
    [[ -n "$url" ]] && python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$url" 2>/dev/null && break
    sleep 0.2
done
[[ -n "$url" ]] || { echo "error: the server did not start:" >&2; cat serve.err >&2; exit 1; }
set +e
"$DSV4" stress --url "$url" "${workload[@]}" --quiet --json stress.json
stress_rc=$?
set -e
kill $serve_pid; wait $serve_pid 2>/dev/null || true
trap - EXIT
failed="$(json stress.json "d['failed_sessions']")"
echo "stress: $failed of $SESSIONS sessions corrupted (exit status $stress_rc); signatures: $(json stress.json "d['signatures']")"
if [[ "$failed" == 0 ]]; then
    echo "error: the fault produced no corrupted session; nothing to rehearse" >&2
    exit 1
fi

echo
echo "== 2. a wrong hypothesis: the bf16 indexer keys are the cause"
wrong="bf16 indexer keys change top-k selection under concurrency; fp8 keys would avoid it"
hyp="$("$DSV4" --profile drill ledger record --incident "$INCIDENT" --status proposed \
    --title "bf16 index keys corrupt tool calls under load" --hypothesis "$wrong" \
    --evidence stress.json --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["id"])')"
echo "recorded hypothesis $hyp"
"$DSV4" --profile drill ab --a drill --b-set numerics.index_k_dtype=fp8 --repeat "$REPEAT" \
    "${workload[@]}" --quiet --json ab-index-k.json
p="$(json ab-index-k.json "d['p_value']")"
echo "A/B index_k_dtype bf16 -> fp8: p = $p"
"$DSV4" --profile drill ledger record --incident "$INCIDENT" --status falsified --supersedes "$hyp" \
    --title "fp8 index keys do not remove the corruption (A/B p = $p)" --hypothesis "$wrong" \
    --evidence ab-index-k.json --json > /dev/null

echo
echo "== 3. the fix: exec.multi_stream_overlap=false"
"$DSV4" --profile drill ab --a drill --b-set exec.multi_stream_overlap=false --repeat "$REPEAT" \
    "${workload[@]}" --quiet --json ab-overlap.json
p="$(json ab-overlap.json "d['p_value']")"
fa="$(json ab-overlap.json "d['a']['failures']")"; na="$(json ab-overlap.json "d['a']['sessions']")"
fb="$(json ab-overlap.json "d['b']['failures']")"; nb="$(json ab-overlap.json "d['b']['sessions']")"
echo "A/B multi_stream_overlap true -> false: $fa/$na vs $fb/$nb failed sessions, p = $p"
status=validated
if ! python3 -c "import sys; sys.exit(0 if float('$p') < 0.05 and $fb == 0 else 1)"; then
    echo "warning: the A/B did not validate the fix (p = $p, $fb failures with the fix); recording it as proposed" >&2
    status=proposed
fi
"$DSV4" --profile drill --set exec.multi_stream_overlap=false ledger record --from true \
    --incident "$INCIDENT" --status "$status" --title "Turn off multi-stream overlap" \
    --hypothesis "the captured-plan arena aliases side-stream scratch with main-stream buffers; one stream removes the race" \
    --evidence ab-overlap.json --json > /dev/null

echo
echo "== 4. the ledger and the incident document"
"$DSV4" ledger log
"$DSV4" ledger verify
cp "docs/incidents/$INCIDENT.md" incident.before
"$DSV4" ledger render
cmp "docs/incidents/$INCIDENT.md" incident.before && echo "dsv4 ledger render regenerates docs/incidents/$INCIDENT.md byte for byte"
rm incident.before
git log --oneline
echo
echo "incident document: $scratch/docs/incidents/$INCIDENT.md"
