"""The pattern-rewrite driver (tracelog.passes.rewrite) and the adapters'
fusions (tracelog.passes.fusions) on hand-built graphs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tracelog.ir import Graph, Node, Output, TensorType, Value
from tracelog.ops import OPS, is_random, traits_of
from tracelog.passes.fusions import GEMM_TRANSPOSES
from tracelog.passes.rewrite import Match, P, Rewrites, rewrite

F = "float32"


def _graph(nodes: list[Node], outputs: list[str], types: Mapping[str, tuple[int, ...]]) -> Graph:
    """Inputs are the names read before any node defines them."""
    g = Graph("prediction", nodes=nodes)
    defined = {o for n in nodes for o in n.outputs}
    for n in nodes:
        for i in n.inputs:
            if i and i not in defined and i not in g.values:
                g.values[i] = Value(i, TensorType(F, types.get(i, (2, 3))), "input")
    for n in nodes:
        for o in n.outputs:
            g.values[o] = Value(o, TensorType(F, types.get(o, (2, 3))), "node")
    g.outputs = [
        Output(o, "prediction" if k == 0 else f"prediction.{k}") for k, o in enumerate(outputs)
    ]
    g.validate()
    return g


def _node(op: str, ins: list[str], outs: list[str], module: str = "", **attrs: object) -> Node:
    return Node(op, ins, outs, dict(attrs), module=module, module_type="M", source=f"src.{op}")  # type: ignore[arg-type]


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def _neg_neg(m: Match) -> list[Node]:
    return [m.node_as("Identity", [m["x"]])]


# Neg(Neg(x)) -> Identity(x)
NEG_NEG = Rewrites([(P("Neg", P("Neg", "x")), _neg_neg)])


def test_no_match_leaves_the_graph_equal() -> None:
    g = _graph([_node("Relu", ["x"], ["a"]), _node("Neg", ["a"], ["y"])], ["y"], {})
    before = g.canonical().digest()
    out, report = rewrite(g, NEG_NEG + GEMM_TRANSPOSES)
    assert not report.fired and report.summary() == "no rewrites"
    assert out.canonical().digest() == before
    assert out.nodes == g.nodes and out.values == g.values


def test_rule_fires_keeps_root_provenance_and_output_names() -> None:
    g = _graph(
        [
            _node("Neg", ["x"], ["a"], module="inner"),
            _node("Neg", ["a"], ["y"], module="outer"),
        ],
        ["y"],
        {},
    )
    out, report = rewrite(g, NEG_NEG)
    assert report.fired == {"neg_neg": 1}
    (node,) = out.nodes
    assert (node.op, node.inputs, node.outputs) == ("Identity", ["x"], ["y"])
    assert (node.module, node.module_type, node.source) == ("outer", "M", "src.Neg")
    assert "a" not in out.values  # the dead inner node's value went with it
    out.validate()
    assert g.nodes[0].op == "Neg" and len(g.nodes) == 2  # the input graph is untouched


def test_a_matched_inner_node_with_another_reader_is_not_swallowed() -> None:
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Neg", ["a"], ["y"]),
        _node("Relu", ["a"], ["z"]),  # a second reader of the inner Neg
    ]
    g = _graph(nodes, ["y", "z"], {})
    out, report = rewrite(g, NEG_NEG)
    assert not report.fired  # single use is required by default
    assert _ops(out) == ["Neg", "Neg", "Relu"]

    # shared=True reads through it; the inner node stays for its other reader
    shared = Rewrites([(P("Neg", P("Neg", "x", shared=True)), _neg_neg)])
    out, report = rewrite(g, shared)
    assert report.fired == {"neg_neg": 1}
    assert _ops(out) == ["Neg", "Identity", "Relu"]
    assert out.nodes[0].outputs == ["a"] and out.nodes[2].inputs == ["a"]
    out.validate()


def test_an_inner_node_that_is_a_graph_output_stays() -> None:
    g = _graph([_node("Neg", ["x"], ["a"]), _node("Neg", ["a"], ["y"])], ["y", "a"], {})
    out, report = rewrite(g, NEG_NEG)
    assert not report.fired  # "a" is read twice: by the outer Neg and as an output
    assert _ops(out) == ["Neg", "Neg"]


def _split_relu(m: Match) -> list[Node]:
    """Relu(a Split output) -> Abs(x): a marker that the pattern matched."""
    return [m.node_as("Abs", [m["x"]])]


def test_multi_output_nodes() -> None:
    types = {"x": (4, 3), "s0": (2, 3), "s1": (2, 3), "y": (2, 3)}
    nodes = [
        _node("Split", ["x"], ["s0", "s1"], axis=0, num_outputs=2),
        _node("Relu", ["s1"], ["y"]),
    ]
    g = _graph(nodes, ["s0", "y"], types)
    # a pattern on output 0 does not match a reader of output 1
    on_first = Rewrites([(P("Relu", P("Split", "x", out=0, shared=True)), _split_relu)])
    assert not rewrite(g, on_first)[1].fired
    on_second = Rewrites([(P("Relu", P("Split", "x", out=1, shared=True)), _split_relu)])
    out, report = rewrite(g, on_second)
    assert report.fired == {"split_relu": 1}
    assert _ops(out) == ["Split", "Abs"]  # Split's output 0 is still a graph output
    # single use counts every output: s0 is read (an output), so a non-shared pattern fails
    strict = Rewrites([(P("Relu", P("Split", "x", out=1)), _split_relu)])
    assert not rewrite(g, strict)[1].fired

    # a multi-output root: the replacement must define every output still read
    def drop_mask(m: Match) -> list[Node]:
        return [Node("Identity", [m["x"]], [m.root.outputs[0]])]

    dg = _graph([_node("Dropout", ["x"], ["y", "mask"])], ["y"], {"mask": (2, 3)})
    out, report = rewrite(dg, Rewrites([(P("Dropout", "x"), drop_mask)]))
    assert _ops(out) == ["Identity"] and "mask" not in out.values
    dg.outputs.append(Output("mask", "prediction.1"))
    with pytest.raises(ValueError, match="drops \\['mask'\\]"):
        rewrite(dg, Rewrites([(P("Dropout", "x"), drop_mask)]))


def test_variables_bind_one_value_and_attrs_and_predicates_filter() -> None:
    g = _graph([_node("Mul", ["x", "x"], ["sq"]), _node("Mul", ["x", "w"], ["y"])], ["sq", "y"], {})

    def square(m: Match) -> list[Node]:
        return [m.node_as("Pow", [m["a"], m["a"]])]

    out, report = rewrite(g, Rewrites([(P("Mul", "a", "a"), square)]))
    assert report.fired == {"square": 1} and _ops(out) == ["Pow", "Mul"]
    t = _graph([_node("Transpose", ["x"], ["y"], perm=[1, 0])], ["y"], {"y": (3, 2)})
    for pat, fires in (
        (P("Transpose", "x", perm=[1, 0]), True),
        (P("Transpose", "x", perm=[0, 1]), False),
        (P("Transpose", "x", where=lambda n: n.module == "m"), False),
    ):
        assert (
            bool(
                rewrite(t, Rewrites([(pat, lambda m: [m.node_as("Identity", [m["x"]])])]))[1].fired
            )
            is fires
        )


def test_declining_rule_changes_nothing() -> None:
    g = _graph([_node("Neg", ["x"], ["a"]), _node("Neg", ["a"], ["y"])], ["y"], {})

    def declines(m: Match) -> None:
        m.fresh(TensorType(F, (1,)))  # a value made and then not used
        return None

    out, report = rewrite(g, Rewrites([(P("Neg", P("Neg", "x")), declines)]) + NEG_NEG)
    assert report.fired == {"neg_neg": 1}  # the next rule for the op was tried
    assert set(out.values) == {"x", "y"}


def test_fixed_point_terminates() -> None:
    # eight Negs in a chain: pairs fold, then the Identity chain stays (no rule)
    nodes = [_node("Neg", ["x" if k == 0 else f"n{k - 1}"], [f"n{k}"]) for k in range(8)]
    g = _graph(nodes, ["n7"], {})
    out, report = rewrite(g, NEG_NEG)
    assert report.fired == {"neg_neg": 4}
    assert _ops(out) == ["Identity"] * 4
    out.validate()

    # rules that undo each other stop at the limit instead of looping forever
    def to_relu(m: Match) -> list[Node]:
        return [m.node_as("Relu", [m["x"]])]

    def to_abs(m: Match) -> list[Node]:
        return [m.node_as("Abs", [m["x"]])]

    flip = Rewrites([(P("Abs", "x"), to_relu), (P("Relu", "x"), to_abs)])
    with pytest.raises(RuntimeError, match="no fixed point"):
        rewrite(_graph([_node("Abs", ["x"], ["y"])], ["y"], {}), flip, limit=50)


def test_composed_passes_try_the_left_rules_first() -> None:
    g = _graph([_node("Neg", ["x"], ["a"]), _node("Neg", ["a"], ["y"])], ["y"], {})

    def first(m: Match) -> list[Node]:
        return [m.node_as("Abs", [m["x"]])]

    pat = P("Neg", P("Neg", "x"))
    out, report = rewrite(g, Rewrites([(pat, first)]) + NEG_NEG)
    assert report.fired == {"first": 1} and _ops(out) == ["Abs"]
    assert len(Rewrites([(pat, first)]) + NEG_NEG) == 2


# -- fusions --------------------------------------------------------------------------
def _linear(op: str, w_shape: tuple[int, ...] = (4, 3), **attrs: object) -> list[Node]:
    ins = ["x", "wt"] + (["b"] if op == "Gemm" else [])
    return [
        _node("Transpose", ["w"], ["wt"], module="fc", perm=[1, 0]),
        _node(op, ins, ["y"], module="fc", **attrs),
    ]


TYPES = {"x": (2, 3), "w": (4, 3), "wt": (3, 4), "b": (4,), "y": (2, 4)}


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_gemm_takes_the_weight_untransposed(op: str) -> None:
    g = _graph(_linear(op), ["y"], TYPES)
    out, report = rewrite(g, GEMM_TRANSPOSES)
    assert sum(report.fired.values()) == 1
    (gemm,) = out.nodes
    assert (gemm.op, gemm.inputs[:2], gemm.attrs, gemm.module) == (
        "Gemm",
        ["x", "w"],
        {"transB": 1},
        "fc",
    )
    assert gemm.inputs[2:] == (["b"] if op == "Gemm" else [])


def test_gemm_fusion_keeps_alpha_beta_and_a_shared_transpose() -> None:
    nodes = _linear("Gemm", alpha=2.0, beta=0.5) + [_node("Relu", ["wt"], ["r"])]
    out, _ = rewrite(_graph(nodes, ["y", "r"], {**TYPES, "r": (3, 4)}), GEMM_TRANSPOSES)
    assert _ops(out) == ["Transpose", "Gemm", "Relu"]  # wt has another reader
    assert out.nodes[1].attrs == {"alpha": 2.0, "beta": 0.5, "transB": 1}


def test_gemm_fusion_leaves_other_forms() -> None:
    for nodes, types in (
        (_linear("Gemm", transA=1), TYPES),  # a transposed A: not today's pattern
        (_linear("Gemm", transB=1), TYPES),  # already transposed
        # a batched MatMul (x 3-D) stays a MatMul
        (_linear("MatMul"), {**TYPES, "x": (5, 2, 3), "y": (5, 2, 4)}),
    ):
        g = _graph(nodes, ["y"], types)
        out, report = rewrite(g, GEMM_TRANSPOSES)
        assert not report.fired and out.canonical().digest() == g.canonical().digest()


# -- traits -----------------------------------------------------------------------------
def test_channels_first_trait_is_the_channels_last_attribute() -> None:
    for schema in OPS.values():
        assert ("channels_first" in schema.traits) == ("channels_last" in schema.attrs), schema


def test_traits_of_nodes() -> None:
    assert is_random(Node("Dropout", ["x"], ["y"]))
    assert not is_random(Node("Dropout", ["x"], ["y"], domain="other"))
    assert "elementwise" in traits_of(Node("StopGradient", ["x"], ["y"], domain="tracelog"))
    assert "reduction" in traits_of(Node("ReduceProd", ["x"], ["y"]))
    assert traits_of(Node("NoSuchOp", [], ["y"])) == frozenset()


@pytest.mark.parametrize("axis, repeat", [(2, True), (1, False)])
def test_a_repeat_is_a_nearest_resize_and_a_tile_is_not(axis: int, repeat: bool) -> None:
    """x [3, 4] with a new axis, tiled by 2 there, merged to [3, 8]: a new axis
    after axis 1 repeats each element (np.repeat: one Resize); before it, it
    tiles the whole row (np.tile: left as it is). Checked on onnx.reference."""
    pytest.importorskip("onnx", reason="checked on onnx.reference")
    import numpy as np

    from tracelog.ir import ConstData
    from tracelog.passes.fusions import REPEATS
    from tracelog.verify import run_graph

    unsqueezed = (3, 4, 1) if axis == 2 else (3, 1, 4)
    tiled = (3, 4, 2) if axis == 2 else (3, 2, 4)
    reps = [1, 1, 2] if axis == 2 else [1, 2, 1]
    nodes = [
        _node("Unsqueeze", ["x", "axes"], ["u"]),
        _node("Tile", ["u", "reps"], ["t"]),
        _node("Reshape", ["t", "shape"], ["y"]),
    ]
    g = _graph(nodes, ["y"], {"x": (3, 4), "u": unsqueezed, "t": tiled, "y": (3, 8)})
    for name, data in (("axes", [axis]), ("reps", reps), ("shape", [3, 8])):
        g.values[name] = Value(
            name, TensorType("int64", (len(data),)), "const", const=ConstData(data=data)
        )
    done, report = rewrite(g, REPEATS)
    assert _ops(done) == (["Resize"] if repeat else ["Unsqueeze", "Tile", "Reshape"])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = np.repeat(x, 2, axis=1) if repeat else np.tile(x, (1, 2))
    np.testing.assert_array_equal(run_graph(done, {"x": x})["prediction"], want)


@pytest.mark.parametrize("back, fused", [([0, 2, 1], True), ([1, 0, 2], False)])
def test_softmax_between_inverse_transposes_is_a_softmax_over_that_axis(back, fused) -> None:
    pytest.importorskip("onnx", reason="checked on onnx.reference")
    import numpy as np

    from tracelog.passes.fusions import SOFTMAX_AXES
    from tracelog.verify import run_graph

    nodes = [
        _node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        _node("Softmax", ["t"], ["s"], axis=-1),
        _node("Transpose", ["s"], ["y"], perm=back),
    ]
    shape_y = (2, 5, 3) if fused else (3, 2, 5)
    g = _graph(nodes, ["y"], {"x": (2, 5, 3), "t": (2, 3, 5), "s": (2, 3, 5), "y": shape_y})
    done, _ = rewrite(g, SOFTMAX_AXES)
    assert _ops(done) == (["Softmax"] if fused else ["Transpose", "Softmax", "Transpose"])
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(
        run_graph(done, {"x": x})["prediction"], run_graph(g, {"x": x})["prediction"], rtol=1e-6
    )
