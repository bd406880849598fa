#!/usr/bin/env bash
# Every benchmark in the README, side by side in one session, one server at a time.
#   bash benchmarks/run_all.sh [results-dir]        (about 30 minutes on 2 CPU cores)
# Needs llama.cpp built once (bash benchmarks/llama_cpp.sh build && ... models), and the
# first engine's checkout for the before/after row: git worktree add --detach
# /tmp/first-engine bd9fa3b (FIRST_ENGINE=path overrides; skipped if absent).
# Results go to results/<label>.json, charts to docs/charts/, the decode profiles to
# results/profile_decode*.json, start-up times to results/startup.txt. Run nothing else
# heavy meanwhile: the numbers are ratios measured in this one run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results}
PORT=${PORT:-8123}
URL=http://127.0.0.1:$PORT
FIRST_ENGINE=${FIRST_ENGINE:-/tmp/first-engine}
mkdir -p "$OUT"

wait_healthy() {  # wait_healthy PID LOG
  for _ in $(seq 600); do
    curl -sf "$URL/health" > /dev/null && return 0
    kill -0 "$1" 2> /dev/null || { cat "$2" >&2; exit 1; }
    sleep 0.2
  done
}

bench_server() {  # bench_server LABEL TREE SCRIPT "SERVER FLAGS" BENCH FLAGS...
  local label=$1 tree=$2 script=$3 flags=$4; shift 4
  echo "=== $label: $tree/$script $flags" >&2
  # shellcheck disable=SC2086
  (cd "$tree" && exec python3 "$script" --port "$PORT" $flags) > "/tmp/nano-vllm-$label.log" 2>&1 &
  local pid=$!
  wait_healthy "$pid" "/tmp/nano-vllm-$label.log"
  python3 benchmarks/bench.py --url "$URL" --label "$label" --results-dir "$OUT" "$@" || true
  kill "$pid"; wait "$pid" 2> /dev/null || true
}

# 0. Start-up: a first start (empty kernel cache: the kernels compile) and a later one.
KERNELS=$(mktemp -d)
for start in first later; do
  t0=$(python3 -c "import time; print(time.time())")
  TORCH_EXTENSIONS_DIR=$KERNELS python3 server.py --port "$PORT" > /tmp/nano-vllm-start.log 2>&1 &
  pid=$!
  wait_healthy "$pid" /tmp/nano-vllm-start.log
  echo "$start start (kernels $([ $start = first ] && echo compiled || echo cached)):" \
    "$(python3 -c "import time; print(round(time.time() - $t0, 1))") s to /health" \
    | tee -a "$OUT/startup.txt"
  kill "$pid"; wait "$pid" 2> /dev/null || true
done
rm -rf "$KERNELS"

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
# 2. Prefix caching on and off, ~500-token system prompt shared by 30 users.
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
# 5. Charts and tables.
python3 benchmarks/plot.py "$OUT/nano-vllm.json" "$OUT/baseline.json" --out docs/charts
python3 benchmarks/plot.py "$OUT/prefix-cache-on.json" "$OUT/prefix-cache-off.json" \
  --out docs/charts --prefix prefix_
python3 benchmarks/plot.py "$OUT/prefill-batched.json" "$OUT/prefill-one-at-a-time.json" \
  --out docs/charts --prefix prefill_
python3 benchmarks/report.py "$OUT" > "$OUT/tables.md"
# 6. Preemption: 30 users in a pool of 64 blocks (1,024 tokens, about a third of what they
#    need at once). Every request must still finish; /metrics counts the preemptions.
python3 server.py --port "$PORT" --num-blocks 64 > /tmp/nano-vllm-preemption.log 2>&1 &
PID=$!
wait_healthy "$PID" /tmp/nano-vllm-preemption.log
python3 benchmarks/bench.py --url "$URL" --label preemption-64-blocks --results-dir "$OUT" \
  --users 30 --max-tokens 100 || true
curl -s "$URL/metrics" | grep -E '^nano_vllm:(num_preemptions_total|request_success_total)' \
  > "$OUT/preemption_metrics.txt"
kill "$PID"; wait "$PID" 2> /dev/null || true
cat "$OUT/preemption_metrics.txt"
