"""The translation check (issue 14): the sample's float64 reference, the
emitted program run again in float64 against it, and what that sees that a
float32 comparison cannot: an edit far below float32's resolution."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_translated, edit_onnx_graphs
from torch import nn

import tracelog
from tracelog.adapters.torch import TorchListener
from tracelog.emit.harness import attach
from tracelog.ir import ConstData, Graph, Node, TensorType, Value
from tracelog.verify import translation


@pytest.fixture(scope="module")
def mlp_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log_dir = tmp_path_factory.mktemp("mlp") / "log"
    listener = TorchListener(model, log_dir, strict=True)
    for _ in range(2):
        x, y = torch.randn(8, 6), torch.randint(0, 4, (8,))
        with listener.batch():
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    listener.close()
    return log_dir


def test_the_ir_in_float64_is_the_reference(mlp_log: Path) -> None:
    """onnx.reference runs the recorded graphs widened to float64 and agrees
    with torch's own float64 replay to float64 rounding."""
    rows = translation(tracelog.load(mlp_log))
    assert [r.name for r in rows] == ["prediction [float64]", "loss [float64]"]
    assert all(r.ok and r.max_abs < 1e-13 for r in rows), rows


@pytest.mark.parametrize("target", ["tensorflow", "jax"])
def test_program_in_float64_matches_the_reference(mlp_log: Path, target: str) -> None:
    report = tracelog.check(mlp_log, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith("[float64]")]
    assert len(translated) >= 6  # prediction, loss, four gradients
    assert max(c.max_abs for c in translated) < 1e-12


def _run_edited(log_dir: Path, target: str, old: str, new: str) -> list:
    """The emitted program with one edit, its parity rows."""
    path = tracelog.emit(log_dir, target=target)
    text = path.read_text()
    assert text.count(old) == 1, old
    edited = path.with_name(f"edited_{target}.py")
    edited.write_text(text.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"edited_{target}", edited)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    attach(module.__dict__, target)  # the parity check, as its __main__ runs it
    return module.check_parity(str(log_dir))


def test_an_edit_below_float32_resolution_fails_only_the_translation(mlp_log: Path) -> None:
    """tanh's input scaled by 1 + 1e-6: every float32 comparison still passes
    (atol 1e-5), while the float64 run is off the reference by ~1e-7."""
    rows = _run_edited(
        mlp_log, "tensorflow", "tf.math.tanh(gemm_0)", "tf.math.tanh(gemm_0 * (1 + 1e-6))"
    )
    float64 = [r for r in rows if r[0].endswith("[float64]")]
    float32 = [r for r in rows if not r[0].endswith("[float64]")]
    assert all(r[3] for r in float32)
    assert not all(r[3] for r in float64)
    assert all(not r[3] for r in float64 if r[0].startswith(("prediction", "loss")))


# each target's module object handing the graph functions its parameters,
# edited to hand them zeros: the check, which runs through it, must fail
_MODULE_EDITS = {
    "torch": (
        "found = {row[0]: own[state_key(row[0])] for row in PARAMETERS}",
        "found = {row[0]: own[state_key(row[0])] * 0 for row in PARAMETERS}",
    ),
    "tensorflow": ("found[name] = node", "found[name] = node * 0"),
    "jax": ("flat[name] = node", "flat[name] = node * 0"),
}


@pytest.mark.parametrize("target", sorted(_MODULE_EDITS))
def test_the_check_runs_through_the_module_object(mlp_log: Path, target: str) -> None:
    """The parity check builds the target's module object (PyTorch's and
    TensorFlow's Model, JAX's params_tree) from the recorded parameters and
    runs the graph functions on what it holds: a module that hands them
    anything else fails the check, translation and float32 alike."""
    rows = _run_edited(mlp_log, target, *_MODULE_EDITS[target])
    assert not any(r[3] for r in rows if r[0].startswith("prediction"))


def test_the_sample_reference_is_float64_and_near_the_float32_run(mlp_log: Path) -> None:
    sample = tracelog.load(mlp_log).sample()
    for key in ("loss", "output/prediction", "grad/0.weight"):
        ref = sample["ref64/" + key]
        assert ref.dtype == np.float64
        np.testing.assert_allclose(sample[key], ref, rtol=1e-5, atol=1e-6)


def _scale_tanh_input(graph: Graph) -> bool:
    """tanh(x) -> tanh(x * (1 + 1e-6)): a Mul inserted before the graph's Tanh."""
    for k, node in enumerate(graph.nodes):
        if node.op == "Tanh":
            x = node.inputs[0]
            ty = graph.values[x].type
            factor, scaled = f"{x}.factor", f"{x}.scaled"
            graph.values[factor] = Value(
                factor, TensorType(ty.dtype, ()), "const", const=ConstData([1 + 1e-6])
            )
            graph.values[scaled] = Value(scaled, ty, "node")
            graph.nodes.insert(k, Node("Mul", [x, factor], [scaled]))
            node.inputs[0] = scaled
            return True
    return False


def test_an_onnx_edit_below_float32_resolution_fails_only_the_translation(
    mlp_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ONNX target's check, its model with tanh's input scaled by 1 + 1e-6:
    onnxruntime's float32 rows still pass, the model in float64 is off the
    reference by ~1e-7 of the output's scale."""
    report = tracelog.check(mlp_log, "onnx")
    assert_translated(report)
    assert max(c.max_rel for c in report.comparisons if c.name.endswith("[float64]")) < 1e-13
    edit_onnx_graphs(monkeypatch, _scale_tanh_input)
    rows = tracelog.check(mlp_log, "onnx").comparisons
    float64 = [c for c in rows if c.name.endswith("[float64]")]
    float32 = [c for c in rows if not c.name.endswith("[float64]")]
    assert [c.name for c in float64] == ["prediction [float64]", "loss [float64]"]
    assert all(c.ok for c in float32), float32
    assert all(not c.ok and c.max_rel > 1e-8 for c in float64), float64


def test_a_float32_only_failure_is_reported_as_accuracy_not_as_a_node() -> None:
    """Translation rows that pass and float32 rows that fail: the program is
    the source's function, less accurate; no node is searched for."""
    from tracelog.parity import accuracy_only
    from tracelog.verify import Comparison, Report

    translated = Comparison("loss [float64]", 1e-17, 1e-16, True)
    inaccurate = Comparison("loss", 1e-4, 1e-4, False, 1e-6, 50.0)
    line = accuracy_only(Report("t", [translated, inaccurate]))
    assert line is not None and "fail on accuracy" in line and "50.0x" in line
    wrong = Comparison("loss [float64]", 1.0, 1.0, False)
    assert accuracy_only(Report("t", [wrong, inaccurate])) is None
    assert accuracy_only(Report("t", [inaccurate])) is None  # no reference: atol rows
