#!/usr/bin/env bash
# Every benchmark in the README, side by side in one session, one server at a time.
#   bash benchmarks/run_all.sh [results-dir]    (about 25 minutes on 2 CPU cores)
# Each level is repeated (--rounds) where a repeat measures the same thing; not for the prefix
# cache runs, whose later rounds would find the whole system prompt cached by the first.
# Results go to results/<label>.json, charts to docs/charts/, the decode profile to
# results/profile_decode.json. Run nothing else heavy meanwhile: the numbers are ratios
# measured in this one run.
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: scripts run as python3 benchmarks/X.py
OUT=${1:-results}
PORT=${PORT:-8123}
URL=http://127.0.0.1:$PORT

bench_server() {  # bench_server LABEL SERVER_SCRIPT "SERVER FLAGS" BENCH FLAGS...
  local label=$1 script=$2 flags=$3; shift 3
  echo "=== $label: python3 $script $flags" >&2
  # shellcheck disable=SC2086
  python3 "$script" --port "$PORT" $flags > "/tmp/nano-vllm-$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    curl -sf "$URL/health" > /dev/null && break
    kill -0 "$pid" 2> /dev/null || { cat "/tmp/nano-vllm-$label.log" >&2; exit 1; }
    sleep 1
  done
  python3 benchmarks/bench.py --url "$URL" --label "$label" --results-dir "$OUT" "$@" || true
  kill "$pid"; wait "$pid" 2> /dev/null || true
}

# 1. Our engine against the baseline (per-user padded KV cache), same load.
bench_server nano-vllm server.py "" --users 1 10 30 40 --max-tokens 100 --rounds 2
bench_server baseline baseline_server.py "" --users 1 10 30 40 --max-tokens 100 --rounds 2
# 1b. The same load in bfloat16 (this CPU has AVX-512 bf16), for reference.
bench_server nano-vllm-bf16 server.py "--dtype bfloat16" --users 1 10 30 40 --max-tokens 100 \
  --rounds 2
# 2. Prefix caching on and off, ~500-token system prompt shared by 30 users.
bench_server prefix-cache-on server.py "" --users 30 --max-tokens 100 --system-repeats 50
bench_server prefix-cache-off server.py "--no-prefix-cache" --users 30 --max-tokens 100 \
  --system-repeats 50
# 3. Batched prefill under the token budget against one newcomer prefilled per step.
bench_server prefill-one-at-a-time server.py "--max-prefills-per-step 1" --users 10 30 \
  --max-tokens 100 --rounds 3
bench_server prefill-batched server.py "" --users 10 30 --max-tokens 100 --rounds 3
# 4. Where a decode step's time goes.
python3 benchmarks/profile_decode.py --users 1 10 30 --contexts 100 1000 2000 \
  --out "$OUT/profile_decode.json"
python3 benchmarks/profile_decode.py --attention torch --users 30 --contexts 100 1000 \
  --out "$OUT/profile_decode_torch.json"
# 5. Charts.
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
for _ in $(seq 300); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
python3 benchmarks/bench.py --url "$URL" --label preemption-64-blocks --results-dir "$OUT" \
  --users 30 --max-tokens 100 || true
curl -s "$URL/metrics" | grep -E '^nano_vllm:(num_preemptions_total|request_success_total)' \
  > "$OUT/preemption_metrics.txt"
kill "$PID"; wait "$PID" 2> /dev/null || true
cat "$OUT/preemption_metrics.txt"
