"""Aten rules for bags of embeddings: nn.EmbeddingBag and F.embedding_bag
(``aten._embedding_bag``), the rows an index list reads summed, averaged or
maxed per bag, as aten's CPU kernel computes them
(aten/src/ATen/native/EmbeddingBag.cpp):

- fixed-size bags (a 2-D input [B, L]: F.embedding_bag flattens it and passes
  offsets arange(0, B*L, L)): Gather to [B, L, D], then a reduction over L;
- bags given by offsets (a 1-D input: the offsets are data): each position's
  bag is computed at run time as aten's make_offset2bag does it (a mark at each
  bag's start, their running count minus one), then the gathered rows are
  scattered into [bags, D] with ScatterElements (add, or max).

Positions holding ``padding_idx`` belong to no bag: they add nothing, count
for no mean, and their row gets no gradient from them. An empty bag is 0 in
every mode. With ``include_last_offset`` the last offset ends nothing on CPU:
the last bag runs to the end of the input.

Registered into ``ATEN`` on import (the last line of ``rules.py`` imports this
module).
"""

from __future__ import annotations

import numpy as np

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tape import TArg
from tracelog.adapters.torch.rules import ATEN, Names
from tracelog.ir import Dim, TensorType, dim_mul, format_dim, parse_dim

_SUM, _MEAN, _MAX = 0, 1, 2
_REDUCE = {_SUM: "ReduceSum", _MEAN: "ReduceMean", _MAX: "ReduceMax"}
# records that pass their input's values on: the offsets of fixed-size bags
# reach the kernel through a detach
_SAME_VALUES = {
    "aten.detach.default",
    "aten.alias.default",
    "aten.lift_fresh.default",
    "aten.lift_fresh_copy.default",
    "aten.clone.default",
    "aten.contiguous.default",
}
_INT64 = TensorType("int64", (1,))


def _plus(d: Dim, k: int) -> Dim:
    poly = parse_dim(d)
    poly[()] = poly.get((), 0) + k
    return format_dim(poly)


def _quotient(n: Dim, bags: Dim) -> Dim | None:
    """n / bags as a dim ("batch*seq" / "batch": "seq"), None where it is none."""
    poly = parse_dim(bags)
    if len(poly) != 1:
        return None
    ((monomial, coef),) = poly.items()
    if coef < 1:
        return None
    quotient: dict[tuple[str, ...], int] = {}
    for m, c in parse_dim(n).items():
        rest = list(m)
        for symbol in monomial:
            if symbol not in rest:
                return None
            rest.remove(symbol)
        if c % coef:
            return None
        quotient[tuple(rest)] = c // coef
    length = format_dim(quotient)
    return length if dim_mul(bags, length) == n else None


def _fixed_bag_length(ctx: Ctx, include_last: bool) -> Dim | None:
    """L where the offsets are arange(0, N, L) over N = bags * L indices (the
    offsets F.embedding_bag makes for a 2-D input [B, L]; L may be a symbol
    when the input's second dim is one), else None."""
    offsets = ctx.arg(2, "offsets")
    if include_last or not isinstance(offsets, TArg):
        return None
    recs = ctx.b.tape.recs
    while offsets.ref[0] == "o" and recs[offsets.ref[1]].op in _SAME_VALUES:
        offsets = recs[offsets.ref[1]].args[0]
        if not isinstance(offsets, TArg):
            return None
    if offsets.ref[0] != "o":
        return None
    rec = recs[offsets.ref[1]]
    if rec.op == "aten.arange.start_step" and len(rec.args) >= 3:
        start, end, step = rec.args[:3]
    elif rec.op == "aten.arange.default" and rec.args:
        start, end, step = 0, rec.args[0], 1
    else:
        return None
    if start != 0 or type(step) is not int or step < 1 or type(end) is not int or end % step:
        return None
    (bags,) = offsets.shape
    (n,) = ctx.in_type(1).shape
    length = _quotient(n, bags)
    if length is None or (isinstance(length, int) and length != step):
        return None
    return length


def _lowest(dtype: str) -> float:
    """The dtype's lowest finite value: what no row beats in a max (-inf would
    give inf - inf where a target's max gradient subtracts)."""
    return float(np.finfo(np.dtype(dtype)).min)


@ATEN.register("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def _embedding_bag(ctx: Ctx) -> Names:
    # (weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    #  per_sample_weights, include_last_offset, padding_idx): sparse changes only
    # the gradient's layout, not its values
    mode = int(ctx.arg(4, "mode", _SUM))
    if mode not in _REDUCE:
        raise NotSupported(f"embedding_bag mode {mode}")
    if ctx.arg(3, "scale_grad_by_freq", False):
        # torch 2.13's CPU backward scales rows by counts that are not their own
        # index's (one bag [1, 1, 1, 2]: row 2's gradient is a third)
        raise NotSupported("embedding_bag's scale_grad_by_freq (aten's CPU backward)")
    include_last = bool(ctx.arg(7, "include_last_offset", False))
    padding_idx = ctx.arg(8, "padding_idx", -1)
    pad = -1 if padding_idx is None else int(padding_idx)  # aten's -1: none
    length = _fixed_bag_length(ctx, include_last)
    if length is not None:
        out = _fixed_bags(ctx, mode, length, pad)
    else:
        out = _offset_bags(ctx, mode, include_last, pad)
    # offset2bag, bag_size and max_indices are for aten's backward only
    return [out, None, None, None]


def _weighted_rows(ctx: Ctx, indices: str, ty: TensorType) -> str:
    """The weight's rows at ``indices``, times per_sample_weights where given
    (sum mode only, as torch checks), of type ``ty``."""
    rows = ctx.helper("Gather", [ctx.t(0), indices], ty, axis=0)
    if ctx.arg(6, "per_sample_weights") is None:
        return rows
    scales = ctx.helper(
        "Reshape",
        [ctx.t(6, "per_sample_weights"), ctx.shape_const([*ty.shape[:-1], 1])],
        TensorType(ty.dtype, (*ty.shape[:-1], 1)),
    )
    return ctx.helper("Mul", [rows, scales], ty)


def _fixed_bags(ctx: Ctx, mode: int, length: Dim, pad: int) -> str:
    """Bags of ``length`` consecutive indices: [B, L] gathered, reduced over L."""
    out = ctx.out_type()
    bags, dim = out.shape
    dt = out.dtype
    idx_dtype = ctx.in_type(1).dtype
    grid = TensorType(idx_dtype, (bags, length))
    indices = ctx.helper("Reshape", [ctx.t(1), ctx.shape_const([bags, length])], grid)
    rows_ty = TensorType(dt, (bags, length, dim))
    rows = _weighted_rows(ctx, indices, rows_ty)
    bag_axis = ctx.ints([1])
    if pad < 0:
        return ctx.helper(_REDUCE[mode], [rows, bag_axis], out, keepdims=0)
    # padding positions: in no bag (masked out of the sum and the max, not counted)
    is_pad = ctx.helper(
        "Equal", [indices, ctx.const(pad, idx_dtype)], TensorType("bool", (bags, length))
    )
    is_pad = ctx.helper("Unsqueeze", [is_pad, ctx.ints([2])], TensorType("bool", (bags, length, 1)))
    filler = _lowest(dt) if mode == _MAX else 0.0
    masked = ctx.helper("Where", [is_pad, ctx.const(filler, dt), rows], rows_ty)
    op = "ReduceMax" if mode == _MAX else "ReduceSum"
    reduced = ctx.helper(op, [masked, bag_axis], out, keepdims=0)
    if mode == _SUM:
        return reduced
    keep = ctx.helper("Not", [is_pad], TensorType("bool", (bags, length, 1)))
    counts = ctx.helper(
        "ReduceSum",
        [ctx.helper("Cast", [keep], TensorType(dt, (bags, length, 1)), to=dt), bag_axis],
        TensorType(dt, (bags, 1)),
        keepdims=0,
    )
    return _per_count(ctx, mode, reduced, counts)


def _per_count(ctx: Ctx, mode: int, reduced: str, counts: str) -> str:
    """A bag's sum divided by its count for a mean (an empty bag's 0 by 1), or
    its max where it has a row (else 0)."""
    out = ctx.out_type()
    dt = out.dtype
    if mode == _MEAN:
        divisor = ctx.helper("Max", [counts, ctx.const(1.0, dt)], TensorType(dt, (out.shape[0], 1)))
        return ctx.helper("Div", [reduced, divisor], out)
    some = ctx.helper(
        "Greater", [counts, ctx.const(0.0, dt)], TensorType("bool", (out.shape[0], 1))
    )
    return ctx.helper("Where", [some, reduced, ctx.const(0.0, dt)], out)


def _offset_bags(ctx: Ctx, mode: int, include_last: bool, pad: int) -> str:
    """Bags that start at the offsets: each position's bag computed from them,
    the rows scattered into their bags."""
    out = ctx.out_type()
    bags, dim = out.shape
    dt = out.dtype
    it = ctx.in_type(1)
    if len(it.shape) != 1:
        raise NotSupported("embedding_bag of a 2-D input with offsets of its own")
    (n,) = it.shape
    indices = ctx.t(1)
    offsets = ctx.t(2, "offsets")
    starts_ty = TensorType("int64", (bags,))
    if ctx.in_type(2).dtype != "int64":
        offsets = ctx.helper(
            "Cast", [offsets], TensorType("int64", ctx.in_type(2).shape), to="int64"
        )
    starts = offsets
    if include_last:  # the last offset ends no bag on CPU: the last bag runs to the end
        starts = ctx.helper(
            "Slice", [offsets, ctx.ints([0]), ctx.ints([-1]), ctx.ints([0])], starts_ty
        )
    n_size = ctx.helper("Shape", [indices], _INT64, start=0, end=1)
    bags_size = ctx.helper("Shape", [starts], _INT64, start=0, end=1)
    # make_offset2bag: a mark at each bag's start (empty bags mark one position
    # twice, trailing ones the position past the end), their running count - 1
    marks_ty = TensorType("int64", (_plus(n, 1),))
    marks = ctx.helper(
        "ScatterElements",
        [
            ctx.helper(
                "ConstantOfShape",
                [ctx.helper("Add", [n_size, ctx.ints([1])], _INT64)],
                marks_ty,
                value=0,
            ),
            starts,
            ctx.helper("ConstantOfShape", [bags_size], starts_ty, value=1),
        ],
        marks_ty,
        axis=0,
        reduction="add",
    )
    counted = ctx.helper("CumSum", [marks, ctx.const(0, "int64")], marks_ty)
    seg_ty = TensorType("int64", (n,))
    bag_of = ctx.helper(
        "Slice",
        [ctx.helper("Sub", [counted, ctx.ints([1])], marks_ty), ctx.ints([0]), ctx.ints([-1])],
        seg_ty,
    )
    rows_size = bags_size
    rows_n: Dim = bags
    if pad >= 0:  # padding positions go to one more bag, dropped at the end
        is_pad = ctx.helper("Equal", [indices, ctx.const(pad, it.dtype)], TensorType("bool", (n,)))
        bag_of = ctx.helper("Where", [is_pad, bags_size, bag_of], seg_ty)
        rows_size = ctx.helper("Add", [bags_size, ctx.ints([1])], _INT64)
        rows_n = _plus(bags, 1)
    rows_ty = TensorType(dt, (n, dim))
    rows = _weighted_rows(ctx, indices, rows_ty)
    acc_ty = TensorType(dt, (rows_n, dim))
    where = ctx.helper(
        "Expand",
        [
            ctx.helper("Unsqueeze", [bag_of, ctx.ints([1])], TensorType("int64", (n, 1))),
            ctx.helper("Shape", [rows], TensorType("int64", (2,))),
        ],
        TensorType("int64", (n, dim)),
    )
    acc_shape = ctx.helper(
        "Concat",
        [rows_size, ctx.helper("Shape", [ctx.t(0)], _INT64, start=1, end=2)],
        TensorType("int64", (2,)),
        axis=0,
    )
    initial = ctx.helper(
        "ConstantOfShape", [acc_shape], acc_ty, value=_lowest(dt) if mode == _MAX else 0.0
    )
    reduced = ctx.helper(
        "ScatterElements",
        [initial, where, rows],
        acc_ty,
        axis=0,
        reduction="max" if mode == _MAX else "add",
    )
    counts: str | None = None
    if mode != _SUM:
        counts_ty = TensorType(dt, (rows_n,))
        counts = ctx.helper(
            "ScatterElements",
            [
                ctx.helper("ConstantOfShape", [rows_size], counts_ty, value=0.0),
                bag_of,
                ctx.helper("ConstantOfShape", [n_size], TensorType(dt, (n,)), value=1.0),
            ],
            counts_ty,
            axis=0,
            reduction="add",
        )
        counts = ctx.helper("Unsqueeze", [counts, ctx.ints([1])], TensorType(dt, (rows_n, 1)))
    if pad >= 0:
        drop_last = [ctx.ints([0]), ctx.ints([-1]), ctx.ints([0])]
        reduced = ctx.helper("Slice", [reduced, *drop_last], out)
        if counts is not None:
            counts = ctx.helper("Slice", [counts, *drop_last], TensorType(dt, (bags, 1)))
    if counts is None:
        return reduced
    return _per_count(ctx, mode, reduced, counts)
