"""IR -> TensorFlow: one rule per IR op (the TF table).

Rules write eager TensorFlow 2 code. The IR keeps PyTorch's NCHW layout;
TensorFlow's CPU kernels for convolution and pooling take NHWC only, so those
rules transpose in and out around the kernel (see the program header).
"""

from __future__ import annotations

from tracelog.emit.common import EmitTable, RuleCtx, chain, einsum_equation, literal, slice_expr
from tracelog.passes.layout import to_channels_last

TF = EmitTable("tensorflow")
IMPORTS = ("tf", "np", "os", "sys", "load_file")

NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]


def _dt(dtype: str) -> str:
    return f"tf.{dtype}"


# -- element-wise -------------------------------------------------------------------
_UNARY = {
    "Relu": "tf.nn.relu",
    "Tanh": "tf.math.tanh",
    "Sigmoid": "tf.math.sigmoid",
    "Sqrt": "tf.math.sqrt",
    "Exp": "tf.math.exp",
    "Log": "tf.math.log",
    "Abs": "tf.math.abs",
    "Neg": "tf.math.negative",
    "Reciprocal": "tf.math.reciprocal",
    "Erf": "tf.math.erf",
    "Softplus": "tf.math.softplus",
    "Floor": "tf.math.floor",
    "Ceil": "tf.math.ceil",
    "Identity": "tf.identity",
    "Not": "tf.math.logical_not",
}
for _op, _fn in _UNARY.items():
    TF.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)})")

_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Pow": "**"}
for _op, _sym in _BINARY.items():
    TF.add(_op, lambda c, _sym=_sym: f"{c.i(0)} {_sym} {c.i(1)}")


@TF.register("Div")
def _div(c: RuleCtx) -> str:
    if c.out_type().dtype.startswith(("int", "uint")):
        return f"tf.truncatediv({c.i(0)}, {c.i(1)})"  # ONNX integer Div truncates
    return f"{c.i(0)} / {c.i(1)}"


for _op, _fn in {
    "Equal": "tf.math.equal",
    "Less": "tf.math.less",
    "Greater": "tf.math.greater",
    "And": "tf.math.logical_and",
    "Or": "tf.math.logical_or",
}.items():
    TF.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)}, {c.i(1)})")


@TF.register("Max", "Min")
def _max_min(c: RuleCtx) -> str:
    fn = "tf.math.maximum" if c.node.op == "Max" else "tf.math.minimum"
    return chain(c, fn)


@TF.register("LeakyRelu")
def _leaky_relu(c: RuleCtx) -> str:
    return f"tf.nn.leaky_relu({c.i(0)}, alpha={literal(float(c.attr('alpha', 0.01)))})"


@TF.register("Gelu")
def _gelu(c: RuleCtx) -> str:
    approx = c.attr("approximate", "none") == "tanh"
    return f"tf.nn.gelu({c.i(0)}, approximate={literal(approx)})"


@TF.register("Clip")
def _clip(c: RuleCtx) -> str:
    x = c.i(0)
    if c.has(1):
        x = f"tf.math.maximum({x}, {c.i(1)})"
    if c.has(2):
        x = f"tf.math.minimum({x}, {c.i(2)})"
    return x


@TF.register("Where")
def _where(c: RuleCtx) -> str:
    return f"tf.where({c.i(0)}, {c.i(1)}, {c.i(2)})"


@TF.register("Cast")
def _cast(c: RuleCtx) -> str:
    return f"tf.cast({c.i(0)}, {_dt(str(c.attr('to')))})"


@TF.register("Softmax", "LogSoftmax")
def _softmax(c: RuleCtx) -> str:
    fn = "tf.nn.softmax" if c.node.op == "Softmax" else "tf.nn.log_softmax"
    return f"{fn}({c.i(0)}, axis={int(c.attr('axis', -1))})"


# -- linear algebra -------------------------------------------------------------------
@TF.register("MatMul")
def _matmul(c: RuleCtx) -> str:
    return f"tf.linalg.matmul({c.i(0)}, {c.i(1)})"


@TF.register("Einsum")
def _einsum(c: RuleCtx) -> str:
    operands = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    return f"tf.einsum({einsum_equation(c)}, {operands})"


@TF.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    flags = []
    if c.attr("transA", 0):
        flags.append("transpose_a=True")
    if c.attr("transB", 0):
        flags.append("transpose_b=True")
    expr = f"tf.linalg.matmul({', '.join([c.i(0), c.i(1), *flags])})"
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    if alpha != 1.0:
        expr = f"{literal(alpha)} * {expr}"
    if c.has(2):
        bias = c.i(2) if beta == 1.0 else f"{literal(beta)} * {c.i(2)}"
        expr = f"{expr} + {bias}"
    return expr


def _channels_last(c: RuleCtx) -> bool:
    return bool(int(c.attr("channels_last", 0)))


def _to_nhwc(c: RuleCtx, x: str) -> str:
    return x if _channels_last(c) else f"tf.transpose({x}, {NCHW_TO_NHWC})"


def _from_nhwc(c: RuleCtx, y: str) -> str:
    return y if _channels_last(c) else f"tf.transpose({y}, {NHWC_TO_NCHW})"


@TF.register("Conv")
def _conv(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    if rank != 4:
        raise NotImplementedError("tensorflow: Conv other than 2-D")
    pads = list(c.attr("pads", [0, 0, 0, 0]))
    strides = list(c.attr("strides", [1, 1]))
    dil = list(c.attr("dilations", [1, 1]))
    group = int(c.attr("group", 1))
    x = _to_nhwc(c, c.i(0))
    padding = f"[[0, 0], [{pads[0]}, {pads[2]}], [{pads[1]}, {pads[3]}], [0, 0]]"
    cin = c.in_type(0).shape[3 if _channels_last(c) else 1]
    wshape = c.in_type(1).shape
    if group == 1:
        w = f"tf.transpose({c.i(1)}, [2, 3, 1, 0])"  # OIHW -> HWIO
        if dil != [1, 1]:
            # TF's CPU kernels have no gradient for dilation > 1: dilate the kernel
            # with zeros instead (the same sums, and differentiable).
            w = f"{c.use('_dilate_kernel')}({w}, {dil})"
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
            raise NotImplementedError("tensorflow: dilated grouped Conv")
        y = f"{c.use('_grouped_conv2d')}({x}, {c.i(1)}, {group}, {strides}, {padding})"
    if c.has(2):
        y = f"{y} + {c.i(2)}"  # NHWC: the bias broadcasts along the last axis
    return _from_nhwc(c, y)


# -- normalisation -----------------------------------------------------------------------
@TF.register("BatchNormalization")
def _batch_norm(c: RuleCtx) -> str:
    eps = literal(float(c.attr("epsilon", 1e-5)))
    fn = c.use("_batch_norm_eval")
    axis = len(c.in_type(0).shape) - 1 if _channels_last(c) else 1
    return f"{fn}({c.i(0)}, {c.i(1)}, {c.i(2)}, {c.i(3)}, {c.i(4)}, {eps}, {axis})"


@TF.register("tracelog.StopGradient")
def _stop_gradient(c: RuleCtx) -> str:
    return f"tf.stop_gradient({c.i(0)})"


@TF.register("tracelog.BatchNormTraining")
def _batch_norm_train(c: RuleCtx) -> str:
    fn = c.use("_batch_norm_train")
    eps = literal(float(c.attr("epsilon")))
    mom = literal(float(c.attr("momentum")))
    axes = literal(list(c.attr("axes")))
    axis = len(c.in_type(0).shape) - 1 if _channels_last(c) else 1
    return f"{fn}({c.i(0)}, {c.i(1)}, {c.i(2)}, {c.i(3)}, {c.i(4)}, {eps}, {mom}, {axes}, {axis})"


@TF.register("LayerNormalization")
def _layer_norm(c: RuleCtx) -> str:
    fn = c.use("_layer_norm")
    rank = len(c.in_type(0).shape)
    axis = int(c.attr("axis", -1)) % rank
    eps = literal(float(c.attr("epsilon", 1e-5)))
    bias = c.i(2) if c.has(2) else "None"
    return f"{fn}({c.i(0)}, {c.i(1)}, {bias}, {list(range(axis, rank))}, {eps})"


@TF.register("Dropout")
def _dropout(c: RuleCtx) -> str:
    fn = c.use("_dropout")
    return f"{fn}({c.i(0)}, {c.i(1)}, rng, {literal(c.mask_key)})"


# -- pooling ------------------------------------------------------------------------------
def _pool_pads(c: RuleCtx) -> list[int]:
    return list(c.attr("pads", [0, 0, 0, 0]))


@TF.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    if int(c.attr("ceil_mode", 0)):
        raise NotImplementedError("tensorflow: MaxPool with ceil_mode")
    if list(c.attr("dilations", [1, 1])) != [1, 1]:
        raise NotImplementedError("tensorflow: dilated MaxPool")
    k, s, p = list(c.attr("kernel_shape")), list(c.attr("strides", [1, 1])), _pool_pads(c)
    x = _to_nhwc(c, c.i(0))
    if any(p):
        x = f"tf.pad({x}, [[0, 0], [{p[0]}, {p[2]}], [{p[1]}, {p[3]}], [0, 0]], constant_values=-np.inf)"
    y = f"tf.nn.max_pool2d({x}, ksize={k}, strides={s}, padding='VALID')"
    return _from_nhwc(c, y)


@TF.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    if int(c.attr("ceil_mode", 0)):
        raise NotImplementedError("tensorflow: AveragePool with ceil_mode")
    k, s, p = list(c.attr("kernel_shape")), list(c.attr("strides", [1, 1])), _pool_pads(c)
    x = _to_nhwc(c, c.i(0))
    pad = f"[[0, 0], [{p[0]}, {p[2]}], [{p[1]}, {p[3]}], [0, 0]]"
    if not any(p):
        return _from_nhwc(c, f"tf.nn.avg_pool2d({x}, ksize={k}, strides={s}, padding='VALID')")
    y = f"tf.nn.avg_pool2d(tf.pad({x}, {pad}), ksize={k}, strides={s}, padding='VALID')"
    if not int(c.attr("count_include_pad", 0)):
        # padding the divisor leaves out: window sums over the counts of real elements
        ones = f"tf.pad(tf.ones_like({x}[:1, :, :, :1]), {pad})"
        y = f"{y} / tf.nn.avg_pool2d({ones}, ksize={k}, strides={s}, padding='VALID')"
    return _from_nhwc(c, y)


@TF.register("GlobalAveragePool")
def _gap(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    axes = list(range(1, rank - 1)) if _channels_last(c) else list(range(2, rank))
    return f"tf.math.reduce_mean({c.i(0)}, axis={axes}, keepdims=True)"


# -- reductions ------------------------------------------------------------------------------
_REDUCE = {
    "ReduceMean": "tf.math.reduce_mean",
    "ReduceSum": "tf.math.reduce_sum",
    "ReduceMax": "tf.math.reduce_max",
    "ReduceMin": "tf.math.reduce_min",
    "ReduceProd": "tf.math.reduce_prod",
}


def _reduce_rule(fn: str):  # noqa: ANN202 - a rule factory
    def rule(c: RuleCtx) -> str:
        keep = bool(int(c.attr("keepdims", 1)))
        axes = c.ints(1) if c.has(1) else None
        if c.has(1) and axes is None:
            raise NotImplementedError("tensorflow: reduction over computed axes")
        axis = "" if axes is None else f", axis={axes}"
        return f"{fn}({c.i(0)}{axis}, keepdims={literal(keep)})"

    return rule


for _op, _fn in _REDUCE.items():
    TF.add(_op, _reduce_rule(_fn))


@TF.register("ArgMax")
def _argmax(c: RuleCtx) -> str:
    axis = int(c.attr("axis", 0))
    y = f"tf.math.argmax({c.i(0)}, axis={axis}, output_type=tf.int64)"
    if int(c.attr("keepdims", 1)):
        y = f"tf.expand_dims({y}, {axis})"
    return y


# -- shapes ------------------------------------------------------------------------------------
@TF.register("Reshape")
def _reshape(c: RuleCtx) -> str:
    shape = c.ints(1)
    if shape is not None and 0 in shape:
        raise NotImplementedError("tensorflow: Reshape with 0 (copy) dims")
    return f"tf.reshape({c.i(0)}, {shape if shape is not None else c.i(1)})"


@TF.register("Transpose")
def _transpose(c: RuleCtx) -> str:
    return f"tf.transpose({c.i(0)}, {list(c.attr('perm'))})"


@TF.register("Concat")
def _concat(c: RuleCtx) -> str:
    parts = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    return f"tf.concat([{parts}], axis={int(c.attr('axis'))})"


@TF.register("Split")
def _split(c: RuleCtx) -> str:
    sizes = c.ints(1)
    if sizes is None:
        n = int(c.attr("num_outputs", len(c.node.outputs)))
        return f"tf.split({c.i(0)}, {n}, axis={int(c.attr('axis', 0))})"
    return f"tf.split({c.i(0)}, {sizes}, axis={int(c.attr('axis', 0))})"


@TF.register("Slice")
def _slice(c: RuleCtx) -> str:
    return slice_expr(c, "tensorflow")


@TF.register("Gather")
def _gather(c: RuleCtx) -> str:
    idx = c.const(1)
    index = literal(idx.tolist()) if idx is not None and idx.ndim == 0 else c.i(1)
    return f"tf.gather({c.i(0)}, {index}, axis={int(c.attr('axis', 0))})"


@TF.register("Unsqueeze")
def _unsqueeze(c: RuleCtx) -> str:
    axes = c.ints(1)
    if axes is None:
        raise NotImplementedError("tensorflow: Unsqueeze with computed axes")
    rank = len(c.out_type().shape)
    y = c.i(0)
    for a in sorted(a % rank for a in axes):
        y = f"tf.expand_dims({y}, {a})"
    return y


@TF.register("Squeeze")
def _squeeze(c: RuleCtx) -> str:
    axes = c.ints(1) if c.has(1) else None
    return f"tf.squeeze({c.i(0)}, axis={axes})" if axes else f"tf.squeeze({c.i(0)})"


@TF.register("Expand")
def _expand(c: RuleCtx) -> str:
    # ONNX Expand broadcasts both ways; tf.broadcast_to only widens.
    shape = c.ints(1)
    target = literal(shape) if shape is not None else c.i(1)
    x = c.i(0)
    return f"tf.broadcast_to({x}, tf.broadcast_dynamic_shape(tf.shape({x}, out_type=tf.int64), tf.constant({target}, tf.int64)))"


@TF.register("Pad")
def _pad(c: RuleCtx) -> str:
    pads = c.ints(1)
    if pads is None or c.has(3) or c.attr("mode", "constant") != "constant":
        raise NotImplementedError("tensorflow: Pad other than constant with constant pads")
    half = len(pads) // 2
    value = f", constant_values={c.i(2)}" if c.has(2) else ""
    return f"tf.pad({c.i(0)}, {[[pads[k], pads[k + half]] for k in range(half)]}{value})"


@TF.register("Tile")
def _tile(c: RuleCtx) -> str:
    reps = c.ints(1)
    return f"tf.tile({c.i(0)}, {reps if reps is not None else c.i(1)})"


@TF.register("Shape")
def _shape(c: RuleCtx) -> str:
    start, end = c.attr("start"), c.attr("end")
    s = f"tf.shape({c.i(0)}, out_type=tf.int64)"
    if start is None and end is None:
        return s
    return f"{s}[{'' if start is None else start}:{'' if end is None else end}]"


@TF.register("ConstantOfShape")
def _constant_of_shape(c: RuleCtx) -> str:
    dt = c.out_type().dtype
    return f"tf.fill({c.i(0)}, tf.constant({literal(c.attr('value', 0.0))}, {_dt(dt)}))"


# -- losses --------------------------------------------------------------------------------------
@TF.register("NegativeLogLikelihoodLoss")
def _nll(c: RuleCtx) -> str:
    fn = c.use("_nll_loss")
    weight = c.i(2) if c.has(2) else "None"
    reduction = literal(str(c.attr("reduction", "mean")))
    ignore = c.attr("ignore_index")
    return f"{fn}({c.i(0)}, {c.i(1)}, {weight}, {reduction}, {literal(ignore) if ignore is not None else 'None'})"


TF.not_yet("tracelog.Unsupported", reason="the source op could not be recorded")

HELPERS: dict[str, str] = {  # emitted into a program only when a rule uses them
    "_batch_norm_train": '''
def _batch_norm_train(x, scale, bias, running_mean, running_var, eps, momentum, axes, channel_axis):
    """Batch norm in training mode as PyTorch computes it: normalise with the
    batch's biased variance, update the running variance with the unbiased one."""
    shape = [1] * len(x.shape)
    shape[channel_axis] = -1
    mean, var = tf.nn.moments(x, axes=axes)
    y = (x - tf.reshape(mean, shape)) / tf.sqrt(tf.reshape(var, shape) + eps)
    y = y * tf.reshape(scale, shape) + tf.reshape(bias, shape)
    n = tf.cast(tf.size(x) // tf.size(mean), x.dtype)
    new_mean = (1.0 - momentum) * running_mean + momentum * mean
    new_var = (1.0 - momentum) * running_var + momentum * var * n / (n - 1.0)
    return y, new_mean, new_var
''',
    "_batch_norm_eval": """
def _batch_norm_eval(x, scale, bias, mean, var, eps, channel_axis):
    shape = [1] * len(x.shape)
    shape[channel_axis] = -1
    y = (x - tf.reshape(mean, shape)) / tf.sqrt(tf.reshape(var, shape) + eps)
    return y * tf.reshape(scale, shape) + tf.reshape(bias, shape)
""",
    "_layer_norm": """
def _layer_norm(x, scale, bias, axes, eps):
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    y = (x - mean) / tf.sqrt(var + eps) * scale
    return y if bias is None else y + bias
""",
    "_dropout": '''
def _dropout(x, rate, rng, key):
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay), a tf.random.Generator, or None for the
    global generator."""
    if isinstance(rng, dict):
        mask = tf.cast(rng[key], x.dtype)
    else:
        gen = rng if rng is not None else tf.random.get_global_generator()
        mask = tf.cast(gen.uniform(tf.shape(x)) >= tf.cast(rate, tf.float32), x.dtype)
    return x * (mask / (1.0 - rate)), tf.cast(mask, tf.bool)
''',
    "_nll_loss": '''
def _nll_loss(logp, target, weight, reduction, ignore_index):
    """ONNX NegativeLogLikelihoodLoss: class axis 1, targets of shape [N, ...]."""
    c = logp.shape[1]
    perm = [0] + list(range(2, len(logp.shape))) + [1]
    flat = tf.reshape(tf.transpose(logp, perm), [-1, c])
    t = tf.reshape(target, [-1])
    valid = tf.ones_like(t, dtype=tf.bool) if ignore_index is None else tf.not_equal(t, ignore_index)
    safe = tf.where(valid, t, tf.zeros_like(t))
    picked = -tf.gather(flat, safe, axis=1, batch_dims=1)
    w = tf.ones_like(picked) if weight is None else tf.gather(weight, safe)
    w = w * tf.cast(valid, w.dtype)
    losses = picked * w
    if reduction == "none":
        return tf.reshape(losses, tf.shape(target))
    if reduction == "sum":
        return tf.reduce_sum(losses)
    return tf.reduce_sum(losses) / tf.reduce_sum(w)
''',
    "_dilate_kernel": '''
def _dilate_kernel(w, rates):
    """An HWIO kernel with (rate - 1) zeros between taps: a dilated convolution
    as a plain one, which TensorFlow can differentiate on the CPU."""
    kh, kw, cin, cout = w.shape
    taps = [[i * rates[0], j * rates[1]] for i in range(kh) for j in range(kw)]
    shape = [(kh - 1) * rates[0] + 1, (kw - 1) * rates[1] + 1, cin, cout]
    return tf.scatter_nd(taps, tf.reshape(w, [kh * kw, cin, cout]), shape)
''',
    "_grouped_conv2d": '''
def _grouped_conv2d(x, w, groups, strides, padding):
    """Grouped convolution (NHWC input, OIHW weights) as one conv per group."""
    xs = tf.split(x, groups, axis=3)
    ws = tf.split(tf.transpose(w, [2, 3, 1, 0]), groups, axis=3)
    ys = [tf.nn.conv2d(a, b, strides=strides, padding=padding) for a, b in zip(xs, ws)]
    return tf.concat(ys, axis=3)
''',
}


def target():  # noqa: ANN201 - a Target, built on use to keep imports light
    from tracelog.emit.program import Target

    return Target(
        name="tensorflow",
        title="TensorFlow",
        table=TF,
        helpers=HELPERS,
        reserved=IMPORTS,
        template="tensorflow.py.j2",
        file_name="program_tensorflow.py",
        const_expr="tf.constant({value}, tf.{dtype})",
        layout_note=(
            "Layout: NHWC inside (TensorFlow's CPU convolution and pooling kernels take\n"
            "channels last); the recording was NCHW. Transposes kept, per function:\n"
            "{layout}"
        ),
        passes=(to_channels_last,),
    )
