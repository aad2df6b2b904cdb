#!/usr/bin/env bash
# Model diff of the reference (oracle) against a candidate backend in every numerics combination,
# for the tiny model and the small config. Usage: scripts/diff-all-numerics.sh [CANDIDATE] [TOKENS]
# Prints one line per run and exits 1 if any run fails. The small checkpoint is written once to
# ${DSV4_SMALL_DIR:-target/small-model} with `dsv4 model init-random --config small`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
candidate=${1:-cpu}
tokens=${2:-192}
cargo build --release -q -p dsv4-cli
dsv4=target/release/dsv4
small=${DSV4_SMALL_DIR:-target/small-model}
[ -f "$small/model.safetensors" ] || "$dsv4" model init-random --config small --out "$small" >/dev/null
failed=0
for model in tiny "$small"; do
  for kv in bf16 fp8; do for ik in bf16 fp8 fp4; do for aq in none fp8; do
    out=$("$dsv4" --set model.path="$model" --set numerics.kv_cache_dtype=$kv \
      --set numerics.index_k_dtype=$ik --set numerics.act_quant=$aq \
      diff --model --against "$candidate" --tokens "$tokens" --decode 4 2>&1) || failed=1
    summary=$(grep -E '^(first divergence|logits|result)' <<<"$out" | tr '\n' ' ')
    echo "$(basename "$model") kv=$kv index_k=$ik act=$aq: $summary"
  done; done; done
done
exit $failed
