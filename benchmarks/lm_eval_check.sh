#!/usr/bin/env bash
# lm-evaluation-harness as a client: its `local-completions` model against this server must
# score a small local task (benchmarks/lm_eval_task/: multiple choice, scored by
# loglikelihood through echo + logprobs, and greedy generation with stop strings) exactly
# as its `hf` model scores it on the same model folder, with tokenized_requests true and
# false, batch size above 1.
#
#   bash benchmarks/lm_eval_check.sh
#
# Needs lm-eval (requirements-eval.txt), in .venv-eval/ or wherever LM_EVAL points.
# Results go to results/tmp/lm_eval/; the last lines compare them and the exit status says
# whether all agree.
set -euo pipefail
cd "$(dirname "$0")/.."

LM_EVAL=${LM_EVAL:-.venv-eval/bin/lm-eval}
MODEL_DIR=${MODEL_DIR:-$HOME/.cache/nano-vllm/SmolLM2-135M-Instruct}
PORT=${PORT:-8731}
BATCH=${BATCH:-4}
OUT=results/tmp/lm_eval
TASKS=nano_mc,nano_gen,nano_mc_eos
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

run() {  # name, model, model_args
    "$LM_EVAL" run --model "$2" --model_args "$3" --tasks "$TASKS" \
        --include_path benchmarks/lm_eval_task --batch_size "$BATCH" --seed 1234 --device cpu \
        --output_path "$OUT/$1" --log_samples > "$OUT/$1.log" 2>&1
    echo "$1: done"
}

local_runs() {  # against the server on $PORT, which benchmarks/live_server.py started
    for tokenized in True False; do
        run "local-tokenized-$tokenized" local-completions \
            "model=default,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer=$MODEL_DIR,tokenized_requests=$tokenized,num_concurrent=1,max_retries=1"
    done
}

if [[ ${1:-} == --local-runs ]]; then  # this script again, as the client of the server
    local_runs
    exit
fi

rm -rf "$OUT" && mkdir -p "$OUT"
run hf hf "pretrained=$MODEL_DIR,dtype=float32"
python3 benchmarks/live_server.py --port "$PORT" --log "$OUT/server.log" \
    python3 server.py --model "$MODEL_DIR" --port {port} -- \
    bash benchmarks/lm_eval_check.sh --local-runs

python3 benchmarks/lm_eval_compare.py "$OUT"
