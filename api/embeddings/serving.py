"""/v1/embeddings, /v1/rerank and /v1/score over an embedding model's engine.

Each input is one engine request with nothing to generate: the engine packs many into one
step (engine/embedding_core.py) and hands each back its vector. A task prompt of the model
(config_sentence_transformers.json) goes before each text: the one `prompt_name` names on
/v1/embeddings; on rerank and score the query takes the model's "query" prompt and the
documents its "document" prompt, where it has them. Rerank and score, with a bi-encoder,
are the cosine of the query's and each document's embeddings.
"""

from __future__ import annotations

import base64
import math
import uuid
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.embeddings.protocol import (
    MAX_INPUTS,
    Embedding,
    EmbeddingFields,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankResultDocument,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from api.engine_client import EngineClient
from api.errors import APIError
from api.job import Job, Prompt
from api.sampling import check_priority
from api.serving import REQUEST_ID_HEADER, Arrivals, EngineRequests, failure
from engine.request import SamplingParams

EMBED = SamplingParams(max_tokens=0, temperature=0.0)  # the prompt alone, nothing sampled
QUERY, DOCUMENT = "query", "document"


@dataclass
class Inputs:
    """Texts (or token ids) to embed, each with the task prompt put before it."""

    items: list[str | list[int]]
    prompt: str = ""
    param: str = "input"  # the field they came from, for errors


class EmbeddingServing(EngineRequests):
    request_id_prefix = "embd"

    def __init__(self, engine: EngineClient, model_name: str, arrivals: Arrivals | None = None,
                 accept_unknown_fields: bool = False) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.accepted_model_names = {model_name, "default"}
        self.arrivals = arrivals or Arrivals()
        self.accept_unknown_fields = accept_unknown_fields

    @property
    def info(self):
        info = self.engine.embedding_info
        if info is None:
            raise APIError(f"The model '{self.model_name}' generates text and computes no "
                           "embeddings; serve an embedding model (such as "
                           "embeddinggemma-300m) for this endpoint.", "model",
                           code="model_not_embedding")
        return info

    # --- the endpoints -------------------------------------------------------------------

    async def embeddings(self, body: EmbeddingRequest, http_request: Request) -> Response:
        info = self.check(body)
        if body.dimensions is not None and body.dimensions not in info.matryoshka_dimensions:
            raise APIError(f"dimensions {body.dimensions} is not a size this model was trained "
                           f"for; choose one of {list(info.matryoshka_dimensions)}.",
                           "dimensions")
        name = body.prompt_name if body.prompt_name is not None else info.default_prompt_name
        inputs = Inputs(body.inputs(), self.task_prompt(name, "prompt_name"))
        if inputs.prompt and any(not isinstance(i, str) for i in inputs.items):
            raise APIError("prompt_name applies to text; token ids are embedded as they are.",
                           "prompt_name")
        job, vectors = await self.run(body, http_request, [inputs])
        if job is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if body.dimensions is not None:
            vectors = [truncated(v, body.dimensions, info.normalized) for v in vectors]
        data = [Embedding(index=i, embedding=encoded(v, body.encoding_format))
                for i, v in enumerate(vectors)]
        tokens = job_tokens(job)
        return self.answer(job, EmbeddingResponse(
            id=job.response_id, created=job.created, model=self.model_name, data=data,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)))

    async def rerank(self, body: RerankRequest, http_request: Request) -> Response:
        info = self.check(body)
        documents = body.texts()
        job, vectors = await self.run(body, http_request, [
            Inputs([body.query], info.prompts.get(QUERY, ""), "query"),
            Inputs(list(documents), info.prompts.get(DOCUMENT, ""), "documents")])
        if job is None:
            return Response(status_code=499)
        scores = cosines(vectors[0], vectors[1:])
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:body.top_n]
        results = [RerankResult(index=i, relevance_score=scores[i],
                                document=RerankResultDocument(text=documents[i])
                                if body.return_documents else None) for i in order]
        return self.answer(job, RerankResponse(
            id=job.response_id, model=self.model_name,
            usage=RerankUsage(total_tokens=job_tokens(job)), results=results))

    async def score(self, body: ScoreRequest, http_request: Request) -> Response:
        info = self.check(body)
        queries = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
        documents = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
        if len(queries) != 1 and len(queries) != len(documents):
            raise APIError(f"text_1 has {len(queries)} texts and text_2 {len(documents)}: send "
                           "one text_1, or as many as text_2 (pairs).", "text_1")
        job, vectors = await self.run(body, http_request, [
            Inputs(queries, info.prompts.get(QUERY, ""), "text_1"),
            Inputs(documents, info.prompts.get(DOCUMENT, ""), "text_2")])
        if job is None:
            return Response(status_code=499)
        query_vectors, document_vectors = vectors[:len(queries)], vectors[len(queries):]
        if len(queries) == 1:
            query_vectors = query_vectors * len(documents)
        data = [ScoreData(index=i, score=cosines(q, [d])[0])
                for i, (q, d) in enumerate(zip(query_vectors, document_vectors, strict=True))]
        tokens = job_tokens(job)
        return self.answer(job, ScoreResponse(
            id=job.response_id, created=job.created, model=self.model_name, data=data,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)))

    # --- what they share -----------------------------------------------------------------

    def check(self, body: EmbeddingFields):
        """The model's embedding info, once the body is one this server takes."""
        with self.arrivals.taken_in():
            if body.model is not None:
                self.check_model_name(body.model)
            body.check_supported(self.accept_unknown_fields)
            check_priority(body.priority, self.engine.scheduling_policy)
            return self.info

    def task_prompt(self, name: str | None, param: str) -> str:
        if name is None:
            return ""
        prompts = self.info.prompts
        if name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise APIError(f"{param} {name!r} is not one of this model's prompts ({known}).",
                           param)
        return prompts[name]

    async def run(self, body: EmbeddingFields, http_request: Request,
                  groups: list[Inputs]) -> tuple[Job | None, list[list[float]]]:
        """Every input of every group embedded, in order: the job and the vectors (None
        and [] if the client left first)."""
        count = sum(len(g.items) for g in groups)
        if count > MAX_INPUTS:
            raise APIError(f"{count} inputs in one request; at most {MAX_INPUTS}.",
                           groups[0].param)
        with self.arrivals.taken_in():
            prompts = await run_in_threadpool(self.tokenize, groups, body.truncate_prompt_tokens)
        client_id = http_request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        job = Job(f"{self.request_id_prefix}-{client_id}", self.model_name, prompts, 1, 1,
                  client_id=client_id)
        self.submit(job, [EMBED] * len(prompts), body.request_timeout, body.priority,
                    self.arrivals.count)
        vectors: list[list[float] | None] = [None] * len(prompts)
        async with aclosing(self.outputs(job, http_request)) as outputs:
            async for index, output in outputs:
                if output.error:
                    raise failure(output)
                job.record(index, output)
                vectors[index] = output.embedding
        if not job.done or any(v is None for v in vectors):
            return None, []
        return job, vectors  # type: ignore[return-value]

    def tokenize(self, groups: list[Inputs], truncate: int | None) -> list[Prompt]:
        """Each input's tokens (its prompt before a text): a 400 for one too long, unless
        `truncate` cuts it (-1: to the model's most), as sentence-transformers does."""
        most = self.engine.max_tokens_per_request
        if truncate is not None and not (truncate == -1 or 1 <= truncate <= most):
            raise APIError(f"truncate_prompt_tokens must be -1 or in [1, {most}].",
                           "truncate_prompt_tokens")
        limit = most if truncate in (None, -1) else truncate
        vocab = len(self.tokenizer)
        prompts = []
        for group in groups:
            for i, item in enumerate(group.items):
                where = f"{group.param}[{i}]" if len(group.items) > 1 else group.param
                if isinstance(item, str):
                    ids = self.tokenizer(group.prompt + item, truncation=truncate is not None,
                                         max_length=limit).input_ids
                else:
                    if any(t >= vocab for t in item):
                        raise APIError(f"Token ids in {where} must be in [0, {vocab}).", where)
                    ids = item[:limit] if truncate is not None else item
                if len(ids) > most:
                    raise APIError(f"{where} has {len(ids)} tokens; this model takes at most "
                                   f"{most} (truncate_prompt_tokens cuts longer inputs).",
                                   where, code="context_length_exceeded")
                prompts.append(Prompt(ids, item if isinstance(item, str) else None))
        return prompts

    def answer(self, job: Job, body: EmbeddingResponse | RerankResponse | ScoreResponse,
               ) -> JSONResponse:
        return JSONResponse(body.model_dump(exclude_none=True),
                            headers={REQUEST_ID_HEADER: job.client_id})


def job_tokens(job: Job) -> int:
    return sum(len(p.token_ids) for p in job.prompts)


def truncated(vector: list[float], size: int, normalize: bool) -> list[float]:
    """A Matryoshka embedding cut to `size`, normalized again if the model normalizes."""
    cut = vector[:size]
    if not normalize:
        return cut
    norm = math.sqrt(sum(x * x for x in cut)) or 1.0
    return [x / norm for x in cut]


def encoded(vector: list[float], encoding_format: str | None) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


def cosines(query: list[float], documents: list[list[float]]) -> list[float]:
    q = np.asarray(query, dtype=np.float64)
    d = np.asarray(documents, dtype=np.float64)
    norms = np.linalg.norm(d, axis=1) * (np.linalg.norm(q) or 1.0)
    return (d @ q / np.where(norms == 0, 1.0, norms)).tolist()

