"""The aten table (``ATEN``): one rule per aten overload, each building
ONNX-semantics IR on the framework-neutral Builder.

A rule gets a Ctx for one record and returns the IR names of the record's
outputs (returned tensors, then tensors it mutated), None for an output
tracelog does not model. A rule raises NotSupported for a form of its op it
cannot express; the record then becomes a tracelog.Unsupported node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tracelog.adapters.builder import UNINITIALISED, Converter, Ctx, NotSupported, use_rewrites
from tracelog.adapters.tape import TArg, batch_multiple
from tracelog.ir import (
    BATCH,
    TensorType,
    dim_mul,
    dim_scale,
    format_dim,
    is_symbolic,
    parse_dim,
)
from tracelog.ops import TRACELOG_DOMAIN
from tracelog.passes.fusions import GEMM_TRANSPOSES, WRITTEN_OUT
from tracelog.registry import Table

ATEN: Table[Converter] = Table("aten")
# t + mm/addmm -> Gemm(transB=1); layer norm, softmax, GELU written out -> the fused op
use_rewrites(ATEN, GEMM_TRANSPOSES + WRITTEN_OUT)

INT64_MAX = 2**63 - 1
_REDUCTION = {0: "none", 1: "mean", 2: "sum"}

Names = Sequence[str | None]


def _pair(v: int | Sequence[int], n: int = 2) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _operand(ctx: Ctx, i: int, name: str, dtype: str) -> str:
    """Tensor or Python-scalar operand i, in the result's dtype (the type
    promotion torch applied before the kernel ran)."""
    a = ctx.arg(i, name)
    if isinstance(a, TArg):
        n = ctx.t(i, name)
        if a.dtype != dtype:
            n = ctx.helper("Cast", [n], TensorType(dtype, a.shape), to=dtype)
        return n
    if a is None:
        raise NotSupported(f"operand {name} is None")
    k = _batch_times(ctx, a)
    if k:
        # x.sum() / x.shape[0], F.kl_div(reduction="batchmean"): the batch size
        # as a number, computed from the data's shape so other batches share the
        # graph (the fingerprint reads such an int as the batch: Rec.key)
        return ctx.batch_number(dtype, k)
    return ctx.const(a, dtype)


def _batch_times(ctx: Ctx, a: Any) -> int:
    """k where a Python int operand of a data-derived record is k times the
    batch size (k > 1: the element count of a batch-derived value of the loss);
    0 for any other."""
    batch = ctx.b.tape.batch_size
    if type(a) is not int or not ctx.rec.tainted or batch is None or batch < 2:
        return 0
    if a == batch:
        return 1
    return batch_multiple(ctx.b.tape, a) if ctx.rec.region == "post" else 0


# -- aliases and copies: no node -----------------------------------------------
@ATEN.register("aten.detach.default")
def _detach(ctx: Ctx) -> Names:
    # the same values, and no gradient through them (a straight-through estimator)
    info = ctx.b.pseudo.get(ctx.raw_name(0))
    if info is not None and info[0] in UNINITIALISED:
        # an alias of uninitialised memory (invert_permutation's empty_like, which
        # scatter_ then fills): uninitialised too
        name = ctx.b.helper_name()
        ctx.b.pseudo[name] = info
        return [name]
    return ctx.one("StopGradient", [ctx.t(0)], domain="tracelog")


# as_strided(_) that keeps a tensor's values where they were (listener.py reads the
# strides when it runs; any other as_strided stays unsupported)
RESTRIDE = "tracelog.restride"


@ATEN.register(
    RESTRIDE,
    "aten.alias.default",
    "aten.lift_fresh.default",
    "aten.lift_fresh_copy.default",
    "aten.clone.default",
    "aten.contiguous.default",
)
def _alias(ctx: Ctx) -> Names:
    return [ctx.t(0)]


@ATEN.register("aten._to_copy.default")
def _to_copy(ctx: Ctx) -> Names:
    src, out = ctx.in_type(0), ctx.out_type()
    if src.dtype == out.dtype:
        return [ctx.t(0)]
    return ctx.one("Cast", [ctx.t(0)], to=out.dtype)


# -- element-wise ----------------------------------------------------------------
_UNARY = {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "sqrt": "Sqrt",
    "exp": "Exp",
    "log": "Log",
    "abs": "Abs",
    "neg": "Neg",
    "reciprocal": "Reciprocal",
    "erf": "Erf",
    "floor": "Floor",
    "ceil": "Ceil",
}


def _unary_rule(op: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        return ctx.one(op, [ctx.t(0)])

    return rule


for _aten, _op in _UNARY.items():
    ATEN.update_from([f"aten.{_aten}.default", f"aten.{_aten}_.default"], _unary_rule(_op))


@ATEN.register("aten.rsqrt.default", "aten.rsqrt_.default")
def _rsqrt(ctx: Ctx) -> Names:
    s = ctx.helper("Sqrt", [ctx.t(0)], ctx.out_type())
    return ctx.one("Reciprocal", [s])


@ATEN.register("aten.silu.default", "aten.silu_.default")
def _silu(ctx: Ctx) -> Names:
    # one op (tracelog.ops SiLU): each target runs its own kernel, torch's bitwise
    return ctx.one("SiLU", [ctx.t(0)], domain="tracelog")


@ATEN.register("aten.gelu.default", "aten.gelu_.default")
def _gelu(ctx: Ctx) -> Names:
    return ctx.one("Gelu", [ctx.t(0)], approximate=ctx.arg(1, "approximate", "none"))


@ATEN.register("aten.celu.default", "aten.celu_.default")
def _celu(ctx: Ctx) -> Names:
    return ctx.one("Celu", [ctx.t(0)], alpha=float(ctx.arg(1, "alpha", 1.0)))


@ATEN.register("aten.elu.default", "aten.elu_.default")
def _elu(ctx: Ctx) -> Names:
    # scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1)), as torch's
    # kernel: nn.ELU (alpha), nn.SELU (torch.selu is elu with SELU's constants)
    out = ctx.out_type()
    dt = out.dtype
    x = ctx.t(0)
    alpha = float(ctx.arg(1, "alpha", 1.0))
    scale = float(ctx.arg(2, "scale", 1.0))
    input_scale = float(ctx.arg(3, "input_scale", 1.0))
    last = scale == 1.0  # the node before the scale is the record's output
    if input_scale == 1.0 and alpha == 1.0:  # CELU at alpha 1 is ELU (torch's own kernel)
        if last:
            return ctx.one("Celu", [x], alpha=1.0)
        y = ctx.helper("Celu", [x], out, alpha=1.0)
    else:
        z = x if input_scale == 1.0 else ctx.helper("Mul", [x, ctx.const(input_scale, dt)], out)
        neg = ctx.helper("Celu", [z], out, alpha=1.0)  # exp(z) - 1 where z <= 0
        if alpha != 1.0:
            neg = ctx.helper("Mul", [neg, ctx.const(alpha, dt)], out)
        pos = ctx.helper("Greater", [x, ctx.const(0.0, dt)], TensorType("bool", out.shape))
        if last:
            return ctx.one("Where", [pos, x, neg])
        y = ctx.helper("Where", [pos, x, neg], out)
    return ctx.one("Mul", [y, ctx.const(scale, dt)])


@ATEN.register("aten.softplus.default")
def _softplus(ctx: Ctx) -> Names:
    # log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold,
    # as torch's kernel
    out = ctx.out_type()
    dt = out.dtype
    x = ctx.t(0)
    beta = float(ctx.arg(1, "beta", 1.0))
    threshold = float(ctx.arg(2, "threshold", 20.0))
    bx = x if beta == 1.0 else ctx.helper("Mul", [x, ctx.const(beta, dt)], out)
    soft = ctx.helper("Softplus", [bx], out)
    if beta != 1.0:
        soft = ctx.helper("Div", [soft, ctx.const(beta, dt)], out)
    above = ctx.helper("Greater", [bx, ctx.const(threshold, dt)], TensorType("bool", out.shape))
    return ctx.one("Where", [above, x, soft])


@ATEN.register("aten.mish.default", "aten.mish_.default")
def _mish(ctx: Ctx) -> Names:
    # x * tanh(softplus(x)) (ONNX Mish is opset 18 and not in every target)
    out = ctx.out_type()
    x = ctx.t(0)
    tanh = ctx.helper("Tanh", [ctx.helper("Softplus", [x], out)], out)
    return ctx.one("Mul", [x, tanh])


@ATEN.register("aten.log_sigmoid_forward.default")
def _log_sigmoid(ctx: Ctx) -> Names:
    # log(sigmoid(x)) = -softplus(-x); the second output is backward's buffer
    out = ctx.out_type()
    neg = ctx.helper("Neg", [ctx.t(0)], out)
    y = ctx.one("Neg", [ctx.helper("Softplus", [neg], out)])
    return [y[0], None]


@ATEN.register("aten.leaky_relu.default", "aten.leaky_relu_.default")
def _leaky_relu(ctx: Ctx) -> Names:
    return ctx.one("LeakyRelu", [ctx.t(0)], alpha=float(ctx.arg(1, "negative_slope", 0.01)))


@ATEN.register("aten.hardtanh.default", "aten.hardtanh_.default")
def _hardtanh(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    lo = ctx.const(float(ctx.arg(1, "min_val", -1.0)), dt)
    hi = ctx.const(float(ctx.arg(2, "max_val", 1.0)), dt)
    return ctx.one("Clip", [ctx.t(0), lo, hi])


@ATEN.register("aten.hardsigmoid.default", "aten.hardsigmoid_.default")
def _hardsigmoid(ctx: Ctx) -> Names:
    # as torch's CPU kernel: min(max(x + 3, 0), 6) / 6 (MobileNetV3's gates)
    out, dt = ctx.out_type(), ctx.out_type().dtype
    gate = _relu6_of_shifted(ctx, ctx.t(0), out)
    return ctx.one("Div", [gate, ctx.const(6.0, dt)])


@ATEN.register("aten.hardswish.default", "aten.hardswish_.default")
def _hardswish(ctx: Ctx) -> Names:
    # as torch's CPU kernel: x * min(max(x + 3, 0), 6) / 6, the product first
    out, dt = ctx.out_type(), ctx.out_type().dtype
    x = ctx.t(0)
    product = ctx.helper("Mul", [x, _relu6_of_shifted(ctx, x, out)], out)
    return ctx.one("Div", [product, ctx.const(6.0, dt)])


def _relu6_of_shifted(ctx: Ctx, x: str, out: TensorType) -> str:
    """min(max(x + 3, 0), 6)."""
    dt = out.dtype
    shifted = ctx.helper("Add", [x, ctx.const(3.0, dt)], out)
    return ctx.helper("Clip", [shifted, ctx.const(0.0, dt), ctx.const(6.0, dt)], out)


@ATEN.register("aten.clamp.default", "aten.clamp_.default")
def _clamp(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    lo, hi = ctx.arg(1, "min"), ctx.arg(2, "max")
    if isinstance(lo, TArg) or isinstance(hi, TArg):
        raise NotSupported("clamp with tensor bounds")
    ins = [
        ctx.t(0),
        "" if lo is None else ctx.const(lo, dt),
        "" if hi is None else ctx.const(hi, dt),
    ]
    while ins and ins[-1] == "":
        ins.pop()
    return ctx.one("Clip", ins)


@ATEN.register("aten.clamp_min.default", "aten.clamp_min_.default")
def _clamp_min(ctx: Ctx) -> Names:
    return ctx.one("Clip", [ctx.t(0), ctx.const(ctx.arg(1, "min"), ctx.out_type().dtype)])


@ATEN.register("aten.clamp_max.default", "aten.clamp_max_.default")
def _clamp_max(ctx: Ctx) -> Names:
    return ctx.one("Clip", [ctx.t(0), "", ctx.const(ctx.arg(1, "max"), ctx.out_type().dtype)])


_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}


def _binary_rule(op: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        dt = ctx.out_type().dtype
        a = _operand(ctx, 0, "self", dt)
        b = _operand(ctx, 1, "other", dt)
        alpha = ctx.arg(2, "alpha", 1)
        if op in ("Add", "Sub") and alpha != 1:
            b = ctx.helper("Mul", [b, ctx.const(alpha, dt)], ctx.out_type())
        return ctx.one(op, [a, b])

    return rule


# mul.Tensor and div_.Scalar also carry CPU dropout; their rules are below.
_DROPOUT_KEYS = ("aten.mul.Tensor", "aten.mul_.Tensor", "aten.div_.Scalar")
for _aten, _op in _BINARY.items():
    for _overload in ("Tensor", "Scalar"):
        for _key in (f"aten.{_aten}.{_overload}", f"aten.{_aten}_.{_overload}"):
            if _key not in _DROPOUT_KEYS:
                ATEN.add(_key, _binary_rule(_op))


@ATEN.register("aten.minimum.default", "aten.maximum.default")
def _min_max(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    op = "Min" if ctx.rec.op == "aten.minimum.default" else "Max"
    return ctx.one(op, [_operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)])


@ATEN.register("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    a = _operand(ctx, 0, "self", dt)
    b = _operand(ctx, 1, "other", dt)
    alpha = ctx.arg(2, "alpha", 1)
    if alpha != 1:
        a = ctx.helper("Mul", [a, ctx.const(alpha, dt)], ctx.out_type())
    return ctx.one("Sub", [b, a])


@ATEN.register(
    "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor",
    "aten.pow_.Scalar",
    "aten.pow_.Tensor",
)
def _pow(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Pow", [_operand(ctx, 0, "self", dt), _operand(ctx, 1, "exponent", dt)])


# comparisons (every overload, after type promotion): rules_attention.py


@ATEN.register("aten.pow.Scalar")
def _pow_scalar_base(ctx: Ctx) -> Names:
    # a number to a tensor's power (Funnel's 10000 ** (2k / d) frequencies)
    dt = ctx.out_type().dtype
    return ctx.one("Pow", [ctx.const(ctx.arg(0, "self"), dt), _operand(ctx, 1, "exponent", dt)])


@ATEN.register("aten._weight_norm_interface.default")
def _weight_norm(ctx: Ctx) -> Names:
    """nn.utils.weight_norm's kernel: w = v * (g / ||v||), the norm over every
    dim but `dim` (kept, as g's shape); returns (w, the norm)."""
    v, g, vt = ctx.t(0), ctx.t(1), ctx.in_type(0)
    dim = int(ctx.arg(2, "dim", 0)) % len(vt.shape)
    axes = [d for d in range(len(vt.shape)) if d != dim]
    norm_type = ctx.out_type(1)
    squares = ctx.helper("Mul", [v, v], vt)
    total = ctx.helper("ReduceSum", [squares, ctx.ints(axes)], norm_type, keepdims=1)
    norm = ctx.helper("Sqrt", [total], norm_type)
    scale = ctx.helper("Div", [g, norm], ctx.in_type(1))
    w = ctx.helper("Mul", [v, scale], ctx.out_type(0))
    return [w, norm]


@ATEN.register("aten.where.self")
def _where(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Where", [ctx.t(0), _operand(ctx, 1, "self", dt), _operand(ctx, 2, "other", dt)])


@ATEN.register("aten.masked_fill.Scalar", "aten.masked_fill_.Scalar")
def _masked_fill(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Where", [ctx.t(1), ctx.const(ctx.arg(2, "value"), dt), ctx.t(0)])


# -- linear algebra -----------------------------------------------------------------
# A weight's `t` feeding mm/addmm becomes Gemm(transB=1) in the fusion pass
# (tracelog.passes.fusions.GEMM_TRANSPOSES); the rules write the plain ops.
@ATEN.register("aten.addmm.default")
def _addmm(ctx: Ctx) -> Names:
    a, b, c = ctx.t(1), ctx.t(2), ctx.t(0)
    beta, alpha = ctx.arg(3, "beta", 1), ctx.arg(4, "alpha", 1)
    attrs = {"alpha": float(alpha), "beta": float(beta)} if (alpha, beta) != (1, 1) else {}
    return ctx.one("Gemm", [a, b, c], **attrs)


@ATEN.register("aten.mm.default")
def _mm(ctx: Ctx) -> Names:
    return ctx.one("MatMul", [ctx.t(0), ctx.t(1)])


@ATEN.register("aten.bmm.default", "aten.matmul.default")
def _matmul(ctx: Ctx) -> Names:
    return ctx.one("MatMul", [ctx.t(0), ctx.t(1)])


@ATEN.register("aten.convolution.default")
def _convolution(ctx: Ctx) -> Names:
    x, w, b = ctx.t(0), ctx.t(1), ctx.opt(2)
    stride, padding, dilation = ctx.arg(3), ctx.arg(4), ctx.arg(5)
    transposed, groups = ctx.arg(6), ctx.arg(8)
    if transposed:
        from tracelog.adapters.torch.rules_vision import conv_transpose

        return conv_transpose(ctx)
    spatial = len(ctx.in_type(1).shape) - 2
    pads = _pair(padding, spatial)
    ins = [x, w] + ([b] if b else [])
    return ctx.one(
        "Conv",
        ins,
        kernel_shape=[int(d) for d in ctx.in_type(1).shape[2:]],
        strides=_pair(stride, spatial),
        pads=pads + pads,
        dilations=_pair(dilation, spatial),
        group=int(groups),
    )


# -- normalisation ------------------------------------------------------------------
def _affine(ctx: Ctx, i: int, fill: float, channels: int | str, dtype: str) -> str:
    if ctx.arg(i) is not None:
        return ctx.t(i)
    if not isinstance(channels, int):
        raise NotSupported("batch norm without affine parameters over a batch-sized axis")
    return ctx.const([fill] * channels, dtype)


@ATEN.register("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default")
def _batch_norm(ctx: Ctx) -> Names:
    xt = ctx.in_type(0)
    c, dt = xt.shape[1], xt.dtype
    training, momentum, eps = ctx.arg(5), float(ctx.arg(6)), float(ctx.arg(7))
    if training and ctx.arg(3) is None and not isinstance(c, int):
        return _instance_norm(ctx, eps)
    scale, bias = _affine(ctx, 1, 1.0, c, dt), _affine(ctx, 2, 0.0, c, dt)
    has_stats = ctx.arg(3) is not None
    if not training:
        if not has_stats:
            raise NotSupported("batch norm in eval mode without running statistics")
        normalized = ctx.one(
            "BatchNormalization", [ctx.t(0), scale, bias, ctx.t(3), ctx.t(4)], epsilon=eps
        )
        return [normalized[0], None, None]
    axes = [0] + list(range(2, len(xt.shape)))
    if not has_stats:
        # batch statistics alone (track_running_stats=False, BiT's weight
        # standardisation): the op with stand-in statistics that momentum 0
        # leaves as they are, its updates unused (over a batch-sized axis:
        # _instance_norm, above)
        assert isinstance(c, int)
        stats = TensorType(dt, (c,))
        y, _, _ = ctx.node(
            "BatchNormTraining",
            [ctx.t(0), scale, bias, ctx.const([0.0] * c, dt), ctx.const([1.0] * c, dt)],
            outs=[ctx.out_type(0), stats, stats],
            domain=TRACELOG_DOMAIN,
            epsilon=eps,
            momentum=0.0,
            axes=axes,
        )
        return [y, None, None]
    mean_type, var_type = ctx.in_type(3), ctx.in_type(4)
    y, new_mean, new_var = ctx.node(
        "BatchNormTraining",
        [ctx.t(0), scale, bias, ctx.t(3), ctx.t(4)],
        outs=[ctx.out_type(0), mean_type, var_type],
        domain=TRACELOG_DOMAIN,
        epsilon=eps,
        momentum=momentum,
        axes=axes,
    )
    # outputs: out, save_mean, save_invstd, then running_mean and running_var updated in place
    return [y, None, None, new_mean, new_var]


def _instance_norm(ctx: Ctx, eps: float) -> Names:
    """Batch statistics over a batch-sized channel axis: F.instance_norm's
    batch norm of x viewed as [1, B*C, *spatial] (its weight and bias repeated
    B times, or none). Each (sample, channel) row normalised over its own
    elements, as the CPU kernel: (x - mean) * (1 / sqrt(var + eps)) * w + b,
    the variance the biased one."""
    xt = ctx.in_type(0)
    dt = xt.dtype
    axes = [0, *range(2, len(xt.shape))]
    stats = TensorType(dt, tuple(1 if i in axes else d for i, d in enumerate(xt.shape)))
    mean = ctx.helper("ReduceMean", [ctx.t(0), ctx.ints(axes)], stats, keepdims=1)
    centred = ctx.helper("Sub", [ctx.t(0), mean], xt)
    var = ctx.helper(
        "ReduceMean", [ctx.helper("Mul", [centred, centred], xt), ctx.ints(axes)], stats, keepdims=1
    )
    root = ctx.helper("Sqrt", [ctx.helper("Add", [var, ctx.const(eps, dt)], stats)], stats)
    invstd = ctx.helper("Reciprocal", [root], stats)
    steps = [("Mul", invstd)]
    for i, op in ((1, "Mul"), (2, "Add")):
        if ctx.arg(i) is not None:
            ones = (len(xt.shape) - 2) * [1]
            per = ctx.helper(
                "Unsqueeze",
                [ctx.t(i), ctx.ints(list(range(1, 1 + len(ones))))],
                TensorType(ctx.in_type(i).dtype, (xt.shape[1], *ones)),
            )
            steps.append((op, per))
    y = centred
    for op, operand in steps[:-1]:
        y = ctx.helper(op, [y, operand], xt)
    op, operand = steps[-1]
    return [ctx.one(op, [y, operand])[0], None, None]


@ATEN.register("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_eval(ctx: Ctx) -> Names:
    xt = ctx.in_type(0)
    c, dt = xt.shape[1], xt.dtype
    scale, bias = _affine(ctx, 1, 1.0, c, dt), _affine(ctx, 2, 0.0, c, dt)
    eps = float(ctx.arg(6, "eps"))
    y = ctx.one("BatchNormalization", [ctx.t(0), scale, bias, ctx.t(3), ctx.t(4)], epsilon=eps)
    return [y[0], None, None]


@ATEN.register("aten.native_layer_norm.default")
def _layer_norm(ctx: Ctx) -> Names:
    xt = ctx.in_type(0)
    normalized = list(ctx.arg(1))
    dt = xt.dtype
    # no weight (OLMo's norm): ones of the normalized shape, which F.layer_norm
    # takes as its weight only in exactly that shape
    scale = (
        ctx.t(2)
        if ctx.arg(2) is not None
        else ctx.const(np.ones([int(d) for d in normalized], dtype=np.float64), dt)
    )
    ins = [ctx.t(0), scale] + ([ctx.t(3)] if ctx.arg(3) is not None else [])
    attrs = {"axis": -len(normalized), "epsilon": float(ctx.arg(4))}
    wdt = ctx.in_type(2).dtype if ctx.arg(2) is not None else dt
    if wdt != dt:
        # mixed types (bfloat16 data, float32 weights under CPU autocast): torch
        # normalises in the weights' type and rounds the result to the data's
        wide = TensorType(wdt, xt.shape)
        ins[0] = ctx.helper("Cast", [ins[0]], wide, to=wdt)
        wide_y = ctx.helper("LayerNormalization", ins, wide, **attrs)
        return [ctx.one("Cast", [wide_y], to=dt)[0], None, None]
    y = ctx.one("LayerNormalization", ins, **attrs)
    return [y[0], None, None]


# -- activations with an axis ---------------------------------------------------------
@ATEN.register("aten._softmax.default")
def _softmax(ctx: Ctx) -> Names:
    return ctx.one("Softmax", [ctx.t(0)], axis=int(ctx.arg(1)))


@ATEN.register("aten._log_softmax.default")
def _log_softmax(ctx: Ctx) -> Names:
    return ctx.one("LogSoftmax", [ctx.t(0)], axis=int(ctx.arg(1)))


# -- pooling ---------------------------------------------------------------------------
@ATEN.register("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
def _max_pool2d(ctx: Ctx) -> Names:
    kernel = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride", ())
    stride = _pair(stride) if stride else kernel
    pads = _pair(ctx.arg(3, "padding", 0))
    dilation = _pair(ctx.arg(4, "dilation", 1))
    ceil = int(bool(ctx.arg(5, "ceil_mode", False)))
    y = ctx.one(
        "MaxPool",
        [ctx.t(0)],
        kernel_shape=kernel,
        strides=stride,
        pads=pads + pads,
        dilations=dilation,
        ceil_mode=ceil,
    )
    if ctx.rec.op != "aten.max_pool2d_with_indices.default":
        return [y[0], None]
    try:
        return [y[0], _max_pool2d_indices(ctx, kernel, stride, pads, dilation)]
    except NotSupported:
        return [y[0], None]  # unmodelled indices: NotSupported where something reads them


def _counter(ctx: Ctx, n: int, axes: list[int]) -> str:
    """0, 1, ..., n - 1 (int64) with ``axes`` of size 1 inserted."""
    line = TensorType("int64", (n,))
    ones = ctx.helper("ConstantOfShape", [ctx.ints([n])], line, value=1)
    count = ctx.helper("CumSum", [ones, ctx.const(0, "int64")], line)
    count = ctx.helper("Sub", [count, ctx.ints([1])], line)
    shape = [n]
    for a in sorted(axes):
        shape.insert(a, 1)
    return ctx.helper("Unsqueeze", [count, ctx.ints(axes)], TensorType("int64", tuple(shape)))


def _max_pool2d_indices(
    ctx: Ctx, kernel: list[int], stride: list[int], pads: list[int], dilation: list[int]
) -> str:
    """Each window's argmax as torch's CPU kernel gives it: the flat index h * W + w
    in its input plane of the first largest value (a later one wins only if
    greater). The windows' taps side by side ([..., OH, OW, K], the input padded
    with -inf), ArgMax over them, and the tap's position looked up."""
    xt, it = ctx.in_type(0), ctx.out_type(1)
    h, w = xt.shape[-2:]
    oh, ow = it.shape[-2:]
    if not all(isinstance(d, int) for d in (h, w, oh, ow)):
        raise NotSupported("max pooling indices over a symbolic spatial size")
    h, w, oh, ow = int(h), int(w), int(oh), int(ow)
    dt, lead = xt.dtype, list(xt.shape[:-2])
    rank = len(xt.shape)
    # rows padded left by the padding and right as far as the last window reaches
    extent = [
        (o - 1) * s + (k - 1) * d + 1
        for o, s, k, d in zip((oh, ow), stride, kernel, dilation, strict=True)
    ]
    right = [max(0, e - n - p) for e, n, p in zip(extent, (h, w), pads, strict=True)]
    widths = [0] * (rank - 2) + pads + [0] * (rank - 2) + right
    padded = TensorType(dt, (*lead, h + pads[0] + right[0], w + pads[1] + right[1]))
    x = ctx.helper("Pad", [ctx.t(0), ctx.ints(widths), ctx.const(-math.inf, dt)], padded)
    tap_t = TensorType(dt, (*lead, oh, ow, 1))
    taps, offsets = [], []
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            r0, c0 = kh * dilation[0], kw * dilation[1]
            tap = ctx.helper(
                "Slice",
                [
                    x,
                    ctx.ints([r0, c0]),
                    ctx.ints([r0 + (oh - 1) * stride[0] + 1, c0 + (ow - 1) * stride[1] + 1]),
                    ctx.ints([rank - 2, rank - 1]),
                    ctx.ints(stride),
                ],
                TensorType(dt, (*lead, oh, ow)),
            )
            taps.append(ctx.helper("Unsqueeze", [tap, ctx.ints([rank])], tap_t))
            offsets.append((r0 - pads[0]) * w + c0 - pads[1])
    k = len(taps)
    stacked = ctx.helper("Concat", taps, TensorType(dt, (*lead, oh, ow, k)), axis=rank)
    best = ctx.helper(
        "ArgMax", [stacked], TensorType("int64", (*lead, oh, ow, 1)), axis=rank, keepdims=1
    )
    chosen = ctx.helper(
        "Equal", [best, ctx.ints(list(range(k)))], TensorType("bool", (*lead, oh, ow, k))
    )
    # each tap's flat position, oh * sh * W + ow * sw + the tap's offset, from
    # counters rather than a table (nothing large is stored where nothing reads it)
    rows = ctx.helper(
        "Mul",
        [_counter(ctx, oh, [1, 2]), ctx.ints([stride[0] * w])],
        TensorType("int64", (oh, 1, 1)),
    )
    cols = ctx.helper(
        "Mul", [_counter(ctx, ow, [0, 2]), ctx.ints([stride[1]])], TensorType("int64", (1, ow, 1))
    )
    positions = ctx.helper(
        "Add",
        [ctx.helper("Add", [rows, cols], TensorType("int64", (oh, ow, 1))), ctx.ints(offsets)],
        TensorType("int64", (oh, ow, k)),
    )
    picked = ctx.helper(
        "Where", [chosen, positions, ctx.const(0, "int64")], TensorType("int64", (*lead, oh, ow, k))
    )
    return ctx.helper("ReduceSum", [picked, ctx.ints([rank])], it, keepdims=0)


@ATEN.register("aten.avg_pool2d.default")
def _avg_pool2d(ctx: Ctx) -> Names:
    kernel = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride", ())
    stride = _pair(stride) if stride else kernel
    pads = _pair(ctx.arg(3, "padding", 0))
    if ctx.arg(6, "divisor_override") is not None:
        raise NotSupported("avg_pool2d with divisor_override")
    return ctx.one(
        "AveragePool",
        [ctx.t(0)],
        kernel_shape=kernel,
        strides=stride,
        pads=pads + pads,
        ceil_mode=int(bool(ctx.arg(4, "ceil_mode", False))),
        count_include_pad=int(bool(ctx.arg(5, "count_include_pad", True))),
    )


@ATEN.register("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx: Ctx) -> Names:
    out_hw = _pair(ctx.arg(1, "output_size"))
    in_hw = ctx.in_type(0).shape[-2:]
    if out_hw == [1, 1]:
        return ctx.one("GlobalAveragePool", [ctx.t(0)])
    if any(not isinstance(i, int) or i % o for i, o in zip(in_hw, out_hw, strict=True)):
        from tracelog.adapters.torch.rules_vision import adaptive_pool

        return adaptive_pool(ctx, "avg")
    kernel = [int(i) // o for i, o in zip(in_hw, out_hw, strict=True)]
    return ctx.one("AveragePool", [ctx.t(0)], kernel_shape=kernel, strides=kernel)


# -- reductions ------------------------------------------------------------------------
def _axes(dims: int | Sequence[int] | None) -> list[int] | None:
    if dims is None:
        return None
    if isinstance(dims, int):
        return [dims]
    return [int(d) for d in dims]


def _reduce_rule(op: str, all_dims_overload: bool) -> Converter:
    def rule(ctx: Ctx) -> Names:
        x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
        if src.dtype != out.dtype:
            # the reduction runs in its output's dtype: a sum of bools or int32 counts
            # in int64 (mBART's count of non-pad tokens), sum/mean(dtype=) in that dtype
            x = ctx.helper("Cast", [x], TensorType(out.dtype, src.shape), to=out.dtype)
        if all_dims_overload:
            return ctx.one(op, [x], keepdims=0)
        axes = _axes(ctx.arg(1, "dim"))
        keep = int(bool(ctx.arg(2, "keepdim", False)))
        if not axes:
            return ctx.one(op, [x], keepdims=keep)
        return ctx.one(op, [x, ctx.ints(axes)], keepdims=keep)

    return rule


ATEN.add("aten.mean.default", _reduce_rule("ReduceMean", True))
ATEN.add("aten.sum.default", _reduce_rule("ReduceSum", True))
ATEN.add("aten.max.default", _reduce_rule("ReduceMax", True))
ATEN.add("aten.min.default", _reduce_rule("ReduceMin", True))
ATEN.add("aten.mean.dim", _reduce_rule("ReduceMean", False))
ATEN.add("aten.sum.dim_IntList", _reduce_rule("ReduceSum", False))
ATEN.add("aten.amax.default", _reduce_rule("ReduceMax", False))
ATEN.add("aten.amin.default", _reduce_rule("ReduceMin", False))


@ATEN.register("aten.nansum.default")
def _nansum(ctx: Ctx) -> Names:
    """torch.nansum (nanmean divides it by the count of non-NaN values): NaNs
    read as 0, then a sum over `dim` in the output's dtype; NaN positions
    get no gradient, as torch's."""
    x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    if src.dtype in ("float16", "bfloat16", "float32", "float64"):
        nan = ctx.helper("IsNaN", [x], TensorType("bool", src.shape))
        x = ctx.helper("Where", [nan, ctx.const(0.0, src.dtype), x], src)
    if src.dtype != out.dtype:
        x = ctx.helper("Cast", [x], TensorType(out.dtype, src.shape), to=out.dtype)
    axes = _axes(ctx.arg(1, "dim"))
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    if not axes:
        return ctx.one("ReduceSum", [x], keepdims=keep)
    return ctx.one("ReduceSum", [x, ctx.ints(axes)], keepdims=keep)


@ATEN.register("aten.linalg_vector_norm.default")
def _vector_norm(ctx: Ctx) -> Names:
    """torch.linalg.vector_norm (torch.norm, F.normalize, ConvNeXt V2's global
    response norm): the sum of |x|^ord over `dim`, to the 1/ord, as the CPU
    kernel takes it (no rescaling); ord inf and -inf the largest and least |x|."""
    order = float(ctx.arg(1, "ord", 2))
    axes = _axes(ctx.arg(2, "dim"))
    keep = int(bool(ctx.arg(3, "keepdim", False)))
    x, src, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    if src.dtype != out.dtype:  # dtype=: the norm is taken in it
        x = ctx.helper("Cast", [x], TensorType(out.dtype, src.shape), to=out.dtype)
    return [norm_along(ctx, x, TensorType(out.dtype, src.shape), order, axes or [], keep)]


def norm_along(
    ctx: Ctx,
    x: str,
    wide: TensorType,
    order: float,
    axes: Sequence[int],
    keep: int,
    typed: TensorType | None = None,
) -> str:
    """The vector norm of order `order` of x (of type `wide`) over `axes` (none:
    all), as the record's output; see _vector_norm. With `typed`: a helper of
    that type instead (a norm the record goes on to use)."""
    out = typed or ctx.out_type()
    dt = out.dtype

    def result(op: str, inputs: Sequence[str], **attrs: Any) -> str:
        """The norm's last node: the record's output, or a helper of type `typed`."""
        if typed is None:
            return ctx.one(op, inputs, **attrs)[0]
        return ctx.helper(op, inputs, typed, **attrs)

    reduced = [ctx.ints(list(axes))] if axes else []
    bools = TensorType("bool", wide.shape)
    if order in (math.inf, -math.inf):
        a = ctx.helper("Abs", [x], wide)
        return result("ReduceMax" if order > 0 else "ReduceMin", [a, *reduced], keepdims=keep)
    if order == 1:
        a = ctx.helper("Abs", [x], wide)
        return result("ReduceSum", [a, *reduced], keepdims=keep)
    if order == 0:  # how many are nonzero (no gradient, as torch's)
        zero = ctx.helper("Equal", [x, ctx.const(0.0, dt)], bools)
        nonzero = ctx.helper("Not", [zero], bools)
        counted = ctx.helper("Cast", [nonzero], wide, to=dt)
        return result("ReduceSum", [counted, *reduced], keepdims=keep)
    if order == 2:
        powers = ctx.helper("Mul", [x, x], wide)
        inverse = None
    else:  # the CPU kernel's generic order: (sum |x|^p)^(1/p)
        powers = ctx.helper("Pow", [ctx.helper("Abs", [x], wide), ctx.const(order, dt)], wide)
        inverse = ctx.const(1.0 / order, dt)
    total = ctx.helper("ReduceSum", [powers, *reduced], out, keepdims=keep)
    if order < 0:
        assert inverse is not None
        return result("Pow", [total, inverse])
    # torch's gradient of a zero norm is 0 (norm_backward masks it); the root's
    # is inf there, so the root is taken of 1 where the sum is 0 and its result
    # replaced: no inf * 0 reaches the gradient
    zero = ctx.helper("Equal", [total, ctx.const(0.0, dt)], TensorType("bool", out.shape))
    safe = ctx.helper("Where", [zero, ctx.const(1.0, dt), total], out)
    root = (
        ctx.helper("Sqrt", [safe], out)
        if inverse is None
        else ctx.helper("Pow", [safe, inverse], out)
    )
    return result("Where", [zero, ctx.const(0.0, dt), root])


@ATEN.register("aten._cdist_forward.default")
def _cdist(ctx: Ctx) -> Names:
    """torch.cdist: the p-norm of x1[..., i, :] - x2[..., j, :] for each pair,
    from the differences (torch's matrix-product form for p = 2 over more
    than 25 rows rounds worse; both are the same function)."""
    t1, t2, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    p = float(ctx.arg(2, "p", 2.0))
    width = t1.shape[-1]
    a_t = TensorType(t1.dtype, (*t1.shape[:-1], 1, width))
    b_t = TensorType(t2.dtype, (*t2.shape[:-2], 1, *t2.shape[-2:]))
    a = ctx.helper("Unsqueeze", [ctx.t(0), ctx.ints([-2])], a_t)
    b = ctx.helper("Unsqueeze", [ctx.t(1), ctx.ints([-3])], b_t)
    diff_t = TensorType(out.dtype, (*out.shape, width))
    diff = ctx.helper("Sub", [a, b], diff_t)
    return [norm_along(ctx, diff, diff_t, p, [len(out.shape)], 0)]


def _max_dim_rule(op: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        dim = int(ctx.arg(1, "dim"))
        keep = int(bool(ctx.arg(2, "keepdim", False)))
        values = ctx.one(op, [ctx.t(0), ctx.ints([dim])], keepdims=keep)[0]
        arg_op = "ArgMax" if op == "ReduceMax" else None
        if arg_op is None:
            return [values, None]
        indices = ctx.helper(
            arg_op, [ctx.t(0)], ctx.out_type(1), axis=dim, keepdims=keep, select_last_index=0
        )
        return [values, indices]

    return rule


ATEN.add("aten.max.dim", _max_dim_rule("ReduceMax"))
ATEN.add("aten.min.dim", _max_dim_rule("ReduceMin"))


@ATEN.register("aten.argmax.default")
def _argmax(ctx: Ctx) -> Names:
    return argmax_of(ctx, ctx.t(0))


def argmax_of(ctx: Ctx, data: str) -> Names:
    """The record's argmax (dim, keepdim as its arguments say) of `data`, a
    tensor of the input's type (argmin: of its negation)."""
    dim = ctx.arg(1, "dim")
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    if dim is not None:
        return ctx.one("ArgMax", [data], axis=int(dim), keepdims=keep)
    # no dim: the argmax of the flattened input (a scalar; keepdim: every dim 1)
    x = ctx.in_type(0)
    symbolic = [d for d in x.shape if is_symbolic(d)]
    if len(symbolic) > 1:
        raise NotSupported("argmax over all dims of a tensor with two batch dims")
    size = math.prod(int(d) for d in x.shape if not is_symbolic(d))
    n: int | str = dim_scale(symbolic[0], size) if symbolic else size
    flat = ctx.helper("Reshape", [data, ctx.ints([-1])], TensorType(x.dtype, (n,)))
    if not keep:
        return ctx.one("ArgMax", [flat], axis=0, keepdims=0)
    index = ctx.helper("ArgMax", [flat], TensorType("int64", (1,)), axis=0, keepdims=1)
    return ctx.one("Reshape", [index, ctx.ints([1] * len(x.shape))])


# -- shape ops ---------------------------------------------------------------------------
def _views_uninitialised(rule: Converter) -> Converter:
    """A view rule that keeps a view of an uninitialised tensor (empty, or a view
    of one) uninitialised: nothing reads it until a write through it gives its
    base a value (VIEW_WRITE materialises that base)."""

    def rule_or_view(ctx: Ctx) -> Names:
        info = ctx.b.pseudo.get(ctx.raw_name(0)) if isinstance(ctx.arg(0), TArg) else None
        if info is None or info[0] not in UNINITIALISED:
            return rule(ctx)
        name = ctx.b.helper_name()
        ctx.b.pseudo[name] = ("empty view", tuple(ctx.out_type().shape))
        return [name]

    return rule_or_view


@ATEN.register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
@_views_uninitialised
def _view(ctx: Ctx) -> Names:
    return ctx.one("Reshape", [ctx.t(0), ctx.shape_const(list(ctx.out_type().shape))])


@ATEN.register("aten.permute.default")
@_views_uninitialised
def _permute(ctx: Ctx) -> Names:
    rank = len(ctx.in_type(0).shape)
    return ctx.one("Transpose", [ctx.t(0)], perm=[int(d) % rank for d in ctx.arg(1)])


@ATEN.register("aten.transpose.int", "aten.transpose_.default")  # transpose_: torch.quantile
@_views_uninitialised
def _transpose(ctx: Ctx) -> Names:
    rank = len(ctx.in_type(0).shape)
    perm = list(range(rank))
    d0, d1 = int(ctx.arg(1)) % rank, int(ctx.arg(2)) % rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.one("Transpose", [ctx.t(0)], perm=perm)


@ATEN.register("aten.t.default", "aten.t_.default")
def _t(ctx: Ctx) -> Names:
    if len(ctx.in_type(0).shape) < 2:
        return [ctx.t(0)]
    return ctx.one("Transpose", [ctx.t(0)], perm=[1, 0])


@ATEN.register("aten.unsqueeze.default", "aten.unsqueeze_.default")
@_views_uninitialised
def _unsqueeze(ctx: Ctx) -> Names:
    return ctx.one("Unsqueeze", [ctx.t(0), ctx.ints([int(ctx.arg(1))])])


@ATEN.register(
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.squeeze_.dim",  # torch.quantile squeezes its sorted copy in place
    "aten.squeeze_.dims",
    "aten.squeeze_.default",
)
@_views_uninitialised
def _squeeze(ctx: Ctx) -> Names:
    # the input's shape as its IR value has it: squeeze_'s argument is recorded after
    # the op squeezed it in place
    shape = ctx.b.values[ctx.t(0)].type.shape
    dims = _axes(ctx.arg(1, "dim"))
    if dims is None:
        dims = [i for i, d in enumerate(shape) if d == 1]
    dims = [d % len(shape) for d in dims if shape[d % len(shape)] == 1] if shape else []
    if not dims:
        return [ctx.t(0)]
    return ctx.one("Squeeze", [ctx.t(0), ctx.ints(dims)])


@ATEN.register("aten.expand.default")
def _expand(ctx: Ctx) -> Names:
    src, out = ctx.in_type(0).shape, ctx.out_type().shape
    offset = len(out) - len(src)
    dims: list[int | str] = []
    for i, d in enumerate(out):
        j = i - offset
        dims.append(1 if j >= 0 and src[j] == d else d)
    shape = (
        ctx.dynamic_shape(dims) if any(map(is_symbolic, dims)) else ctx.ints([int(d) for d in dims])
    )
    return ctx.one("Expand", [ctx.t(0), shape])


@ATEN.register("aten.repeat.default")
def _repeat(ctx: Ctx) -> Names:
    """Tile. More counts than dims: x is first unsqueezed at the front, as
    torch reads it (an index row repeated per sample: arange(n).repeat(B, 1)).
    A count that makes a batch-sized dim is that dim's size over the input
    dim's, computed from the data, so that every batch size runs the graph."""
    reps = [int(r) for r in ctx.arg(1)]
    x, xt, out = ctx.t(0), ctx.in_type(0), ctx.out_type()
    lead = len(reps) - len(xt.shape)
    if lead < 0:
        raise NotSupported("repeat with fewer counts than dims")
    shape = (1,) * lead + tuple(xt.shape)
    if lead:
        x = ctx.helper("Unsqueeze", [x, ctx.ints(list(range(lead)))], TensorType(xt.dtype, shape))
    follows = [is_symbolic(o) and not is_symbolic(i) for i, o in zip(shape, out.shape, strict=True)]
    if not any(follows):
        return ctx.one("Tile", [x, ctx.ints(reps)])
    parts = []
    for r, i, o, follow in zip(reps, shape, out.shape, follows, strict=True):
        if not follow:
            parts.append(ctx.ints([r]))
        elif i == 1:
            parts.append(ctx.b_dim(o))
        else:  # instance norm's weight.repeat(B): the count is the out dim over the in dim
            poly = parse_dim(o)
            if any(c % int(i) for c in poly.values()):
                raise NotSupported(f"repeat of {i} to {o}: not a whole number of times")
            parts.append(ctx.b_dim(format_dim({m: c // int(i) for m, c in poly.items()})))
    counts = ctx.helper("Concat", parts, TensorType("int64", (len(reps),)), axis=0)
    return ctx.one("Tile", [x, counts])


@ATEN.register("aten.cat.default")
def _cat(ctx: Ctx) -> Names:
    tensors = ctx.arg(0, "tensors")
    names = [ctx.b.name_of(t) for t in tensors if t.shape != (0,)]
    return ctx.one("Concat", names, axis=int(ctx.arg(1, "dim", 0)))


@ATEN.register("aten.stack.default")
def _stack(ctx: Ctx) -> Names:
    dim = int(ctx.arg(1, "dim", 0))
    out = ctx.out_type()
    dim = dim % len(out.shape)
    parts = []
    for t in ctx.arg(0, "tensors"):
        shape = list(t.shape)
        shape.insert(dim, 1)
        parts.append(
            ctx.helper(
                "Unsqueeze", [ctx.b.name_of(t), ctx.ints([dim])], TensorType(t.dtype, tuple(shape))
            )
        )
    return ctx.one("Concat", parts, axis=dim)


def _split(ctx: Ctx, sizes: list[int], dim: int) -> Names:
    return ctx.node("Split", [ctx.t(0), ctx.ints(sizes)], axis=dim)


@ATEN.register(
    "aten.split.Tensor",
    "aten.split_with_sizes.default",
    # the same split, its outputs not tracked as views (LSTMCell's and GRUCell's gates)
    "aten.unsafe_split.Tensor",
    "aten.unsafe_split_with_sizes.default",
)
def _split_rule(ctx: Ctx) -> Names:
    shape = ctx.in_type(0).shape
    dim = int(ctx.arg(2, "dim", 0)) % len(shape)
    # (a part marked batch-sized beside a whole that is not: the batch-dim
    # replay did not run, and a size equal to the batch was taken for it)
    if is_symbolic(shape[dim]) or any(not isinstance(o.shape[dim], int) for o in ctx.rec.outs):
        raise NotSupported("split along the batch dim")
    return _split(ctx, [int(o.shape[dim]) for o in ctx.rec.outs[: ctx.rec.n_returned]], dim)


@ATEN.register("aten.unbind.int")
def _unbind(ctx: Ctx) -> Names:
    shape = ctx.in_type(0).shape
    dim = int(ctx.arg(1, "dim", 0)) % len(shape)
    size = shape[dim]
    if not isinstance(size, int):
        raise NotSupported("unbind along the batch dim")
    kept = list(shape)
    kept[dim] = 1
    parts = ctx.node(
        "Split",
        [ctx.t(0), ctx.ints([1] * size)],
        outs=[TensorType(ctx.in_type(0).dtype, tuple(kept))] * size,
        axis=dim,
    )
    return [
        ctx.helper("Squeeze", [p, ctx.ints([dim])], ctx.out_type(k)) for k, p in enumerate(parts)
    ]


@ATEN.register("aten.slice.Tensor")
@_views_uninitialised
def _slice(ctx: Ctx) -> Names:
    shape = ctx.in_type(0).shape
    dim = int(ctx.arg(1, "dim", 0)) % len(shape)
    start = ctx.arg(2, "start", None)
    end = ctx.arg(3, "end", None)
    step = int(ctx.arg(4, "step", 1))
    start = 0 if start is None else int(start)
    end = INT64_MAX if end is None or end >= INT64_MAX else int(end)
    size = shape[dim]
    if is_symbolic(size) and step == 1 and ctx.out_type().shape[dim] == size:
        # as long as its input at every size the replay tried (x[-n:] with n the
        # input's own length, B*T: NLLB-MoE's router mask[-nb_tokens:]): the whole
        return [ctx.t(0)]
    if is_symbolic(size) and BATCH in str(size) and (start, end, step) != (0, INT64_MAX, 1):
        if ctx.batch is not None and end >= ctx.batch and start == 0 and step == 1:
            return [ctx.t(0)]  # a slice of the whole batch: x[:n] with n >= batch
        raise NotSupported("a slice of part of the batch")
    if (start, end, step) == (0, INT64_MAX, 1) or (
        isinstance(size, int) and start == 0 and end >= size and step == 1
    ):
        return [ctx.t(0)]
    length = ctx.out_type().shape[dim]
    ends = ctx.ints([end])
    if is_symbolic(length) and isinstance(size, int) and end >= size and step == 1:
        # the last T of a table of fixed length L (MPT's ALiBi bias[:, L - T:]): its
        # start follows the length, L - T, not the recorded number
        one = TensorType("int64", (1,))
        starts = ctx.helper("Sub", [ctx.ints([size]), ctx.b_dim(length)], one)
        return ctx.one(
            "Slice", [ctx.t(0), starts, ctx.ints([size]), ctx.ints([dim]), ctx.ints([1])]
        )
    if is_symbolic(length) and 0 <= end < INT64_MAX:
        # a slice as long as a sequence (position_ids[:, :T], x[:, 1:T]): its end
        # follows that length, start + length, not the recorded number
        if step != 1 or start < 0:
            raise NotSupported("a strided or negative-start slice of a sequence-long length")
        ends = ctx.helper("Add", [ctx.ints([start]), ctx.b_dim(length)], TensorType("int64", (1,)))
    return ctx.one("Slice", [ctx.t(0), ctx.ints([start]), ends, ctx.ints([dim]), ctx.ints([step])])


@ATEN.register("aten.select.int")
@_views_uninitialised
def _select(ctx: Ctx) -> Names:
    shape = ctx.in_type(0).shape
    dim = int(ctx.arg(1, "dim")) % len(shape)
    # a sample of the batch too (h[0], h[-1]: the emitters count a negative index
    # from a symbolic dim's run-time size): the graph holds for every batch that has it
    index = int(ctx.arg(2, "index"))
    return ctx.one("Gather", [ctx.t(0), ctx.const(index, "int64")], axis=dim)


@ATEN.register("aten.embedding.default")
def _embedding(ctx: Ctx) -> Names:
    weight = ctx.t(0)
    padding_idx = int(ctx.arg(2, "padding_idx", -1))
    if padding_idx >= 0:
        # torch's embedding backward leaves the padding row without gradient: the
        # rows read through a StopGradient there (same values, no gradient)
        wt = ctx.in_type(0)
        rows = wt.shape[0]
        if not isinstance(rows, int):
            raise NotSupported("an embedding with a padding index and a symbolic row count")
        is_pad = np.zeros((rows, 1), dtype=bool)
        is_pad[padding_idx] = True
        frozen = ctx.helper("StopGradient", [weight], wt, domain=TRACELOG_DOMAIN)
        weight = ctx.helper("Where", [ctx.const(is_pad, "bool"), frozen, weight], wt)
    if not ctx.arg(3, "scale_grad_by_freq", False):
        return ctx.one("Gather", [weight, ctx.t(1)], axis=0)
    return ctx.one(
        *_by_frequency(ctx, ctx.helper("Gather", [weight, ctx.t(1)], ctx.out_type(), axis=0))
    )


def _by_frequency(ctx: Ctx, rows: str) -> tuple[str, list[str]]:
    """scale_grad_by_freq: each row read as itself, its gradient divided by how
    often the batch reads its index (torch's embedding backward): rows +
    (rows - StopGradient(rows)) / count, whose value is rows exactly."""
    wt, it, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    vocab = wt.shape[0]
    if not isinstance(vocab, int):
        raise NotSupported("scale_grad_by_freq with a symbolic row count")
    size: int | str = 1
    for d in it.shape:
        size = dim_mul(size, d)
    flat = ctx.helper("Reshape", [ctx.t(1), ctx.ints([-1])], TensorType(it.dtype, (size,)))
    n = TensorType(wt.dtype, (size,))
    ones = ctx.helper(
        "ConstantOfShape",
        [ctx.helper("Shape", [flat], TensorType("int64", (1,)))],
        n,
        value=1.0,
    )
    zeros = ctx.const(np.zeros(vocab, dtype=np.dtype(wt.dtype)), wt.dtype)
    counts = ctx.helper(
        "ScatterElements",
        [zeros, flat, ones],
        TensorType(wt.dtype, (vocab,)),
        axis=0,
        reduction="add",
    )
    read = ctx.helper("Gather", [counts, ctx.t(1)], TensorType(wt.dtype, it.shape), axis=0)
    per_row = ctx.helper(
        "Unsqueeze", [read, ctx.ints([len(it.shape)])], TensorType(wt.dtype, (*it.shape, 1))
    )
    frozen = ctx.helper("StopGradient", [rows], out, domain=TRACELOG_DOMAIN)
    moving = ctx.helper("Div", [ctx.helper("Sub", [rows, frozen], out), per_row], out)
    return "Add", [frozen, moving]


# -- tensor factories: constants, or ConstantOfShape for a batch-sized shape -----------
def _fill_rule(value_arg: int | None, fill: float) -> Converter:
    def rule(ctx: Ctx) -> Names:
        out = ctx.out_type()
        value = fill if value_arg is None else ctx.arg(value_arg, "fill_value")
        if isinstance(value, TArg):
            raise NotSupported("a fill value given as a tensor")
        if any(map(is_symbolic, out.shape)):
            return ctx.one("ConstantOfShape", [ctx.dynamic_shape(list(out.shape))], value=value)
        dtype = np.dtype(out.dtype)
        # a float fill as given (torch.quantile's q = 0.3, not float32's 0.30000001):
        # the constant keeps its exact value for the float64 check (Builder.new_const)
        wide = np.float64 if dtype.kind == "f" and isinstance(value, float) else dtype
        data = np.full([int(d) for d in out.shape], value, dtype=wide)
        return [ctx.const(data, out.dtype)]

    return rule


ATEN.update_from(
    ["aten.zeros_like.default", "aten.new_zeros.default", "aten.zeros.default"],
    _fill_rule(None, 0.0),
)
ATEN.update_from(
    ["aten.ones_like.default", "aten.new_ones.default", "aten.ones.default"], _fill_rule(None, 1.0)
)
ATEN.update_from(["aten.full_like.default", "aten.new_full.default"], _fill_rule(1, 0.0))
ATEN.add("aten.full.default", _fill_rule(1, 0.0))
ATEN.add("aten.scalar_tensor.default", _fill_rule(0, 0.0))


# -- dropout: CPU runs empty_like -> bernoulli_(1 - p) -> div_(1 - p) -> mul ------------
@ATEN.register("aten.empty_like.default")
def _empty_like(ctx: Ctx) -> Names:
    name = ctx.b.helper_name()
    ctx.b.pseudo[name] = ("empty", None)
    return [name]


@ATEN.register("aten.new_empty.default")
def _new_empty(ctx: Ctx) -> Names:
    # feature dropout (F.dropout1d/2d/3d, nn.Dropout2d): one keep draw per sample
    # and channel, a fresh [B, C, 1, ...] tensor that multiplies the input
    name = ctx.b.helper_name()
    ctx.b.pseudo[name] = ("empty", tuple(ctx.out_type().shape))
    return [name]


@ATEN.register("aten.bernoulli_.float")
def _bernoulli_(ctx: Ctx) -> Names:
    src = ctx.raw_name(0)
    info = ctx.b.pseudo.get(src)
    if info is None or info[0] != "empty":
        raise NotSupported("bernoulli_ on a tensor that is not a fresh mask")
    name = ctx.b.helper_name()
    ctx.b.pseudo[name] = ("bernoulli", float(ctx.arg(1, "p", 0.5)), ctx.rec.index, info[1])
    return [name]


def _dropout_scale(ctx: Ctx) -> Names | None:
    """div_(mask, 1 - p) on a bernoulli mask: the scaled dropout mask."""
    src = ctx.raw_name(0)
    info = ctx.b.pseudo.get(src)
    if info is None:
        return None
    keep = ctx.arg(1)
    if info[0] != "bernoulli" or not isinstance(keep, (int, float)) or abs(keep - info[1]) > 1e-12:
        raise NotSupported("a dropout mask scaled other than by 1 / (1 - p)")
    name = ctx.b.helper_name()
    ctx.b.pseudo[name] = ("mask", info[1], info[2], info[3])
    return [name]


def _dropout_mul(ctx: Ctx) -> Names | None:
    """mul(x, scaled mask): Dropout in training mode; its mask is recorded."""
    names = [ctx.raw_name(i) if isinstance(ctx.arg(i), TArg) else None for i in (0, 1)]
    infos = [ctx.b.pseudo.get(n) if n else None for n in names]
    if not any(infos):
        return None
    k = 1 if infos[1] else 0
    info = infos[k]
    if info is None or info[0] != "mask" or names[1 - k] is None or infos[1 - k]:
        raise NotSupported("a random tensor is used outside the dropout pattern")
    keep, rec_index, shape = info[1], info[2], info[3]
    x = names[1 - k]
    assert x is not None  # checked above
    out = ctx.out_type()
    if shape is None or tuple(shape) == tuple(out.shape):
        return [ctx.dropout(x, 1.0 - keep, rec_index)]
    # a mask of its own shape (a draw per sample and channel): Dropout of ones of
    # that shape is the scaled mask (its mask the one drawn), times x
    ones_t = TensorType(out.dtype, tuple(shape))
    ones = ctx.helper(
        "ConstantOfShape",
        [ctx.shape_const(list(shape), allow_minus_one=False)],
        ones_t,
        value=1.0,
    )
    scaled = ctx.dropout(ones, 1.0 - keep, rec_index, ones_t)
    return ctx.one("Mul", [x, scaled] if k == 1 else [scaled, x])


_plain_div = _binary_rule("Div")
_plain_mul = _binary_rule("Mul")


@ATEN.register("aten.div.out")
def _div_out(ctx: Ctx) -> Names:
    # torch.div(a, b, out=t) (spectral norm's power iteration into its u and v
    # buffers): the quotient, which t holds from here on
    dt = ctx.out_type().dtype
    return ctx.one("Div", [_operand(ctx, 0, "self", dt), _operand(ctx, 1, "other", dt)])


@ATEN.register("aten.div_.Scalar")
def _div_scalar_inplace(ctx: Ctx) -> Names:
    return _dropout_scale(ctx) or _plain_div(ctx)


@ATEN.register("aten.mul.Tensor", "aten.mul_.Tensor")  # mul_: nn.Dropout(inplace=True)
def _mul_tensor(ctx: Ctx) -> Names:
    if ctx.out_type().dtype == "bool":  # torch.isfinite: (x == x) * (|x| != inf)
        return ctx.one("And", [ctx.t(0), ctx.t(1)])  # ONNX's Mul takes no bool
    return _dropout_mul(ctx) or _plain_mul(ctx)


# -- random draws: torch.rand / randn and their _like forms, uniform_ and normal_ --------
# (stochastic depth's keep_prob + rand floored, a VAE's noise). The node draws values
# of its output's type; the sample keeps what the batch drew (the listener copies it as
# drawn: DropPath floors it in place) and a replay feeds it back.
_DRAWS = {
    "aten.rand.default": ("RandomUniformLike", None, None),
    "aten.rand_like.default": ("RandomUniformLike", None, None),
    "aten.uniform_.default": ("RandomUniformLike", (1, "from", 0.0), (2, "to", 1.0)),
    "aten.randn.default": ("RandomNormalLike", None, None),
    "aten.randn_like.default": ("RandomNormalLike", None, None),
    "aten.normal_.default": ("RandomNormalLike", (1, "mean", 0.0), (2, "std", 1.0)),
    "aten.exponential_.default": ("RandomExponentialLike", None, None),  # gumbel_softmax
}
# torch.randint([low,] high, size): ints drawn uniformly from [low, high) (Informer's
# sampled keys)
_INT_DRAWS = {"aten.randint.low": 0, "aten.randint.default": None}  # low's argument, if any
DRAW_OPS = frozenset([*_DRAWS, *_INT_DRAWS])
# a float32 draw floored gives every int of a range this wide, and holds the ints fed back
_EXACT_INTS = 2**24


@ATEN.register(*_DRAWS)
def _random_draw(ctx: Ctx) -> Names:
    op, first, second = _DRAWS[ctx.rec.op]
    out = ctx.out_type()
    if out.dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise NotSupported(f"a random draw of dtype {out.dtype}")
    if op == "RandomExponentialLike" and float(ctx.arg(1, "lambd", 1.0)) != 1.0:
        # the node draws at rate 1 and the sample feeds back what the batch drew: a
        # rate written as a division after it would scale the fed values again
        raise NotSupported("an exponential draw of a rate other than 1")
    a, b = 0.0, 1.0  # rand: [0, 1); randn: mean 0, std 1
    if first is not None and second is not None:  # uniform_(from, to), normal_(mean, std)
        a, b = float(ctx.arg(*first)), float(ctx.arg(*second))
    if op == "RandomExponentialLike":
        return [random_like(ctx, out, op, record=True, domain=TRACELOG_DOMAIN)]
    attrs = {"low": a, "high": b} if op == "RandomUniformLike" else {"mean": a, "scale": b}
    return [random_like(ctx, out, op, record=True, **attrs)]


@ATEN.register(*_INT_DRAWS)
def _randint(ctx: Ctx) -> Names:
    """Ints from [low, high): no target has a uniform int draw shaped as a tensor
    is (ONNX has none), so a uniform float draw in [low, high), floored, capped
    at high - 1 (rounding may carry a draw just below high up to it), cast to the
    record's dtype. The sample feeds back the ints the batch drew, which floor
    to themselves."""
    at = _INT_DRAWS[ctx.rec.op]
    low = 0 if at is None else ctx.arg(at, "low")
    high = ctx.arg(0 if at is None else at + 1, "high")
    if type(low) is not int or type(high) is not int or high <= low:
        raise NotSupported("randint with bounds that are not ints, low < high")
    if max(abs(low), abs(high)) > _EXACT_INTS:
        raise NotSupported(f"randint past float32's exact ints (|bound| > {_EXACT_INTS})")
    out = ctx.out_type()
    drawn = TensorType("float32", out.shape)
    u = random_like(ctx, drawn, "RandomUniformLike", low=float(low), high=float(high))
    whole = ctx.helper("Floor", [u], drawn)
    capped = ctx.helper("Min", [whole, ctx.const(float(high - 1), "float32")], drawn)
    return ctx.one("Cast", [capped], to=out.dtype)


def random_like(ctx: Ctx, ty: TensorType, op: str, record: bool = False, **attrs: Any) -> str:
    """A draw node of type `ty` (the record's output with `record`, else a
    helper) whose values the sample takes from the record's draw (the
    listener's mask()); a fresh run draws them."""
    # the draw's shape and dtype as a tensor of zeros (a symbolic dim from the data)
    dims = list(ty.shape)
    shape = (
        ctx.dynamic_shape(dims)
        if any(is_symbolic(d) for d in dims)
        else ctx.ints([int(d) for d in dims])
    )
    like = ctx.helper("ConstantOfShape", [shape], ty, value=0.0)
    y = ctx.one(op, [like], **attrs)[0] if record else ctx.helper(op, [like], ty, **attrs)
    ctx.b.random_recs[y] = ctx.rec.index
    return y


@ATEN.register("aten.native_dropout.default")
def _native_dropout(ctx: Ctx) -> Names:
    if not ctx.arg(2, "train"):
        return [ctx.t(0), None]
    return [ctx.dropout(ctx.t(0), float(ctx.arg(1, "p")), ctx.rec.index), None]


# -- losses -----------------------------------------------------------------------------
def _reduce_loss(ctx: Ctx, elementwise: str, reduction: int) -> Names:
    kind = _REDUCTION.get(int(reduction))
    if kind == "none":
        return [ctx.node("Identity", [elementwise], outs=1)[0]]
    op = "ReduceMean" if kind == "mean" else "ReduceSum"
    return ctx.one(op, [elementwise], keepdims=0)


@ATEN.register("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll_loss(ctx: Ctx) -> Names:
    ins = [ctx.t(0), ctx.t(1)] + ([ctx.t(2)] if ctx.arg(2) is not None else [])
    y = ctx.one(
        "NegativeLogLikelihoodLoss",
        ins,
        reduction=_REDUCTION[int(ctx.arg(3, "reduction", 1))],
        ignore_index=int(ctx.arg(4, "ignore_index", -100)),
    )
    return [y[0], None]


@ATEN.register("aten.mse_loss.default")
def _mse_loss(ctx: Ctx) -> Names:
    a = ctx.in_type(0)
    diff = ctx.helper("Sub", [ctx.t(0), ctx.t(1)], a)
    sq = ctx.helper("Mul", [diff, diff], a)
    return _reduce_loss(ctx, sq, ctx.arg(2, "reduction", 1))


@ATEN.register("aten.binary_cross_entropy_with_logits.default")
def _bce_with_logits(ctx: Ctx) -> Names:
    # torch: (1 - y) * x + w_pos * (log(1 + exp(-|x|)) + max(-x, 0)),
    # w_pos = 1 + (pos_weight - 1) * y; written with ONNX ops.
    xt = ctx.in_type(0)
    x, y = ctx.t(0), ctx.t(1)
    one = ctx.const(1.0, xt.dtype)
    neg_abs = ctx.helper("Neg", [ctx.helper("Abs", [x], xt)], xt)
    log_term = ctx.helper(
        "Add",
        [
            ctx.helper("Softplus", [neg_abs], xt),
            ctx.helper("Relu", [ctx.helper("Neg", [x], xt)], xt),
        ],
        xt,
    )
    if ctx.arg(3, "pos_weight") is not None:
        pw_minus_1 = ctx.helper("Sub", [ctx.t(3, "pos_weight"), one], ctx.in_type(3))
        w_pos = ctx.helper("Add", [ctx.helper("Mul", [pw_minus_1, y], xt), one], xt)
        log_term = ctx.helper("Mul", [w_pos, log_term], xt)
    lin = ctx.helper("Mul", [ctx.helper("Sub", [one, y], xt), x], xt)
    loss = ctx.helper("Add", [lin, log_term], xt)
    if ctx.arg(2, "weight") is not None:
        loss = ctx.helper("Mul", [loss, ctx.t(2, "weight")], xt)
    return _reduce_loss(ctx, loss, ctx.arg(4, "reduction", 1))


@ATEN.register("aten.binary_cross_entropy.default")
def _bce(ctx: Ctx) -> Names:
    # nn.BCELoss on probabilities, aten's kernel: (y - 1) * max(log1p(-x), -100)
    # - y * max(log(x), -100), times the weight (each log clamped at -100, so a
    # probability of 0 or 1 gives a finite loss)
    xt = ctx.in_type(0)
    dt = xt.dtype
    x, y = ctx.t(0), ctx.t(1)
    floor = ctx.const(-100.0, dt)
    log_rest = ctx.helper(
        "Log1p", [ctx.helper("Neg", [x], xt)], xt, domain="tracelog"
    )  # log(1 - x), exact where x is small
    log_rest = ctx.helper("Max", [log_rest, floor], xt)
    log_x = ctx.helper("Max", [ctx.helper("Log", [x], xt), floor], xt)
    rest = ctx.helper("Mul", [ctx.helper("Sub", [y, ctx.const(1.0, dt)], xt), log_rest], xt)
    loss = ctx.helper("Sub", [rest, ctx.helper("Mul", [y, log_x], xt)], xt)
    if ctx.arg(2, "weight") is not None:
        loss = ctx.helper("Mul", [loss, ctx.t(2, "weight")], xt)
    return _reduce_loss(ctx, loss, ctx.arg(3, "reduction", 1))


def _abs_diff(ctx: Ctx) -> tuple[str, TensorType]:
    """|input - target| of a loss, in the result's elementwise type."""
    a = ctx.in_type(0)
    return ctx.helper("Abs", [ctx.helper("Sub", [ctx.t(0), ctx.t(1)], a)], a), a


def _piecewise(ctx: Ctx, z: str, a: TensorType, width: float, near: str, far: str) -> str:
    """Where z < width the quadratic piece, else the linear one."""
    below = ctx.helper("Less", [z, ctx.const(width, a.dtype)], TensorType("bool", a.shape))
    return ctx.helper("Where", [below, near, far], a)


@ATEN.register("aten.smooth_l1_loss.default")
def _smooth_l1_loss(ctx: Ctx) -> Names:
    # z = |x - y|: 0.5 z^2 / beta below beta, z - 0.5 beta from it (aten's
    # smooth_l1 kernel, in its order of operations); beta 0: the L1 loss
    beta = float(ctx.arg(3, "beta", 1.0))
    z, a = _abs_diff(ctx)
    dt = a.dtype
    if beta == 0.0:
        return _reduce_loss(ctx, z, ctx.arg(2, "reduction", 1))
    half_z = ctx.helper("Mul", [ctx.const(0.5, dt), z], a)
    near = ctx.helper("Div", [ctx.helper("Mul", [half_z, z], a), ctx.const(beta, dt)], a)
    far = ctx.helper("Sub", [z, ctx.const(0.5 * beta, dt)], a)
    return _reduce_loss(ctx, _piecewise(ctx, z, a, beta, near, far), ctx.arg(2, "reduction", 1))


@ATEN.register("aten.huber_loss.default")
def _huber_loss(ctx: Ctx) -> Names:
    # z = |x - y|: 0.5 z^2 below delta, delta (z - 0.5 delta) from it (aten's
    # huber kernel)
    delta = float(ctx.arg(3, "delta", 1.0))
    z, a = _abs_diff(ctx)
    dt = a.dtype
    half_z = ctx.helper("Mul", [ctx.const(0.5, dt), z], a)
    near = ctx.helper("Mul", [half_z, z], a)
    linear = ctx.helper("Sub", [z, ctx.const(0.5 * delta, dt)], a)
    far = ctx.helper("Mul", [ctx.const(delta, dt), linear], a)
    return _reduce_loss(ctx, _piecewise(ctx, z, a, delta, near, far), ctx.arg(2, "reduction", 1))


@ATEN.register("aten.soft_margin_loss.default")
def _soft_margin_loss(ctx: Ctx) -> Names:
    # log1p(exp(-y x)), as aten's soft_margin_loss writes it
    a = ctx.in_type(0)
    product = ctx.helper("Mul", [ctx.helper("Neg", [ctx.t(0)], a), ctx.t(1)], a)
    loss = ctx.helper("Log1p", [ctx.helper("Exp", [product], a)], a, domain="tracelog")
    return _reduce_loss(ctx, loss, ctx.arg(2, "reduction", 1))


@ATEN.register("aten.multi_margin_loss.default")
def _multi_margin_loss(ctx: Ctx) -> Names:
    """Per sample i of [N, C] scores x and its class y_i: the sum over the
    other classes j of w[y_i] * max(0, margin - x[y_i] + x[j])^p, over C
    (aten's multi_margin_loss_cpu_kernel; p 1 or 2)."""
    xt = ctx.in_type(0)
    if len(xt.shape) != 2:
        raise NotSupported("multi_margin_loss of one sample (a 1-d input)")
    p, margin = int(ctx.arg(2, "p", 1)), float(ctx.arg(3, "margin", 1.0))
    if p not in (1, 2):
        raise NotSupported(f"multi_margin_loss with p={p}")
    dt, classes = xt.dtype, xt.shape[1]
    if is_symbolic(classes):
        raise NotSupported("multi_margin_loss over a symbolic number of classes")
    n = xt.shape[0]
    column = TensorType(dt, (n, 1))
    labels = ctx.helper("Unsqueeze", [ctx.t(1), ctx.ints([1])], TensorType("int64", (n, 1)))
    picked = ctx.helper("GatherElements", [ctx.t(0), labels], column, axis=1)
    gap = ctx.helper("Sub", [ctx.const(margin, dt), picked], column)
    hinge = ctx.helper("Relu", [ctx.helper("Add", [gap, ctx.t(0)], xt)], xt)
    if p == 2:
        hinge = ctx.helper("Mul", [hinge, hinge], xt)
    own = ctx.helper(
        "Equal",
        [ctx.ints(list(range(int(classes)))), labels],
        TensorType("bool", xt.shape),
    )
    hinge = ctx.helper("Where", [own, ctx.const(0.0, dt), hinge], xt)
    if ctx.arg(4, "weight") is not None:
        w = ctx.helper("Gather", [ctx.t(4, "weight"), labels], column, axis=0)
        hinge = ctx.helper("Mul", [hinge, w], xt)
    per_sample = ctx.helper("ReduceSum", [hinge, ctx.ints([1])], TensorType(dt, (n,)), keepdims=0)
    loss = ctx.helper("Div", [per_sample, ctx.const(float(classes), dt)], TensorType(dt, (n,)))
    return _reduce_loss(ctx, loss, ctx.arg(5, "reduction", 1))


@ATEN.register("aten.multilabel_margin_loss_forward.default")
def _multilabel_margin_loss(ctx: Ctx) -> Names:
    """Per sample of [N, C] scores x and labels y (read up to the first negative,
    as aten's multilabel_margin_loss_forward_inner_sum_cpu): the sum over its
    labels k and the classes j that are none of its labels of
    max(0, 1 - x[y_k] + x[j]), over C; then the reduction. The second output
    (is_target) is left unmodelled: only the backward kernel reads it."""
    xt = ctx.in_type(0)
    if len(xt.shape) != 2:
        raise NotSupported("multilabel_margin_loss of one sample (a 1-d input)")
    dt, classes, n = xt.dtype, xt.shape[1], xt.shape[0]
    if is_symbolic(classes):
        raise NotSupported("multilabel_margin_loss over a symbolic number of classes")
    c = int(classes)
    x, y = ctx.t(0), ctx.t(1)
    if ctx.in_type(1).dtype != "int64":
        y = ctx.helper("Cast", [y], TensorType("int64", xt.shape), to="int64")
    flags = TensorType("bool", xt.shape)
    ended = ctx.helper(
        "CumSum",
        [
            ctx.helper(
                "Cast",
                [ctx.helper("Less", [y, ctx.const(0, "int64")], flags)],
                TensorType("int64", xt.shape),
                to="int64",
            ),
            ctx.const(1, "int64"),
        ],
        TensorType("int64", xt.shape),
    )
    listed = ctx.helper("Equal", [ended, ctx.const(0, "int64")], flags)  # k before the end
    labels = ctx.helper("Where", [listed, y, ctx.const(0, "int64")], TensorType("int64", xt.shape))
    cube = (n, c, c)  # [sample, label k, class j]
    hits = ctx.helper(
        "And",
        [
            ctx.helper(
                "Equal",
                [
                    ctx.helper(
                        "Unsqueeze", [labels, ctx.ints([2])], TensorType("int64", (n, c, 1))
                    ),
                    ctx.ints(list(range(c))),
                ],
                TensorType("bool", cube),
            ),
            ctx.helper("Unsqueeze", [listed, ctx.ints([2])], TensorType("bool", (n, c, 1))),
        ],
        TensorType("bool", cube),
    )
    is_target = ctx.helper(
        "ReduceMax",
        [ctx.helper("Cast", [hits], TensorType(dt, cube), to=dt), ctx.ints([1])],
        TensorType(dt, (n, 1, c)),
        keepdims=1,
    )
    other = ctx.helper("Equal", [is_target, ctx.const(0.0, dt)], TensorType("bool", (n, 1, c)))
    counted = ctx.helper(
        "And",
        [ctx.helper("Unsqueeze", [listed, ctx.ints([2])], TensorType("bool", (n, c, 1))), other],
        TensorType("bool", cube),
    )
    picked = ctx.helper("GatherElements", [x, labels], xt, axis=1)
    gap = ctx.helper(
        "Sub",
        [
            ctx.const(1.0, dt),
            ctx.helper("Unsqueeze", [picked, ctx.ints([2])], TensorType(dt, (n, c, 1))),
        ],
        TensorType(dt, (n, c, 1)),
    )
    row = ctx.helper("Unsqueeze", [x, ctx.ints([1])], TensorType(dt, (n, 1, c)))
    hinge = ctx.helper(
        "Relu", [ctx.helper("Add", [gap, row], TensorType(dt, cube))], TensorType(dt, cube)
    )
    hinge = ctx.helper("Where", [counted, hinge, ctx.const(0.0, dt)], TensorType(dt, cube))
    per_sample = ctx.helper(
        "ReduceSum", [hinge, ctx.ints([1, 2])], TensorType(dt, (n,)), keepdims=0
    )
    loss = ctx.helper("Div", [per_sample, ctx.const(float(c), dt)], TensorType(dt, (n,)))
    return [*_reduce_loss(ctx, loss, ctx.arg(2, "reduction", 1)), None]


def dim_sub(d: int | str, k: int) -> int | str:
    """A dim less k elements."""
    poly = parse_dim(d)
    poly[()] = poly.get((), 0) - k
    return format_dim(poly)


# -- in-place writes: the written value, and the base of a written view -----------------
@ATEN.register("aten.copy_.default")
def _copy_(ctx: Ctx) -> Names:
    # the new value of self: src in self's dtype, broadcast to self's shape (the
    # base of a view written so gets its new value from a VIEW_WRITE record)
    out = ctx.out_type()
    src = ctx.in_type(1)
    x = ctx.t(1)
    if src.dtype != out.dtype:
        x = ctx.helper("Cast", [x], TensorType(out.dtype, src.shape), to=out.dtype)
    if tuple(src.shape) != tuple(out.shape):
        return ctx.one("Expand", [x, ctx.shape_const(list(out.shape), allow_minus_one=False)])
    return [x]


ATEN.update_from(["aten.fill_.Scalar"], _fill_rule(1, 0.0))


@ATEN.register("aten.fill_.Tensor")
def _fill_tensor(ctx: Ctx) -> Names:
    # self's new value: the 0-dim value in self's dtype, broadcast to self's shape
    out = ctx.out_type()
    value = ctx.t(1)
    if ctx.in_type(1).dtype != out.dtype:
        value = ctx.helper("Cast", [value], TensorType(out.dtype, ()), to=out.dtype)
    return ctx.one("Expand", [value, ctx.shape_const(list(out.shape), allow_minus_one=False)])


ATEN.update_from(["aten.zero_.default"], _fill_rule(None, 0.0))

VIEW_WRITE = "tracelog.view_write"  # the listener's record for a write through a view


# views of the whole base: its new value is the view's, in the base's shape or order
WHOLE_VIEWS = (
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.unsqueeze.default",
    "aten.transpose.int",
    "aten.permute.default",
)


def inverse_order(kind: str, args: Sequence[Any], rank: int) -> list[int] | None:
    """The permutation that takes a transposed or permuted view back to its
    base's order; None for a view that keeps the order (a reshape)."""
    if kind == "aten.transpose.int":
        perm = list(range(rank))
        a, b = int(args[0]) % rank, int(args[1]) % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if kind == "aten.permute.default":
        dims = [int(d) % rank for d in args[0]]
        return [dims.index(k) for k in range(rank)]
    return None


def _written_base(ctx: Ctx) -> str:
    """The base of a view write. An uninitialised one (empty, as _pad_circular's
    new_empty) is zeros, one value its memory may hold: the write gives the
    view's region its value, and the elements the source reads back are ones it
    wrote (the float64 reference fills empty memory with NaN, so a read of any
    other fails the translation check)."""
    info = ctx.b.pseudo.get(ctx.raw_name(0))
    if info is None or info[0] not in UNINITIALISED:
        return ctx.t(0)
    bt = ctx.in_type(0)
    if any(map(is_symbolic, bt.shape)):
        shape = ctx.dynamic_shape(list(bt.shape))
        return ctx.helper("ConstantOfShape", [shape], bt, value=0.0)
    return ctx.const(np.zeros([int(d) for d in bt.shape], dtype=np.dtype(bt.dtype)), bt.dtype)


@ATEN.register(VIEW_WRITE)
def _view_write(ctx: Ctx) -> Names:
    """base with the region a slice or select view covers replaced by the view's
    new value: Concat of the base before it, the value and the base after it;
    through a view of the whole base, the value in the base's shape or order."""
    kind = ctx.arg(2)
    bt = ctx.in_type(0)
    rank = len(bt.shape)
    if kind in WHOLE_VIEWS:
        value = ctx.t(1)
        if ctx.in_type(1).dtype != bt.dtype:
            raise NotSupported("a write through a view of another dtype")
        perm = inverse_order(kind, ctx.rec.args[3:], rank)
        if perm is not None:
            return ctx.one("Transpose", [value], perm=perm)
        return ctx.one("Reshape", [value, ctx.shape_const(list(bt.shape))])
    if kind == "aten.slice.Tensor":
        dim, start, end, step = (
            ctx.arg(3, default=0),
            ctx.arg(4),
            ctx.arg(5),
            ctx.arg(6, default=1),
        )
        start = 0 if start is None else int(start)
        end = INT64_MAX if end is None else int(end)
        value = ctx.t(1)
    elif kind == "aten.select.int":
        dim, index, step = ctx.arg(3), int(ctx.arg(4)), 1
        start, end = index, index + 1
        vt = ctx.in_type(1)
        shape = list(vt.shape)
        shape.insert(int(dim) % rank, 1)
        value = ctx.helper(
            "Unsqueeze", [ctx.t(1), ctx.ints([int(dim) % rank])], TensorType(vt.dtype, tuple(shape))
        )
    else:
        raise NotSupported("an in-place write into a view tracelog cannot express")
    dim = int(dim) % rank
    size = bt.shape[dim]
    if step != 1 or start < 0 or end < 0:
        raise NotSupported("an in-place write into a strided view or one counted from the end")
    base = _written_base(ctx)
    end = min(end, size) if isinstance(size, int) else end
    pieces = []
    if start > 0:
        head = list(bt.shape)
        head[dim] = start
        pieces.append(
            ctx.helper(
                "Slice",
                [base, ctx.ints([0]), ctx.ints([start]), ctx.ints([dim])],
                TensorType(bt.dtype, tuple(head)),
            )
        )
    pieces.append(value)
    if end != INT64_MAX and (not isinstance(size, int) or end < size):
        tail = list(bt.shape)
        tail[dim] = size - end if isinstance(size, int) else dim_sub(size, end)
        pieces.append(
            ctx.helper(
                "Slice",
                [base, ctx.ints([end]), ctx.ints([INT64_MAX]), ctx.ints([dim])],
                TensorType(bt.dtype, tuple(tail)),
            )
        )
    if len(pieces) == 1:
        return ctx.one("Identity", pieces)
    return ctx.one("Concat", pieces, axis=dim)


# the op families in modules of their own register into ATEN when imported
from tracelog.adapters.torch import (  # noqa: E402, F401
    rules_attention,
    rules_ctc,
    rules_embedding,
    rules_linalg,
    rules_math,
    rules_recurrent,
    rules_vision,
)
