"""Dense linear algebra in training code (torch.linalg): inverse, solve,
determinants, Cholesky (lower and upper), triangular and Cholesky solves
(from the left and the right, of matrices and of vectors), on
a batch of symmetric positive definite matrices built from the data, on
their rows permuted (elimination must pivot), and on a parameter matrix
solved against the batch (batch dims broadcast). Each program target runs its
own factorisation and passes with its float64 rows, gradients included; the
ONNX target runs ONNX's Det and tracelog's functions (Loops over the matrix
size) in float64 on onnx.reference and in float32 on onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import record_keras_lambda  # noqa: E402

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn


class _Linalg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 16), nn.Linear(8, 5)
        self.w = nn.Parameter(torch.randn(4, 4))  # one matrix against the batch's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x).view(-1, 4, 4)
        a = h @ h.transpose(-1, -2) / 4 + torch.eye(4)  # SPD, well conditioned
        b = h[:, :, :2]
        p = a[:, [1, 3, 0, 2]]  # a general matrix: its elimination swaps rows
        det = torch.linalg.det(a)[:, None, None].expand(-1, 4, 2)
        factor = torch.linalg.cholesky(a)
        w = self.w @ self.w.T / 4 + torch.eye(4)
        w_factor = torch.linalg.cholesky(w)
        terms = [
            torch.linalg.inv(p)[:, :, :2],
            torch.linalg.solve(p, b),
            det * 0.1,
            torch.linalg.slogdet(p)[0][:, None, None] * torch.linalg.slogdet(p)[1][:, None, None],
            torch.logdet(a)[:, None, None],
            factor[:, :, :2] + torch.linalg.cholesky(a, upper=True)[:, :, 1:3],
            torch.linalg.solve_triangular(factor, b, upper=False),
            torch.linalg.solve_triangular(factor, b, upper=False, unitriangular=True),
            torch.linalg.solve_triangular(factor, b.mT, upper=False, left=False).mT,
            torch.linalg.solve(p, b[:, :, 0])[:, :, None],  # a batch of vectors
            torch.linalg.solve(p, b.mT, left=False).mT,
            torch.linalg.solve(w, b) + torch.linalg.solve_triangular(w_factor, b, upper=False),
            torch.cholesky_solve(b, factor),
            torch.cholesky_solve(b, factor.transpose(-1, -2), upper=True),
            torch.cholesky_inverse(factor)[:, :, :2],
            torch.triangular_solve(b, factor, upper=False, transpose=True).solution,
            torch.cholesky(a)[:, :, 1:3],
        ]
        return self.head(sum(terms).reshape(-1, 8))


def _record(model: nn.Module, log_dir: Path) -> tracelog.TraceLog:
    torch.manual_seed(0)
    with TorchListener(model, log_dir, strict=True) as listener:
        for n in (12, 9):
            x, y = torch.randn(n, 6), torch.arange(n) % 5
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            model.zero_grad()
    log = tracelog.load(log_dir)
    assert log.unrecorded == 0, log.failures
    assert [e.usage.batches for e in log.entries.values()] == [2, 2]
    return log


# the deprecated torch.cholesky and torch.triangular_solve, which training code still calls
@pytest.mark.filterwarnings("ignore:torch.(cholesky|triangular_solve) is deprecated")
@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax", "onnx"])
def test_linalg_translates(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    log = _record(_Linalg(), tmp_path)
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert {
        "Det",
        "tracelog.Inverse",
        "tracelog.Solve",
        "tracelog.SlogDet",
        "tracelog.Cholesky",
        "tracelog.SolveTriangular",
    } <= ops
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert {"prediction [float64]", "loss [float64]"} <= {c.name for c in translated}
    if target != "onnx":  # a program: the gradients by the target's autodiff
        assert "grad w [float64]" in {c.name for c in translated}, report.table()
    assert all(c.ok for c in translated), report.table()


def _keras_linalg(h: Any) -> Any:
    """tf.linalg on a batch of symmetric positive definite matrices and on
    their rows permuted: every adjoint and lower flag."""
    import tensorflow as tf

    h = tf.reshape(h, [-1, 4, 4])
    a = tf.linalg.matmul(h, h, transpose_b=True) / 4.0 + np.eye(4, dtype="float32")
    p = tf.gather(a, [1, 3, 0, 2], axis=1)
    b = h[:, :, :2]
    factor = tf.linalg.cholesky(a)
    sign, logabs = tf.linalg.slogdet(p)
    det = tf.linalg.det(a)[:, None, None]
    return tf.reshape(
        tf.linalg.inv(p)[:, :, :2]
        + tf.linalg.inv(p, adjoint=True)[:, :, 1:3]
        + tf.linalg.solve(p, b)
        + tf.linalg.solve(p, b, adjoint=True)
        + det * 0.1
        + (sign * logabs)[:, None, None]
        + factor[:, :, :2]
        + tf.linalg.triangular_solve(factor, b)
        + tf.linalg.triangular_solve(factor, b, adjoint=True)
        + tf.linalg.triangular_solve(tf.linalg.matrix_transpose(factor), b, lower=False),
        [-1, 8],
    )


def test_keras_linalg_translates(tmp_path: Path) -> None:
    """The same ops from TensorFlow (MatrixInverse, MatrixSolve, MatrixDeterminant,
    LogMatrixDeterminant, Cholesky, MatrixTriangularSolve) record as the same IR
    and translate; JAX's run of these ops is the torch source's above."""
    pytest.importorskip("tensorflow", reason="the Keras adapter needs TensorFlow")
    pytest.importorskip("keras", reason="the Keras adapter needs Keras 3")
    from tracelog.verify import verify

    log = record_keras_lambda(_keras_linalg, tmp_path, 16)
    assert log.unrecorded == 0, log.failures
    assert [e.usage.batches for e in log.entries.values()] == [2, 2]
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert {"Det", "tracelog.Inverse", "tracelog.SlogDet", "tracelog.SolveTriangular"} <= ops
    report = verify(tmp_path, runtime="reference")
    assert report.ok, report.table()
    for target in ("torch", "onnx"):
        report = tracelog.check(tmp_path, target)
        assert report.ok, report.table()
        translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
        assert translated and all(c.ok for c in translated), report.table()
