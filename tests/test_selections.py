"""Selections by the data: x[mask], masked_select and nonzero, whose output
size is how many elements a mask selects. Each mask's count is a symbol of its
own ("count"), found by the batch-dim replay as the sequence length is, so
batches that select different numbers of rows share one graph pair; the
programs select at run time (Compress, NonZero), JAX's op by op (jax.jit
traces static shapes only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402
from tracelog.ir import parse_dim  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _Tagger(nn.Module):
    """Per-token logits over a [B, T] sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(ids)))


def _labelled_rows(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # the rows with a label (y >= 0): the predictions and the labels by one mask
    keep = y >= 0
    return F.cross_entropy(p[keep], y[keep])


def _labelled_by_nonzero(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # DeBERTa's classification loss: the labelled rows' indices from nonzero, the
    # rows gathered with an index expanded to (count, classes)
    index = (y >= 0).nonzero()
    rows = torch.gather(p, 0, index.expand(index.size(0), p.size(1)))
    return F.cross_entropy(rows, torch.gather(y, 0, index.view(-1)))


def _tokens(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a token-level loss over the tokens a [B, T] mask keeps, and a penalty on the
    # logits above 1 taken with masked_select
    keep = y != -100
    large = torch.masked_select(p, p > 1.0)
    return F.cross_entropy(p[keep], y[keep]) + 0.01 * (large - 1.0).pow(2).sum()


def _labels(step: int, n: int) -> torch.Tensor:
    """Labels with -1 for unlabelled rows: a count that changes every batch,
    one batch all labelled (a count equal to the batch size) and one with a
    single label."""
    y = torch.randint(-1, 5, (n,))
    if step == 1:
        y = torch.arange(n) % 5
    if step == 2:
        y = torch.full((n,), -1)
        y[3] = 2
    return y


def _record(
    tmp_path: Path, model: nn.Module, loss: Any, batches: list[tuple[Any, Any]], mode: str
) -> tracelog.TraceLog:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracelog.Listener(model, tmp_path, mode=mode, strict=True) as listener:
        for x, y in batches:
            with listener.batch():
                loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return tracelog.load(tmp_path)


def _rows(n_batches: int = 8) -> list[tuple[Any, Any]]:
    torch.manual_seed(0)
    return [(torch.randn(8, 6), _labels(step, 8)) for step in range(n_batches)]


def _one_pair(log: tracelog.TraceLog, batches: int) -> None:
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops, ops
    usage = {e.kind: e.usage.batches for e in log.entries.values()}
    assert len(log.entries) == 2 and usage == {"prediction": batches, "loss": batches}, usage


def _counted_dims(log: tracelog.TraceLog) -> set[str]:
    found = set()
    for g in log.graphs.values():
        for v in g.values.values():
            for d in v.type.shape:
                if isinstance(d, str):
                    found |= {s for m in parse_dim(d) for s in m if s.startswith("count")}
    return found


def _check(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    assert_translated(tracelog.check(tmp_path, target))


@pytest.mark.parametrize("loss", [_labelled_rows, _labelled_by_nonzero])
@pytest.mark.parametrize("mode", ["exact", "guarded"])
def test_rows_selected_by_a_mask_are_one_graph_pair_whatever_their_count(
    loss: Any, mode: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    log = _record(tmp_path, nn.Linear(6, 5), loss, _rows(), mode)
    _one_pair(log, 8)
    assert _counted_dims(log) == {"count"}
    if mode == "guarded":
        guarded = [e.usage.guarded for e in log.entries.values()]
        assert all(g > 0 for g in guarded), guarded


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("loss", [_labelled_rows, _labelled_by_nonzero])
def test_a_loss_over_the_labelled_rows_translates(target: str, loss: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _one_pair(_record(tmp_path, nn.Linear(6, 5), loss, _rows(4), "exact"), 4)
    _check(target, tmp_path)


@pytest.mark.parametrize("target", TARGETS)
def test_a_token_loss_over_a_sequence_mask_and_masked_select_translate(
    target: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    batches = []
    for n, t in ((4, 7), (4, 7), (3, 7)):
        ids = torch.randint(0, 20, (n, t))
        y = torch.randint(0, 5, (n, t))
        y[:, -2:] = -100  # padding
        y[0, :3] = -100
        batches.append((ids, y))
    log = _record(tmp_path, _Tagger(), _tokens, batches, "exact")
    _one_pair(log, 3)
    assert _counted_dims(log) == {"count", "count2"}  # the tokens kept, the logits above 1
    _check(target, tmp_path)


def test_the_jax_program_selects_op_by_op(tmp_path: Path) -> None:
    pytest.importorskip("jax", reason="the JAX target needs jax installed")
    torch.manual_seed(0)
    _record(tmp_path, nn.Linear(6, 5), _labelled_rows, _rows(2), "exact")
    program = tracelog.emit(tmp_path, target="jax")
    text = Path(program).read_text()
    assert "jnp.compress(" in text and "\nSTATIC_SHAPES = False" in text
    torch_text = Path(tracelog.emit(tmp_path, target="torch")).read_text()
    assert "STATIC_SHAPES" not in torch_text


class _Rewritten(nn.Module):
    """x[mask] = f(x[mask]) and x[mask] += g(x[mask]): a value per selected
    element, over a mask of one dim and of two."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        out = h.clone()
        keep = h > 0
        out[keep] = torch.sqrt(h[keep]) * 2
        extra = torch.zeros_like(h)
        big = h > 0.5
        extra[big] += h[big] ** 2
        pairs = h.reshape(h.shape[0], 2, 4).clone()
        lead = pairs[..., 0] > 0
        pairs[lead] = pairs[lead].flip(-1) * 3
        return self.head(out + extra + pairs.reshape(h.shape[0], 8))


@pytest.mark.parametrize("target", TARGETS)
def test_writes_of_a_value_per_selected_element_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(8, 6), torch.arange(8) % 5) for _ in range(3)]
    log = _record(tmp_path, _Rewritten(), F.cross_entropy, batches, "exact")
    _one_pair(log, 3)
    assert {"count", "count2", "count3"} <= _counted_dims(log)
    _check(target, tmp_path)


def test_batches_of_other_counts_share_a_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the fingerprint reads a selection's count as it reads the batch size: exact
    # mode builds the graphs (and replays the tape) once, not once per count
    import tracelog.adapters.torch.listener as listener

    built = []
    replay = listener.exact_batch_dims

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return replay(*args, **kwargs)

    monkeypatch.setattr(listener, "exact_batch_dims", counting)
    torch.manual_seed(0)
    batches = []
    # counts 6, 7, 4, 6, 7 of 8 (not 5: a count equal to the classes marks their dim
    # too, and a batch of another count is then another fingerprint, rightly)
    for unlabelled in (2, 1, 4, 2, 1):
        y = torch.arange(8) % 5
        y[:unlabelled] = -1
        batches.append((torch.randn(8, 6), y))
    log = _record(tmp_path, nn.Linear(6, 5), _labelled_rows, batches, "exact")
    _one_pair(log, 5)
    assert len(built) == 1
