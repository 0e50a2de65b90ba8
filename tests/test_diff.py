"""`tracelog diff`: a semantic diff of two logs. One model recorded in
variants that each change one thing; each variant must read as exactly that
change at its module path, in text, markdown and JSON (JSON checked against
the schema kept in the package)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import record, validate_against_schema

import tracelog
from tracelog.cli import main as cli
from tracelog.diff import (
    ADDED,
    ATTR,
    CHANGED,
    INPUT,
    MODULE_TYPE,
    NODE_ADDED,
    OP,
    SCHEMA_FILE,
    SHAPE,
    LogDiff,
    _md,
    dumps,
    load_snapshot,
    snapshot,
)
from tracelog.ir import Output

FORMATS = ("text", "markdown", "json")


class MLP(nn.Module):
    """fc1 -> act -> drop [-> mid] -> fc2, every part a named module."""

    def __init__(
        self, hidden: int = 8, act: type[nn.Module] = nn.ReLU, p: float = 0.1, mid: bool = False
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, hidden)
        self.act = act()
        self.drop = nn.Dropout(p)
        self.mid = nn.Linear(hidden, hidden) if mid else None
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))
        if self.mid is not None:
            x = self.mid(x)
        return self.fc2(x)


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "again": {},  # the same model, recorded a second time
    "layer_added": {"mid": True},
    "activation": {"act": nn.Tanh},
    "hidden": {"hidden": 16},
    "dropout": {"p": 0.3},
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    out = {}
    for name, kw in VARIANTS.items():
        torch.manual_seed(0)
        out[name] = tmp_path_factory.mktemp(name)
        record(MLP(**kw), out[name], [(x, y), (x, y)], F.cross_entropy)
    torch.manual_seed(0)
    out["more_batches"] = tmp_path_factory.mktemp("more_batches")
    record(MLP(), out["more_batches"], [(x, y)] * 3, F.cross_entropy)
    return out


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(["diff", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _validate(doc: dict[str, Any]) -> None:
    validate_against_schema(doc, SCHEMA_FILE)


def _modules(d: dict[str, Any]) -> dict[str, list[tuple[str, str, str]]]:
    """graph label -> [(module path, status, change what), ...]"""
    return {
        f"{g['kind']}/{g['phase']}": [
            (m["path"], m["status"], c["what"]) for m in g["modules"] for c in m["changes"]
        ]
        for g in d["graphs"]
        if g["status"] != "same"
    }


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("other", ["base", "again"])
def test_the_same_log_diffs_equal(logs, capsys, fmt: str, other: str) -> None:
    code, out, err = _run(capsys, str(logs["base"]), str(logs[other]), "--format", fmt)
    assert (code, err) == (0, "")
    if fmt == "json":
        doc = json.loads(out)
        _validate(doc)
        assert doc["equal"] and doc["differences"] == 0
        assert {g["status"] for g in doc["graphs"]} == {"same"}
        assert doc["parameters"] == []
    else:
        assert "no differences" in out


def _expect_layer_added(doc: dict[str, Any]) -> None:
    for graph in ("prediction/train", "prediction/eval"):
        assert _modules(doc)[graph] == [("mid", ADDED, NODE_ADDED)]
    assert set(_modules(doc)) == {"prediction/train", "prediction/eval"}
    params = [(p["name"], p["module"], p["status"]) for p in doc["parameters"]]
    assert params == [("mid.weight", "mid", ADDED), ("mid.bias", "mid", ADDED)]
    added = doc["graphs"][0]["modules"][0]
    assert added["new_type"] == "Linear" and added["changes"][0]["op"] == "Gemm"
    assert added["changes"][0]["new"] == "Gemm(transB=1) -> float32[batch, 8]"


def _expect_activation(doc: dict[str, Any]) -> None:
    for graph in ("prediction/train", "prediction/eval"):
        assert _modules(doc)[graph] == [("act", CHANGED, MODULE_TYPE), ("act", CHANGED, OP)]
    assert set(_modules(doc)) == {"prediction/train", "prediction/eval"}
    op = doc["graphs"][0]["modules"][0]["changes"][1]
    assert (op["old"], op["new"]) == ("Relu", "Tanh")
    assert doc["parameters"] == []


def _expect_hidden(doc: dict[str, Any]) -> None:
    mods = _modules(doc)
    assert {path for path, _, _ in mods["prediction/train"]} == {"fc1", "act", "drop"}
    assert {path for path, _, _ in mods["prediction/eval"]} == {"fc1", "act"}
    assert {what for g in mods.values() for _, _, what in g} == {SHAPE}
    for g in doc["graphs"]:
        for m in g["modules"]:
            for c in m["changes"]:  # the symbolic batch dim stays a symbol
                assert (c["old"], c["new"]) == (["batch", 8], ["batch", 16])
    params = {
        p["name"]: (p["module"], p["old"]["shape"], p["new"]["shape"]) for p in doc["parameters"]
    }
    assert params == {
        "fc1.weight": ("fc1", [8, 4], [16, 4]),
        "fc1.bias": ("fc1", [8], [16]),
        "fc2.weight": ("fc2", [3, 8], [3, 16]),
    }


def _expect_dropout(doc: dict[str, Any]) -> None:
    assert _modules(doc) == {"prediction/train": [("drop", CHANGED, INPUT)]}  # eval has none
    change = doc["graphs"][0]["modules"][0]["changes"][0]
    assert change["field"] == "input 1 (ratio)" and change["op"] == "Dropout"
    assert change["old"] == pytest.approx(0.1) and change["new"] == pytest.approx(0.3)
    assert doc["parameters"] == []


EXPECTED = {
    "layer_added": (_expect_layer_added, ["+ mid (Linear)", "added Gemm(transB=1)"]),
    "activation": (_expect_activation, ["~ act (ReLU -> Tanh)", "op Relu -> Tanh"]),
    "hidden": (_expect_hidden, ["~ fc1 (Linear)", "fc1.weight  float32[8, 4] -> float32[16, 4]"]),
    "dropout": (_expect_dropout, ["~ drop (Dropout)", "input 1 (ratio) 0.1 -> 0.3"]),
}
MARKDOWN = {
    "layer_added": "| + | `mid` (`Linear`) | node 0 `Gemm`: added `Gemm(transB=1) -> float32[batch, 8]` |",
    "activation": "| ~ | `act` (`ReLU` → `Tanh`) | node 0 `Tanh`: op `Relu` → `Tanh` |",
    "hidden": "| ~ | `fc1.weight` | `float32[8, 4]` | `float32[16, 4]` |",
    "dropout": "| ~ | `drop` (`Dropout`) | node 0 `Dropout`: `input 1 (ratio)` `0.1` → `0.3` |",
}
# module paths a variant must not mention
UNTOUCHED = {
    "layer_added": ("fc1", "act", "drop", "fc2"),
    "activation": ("fc1", "drop", "fc2", "mid"),
    "hidden": ("mid",),
    "dropout": ("fc1", "act", "fc2", "mid"),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_one_change_reads_as_that_change(logs, capsys, variant: str, fmt: str) -> None:
    code, out, err = _run(capsys, str(logs["base"]), str(logs[variant]), "--format", fmt)
    assert (code, err) == (1, "")
    check, lines = EXPECTED[variant]
    if fmt == "json":
        doc = json.loads(out)
        _validate(doc)
        assert not doc["equal"] and doc["differences"] > 0
        check(doc)
        return
    if fmt == "text":
        for line in lines:
            assert line in out
    else:
        assert out.startswith("### tracelog diff: ")
        assert MARKDOWN[variant] in out.splitlines()
    for path in UNTOUCHED[variant]:
        for mark in "+-~":
            assert f"{mark} {path} " not in out and f"| {mark} | `{path}`" not in out


def test_counts_are_shown_and_compared_only_on_request(logs, capsys) -> None:
    base, more = str(logs["base"]), str(logs["more_batches"])
    code, out, _ = _run(capsys, base, more)
    assert code == 0 and "usage: 2 batches, epoch 0 -> 3 batches, epoch 0 (shown" in out
    code, out, _ = _run(capsys, base, more, "--counts", "--format", "json")
    doc = json.loads(out)
    _validate(doc)
    assert code == 1 and doc["counts_compared"] and doc["differences"] == 2
    assert [g["counts_changed"] for g in doc["graphs"]] == [True, True, False, False]


def test_python_api_returns_the_same_structure(logs, capsys) -> None:
    d = tracelog.diff(logs["base"], logs["activation"])
    assert isinstance(d, LogDiff) and not d.equal
    code, out, _ = _run(capsys, str(logs["base"]), str(logs["activation"]), "--format", "json")
    assert json.loads(out) == d.to_json()
    assert tracelog.diff(tracelog.load(logs["base"]), logs["again"]).equal


def test_errors_are_one_line_and_exit_2(logs, capsys, tmp_path: Path) -> None:
    for args in (
        [str(tmp_path / "missing"), str(logs["base"])],
        [str(logs["base"]), str(tmp_path)],
    ):
        code, out, err = _run(capsys, *args)
        assert code == 2 and out == ""
        assert err.startswith("tracelog: error: ") and err.count("\n") == 1
        assert "not a tracelog log" in err


def test_attribute_change_is_reported_by_name(logs) -> None:
    old = tracelog.load(logs["base"])
    new = tracelog.load(logs["base"])
    h = next(e.hash for e in new.entries_sorted() if e.kind == "loss")
    graph = new.graphs.pop(h)
    graph.nodes[0].attrs["axis"] = 0  # LogSoftmax over the other axis
    h2 = new.add_graph(graph)
    for key in [k for k in new.entries if k[0] == h]:
        entry = new.entries.pop(key)
        entry.hash = h2
        new.entries[(h2, key[1])] = entry
    doc = tracelog.diff(old, new).to_json()
    _validate(doc)
    changes = [c for g in doc["graphs"] for m in g["modules"] for c in m["changes"]]
    assert [(c["what"], c["op"], c["field"], c["old"], c["new"]) for c in changes] == [
        (ATTR, "LogSoftmax", "axis", 1, 0)
    ] * 2


def test_snapshot_round_trip_and_determinism(logs) -> None:
    text = snapshot(logs["base"])
    assert text == snapshot(logs["again"])  # nothing that varies between runs
    assert tracelog.diff(load_snapshot(text), logs["base"]).equal
    assert not tracelog.diff(load_snapshot(text), logs["dropout"]).equal


def test_markdown_cells_cannot_break_out() -> None:
    cell = _md("a|b`c\nd")
    assert "\n" not in cell and "\\|" in cell and cell.startswith("``")


def _one_graph_log(nodes: list[tuple[str, dict[str, Any]]]) -> tracelog.TraceLog:
    """A log of one prediction graph: x -> the given ops in module "pool"."""
    t = tracelog.TensorType("float32", ("batch", 4, 8, 8))
    values = {"x": tracelog.Value("x", t, "input")}
    prev = "x"
    graph_nodes = []
    for k, (op, attrs) in enumerate(nodes):
        values[f"t{k}"] = tracelog.Value(f"t{k}", t, "node")
        graph_nodes.append(tracelog.Node(op, [prev], [f"t{k}"], attrs, module="pool"))
        prev = f"t{k}"
    graph = tracelog.Graph("prediction", values, graph_nodes)
    graph.outputs = [Output(prev, "prediction")]
    log = tracelog.TraceLog({"name": "torch"})
    h = log.add_graph(graph)
    log.count("train", h, None, 0, 0)
    return log


def test_a_changed_attribute_pairs_with_its_old_node() -> None:
    """Aligned by (op, attributes) first, what differs then by op: the MaxPool
    whose kernel changed is one attribute change, not a node removed and added."""
    old = _one_graph_log(
        [("Transpose", {"perm": [0, 1, 2, 3]}), ("MaxPool", {"kernel_shape": [2, 2]})]
    )
    new = _one_graph_log([("MaxPool", {"kernel_shape": [3, 3]})])
    (module,) = tracelog.diff(old, new).graphs[0].modules
    assert [(c.what, c.op, c.field, c.old, c.new) for c in module.changes] == [
        (
            "node removed",
            "Transpose",
            "",
            "Transpose(perm=[0, 1, 2, 3]) -> float32[batch, 4, 8, 8]",
            None,
        ),
        (ATTR, "MaxPool", "kernel_shape", [2, 2], [3, 3]),
        (INPUT, "MaxPool", "input 0 (X)", "(computed)", "input x"),  # it reads x itself now
    ]


def test_json_is_strict_where_a_constant_is_infinite(logs) -> None:
    old = tracelog.load(logs["base"])
    new = tracelog.load(logs["base"])
    h = next(e.hash for e in new.entries_sorted() if e.kind == "prediction" and e.phase == "train")
    graph = new.graphs.pop(h)
    ratio = next(
        v for v in graph.values.values() if v.kind == "const" and v.type.dtype == "float32"
    )
    assert ratio.const is not None
    ratio.const.data = float("-inf")
    h2 = new.add_graph(graph)
    new.entries[(h2, "train")] = new.entries.pop((h, "train"))
    new.entries[(h2, "train")].hash = h2
    doc = json.loads(dumps(tracelog.diff(old, new), "json"))
    _validate(doc)
    (change,) = [c for g in doc["graphs"] for m in g["modules"] for c in m["changes"]]
    assert change["new"] == "-inf"
