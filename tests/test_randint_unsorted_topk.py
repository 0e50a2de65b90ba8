"""torch.randint in the forward and topk(sorted=False), as Informer's ProbSparse
attention uses them: keys sampled at random (randint), the queries of the
largest sparsity measure picked (topk, unsorted), a dropout drawn over the
picked rows, the result scattered back. randint is a uniform float draw,
floored, capped and cast; the sample keeps the ints. topk(sorted=False) is
TopK put in the order the batch's gave, as a draw (a fresh run draws an
order): the dropout mask drawn over the picked rows meets them in that order.
The draw also decides which of the values tied at the k-th are picked (the
kernel's own choice): a mask scattered at the picked meets them (Doge)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch.rules_attention import topk_keys  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402
from tracelog.sample import mask_key  # noqa: E402

nn = torch.nn
F = nn.functional


class _ProbSparse(nn.Module):
    """Informer's ProbSparse self-attention over [B, L, 8], one head."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        n, length, _ = x.shape
        sample = torch.randint(0, length, (5,))  # keys sampled with repeats
        qk = q @ k[:, sample].transpose(1, 2)
        measure = qk.max(-1)[0] - qk.sum(-1) / length
        top = measure.topk(4, sorted=False)[1]  # [B, 4], in the partial sort's order
        rows = torch.arange(n).unsqueeze(-1)
        attn = F.dropout(torch.softmax(q[rows, top] @ k.transpose(1, 2), -1), 0.3, self.training)
        context = v.mean(1, keepdim=True).expand(n, length, 8).clone()
        context[rows, top] = attn @ v
        return self.out(context.mean(1))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("probsparse")
    torch.manual_seed(0)
    model = _ProbSparse()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for _ in range(2):
            x, y = torch.randn(3, 12, 8, generator=g), torch.randn(3, 2, generator=g)
            with listener.batch():
                F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return log_dir


def test_the_draws_are_nodes_and_the_sample_keeps_them(recorded: Path) -> None:
    log = tracelog.load(recorded)
    pred = log.graph(log.sample_info["prediction"])
    ops = [n.op for n in pred.nodes]
    assert "Unsupported" not in ops
    # randint's draw, topk's keys; the dropout's
    assert ops.count("RandomUniformLike") == 2 and ops.count("Dropout") == 1
    # topk(sorted=False): the input sorted by its keys, the k picked, put in key order
    assert ops.count("Floor") == 1 and ops.count("TopK") == 3
    sample = log.sample()
    draws = [sample[mask_key(k)] for k in range(log.sample_info["masks"])]
    ints = [d for d in draws if d.shape == (5,)]
    assert len(ints) == 1 and (ints[0] % 1 == 0).all() and 0 <= ints[0].min() < 12
    (keys,) = [d for d in draws if d.shape == (3, 12)]
    # one key per query: (r + 0.5) / 12 for r a permutation of 0..11, the picked 0..3
    assert sorted(np.round(keys[0] * 12 - 0.5).astype(int)) == list(range(12))


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_replays_the_ints_and_the_order(recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    report = tracelog.check(recorded, target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)


def _picked_by_keys(
    x: torch.Tensor, keys: torch.Tensor, k: int, dim: int, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(sorted=False)'s rule, in torch: the input in key order, the k
    first of a stable sort (the lower key first among equals), in key order."""
    perm = torch.argsort(keys, dim=dim, stable=True)
    values, picked = torch.sort(x.gather(dim, perm), dim=dim, descending=largest, stable=True)
    values, indices = values.narrow(dim, 0, k), perm.gather(dim, picked.narrow(dim, 0, k))
    order = torch.argsort(keys.gather(dim, indices), dim=dim, stable=True)
    return values.gather(dim, order), indices.gather(dim, order)


def test_topk_keys_pick_what_the_kernel_picked_in_its_order() -> None:
    """The keys make the rule pick the kernel's elements, in the kernel's
    order, along any dim, where many values tie at the k-th and the kernel
    kept other tied elements than the lower indices."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (3, 9, 4), generator=g).float()  # many ties
    for dim, largest in ((1, True), (2, False), (0, True)):
        k = 3 if dim != 0 else 2
        # a kernel's pick: a valid top k whose ties are broken at random, in any order
        noise = torch.rand(x.shape, generator=g) * 0.5  # below the values' spacing
        _, indices = (x + (noise if largest else -noise)).topk(k, dim, largest, sorted=False)
        indices = indices.index_select(dim, torch.randperm(k, generator=g))
        values = x.gather(dim, indices)
        keys = topk_keys(indices, x.shape[dim], dim)
        assert keys.shape == x.shape and keys.dtype == torch.float32
        got_values, got_indices = _picked_by_keys(x, keys, k, dim, largest)
        assert torch.equal(got_indices, indices) and torch.equal(got_values, values)
    # the lower indices among ties are not what such a kernel keeps: the case matters
    tied = torch.ones(1, 6)
    assert not torch.equal(tied.topk(2, sorted=False)[1], torch.tensor([[2, 5]]))
    keys = topk_keys(torch.tensor([[2, 5]]), 6, 1)
    assert torch.equal(_picked_by_keys(tied, keys, 2, 1, True)[1], torch.tensor([[2, 5]]))


class _TiedMask(nn.Module):
    """Doge's dynamic mask over [B, L, 8]: the top 4 keys by a per-key score
    stay, the others are masked. Its score parameter starts at zero, so every
    key ties and the kernel's partial sort decides which 4 stay."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.score, self.a = nn.Linear(8, 1), nn.Parameter(torch.zeros(1))
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        score = torch.exp(self.a * F.softplus(self.score(x)).squeeze(-1))  # [B, L], 1 at init
        top = score.topk(4, dim=-1, sorted=False).indices
        keep = torch.zeros_like(score).scatter(-1, top, 1.0)
        scores = self.q(x) @ self.k(x).transpose(1, 2) + score.unsqueeze(1)
        attn = torch.softmax(scores.masked_fill(keep.unsqueeze(1) == 0, -1e9), -1)
        return self.out((attn @ self.v(x)).mean(1))


def _record_tied(log_dir: Path) -> None:
    """One batch of _TiedMask, every key tied, recorded with its sample."""
    torch.manual_seed(0)
    model = _TiedMask()
    g = torch.Generator().manual_seed(1)
    with tracelog.Listener(model, log_dir, strict=True) as listener, listener.batch():
        x, y = torch.randn(3, 12, 8, generator=g), torch.randn(3, 2, generator=g)
        F.mse_loss(model(x), y).backward()


@pytest.mark.parametrize("target", TARGETS)
def test_a_mask_at_the_picked_of_tied_values_checks_on_every_target(
    tmp_path_factory: pytest.TempPathFactory, target: str
) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    log_dir = tmp_path_factory.mktemp(f"tied_{target}")
    _record_tied(log_dir)
    report = tracelog.check(log_dir, target)
    assert report.ok, report.table()
    # the float64 reference is the batch's: it kept the kernel's picks (with the lower
    # indices kept, it and the program agree, and the source's float32 is 0.2 off)
    errors = [c.source_err for c in report.comparisons if c.source_err is not None]
    assert errors and max(errors) < 1e-5, report.table()


def _lower_index_first(indices: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """topk_keys as it was before: the lower index first among equals, whatever
    the kernel picked."""
    shape, where = list(indices.shape), [1] * indices.dim()
    shape[dim] = where[dim] = size
    return ((torch.arange(size).view(where).expand(shape).double() + 0.5) / size).float()


def test_a_reference_that_replays_another_draw_than_the_batch_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The draw wrong on both sides (the rule and the float64 replay keep the
    lower indices among ties): the reference agrees with the program and not
    with the batch. The sample drops it, saying why, and the check then judges
    the program against the batch's own float32 values, and fails."""
    from tracelog.adapters.torch import listener as torch_listener

    monkeypatch.setattr(torch_listener, "topk_keys", _lower_index_first)
    _record_tied(tmp_path)
    log = tracelog.load(tmp_path)
    assert log.sample_info is not None
    note = log.sample_info["reference"]
    assert note.startswith("none: its loss ") and "a tracelog bug" in note, note
    assert note[len("none: ") :] in caplog.text
    assert not any(k.startswith(("ref64/", "scale64/")) for k in log.sample())
    report = tracelog.check(tmp_path, "torch")
    assert not report.ok and "no float64 reference: its loss" in report.title
    assert not next(c for c in report.comparisons if c.name == "loss").ok


def test_a_fresh_run_draws_ints_in_range() -> None:
    """As a training program (no recorded draws): floor of a uniform draw in
    [low, high), capped at high - 1, covers every int of the range."""
    from tracelog.emit.runtime import torch_program

    like = torch.zeros(4000)
    u = torch_program._uniform(like, -3.0, 4.0, None, "mask.0")
    ints = torch.minimum(torch.floor(u), torch.tensor(3.0))
    assert set(ints.long().tolist()) == set(range(-3, 4))


def test_randint_past_float32_ints_is_unsupported(tmp_path: Path) -> None:
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            i = torch.randint(0, 2**25, (x.shape[0],))
            return self.fc(x) + (i % 2).unsqueeze(-1)

    model = Wide()
    with tracelog.Listener(model, tmp_path) as listener, listener.batch():
        F.mse_loss(model(torch.randn(3, 4)), torch.randn(3, 2)).backward()
    log = tracelog.load(tmp_path)
    unsupported = [n for g in log.graphs.values() for n in g.nodes if n.op == "Unsupported"]
    assert unsupported and "exact ints" in str(unsupported[0].attrs)


def test_a_gate_on_a_scalar_replays_in_the_torch_program() -> None:
    """A gate on a 0-d value (a clamp of the loss): the recorded decision's
    comparison (signs > 0) is a numpy scalar, not an array; the PyTorch
    runtime takes it (it raised TypeError in Informer's redrawn runs)."""
    from tracelog.emit.runtime import torch_program

    signs = np.array(1, dtype=np.int8)
    x, y = torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.25, dtype=torch.float64)
    assert isinstance(signs > 0, np.bool_)
    assert float(torch_program._gate_where(signs > 0, x, y)) == 0.5
    assert float(torch_program._gate_where(signs < 0, x, y)) == 0.25
