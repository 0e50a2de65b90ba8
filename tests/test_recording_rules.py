"""DESIGN.md's recording rules: never perturb training, fail open, stay
cheap and flat after warm-up; and how graphs are split, deduplicated and
counted."""

from __future__ import annotations

import gc
import os
import tracemalloc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from zoo import CNNBnDrop

import tracelog
from tracelog.adapters.torch import TorchListener
from tracelog.adapters.torch import listener as listener_mod


def _data(n_batches: int, bs: int = 8, last: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    sizes = [bs] * (n_batches - 1) + [last]
    return [
        (torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g))
        for n in sizes
    ]


def _train(model, data, epochs, listener=None, backward_inside=True):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        if listener is not None:
            listener.set_epoch(epoch)
        for x, y in data:
            ctx = listener.batch() if listener is not None else _null()
            with ctx:
                loss = F.cross_entropy(model(x), y)
                if backward_inside:
                    loss.backward()
            if not backward_inside:
                loss.backward()
            opt.step()
            opt.zero_grad()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_final_weights_bitwise_equal_with_and_without_listener(tmp_path) -> None:
    data = _data(5)
    torch.manual_seed(3)
    plain = CNNBnDrop()
    torch.manual_seed(3)
    traced = CNNBnDrop()
    torch.manual_seed(7)
    _train(plain, data, epochs=2)
    torch.manual_seed(7)
    listener = TorchListener(traced, tmp_path / "log")
    _train(traced, data, epochs=2, listener=listener)
    log = listener.close()
    assert log.recorded == 10 and log.unrecorded == 0
    a, b = plain.state_dict(), traced.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_rng_state_untouched(tmp_path) -> None:
    model = CNNBnDrop()
    data = _data(2)
    torch.manual_seed(11)
    _train(model, data, epochs=1)
    expected = torch.get_rng_state()
    model2 = CNNBnDrop()
    model2.load_state_dict(model.state_dict())
    torch.manual_seed(11)
    with TorchListener(model2, tmp_path / "log") as listener:
        _train(model2, data, epochs=1, listener=listener)
    assert torch.equal(torch.get_rng_state(), expected)


def test_fails_open_and_reports_unrecorded_batches(tmp_path, monkeypatch, caplog) -> None:
    original = listener_mod._Window.on_op
    calls = {"n": 0}

    def flaky(self, func, args, kwargs, out):
        if self.batch in (1, 3) and self.epoch == 0:
            calls["n"] += 1
            raise RuntimeError("injected fault")
        return original(self, func, args, kwargs, out)

    monkeypatch.setattr(listener_mod._Window, "on_op", flaky)
    model = CNNBnDrop()
    data = _data(5)
    torch.manual_seed(5)
    reference = CNNBnDrop()
    reference.load_state_dict(model.state_dict())
    listener = TorchListener(model, tmp_path / "log")
    torch.manual_seed(9)
    _train(model, data, epochs=2, listener=listener)
    log = listener.close()
    torch.manual_seed(9)
    _train(reference, data, epochs=2)
    for k, v in reference.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k  # training itself went on unchanged
    assert calls["n"] == 2
    assert log.recorded == 8 and log.unrecorded == 2
    assert [(f["epoch"], f["batch"]) for f in log.failures] == [(0, 1), (0, 3)]
    assert "injected fault" in log.failures[0]["error"]
    # logged once, not once per batch
    assert sum("injected fault" in r.getMessage() for r in caplog.records) == 1
    again = tracelog.load(tmp_path / "log")
    assert again.unrecorded == 2


def test_user_exception_propagates_and_log_keeps_what_was_recorded(tmp_path) -> None:
    model = CNNBnDrop()
    data = _data(3)
    with pytest.raises(ZeroDivisionError):
        with TorchListener(model, tmp_path / "log") as listener:
            _train(model, data[:2], epochs=1, listener=listener)
            with listener.batch():
                model(data[2][0])
                raise ZeroDivisionError
    log = tracelog.load(tmp_path / "log")
    assert log.recorded == 2 and log.unrecorded == 1
    assert "ZeroDivisionError" in log.failures[0]["error"]


def test_memory_flat_over_2300_batches(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # exact mode: every batch through the dispatch mode and the fingerprint
    # cache (guarded mode pushes the mode on 1 batch in 100, so torch's bounded
    # set below fills over ~100x more batches; test_guarded checks the key table)
    listener = TorchListener(model, tmp_path / "log", mode="exact")
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def run(n: int) -> None:
        for _ in range(n):
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    run(300)  # warm-up: the graphs are built, the sample taken
    gc.collect()
    tracemalloc.start(4)  # the innermost frames: a tracelog one if tracelog allocated
    run(1000)
    gc.collect()
    first = tracemalloc.take_snapshot()
    run(1000)
    gc.collect()
    end = tracemalloc.take_snapshot()
    tracemalloc.stop()
    log = listener.close()
    assert log.recorded == 2300
    assert len(log.graphs) == 2 and len(listener._cache) == 1
    # What tracelog allocated (any tracelog frame on the stack: its recorder
    # runs each op) and still holds: a leak of 16 bytes a batch shows as
    # 16 kB (one object() kept in a list is 24). Not what torch allocated
    # in its own code while tracelog's dispatch frame was below it (the op
    # run by the recorder: torch's bounded set of small objects, from 0 to
    # 23 kB over these 1,000 batches from one run to the next); a leak of
    # what torch returns is the whole process's, bounded below.
    package = os.path.dirname(tracelog.__file__)
    ours = [
        tracemalloc.Filter(True, os.path.join(package, "*"), all_frames=True),
        tracemalloc.Filter(False, os.path.join(os.path.dirname(torch.__file__), "*")),
    ]
    grown = sum(
        s.size_diff
        for s in end.filter_traces(ours).compare_to(first.filter_traces(ours), "filename")
    )
    assert grown < 16 * 1024, grown
    # Beside it, torch's autograd engine fills a cache of small objects
    # while a dispatch mode is pushed (allocated in run_backward, no tracelog
    # frame): bounded (it levels off near 150-165 kB), but since a window's
    # tape is freed as the window ends, not by the collector later, it fills
    # over tens of thousands of batches, so only a looser bound holds here.
    total = sum(s.size_diff for s in end.compare_to(first, "filename"))
    assert total < 64 * 1024, total


def test_branch_taken_on_some_batches_is_a_second_counted_entry(tmp_path) -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.step = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.step += 1
            h = self.fc(x)
            return torch.tanh(h) if self.step % 3 == 0 else h

    model = Branchy()
    listener = TorchListener(model, tmp_path / "log", strict=True)
    for _ in range(9):
        with listener.batch():
            F.cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 3, (5,))).backward()
    log = listener.close()
    preds = [e for e in log.entries_sorted() if e.kind == "prediction"]
    assert sorted(e.usage.batches for e in preds) == [3, 6]
    tanh = [e for e in preds if "Tanh" in log.graphs[e.hash].op_histogram()]
    assert tanh[0].usage.first == (0, 2) and tanh[0].usage.last == (0, 8)
    losses = [e for e in log.entries_sorted() if e.kind == "loss"]
    assert len(losses) == 1 and losses[0].usage.batches == 9
    assert sum(p.usage.batches for p in log.pairs.values()) == 9


def test_loss_found_when_backward_is_outside_the_window(tmp_path) -> None:
    model = CNNBnDrop()
    listener = TorchListener(model, tmp_path / "log", strict=True)
    _train(model, _data(3), epochs=1, listener=listener, backward_inside=False)
    log = listener.close()
    assert log.sample_info["grads_from"] == "autograd.grad"
    (loss,) = [e for e in log.entries_sorted() if e.kind == "loss"]
    assert loss.usage.batches == 3
    from tracelog.verify import verify

    assert verify(tmp_path / "log").ok


def test_sample_gradients_match_torch(tmp_path) -> None:
    model = CNNBnDrop()
    x, y = _data(1, last=8)[0]
    listener = TorchListener(model, tmp_path / "log", strict=True)
    torch.manual_seed(0)
    with listener.batch():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    log = listener.close()
    sample = log.sample()
    for n, g in grads.items():
        assert torch.equal(torch.from_numpy(sample[f"grad/{n}"]), g), n


def test_explicit_loss_mark_wins_over_a_later_scalar(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    listener = TorchListener(model, tmp_path / "log", strict=True)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with listener.batch():
        pred = model(x)
        loss = listener.loss(F.cross_entropy(pred, y))
        reg = (pred**2).mean()  # a later scalar that is not the loss
        del reg
    loss.backward()
    log = listener.close()
    (entry,) = [e for e in log.entries_sorted() if e.kind == "loss"]
    assert "NegativeLogLikelihoodLoss" in log.graphs[entry.hash].op_histogram()
    assert "Pow" not in log.graphs[entry.hash].op_histogram()


def test_seeded_runs_give_identical_logs(tmp_path) -> None:
    texts = []
    for i in range(2):
        torch.manual_seed(0)
        model = CNNBnDrop()
        torch.manual_seed(1)
        listener = TorchListener(model, tmp_path / f"log{i}", strict=True)
        _train(model, _data(3), epochs=2, listener=listener)
        listener.close()
        texts.append((tmp_path / f"log{i}" / "trace.json").read_bytes())
    assert texts[0] == texts[1]


def test_listener_factory_and_misuse(tmp_path) -> None:
    model = nn.Linear(2, 2)
    listener = tracelog.Listener(model, tmp_path / "log")
    assert isinstance(listener, TorchListener)
    with pytest.raises(RuntimeError, match="must be called inside"):
        listener.loss(torch.zeros(()))
    with listener.batch():
        with pytest.raises(RuntimeError, match="cannot nest"):
            with listener.batch():
                pass
    listener.close()
    with pytest.raises(TypeError, match="no listener"):
        tracelog.Listener(object(), tmp_path / "x")


class _StackSeen(torch.autograd.Function):
    """Identity whose backward notes how many dispatch modes are on the stack."""

    seen: list[int] = []

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        _StackSeen.seen.append(len(_get_current_dispatch_mode_stack()))
        return g


@pytest.mark.parametrize("how", ["backward", "autograd.backward", "autograd.grad"])
def test_the_recorder_leaves_as_backward_starts(tmp_path, how) -> None:
    """Nothing from backward on is in either graph, so an exact window's
    recorder leaves the dispatch stack as backward starts (backward's ops run
    without it: issue 18's exact mode). The loss is backward's root, though a
    later scalar was computed, and the graphs are those recorded before: a
    batch whose backward starts some other way (the engine called directly)
    keeps the recorder on the stack and gives the same graphs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    params = list(model.parameters())

    def run(log_dir, start_backward):
        _StackSeen.seen = []
        with tracelog.Listener(model, log_dir, mode="exact") as listener:
            for _ in range(2):
                with listener.batch():
                    out = _StackSeen.apply(model(x))
                    loss = F.cross_entropy(out, y)
                    (out.argmax(1) == y).float().mean()  # a later scalar: not the loss
                    start_backward(loss)
        return tracelog.load(log_dir)

    starts = {
        "backward": lambda loss: loss.backward(),
        "autograd.backward": lambda loss: torch.autograd.backward([loss]),
        "autograd.grad": lambda loss: torch.autograd.grad(loss, params),
    }
    log = run(tmp_path / "a", starts[how])
    assert _StackSeen.seen == [0, 0]

    def engine(loss):  # backward with no torch.autograd function on the way
        seed = torch.ones_like(loss, memory_format=torch.preserve_format)  # as backward seeds it
        torch.autograd.Variable._execution_engine.run_backward(
            (loss,), (seed,), False, False, (), True, True
        )

    direct = run(tmp_path / "b", engine)
    assert _StackSeen.seen == [1, 1]
    rows = [(e.kind, e.hash, e.usage.batches) for e in log.entries_sorted()]
    assert rows == [(e.kind, e.hash, e.usage.batches) for e in direct.entries_sorted()]
    assert [kind for kind, _, _ in rows] == ["prediction", "loss"]
    loss_ops = log.graphs[rows[1][1]].op_histogram()
    assert "NegativeLogLikelihoodLoss" in loss_ops and "ArgMax" not in loss_ops, loss_ops
