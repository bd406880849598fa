"""Embeddings per second: our server against sentence-transformers in one process.

    python3 benchmarks/embeddings.py [--out-dir results/embeddings] [--quick]

It saves OUT_DIR/CPU.json, CPU the CPU's model in lower case with dashes.

Two workloads, the same texts for both sides: 256 short texts (about 20 tokens each) and 32
long ones (about 1,000 tokens), made from a fixed word list. sentence-transformers
(`SentenceTransformer(folder).encode`, fp32, no prompt) encodes each workload at every batch
size of a list, and its best is what we are compared with. Our server (`python3 server.py
--model embeddinggemma-300m`, started after, never beside it) gets the same texts from 16
concurrent clients, each sending one text a request, as a retrieval pipeline's workers would;
the load generator shares the machine's cores with the server. One warm-up pass each first.
Every vector we send back is checked against sentence-transformers' (cosine at least 0.9999)
so that a fast wrong answer cannot pass.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import torch

from benchmarks.neighbour import cpu_slug
from benchmarks.results import EmbeddingRun, EmbeddingWorkload, Machine
from model.gguf.source import fetch_release

MODEL = "embeddinggemma-300m"
CLIENTS = 16
WORDS = ("retrieval", "search", "engine", "model", "token", "vector", "query", "document",
         "answer", "paris", "france", "river", "mountain", "city", "history", "science",
         "music", "protein", "market", "energy", "climate", "data", "language", "learning",
         "network", "memory", "kernel", "cache", "thread", "batch", "server", "client")


@dataclass(frozen=True)
class Workload:
    name: str
    count: int
    words: int  # about 1.05 tokens a word with this list


WORKLOADS = (Workload("short", 256, 18), Workload("long", 32, 950))
ST_BATCHES = {"short": (16, 64, 256), "long": (1, 8, 32)}


def texts(workload: Workload) -> list[str]:
    rng = random.Random(workload.name)
    return [" ".join(rng.choice(WORDS) for _ in range(workload.words))
            for _ in range(workload.count)]


def sentence_transformers_rate(st, items: list[str], batches: tuple[int, ...]
                               ) -> tuple[float, int, torch.Tensor]:
    """The best texts per second over the batch sizes, that batch size, and the vectors."""
    st.encode(items[:batches[0]], batch_size=batches[0])  # warm-up
    best, best_batch, vectors = 0.0, 0, None
    for batch in batches:
        start = time.perf_counter()
        out = st.encode(items, batch_size=batch, convert_to_tensor=True)
        rate = len(items) / (time.perf_counter() - start)
        print(f"  sentence-transformers, batch {batch}: {rate:.1f} texts/s", flush=True)
        if rate > best:
            best, best_batch, vectors = rate, batch, out
    return best, best_batch, vectors


async def served_rate(url: str, items: list[str]) -> tuple[float, list[list[float]]]:
    """Texts per second with CLIENTS clients each sending one text a request, and the
    vectors in order."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(items)):
        queue.put_nowait(i)
    vectors: list[list[float] | None] = [None] * len(items)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            answer = await http.post(f"{url}/v1/embeddings", json={
                "model": MODEL, "input": items[i], "encoding_format": "float"})
            answer.raise_for_status()
            vectors[i] = answer.json()["data"][0]["embedding"]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=CLIENTS)
                                 ) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)))
        elapsed = time.perf_counter() - start
    return len(items) / elapsed, vectors  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "server.py", "--model", MODEL, "--port", str(port), *extra]
    print("  " + " ".join(command[1:]), flush=True)
    server = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path,
                        default=Path(__file__).resolve().parents[1] / "results" / "embeddings")
    parser.add_argument("--quick", action="store_true",
                        help="a few texts of each kind, to try the script (nothing saved)")
    parser.add_argument("--server-args", default="",
                        help="more flags for server.py, e.g. '--max-num-batched-tokens 2048'")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    folder = fetch_release(MODEL)
    workloads = [Workload(w.name, 8, w.words) if args.quick else w for w in WORKLOADS]
    st = SentenceTransformer(str(folder), device="cpu")
    reference = {}
    for w in workloads:
        print(f"{w.name}: {w.count} texts, sentence-transformers ...", flush=True)
        batches = tuple(b for b in ST_BATCHES[w.name] if b <= w.count) or (w.count,)
        reference[w.name] = sentence_transformers_rate(st, texts(w), batches)
    tokens = {w.name: sum(len(st.tokenizer(t).input_ids) for t in texts(w)) / w.count
              for w in workloads}
    del st
    port = free_port()
    server = start_server(port, args.server_args.split())
    results = []
    try:
        url = f"http://127.0.0.1:{port}"
        for w in workloads:
            items = texts(w)
            print(f"{w.name}: our server, {CLIENTS} clients ...", flush=True)
            asyncio.run(served_rate(url, items[:CLIENTS]))  # warm-up
            rate, vectors = asyncio.run(served_rate(url, items))
            st_rate, st_batch, st_vectors = reference[w.name]
            cosine = torch.nn.functional.cosine_similarity(
                torch.tensor(vectors), st_vectors.float()).min().item()
            print(f"  ours {rate:.1f} texts/s, sentence-transformers {st_rate:.1f} (batch "
                  f"{st_batch}): {rate / st_rate:.2f}x; lowest cosine {cosine:.6f}", flush=True)
            if cosine < 0.9999:
                raise SystemExit(f"{w.name}: a vector differs from sentence-transformers' "
                                 f"(cosine {cosine:.6f})")
            results.append(EmbeddingWorkload(w.name, w.count, round(tokens[w.name], 1),
                                             round(rate, 2), round(st_rate, 2), st_batch,
                                             round(cosine, 6)))
    finally:
        server.terminate()
        server.wait(60)
    if args.quick:
        return
    run = EmbeddingRun(Machine.this_one(), started_at, " ".join(["python3", *sys.argv]), MODEL,
                       CLIENTS, args.server_args, results)
    path = args.out_dir / f"{cpu_slug()}.json"
    run.save(path)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
