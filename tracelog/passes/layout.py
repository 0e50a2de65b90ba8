"""Layout passes: NCHW -> NHWC for targets whose kernels want channels last
(TensorFlow on CPU), and NHWC recordings (Keras) -> NCHW inside for PyTorch
and JAX. ``to_channels_last``:

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

Keras' 1-D layers run as ExpandDims + the 2-D op + Squeeze: a 4-D layout
transpose hops over the Unsqueeze/Squeeze and goes on as the 3-D one,
[0, 2, 1] (NWC <-> NCW). That permutation is its own inverse, so which way a
3-D transpose goes is remembered from the hop that made it; other 3-D
transposes (attention's) are never taken for layout ones.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import SupportsInt

from tracelog.ir import AttrValue, ConstData, Dim, Graph, Node, TensorType, Value
from tracelog.ops import traits_of

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]


def _has(n: Node, trait: str) -> bool:
    """Whether n's op has the schema trait (tracelog.ops.TRAITS): the pass's
    op classes come from the vocabulary, not from lists kept here."""
    return trait in traits_of(n)


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


def _layout_perm(direction: list[int], rank: int) -> list[int]:
    """The permutation of rank ``rank`` that moves channels the way the 4-D
    ``direction`` (TO_NHWC or TO_NCHW) does."""
    if direction == TO_NHWC:
        return [0, *range(2, rank), 1]
    return [0, rank - 1, *range(1, rank - 1)]


class _Rewriter:
    def __init__(self, graph: Graph, suffix: str) -> None:
        self.g = copy.deepcopy(graph)
        self.suffix = suffix  # names the values the pass makes, by their layout
        # the 3-D layout transposes the pass made: output name -> 4-D direction
        self.directions: dict[str, tuple[int, ...]] = {}

    def layout_rank(self, n: Node | None, direction: list[int]) -> int:
        """The rank of n's input where n is a layout transpose going the 4-D
        ``direction`` (4, or 3 for one a hop made); 0 otherwise."""
        if n is None or n.op != "Transpose" or "perm" not in n.attrs:
            return 0
        rank = _rank(self.g, n.inputs[0])
        if rank not in (3, 4) or n.ints_attr("perm") != _layout_perm(direction, rank):
            return 0
        if rank == 3 and self.directions.get(n.outputs[0]) != tuple(direction):
            return 0
        return rank

    def fresh(self, base: str, ty: TensorType) -> str:
        name, k = f"{base}_{self.suffix}", 1
        while name in self.g.values:
            k += 1
            name = f"{base}_{self.suffix}{k}"
        self.g.values[name] = Value(name, ty, "node")
        return name

    def transpose(
        self,
        src: str,
        perm: list[int],
        out: str | None,
        like: Node,
        direction: list[int] | None = None,
    ) -> tuple[Node, str]:
        ty = _permute(self.g.values[src].type, perm)
        if out is None:
            out = self.fresh(src, ty)
        if direction is not None and len(perm) == 3:
            self.directions[out] = tuple(direction)
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
    """For TensorFlow: layout-sensitive NCHW ops run NHWC, transposes sunk."""
    rw = _Rewriter(graph, "nhwc")
    g = rw.g
    if not any(_has(n, "channels_first") and _rank(g, n.inputs[0]) == 4 for n in g.nodes):
        return g, LayoutReport()

    # 1. wrap each layout-sensitive op
    nodes: list[Node] = []
    for n in g.nodes:
        if not _has(n, "channels_first") or _rank(g, n.inputs[0]) != 4:
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
    _sink(rw, TO_NCHW)
    report = _report(rw, into=TO_NHWC, back=TO_NCHW, source_layout="NCHW")
    report.changed = True
    return g, report


def to_channels_first(graph: Graph) -> tuple[Graph, LayoutReport]:
    """For PyTorch and JAX on a channels-last recording (Keras): the IR has each
    NCHW op between a transpose from NHWC and one back to it. The transposes
    back to NHWC are sunk and cancel against the next op's transpose in, so
    the data stays NCHW from where it enters to where it leaves (a flatten,
    an output)."""
    if not any(_is_perm(n, TO_NHWC) and _rank(graph, n.outputs[0]) == 4 for n in graph.nodes):
        return graph, LayoutReport()  # nothing to do: no copy (a GPT-2 graph's costs 25 ms)
    rw = _Rewriter(graph, "nchw")
    g = rw.g
    before = sum(1 for n in g.nodes if n.op == "Transpose")
    _sink(rw, TO_NHWC)
    report = _report(rw, into=TO_NCHW, back=TO_NHWC, source_layout="NHWC")
    report.changed = sum(1 for n in g.nodes if n.op == "Transpose") != before
    return g, report


def _sink(rw: _Rewriter, back: list[int]) -> None:
    changed = True
    while changed:
        changed = (
            _cancel(rw)
            or _push(rw, back)
            or _hoist(rw, _inverse(back))
            or _fold_reshapes(rw)
            or _share_transposes(rw)
        )
        _dead_code(rw.g)


def _share_transposes(rw: _Rewriter) -> bool:
    """Two Transposes of one value by one perm (an input feeding two convs):
    the second reads the first's result."""
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    outputs = {o.name for o in rw.g.outputs}
    rename: dict[str, str] = {}
    for n in rw.g.nodes:
        if n.op != "Transpose" or "perm" not in n.attrs or n.outputs[0] in outputs:
            continue
        key = (n.inputs[0], tuple(n.ints_attr("perm")))
        if key in seen:
            rename[n.outputs[0]] = seen[key]
        else:
            seen[key] = n.outputs[0]
    return _rename_inputs(rw.g, rename)


def _rename_inputs(g: Graph, rename: dict[str, str]) -> bool:
    """Point consumers at the new names; whether any input changed (what ends
    the passes' fixed-point loop)."""
    changed = False
    for n in g.nodes:
        new = [rename.get(i, i) for i in n.inputs]
        if new != n.inputs:
            n.inputs, changed = new, True
    return changed


def _fold_reshapes(rw: _Rewriter) -> bool:
    """A Reshape this pass made, of a Reshape/Squeeze/Unsqueeze: a reshape of
    the first one's input (row-major order is all any of them keeps). Folds
    Keras' bias path, reshape -> squeeze -> reshape, into one reshape."""
    prod = rw.producers()
    for n in rw.g.nodes:
        if n.op != "Reshape" or n.source != "layout pass":
            continue
        src = prod.get(n.inputs[0])
        if src is not None and _has(src, "reshape"):
            n.inputs = [src.inputs[0], *n.inputs[1:]]
            return True
    return False


def _rank(g: Graph, name: str) -> int:
    return len(g.values[name].type.shape) if name in g.values else -1


def _is_perm(n: Node | None, perm: list[int]) -> bool:
    return n is not None and n.op == "Transpose" and n.ints_attr("perm", []) == perm


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _cancel(rw: _Rewriter) -> bool:
    """Transpose(p2) of Transpose(p1) of x is x when p2 undoes p1."""
    prod = rw.producers()
    rename: dict[str, str] = {}
    for n in rw.g.nodes:
        if n.op != "Transpose" or "perm" not in n.attrs:
            continue
        src = prod.get(n.inputs[0])
        if src is None or src.op != "Transpose" or "perm" not in src.attrs:
            continue
        p1, p2 = src.ints_attr("perm"), n.ints_attr("perm")
        if len(p1) == len(p2) and all(p1[p2[i]] == i for i in range(len(p2))):
            rename[n.outputs[0]] = src.inputs[0]
    # consumers read x; a graph output keeps its name and so its transpose
    return _rename_inputs(rw.g, rename)


def _nearly_static(ty: TensorType) -> bool:
    """At most one dim is a symbol: a Reshape can make the shape, -1 there."""
    return sum(not isinstance(d, int) for d in ty.shape) <= 1


def _relaid_shape(ty: TensorType, back: list[int]) -> list[Dim] | None:
    """The shape b' of a broadcast operand b such that op(T(a), b) equals
    T(op(a, b')) for the transpose T = back, when a Reshape makes it (its
    non-1 dims keep their order; a batch-sized dropout mask too); None when
    it cannot."""
    rank = len(back)
    if not _nearly_static(ty) or len(ty.shape) > rank:
        return None
    e: list[Dim] = [*([1] * (rank - len(ty.shape))), *ty.shape]
    inv = _inverse(back)
    order = [inv[j] for j in range(rank) if e[inv[j]] != 1]
    if order != sorted(order):
        return None
    return [e[inv[j]] for j in range(rank)]


def _const(rw: _Rewriter, base: str, data: list[int]) -> str:
    name = rw.fresh(base, TensorType("int64", (len(data),)))
    rw.g.values[name].kind = "const"
    rw.g.values[name].const = ConstData(data=list(data))
    return name


def _const_ints(g: Graph, name: str) -> list[int] | None:
    v = g.values.get(name)
    if v is None or v.kind != "const" or v.const is None or v.const.data is None:
        return None
    return _flat_ints(v.const.data)


def _relay_operand(
    rw: _Rewriter, n: Node, name: str, untransposed: str | None, back: list[int], pre: list[Node]
) -> str:
    """An element-wise op's input once the op runs before T: the transpose's
    input, the operand itself where it broadcasts alike in both layouts, or a
    Reshape of it (appended to ``pre``); ``_can_relay`` said it can."""
    if untransposed is not None:
        return untransposed
    ty = rw.g.values[name].type if name in rw.g.values else None
    if ty is None or all(d == 1 for d in ty.shape):
        return name  # an omitted input, a scalar or all-ones: the same in any layout
    shape = _relaid_shape(ty, back)
    assert shape is not None
    out = rw.fresh(name, TensorType(ty.dtype, tuple(shape)))
    reshape = Node(
        "Reshape",
        [name, _const(rw, name + "_shape", [d if isinstance(d, int) else -1 for d in shape])],
        [out],
        {},
        module=n.module,
        module_type=n.module_type,
        source="layout pass",
    )
    pre.append(reshape)
    return out


def _can_relay(g: Graph, name: str, back: list[int]) -> bool:
    ty = g.values[name].type if name in g.values else None
    return ty is None or all(d == 1 for d in ty.shape) or _relaid_shape(ty, back) is not None


@dataclass
class _Pushed:
    """An op rewritten to run before the transpose T: what it reads, its
    attributes, whether T follows it (not after a reduction that drops the
    axes T moves), and the Reshapes that re-lay its broadcast operands."""

    inputs: list[str]
    attrs: dict[str, AttrValue]
    transpose_out: bool = True
    pre: list[Node] = field(default_factory=list)
    out_perm: list[int] | None = None  # T's perm after op', where op' changes the rank


def _push(rw: _Rewriter, back: list[int]) -> bool:
    """op(T(a), ...) -> T(op'(a, ...)) for the transpose T = back: element-wise
    ops (broadcast operands re-laid by a Reshape), reductions and Squeeze over
    constant axes, Concat, constant Pad, Slice of constant axes, Resize over
    listed axes, Softmax."""
    g = rw.g
    prod = rw.producers()
    for idx, n in enumerate(g.nodes):
        if not n.outputs or not n.inputs:
            continue
        # per input: the rank and input of the transpose T that made it, or (0, None)
        found = [_untransposed(rw, prod.get(i), back) for i in n.inputs]
        ranks = {r for r, _ in found if r}
        if len(ranks) != 1 or (not found[0][0] and not _has(n, "elementwise")):
            continue
        rank = ranks.pop()
        untransposed = [u if r == rank else None for r, u in found]
        pushed = _pushed(rw, n, untransposed, _layout_perm(back, rank))
        if pushed is None:
            continue
        g.nodes[idx : idx + 1] = _before_transpose(rw, n, pushed, back)
        return True
    return False


def _hoist(rw: _Rewriter, into: list[int]) -> bool:
    """T(op(x, ...)) -> op'(T(x), ...) for the transpose T = into, where T is
    op's only reader: the transpose into the other layout moves up toward
    where the data enters (Rescaling's element-wise ops before a Conv, a
    Resize over listed axes), and cancels or stays there."""
    g = rw.g
    prod, uses = rw.producers(), rw.consumers()
    outputs = {o.name for o in g.outputs}
    for t in g.nodes:
        if not rw.layout_rank(t, into):
            continue
        n = prod.get(t.inputs[0])
        if n is None or n.outputs[0] in outputs or len(uses.get(n.outputs[0], [])) != 1:
            continue
        hoisted = _hoisted(rw, n, t, into)
        if hoisted is None:
            continue
        at = next(k for k, m in enumerate(g.nodes) if m is n)
        g.nodes[at : at + 1] = hoisted
        g.nodes.remove(t)
        return True
    return False


def _hoisted(rw: _Rewriter, n: Node, t: Node, into: list[int]) -> list[Node] | None:
    """The nodes that compute t's output with the transpose before n: an
    element-wise op with one 4-D input that is not a constant (the others
    re-laid by a Reshape), or a Resize over listed axes; None otherwise."""
    g = rw.g
    if len(n.outputs) != 1:
        return None
    rank = _rank(g, t.inputs[0])
    perm = _layout_perm(into, rank)
    relay = _inverse(perm)  # op(T^-1(c), b) = T^-1(op(c, b')): b' laid out as T's output
    if _has(n, "elementwise") and _rank(g, n.outputs[0]) == rank:
        data = [i for i in n.inputs if _rank(g, i) == rank and g.values[i].kind != "const"]
        if len(data) != 1 or not all(_can_relay(g, i, relay) for i in n.inputs if i not in data):
            return None
        t_in, moved = rw.transpose(data[0], perm, None, n, into)
        pre: list[Node] = [t_in]
        inputs = [
            moved if i in data else _relay_operand(rw, n, i, None, relay, pre) for i in n.inputs
        ]
        attrs = dict(n.attrs)
    elif not n.domain and n.op == "Resize" and "axes" in n.attrs and n.inputs[1:2] in ([], [""]):
        # axis a of x is axis relay[a] of T(x) (scales/sizes stay paired)
        axes = [relay[a % rank] for a in n.ints_attr("axes")]
        if axes != sorted(axes):
            return None
        t_in, moved = rw.transpose(n.inputs[0], perm, None, n, into)
        pre, inputs, attrs = [t_in], [moved, *n.inputs[1:]], {**n.attrs, "axes": axes}
    elif not n.domain and n.op == "Unsqueeze" and rank == 4 and len(n.inputs) == 2:
        # T(Unsqueeze(x, a)) = Unsqueeze(T3(x), k): the 3-D layout transpose, then
        # the size-1 axis inserted where T put axis a
        inserted = _const_ints(g, n.inputs[1])
        if inserted is None or len(inserted) != 1 or _rank(g, n.inputs[0]) != 3:
            return None
        a = inserted[0] % 4
        q = [p - (p > a) for p in perm if p != a]
        if q != _layout_perm(into, 3):
            return None
        t_in, moved = rw.transpose(n.inputs[0], q, None, n, into)
        k = _const(rw, n.inputs[1], [perm.index(a)])
        pre, inputs, attrs = [t_in], [moved, k], dict(n.attrs)
    elif not n.domain and n.op == "Reshape" and len(n.inputs) == 2:
        # T(Reshape(x, s)) = Reshape(x, T(s)) where T moves only unit dims
        # past the others (squeeze-excite's [batch, 1, 1, C] -> [batch, C, 1, 1]):
        # the values' order is the same, so no transpose is left
        shape = _const_ints(g, n.inputs[1])
        out = g.values[n.outputs[0]].type.shape
        if shape is None or len(shape) != rank:
            return None
        order = [p for p in perm if out[p] != 1]  # by position: dims may be equal in size
        if order != sorted(order):
            return None
        relaid = _const(rw, n.inputs[1], [shape[p] for p in perm])
        pre, inputs, attrs = [], [n.inputs[0], relaid], dict(n.attrs)
    else:
        return None
    op = copy.copy(n)
    op.inputs, op.attrs, op.outputs = inputs, attrs, [t.outputs[0]]
    return [*pre, op]


def _untransposed(rw: _Rewriter, src: Node | None, back: list[int]) -> tuple[int, str | None]:
    """The rank and input of the layout transpose going ``back`` that is src
    (a value's producer); (0, None) when something else made the value."""
    rank = rw.layout_rank(src, back)
    return (rank, src.inputs[0]) if rank and src is not None else (0, None)


def _pushed(
    rw: _Rewriter, n: Node, untransposed: list[str | None], back: list[int]
) -> _Pushed | None:
    """n rewritten to run before T, by the kind of op; None where it cannot."""
    g = rw.g
    by_name = "" if n.domain else n.op
    first = untransposed[0] if untransposed[0] is not None else ""
    rank = len(back)
    if _has(n, "elementwise") and _rank(g, n.outputs[0]) == rank:
        return _push_elementwise(rw, n, untransposed, back)
    if _has(n, "reduction") and len(n.inputs) == 2 and (axes := _const_ints(g, n.inputs[1])):
        return _push_reduction(rw, n, first, axes, back)
    if by_name == "Squeeze" and len(n.inputs) == 2 and (axes := _const_ints(g, n.inputs[1])):
        return _push_squeeze(rw, n, first, axes, back)
    if by_name == "Concat" and None not in untransposed:
        inputs = [u for u in untransposed if u is not None]
        return _Pushed(inputs, {**n.attrs, "axis": back[n.int_attr("axis") % rank]})
    if by_name == "Pad" and len(n.inputs) >= 2 and (pads := _const_ints(g, n.inputs[1])):
        return _push_pad(rw, n, first, pads, back)
    if by_name == "Slice" and len(n.inputs) >= 3:
        # slicing axis a of T(x) is slicing axis back[a] of x
        axes = _slice_axes(g, n)
        if axes is None:
            return None
        new_axes = _const(rw, n.inputs[1] + "_axes", [back[a % rank] for a in axes])
        return _Pushed([first, n.inputs[1], n.inputs[2], new_axes, *n.inputs[4:]], dict(n.attrs))
    if by_name in ("Softmax", "LogSoftmax") and len(n.inputs) == 1:
        # over axis a of T(x) is over axis back[a] of x
        return _Pushed([first], {**n.attrs, "axis": back[n.int_attr("axis", -1) % rank]})
    if by_name == "Resize" and "axes" in n.attrs and not (len(n.inputs) > 1 and n.inputs[1]):
        # resizing axis a of T(x) is resizing axis back[a] of x (scales/sizes stay paired)
        axes = [back[a % rank] for a in n.ints_attr("axes")]
        return _Pushed([first, *n.inputs[1:]], {**n.attrs, "axes": axes})
    return None


def _slice_axes(g: Graph, n: Node) -> list[int] | None:
    """A Slice's constant axes (all of starts' when omitted); None when not constant."""
    if len(n.inputs) > 3 and n.inputs[3]:
        return _const_ints(g, n.inputs[3])
    starts = _const_ints(g, n.inputs[1])
    return None if starts is None else list(range(len(starts)))


def _push_elementwise(
    rw: _Rewriter, n: Node, untransposed: list[str | None], back: list[int]
) -> _Pushed | None:
    """Each operand: the transpose's input, or itself re-laid for the new layout."""
    moves = list(zip(n.inputs, untransposed, strict=True))
    if not all(u is not None or _can_relay(rw.g, i, back) for i, u in moves):
        return None
    pre: list[Node] = []
    inputs = [_relay_operand(rw, n, i, u, back, pre) for i, u in moves]
    return _Pushed(inputs, dict(n.attrs), pre=pre)


def _push_reduction(
    rw: _Rewriter, n: Node, first: str, axes: list[int], back: list[int]
) -> _Pushed | None:
    """A reduction over the permuted axes; with keepdims=0 no transpose
    follows, so the kept axes must stay in order."""
    rank = len(back)
    axes = [a % rank for a in axes]
    new_axes = sorted(back[a] for a in axes)
    transpose_out = True
    if n.int_attr("keepdims", 1) == 0:
        kept = [back[i] for i in range(rank) if i not in axes]
        if kept != sorted(kept):
            return None
        transpose_out = False
    return _Pushed([first, _const(rw, n.inputs[1], new_axes)], dict(n.attrs), transpose_out)


def _push_squeeze(
    rw: _Rewriter, n: Node, first: str, axes: list[int], back: list[int]
) -> _Pushed | None:
    """A Squeeze of the permuted axes; where the axes left are out of order
    (a 1-D layer's Squeeze after its 2-D op), the 3-D layout transpose of
    them follows."""
    rank = len(back)
    axes = [a % rank for a in axes]
    kept = [back[i] for i in range(rank) if i not in axes]
    new_axes = _const(rw, n.inputs[1], sorted(back[a] for a in axes))
    if kept == sorted(kept):
        return _Pushed([first, new_axes], dict(n.attrs), transpose_out=False)
    out_perm = [sorted(kept).index(k) for k in kept]
    if rank != 4 or out_perm != _layout_perm(back, 3):
        return None
    return _Pushed([first, new_axes], dict(n.attrs), out_perm=out_perm)


def _push_pad(
    rw: _Rewriter, n: Node, first: str, pads: list[int], back: list[int]
) -> _Pushed | None:
    """A constant Pad with its pads permuted."""
    rank = len(back)
    if len(pads) != 2 * rank or len(n.inputs) > 3:
        return None
    new_pads = [0] * 2 * rank
    for i in range(rank):
        new_pads[back[i]], new_pads[rank + back[i]] = pads[i], pads[rank + i]
    return _Pushed([first, _const(rw, n.inputs[1], new_pads), *n.inputs[2:]], dict(n.attrs))


def _before_transpose(rw: _Rewriter, n: Node, pushed: _Pushed, direction: list[int]) -> list[Node]:
    """The nodes that replace n: the Reshapes, op', and T of op''s output
    under n's output name (unless the op drops T)."""
    op = copy.copy(n)
    op.inputs, op.attrs = pushed.inputs, pushed.attrs
    if not pushed.transpose_out:
        return [*pushed.pre, op]
    y = n.outputs[0]
    perm = pushed.out_perm or _layout_perm(direction, _rank(rw.g, y))
    y_new = rw.fresh(y, _permute(rw.g.values[y].type, _inverse(perm)))
    op.outputs = [y_new, *n.outputs[1:]]
    t_out, _ = rw.transpose(y_new, perm, y, n, direction)
    return [*pushed.pre, op, t_out]


def _flat_ints(data: object) -> list[int]:
    """A constant's nested list of numbers, flattened, as ints."""
    if isinstance(data, list):
        return [x for d in data for x in _flat_ints(d)]
    if not isinstance(data, SupportsInt):
        raise TypeError(f"a constant holds {data!r}, not a number")
    return [int(data)]


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


def _report(rw: _Rewriter, into: list[int], back: list[int], source_layout: str) -> LayoutReport:
    """The layout transposes left, and why: data entering in the source layout,
    or a value going back to it for an op that reads the layout."""
    after = rw.g
    other = "NHWC" if source_layout == "NCHW" else "NCHW"
    report = LayoutReport()
    uses: dict[str, list[Node]] = {}
    for n in after.nodes:
        for i in n.inputs:
            uses.setdefault(i, []).append(n)
    outputs = {o.name: o.role for o in after.outputs}
    for n in after.nodes:
        src = after.values[n.inputs[0]] if n.inputs and n.inputs[0] in after.values else None
        if src is None:
            continue
        if rw.layout_rank(n, into):
            where = (
                f"data input {src.name} enters {source_layout}"
                if src.kind == "input"
                else f"into {other} after {_producer_op(after, src.name)}"
            )
        elif rw.layout_rank(n, back):
            readers = sorted(
                {f"{u.qualified_op} at {u.module or '<root>'}" for u in uses.get(n.outputs[0], [])}
            )
            if n.outputs[0] in outputs:
                readers.append(f"output {outputs[n.outputs[0]]}")
            where = f"back to {source_layout} for " + ", ".join(readers)
        else:
            continue
        report.kept.append(where)
    return report


def _producer_op(g: Graph, name: str) -> str:
    for n in g.nodes:
        if name in n.outputs:
            return f"{n.qualified_op} at {n.module or '<root>'}"
    return name
