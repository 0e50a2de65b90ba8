"""Aten rules for vision ops (issue 12): group norm, transposed convolution and
upsampling, written as ONNX GroupNormalization, ConvTranspose and Resize.

Registered into ``ATEN`` on import (the last line of ``rules.py`` imports this
module). Where torch's meaning and ONNX's differ, the mapping is written next
to the rule, and a form ONNX cannot say exactly becomes plain ops or NotSupported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tracelog.adapters.builder import Converter, Ctx, NotSupported
from tracelog.adapters.torch.rules import ATEN, INT64_MAX, Names, _pair
from tracelog.ir import BATCH, Dim, TensorType, dim_mul, format_dim, is_symbolic, parse_dim


# -- group norm ------------------------------------------------------------------------
@ATEN.register("aten.native_group_norm.default")
def _group_norm(ctx: Ctx) -> Names:
    # native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd)
    xt = ctx.in_type(0)
    channels, dt = xt.shape[1], xt.dtype
    groups, eps = int(ctx.arg(6, "group")), float(ctx.arg(7, "eps"))

    def affine(i: int, fill: float) -> str:
        if ctx.arg(i) is not None:
            return ctx.t(i)
        if not isinstance(channels, int):
            raise NotSupported("group norm without affine parameters over a symbolic channel dim")
        return ctx.const([fill] * channels, dt)  # ONNX takes scale and bias always

    # stash_type: the precision of the statistics. ONNX's default is float32, which is
    # what torch uses for float32 and narrower inputs; float64 inputs keep float64.
    stash = {"stash_type": 11} if dt == "float64" else {}
    y = ctx.one(
        "GroupNormalization",
        [ctx.t(0), affine(1, 1.0), affine(2, 0.0)],
        epsilon=eps,
        num_groups=groups,
        **stash,
    )
    return [y[0], None, None]


# -- transposed convolution -------------------------------------------------------------
def conv_transpose(ctx: Ctx) -> Names:
    """aten.convolution with transposed=True. torch's output size,
    (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1,
    is ONNX ConvTranspose's with pads [p, p] and output_padding added at the
    end; the weight layout (C_in, C_out / groups, k...) is ONNX's."""
    x, w, b = ctx.t(0), ctx.t(1), ctx.opt(2)
    kernel = ctx.in_type(1).shape[2:]
    if not all(isinstance(k, int) for k in kernel):
        raise NotSupported("transposed convolution with a symbolic kernel size")
    spatial = len(kernel)
    stride, padding, dilation = ctx.arg(3), ctx.arg(4), ctx.arg(5)
    output_padding, groups = ctx.arg(7), ctx.arg(8)
    begin, strides = _pair(padding, spatial), _pair(stride, spatial)
    end, extra = list(begin), _pair(output_padding, spatial)
    for i, (s, op) in enumerate(zip(strides, extra, strict=True)):
        # torch allows output_padding < max(stride, dilation), onnxruntime only < stride:
        # a larger one is the same output with that much less padding at the end
        if op >= s:
            if op > end[i]:
                raise NotSupported("output_padding beyond both the stride and the padding")
            end[i], extra[i] = end[i] - op, 0
    return ctx.one(
        "ConvTranspose",
        [x, w] + ([b] if b else []),
        kernel_shape=[int(k) for k in kernel],
        strides=strides,
        pads=begin + end,
        dilations=_pair(dilation, spatial),
        output_padding=extra,
        group=int(groups),
    )


# -- upsampling ---------------------------------------------------------------------------
_SCALE_NAMES = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}


def _upsample_args(ctx: Ctx, n: int, aligned: bool, vec: bool) -> tuple[bool, list[float] | None]:
    """(align_corners, per-axis scale factors or None). torch uses a scale
    factor only when every axis has one above zero; else it uses in / out."""
    align = bool(ctx.arg(2, "align_corners")) if aligned else False
    k = 3 if aligned else 2
    if vec:
        factors = ctx.arg(k, "scale_factors")
        scales = list(factors) if factors else [None] * n
    else:
        scales = [ctx.arg(k + j, name) for j, name in enumerate(_SCALE_NAMES[n])]
    given = [float(s) for s in scales if s is not None and s > 0]
    if len(given) == n:
        return align, given
    if given:
        raise NotSupported("upsampling with scale factors for some axes only")
    return align, None


def _exact_ratio(r: float) -> bool:
    """A whole ratio, or a power of two: x / r has one floor in any float
    arithmetic, so ONNX's nearest index leaves no rounding to a runtime."""
    return (r >= 1 and r == int(r)) or math.frexp(r)[0] == 0.5


def torch_nearest_index(
    n_in: int, n_out: int, scale: float | None, exact: bool, dtype: str
) -> np.ndarray:
    """The source index of each output position, as torch's CPU kernels compute
    it ('nearest': floor(d * s); 'nearest-exact': floor((d + 0.5) * s), at most
    n_in - 1; s = 1 / scale_factor, else n_in / n_out). The product is formed
    in the input's opmath type (float32 below float64) and rounded to float32
    before the floor (floorf)."""
    ft = np.float64 if dtype == "float64" else np.float32
    s = ft(1.0 / scale) if scale is not None else ft(n_in) / ft(n_out)
    d = np.arange(n_out).astype(ft) + ft(0.5 if exact else 0.0)
    src = np.floor((d * s).astype(np.float32))
    return np.minimum(src.astype(np.int64), n_in - 1)


def onnx_nearest_index(n_in: int, n_out: int, scale: float, exact: bool) -> np.ndarray:
    """ONNX Resize nearest, as the targets compute it: asymmetric + floor
    ('nearest'), or half_pixel + round_prefer_ceil ('nearest-exact'), from the
    axis's scale (the scales input, else n_out / n_in)."""
    d = np.arange(n_out, dtype=np.float64)
    src = np.floor((d + 0.5) / scale - 0.5 + 0.5) if exact else np.floor(d / scale)
    return np.clip(src.astype(np.int64), 0, n_in - 1)


def _own_size(ctx: Ctx, scales: Sequence[float] | None) -> bool:
    """Upsampling to the input's own size (the same dims, symbols included) at
    scale 1: every mode and coordinate mapping samples each element at itself
    (BEiT's bias table interpolated to the window it was made for). A scale
    other than 1 that floors to the same size samples elsewhere."""
    return ctx.in_type(0).shape == ctx.out_type().shape and (
        scales is None or all(float(s) == 1.0 for s in scales)
    )


def _resize_node(
    ctx: Ctx,
    axes: list[int],
    scales: Sequence[float] | None,
    sizes: Sequence[int] | None,
    **attrs: object,
) -> Names:
    if scales is not None:
        ins = [ctx.t(0), "", ctx.const([float(s) for s in scales], "float32")]
    else:
        assert sizes is not None
        ins = [ctx.t(0), "", "", ctx.ints([int(s) for s in sizes])]
    return ctx.one("Resize", ins, axes=axes, **attrs)


def _nearest(ctx: Ctx, n: int, exact: bool, vec: bool) -> Names:
    """torch 'nearest' is ONNX nearest with asymmetric coordinates and floor;
    'nearest-exact' is half_pixel with round_prefer_ceil. The index tables
    agree wherever the ratio leaves no rounding (a whole ratio, a power of
    two) and torch's float32 product rounds the same way, which is checked
    here; elsewhere the recorded index table becomes a Gather per axis, which
    is what torch computes, exactly."""
    _, scales = _upsample_args(ctx, n, aligned=False, vec=vec)
    if _own_size(ctx, scales):
        return [ctx.t(0)]
    xt, out = ctx.in_type(0), ctx.out_type()
    axes = list(range(2, 2 + n))
    ins, outs = list(xt.shape[2:]), list(out.shape[2:])
    attrs: dict[str, object] = (
        {"coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil"}
        if exact
        else {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    )
    static = all(isinstance(d, int) for d in ins + outs)
    if not static:
        # a symbolic axis: only ratios with no rounding at any size
        if scales is not None and all(math.frexp(s)[0] == 0.5 for s in scales):
            return _resize_node(ctx, axes, scales, None, mode="nearest", **attrs)
        raise NotSupported("nearest upsampling of a symbolic-size axis by a ratio not a power of 2")
    sizes = [int(d) for d in outs]
    tables = [
        torch_nearest_index(int(i), o, None if scales is None else scales[k], exact, xt.dtype)
        for k, (i, o) in enumerate(zip(ins, sizes, strict=True))
    ]

    def agrees(ratios: list[float]) -> bool:
        return all(
            _exact_ratio(r) and np.array_equal(onnx_nearest_index(int(i), o, r, exact), t)
            for r, i, o, t in zip(ratios, ins, sizes, tables, strict=True)
        )

    if scales is not None:
        f32 = [float(np.float32(s)) for s in scales]
        if all(math.floor(int(i) * s) == o for i, s, o in zip(ins, f32, sizes, strict=True)):
            if agrees(f32):
                return _resize_node(ctx, axes, f32, None, mode="nearest", **attrs)
    if agrees([o / int(i) for i, o in zip(ins, sizes, strict=True)]):
        return _resize_node(ctx, axes, None, sizes, mode="nearest", **attrs)
    return _gather_axes(ctx, axes, tables)


def _gather_axes(ctx: Ctx, axes: list[int], tables: list[np.ndarray]) -> Names:
    """x indexed along each axis by a constant table: a Gather per axis whose
    table is not the identity."""
    x, xt = ctx.t(0), ctx.in_type(0)
    shape = list(xt.shape)
    todo = [
        (a, t)
        for a, t in zip(axes, tables, strict=True)
        if not np.array_equal(t, np.arange(shape[a]))
    ]
    if not todo:
        return [x]
    for k, (a, t) in enumerate(todo):
        shape[a] = len(t)
        if k == len(todo) - 1:
            return ctx.one("Gather", [x, ctx.const(t, "int64")], axis=a)
        x = ctx.helper(
            "Gather", [x, ctx.const(t, "int64")], TensorType(xt.dtype, tuple(shape)), axis=a
        )
    raise AssertionError("unreachable")


def _interpolating(ctx: Ctx, n: int, mode: str, vec: bool) -> Names:
    """torch 'linear' / 'bilinear' / 'trilinear' / 'bicubic'. align_corners=True
    is ONNX's align_corners transform with the output sizes (torch ignores a
    scale factor there). align_corners=False is half_pixel (torch clamps a
    negative source coordinate to 0 for linear, which ONNX's edge padding does
    too; cubic is clamped by neither), with the scale factor when torch had
    one: torch then maps coordinates by 1 / scale_factor, not in / out, and
    ONNX's scales input means the same. Cubic is Keys' kernel with a = -0.75,
    out-of-range taps reading the edge (exclude_outside=0), as torch's."""
    align, scales = _upsample_args(ctx, n, aligned=True, vec=vec)
    if _own_size(ctx, scales):
        return [ctx.t(0)]
    xt, out = ctx.in_type(0), ctx.out_type()
    axes = list(range(2, 2 + n))
    ins, outs = list(xt.shape[2:]), list(out.shape[2:])
    attrs: dict[str, object] = {"mode": mode}
    if mode == "cubic":
        attrs["cubic_coeff_a"] = -0.75
    if not align and scales is not None:
        f32 = [float(np.float32(s)) for s in scales]
        for i, s, o in zip(ins, f32, outs, strict=True):
            # ONNX's output size is floor(in * scale), for the float32 scale it holds
            if isinstance(i, int) and isinstance(o, int) and math.floor(i * s) != o:
                raise NotSupported(f"upsampling {i} by {s} to {o}: not floor(in * float32 scale)")
        return _resize_node(
            ctx, axes, f32, None, coordinate_transformation_mode="half_pixel", **attrs
        )
    if not all(isinstance(o, int) for o in outs):
        raise NotSupported("upsampling to a symbolic size")
    coord = "align_corners" if align else "half_pixel"
    return _resize_node(
        ctx, axes, None, [int(o) for o in outs], coordinate_transformation_mode=coord, **attrs
    )


def _register_upsampling() -> None:
    for n in (1, 2, 3):
        for exact, name in (
            (False, f"upsample_nearest{n}d"),
            (True, f"_upsample_nearest_exact{n}d"),
        ):
            for vec in (False, True):

                def nearest(ctx: Ctx, n: int = n, exact: bool = exact, vec: bool = vec) -> Names:
                    return _nearest(ctx, n, exact, vec)

                ATEN.add(f"aten.{name}.{'vec' if vec else 'default'}", nearest)
    for n, name, mode in (
        (1, "upsample_linear1d", "linear"),
        (2, "upsample_bilinear2d", "linear"),
        (3, "upsample_trilinear3d", "linear"),
        (2, "upsample_bicubic2d", "cubic"),
    ):
        for vec in (False, True):

            def interpolating(ctx: Ctx, n: int = n, mode: str = mode, vec: bool = vec) -> Names:
                return _interpolating(ctx, n, mode, vec)

            ATEN.add(f"aten.{name}.{'vec' if vec else 'default'}", interpolating)


_register_upsampling()


def _antialiased(ctx: Ctx) -> Names:
    """torch's antialiased bilinear and bicubic resizing (PIL's filters: a
    triangle or Keys' a = -0.5 kernel stretched by the downscale factor,
    weights normalised per output). It is separable and linear in the
    input, so it is two products with constant matrices: each axis's
    weights, read from torch's own kernel in float64 on one-hot rows (rows
    of all ones along the other axis, whose weights sum to 1), kept in
    float64 and cast to the input's dtype (the float64 check reads them
    exact). The matrices are checked against the kernel on a random input."""
    import torch

    xt, out = ctx.in_type(0), ctx.out_type()
    sizes = (*xt.shape[-2:], *out.shape[-2:])
    if not all(isinstance(d, int) for d in sizes):
        raise NotSupported("antialiased resizing over a symbolic spatial size")
    h, w, ho, wo = (int(d) for d in sizes)
    _, name, overload = ctx.rec.op.split(".")
    kernel = getattr(getattr(torch.ops.aten, name), overload)
    rest = [ctx.arg(i) for i in range(1, len(ctx.rec.args))]

    def run(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return kernel(x, *rest).numpy()

    one_row = torch.zeros(h, 1, h, w, dtype=torch.float64)
    one_row[torch.arange(h), 0, torch.arange(h), :] = 1.0
    one_col = torch.zeros(w, 1, h, w, dtype=torch.float64)
    one_col[torch.arange(w), 0, :, torch.arange(w)] = 1.0
    wh = run(one_row)[:, 0, :, 0].T  # [ho, h]
    ww = run(one_col)[:, 0, 0, :]  # [w, wo]
    probe = torch.randn(2, 3, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if not np.allclose(wh @ probe.numpy() @ ww, run(probe), rtol=1e-12, atol=1e-12):
        raise NotSupported("an antialiased resize that is not two weight matrices")
    lead = tuple(xt.shape[:-2])
    dt = xt.dtype

    def weights(m: np.ndarray) -> str:
        if dt == "float64":
            return ctx.const(m, dt)
        wide = ctx.const(m, "float64")
        return ctx.helper("Cast", [wide], TensorType(dt, m.shape), to=dt)

    # 2-D products only, each axis moved last and the rest flattened: TensorFlow
    # 2.21's oneDNN batch matmul frees memory twice in the gradient of a
    # broadcast product whose batch dims hold a 1 ([n, 1, h, w] @ [w, wo])
    rows: Dim = 1
    for d in lead:
        rows = dim_mul(rows, d)
    wide = ctx.helper(
        "Reshape", [ctx.t(0), ctx.ints([-1, w])], TensorType(dt, (dim_mul(rows, h), w))
    )
    across = ctx.helper("MatMul", [wide, weights(ww)], TensorType(dt, (dim_mul(rows, h), wo)))
    across = ctx.helper(
        "Reshape", [across, ctx.shape_const((*lead, h, wo))], TensorType(dt, (*lead, h, wo))
    )
    rank = len(xt.shape)
    swap = [*range(rank - 2), rank - 1, rank - 2]
    turned = ctx.helper("Transpose", [across], TensorType(dt, (*lead, wo, h)), perm=swap)
    flat = ctx.helper(
        "Reshape", [turned, ctx.ints([-1, h])], TensorType(dt, (dim_mul(rows, wo), h))
    )
    down = ctx.helper(
        "MatMul", [flat, weights(wh.T.copy())], TensorType(dt, (dim_mul(rows, wo), ho))
    )
    down = ctx.helper(
        "Reshape", [down, ctx.shape_const((*lead, wo, ho))], TensorType(dt, (*lead, wo, ho))
    )
    return ctx.one("Transpose", [down], perm=swap)


for _name in ("_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
    for _overload in ("default", "vec"):
        ATEN.add(f"aten.{_name}.{_overload}", _antialiased)


# -- pooling: 3-D forms and adaptive pooling to sizes that do not divide ---------------------
@ATEN.register("aten.max_pool3d_with_indices.default")
def _max_pool3d(ctx: Ctx) -> Names:
    kernel = _pair(ctx.arg(1, "kernel_size"), 3)
    stride = ctx.arg(2, "stride", ())
    pads = _pair(ctx.arg(3, "padding", 0), 3)
    y = ctx.one(
        "MaxPool",
        [ctx.t(0)],
        kernel_shape=kernel,
        strides=_pair(stride, 3) if stride else kernel,
        pads=pads + pads,
        dilations=_pair(ctx.arg(4, "dilation", 1), 3),
        ceil_mode=int(bool(ctx.arg(5, "ceil_mode", False))),
    )
    return [y[0], None]


@ATEN.register("aten.avg_pool3d.default")
def _avg_pool3d(ctx: Ctx) -> Names:
    kernel = _pair(ctx.arg(1, "kernel_size"), 3)
    stride = ctx.arg(2, "stride", ())
    pads = _pair(ctx.arg(3, "padding", 0), 3)
    if ctx.arg(6, "divisor_override") is not None:
        raise NotSupported("avg_pool3d with divisor_override")
    return ctx.one(
        "AveragePool",
        [ctx.t(0)],
        kernel_shape=kernel,
        strides=_pair(stride, 3) if stride else kernel,
        pads=pads + pads,
        ceil_mode=int(bool(ctx.arg(4, "ceil_mode", False))),
        count_include_pad=int(bool(ctx.arg(5, "count_include_pad", True))),
    )


def _adaptive_windows(n_in: int, n_out: int) -> list[tuple[int, int]]:
    """torch's adaptive pooling windows: [floor(i * in / out), ceil((i + 1) * in / out))."""
    return [(i * n_in // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def adaptive_pool(ctx: Ctx, kind: str) -> Names:
    """Adaptive average or max pooling over the trailing spatial axes. Windows
    of one size (in divisible by out) are a pool with kernel = stride = in /
    out. Otherwise each axis pools separately, which is exact for both a
    window's mean and its max: averaging is an Einsum with a constant matrix
    of 1 / window length per axis; max is a ReduceMax per window, concatenated."""
    xt = ctx.in_type(0)
    n = len(xt.shape) - 2
    outs = _pair(ctx.arg(1, "output_size"), n)
    ins = list(xt.shape[2:])
    if not all(isinstance(i, int) for i in ins) or any(o is None for o in outs):
        raise NotSupported(f"adaptive pooling of a symbolic size to {outs}")
    ins_int = [int(i) for i in ins]
    if kind == "avg" and outs == [1] * n:
        return ctx.one("GlobalAveragePool", [ctx.t(0)])
    if all(i % o == 0 for i, o in zip(ins_int, outs, strict=True)):
        kernel = [i // o for i, o in zip(ins_int, outs, strict=True)]
        op = "AveragePool" if kind == "avg" else "MaxPool"
        return ctx.one(op, [ctx.t(0)], kernel_shape=kernel, strides=kernel)
    if kind == "avg":
        return _adaptive_avg_einsum(ctx, ins_int, outs)
    return _adaptive_max_slices(ctx, ins_int, outs)


def _adaptive_avg_einsum(ctx: Ctx, ins: list[int], outs: list[int]) -> Names:
    """Window sums by an Einsum with 0/1 matrices, divided by each window's
    element count: exact integers in any float dtype, where a matrix of
    1 / length would carry float32's rounding of 1/3 into a float64 run."""
    dt = ctx.in_type(0).dtype
    letters_in, letters_out = "dhw"[3 - len(ins) :], "pqr"[3 - len(ins) :]
    operands, terms, result = [], [], ""
    counts = np.ones([1] * len(ins))
    for axis, (i, o, a, b) in enumerate(zip(ins, outs, letters_in, letters_out, strict=True)):
        if i == o:  # every window one element: nothing to average
            result += a
            counts = np.repeat(counts, i, axis=axis)
            continue
        windows = _adaptive_windows(i, o)
        ones = np.zeros((o, i))
        for k, (start, end) in enumerate(windows):
            ones[k, start:end] = 1.0
        operands.append(ctx.const(ones, dt))
        terms.append(b + a)
        result += b
        shape = [1] * len(ins)
        shape[axis] = o
        counts = counts * np.array([end - start for start, end in windows]).reshape(shape)
    equation = ",".join([*terms, "nc" + letters_in]) + "->nc" + result
    xt = ctx.in_type(0)
    sums = ctx.helper(
        "Einsum",
        [*operands, ctx.t(0)],
        TensorType(dt, (*xt.shape[:2], *counts.shape)),
        equation=equation,
    )
    return ctx.one("Div", [sums, ctx.const(counts, dt)])


def _adaptive_max_slices(ctx: Ctx, ins: list[int], outs: list[int]) -> Names:
    xt = ctx.in_type(0)
    x, shape = ctx.t(0), list(xt.shape)
    axes = [2 + k for k, (i, o) in enumerate(zip(ins, outs, strict=True)) if i != o]
    for step, axis in enumerate(axes):
        n_in, n_out = ins[axis - 2], outs[axis - 2]
        window_shape = list(shape)
        parts = []
        for start, end in _adaptive_windows(n_in, n_out):
            window_shape[axis] = end - start
            window = ctx.helper(
                "Slice",
                [x, ctx.ints([start]), ctx.ints([end]), ctx.ints([axis])],
                TensorType(xt.dtype, tuple(window_shape)),
            )
            window_shape[axis] = 1
            parts.append(
                ctx.helper(
                    "ReduceMax",
                    [window, ctx.ints([axis])],
                    TensorType(xt.dtype, tuple(window_shape)),
                    keepdims=1,
                )
            )
        shape[axis] = n_out
        if step == len(axes) - 1:
            y = ctx.one("Concat", parts, axis=axis)
            return [y[0], None]
        x = ctx.helper("Concat", parts, TensorType(xt.dtype, tuple(shape)), axis=axis)
    raise AssertionError("unreachable: an identity adaptive pool divides")


ATEN.add("aten._adaptive_avg_pool3d.default", lambda ctx: adaptive_pool(ctx, "avg"))
ATEN.add("aten.adaptive_max_pool2d.default", lambda ctx: adaptive_pool(ctx, "max"))
ATEN.add("aten.adaptive_max_pool3d.default", lambda ctx: adaptive_pool(ctx, "max"))


# -- pixel and channel shuffles: a reshape, a transpose, a reshape (as aten's kernels) -----
def _regroup(ctx: Ctx, split: list[int | str], perm: list[int]) -> Names:
    """The input viewed as `split`, its axes put in `perm`'s order, and viewed
    as the record's output shape."""
    xt, out = ctx.in_type(0), ctx.out_type()
    split_t = TensorType(xt.dtype, tuple(split))
    grouped = ctx.helper("Reshape", [ctx.t(0), ctx.shape_const(split)], split_t)
    moved_t = TensorType(xt.dtype, tuple(split[p] for p in perm))
    moved = ctx.helper("Transpose", [grouped], moved_t, perm=perm)
    return ctx.one("Reshape", [moved, ctx.shape_const(list(out.shape))])


@ATEN.register("aten.pixel_shuffle.default")
def _pixel_shuffle(ctx: Ctx) -> Names:
    # [*, C r^2, H, W] -> [*, C, r, r, H, W] -> [*, C, H, r, W, r] -> [*, C, H r, W r]
    r = int(ctx.arg(1, "upscale_factor"))
    *lead, depth, h, w = ctx.in_type(0).shape
    if is_symbolic(depth):
        raise NotSupported("pixel_shuffle of a symbolic number of channels")
    n = len(lead)
    split = [*lead, int(depth) // (r * r), r, r, h, w]
    return _regroup(ctx, split, [*range(n), n, n + 3, n + 1, n + 4, n + 2])


@ATEN.register("aten.pixel_unshuffle.default")
def _pixel_unshuffle(ctx: Ctx) -> Names:
    # [*, C, H r, W r] -> [*, C, H, r, W, r] -> [*, C, r, r, H, W] -> [*, C r^2, H, W]
    r = int(ctx.arg(1, "downscale_factor"))
    *lead, c, h, w = ctx.in_type(0).shape
    if is_symbolic(h) or is_symbolic(w):
        raise NotSupported("pixel_unshuffle of a symbolic height or width")
    n = len(lead)
    split = [*lead, c, int(h) // r, r, int(w) // r, r]
    return _regroup(ctx, split, [*range(n), n, n + 2, n + 4, n + 1, n + 3])


@ATEN.register("aten.channel_shuffle.default", "aten.native_channel_shuffle.default")
def _channel_shuffle(ctx: Ctx) -> Names:
    # [N, C, *rest] -> [N, g, C / g, *rest] -> [N, C / g, g, *rest] -> [N, C, *rest]
    g = int(ctx.arg(1, "groups"))
    b, c, *rest = ctx.in_type(0).shape
    if is_symbolic(c):
        raise NotSupported("channel_shuffle of a symbolic number of channels")
    split = [b, g, int(c) // g, *rest]
    return _regroup(ctx, split, [0, 2, 1, *range(3, len(split))])


# -- reflection and replication padding: one Gather per padded dim ----------------------------
def _pad_indices(n: int, before: int, after: int, mode: str) -> list[int]:
    """The source index of each position of a dim of size n padded by
    (before, after): mirrored about the edge element (reflect) or the edge
    element repeated (replicate), as aten's reflection_pad and replication_pad."""
    if mode == "reflect":
        if before >= n or after >= n:
            raise NotSupported(f"reflection padding of {max(before, after)} on a dim of size {n}")
        return [*range(before, 0, -1), *range(n), *range(n - 2, n - 2 - after, -1)]
    return [0] * before + list(range(n)) + [n - 1] * after


def _pad_by_gather(mode: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        xt = ctx.in_type(0)
        pads = [int(p) for p in ctx.arg(1, "padding")]
        rank = len(xt.shape)
        if any(p < 0 for p in pads):
            raise NotSupported(f"a negative {mode} padding")
        shape = list(xt.shape)
        x = ctx.t(0)
        padded = [
            (rank - 1 - j, pads[2 * j], pads[2 * j + 1])
            for j in range(len(pads) // 2)
            if pads[2 * j] or pads[2 * j + 1]
        ]
        if not padded:
            return ctx.one("Identity", [x])
        index_of = []
        for axis, before, after in padded:
            if is_symbolic(shape[axis]):
                raise NotSupported(f"{mode} padding of a symbolic-size dim")
            index_of.append(_pad_indices(int(shape[axis]), before, after, mode))
        for (axis, _before, _after), index in zip(padded[:-1], index_of, strict=False):
            shape[axis] = len(index)
            x = ctx.helper(
                "Gather", [x, ctx.ints(index)], TensorType(xt.dtype, tuple(shape)), axis=axis
            )
        return ctx.one("Gather", [x, ctx.ints(index_of[-1])], axis=padded[-1][0])

    return rule


for _rank in (1, 2, 3):
    ATEN.add(f"aten.reflection_pad{_rank}d.default", _pad_by_gather("reflect"))
    ATEN.add(f"aten.replication_pad{_rank}d.default", _pad_by_gather("replicate"))


# -- im2col (nn.Unfold) ---------------------------------------------------------------------
def _plus(d: int | str, k: int) -> int | str:
    """A dim plus a constant (a sequence-long axis padded or cut)."""
    poly = parse_dim(d)
    return format_dim({**poly, (): poly.get((), 0) + k})


@ATEN.register("aten.im2col.default")
def _im2col(ctx: Ctx) -> Names:
    """im2col(x, kernel_size, dilation, padding, stride): x [N?, C, H, W] to
    [N?, C * kh * kw, L], row c * kh * kw + i * kw + j holding tap (i, j) of
    channel c at each of the L output positions. Each tap is a strided Slice
    of the zero-padded input; the taps stack on a new axis after the channels,
    so one Reshape gives torch's row order. Slices copy, so it is exact in
    any dtype (a convolution with one-hot weights could take a rounding
    algorithm such as Winograd)."""
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    kernel, dilation = _pair(ctx.arg(1, "kernel_size"), 2), _pair(ctx.arg(2, "dilation"), 2)
    padding, stride = _pair(ctx.arg(3, "padding"), 2), _pair(ctx.arg(4, "stride"), 2)
    spatial = list(xt.shape[-2:])
    padded = [_plus(n, 2 * p) for n, p in zip(spatial, padding, strict=True)]
    outs: list[int | str] = []
    for n, k, d, s in zip(padded, kernel, dilation, stride, strict=True):
        if isinstance(n, int):
            outs.append((n - d * (k - 1) - 1) // s + 1)
        elif s != 1 or BATCH in str(n):
            # (n - span) // s + 1 taps: no polynomial in the sequence's length
            raise NotSupported(f"im2col with stride {s} over a symbolic size {n}")
        else:
            outs.append(_plus(n, -d * (k - 1)))
    x = ctx.t(0)
    if any(padding):
        pads = [0] * (rank - 2) + padding
        shape = (*xt.shape[:-2], *padded)
        x = ctx.helper("Pad", [x, ctx.ints(pads + pads)], TensorType(xt.dtype, shape))
    axes = [rank - 2, rank - 1]
    tap = TensorType(xt.dtype, (*xt.shape[:-2], 1, *outs))
    taps = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            starts = [i * dilation[0], j * dilation[1]]
            ends = []
            for b, o, s, k, d, t in zip(
                starts, outs, stride, kernel, dilation, (i, j), strict=True
            ):
                if isinstance(o, int):
                    ends.append(b + (o - 1) * s + 1)
                else:  # stride 1: the last tap's span past this one's start, from the end
                    ends.append(-d * (k - 1 - t) or INT64_MAX)
            window = ctx.helper(
                "Slice",
                [x, ctx.ints(starts), ctx.ints(ends), ctx.ints(axes), ctx.ints(stride)],
                TensorType(xt.dtype, (*xt.shape[:-2], *outs)),
            )
            taps.append(ctx.helper("Unsqueeze", [window, ctx.ints([rank - 2])], tap))
    stacked_shape = (*xt.shape[:-2], kernel[0] * kernel[1], *outs)
    stacked = (
        ctx.helper("Concat", taps, TensorType(xt.dtype, stacked_shape), axis=rank - 2)
        if len(taps) > 1
        else taps[0]
    )
    return ctx.one("Reshape", [stacked, ctx.shape_const(list(ctx.out_type().shape))])


# -- spatial transformers: affine_grid and grid_sample (4-D) -----------------------------------
# Written as plain IR after aten's decompositions (torch/_decomp: affine_grid_generator,
# grid_sampler_2d), not as ONNX GridSample: onnx.reference's GridSample computes in
# float32 whatever the input (5e-7 off torch in float64, onnx 1.23), so the float64
# translation check could not pass on it, and the other targets would each need a
# helper and its gradient to the grid. As plain ops (Floor, Round, Where, GatherElements
# of the points around each sample) every target's own autodiff gives aten's backward:
# the points' indices are constants (Floor and Round have zero derivative, as in aten's
# backward), the gradient to the grid flows through the weights, a point outside the
# image carries weight 0 and so no gradient, as aten skips it; the arithmetic is aten's.
def _linspace_from_neg_one(n: int, align_corners: bool) -> np.ndarray:
    """aten's base grid axis (linspace_from_neg_one), in float64."""
    import torch

    if n <= 1:
        return np.zeros(1)
    steps = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
    return (steps if align_corners else steps * (n - 1) / n).numpy()


@ATEN.register("aten.affine_grid_generator.default")
def _affine_grid(ctx: Ctx) -> Names:
    """affine_grid_generator(theta [N, 2, 3], size [N, C, H, W], align_corners):
    [N, H, W, 2], the base grid of (x, y, 1) per output pixel times theta^T, one
    batched matmul as aten's kernel (bmm). The base grid is a constant of H * W
    rows that does not depend on the batch."""
    tt = ctx.in_type(0)
    size = [int(s) for s in ctx.arg(1, "size")]
    if len(size) != 4:
        raise NotSupported("affine_grid over a volume (5-D)")
    h, w = size[2:]
    align = bool(ctx.arg(2, "align_corners"))
    ys, xs = np.meshgrid(
        _linspace_from_neg_one(h, align), _linspace_from_neg_one(w, align), indexing="ij"
    )
    base = np.stack([xs.ravel(), ys.ravel(), np.ones(h * w)], axis=1)  # [H * W, 3]
    n = tt.shape[0]
    theta_t = ctx.helper("Transpose", [ctx.t(0)], TensorType(tt.dtype, (n, 3, 2)), perm=[0, 2, 1])
    flat = ctx.helper(
        "MatMul", [ctx.const(base, tt.dtype), theta_t], TensorType(tt.dtype, (n, h * w, 2))
    )
    return ctx.one("Reshape", [flat, ctx.shape_const(list(ctx.out_type().shape))])


_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}


class _GridSampler:
    """The IR of one grid_sampler_2d record: x [N, C, H, W] sampled at grid
    [N, Ho, Wo, 2] (x, y in [-1, 1]), as aten's decomposition computes it.
    The points a mode reads around each sample (1, 2 x 2 or 4 x 4) are
    gathered at once, on axes [N, C, ky, kx, Ho, Wo], and weighted there."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        xt, gt = ctx.in_type(0), ctx.in_type(1)
        self.dt = xt.dtype
        self.n, c, h, w = xt.shape
        _, ho, wo, _ = gt.shape
        fixed = [c, h, w, ho, wo]
        if any(is_symbolic(d) for d in fixed):
            raise NotSupported("grid_sample over a symbolic channel or spatial size")
        self.c, self.h, self.w, self.ho, self.wo = (int(d) for d in fixed)
        self.padding = int(ctx.arg(3, "padding_mode"))
        self.align = bool(ctx.arg(4, "align_corners"))
        self.coord_t = TensorType(self.dt, (self.n, self.ho, self.wo))

    def num(self, v: float) -> str:
        return self.ctx.const(v, self.dt)

    def op(self, op: str, *inputs: str, ty: TensorType | None = None, **attrs: object) -> str:
        return self.ctx.helper(op, list(inputs), ty or self.coord_t, **attrs)

    def type_of(self, name: str) -> TensorType:
        return self.ctx.b.values[name].type

    def typed(self, dims: tuple[int | str, ...], dtype: str | None = None) -> TensorType:
        """[N, *dims, Ho, Wo]."""
        return TensorType(dtype or self.dt, (self.n, *dims, self.ho, self.wo))

    def axis(self, k: int) -> str:
        """grid[..., k]: x (k = 0) or y (k = 1)."""
        return self.op("Gather", self.ctx.t(1), self.ctx.const(k, "int64"), axis=3)

    def unnormalize(self, coord: str, size: int) -> str:
        """From [-1, 1] to pixel units (aten's grid_sampler_unnormalize)."""
        mul = size * 0.5 - 0.5 if self.align else size * 0.5
        return self.op("Add", self.op("Mul", coord, self.num(mul)), self.num(size * 0.5 - 0.5))

    def bounded(self, u: str, size: int) -> str:
        """aten's compute_coordinates: as is (zeros), clipped (border), or
        reflected and clipped (reflection)."""
        if self.padding == 0:
            return u
        if self.padding == 2:
            u = (
                self.reflect(u, 0, 2 * (size - 1))
                if self.align
                else self.reflect(u, -1, 2 * size - 1)
            )
        return self.op("Clip", u, self.num(0.0), self.num(size - 1.0))

    def source_index(self, coord: str, size: int) -> str:
        """aten's grid_sampler_compute_source_index."""
        return self.bounded(self.unnormalize(coord, size), size)

    def reflect(self, u: str, twice_low: int, twice_high: int) -> str:
        """u reflected about low and high until inside them (aten's
        reflect_coordinates); the derivative's sign flips with each reflection."""
        if twice_low == twice_high:
            return self.op("Mul", u, self.num(0.0))
        low, span = twice_low / 2, (twice_high - twice_low) / 2
        dist = self.op("Abs", self.op("Sub", u, self.num(low)))
        extra = self.op("Mod", dist, self.num(span), fmod=1)
        flips = self.op("Floor", self.op("Div", dist, self.num(span)))
        odd = self.op(  # flips is a whole number >= 0: its fmod by 2 is exact
            "Equal",
            self.op("Mod", flips, self.num(2.0), fmod=1),
            self.num(1.0),
            ty=self.typed((), "bool"),
        )
        return self.op(
            "Where",
            odd,
            self.op("Sub", self.num(span + low), extra),
            self.op("Add", extra, self.num(low)),
        )

    def stacked(self, parts: list[str], along_x: bool) -> str:
        """[N, Ho, Wo] tensors stacked as [N, 1, k, Ho, Wo] (along x) or
        [N, k, 1, Ho, Wo] (along y)."""
        one = self.typed((1, 1))
        units = [self.op("Unsqueeze", p, self.ctx.ints([1, 2]), ty=one) for p in parts]
        if len(units) == 1:
            return units[0]
        k = len(units)
        return self.op(
            "Concat", *units, ty=self.typed((1, k) if along_x else (k, 1)), axis=2 if along_x else 1
        )

    def points(self, xs: list[str], ys: list[str]) -> tuple[str, str]:
        """(x[n, :, ys[i], xs[j]] as [N, C, ky, kx, Ho, Wo] where inside the
        image, else x[n, :, 0, 0]; the inside mask, [N, ky, kx, Ho, Wo]) at
        whole-number coordinates, by one GatherElements over x as [N, C, H * W]."""
        ky, kx = len(ys), len(xs)
        x, y = self.stacked(xs, True), self.stacked(ys, False)

        def within(v: str, size: int, dims: tuple[int, int]) -> str:
            mask_t = self.typed(dims, "bool")
            low = self.op("GreaterOrEqual", v, self.num(0.0), ty=mask_t)
            high = self.op("Less", v, self.num(float(size)), ty=mask_t)
            return self.op("And", low, high, ty=mask_t)

        inside = self.op(
            "And",
            within(x, self.w, (1, kx)),
            within(y, self.h, (ky, 1)),
            ty=self.typed((ky, kx), "bool"),
        )
        # the flat index y * W + x: whole numbers below float32's 2^24 (checked)
        linear = self.op(
            "Add", self.op("Mul", y, self.num(float(self.w))), x, ty=self.typed((ky, kx))
        )
        linear = self.op("Where", inside, linear, self.num(0.0), ty=self.typed((ky, kx)))
        index = self.op("Cast", linear, ty=self.typed((ky, kx), "int64"), to="int64")
        count = ky * kx * self.ho * self.wo
        row_t = TensorType("int64", (self.n, 1, count))
        index = self.op("Reshape", index, self.ctx.shape_const([self.n, 1, count]), ty=row_t)
        # Expand broadcasts both ways: [1, C, 1] leaves the batch as it is
        wide_t = TensorType("int64", (self.n, self.c, count))
        index = self.op("Expand", index, self.ctx.ints([1, self.c, 1]), ty=wide_t)
        hw = self.h * self.w
        flat = self.op(
            "Reshape",
            self.ctx.t(0),
            self.ctx.shape_const([self.n, self.c, hw]),
            ty=TensorType(self.dt, (self.n, self.c, hw)),
        )
        picked = self.op(
            "GatherElements", flat, index, ty=TensorType(self.dt, (self.n, self.c, count)), axis=2
        )
        shape = [self.n, self.c, ky, kx, self.ho, self.wo]
        values = self.op(
            "Reshape",
            picked,
            self.ctx.shape_const(shape),
            ty=TensorType(self.dt, tuple(shape)),
        )
        return values, inside

    def channels(self, t: str) -> str:
        """[N, ky, kx, Ho, Wo] as [N, 1, ky, kx, Ho, Wo], for every channel."""
        ty = self.type_of(t)
        wide = TensorType(ty.dtype, (self.n, 1, *ty.shape[1:]))
        return self.op("Unsqueeze", t, self.ctx.ints([1]), ty=wide)

    def cubic(self, t: str) -> list[str]:
        """aten's get_cubic_upsample_coefficients(t), A = -0.75, each in
        its order of operations."""
        a = -0.75
        mul, add, sub = "Mul", "Add", "Sub"

        def near(x: str) -> str:  # cubic_convolution1: ((A + 2) x - (A + 3)) x x + 1
            inner = self.op(sub, self.op(mul, x, self.num(a + 2)), self.num(a + 3))
            return self.op(add, self.op(mul, self.op(mul, inner, x), x), self.num(1.0))

        def far(x: str) -> str:  # cubic_convolution2: ((A x - 5 A) x + 8 A) x - 4 A
            inner = self.op(sub, self.op(mul, x, self.num(a)), self.num(5 * a))
            inner = self.op(add, self.op(mul, inner, x), self.num(8 * a))
            return self.op(sub, self.op(mul, inner, x), self.num(4 * a))

        one = self.num(1.0)
        rest = self.op(sub, one, t)
        return [far(self.op(add, t, one)), near(t), near(rest), far(self.op(add, rest, one))]


@ATEN.register("aten.grid_sampler_2d.default")
def _grid_sampler_2d(ctx: Ctx) -> Names:
    """grid_sampler_2d(x, grid, mode, padding_mode, align_corners): bilinear
    (the 2 x 2 points around, weighted), nearest (Round: half to even, as
    aten's nearbyint) or bicubic (the 4 x 4 points around, each bounded by the
    padding, weighted by aten's cubic coefficients of the fractions: rows
    along x, then along y); padding zeros, border or reflection. The sums
    over the points are a ReduceSum, where aten adds them one by one: the
    same sum up to float rounding."""
    mode = int(ctx.arg(2, "interpolation_mode"))
    if mode not in _GRID_MODES:
        raise NotSupported(f"grid_sample's interpolation mode {mode}")
    s = _GridSampler(ctx)
    if s.h * s.w >= 1 << 24:
        raise NotSupported("grid_sample of an image of 2^24 pixels or more")
    gx, gy = s.axis(0), s.axis(1)
    if mode == 1:
        ix, iy = s.source_index(gx, s.w), s.source_index(gy, s.h)
        values, inside = s.points([s.op("Round", ix)], [s.op("Round", iy)])
        kept = s.op("Where", s.channels(inside), values, s.num(0.0), ty=s.type_of(values))
        return ctx.one("Reshape", [kept, ctx.shape_const(list(ctx.out_type().shape))])
    reduced = ctx.ints([2, 3])
    if mode == 0:
        ix, iy = s.source_index(gx, s.w), s.source_index(gy, s.h)
        x0, y0 = s.op("Floor", ix), s.op("Floor", iy)
        x1, y1 = s.op("Add", x0, s.num(1.0)), s.op("Add", y0, s.num(1.0))
        values, inside = s.points([x0, x1], [y0, y1])
        # aten's weights: (x1 - ix or ix - x0) * (y1 - iy or iy - y0), 0 outside
        wx = s.stacked([s.op("Sub", x1, ix), s.op("Sub", ix, x0)], True)
        wy = s.stacked([s.op("Sub", y1, iy), s.op("Sub", iy, y0)], False)
        weights = s.op("Mul", wx, wy, ty=s.typed((2, 2)))
        weights = s.op("Where", inside, weights, s.num(0.0), ty=s.typed((2, 2)))
        terms = s.op("Mul", values, s.channels(weights), ty=s.type_of(values))
        return ctx.one("ReduceSum", [terms, reduced], keepdims=0)
    ix, iy = s.unnormalize(gx, s.w), s.unnormalize(gy, s.h)
    x0, y0 = s.op("Floor", ix), s.op("Floor", iy)
    # the points bounded one by one (whole numbers stay whole: the gradient to the
    # grid flows through the fractions alone, as in aten's backward)
    xs = [s.bounded(s.op("Add", x0, s.num(k - 1.0)), s.w) for k in range(4)]
    ys = [s.bounded(s.op("Add", y0, s.num(k - 1.0)), s.h) for k in range(4)]
    values, inside = s.points(xs, ys)
    values = s.op("Where", s.channels(inside), values, s.num(0.0), ty=s.type_of(values))
    cx = s.channels(s.stacked(s.cubic(s.op("Sub", ix, x0)), True))  # [N, 1, 1, 4, Ho, Wo]
    cy = s.channels(s.stacked(s.cubic(s.op("Sub", iy, y0)), False))  # [N, 1, 4, 1, Ho, Wo]
    rows_t = TensorType(s.dt, (s.n, s.c, 4, 1, s.ho, s.wo))
    rows = s.op(
        "ReduceSum",
        s.op("Mul", values, cx, ty=s.type_of(values)),
        ctx.ints([3]),
        ty=rows_t,
        keepdims=1,
    )
    return ctx.one("ReduceSum", [s.op("Mul", rows, cy, ty=rows_t), reduced], keepdims=0)


# -- col2im (nn.Fold) ---------------------------------------------------------------------------
@ATEN.register("aten.col2im.default")
def _col2im(ctx: Ctx) -> Names:
    """col2im(x, output_size, kernel_size, dilation, padding, stride): x [N?,
    C * kh * kw, L] to [N?, C, H, W], the adjoint of im2col: each tap's [L]
    row, laid out on the block grid, is added into the zero-padded image at
    the tap's offset, and the padding cut off. Each tap is placed by Pad
    (spread by the stride first: Pad on unit axes and a Reshape), and the
    taps are added in aten's order (kernel row, then column) starting from the
    first, so each pixel is the same float sum as aten's CPU kernel; the
    gradient, by autodiff of Gather, Pad, Reshape and Add, is im2col's."""
    xt = ctx.in_type(0)
    *lead, rows, length = xt.shape
    out = [int(o) for o in _pair(ctx.arg(1, "output_size"), 2)]
    kernel, dilation = _pair(ctx.arg(2, "kernel_size"), 2), _pair(ctx.arg(3, "dilation"), 2)
    padding, stride = _pair(ctx.arg(4, "padding"), 2), _pair(ctx.arg(5, "stride"), 2)
    if is_symbolic(rows) or is_symbolic(length):
        raise NotSupported("col2im of a symbolic number of rows or blocks")
    taps = kernel[0] * kernel[1]
    channels = int(rows) // taps
    padded = [o + 2 * p for o, p in zip(out, padding, strict=True)]
    blocks = [
        (n - d * (k - 1) - 1) // s + 1
        for n, k, d, s in zip(padded, kernel, dilation, stride, strict=True)
    ]
    dt, r = xt.dtype, len(lead)  # r: the channel axis
    grid = [*lead, channels, taps, *blocks]
    x = ctx.helper("Reshape", [ctx.t(0), ctx.shape_const(grid)], TensorType(dt, tuple(grid)))
    spans = [(b - 1) * s + 1 for b, s in zip(blocks, stride, strict=True)]
    total = None
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            tap = ctx.helper(
                "Gather",
                [x, ctx.const(i * kernel[1] + j, "int64")],
                TensorType(dt, (*lead, channels, *blocks)),
                axis=r + 1,
            )
            if stride != [1, 1]:
                tap = _spread(ctx, tap, [*lead, channels], blocks, stride, dt)
            before = [i * dilation[0], j * dilation[1]]
            after = [n - b - s for n, b, s in zip(padded, before, spans, strict=True)]
            zeros = [0] * (r + 1)
            placed = ctx.helper(
                "Pad",
                [tap, ctx.ints(zeros + before + zeros + after)],
                TensorType(dt, (*lead, channels, *padded)),
            )
            if total is None:
                total = placed
            else:
                total = ctx.helper(
                    "Add", [total, placed], TensorType(dt, (*lead, channels, *padded))
                )
    assert total is not None  # a kernel has at least one tap
    if not any(padding):
        return ctx.one("Identity", [total])
    ends = [p + o for p, o in zip(padding, out, strict=True)]
    return ctx.one("Slice", [total, ctx.ints(padding), ctx.ints(ends), ctx.ints([r + 1, r + 2])])


def _spread(
    ctx: Ctx, tap: str, lead: list[int | str], blocks: list[int], stride: list[int], dt: str
) -> str:
    """[*lead, bh, bw] to [*lead, (bh - 1) * sh + 1, (bw - 1) * sw + 1]: each
    element at its multiple of the stride, zeros between."""
    r = len(lead)
    (bh, bw), (sh, sw) = blocks, stride
    unit = ctx.helper(
        "Unsqueeze", [tap, ctx.ints([r + 1, r + 3])], TensorType(dt, (*lead, bh, 1, bw, 1))
    )
    zeros = [0] * (r + 4)
    after = [0] * r + [0, sh - 1, 0, sw - 1]
    wide = ctx.helper(
        "Pad", [unit, ctx.ints(zeros + after)], TensorType(dt, (*lead, bh, sh, bw, sw))
    )
    flat = [*lead, bh * sh, bw * sw]
    spread = ctx.helper("Reshape", [wide, ctx.shape_const(flat)], TensorType(dt, tuple(flat)))
    ends = [(bh - 1) * sh + 1, (bw - 1) * sw + 1]
    return ctx.helper(
        "Slice",
        [spread, ctx.ints([0, 0]), ctx.ints(ends), ctx.ints([r, r + 1])],
        TensorType(dt, (*lead, *ends)),
    )


# -- max unpooling ---------------------------------------------------------------------
@ATEN.register("aten.max_unpool2d.default")
def _max_unpool2d(ctx: Ctx) -> Names:
    # max_unpool2d(x, indices, output_size): per (sample, channel) plane, zeros of
    # output_size with x written at its flat indices (torch's _max_unpoolnd: an
    # index put into new_zeros; its gradient gathers at the indices). F.max_unpool1d
    # runs it on [..., 1, L] and squeezes.
    xt, out = ctx.in_type(0), ctx.out_type()
    lead = list(xt.shape[:-2])
    h, w = xt.shape[-2:]
    oh, ow = (int(s) for s in ctx.arg(2, "output_size"))
    if not isinstance(h, int) or not isinstance(w, int):
        raise NotSupported("max_unpool2d of a symbolic spatial size")
    axis = len(lead)
    flat_x = TensorType(xt.dtype, (*lead, h * w))
    x = ctx.helper("Reshape", [ctx.t(0), ctx.shape_const([*lead, h * w])], flat_x)
    idx = ctx.helper(
        "Reshape",
        [ctx.t(1), ctx.shape_const([*lead, h * w])],
        TensorType("int64", (*lead, h * w)),
    )
    plane = TensorType(xt.dtype, (*lead, oh * ow))
    if any(map(is_symbolic, lead)):
        shape = ctx.dynamic_shape([*lead, oh * ow])
        zeros = ctx.helper("ConstantOfShape", [shape], plane, value=0.0)
    else:
        dims = [int(d) for d in lead] + [oh * ow]
        zeros = ctx.const(np.zeros(dims, dtype=np.dtype(xt.dtype)), xt.dtype)
    # overlapping windows repeat an index (with its one value): torch's gradient
    # gathers at every index, JAX's scatter gives it to one update of each place.
    # The value scattered unchanged, the gradient through a scatter-add (gather
    # everywhere) that adds exactly zero: A(x) - StopGradient(A(x)).
    frozen = ctx.helper("StopGradient", [x], flat_x, domain="tracelog")
    y = ctx.helper("ScatterElements", [zeros, idx, frozen], plane, axis=axis)
    added = ctx.helper("ScatterElements", [zeros, idx, x], plane, axis=axis, reduction="add")
    fixed = ctx.helper("StopGradient", [added], plane, domain="tracelog")
    y = ctx.helper("Add", [y, ctx.helper("Sub", [added, fixed], plane)], plane)
    return ctx.one("Reshape", [y, ctx.shape_const(list(out.shape))])
