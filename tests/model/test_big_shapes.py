"""A 7B-class GGUF file without its 4.7 GB: Qwen2.5-7B's real shapes and Q4_K_M's types in
a header whose tensor data is a sparse tail of zeros (tests/model/gguf_files.py). A model
that cannot fit is refused before anything large is allocated, with what it needs and what
is free; one that fits is sized from its header without reading a tensor."""

from __future__ import annotations

import time

import pytest

from model import memory
from model.memory import GIB, ModelTooLarge, check_fits, weights_bytes
from tests.model.gguf_files import qwen2_7b_tensors, write_sparse_gguf


@pytest.fixture(scope="module")
def sparse_7b(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "qwen2.5-7b-shapes.gguf"
    fields, tensors = qwen2_7b_tensors()
    size = write_sparse_gguf(path, "qwen2", fields, tensors)
    assert path.stat().st_blocks * 512 < 1024**2, "the tail must cost no disk"
    return path, size


def test_the_weights_are_sized_from_the_header(sparse_7b):
    path, size = sparse_7b
    codes, dense = weights_bytes(path, "gguf"), weights_bytes(path, "dense")
    print(f"file {size / GIB:.2f} GiB: {codes / GIB:.2f} GiB on its codes, {dense / GIB:.1f} "
          "GiB dense")
    assert 1.0 < codes / size < 1.05  # Q4_K and Q6_K kept as the file has them, about
    assert dense > 28 * GIB  # 7.6 billion weights at 4 bytes


def test_a_model_that_cannot_fit_is_refused_before_it_is_read(sparse_7b, monkeypatch):
    from model.loader import load

    path, _ = sparse_7b
    monkeypatch.setattr(memory, "available_bytes", lambda: 3 * GIB)
    started = time.perf_counter()
    with pytest.raises(ModelTooLarge, match=r"need 4\.\d GiB as gguf weights.*3\.0 GiB free"):
        load(str(path))
    assert time.perf_counter() - started < 10  # the header only
    with pytest.raises(ModelTooLarge, match="drop --weights dense") as err:
        check_fits(path, "dense")
    print(err.value)


def test_the_server_says_so_and_exits(sparse_7b, capsys, monkeypatch):
    """In-process start: one line on stderr and exit status 1, no traceback."""
    import server

    path, _ = sparse_7b
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * GIB)  # below the 4.4 GiB
    args = server.build_parser(None).parse_args(["--model", str(path), "--no-engine-process"])
    assert server.run_server(None, args=args) == 1
    err = capsys.readouterr().err
    print(err)
    assert "error: qwen2.5-7b-shapes.gguf: its weights need" in err and "Traceback" not in err
