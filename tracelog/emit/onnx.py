"""IR -> ONNX ModelProto. The IR already speaks ONNX, so this is serialisation:
one node per IR node, tracelog-domain ops carried as ONNX functions."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from tracelog.errors import UnsupportedOpError
from tracelog.ir import Graph, Node, TensorType, Value
from tracelog.ops import (
    ONNX_IR_VERSION,
    ONNX_OPSET,
    TRACELOG_DOMAIN,
    TRACELOG_OPSET,
    is_random,
    schema_for,
)
from tracelog.sample import draw_key


def _onnx() -> ModuleType:
    """The onnx module, imported on use (an optional extra)."""
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "ONNX export needs the onnx package: pip install 'tracelog[onnx]'"
        ) from None
    return onnx


def np_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of an IR dtype; bfloat16, which numpy lacks, is ml_dtypes'."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def onnx_dtype(dtype: str) -> int:
    onnx = _onnx()
    if dtype == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(name: str, ty: TensorType) -> Any:
    onnx = _onnx()
    dims = [d if isinstance(d, int) else str(d) for d in ty.shape]
    return onnx.helper.make_tensor_value_info(name, onnx_dtype(ty.dtype), dims)


def const_array(v: Value, constants: dict[str, np.ndarray] | None) -> np.ndarray:
    """The content of a constant value, from inline data or the weights file."""
    assert v.const is not None
    if v.const.digest is not None:
        if constants is None or f"const/{v.const.digest}" not in constants:
            raise KeyError(f"constant {v.name} ({v.const.digest[:12]}) is not in the weights")
        return constants[f"const/{v.const.digest}"]
    shape = [int(d) for d in v.type.shape]
    return np.asarray(v.const.data, dtype=np_dtype(v.type.dtype)).reshape(shape)


def unsupported_nodes(graph: Graph) -> list[tuple[str, int, list[str]]]:
    """(source op, count, module paths) for each Unsupported node."""
    found: dict[str, tuple[int, list[str]]] = {}
    for n in graph.nodes:
        if n.domain == TRACELOG_DOMAIN and n.op == "Unsupported":
            key = str(n.attrs.get("source", "?"))
            count, mods = found.get(key, (0, []))
            if n.module not in mods:
                mods = mods + [n.module]
            found[key] = (count + 1, mods)
    return [(k, c, m) for k, (c, m) in sorted(found.items())]


def mask_type(graph: Graph, node: Node) -> TensorType:
    """The recorded draw of a random node: Dropout's mask, bool of its output's
    shape; a random draw's values, of its output's type."""
    out = graph.values[node.outputs[0]].type
    return TensorType("bool", out.shape) if node.op == "Dropout" else out


def mask_inputs(graph: Graph) -> list[tuple[str, TensorType]]:
    """The mask inputs of a graph replayed with its recorded masks: "mask.<k>"
    ("loss_mask.<k>" in a loss graph: tracelog.sample.draw_key) for the k-th
    random node (Dropout) in node order, a bool tensor of that node's output
    shape. Every place that declares the masks reads them here."""
    random = [n for n in graph.nodes if is_random(n)]
    return [(draw_key(graph.kind, k), mask_type(graph, n)) for k, n in enumerate(random)]


def graph_to_onnx(
    graph: Graph,
    *,
    name: str = "graph",
    constants: dict[str, np.ndarray] | None = None,
    replay_masks: bool = False,
    expose_all: bool = False,
    doc: str = "",
) -> Any:
    """An ONNX model for one IR graph. Data inputs, parameters and buffers are
    graph inputs; constants are initializers. With replay_masks, each training
    Dropout takes its mask from an input "mask.<k>" (k in node order; a loss
    graph's "loss_mask.<k>"), so a run reproduces the recorded batch exactly.
    With expose_all, every node output is a graph output too (for per-node
    comparison)."""
    onnx = _onnx()
    helper = onnx.helper
    missing = unsupported_nodes(graph)
    if missing:
        raise UnsupportedOpError("onnx", missing)

    inputs = [
        value_info(v.name, v.type)
        for v in graph.values.values()
        if v.kind in ("input", "param", "buffer")
    ]
    initializers = [
        onnx.numpy_helper.from_array(const_array(v, constants), v.name) for v in graph.constants
    ]
    nodes, functions, masks = _graph_nodes(graph, replay_masks)
    inputs += masks
    outputs = []
    for out in graph.outputs:
        vi = value_info(out.name, graph.values[out.name].type)
        vi.doc_string = out.role
        outputs.append(vi)
    produced = {o for n in graph.nodes for o in n.outputs if o}
    out_names = {o.name for o in graph.outputs}
    infos = [
        value_info(v.name, v.type)
        for v in graph.values.values()
        if v.kind == "node" and v.name in produced and v.name not in out_names
    ]
    if expose_all:
        outputs += infos
        infos = []
    g = helper.make_graph(
        nodes, name, inputs, outputs, initializer=initializers, value_info=infos, doc_string=doc
    )
    opsets = [helper.make_opsetid("", ONNX_OPSET)]
    if functions:
        opsets.append(helper.make_opsetid(TRACELOG_DOMAIN, TRACELOG_OPSET))
    model = helper.make_model(
        g,
        opset_imports=opsets,
        functions=[functions[k] for k in sorted(functions)],
        ir_version=ONNX_IR_VERSION,
        producer_name="tracelog",
    )
    return model


def _graph_nodes(
    graph: Graph,
    replay_masks: bool,
    start: int = 0,
    end: int | None = None,
    mask_base: int = 0,
) -> tuple[list[Any], dict[str, Any], list[Any]]:
    """NodeProtos for a graph's nodes (graph.nodes[start:end]), the
    FunctionProtos of the tracelog ops they use, and (with replay_masks) the
    value infos of the mask inputs, numbered from mask_base (named by the
    graph's kind: tracelog.sample.draw_key)."""
    onnx = _onnx()
    helper = onnx.helper
    nodes: list[Any] = []
    functions: dict[str, Any] = {}
    masks: list[Any] = []
    k = mask_base
    for i in range(start, len(graph.nodes) if end is None else end):
        node = graph.nodes[i]
        node_name = f"{node.module or 'root'}/{node.op}_{i}"
        doc_string = (
            f"{node.module} ({node.module_type}) <- {node.source}" if node.module else node.source
        )
        if replay_masks and is_random(node):
            mask_name = draw_key(graph.kind, k)
            k += 1
            masks.append(value_info(mask_name, mask_type(graph, node)))
            if node.op == "Dropout":
                nodes.extend(_replayed_dropout(node, mask_name, graph, node_name))
            else:  # the values the batch drew
                nodes.append(
                    helper.make_node("Identity", [mask_name], node.outputs, name=node_name)
                )
            continue
        given = schema_for(node.domain, node.op).explicit_attrs(node.attrs) if node.domain else {}
        attrs = {
            k: _attr(node.op, k, v, graph, node.outputs, node.domain)
            for k, v in (given or node.attrs).items()
        }
        inputs = list(node.inputs)
        if node.op == "Dropout" and len(inputs) > 1 and inputs[1]:
            inputs[1] = _float_ratio(inputs[1], graph, node_name, nodes)
        if node.domain == TRACELOG_DOMAIN and node.op == "Attention" and not node.inputs[3:4]:
            inputs = [*inputs[:3], _no_mask(graph.values[inputs[0]].type.dtype, node_name, nodes)]
        wide = _sums_wide(graph, node)
        if wide:  # summed in float64, cast back once (_sums_wide)
            nodes.append(helper.make_node("Cast", [inputs[0]], [wide[0]], to=DOUBLE, name=wide[0]))
            inputs[0] = wide[0]
        made = helper.make_node(
            node.op,
            inputs,
            [wide[1]] if wide else node.outputs,
            name=node_name,
            doc_string=doc_string,
            domain=node.domain or None,
            **attrs,
        )
        nodes.append(made)
        if wide:
            dtype = onnx_dtype(graph.values[node.outputs[0]].type.dtype)
            nodes.append(helper.make_node("Cast", [wide[1]], node.outputs, to=dtype, name=wide[1]))
        if node.domain == TRACELOG_DOMAIN and node.op not in functions:
            schema = schema_for(node.domain, node.op)
            if schema.function is None:
                raise UnsupportedOpError("onnx", [(node.qualified_op, 1, [node.module])])
            functions[node.op] = onnx.parser.parse_function(schema.function)
    return nodes, functions, masks


DOUBLE = 11  # onnx.TensorProto.DOUBLE
# onnxruntime's CPU ReduceSum and ReduceMean add in one running sum of the input's
# dtype: over 16384 float32 values 6x PyTorch's error (which sums in a cascade), over
# a column 16-56x; an MSE's mean over 262144 values read 131x, and the float32 check
# of a correct model failed. In float64, cast back once, the sum is within one
# rounding of exact.
_WIDE_SUMS = ("ReduceSum", "ReduceMean")


def _sums_wide(graph: Graph, node: Node) -> tuple[str, str] | None:
    """For a ReduceSum or ReduceMean of a float narrower than float64: the
    names of its input cast to float64 and of its float64 result (the node's
    output is that result cast back); None for any other node."""
    if node.domain or node.op not in _WIDE_SUMS or not node.inputs:
        return None
    if graph.values[node.inputs[0]].type.dtype not in ("float32", "float16", "bfloat16"):
        return None
    out = node.outputs[0]
    return f"{out}/float64_in", f"{out}/float64"


def _attr(op: str, key: str, value: Any, graph: Graph, outputs: list[str], domain: str = "") -> Any:
    onnx = _onnx()
    if domain == TRACELOG_DOMAIN and isinstance(value, float):
        # a float attribute is float32 by the standard; a tracelog op's function takes
        # its float parameters as double scalars (CastLike'd to its input), exact in a
        # float64 run of the model (the translation check)
        return onnx.numpy_helper.from_array(np.asarray(value, dtype=np.float64), key)
    if op == "Cast" and key == "to":
        return onnx_dtype(str(value))
    if op == "ConstantOfShape" and key == "value":
        dtype = graph.values[outputs[0]].type.dtype
        return onnx.numpy_helper.from_array(np.asarray([value], dtype=np.dtype(dtype)), "value")
    return value


def _float_ratio(ratio: str, graph: Graph, name: str, nodes: list[Any]) -> str:
    """Dropout's ratio as ONNX takes it (T1: float16, float, double): a
    bfloat16 ratio (autocast's dropout on bfloat16 data) cast to float32,
    which holds it exactly."""
    if graph.values[ratio].type.dtype != "bfloat16":
        return ratio
    helper = _onnx().helper
    cast = f"{name}/ratio"
    nodes.append(helper.make_node("Cast", [ratio], [cast], to=onnx_dtype("float32"), name=cast))
    return cast


def _no_mask(dtype: str, name: str, nodes: list[Any]) -> str:
    """Attention's absent mask as its ONNX function takes it: a scalar 0 of Q's dtype."""
    helper = _onnx().helper
    zero = f"{name}/no_mask"
    value = helper.make_tensor("zero", onnx_dtype(dtype), [], [0.0])
    nodes.append(helper.make_node("Constant", [], [zero], name=zero, value=value))
    return zero


def _replayed_dropout(node: Any, mask: str, graph: Graph, name: str) -> list[Any]:
    """Dropout as PyTorch computed it: x * (mask / (1 - ratio))."""
    helper = _onnx().helper
    x, ratio = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    dt = onnx_dtype(graph.values[y].type.dtype)
    p = f"{name}/"
    made = [
        helper.make_node("Cast", [mask], [p + "mask_f"], to=dt, name=p + "cast"),
        helper.make_node(
            "Constant",
            [],
            [p + "one"],
            name=p + "one",
            value=helper.make_tensor("one", dt, [], [1.0]),
        ),
        helper.make_node("Sub", [p + "one", ratio], [p + "keep"], name=p + "keep"),
        helper.make_node("Div", [p + "mask_f", p + "keep"], [p + "scale"], name=p + "scale"),
        helper.make_node("Mul", [x, p + "scale"], [y], name=p + "mul"),
    ]
    if len(node.outputs) > 1 and node.outputs[1]:
        made.append(helper.make_node("Identity", [mask], [node.outputs[1]], name=p + "mask"))
    return made
