"""An embedding model (model/embedding.py) against sentence-transformers on the same folder:
a tiny random bidirectional Gemma 3 shaped like EmbeddingGemma, whose sliding window (8
tokens) is shorter than the inputs, so the bidirectional band matters; every pooling mode;
several inputs packed into one run. The real EmbeddingGemma is compared in
tests/api/test_embeddings.py."""

from __future__ import annotations

import pytest
import torch

from model.embedding import EmbeddingModel
from model.gguf.source import load_tokenizer
from model.loader import load_model
from tests.families import EMBEDDING_WINDOW, save_embedding_model

TEXTS = ["hello", "The quick brown fox jumps over the lazy dog, twice, and then once more.",
         "A longer text " * 12, "short one"]
COSINE = 0.9999


@pytest.fixture(scope="module", params=["mean", "cls", "lasttoken"])
def folder(request, tmp_path_factory, model_dir):
    return save_embedding_model(tmp_path_factory.mktemp(request.param) / "tiny", model_dir,
                                pooling=request.param)


def reference(folder, texts, prompt_name=None) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    return st.encode(texts, prompt_name=prompt_name, convert_to_tensor=True,
                     batch_size=len(texts)).float()


def test_embeddings_match_sentence_transformers(folder):
    model = load_model(folder)
    assert isinstance(model, EmbeddingModel)
    tokenizer = load_tokenizer(folder)
    prompt = model.info.prompts["query"]
    sequences = [tokenizer(prompt + t).input_ids for t in TEXTS]
    assert max(map(len, sequences)) > 3 * EMBEDDING_WINDOW  # the band is narrower than them
    ours = model.embed(sequences)  # all four packed into one run
    theirs = reference(folder, TEXTS, "query")
    cosines = torch.nn.functional.cosine_similarity(ours, theirs)
    print(f"{model.pooling}: 1 - cosine per text {(1 - cosines).tolist()}")
    assert ours.shape == theirs.shape == (len(TEXTS), 48)
    assert cosines.min().item() >= COSINE
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))
    alone = torch.cat([model.embed([s]) for s in sequences])  # packing changes nothing
    torch.testing.assert_close(ours, alone, atol=1e-5, rtol=1e-4)


def test_the_band_and_the_mask_matter(folder):
    """The sliding layers' band is what sentence-transformers computes (above); the whole
    sequence in every layer instead gives other vectors."""
    from model.attention import bidirectional

    model = load_model(folder)
    tokenizer = load_tokenizer(folder)
    sequence = tokenizer(TEXTS[2]).input_ids
    exact = model.embed([sequence])
    original = bidirectional.PackedBidirectionalAttention._band
    try:
        bidirectional.PackedBidirectionalAttention._band = (
            lambda self, n, reach, device: torch.ones(n, n, dtype=torch.bool))
        whole = model.embed([sequence])
    finally:
        bidirectional.PackedBidirectionalAttention._band = original
    assert (exact - whole).abs().max().item() > 1e-3


def test_a_folder_without_modules_json_is_refused(folder, tmp_path):
    import shutil

    copy = tmp_path / "bare"
    shutil.copytree(folder, copy)
    (copy / "modules.json").unlink()
    with pytest.raises(ValueError, match="sentence-transformers folder"):
        load_model(copy)
