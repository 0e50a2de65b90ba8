"""The ONNX target: model.onnx holds every unique graph as a function, passes
the full checker, runs on onnxruntime, and is written deterministically."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from helpers import assert_translated, edit_onnx_graphs, record
from zoo import CNNBnDrop

import tracelog
from tracelog.emit.onnx_model import GRAPHS_DOMAIN


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("onnx")
    batches = [(torch.randn(n, 3, 8, 8), torch.randint(0, 5, (n,))) for n in (8, 8, 3)]
    record(CNNBnDrop(), d, batches, torch.nn.functional.cross_entropy, epochs=2)
    return d


def test_model_holds_every_unique_graph(log_dir) -> None:
    path = tracelog.emit(log_dir, target="onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    log = tracelog.load(log_dir)
    graph_functions = [f for f in model.functions if f.domain == GRAPHS_DOMAIN]
    assert len(graph_functions) == len(log.graphs) == 3  # train and eval predictions, one loss
    assert {f.name for f in graph_functions} == {"predict_train", "loss_train", "predict_eval"}
    assert all("batches" in f.doc_string for f in graph_functions)
    dims = [d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim]
    assert "batch" in dims
    assert {t.name for t in model.graph.initializer} >= {
        "conv.weight",
        "bn.running_mean",
        "fc.bias",
    }
    props = {p.key: p.value for p in model.metadata_props}
    usage = json.loads(props["tracelog.usage"])
    assert [u["batches"] for u in usage] == [6, 6, 2, 2]
    node_docs = [n.doc_string for f in graph_functions for n in f.node if n.doc_string]
    assert any(doc.startswith("conv (Conv2d)") for doc in node_docs)


def test_model_runs_on_onnxruntime_for_any_batch_size(log_dir) -> None:
    path = tracelog.emit(log_dir, target="onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 7):
        out = sess.run(
            None,
            {"x": np.random.rand(n, 3, 8, 8).astype(np.float32), "target": np.zeros(n, np.int64)},
        )
        assert out[0].shape == (n, 5)


def test_written_bytes_are_deterministic(log_dir, tmp_path) -> None:
    a = tracelog.emit(log_dir, target="onnx", out=str(tmp_path / "a.onnx")).read_bytes()
    b = tracelog.emit(log_dir, target="onnx", out=str(tmp_path / "b.onnx")).read_bytes()
    assert a == b


def test_check_reports_parity_without_gradients(log_dir) -> None:
    report = tracelog.check(log_dir, target="onnx")
    assert report.ok, report.table()
    assert not any(c.name.startswith("grad") for c in report.comparisons)


def test_check_runs_the_model_in_float64_against_the_reference(log_dir) -> None:
    """The translation rows: model.onnx in float64 on onnx.reference, batch
    norm's running statistics included (its momentum a double in ONNX), at
    float64 rounding; beside them onnxruntime's float32 rows."""
    report = tracelog.check(log_dir, target="onnx")
    assert_translated(report)
    names = [c.name for c in report.comparisons]
    assert names[:5] == [
        "prediction [float64]",
        "update:bn.running_mean [float64]",
        "update:bn.running_var [float64]",
        "update:bn.num_batches_tracked [float64]",
        "loss [float64]",
    ]
    assert max(c.max_rel for c in report.comparisons[:5]) < 1e-13
    assert "translation ([float64] rows" in report.table()


def test_a_float32_momentum_fails_only_the_translation(log_dir, monkeypatch) -> None:
    """Batch norm's momentum as float32 holds it (0.1 -> 0.10000000149, what a
    float attribute of the model would carry): the running statistics move by
    ~1e-9 of their scale, far below float32's resolution (onnxruntime's rows
    pass) and far above float64's (the translation rows fail)."""

    def momentum_in_float32(graph) -> bool:
        found = [n for n in graph.nodes if n.op == "BatchNormTraining"]
        for n in found:
            n.attrs["momentum"] = float(np.float32(n.attrs["momentum"]))
        return bool(found)

    edit_onnx_graphs(monkeypatch, momentum_in_float32)
    report = tracelog.check(log_dir, target="onnx")
    failed = {c.name for c in report.comparisons if not c.ok}
    assert failed == {"update:bn.running_mean [float64]", "update:bn.running_var [float64]"}


class _TwoDropouts(torch.nn.Module):
    """Two dropouts of different shapes: [batch, 8], then [batch, 4]."""

    def __init__(self) -> None:
        super().__init__()
        self.d0, self.fc, self.d1 = (
            torch.nn.Dropout(0.2),
            torch.nn.Linear(8, 4),
            torch.nn.Dropout(0.5),
        )
        self.out = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.d1(torch.relu(self.fc(self.d0(x)))))


def test_replay_declares_each_dropout_mask_with_its_own_type(tmp_path) -> None:
    """model.onnx's replay form once declared every mask input with the first
    Dropout's type, so a second dropout of another shape failed in onnxruntime."""
    from tracelog.emit.onnx import mask_inputs
    from tracelog.emit.onnx_model import build_model

    torch.manual_seed(0)
    batches = [(torch.randn(6, 8), torch.randint(0, 3, (6,)))]
    record(_TwoDropouts(), tmp_path, batches, torch.nn.functional.cross_entropy)
    log = tracelog.load(tmp_path)
    pred = log.graph(log.sample_info["prediction"])
    want = {name: (onnx.TensorProto.BOOL, list(ty.shape)) for name, ty in mask_inputs(pred)}
    assert want == {
        "mask.0": (onnx.TensorProto.BOOL, ["batch", 8]),
        "mask.1": (onnx.TensorProto.BOOL, ["batch", 4]),
    }
    model = build_model(log, replay_masks=True)
    declared = {
        i.name: (
            i.type.tensor_type.elem_type,
            [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim],
        )
        for i in model.graph.input
        if i.name.startswith("mask.")
    }
    assert declared == want
    report = tracelog.check(tmp_path, target="onnx")
    assert report.ok, report.table()


def test_batch_norm_statistics_accumulate_as_each_source_kernel_does() -> None:
    """tracelog.BatchNormTraining's ONNX function on onnxruntime in float32:
    PyTorch's flavour (unbiased) takes the batch statistics in float64, as
    PyTorch's CPU kernel accumulates them (its running mean equals torch's to
    the last bit where a float32 ReduceMean, summing values that cancel, is
    not: the torch ResNet's ONNX update rows were 2.3x torch's float32 error); Keras' flavour
    takes them in float32, as tf.nn.moments does."""
    from onnx import TensorProto, helper

    from tracelog.ops import TRACELOG_DOMAIN, schema_for

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)  # means near 0: cancellation
    scale, bias = np.ones(3, np.float32), np.zeros(3, np.float32)
    running = (np.zeros(3, np.float32), np.ones(3, np.float32))
    function = onnx.parser.parse_function(schema_for(TRACELOG_DOMAIN, "BatchNormTraining").function)

    def run(unbiased: int, decay: float) -> list[np.ndarray]:
        def double(name: str, v: float) -> onnx.AttributeProto:
            return helper.make_attribute(
                name, helper.make_tensor(name, TensorProto.DOUBLE, [], [v])
            )

        node = helper.make_node(
            "BatchNormTraining",
            ["x", "s", "b", "m", "v"],
            ["y", "nm", "nv"],
            domain=TRACELOG_DOMAIN,
        )
        node.attribute.extend(
            [double("epsilon", 1e-5), double("momentum", 0.1), double("decay", decay)]
        )
        node.attribute.extend(
            [helper.make_attribute("axes", [0, 2, 3]), helper.make_attribute("unbiased", unbiased)]
        )
        f32 = TensorProto.FLOAT
        graph = helper.make_graph(
            [node],
            "bn",
            [helper.make_tensor_value_info(n, f32, None) for n in "xsbmv"],
            [helper.make_tensor_value_info(n, f32, None) for n in ("y", "nm", "nv")],
        )
        model = helper.make_model(
            graph,
            functions=[function],
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(TRACELOG_DOMAIN, 1)],
        )
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return session.run(None, dict(zip("xsbmv", (x, scale, bias, *running), strict=True)))

    mean, var = torch.zeros(3), torch.ones(3)
    torch.nn.functional.batch_norm(torch.from_numpy(x), mean, var, None, None, True, 0.1, 1e-5)
    torch_flavour = run(1, 0.9)
    np.testing.assert_array_equal(torch_flavour[1], mean.numpy())
    keras_flavour = run(0, 0.9)
    mean32 = (0.1 * x.mean((0, 2, 3), dtype=np.float32)).astype(np.float32)
    assert not np.array_equal(keras_flavour[1], mean.numpy())  # float32 statistics
    np.testing.assert_allclose(keras_flavour[1], mean32, rtol=1e-5)
