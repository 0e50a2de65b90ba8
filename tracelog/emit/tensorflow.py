"""The TensorFlow target: how TensorFlow 2 (eager) spells each IR op.

Templates use the fields of the shared op table (`tracelog.emit.rules`);
functions are kept for what a template cannot say. Graphs recorded NCHW run
NHWC inside (the layout pass): TensorFlow's CPU convolution and pooling
kernels take channels last. Where a node still holds NCHW data, the rules
transpose in and out around the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tracelog.emit.program import Target
from tracelog.emit.rules import (
    PYTHON_BASE,
    Each,
    RuleCtx,
    Spellings,
    not_yet_everywhere,
    pool_ceil_extra,
    scaled_gemm,
)
from tracelog.ir import Dim
from tracelog.passes.layout import to_channels_last

TF = Spellings("tensorflow", base=PYTHON_BASE)
TARGET = Target(
    "tensorflow",
    TF,
    "tracelog.emit.runtime.tensorflow_program",
    "tf.constant({value}, tf.{dtype})",
    (to_channels_last,),
    layout_note=(
        "Layout: NHWC inside (TensorFlow's CPU convolution and pooling kernels take\n"
        "channels last); the recording was NCHW. Transposes kept, per function:\n"
        "{layout}"
    ),
)

NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]

TF.spell(
    {
        "Relu": "tf.nn.relu({0})",
        "Tanh": "tf.math.tanh({0})",
        "Sigmoid": "tf.math.sigmoid({0})",
        "Sqrt": "tf.math.sqrt({0})",
        "Exp": "tf.math.exp({0})",
        "Log": "tf.math.log({0})",
        "Abs": "tf.math.abs({0})",
        "Neg": "tf.math.negative({0})",
        "Reciprocal": "tf.math.reciprocal({0})",
        "Erf": "tf.math.erf({0})",
        "Softplus": "tf.math.softplus({0})",
        "Floor": "tf.math.floor({0})",
        "Ceil": "tf.math.ceil({0})",
        "Identity": "tf.identity({0})",
        "Not": "tf.math.logical_not({0})",
        "Div/int": "tf.truncatediv({0}, {1})",
        "Equal": "tf.math.equal({0}, {1})",
        "Less": "tf.math.less({0}, {1})",
        "Greater": "tf.math.greater({0}, {1})",
        "And": "tf.math.logical_and({0}, {1})",
        "Or": "tf.math.logical_or({0}, {1})",
        "Celu": "tf.nn.elu({0} / {alpha}) * {alpha}",
        # tf.nn.leaky_relu's alpha is a float32 attribute: _leaky_relu keeps the slope exact
        "LeakyRelu": "_leaky_relu({0}, {alpha})",
        # fused kernels (issue 15): _gelu (tf.nn.gelu's constants are float32), tf.nn.softmax /
        # log_softmax; the normalisations are helpers over tf.nn.moments (TF has no fused layer
        # norm; Keras' batch-norm update through tf.nn.batch_normalization)
        "Gelu": "_gelu({0}, {tanh})",
        "Cast": "tf.cast({0}, tf.{to})",
        "Softmax": "tf.nn.softmax({0}, axis={axis})",
        "LogSoftmax": "tf.nn.log_softmax({0}, axis={axis})",
        "MatMul": "tf.linalg.matmul({0}, {1})",
        "Einsum": "tf.einsum({equation}, {operands})",
        "tracelog.StopGradient": "tf.stop_gradient({0})",
        "tracelog.SiLU": "tf.nn.silu({0})",
        "tracelog.Log1p": "tf.math.log1p({0})",
        "tracelog.Expm1": "tf.math.expm1({0})",
        "BatchNormalization": "_batch_norm_eval({0}, {1}, {2}, {3}, {4}, {eps}, {channel_axis})",
        "tracelog.BatchNormTraining": (
            "_batch_norm_train({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {axes}, {channel_axis})"
        ),
        # Keras' update (tracelog.ops BatchNormTraining: decay, unbiased)
        "tracelog.BatchNormTraining/weighted": (
            "_batch_norm_train_weighted({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {decay}, "
            "{unbiased}, {axes}, {channel_axis})"
        ),
        "LayerNormalization": "_layer_norm({0}, {1}, {bias}, {axes}, {eps})",
        "Dropout": "_dropout({0}, {1}, rng, {key})",
        "RandomUniformLike": "_uniform({0}, {low}, {high}, rng, {key})",
        "RandomNormalLike": "_normal({0}, {mean}, {scale}, rng, {key})",
        "tracelog.RandomExponentialLike": "_exponential({0}, rng, {key})",
        "ReduceMean/all": "tf.math.reduce_mean({0}, keepdims={keep})",
        "ReduceSum/all": "tf.math.reduce_sum({0}, keepdims={keep})",
        "ReduceMax": "tf.math.reduce_max({0}, axis={axes}, keepdims={keep})",
        "ReduceMax/all": "tf.math.reduce_max({0}, keepdims={keep})",
        "ReduceMin": "tf.math.reduce_min({0}, axis={axes}, keepdims={keep})",
        "ReduceMin/all": "tf.math.reduce_min({0}, keepdims={keep})",
        "ReduceProd": "tf.math.reduce_prod({0}, axis={axes}, keepdims={keep})",
        "ReduceProd/all": "tf.math.reduce_prod({0}, keepdims={keep})",
        "Transpose": "tf.transpose({0}, {perm})",
        "Concat": "tf.concat([{parts}], axis={axis})",
        "Slice": "{0}[{index}]",
        "Gather": "tf.gather({0}, {index}, axis={axis})",
        "NegativeLogLikelihoodLoss": "_nll_loss({0}, {1}, {weight}, {reduction}, {ignore})",
        "Shape/whole": "tf.shape({0}, out_type=tf.int64)",
        "Shape": "tf.shape({0}, out_type=tf.int64){range}",
        "ConstantOfShape": "tf.fill({0}, tf.constant({value}, tf.{dtype}))",
        "ArgMax": "tf.expand_dims(tf.math.argmax({0}, axis={axis}, output_type=tf.int64), {axis})",
        "ArgMax/drop": "tf.math.argmax({0}, axis={axis}, output_type=tf.int64)",
        "Reshape": "tf.reshape({0}, {ints})",
        "Reshape/operand": "tf.reshape({0}, {1})",
        "Reshape/unit_dims": "{0}[{index}]",
        "Split": "tf.split({0}, {sizes}, axis={axis})",
        "Split/even": "tf.split({0}, {n}, axis={axis})",
        "Unsqueeze": Each("axes", "tf.expand_dims({0}, {it})"),
        "Squeeze": "tf.squeeze({0}, axis={axes})",
        "Squeeze/all": "tf.squeeze({0})",
        "Pad": "tf.pad({0}, {pairs})",
        "Pad/valued": "tf.pad({0}, {pairs}, constant_values={2})",
        "Tile": "tf.tile({0}, {ints})",
        "Tile/operand": "tf.tile({0}, {1})",
    }
)
not_yet_everywhere(TF)


# -- sums along the innermost axis ----------------------------------------------------------
# TensorFlow's CPU Sum over leading axes adds each column in one running float32
# sum (4 to 12 times further from the exact sum than PyTorch's at 4096 rows and
# more); over the innermost axis it is as accurate as PyTorch's. So where a sum
# would run over an axis that some kept axis follows, the program calls the
# runtime's forms that move the summed axes last: _reduce_sum / _reduce_mean
# for its own sums, and _broadcast / _bias_add for an operand broadcast along
# such axes, whose gradient is that sum (a bias's gradient, summed over rows).
def column_sum(shape: Sequence[Dim], summed: Iterable[int]) -> bool:
    """Whether a sum of `shape` over the axes `summed` runs over an axis that
    an axis it keeps (of size other than 1) follows."""
    rank = len(shape)
    moved = {a % rank for a in summed if shape[a % rank] != 1}
    return bool(moved) and any(
        i > min(moved) for i in range(rank) if i not in moved and shape[i] != 1
    )


def broadcast_sums(c: RuleCtx, k: int) -> bool:
    """Whether input k is a float the gradients pass through, broadcast to the
    node's output along axes a column sum would undo."""
    if not c.gets_gradient(k):
        return False
    out, shape = c.out_type().shape, c.in_type(k).shape
    pad = len(out) - len(shape)
    wide = (1,) * pad + tuple(shape)
    return column_sum(out, [i for i in range(len(out)) if wide[i] == 1 and out[i] != 1])


def _elementwise(template: str, operands: range | None = None, fold: bool = False) -> Callable:
    """An element-wise op's template, each operand that broadcast_sums
    broadcast first by _broadcast (against the node's other inputs)."""

    def rule(c: RuleCtx) -> str:
        names = c.inputs()
        xs = list(names)
        for k in operands if operands is not None else range(len(names)):
            if broadcast_sums(c, k):
                others = ", ".join(n for j, n in enumerate(names) if j != k)
                xs[k] = f"_broadcast({names[k]}, {others})"
        if not fold:
            return template.format(*xs, **c.f)
        expr = xs[0]
        for x in xs[1:]:
            expr = template.format(expr, x, **c.f)
        return expr

    return rule


for _op in ("Add", "Sub", "Mul", "Div"):
    TF.add(_op, _elementwise(str(PYTHON_BASE[_op])))
TF.add("Pow", _elementwise("{0} ** {1}"))
TF.add("Max", _elementwise("tf.math.maximum({0}, {1})", fold=True))
TF.add("Min", _elementwise("tf.math.minimum({0}, {1})", fold=True))
TF.add("Where", _elementwise("tf.where({0}, {1}, {2})", range(1, 3)))


def bias_added(c: RuleCtx, y: str, k: int, bias: str) -> str:
    """y + input k (a Gemm's C, written `bias`), by _bias_add where broadcast_sums."""
    return f"_bias_add({y}, {bias})" if broadcast_sums(c, k) else f"{y} + {bias}"


def _conv_bias(c: RuleCtx, y: str) -> str:
    """y (channels last) + the Conv's bias, by _bias_add where it gets a gradient."""
    return f"_bias_add({y}, {c.i(2)})" if c.gets_gradient(2) else f"{y} + {c.i(2)}"


def _expand(shape: str) -> Callable:
    def rule(c: RuleCtx) -> str:
        fn = "_broadcast_to" if broadcast_sums(c, 0) else "tf.broadcast_to"
        x = c.i(0)
        whole = f"tf.broadcast_dynamic_shape(tf.shape({x}, out_type=tf.int64), {shape})"
        return f"{fn}({x}, {whole.format(*c.inputs(), **c.f)})"

    return rule


# ONNX Expand broadcasts both ways; tf.broadcast_to only widens.
TF.add("Expand", _expand("tf.constant({ints}, tf.int64)"))
TF.add("Expand/operand", _expand("tf.constant({1}, tf.int64)"))


def _reduction(fn: str, innermost: str, axes: str = "axes", keep: str = "{keep}") -> Callable:
    def rule(c: RuleCtx) -> str:
        if column_sum(c.in_type(0).shape, c.f[axes]):
            return f"{innermost}({c.i(0)}, {c.f[axes]}, {keep.format(**c.f)})"
        return f"{fn}({c.i(0)}, axis={c.f[axes]}, keepdims={keep.format(**c.f)})"

    return rule


TF.add("ReduceSum", _reduction("tf.math.reduce_sum", "_reduce_sum"))
TF.add("ReduceMean", _reduction("tf.math.reduce_mean", "_reduce_mean"))
TF.add("GlobalAveragePool", _reduction("tf.math.reduce_mean", "_reduce_mean", keep="True"))


def _to_nhwc(c: RuleCtx, x: str) -> str:
    return x if c.f["channels_last"] else f"tf.transpose({x}, {NCHW_TO_NHWC})"


def _from_nhwc(c: RuleCtx, y: str) -> str:
    return y if c.f["channels_last"] else f"tf.transpose({y}, {NHWC_TO_NCHW})"


def _nhwc_pads(p: list[int]) -> str:
    return f"[[0, 0], [{p[0]}, {p[2]}], [{p[1]}, {p[3]}], [0, 0]]"


@TF.register("Clip")
def _clip(c: RuleCtx) -> str:
    x = c.i(0)
    if c.has(1):
        x = f"tf.math.maximum({x}, {c.i(1)})"
    if c.has(2):
        x = f"tf.math.minimum({x}, {c.i(2)})"
    return x


@TF.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    flags = ["transpose_a=True"] * c.f["transA"] + ["transpose_b=True"] * c.f["transB"]
    return scaled_gemm(c, f"tf.linalg.matmul({', '.join([c.i(0), c.i(1), *flags])})", bias_added)


@TF.register("Conv")
def _conv(c: RuleCtx) -> str:
    if c.rank() != 4:
        x, f = _channels_last(c, c.i(0)), c.f
        y = f"_conv_nd({x}, {c.i(1)}, {f['strides']}, {f['pads']}, {f['dilations']}, {f['group']})"
        return _channels_first(c, _conv_bias(c, y) if c.has(2) else y)
    strides, dil, group = c.f["strides"], c.f["dilations"], c.f["group"]
    x = _to_nhwc(c, c.i(0))
    padding = _nhwc_pads(c.f["pads"])
    cin = c.in_type(0).shape[3 if c.f["channels_last"] else 1]
    wshape = c.in_type(1).shape
    if group == 1:
        w = f"tf.transpose({c.i(1)}, [2, 3, 1, 0])"  # OIHW -> HWIO
        if dil != [1, 1]:
            # TF's CPU kernels have no gradient for dilation > 1: dilate the kernel
            # with zeros instead (the same sums, and differentiable).
            w = f"_dilate_kernel({w}, {dil})"
            dil = [1, 1]
        y = f"tf.nn.conv2d({x}, {w}, strides={strides}, padding={padding}, dilations={dil})"
    elif group == cin and dil == [1, 1]:
        # depthwise: OIHW with I=1, O=cin*m -> HW(cin)(m)
        mult = int(wshape[0]) // group
        w = f"tf.reshape(tf.transpose({c.i(1)}, [2, 3, 1, 0]), [{wshape[2]}, {wshape[3]}, {cin}, {mult}])"
        y = (
            f"tf.nn.depthwise_conv2d({x}, {w}, strides=[1, {strides[0]}, {strides[1]}, 1], "
            f"padding={padding})"
        )
    else:
        if dil != [1, 1]:
            raise NotImplementedError("dilated grouped Conv")
        y = f"_grouped_conv2d({x}, {c.i(1)}, {group}, {strides}, {padding})"
    if c.has(2):
        y = _conv_bias(c, y)  # NHWC: the bias broadcasts along the last axis
    return _from_nhwc(c, y)


def _channels_last(c: RuleCtx, x: str) -> str:
    """x channels-last: as it is (the layout pass ran the op so), else transposed."""
    rank = c.rank()
    return x if c.f["channels_last"] else f"tf.transpose({x}, {[0, *range(2, rank), 1]})"


def _channels_first(c: RuleCtx, y: str) -> str:
    rank = c.rank()
    return y if c.f["channels_last"] else f"tf.transpose({y}, {[0, rank - 1, *range(1, rank - 1)]})"


def _channels_last_pads(p: list[int]) -> str:
    """ONNX pads [b1, b2, e1, e2] as tf.pad's pairs of channels-last data."""
    n = len(p) // 2
    return "[[0, 0], " + "".join(f"[{p[i]}, {p[i + n]}], " for i in range(n)) + "[0, 0]]"


def _ceil_pads(c: RuleCtx) -> tuple[list[int], list[int]]:
    """The node's pads with ceil_mode's overhang added past each end, and the
    overhang alone (as pads)."""
    n, pads = c.rank() - 2, c.f["pads"]
    extra = pool_ceil_extra(c)
    return pads[:n] + [e + x for e, x in zip(pads[n:], extra, strict=True)], [0] * n + extra


@TF.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    n = c.rank() - 2
    if c.f["dilations"] != [1] * n:
        raise NotImplementedError("dilated MaxPool")
    k, s = c.f["kernel"], c.f["strides"]
    p, _ = _ceil_pads(c)
    x = _channels_last(c, c.i(0))
    if any(p):
        x = f"tf.pad({x}, {_channels_last_pads(p)}, constant_values=-np.inf)"
    return _channels_first(c, f"tf.nn.max_pool{n}d({x}, ksize={k}, strides={s}, padding='VALID')")


@TF.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    n = c.rank() - 2
    k, s = c.f["kernel"], c.f["strides"]
    p, overhang = _ceil_pads(c)
    x = _channels_last(c, c.i(0))
    window = f"ksize={k}, strides={s}, padding='VALID'"
    if not any(p):
        return _channels_first(c, f"tf.nn.avg_pool{n}d({x}, {window})")
    pad = _channels_last_pads(p)
    y = f"tf.nn.avg_pool{n}d(tf.pad({x}, {pad}), {window})"
    if not c.f["include_pad"] or any(overhang):
        # window sums over the count of real elements (and of the padding, with
        # count_include_pad), never of ceil_mode's overhang
        ones = f"tf.ones_like({x}[:1, {':, ' * n}:1])"
        if c.f["include_pad"]:
            ones = f"tf.pad({ones}, {_channels_last_pads(c.f['pads'])}, constant_values=1)"
            pad = _channels_last_pads(overhang)
        ones = f"tf.pad({ones}, {pad})"
        y = f"{y} / tf.nn.avg_pool{n}d({ones}, {window})"
    return _channels_first(c, y)


# -- vision: group norm, transposed convolution, resize (issue 12) --
TF.spell(
    {
        "GroupNormalization": "_group_norm({0}, {1}, {2}, {groups}, {eps}, {channel_axis})",
        "ConvTranspose": (
            "_conv_transpose({0}, {1}, {bias}, {strides}, {pads}, {dilations}, "
            "{output_padding}, {group}, {channels_last})"
        ),
        # the layout pass moves Resize's axes with the data (NHWC: axes [1, 2])
        "Resize": "_resize({0}, {axes}, {scales}, {sizes}, {mode}, {coord}, {nearest}, {cubic_a})",
    }
)


# -- attention, masks and indexing (issue 12) ---------------------------------------------
TF.spell(
    {
        "Sin": "tf.math.sin({0})",
        "Cos": "tf.math.cos({0})",
        "LessOrEqual": "tf.math.less_equal({0}, {1})",
        "GreaterOrEqual": "tf.math.greater_equal({0}, {1})",
        "Xor": "tf.math.logical_xor({0}, {1})",
        "BitwiseAnd": "tf.bitwise.bitwise_and({0}, {1})",
        "BitwiseOr": "tf.bitwise.bitwise_or({0}, {1})",
        "BitwiseXor": "tf.bitwise.bitwise_xor({0}, {1})",
        "BitwiseNot": "tf.bitwise.invert({0})",
        "Mod": "tf.math.floormod({0}, {1})",  # the divisor's sign, as ONNX Mod (fmod=0)
        "CumSum": "tf.math.cumsum({0}, axis={axis})",
        "GatherElements": "tf.experimental.numpy.take_along_axis({0}, {1}, axis={axis})",
        "Compress": "tf.boolean_mask({0}, {1}, axis={axis})",
        "NonZero": "tf.transpose(tf.where(tf.cast({0}, tf.bool)))",
        "TopK": "_topk({0}, {k}, {axis}, {largest})",
    }
)


@TF.register("Trilu")
def _trilu(c: RuleCtx) -> str:
    # tf.linalg.band_part takes no diagonal offset: keep where col - row is on the kept side of k
    x = c.i(0)
    side = ">=" if c.f["upper"] else "<="
    offset = f"tf.range(tf.shape({x})[-1])[None, :] - tf.range(tf.shape({x})[-2])[:, None]"
    return f"tf.where({offset} {side} {c.f['k']}, {x}, tf.zeros_like({x}))"


_TF_SCATTER = {
    "none": "tf.tensor_scatter_nd_update",
    "add": "tf.tensor_scatter_nd_add",
    "max": "tf.tensor_scatter_nd_max",
    "min": "tf.tensor_scatter_nd_min",
}


@TF.register("ScatterElements")
def _scatter_elements(c: RuleCtx) -> str:
    # every position of the index (row-major, as tf.where lists them), its axis
    # coordinate replaced by the index's value: the full coordinates to scatter to
    a = c.f["axis"]
    idx = f"tf.cast({c.i(1)}, tf.int64)"
    grid = f"tf.where(tf.ones_like({c.i(1)}, tf.bool))"
    coords = f"tf.concat([{grid}[:, :{a}], tf.reshape({idx}, [-1, 1]), {grid}[:, {a + 1}:]], 1)"
    updates = f"tf.reshape({c.i(2)}, [-1])"
    if c.f["reduction"] == "mul":
        # no multiplying scatter: the product of the updates per element (1 where
        # none lands), by row-major position, times the data
        x = c.i(0)
        shape = f"tf.shape({x}, out_type=tf.int64)"
        strides = f"tf.math.cumprod({shape}, exclusive=True, reverse=True)"
        flat = f"tf.reduce_sum({coords} * {strides}, axis=1)"
        product = f"tf.math.unsorted_segment_prod({updates}, {flat}, tf.size({x}, tf.int64))"
        return f"{x} * tf.reshape({product}, {shape})"
    return f"{_TF_SCATTER[c.f['reduction']]}({c.i(0)}, {coords}, {updates})"


for _variant in ("add", "mul", "max", "min"):
    TF.add(f"ScatterElements/{_variant}", _scatter_elements)


# -- recurrent layers (issue 12) --
TF.spell(
    {
        "LSTM": "_lstm({0}, {1}, {2}, {bias}, {h0}, {c0}, {direction}{extra}){take}",
        "GRU": "_gru({0}, {1}, {2}, {bias}, {h0}, {direction}{extra}){take}",
        "RNN": "_rnn({0}, {1}, {2}, {bias}, {h0}, {direction}, {activation}{extra}){take}",
    }
)


# -- scaled dot-product attention (issue 15): TensorFlow has no fused kernel; _attention
# writes it out (matmul, the mask, softmax, matmul) once, in the program's runtime
TF.spell({"tracelog.Attention": "_attention({0}, {1}, {2}, {mask}, {scale}, {causal})"})


# -- element-wise math: trigonometric and hyperbolic functions, rounding, special
# functions, running products (each the framework's own kernel) --
TF.spell(
    {
        "Tan": "tf.math.tan({0})",
        "Asin": "tf.math.asin({0})",
        "Acos": "tf.math.acos({0})",
        "Atan": "tf.math.atan({0})",
        "Sinh": "tf.math.sinh({0})",
        "Cosh": "tf.math.cosh({0})",
        "Asinh": "tf.math.asinh({0})",
        "Acosh": "tf.math.acosh({0})",
        "Atanh": "tf.math.atanh({0})",
        "Round": "tf.math.round({0})",
        "IsNaN": "tf.math.is_nan({0})",
        "IsInf": "tf.math.is_inf({0})",
        "IsInf/pos": "tf.math.logical_and(tf.math.is_inf({0}), {0} > 0)",
        "IsInf/neg": "tf.math.logical_and(tf.math.is_inf({0}), {0} < 0)",
        "Mod/fmod": "_fmod({0}, {1})",
        "tracelog.Atan2": "tf.math.atan2({0}, {1})",
        "tracelog.Hypot": "_hypot({0}, {1})",
        "tracelog.Erfc": "tf.math.erfc({0})",
        "tracelog.Lgamma": "tf.math.lgamma({0})",
        "Det": "tf.linalg.det({0})",
        "tracelog.Inverse": "tf.linalg.inv({0})",
        "tracelog.Solve": "tf.linalg.solve({0}, {1})",
        "tracelog.Solve/broadcast": "_solve_broadcast({0}, {1})",
        "tracelog.SlogDet": "tf.linalg.slogdet({0})",
        "tracelog.Cholesky": "tf.linalg.cholesky({0})",
        "tracelog.SolveTriangular": "tf.linalg.triangular_solve({0}, {1}, lower={lower})",
        "tracelog.Digamma": "tf.math.digamma({0})",
        "tracelog.Trigamma": "tf.math.polygamma(tf.ones_like({0}), {0})",
        "tracelog.Erfinv": "_erfinv({0})",
        "tracelog.Ndtri": "tf.math.ndtri({0})",
        "tracelog.LogNdtr": "_log_ndtr({0})",
        "tracelog.I0": "tf.math.bessel_i0({0})",
        "tracelog.I0e": "tf.math.bessel_i0e({0})",
        "tracelog.I1": "tf.math.bessel_i1({0})",
        "tracelog.I1e": "tf.math.bessel_i1e({0})",
        "tracelog.CumProd": "tf.math.cumprod({0}, axis={axis})",
    }
)


# -- CTC loss: the runtime's alpha recursion in log space (tf.nn.ctc_loss takes a
# log_softmax of its own, and its gradient of an impossible alignment is not zero_infinity's)
TF.spell({"tracelog.CTCLoss": "_ctc_loss({0}, {1}, {2}, {3}, {blank}, {zero_infinity})"})
