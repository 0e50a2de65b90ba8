"""Issue 16 item 5: attaching the listener never changes whether or how a
model runs compiled. A counting backend sees every compilation and every run
of compiled code; the log counts the compiled batches, unrecorded with the
reason, beside the optimizer steps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog
from tracelog.adapters.torch.compiled import COMPILED_REASON, COMPILED_WARNING


class Counting:
    """A torch.compile backend that runs the captured graph and counts."""

    def __init__(self) -> None:
        self.compiles = 0
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.compiles += 1

        def run(*args: Any) -> Any:
            self.calls += 1
            return gm.forward(*args)

        return run


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(listener: Any, model: Any, opt: torch.optim.Optimizer, steps: int) -> None:
    x, y = torch.randn(4, 8), torch.arange(4)
    for _ in range(steps):
        with listener.batch():
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_compiled_before_attach(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    net, backend = _net(), Counting()
    model = torch.compile(net, backend=backend)
    with caplog.at_level(logging.WARNING, logger="tracelog"):
        listener = tracelog.Listener(model, tmp_path / "log")
    assert [r.getMessage() for r in caplog.records] == [COMPILED_WARNING]  # one, at attach
    with listener:
        _train(listener, model, torch.optim.SGD(net.parameters(), lr=0.1), 4)
    assert (backend.compiles, backend.calls) == (1, 4)  # compiled once, every step compiled
    log = tracelog.load(tmp_path / "log")
    assert (log.recorded, log.unrecorded, log.optimizer_steps) == (0, 4, 4)
    assert {f["error"] for f in log.failures} == {COMPILED_REASON}
    # named as the user's module, not through OptimizedModule's _orig_mod
    assert [p["name"] for p in log.model["params"]][0] == "0.weight"


def test_first_compiled_call_inside_a_window(tmp_path: Path) -> None:
    """The listener attached first, then the model compiled, its first
    compiled call inside a window: it compiles once and runs compiled in every
    later window and outside them, with no recompilation."""
    net, backend = _net(), Counting()
    listener = tracelog.Listener(net, tmp_path / "log")
    model = torch.compile(net, backend=backend)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    _train(listener, model, opt, 3)
    model(torch.randn(4, 8))  # outside a window
    assert (backend.compiles, backend.calls) == (1, 4)
    listener.close()
    log = tracelog.load(tmp_path / "log")
    assert (log.recorded, log.unrecorded, log.optimizer_steps) == (0, 3, 3)
    assert "compiled code is not recorded" in log.failures[0]["error"]


def test_same_compiled_graph_with_and_without_listener(tmp_path: Path) -> None:
    """The graph Dynamo captures is the same with the listener's hooks on the
    modules: they return at once under tracing."""
    graphs: list[list[Any]] = []

    def keep(gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    x = torch.randn(4, 8)
    torch.compile(_net(), backend=keep)(x)
    torch._dynamo.reset()  # compile afresh, not from the cache
    net = _net()
    with tracelog.Listener(net, tmp_path / "log") as listener, listener.batch():
        torch.compile(net, backend=keep)(x)
    # one graph each (no graph break), the same ops (the hooks read the inputs
    # first: only the order of the graph's placeholders differs)
    assert len(graphs) == 2 and graphs[0] == graphs[1] and len(graphs[0]) == 3


def test_eager_model_still_recorded(tmp_path: Path) -> None:
    """Another, eager model beside compiled code records as before."""
    torch.compile(_net(), backend=Counting())(torch.randn(2, 8))
    net = _net()
    with tracelog.Listener(net, tmp_path / "log") as listener:
        _train(listener, net, torch.optim.SGD(net.parameters(), lr=0.1), 2)
    log = tracelog.load(tmp_path / "log")
    assert (log.recorded, log.unrecorded) == (2, 0)
