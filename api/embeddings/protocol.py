"""The bodies of /v1/embeddings (OpenAI's shape), /v1/rerank (the Jina and Cohere shape that
vLLM and llama.cpp serve) and /v1/score (vLLM's), requests and responses."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.field_policy import EMBEDDINGS, RERANK, SCORE
from api.protocol import NonEmptyText, NullFalse, RequestBody, TokenIds, or_null
from api.sampling import MIN_REQUEST_TIMEOUT

Texts = Annotated[list[NonEmptyText], Field(min_length=1)]
MAX_INPUTS = 2048  # inputs in one request, as OpenAI's API allows


class EmbeddingFields(RequestBody):
    """What every embedding endpoint takes besides its inputs."""

    # A field no table names is judged by the field policy (a 400 by default).
    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    # A task prompt of the model's (config_sentence_transformers.json), put before each text.
    prompt_name: str | None = None
    # Inputs longer than the model takes: cut to this many tokens (-1: the model's most)
    # instead of a 400.
    truncate_prompt_tokens: int | None = None
    priority: Annotated[int, *or_null("integer", 0)] = 0
    request_timeout: float | None = Field(default=None, ge=MIN_REQUEST_TIMEOUT,
                                          allow_inf_nan=False)


class EmbeddingRequest(EmbeddingFields):
    ENDPOINT: ClassVar[str] = EMBEDDINGS
    # Text, token ids, or a list of either.
    input: (NonEmptyText | TokenIds | Annotated[list[NonEmptyText], Field(min_length=1)]
            | Annotated[list[TokenIds], Field(min_length=1)])
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if isinstance(self.input[0], str | list):
            return list(self.input)  # type: ignore[arg-type]
        return [self.input]  # type: ignore[list-item]


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: NonEmptyText


class RerankRequest(EmbeddingFields):
    ENDPOINT: ClassVar[str] = RERANK
    query: NonEmptyText
    documents: Annotated[list[NonEmptyText | RerankDocument], Field(min_length=1)]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: NullFalse = False

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreRequest(EmbeddingFields):
    ENDPOINT: ClassVar[str] = SCORE
    # One text against one or several, or pairs (text_1[i] with text_2[i]).
    text_1: NonEmptyText | Texts
    text_2: NonEmptyText | Texts


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a float32 little-endian base64 string, if asked


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class RerankResultDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankResultDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage
