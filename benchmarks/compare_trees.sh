#!/usr/bin/env bash
# The same load against servers started from two checkouts, one at a time, alternating:
# before and after a change, measured side by side in one run.
#   bash benchmarks/compare_trees.sh OUT "FLAGS" LABEL_A TREE_A LABEL_B TREE_B [bench flags...]
# e.g. git worktree add /tmp/before HEAD~1 &&
#      bash benchmarks/compare_trees.sh results/ab "" before /tmp/before after . --users 30
# FLAGS go to both servers. Each tree is benchmarked twice, A B A B; results go to
# OUT/LABEL-1.json, OUT/LABEL-2.json. Run nothing else heavy meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1 FLAGS=$2 LABEL_A=$3 TREE_A=$4 LABEL_B=$5 TREE_B=$6
shift 6
BENCH_ARGS=("$@")
PORT=${PORT:-8123}
URL=http://127.0.0.1:$PORT
BENCH=$(pwd)/benchmarks/bench.py
mkdir -p "$OUT"

run() {  # run LABEL TREE
  local label=$1 tree=$2
  echo "=== $label: $tree/server.py $FLAGS" >&2
  # shellcheck disable=SC2086
  (cd "$tree" && exec python3 server.py --port "$PORT" $FLAGS) > "/tmp/nano-vllm-$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    curl -sf "$URL/health" > /dev/null && break
    kill -0 "$pid" 2> /dev/null || { cat "/tmp/nano-vllm-$label.log" >&2; exit 1; }
    sleep 1
  done
  python3 "$BENCH" --url "$URL" --label "$label" --results-dir "$OUT" "${BENCH_ARGS[@]}" || true
  kill "$pid"; wait "$pid" 2> /dev/null || true
}

for round in 1 2; do
  run "$LABEL_A-$round" "$TREE_A"
  run "$LABEL_B-$round" "$TREE_B"
done
