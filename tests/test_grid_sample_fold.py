"""Spatial transformers and folding, recorded from real training steps:
F.affine_grid (aten.affine_grid_generator) and F.grid_sample
(aten.grid_sampler_2d: bilinear, nearest and bicubic; zeros, border and reflection
padding; align_corners both ways), and F.fold (aten.col2im). Each records with
no unsupported node, one graph for two batch sizes, and translates on every
target with the float64 verdict: the gradients to the sampled input, to the
grid and to the localisation net that makes it included."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]
MODES = list(
    itertools.product(("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection"))
)
EVERY = [
    (mode, padding, align) for (mode, padding), align in itertools.product(MODES, (False, True))
]
# each mode, each padding and align_corners both ways once: the TensorFlow and JAX
# programs of the whole product take a minute to trace (1600 nodes)
EACH = [
    ("bilinear", "zeros", False),
    ("nearest", "border", True),
    ("bicubic", "reflection", False),
    ("bilinear", "reflection", True),
]


class SpatialTransformer(nn.Module):
    """A localisation net gives theta; affine_grid makes the sampling grid,
    grid_sample reads the features there, a classifier reads the result.
    Every mode (bilinear, nearest, bicubic) and padding, align_corners both
    ways (each combination on ONNX and PyTorch, each once on the others), on a 5 x 4 grid over a 6 x 6 image, theta scaled up to 2.5 so that
    points land outside the image (and reflect more than once); a grid made by a layer directly (the gradient to
    the grid itself); and fixed points at half-integer coordinates, where
    nearest rounds half to even as aten's nearbyint (0.5, 1.5, 2.5 to 0, 2, 2)."""

    def __init__(self, combos: list[tuple[str, str, bool]]) -> None:
        super().__init__()
        self.combos = combos
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.loc = nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.Tanh(), nn.Linear(8, 6))
        self.warp = nn.Linear(36, 5 * 4 * 2)
        self.head = nn.Linear(3 * 5 * 4 * (len(combos) + 1) + 3 * 3, 5)
        ties = torch.tensor([-0.75, -0.25, 0.25])  # x = 0.5, 1.5, 2.5 on 5 pixels, aligned
        self.register_buffer("ties", torch.stack([ties, ties.flip(0)], -1).view(1, 1, 3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        h = torch.tanh(self.conv(x))  # [n, 3, 6, 6]
        identity = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        theta = self.loc(x).view(n, 2, 3) + identity
        features = []
        for k, (mode, padding, align) in enumerate(self.combos):
            grid = F.affine_grid(theta * (1.0 + 0.75 * (k % 3)), [n, 3, 5, 4], align)
            y = F.grid_sample(h, grid, mode=mode, padding_mode=padding, align_corners=align)
            features.append(y.flatten(1))
        grid = torch.tanh(self.warp(x.flatten(1))).view(n, 5, 4, 2) * 1.5
        features.append(
            F.grid_sample(h, grid, padding_mode="border", align_corners=False).flatten(1)
        )
        ties = F.grid_sample(
            h[:, :, :5, :5], self.ties.expand(n, 1, 3, 2), mode="nearest", align_corners=True
        )
        features.append(ties.flatten(1))
        return self.head(torch.cat(features, 1))


class Folding(nn.Module):
    """nn.Fold as overlap-add of learnt patches: unfold, a layer over each
    patch, fold back with the same geometry (stride, dilation, padding);
    overlapping strided blocks that do not tile the image (9 - 3 divides by 2,
    8 - 3 does not); and an unbatched fold."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.geometry = dict(kernel_size=(2, 3), dilation=(2, 1), padding=(0, 1), stride=(1, 2))
        self.mix = nn.Linear(18, 18)
        self.patches = nn.Linear(3, 3 * 9 * 12)
        self.head = nn.Linear(3 * 7 * 6 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        h = self.conv(x)  # [n, 3, 7, 6]
        cols = F.unfold(h, **self.geometry)  # [n, 18, 5 * 3]
        cols = self.mix(cols.transpose(1, 2)).transpose(1, 2)
        back = F.fold(torch.tanh(cols), (7, 6), **self.geometry)
        learnt = self.patches(h.mean(dim=(2, 3))).view(n, 27, 12)
        overlap = nn.Fold((7, 6), 3, padding=1, stride=2)(learnt)
        single = F.fold(learnt.sum(0), (7, 6), 3, padding=1, stride=2)
        return self.head(torch.cat([back, overlap, overlap * single], 1).flatten(1))


def _check(target: str, tmp_path: Path, model: nn.Module, shape: tuple[int, ...]) -> None:
    """Two training steps of batch sizes 6 and 4 (one graph), checked on `target`."""
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with TorchListener(model, tmp_path, strict=True) as listener:
        for n in (6, 4):
            with listener.batch():
                x, y = torch.randn(n, *shape), torch.arange(n) % 5
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops and "Unsupported" not in ops, ops
    (pair,) = log.pairs.values()
    assert pair.usage.batches == 2
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)


@pytest.mark.parametrize("target", TARGETS)
def test_spatial_transformer_translates(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    combos = EVERY if target in ("onnx", "torch") else EACH
    _check(target, tmp_path, SpatialTransformer(combos), (1, 6, 6))


@pytest.mark.parametrize("target", TARGETS)
def test_fold_translates(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, Folding(), (2, 7, 6))
