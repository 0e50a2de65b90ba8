"""The inverse error function, the normal quantile and log-CDF, and the
modified Bessel functions of orders 0 and 1 (plain and exponentially scaled):
their ONNX functions against scipy and mpmath in float64 over their domains
(near +-1 for erfinv, down to subnormal probabilities for ndtri, far into the
left tail for log_ndtr, past exp's overflow for i0 and i1), and a torch
model using them in its forward pass and loss, recorded over a batch of 6
and one of 4 and checked on every target with its float64 rows; the same
ops from TensorFlow record as the same IR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")
special = pytest.importorskip("scipy.special", reason="scipy is the reference")

from helpers import record_keras_lambda  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402
from tracelog.ir import Graph, Node, Output, TensorType, Value  # noqa: E402
from tracelog.verify import run_graph  # noqa: E402

nn = torch.nn
TARGETS = ["torch", "tensorflow", "jax", "onnx"]
OPS = ["Erfinv", "Ndtri", "LogNdtr", "I0", "I0e", "I1", "I1e"]


def _onnx_function(op: str, x: np.ndarray, runtime: str = "reference") -> np.ndarray:
    values = {
        "x": Value("x", TensorType(str(x.dtype), x.shape), "input"),
        "y": Value("y", TensorType(str(x.dtype), x.shape), "node"),
    }
    graph = Graph(
        "prediction",
        values,
        [Node(op, ["x"], ["y"], {}, domain="tracelog", module="m", module_type="Op")],
        [Output("y", "prediction")],
    )
    with np.errstate(all="ignore"):  # the untaken branches' infinities
        return run_graph(graph, {"x": x}, runtime=runtime)["prediction"]


def _near_one(sign: float) -> np.ndarray:
    return sign * (1.0 - np.geomspace(1.1e-16, 0.5, 300))


# each op's grid (in its domain, out to its edges) and scipy's function
_GRIDS = {
    "Erfinv": np.concatenate(
        [np.linspace(-0.999, 0.999, 2001), _near_one(1.0), _near_one(-1.0)]
        + [np.geomspace(1e-300, 0.5, 200), [0.5, 0.49, 0.4926, 1 - 2**-53, 1 - 1e-12]]
    ),
    "Ndtri": np.concatenate(
        [np.geomspace(1e-310, 0.5, 500), 1.0 - np.geomspace(1.1e-16, 0.5, 300)]
        + [np.linspace(0.001, 0.999, 999)]
    ),
    "LogNdtr": np.concatenate(
        [np.linspace(-40.0, 37.0, 7701), -np.geomspace(1e-300, 1e150, 500)]
        + [np.geomspace(1e-300, 37.0, 500), [0.0, -0.663, 0.663]]
    ),
}
for _op in ("I0", "I0e", "I1", "I1e"):
    _GRIDS[_op] = np.concatenate(
        [np.linspace(-30.0, 30.0, 3001), np.geomspace(1e-300, 712.0, 600)]
        + [-np.geomspace(1e-300, 712.0, 300), [0.0, 8.0, -8.0, 7.999, 8.001]]
    )
_SCIPY = {
    "Erfinv": special.erfinv,
    "Ndtri": special.ndtri,
    "LogNdtr": special.log_ndtr,
    "I0": special.i0,
    "I0e": special.i0e,
    "I1": special.i1,
    "I1e": special.i1e,
}


def _exact(op: str, x: np.ndarray) -> np.ndarray:
    """mpmath's values, rounded to float64: erfinv and ndtri from 1 - |x| and
    p taken exactly (400 digits: p down to 1e-310), log_ndtr as log1p of the
    upper tail for x > 0, i0 and i1 times exp(-|x|) for the scaled forms."""
    mpmath = pytest.importorskip(
        "mpmath", reason="mpmath (a torch dependency) is the exact reference"
    )

    def one(v: float) -> float:
        m = mpmath.mpf(v)
        if op == "Erfinv":
            return float(mpmath.erfinv(m))
        if op == "Ndtri":
            return float(mpmath.sqrt(2) * mpmath.erfinv(2 * m - 1))
        if op == "LogNdtr":
            return float(mpmath.log1p(-mpmath.ncdf(-m)) if v > 0 else mpmath.log(mpmath.ncdf(m)))
        order = 0 if op.startswith("I0") else 1
        scale = mpmath.exp(-abs(m)) if op.endswith("e") else 1
        return float(mpmath.besseli(order, m) * scale)

    with mpmath.workdps(400):
        return np.asarray([one(float(v)) for v in x])


@pytest.mark.parametrize("op", OPS)
def test_onnx_function_is_float64_accurate(op: str) -> None:
    x = _GRIDS[op]
    got = _onnx_function(op, x)
    errors = {}
    for name, xs, want, y in (
        ("scipy", x, _SCIPY[op](x), got),
        ("mpmath", x[::9], _exact(op, x[::9]), got[::9]),
    ):
        # relative, where the value is finite and normal (log_ndtr's subnormal right
        # tail holds a few bits)
        kept = np.isfinite(want) & (np.abs(want) > 1e-290)
        err = np.abs(y[kept] - want[kept]) / np.abs(want[kept])
        errors[name] = (float(err.max()), float(xs[kept][err.argmax()]))
    print(f"{op}: max relative error {errors}")
    # measured: 6e-16 (Erfinv, Ndtri, LogNdtr, I0, I0e), 2e-15 (I1, I1e) against
    # mpmath; scipy's log_ndtr is 2e-13 off where the value nears subnormals (x = 36)
    assert errors["mpmath"][0] < 1e-14, (op, errors)
    assert errors["scipy"][0] < (1e-12 if op == "LogNdtr" else 1e-14), (op, errors)


@pytest.mark.parametrize("op", OPS)
def test_onnx_function_on_onnxruntime_and_in_float32(op: str) -> None:
    """onnxruntime runs the same function (the same float64 values), and a
    float32 input gets the float64 value correctly rounded."""
    x = _GRIDS[op]
    np.testing.assert_allclose(
        _onnx_function(op, x, "onnxruntime"), _onnx_function(op, x), rtol=1e-15, atol=0
    )
    x32 = x.astype(np.float32)
    x32 = x32[np.isfinite(x32) & ((np.abs(x32) > 1e-37) | (x32 == 0))]
    got = _onnx_function(op, x32)
    with np.errstate(all="ignore"):
        want = _SCIPY[op](x32.astype(np.float64))
    kept = np.isfinite(want) & (np.abs(want) < 3e38) & (np.abs(want) > 1e-37)
    ulp = np.abs(got[kept] - want[kept]) / np.spacing(np.abs(want[kept]).astype(np.float32))
    assert ulp.max() <= 0.51, (op, float(ulp.max()))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_edges() -> None:
    """+-1, outside the domain and NaN: torch's values (i0 and i1 are NaN at
    +-inf in torch, TensorFlow, JAX and scipy alike)."""
    for op, fn, x in (
        ("Erfinv", torch.erfinv, [1.0, -1.0, 1.5, -2.0, np.nan, 0.0]),
        ("Ndtri", torch.special.ndtri, [0.0, 1.0, 0.5, -0.1, 1.1, np.nan]),
        ("LogNdtr", torch.special.log_ndtr, [np.inf, -np.inf, np.nan, 0.0, -1e300, 1e300]),
        ("I0", torch.special.i0, [np.inf, -np.inf, np.nan, 0.0]),
        ("I0e", torch.special.i0e, [np.inf, -np.inf, np.nan, 0.0]),
        ("I1", torch.special.i1, [np.inf, -np.inf, np.nan, 0.0]),
        ("I1e", torch.special.i1e, [np.inf, -np.inf, np.nan, 0.0]),
    ):
        arr = np.asarray(x)
        want = fn(torch.from_numpy(arr)).numpy()
        np.testing.assert_array_equal(_onnx_function(op, arr), want, err_msg=op)


def test_ndtri_keeps_small_probabilities_digits() -> None:
    # sqrt(2) erfinv(2p - 1) is -inf from p = 2^-54 (2p - 1 rounds to -1)
    p = np.asarray([1e-20, 1e-100, 1e-300, 5e-324])
    got = _onnx_function("Ndtri", p)
    np.testing.assert_allclose(got, special.ndtri(p), rtol=1e-14)
    assert np.all(np.isfinite(got))


class _Special(nn.Module):
    """A head whose features pass through the functions: erfinv and ndtri of
    values in (-1, 1) and (0, 1), log_ndtr of the logits (the probit
    likelihood), the Bessel functions of the features (von Mises' normaliser
    log(2 pi i0(kappa)), as log(i0e(kappa)) + kappa, and i1 / i0)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        u = torch.tanh(h) * 0.95
        kappa = nn.functional.softplus(h) * 4.0
        terms = (
            torch.erfinv(u)
            + torch.special.erfinv(u * 0.5)
            + torch.special.ndtri(torch.sigmoid(h)) * 0.5
            + torch.special.log_ndtr(h * 3.0) * 0.1
            + torch.special.i0(h) * 0.1
            + torch.special.i1(h) * 0.1
            + torch.log(torch.special.i0e(kappa))
            + kappa * 0.01
            + torch.special.i1e(kappa) / torch.special.i0e(kappa)
        )
        return self.head(h + terms)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a probit loss on the first logit (log_ndtr of +-z), cross-entropy on the rest
    z = out[:, 0] * (2.0 * (y % 2).float() - 1.0)
    return nn.functional.cross_entropy(out, y) - torch.special.log_ndtr(z).mean()


@pytest.mark.parametrize("target", TARGETS)
def test_special_functions_translate(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _Special()
    listener = tracelog.Listener(model, tmp_path, strict=True)
    for n in (6, 4):  # a batch of 6, then a short one of 4
        x, y = torch.randn(n, 6), torch.arange(n) % 5
        with listener.batch():
            _loss(model(x), y).backward()
        model.zero_grad()
    log = listener.close()
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert {f"tracelog.{op}" for op in OPS} <= ops, ops
    assert "tracelog.Unsupported" not in ops, ops
    assert [e.usage.batches for e in log.entries.values()] == [2, 2]
    report = tracelog.check(tmp_path, target)
    print(report.table())
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated), report.table()
    if target != "onnx":  # ONNX has no autodiff
        assert any(c.name.startswith("grad fc.weight") for c in report.comparisons)


def _keras_special(h):
    import tensorflow as tf

    u = tf.math.tanh(h) * 0.9
    return (
        tf.math.erfinv(u)
        + tf.math.ndtri(tf.math.sigmoid(h)) * 0.5
        + tf.math.bessel_i0(h) * 0.1
        + tf.math.bessel_i0e(h)
        + tf.math.bessel_i1(h) * 0.1
        + tf.math.bessel_i1e(h)
    )


def test_keras_special_functions_translate(tmp_path: Path) -> None:
    """TensorFlow's Erfinv, Ndtri and BesselI0/I0e/I1/I1e record as the same
    IR and translate."""
    pytest.importorskip("tensorflow", reason="the Keras adapter needs TensorFlow")
    pytest.importorskip("keras", reason="the Keras adapter needs Keras 3")

    log = record_keras_lambda(_keras_special, tmp_path, 8)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    wanted = {"tracelog.Erfinv", "tracelog.Ndtri", "tracelog.I0", "tracelog.I0e"}
    assert wanted | {"tracelog.I1", "tracelog.I1e"} <= ops, ops
    for target in ("onnx", "torch"):
        report = tracelog.check(tmp_path, target)
        assert report.ok, report.table()
        translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
        assert translated and all(c.ok for c in translated), report.table()
