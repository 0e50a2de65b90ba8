"""Aten rules for attention, masks and indexing (issue 12): what Hugging Face
GPT-2, BERT, Llama and ViT and torch.nn's TransformerEncoder and
MultiheadAttention record, written as ONNX-semantics IR. Registered into the
one aten table (``rules.ATEN``) when that module is imported.

What the CPU dispatcher shows for ``F.scaled_dot_product_attention`` (torch
2.13): the fused kernel ``_scaled_dot_product_flash_attention_for_cpu`` runs
only with ``dropout_p == 0`` (it refuses dropout), and is recorded as one
``tracelog.Attention`` node (issue 15), which each target runs as its own
attention kernel or writes out. With ``dropout_p > 0`` the math path runs instead, and its aten ops are recorded one by one: the scaled
``bmm``, the mask ``add``, ``_safe_softmax``, the usual dropout
(``empty_like``/``bernoulli_``/``div_``/``mul``, recorded as Dropout with its
mask, so the sample replays the attention-weight mask), the second ``bmm``.
The CUDA kernels (efficient, flash, cuDNN) draw their dropout mask inside the
kernel from a philox state: no mask tensor exists to record, so those kernels
with ``dropout_p > 0`` are NotSupported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from tracelog.adapters.builder import UNINITIALISED, Converter, Ctx, NotSupported
from tracelog.adapters.tape import TArg
from tracelog.adapters.torch.batch_dims import iterated
from tracelog.adapters.torch.rules import (
    ATEN,
    INT64_MAX,
    Names,
    _operand,
    _unary_rule,
    _where,
    random_like,
)
from tracelog.adapters.torch.tensors import TORCH_DTYPES, dtype_name
from tracelog.ir import BATCH, Dim, TensorType, dim_mul, format_dim, is_symbolic, parse_dim
from tracelog.ops import TRACELOG_DOMAIN

_NEG_INF = float("-inf")


# -- helpers -----------------------------------------------------------------------------
def _promoted(a: Any, b: Any) -> str:
    """The dtype torch computes a binary op of a and b in: its type promotion,
    where a 0-dim tensor or a Python scalar does not widen a tensor of its own
    category (int64 tensor == 0.5 compares in float32, not in int64)."""

    def proto(x: Any) -> Any:
        if isinstance(x, TArg):
            shape = [1] * len(x.shape)
            return torch.empty(shape, dtype=TORCH_DTYPES[x.dtype], device="meta")
        if isinstance(x, (bool, int, float)):
            return x
        raise NotSupported(f"an operand of type {type(x).__name__}")

    pa, pb = proto(a), proto(b)
    if not isinstance(pa, torch.Tensor) and not isinstance(pb, torch.Tensor):
        raise NotSupported("a comparison of two Python scalars")
    return dtype_name(torch.result_type(pa, pb))


def _chain(ctx: Ctx, steps: Sequence[tuple[str, dict[str, Any]]], inputs: list[str]) -> Names:
    """Ops applied in turn to a bool result, the last giving the record's
    output: the comparison, then Not (ne), then Cast (an in-place op keeps
    its tensor's dtype)."""
    out = ctx.out_type()
    cur = inputs
    for op, attrs in steps[:-1]:
        cur = [ctx.helper(op, cur, TensorType("bool", out.shape), **attrs)]
    op, attrs = steps[-1]
    return ctx.one(op, cur, **attrs)


def _as_bool_result(ctx: Ctx, op: str, inputs: list[str], negate: bool = False) -> Names:
    out = ctx.out_type()
    steps: list[tuple[str, dict[str, Any]]] = [(op, {})]
    if negate:
        steps.append(("Not", {}))
    if out.dtype != "bool":
        steps.append(("Cast", {"to": out.dtype}))
    return _chain(ctx, steps, inputs)


def _to_bool(ctx: Ctx, i: int, name: str) -> str:
    """Tensor operand i as bool (nonzero is true), as torch's logical ops read it."""
    a = ctx.arg(i, name)
    if not isinstance(a, TArg):
        return ctx.const(bool(a), "bool")
    n = ctx.t(i, name)
    if a.dtype == "bool":
        return n
    return ctx.helper("Cast", [n], TensorType("bool", a.shape), to="bool")


def _broadcast(ctx: Ctx, shapes: Sequence[Sequence[Dim]]) -> tuple[Dim, ...]:
    """The broadcast of shapes whose dims may be batch symbols (a symbol and
    the batch size as an int are one dim: the symbol is kept)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for k in range(rank):
        dims = sorted(
            {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0} - {1},
            key=lambda d: (not is_symbolic(d), str(d)),
        )
        if any(not _same_dim(ctx, dims[0], d) for d in dims[1:]):
            raise NotSupported(f"index shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(dims[0] if dims else 1)
    return tuple(out)


def _same_dim(ctx: Ctx, a: Dim, b: Dim) -> bool:
    """Whether two dims are equal in this batch: a batch-sized dim matches the
    batch size as an int (an index built with arange(batch) is a constant)."""
    if a == b:
        return True
    n = ctx.batch
    if n is None or is_symbolic(a) == is_symbolic(b):
        return False
    sym, size = (a, b) if is_symbolic(a) else (b, a)
    poly = parse_dim(sym)
    return set(poly) == {(BATCH,)} and poly[(BATCH,)] * n == size


def _shape_vector(ctx: Ctx, dims: Sequence[Dim]) -> str:
    """An int64 shape tensor for dims: constant when every dim is a size,
    computed from the data input's shape for batch-derived dims."""
    if not any(map(is_symbolic, dims)):
        return ctx.ints([int(d) for d in dims])
    try:
        return ctx.dynamic_shape(list(dims))
    except ValueError:  # a symbol other than batch*k: nothing here computes it
        raise NotSupported(f"a shape {list(dims)} the graph cannot compute") from None


def _iota(ctx: Ctx, size: str, n: Dim, dtype: str) -> str:
    """0, 1, ..., n - 1 for a size the graph computes (``size``: int64 [1]):
    CumSum of ones, which every target writes with a static shape (JAX's
    jnp.arange wants its bound concrete under jit; a computed shape is)."""
    ty = TensorType(dtype, (n,))
    ones = ctx.helper("ConstantOfShape", [size], ty, value=1)
    counts = ctx.helper("CumSum", [ones, ctx.const(0, "int64")], ty)
    return ctx.helper("Sub", [counts, ctx.const(1, dtype)], ty)


def _const_of(ctx: Ctx, name: str) -> np.ndarray | None:
    """The value of a constant IR value, else None."""
    v = ctx.b.values.get(name)
    if v is None or v.kind != "const" or v.const is None:
        return None
    if v.const.digest is not None:
        return ctx.b.constants.get(v.const.digest)
    return np.asarray(v.const.data)


# reading through these keeps every element of the input among the output's
_VALUE_PRESERVING = (
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Expand",
    "Identity",
    "Transpose",
    "Tile",
    "StopGradient",
)


# ops whose output is non-negative where every input is (position + past length)
_SIGN_PRESERVING = ("Add", "Mul", "Max", "Min", "Concat")


def _known_nonnegative(ctx: Ctx, name: str) -> bool:
    """Whether an index is built from constants with no negative entry
    (through reshapes, sums, ...): then it needs no wrapping (the arange-built
    indices of Hugging Face's masks)."""
    producer = {o: n for n in ctx.b.nodes for o in n.outputs if o}

    def nonnegative(value: str, depth: int) -> bool:
        const = _const_of(ctx, value)
        if const is not None:
            return bool(np.all(const >= 0))
        node = producer.get(value)
        if node is None or depth > 32:
            return False
        if node.op in _VALUE_PRESERVING:
            return nonnegative(node.inputs[0], depth + 1)
        if node.op in _SIGN_PRESERVING:
            return all(nonnegative(i, depth + 1) for i in node.inputs)
        return False

    return nonnegative(name, 0)


def _dim_scalar(ctx: Ctx, d: Dim) -> str:
    """A dim's size as an int64 scalar: a constant, or computed from the data."""
    if not is_symbolic(d):
        return ctx.const(int(d), "int64")
    return ctx.helper("Squeeze", [ctx.b_dim(d), ctx.ints([0])], TensorType("int64", ()))


def _dim_size(ctx: Ctx, x: str, shape: Sequence[Dim], d: int) -> str:
    """The size of dim d of x as an int64 scalar: a constant, or read from
    x's shape for a batch-sized dim."""
    size = shape[d]
    if not is_symbolic(size):
        return ctx.const(int(size), "int64")
    vec = ctx.helper("Shape", [x], TensorType("int64", (1,)), start=d, end=d + 1)
    return ctx.helper("Squeeze", [vec, ctx.ints([0])], TensorType("int64", ()))


def _wrapped(ctx: Ctx, idx: str, ty: TensorType, x: str, shape: Sequence[Dim], d: int) -> str:
    """An int64 index into dim d with negative entries counted from the end
    (Mod by the size: torch indexes so; tf.gather refuses negatives)."""
    if ty.dtype != "int64":
        idx = ctx.helper("Cast", [idx], TensorType("int64", ty.shape), to="int64")
    if _known_nonnegative(ctx, idx):
        return idx
    return ctx.helper("Mod", [idx, _dim_size(ctx, x, shape, d)], TensorType("int64", ty.shape))


# -- comparisons: every overload, after torch's type promotion ------------------------------
_COMPARE = {
    "eq": ("Equal", False),
    "ne": ("Equal", True),
    "lt": ("Less", False),
    "le": ("LessOrEqual", False),
    "gt": ("Greater", False),
    "ge": ("GreaterOrEqual", False),
}


def _compare_rule(op: str, negate: bool) -> Converter:
    def rule(ctx: Ctx) -> Names:
        dt = _promoted(ctx.arg(0, "self"), ctx.arg(1, "other"))
        ins = [_operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)]
        return _as_bool_result(ctx, op, ins, negate)

    return rule


for _aten, (_op, _negate) in _COMPARE.items():
    ATEN.update_from(
        [f"aten.{_aten}{inplace}.{kind}" for inplace in ("", "_") for kind in ("Tensor", "Scalar")],
        _compare_rule(_op, _negate),
    )


# -- boolean and bitwise ops ------------------------------------------------------------------
_BITWISE = {"and": ("And", "BitwiseAnd"), "or": ("Or", "BitwiseOr"), "xor": ("Xor", "BitwiseXor")}


def _bitwise_rule(logical: str, bitwise: str) -> Converter:
    """bitwise_and and friends: the logical op on bool, the bitwise op on integers."""

    def rule(ctx: Ctx) -> Names:
        dt = ctx.out_type().dtype
        if dt.startswith("float") or dt == "bfloat16":
            raise NotSupported(f"a bitwise op on {dt}")
        ins = [_operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)]
        return ctx.one(logical if dt == "bool" else bitwise, ins)

    return rule


def _logical_rule(op: str) -> Converter:
    """logical_and and friends: operands read as bool, the result bool (or the
    in-place tensor's own dtype)."""

    def rule(ctx: Ctx) -> Names:
        return _as_bool_result(ctx, op, [_to_bool(ctx, 0, "self"), _to_bool(ctx, 1, "other")])

    return rule


for _name, (_logical, _bitwise) in _BITWISE.items():
    ATEN.update_from(
        [
            f"aten.bitwise_{_name}{inplace}.{kind}"
            for inplace in ("", "_")
            for kind in ("Tensor", "Scalar")
        ],
        _bitwise_rule(_logical, _bitwise),
    )
    ATEN.update_from(
        [f"aten.logical_{_name}.default", f"aten.logical_{_name}_.default"],
        _logical_rule(_logical),
    )


@ATEN.register("aten.bitwise_not.default", "aten.bitwise_not_.default")
def _bitwise_not(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Not" if dt == "bool" else "BitwiseNot", [ctx.t(0)])


@ATEN.register("aten.logical_not.default", "aten.logical_not_.default")
def _logical_not(ctx: Ctx) -> Names:
    return _as_bool_result(ctx, "Not", [_to_bool(ctx, 0, "self")])


# -- where and masked_fill ---------------------------------------------------------------------
ATEN.update_from(["aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar"], _where)


@ATEN.register("aten.masked_fill.Tensor", "aten.masked_fill_.Tensor")
def _masked_fill_tensor(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Where", [ctx.t(1), _operand(ctx, 2, "value", dt), ctx.t(0)])


# -- element-wise ------------------------------------------------------------------------------
for _aten, _op in {"sin": "Sin", "cos": "Cos"}.items():
    ATEN.update_from([f"aten.{_aten}.default", f"aten.{_aten}_.default"], _unary_rule(_op))

# remainder: rules_math.py, with fmod and the rounding divisions


# -- factories ------------------------------------------------------------------------------------
def _arange_bounds(ctx: Ctx) -> tuple[Any, Any, Any]:
    overload = ctx.rec.op.rsplit(".", 1)[1]
    if overload == "default":
        return 0, ctx.arg(0, "end"), 1
    if overload == "start":
        return ctx.arg(0, "start"), ctx.arg(1, "end"), 1
    return ctx.arg(0, "start"), ctx.arg(1, "end"), ctx.arg(2, "step", 1)


@ATEN.register("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx: Ctx) -> Names:
    start, _end, step = _arange_bounds(ctx)
    if not all(isinstance(b, (int, float)) for b in (start, step)):
        raise NotSupported("arange with tensor bounds")
    out = ctx.out_type()
    (n,) = out.shape
    if not is_symbolic(n):
        # torch computes start + i * step in double, then rounds to the dtype
        idx = np.arange(int(n), dtype=np.int64)
        exact = out.dtype.startswith(("int", "uint")) and isinstance(start + step, int)
        values = start + step * idx if exact else start + step * idx.astype(np.float64)
        return [ctx.const(np.asarray(values).astype(out.dtype), out.dtype)]
    # a batch-sized length (the end was the batch size): its bound is computed
    y = _iota(ctx, _shape_vector(ctx, [n]), n, out.dtype)
    if step != 1:
        y = ctx.helper("Mul", [y, ctx.const(step, out.dtype)], out)
    if start != 0:
        y = ctx.helper("Add", [y, ctx.const(start, out.dtype)], out)
    return [y]


@ATEN.register("aten.eye.default", "aten.eye.m")
def _eye(ctx: Ctx) -> Names:
    """eye(n[, m]): a constant; over a sequence-long size (XLNet's
    -eye(qlen) beside its attention mask) row index == column index, the
    indices counted up to sizes the graph computes."""
    out = ctx.out_type()
    rows, cols = out.shape
    if not is_symbolic(rows) and not is_symbolic(cols):
        return [ctx.const(np.eye(int(rows), int(cols), dtype=np.dtype(out.dtype)), out.dtype)]
    i = _iota(ctx, _shape_vector(ctx, [rows]), rows, "int64")
    j = _iota(ctx, _shape_vector(ctx, [cols]), cols, "int64")
    i = ctx.helper("Unsqueeze", [i, ctx.ints([1])], TensorType("int64", (rows, 1)))
    j = ctx.helper("Unsqueeze", [j, ctx.ints([0])], TensorType("int64", (1, cols)))
    if out.dtype == "bool":
        return ctx.one("Equal", [i, j])
    same = ctx.helper("Equal", [i, j], TensorType("bool", out.shape))
    return ctx.one("Cast", [same], to=out.dtype)


@ATEN.register("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(ctx: Ctx) -> Names:
    """x.diagonal(offset, dim1, dim2) (torch.diag of a matrix, a similarity
    matrix's positives): dim1 and dim2 moved last, each row's element on the
    diagonal kept (_on_diagonal) and summed over the columns, the rows with no
    such element sliced off (to a length that is a number: [batch, 4] has 4)."""
    xt, out = ctx.in_type(0), ctx.out_type()
    rank = len(xt.shape)
    offset = int(ctx.arg(1, "offset", 0))
    d1, d2 = int(ctx.arg(2, "dim1", 0)) % rank, int(ctx.arg(3, "dim2", 1)) % rank
    perm = [k for k in range(rank) if k not in (d1, d2)] + [d1, d2]
    moved = TensorType(xt.dtype, tuple(xt.shape[k] for k in perm))
    x = ctx.t(0)
    if perm != list(range(rank)):
        x = ctx.helper("Transpose", [x], moved, perm=perm)
    kept = _on_diagonal(ctx, x, moved, offset)
    n, length, start = moved.shape[-2], out.shape[-1], max(0, -offset)
    if start == 0 and length == n:
        return ctx.one("ReduceSum", [kept, ctx.ints([-1])], keepdims=0)
    if is_symbolic(length):
        raise NotSupported("a diagonal of a batch-sized length shorter than its rows")
    y = ctx.helper(
        "ReduceSum", [kept, ctx.ints([-1])], TensorType(xt.dtype, moved.shape[:-1]), keepdims=0
    )
    return ctx.one("Slice", [y, ctx.ints([start]), ctx.ints([start + int(length)]), ctx.ints([-1])])


@ATEN.register("aten.trace.default")
def _trace(ctx: Ctx) -> Names:
    # the sum of a matrix's diagonal
    xt = ctx.in_type(0)
    if len(xt.shape) != 2:
        raise NotSupported("trace of a tensor other than a matrix")
    kept = _on_diagonal(ctx, ctx.t(0), xt, 0)
    return ctx.one("ReduceSum", [kept, ctx.ints([0, 1])], keepdims=0)


def _on_diagonal(ctx: Ctx, x: str, xt: TensorType, offset: int) -> str:
    """x [..., n, m] where row + offset == column, 0 elsewhere (Where: what is
    off the diagonal, -inf included, stays out of a sum over it). Along a
    batch-sized dim the indices are counted up to the size the graph computes."""
    n, m = xt.shape[-2:]
    if xt.dtype == "bool":
        raise NotSupported("the diagonal of a bool tensor")

    def counted(d: Dim) -> str:
        if is_symbolic(d):
            return _iota(ctx, _shape_vector(ctx, [d]), d, "int64")
        return ctx.ints(list(range(int(d))))

    rows = counted(n)
    cols = rows if n == m else counted(m)
    if offset:
        rows = ctx.helper("Add", [rows, ctx.const(offset, "int64")], TensorType("int64", (n,)))
    on = ctx.helper(
        "Equal",
        [
            ctx.helper("Unsqueeze", [rows, ctx.ints([1])], TensorType("int64", (n, 1))),
            ctx.helper("Unsqueeze", [cols, ctx.ints([0])], TensorType("int64", (1, m))),
        ],
        TensorType("bool", (n, m)),
    )
    zero = 0 if xt.dtype.startswith(("int", "uint")) else 0.0
    return ctx.helper("Where", [on, x, ctx.const(zero, xt.dtype)], xt)


# -- padding ------------------------------------------------------------------------------------
@ATEN.register("aten.constant_pad_nd.default")
def _constant_pad_nd(ctx: Ctx) -> Names:
    xt, out = ctx.in_type(0), ctx.out_type()
    rank = len(xt.shape)
    pad = [int(p) for p in ctx.arg(1, "pad")]
    value = ctx.arg(2, "value", 0)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise NotSupported(f"constant_pad_nd with pad {pad} on rank {rank}")
    begins, ends = [0] * rank, [0] * rank
    for j in range(len(pad) // 2):  # torch's pad runs from the last dim backwards
        begins[rank - 1 - j], ends[rank - 1 - j] = pad[2 * j], pad[2 * j + 1]
    x = ctx.t(0)
    crop = [d for d in range(rank) if begins[d] < 0 or ends[d] < 0]
    if crop:
        # a negative pad removes elements: a Slice (tf.pad and jnp.pad take no negative pads)
        shape = list(xt.shape)
        for d in crop:
            if is_symbolic(shape[d]):
                raise NotSupported("a negative pad of a batch-sized dim")
            shape[d] = int(shape[d]) + min(begins[d], 0) + min(ends[d], 0)
        starts = [max(0, -begins[d]) for d in crop]
        stops = [ends[d] if ends[d] < 0 else INT64_MAX for d in crop]
        begins, ends = [max(0, b) for b in begins], [max(0, e) for e in ends]
        if not any(begins + ends):
            return ctx.one("Slice", [x, ctx.ints(starts), ctx.ints(stops), ctx.ints(crop)])
        x = ctx.helper(
            "Slice",
            [x, ctx.ints(starts), ctx.ints(stops), ctx.ints(crop)],
            TensorType(xt.dtype, tuple(shape)),
        )
    if not any(begins + ends):
        return [x]
    ins = [x, ctx.ints(begins + ends)]
    if value:
        ins.append(ctx.const(value, out.dtype))
    return ctx.one("Pad", ins, mode="constant")


# -- indexing ------------------------------------------------------------------------------------
@ATEN.register("aten.gather.default")
def _gather(ctx: Ctx) -> Names:
    xt, it = ctx.in_type(0), ctx.in_type(2)
    rank = len(xt.shape)
    if rank == 0:
        raise NotSupported("gather on a 0-dim tensor")
    dim = int(ctx.arg(1, "dim")) % rank
    x = ctx.t(0)
    # torch reads only the index's extent of the other dims; GatherElements
    # (take-along-axis) wants them equal, so the data is cut to it first
    cut = [d for d in range(rank) if d != dim and not _same_dim(ctx, xt.shape[d], it.shape[d])]
    if cut:
        if any(is_symbolic(xt.shape[d]) or is_symbolic(it.shape[d]) for d in cut):
            raise NotSupported("gather with an index shorter than a batch-sized dim")
        shape = tuple(it.shape[d] if d in cut else xt.shape[d] for d in range(rank))
        x = ctx.helper(
            "Slice",
            [x, ctx.ints([0] * len(cut)), ctx.ints([int(it.shape[d]) for d in cut]), ctx.ints(cut)],
            TensorType(xt.dtype, shape),
        )
    return ctx.one("GatherElements", [x, ctx.t(2)], axis=dim)


@ATEN.register("aten.index_select.default")
def _index_select(ctx: Ctx) -> Names:
    xt, it = ctx.in_type(0), ctx.in_type(2)
    dim = int(ctx.arg(1, "dim")) % max(len(xt.shape), 1)
    idx = ctx.t(2)
    if not it.shape:  # a 0-dim index keeps the dim, with size 1
        idx = ctx.helper("Reshape", [idx, ctx.ints([1])], TensorType(it.dtype, (1,)))
        it = TensorType(it.dtype, (1,))
    idx = _wrapped(ctx, idx, it, ctx.t(0), xt.shape, dim)
    return ctx.one("Gather", [ctx.t(0), idx], axis=dim)


@ATEN.register("aten.index.Tensor")
def _index(ctx: Ctx) -> Names:
    """Advanced indexing x[..., i, j, ...] with integer index tensors: the
    indexed dims are merged into one and read with one Gather of the
    row-major linear index (broadcast like torch broadcasts the indices)."""
    indices = list(ctx.arg(1, "indices"))
    if all(i is None for i in indices):
        return [ctx.t(0)]
    if any(i is not None and i.dtype in ("bool", "uint8") for i in indices):
        return _selected(ctx, indices)
    merged = _merged_index(ctx, indices)
    return ctx.one("Gather", [merged.x, merged.linear], axis=merged.first)


def _counted(ctx: Ctx, axis: int) -> None:
    """The output's size along `axis` is the data's count of selected elements:
    it must follow a count symbol (symbols.py: the batch-dim replay sized the
    selection at other counts); a count it could not follow (below 2, or a
    replay that failed) would hold this batch's number in every batch's graph.
    A count the graph iterates over (one unbind output per selected row:
    batch_dims.iterated) is a number of this graph, as the outputs' number is."""
    d = ctx.out_type().shape[axis]
    if not (is_symbolic(d) and any(s.startswith("count") for m in parse_dim(d) for s in m)):
        if isinstance(d, int) and iterated(ctx.b.tape.recs, ctx.rec, axis, ctx.batch):
            return
        raise NotSupported(
            "a boolean selection whose count the batch-dim replay could not follow "
            f"(counted {d}): its size depends on the data"
        )


def _selected(ctx: Ctx, indices: list[Any]) -> Names:
    """x[mask] (a mask over dims j..j+m of x, the other indices None): those
    dims merged into one (row-major, as torch reads the mask) and compressed
    by the flattened mask along it; the count is a symbol (_counted)."""
    masks = [d for d, i in enumerate(indices) if i is not None]
    if len(masks) != 1 or indices[masks[0]].dtype != "bool":
        raise NotSupported("a boolean mask beside other indices, or a uint8 mask")
    j, mask = masks[0], indices[masks[0]]
    _counted(ctx, j)
    xt, m = ctx.in_type(0), len(mask.shape)
    x, flat_mask = ctx.t(0), ctx.b.name_of(mask)
    if m != 1:
        merged: Dim = 1
        for size in xt.shape[j : j + m]:
            merged = dim_mul(merged, size)
        flat = [*xt.shape[:j], merged, *xt.shape[j + m :]]
        x = ctx.helper("Reshape", [x, ctx.shape_const(flat)], TensorType(xt.dtype, tuple(flat)))
        flat_mask = ctx.helper(
            "Reshape", [flat_mask, ctx.ints([-1])], TensorType("bool", (merged,))
        )
    return ctx.one("Compress", [x, flat_mask], axis=j)


@ATEN.register("aten.masked_select.default")
def _masked_select(ctx: Ctx) -> Names:
    """torch.masked_select(x, mask): x and mask broadcast, flattened, and the
    elements where the mask holds, in row-major order (1-D, a count symbol)."""
    _counted(ctx, 0)
    xt, mt = ctx.in_type(0), ctx.in_type(1)
    shape = tuple(_broadcast(ctx, [xt.shape, mt.shape]))
    x, mask = ctx.t(0), ctx.t(1)
    if tuple(xt.shape) != shape:
        x = ctx.helper(
            "Expand", [x, ctx.shape_const(list(shape), False)], TensorType(xt.dtype, shape)
        )
    if tuple(mt.shape) != shape:
        mask = ctx.helper(
            "Expand", [mask, ctx.shape_const(list(shape), False)], TensorType("bool", shape)
        )
    merged: Dim = 1
    for size in shape:
        merged = dim_mul(merged, size)
    flat_x = ctx.helper("Reshape", [x, ctx.ints([-1])], TensorType(xt.dtype, (merged,)))
    flat_mask = ctx.helper("Reshape", [mask, ctx.ints([-1])], TensorType("bool", (merged,)))
    return ctx.one("Compress", [flat_x, flat_mask], axis=0)


@ATEN.register("aten.nonzero.default")
def _nonzero(ctx: Ctx) -> Names:
    """torch.nonzero(x): the indices of x's nonzero elements, [count, rank] in
    row-major order (ONNX NonZero gives them as [rank, count])."""
    _counted(ctx, 0)
    xt, out = ctx.in_type(0), ctx.out_type()
    found = ctx.helper("NonZero", [ctx.t(0)], TensorType("int64", (len(xt.shape), out.shape[0])))
    return ctx.one("Transpose", [found], perm=[1, 0])


class _Merged(NamedTuple):
    """x with the dims an advanced index reads merged into one (moved to the
    front first where they are not adjacent, as torch orders the result)."""

    x: str  # x, transposed and reshaped: shape[:first] + [merged] + shape[first + k:]
    shape: list[Dim]  # x's shape after the transpose, before the merge
    flat: list[Dim]  # the merged shape
    first: int  # the merged dim
    linear: str  # the row-major linear index into it (int64, the indices broadcast)
    linear_shape: tuple[Dim, ...]
    perm: list[int] | None  # the transpose, where the indexed dims were not adjacent


def _merged_index(ctx: Ctx, indices: list[Any], base: str | None = None) -> _Merged:
    """(`base`: x's value where not the record's input 0 as it is: zeros for
    uninitialised memory, _index_put.)"""
    xt = ctx.in_type(0)
    positions = [d for d, i in enumerate(indices) if i is not None]
    source = ctx.t(0) if base is None else base
    x, shape = source, list(xt.shape)
    perm = None
    if positions != list(range(positions[0], positions[-1] + 1)):
        # torch puts the result dims first when the indexed dims are not adjacent
        perm = positions + [d for d in range(len(shape)) if d not in positions]
        shape = [shape[p] for p in perm]
        x = ctx.helper("Transpose", [x], TensorType(xt.dtype, tuple(shape)), perm=perm)
        positions = list(range(len(positions)))
    first, k = positions[0], len(positions)
    # each index wraps by the size of the dim it indexes in x (before any transpose)
    names = [
        _wrapped(ctx, ctx.b.name_of(indices[d]), indices[d].type, source, xt.shape, d)
        for d in range(len(indices))
        if indices[d] is not None
    ]
    linear = names[0]
    sizes = [shape[d] for d in positions]
    if k > 1:
        shapes = [indices[d].shape for d in range(len(indices)) if indices[d] is not None]
        lin_shape = tuple(shapes[0])
        for j in range(1, k):
            scaled_ty = TensorType("int64", lin_shape)
            size = _dim_scalar(ctx, sizes[j])
            scaled = ctx.helper("Mul", [linear, size], scaled_ty)
            lin_shape = _broadcast(ctx, [lin_shape, shapes[j]])
            linear = ctx.helper("Add", [scaled, names[j]], TensorType("int64", lin_shape))
        merged: Dim = sizes[0]
        for size_j in sizes[1:]:
            merged = dim_mul(merged, size_j)
        flat = shape[:first] + [merged] + shape[first + k :]
        x = ctx.helper("Reshape", [x, ctx.shape_const(flat)], TensorType(xt.dtype, tuple(flat)))
    else:
        flat, lin_shape = list(shape), tuple(indices[positions[0]].shape)
    return _Merged(x, shape, flat, first, linear, lin_shape, perm)


def _put_per_element(
    ctx: Ctx,
    mask: str,
    mt: TensorType,
    d: int,
    values: str,
    v_shape: tuple[Dim, ...],
    accumulate: bool,
) -> Names:
    """x[mask] = v (or +=) with a value per selected element, v shaped as
    x[mask] ([*x.shape[:d], count, *rest], count a symbol: _counted): each
    position of the flattened mask reads v's row at the running count of
    selected elements up to it (a cumulative sum), v led by one row of zeros
    (the count may be 0, and positions before the first selected one read
    it); Where keeps x elsewhere. The gradients are index_put's: v's rows
    from the selected positions, x's from the others."""
    xt, out = ctx.in_type(0), ctx.out_type()
    rank, mrank = len(xt.shape), len(mt.shape)
    count: Dim = v_shape[d] if len(v_shape) == rank - mrank + 1 else 0
    if not is_symbolic(count) or not any(
        s.startswith("count") for m in parse_dim(count) for s in m
    ):
        raise NotSupported(
            "index_put of a value per selected element whose count the batch-dim "
            "replay could not follow: their count depends on the data"
        )
    merged: Dim = 1
    for size in mt.shape:
        merged = dim_mul(merged, size)
    flat = ctx.helper("Reshape", [mask, ctx.ints([-1])], TensorType("bool", (merged,)))
    ints = TensorType("int64", (merged,))
    counts = ctx.helper(
        "CumSum", [ctx.helper("Cast", [flat], ints, to="int64"), ctx.const(0, "int64")], ints
    )
    # the row of zeros: v's shape with 1 at d (computed: v's dims are symbolic)
    parts = [ctx.ints([1])]
    if d:
        parts.insert(0, ctx.helper("Shape", [values], TensorType("int64", (d,)), start=0, end=d))
    if d + 1 < len(v_shape):
        after = TensorType("int64", (len(v_shape) - d - 1,))
        parts.append(ctx.helper("Shape", [values], after, start=d + 1))
    row_shape = (
        parts[0]
        if len(parts) == 1
        else ctx.helper("Concat", parts, TensorType("int64", (len(v_shape),)), axis=0)
    )
    before, after_d = v_shape[:d], v_shape[d + 1 :]
    zeros = ctx.helper(
        "ConstantOfShape", [row_shape], TensorType(out.dtype, (*before, 1, *after_d)), value=0.0
    )
    grown = parse_dim(count)
    grown[()] = grown.get((), 0) + 1
    padded_t = TensorType(out.dtype, (*before, format_dim(grown), *after_d))
    padded = ctx.helper("Concat", [zeros, values], padded_t, axis=d)
    spread_t = TensorType(out.dtype, (*before, merged, *after_d))
    spread = ctx.helper("Gather", [padded, counts], spread_t, axis=d)
    spread = ctx.helper("Reshape", [spread, ctx.shape_const(list(xt.shape))], out)
    axes = [*range(d), *range(d + mrank, rank)]
    full = mask
    if axes:
        shape = [1] * d + list(mt.shape) + [1] * (rank - d - mrank)
        full = ctx.helper("Unsqueeze", [mask, ctx.ints(axes)], TensorType("bool", tuple(shape)))
    if accumulate:
        spread = ctx.helper("Add", [ctx.t(0), spread], out)
    return ctx.one("Where", [full, spread, ctx.t(0)])


@ATEN.register("aten.index_put.default", "aten.index_put_.default")
def _index_put(ctx: Ctx) -> Names:
    """x[indices] = values (accumulate: +=). Integer index tensors: the
    indexed dims merged into one (as _index reads them) and written with one
    ScatterElements along it, the index and the values broadcast to the read's
    shape and its index dims flattened; with accumulate, duplicate indices
    add up; without, which write wins is undefined in torch and on every
    target (and so are the written values' gradients). A boolean mask with
    one value: Where (x[x < 0] = 0); with a value per selected element (their
    count a symbol): _put_per_element."""
    out = ctx.out_type()
    indices = list(ctx.arg(1, "indices"))
    accumulate = bool(ctx.arg(3, "accumulate", False))
    values = _operand(ctx, 2, "values", out.dtype)
    vt = ctx.arg(2, "values")
    v_shape = tuple(vt.shape) if isinstance(vt, TArg) else ()
    if all(i is None for i in indices):
        raise NotSupported("index_put with no index tensor")
    if any(i is not None and i.dtype in ("bool", "uint8") for i in indices):
        return _masked_put(ctx, indices, values, v_shape, accumulate)
    base = None
    info = ctx.b.pseudo.get(ctx.raw_name(0))
    if info is not None and info[0] in UNINITIALISED and not accumulate:
        # a write into uninitialised memory (an inverse permutation: inv[perm] =
        # arange(n)): where nothing is written any value is as good, and zeros are one
        xt = ctx.in_type(0)
        base = ctx.helper(
            "ConstantOfShape",
            [ctx.shape_const(list(xt.shape), allow_minus_one=False)],
            TensorType(xt.dtype, xt.shape),
            value=0,
        )
    m = _merged_index(ctx, indices, base)
    pre, post = m.flat[: m.first], m.flat[m.first + 1 :]
    read = (*pre, *m.linear_shape, *post)  # x[indices]'s shape, which values broadcast to
    n: Dim = 1
    for d in m.linear_shape:
        n = dim_mul(n, d)
    written = (*pre, n, *post)
    ones = [1] * len(pre)
    index = ctx.helper(
        "Reshape",
        [m.linear, ctx.shape_const([*ones, n, *([1] * len(post))])],
        TensorType("int64", (*ones, n, *([1] * len(post)))),
    )
    index = ctx.helper(
        "Expand", [index, ctx.shape_const(written, False)], TensorType("int64", written)
    )
    if tuple(v_shape) != read:
        values = ctx.helper(
            "Expand", [values, ctx.shape_const(read, False)], TensorType(out.dtype, read)
        )
    values = ctx.helper(
        "Reshape", [values, ctx.shape_const(written)], TensorType(out.dtype, written)
    )
    inputs = [m.x, index, values]
    attrs: dict[str, Any] = {"axis": m.first, **({"reduction": "add"} if accumulate else {})}
    if m.flat == m.shape and m.perm is None:
        return ctx.one("ScatterElements", inputs, **attrs)
    y = ctx.helper("ScatterElements", inputs, TensorType(out.dtype, tuple(m.flat)), **attrs)
    if m.flat != m.shape:
        unmerged = (ctx.shape_const(m.shape),)
        if m.perm is None:
            return ctx.one("Reshape", [y, *unmerged])
        y = ctx.helper("Reshape", [y, *unmerged], TensorType(out.dtype, tuple(m.shape)))
    assert m.perm is not None
    return ctx.one("Transpose", [y], perm=[m.perm.index(d) for d in range(len(m.perm))])


def _masked_put(
    ctx: Ctx, indices: list[Any], values: str, v_shape: tuple[Dim, ...], accumulate: bool
) -> Names:
    """x[mask] = v (or +=) where v is the same for every selected element (one
    value, or a row over the dims after the mask's: Wav2Vec2's
    hidden[mask] = masked_spec_embed): Where over the mask, unsqueezed to
    x's rank at the dims it covers, v right-aligned with those after it. A
    value per selected element: _put_per_element."""
    xt = ctx.in_type(0)
    positions = [d for d, i in enumerate(indices) if i is not None]
    if len(positions) != 1:
        raise NotSupported("index_put with a boolean mask beside other indices")
    d = positions[0]
    mt = indices[d]
    rank, mrank = len(xt.shape), len(mt.shape)
    rest = rank - d - mrank  # x[mask] is [count, *x.shape[d + mrank:]], after x.shape[:d]
    head, tail = v_shape[: max(len(v_shape) - rest, 0)], v_shape[max(len(v_shape) - rest, 0) :]
    per_element = any(not isinstance(k, int) or k != 1 for k in head)
    covered = xt.shape[d : d + mrank]
    if len(covered) != mrank or any(
        not _same_dim(ctx, a, b) for a, b in zip(mt.shape, covered, strict=True)
    ):
        raise NotSupported(f"a boolean mask of shape {list(mt.shape)} on {list(xt.shape)}")
    mask = ctx.b.name_of(mt)
    if mt.dtype != "bool":
        mask = ctx.helper("Cast", [mask], TensorType("bool", mt.shape), to="bool")
    if per_element:
        return _put_per_element(ctx, mask, mt, d, values, v_shape, accumulate)
    axes = [*range(d), *range(d + mrank, rank)]
    if axes:
        full = [1] * d + list(mt.shape) + [1] * (rank - d - mrank)
        mask = ctx.helper("Unsqueeze", [mask, ctx.ints(axes)], TensorType("bool", tuple(full)))
    value = values
    if head:  # unit dims before the row (or a one-element tensor): dropped
        value = ctx.helper(
            "Reshape", [values, ctx.shape_const(tail)], TensorType(ctx.out_type().dtype, tail)
        )
    if accumulate:
        value = ctx.helper("Add", [ctx.t(0), value], ctx.out_type())
    return ctx.one("Where", [mask, value, ctx.t(0)])


def _scatter_reduction(ctx: Ctx) -> str:
    name = ctx.rec.op.split(".")[1].rstrip("_")
    if name == "scatter_add":
        return "add"
    if name == "scatter_reduce":
        reduce = str(ctx.arg(4, "reduce"))
        found = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}.get(
            reduce
        )
        if found is None:
            raise NotSupported(f"scatter_reduce with reduce={reduce!r}")
        return found
    reduce = ctx.arg(4, "reduce")
    if reduce is None:
        return "none"
    found = {"add": "add", "multiply": "mul"}.get(str(reduce))
    if found is None:
        raise NotSupported(f"scatter with reduce={reduce!r}")
    return found


@ATEN.register(
    "aten.scatter.src",
    "aten.scatter_.src",
    "aten.scatter.value",
    "aten.scatter_.value",
    "aten.scatter.reduce",
    "aten.scatter_.reduce",
    "aten.scatter.value_reduce",
    "aten.scatter_.value_reduce",
    "aten.scatter_add.default",
    "aten.scatter_add_.default",
    "aten.scatter_reduce.two",
    "aten.scatter_reduce_.two",
)
def _scatter(ctx: Ctx) -> Names:
    xt, it = ctx.in_type(0), ctx.in_type(2)
    rank = len(xt.shape)
    if rank == 0:
        raise NotSupported("scatter into a 0-dim tensor")
    dim = int(ctx.arg(1, "dim")) % rank
    dt = ctx.out_type().dtype
    reduction = _scatter_reduction(ctx)
    src = ctx.arg(3)
    idx = ctx.t(2)
    if isinstance(src, TArg):
        upd = _operand(ctx, 3, "src", dt)
        # torch reads only the index's extent of src; ScatterElements wants them equal
        cut = [d for d in range(rank) if not _same_dim(ctx, src.shape[d], it.shape[d])]
        if cut:
            if any(is_symbolic(src.shape[d]) or is_symbolic(it.shape[d]) for d in cut):
                raise NotSupported("scatter with a src larger than its index in a batch-sized dim")
            upd = ctx.helper(
                "Slice",
                [upd, ctx.ints([0] * len(cut)), ctx.ints([int(it.shape[d]) for d in cut])]
                + [ctx.ints(cut)],
                TensorType(dt, it.shape),
            )
    else:
        shape = (
            ctx.helper("Shape", [idx], TensorType("int64", (rank,)))
            if any(map(is_symbolic, it.shape))
            else ctx.ints([int(d) for d in it.shape])
        )
        upd = ctx.helper("Expand", [_operand(ctx, 3, "value", dt), shape], TensorType(dt, it.shape))
    attrs = {} if reduction == "none" else {"reduction": reduction}
    base = ctx.raw_name(0)
    info = ctx.b.pseudo.get(base)
    if info is not None and info[0] in UNINITIALISED and reduction == "none":
        # a scatter into uninitialised memory (torch's invert_permutation): where
        # nothing is written any value is as good, and zeros are one
        base = ctx.helper(
            "ConstantOfShape",
            [ctx.shape_const(list(xt.shape), allow_minus_one=False)],
            TensorType(dt, xt.shape),
            value=0,
        )
    else:
        base = ctx.t(0)
    if ctx.rec.op.startswith("aten.scatter_reduce"):
        return _scatter_reduced(ctx, base, idx, upd, dim, reduction)
    return ctx.one("ScatterElements", [base, idx, upd], axis=dim, **attrs)


# the value a reduction starts from where include_self=False leaves x out
_REDUCE_START = {"add": 0.0, "mul": 1.0, "max": -math.inf, "min": math.inf}


def _scatter_reduced(ctx: Ctx, x: str, idx: str, upd: str, dim: int, reduction: str) -> Names:
    """scatter_reduce: with include_self=False the positions written start
    from the reduction's identity instead of x's value (x stays where nothing
    is written); "mean" is the sum over the values written there (and x's,
    with include_self) divided by their count, torch's. The count per
    position is a scatter-add of ones."""
    xt, dt = ctx.in_type(0), ctx.out_type().dtype
    include = bool(ctx.arg(5, "include_self", True))
    mean = str(ctx.arg(4, "reduce")) == "mean"
    if include and not mean:
        return ctx.one("ScatterElements", [x, idx, upd], axis=dim, reduction=reduction)
    if dt not in ("float16", "bfloat16", "float32", "float64"):
        raise NotSupported(f"scatter_reduce of {dt} with include_self=False or mean")
    ct = TensorType("int64", xt.shape)
    zeros = ctx.helper(
        "ConstantOfShape", [ctx.shape_const(list(xt.shape), allow_minus_one=False)], ct, value=0
    )
    ones = ctx.helper(
        "Expand",
        [ctx.const(1, "int64"), ctx.helper("Shape", [idx], TensorType("int64", (len(xt.shape),)))],
        TensorType("int64", ctx.in_type(2).shape),
    )
    counts = ctx.helper("ScatterElements", [zeros, idx, ones], ct, axis=dim, reduction="add")
    written = ctx.helper("Greater", [counts, ctx.const(0, "int64")], TensorType("bool", xt.shape))
    if not include:
        start = ctx.const(_REDUCE_START[reduction], dt)
        x = ctx.helper("Where", [written, start, x], TensorType(dt, xt.shape))
    if not mean:
        return ctx.one("ScatterElements", [x, idx, upd], axis=dim, reduction=reduction)
    total = ctx.helper(
        "ScatterElements", [x, idx, upd], TensorType(dt, xt.shape), axis=dim, reduction="add"
    )
    if include:
        counts = ctx.helper("Add", [counts, ctx.const(1, "int64")], ct)
    counts = ctx.helper("Max", [counts, ctx.const(1, "int64")], ct)
    return ctx.one("Div", [total, ctx.helper("Cast", [counts], TensorType(dt, xt.shape), to=dt)])


# -- scans and triangles ---------------------------------------------------------------------------
@ATEN.register("aten.cumsum.default", "aten.cumsum_.default")
def _cumsum(ctx: Ctx) -> Names:
    xt, out = ctx.in_type(0), ctx.out_type()
    if not xt.shape:
        return ctx.one("Cast", [ctx.t(0)], to=out.dtype) if xt.dtype != out.dtype else [ctx.t(0)]
    x = ctx.t(0)
    if xt.dtype != out.dtype:  # cumsum of bool or int32 counts in int64 (or its dtype=)
        x = ctx.helper("Cast", [x], TensorType(out.dtype, xt.shape), to=out.dtype)
    dim = int(ctx.arg(1, "dim")) % len(xt.shape)
    return ctx.one("CumSum", [x, ctx.const(dim, "int64")])


def _trilu_rule(upper: int) -> Converter:
    def rule(ctx: Ctx) -> Names:
        k = int(ctx.arg(1, "diagonal", 0))
        ins = [ctx.t(0)] + ([ctx.const(k, "int64")] if k else [])
        return ctx.one("Trilu", ins, upper=upper)

    return rule


ATEN.update_from(["aten.tril.default", "aten.tril_.default"], _trilu_rule(0))
ATEN.update_from(["aten.triu.default", "aten.triu_.default"], _trilu_rule(1))


# -- attention -----------------------------------------------------------------------------------------
def _safe_softmax_of(ctx: Ctx, x: str, ty: TensorType, axis: int) -> str:
    """Softmax over ``axis`` whose rows that are all -inf give 0, not NaN
    (torch's _safe_softmax; the fused attention kernels do the same). ONNX has
    no such op: a row is dead where its max is -inf. A dead row is softmaxed as
    zeros and then zeroed, so no NaN appears in the forward, nor in any
    target's gradient (a Where after a NaN softmax would leak NaN into it)."""
    keep = list(ty.shape)
    keep[axis] = 1
    top = ctx.helper("ReduceMax", [x, ctx.ints([axis])], TensorType(ty.dtype, tuple(keep)))
    dead = ctx.helper(
        "Equal", [top, ctx.const(_NEG_INF, ty.dtype)], TensorType("bool", tuple(keep))
    )
    zero = ctx.const(0.0, ty.dtype)
    safe = ctx.helper("Where", [dead, zero, x], ty)
    p = ctx.helper("Softmax", [safe], ty, axis=axis)
    return ctx.helper("Where", [dead, zero, p], ty)


@ATEN.register("aten._safe_softmax.default")
def _safe_softmax(ctx: Ctx) -> Names:
    xt, out = ctx.in_type(0), ctx.out_type()
    if not xt.shape:
        raise NotSupported("softmax of a 0-dim tensor")
    x = ctx.t(0)
    if xt.dtype != out.dtype:
        x = ctx.helper("Cast", [x], TensorType(out.dtype, xt.shape), to=out.dtype)
    axis = int(ctx.arg(1, "dim")) % len(xt.shape)
    return [_safe_softmax_of(ctx, x, TensorType(out.dtype, xt.shape), axis)]


def _repeat_heads(ctx: Ctx, x: str, ty: TensorType, times: int) -> tuple[str, TensorType]:
    """[..., Hk, S, E] -> [..., Hk * times, S, E], each head repeated in place
    (grouped-query attention: query head h reads key/value head h // times)."""
    *lead, hk, s, e = ty.shape
    five = TensorType(ty.dtype, (*lead, hk, 1, s, e))
    x = ctx.helper("Unsqueeze", [x, ctx.ints([-3])], five)
    ones = [1] * len(lead)
    wide = TensorType(ty.dtype, (*lead, hk, times, s, e))
    x = ctx.helper("Expand", [x, ctx.ints([*ones, 1, times, 1, 1])], wide)
    if is_symbolic(hk):
        raise NotSupported("grouped-query attention with a batch-sized head count")
    out = TensorType(ty.dtype, (*lead, int(hk) * times, s, e))
    return ctx.helper("Reshape", [x, ctx.shape_const(list(out.shape))], out), out


def _causal_keep(ctx: Ctx, q: str, qt: TensorType, k: str, kt: TensorType) -> str:
    """The causal mask as torch aligns it (top-left: query i sees keys j <= i),
    bool [L, S]: a constant, or computed from the shapes for symbolic lengths."""
    length, keys = qt.shape[-2], kt.shape[-2]
    if not is_symbolic(length) and not is_symbolic(keys):
        return ctx.const(np.tril(np.ones((int(length), int(keys)), dtype=bool)), "bool")
    one = TensorType("int64", (1,))
    rank_q, rank_k = len(qt.shape), len(kt.shape)
    lsize = ctx.helper("Shape", [q], one, start=rank_q - 2, end=rank_q - 1)
    ssize = ctx.helper("Shape", [k], one, start=rank_k - 2, end=rank_k - 1)
    rows = _iota(ctx, lsize, length, "int64")
    cols = _iota(ctx, ssize, keys, "int64")
    rows = ctx.helper("Unsqueeze", [rows, ctx.ints([1])], TensorType("int64", (length, 1)))
    cols = ctx.helper("Unsqueeze", [cols, ctx.ints([0])], TensorType("int64", (1, keys)))
    return ctx.helper("LessOrEqual", [cols, rows], TensorType("bool", (length, keys)))


def _attention(ctx: Ctx, mask: Any, causal: bool, scale: float | None, dropout_p: float) -> Names:
    """One tracelog.Attention node (issue 15: each target runs its attention
    kernel where it has one): grouped-query key/value heads repeated before
    it, a boolean mask written as an additive one (0 / -inf), a causal mask
    beside a given mask folded into it (torch's kernel takes one of the two).
    The op's masked-out rows give 0, as the fused kernels give."""
    kernel = ctx.rec.op
    if dropout_p:
        raise NotSupported(
            f"{kernel} with dropout_p={dropout_p}: the kernel draws its dropout mask inside "
            "(philox state), so no mask exists to record or replay"
        )
    q, k, v = ctx.t(0), ctx.t(1), ctx.t(2)
    qt, kt, vt = ctx.in_type(0), ctx.in_type(1), ctx.in_type(2)
    if len(qt.shape) < 3 or len(kt.shape) != len(qt.shape) or len(vt.shape) != len(qt.shape):
        raise NotSupported(f"{kernel} on shapes {qt}, {kt}, {vt}")
    dt = qt.dtype
    hq, hk = qt.shape[-3], kt.shape[-3]
    if hq != hk:
        if is_symbolic(hq) or is_symbolic(hk) or int(hq) % int(hk):
            raise NotSupported(f"{kernel} with {hq} query heads and {hk} key/value heads")
        k, kt = _repeat_heads(ctx, k, kt, int(hq) // int(hk))
        v, vt = _repeat_heads(ctx, v, vt, int(hq) // int(hk))
    e = qt.shape[-1]
    if scale is None:
        if is_symbolic(e):
            raise NotSupported(f"{kernel} with a batch-sized head dim")
        scale = 1.0 / math.sqrt(int(e))
    inputs = [q, k, v]
    if isinstance(mask, TArg):
        m = ctx.b.name_of(mask)
        mask_t = TensorType(dt, mask.shape)
        neg_inf = ctx.const(_NEG_INF, dt)
        if mask.dtype == "bool":
            m = ctx.helper("Where", [m, ctx.const(0.0, dt), neg_inf], mask_t)
        elif mask.dtype != dt:
            m = ctx.helper("Cast", [m], mask_t, to=dt)
        if causal:
            keep = _causal_keep(ctx, q, qt, k, kt)
            wide = TensorType(dt, _broadcast(ctx, [mask.shape, (qt.shape[-2], kt.shape[-2])]))
            m = ctx.helper("Where", [keep, m, neg_inf], wide)
            causal = False
        inputs.append(m)
    elif mask is not None:
        raise NotSupported(f"{kernel} with a mask of type {type(mask).__name__}")
    attrs = {"scale": float(scale), "is_causal": int(causal)}
    return ctx.one("Attention", inputs, domain=TRACELOG_DOMAIN, **attrs)


@ATEN.register("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(ctx: Ctx) -> Names:
    # (query, key, value, dropout_p=0., is_causal=False, *, attn_mask=None, scale=None)
    return _attention(
        ctx,
        ctx.rec.kwarg("attn_mask"),
        bool(ctx.arg(4, "is_causal", False)),
        ctx.rec.kwarg("scale"),
        float(ctx.arg(3, "dropout_p", 0.0)),
    )


@ATEN.register(
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
)
def _sdpa_with_bias(ctx: Ctx) -> Names:
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p=0., is_causal=False, ...)
    return _attention(
        ctx,
        ctx.arg(3, "attn_bias"),
        bool(ctx.arg(6, "is_causal", False)),
        ctx.rec.kwarg("scale"),
        float(ctx.arg(5, "dropout_p", 0.0)),
    )


@ATEN.register("aten._scaled_dot_product_flash_attention.default")
def _sdpa_flash(ctx: Ctx) -> Names:
    # (query, key, value, dropout_p=0., is_causal=False, return_debug_mask=False, *, scale=None)
    return _attention(
        ctx,
        None,
        bool(ctx.arg(4, "is_causal", False)),
        ctx.rec.kwarg("scale"),
        float(ctx.arg(3, "dropout_p", 0.0)),
    )


@ATEN.register("aten.baddbmm.default", "aten.baddbmm_.default")
def _baddbmm(ctx: Ctx) -> Names:
    # beta * self + alpha * (batch1 @ batch2); beta == 0 ignores self (NaN included)
    out = ctx.out_type()
    beta, alpha = ctx.arg(3, "beta", 1), ctx.arg(4, "alpha", 1)
    prod = ctx.helper("MatMul", [ctx.t(1), ctx.t(2)], out)
    if alpha != 1:
        prod = ctx.helper("Mul", [prod, ctx.const(alpha, out.dtype)], out)
    if beta == 0:
        return [prod]
    c = _operand(ctx, 0, "self", out.dtype)
    if beta != 1:
        c = ctx.helper("Mul", [c, ctx.const(beta, out.dtype)], ctx.in_type(0))
    return ctx.one("Add", [prod, c])


# -- sorting: torch.sort / argsort (the whole axis) and torch.topk, as ONNX TopK ---------
TOPK = "aten.topk.default"


def topk_args(args: Sequence[Any], kwargs: Any) -> tuple[Any, int, bool, bool]:
    """topk(self, k, dim=-1, largest=True, sorted=True)'s (k, dim, largest, sorted)."""
    given = dict(kwargs)

    def at(i: int, name: str, default: Any) -> Any:
        return args[i] if len(args) > i else given.get(name, default)

    return (
        at(1, "k", None),
        int(at(2, "dim", -1)),
        bool(at(3, "largest", True)),
        bool(at(4, "sorted", True)),
    )


def topk_keys(indices: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The draw that makes topk(sorted=False)'s rule (_sort) pick the elements
    the batch's kernel picked, in its order: one key per input element along
    dim, the j-th picked (j + 0.5) / size, the others after them in index
    order. Where values tie at the k-th, which of them a kernel keeps is its
    own (torch's CPU partial sort keeps others than the lower indices): the
    rule sorts by the keys first, and TopK keeps the lower index (the lower
    key) among equals."""
    k = int(indices.shape[dim])
    shape = list(indices.shape)
    shape[dim] = size
    rest = torch.ones(shape, dtype=torch.bool).scatter(dim, indices, False)
    after = torch.cumsum(rest.to(torch.int64), dim) - 1 + k  # the others, in index order
    where = [1] * len(shape)
    where[dim] = k
    picked = torch.arange(k, dtype=torch.int64).view(where).expand_as(indices)
    rank = torch.where(rest, after, 0).scatter(dim, indices, picked)
    return ((rank.to(torch.float64) + 0.5) / max(size, 1)).to(torch.float32)


@ATEN.register("aten.sort.default", "aten.sort.stable", TOPK)
def _sort(ctx: Ctx) -> Names:
    """Values and indices in order along a dim; equal elements keep their order
    (torch's stable sort; TopK's lower index first). torch.sort and argsort
    sort the whole dim, topk keeps k."""
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    ordered = True
    if ctx.rec.op == TOPK:
        k, dim, largest, ordered = topk_args(ctx.rec.args, ctx.rec.kwargs)
    else:
        if ctx.rec.op == "aten.sort.stable":  # every argument but self keyword-only
            dim, largest = ctx.rec.kwarg("dim", -1), bool(ctx.rec.kwarg("descending", False))
        else:  # unstable: ties in an order torch leaves open (none in distinct values)
            dim, largest = ctx.arg(1, "dim", -1), bool(ctx.arg(2, "descending", False))
        k = xt.shape[int(dim) % rank] if rank else 1
    if rank == 0:
        raise NotSupported("sorting a 0-d tensor")
    if not isinstance(k, int) and k != xt.shape[int(dim) % rank]:
        raise NotSupported("topk of a symbolic k other than the whole dim")
    # a symbolic dim (the batch: lengths sorted for pack_padded_sequence) is sorted
    # whole: K is its size at run time
    axis = int(dim) % rank
    if ordered:
        return ctx.node("TopK", [ctx.t(0), ctx.b_dim(k)], axis=axis, largest=int(largest), sorted=1)
    # sorted=False: which of the elements tied at the k-th it keeps, and their
    # order, torch leaves open (on CPU, what its partial sort left); later ops
    # meet both (a dropout drawn over the selected rows: Informer; a mask
    # scattered at them: Doge's dynamic mask, whose values all tie at init).
    # A draw of keys over the input (topk_keys) decides both: the input in key
    # order, TopK (the lower index, so the lower key, among equals), the picked
    # in key order. The sample's draw replays the batch's; a fresh run draws
    # one at random, a choice the contract allows.
    vt, it = ctx.rec.outs[0].type, ctx.rec.outs[1].type
    n = xt.shape[axis]
    keys_t, perm_t = TensorType("float32", xt.shape), TensorType(it.dtype, xt.shape)
    u = random_like(ctx, keys_t, "RandomUniformLike", low=0.0, high=1.0)
    _, perm = ctx.node(
        "TopK", [u, ctx.b_dim(n)], outs=[keys_t, perm_t], axis=axis, largest=0, sorted=1
    )
    permuted = ctx.helper("GatherElements", [ctx.t(0), perm], xt, axis=axis)
    values, picked = ctx.node(
        "TopK", [permuted, ctx.b_dim(k)], outs=[vt, it], axis=axis, largest=int(largest), sorted=1
    )
    indices = ctx.helper("GatherElements", [perm, picked], it, axis=axis)
    picked_keys_t = TensorType("float32", it.shape)
    picked_keys = ctx.helper("GatherElements", [u, indices], picked_keys_t, axis=axis)
    _, order = ctx.node(
        "TopK",
        [picked_keys, ctx.b_dim(k)],
        outs=[picked_keys_t, it],
        axis=axis,
        largest=0,
        sorted=1,
    )
    values = ctx.helper("GatherElements", [values, order], vt, axis=axis)
    indices = ctx.helper("GatherElements", [indices, order], it, axis=axis)
    return [values, indices]


# -- index_add, diag_embed, bucketize, linspace ------------------------------------------
@ATEN.register("aten.index_add.default", "aten.index_add_.default")
def _index_add(ctx: Ctx) -> Names:
    """self with source's slices added at index along dim (repeats accumulate),
    times alpha: ScatterElements(add) with the index spread over source's shape."""
    return _index_scatter(ctx, "add")


def _index_scatter(ctx: Ctx, reduction: str | None) -> Names:
    """index_add / index_copy (self, dim, index, source[, alpha]) as
    ScatterElements along dim, each index entry spread over its slice."""
    xt, st = ctx.in_type(0), ctx.in_type(3)
    rank = len(xt.shape)
    if rank == 0:
        raise NotSupported("an index write into a 0-dim tensor")
    dim = int(ctx.arg(1, "dim")) % rank
    dt = ctx.out_type().dtype
    src = _operand(ctx, 3, "source", dt)
    alpha = ctx.arg(4, "alpha", 1) if reduction == "add" else 1
    if alpha != 1:
        src = ctx.helper("Mul", [src, ctx.const(float(alpha), dt)], TensorType(dt, st.shape))
    it = ctx.in_type(2)
    lined: list[int | str] = [1] * rank
    lined[dim] = it.shape[0] if it.shape else 1
    idx = ctx.helper(
        "Reshape",
        [ctx.t(2), ctx.shape_const(lined)],
        TensorType(it.dtype, tuple(lined)),
    )
    shape = (
        ctx.helper("Shape", [src], TensorType("int64", (rank,)))
        if any(map(is_symbolic, st.shape))
        else ctx.ints([int(d) for d in st.shape])
    )
    idx = ctx.helper("Expand", [idx, shape], TensorType(it.dtype, st.shape))
    attrs = {"reduction": reduction} if reduction else {}
    return ctx.one("ScatterElements", [ctx.t(0), idx, src], axis=dim, **attrs)


@ATEN.register("aten.diag_embed.default")
def _diag_embed(ctx: Ctx) -> Names:
    """diag_embed(x) (offset 0, the last two dims): x along the diagonal of
    [..., n, n], zeros elsewhere: x[..., None] times the identity."""
    xt, out = ctx.in_type(0), ctx.out_type()
    rank = len(out.shape)
    offset = int(ctx.arg(1, "offset", 0))
    dims = {int(ctx.arg(2, "dim1", -2)) % rank, int(ctx.arg(3, "dim2", -1)) % rank}
    n = xt.shape[-1] if xt.shape else 1
    if offset or dims != {rank - 2, rank - 1} or is_symbolic(n):
        raise NotSupported("diag_embed off the main diagonal, of other dims, or of a symbolic size")
    column = ctx.helper(
        "Unsqueeze", [ctx.t(0), ctx.ints([rank - 1])], TensorType(xt.dtype, (*xt.shape, 1))
    )
    eye = ctx.const(np.eye(int(n), dtype=np.dtype(xt.dtype)), xt.dtype)
    return ctx.one("Mul", [column, eye])


@ATEN.register("aten.bucketize.Tensor")
def _bucketize(ctx: Ctx) -> Names:
    """The bucket of each value: how many boundaries lie below it (right=False:
    b < x; right=True: b <= x)."""
    if len(ctx.in_type(1).shape) != 1:
        raise NotSupported("bucketize with boundaries of rank other than 1")
    return _buckets(ctx, 0, 1, bool(ctx.arg(3, "right", False)))


@ATEN.register("aten.searchsorted.Tensor")
def _searchsorted(ctx: Ctx) -> Names:
    """torch.searchsorted of values in one sorted 1-D sequence: bucketize with
    the arguments swapped (side="right", or right=True: b <= x)."""
    if len(ctx.in_type(0).shape) != 1:
        raise NotSupported("searchsorted in a sorted sequence of rank other than 1")
    if ctx.arg(5, "sorter") is not None:
        raise NotSupported("searchsorted with a sorter")
    side = ctx.arg(4, "side")
    return _buckets(ctx, 1, 0, side == "right" if side else bool(ctx.arg(3, "right", False)))


def _buckets(ctx: Ctx, values: int, bounds: int, right: bool) -> Names:
    """How many of the 1-D `bounds` lie below each of `values` (b < x, or
    b <= x where `right`), counted as a sum of comparisons."""
    xt, bt, out = ctx.in_type(values), ctx.in_type(bounds), ctx.out_type()
    rank = len(xt.shape)
    x = ctx.helper(
        "Unsqueeze", [ctx.t(values), ctx.ints([rank])], TensorType(xt.dtype, (*xt.shape, 1))
    )
    b = ctx.t(bounds)
    if bt.dtype != xt.dtype:  # torch compares in the promoted type
        common = "float64" if "float64" in (bt.dtype, xt.dtype) else xt.dtype
        if xt.dtype != common:
            x = ctx.helper("Cast", [x], TensorType(common, (*xt.shape, 1)), to=common)
        if bt.dtype != common:
            b = ctx.helper("Cast", [b], TensorType(common, bt.shape), to=common)
    counts = _below(ctx, x, b, (*xt.shape, bt.shape[0]), right, out.dtype)
    return ctx.one("ReduceSum", [counts, ctx.ints([rank])], keepdims=0)


def _below(ctx: Ctx, x: str, bounds: str, shape: tuple[Dim, ...], right: bool, dtype: str) -> str:
    """1 where a bound lies below x (b < x; b <= x where `right`), else 0, in
    `dtype`: x has one value per row (its last axis 1), the bounds run along
    the last axis (`shape` the two broadcast). Summed over that axis, the
    count of bounds below each x: the bucket torch's bucketize, histc and
    grouped_mm's group offsets find by binary search."""
    below = ctx.helper("LessOrEqual" if right else "Less", [bounds, x], TensorType("bool", shape))
    return ctx.helper("Cast", [below], TensorType(dtype, shape), to=dtype)


@ATEN.register("aten.masked_scatter.default")
def _masked_scatter(ctx: Ctx) -> Names:
    """x.masked_scatter(mask, source): where the mask (broadcast to x) is
    set, source's elements in order. The k-th set position reads source's
    flat element k: its index is the running count of set positions less 1
    (0 where none is set yet; Where drops those), a Gather whose gradient
    scatters back into source as torch's does."""
    xt, mt, st = ctx.in_type(0), ctx.in_type(1), ctx.in_type(2)
    shape = xt.shape
    mask = ctx.t(1)
    if tuple(mt.shape) != tuple(shape):
        mask = ctx.helper(
            "Expand", [mask, ctx.shape_const(shape, False)], TensorType("bool", shape)
        )
    n: Dim = 1
    for d in shape:
        n = dim_mul(n, d)
    m: Dim = 1
    for d in st.shape:
        m = dim_mul(m, d)
    line = TensorType("int64", (n,))
    flat = ctx.helper("Reshape", [mask, ctx.ints([-1])], TensorType("bool", (n,)))
    count = ctx.helper(
        "CumSum",
        [ctx.helper("Cast", [flat], line, to="int64"), ctx.const(0, "int64")],
        line,
    )
    index = ctx.helper(
        "Max",
        [ctx.helper("Sub", [count, ctx.const(1, "int64")], line), ctx.const(0, "int64")],
        line,
    )
    source = ctx.helper("Reshape", [ctx.t(2), ctx.ints([-1])], TensorType(st.dtype, (m,)))
    taken = ctx.helper("Gather", [source, index], TensorType(st.dtype, (n,)), axis=0)
    taken = ctx.helper("Reshape", [taken, ctx.shape_const(shape)], TensorType(st.dtype, shape))
    if st.dtype != xt.dtype:
        taken = ctx.helper("Cast", [taken], TensorType(xt.dtype, shape), to=xt.dtype)
    return ctx.one("Where", [mask, taken, ctx.t(0)])


@ATEN.register("aten.linspace.default")
def _linspace(ctx: Ctx) -> Names:
    """A constant: torch's own kernel computes it (start + i * step for the
    first half, end - (steps - 1 - i) * step for the second, in the dtype)."""
    out = ctx.out_type()
    start, end, steps = ctx.arg(0, "start"), ctx.arg(1, "end"), ctx.arg(2, "steps")
    if not all(isinstance(v, (int, float)) for v in (start, end, steps)):
        raise NotSupported("linspace with tensor bounds or a symbolic number of steps")
    values = torch.linspace(start, end, int(steps), dtype=TORCH_DTYPES[out.dtype])
    return [ctx.const(values.numpy(), out.dtype)]


@ATEN.register("aten.isnan.default")
def _isnan(ctx: Ctx) -> Names:
    if not ctx.in_type(0).dtype.startswith(("float", "bfloat")):
        raise NotSupported("isnan of an integer tensor (never NaN)")
    return ctx.one("IsNaN", [ctx.t(0)])


def _any_all(kind: str) -> Converter:
    """any / all along dims (None: every dim) of any dtype: whether some (every)
    element is nonzero, as a max (min) of 0/1 ints."""

    def rule(ctx: Ctx) -> Names:
        xt, out = ctx.in_type(0), ctx.out_type()
        rank = len(xt.shape)
        flags = ctx.t(0)
        if xt.dtype != "bool":
            flags = ctx.helper(
                "Not",
                [
                    ctx.helper(
                        "Equal", [flags, ctx.const(0, xt.dtype)], TensorType("bool", xt.shape)
                    )
                ],
                TensorType("bool", xt.shape),
            )
        ones = ctx.helper("Cast", [flags], TensorType("int32", xt.shape), to="int32")
        dims = ctx.arg(1, "dim")
        axes = (
            list(range(rank))
            if dims is None
            else [
                int(d) % max(rank, 1) for d in (dims if isinstance(dims, (list, tuple)) else [dims])
            ]
        )
        keep = int(bool(ctx.arg(2, "keepdim", False)))
        if not rank:
            return ctx.one("Cast", [ones], to="bool")
        op = "ReduceMax" if kind == "any" else "ReduceMin"
        reduced = ctx.helper(
            op, [ones, ctx.ints(axes)], TensorType("int32", out.shape), keepdims=keep
        )
        return ctx.one("Cast", [reduced], to="bool")

    return rule


for _kind in ("any", "all"):
    ATEN.add(f"aten.{_kind}.dim", _any_all(_kind))
    ATEN.add(f"aten.{_kind}.dims", _any_all(_kind))
    ATEN.add(f"aten.{_kind}.default", _any_all(_kind))


@ATEN.register("aten.index_copy.default", "aten.index_copy_.default")
def _index_copy(ctx: Ctx) -> Names:
    """self with source's slices written at index along dim: ScatterElements
    with the index spread over source's shape (index_add's, with no reduction)."""
    return _index_scatter(ctx, None)


@ATEN.register("aten.index_fill.int_Scalar", "aten.index_fill_.int_Scalar")
def _index_fill(ctx: Ctx) -> Names:
    """self with the slices at index along dim set to value: a mask over that
    dim (1 at each index: a ScatterElements into zeros) chooses value."""
    xt, out = ctx.in_type(0), ctx.out_type()
    rank = len(xt.shape)
    dim = int(ctx.arg(1, "dim")) % max(rank, 1)
    size = xt.shape[dim] if rank else 1
    if is_symbolic(size):
        raise NotSupported("index_fill along the batch or a sequence-long dim")
    it = ctx.in_type(2)
    count = it.shape[0] if it.shape else 1
    idx = ctx.helper("Reshape", [ctx.t(2), ctx.ints([-1])], TensorType(it.dtype, (count,)))
    ones = ctx.helper(
        "ConstantOfShape",
        [ctx.helper("Shape", [idx], TensorType("int64", (1,)))],
        TensorType("int32", (count,)),
        value=1,
    )
    hits = ctx.helper(
        "ScatterElements",
        [ctx.const(np.zeros(int(size), np.int32), "int32"), idx, ones],
        TensorType("int32", (int(size),)),
        axis=0,
    )
    lined = [1] * rank
    lined[dim] = int(size)
    chosen = ctx.helper(
        "Cast",
        [ctx.helper("Reshape", [hits, ctx.ints(lined or [1])], TensorType("int32", tuple(lined)))],
        TensorType("bool", tuple(lined)),
        to="bool",
    )
    value = ctx.const(float(ctx.arg(3, "value")), out.dtype)
    return ctx.one("Where", [chosen, value, ctx.t(0)])


# -- mixture-of-experts kernels (transformers' grouped_mm experts) ---------------------
@ATEN.register("aten.histc.default")
def _histc(ctx: Ctx) -> Names:
    """torch.histc(x, bins, min, max): how many elements fall in each of the
    bins between torch's linspace edges (the upper bound of the edges at or
    below x; x == max in the last bin; x outside not counted), as torch's
    CPU kernel bins them. min == max: the data's own range (one wider on
    each side where it is a single value), the edges computed as torch's
    linspace computes them. No gradient, as torch's."""
    bins, lo, hi = int(ctx.arg(1, "bins", 100)), ctx.arg(2, "min", 0), ctx.arg(3, "max", 0)
    xt, out = ctx.in_type(0), ctx.out_type()
    dt = xt.dtype
    if dt not in ("float16", "float32", "float64"):
        raise NotSupported(f"histc of {dt} (its edges are computed in the dtype, with numpy)")
    n: Dim = 1
    for size in xt.shape:
        n = dim_mul(n, size)
    x = ctx.helper("Reshape", [ctx.t(0), ctx.ints([-1, 1])], TensorType(dt, (n, 1)))
    if float(lo) < float(hi):
        edges = torch.linspace(float(lo), float(hi), bins + 1, dtype=TORCH_DTYPES[dt]).numpy()
        first, last = ctx.const(float(lo), dt), ctx.const(float(hi), dt)
        edge_row = ctx.const(edges.reshape(1, -1), dt)
    else:
        first, last, edge_row = _data_edges(ctx, x, dt, bins)
    one = TensorType("int64", (n, 1))
    at_or_below = _below(ctx, x, edge_row, (n, bins + 1), True, "int64")
    below = ctx.helper("ReduceSum", [at_or_below, ctx.ints([1])], one, keepdims=1)
    # the bin: the edges at or below x, less one; x == max is in the last bin
    below = ctx.helper("Sub", [below, ctx.const(1, "int64")], one)
    pos = ctx.helper("Min", [below, ctx.const(bins - 1, "int64")], one)
    flags = TensorType("bool", (n, 1))
    inside = ctx.helper(
        "And",
        [
            ctx.helper("GreaterOrEqual", [x, first], flags),
            ctx.helper("LessOrEqual", [x, last], flags),
        ],
        flags,
    )
    each = ctx.const(np.arange(bins, dtype=np.int64).reshape(1, -1), "int64")
    hits = TensorType("bool", (n, bins))
    hit = ctx.helper("And", [ctx.helper("Equal", [pos, each], hits), inside], hits)
    counted = ctx.helper("Cast", [hit], TensorType(out.dtype, (n, bins)), to=out.dtype)
    return ctx.one("ReduceSum", [counted, ctx.ints([0])], keepdims=0)


def _data_edges(ctx: Ctx, x: str, dt: str, bins: int) -> tuple[str, str, str]:
    """histc's range and edges where min == max: the data's least and largest
    values (each one further out where they are equal), and linspace's edges
    between them as torch computes them in the dtype: start + step * i for
    the first half, end - step * (bins - i) for the rest."""
    scalar = TensorType(dt, ())
    lo = ctx.helper("ReduceMin", [x], scalar, keepdims=0)
    hi = ctx.helper("ReduceMax", [x], scalar, keepdims=0)
    same = ctx.helper("Equal", [lo, hi], TensorType("bool", ()))
    lo = ctx.helper(
        "Where", [same, ctx.helper("Sub", [lo, ctx.const(1.0, dt)], scalar), lo], scalar
    )
    hi = ctx.helper(
        "Where", [same, ctx.helper("Add", [hi, ctx.const(1.0, dt)], scalar), hi], scalar
    )
    step = ctx.helper(
        "Div", [ctx.helper("Sub", [hi, lo], scalar), ctx.const(float(bins), dt)], scalar
    )
    steps = np.arange(bins + 1)
    halfway = (bins + 1) // 2
    row = TensorType(dt, (1, bins + 1))
    up = ctx.helper(
        "Add",
        [lo, ctx.helper("Mul", [step, ctx.const(steps.reshape(1, -1).astype(dt), dt)], row)],
        row,
    )
    down_by = (bins - steps).reshape(1, -1).astype(dt)
    down = ctx.helper("Sub", [hi, ctx.helper("Mul", [step, ctx.const(down_by, dt)], row)], row)
    first_half = ctx.const((steps < halfway).reshape(1, -1), "bool")
    return lo, hi, ctx.helper("Where", [first_half, up, down], row)


@ATEN.register("aten._grouped_mm.default")
def _grouped_mm(ctx: Ctx) -> Names:
    """torch._grouped_mm(a [S, K], b [E, K, N], offs [E]): row i of a times b[g],
    g the group whose rows it is in (offs: each group's end, cumulative), as
    a batched product of each row with its group's matrix (b gathered by
    row). Rows past the last offset, which torch leaves unwritten, take the
    last group's."""
    at, bt, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    offs = ctx.arg(2, "offs")
    if (
        len(at.shape) != 2
        or len(bt.shape) != 3
        or not isinstance(offs, TArg)
        or ctx.arg(3, "bias") is not None
        or is_symbolic(bt.shape[0])
    ):
        raise NotSupported("_grouped_mm other than the rows of a 2-D input by groups of a 3-D one")
    s, k = at.shape
    groups, n = int(bt.shape[0]), bt.shape[2]
    rows = _iota(ctx, _shape_vector(ctx, [s]), s, "int64")
    rows = ctx.helper("Unsqueeze", [rows, ctx.ints([1])], TensorType("int64", (s, 1)))
    ends = ctx.helper("Cast", [ctx.t(2)], TensorType("int64", (groups,)), to="int64")
    ends = ctx.helper("Unsqueeze", [ends, ctx.ints([0])], TensorType("int64", (1, groups)))
    past = _below(ctx, rows, ends, (s, groups), True, "int64")  # the groups that end at or before
    group = ctx.helper("ReduceSum", [past, ctx.ints([1])], TensorType("int64", (s,)), keepdims=0)
    group = ctx.helper("Min", [group, ctx.const(groups - 1, "int64")], TensorType("int64", (s,)))
    weights = ctx.helper("Gather", [ctx.t(1), group], TensorType(bt.dtype, (s, k, n)), axis=0)
    a = ctx.helper("Unsqueeze", [ctx.t(0), ctx.ints([1])], TensorType(at.dtype, (s, 1, k)))
    y = ctx.helper("MatMul", [a, weights], TensorType(out.dtype, (s, 1, n)))
    return ctx.one("Squeeze", [y, ctx.ints([1])])
