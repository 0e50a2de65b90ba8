"""nn.EmbeddingBag and F.embedding_bag (aten._embedding_bag): sum, mean and
max bags, of a 2-D input (fixed-size bags) and of a 1-D input with offsets
(either include_last_offset), with per_sample_weights and padding_idx, empty
bags among them. Each records with no unsupported node and translates on
every target with the float64 verdict (the weights' gradients included).
scale_grad_by_freq stays unsupported, with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
TARGETS = ["onnx", "torch", "tensorflow", "jax"]
ROWS, PAD = 13, 4


class _FixedBags(torch.nn.Module):
    """Bags of a [B, L] input: each mode, with and without a padding index, sum
    with per-sample weights, and a frozen table."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = torch.nn.ModuleList(
            [torch.nn.EmbeddingBag(ROWS, 3, mode=m) for m in ("sum", "mean", "max")]
        )
        self.padded = torch.nn.ModuleList(
            [
                torch.nn.EmbeddingBag(ROWS, 3, mode=m, padding_idx=PAD)
                for m in ("sum", "mean", "max")
            ]
        )
        self.weighted = torch.nn.EmbeddingBag(ROWS, 3, mode="sum", padding_idx=PAD)
        # a frozen table: torch runs aten._embedding_bag_forward_only
        self.frozen = torch.nn.EmbeddingBag(ROWS, 3, mode="mean", padding_idx=PAD)
        self.frozen.weight.requires_grad_(False)
        self.table = torch.nn.Parameter(torch.randn(ROWS, 3))
        self.head = torch.nn.Linear(3, 5)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        h = self.weighted(x, per_sample_weights=weights)
        for bag in [*self.bags, *self.padded, self.frozen]:
            h = h + bag(x)
        h = h + F.embedding_bag(x, self.table, mode="max", padding_idx=-1)
        return self.head(h)


class _OffsetBags(torch.nn.Module):
    """Bags of a 1-D input cut by offsets: each mode, include_last_offset
    either way, a padding index, per-sample weights."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = torch.nn.ModuleList(
            [torch.nn.EmbeddingBag(ROWS, 3, mode=m) for m in ("sum", "mean", "max")]
        )
        self.padded = torch.nn.ModuleList(
            [
                torch.nn.EmbeddingBag(ROWS, 3, mode=m, padding_idx=PAD)
                for m in ("sum", "mean", "max")
            ]
        )
        self.last = torch.nn.ModuleList(
            [
                torch.nn.EmbeddingBag(ROWS, 3, mode=m, include_last_offset=True, padding_idx=p)
                for m, p in (("sum", None), ("mean", PAD), ("max", PAD))
            ]
        )
        self.weighted = torch.nn.EmbeddingBag(ROWS, 3, mode="sum")
        self.head = torch.nn.Linear(3, 5)

    def forward(
        self, indices: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        h = self.weighted(indices, offsets[:-1], per_sample_weights=weights)
        for bag in [*self.bags, *self.padded]:
            h = h + bag(indices, offsets[:-1])
        for bag in self.last:  # the last offset is the input's length
            h = h + bag(indices, offsets)
        return self.head(h)


def _fixed_batch(n: int) -> tuple[Any, ...]:
    x = torch.randint(0, ROWS, (n, 4))
    x[0] = PAD  # a bag of padding only: 0 in every mode
    x[1, :2] = PAD
    return x, torch.rand(n, 4) + 0.5


def _offset_batch(bags: int, n: int) -> tuple[Any, ...]:
    """n indices in `bags` bags: the first of padding only, the second and the
    last empty; the offsets end with n (include_last_offset's form)."""
    indices = torch.randint(0, ROWS, (n,))
    indices[:2] = PAD
    cuts = torch.sort(torch.randint(3, n, (bags - 4,))).values
    offsets = torch.cat([torch.tensor([0, 2, 2]), cuts, torch.tensor([n, n])])
    return indices, offsets, torch.rand(n) + 0.5


def _check(target: str, tmp_path: Path, model: torch.nn.Module, batches: list[Any]) -> Any:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    with TorchListener(model, tmp_path, strict=True) as listener:
        for args in batches:
            with listener.batch():
                out = model(*args)
                F.cross_entropy(out, torch.arange(out.shape[0]) % 5).backward()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops and "Unsupported" not in ops, ops
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    if target != "onnx":
        assert any(c.name.startswith("grad bags.0.weight") for c in translated), report.table()
    return log


@pytest.mark.parametrize("target", TARGETS)
def test_bags_of_a_2d_input_translate_as_one_graph(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    log = _check(target, tmp_path, _FixedBags(), [_fixed_batch(6), _fixed_batch(9)])
    # the offsets F.embedding_bag makes, arange(0, B*L, L), follow the batch
    assert sum(1 for g in log.graphs.values() if g.kind == "prediction") == 1


@pytest.mark.parametrize("target", TARGETS)
def test_bags_cut_by_offsets_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _OffsetBags(), [_offset_batch(7, 20)])


def test_bags_with_gradient_scaled_by_frequency_are_unsupported(tmp_path: Path) -> None:
    # aten's CPU backward scales some rows by another index's count (one bag
    # [1, 1, 1, 2]: row 2's gradient is a third): refused, not translated wrong
    model = torch.nn.EmbeddingBag(ROWS, 3, scale_grad_by_freq=True)
    with TorchListener(model, tmp_path, strict=False) as listener, listener.batch():
        model(torch.randint(0, ROWS, (4, 3))).sum().backward()
    reasons = [
        n.attrs.get("reason", "")
        for g in tracelog.load(tmp_path).graphs.values()
        for n in g.nodes
        if n.op.endswith("Unsupported")
    ]
    assert any("scale_grad_by_freq" in r for r in reasons), reasons
