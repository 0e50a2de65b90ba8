"""The ONNX target sums in float64. onnxruntime's CPU ReduceSum and ReduceMean
add in one running sum of the input's dtype: a mean squared error over 262144
float32 values came out 131 times further from the float64 reference than
PyTorch's own (which sums in a cascade), and the float32 check of a correct
model failed (ratio 4.88). The model now casts a float32 reduction's input to
float64 and its result back once; its float64 run (the translation check)
is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

import tracelog
from tracelog.adapters.torch import TorchListener

onnx = pytest.importorskip("onnx", reason="the ONNX target needs onnx")
pytest.importorskip("onnxruntime", reason="the ONNX target's float32 run needs onnxruntime")


def test_a_mean_over_many_values_is_as_accurate_as_pytorchs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    x, y = torch.randn(65536, 8) + 0.5, torch.randn(65536, 4)
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        ((model(x) - y) ** 2).mean().backward()
    report = tracelog.check(tmp_path, "onnx")
    assert report.ok, report.table()
    loss = next(c for c in report.comparisons if c.name == "loss")
    assert loss.max_abs <= 2 * loss.source_err, report.table()

    written = onnx.load(str(tracelog.emit(tmp_path, target="onnx")))
    nodes = list(written.graph.node) + [n for f in written.functions for n in f.node]
    (mean,) = [n for n in nodes if n.op_type == "ReduceMean"]
    cast_in = next(n for n in nodes if n.output == mean.input[:1])
    cast_out = next(n for n in nodes if list(n.input) == list(mean.output))
    assert cast_in.op_type == cast_out.op_type == "Cast"
    assert cast_in.attribute[0].i == onnx.TensorProto.DOUBLE
    assert cast_out.attribute[0].i == onnx.TensorProto.FLOAT
