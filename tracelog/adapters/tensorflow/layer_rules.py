"""TF-op rules for the rest of the Keras 3 layer set (issue 13): transposed
and 3-D convolutions, resizing, the element-wise activations TensorFlow has
kernels for, and the small integer and boolean ops Keras uses to build
shapes, repeats and attention masks. Each rule follows the TF op's
definition (tensorflow/core/ops/*.cc); rules.py imports this module, so the
TF_OPS table is complete once rules.py is loaded."""

from __future__ import annotations

import numpy as np

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tensorflow.rules import (
    TF_OPS,
    Names,
    _folded,
    _nhwc_attr,
    _nhwc_op,
    _perm,
    _same_pads,
    attr,
    attr_ints,
    const_array,
)
from tracelog.ir import TensorType, is_symbolic


# -- activations -----------------------------------------------------------------------
@TF_OPS.register("tf.LeakyRelu")
def _leaky_relu(ctx: Ctx) -> Names:
    # the kernel reads its float attribute as float32, in float64 too
    alpha = float(np.float32(attr(ctx, "alpha", 0.2)))  # type: ignore[arg-type]
    return ctx.one("LeakyRelu", [ctx.t(0)], alpha=alpha)


@TF_OPS.register("tf.Elu")
def _elu(ctx: Ctx) -> Names:
    # TF's Elu: x if x > 0 else exp(x) - 1, which is ONNX Celu with alpha 1
    return ctx.one("Celu", [ctx.t(0)], alpha=1.0)


@TF_OPS.register("tf.Selu")
def _selu(ctx: Ctx) -> Names:
    # scale * (x if x > 0 else alpha * (exp(x) - 1)), TF's constants (selu_op_functor.h)
    ty = ctx.out_type()
    x = ctx.t(0)
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    elu = ctx.helper("Celu", [x], ty, alpha=1.0)
    neg = ctx.helper("Mul", [elu, ctx.const(alpha, ty.dtype)], ty)
    pos = ctx.helper("Greater", [x, ctx.const(0.0, ty.dtype)], TensorType("bool", ty.shape))
    picked = ctx.helper("Where", [pos, x, neg], ty)
    return ctx.one("Mul", [picked, ctx.const(scale, ty.dtype)])


@TF_OPS.register("tf.Softsign")
def _softsign(ctx: Ctx) -> Names:
    ty = ctx.out_type()
    x = ctx.t(0)
    denom = ctx.helper(
        "Add", [ctx.helper("Abs", [x], ty), ctx.const(1.0, ty.dtype)], ty
    )  # x / (1 + |x|)
    return ctx.one("Div", [x, denom])


@TF_OPS.register("tf.Expm1")
def _expm1(ctx: Ctx) -> Names:
    # tracelog.Expm1: each target's own expm1 (ONNX's function: tanh(x / 2) *
    # (exp(x) + 1), no cancellation near 0)
    return ctx.one("Expm1", [ctx.t(0)], domain="tracelog")


# -- logic ----------------------------------------------------------------------------------
for _tf, _op in {"LogicalAnd": "And", "LogicalOr": "Or"}.items():

    def _logical(ctx: Ctx, op: str = _op) -> Names:
        fn = {"And": np.logical_and, "Or": np.logical_or}[op]
        return _folded(ctx, fn, 2) or ctx.one(op, [ctx.t(0), ctx.t(1)])

    TF_OPS.add(f"tf.{_tf}", _logical)


@TF_OPS.register("tf.LogicalNot")
def _logical_not(ctx: Ctx) -> Names:
    return _folded(ctx, np.logical_not, 1) or ctx.one("Not", [ctx.t(0)])


# -- building shapes and masks ----------------------------------------------------------------
@TF_OPS.register("tf.Range")
def _range(ctx: Ctx) -> Names:
    folded = _folded(ctx, lambda a, b, c: np.arange(a, b, c), 3)
    if folded is not None:
        return folded
    # a limit computed from static sizes (keras.ops.sparsemax's
    # range(1, shape[axis] + 1)): with start and delta known and the recorded
    # length not the batch's, the values are known: start, then delta added
    # once per step, in the output's dtype, as TensorFlow's kernel adds them
    start, delta, out = const_array(ctx, 0), const_array(ctx, 2), ctx.out_type()
    if start is None or delta is None or is_symbolic(out.shape[0]):
        raise NotSupported("Range with computed bounds")
    steps = np.full(int(out.shape[0]), delta, dtype=np.dtype(out.dtype))
    if steps.size:
        steps[0] = start
    return [ctx.const(np.cumsum(steps, dtype=np.dtype(out.dtype)), out.dtype)]


@TF_OPS.register("tf.Pack")
def _pack(ctx: Ctx) -> Names:
    """Stack N tensors along a new axis: Concat of each Unsqueezed there."""
    n = len(ctx.rec.args)
    axis = int(attr(ctx, "axis", 0))  # type: ignore[call-overload]
    folded = _folded(ctx, lambda *xs: np.stack(xs, axis=axis), n)
    if folded is not None:
        return folded
    rank = len(ctx.out_type().shape)
    ax = axis % rank
    parts = []
    for i in range(n):
        t = ctx.in_type(i)
        shape = list(t.shape)
        shape.insert(ax, 1)
        parts.append(
            ctx.helper("Unsqueeze", [ctx.t(i), ctx.ints([ax])], TensorType(t.dtype, tuple(shape)))
        )
    return ctx.one("Concat", parts, axis=ax)


@TF_OPS.register("tf.Unpack")
def _unpack(ctx: Ctx) -> Names:
    """tf.unstack (ConvLSTM's steps): num slices along `axis`, each without
    it: a Split into parts of one, each Squeezed there."""
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    ax = int(attr(ctx, "axis", 0)) % rank  # type: ignore[call-overload]
    n = len(ctx.rec.outs)
    if n == 0:
        return []
    part = list(xt.shape)
    part[ax] = 1
    parts = ctx.node(
        "Split",
        [ctx.t(0)],
        outs=[TensorType(xt.dtype, tuple(part))] * n,
        axis=ax,
        num_outputs=n,
    )
    return [
        ctx.helper("Squeeze", [p, ctx.ints([ax])], ctx.out_type(k)) for k, p in enumerate(parts)
    ]


@TF_OPS.register("tf.Fill")
def _fill(ctx: Ctx) -> Names:
    out = ctx.out_type()
    if any(is_symbolic(d) for d in out.shape) and const_array(ctx, 0) is not None:
        # constant dims the batch-dim replay found to lead with the batch size
        # (batch_dims._batch_fill): the shape computed from the data at run time
        return ctx.one("Expand", [ctx.t(1), ctx.dynamic_shape(list(out.shape))])
    folded = _folded(ctx, lambda dims, v: np.full([int(d) for d in dims], v), 2)
    if folded is not None:
        return folded
    if not any(is_symbolic(d) for d in out.shape):
        # dims computed from static sizes (tf.eye(tf.shape(x)[1], ...), as
        # keras.ops.trace builds its mask): the recorded shape, so that no
        # target computes a shape at run time (JAX's jit cannot)
        return ctx.one("Expand", [ctx.t(1), ctx.ints([int(d) for d in out.shape])])
    dims = ctx.t(0)
    if ctx.in_type(0).dtype != "int64":
        dims = ctx.helper("Cast", [dims], TensorType("int64", ctx.in_type(0).shape), to="int64")
    return ctx.one("Expand", [ctx.t(1), dims])


@TF_OPS.register("tf.Tile")
def _tile(ctx: Ctx) -> Names:
    reps = const_array(ctx, 1)
    if reps is None:
        raise NotSupported("Tile with computed multiples")
    return ctx.one("Tile", [ctx.t(0), ctx.ints([int(r) for r in reps.reshape(-1)])])


@TF_OPS.register("tf.MatrixBandPart")
def _band_part(ctx: Ctx) -> Names:
    """Keep input[..., i, j] where (lower < 0 or i - j <= lower) and (upper < 0
    or j - i <= upper), zero elsewhere: Trilu(upper=0, k=upper) keeps
    j - i <= upper, Trilu(upper=1, k=-lower) keeps i - j <= lower."""
    lower, upper = const_array(ctx, 1), const_array(ctx, 2)
    if lower is None or upper is None:
        raise NotSupported("MatrixBandPart with computed bands")
    lo, up = int(lower), int(upper)

    def band(x: np.ndarray, lo_: np.ndarray, up_: np.ndarray) -> np.ndarray:
        rows, cols = x.shape[-2:]
        i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
        keep = ((lo < 0) | (i - j <= lo)) & ((up < 0) | (j - i <= up))
        return np.where(keep, x, np.zeros_like(x))

    folded = _folded(ctx, band, 3)
    if folded is not None:
        return folded
    ty = ctx.out_type()
    x = ctx.t(0)
    if up >= 0:
        x = ctx.helper("Trilu", [x, ctx.ints([up])], ty, upper=0)
    if lo >= 0:
        x = ctx.helper("Trilu", [x, ctx.ints([-lo])], ty, upper=1)
    return ctx.one("Identity", [x])


# -- convolutions ------------------------------------------------------------------------------
@TF_OPS.register("tf.Conv2DBackpropInput", "tf.Conv3DBackpropInputV2")
def _conv_backprop_input(ctx: Ctx) -> Names:
    """The gradient of an N-d convolution with respect to its input, as Keras'
    ConvNDTranspose computes it: (input_sizes, filter, out_backprop) -> a
    tensor of input_sizes. That is ONNX ConvTranspose of out_backprop with
    the filter read as [out_backprop channels, result channels, *kernel], the
    forward convolution's pads, and output_padding for the rows a strided
    forward convolution would have dropped."""
    w, dy, out = ctx.in_type(1), ctx.in_type(2), ctx.out_type()
    n = len(w.shape) - 2  # filter: *kernel, result channels, out_backprop channels
    to_oi = [n + 1, n, *range(n)]
    w_t = ctx.helper("Transpose", [ctx.t(1)], _perm(w, to_oi), perm=to_oi)
    k = [int(x) for x in w.shape[:n]]
    s, d = _nhwc_attr(ctx, "strides"), _nhwc_attr(ctx, "dilations")
    sizes = [_static(ctx, x) for x in out.shape[1 : 1 + n]]
    mode = attr(ctx, "padding", b"VALID")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode == "SAME":
        pads = _same_pads(sizes, k, s, d, ctx.batch)
    elif mode == "VALID":
        pads = [0] * (2 * n)
    elif mode == "EXPLICIT":
        p = attr_ints(ctx, "explicit_paddings")
        pads = [p[2 + 2 * i] for i in range(n)] + [p[3 + 2 * i] for i in range(n)]
    else:
        raise NotSupported(f"padding {mode}")
    extra = []
    for i in range(n):
        made = (_static(ctx, dy.shape[1 + i]) - 1) * s[i] + (k[i] - 1) * d[i] + 1
        extra.append(sizes[i] - (made - pads[i] - pads[n + i]))
    if any(e < 0 or e >= max(s[i], d[i]) for i, e in enumerate(extra)):
        raise NotSupported(f"transposed convolution to sizes {sizes} from {dy.shape}")
    return _nhwc_op(
        ctx,
        "ConvTranspose",
        [ctx.t(2), w_t],
        x_type=dy,
        kernel_shape=k,
        strides=s,
        pads=pads,
        dilations=d,
        output_padding=extra,
        group=1,
    )


def _static(ctx: Ctx, size: int | str) -> int:
    """A spatial size; one marked `batch` only equals the batch size by chance."""
    if isinstance(size, int):
        return size
    if ctx.batch is None:
        raise NotSupported("a convolution over a symbolic spatial axis")
    return ctx.batch


# -- resizing -----------------------------------------------------------------------------------
@TF_OPS.register("tf.ResizeBilinear", "tf.ResizeNearestNeighbor")
def _resize(ctx: Ctx) -> Names:
    """images [N, H, W, C] resized to `size` over axes 1 and 2: ONNX Resize
    with sizes over those axes (no transposes: Resize takes its axes)."""
    size = const_array(ctx, 1)
    if size is None:
        raise NotSupported("resizing to a computed size")
    align = bool(attr(ctx, "align_corners", False))
    half = bool(attr(ctx, "half_pixel_centers", False))
    linear = ctx.rec.op == "tf.ResizeBilinear"
    if align and half:
        raise NotSupported("align_corners with half_pixel_centers")
    if align:
        coord = "align_corners"
    elif half:
        # TF's nearest with half-pixel centres rounds (x + 0.5) / scale down: ONNX
        # tf_half_pixel_for_nn; bilinear's half_pixel is ONNX half_pixel
        coord = "half_pixel" if linear else "tf_half_pixel_for_nn"
    else:
        coord = "asymmetric"
    extra: dict[str, object] = {}
    if not linear:
        extra["nearest_mode"] = "round_prefer_ceil" if align else "floor"
    return ctx.one(
        "Resize",
        [ctx.t(0), "", "", ctx.ints([int(v) for v in size.reshape(-1)])],
        mode="linear" if linear else "nearest",
        coordinate_transformation_mode=coord,
        axes=[1, 2],
        **extra,
    )


@TF_OPS.register("tf.Split")
def _split(ctx: Ctx) -> Names:
    """Split(axis, value) into num_split equal parts (glu's halves)."""
    axis = const_array(ctx, 0)
    if axis is None:
        raise NotSupported("Split along a computed axis")
    n = len(ctx.rec.outs)
    return ctx.node("Split", [ctx.t(1)], outs=n, axis=int(axis), num_outputs=n)


@TF_OPS.register("tf.LessEqual")
def _less_equal(ctx: Ctx) -> Names:
    return ctx.one("LessOrEqual", [ctx.t(0), ctx.t(1)])
