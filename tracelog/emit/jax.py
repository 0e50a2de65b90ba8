"""IR -> JAX: one rule per IR op (the JAX table).

Rules write pure functions of a params pytree with jax.numpy, jax.nn and
jax.lax, so that the emitted functions work under jax.jit and jax.grad.
Programs enable 64-bit types (int64 indices and counters stay int64); every
float constant carries its dtype, so float32 graphs stay float32.
"""

from __future__ import annotations

from tracelog.emit.common import EmitTable, RuleCtx, chain, einsum_equation, literal, slice_expr
from tracelog.passes.layout import to_channels_first

JAX = EmitTable("jax")
IMPORTS = ("jax", "jnp", "lax", "np", "os", "sys", "load_file")


def _dt(dtype: str) -> str:
    return f"jnp.{dtype}"


_UNARY = {
    "Relu": "jax.nn.relu",
    "Tanh": "jnp.tanh",
    "Sigmoid": "jax.nn.sigmoid",
    "Sqrt": "jnp.sqrt",
    "Exp": "jnp.exp",
    "Log": "jnp.log",
    "Abs": "jnp.abs",
    "Neg": "jnp.negative",
    "Reciprocal": "jnp.reciprocal",
    "Erf": "lax.erf",
    "Softplus": "jax.nn.softplus",
    "Floor": "jnp.floor",
    "Ceil": "jnp.ceil",
    "Not": "jnp.logical_not",
}
for _op, _fn in _UNARY.items():
    JAX.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)})")
JAX.add("Identity", lambda c: c.i(0))

for _op, _sym in {"Add": "+", "Sub": "-", "Mul": "*"}.items():
    JAX.add(_op, lambda c, _sym=_sym: f"{c.i(0)} {_sym} {c.i(1)}")


@JAX.register("Div")
def _div(c: RuleCtx) -> str:
    if c.out_type().dtype.startswith(("int", "uint")):
        return f"lax.div({c.i(0)}, {c.i(1)})"  # ONNX integer Div truncates, as lax.div does
    return f"{c.i(0)} / {c.i(1)}"


for _op, _fn in {
    "Pow": "jnp.power",
    "Equal": "jnp.equal",
    "Less": "jnp.less",
    "Greater": "jnp.greater",
    "And": "jnp.logical_and",
    "Or": "jnp.logical_or",
}.items():
    JAX.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)}, {c.i(1)})")


@JAX.register("Max", "Min")
def _max_min(c: RuleCtx) -> str:
    fn = "jnp.maximum" if c.node.op == "Max" else "jnp.minimum"
    return chain(c, fn)


@JAX.register("LeakyRelu")
def _leaky_relu(c: RuleCtx) -> str:
    return f"jax.nn.leaky_relu({c.i(0)}, {literal(float(c.attr('alpha', 0.01)))})"


@JAX.register("Gelu")
def _gelu(c: RuleCtx) -> str:
    approx = c.attr("approximate", "none") == "tanh"
    return f"jax.nn.gelu({c.i(0)}, approximate={literal(approx)})"


@JAX.register("Clip")
def _clip(c: RuleCtx) -> str:
    lo = c.i(1) if c.has(1) else "None"
    hi = c.i(2) if c.has(2) else "None"
    return f"jnp.clip({c.i(0)}, {lo}, {hi})"


@JAX.register("Where")
def _where(c: RuleCtx) -> str:
    return f"jnp.where({c.i(0)}, {c.i(1)}, {c.i(2)})"


@JAX.register("Cast")
def _cast(c: RuleCtx) -> str:
    return f"{c.i(0)}.astype({_dt(str(c.attr('to')))})"


@JAX.register("Softmax", "LogSoftmax")
def _softmax(c: RuleCtx) -> str:
    fn = "jax.nn.softmax" if c.node.op == "Softmax" else "jax.nn.log_softmax"
    return f"{fn}({c.i(0)}, axis={int(c.attr('axis', -1))})"


@JAX.register("MatMul")
def _matmul(c: RuleCtx) -> str:
    return f"jnp.matmul({c.i(0)}, {c.i(1)})"


@JAX.register("Einsum")
def _einsum(c: RuleCtx) -> str:
    operands = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    return f"jnp.einsum({einsum_equation(c)}, {operands})"


@JAX.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    a = f"{c.i(0)}.T" if c.attr("transA", 0) else c.i(0)
    b = f"{c.i(1)}.T" if c.attr("transB", 0) else c.i(1)
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    expr = f"{a} @ {b}"
    if alpha != 1.0:
        expr = f"{literal(alpha)} * ({expr})"
    if c.has(2):
        expr = f"{expr} + {c.i(2) if beta == 1.0 else f'{literal(beta)} * {c.i(2)}'}"
    return expr


@JAX.register("Conv")
def _conv(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    if rank != 4:
        raise NotImplementedError("jax: Conv other than 2-D")
    pads = list(c.attr("pads", [0, 0, 0, 0]))
    y = (
        f"lax.conv_general_dilated({c.i(0)}, {c.i(1)}, "
        f"window_strides={tuple(c.attr('strides', [1, 1]))}, "
        f"padding=(({pads[0]}, {pads[2]}), ({pads[1]}, {pads[3]})), "
        f"rhs_dilation={tuple(c.attr('dilations', [1, 1]))}, "
        f"dimension_numbers=('NCHW', 'OIHW', 'NCHW'), "
        f"feature_group_count={int(c.attr('group', 1))})"
    )
    if c.has(2):
        y = f"{y} + {c.i(2)}.reshape(1, -1, 1, 1)"
    return y


@JAX.register("BatchNormalization")
def _batch_norm(c: RuleCtx) -> str:
    fn = c.use("_batch_norm_eval")
    eps = literal(float(c.attr("epsilon", 1e-5)))
    return f"{fn}({c.i(0)}, {c.i(1)}, {c.i(2)}, {c.i(3)}, {c.i(4)}, {eps})"


@JAX.register("tracelog.StopGradient")
def _stop_gradient(c: RuleCtx) -> str:
    return f"lax.stop_gradient({c.i(0)})"


@JAX.register("tracelog.BatchNormTraining")
def _batch_norm_train(c: RuleCtx) -> str:
    fn = c.use("_batch_norm_train")
    eps = literal(float(c.attr("epsilon")))
    mom = literal(float(c.attr("momentum")))
    axes = literal(tuple(c.attr("axes")))
    return f"{fn}({c.i(0)}, {c.i(1)}, {c.i(2)}, {c.i(3)}, {c.i(4)}, {eps}, {mom}, {axes})"


@JAX.register("LayerNormalization")
def _layer_norm(c: RuleCtx) -> str:
    fn = c.use("_layer_norm")
    rank = len(c.in_type(0).shape)
    axis = int(c.attr("axis", -1)) % rank
    bias = c.i(2) if c.has(2) else "None"
    eps = literal(float(c.attr("epsilon", 1e-5)))
    return f"{fn}({c.i(0)}, {c.i(1)}, {bias}, {tuple(range(axis, rank))}, {eps})"


@JAX.register("Dropout")
def _dropout(c: RuleCtx) -> str:
    fn = c.use("_dropout")
    return f"{fn}({c.i(0)}, {c.i(1)}, rng, {literal(c.mask_key)})"


def _window(c: RuleCtx) -> tuple[list[int], list[int], list[int]]:
    k = list(c.attr("kernel_shape"))
    s = list(c.attr("strides", [1] * len(k)))
    p = list(c.attr("pads", [0] * 2 * len(k)))
    if int(c.attr("ceil_mode", 0)):
        raise NotImplementedError(f"jax: {c.node.op} with ceil_mode")
    return k, s, p


@JAX.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    k, s, p = _window(c)
    if list(c.attr("dilations", [1, 1])) != [1, 1]:
        raise NotImplementedError("jax: dilated MaxPool")
    x = c.i(0)
    return (
        f"lax.reduce_window({x}, -jnp.inf, lax.max, (1, 1, {k[0]}, {k[1]}), (1, 1, {s[0]}, {s[1]}), "
        f"((0, 0), (0, 0), ({p[0]}, {p[2]}), ({p[1]}, {p[3]})))"
    )


@JAX.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    k, s, p = _window(c)
    x = c.i(0)
    window = f"(1, 1, {k[0]}, {k[1]}), (1, 1, {s[0]}, {s[1]}), ((0, 0), (0, 0), ({p[0]}, {p[2]}), ({p[1]}, {p[3]}))"
    total = f"lax.reduce_window({x}, 0.0, lax.add, {window})"
    if int(c.attr("count_include_pad", 0)) or not any(p):
        return f"{total} / {k[0] * k[1]}"
    return f"{total} / lax.reduce_window(jnp.ones_like({x}), 0.0, lax.add, {window})"


@JAX.register("GlobalAveragePool")
def _gap(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    return f"jnp.mean({c.i(0)}, axis={tuple(range(2, rank))}, keepdims=True)"


def _reduce_rule(fn: str):  # noqa: ANN202 - a rule factory
    def rule(c: RuleCtx) -> str:
        keep = bool(int(c.attr("keepdims", 1)))
        axes = c.ints(1) if c.has(1) else None
        if c.has(1) and axes is None:
            raise NotImplementedError("jax: reduction over computed axes")
        axis = "None" if axes is None else str(tuple(axes))
        return f"{fn}({c.i(0)}, axis={axis}, keepdims={literal(keep)})"

    return rule


for _op, _fn in {
    "ReduceMean": "jnp.mean",
    "ReduceSum": "jnp.sum",
    "ReduceMax": "jnp.max",
    "ReduceMin": "jnp.min",
    "ReduceProd": "jnp.prod",
}.items():
    JAX.add(_op, _reduce_rule(_fn))


@JAX.register("ArgMax")
def _argmax(c: RuleCtx) -> str:
    keep = literal(bool(int(c.attr("keepdims", 1))))
    return f"jnp.argmax({c.i(0)}, axis={int(c.attr('axis', 0))}, keepdims={keep})"


@JAX.register("Reshape")
def _reshape(c: RuleCtx) -> str:
    shape = c.ints(1)
    if shape is not None and 0 in shape:
        raise NotImplementedError("jax: Reshape with 0 (copy) dims")
    target = tuple(shape) if shape is not None else f"tuple({c.i(1)})"
    return f"jnp.reshape({c.i(0)}, {target})"


@JAX.register("Transpose")
def _transpose(c: RuleCtx) -> str:
    return f"jnp.transpose({c.i(0)}, {tuple(c.attr('perm'))})"


@JAX.register("Concat")
def _concat(c: RuleCtx) -> str:
    parts = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    out = c.out_type()
    if out.dtype == "int64" and len(out.shape) == 1:
        # a shape being assembled: NumPy keeps it static under jax.jit
        return f"np.concatenate([{parts}], axis=0)"
    return f"jnp.concatenate([{parts}], axis={int(c.attr('axis'))})"


@JAX.register("Split")
def _split(c: RuleCtx) -> str:
    sizes = c.ints(1)
    axis = int(c.attr("axis", 0))
    if sizes is None:
        n = int(c.attr("num_outputs", len(c.node.outputs)))
        return f"jnp.array_split({c.i(0)}, {n}, axis={axis})"
    cuts = [sum(sizes[: k + 1]) for k in range(len(sizes) - 1)]
    return f"jnp.split({c.i(0)}, {cuts}, axis={axis})"


@JAX.register("Slice")
def _slice(c: RuleCtx) -> str:
    return slice_expr(c, "jax")


@JAX.register("Gather")
def _gather(c: RuleCtx) -> str:
    idx = c.const(1)
    index = literal(idx.tolist()) if idx is not None and idx.ndim == 0 else c.i(1)
    return f"jnp.take({c.i(0)}, {index}, axis={int(c.attr('axis', 0))})"


@JAX.register("Unsqueeze")
def _unsqueeze(c: RuleCtx) -> str:
    axes = c.ints(1)
    if axes is None:
        raise NotImplementedError("jax: Unsqueeze with computed axes")
    rank = len(c.out_type().shape)
    return f"jnp.expand_dims({c.i(0)}, {tuple(sorted(a % rank for a in axes))})"


@JAX.register("Squeeze")
def _squeeze(c: RuleCtx) -> str:
    axes = c.ints(1) if c.has(1) else None
    return f"jnp.squeeze({c.i(0)}, axis={tuple(axes)})" if axes else f"jnp.squeeze({c.i(0)})"


@JAX.register("Expand")
def _expand(c: RuleCtx) -> str:
    shape = c.ints(1)
    target = tuple(shape) if shape is not None else f"tuple({c.i(1)})"
    x = c.i(0)
    return f"jnp.broadcast_to({x}, jnp.broadcast_shapes({x}.shape, {target}))"


@JAX.register("Pad")
def _pad(c: RuleCtx) -> str:
    pads = c.ints(1)
    if pads is None or c.has(3) or c.attr("mode", "constant") != "constant":
        raise NotImplementedError("jax: Pad other than constant with constant pads")
    half = len(pads) // 2
    value = f", constant_values={c.i(2)}" if c.has(2) else ""
    return f"jnp.pad({c.i(0)}, {[(pads[k], pads[k + half]) for k in range(half)]}{value})"


@JAX.register("Tile")
def _tile(c: RuleCtx) -> str:
    reps = c.ints(1)
    return f"jnp.tile({c.i(0)}, {tuple(reps) if reps is not None else f'tuple({c.i(1)})'})"


@JAX.register("Shape")
def _shape(c: RuleCtx) -> str:
    # the static shape, as a NumPy array: it stays concrete under jax.jit
    start, end = c.attr("start"), c.attr("end")
    sl = f"[{'' if start is None else start}:{'' if end is None else end}]"
    return f"np.asarray({c.i(0)}.shape{sl}, dtype=np.int64)"


@JAX.register("ConstantOfShape")
def _constant_of_shape(c: RuleCtx) -> str:
    dt = c.out_type().dtype
    return f"jnp.full(tuple(np.asarray({c.i(0)}).tolist()), {literal(c.attr('value', 0.0))}, dtype={_dt(dt)})"


@JAX.register("NegativeLogLikelihoodLoss")
def _nll(c: RuleCtx) -> str:
    fn = c.use("_nll_loss")
    weight = c.i(2) if c.has(2) else "None"
    reduction = literal(str(c.attr("reduction", "mean")))
    ignore = c.attr("ignore_index")
    return f"{fn}({c.i(0)}, {c.i(1)}, {weight}, {reduction}, {literal(ignore) if ignore is not None else 'None'})"


JAX.not_yet("tracelog.Unsupported", reason="the source op could not be recorded")

HELPERS: dict[str, str] = {  # emitted into a program only when a rule uses them
    "_batch_norm_train": '''
def _batch_norm_train(x, scale, bias, running_mean, running_var, eps, momentum, axes):
    """Batch norm in training mode as PyTorch computes it on the CPU: batch
    statistics accumulated in float64; the running variance updates with the
    unbiased one. Returns the output and the new running statistics."""
    shape = [1 if d in axes else -1 for d in range(x.ndim)]
    x64 = x.astype(jnp.float64)
    mean = jnp.mean(x64, axis=axes)
    var = jnp.mean(jnp.square(x64 - mean.reshape(shape)), axis=axes)
    a = scale.astype(jnp.float64) / jnp.sqrt(var + eps)
    b = bias.astype(jnp.float64) - mean * a
    y = x * a.astype(x.dtype).reshape(shape) + b.astype(x.dtype).reshape(shape)
    n = x.size // mean.size
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(x.dtype)
    new_var = (1 - momentum) * running_var + momentum * (var * n / (n - 1)).astype(x.dtype)
    return y, lax.stop_gradient(new_mean), lax.stop_gradient(new_var)
''',
    "_batch_norm_eval": """
def _batch_norm_eval(x, scale, bias, mean, var, eps):
    shape = [1, -1] + [1] * (x.ndim - 2)
    a = scale / jnp.sqrt(var + eps)
    b = bias - mean * a
    return x * a.reshape(shape) + b.reshape(shape)
""",
    "_layer_norm": """
def _layer_norm(x, scale, bias, axes, eps):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + eps) * scale
    return y if bias is None else y + bias
""",
    "_dropout": '''
def _dropout(x, rate, rng, key):
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay) or a jax.random key."""
    if isinstance(rng, dict):
        mask = jnp.asarray(rng[key]).astype(x.dtype)
    elif rng is None:
        raise ValueError("dropout in training mode needs rng: a jax.random key or recorded masks")
    else:
        mask = jax.random.bernoulli(rng, 1.0 - rate, x.shape).astype(x.dtype)
    return x * (mask / (1.0 - rate)), mask > 0
''',
    "_nll_loss": '''
def _nll_loss(logp, target, weight, reduction, ignore_index):
    """ONNX NegativeLogLikelihoodLoss: class axis 1, targets of shape [N, ...]."""
    valid = jnp.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = -jnp.take_along_axis(logp, jnp.expand_dims(safe, 1), axis=1).squeeze(1)
    w = jnp.ones_like(picked) if weight is None else jnp.take(weight, safe)
    w = w * valid.astype(w.dtype)
    losses = picked * w
    if reduction == "none":
        return losses
    if reduction == "sum":
        return jnp.sum(losses)
    return jnp.sum(losses) / jnp.sum(w)
''',
}


def target():  # noqa: ANN201 - a Target, built on use to keep imports light
    from tracelog.emit.program import Target

    return Target(
        name="jax",
        title="JAX",
        table=JAX,
        helpers=HELPERS,
        reserved=IMPORTS,
        template="jax.py.j2",
        file_name="program_jax.py",
        # NumPy constants: static under jax.jit, dtype kept
        const_expr="np.asarray({value}, dtype=np.{dtype})",
        layout_note=(
            "Layout: the recording was channels-last (NHWC); this program runs NCHW\n"
            "inside. Transposes kept, per function:\n{layout}"
        ),
        passes=(to_channels_first,),
    )
