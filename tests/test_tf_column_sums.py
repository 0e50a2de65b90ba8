"""TensorFlow programs sum along the innermost axis. TensorFlow's CPU Sum over
leading axes (a column sum) adds each column in one running float32 sum, so a
bias's gradient over many rows, or a per-head scale's over a whole attention
map, came out several times further from the float64 reference than PyTorch's
own (Swin2SR's logit_scale: accuracy ratio 3.76). The runtime's _reduce_sum /
_reduce_mean and the gradients of _broadcast / _bias_add sum rows instead
where each sum adds SUMMED_ALIKE values or more; the emitter calls them only
where a sum would run over an axis that a kept axis follows, and broadcasts
only values the gradients pass through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import tracelog
from tracelog.adapters.torch import TorchListener

tf = pytest.importorskip("tensorflow", reason="the TensorFlow target needs tensorflow-cpu")
from tracelog.emit.runtime import tensorflow_program as rt  # noqa: E402
from tracelog.emit.tensorflow import column_sum  # noqa: E402

SHAPE = (3, 4, 5, 6)


@pytest.fixture(params=[1, rt.SUMMED_ALIKE], ids=["rows", "short_sums_left_to_tf"])
def threshold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The helpers with every sum long (1: summed by rows), and as shipped
    (this file's small shapes: TensorFlow's own sums)."""
    monkeypatch.setattr(rt, "SUMMED_ALIKE", request.param)
    return int(request.param)


@pytest.mark.parametrize("axes", [[0], [1, 3], [0, 2, 3], [3], [2, 3], [-1], [-3], [0, 1, 2, 3]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_row_sums_equal_tensorflows_own(axes: list[int], keepdims: bool, threshold: int) -> None:
    x = tf.constant(np.random.default_rng(0).standard_normal(SHAPE))
    for ours, theirs in [(rt._reduce_sum, tf.math.reduce_sum), (rt._reduce_mean, tf.reduce_mean)]:
        got, want = ours(x, axes, keepdims).numpy(), theirs(x, axes, keepdims=keepdims).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape", [(6,), (1, 5, 1), (1, 4, 1, 6), (3, 1, 5, 6), (1,), (), SHAPE])
def test_broadcast_is_tensorflows_own_with_its_gradient(
    shape: tuple[int, ...], threshold: int
) -> None:
    rng = np.random.default_rng(1)
    v, other = tf.Variable(rng.standard_normal(shape)), tf.constant(rng.standard_normal(SHAPE))
    dy = rng.standard_normal(SHAPE)
    with tf.GradientTape(persistent=True) as tape:
        ours, theirs = rt._broadcast(v, other) * other, v * other
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    got = tape.gradient(ours, v, output_gradients=dy).numpy()
    want = tape.gradient(theirs, v, output_gradients=dy).numpy()
    assert got.shape == want.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_short_sums_are_tensorflows_own() -> None:
    """Under SUMMED_ALIKE values summed into each, the helpers are TensorFlow's
    own ops (as accurate there, and cheaper: no transpose, no custom gradient)."""
    x = tf.constant(np.random.default_rng(2).standard_normal((255, 3)).astype(np.float32))
    np.testing.assert_array_equal(rt._reduce_sum(x, [0], False), tf.reduce_sum(x, [0]))
    b = tf.constant(np.ones(3, np.float32))
    assert rt._broadcast(b, x) is b
    long = tf.concat([x, x[:1]], 0)  # 256 rows
    assert rt._broadcast(b, long) is not b


def test_which_sums_are_column_sums() -> None:
    assert column_sum(["batch", 16], [0])  # a bias's gradient over rows
    assert column_sum([8, 2, 16, 16], [0, 2, 3])  # a per-head scale's
    assert column_sum([8, 32, 32, 64], [1, 2])  # a global average pool, channels last
    assert not column_sum(["batch", 16], [1])  # along the innermost axis
    assert not column_sum([8, 2, 16, 16], [2, 3])
    assert not column_sum([1, 16], [0])  # over an axis of 1: no sum at all
    assert not column_sum([8, 1, 1], [0])  # the axes it keeps are all 1
    assert not column_sum([8, 4], [])


class _Scaled(nn.Module):
    """A linear layer, then a per-feature scale and a scalar gain: three
    parameters whose gradients sum over every row."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.gain = nn.Parameter(torch.tensor(1.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale * self.gain


def test_gradients_summed_over_many_rows_are_as_accurate_as_pytorchs(tmp_path: Path) -> None:
    """16384 rows: by TensorFlow's column sums the bias's and the scale's
    gradients were 69 and 32 times further from the float64 reference than
    PyTorch's own; summed by rows, 1.0 and 1.2 times. (The check's accuracy
    ratio passed both: it judges an output at least at the typical float32
    error of its kind, here fc.weight's.) The scalar gain's gradient is a sum
    over every axis, which TensorFlow adds accurately: no _broadcast."""
    torch.manual_seed(0)
    model = _Scaled()
    x, y = torch.randn(16384, 8) + 0.5, torch.randn(16384, 4)
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        ((model(x) - y) ** 2).mean().backward()
    program = tracelog.emit(tmp_path, target="tensorflow").read_text()
    assert "_bias_add(tf.linalg.matmul(" in program
    assert "_broadcast(scale, " in program and " * gain\n" in program
    report = tracelog.check(tmp_path, "tensorflow")
    assert report.ok, report.table()
    rows = {c.name: c for c in report.comparisons}
    for name in ("grad fc.bias", "grad scale", "grad gain"):
        assert rows[name].max_abs <= 2 * rows[name].source_err, report.table()


class _Masked(nn.Module):
    """Scores plus a mask made from the data: the mask broadcasts over the
    query axis but no gradient passes through it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        scores = h @ h.transpose(1, 2)
        mask = (1.0 - keep[:, None, :].float()) * -1e4
        return torch.softmax(scores + mask, -1).sum(1)


def test_values_no_gradient_passes_through_are_broadcast_by_tensorflow(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Masked()
    x, keep = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        model(x, keep).square().mean().backward()
    program = tracelog.emit(tmp_path, target="tensorflow").read_text()
    # the bias of fc is summed by rows; the mask is added as it is
    assert "_bias_add(" in program
    assert "_broadcast(mul" not in program and "_broadcast(sub" not in program
    assert program.count("_broadcast(") == program.count("def _broadcast(") + (
        program.count("_broadcast(bias, y)")
    ), [line for line in program.splitlines() if "_broadcast(" in line]
    assert tracelog.check(tmp_path, "tensorflow").ok


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * s)


class _TwoScales(nn.Module):
    """One module kind called twice: first with a scale no gradient passes
    through (detached), then with a parameter's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.first, self.second = _Scale(), _Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(self.fc(x), x.mean(0, keepdim=True).detach())
        return self.second(h, self.w[None])


def test_a_module_kinds_function_broadcasts_what_a_later_call_differentiates(
    tmp_path: Path,
) -> None:
    """The kind's function is written from its first call, where the scale
    gets no gradient; the second call passes a parameter through it."""
    torch.manual_seed(0)
    model = _TwoScales()
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        model(torch.randn(16, 8)).square().mean().backward()
    program = tracelog.emit(tmp_path, target="tensorflow").read_text()
    kind = program[program.index("(_Scale): Mul, Tanh") :].split("\n\n", 1)[0]
    assert "x * _broadcast(x_1, x)" in kind, kind
    assert tracelog.check(tmp_path, "tensorflow").ok
