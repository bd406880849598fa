set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-results/round3-check}; mkdir -p $OUT
for pair in "nano server.py" "base baseline_server.py"; do
  set -- $pair
  python3 $2 --port 8177 > /tmp/final-$1.log 2>&1 & pid=$!
  for i in $(seq 240); do curl -sf localhost:8177/health >/dev/null && break; sleep 1; done
  python3 benchmarks/bench.py --url http://127.0.0.1:8177 --label $1 --results-dir $OUT --users 1 30 --max-tokens 100
  kill $pid; wait $pid 2>/dev/null
done
