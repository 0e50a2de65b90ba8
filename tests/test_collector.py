"""An exact window makes no cyclic garbage, and pauses Python's garbage
collector while it records (tracelog/adapters/collector.py): the tape's
objects die by reference counting as the window ends, so collections in the
window would only scan and promote them."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog
from tracelog.adapters import collector


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(8, dim=-1)
        h = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        return self.out(F.gelu(h).mean(dim=1))


def _models() -> list[nn.Module]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())
    return [mlp, cnn, _Attn()]


def _data(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(model, _Attn):
        return torch.randn(4, 5, 8), torch.randint(0, 3, (4,))
    if isinstance(model[0], nn.Conv2d):
        return torch.randn(4, 1, 6, 6), torch.randint(0, 64, (4,))
    return torch.randn(4, 8), torch.randint(0, 3, (4,))


def _tracelog_garbage() -> list[str]:
    """The cyclic garbage a collection finds now that tracelog made."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted(
            {
                getattr(o, "__qualname__", type(o).__qualname__)
                for o in gc.garbage
                if (getattr(o, "__module__", None) or type(o).__module__).startswith("tracelog")
            }
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("mode", ["exact", "guarded"])
@pytest.mark.parametrize("index", range(3))
def test_a_window_leaves_no_cyclic_garbage(tmp_path: Path, index: int, mode: str) -> None:
    """Exact: the tape; guarded (a fast window): the window and its key's calls mode."""
    model = _models()[index]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    listener = tracelog.Listener(model, tmp_path / "log", mode=mode, guard_after=2)
    with listener:
        for _ in range(3):  # the first batch builds graphs and the sample
            x, y = _data(model)
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        gc.collect()
        gc.disable()  # only reference counting frees what the window made
        try:
            x, y = _data(model)
            with listener.batch():
                out = model(x)
                seen = weakref.ref(out)  # an activation the tape holds
                F.cross_entropy(out, y).backward()
            del out
            assert seen() is None  # freed as the window ended, not left for a collection
            assert _tracelog_garbage() == []
            assert listener.last_guarded == (mode == "guarded")
        finally:
            gc.enable()


def test_the_collector_is_paused_in_exact_windows_only(tmp_path: Path) -> None:
    model = _models()[0]
    states: list[tuple[bool, int]] = []

    class Spy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            states.append((gc.isenabled(), collector.paused()))
            return x

    model.append(Spy())
    listener = tracelog.Listener(model, tmp_path / "log", guard_after=1, rerecord_every=1000)
    for _ in range(4):
        x, y = _data(model)
        with listener.batch():
            F.cross_entropy(model(x), y).backward()
        assert gc.isenabled() and collector.paused() == 0
    listener.close()
    # exact (the sample; K = 1 trusts its key), then guarded: no pause without the recorder
    assert states[0] == (False, 1) and states[-1] == (True, 0), states
    assert log_counts(tmp_path / "log") == {"exact": 1, "guarded": 3}


def log_counts(log_dir: Path) -> dict[str, int]:
    rec = tracelog.load(log_dir).recording
    assert rec is not None
    return {"exact": rec["exact"], "guarded": rec["guarded"]}


def test_a_user_who_disabled_the_collector_keeps_it_disabled(tmp_path: Path) -> None:
    model = _models()[0]
    gc.disable()
    try:
        with tracelog.Listener(model, tmp_path / "log", mode="exact") as listener:
            x, y = _data(model)
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_windows_and_an_unclosed_one_restore_the_collector(tmp_path: Path) -> None:
    a, b = _models()[0], _models()[0]
    la = tracelog.Listener(a, tmp_path / "a", mode="exact")
    lb = tracelog.Listener(b, tmp_path / "b", mode="exact")
    x, y = _data(a)
    cm_a = la.open_batch()
    F.cross_entropy(a(x), y).backward()
    with lb.batch():  # another model's window inside this one's
        F.cross_entropy(b(x), y).backward()
        assert collector.paused() == 2
    assert not gc.isenabled()  # a's window is still open
    la.close_batch(cm_a)
    assert gc.isenabled() and collector.paused() == 0
    cm_b = lb.open_batch()  # never closed: close() ends the pause
    F.cross_entropy(b(x), y).backward()
    lb.close()
    la.close()
    assert cm_b is not None and gc.isenabled() and collector.paused() == 0


def test_an_error_in_the_window_resumes_the_collector(tmp_path: Path) -> None:
    model = _models()[0]
    with tracelog.Listener(model, tmp_path / "log", mode="exact") as listener:
        x, _ = _data(model)
        with pytest.raises(ValueError, match="the user's"), listener.batch():
            model(x)
            assert not gc.isenabled()
            raise ValueError("the user's error")
        assert gc.isenabled() and collector.paused() == 0


def test_close_ends_a_window_left_open(tmp_path: Path) -> None:
    """close() with a window still open (open_batch never closed): the window
    ends there, its batch counted and recorded, and its recorder leaves the
    dispatch stack: nothing records for a closed listener (a recorder left
    there saw every later op of the process)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    model = _models()[0]
    listener = tracelog.Listener(model, tmp_path / "log", mode="exact")
    x, y = _data(model)
    with listener.batch():
        F.cross_entropy(model(x), y).backward()
    cm = listener.open_batch()
    loss = F.cross_entropy(model(x), y)
    assert cm is not None and len(_get_current_dispatch_mode_stack()) == 1
    listener.close()
    assert _get_current_dispatch_mode_stack() == []
    assert gc.isenabled() and collector.paused() == 0
    listener.close_batch(cm)  # the user's late exit: a no-op
    loss.backward()
    log = tracelog.load(tmp_path / "log")
    assert [(e.kind, e.usage.batches) for e in log.entries_sorted()] == [
        ("prediction", 2),
        ("loss", 2),
    ]
    assert log.failures == []


def test_close_inside_a_batch_window_ends_it(tmp_path: Path) -> None:
    """close() called inside ``with listener.batch():``: the block's exit
    after it does nothing more."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    model = _models()[0]
    x, y = _data(model)
    listener = tracelog.Listener(model, tmp_path / "log", mode="exact")
    with listener.batch():
        F.cross_entropy(model(x), y).backward()
        listener.close()
        assert _get_current_dispatch_mode_stack() == []
        model(x)  # not recorded: the listener is closed
    assert [
        (e.kind, e.usage.batches) for e in tracelog.load(tmp_path / "log").entries_sorted()
    ] == [
        ("prediction", 1),
        ("loss", 1),
    ]
