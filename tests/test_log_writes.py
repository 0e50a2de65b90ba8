"""The log's tensor files are written in pieces (tensor_pieces: the header,
then each array's own memory) with their sha256 taken beside the write: the
bytes are safetensors' own, and a failed write leaves the old file."""

from __future__ import annotations

import errno
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save

from tracelog import log as tlog
from tracelog.sample import encode_tensors, tensor_pieces

_DTYPES: list[Any] = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "uint16",
    "float16",
    "int32",
    "uint32",
    "float32",
    "float64",
    "int64",
    "uint64",
    "complex64",
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]
# names safetensors orders and escapes: upper before lower, non-ASCII, quotes,
# control characters, the empty name
_NAMES = ["a", "b", "Z", "é", "x/1", 'a"q', "n\nl", "\x01", "param/h.0", "param/h.10", "", "\u2028"]


def _joined(pieces: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def test_the_pieces_are_the_bytes_safetensors_writes() -> None:
    draw = random.Random(0)
    for trial in range(300):
        tensors = {}
        for _ in range(draw.randint(0, 8)):
            shape = tuple(draw.choice([0, 1, 2, 3, 5]) for _ in range(draw.randint(0, 3)))
            values = np.asarray(np.random.default_rng(trial).random(shape) * 10)
            tensors[draw.choice(_NAMES) + str(draw.randint(0, 3))] = values.astype(
                draw.choice(_DTYPES)
            )
        metadata = draw.choice([None, {"run": "abc"}, {"é\n": '\x00x"\\'}])
        pieces = tensor_pieces(tensors, metadata)
        assert pieces is not None
        assert _joined(pieces) == save(tensors, metadata=metadata), (tensors, metadata)


def test_non_contiguous_arrays_are_written_as_their_values() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T
    pieces = tensor_pieces({"a": a, "loss": np.array(0.5, np.float32)})
    assert pieces is not None
    assert _joined(pieces) == encode_tensors({"a": a, "loss": np.array(0.5, np.float32)})


def test_what_safetensors_alone_decides_is_left_to_it() -> None:
    x = {"x": np.zeros(2, np.float32)}
    assert tensor_pieces(x, {"a": "1", "b": "2"}) is None  # the entries' order is its own
    assert tensor_pieces(x, {}) is None
    assert tensor_pieces({"x": np.zeros(2, ">f4")}) is None
    assert tensor_pieces({"x": np.zeros(2, np.complex128)}) is None


@pytest.mark.parametrize("size", [100, 3 << 20])  # hashed inline, and on a helper thread
def test_a_hashed_write_gives_the_files_sha256(tmp_path: Path, size: int) -> None:
    tensors = {"w": np.random.default_rng(0).random(size // 8), "b": np.ones(3, np.float32)}
    pieces = tensor_pieces(tensors, {"run": "x"})
    assert pieces is not None
    path = tmp_path / "weights.safetensors"
    digest = tlog._hashed_write(path, pieces)
    data = path.read_bytes()
    assert data == save(tensors, metadata={"run": "x"})
    assert digest == hashlib.sha256(data).hexdigest()


def test_a_failed_hashed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "sample.safetensors"
    path.write_bytes(b"old")

    def full(f: Any, data: Any) -> None:
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tlog, "_fill", full)
    pieces = tensor_pieces({"w": np.ones(1 << 18)})
    assert pieces is not None
    with pytest.raises(OSError, match="No space"):
        tlog._hashed_write(path, pieces)
    assert path.read_bytes() == b"old"
    assert not list(tmp_path.glob(".*.tmp*"))


def _plain(draw: random.Random, depth: int) -> Any:
    kind = draw.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return draw.choice(["", "a", 'é\n"\\', "\u2028\x01", "x" * 30, "\ud83d\ude00"])
    if kind == 1:
        return draw.randint(-(10**20), 10**20)
    if kind == 2:
        return draw.choice([0.1, -0.0, 1e300, float("inf"), float("-inf"), float("nan"), 3.0])
    if kind == 3:
        return draw.choice([True, False])
    if kind == 4:
        return None
    if kind == 5:
        return draw.randint(0, 9)
    if kind == 6:
        return {
            draw.choice(_NAMES) + str(k): _plain(draw, depth + 1) for k in range(draw.randint(0, 4))
        }
    if kind == 7:
        return [_plain(draw, depth + 1) for _ in range(draw.randint(0, 4))]
    return tuple(_plain(draw, depth + 1) for _ in range(draw.randint(0, 3)))


def test_indented_json_is_jsons_own_text() -> None:
    draw = random.Random(0)
    for _ in range(2000):
        obj = _plain(draw, 0)
        assert tlog.indented_json(obj) == json.dumps(obj, indent=1, sort_keys=True), obj


def test_indented_json_leaves_what_is_not_plain_to_json() -> None:
    class Code(int):
        pass

    for obj in [{1: "a", 2: "b"}, {"x": Code(3)}, [{"k": (1, {True: None})}]]:
        assert tlog.indented_json(obj) == json.dumps(obj, indent=1, sort_keys=True)
    with pytest.raises(TypeError):
        tlog.indented_json({"a": np.float32(1.0)})  # as json.dumps raises
    with pytest.raises(TypeError):
        tlog.indented_json({"a": 1, 2: 3})  # keys json cannot sort


def test_a_recorded_logs_json_files_are_jsons_own_text(tmp_path: Path) -> None:
    import torch

    import tracelog

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with tracelog.Listener(model, tmp_path / "log") as listener, listener.batch():
        torch.nn.functional.cross_entropy(
            model(torch.randn(3, 4)), torch.tensor([0, 1, 1])
        ).backward()
    files = [tmp_path / "log" / "trace.json", *(tmp_path / "log" / "graphs").glob("*.json")]
    assert len(files) == 3
    for f in files:
        text = f.read_text()
        assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
