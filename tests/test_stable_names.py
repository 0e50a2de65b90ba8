"""Stable names (issue 15): values are named by module path and role, so a
one-module change to a model is a one-module diff of every emitted program.

Two recordings of the same small ResNet-style model, one with one block's
activation changed (ReLU -> GELU) or with one block added: the unified diff
of the emitted programs touches only lines of that block's module (its
statements, comments, parameters and the next line that reads its output)
and the header comment of each function whose graph changed (its hash)."""

from __future__ import annotations

import ast
import difflib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import record
from torch import nn

from tracelog.emit import PROGRAM_TARGETS, get_target
from tracelog.emit.names import role, value_candidates
from tracelog.emit.program import build_program
from tracelog.ir import Graph, Node, TensorType, Value
from tracelog.log import TraceLog


class Block(nn.Module):
    def __init__(self, channels: int, act: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act = F.gelu if act == "gelu" else F.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.bn1(self.conv1(x)))
        return self.act(self.bn2(self.conv2(h)) + x)


class ResNetish(nn.Module):
    def __init__(self, acts: tuple[str, ...]) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layers = nn.Sequential(*[Block(4, a) for a in acts])
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(torch.relu(self.stem(x)))
        return self.head(h.mean((2, 3)))


VARIANTS = {
    "base": ("relu", "relu", "relu"),
    "changed": ("relu", "gelu", "relu"),  # layers.1's activation
    "added": ("relu", "relu", "relu", "relu"),  # layers.3, a new block
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = {}
    for name, acts in VARIANTS.items():
        torch.manual_seed(0)
        batches = [(torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,))) for _ in range(2)]
        found[name] = tmp_path_factory.mktemp(name)
        record(ResNetish(acts), found[name], batches, F.cross_entropy)
    return found


@dataclass
class Change:
    """One changed line of a program diff, with what owns it: the whole
    statement it is part of (black splits long ones over lines), the function
    it is in, and whether that function exists on the other side."""

    side: str  # "-" or "+"
    line: str
    owner: str
    function: str
    targets: tuple[str, ...]  # the names its statement assigns
    function_is_new: bool


def _layout(text: str) -> tuple[dict[int, tuple[str, str, tuple[str, ...]]], set[str]]:
    """Line index -> (its owner's text, its function, the names its statement
    assigns), and the top-level functions the program defines."""
    lines, tree = text.splitlines(), ast.parse(text)
    found: dict[int, tuple[str, str, tuple[str, ...]]] = {}
    functions = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        functions.add(node.name)
        assert node.end_lineno is not None
        for i in range(node.lineno - 1, node.end_lineno):
            found[i] = (lines[i], node.name, ())
        for stmt in node.body:
            assert stmt.end_lineno is not None
            owner = "\n".join(lines[stmt.lineno - 1 : stmt.end_lineno])
            targets = tuple(
                n.id
                for t in getattr(stmt, "targets", [])
                for n in ast.walk(t)
                if isinstance(n, ast.Name)
            )
            for i in range(stmt.lineno - 1, stmt.end_lineno):
                found[i] = (owner, node.name, targets)
    return found, functions


def changes(old: str, new: str) -> list[Change]:
    """The removed and added lines of the diff of two programs."""
    a, b = old.splitlines(), new.splitlines()
    (old_at, old_fns), (new_at, new_fns) = _layout(old), _layout(new)
    found = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        sides = (("-", a, old_at, new_fns, i1, i2), ("+", b, new_at, old_fns, j1, j2))
        for side, lines, at, other, lo, hi in sides:
            for i in range(lo, hi):
                if not lines[i].strip():
                    continue
                owner, function, targets = at.get(i, (lines[i], "", ()))
                new_fn = bool(function) and function not in other
                found.append(Change(side, lines[i], owner, function, targets, new_fn))
    return found


HEADER = re.compile(r"^# (prediction|loss) graph [0-9a-f]{12}, \d+ ops\.")


def judged(found: list[Change], module: str) -> tuple[list[Change], list[Change], list[Change]]:
    """The changes split into the module's own (its statements, comments and
    parameters, and runtime helpers its new op brought in), its neighbours
    (statements of other modules that read its values), and the rest, which
    must be only graph functions' header comments (their hash and op count)."""
    prefix = module.replace(".", "_") + "_"
    own_text = re.compile(rf"(\b{re.escape(prefix)}|\b{re.escape(module)}[.\s])")
    own, neighbours, rest = [], [], []
    for c in found:
        if c.function_is_new and c.function.startswith("_"):
            own.append(c)  # a runtime helper inlined for the new op (_gelu)
        elif not own_text.search(c.owner):
            rest.append(c)
        elif c.targets and not any(t.startswith(prefix) for t in c.targets):
            neighbours.append(c)
        else:
            own.append(c)
    # a neighbour's old side reads what the module replaced: its twin
    twins = {(c.function, c.targets) for c in neighbours}
    neighbours += [c for c in rest if c.targets and (c.function, c.targets) in twins]
    rest = [c for c in rest if c not in neighbours]
    return own, neighbours, rest


@pytest.mark.parametrize("target", PROGRAM_TARGETS)
@pytest.mark.parametrize(("variant", "module"), [("changed", "layers.1"), ("added", "layers.3")])
def test_a_one_module_change_is_a_one_module_diff(
    logs: dict[str, Path], variant: str, module: str, target: str
) -> None:
    tgt = get_target(target)
    old = build_program(TraceLog.load(logs["base"]), tgt)
    new = build_program(TraceLog.load(logs[variant]), tgt)
    own, neighbours, rest = judged(changes(old, new), module)
    assert own, "the change must show"
    # beyond the module: one header comment per changed graph function, each
    # side of the diff, and no other line
    assert all(HEADER.match(c.line) for c in rest), [c.line for c in rest]
    assert len(rest) <= 4, [c.line for c in rest]
    # the statements next to the module that read its output: one or two per
    # function (the next block's first op and its residual add, or the head)
    per_function = Counter(c.function for c in neighbours if c.side == "+")
    assert max(per_function.values(), default=0) <= 2, per_function
    # no renumbering: every other module's values keep their names, in order
    prefix = module.replace(".", "_") + "_"
    assert _assigned(old, prefix) == _assigned(new, prefix)


def _assigned(text: str, prefix: str) -> dict[str, list[str]]:
    """Per graph function, the names its statements assign but those of the
    module with `prefix`."""
    at, _ = _layout(text)
    found: dict[str, list[str]] = {}
    seen = set()
    for _, (owner, function, targets) in sorted(at.items()):
        if function.startswith(("predict_", "loss_")) and (function, owner) not in seen:
            seen.add((function, owner))
            found.setdefault(function, []).extend(t for t in targets if not t.startswith(prefix))
    return found


def test_names_follow_module_and_role() -> None:
    f32 = TensorType("float32", ("batch", 4))
    values = {n: Value(n, f32, "input" if n == "x" else "node") for n in ("x", *"abcdefg")}
    nodes = [
        Node("Conv", ["x"], ["a"], module="layer1.0.conv1", module_type="Conv2d"),
        Node("Relu", ["a"], ["b"], module="layer1.0", module_type="Block"),
        Node("Add", ["b", "x"], ["c"], module="layer1.0", module_type="Block"),
        Node("Relu", ["c"], ["d"], module="layer1.0", module_type="Block"),
        Node("Dropout", ["d"], ["e", "f"], module="drop", module_type="Dropout"),
        Node("Gemm", ["e"], ["g"], module="0", module_type="Linear"),
    ]
    got = value_candidates(Graph("prediction", values, nodes, []))
    assert got == {
        "a": "layer1_0_conv1",
        "b": "layer1_0_relu",
        "c": "layer1_0_add",
        "d": "layer1_0_relu",  # made layer1_0_relu_1 by the function's namespace
        "e": "drop",
        "f": "drop_mask",
        "g": "gemm_0",
    }
    assert [role(op) for op in ("LogSoftmax", "MatMul", "ScatterND", "BatchNormalization")] == [
        "log_softmax",
        "matmul",
        "scatter_nd",
        "batch_norm",
    ]
