"""Aten rules for element-wise math and reductions torch has kernels for and
ONNX has no single op for: variance and standard deviation, logsumexp,
products, argmin, flips and rolls, GLU, PReLU, thresholds and shrinks, lerp,
log2 and log10, logit, sign, and log1p and expm1 (tracelog ops: each target
runs its own accurate kernel). Each is written from the op's definition in
torch (aten/src/ATen/native), with existing IR ops, as a program of the
same meaning on every target.

Registered into ``ATEN`` on import (the last line of ``rules.py`` imports this
module).
"""

from __future__ import annotations

import math
from typing import Any

from tracelog.adapters.builder import Converter, Ctx, NotSupported
from tracelog.adapters.torch.rules import ATEN, Names, _axes, _vector_norm, argmax_of
from tracelog.ir import TensorType, is_symbolic

_INT64_MAX = 2**63 - 1


def _reduced_axes(ctx: Ctx, dims: Any) -> list[int]:
    """The axes a reduction's `dim` names (None or empty: every axis), each in
    [0, rank)."""
    rank = len(ctx.in_type(0).shape)
    axes = _axes(dims)
    return list(range(rank)) if not axes else sorted(int(a) % rank for a in axes)


def _count(ctx: Ctx, axes: list[int], dtype: str) -> str | float:
    """How many elements each reduction takes: a number where the reduced
    sizes are, else a scalar computed from the input's shape (the batch)."""
    shape = ctx.in_type(0).shape
    if not any(is_symbolic(shape[a]) for a in axes):
        return float(math.prod(int(shape[a]) for a in axes))
    sizes = ctx.helper("Shape", [ctx.t(0)], TensorType("int64", (len(shape),)))
    picked = ctx.helper(
        "Gather", [sizes, ctx.ints(axes)], TensorType("int64", (len(axes),)), axis=0
    )
    n = ctx.helper("ReduceProd", [picked], TensorType("int64", ()), keepdims=0)
    return ctx.helper("Cast", [n], TensorType(dtype, ()), to=dtype)


def _moments(ctx: Ctx, root: bool) -> Names:
    """var / std (.correction) and var_mean / std_mean: the sum of squared
    deviations from the mean over (n - correction), as torch's kernel; the
    deviations are taken from a mean whose gradient is stopped (their sum is
    0, so the gradient is torch's, 2 (x - mean) / (n - correction), with no
    rounding noise through the mean)."""
    x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    dt = out.dtype
    axes = _reduced_axes(ctx, ctx.arg(1, "dim"))
    correction = ctx.arg(2, "correction")
    correction = 1.0 if correction is None else float(correction)
    keep = int(bool(ctx.arg(3, "keepdim", False)))
    kept = TensorType(dt, tuple(1 if i in axes else d for i, d in enumerate(src.shape)))
    mean = ctx.helper("ReduceMean", [x, ctx.ints(axes)], kept, keepdims=1)
    frozen = ctx.helper("StopGradient", [mean], kept, domain="tracelog")
    deviation = ctx.helper("Sub", [x, frozen], src)
    squares = ctx.helper("Mul", [deviation, deviation], src)
    total = ctx.helper("ReduceSum", [squares, ctx.ints(axes)], out, keepdims=keep)
    n = _count(ctx, axes, dt)
    if isinstance(n, float):
        if n - correction <= 0:
            raise NotSupported(f"a variance of {n:g} values with correction {correction:g}")
        denominator = ctx.const(n - correction, dt)
    else:
        denominator = ctx.helper("Sub", [n, ctx.const(correction, dt)], TensorType(dt, ()))
    two = ctx.rec.n_returned == 2  # var_mean / std_mean: (var, mean)
    if not root:
        var = ctx.one("Div", [total, denominator])[0]
        return [var, _mean_out(ctx, x, axes, keep)] if two else [var]
    var = ctx.helper("Div", [total, denominator], out)
    # torch's std gradient is 0 where std is 0 (std_backward masks it); sqrt's
    # is inf there: the root is taken of 1 where var is 0, its result replaced
    zero = ctx.helper("Equal", [var, ctx.const(0.0, dt)], TensorType("bool", out.shape))
    safe = ctx.helper("Where", [zero, ctx.const(1.0, dt), var], out)
    root_of = ctx.helper("Sqrt", [safe], out)
    std = ctx.one("Where", [zero, ctx.const(0.0, dt), root_of])[0]
    return [std, _mean_out(ctx, x, axes, keep)] if two else [std]


def _mean_out(ctx: Ctx, x: str, axes: list[int], keep: int) -> str:
    return ctx.helper("ReduceMean", [x, ctx.ints(axes)], ctx.out_type(1), keepdims=keep)


@ATEN.register("aten.var.correction", "aten.var_mean.correction")
def _var(ctx: Ctx) -> Names:
    return _moments(ctx, root=False)


@ATEN.register("aten.std.correction", "aten.std_mean.correction")
def _std(ctx: Ctx) -> Names:
    return _moments(ctx, root=True)


@ATEN.register("aten.logsumexp.default")
def _logsumexp(ctx: Ctx) -> Names:
    # log(sum(exp(x - m))) + m, m the largest value (0 where it is infinite), as
    # torch's kernel; m's gradient is stopped: its two terms cancel exactly, and
    # the gradient is then torch's, softmax(x)
    x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    dt = out.dtype
    axes = _reduced_axes(ctx, ctx.arg(1, "dim"))
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    kept = TensorType(dt, tuple(1 if i in axes else d for i, d in enumerate(src.shape)))
    m = ctx.helper("ReduceMax", [x, ctx.ints(axes)], kept, keepdims=1)
    infinite = ctx.helper(
        "Equal",
        [ctx.helper("Abs", [m], kept), ctx.const(math.inf, dt)],
        TensorType("bool", kept.shape),
    )
    m = ctx.helper("Where", [infinite, ctx.const(0.0, dt), m], kept)
    m = ctx.helper("StopGradient", [m], kept, domain="tracelog")
    shifted = ctx.helper("Exp", [ctx.helper("Sub", [x, m], src)], src)
    total = ctx.helper("ReduceSum", [shifted, ctx.ints(axes)], out, keepdims=keep)
    if not keep:
        m = ctx.helper("Squeeze", [m, ctx.ints(axes)], out)
    return ctx.one("Add", [ctx.helper("Log", [total], out), m])


@ATEN.register("aten.prod.dim_int", "aten.prod.default")
def _prod(ctx: Ctx) -> Names:
    x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    if src.dtype != out.dtype:  # dtype=, or ints in int64: the product runs in it
        x = ctx.helper("Cast", [x], TensorType(out.dtype, src.shape), to=out.dtype)
    if ctx.rec.op == "aten.prod.default":
        return ctx.one("ReduceProd", [x], keepdims=0)
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    return ctx.one("ReduceProd", [x, ctx.ints([int(ctx.arg(1, "dim"))])], keepdims=keep)


@ATEN.register("aten.argmin.default")
def _argmin(ctx: Ctx) -> Names:
    # the first index of the least value is the first index of the largest negation
    return argmax_of(ctx, ctx.helper("Neg", [ctx.t(0)], ctx.in_type(0)))


@ATEN.register("aten.flip.default")
def _flip(ctx: Ctx) -> Names:
    rank = len(ctx.in_type(0).shape)
    dims = sorted({int(d) % rank for d in ctx.arg(1, "dims")})
    if not dims:
        return [ctx.t(0)]
    k = len(dims)
    return ctx.one(
        "Slice",
        [
            ctx.t(0),
            ctx.ints([-1] * k),
            ctx.ints([-_INT64_MAX] * k),
            ctx.ints(dims),
            ctx.ints([-1] * k),
        ],
    )


@ATEN.register("aten.roll.default")
def _roll(ctx: Ctx) -> Names:
    # each dim in turn: its last `shift` entries, then the rest
    xt = ctx.in_type(0)
    shifts, dims = list(ctx.arg(1, "shifts")), list(ctx.arg(2, "dims", []))
    if not dims or len(dims) != len(shifts):
        raise NotSupported("a roll of the flattened tensor")
    y = ctx.t(0)
    steps = [(int(s), int(d) % len(xt.shape)) for s, d in zip(shifts, dims, strict=True)]
    for k, (shift, dim) in enumerate(steps):
        size = xt.shape[dim]
        if is_symbolic(size):
            raise NotSupported("a roll along the batch or a sequence-long dim")
        cut = int(size) - shift % int(size)
        last = k == len(steps) - 1
        if cut == int(size):  # a whole turn
            if last:
                return ctx.one("Identity", [y])
            continue
        pieces = [_part(ctx, y, xt, dim, cut, int(size)), _part(ctx, y, xt, dim, 0, cut)]
        if last:
            return ctx.one("Concat", pieces, axis=dim)
        y = ctx.helper("Concat", pieces, xt, axis=dim)
    raise AssertionError("unreachable")


def _part(ctx: Ctx, y: str, yt: TensorType, dim: int, lo: int, hi: int) -> str:
    """y[lo:hi] along dim."""
    shape = tuple(hi - lo if i == dim else d for i, d in enumerate(yt.shape))
    ends = [ctx.ints([lo]), ctx.ints([hi]), ctx.ints([dim])]
    return ctx.helper("Slice", [y, *ends], TensorType(yt.dtype, shape))


@ATEN.register("aten.glu.default")
def _glu(ctx: Ctx) -> Names:
    # the first half times the sigmoid of the second, along `dim`
    xt, out = ctx.in_type(0), ctx.out_type()
    dim = int(ctx.arg(1, "dim", -1)) % len(xt.shape)
    size = xt.shape[dim]
    if is_symbolic(size):
        raise NotSupported("a GLU along the batch or a sequence-long dim")
    half = int(size) // 2
    first, second = ctx.node("Split", [ctx.t(0), ctx.ints([half, half])], outs=[out, out], axis=dim)
    return ctx.one("Mul", [first, ctx.helper("Sigmoid", [second], out)])


@ATEN.register("aten._prelu_kernel.default")
def _prelu(ctx: Ctx) -> Names:
    # x where x > 0, else weight * x (the weight shaped by torch to broadcast)
    out = ctx.out_type()
    x = ctx.t(0)
    positive = ctx.helper("Greater", [x, ctx.const(0.0, out.dtype)], TensorType("bool", out.shape))
    return ctx.one("Where", [positive, x, ctx.helper("Mul", [ctx.t(1), x], out)])


@ATEN.register("aten.threshold.default", "aten.threshold_.default")
def _threshold(ctx: Ctx) -> Names:
    # x where x > threshold, else value
    out = ctx.out_type()
    x = ctx.t(0)
    above = ctx.helper(
        "Greater", [x, ctx.const(float(ctx.arg(1)), out.dtype)], TensorType("bool", out.shape)
    )
    return ctx.one("Where", [above, x, ctx.const(float(ctx.arg(2)), out.dtype)])


@ATEN.register("aten.hardshrink.default")
def _hardshrink(ctx: Ctx) -> Names:
    # x where |x| > lambd, else 0
    out = ctx.out_type()
    x = ctx.t(0)
    lambd = float(ctx.arg(1, "lambd", 0.5))
    outside = ctx.helper(
        "Greater",
        [ctx.helper("Abs", [x], out), ctx.const(lambd, out.dtype)],
        TensorType("bool", out.shape),
    )
    return ctx.one("Where", [outside, x, ctx.const(0.0, out.dtype)])


@ATEN.register("aten.softshrink.default")
def _softshrink(ctx: Ctx) -> Names:
    # x - lambd above lambd, x + lambd below -lambd, else 0
    out = ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    x = ctx.t(0)
    lambd = float(ctx.arg(1, "lambd", 0.5))
    above = ctx.helper("Greater", [x, ctx.const(lambd, dt)], mask)
    below = ctx.helper("Less", [x, ctx.const(-lambd, dt)], mask)
    lowered = ctx.helper("Sub", [x, ctx.const(lambd, dt)], out)
    raised = ctx.helper("Add", [x, ctx.const(lambd, dt)], out)
    inner = ctx.helper("Where", [below, raised, ctx.const(0.0, dt)], out)
    return ctx.one("Where", [above, lowered, inner])


@ATEN.register("aten.lerp.Scalar")
def _lerp(ctx: Ctx) -> Names:
    # as torch's kernel: start + w (end - start) for |w| < 0.5, else
    # end - (end - start)(1 - w), the form exact at w = 1
    out = ctx.out_type()
    start, end, w = ctx.t(0), ctx.t(1), float(ctx.arg(2, "weight"))
    diff = ctx.helper("Sub", [end, start], out)
    if abs(w) < 0.5:
        step = ctx.helper("Mul", [diff, ctx.const(w, out.dtype)], out)
        return ctx.one("Add", [start, step])
    step = ctx.helper("Mul", [diff, ctx.const(1.0 - w, out.dtype)], out)
    return ctx.one("Sub", [end, step])


def _log_base(base: float) -> Converter:
    def rule(ctx: Ctx) -> Names:
        # log(x) / log(base): one rounding more than torch's own kernel
        out = ctx.out_type()
        log = ctx.helper("Log", [ctx.t(0)], out)
        return ctx.one("Div", [log, ctx.const(math.log(base), out.dtype)])

    return rule


ATEN.update_from(["aten.log2.default", "aten.log2_.default"], _log_base(2.0))
ATEN.update_from(["aten.log10.default", "aten.log10_.default"], _log_base(10.0))


@ATEN.register("aten.logit.default", "aten.logit_.default")
def _logit(ctx: Ctx) -> Names:
    # log(z / (1 - z)), z = x clamped to [eps, 1 - eps] where eps is given
    out = ctx.out_type()
    dt = out.dtype
    z = ctx.t(0)
    eps = ctx.arg(1, "eps")
    if eps is not None:
        z = ctx.helper("Clip", [z, ctx.const(float(eps), dt), ctx.const(1.0 - float(eps), dt)], out)
    rest = ctx.helper("Sub", [ctx.const(1.0, dt), z], out)
    return ctx.one("Log", [ctx.helper("Div", [z, rest], out)])


@ATEN.register("aten.sign.default", "aten.sign_.default")
def _sign(ctx: Ctx) -> Names:
    # (x > 0) - (x < 0), in x's dtype; no gradient, as torch's
    out = ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    x = ctx.t(0)
    zero = ctx.const(0.0 if dt.startswith(("float", "bfloat")) else 0, dt)
    positive = ctx.helper("Cast", [ctx.helper("Greater", [x, zero], mask)], out, to=dt)
    negative = ctx.helper("Cast", [ctx.helper("Less", [x, zero], mask)], out, to=dt)
    return ctx.one("Sub", [positive, negative])


@ATEN.register("aten.log1p.default", "aten.log1p_.default")
def _log1p(ctx: Ctx) -> Names:
    return ctx.one("Log1p", [ctx.t(0)], domain="tracelog")


@ATEN.register("aten.expm1.default", "aten.expm1_.default")
def _expm1(ctx: Ctx) -> Names:
    return ctx.one("Expm1", [ctx.t(0)], domain="tracelog")


@ATEN.register("aten.mv.default")
def _mv(ctx: Ctx) -> Names:
    # a matrix times a vector, as a matrix times a one-column matrix: every
    # target's MatMul takes that (TensorFlow's takes no 1-D operand)
    vt, out = ctx.in_type(1), ctx.out_type()
    column = ctx.helper(
        "Unsqueeze", [ctx.t(1), ctx.ints([1])], TensorType(vt.dtype, (*vt.shape, 1))
    )
    product = ctx.helper("MatMul", [ctx.t(0), column], TensorType(out.dtype, (*out.shape, 1)))
    return ctx.one("Squeeze", [product, ctx.ints([1])])


@ATEN.register("aten.norm.ScalarOpt_dim")
def _norm(ctx: Ctx) -> Names:
    # torch.norm(x, p, dim, keepdim) (F.pairwise_distance): the vector norm of order p
    if ctx.arg(1, "p") is None:
        raise NotSupported("torch.norm without an order")
    return _vector_norm(ctx)


@ATEN.register("aten.clamp_min.Tensor", "aten.clamp_min_.Tensor")
def _clamp_min_tensor(ctx: Ctx) -> Names:
    return ctx.one("Max", [ctx.t(0), ctx.t(1)])


@ATEN.register("aten.clamp_max.Tensor", "aten.clamp_max_.Tensor")
def _clamp_max_tensor(ctx: Ctx) -> Names:
    return ctx.one("Min", [ctx.t(0), ctx.t(1)])
