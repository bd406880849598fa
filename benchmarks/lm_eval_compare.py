"""Compare lm-evaluation-harness runs (benchmarks/lm_eval_check.sh): each run's scores must
equal the `hf` run's exactly, and so must every generated answer; loglikelihoods are shown
with their largest difference from `hf` (fp32 sums in another order: not bit-equal).

    python3 benchmarks/lm_eval_compare.py results/tmp/lm_eval
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REFERENCE = "hf"


def scores(run: Path) -> dict[str, float]:
    [results] = sorted(run.rglob("results_*.json"))
    data = json.loads(results.read_text())["results"]
    return {f"{task}/{metric}": value for task, metrics in data.items()
            for metric, value in metrics.items()
            if isinstance(value, float) and "stderr" not in metric}


def samples(run: Path) -> dict[str, list]:
    """Per task, each document's filtered responses, in document order."""
    found = {}
    for path in run.rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        docs = sorted((json.loads(line) for line in path.open()), key=lambda d: d["doc_id"])
        found[task] = [d["filtered_resps"] for d in docs]
    return found


def largest_loglikelihood_difference(ours: list, reference: list) -> float:
    return max(abs(float(a[0]) - float(b[0]))
               for doc_a, doc_b in zip(ours, reference, strict=True)
               for a, b in zip(doc_a, doc_b, strict=True))


def main(out: Path) -> int:
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    table = {run.name: scores(run) for run in runs}
    print(f"{'metric':24}" + "".join(f"{run.name:>24}" for run in runs))
    for key in sorted(table[REFERENCE]):
        print(f"{key:24}" + "".join(f"{table[run.name].get(key, float('nan')):>24.4f}"
                                     for run in runs))
    reference = samples(out / REFERENCE)
    agree = True
    for run in runs:
        ours = samples(run)
        generated = ours["nano_gen"] == reference["nano_gen"]
        greedy = ([[c[1] for c in d] for d in ours["nano_mc"]]
                  == [[c[1] for c in d] for d in reference["nano_mc"]])
        diff = largest_loglikelihood_difference(ours["nano_mc"], reference["nano_mc"])
        print(f"{run.name}: scores equal {table[run.name] == table[REFERENCE]}, answers equal "
              f"{generated}, is_greedy equal {greedy}, loglikelihood max diff {diff:.2e}")
        agree &= table[run.name] == table[REFERENCE] and generated and greedy
    print("all equal to hf:", agree)
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
