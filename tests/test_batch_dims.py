"""The batch-dim search's replay (adapters/torch/batch_dims.py): remembering
meta kernels' outputs by their arguments changes no result, and a model's
repeated layers run each meta kernel once per replay size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import tracelog
from tracelog.adapters.torch import batch_dims
from tracelog.adapters.torch import listener as torch_listener


class _Forgetful(dict):  # type: ignore[type-arg]
    """A memo that keeps nothing: every replay runs every kernel."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.softmax(self.fc(self.norm(x)), dim=-1)


def _kept_tapes(monkeypatch: Any) -> list[Any]:
    """The list each tape the listener searches for batch dims is added to."""
    tapes: list[Any] = []

    def keep(tape: Any, **kwargs: Any) -> Any:
        tapes.append(tape)
        return batch_dims.exact_batch_dims(tape, **kwargs)

    monkeypatch.setattr(torch_listener, "exact_batch_dims", keep)
    return tapes


def _tape(tmp_path: Path, monkeypatch: Any) -> Any:
    """The tape of one recorded batch of six equal layers over [B, T, 8] data."""
    tapes = _kept_tapes(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(*[_Layer(8) for _ in range(6)], nn.Linear(8, 3))
    x, y = torch.randn(4, 5, 8), torch.randint(0, 3, (4, 5))
    with tracelog.Listener(model, tmp_path / "log") as listener, listener.batch():
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
    return tapes[0]


def _kernel_calls(monkeypatch: Any) -> list[int]:
    calls = [0]
    call = batch_dims._MetaReplay._call

    def counted(self: Any, rec: Any, args: Any, kwargs: Any) -> Any:
        calls[0] += 1
        return call(self, rec, args, kwargs)

    monkeypatch.setattr(batch_dims._MetaReplay, "_call", counted)
    return calls


def test_the_memo_changes_no_shape_and_runs_each_layer_kernel_once(
    tmp_path: Path, monkeypatch: Any
) -> None:
    tape = _tape(tmp_path, monkeypatch)
    calls = _kernel_calls(monkeypatch)
    forgetful = batch_dims.exact_batch_dims(tape, memo=_Forgetful())
    without = calls[0]
    calls[0] = 0
    memo: batch_dims.Memo = {}
    remembered = batch_dims.exact_batch_dims(tape, memo=memo)
    assert forgetful is not None and remembered is not None
    assert [r.outs for r in remembered.recs] == [r.outs for r in forgetful.recs]
    assert [r.args for r in remembered.recs] == [r.args for r in forgetful.recs]
    # the symbols were found: [B, T, 8] data, T a sequence symbol
    assert any("seq" in str(d) for r in remembered.recs for o in r.outs for d in o.shape)
    # six equal layers: their kernels run once per replay size, not six times
    assert calls[0] * 3 < without, (calls[0], without)


def test_a_repeated_layers_records_are_ranked_once_per_replay(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # the choices of a record (and the checks of each) are tried once per
    # replay size for six equal layers; the rest take the remembered outcomes
    tape = _tape(tmp_path, monkeypatch)
    ranked = [0]
    outcomes_of = batch_dims._MetaReplay._outcomes_of

    def counted(self: Any, rec: Any, plan: Any) -> Any:
        ranked[0] += 1
        return outcomes_of(self, rec, plan)

    monkeypatch.setattr(batch_dims._MetaReplay, "_outcomes_of", counted)
    forgetful = batch_dims.exact_batch_dims(tape, memo=_Forgetful())
    without, ranked[0] = ranked[0], 0
    remembered = batch_dims.exact_batch_dims(tape, memo={})
    assert forgetful is not None and remembered is not None
    assert [r.outs for r in remembered.recs] == [r.outs for r in forgetful.recs]
    assert remembered.symbols == forgetful.symbols
    assert ranked[0] * 3 < without, (ranked[0], without)


def test_no_two_tries_of_a_record_run_the_same_arguments(tmp_path: Path, monkeypatch: Any) -> None:
    # choice None (every int follows) and {0: 1} are one argument list where a
    # record has one int that may follow (LayerNorm's [8] at B = 4): run once
    tape = _tape(tmp_path, monkeypatch)
    runs: list[list[tuple[tuple[int, ...], int | None]]] = []  # per ranking of a record
    duplicated = [0]  # records whose choices name one argument list twice
    ranked, run_with = batch_dims._MetaReplay._ranked, batch_dims._MetaReplay.run_with
    choices = batch_dims._MetaReplay.choices

    def counted_ranked(self: Any, rec: Any, plan: Any, tries: Any) -> Any:
        runs.append([])
        return ranked(self, rec, plan, tries)

    def counted(self: Any, rec: Any, plan: Any, values: Any, infer: Any = None) -> Any:
        runs[-1].append((values, infer))
        return run_with(self, rec, plan, values, infer)

    def counted_choices(self: Any, plan: Any, limit: int = 128) -> Any:
        found = choices(self, plan, limit)
        duplicated[0] += len({plan.values(c) for c in found}) < len(found)
        return found

    monkeypatch.setattr(batch_dims._MetaReplay, "_ranked", counted_ranked)
    monkeypatch.setattr(batch_dims._MetaReplay, "run_with", counted)
    monkeypatch.setattr(batch_dims._MetaReplay, "choices", counted_choices)
    assert batch_dims.exact_batch_dims(tape, memo=_Forgetful()) is not None
    assert duplicated[0] > 0  # the case arises in this tape
    assert all(len(set(tried)) == len(tried) for tried in runs)


def test_a_view_or_expand_not_asked_is_one_that_raises() -> None:
    # the replay skips a choice whose view or expand cannot fit its input; each
    # skipped one must be one the meta kernel refuses
    from types import SimpleNamespace

    src = torch.empty(4, 6, 8, device="meta")
    lists = [
        [4, 6, 8], [4, 48], [192], [5, 6, 8], [4, -1], [-1, 7], [-1, -1, 8], [2, 2, 6, 8],
        [4, 6, 1, 8], [3, 4, 6, 8], [4, 1, 8], [6, 8], [4, 6, 9], [4, -1, 8], [0, -1],
    ]  # fmt: skip
    ops = {
        "aten.view.default": torch.ops.aten.view.default,
        "aten.reshape.default": torch.ops.aten.reshape.default,
        "aten.expand.default": torch.ops.aten.expand.default,
    }
    left_to_the_kernel = []
    for name, op in ops.items():
        for sizes in lists:
            plan = batch_dims._Plan([src, list(sizes)], {}, [], None)
            cannot = batch_dims._cannot_fit(SimpleNamespace(op=name), plan, (), None)
            try:
                op(src, sizes)
            except Exception:
                if not cannot:
                    left_to_the_kernel.append((name.split(".")[1], sizes))
            else:
                assert not cannot, (name, sizes)
    # a -1 beside a 0 size, and an expand with a -1: the kernel's to refuse
    assert left_to_the_kernel == [
        ("view", [0, -1]), ("reshape", [0, -1]),
        ("expand", [4, -1]), ("expand", [-1, 7]), ("expand", [0, -1]),
    ]  # fmt: skip
    # a slot takes its choice's value, and `infer` writes -1 in its place
    plan = batch_dims._Plan([src, [batch_dims._Slot(0), 48]], {}, [(4, [5])], None)
    view = SimpleNamespace(op="aten.view.default")
    assert not batch_dims._cannot_fit(view, plan, (4,), None)
    assert batch_dims._cannot_fit(view, plan, (5,), None)
    assert batch_dims._cannot_fit(view, plan, (5,), 1)  # [5, -1]: 192 is no multiple of 5
    assert not batch_dims._cannot_fit(view, plan, (4,), 1)


class _ConstantMask(nn.Module):
    """A constant made in the forward whose size is twice the batch size
    (8 with batches of 4), beside zeros made from x.size(0) and twice it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        mask = torch.tril(torch.ones(8, 8))
        state = torch.zeros(n, 8) + torch.zeros(n * 2, 8).view(n, 16)[:, :8]
        return self.fc(x) @ mask + state


def test_a_constant_sized_twice_the_batch_stays_a_number(tmp_path: Path) -> None:
    """torch.ones(8, 8) in a batch of 4 runs in the B + 1 replay either kept or
    as ones(8, 2B); the reading that keeps a record's k*B (k > 1) ranks first,
    so its columns stay 8 (a slice of them was refused as part of the batch),
    while zeros(x.size(0), 8) and zeros(2 * x.size(0), 8), which the data
    needs moved, still follow the batch: batches of 4 and 5 give one graph."""
    torch.manual_seed(0)
    model = _ConstantMask()
    with tracelog.Listener(model, tmp_path, strict=True) as listener:
        for n in (4, 5):
            with listener.batch():
                out = model(torch.randn(n, 8))
                torch.nn.functional.mse_loss(out[:, :1], torch.zeros(n, 1)).backward()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    kinds = [g.kind for g in log.graphs.values()]
    assert sorted(kinds) == ["loss", "prediction"], kinds  # one pair for both sizes
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "Unsupported" not in ops and "tracelog.Unsupported" not in ops, ops
    report = tracelog.check(tmp_path, "onnx")
    assert report.ok, report.table()


class _ChannelsLastProjection(nn.Module):
    """CvT's convolutional projection: tokens [B, L, C] permuted and viewed as
    an image (channels-last strides), a convolution, the image viewed back as
    tokens [B, L, C] and a Linear over them. On the CPU the convolution keeps
    its input's channels-last layout, so the Linear's flattening view of the
    permuted tokens is a view; the meta kernel gives a contiguous output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        image = self.conv(x.permute(0, 2, 1).view(n, 8, 4, 4))
        return self.fc(image.view(n, 8, 16).permute(0, 2, 1)).mean(dim=1)


def test_a_view_the_meta_layout_cannot_take_replays(tmp_path: Path, monkeypatch: Any) -> None:
    """The replay runs a view as a reshape: as a view of the contiguous meta
    it raised, the replay failed, and every dim equal to the batch size was
    guessed to be it (CvT's [B, H * W, C] with H * W = B: a split of it then
    failed to record). Here H = W = B = 4."""
    tapes = _kept_tapes(monkeypatch)
    torch.manual_seed(0)
    model = _ChannelsLastProjection()
    with tracelog.Listener(model, tmp_path / "log", strict=True) as listener, listener.batch():
        x, y = torch.randn(4, 16, 8), torch.randint(0, 3, (4,))
        nn.functional.cross_entropy(model(x), y).backward()
    assert batch_dims.exact_batch_dims(tapes[0]) is not None
    log = tracelog.load(tmp_path / "log")
    shapes = {v.type.shape for g in log.graphs.values() for v in g.values.values()}
    assert ("batch", 8, 4, 4) in shapes and not any(s.count("batch") > 1 for s in shapes), shapes
    assert tracelog.check(tmp_path / "log", "torch").ok


class _EmptyPart(nn.Module):
    """A data-derived value with an empty dim (an empty selection, as
    AdaptiveLogSoftmaxWithLoss makes for a cluster no target falls in)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.cat([h, h[:, 8:] * 2], 1)


def test_an_empty_data_dim_is_zero_not_a_batch_multiple(tmp_path: Path) -> None:
    # 0 = 0 * B read as "batch*0" wrote a shape load() refuses: the log was unreadable
    torch.manual_seed(0)
    model = _EmptyPart()
    with tracelog.Listener(model, tmp_path, strict=True) as listener, listener.batch():
        model(torch.randn(4, 8)).pow(2).mean().backward()
    log = tracelog.load(tmp_path)
    assert log.recorded == 1 and log.unrecorded == 0
    shapes = [v.type.shape for g in log.graphs.values() for v in g.values.values()]
    assert ("batch", 0) in shapes, shapes
    assert tracelog.check(tmp_path, "torch").ok


def test_a_graph_with_a_dim_no_log_holds_fails_its_batch_not_the_log(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from tracelog import ir

    monkeypatch.setattr(ir, "batch_dim", lambda k: f"batch*{k}")  # the old spelling of 0
    monkeypatch.setattr(batch_dims, "batch_dim", lambda k: f"batch*{k}")
    monkeypatch.setattr(
        batch_dims._MetaReplay,
        "resym",
        lambda self, a: a._replace(shape=("batch*0", *a.shape[1:])) if a.shape else a,
    )
    model = _EmptyPart()
    with tracelog.Listener(model, tmp_path) as listener, listener.batch():
        model(torch.randn(4, 8)).pow(2).mean().backward()
    log = tracelog.load(tmp_path)  # readable
    assert log.unrecorded == 1 and "not a dim a log holds" in str(log.failures)


def test_map_targs_copies_every_record_as_dataclasses_replace_does(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import dataclasses

    from tracelog.adapters.tape import map_targs

    tape = _tape(tmp_path, monkeypatch)
    before = [(r.args, r.kwargs, r.outs) for r in tape.recs]
    grown = map_targs(tape, lambda a: a._replace(shape=(*a.shape, 1)))
    for rec, new in zip(tape.recs, grown.recs, strict=True):
        want = dataclasses.replace(
            rec,
            args=tuple(_grown(a) for a in rec.args),
            kwargs=tuple((k, _grown(v)) for k, v in rec.kwargs),
            outs=tuple(_grown(o) for o in rec.outs),
        )
        assert new == want and new is not rec and new.func is rec.func
    assert [(r.args, r.kwargs, r.outs) for r in tape.recs] == before  # the tape is kept


def _grown(obj: Any) -> Any:
    from tracelog.adapters.tape import TArg

    if isinstance(obj, TArg):
        return obj._replace(shape=(*obj.shape, 1))
    if isinstance(obj, tuple):
        return tuple(_grown(x) for x in obj)
    return obj


def test_a_parsed_dim_is_the_callers_own() -> None:
    from tracelog.ir import dim_value, parse_dim

    poly = parse_dim("batch*seq-batch+3")
    assert poly == {("batch", "seq"): 1, ("batch",): -1, (): 3}
    poly.clear()  # the remembered parse is not the caller's dict
    assert parse_dim("batch*seq-batch+3") == {("batch", "seq"): 1, ("batch",): -1, (): 3}
    assert dim_value("batch*seq-batch+3", {"batch": 2, "seq": 5}) == 11
