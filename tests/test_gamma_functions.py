"""log-gamma, digamma and trigamma: their ONNX functions against scipy in
float64 over their whole domain, and the distributions training code takes
them from (Gamma, Beta, Dirichlet and Poisson log-likelihoods, Dirichlet, Gamma
and Beta KLs, torch.special's gammaln, psi, polygamma(1) and multigammaln),
recorded from PyTorch and checked on every target with their float64 rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")
special = pytest.importorskip("scipy.special", reason="scipy is the reference")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402
from tracelog.ir import Graph, Node, Output, TensorType, Value  # noqa: E402
from tracelog.verify import run_graph  # noqa: E402

nn = torch.nn
D = torch.distributions
TARGETS = ["onnx", "torch", "tensorflow", "jax"]

# positive, tiny, near the reflection at 0.5, large; negatives between the poles
_GRID = np.concatenate(
    [
        np.geomspace(1e-8, 1e6, 400),
        np.linspace(0.3, 12.0, 400),
        -np.geomspace(1e-6, 60.0, 300) + 0.5 * np.sin(np.arange(300)) * 0.49,
        # either side of the poles
        np.ravel(-np.arange(1.0, 40.0)[:, None] + np.asarray([-1e-3, -1e-9, 1e-9, 1e-3])),
    ]
)
_GRID = _GRID[np.abs(_GRID - np.round(_GRID)) > 1e-6]  # off the poles


def _onnx_function(op: str, x: np.ndarray) -> np.ndarray:
    values = {
        "x": Value("x", TensorType("float64", x.shape), "input"),
        "y": Value("y", TensorType("float64", x.shape), "node"),
    }
    graph = Graph(
        "prediction",
        values,
        [Node(op, ["x"], ["y"], {}, domain="tracelog", module="m", module_type="Op")],
        [Output("y", "prediction")],
    )
    return run_graph(graph, {"x": x}, runtime="reference")["prediction"]


_MP = {"Lgamma": "loggamma", "Digamma": "digamma", "Trigamma": "psi"}


def _exact(op: str, x: np.ndarray) -> np.ndarray:
    """mpmath at 40 digits, rounded to float64 (log |Gamma| as the real part of
    its complex log-gamma)."""
    mpmath = pytest.importorskip(
        "mpmath", reason="mpmath (a torch dependency) is the exact reference"
    )
    mpmath.mp.dps = 40
    f = getattr(mpmath, _MP[op])
    call = (lambda v: f(1, v)) if op == "Trigamma" else f
    return np.asarray([float(mpmath.re(call(mpmath.mpf(float(v))))) for v in x])


@pytest.mark.parametrize(
    ("op", "reference"),
    [
        ("Lgamma", special.gammaln),
        ("Digamma", special.digamma),
        ("Trigamma", lambda x: special.polygamma(1, x)),
    ],
)
def test_onnx_function_is_float64_accurate(op: str, reference) -> None:
    got = _onnx_function(op, _GRID)
    # relative to the value, or to 1 where the value crosses zero (lgamma at 1 and 2,
    # digamma at its root): the terms the function adds are of that size
    errors = {}
    for name, x, want in (
        ("scipy", _GRID, reference(_GRID)),
        ("mpmath", _GRID[::3], _exact(op, _GRID[::3])),
    ):
        y = got if name == "scipy" else got[::3]
        err = np.abs(y - want) / np.maximum(np.abs(want), 1.0)
        errors[name] = (float(err.max()), float(x[err.argmax()]))
    print(f"{op}: max relative error {errors}")
    # measured: Lgamma 6.6e-15 against scipy and mpmath, Trigamma 7.8e-16; Digamma
    # 1.1e-13 against scipy, which is that far off next to its poles (-15.999), and
    # 7.8e-16 against mpmath
    assert errors["scipy"][0] < 2e-13, (op, errors)
    assert errors["mpmath"][0] < 1e-14, (op, errors)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the poles' own infinities
@pytest.mark.parametrize("op", ["Lgamma", "Digamma", "Trigamma"])
def test_onnx_function_at_poles_and_infinities(op: str) -> None:
    x = np.asarray([0.0, -1.0, -3.0, np.inf])
    got = _onnx_function(op, x)
    # torch's, but trigamma's at the negative integers: torch gives sin(pi x)'s
    # rounding there (6.6e32 at -1), scipy, TensorFlow and JAX +inf
    functions = {
        "Lgamma": torch.lgamma,
        "Digamma": torch.digamma,
        "Trigamma": lambda v: torch.where(
            (v <= 0) & (v == v.floor()), torch.inf, torch.special.polygamma(1, v)
        ),
    }
    want = functions[op](torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, want)


def test_log_factorials_of_0_and_1_are_exact() -> None:
    # lgamma(1) = lgamma(2) = 0 as torch's (Poisson's log k! at counts 0 and 1)
    got = _onnx_function("Lgamma", np.asarray([1.0, 2.0, 3.0]))
    assert got[0] == 0.0 and got[1] == 0.0, got
    assert got[2] == pytest.approx(np.log(2.0), rel=1e-15)


class _Likelihoods(nn.Module):
    """A head predicting the parameters of distributions (softplus: positive),
    trained by their log-likelihoods and a Dirichlet KL."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(self.fc(x)) + 0.1


def _nll(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    counts = (y % 4).float()
    rate = (y.float() + 1.0) / 3.0
    share = torch.softmax(torch.arange(4.0) + y.float().unsqueeze(1), -1)
    prior = D.Dirichlet(torch.ones(4))
    return -(
        D.Gamma(p[:, 0], p[:, 1]).log_prob(rate).mean()
        + D.Beta(p[:, 2], p[:, 3]).log_prob(torch.sigmoid(rate - 1.0)).mean()
        + D.Poisson(p[:, 4]).log_prob(counts).mean()
        + D.Dirichlet(p[:, 4:8]).log_prob(share).mean()
        - D.kl_divergence(D.Dirichlet(p[:, 4:8]), prior).mean()
        - D.kl_divergence(D.Gamma(p[:, 0], p[:, 1]), D.Gamma(p[:, 2], p[:, 3])).mean()
        - D.kl_divergence(D.Beta(p[:, 4], p[:, 5]), D.Beta(p[:, 6], p[:, 7])).mean()
        - nn.PoissonNLLLoss(log_input=False, full=True)(p[:, 5], counts)
        + (torch.lgamma(p) + torch.digamma(p)).mean() * 0.01
        + (torch.special.gammaln(p) - torch.special.psi(p)).mean() * 0.01
        + torch.special.polygamma(1, p).mean() * 0.01
        + torch.special.multigammaln(p + 1.0, 3).mean() * 0.01
    )


@pytest.mark.parametrize("target", TARGETS)
def test_distribution_likelihoods_translate(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _Likelihoods()
    with TorchListener(model, tmp_path, strict=True) as listener:
        for n in (12, 9):
            x, y = torch.randn(n, 6), torch.arange(n) % 5
            with listener.batch():
                _nll(model(x), y).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert {"tracelog.Lgamma", "tracelog.Digamma", "tracelog.Trigamma"} <= ops, ops
    assert [e.usage.batches for e in log.entries.values()] == [2, 2]
    report = tracelog.check(tmp_path, target)
    print(report.table())
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated), report.table()


class _Forms(nn.Module):
    """The other spellings: polygamma of order 0, the in-place forms, mvlgamma of
    order 1."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.softplus(self.fc(x)) + 1.0
        return (
            torch.special.polygamma(0, h)
            + (h * 1.0).polygamma_(1)
            + (h * 1.0).mvlgamma_(2)
            + torch.special.multigammaln(h, 1)
        )


def test_the_other_forms_translate(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Forms()
    with TorchListener(model, tmp_path, strict=True) as listener:
        for n in (5, 4):
            with listener.batch():
                model(torch.randn(n, 3)).square().mean().backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert {"tracelog.Lgamma", "tracelog.Digamma", "tracelog.Trigamma"} <= ops, ops
    assert "tracelog.Unsupported" not in ops, ops
    for target in ("onnx", "torch"):
        report = tracelog.check(tmp_path, target)
        assert report.ok, report.table()


def test_polygamma_of_order_2_is_unsupported(tmp_path: Path) -> None:
    model = nn.Linear(3, 4)
    with TorchListener(model, tmp_path) as listener:
        with listener.batch():
            torch.special.polygamma(2, model(torch.randn(5, 3)).exp()).mean().backward()
    with pytest.raises(tracelog.UnsupportedOpError, match="polygamma"):
        tracelog.emit(tmp_path, "torch", str(tmp_path / "out"))
