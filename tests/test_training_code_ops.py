"""Ops and losses of everyday training code that recorded as unsupported,
crashed the recording, or lost the float64 reference (found by trying them):
nn.BCELoss on probabilities, cross entropy with label smoothing, class weights
and an ignored label together, torch.roll by one along the batch (each
sample's neighbour as its negative), index_add into a tensor made without a
dtype, diag_embed, bucketize, linspace, Tensor.unfold (sliding windows),
torch.quantile (sort, lerp by tensors, any, isnan, squeeze_), index_copy,
index_fill, special.xlog1py, an embedding with scale_grad_by_freq,
torch.isfinite (a product of bools), searchsorted, nansum,
masked_scatter, aminmax, renorm, ldexp, tril/triu_indices, pdist and RReLU
in training. Each translates on every target with its float64 rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _Ops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.embed = nn.Embedding(10, 8, padding_idx=0, scale_grad_by_freq=True)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        tokens = (
            (x[:, :3].abs() * 4).long().clamp(max=8)
        )  # repeats: counts > 1 (8: not a batch size)
        edges = torch.linspace(-1.0, 1.0, 5)
        spread = torch.zeros(n, 4).index_add(1, torch.arange(8) % 4, h)  # zeros: no dtype=
        terms = [
            self.embed(tokens).sum(1),
            torch.diag_embed(h[:, :4]).reshape(n, 16)[:, :8],
            torch.bucketize(h.detach(), edges).float() * h,
            torch.bucketize(h.detach(), edges, right=True).float() * 0.5,
            spread.repeat(1, 2),
            torch.where(torch.isfinite(h.log()), h, -h),
            h.roll(1, 0) - h.roll(-1, 0) * 0.5,
            torch.quantile(h, 0.75, dim=-1, keepdim=True),  # sort, lerp, any, isnan
            torch.quantile(h, torch.tensor([0.1, 0.5]), dim=-1).T.repeat(1, 4),
            torch.zeros(n, 8).index_copy(1, torch.arange(8).flip(0), h),
            h.index_fill(1, torch.tensor([0, 3]), 0.5),
            torch.special.xlog1py(h.relu(), h.abs()),
            torch.lerp(h, h.flip(-1), torch.sigmoid(h.detach())),
            (h > 0).any(-1, keepdim=True).float() + (h > -3).all(-1, keepdim=True).float(),
            h.unfold(1, 4, 2).sum(-1).repeat(1, 3)[:, :8],  # windows of 4, every 2
            h.view(n, 2, 4).unfold(2, 2, 1).reshape(n, 12)[:, :8],
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


def _losses(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    probs = torch.sigmoid(p)
    labels = (y.unsqueeze(1) == torch.arange(5)).float()
    ignored = torch.where(y == 3, torch.full_like(y, -100), y)
    anchor, positive = p, p.flip(-1)
    return (
        F.binary_cross_entropy(probs, labels)
        + F.binary_cross_entropy(probs, labels, weight=torch.linspace(0.5, 1.5, 5), reduction="sum")
        * 0.1
        + F.cross_entropy(
            p, ignored, label_smoothing=0.1, weight=torch.linspace(0.5, 1.5, 5), ignore_index=-100
        )
        + F.triplet_margin_loss(anchor, positive, anchor.roll(1, 0))
    )


def _check(target: str, tmp_path: Path, model: nn.Module, loss: Any) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    with TorchListener(model, tmp_path, strict=True) as listener:
        for n in (12, 9):  # a second batch size: the same graphs
            x, y = torch.randn(n, 6) * 2, torch.arange(n) % 5
            with listener.batch():
                loss(model(x), y).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops and "Unsupported" not in ops, ops
    assert [e.usage.batches for e in log.entries.values() if e.kind == "prediction"] == [2]
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated), report.table()


@pytest.mark.parametrize("target", TARGETS)
def test_ops_translate_with_their_float64_rows(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Ops(), F.cross_entropy)


@pytest.mark.parametrize("target", TARGETS)
def test_bce_smoothed_weighted_ce_and_rolled_negatives_translate(
    target: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, nn.Linear(6, 5), _losses)


class _Gumbel(nn.Module):
    """Discrete latents trained through F.gumbel_softmax (its noise an
    exponential_ draw), hard (straight-through) and soft."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(F.gumbel_softmax(h, tau=0.5, hard=True) + F.gumbel_softmax(h, tau=2.0))


@pytest.mark.parametrize("target", TARGETS)
def test_gumbel_softmax_replays_its_exponential_draws(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Gumbel(), F.cross_entropy)
    ops = set().union(*(g.op_histogram() for g in tracelog.load(tmp_path).graphs.values()))
    assert "tracelog.RandomExponentialLike" in ops, ops


@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax"])
def test_a_fresh_exponential_draw_has_rate_one(target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    import numpy as np

    from tracelog.emit import get_target
    from tracelog.emit.inline import import_block

    namespace: dict[str, Any] = {}
    emitter = get_target(target)
    runtime = emitter.helpers
    used = [runtime.functions[h] for h in runtime.helpers_used(runtime.functions["_exponential"])]
    parts = [import_block(emitter.pieces), *runtime.statements, *used]
    exec("\n\n".join(parts), namespace)
    like = np.zeros((200, 100), np.float32)
    if target == "torch":
        drawn = namespace["_exponential"](torch.from_numpy(like), None, "mask.0").numpy()
    elif target == "jax":
        import jax

        drawn = np.asarray(namespace["_exponential"](like, jax.random.PRNGKey(0), "mask.0"))
    else:
        import tensorflow as tf

        drawn = namespace["_exponential"](tf.constant(like), None, "mask.0").numpy()
    assert drawn.dtype == np.float32 and drawn.min() >= 0.0
    assert abs(drawn.mean() - 1.0) < 0.05 and abs(drawn.std() - 1.0) < 0.05


def _per_positive(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A multi-label loss normalised by the batch's positives, and a token loss
    by its valid labels: sums over the targets, computed after the forward."""
    labels = (y.unsqueeze(1) == torch.arange(5)).float()
    positives = labels.sum().clamp(min=1)
    bce = F.binary_cross_entropy_with_logits(p, labels, reduction="sum") / positives
    masked = torch.where(y == 3, torch.full_like(y, -100), y)
    valid = (masked != -100).sum()
    return bce + F.cross_entropy(p, masked, ignore_index=-100, reduction="sum") / valid


@pytest.mark.parametrize("mode", ["exact", "guarded"])
def test_a_loss_normalised_by_its_targets_is_one_graph(mode: str, tmp_path: Path) -> None:
    # the sums over the targets were constants of each batch's data: a loss graph per
    # batch (exact), and guarded batches counted for another batch's graph
    torch.manual_seed(0)
    model = nn.Linear(6, 5)
    with TorchListener(model, tmp_path, mode=mode, guard_after=2, strict=True) as listener:
        for step in range(8):
            x, y = torch.randn(10, 6), torch.randint(0, 5, (10,))
            y[step % 10] = 3  # a different count of ignored labels in each batch
            with listener.batch():
                _per_positive(model(x), y).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert [e.usage.batches for e in log.entries.values() if e.kind == "loss"] == [8]
    if mode == "guarded":
        assert log.recording is not None and log.recording.get("guarded", 0) > 0, log.recording
    report = tracelog.check(tmp_path, "torch")
    assert report.ok and all(c.ok for c in report.comparisons), report.table()


def test_a_roll_along_the_batch_by_more_than_one_is_unsupported(tmp_path: Path) -> None:
    # torch takes the shift modulo the size, which batches sharing the graph may not have
    model = nn.Linear(6, 5)
    with TorchListener(model, tmp_path, strict=False) as listener, listener.batch():
        model(torch.randn(8, 6)).roll(3, 0).pow(2).mean().backward()
    log = tracelog.load(tmp_path)
    reasons = [n.attrs.get("reason", "") for g in log.graphs.values() for n in g.nodes]
    assert any("a roll by 3 along the batch" in r for r in reasons), reasons


class _Normalised(nn.Module):
    """Weights reparametrised as GAN and flow code does: nn.utils.spectral_norm
    (power iteration on its u and v buffers in place, sigma by torch.dot), the
    parametrizations' spectral_norm and weight_norm."""

    def __init__(self) -> None:
        super().__init__()
        P = nn.utils.parametrizations
        self.a = nn.utils.spectral_norm(nn.Linear(6, 8))
        self.b = P.spectral_norm(nn.Linear(8, 8))
        self.c = P.weight_norm(nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("target", TARGETS)
def test_spectral_and_weight_norm_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Normalised(), F.cross_entropy)


class _BatchMean(nn.Module):
    """A batch mean written out in the forward: sum over the batch divided by
    x.size(0), a Python int."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(h - h.sum(0, keepdim=True) / x.size(0))


def _divided_by_batch(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Losses divided by the batch size as a number: F.kl_div's batchmean
    (distillation from a detached teacher), cross entropy with probabilities as
    targets (aten divides by the sample count), a sum over the batch's size."""
    teacher = F.log_softmax(p.flip(0).detach(), -1)
    return (
        F.kl_div(F.log_softmax(p, -1), teacher, reduction="batchmean", log_target=True)
        + F.cross_entropy(p, teacher.exp(), label_smoothing=0.05)
        + F.cross_entropy(p, y, reduction="sum") / p.shape[0]
    )


@pytest.mark.parametrize("target", TARGETS)
def test_a_division_by_the_batch_size_is_one_graph(target: str, tmp_path: Path) -> None:
    # the first batch's size was a constant of the graphs, which the fingerprint
    # (reading such an int as the batch) counted the batch of 9 against
    torch.manual_seed(0)
    _check(target, tmp_path, _BatchMean(), _divided_by_batch)
    log = tracelog.load(tmp_path)
    assert [e.usage.batches for e in log.entries.values() if e.kind == "loss"] == [2]
    numbers = {
        float(x)
        for g in log.graphs.values()
        for v in g.constants
        if v.const is not None and v.const.data is not None and not v.type.shape
        for x in [v.const.data]
    }
    assert 12.0 not in numbers, numbers  # the first batch's size


class _Geometry(nn.Module):
    """A similarity matrix's diagonal (torch.diag, diagonal with offsets, trace),
    cross products, copysign, frac, entr, rot90 and RReLU in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        sim = h @ h.T  # [batch, batch]
        blocks = h.view(-1, 2, 4)
        terms = [
            torch.diag(sim).unsqueeze(1) * 0.1,
            sim.masked_fill(sim < 0, float("-inf")).diagonal().unsqueeze(1).clamp(min=0) * 0.1,
            torch.diagonal(blocks, offset=1, dim1=1, dim2=2).repeat(1, 4),
            torch.diagonal(h.view(-1, 4, 2), offset=-1, dim1=2, dim2=1).repeat(1, 8),
            torch.trace(h[:, :4].T @ h[:, :4]).expand(h.shape[0], 8) * 0.01,
            torch.linalg.cross(h[:, :3], h[:, 3:6]).repeat(1, 3)[:, :8],
            torch.copysign(h, h.flip(-1)) + torch.frac(h * 3.0),
            torch.special.entr(torch.sigmoid(h)),
            torch.rot90(blocks, 1, (1, 2)).reshape(-1, 8)
            + torch.rot90(blocks, 3, (2, 1)).reshape(-1, 8),
            F.rrelu(h, training=False),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", TARGETS)
def test_diagonals_cross_products_and_small_ops_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Geometry(), F.cross_entropy)


class _Sorted(nn.Module):
    """searchsorted (left, right, a float64 sequence), nansum and nanmean of
    values with NaNs, and masked_scatter from a source of the batch's shape
    and from a fixed-size one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        edges = torch.tensor([-1.0, -0.25, 0.5, 2.0])
        holed = torch.where(h > 1.0, torch.nan, h)
        table = torch.arange(96.0).reshape(12, 8) / 96.0
        terms = [
            torch.searchsorted(edges, h.detach().contiguous()).float() * h,
            torch.searchsorted(edges.double(), h.detach().contiguous(), side="right").float(),
            torch.nanmean(holed, dim=-1, keepdim=True) + torch.nansum(holed) * 0.01,
            h.masked_scatter(h > 0, h.flip(-1) * 3.0),
            h.masked_scatter(torch.tensor([True, False] * 4), table * h.mean()),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", TARGETS)
def test_searchsorted_nan_reductions_and_masked_scatter_translate(
    target: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Sorted(), F.cross_entropy)


class _Scattered(nn.Module):
    """scatter_reduce with sum, amax, amin and mean, with and without the
    input's own values (include_self), into rows a batch-sized repeat of one
    index row picks (arange(n).repeat(B, 1): its leading dim added, the batch's
    count computed from the data), and a parameter row repeated per sample."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)
        self.row = nn.Parameter(torch.randn(1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        index = torch.arange(8).repeat(n, 1) % 3
        start = torch.full((n, 4), 0.5)
        terms = [
            start.scatter_reduce(1, index, h, reduce, include_self=include).repeat(1, 2)
            for reduce in ("sum", "amax", "amin", "mean")
            for include in (True, False)
        ]
        total = h + self.row.repeat(n, 1)
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_reduce_without_self_and_batch_repeats_translate(
    target: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Scattered(), F.cross_entropy)


class _Spread(nn.Module):
    """aminmax, renorm (some rows over the limit, some under), ldexp,
    tril_indices and triu_indices, pdist over a fixed number of rows (the
    batch is its width), and quantile at a level float32 does not hold
    exactly (its q is a float constant: 0.3, not 0.30000001, in float64),
    and RReLU in training (its slopes drawn per element, fed back from the
    sample)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)
        self.rrelu = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        low, high = torch.aminmax(h, dim=-1, keepdim=True)
        square = h[:, :4, None] * h[:, None, 4:]  # [n, 4, 4]
        rows, cols = torch.tril_indices(4, 4, -1)
        upper = torch.triu_indices(4, 4, 1)
        terms = [
            low * high + torch.aminmax(h).max,
            torch.renorm(h, 2, 0, 1.5) + torch.renorm(h, 1, 1, 2.0),
            torch.ldexp(h, torch.arange(8) % 3 - 1),
            (square[:, rows, cols] - square[:, upper[0], upper[1]]).repeat(1, 2)[:, :8] * 0.1,
            torch.pdist(h.T[:6].contiguous())[:8] + torch.pdist(h.T[2:], p=1)[:8] * 0.1,
            torch.quantile(h, 0.3, dim=-1, keepdim=True).expand(n, 8),
            self.rrelu(h) + F.rrelu(h * 2, 0.05, 0.5, training=True),  # slopes drawn
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


@pytest.mark.parametrize("target", TARGETS)
def test_aminmax_renorm_ldexp_triangle_indices_pdist_quantile_and_rrelu_translate(
    target: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Spread(), F.cross_entropy)


class _Reversed(torch.autograd.Function):
    """A gradient reversal (domain-adversarial training): identity forward,
    negated backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return -grad


class _Squared(torch.autograd.Function):
    """x * x with its own backward, which is the derivative of its forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _Custom(nn.Module):
    def __init__(self, function: Any) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 5)
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.head(self.function.apply(h) * 2 + h)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_a_custom_backward_that_is_not_the_forwards_derivative_fails_the_check(
    target: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reference and the programs differentiate the recorded forward; a
    custom Function's own backward (here a gradient reversal) trained with
    another gradient, which the sample marks and every check fails on, naming
    the parameters. A custom backward that is the derivative passes."""
    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="tracelog"):
        with TorchListener(_Custom(_Reversed), tmp_path / "reversed", strict=True) as listener:
            x, y = torch.randn(8, 6), torch.arange(8) % 5
            with listener.batch():
                F.cross_entropy(listener.model(x), y).backward()
    assert "_Reversed" in caplog.text and "fc.weight" in caplog.text
    report = tracelog.check(tmp_path / "reversed", target)
    assert not report.ok
    failed = {c.name for c in report.comparisons if not c.ok}
    assert "grad fc.weight (the source's, by a custom autograd backward)" in failed, failed
    assert "grad fc.bias (the source's, by a custom autograd backward)" in failed, failed
    _check(target, tmp_path / "squared", _Custom(_Squared), F.cross_entropy)
