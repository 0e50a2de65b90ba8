"""Tests generated from the aten table: every rule for a one-tensor aten op
(its other arguments at their defaults) records a real training step of a
small model that applies the op, and the recorded IR, replayed by
onnx.reference, reproduces what PyTorch computed. A rule added to the table
is tested here with no test written by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.adapters.torch.rules import ATEN  # noqa: E402
from tracelog.ops import schema_for  # noqa: E402
from tracelog.verify import verify  # noqa: E402

F = torch.nn.functional


def _one_tensor_ops() -> list[str]:
    """aten keys whose op takes one tensor first, every other argument has a
    default, and returns one tensor (in-place forms left out: they write a
    leaf the test's model owns)."""
    keys = []
    for key in ATEN.keys():
        namespace, name, overload = (key.split(".") + ["", ""])[:3]
        if namespace != "aten":  # the listener's own records (tracelog.view_write)
            continue
        if name.endswith("_") or name.startswith("_"):
            continue
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, overload, None)
        if op is None:
            continue
        schema = op._schema
        args = [a for a in schema.arguments if not a.kwarg_only]
        if (
            args
            and str(args[0].type) == "Tensor"
            and all(a.has_default_value() for a in schema.arguments[1:])
            and len(schema.returns) == 1
            and str(schema.returns[0].type) == "Tensor"
            and not schema.is_mutable
            and not name.startswith("empty")  # its result is whatever memory held
            and _callable_alone(op)
        ):
            keys.append(key)
    return keys


def _callable_alone(op: object) -> bool:
    """Whether the op runs on the test's 5 by 4 input with every other
    argument at its default (clamp, for one, wants a bound; cholesky_inverse a
    square matrix: test_linalg_ops.py has those)."""
    try:
        op(torch.ones(5, 4))  # type: ignore[operator]
    except (RuntimeError, TypeError):
        return False
    return True


ONE_TENSOR_OPS = _one_tensor_ops()


# the inputs an op is applied to, by its domain: any value; positive ones (log,
# sqrt); within (0, 1) (logit, atanh, erfinv, asin); at least 1 (acosh)
_DOMAINS = {
    "any": lambda h: h,
    "positive": lambda h: h * h + 0.25,
    "unit": torch.sigmoid,
    "above_one": lambda h: h * h + 1.25,
}


class _Applies(torch.nn.Module):
    def __init__(self, op: object, domain: str = "any") -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.op = op
        self.domain = domain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(_DOMAINS[self.domain](self.fc(x)))  # type: ignore[operator]


def test_the_table_has_one_tensor_ops() -> None:
    assert "aten.relu.default" in ONE_TENSOR_OPS and len(ONE_TENSOR_OPS) > 10


@pytest.mark.parametrize("key", ONE_TENSOR_OPS)
def test_one_tensor_rule_records_what_torch_computes(key: str, tmp_path: Path) -> None:
    _, name, overload = key.split(".")
    op = getattr(getattr(torch.ops.aten, name), overload)
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    model = _Applies(op)
    with torch.no_grad():  # the first domain on which the op is finite everywhere
        for domain in _DOMAINS:
            model.domain = domain
            if bool(torch.isfinite(model(x).float()).all()):
                break
        else:
            raise AssertionError(f"{key} is not finite on any of the inputs tried")
    listener = TorchListener(model, tmp_path / "log", strict=True)
    with listener.batch():
        out = model(x)
        loss = (out.float() ** 2).mean()
        if not loss.requires_grad:  # an op with no gradient (argmax, ones_like, ...)
            loss = loss + (model.fc.weight**2).sum()
        loss.backward()
    log = listener.close()
    assert log.unrecorded == 0, log.failures
    if any(schema_for(n.domain, n.op).no_function for g in log.graphs.values() for n in g.nodes):
        # an op with no ONNX function: the PyTorch program is the replay
        import tracelog

        report = tracelog.check(tmp_path / "log", "torch")
    else:
        report = verify(tmp_path / "log")
    assert report.ok, report.table()


class _Counts(torch.nn.Module):
    """Sums whose output dtype is not their input's: a count of non-pad tokens
    (a bool sum, int64 in torch; mBART's shift_tokens_right), an int32 sum and
    a float sum asked for in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        tokens = (ids != 0).sum(dim=1)  # bool -> int64
        total = ids.to(torch.int32).sum()  # int32 -> int64
        wide = h.sum(dim=1, dtype=torch.float64).to(h.dtype)
        return wide / tokens.unsqueeze(-1).to(h.dtype) + total.to(h.dtype)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_a_sum_runs_in_its_output_dtype(target: str, tmp_path: Path) -> None:
    """ReduceSum on bools is no op of ONNX or TensorFlow (the program failed to
    load or run): the input is cast to the sum's dtype first, as torch sums."""
    import tracelog
    from tracelog.emit import targets

    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _Counts()
    ids = torch.tensor([[3, 4, 0, 0], [1, 2, 5, 0], [7, 8, 9, 6]])
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        (model(ids) ** 2).mean().backward()
    assert verify(tmp_path).ok
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()


def _checked(
    target: str, tmp_path: Path, model: torch.nn.Module, x: torch.Tensor
) -> tuple[Any, Any]:
    """One training batch of `model` on `x` recorded (a 3-class cross-entropy),
    and the target's check of it: (the log, the report)."""
    import tracelog
    from tracelog.emit import targets

    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        F.cross_entropy(model(x), torch.arange(len(x)) % 3).backward()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    return log, tracelog.check(tmp_path, target)


def _translates_and_shares_a_graph(target: str, tmp_path: Path, model: Any) -> None:
    """`model` records with no unsupported node and passes the target's check
    on its float64 rows; on the torch target, batches of 8 and 5 share one
    training graph."""
    import tracelog

    torch.manual_seed(0)
    log, report = _checked(target, tmp_path / "a", model, torch.randn(8, 6))
    assert "tracelog.Unsupported" not in _ops(log)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    if target == "torch":
        with TorchListener(model, tmp_path / "b", strict=True) as listener:
            for batch in (8, 5):
                with listener.batch():
                    x = torch.randn(batch, 6)
                    F.cross_entropy(model(x), torch.arange(batch) % 3).backward()
        train = [p for p in tracelog.load(tmp_path / "b").pairs.values() if p.phase == "train"]
        assert len(train) == 1 and train[0].usage.batches == 2


def _ops(log: Any) -> set[str]:
    return set().union(*(g.op_histogram() for g in log.graphs.values()))


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_silu_is_one_op_and_the_torch_program_runs_torchs_kernel(
    target: str, tmp_path: Path
) -> None:
    """SiLU records as tracelog.SiLU, which each target runs as its own
    kernel: a PyTorch program of it is bitwise the source (its float32 error
    is the source's on every output, ratio 1), and the others pass."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 32), torch.nn.SiLU(), torch.nn.Linear(32, 3), torch.nn.SiLU()
    )
    log, report = _checked(target, tmp_path, model, torch.randn(16, 6) * 3)
    ops = _ops(log)
    assert "tracelog.SiLU" in ops and "Sigmoid" not in ops
    assert report.ok, report.table()
    if target == "torch":
        rows = [c for c in report.comparisons if c.ratio is not None]
        assert rows and all(c.max_abs == c.source_err for c in rows), report.table()


class _MoreActivations(torch.nn.Module):
    """ELU (alpha 1 and not), SELU, Softplus (torch's defaults, and a beta and
    threshold of its own), Mish, LogSigmoid and clamp_max, summed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.acts = torch.nn.ModuleList(
            [
                torch.nn.ELU(),
                torch.nn.ELU(alpha=0.5),
                torch.nn.SELU(),
                torch.nn.Softplus(),
                torch.nn.Softplus(beta=2.0, threshold=5.0),
                torch.nn.Mish(),
                torch.nn.LogSigmoid(),
            ]
        )
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        total = h.clamp_max(4.0)
        for act in self.acts:
            total = total + act(h)
        return self.head(total)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_elu_selu_softplus_mish_log_sigmoid_and_clamp_max(target: str, tmp_path: Path) -> None:
    """Each activation as torch's kernel defines it (a Softplus's threshold
    included: the pre-activations reach +-8), on every target."""
    torch.manual_seed(0)
    log, report = _checked(target, tmp_path, _MoreActivations(), torch.randn(16, 6) * 4)
    ops = _ops(log)
    assert {"Celu", "Softplus", "Where"} <= ops and "tracelog.Unsupported" not in ops
    assert report.ok, report.table()


class _MathOps(torch.nn.Module):
    """rules_math.py's ops, each on the same hidden layer, summed: var, std,
    var_mean (batch-wide too), logsumexp, prod, argmin, flip, roll, GLU,
    PReLU, threshold, the shrinks, lerp, log2, log10, logit, sign, log1p,
    expm1, mv, torch.norm and clamps by tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.prelu = torch.nn.PReLU(8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        terms = [
            h.var(-1, keepdim=True),
            h.std(-1, keepdim=True),
            torch.var_mean(h, -1, keepdim=True, correction=0)[0],
            torch.var_mean(h, 0, keepdim=True)[1],  # over the batch
            h.std(0, keepdim=True),
            torch.logsumexp(h, -1, keepdim=True),
            torch.sigmoid(h).prod(-1, keepdim=True),
            h.gather(-1, h.argmin(-1, keepdim=True)),
            h.flip(-1),
            torch.roll(h, 3, -1),
            F.glu(torch.cat([h, h.flip(-1)], -1), -1),
            self.prelu(h),
            F.threshold(h, 0.1, -1.0),
            F.hardshrink(h),
            F.softshrink(h, 0.3),
            torch.lerp(h, h.flip(-1), 0.3),
            torch.lerp(h, h.flip(-1), 0.8),
            torch.log2(h.abs() + 1),
            torch.log10(h.abs() + 1),
            torch.logit(torch.sigmoid(h), eps=1e-6),
            torch.sign(h) * h,
            torch.log1p(h.abs() * 1e-3),
            torch.expm1(h * 1e-3),
            (h @ self.fc.bias).unsqueeze(-1),
            F.pairwise_distance(h, h.flip(-1)).unsqueeze(-1),
            F.cosine_similarity(h, h.flip(-1), dim=-1).unsqueeze(-1),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_math_ops_from_their_definitions(target: str, tmp_path: Path) -> None:
    """rules_math.py's ops record (no unsupported node) and translate on
    every target, with the float64 verdict."""
    torch.manual_seed(0)
    log, report = _checked(target, tmp_path, _MathOps(), torch.randn(16, 6) * 2)
    assert "tracelog.Unsupported" not in _ops(log)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)


class _ElementwiseMath(torch.nn.Module):
    """The element-wise functions ONNX has an op for or tracelog defines one
    for, each on the same hidden layer, each inside its domain (acosh >= 1,
    atanh and erfinv in (-1, 1)), summed: trigonometric and hyperbolic
    functions, atan2, hypot, exp2, erfc, erfinv, round (decimals too),
    trunc, fmod, remainder, floor division and division rounded either way
    (their divisors by tensor and by number), nan_to_num and cumprod."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        u = torch.tanh(h) * 0.9  # in (-1, 1)
        d = h.flip(-1).abs() + 0.5  # a divisor away from 0
        wild = torch.where(h > 1.5, torch.inf, torch.where(h < -1.5, -torch.inf, h))
        wild = torch.where(h.abs() < 0.05, torch.nan, wild)
        terms = [
            torch.tan(u),
            torch.asin(u),
            torch.acos(u),
            torch.atan(h),
            torch.atan2(h, h.flip(-1)),
            torch.sinh(h),
            torch.cosh(h),
            torch.asinh(h),
            torch.acosh(h * h + 1.0),
            torch.atanh(u),
            torch.hypot(h, h.flip(-1)),
            torch.exp2(h),
            torch.special.erfc(h * 2),
            torch.erfinv(u),
            torch.round(h * 3) * h,
            torch.round(h, decimals=1) * h,
            torch.round(h * 100, decimals=-1) * h,
            torch.trunc(h * 3) * h,
            torch.fmod(h * 3, d),
            torch.fmod(h * 3, 0.7),
            torch.remainder(h * 3, d),
            h * 3 % -0.7,
            torch.floor_divide(h.detach() * 3, 0.7) * h,
            torch.div(h * 3, d, rounding_mode="floor") * h,
            torch.div(h * 3, -0.7, rounding_mode="trunc") * h,
            torch.nan_to_num(h),  # (the default infinities' replacements are the dtype's)
            torch.nan_to_num(wild, nan=0.5, posinf=2.0, neginf=-3.0),
            torch.cumprod(torch.sigmoid(h) + 0.5, -1),
            torch.cumprod(h, 1, dtype=torch.float64).to(h.dtype),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_trigonometric_rounding_and_special_functions(target: str, tmp_path: Path) -> None:
    """Each function records (no unsupported node) and translates on every
    target, gradients included, with the float64 verdict (nan_to_num's default
    replacements of infinities are the recorded dtype's largest values, so the
    float64 run takes them on no infinity), ONNX included (erfinv by its
    Newton function)."""
    torch.manual_seed(0)
    model, x = _ElementwiseMath(), torch.randn(16, 6) * 2
    log, report = _checked(target, tmp_path, model, x)
    ops = _ops(log)
    assert "tracelog.Unsupported" not in ops
    assert {"Atan", "Round", "Mod", "tracelog.Atan2", "tracelog.CumProd"} <= ops
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    if target != "onnx":  # ONNX has no autodiff
        assert any(c.name.startswith("grad fc.weight") for c in report.comparisons)


class _ElementwiseMathOnnx(torch.nn.Module):
    """A subset of _ElementwiseMath's functions, on ONNX alone."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _ElementwiseMath()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner.fc(x)
        d = h.flip(-1).abs() + 0.5
        terms = [
            torch.tan(torch.tanh(h)),
            torch.acosh(h * h + 1.0),
            torch.atan2(h, h.flip(-1)),
            torch.hypot(h, h.flip(-1)),
            torch.exp2(h),
            torch.special.erfc(h * 2),
            torch.round(h, decimals=1) * h,
            torch.trunc(h * 3) * h,
            torch.fmod(h * 3, d),
            torch.remainder(h * 3, d),
            torch.div(h * 3, d, rounding_mode="floor") * h,
            torch.nan_to_num(torch.where(h > 1.5, torch.inf, h), posinf=2.0),
            torch.cumprod(torch.sigmoid(h) + 0.5, -1),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.inner.head(total)


def test_trigonometric_rounding_and_special_functions_in_onnx(tmp_path: Path) -> None:
    torch.manual_seed(0)
    log, report = _checked("onnx", tmp_path, _ElementwiseMathOnnx(), torch.randn(16, 6) * 2)
    assert "tracelog.Unsupported" not in _ops(log)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)


class _NormsAndRelayouts(torch.nn.Module):
    """Vector norms (ConvNeXt V2's global response norm, F.normalize, orders 1
    and inf), an in-place dropout (MobileViT's classifier) and an adaptive
    average pool over a sequence (Swin's pooler: its CPU kernel restrides the
    mean with as_strided_)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.gamma = torch.nn.Parameter(torch.full((1, 4, 1, 1), 0.5))
        self.pool = torch.nn.AdaptiveAvgPool1d(1)
        self.drop = torch.nn.Dropout(0.25, inplace=True)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        h = h * (h.shape[1] > 0)  # keeps h; the zero plane below is a zero norm
        h = torch.cat([h[:, :3], torch.zeros_like(h[:, 3:])], dim=1)
        g = torch.linalg.vector_norm(h, ord=2, dim=(2, 3), keepdim=True)
        n = g / (g.mean(dim=1, keepdim=True) + 1e-6)
        h = h + self.gamma * (h * n)  # GRN
        seq = torch.nn.functional.normalize(h.flatten(2), dim=1)  # [B, C, HW]
        pooled = self.pool(seq).squeeze(-1)  # [B, C]
        ones = torch.linalg.vector_norm(h, ord=1, dim=(2, 3))
        peak = torch.linalg.vector_norm(h, ord=float("inf"), dim=(2, 3))
        return self.head(self.drop(pooled + 0.01 * ones + 0.1 * peak))


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_norms_in_place_dropout_and_a_restrided_pool(target: str, tmp_path: Path) -> None:
    """Every op recorded (no Unsupported node), and parity on every target,
    gradients included: a zero norm's gradient is 0, as torch's."""
    import tracelog
    from tracelog.emit import targets

    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _NormsAndRelayouts()
    x, y = torch.randn(4, 3, 5, 5), torch.tensor([0, 2, 1, 1])
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        torch.nn.functional.cross_entropy(model(x), y).backward()
    log = tracelog.load(tmp_path)
    ops = {n.op for g in log.graphs.values() for n in g.nodes}
    assert "Unsupported" not in ops and "Dropout" in ops
    assert torch.isfinite(model.conv.weight.grad).all()
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)


class _WeightNormed(torch.nn.Module):
    """Weight normalisation (wav2vec2's positional convolution: dim=2; a linear
    layer: dim=0, through the parametrization API), hard activations
    (MobileNetV3, LeViT) and a number raised to a tensor's power (Funnel's
    frequencies)."""

    def __init__(self) -> None:
        super().__init__()
        conv = torch.nn.Conv1d(3, 4, 3, padding=1)
        with pytest.warns(FutureWarning):  # wav2vec2 still calls the old API
            self.conv = torch.nn.utils.weight_norm(conv, name="weight", dim=2)
        self.fc = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.hardswish(self.conv(x))
        h = h * torch.nn.functional.hardsigmoid(h)
        freq = 10.0 ** (torch.arange(4, dtype=h.dtype) / -4.0)
        return self.fc(h.mean(dim=2) * freq)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_weight_norm_hard_activations_and_a_scalar_base_power(target: str, tmp_path: Path) -> None:
    import tracelog
    from tracelog.emit import targets

    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _WeightNormed()
    x, y = torch.randn(4, 3, 6) * 3, torch.randn(4, 2)
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        torch.nn.functional.mse_loss(model(x), y).backward()
    log = tracelog.load(tmp_path)
    assert "Unsupported" not in {n.op for g in log.graphs.values() for n in g.nodes}
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    if target != "onnx":  # (the ONNX model has no gradients)
        assert any(c.name.startswith("grad conv.weight_g") for c in report.comparisons)


class _IndexPuts(torch.nn.Module):
    """x[idx] = v in its forms: rows by an index tensor (a negative one
    among them), a column pair by two index tensors, += with a repeated
    index, indexed dims that are not adjacent, a value broadcast along the
    batch, and a boolean mask with one value (x[x < 0] = 0) or one row."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 3)
        self.row = torch.nn.Parameter(torch.randn(6))
        self.cube = torch.nn.Linear(6, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        b = h.shape[0]
        a = h.clone()
        a[:, torch.tensor([0, -1])] = h[:, 2:4] * 2  # columns by an index tensor
        a[torch.tensor([1, 3]), torch.tensor([4, 5])] = self.row[:2]  # two index tensors
        a[:, torch.tensor([1, 2])] += h[:, :2]  # read, add, write back
        # accumulate with a repeated index: both writes add (a[i] += v with a repeated
        # i writes back without accumulating: which write wins is undefined in torch)
        rows = torch.arange(b).unsqueeze(1)
        a = a.index_put((rows, torch.tensor([1, 1, 2])), h[:, :3], accumulate=True)
        a[torch.tensor([2])] = self.row  # a row, the value broadcast along it
        a[a < -0.5] = 0.0  # a boolean mask, one value
        a[h > 1.0] = self.row[1]  # a mask, a one-element tensor
        a[h[:, 0] > 0.3] = self.row  # a mask of rows, one row (Wav2Vec2's masking)
        # (a[mask] += v reads a[mask] first: a count that depends on the data)
        a = a.index_put((h < -1.0,), self.row[0], accumulate=True)
        c = self.cube(x).view(b, 2, 3, 4)
        # the indexed dims first in the read (torch: not adjacent): [2, B, 3]
        c[:, torch.tensor([1]), :, torch.tensor([0, 3])] = (h[:, :2].t() * 0.5).unsqueeze(-1)
        return self.head(a + c.sum((1, 3))[:, :1])


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_index_put_records_and_translates(target: str, tmp_path: Path) -> None:
    """index_put in each form records as ScatterElements or Where (no
    unsupported node) and translates on every target, gradients through the
    written values and the overwritten input included, with the float64
    verdict."""
    torch.manual_seed(0)
    model, x = _IndexPuts(), torch.randn(8, 6)
    log, report = _checked(target, tmp_path, model, x)
    ops = _ops(log)
    assert "tracelog.Unsupported" not in ops
    assert {"ScatterElements", "Where"} <= ops
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    if target != "onnx":  # (the ONNX check compares predictions and the loss)
        assert any(c.name.startswith("grad row") for c in report.comparisons)


def test_index_put_of_a_value_per_masked_element(tmp_path: Path) -> None:
    # x[mask] = v with one value per selected element: v is x[mask]'s, its count a
    # symbol, and the write translates; a value made from the count read as a
    # Python number (mask.sum().item()) holds this batch's count: unsupported
    import tracelog

    class Masked(torch.nn.Module):
        def __init__(self, from_item: bool) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.from_item = from_item

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            mask = h > 0
            h = h.clone()
            if self.from_item:
                h[mask] = torch.arange(int(mask.sum().item()), dtype=h.dtype)
            else:
                h[mask] = h[mask] * 2
            return h

    for from_item in (False, True):
        log_dir = tmp_path / str(from_item)
        model = Masked(from_item)
        with TorchListener(model, log_dir) as listener, listener.batch():
            model(torch.randn(5, 4)).sum().backward()
        log = tracelog.load(log_dir)
        reasons = [
            n.attrs.get("reason")
            for e in log.entries_sorted()
            for n in log.graph(e.hash).nodes
            if n.op == "Unsupported"
        ]
        if from_item:
            assert any("depends on the data" in str(r) for r in reasons), reasons
        else:
            assert not reasons
            report = tracelog.check(log_dir, "torch")
            assert report.ok, report.table()


class _SampleSelects(torch.nn.Module):
    """One sample of the batch read by its index (the first, and the last
    counted from the end): torch.outer(h[0], h[-1])."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(h + torch.outer(h[0], h[-1]).sum(0) * 0.1)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_a_sample_of_the_batch_selected_by_index_translates(target: str, tmp_path: Path) -> None:
    """h[0] and h[-1] record as Gather on the batch dim (they recorded as
    unsupported) and translate on every target, with the float64 verdict;
    a batch of another size shares the graph (h[-1] is its own last sample)."""
    _translates_and_shares_a_graph(target, tmp_path, _SampleSelects())


class _WeightlessNorms(torch.nn.Module):
    """Layer norms with no weight and no bias (OLMo's), over the last dim and
    over the last two."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(self.fc(x), (12,))
        h = F.layer_norm(h.view(-1, 3, 4), (3, 4), eps=1e-3).flatten(1)
        return self.head(h)


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_layer_norms_without_weight_translate(target: str, tmp_path: Path) -> None:
    """A layer norm with no weight takes ones of the normalized shape as its
    scale: the PyTorch program's F.layer_norm refused the [1, n] it was
    given (OLMo), and over two axes it recorded as unsupported."""
    torch.manual_seed(0)
    log, report = _checked(target, tmp_path, _WeightlessNorms(), torch.randn(8, 6))
    assert "tracelog.Unsupported" not in _ops(log)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)


class _Eyes(torch.nn.Module):
    """Identity matrices: a batch-by-batch one masking each sample's score
    against itself (XLNet's -eye(qlen) beside its attention mask: a size the
    graph computes), as a float and as a bool mask, and a constant 6 x 4."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = x.shape[0]
        scores = h @ h.T - 4.0 * torch.eye(n, dtype=h.dtype)
        scores = scores.masked_fill(torch.eye(n, n, dtype=torch.bool), -1e4)
        mixed = torch.softmax(scores, dim=-1) @ h
        return self.head(torch.cat([mixed, h @ torch.eye(6, 4, dtype=h.dtype)], dim=1))


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_eye_of_a_constant_and_of_a_computed_size(target: str, tmp_path: Path) -> None:
    """torch.eye records as a constant, or over the batch as row == column
    of index ranges counted to the computed size (it recorded as
    unsupported); a batch of another size shares the graph."""
    _translates_and_shares_a_graph(target, tmp_path, _Eyes())


class _StatlessBatchNorms(torch.nn.Module):
    """Batch norms with no running statistics: a layer with
    track_running_stats=False, and BiT's weight standardisation (a
    convolution's weight normalised per output channel by F.batch_norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4, track_running_stats=False)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.conv.weight
        w = F.batch_norm(w.reshape(1, 4, -1), None, None, training=True, momentum=0.0, eps=1e-8)
        h = F.conv2d(x, w.reshape_as(self.conv.weight), self.conv.bias, padding=1)
        return self.head(torch.relu(self.norm(h)).mean(dim=(2, 3)))


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_batch_norm_without_running_statistics_translates(target: str, tmp_path: Path) -> None:
    """Batch statistics alone record as BatchNormTraining beside stand-in
    statistics it leaves unused (they recorded as unsupported)."""
    torch.manual_seed(0)
    log, report = _checked(target, tmp_path, _StatlessBatchNorms(), torch.randn(8, 2, 5, 5))
    ops = _ops(log)
    assert "tracelog.Unsupported" not in ops and "tracelog.BatchNormTraining" in ops, ops
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
