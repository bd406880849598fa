"""Runs one scheduled step: builds the input tensors, runs the model over the paged cache,
samples. The runner owns the attention backend and the sampler; it reads each request's
position and block table but changes nothing in it (the scheduler does that).

The LM head runs only on the rows whose logits are used: each sequence's last row when it
samples, and every prompt row of a request that asked for prompt logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.cpu_load import ContentionWatch
from engine.logprobs import gather_logprobs, raw_logprobs
from engine.request import Request
from engine.sampler import Sampler
from engine.spec_decode import verify
from engine.step_types import RunnerOutput, ScheduledRequest, SchedulerOutput, SequenceStep
from kvcache.pool import KVCachePool
from model.attention import create_backend
from model.decode_stack import DecodeStack
from model.llama import LlamaModel

SHORT_CHUNK_ROWS = 8  # a chunk of at most this many tokens after cached ones attends row by row


class LogitsRows:
    """The rows a step needs logits for, as (step index, offset in that step's tokens),
    each computed once; `add` says which row of the logits it will be."""

    def __init__(self) -> None:
        self.positions: list[tuple[int, int]] = []
        self._index: dict[tuple[int, int], int] = {}

    def add(self, step: int, offset: int) -> int:
        key = (step, offset)
        if key not in self._index:
            self._index[key] = len(self.positions)
            self.positions.append(key)
        return self._index[key]


def take_rows(logits: Tensor, rows: list[int]) -> Tensor:
    """logits[rows]: a view when the rows are consecutive (usually all of them, in order),
    a copy otherwise (indexing by a list copies every row it takes)."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return logits[rows[0]:rows[0] + len(rows)]
    return logits[rows]


@dataclass
class ThreadPolicy:
    """How many threads a step's kernels get: one for a step of few tokens, all for a big one.

    On 2 cores shared with the HTTP loop (and, in a benchmark, the load generator), two
    OpenMP threads stall whenever one of them is preempted: measured end to end, one user's
    inter-token latency was 40% lower on one thread (bf16 11.7 vs 16.6 ms), while 30 users
    ran 15-30% faster on two (see the README's thread measurements)."""

    max_threads: int
    single_below: int  # steps that compute fewer tokens than this run on one thread
    current: int = 0
    # Fewer threads while other processes hold cores (engine/cpu_load.py); None: never.
    watch: ContentionWatch | None = None

    def apply(self, num_tokens: int) -> None:
        wanted = 1 if num_tokens < self.single_below else self.max_threads
        if wanted > 1 and self.watch is not None:
            wanted = min(wanted, self.watch.threads())
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVCachePool, attention_backend: str = "auto",
                 threads: ThreadPolicy | None = None, decode_stack: bool = True) -> None:
        self.model = model
        self.pool = pool
        self.device = model.norm.weight.device  # (the embedding may be quantized)
        self.threads = threads
        self.attention = create_backend(attention_backend, pool)
        self.attention_backend = self.attention.name
        # Decode steps' layers in one C++ call, where the model and kernels allow it
        # (model/decode_stack.py); it needs the attention kernel that reads blocks in place,
        # and one block table for all layers.
        self.decode_stack = (DecodeStack.build(model, pool)
                             if decode_stack and self.attention_backend == "cpu-kernel"
                             and pool.groups.num_groups == 1 else None)
        self.sampler = Sampler()
        self.matmul_path = ", ".join(sorted({m.matmul_path for m in model.modules()
                                             if hasattr(m, "matmul_path")}))

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Compute every scheduled token, sample for each request that reaches its end (a
        sample forked this step, with no tokens of its own, uses its parent's last row),
        verify the drafts of speculating requests (spec_decode.verify), and score the prompt
        rows of requests that asked for prompt logprobs."""
        self.pool.copy_blocks(scheduled.block_copies)
        steps: list[SequenceStep] = []
        step_of: dict[str, int] = {}  # request id -> index in steps (those computing tokens)
        for request_id, entry in scheduled.scheduled.items():
            if entry.num_tokens > 0:
                step_of[request_id] = len(steps)
                steps.append(SequenceStep(entry.token_ids(), entry.request.num_computed_tokens,
                                          entry.request.blocks.tables, need_logits=False))
        rows = LogitsRows()
        sampling: list[tuple[ScheduledRequest, int]] = []  # (who samples, its logits row)
        verifying: list[tuple[ScheduledRequest, list[int]]] = []  # (who, its k + 1 rows)
        for request_id, entry in scheduled.scheduled.items():
            if entry.draft_token_ids:
                n, k = entry.num_tokens, len(entry.draft_token_ids)
                verifying.append((entry, [rows.add(step_of[request_id], j)
                                          for j in range(n - k - 1, n)]))
            elif entry.request.params.max_tokens > 0 and entry.reaches_end:  # 0: prompt only
                source = step_of[entry.fork_of or request_id]
                sampling.append((entry, rows.add(source, len(steps[source].token_ids) - 1)))
        scoring = self._prompt_rows(scheduled, step_of, rows)
        logits = self.compute_logits(steps, rows.positions) if steps else None
        output = RunnerOutput()
        if sampling:
            assert logits is not None
            sampled = self.sampler.sample(take_rows(logits, [row for _, row in sampling]),
                                          [entry.request for entry, _ in sampling])
            for (entry, _), token, logprobs in zip(sampling, sampled.token_ids,
                                                   sampled.logprobs, strict=True):
                output.sampled_token_ids[entry.request_id] = [token]
                if logprobs is not None:
                    output.logprobs[entry.request_id] = [logprobs]
        for entry, verified_rows in verifying:
            assert logits is not None
            output.sampled_token_ids[entry.request_id] = verify(
                logits[verified_rows], entry.draft_token_ids, entry.request)
        if scoring:
            assert logits is not None
            self._score_prompts(logits, scoring, output)
        return output

    @staticmethod
    def _prompt_rows(scheduled: SchedulerOutput, step_of: dict[str, int],
                     rows: LogitsRows) -> list[tuple[int, Request, int]]:
        """(logits row, request, prompt position scored) for each prompt token whose
        logprob this step can give: row j scores token j + 1."""
        scoring = []
        for request_id, entry in scheduled.scheduled.items():
            request, n = entry.request, entry.num_tokens
            if request.prompt_logprobs is None or n == 0:
                continue
            start = request.num_computed_tokens
            first = max(start, len(request.prompt_logprobs) - 1)  # rows not scored before
            for j in range(first, min(start + n, request.num_prompt_tokens - 1)):
                scoring.append((rows.add(step_of[request_id], j - start), request, j + 1))
        return scoring

    @staticmethod
    def _score_prompts(logits: Tensor, scoring: list[tuple[int, Request, int]],
                       output: RunnerOutput) -> None:
        """Raw logprobs of the scored prompt tokens, into output.prompt_logprobs."""
        found = gather_logprobs(
            raw_logprobs(logits[[row for row, _, _ in scoring]]),
            [request.prompt_token_ids[j] for _, request, j in scoring],
            [request.params.prompt_logprobs or 0 for _, request, _ in scoring])
        for (_, request, _), logprobs in zip(scoring, found, strict=True):
            output.prompt_logprobs.setdefault(request.request_id, []).append(logprobs)

    @torch.inference_mode()
    def compute_logits(self, steps: list[SequenceStep],
                       rows: list[tuple[int, int]] | None = None) -> Tensor:
        """Logits [len(rows), vocab] for rows given as (step index, offset in its tokens);
        without rows, the last row of each step that needs logits, in the order of steps."""
        if rows is None:
            rows = [(i, len(s.token_ids) - 1) for i, s in enumerate(steps) if s.need_logits]
        # One-token sequences go first: they attend together in one batched call. So do the
        # rows of a short chunk after cached tokens (a speculative step's last token and
        # drafts): row j is a query over the first start_pos + j + 1 tokens, all of whose
        # K/V are written before attention runs, which is causal attention without
        # gathering the whole context (measured on the CPU kernel: README).
        single = [i for i, s in enumerate(steps) if len(s.token_ids) == 1
                  or (s.start_pos > 0 and len(s.token_ids) <= SHORT_CHUNK_ROWS)]
        chunks = sorted(set(range(len(steps))) - set(single))
        input_ids: list[int] = []
        positions: list[int] = []
        first_row = [0] * len(steps)  # step index -> its first row in the flat batch
        for i in single + chunks:
            s = steps[i]
            first_row[i] = len(input_ids)
            input_ids.extend(s.token_ids)
            positions.extend(range(s.start_pos, s.context_len))
        if self.threads is not None:
            self.threads.apply(len(input_ids))
        # One step's metadata per KV cache group, each through that group's block tables.
        self.attention.steps = [self.attention.build_metadata(
            [(steps[i].block_tables[g], steps[i].start_pos + j + 1) for i in single
             for j in range(len(steps[i].token_ids))],
            [(steps[i].block_tables[g], steps[i].context_len, len(steps[i].token_ids))
             for i in chunks]) for g in range(self.pool.groups.num_groups)]
        ids = torch.tensor(input_ids, device=self.device)
        where = torch.tensor(positions, device=self.device)
        logits_indices = torch.tensor([first_row[i] + k for i, k in rows], dtype=torch.long,
                                      device=self.device)
        try:
            if self.decode_stack is not None and not chunks:
                return self.decode_stack(ids, where, self.attention.steps[0], logits_indices)
            return self.model(ids, where, self.attention, logits_indices=logits_indices)
        finally:
            self.attention.steps = []
