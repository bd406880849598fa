"""/v1/embeddings, /v1/rerank and /v1/score on the real EmbeddingGemma-300M, against
sentence-transformers on the same folder (cosine of every embedding at least 0.9999), through
the openai SDK (which asks for base64 by default), LangChain's OpenAIEmbeddings and httpx.

It needs the model in the cache (`python3 -m model.gguf.source embeddinggemma-300m`, 1.1 GB,
which CI fetches); elsewhere it skips rather than download. About 40 s: both models load, and
sentence-transformers encodes a 2,000-token text.
"""

from __future__ import annotations

import math

import httpx
import openai
import pytest
import torch

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from model.gguf.source import load_tokenizer, release_path
from model.loader import load_model
from tests.api.conftest import serve
from tests.api.test_openapi_schema import OpenAISchemas, schemas  # noqa: F401 (a fixture)
from tests.conftest import missing

NAME = "embeddinggemma-300m"
COSINE = 0.9999
SHORT = ["What is the capital of France?", "Paris is the capital and largest city of France.",
         "Bananas are yellow and rich in potassium.", "hi"]
QUERY = "Which planet is known as the red planet?"
DOCUMENTS = ["Venus is the hottest planet in the solar system.",
             "Mars is often called the red planet because of iron oxide on its surface.",
             "Jupiter is the largest planet.", "The red fox lives in forests."]


@pytest.fixture(scope="module")
def folder():
    path = release_path(NAME)
    if not (path / "config.json").is_file():
        missing(f"{path} (python3 -m model.gguf.source {NAME} fetches it)")
    return path


@pytest.fixture(scope="module")
def st(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def embedding_server(folder):
    engine = BatchEngine(EngineConfig(max_num_batched_tokens=512), load_model(folder),
                         load_tokenizer(folder))
    yield from serve(engine, model_name=NAME)


@pytest.fixture(scope="module")
def client(embedding_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{embedding_server.url}/v1", api_key="x", max_retries=0,
                         timeout=120)


FILLER = ("the engine packs many inputs into one step while a bidirectional model sees every "
          "token of its input at once")


def long_text(tokens: int) -> str:
    words = FILLER.split()
    return " ".join(words[i % len(words)] for i in range(int(tokens * 0.95)))


def cosines(ours, theirs) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(torch.tensor(ours), theirs.float())


def test_embeddings_match_sentence_transformers_both_prompts(client, st):
    for prompt, texts in (("query", [*SHORT, long_text(2000)]), ("document", SHORT)):
        # One request: every input packed into the engine's steps (the long one alone).
        got = client.embeddings.create(model=NAME, input=texts,
                                       extra_body={"prompt_name": prompt})  # base64 on the wire
        ours = [d.embedding for d in got.data]
        theirs = st.encode(texts, prompt_name=prompt, convert_to_tensor=True)
        similarity = cosines(ours, theirs)
        print(f"{prompt}: 1 - cosine {(1 - similarity).tolist()}, usage {got.usage}")
        assert similarity.min().item() >= COSINE
        assert [d.index for d in got.data] == list(range(len(texts)))
        tokens = sum(len(st.tokenizer(st.prompts[prompt] + t).input_ids) for t in texts)
        assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    assert 1800 < len(st.tokenizer(long_text(2000)).input_ids) <= 2048


def test_every_matryoshka_size_is_cut_then_normalized(client, st):
    for size in (768, 512, 256, 128):
        got = client.embeddings.create(model=NAME, input=SHORT[:2], dimensions=size,
                                       encoding_format="float")
        theirs = st.encode(SHORT[:2], truncate_dim=size, convert_to_tensor=True)
        vectors = [d.embedding for d in got.data]
        assert all(len(v) == size for v in vectors)
        assert all(abs(math.fsum(x * x for x in v) - 1) < 1e-5 for v in vectors)
        assert cosines(vectors, theirs).min().item() >= COSINE
    with pytest.raises(openai.BadRequestError, match=r"one of \[768, 512, 256, 128\]"):
        client.embeddings.create(model=NAME, input="x", dimensions=300)


def test_token_ids_and_truncation(client, st, embedding_server):
    ids = st.tokenizer("Paris is the capital and largest city of France.").input_ids
    by_ids = client.embeddings.create(model=NAME, input=[ids], encoding_format="float")
    by_text = client.embeddings.create(model=NAME, input=SHORT[1], encoding_format="float")
    assert cosines([by_ids.data[0].embedding], torch.tensor([by_text.data[0].embedding]))[0] \
        > 0.99999
    url = f"{embedding_server.url}/v1/embeddings"
    too_long = httpx.post(url, json={"input": long_text(2300)}, timeout=60)
    assert too_long.status_code == 400 and "at most 2048" in too_long.json()["error"]["message"]
    cut = httpx.post(url, json={"input": long_text(2300), "truncate_prompt_tokens": 64},
                     timeout=60).json()
    assert cut["usage"]["prompt_tokens"] == 64
    st.max_seq_length = 64
    try:
        short_theirs = st.encode([long_text(2300)], convert_to_tensor=True)
    finally:
        st.max_seq_length = 2048
    assert cosines([cut["data"][0]["embedding"]], short_theirs)[0] >= COSINE


def test_rerank_and_score_follow_sentence_transformers(embedding_server, st):
    q = st.encode([QUERY], prompt_name="query", convert_to_tensor=True)
    d = st.encode(DOCUMENTS, prompt_name="document", convert_to_tensor=True)
    expected = st.similarity(q, d)[0]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    ranked = httpx.post(f"{embedding_server.url}/v1/rerank", timeout=60, json={
        "model": NAME, "query": QUERY, "documents": DOCUMENTS, "top_n": 3,
        "return_documents": True}).json()
    assert [r["index"] for r in ranked["results"]] == order[:3]
    assert ranked["results"][0]["document"]["text"] == DOCUMENTS[order[0]]
    for result in ranked["results"]:
        assert abs(result["relevance_score"] - expected[result["index"]].item()) < 1e-4
    scored = httpx.post(f"{embedding_server.url}/v1/score", timeout=60, json={
        "model": NAME, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert [round(s["score"], 4) for s in scored["data"]] == \
        [round(x, 4) for x in expected.tolist()]
    assert scored["usage"]["prompt_tokens"] == ranked["usage"]["total_tokens"]  # same texts


def test_langchain_embeddings(embedding_server, st):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: send text (by default LangChain sends tiktoken's ids,
    # which mean nothing to another model's tokenizer).
    embeddings = OpenAIEmbeddings(model=NAME, base_url=f"{embedding_server.url}/v1",
                                  api_key="x", check_embedding_ctx_length=False)
    vectors = embeddings.embed_documents(SHORT[:2])
    query = embeddings.embed_query(SHORT[0])
    theirs = st.encode(SHORT[:2], convert_to_tensor=True)
    assert cosines(vectors, theirs).min().item() >= COSINE
    assert cosines([query], theirs[:1])[0] >= COSINE


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "prompt_name": "nope"}, "prompt_name", "document, query"),
    ({"input": [[1, 2, 999999]]}, "input", "[0, 262145)"),
    ({"input": [[2, 3]], "prompt_name": "query"}, "prompt_name", "token ids"),
    ({"input": ""}, "input", ""),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1 or"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", ""),
    ({"input": "x", "dimensions": 100}, "dimensions", "trained"),
    ({"input": "x", "top_k": 3}, "top_k", "Unrecognized"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(embedding_server, body, param, words):
    answer = httpx.post(f"{embedding_server.url}/v1/embeddings", json=body, timeout=60)
    error = answer.json()["error"]
    assert answer.status_code == 400, answer.text
    assert error["param"] == param and words in error["message"]


def test_the_endpoints_refuse_the_other_kind_of_model(embedding_server, server):
    chat = httpx.post(f"{embedding_server.url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_not_generative"
    embed = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi"}, timeout=60)
    assert embed.status_code == 400 and embed.json()["error"]["code"] == "model_not_embedding"
    wrong = httpx.post(f"{embedding_server.url}/v1/embeddings", timeout=60,
                       json={"input": "hi", "model": "gpt-4"})
    assert wrong.status_code == 404


def test_metrics_count_the_inputs_embedded(embedding_server, client):
    def embedded() -> float:
        text = httpx.get(f"{embedding_server.url}/metrics", timeout=30).text
        line = next(x for x in text.splitlines()
                    if x.startswith("nano_vllm:embedding_inputs_total"))
        return float(line.split()[-1])

    before = embedded()
    client.embeddings.create(model=NAME, input=SHORT)
    assert embedded() == before + len(SHORT)


def test_the_float_answer_validates_against_openais_document(embedding_server,
                                                              schemas: OpenAISchemas):  # noqa: F811
    """(A base64 answer's `embedding` is a string, as OpenAI's API sends it, though the
    published schema lists only the float array.)"""
    body = httpx.post(f"{embedding_server.url}/v1/embeddings", timeout=60,
                      json={"input": SHORT[:2], "model": NAME, "dimensions": 128}).json()
    schemas.check("CreateEmbeddingResponse", body)


def test_the_document_lists_what_each_kind_of_model_serves(embedding_server, server):
    mine = httpx.get(f"{embedding_server.url}/openapi.json", timeout=30).json()["paths"]
    theirs = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    assert {"/v1/embeddings", "/v1/rerank", "/v1/score"} <= set(mine)
    assert "/v1/responses" not in mine and "/v1/messages" not in mine
    assert "/v1/embeddings" not in theirs and "/v1/responses" in theirs
