"""Every op family of the core vocabulary, recorded from a real training
step, checked against two independent ONNX runtimes."""

from __future__ import annotations

import onnx
import pytest

from tracelog.emit.onnx import graph_to_onnx
from tracelog.verify import verify


def _entries(log, kind: str, phase: str):
    return [e for e in log.entries_sorted() if e.kind == kind and e.phase == phase]


def test_one_graph_per_kind_and_phase_with_counts(recorded) -> None:
    case, _, log = recorded
    assert log.unrecorded == 0, log.failures
    (pred,) = _entries(log, "prediction", "train")
    (loss,) = _entries(log, "loss", "train")
    assert pred.usage.batches == loss.usage.batches == 6
    assert pred.usage.epochs == [0, 1]
    assert pred.usage.first == (0, 0) and pred.usage.last == (1, 2)
    (ev,) = _entries(log, "prediction", "eval")
    assert ev.usage.batches == 2


def test_recorded_ops(recorded) -> None:
    case, _, log = recorded
    (pred,) = _entries(log, "prediction", "train")
    (loss,) = _entries(log, "loss", "train")
    pred_ops = set(log.graphs[pred.hash].op_histogram())
    loss_ops = set(log.graphs[loss.hash].op_histogram())
    assert case.pred_ops <= pred_ops, pred_ops
    assert case.loss_ops <= loss_ops, loss_ops
    assert "tracelog.Unsupported" not in pred_ops | loss_ops
    if case.eval_ops:
        (ev,) = _entries(log, "prediction", "eval")
        assert case.eval_ops <= set(log.graphs[ev.hash].op_histogram())


def test_parameters_named_by_module_path_and_batch_symbolic(recorded) -> None:
    case, _, log = recorded
    (pred,) = _entries(log, "prediction", "train")
    g = log.graphs[pred.hash]
    model_params = {p["name"] for p in log.model["params"]}
    assert {v.name for v in g.params} <= model_params
    assert g.params, "a model with parameters records them by name"
    for v in g.params:
        assert "batch" not in v.type.shape
    for v in g.inputs:
        assert v.type.shape[0] == "batch"
    out = g.output("prediction")
    assert g.values[out.name].type.shape[0] == "batch"
    modules = {name: type(m).__name__ for name, m in case.model().named_modules()}
    for node in g.nodes:
        # "" is the root module itself: ops written in its own forward
        assert modules.get(node.module) == node.module_type, (node.op, node.module)


@pytest.mark.parametrize("runtime", ["reference", "onnxruntime"])
def test_ir_matches_torch_on_onnx_runtimes(recorded, runtime: str) -> None:
    _, log_dir, _ = recorded
    report = verify(log_dir, runtime=runtime, atol=1e-5, rtol=1e-4)
    assert report.ok, report.table()


def test_every_graph_passes_onnx_full_check(recorded) -> None:
    _, _, log = recorded
    weights = log.weights()
    for g in log.graphs.values():
        model = graph_to_onnx(g, constants=weights)
        onnx.checker.check_model(model, full_check=True)
        dims = [d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim]
        if g.inputs and g.inputs[0].type.shape and g.inputs[0].type.shape[0] == "batch":
            assert "batch" in dims


def test_buffers_updates_are_explicit_outputs(recorded) -> None:
    case, _, log = recorded
    (pred,) = _entries(log, "prediction", "train")
    g = log.graphs[pred.hash]
    roles = {o.role for o in g.outputs}
    bufs = {b["name"] for b in log.model["buffers"]}
    assert {r.split(":", 1)[1] for r in roles if r.startswith("update:")} == bufs
    (ev,) = _entries(log, "prediction", "eval")
    assert not [o for o in log.graphs[ev.hash].outputs if o.role.startswith("update:")]


def test_eval_batch_norm_graph_keeps_a_feature_dim_equal_to_the_batch(tmp_path) -> None:
    """Batch 4 and 4 features after a flatten: the eval graph (native_batch_norm
    with empty save_mean outputs, which the meta kernel sizes (C,)) must still
    find which 4 is the batch, and run at another batch size."""
    import numpy as np
    import torch
    from helpers import record

    from tracelog.verify import run_graph

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 4),
        torch.nn.Tanh(),
        torch.nn.Linear(4, 3),
    )
    batches = [(torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,)))]
    log = record(model, tmp_path / "log", batches, torch.nn.functional.cross_entropy)
    weights = log.weights()
    phases = set()
    for e in log.entries_sorted():
        if e.kind != "prediction":
            continue
        g = log.graph(e.hash)
        phases.add(e.phase)
        x = np.random.default_rng(0).standard_normal((7, 3, 6, 6)).astype(np.float32)
        (name,) = [v.name for v in g.inputs]
        got = run_graph(g, {**weights, name: x}, runtime="onnxruntime", constants=weights)
        assert got["prediction"].shape == (7, 3), e.phase
    assert phases == {"train", "eval"}
