"""TensorFlow ops that keras.ops writes in custom layers and losses: ranking
(TopKV2, ArgMax, ArgMin and the sign-bit test Keras puts around them), scans
(Cumsum with exclusive and reverse), rolls and mirrored padding, one-hot,
segment sums, cross products and broadcasting, a matrix's diagonal, and the
element-wise Sign, Ceil, IsFinite, Any and All. Each from the op's meaning
in TensorFlow's documentation, in the IR ops the PyTorch rules use for the
same meanings."""

from __future__ import annotations

import numpy as np

from tracelog.adapters.arith import sign_of
from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.ir import TensorType, is_symbolic

from .rules import TF_OPS, Names, _axes_of, attr, attr_int, const_array

_INT32_MIN = -(2**31)


def _static(ctx: Ctx, n: int | str, what: str) -> int:
    if is_symbolic(n):
        raise NotSupported(f"{ctx.rec.op} {what} of a batch-sized dim")
    return int(n)


def _flipped(ctx: Ctx, x: str, ty: TensorType, axis: int) -> str:
    big = 2**62
    ins = [x, ctx.ints([-1]), ctx.ints([-big]), ctx.ints([axis]), ctx.ints([-1])]
    return ctx.helper("Slice", ins, ty)


# -- element-wise ------------------------------------------------------------------------------------
@TF_OPS.register("tf.Sign")
def _sign(ctx: Ctx) -> Names:
    return [sign_of(ctx, ctx.t(0), ctx.out_type())]


@TF_OPS.register("tf.Ceil")
def _ceil(ctx: Ctx) -> Names:
    return ctx.one("Ceil", [ctx.t(0)])


@TF_OPS.register("tf.IsFinite")
def _is_finite(ctx: Ctx) -> Names:
    # x - x is 0 exactly for a finite x, NaN for an infinity or a NaN
    xt = ctx.in_type(0)
    x = ctx.t(0)
    diff = ctx.helper("Sub", [x, x], xt)
    return ctx.one("Equal", [diff, ctx.const(0.0, xt.dtype)])


def _any_all(op: str, ctx: Ctx) -> Names:
    # whether some (every) element along the axes holds: a max (min) of 0/1 ints
    xt, out = ctx.in_type(0), ctx.out_type()
    ones = ctx.helper("Cast", [ctx.t(0)], TensorType("int32", xt.shape), to="int32")
    if not xt.shape:
        return ctx.one("Cast", [ones], to="bool")
    keep = int(bool(attr(ctx, "keep_dims", False)))
    axes = [a % len(xt.shape) for a in _axes_of(ctx, 1)]
    reduced = ctx.helper(op, [ones, ctx.ints(axes)], TensorType("int32", out.shape), keepdims=keep)
    return ctx.one("Cast", [reduced], to="bool")


@TF_OPS.register("tf.Any")
def _any(ctx: Ctx) -> Names:
    return _any_all("ReduceMax", ctx)


@TF_OPS.register("tf.All")
def _all(ctx: Ctx) -> Names:
    return _any_all("ReduceMin", ctx)


# -- ranking --------------------------------------------------------------------------------------
@TF_OPS.register("tf.TopKV2")
def _top_k(ctx: Ctx) -> Names:
    # the k largest along the last axis, in order, the lower index first among
    # equals (TensorFlow's and ONNX's rule alike); indices as TF types them
    xt, values_t, indices_t = ctx.in_type(0), ctx.out_type(0), ctx.out_type(1)
    k_arr = const_array(ctx, 1)
    if k_arr is not None:
        k = ctx.ints([int(k_arr)])
    elif values_t.shape[-1] == xt.shape[-1]:  # tf.sort: k computed as the axis' size
        k = ctx.b_dim(xt.shape[-1])
    else:
        raise NotSupported("top_k of a computed k other than the axis' size")
    if not bool(attr(ctx, "sorted", True)):
        raise NotSupported("top_k with sorted=False (an order TensorFlow leaves open)")
    values, indices = ctx.node(
        "TopK",
        [ctx.t(0), k],
        outs=[values_t, TensorType("int64", indices_t.shape)],
        axis=len(xt.shape) - 1,
        largest=1,
        sorted=1,
    )
    if indices_t.dtype != "int64":
        indices = ctx.helper("Cast", [indices], indices_t, to=indices_t.dtype)
    return [values, indices]


def _arg(ctx: Ctx, negate: bool) -> Names:
    # the first index of the largest (smallest: of the largest negation) value
    xt, out = ctx.in_type(0), ctx.out_type()
    axes = _axes_of(ctx, 1)
    x = ctx.helper("Neg", [ctx.t(0)], xt) if negate else ctx.t(0)
    index = ctx.helper(
        "ArgMax", [x], TensorType("int64", out.shape), axis=axes[0] % len(xt.shape), keepdims=0
    )
    return [index] if out.dtype == "int64" else ctx.one("Cast", [index], to=out.dtype)


@TF_OPS.register("tf.ArgMax")
def _argmax(ctx: Ctx) -> Names:
    return _arg(ctx, negate=False)


@TF_OPS.register("tf.ArgMin")
def _argmin(ctx: Ctx) -> Names:
    return _arg(ctx, negate=True)


@TF_OPS.register("tf.Bitcast")
def _bitcast(ctx: Ctx) -> Names:
    # float32 bits as int32: kept aside, for the sign-bit test Keras' signbit
    # writes with it (BitwiseAnd with int32's minimum, below)
    xt, out = ctx.in_type(0), ctx.out_type()
    if (xt.dtype, out.dtype) != ("float32", "int32"):
        raise NotSupported(f"a bitcast of {xt.dtype} to {out.dtype}")
    name = ctx.b.helper_name()
    ctx.b.pseudo[name] = ("bitcast", ctx.t(0))
    return [name]


@TF_OPS.register("tf.BitwiseAnd")
def _bitwise_and(ctx: Ctx) -> Names:
    # bitcast(x) & int32 min: the sign bit, as int32 min where x's is set (1 / x
    # < 0: -0.0 included) and 0 elsewhere
    info = ctx.b.pseudo.get(ctx.raw_name(0))
    mask = const_array(ctx, 1)
    if info is None or info[0] != "bitcast" or mask is None or np.any(mask != _INT32_MIN):
        raise NotSupported("a bitwise and other than a float's sign-bit test")
    out = ctx.out_type()
    x = str(info[1])
    xt = TensorType("float32", out.shape)
    inverse = ctx.helper("Reciprocal", [x], xt)
    negative = ctx.helper(
        "Less", [inverse, ctx.const(0.0, "float32")], TensorType("bool", out.shape)
    )
    return ctx.one("Where", [negative, ctx.const(_INT32_MIN, "int32"), ctx.const(0, "int32")])


# -- scans, rolls, padding -----------------------------------------------------------------------
def _scan(ctx: Ctx, op: str, identity: int) -> Names:
    # the running sum (product) along an axis; reverse: the scan of the flipped
    # axis, flipped back; exclusive: each position's scan of those before it,
    # the inclusive scan shifted by one with the identity (0, 1) first
    xt = ctx.in_type(0)
    axis_arr = const_array(ctx, 1)
    if axis_arr is None:
        raise NotSupported(f"{ctx.rec.op} over a computed axis")
    rank = len(xt.shape)
    axis = int(axis_arr) % max(rank, 1)
    reverse, exclusive = bool(attr(ctx, "reverse", False)), bool(attr(ctx, "exclusive", False))
    x = ctx.t(0)
    if reverse:
        x = _flipped(ctx, x, xt, axis)
    if op == "CumSum":
        y = ctx.helper("CumSum", [x, ctx.const(axis, "int64")], xt)
    else:
        y = ctx.helper(op, [x], xt, domain="tracelog", axis=axis)
    if exclusive:
        n = _static(ctx, xt.shape[axis], "exclusive scan")
        shape = tuple(n - 1 if k == axis else d for k, d in enumerate(xt.shape))
        head = ctx.helper(
            "Slice",
            [y, ctx.ints([0]), ctx.ints([n - 1]), ctx.ints([axis])],
            TensorType(xt.dtype, shape),
        )
        pads = [1 if k == axis else 0 for k in range(rank)] + [0] * rank
        pad_ins = [head, ctx.ints(pads)]
        if identity:  # a product's shift fills with 1
            one = 1 if xt.dtype.startswith(("int", "uint")) else 1.0
            pad_ins.append(ctx.const(one, xt.dtype))
        y = ctx.helper("Pad", pad_ins, xt, mode="constant")
    if reverse:
        y = _flipped(ctx, y, xt, axis)
    return [y]


@TF_OPS.register("tf.Cumsum")
def _cumsum(ctx: Ctx) -> Names:
    return _scan(ctx, "CumSum", 0)


@TF_OPS.register("tf.Cumprod")
def _cumprod(ctx: Ctx) -> Names:
    # tracelog.CumProd (ONNX has no running product); its gradient is each
    # target's autodiff of its cumprod, TensorFlow's for nonzero x (TF divides
    # by x)
    return _scan(ctx, "CumProd", 1)


@TF_OPS.register("tf.Roll")
def _roll(ctx: Ctx) -> Names:
    # along each axis, the last `shift` entries, then the rest
    xt = ctx.in_type(0)
    shifts, axes = const_array(ctx, 1), const_array(ctx, 2)
    if shifts is None or axes is None:
        raise NotSupported("a roll by a computed shift or axis")
    rank = len(xt.shape)
    y = ctx.t(0)
    for shift, axis in zip(shifts.reshape(-1), axes.reshape(-1), strict=True):
        a = int(axis) % rank
        n = _static(ctx, xt.shape[a], "roll")
        s = int(shift) % n
        if not s:
            continue

        tail, head = _part(ctx, y, xt, a, n - s, n), _part(ctx, y, xt, a, 0, n - s)
        y = ctx.helper("Concat", [tail, head], xt, axis=a)
    return [y]


def _part(ctx: Ctx, y: str, xt: TensorType, axis: int, lo: int, hi: int) -> str:
    shape = tuple(hi - lo if k == axis else d for k, d in enumerate(xt.shape))
    ins = [y, ctx.ints([lo]), ctx.ints([hi]), ctx.ints([axis])]
    return ctx.helper("Slice", ins, TensorType(xt.dtype, shape))


@TF_OPS.register("tf.MirrorPad")
def _mirror_pad(ctx: Ctx) -> Names:
    # each padded axis gathered by the indices its mirror reads: REFLECT leaves
    # the edge out of the mirror (d c | a b c d | b a), SYMMETRIC repeats it
    # (b a | a b c d | d c); Gather's gradient adds up the repeats
    xt, out = ctx.in_type(0), ctx.out_type()
    pads = const_array(ctx, 1)
    if pads is None:
        raise NotSupported("paddings computed at run time")
    mode = str(attr(ctx, "mode", "REFLECT")).upper()
    edge = 0 if mode == "SYMMETRIC" else 1
    y, shape = ctx.t(0), list(xt.shape)
    for axis, (before, after) in enumerate(pads.reshape(-1, 2).tolist()):
        if not before and not after:
            continue
        n = _static(ctx, xt.shape[axis], "mirror padding")
        left = [before - k - 1 + edge for k in range(before)]
        right = [n - 1 - edge - k for k in range(after)]
        index = left + list(range(n)) + right
        shape[axis] = len(index)
        y = ctx.helper(
            "Gather", [y, ctx.ints(index)], TensorType(xt.dtype, tuple(shape)), axis=axis
        )
    if tuple(shape) != tuple(out.shape):
        raise NotSupported(f"mirror padding gave {tuple(shape)}, not {tuple(out.shape)}")
    return [y]


# -- one-hot, segments, cross products ------------------------------------------------------------
@TF_OPS.register("tf.OneHot")
def _one_hot(ctx: Ctx) -> Names:
    # on_value where the index equals the position along the new axis, else
    # off_value (an index out of range, negative included, is all off)
    it, out = ctx.in_type(0), ctx.out_type()
    depth = const_array(ctx, 1)
    if depth is None:
        raise NotSupported("one_hot of a computed depth")
    rank = len(out.shape)
    axis = attr_int(ctx, "axis", -1) % rank
    index = ctx.helper(
        "Unsqueeze",
        [ctx.t(0), ctx.ints([axis])],
        TensorType(it.dtype, tuple(it.shape[:axis]) + (1,) + tuple(it.shape[axis:])),
    )
    positions = np.arange(int(depth), dtype=np.dtype(it.dtype)).reshape(
        (int(depth),) + (1,) * (rank - 1 - axis)
    )
    hit = ctx.helper(
        "Equal", [index, ctx.const(positions, it.dtype)], TensorType("bool", out.shape)
    )
    return ctx.one("Where", [hit, ctx.t(2), ctx.t(3)])


@TF_OPS.register("tf.UnsortedSegmentSum")
def _unsorted_segment_sum(ctx: Ctx) -> Names:
    # data's rows added into num_segments rows by their segment ids (ids of
    # the rows: rank 1), a scatter with add into zeros
    dt, it, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    if len(it.shape) != 1:
        raise NotSupported("segment ids of rank other than 1")
    ids = ctx.t(1)
    if it.dtype != "int64":
        ids = ctx.helper("Cast", [ids], TensorType("int64", it.shape), to="int64")
    rank = len(dt.shape)
    if rank > 1:
        column = ctx.helper(
            "Reshape",
            [ids, ctx.ints([-1] + [1] * (rank - 1))],
            TensorType("int64", (it.shape[0],) + (1,) * (rank - 1)),
        )
        shape = ctx.helper("Shape", [ctx.t(0)], TensorType("int64", (rank,)))
        ids = ctx.helper("Expand", [column, shape], TensorType("int64", dt.shape))
    shape = (
        ctx.dynamic_shape(list(out.shape))
        if any(is_symbolic(d) for d in out.shape)
        else ctx.ints([int(d) for d in out.shape])
    )
    zero = 0 if out.dtype.startswith(("int", "uint")) else 0.0
    zeros = ctx.helper("ConstantOfShape", [shape], out, value=zero)
    return ctx.one("ScatterElements", [zeros, ids, ctx.t(0)], axis=0, reduction="add")


@TF_OPS.register("tf.Cross")
def _cross(ctx: Ctx) -> Names:
    # a x b along the last axis (of size 3): a[i+1] b[i+2] - a[i+2] b[i+1]
    out = ctx.out_type()
    axis = len(out.shape) - 1

    def turned(i: int, shift: int) -> str:
        index = ctx.ints([(k + shift) % 3 for k in range(3)])
        return ctx.helper("Gather", [ctx.t(i), index], ctx.in_type(i), axis=axis)

    first = ctx.helper("Mul", [turned(0, 1), turned(1, 2)], out)
    second = ctx.helper("Mul", [turned(0, 2), turned(1, 1)], out)
    return ctx.one("Sub", [first, second])


@TF_OPS.register("tf.BroadcastArgs")
def _broadcast_args(ctx: Ctx) -> Names:
    # the broadcast of two shapes: folded where both are known, else (equal
    # ranks, as broadcast_dynamic_shape of two tensors of one rank gives) the
    # larger of each pair of dims: each is the other or 1
    a, b = const_array(ctx, 0), const_array(ctx, 1)
    out = ctx.out_type()
    if a is not None and b is not None:
        shape = np.broadcast_shapes(tuple(a.tolist()), tuple(b.tolist()))
        return [ctx.const(np.asarray(shape, dtype=np.dtype(out.dtype)), out.dtype)]
    if ctx.in_type(0).shape != ctx.in_type(1).shape:
        raise NotSupported("the broadcast of shapes of different ranks computed at run time")
    return ctx.one("Max", [ctx.t(0), ctx.t(1)])


@TF_OPS.register("tf.BroadcastTo")
def _broadcast_to(ctx: Ctx) -> Names:
    # to the recorded output's shape, computed where it follows the batch (the
    # shape argument: Keras builds it from the static shapes of this batch); a
    # broadcast to the input's own shape is the input
    xt, out = ctx.in_type(0), ctx.out_type()
    if tuple(xt.shape) == tuple(out.shape):
        return [ctx.t(0)]
    dims = list(out.shape)
    if any(map(is_symbolic, dims)):
        shape = ctx.dynamic_shape(dims)
    else:
        shape = ctx.ints([int(d) for d in dims])
    return ctx.one("Expand", [ctx.t(0), shape])


@TF_OPS.register("tf.MatrixDiagPartV3")
def _matrix_diag_part(ctx: Ctx) -> Names:
    # the main diagonal of the last two dims (k = 0): each row's element on it
    # kept (Where: what is elsewhere, -inf included, stays out) and summed over
    # the columns, the rows past the shorter side cut
    xt, out = ctx.in_type(0), ctx.out_type()
    k = const_array(ctx, 1)
    if k is None or np.any(k != 0):
        raise NotSupported("a diagonal other than the main one")
    n = _static(ctx, xt.shape[-2], "diagonal")
    m = _static(ctx, xt.shape[-1], "diagonal")
    on = ctx.const(np.eye(n, m, dtype=bool), "bool")
    zero = ctx.const(0 if xt.dtype.startswith(("int", "uint")) else 0.0, xt.dtype)
    kept = ctx.helper("Where", [on, ctx.t(0), zero], xt)
    summed = TensorType(xt.dtype, tuple(xt.shape[:-1]))
    if n <= m:
        return ctx.one("ReduceSum", [kept, ctx.ints([-1])], keepdims=0)
    rows = ctx.helper("ReduceSum", [kept, ctx.ints([-1])], summed, keepdims=0)
    return ctx.one("Slice", [rows, ctx.ints([0]), ctx.ints([int(out.shape[-1])]), ctx.ints([-1])])


def _main_diagonal(ctx: Ctx, k_index: int, diag_index: int) -> tuple[str, str]:
    """For a matrix op writing its main diagonal (k = 0) into the recorded
    output: the [M, N] mask of that diagonal, and the diagonal (argument
    diag_index, [..., min(M, N)]) unsqueezed to broadcast onto it: along the
    rows' axis where M <= N (row i holds diag[i]), else the columns'."""
    k = const_array(ctx, k_index)
    if k is None or np.any(k != 0):
        raise NotSupported(f"{ctx.rec.op} of a diagonal other than the main one")
    out, dt = ctx.out_type(), ctx.in_type(diag_index)
    m = _static(ctx, out.shape[-2], "diagonal")
    n = _static(ctx, out.shape[-1], "diagonal")
    if not dt.shape or dt.shape[-1] != min(m, n):
        raise NotSupported(f"{ctx.rec.op} of a diagonal not of the matrix's length")
    mask = ctx.const(np.eye(m, n, dtype=bool), "bool")
    axis = len(dt.shape) if m <= n else len(dt.shape) - 1
    shape = list(dt.shape)
    shape.insert(axis, 1)
    diag = ctx.helper(
        "Unsqueeze", [ctx.t(diag_index), ctx.ints([axis])], TensorType(dt.dtype, tuple(shape))
    )
    return mask, diag


@TF_OPS.register("tf.MatrixSetDiagV3")
def _matrix_set_diag(ctx: Ctx) -> Names:
    # the input with its main diagonal replaced (tf.eye of computed sizes, which
    # keras.ops.trace masks with): Where, so the diagonal's gradient goes to
    # `diagonal` and the rest's to `input`, as TensorFlow's
    mask, diag = _main_diagonal(ctx, 2, 1)
    return _select(ctx, mask, diag, ctx.t(0))


@TF_OPS.register("tf.MatrixDiagV3")
def _matrix_diag(ctx: Ctx) -> Names:
    # a matrix with `diagonal` on its main diagonal and padding_value elsewhere
    # (tf.eye, tf.linalg.diag); its size is the recorded output's
    mask, diag = _main_diagonal(ctx, 1, 0)
    return _select(ctx, mask, diag, ctx.t(4))


def _select(ctx: Ctx, mask: str, on: str, off: str) -> Names:
    # Where(mask, on, off); of booleans (keras.ops.trace's tf.eye(..., "bool"))
    # as (mask and on) or (not mask and off): onnxruntime has no boolean Where
    out = ctx.out_type()
    if out.dtype != "bool":
        return ctx.one("Where", [mask, on, off])
    kept = ctx.helper("And", [mask, on], out)
    unmasked = ctx.helper("Not", [mask], ctx.b.values[mask].type)
    rest = ctx.helper("And", [unmasked, off], out)
    return ctx.one("Or", [kept, rest])
