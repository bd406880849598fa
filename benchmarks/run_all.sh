#!/usr/bin/env bash
# The runs of the results page's core sections, in one go, one server at a time: start-up,
# against llama.cpp on the same weights, against the baseline, against the first engine,
# prefix caching, batched prefill, where a decode step's time goes, a busy neighbour and
# preemption (docs/results.md lists them; every other section prints its own commands).
#   bash benchmarks/run_all.sh [results-dir]        (about 5 minutes on 2 CPU cores)
# Needs llama.cpp built once (bash benchmarks/llama_cpp.sh build && ... models), and the
# first engine's checkout for the before/after row: git worktree add --detach
# /tmp/first-engine bd9fa3b (FIRST_ENGINE=path overrides; skipped if absent).
# Results go to results/<label>.json, charts to docs/charts/, the decode profiles to
# results/profile_decode*.json, start-up times to results/startup/. Run nothing else
# meanwhile: the numbers are ratios measured in this one run. Each server is started, waited
# for and stopped by benchmarks/live_server.py.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results}
PORT=${PORT:-8123}
FIRST_ENGINE=${FIRST_ENGINE:-/tmp/first-engine}
mkdir -p "$OUT"

with_server() {  # with_server LOG TREE SERVER COMMAND... -- CLIENT COMMAND...
  local log=$1 tree=$2; shift 2
  python3 benchmarks/live_server.py --port "$PORT" --log "$log" --cwd "$tree" "$@"
}

bench_server() {  # bench_server LABEL TREE SCRIPT "SERVER FLAGS" BENCH FLAGS...
  local label=$1 tree=$2 script=$3 flags=$4; shift 4
  echo "=== $label: $tree/$script $flags" >&2
  # A failed load is recorded in its JSON; only a server that does not come up stops the run.
  # shellcheck disable=SC2086
  with_server "/tmp/nano-vllm-$label.log" "$tree" --allow-client-failure \
    python3 "$script" --port {port} $flags -- \
    python3 benchmarks/bench.py --url {url} --label "$label" --results-dir "$OUT" "$@"
}

# 0. Start-up: a first start (no compiled kernels, no cached thread choice) and a later one.
python3 benchmarks/startup.py "$OUT/startup" nano-vllm=server.py

# 1. Against llama.cpp, the same weights in three precisions, and against the baseline.
LEVELS=(--users 1 30 --max-tokens 100 --rounds 2)
bench_server nano-vllm . server.py "" "${LEVELS[@]}"
bench_server nano-vllm-bf16 . server.py "--dtype bfloat16" "${LEVELS[@]}"
bench_server nano-vllm-q4_1 . server.py "--weights q4_1" "${LEVELS[@]}"
USERS="1 30" ROUNDS=2 bash benchmarks/llama_cpp.sh bench "$OUT"
bench_server nano-vllm-vs-baseline . server.py "" --users 1 10 30 --max-tokens 100
bench_server baseline . baseline_server.py "" --users 1 10 30 --max-tokens 100
if [[ -d $FIRST_ENGINE ]]; then
  bench_server nano-vllm-first-engine "$FIRST_ENGINE" server.py "" "${LEVELS[@]}"
fi
# 2. Prefix caching on and off, a ~690-token system prompt shared by 30 users.
bench_server prefix-cache-on . server.py "" --users 30 --max-tokens 100 --system-repeats 50
bench_server prefix-cache-off . server.py "--no-prefix-cache" --users 30 --max-tokens 100 \
  --system-repeats 50
# 3. Batched prefill under the token budget against one newcomer prefilled per step.
bench_server prefill-one-at-a-time . server.py "--max-prefills-per-step 1" --users 10 30 \
  --max-tokens 100 --rounds 2
bench_server prefill-batched . server.py "" --users 10 30 --max-tokens 100 --rounds 2
# 4. Where a decode step's time goes.
python3 benchmarks/profile_decode.py --users 1 30 --contexts 100 1000 \
  --out "$OUT/profile_decode.json"
python3 benchmarks/profile_decode.py --dtype bfloat16 --users 1 30 --contexts 100 1000 \
  --out "$OUT/profile_decode_bf16.json"
# 5. What a process spinning beside the engine costs a decode step, with and without giving
#    it the core (one file per CPU).
python3 benchmarks/neighbour.py --out-dir "$OUT/neighbour"
# 6. Preemption: 30 users in a pool of 64 blocks (1,024 tokens, about a third of what they
#    need at once). Every request must still finish; /metrics counts the preemptions.
with_server /tmp/nano-vllm-preemption.log . python3 server.py --port {port} --num-blocks 64 -- \
  bash -c 'python3 benchmarks/bench.py --url "$SERVER_URL" --label preemption-64-blocks \
             --results-dir "$1" --users 30 --max-tokens 100 || true
           curl -s "$SERVER_URL/metrics" \
             | grep -E "^nano_vllm:(num_preemptions_total|request_success_total)" \
             > "$1/preemption_metrics.txt"' _ "$OUT"
cat "$OUT/preemption_metrics.txt"
# 7. Charts and tables, once every run above is saved.
python3 benchmarks/report.py --results "$OUT"   # docs/results.md and docs/charts/
