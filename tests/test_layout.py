"""The layout passes on small hand-built graphs: same results on
onnx.reference before and after, transposes where they should be, and the
fixed-point loop ends when a transpose pair is a graph output."""

from __future__ import annotations

import numpy as np
import pytest

from tracelog.ir import ConstData, Graph, Node, Output, TensorType, Value
from tracelog.passes.layout import TO_NCHW, TO_NHWC, to_channels_first, to_channels_last
from tracelog.verify import run_graph

pytest.importorskip("onnx", reason="the layout tests run graphs on onnx.reference")


class _G:
    """A tiny graph builder: values by name, nodes in order."""

    def __init__(self) -> None:
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []

    def input(self, name: str, shape: tuple[int, ...], kind: str = "input") -> str:
        self.values[name] = Value(name, TensorType("float32", shape), kind)
        return name

    def const(self, name: str, data: list[int]) -> str:
        self.values[name] = Value(
            name, TensorType("int64", (len(data),)), "const", const=ConstData(data=data)
        )
        return name

    def op(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs: object) -> str:
        out = f"v{len(self.nodes)}"
        self.values[out] = Value(out, TensorType("float32", shape), "node")
        self.nodes.append(Node(op, inputs, [out], dict(attrs), module="m", module_type="M"))
        return out

    def graph(self, *outputs: str) -> Graph:
        roles = ["prediction"] + [f"prediction.{k}" for k in range(1, len(outputs))]
        return Graph(
            "prediction",
            self.values,
            self.nodes,
            [Output(o, r) for o, r in zip(outputs, roles, strict=True)],
        )


def _keras_like() -> Graph:
    """What the TF adapter records for conv -> bias -> batch-norm-style
    arithmetic -> relu -> concat -> pad -> global mean, NHWC around each
    NCHW conv: transposes in and out of every conv."""
    g = _G()
    x = g.input("x", (2, 5, 5, 3))
    w = g.input("w", (4, 3, 3, 3), "param")
    bias = g.input("bias", (4,), "param")
    xt = g.op("Transpose", [x], (2, 3, 5, 5), perm=TO_NCHW)
    y = g.op("Conv", [xt, w], (2, 4, 5, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = g.op("Transpose", [y], (2, 5, 5, 4), perm=TO_NHWC)
    y = g.op("Add", [y, bias], (2, 5, 5, 4))
    mean = g.op("ReduceMean", [y, g.const("axes", [0, 1, 2])], (1, 1, 1, 4), keepdims=1)
    y = g.op("Relu", [g.op("Sub", [y, mean], (2, 5, 5, 4))], (2, 5, 5, 4))
    both = g.op("Concat", [y, y], (2, 5, 5, 8), axis=3)
    padded = g.op("Pad", [both, g.const("pads", [0, 1, 0, 0, 0, 0, 1, 0])], (2, 6, 6, 8))
    yt = g.op("Transpose", [padded], (2, 8, 6, 6), perm=TO_NCHW)
    w2 = g.input("w2", (2, 8, 1, 1), "param")
    z = g.op("Conv", [yt, w2], (2, 2, 6, 6), kernel_shape=[1, 1])
    z = g.op("Transpose", [z], (2, 6, 6, 2), perm=TO_NHWC)
    pooled = g.op("ReduceMean", [z, g.const("hw", [1, 2])], (2, 2), keepdims=0)
    return g.graph(pooled, mean)


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        v.name: rng.standard_normal(v.type.shape).astype(np.float32)
        for v in graph.values.values()
        if v.kind in ("input", "param") and all(isinstance(d, int) for d in v.type.shape)
    }


def test_channels_first_keeps_transposes_only_at_the_edges_and_computes_the_same() -> None:
    graph = _keras_like()
    after, report = to_channels_first(graph)
    # the mean is also a graph output: it leaves NHWC, as recorded
    assert report.changed
    assert report.kept == ["data input x enters NHWC", "back to NHWC for output prediction.1"]
    assert [n.op for n in after.nodes].count("Transpose") == 2
    # the [C] bias is re-laid to [1, C, 1, 1] by one Reshape
    (reshape,) = [n for n in after.nodes if n.op == "Reshape"]
    assert after.values[reshape.outputs[0]].type.shape == (1, 4, 1, 1)
    feeds = _feeds(graph)
    want, got = run_graph(graph, feeds), run_graph(after, feeds)
    for role in want:
        np.testing.assert_allclose(got[role], want[role], rtol=1e-6, atol=1e-6)


def test_a_transpose_pair_that_is_a_graph_output_ends_the_loop() -> None:
    g = _G()
    x = g.input("x", (2, 3, 4, 5))
    there = g.op("Transpose", [x], (2, 4, 5, 3), perm=TO_NHWC)
    back = g.op("Transpose", [there], (2, 3, 4, 5), perm=TO_NCHW)
    graph = g.graph(back, there)
    for rewrite in (to_channels_first, to_channels_last):
        after, _ = rewrite(graph)
        feeds = _feeds(graph)
        want, got = run_graph(graph, feeds), run_graph(after, feeds)
        for role in want:
            np.testing.assert_array_equal(got[role], want[role])


def test_channels_first_leaves_a_graph_without_nhwc_transposes_alone() -> None:
    g = _G()
    x = g.input("x", (2, 3))
    graph = g.graph(g.op("Relu", [x], (2, 3)))
    after, report = to_channels_first(graph)
    assert not report.changed and not report.kept
    assert [n.op for n in after.nodes] == ["Relu"]


def test_channels_first_hoists_the_transpose_in_above_scaling_and_resize() -> None:
    """x * s + o, a nearest Resize over H and W, then a conv (Keras'
    Rescaling and UpSampling2D before Conv2D): the transpose into NCHW moves
    up to the data input; a value another node also reads stays where it is."""
    g = _G()
    x = g.input("x", (2, 4, 4, 3))
    g.values["s"] = Value("s", TensorType("float32", (3,)), "const", const=ConstData([0.5] * 3))
    scaled = g.op("Add", [g.op("Mul", [x, "s"], (2, 4, 4, 3)), "s"], (2, 4, 4, 3))
    g.values["scales"] = Value(
        "scales", TensorType("float32", (2,)), "const", const=ConstData([2.0, 2.0])
    )
    up = g.op(
        "Resize",
        [scaled, "", "scales"],
        (2, 8, 8, 3),
        axes=[1, 2],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    w = g.input("w", (4, 3, 1, 1), "param")
    z = g.op("Conv", [g.op("Transpose", [up], (2, 3, 8, 8), perm=TO_NCHW), w], (2, 4, 8, 8))
    z = g.op("Transpose", [z], (2, 8, 8, 4), perm=TO_NHWC)
    pooled = g.op("ReduceMean", [z, g.const("hw", [1, 2])], (2, 4), keepdims=0)
    graph = g.graph(pooled, scaled)
    after, report = to_channels_first(graph)
    # the scaled value is also an output: the Resize runs NCHW, the arithmetic NHWC
    assert report.kept == ["into NCHW after Add at m"]
    (resize,) = [n for n in after.nodes if n.op == "Resize"]
    assert resize.ints_attr("axes") == [2, 3]
    feeds = _feeds(graph)
    want, got = run_graph(graph, feeds), run_graph(after, feeds)
    for role in want:
        np.testing.assert_allclose(got[role], want[role], rtol=1e-6, atol=1e-6)
    alone, report = to_channels_first(g.graph(pooled))
    assert report.kept == ["data input x enters NHWC"]
    assert [(n.op, n.inputs[0]) for n in alone.nodes][0] == ("Transpose", "x")
    np.testing.assert_allclose(
        run_graph(alone, feeds)["prediction"], want["prediction"], rtol=1e-6, atol=1e-6
    )


def test_channels_first_carries_a_1d_layer_through_unsqueeze_and_squeeze() -> None:
    """Keras' Conv1D/pools: ExpandDims, the 2-D op between layout transposes,
    Squeeze. The transposes hop over both and go on as [0, 2, 1] through a
    batch-sized mask (SpatialDropout1D), a Slice (Cropping1D) and the bias, to
    one entering and one leaving for the flatten; a [0, 2, 1] transpose the
    recording made itself (attention's) is not taken for a layout one."""
    g = _G()
    x = g.input("x", (2, 6, 3))
    line = g.op("Unsqueeze", [x, g.const("ax1", [1])], (2, 1, 6, 3))
    t = g.op("Transpose", [line], (2, 3, 1, 6), perm=TO_NCHW)
    w = g.input("w", (4, 3, 1, 3), "param")
    y = g.op("Conv", [t, w], (2, 4, 1, 6), kernel_shape=[1, 3], pads=[0, 1, 0, 1])
    y = g.op("Transpose", [y], (2, 1, 6, 4), perm=TO_NHWC)
    y = g.op("Squeeze", [y, g.const("sq", [1])], (2, 6, 4))
    g.values["mask"] = Value("mask", TensorType("float32", ("batch", 1, 4)), "input")
    y = g.op("Mul", [y, "mask"], (2, 6, 4))
    y = g.op(
        "Slice", [y, g.const("starts", [1]), g.const("ends", [5]), g.const("axes", [1])], (2, 4, 4)
    )
    y = g.op("Add", [y, g.input("bias", (4,), "param")], (2, 4, 4))
    scores = g.op("Transpose", [y], (2, 4, 4), perm=[0, 2, 1])
    flat = g.op("Reshape", [y, g.const("flat", [-1, 16])], (2, 16))
    graph = g.graph(flat, scores)
    after, report = to_channels_first(graph)
    assert report.kept == [
        "data input x enters NHWC",
        "back to NHWC for Reshape at m, Transpose at m",
    ], report.summary()
    perms = [n.ints_attr("perm") for n in after.nodes if n.op == "Transpose"]
    assert perms.count([0, 2, 1]) == 3, perms  # in, back out, and the recording's own
    assert [n.op for n in after.nodes if n.op in ("Conv", "Slice")] == ["Conv", "Slice"]
    feeds = _feeds(graph)
    feeds["mask"] = (np.random.default_rng(1).random((2, 1, 4)) > 0.5).astype(np.float32)
    want, got = run_graph(graph, feeds), run_graph(after, feeds)
    for role in want:
        np.testing.assert_allclose(got[role], want[role], rtol=1e-6, atol=1e-6)


def _reshape_then_conv(before: tuple[int, ...], after: tuple[int, ...]) -> Graph:
    """x of shape `before`, reshaped to the NHWC `after`, into an NCHW conv."""
    g = _G()
    x = g.input("x", before)
    y = g.op("Reshape", [x, g.const("shape", list(after))], after)
    w = g.input("w", (3, after[3], 1, 1), "param")
    nchw = (after[0], after[3], after[1], after[2])
    z = g.op("Conv", [g.op("Transpose", [y], nchw, perm=TO_NCHW), w], (after[0], 3, *nchw[2:]))
    z = g.op("Transpose", [z], (after[0], *nchw[2:], 3), perm=TO_NHWC)
    return g.graph(g.op("ReduceMean", [z, g.const("hw", [1, 2])], (after[0], 3), keepdims=0))


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        # squeeze-excite: [batch, C] -> [batch, 1, 1, C]; into NCHW it is
        # [batch, C, 1, 1], the same values in the same order: nothing kept
        ((2, 4), (2, 1, 1, 4), []),
        # a linear's [B*H*W, C] -> [B, H, W, C] with H = W = C: the sizes
        # match after the transpose, the values do not; it stays
        ((8, 2), (2, 2, 2, 2), ["into NCHW after Reshape at m"]),
    ],
)
def test_channels_first_carries_a_transpose_through_a_unit_dims_reshape_only(
    before: tuple[int, ...], after: tuple[int, ...], kept: list[str]
) -> None:
    graph = _reshape_then_conv(before, after)
    out, report = to_channels_first(graph)
    assert report.kept == kept
    feeds = _feeds(graph)
    np.testing.assert_allclose(
        run_graph(out, feeds)["prediction"],
        run_graph(graph, feeds)["prediction"],
        rtol=1e-6,
        atol=1e-6,
    )
