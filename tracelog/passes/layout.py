"""NCHW -> NHWC for targets whose kernels want channels last (TensorFlow on CPU).

1. Each layout-sensitive 4-D op (Conv, pools, batch norm) is wrapped: a
   Transpose to NHWC before it, the op marked channels_last=1, a Transpose
   back to NCHW after it.
2. Transposes back to NCHW are pushed down through ops that do not care about
   layout (element-wise ops, reductions with constant axes), and a Transpose
   to NHWC that meets a Transpose back to NCHW cancels.
3. Dead nodes go.

What stays is reported: a transpose where NCHW data enters, and one where an
NHWC value leaves for an op that reads the layout (Reshape, Dropout, a graph
output). On a ResNet that is one in and one out, none inside the body.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from tracelog.ir import ConstData, Graph, Node, TensorType, Value

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]

# ops whose first input is NCHW data and which can run channels-last
LAYOUT_OPS = {
    ("", "Conv"),
    ("", "MaxPool"),
    ("", "AveragePool"),
    ("", "GlobalAveragePool"),
    ("", "BatchNormalization"),
    ("tracelog", "BatchNormTraining"),
}
# element-wise ops: a transpose of all their 4-D inputs commutes with them
ELEMENTWISE = {
    "Relu", "Tanh", "Sigmoid", "Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal", "Erf",
    "Softplus", "Identity", "LeakyRelu", "Gelu", "Clip", "Add", "Sub", "Mul", "Div", "Pow",
    "Max", "Min", "Where", "Cast",
}  # fmt: skip
REDUCTIONS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}


@dataclass
class LayoutReport:
    changed: bool = False  # some op now runs channels-last
    kept: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.kept:
            return "no transposes kept"
        return f"{len(self.kept)} transposes kept: " + "; ".join(self.kept)


def _permute(ty: TensorType, perm: list[int]) -> TensorType:
    return TensorType(ty.dtype, tuple(ty.shape[p] for p in perm))


class _Rewriter:
    def __init__(self, graph: Graph) -> None:
        self.g = copy.deepcopy(graph)

    def fresh(self, base: str, ty: TensorType) -> str:
        name, k = f"{base}_nhwc", 1
        while name in self.g.values:
            k += 1
            name = f"{base}_nhwc{k}"
        self.g.values[name] = Value(name, ty, "node")
        return name

    def transpose(self, src: str, perm: list[int], out: str | None, like: Node) -> tuple[Node, str]:
        ty = _permute(self.g.values[src].type, perm)
        if out is None:
            out = self.fresh(src, ty)
        node = Node(
            "Transpose",
            [src],
            [out],
            {"perm": list(perm)},
            module=like.module,
            module_type=like.module_type,
            source="layout pass",
        )
        return node, out

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.g.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {}
        for n in self.g.nodes:
            for i in n.inputs:
                uses.setdefault(i, []).append(n)
        return uses


def to_channels_last(graph: Graph) -> tuple[Graph, LayoutReport]:
    rw = _Rewriter(graph)
    g = rw.g
    if not any((n.domain, n.op) in LAYOUT_OPS and _rank(g, n.inputs[0]) == 4 for n in g.nodes):
        return g, LayoutReport()

    # 1. wrap each layout-sensitive op
    nodes: list[Node] = []
    for n in g.nodes:
        if (n.domain, n.op) not in LAYOUT_OPS or _rank(g, n.inputs[0]) != 4:
            nodes.append(n)
            continue
        t_in, x_nhwc = rw.transpose(n.inputs[0], TO_NHWC, None, n)
        y = n.outputs[0]
        y_nhwc = rw.fresh(y, _permute(g.values[y].type, TO_NHWC))
        op = copy.copy(n)
        op.inputs = [x_nhwc, *n.inputs[1:]]
        op.outputs = [y_nhwc, *n.outputs[1:]]
        op.attrs = {**n.attrs, "channels_last": 1}
        if n.op == "BatchNormTraining":
            op.attrs["axes"] = [0, 1, 2]
        t_out, _ = rw.transpose(y_nhwc, TO_NCHW, y, n)
        nodes += [t_in, op, t_out]
    g.nodes = nodes

    # 2. push NCHW-bound transposes down, cancel inverse pairs, to a fixed point
    changed = True
    while changed:
        changed = _cancel(rw) or _push(rw)
        _dead_code(g)
    report = _report(g)
    report.changed = True
    return g, report


def _rank(g: Graph, name: str) -> int:
    return len(g.values[name].type.shape) if name in g.values else -1


def _is_back(n: Node | None) -> bool:
    return n is not None and n.op == "Transpose" and list(n.attrs.get("perm", [])) == TO_NCHW


def _cancel(rw: _Rewriter) -> bool:
    """Transpose(TO_NHWC) of Transpose(TO_NCHW) of x is x."""
    prod = rw.producers()
    rename: dict[str, str] = {}
    for n in rw.g.nodes:
        if n.op == "Transpose" and list(n.attrs.get("perm", [])) == TO_NHWC:
            src = prod.get(n.inputs[0])
            if _is_back(src):
                rename[n.outputs[0]] = src.inputs[0]  # type: ignore[union-attr]
    if not rename:
        return False
    for n in rw.g.nodes:
        n.inputs = [rename.get(i, i) for i in n.inputs]
    return True


def _small_const(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    if v is None:
        return not name
    return v.kind in ("const", "param", "buffer", "input") and all(d == 1 for d in v.type.shape)


def _push(rw: _Rewriter) -> bool:
    """op(Transpose_back(a), Transpose_back(b)) -> Transpose_back(op(a, b)) for
    element-wise ops and for reductions over constant axes with keepdims."""
    g = rw.g
    prod = rw.producers()
    for idx, n in enumerate(g.nodes):
        if n.domain or not n.outputs or _rank(g, n.outputs[0]) != 4:
            continue
        if n.op in ELEMENTWISE:
            backs = [prod.get(i) for i in n.inputs]
            if not any(_is_back(b) for b in backs):
                continue
            if not all(
                _is_back(b) or _small_const(g, i) for b, i in zip(backs, n.inputs, strict=True)
            ):
                continue
            new_inputs = [b.inputs[0] if _is_back(b) else i for b, i in zip(backs, n.inputs, strict=True)]  # type: ignore[union-attr]
            attrs = dict(n.attrs)
        elif n.op in REDUCTIONS and int(n.attrs.get("keepdims", 1)) == 1 and len(n.inputs) == 2:
            back = prod.get(n.inputs[0])
            axes_v = g.values.get(n.inputs[1])
            if (
                not _is_back(back)
                or axes_v is None
                or axes_v.kind != "const"
                or axes_v.const is None
            ):
                continue
            if axes_v.const.data is None:
                continue
            axes = [int(a) % 4 for a in _flat(axes_v.const.data)]
            nhwc_axes = sorted(TO_NCHW[a] for a in axes)
            axes_name = rw.fresh(n.inputs[1], TensorType("int64", (len(nhwc_axes),)))
            g.values[axes_name].kind = "const"
            g.values[axes_name].const = ConstData(data=nhwc_axes)
            new_inputs = [back.inputs[0], axes_name]  # type: ignore[union-attr]
            attrs = dict(n.attrs)
        else:
            continue
        y = n.outputs[0]
        y_nhwc = rw.fresh(y, _permute(g.values[y].type, TO_NHWC))
        op = copy.copy(n)
        op.inputs, op.outputs, op.attrs = new_inputs, [y_nhwc], attrs
        t_out, _ = rw.transpose(y_nhwc, TO_NCHW, y, n)
        g.nodes[idx : idx + 1] = [op, t_out]
        return True
    return False


def _flat(data: object) -> list[object]:
    if isinstance(data, list):
        return [x for d in data for x in _flat(d)]
    return [data]


def _dead_code(g: Graph) -> None:
    live = {o.name for o in g.outputs}
    kept: list[Node] = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(i for i in n.inputs if i)
    g.nodes = list(reversed(kept))
    used = live | {o for n in g.nodes for o in n.outputs if o}
    g.values = {k: v for k, v in g.values.items() if k in used or v.kind != "node"}


def _report(after: Graph) -> LayoutReport:
    report = LayoutReport()
    uses: dict[str, list[Node]] = {}
    for n in after.nodes:
        for i in n.inputs:
            uses.setdefault(i, []).append(n)
    outputs = {o.name: o.role for o in after.outputs}
    for n in after.nodes:
        if n.op != "Transpose" or n.source != "layout pass":
            continue
        perm = list(n.attrs["perm"])
        src = after.values[n.inputs[0]]
        if perm == TO_NHWC:
            where = (
                f"data input {src.name} enters NCHW"
                if src.kind == "input"
                else f"into NHWC after {_producer_op(after, src.name)}"
            )
        else:
            readers = sorted(
                {f"{u.qualified_op} at {u.module or '<root>'}" for u in uses.get(n.outputs[0], [])}
            )
            if n.outputs[0] in outputs:
                readers.append(f"output {outputs[n.outputs[0]]}")
            where = "back to NCHW for " + ", ".join(readers)
        report.kept.append(where)
    return report


def _producer_op(g: Graph, name: str) -> str:
    for n in g.nodes:
        if name in n.outputs:
            return f"{n.qualified_op} at {n.module or '<root>'}"
    return name
