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

import numpy as np

from tracelog.adapters.arith import (
    floor_mod_of,
    fmod_of,
    int_floor_div_of,
    is_int,
    nonzero,
    sign_of,
    signs_differ,
    trunc_of,
)
from tracelog.adapters.builder import Converter, Ctx, NotSupported
from tracelog.adapters.tape import TArg
from tracelog.adapters.torch.rules import (
    ATEN,
    INT64_MAX,
    Names,
    _axes,
    _operand,
    _vector_norm,
    argmax_of,
    dim_sub,
    norm_along,
    random_like,
)
from tracelog.ir import TensorType, is_symbolic
from tracelog.ops import TRACELOG_DOMAIN

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


def _shift(ctx: Ctx, x: str, axes: str, kept: TensorType) -> str:
    """logsumexp's shift: the largest value along axes (kept dims), 0 where it
    is infinite, its gradient stopped (its two terms cancel exactly)."""
    dt = kept.dtype
    m = ctx.helper("ReduceMax", [x, axes], kept, keepdims=1)
    infinite = ctx.helper(
        "Equal",
        [ctx.helper("Abs", [m], kept), ctx.const(math.inf, dt)],
        TensorType("bool", kept.shape),
    )
    m = ctx.helper("Where", [infinite, ctx.const(0.0, dt), m], kept)
    return ctx.helper("StopGradient", [m], kept, domain="tracelog")


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
    m = _shift(ctx, x, ctx.ints(axes), kept)
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
            y = _roll_one(ctx, y, xt, dim, shift)
            if k == len(steps) - 1:
                return ctx.one("Identity", [y])
            continue
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


def _roll_one(ctx: Ctx, y: str, yt: TensorType, dim: int, shift: int) -> str:
    """A roll by one step along a symbolic dim (the batch: each sample's
    neighbour as its negative): the last entry, then the rest (or the rest,
    then the first). A longer roll of such a dim depends on its size (torch
    takes the shift modulo it), which batches that share the graph may not have."""
    if shift == 0:
        return y
    if abs(shift) != 1:
        raise NotSupported(f"a roll by {shift} along the batch or a sequence-long dim")
    rest = TensorType(
        yt.dtype, tuple(dim_sub(d, 1) if i == dim else d for i, d in enumerate(yt.shape))
    )
    one = TensorType(yt.dtype, tuple(1 if i == dim else d for i, d in enumerate(yt.shape)))
    axis = ctx.ints([dim])

    def cut(lo: int, hi: int, ty: TensorType) -> str:
        return ctx.helper("Slice", [y, ctx.ints([lo]), ctx.ints([hi]), axis], ty)

    if shift == 1:
        pieces = [cut(-1, INT64_MAX, one), cut(0, -1, rest)]
    else:
        pieces = [cut(1, INT64_MAX, rest), cut(0, 1, one)]
    return ctx.helper("Concat", pieces, yt, axis=dim)


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


@ATEN.register("aten.lerp.Tensor", "aten.lerp_.Tensor")
def _lerp_tensor(ctx: Ctx) -> Names:
    # torch's kernel per element: start + w (end - start) where |w| < 0.5, else
    # end - (end - start)(1 - w) (torch.quantile interpolates so)
    out = ctx.out_type()
    dt = out.dtype
    start, end, w = (_operand(ctx, i, k, dt) for i, k in ((0, "self"), (1, "end"), (2, "weight")))
    diff = ctx.helper("Sub", [end, start], out)
    near = ctx.helper("Add", [start, ctx.helper("Mul", [w, diff], out)], out)
    rest = ctx.helper("Sub", [ctx.const(1.0, dt), w], ctx.in_type(2))
    far = ctx.helper("Sub", [end, ctx.helper("Mul", [diff, rest], out)], out)
    small = ctx.helper(
        "Less",
        [ctx.helper("Abs", [w], ctx.in_type(2)), ctx.const(0.5, dt)],
        TensorType("bool", ctx.in_type(2).shape),
    )
    return ctx.one("Where", [small, near, far])


@ATEN.register("aten.lerp.Scalar", "aten.lerp_.Scalar")
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
    return [sign_of(ctx, ctx.t(0), ctx.out_type())]


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


# -- trigonometric and hyperbolic functions, rounding, special functions ---------------------
# ONNX's op where ONNX has one of torch's meaning (Tan ... Atanh; Round, half to even as
# torch.round); tracelog ops where it has none (each target runs its own kernel).
_FLOAT_UNARY = {
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "erfc": "tracelog.Erfc",
    "erfinv": "tracelog.Erfinv",
    "lgamma": "tracelog.Lgamma",
    "digamma": "tracelog.Digamma",
    "i0": "tracelog.I0",
}


def _float_unary_rule(op: str) -> Converter:
    domain, _, name = op.rpartition(".")

    def rule(ctx: Ctx) -> Names:
        # an integer input is promoted to the result's float dtype first, as torch does
        x = _operand(ctx, 0, "self", ctx.out_type().dtype)
        return ctx.one(name, [x], **({"domain": domain} if domain else {}))

    return rule


for _aten, _op in _FLOAT_UNARY.items():
    ATEN.update_from([f"aten.{_aten}.default", f"aten.{_aten}_.default"], _float_unary_rule(_op))
# torch.special's functions that have no in-place form
_SPECIAL_UNARY = {
    "special_ndtri": "tracelog.Ndtri",
    "special_log_ndtr": "tracelog.LogNdtr",
    "special_i0e": "tracelog.I0e",
    "special_i1": "tracelog.I1",
    "special_i1e": "tracelog.I1e",
}
for _aten, _op in _SPECIAL_UNARY.items():
    ATEN.add(f"aten.{_aten}.default", _float_unary_rule(_op))


@ATEN.register("aten.polygamma.default", "aten.polygamma_.default")
def _polygamma(ctx: Ctx) -> Names:
    # torch.special.polygamma(n, x) (polygamma(n, self); the in-place form is
    # x.polygamma_(n)): order 0 is digamma, 1 trigamma; higher orders have no op
    inplace = ctx.rec.op.startswith("aten.polygamma_")
    n = ctx.arg(1 if inplace else 0, "n")
    ops = {0: "Digamma", 1: "Trigamma"}
    if type(n) is not int or n not in ops:
        raise NotSupported(f"polygamma of order {n!r} (orders 0 and 1 translate)")
    x = _operand(ctx, 0 if inplace else 1, "self", ctx.out_type().dtype)
    return ctx.one(ops[n], [x], domain="tracelog")


@ATEN.register("aten.mvlgamma.default", "aten.mvlgamma_.default")
def _mvlgamma(ctx: Ctx) -> Names:
    # torch.special.multigammaln(x, p): as torch's kernel, sum over i < p of
    # lgamma(x - i / 2) (the shifts -(p - 1) / 2 ... 0 along a new last axis) plus
    # p (p - 1) log(pi) / 4, that constant taken in float64 as torch takes it
    p = ctx.arg(1, "p")
    if type(p) is not int or p < 1:
        raise NotSupported(f"mvlgamma of order {p!r}")
    out = ctx.out_type()
    x = _operand(ctx, 0, "self", out.dtype)
    wide = TensorType(out.dtype, (*out.shape, p))
    column = ctx.helper(
        "Unsqueeze", [x, ctx.ints([len(out.shape)])], TensorType(out.dtype, (*out.shape, 1))
    )
    shifts = ctx.const([-(p - 1) / 2 + k / 2 for k in range(p)], out.dtype)
    args = ctx.helper("Add", [shifts, column], wide)
    logs = ctx.helper("Lgamma", [args], wide, domain="tracelog")
    total = ctx.helper("ReduceSum", [logs, ctx.ints([len(out.shape)])], out, keepdims=0)
    offset = float(p * (p - 1)) * math.log(math.pi) * 0.25
    return ctx.one("Add", [total, ctx.const(offset, out.dtype)])


@ATEN.register("aten.exp2.default", "aten.exp2_.default")
def _exp2(ctx: Ctx) -> Names:
    # 2^x: ONNX Pow with the base 2 (each target's pow; exact where x is an integer)
    dt = ctx.out_type().dtype
    return ctx.one("Pow", [ctx.const(2.0, dt), _operand(ctx, 0, "self", dt)])


@ATEN.register("aten.atan2.default", "aten.atan2_.default")
def _atan2(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    y, x = _operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)
    return ctx.one("Atan2", [y, x], domain="tracelog")


@ATEN.register("aten.hypot.default", "aten.hypot_.default")
def _hypot(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    x, y = _operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)
    return ctx.one("Hypot", [x, y], domain="tracelog")


@ATEN.register(
    "aten.round.default", "aten.round_.default", "aten.round.decimals", "aten.round_.decimals"
)
def _round(ctx: Ctx) -> Names:
    # nearbyint (half to even) of x, or of x * 10^k / 10^k (x / 10^-k * 10^-k for k < 0),
    # 10^|k| in x's dtype, as torch's kernel takes it; an integer is its own rounding
    x, out = ctx.t(0), ctx.out_type()
    if is_int(out.dtype):
        return [x]
    decimals = int(ctx.arg(1, "decimals", 0) or 0)
    if decimals == 0:
        return ctx.one("Round", [x])
    scale = ctx.const(10.0 ** abs(decimals), out.dtype)
    first, then = ("Mul", "Div") if decimals > 0 else ("Div", "Mul")
    rounded = ctx.helper("Round", [ctx.helper(first, [x, scale], out)], out)
    return ctx.one(then, [rounded, scale])


@ATEN.register("aten.trunc.default", "aten.trunc_.default")
def _trunc(ctx: Ctx) -> Names:
    x, out = ctx.t(0), ctx.out_type()
    if is_int(out.dtype):
        return [x]
    return [trunc_of(ctx, x, out)]


@ATEN.register("aten.nan_to_num.default", "aten.nan_to_num_.default")
def _nan_to_num(ctx: Ctx) -> Names:
    # NaN -> nan (0), +inf -> posinf, -inf -> neginf (the dtype's largest and lowest
    # finite values by default), each cast to x's dtype; integers have none of them
    x, out = ctx.t(0), ctx.out_type()
    dt = out.dtype
    if is_int(dt):
        return [x]
    info = np.finfo(np.dtype(dt)) if dt != "bfloat16" else None
    if info is None:
        raise NotSupported("nan_to_num on bfloat16")
    nan, posinf, neginf = (ctx.arg(i, k) for i, k in ((1, "nan"), (2, "posinf"), (3, "neginf")))
    nan = 0.0 if nan is None else float(nan)
    posinf = float(info.max) if posinf is None else float(posinf)
    neginf = float(info.min) if neginf is None else float(neginf)
    mask = TensorType("bool", out.shape)
    pos = ctx.helper("IsInf", [x], mask, detect_negative=0)
    neg = ctx.helper("IsInf", [x], mask, detect_positive=0)
    y = ctx.helper("Where", [neg, ctx.const(neginf, dt), x], out)
    y = ctx.helper("Where", [pos, ctx.const(posinf, dt), y], out)
    return ctx.one("Where", [ctx.helper("IsNaN", [x], mask), ctx.const(nan, dt), y])


@ATEN.register("aten.cumprod.default", "aten.cumprod_.default")
def _cumprod(ctx: Ctx) -> Names:
    # the running product along dim, in the result's dtype (dtype=, or int64 for integers)
    out = ctx.out_type()
    x = _operand(ctx, 0, "self", out.dtype)
    rank = len(out.shape)
    if rank == 0:
        return [x]
    axis = int(ctx.arg(1, "dim")) % rank
    return ctx.one("CumProd", [x], domain="tracelog", axis=axis)


# -- fmod, remainder and the rounding divisions ------------------------------------------------
# From torch's kernels (aten/src/ATen/native/cpu/BinaryOpsKernel.cpp, c10's div_floor_*):
# fmod is C's (ONNX Mod, fmod=1); remainder and floor division correct it by the signs.


def _binary_operands(ctx: Ctx) -> tuple[str, str, TensorType]:
    out = ctx.out_type()
    return _operand(ctx, 0, "self", out.dtype), _operand(ctx, 1, "other", out.dtype), out


@ATEN.register("aten.fmod.Tensor", "aten.fmod.Scalar", "aten.fmod_.Tensor", "aten.fmod_.Scalar")
def _fmod(ctx: Ctx) -> Names:
    # C's fmod, the dividend's sign
    a, b, _ = _binary_operands(ctx)
    return ctx.one("Mod", [a, b], fmod=1)


@ATEN.register(
    "aten.remainder.Tensor",
    "aten.remainder.Scalar",
    "aten.remainder.Scalar_Tensor",
    "aten.remainder_.Tensor",
    "aten.remainder_.Scalar",
)
def _remainder(ctx: Ctx) -> Names:
    # Python's %, the divisor's sign (arith.floor_mod_of, as torch's kernel)
    a, b, out = _binary_operands(ctx)
    return [floor_mod_of(ctx, a, b, out)]


def _floor_divide_of(ctx: Ctx, a: str, b: str, out: TensorType) -> str:
    """Python's a // b as torch's kernel computes it. Integers: the truncated
    quotient, less 1 where the signs differ and the division is not exact.
    Floats (div_floor_floating): a / b where b is 0; else d = (a - fmod(a,
    b)) / b, less 1 where fmod's sign is not b's, rounded to the nearest
    integer (floor, plus 1 above a half), and 0 with the sign of a / b where
    d is 0. Its gradient is 0, as torch's."""
    dt, mask = out.dtype, TensorType("bool", out.shape)
    if is_int(dt):
        return int_floor_div_of(ctx, a, b, out)
    one, zero, half = ctx.const(1.0, dt), ctx.const(0.0, dt), ctx.const(0.5, dt)
    m = fmod_of(ctx, a, b, out)
    d = ctx.helper("Div", [ctx.helper("Sub", [a, m], out), b], out)
    fix = ctx.helper("And", [nonzero(ctx, m, out), signs_differ(ctx, b, m, out)], mask)
    d = ctx.helper("Where", [fix, ctx.helper("Sub", [d, one], out), d], out)
    f = ctx.helper("Floor", [d], out)
    up = ctx.helper("Greater", [ctx.helper("Sub", [d, f], out), half], mask)
    f = ctx.helper("Where", [up, ctx.helper("Add", [f, one], out), f], out)
    q = ctx.helper("Div", [a, b], out)
    signed_zero = ctx.helper("Mul", [q, zero], out)
    d_zero = ctx.helper("Equal", [d, zero], mask)
    f = ctx.helper("Where", [d_zero, signed_zero, f], out)
    b_zero = ctx.helper("Equal", [b, zero], mask)
    return ctx.helper("Where", [b_zero, q, f], out)


@ATEN.register(
    "aten.floor_divide.default",
    "aten.floor_divide.Scalar",
    "aten.floor_divide_.Tensor",
    "aten.floor_divide_.Scalar",
)
def _floor_divide(ctx: Ctx) -> Names:
    a, b, out = _binary_operands(ctx)
    return [_floor_divide_of(ctx, a, b, out)]


@ATEN.register(
    "aten.div.Tensor_mode", "aten.div_.Tensor_mode", "aten.div.Scalar_mode", "aten.div_.Scalar_mode"
)
def _div_mode(ctx: Ctx) -> Names:
    # rounding_mode None: true division; "trunc": the quotient truncated (ONNX integer
    # Div; trunc(a / b) for floats, as torch's div_trunc); "floor": Python's a // b
    a, b, out = _binary_operands(ctx)
    mode = ctx.arg(2, "rounding_mode")
    if mode is None:
        return ctx.one("Div", [a, b])
    if mode == "floor":
        return [_floor_divide_of(ctx, a, b, out)]
    if mode != "trunc":
        raise NotSupported(f"division with rounding mode {mode!r}")
    q = ctx.helper("Div", [a, b], out)
    return [q if is_int(out.dtype) else trunc_of(ctx, q, out)]


# -- more element-wise functions: xlogy (KL divergence), logaddexp, sinc, sgn, addcmul,
# addcdiv, clamp by tensors -------------------------------------------------------------------
def _x_log(ctx: Ctx, log1p: bool) -> Names:
    """x * log(y) (xlogy) or x * log1p(y) (xlog1py), 0 where x is 0 unless y is
    NaN, as aten's kernels; the product there is taken of log(1) or log1p(0), so
    no 0 * inf or 0 * NaN reaches the gradient."""
    out = ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    x, y = _operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)
    x_zero = ctx.helper("Equal", [x, ctx.const(0.0, dt)], mask)
    y_nan = ctx.helper("IsNaN", [y], mask)
    zero = ctx.helper("And", [x_zero, ctx.helper("Not", [y_nan], mask)], mask)
    safe_y = ctx.helper("Where", [zero, ctx.const(0.0 if log1p else 1.0, dt), y], out)
    logs = (
        ctx.helper("Log1p", [safe_y], out, domain="tracelog")
        if log1p
        else ctx.helper("Log", [safe_y], out)
    )
    return ctx.one("Where", [zero, ctx.const(0.0, dt), ctx.helper("Mul", [x, logs], out)])


@ATEN.register("aten.xlogy.Tensor", "aten.xlogy.Scalar_Other", "aten.xlogy.Scalar_Self")
@ATEN.register("aten.xlogy_.Tensor", "aten.xlogy_.Scalar_Other")
def _xlogy(ctx: Ctx) -> Names:
    return _x_log(ctx, log1p=False)  # F.kl_div's target * log(target)


@ATEN.register(
    "aten.special_xlog1py.default",
    "aten.special_xlog1py.self_scalar",
    "aten.special_xlog1py.other_scalar",
)
def _xlog1py(ctx: Ctx) -> Names:
    return _x_log(ctx, log1p=True)


@ATEN.register("aten.logaddexp.default")
def _logaddexp(ctx: Ctx) -> Names:
    # log(e^a + e^b) as aten's kernel: max(a, b) + log1p(exp(-|a - b|)), and a
    # itself where a == b is infinite (where a - b is NaN)
    out = ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    a, b = _operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)
    top = ctx.helper("Max", [a, b], out)
    gap = ctx.helper("Abs", [ctx.helper("Sub", [a, b], out)], out)
    tail = ctx.helper("Exp", [ctx.helper("Neg", [gap], out)], out)
    total = ctx.helper("Add", [top, ctx.helper("Log1p", [tail], out, domain="tracelog")], out)
    same = ctx.helper("Equal", [a, b], mask)
    infinite = ctx.helper("And", [same, ctx.helper("IsInf", [a], mask)], mask)
    return ctx.one("Where", [infinite, a, total])


@ATEN.register("aten.sinc.default", "aten.sinc_.default")
def _sinc(ctx: Ctx) -> Names:
    # sin(pi x) / (pi x), 1 at x == 0 (aten's kernel); the quotient is taken of
    # sin(0) / 1 there, so its gradient is 0 as torch's, not NaN
    out = ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    x = ctx.t(0)
    zero = ctx.helper("Equal", [x, ctx.const(0.0, dt)], mask)
    product = ctx.helper("Mul", [x, ctx.const(math.pi, dt)], out)
    safe = ctx.helper("Where", [zero, ctx.const(1.0, dt), product], out)
    ratio = ctx.helper("Div", [ctx.helper("Sin", [product], out), safe], out)
    return ctx.one("Where", [zero, ctx.const(1.0, dt), ratio])


@ATEN.register("aten.sgn.default", "aten.sgn_.default")
def _sgn(ctx: Ctx) -> Names:
    # x / |x| for complex x; a real tensor's sign
    if ctx.in_type(0).dtype.startswith("complex"):
        raise NotSupported("sgn of a complex tensor")
    return _sign(ctx)


def _addc(op: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        # self + value * (t1 op t2), in aten's order: (value * t1) op t2
        out = ctx.out_type()
        dt = out.dtype
        a, b = _operand(ctx, 1, "tensor1", dt), _operand(ctx, 2, "tensor2", dt)
        value = ctx.arg(3, "value", 1)
        if value != 1:
            a = ctx.helper("Mul", [ctx.const(value, dt), a], ctx.in_type(1))
        term = ctx.helper(op, [a, b], out)
        return ctx.one("Add", [_operand(ctx, 0, "self", dt), term])

    return rule


ATEN.update_from(["aten.addcmul.default", "aten.addcmul_.default"], _addc("Mul"))
ATEN.update_from(["aten.addcdiv.default", "aten.addcdiv_.default"], _addc("Div"))


@ATEN.register("aten.clamp.Tensor", "aten.clamp_.Tensor")
def _clamp_tensor(ctx: Ctx) -> Names:
    # min(max(x, lo), hi), each bound a tensor, a number or absent
    out = ctx.out_type()
    dt = out.dtype
    y = ctx.t(0)
    if ctx.in_type(0).dtype != dt:
        y = ctx.helper("Cast", [y], TensorType(dt, ctx.in_type(0).shape), to=dt)
    bounds = [(1, "min", "Max"), (2, "max", "Min")]
    given = [(i, name, op) for i, name, op in bounds if ctx.arg(i, name) is not None]
    if not given:
        raise NotSupported("clamp with neither bound")
    for i, name, op in given[:-1]:
        y = ctx.helper(op, [y, _operand(ctx, i, name, dt)], out)
    i, name, op = given[-1]
    return ctx.one(op, [y, _operand(ctx, i, name, dt)])


# -- order statistics: the k-th smallest along a dim, the median -------------------------
def _kth(ctx: Ctx, k: int, axis: int, keep: int) -> Names:
    """The k-th smallest values along `axis` and their indices (TopK of the k
    least, its last); torch's own choice among equal values is unspecified."""
    xt = ctx.in_type(0)
    if not 1 <= k <= int(xt.shape[axis]):
        raise NotSupported(f"the {k}-th value of {xt.shape[axis]}")
    least_t = TensorType(xt.dtype, tuple(k if i == axis else d for i, d in enumerate(xt.shape)))
    least, where = ctx.node(
        "TopK",
        [ctx.t(0), ctx.ints([k])],
        outs=[least_t, TensorType("int64", least_t.shape)],
        axis=axis,
        largest=0,
        sorted=1,
    )
    picked = []
    for name, out in ((least, ctx.out_type(0)), (where, ctx.out_type(1))):
        one_t = TensorType(out.dtype, tuple(1 if i == axis else d for i, d in enumerate(xt.shape)))
        kept = ctx.helper("Gather", [name, ctx.ints([k - 1])], one_t, axis=axis)
        picked.append(kept if keep else ctx.helper("Squeeze", [kept, ctx.ints([axis])], out))
    return picked


def _along(ctx: Ctx, i: int) -> tuple[int, int]:
    """The dim argument at i (default -1) as an axis, and keepdim after it."""
    rank = len(ctx.in_type(0).shape)
    axis = int(ctx.arg(i, "dim", -1)) % rank
    size = ctx.in_type(0).shape[axis]
    if is_symbolic(size):
        raise NotSupported("an order statistic along a symbolic-size dim")
    return axis, int(bool(ctx.arg(i + 1, "keepdim", False)))


@ATEN.register("aten.kthvalue.default")
def _kthvalue(ctx: Ctx) -> Names:
    axis, keep = _along(ctx, 2)
    return _kth(ctx, int(ctx.arg(1, "k")), axis, keep)


@ATEN.register("aten.median.dim")
def _median_dim(ctx: Ctx) -> Names:
    # the lower of the two middle values of an even count, as torch's
    axis, keep = _along(ctx, 1)
    n = int(ctx.in_type(0).shape[axis])
    return _kth(ctx, (n + 1) // 2, axis, keep)


@ATEN.register("aten._trilinear.default")
def _trilinear(ctx: Ctx) -> Names:
    """torch.bilinear's kernel (nn.Bilinear: x1 W x2): each of three tensors
    given size-1 dims at its `expand` positions, their product, summed over
    `sumdim` (aten/src/ATen/native/Linear.cpp, the same sum of products)."""
    out = ctx.out_type()
    dt = out.dtype
    expanded: list[tuple[str, TensorType]] = []
    for i in range(3):
        t, where = ctx.in_type(i), sorted(int(d) for d in ctx.arg(3 + i))
        shape = list(t.shape)
        for d in where:
            shape.insert(d, 1)
        ty = TensorType(dt, tuple(shape))
        name = ctx.t(i)
        if where:
            name = ctx.helper("Unsqueeze", [name, ctx.ints(where)], ty)
        expanded.append((name, ty))

    def broadcast(*types: TensorType) -> TensorType:
        rank = len(types[0].shape)
        return TensorType(
            dt,
            tuple(next((t.shape[d] for t in types if t.shape[d] != 1), 1) for d in range(rank)),
        )

    (a, at), (b, bt), (c, ct) = expanded
    product = ctx.helper("Mul", [a, b], broadcast(at, bt))
    product = ctx.helper("Mul", [product, c], broadcast(at, bt, ct))
    summed = sorted(int(d) for d in ctx.arg(6, "sumdim"))
    if not summed:
        return ctx.one("Identity", [product])
    return ctx.one("ReduceSum", [product, ctx.ints(summed)], keepdims=0)


@ATEN.register("aten.vdot.default", "aten.dot.default")
def _vdot(ctx: Ctx) -> Names:
    # the dot product of two vectors (vdot conjugates the first: real here);
    # torch.dot: nn.utils.spectral_norm's sigma = u . Wv
    if ctx.in_type(0).dtype.startswith("complex"):
        raise NotSupported("vdot of complex vectors")
    product = ctx.helper("Mul", [ctx.t(0), ctx.t(1)], ctx.in_type(0))
    return ctx.one("ReduceSum", [product], keepdims=0)


ATEN.not_yet(
    "aten.embedding_renorm_.default",
    reason=(
        "nn.Embedding's max_norm: the rows read are renormalised in place, in the "
        "weight itself, through a detached alias the graph cannot follow"
    ),
)


@ATEN.register("aten.unfold.default")
def _unfold_windows(ctx: Ctx) -> Names:
    """Tensor.unfold(dim, size, step): the windows x[i*step : i*step + size]
    along dim, as a new dim in its place and the window's elements last (a
    Gather of the window index table, then the element axis moved last)."""
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    dim = int(ctx.arg(1, "dimension")) % max(rank, 1)
    size, step = int(ctx.arg(2, "size")), int(ctx.arg(3, "step"))
    if rank == 0:
        raise NotSupported("unfold of a 0-d tensor")
    length = xt.shape[dim]
    if is_symbolic(length):
        raise NotSupported("unfold along the batch or a sequence-long dim")
    count = (int(length) - size) // step + 1
    table = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    gathered = (*xt.shape[:dim], count, size, *xt.shape[dim + 1 :])
    y = ctx.helper(
        "Gather",
        [ctx.t(0), ctx.ints(table.reshape(-1).tolist())],
        TensorType(xt.dtype, (*xt.shape[:dim], count * size, *xt.shape[dim + 1 :])),
        axis=dim,
    )
    y = ctx.helper("Reshape", [y, ctx.shape_const(list(gathered))], TensorType(xt.dtype, gathered))
    perm = [*range(dim + 1), *range(dim + 2, rank + 1), dim + 1]
    return ctx.one("Transpose", [y], perm=perm)


# -- running scans: logcumsumexp, cummax and cummin ------------------------------------------------
# Each over the triangle j <= i of a [..., L(i), L(j), ...] tensor (x at j, for each
# i): exact and stable where a running product or sum of exponentials is not, in
# L^2 memory along the scanned axis (a length the recorded shape fixes).
def _scan_axis(ctx: Ctx) -> tuple[str, TensorType, int, int]:
    """x, its type, the scanned axis and its length."""
    xt = ctx.in_type(0)
    axis = int(ctx.arg(1, "dim")) % len(xt.shape)
    length = xt.shape[axis]
    if not isinstance(length, int):
        raise NotSupported("a running scan along a symbolic (data-sized) dim")
    return ctx.t(0), xt, axis, length


def _triangle(
    ctx: Ctx, x: str, xt: TensorType, axis: int, length: int, fill: float
) -> tuple[str, str, TensorType]:
    """x[..., j, ...] at [..., i, j, ...] where j <= i, ``fill`` elsewhere; the
    triangle mask (broadcast over the dims after the axis) and the result's type."""
    rest = [1] * (len(xt.shape) - axis - 1)
    lower = np.tril(np.ones((length, length), dtype=bool)).reshape([length, length, *rest])
    tri = ctx.const(lower, "bool")
    shape = (*xt.shape[:axis], length, *xt.shape[axis:])
    wide = TensorType(xt.dtype, shape)
    xu = ctx.helper(
        "Unsqueeze",
        [x, ctx.ints([axis])],
        TensorType(xt.dtype, (*shape[:axis], 1, *shape[axis + 1 :])),
    )
    return ctx.helper("Where", [tri, xu, ctx.const(fill, xt.dtype)], wide), tri, wide


@ATEN.register("aten.logcumsumexp.default")
def _logcumsumexp(ctx: Ctx) -> Names:
    # y[i] = log(sum over j <= i of exp(x[j])), as logsumexp over the triangle: its
    # largest value shifted out (stopped: the two terms' gradients cancel exactly)
    x, xt, axis, length = _scan_axis(ctx)
    if not xt.shape:
        return [x]
    dt = xt.dtype
    masked, _tri, wide = _triangle(ctx, x, xt, axis, length, -math.inf)
    j = ctx.ints([axis + 1])
    kept = TensorType(dt, tuple(1 if k == axis + 1 else d for k, d in enumerate(wide.shape)))
    m = _shift(ctx, masked, j, kept)
    shifted = ctx.helper("Exp", [ctx.helper("Sub", [masked, m], wide)], wide)
    total = ctx.helper("ReduceSum", [shifted, j], xt, keepdims=0)
    m = ctx.helper("Squeeze", [m, j], xt)
    return ctx.one("Add", [ctx.helper("Log", [total], xt), m])


def _cum_extreme(largest: bool) -> Converter:
    def rule(ctx: Ctx) -> Names:
        # torch's kernel (ReduceOps.cpp, cummax_cummin_helper) keeps the last index
        # that ties the running extreme (>= for cummax, <= for cummin); the values
        # are x at those indices, so the gradient goes where torch's scatter sends it
        x, xt, axis, length = _scan_axis(ctx)
        dt = xt.dtype
        if is_int(dt) or dt == "bool":
            raise NotSupported(f"{ctx.rec.op} of {dt}")
        fill = -math.inf if largest else math.inf
        masked, tri, wide = _triangle(ctx, x, xt, axis, length, fill)
        j = ctx.ints([axis + 1])
        kept = TensorType(dt, tuple(1 if k == axis + 1 else d for k, d in enumerate(wide.shape)))
        best = ctx.helper("ReduceMax" if largest else "ReduceMin", [masked, j], kept, keepdims=1)
        hits = TensorType("bool", wide.shape)
        at = ctx.helper("And", [ctx.helper("Equal", [masked, best], hits), tri], hits)
        rest = [1] * (len(xt.shape) - axis - 1)
        positions = ctx.const(
            np.arange(length, dtype=np.int64).reshape([1, length, *rest]), "int64"
        )
        wide_i = TensorType("int64", wide.shape)
        index = ctx.helper("Where", [at, positions, ctx.const(-1, "int64")], wide_i)
        index = ctx.helper("ReduceMax", [index, j], TensorType("int64", xt.shape), keepdims=0)
        values = ctx.helper("GatherElements", [x, index], xt, axis=axis)
        return [values, index]

    return rule


ATEN.add("aten.cummax.default", _cum_extreme(True))
ATEN.add("aten.cummin.default", _cum_extreme(False))


@ATEN.register("aten.block_diag.default")
def _block_diag(ctx: Ctx) -> Names:
    # torch's reference (torch/_refs, _block_diag_iterable): each tensor as a matrix
    # (0-d and 1-d: one row), padded with zero columns left and right, rows concatenated
    out = ctx.out_type()
    blocks = list(ctx.arg(0, "tensors"))
    parts = []
    start = 0
    total = out.shape[1]
    if not isinstance(total, int):
        raise NotSupported("block_diag of a symbolic number of columns")
    for t in blocks:
        name = ctx.b.name_of(t)
        if name in ctx.b.pseudo:
            raise NotSupported("block_diag of a tensor tracelog models only in a pattern")
        if len(t.shape) > 2:
            raise NotSupported("block_diag of a tensor of more than 2 dims")
        if len(t.shape) < 2:
            cols = int(t.shape[0]) if t.shape else 1
            name = ctx.helper(
                "Reshape", [name, ctx.ints([1, cols])], TensorType(t.dtype, (1, cols))
            )
            shape: tuple[int | str, ...] = (1, cols)
        else:
            cols = t.shape[1]
            if not isinstance(cols, int):
                raise NotSupported("block_diag of a block with a symbolic number of columns")
            shape = tuple(t.shape)
        if t.dtype != out.dtype:
            name = ctx.helper("Cast", [name], TensorType(out.dtype, shape), to=out.dtype)
        pads = ctx.ints([0, start, 0, total - start - cols])
        parts.append(ctx.helper("Pad", [name, pads], TensorType(out.dtype, (shape[0], total))))
        start += cols
    return ctx.one("Concat", parts, axis=0)


# -- small element-wise and layout ops of training code ------------------------------------------
RRELU = "aten.rrelu_with_noise.default"


def rrelu_draws(args: Any, kwargs: Any) -> bool:
    """Whether an RReLU call draws its slopes (training): the listener keeps
    its noise tensor, the slopes it drew, as a draw."""
    training = args[4] if len(args) > 4 else (kwargs or {}).get("training", False)
    return bool(training)


@ATEN.register(RRELU)
def _rrelu(ctx: Ctx) -> Names:
    # RReLU (aten/src/ATen/native/Activation.cpp, rrelu_with_noise_out_cpu): in eval
    # a leaky ReLU of slope (lower + upper) / 2; in training x where x > 0, else x
    # times a slope drawn uniformly in [lower, upper] per element (the noise tensor
    # holds them, 1 where x > 0): a draw node, fed the batch's slopes from the
    # sample, its gradient the slope as torch's backward takes it
    lower, upper = float(ctx.arg(2, "lower", 1 / 8)), float(ctx.arg(3, "upper", 1 / 3))
    if not bool(ctx.arg(4, "training", False)):
        return ctx.one("LeakyRelu", [ctx.t(0)], alpha=(lower + upper) / 2)
    xt = ctx.in_type(0)
    if xt.dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise NotSupported(f"RReLU of dtype {xt.dtype}")
    slopes = random_like(ctx, xt, "RandomUniformLike", low=lower, high=upper)
    x = ctx.t(0)
    positive = ctx.helper("Greater", [x, ctx.const(0.0, xt.dtype)], TensorType("bool", xt.shape))
    return ctx.one("Where", [positive, x, ctx.helper("Mul", [x, slopes], xt)])


@ATEN.register("aten.frac.default", "aten.frac_.default")
def _frac(ctx: Ctx) -> Names:
    # x - trunc(x): the fraction keeps x's sign, its gradient is 1
    x, out = ctx.t(0), ctx.out_type()
    return ctx.one("Sub", [x, trunc_of(ctx, x, out)])


@ATEN.register("aten.copysign.Tensor", "aten.copysign_.Tensor", "aten.copysign.Scalar")
def _copysign(ctx: Ctx) -> Names:
    # |a| with b's sign bit: negative where 1 / b < 0 (b = -0.0 included); the
    # gradient flows to a only, through |a| (0 at a = 0), as torch's
    out = ctx.out_type()
    dt = out.dtype
    a = _operand(ctx, 0, "self", dt)
    b = _operand(ctx, 1, "other", dt)
    bt = ctx.in_type(1) if isinstance(ctx.arg(1, "other"), TArg) else TensorType(dt, ())
    magnitude = ctx.helper("Abs", [a], out)
    inverse = ctx.helper("Reciprocal", [b], TensorType(dt, bt.shape))
    negative = ctx.helper("Less", [inverse, ctx.const(0.0, dt)], TensorType("bool", bt.shape))
    return ctx.one("Where", [negative, ctx.helper("Neg", [magnitude], out), magnitude])


@ATEN.register("aten.linalg_cross.default")
def _linalg_cross(ctx: Ctx) -> Names:
    # a x b along a dim of size 3: a[i+1] b[i+2] - a[i+2] b[i+1], the components
    # taken by Gather (broadcast as torch broadcasts a and b)
    out = ctx.out_type()
    rank = len(out.shape)
    dim = int(ctx.arg(2, "dim", -1)) % rank
    dt = out.dtype
    a = _operand(ctx, 0, "self", dt)
    b = _operand(ctx, 1, "other", dt)

    def turned(x: str, xt: TensorType, shift: int) -> str:
        axis = dim - (rank - len(xt.shape))
        ty = TensorType(dt, xt.shape)
        return ctx.helper(
            "Gather", [x, ctx.ints([(k + shift) % 3 for k in range(3)])], ty, axis=axis
        )

    at, bt = ctx.in_type(0), ctx.in_type(1)
    first = ctx.helper("Mul", [turned(a, at, 1), turned(b, bt, 2)], out)
    second = ctx.helper("Mul", [turned(a, at, 2), turned(b, bt, 1)], out)
    return ctx.one("Sub", [first, second])


@ATEN.register("aten.special_entr.default")
def _entr(ctx: Ctx) -> Names:
    # -x log x for x > 0, 0 at 0, -inf below; log is taken of 1 where x <= 0 so
    # that no NaN reaches the gradient of the branch not taken
    x, out = ctx.t(0), ctx.out_type()
    dt, mask = out.dtype, TensorType("bool", out.shape)
    zero = ctx.const(0.0, dt)
    positive = ctx.helper("Greater", [x, zero], mask)
    safe = ctx.helper("Where", [positive, x, ctx.const(1.0, dt)], out)
    terms = ctx.helper("Neg", [ctx.helper("Mul", [safe, ctx.helper("Log", [safe], out)], out)], out)
    at_zero = ctx.helper("Equal", [x, zero], mask)
    rest = ctx.helper("Where", [at_zero, zero, ctx.const(-math.inf, dt)], out)
    return ctx.one("Where", [positive, terms, rest])


@ATEN.register("aten.rot90.default")
def _rot90(ctx: Ctx) -> Names:
    # torch's rot90: k = 1 flips dims[1] then swaps the two dims, k = 2 flips
    # both, k = 3 flips dims[0] then swaps
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    k = int(ctx.arg(1, "k", 1)) % 4
    d0, d1 = (int(d) % rank for d in ctx.arg(2, "dims", [0, 1]))
    x = ctx.t(0)
    if k == 0:
        return ctx.one("Identity", [x])
    flipped = [d1] if k == 1 else [d0, d1] if k == 2 else [d0]
    n = len(flipped)
    y = ctx.helper(
        "Slice",
        [x, ctx.ints([-1] * n), ctx.ints([-_INT64_MAX] * n), ctx.ints(flipped), ctx.ints([-1] * n)],
        xt,
    )
    if k == 2:
        return ctx.one("Identity", [y])
    perm = list(range(rank))
    perm[d0], perm[d1] = d1, d0
    return ctx.one("Transpose", [y], perm=perm)


# -- reductions and distances of training code, from their aten definitions ------------
@ATEN.register("aten.aminmax.default")
def _aminmax(ctx: Ctx) -> Names:
    # torch.aminmax: amin and amax over `dim` (None: every axis), each with
    # amin/amax's gradient
    axes = _axes(ctx.arg(1, "dim"))
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    x = ctx.t(0)
    reduced = [ctx.ints(axes)] if axes else []
    low = ctx.one("ReduceMin", [x, *reduced], keepdims=keep)[0]
    high = ctx.helper("ReduceMax", [x, *reduced], ctx.out_type(1), keepdims=keep)
    return [low, high]


@ATEN.register("aten.renorm.default", "aten.renorm_.default")
def _renorm(ctx: Ctx) -> Names:
    # torch.renorm (aten/src/ATen/native/ReduceOps.cpp, renorm_scale_factor): each
    # slice along `dim` whose p-norm exceeds maxnorm is scaled by
    # maxnorm / (norm + 1e-7), the others kept; the gradient is that product's
    # (torch's renorm_backward differentiates the factor too)
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    p, dim, maxnorm = float(ctx.arg(1, "p")), int(ctx.arg(2, "dim")) % rank, ctx.arg(3, "maxnorm")
    dt = xt.dtype
    kept = TensorType(dt, tuple(d if a == dim else 1 for a, d in enumerate(xt.shape)))
    others = [a for a in range(rank) if a != dim]
    norm = norm_along(ctx, ctx.t(0), xt, p, others, 1, typed=kept)
    limit = ctx.const(float(maxnorm), dt)
    over = ctx.helper("Greater", [norm, limit], TensorType("bool", kept.shape))
    padded = ctx.helper("Add", [norm, ctx.const(1e-7, dt)], kept)
    factor = ctx.helper(
        "Where", [over, ctx.helper("Div", [limit, padded], kept), ctx.const(1.0, dt)], kept
    )
    return ctx.one("Mul", [ctx.t(0), factor])


@ATEN.register("aten.ldexp.Tensor", "aten.ldexp_.default")
def _ldexp(ctx: Ctx) -> Names:
    # torch.ldexp: x * 2 ** e (exact for an integer exponent in range)
    out = ctx.out_type()
    dt = out.dtype
    x = _operand(ctx, 0, "self", dt)
    power_t = TensorType(dt, ctx.in_type(1).shape)
    power = ctx.helper("Pow", [ctx.const(2.0, dt), _operand(ctx, 1, "other", dt)], power_t)
    if ctx.in_type(1).dtype in ("float16", "bfloat16", "float32", "float64"):
        return ctx.one("Mul", [x, power])
    # torch's backward multiplies by pow(2, other) in the exponent's integer dtype,
    # which is 0 for a negative exponent: the value is x * 2 ** e, the gradient
    # that integer power (StopGradient splits the two, as in _embedding_scaled)
    negative = ctx.helper(
        "Less", [ctx.t(1), ctx.const(0, ctx.in_type(1).dtype)], TensorType("bool", power_t.shape)
    )
    slope = ctx.helper("Where", [negative, ctx.const(0.0, dt), power], power_t)
    value = ctx.helper(
        "StopGradient", [ctx.helper("Mul", [x, power], out)], out, domain=TRACELOG_DOMAIN
    )
    frozen = ctx.helper("StopGradient", [x], ctx.in_type(0), domain=TRACELOG_DOMAIN)
    moving = ctx.helper("Mul", [ctx.helper("Sub", [x, frozen], ctx.in_type(0)), slope], out)
    return ctx.one("Add", [value, moving])


def _indices_rule(pick: Any) -> Converter:
    def rule(ctx: Ctx) -> Names:
        # torch.tril_indices / triu_indices(row, col, offset): a constant [2, n]
        rows, cols = int(ctx.arg(0, "row")), int(ctx.arg(1, "col"))
        offset = int(ctx.arg(2, "offset", 0))
        found = np.stack(pick(rows, offset, cols)).astype(np.int64)
        return [ctx.const(found, ctx.out_type().dtype)]

    return rule


ATEN.add("aten.tril_indices.default", _indices_rule(np.tril_indices))
ATEN.add("aten.triu_indices.default", _indices_rule(np.triu_indices))


@ATEN.register("aten._pdist_forward.default")
def _pdist(ctx: Ctx) -> Names:
    # torch.pdist of x [n, m]: the p-norm of x[i] - x[j] for each i < j, in row-major
    # order (np.triu_indices(n, 1)), taken from the differences as cdist's
    xt = ctx.in_type(0)
    n = xt.shape[0]
    if is_symbolic(n):
        raise NotSupported("pdist over a batch-sized number of rows (n(n - 1) / 2 pairs)")
    first, second = np.triu_indices(int(n), 1)
    pairs = TensorType(xt.dtype, (len(first), xt.shape[1]))
    a = ctx.helper("Gather", [ctx.t(0), ctx.ints(first.tolist())], pairs, axis=0)
    b = ctx.helper("Gather", [ctx.t(0), ctx.ints(second.tolist())], pairs, axis=0)
    diff = ctx.helper("Sub", [a, b], pairs)
    return [norm_along(ctx, diff, pairs, float(ctx.arg(1, "p", 2.0)), [1], 0)]
