"""The IR's canonical form and hash, the op vocabulary, and the log on disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import onnx
import pytest
import torch
import torch.nn as nn
from helpers import record
from hypothesis import given, settings
from hypothesis import strategies as st
from zoo import CNNBnDrop

import tracelog
from tracelog.cli import main
from tracelog.ir import Graph, Node, Output, TensorType, Value
from tracelog.log import FORMAT_VERSION
from tracelog.ops import OPS, TRACELOG_DOMAIN, schema_for, vocabulary


def _tiny(names: tuple[str, str]) -> Graph:
    a, b = names
    f = TensorType("float32", ("batch", 4))
    return Graph(
        "prediction",
        {
            "x": Value("x", f, "input"),
            "fc.weight": Value("fc.weight", TensorType("float32", (4, 4)), "param", trainable=True),
            a: Value(a, f, "node"),
            b: Value(b, f, "node"),
        },
        [
            Node("MatMul", ["x", "fc.weight"], [a], module="fc", module_type="Linear"),
            Node("Relu", [a], [b], module="act", module_type="ReLU"),
        ],
        [Output(b, "prediction")],
    )


def test_canonical_form_ignores_temporary_names() -> None:
    g1, g2 = _tiny(("h1", "h2")).canonical(), _tiny(("tmp_9", "zz")).canonical()
    assert g1.canonical_json() == g2.canonical_json()
    assert g1.digest() == g2.digest()
    assert [n.outputs for n in g1.nodes] == [["v0"], ["v1"]]


def test_hash_changes_with_attributes_and_module_path() -> None:
    g = _tiny(("a", "b"))
    base = g.canonical().digest()
    g.nodes[1].module = "other"
    assert g.canonical().digest() != base
    g = _tiny(("a", "b"))
    g.nodes[1].attrs["alpha"] = 0.1
    assert g.canonical().digest() != base


def test_json_round_trip_keeps_the_hash() -> None:
    g = _tiny(("a", "b")).canonical()
    again = Graph.from_json(json.loads(g.canonical_json()))
    assert again.digest() == g.digest()


def test_validate_rejects_use_before_definition_and_unknown_ops() -> None:
    g = _tiny(("a", "b"))
    g.nodes.reverse()
    with pytest.raises(ValueError, match="before it is defined"):
        g.validate()
    g = _tiny(("a", "b"))
    g.nodes[0].op = "NoSuchOp"
    with pytest.raises(NotImplementedError, match="NoSuchOp"):
        g.validate()


def test_vocabulary_covers_the_core_ops_and_functions_parse() -> None:
    names = {s.name for s in vocabulary()}
    core = {
        "Conv", "Gemm", "MatMul", "Add", "Relu", "BatchNormalization", "MaxPool", "Reshape",
        "Transpose", "Softmax", "LogSoftmax", "NegativeLogLikelihoodLoss", "Gather",
        "LayerNormalization", "Dropout", "Concat", "Split", "Slice", "ReduceMean",
    }  # fmt: skip
    assert core <= names
    for (domain, _), schema in OPS.items():
        if domain == TRACELOG_DOMAIN and schema.function:
            fn = onnx.parser.parse_function(schema.function)
            assert fn.name == schema.name
            assert schema.doc
    with pytest.raises(NotImplementedError):
        schema_for("", "Bogus")


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("log")
    batches = [(torch.randn(n, 3, 8, 8), torch.randint(0, 5, (n,))) for n in (8, 8, 3)]
    record(CNNBnDrop(), d, batches, nn.functional.cross_entropy, epochs=2)
    return d


def test_log_directory_contents(log_dir) -> None:
    assert sorted(p.name for p in log_dir.iterdir()) == [
        "graphs",
        "sample.safetensors",
        "trace.json",
        "weights.safetensors",
    ]
    d = json.loads((log_dir / "trace.json").read_text())
    assert d["format"] == "tracelog" and d["version"] == FORMAT_VERSION
    assert d["run"]["state"] == "complete"
    assert sorted(p.name for p in (log_dir / "graphs").iterdir()) == [
        f"{h}.json" for h in d["graphs"]
    ]
    assert d["framework"]["name"] == "torch" and d["framework"]["device"] == "cpu"
    log = tracelog.load(log_dir)
    w = log.weights()
    assert {"conv.weight", "bn.running_mean", "bn.num_batches_tracked"} <= set(w)
    s = log.sample()
    assert {"input/x", "target/target", "mask/0", "output/prediction", "loss"} <= set(s)
    assert {"grad/conv.weight", "param/conv.weight", "buffer/bn.running_var"} <= set(s)
    assert s["mask/0"].dtype == bool and s["loss"].shape == ()


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "trace.json").write_text((d / "trace.json").read_text()[:800]), "corrupt or truncated"),
        (lambda d: (d / "weights.safetensors").write_bytes((d / "weights.safetensors").read_bytes()[:100]), "corrupt or truncated"),
        (lambda d: (d / "sample.safetensors").unlink(), "is missing"),
        (lambda d: (d / "trace.json").write_text((d / "trace.json").read_text().replace('"version": 2', '"version": 99')), "newer than this tracelog"),
        (lambda d: [g.write_text(g.read_text().replace('"Relu"', '"Tanh"', 1)) for g in (d / "graphs").iterdir()], "does not match its hash"),
        (lambda d: (d / "trace.json").unlink(), "not a tracelog log"),
    ],
    ids=["truncated-json", "truncated-weights", "missing-sample", "future-version", "edited-graph", "no-trace"],
)  # fmt: skip
def test_damaged_logs_give_one_line_and_exit_2(log_dir, tmp_path, capsys, damage, message) -> None:
    d = _copy(log_dir, tmp_path / "damaged")
    damage(d)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    with pytest.raises(tracelog.LogError, match=message):
        tracelog.load(d)
    assert main(["show", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before  # nothing overwritten


def test_show_lists_each_unique_graph(log_dir, capsys) -> None:
    assert main(["show", str(log_dir)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:] if line[:1].isdigit()]
    kinds = [(r[1], r[2], r[5], r[8]) for r in rows]
    assert all(int(r[6]) + int(r[7]) == int(r[5]) for r in rows)  # exact + guarded
    assert kinds == [
        ("prediction", "train", "6", "0-1"),
        ("loss", "train", "6", "0-1"),
        ("prediction", "eval", "2", "0-1"),
        ("loss", "eval", "2", "0-1"),
    ]
    assert "tracelog.BatchNormTraining" in out and "Dropout" in out
    assert main(["show", str(log_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["batches"] for e in data["entries"]] == [6, 6, 2, 2]


def test_verify_cli(log_dir, capsys) -> None:
    assert main(["verify", str(log_dir), "--runtime", "onnxruntime"]) == 0
    assert "parity: ok" in capsys.readouterr().out


def test_console_script_runs_in_a_subprocess(log_dir) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tracelog.cli", "show", str(log_dir)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "prediction" in r.stdout


def test_emit_reads_the_tensors_it_needs_and_check_checks_them_all(log_dir, tmp_path) -> None:
    """emit writes a program from trace.json and the graphs: a damaged sample,
    which it never reads, does not stop it (nor is it read); check runs the
    program on the sample, so the sample's sha256 is checked first."""
    d = _copy(log_dir, tmp_path / "damaged")
    blob = bytearray((d / "sample.safetensors").read_bytes())
    blob[-1] ^= 0xFF  # one flipped bit in an array: safetensors would read it
    (d / "sample.safetensors").write_bytes(bytes(blob))
    tracelog.emit(d, target="torch")
    log = tracelog.TraceLog.load(d, check_tensors=False)
    with pytest.raises(tracelog.LogError, match="sha256 differs"):
        log.sample()  # checked as read
    with pytest.raises(tracelog.LogError, match="sha256 differs"):
        tracelog.check(d, "torch")
    with pytest.raises(tracelog.LogError, match="sha256 differs"):
        tracelog.check(d, "onnx")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.booleans()), min_size=1, max_size=30
    )
)
def test_the_guarded_count_keeps_what_count_keeps(batches: list[tuple[int, int, bool]]) -> None:
    """``count_guarded`` (a guarded batch's count in one call, its pair's
    usages found once) leaves the log as ``count(..., guarded=True)`` does,
    whatever the order: later batches, a new epoch, an earlier epoch, a batch
    counted late, exact batches between."""
    logs = []
    for one_call in (False, True):
        log = tracelog.TraceLog()
        loss_graph = _tiny(("h", "y"))
        loss_graph.kind = "loss"
        prediction, loss = log.add_graph(_tiny(("h", "y"))), log.add_graph(loss_graph)
        assert prediction != loss
        usages = None
        for epoch, batch, guarded in batches:
            if not guarded or not one_call:
                log.count("train", prediction, loss, epoch, batch, guarded=guarded)
                continue
            if usages is None:  # as the listener: found on the first guarded batch
                log.count("train", prediction, loss, epoch, batch, guarded=True)
                usages = log.usages("train", prediction, loss)
            else:
                log.count_guarded(usages, epoch, batch)
        logs.append(log)
    plain, fast = logs
    assert fast.recorded == plain.recorded
    for a, b in [(plain.entries, fast.entries), (plain.pairs, fast.pairs)]:
        assert {k: (e.usage.to_json(), e.usage.guarded) for k, e in a.items()} == {
            k: (e.usage.to_json(), e.usage.guarded) for k, e in b.items()
        }
