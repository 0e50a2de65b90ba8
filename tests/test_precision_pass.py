"""The precision pass (tracelog.passes.precision): a graph widened to float64
computes what torch's float64 kernels compute with the IR's own numbers, where
an ONNX float attribute (float32 by the standard) or a standard op's float32
statistics or constants would not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tracelog.ir import Graph, Node, Output, TensorType, Value
from tracelog.passes.precision import float32_exact, promoted_arrays, promoted_float64
from tracelog.verify import run_graph

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 6, 3)).astype(np.float32)  # also [batch, channels, length]
MEAN, VAR = RNG.standard_normal(6).astype(np.float32), RNG.uniform(1e-6, 1e-5, 6).astype("f")
W, B = RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
A, M = RNG.standard_normal((4, 5)).astype(np.float32), RNG.standard_normal((6, 5)).astype("f")
C = RNG.standard_normal((4, 6)).astype(np.float32)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.float64))


# op, attrs, inputs (name -> array; the first is the data), torch's float64 result
CASES: dict[str, tuple[str, dict[str, Any], dict[str, np.ndarray], Callable[[], torch.Tensor]]] = {
    "leaky_relu": ("LeakyRelu", {"alpha": 0.01}, {"x": X}, lambda: F.leaky_relu(t(X), 0.01)),
    "celu": ("Celu", {"alpha": 0.3}, {"x": X}, lambda: F.celu(t(X), 0.3)),
    "addmm": (
        "Gemm",
        {"alpha": 0.3, "beta": 0.7, "transB": 1},
        {"a": A, "m": M, "c": C},
        lambda: torch.addmm(t(C), t(A), t(M).T, beta=0.7, alpha=0.3),
    ),
    "batch_norm_eval": (
        "BatchNormalization",
        {"epsilon": 1e-5},
        {"x": X, "w": W, "b": B, "mean": MEAN, "var": VAR},
        lambda: F.batch_norm(t(X), t(MEAN), t(VAR), t(W), t(B), False, eps=1e-5),
    ),
    "layer_norm": (
        "LayerNormalization",
        {"axis": -2, "epsilon": 1e-5},
        {"x": X * 1e-3, "w": W[:, None] * np.ones(3, "f"), "b": B[:, None] * np.ones(3, "f")},
        lambda: F.layer_norm(
            t(X * 1e-3), (6, 3), t(W[:, None] * np.ones(3, "f")), t(B[:, None] * np.ones(3, "f"))
        ),
    ),
    "group_norm": (
        "GroupNormalization",
        {"epsilon": 1e-5, "num_groups": 2},
        {"x": X * 1e-3, "w": W, "b": B},
        lambda: F.group_norm(t(X * 1e-3), 2, t(W), t(B), eps=1e-5),
    ),
    "gelu": ("Gelu", {}, {"x": X}, lambda: F.gelu(t(X))),
    "gelu_tanh": (
        "Gelu",
        {"approximate": "tanh"},
        {"x": X},
        lambda: F.gelu(t(X), approximate="tanh"),
    ),
}


def _graph(op: str, attrs: dict[str, Any], inputs: dict[str, np.ndarray], shape: tuple) -> Graph:
    values = {
        k: Value(k, TensorType("float32", a.shape), "input" if k == "x" else "param")
        for k, a in inputs.items()
    }
    values["y"] = Value("y", TensorType("float32", shape), "node")
    return Graph(
        "prediction", values, [Node(op, list(inputs), ["y"], attrs)], [Output("y", "prediction")]
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_widened_op_is_torchs_float64_kernel(case: str) -> None:
    op, attrs, inputs, want = CASES[case]
    expected = want().numpy()
    graph = _graph(op, attrs, inputs, expected.shape)
    feeds = promoted_arrays(inputs)
    got = run_graph(promoted_float64(graph), feeds)["prediction"]
    assert got.dtype == np.float64
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 1e-14 * scale
    # the standard op, only widened, is off by more than the translation check's 1e-9
    # wherever float32 rounds its attribute; and no rewrite where it holds it
    exact = all(float32_exact(v) for v in attrs.values())
    rewritten = [n.op for n in promoted_float64(graph).nodes] != [op]
    assert rewritten == (not exact or op in ("LayerNormalization", "GroupNormalization", "Gelu"))


@pytest.mark.parametrize("case", ["layer_norm", "group_norm", "batch_norm_eval"])
def test_widening_alone_would_fail_the_translation_check(case: str, monkeypatch) -> None:
    """Normalisations of small variances: epsilon as float32 (9.99999974738e-06)
    moves the result by more than 1e-9 of its scale."""
    from tracelog.passes import precision

    op, attrs, inputs, want = CASES[case]
    expected = want().numpy()
    graph = _graph(op, attrs, inputs, expected.shape)
    monkeypatch.delitem(precision.EXACT, op)
    try:
        got = run_graph(precision.promoted_float64(graph), promoted_arrays(inputs))["prediction"]
    except Exception:  # GroupNormalization-21's function: no float64 stash type in onnx.reference
        return
    assert np.abs(got - expected).max() > 1e-9 * np.abs(expected).max()


def test_float32_exact() -> None:
    assert float32_exact(0.5) and float32_exact(1) and float32_exact(float("nan"))
    assert not float32_exact(0.01) and not float32_exact(1e-5)
