"""onnx.reference's AveragePool with ceil_mode, as the ONNX target's
translation check and the divergence search run it (tracelog.verify): the
divisor counts the explicit padding (count_include_pad) but never ceil_mode's
overhang, as torch and onnxruntime compute it. onnx 1.23 read HF EfficientNet's
pooler, AvgPool2d(320, ceil_mode=True) over 4x4, as 0."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from tracelog.verify import run_model

CASES = [  # input shape, ONNX attributes, count_include_pad, torch's pool
    ((1, 2, 4, 4), {"kernel_shape": [320, 320], "strides": [320, 320]}, 1,
     torch.nn.AvgPool2d(320, ceil_mode=True)),
    ((2, 3, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2]}, 1,
     torch.nn.AvgPool2d(3, 2, ceil_mode=True)),
    ((2, 3, 7, 6), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 0,
     torch.nn.AvgPool2d(2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((2, 3, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 0]}, 1,
     torch.nn.AvgPool2d((3, 2), (2, 3), padding=(1, 0), ceil_mode=True)),
    ((2, 3, 9), {"kernel_shape": [4], "strides": [3], "pads": [1, 1]}, 1,
     torch.nn.AvgPool1d(4, 3, padding=1, ceil_mode=True)),
]  # fmt: skip


@pytest.mark.parametrize("shape, attrs, include_pad, pool", CASES)
def test_ceil_mode_average_pool_is_torchs(
    shape: tuple[int, ...], attrs: dict[str, Any], include_pad: int, pool: torch.nn.Module
) -> None:
    x = np.random.default_rng(0).standard_normal(shape)
    node = helper.make_node(
        "AveragePool", ["x"], ["y"], ceil_mode=1, count_include_pad=include_pad, **attrs
    )
    io = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in "xy"]
    graph = helper.make_graph([node], "pool", io[:1], io[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    got = run_model(model, {"x": x})[0]
    want = pool(torch.from_numpy(x)).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
