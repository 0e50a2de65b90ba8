"""Ops and recordings that Hugging Face vision, audio, time-series and
multimodal families brought (first tried 2026-11-29).

Group norm over a feature dim equal to the batch size (MobileViTV2 normalises
patches [B, C, P, N] with GroupNorm(1), P = 4 in a batch of 4): aten's
native_group_norm takes its input's rows, channels and the product of its
other sizes as ints, and the batch-dim replay reads them from the replayed
input, so the search tells the batch from the equal feature dim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.adapters.torch import batch_dims  # noqa: E402
from tracelog.adapters.torch import listener as torch_listener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

nn = torch.nn
F = torch.nn.functional
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _PatchNorm(nn.Module):
    """A [B, 6, 8, 8] map cut into 2x2 patches [B, 6, 4, 16] (F.unfold, as
    MobileViTV2 does), normalised by GroupNorm(1) over (C, P, N), and folded
    back: the patch dim P (4) equals the batch size. (A tanh before the mean:
    with the mean alone every position's gradient is its image's, and the
    norm's bias gradient a sum that cancels across the batch: TensorFlow's
    float32 run read 9.9x the source's error there, a float32 question this
    test is not about.)"""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.GroupNorm(1, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        b, c, hh, ww = h.shape
        patches = F.unfold(h, kernel_size=2, stride=2).reshape(b, c, 4, -1)
        patches = self.norm(patches)
        h = F.fold(patches.reshape(b, c * 4, -1), output_size=(hh, ww), kernel_size=2, stride=2)
        return self.head(torch.tanh(h).mean(dim=(2, 3)))


def _record(tmp_path: Path, batches: list[int]) -> tracelog.TraceLog:
    torch.manual_seed(0)
    model = _PatchNorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracelog.Listener(model, tmp_path, strict=True) as listener:
        for b in batches:
            x, y = torch.randn(b, 3, 8, 8), torch.randint(0, 3, (b,))
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return tracelog.load(tmp_path)


def test_group_norm_replays_with_its_sizes_read_from_its_input(
    tmp_path: Path, monkeypatch: Any
) -> None:
    found: list[Any] = []

    def keep(tape: Any, **kwargs: Any) -> Any:
        out = batch_dims.exact_batch_dims(tape, **kwargs)
        found.append(out)
        return out

    monkeypatch.setattr(torch_listener, "exact_batch_dims", keep)
    log = _record(tmp_path, [4])
    assert found and all(t is not None for t in found), "the replay could not tell"
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops, ops
    # the patch dim stays 4: only the leading dim is the batch
    shapes = {tuple(v.type.shape) for g in log.graphs.values() for v in g.values.values()}
    assert ("batch", 6, 4, 16) in shapes, sorted(map(str, shapes))
    assert not any(s[1:].count("batch") for s in shapes if s), sorted(map(str, shapes))


def test_batches_of_other_sizes_share_the_graph_pair(tmp_path: Path) -> None:
    log = _record(tmp_path, [4, 5, 4])
    assert log.unrecorded == 0, log.failures
    usage = {e.kind: e.usage.batches for e in log.entries.values()}
    assert len(log.entries) == 2 and usage == {"prediction": 3, "loss": 3}, usage


@pytest.mark.parametrize("target", TARGETS)
def test_group_norm_over_a_batch_sized_patch_dim_translates(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    _record(tmp_path, [4])
    assert_translated(tracelog.check(tmp_path, target))
