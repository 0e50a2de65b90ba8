"""IR -> PyTorch: one rule per IR op (the torch table).

Rules write eager PyTorch with torch.nn.functional; parameters are
torch.nn.Parameter, so the program trains as it stands. This module writes
text only: it never imports torch.
"""

from __future__ import annotations

from tracelog.emit.common import EmitTable, RuleCtx, chain, einsum_equation, literal, slice_expr
from tracelog.passes.layout import to_channels_first

TORCH = EmitTable("torch")
IMPORTS = ("torch", "F", "np", "os", "sys", "load_file")


def _dt(dtype: str) -> str:
    return f"torch.{dtype}"


# -- element-wise -------------------------------------------------------------------
_UNARY = {
    "Relu": "torch.relu",
    "Tanh": "torch.tanh",
    "Sigmoid": "torch.sigmoid",
    "Sqrt": "torch.sqrt",
    "Exp": "torch.exp",
    "Log": "torch.log",
    "Abs": "torch.abs",
    "Neg": "torch.neg",
    "Reciprocal": "torch.reciprocal",
    "Erf": "torch.erf",
    "Softplus": "F.softplus",
    "Floor": "torch.floor",
    "Ceil": "torch.ceil",
    "Not": "torch.logical_not",
}
for _op, _fn in _UNARY.items():
    TORCH.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)})")
TORCH.add("Identity", lambda c: c.i(0))

for _op, _sym in {"Add": "+", "Sub": "-", "Mul": "*"}.items():
    TORCH.add(_op, lambda c, _sym=_sym: f"{c.i(0)} {_sym} {c.i(1)}")


@TORCH.register("Div")
def _div(c: RuleCtx) -> str:
    if c.out_type().dtype.startswith(("int", "uint")):
        return f"torch.div({c.i(0)}, {c.i(1)}, rounding_mode='trunc')"  # ONNX integer Div truncates
    return f"{c.i(0)} / {c.i(1)}"


for _op, _fn in {
    "Pow": "torch.pow",
    "Equal": "torch.eq",
    "Less": "torch.lt",
    "Greater": "torch.gt",
    "And": "torch.logical_and",
    "Or": "torch.logical_or",
}.items():
    TORCH.add(_op, lambda c, _fn=_fn: f"{_fn}({c.i(0)}, {c.i(1)})")


@TORCH.register("Max", "Min")
def _max_min(c: RuleCtx) -> str:
    fn = "torch.maximum" if c.node.op == "Max" else "torch.minimum"
    return chain(c, fn)


@TORCH.register("LeakyRelu")
def _leaky_relu(c: RuleCtx) -> str:
    return f"F.leaky_relu({c.i(0)}, {literal(float(c.attr('alpha', 0.01)))})"


@TORCH.register("Gelu")
def _gelu(c: RuleCtx) -> str:
    approx = "tanh" if c.attr("approximate", "none") == "tanh" else "none"
    return f"F.gelu({c.i(0)}, approximate={literal(approx)})"


@TORCH.register("Clip")
def _clip(c: RuleCtx) -> str:
    lo = c.i(1) if c.has(1) else "None"
    hi = c.i(2) if c.has(2) else "None"
    return f"torch.clamp({c.i(0)}, {lo}, {hi})"


@TORCH.register("Where")
def _where(c: RuleCtx) -> str:
    return f"torch.where({c.i(0)}, {c.i(1)}, {c.i(2)})"


@TORCH.register("Cast")
def _cast(c: RuleCtx) -> str:
    return f"{c.i(0)}.to({_dt(str(c.attr('to')))})"


@TORCH.register("Softmax", "LogSoftmax")
def _softmax(c: RuleCtx) -> str:
    fn = "torch.softmax" if c.node.op == "Softmax" else "torch.log_softmax"
    return f"{fn}({c.i(0)}, {int(c.attr('axis', -1))})"


# -- linear algebra ------------------------------------------------------------------
@TORCH.register("MatMul")
def _matmul(c: RuleCtx) -> str:
    return f"torch.matmul({c.i(0)}, {c.i(1)})"


@TORCH.register("Einsum")
def _einsum(c: RuleCtx) -> str:
    operands = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    return f"torch.einsum({einsum_equation(c)}, {operands})"


@TORCH.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    a = f"{c.i(0)}.T" if c.attr("transA", 0) else c.i(0)
    if c.attr("transB", 0) and not c.attr("transA", 0) and alpha == 1.0 and beta == 1.0:
        bias = f", {c.i(2)}" if c.has(2) else ""
        return f"F.linear({a}, {c.i(1)}{bias})"  # a Linear layer, as PyTorch writes it
    b = f"{c.i(1)}.T" if c.attr("transB", 0) else c.i(1)
    expr = f"torch.matmul({a}, {b})"
    if alpha != 1.0:
        expr = f"{literal(alpha)} * {expr}"
    if c.has(2):
        expr = f"{expr} + {c.i(2) if beta == 1.0 else f'{literal(beta)} * {c.i(2)}'}"
    return expr


def _symmetric(pads: list[int]) -> list[int] | None:
    half = len(pads) // 2
    return pads[:half] if pads[:half] == pads[half:] else None


def _torch_pad(pads: list[int]) -> list[int]:
    """ONNX [b1, b2, e1, e2] -> F.pad's last-dim-first [b2, e2, b1, e1]."""
    half = len(pads) // 2
    out: list[int] = []
    for k in reversed(range(half)):
        out += [pads[k], pads[k + half]]
    return out


@TORCH.register("Conv")
def _conv(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    if rank not in (3, 4, 5):
        raise NotImplementedError("torch: Conv of this rank")
    fn = f"F.conv{rank - 2}d"
    pads = list(c.attr("pads", [0] * (2 * (rank - 2))))
    x = c.i(0)
    padding = _symmetric(pads)
    if padding is None:
        x = f"F.pad({x}, {_torch_pad(pads)})"
        padding = [0] * (rank - 2)
    bias = c.i(2) if c.has(2) else "None"
    return (
        f"{fn}({x}, {c.i(1)}, {bias}, stride={list(c.attr('strides', [1] * (rank - 2)))}, "
        f"padding={padding}, dilation={list(c.attr('dilations', [1] * (rank - 2)))}, "
        f"groups={int(c.attr('group', 1))})"
    )


# -- normalisation -------------------------------------------------------------------
@TORCH.register("BatchNormalization")
def _batch_norm(c: RuleCtx) -> str:
    eps = literal(float(c.attr("epsilon", 1e-5)))
    return f"F.batch_norm({c.i(0)}, {c.i(3)}, {c.i(4)}, {c.i(1)}, {c.i(2)}, False, 0.0, {eps})"


@TORCH.register("tracelog.StopGradient")
def _stop_gradient(c: RuleCtx) -> str:
    return f"{c.i(0)}.detach()"


@TORCH.register("tracelog.BatchNormTraining")
def _batch_norm_train(c: RuleCtx) -> str:
    fn = c.use("_batch_norm_train")
    eps = literal(float(c.attr("epsilon")))
    mom = literal(float(c.attr("momentum")))
    axes = literal(list(c.attr("axes")))
    return f"{fn}({c.i(0)}, {c.i(1)}, {c.i(2)}, {c.i(3)}, {c.i(4)}, {eps}, {mom}, {axes})"


@TORCH.register("LayerNormalization")
def _layer_norm(c: RuleCtx) -> str:
    shape = c.in_type(0).shape
    axis = int(c.attr("axis", -1)) % len(shape)
    bias = c.i(2) if c.has(2) else "None"
    eps = literal(float(c.attr("epsilon", 1e-5)))
    return f"F.layer_norm({c.i(0)}, {c.i(0)}.shape[{axis}:], {c.i(1)}, {bias}, {eps})"


@TORCH.register("Dropout")
def _dropout(c: RuleCtx) -> str:
    fn = c.use("_dropout")
    return f"{fn}({c.i(0)}, {c.i(1)}, rng, {literal(c.mask_key)})"


# -- pooling ---------------------------------------------------------------------------
@TORCH.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    k = list(c.attr("kernel_shape"))
    s = list(c.attr("strides", [1] * len(k)))
    pads = list(c.attr("pads", [0] * 2 * len(k)))
    x = c.i(0)
    padding = _symmetric(pads)
    if padding is None or any(p * 2 > kk for p, kk in zip(padding, k, strict=True)):
        x = f"F.pad({x}, {_torch_pad(pads)}, value=-float('inf'))"
        padding = [0] * len(k)
    dil = list(c.attr("dilations", [1] * len(k)))
    ceil = literal(bool(int(c.attr("ceil_mode", 0))))
    return f"F.max_pool2d({x}, {k}, {s}, {padding}, {dil}, ceil_mode={ceil})"


@TORCH.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    k = list(c.attr("kernel_shape"))
    s = list(c.attr("strides", [1] * len(k)))
    pads = list(c.attr("pads", [0] * 2 * len(k)))
    include = bool(int(c.attr("count_include_pad", 0)))
    x = c.i(0)
    padding = _symmetric(pads)
    ceil = literal(bool(int(c.attr("ceil_mode", 0))))
    if padding is None or any(p * 2 > kk for p, kk in zip(padding, k, strict=True)):
        total = f"F.avg_pool2d(F.pad({x}, {_torch_pad(pads)}), {k}, {s}, 0, ceil_mode={ceil})"
        if include:
            return total
        # padding the divisor leaves out (Keras' "same"): window sums over real counts
        ones = f"torch.ones_like({x}[:1, :1])"
        count = f"F.avg_pool2d(F.pad({ones}, {_torch_pad(pads)}), {k}, {s}, 0, ceil_mode={ceil})"
        return f"{total} / {count}"
    return (
        f"F.avg_pool2d({x}, {k}, {s}, {padding}, ceil_mode={ceil}, "
        f"count_include_pad={literal(include)})"
    )


@TORCH.register("GlobalAveragePool")
def _gap(c: RuleCtx) -> str:
    rank = len(c.in_type(0).shape)
    return f"{c.i(0)}.mean(dim={tuple(range(2, rank))}, keepdim=True)"


# -- reductions --------------------------------------------------------------------------
def _reduce_rule(method: str):  # noqa: ANN202 - a rule factory
    def rule(c: RuleCtx) -> str:
        keep = bool(int(c.attr("keepdims", 1)))
        axes = c.ints(1) if c.has(1) else None
        if c.has(1) and axes is None:
            raise NotImplementedError("torch: reduction over computed axes")
        if axes is None:
            rank = len(c.in_type(0).shape)
            axes = list(range(rank))
        if method == "prod":
            expr = c.i(0)
            for a in sorted((a % len(c.in_type(0).shape) for a in axes), reverse=True):
                expr = f"torch.prod({expr}, dim={a}, keepdim={literal(keep)})"
            return expr
        return f"torch.{method}({c.i(0)}, dim={tuple(axes)}, keepdim={literal(keep)})"

    return rule


for _op, _method in {
    "ReduceMean": "mean",
    "ReduceSum": "sum",
    "ReduceMax": "amax",
    "ReduceMin": "amin",
    "ReduceProd": "prod",
}.items():
    TORCH.add(_op, _reduce_rule(_method))


@TORCH.register("ArgMax")
def _argmax(c: RuleCtx) -> str:
    keep = literal(bool(int(c.attr("keepdims", 1))))
    return f"torch.argmax({c.i(0)}, dim={int(c.attr('axis', 0))}, keepdim={keep})"


# -- shapes ------------------------------------------------------------------------------
@TORCH.register("Reshape")
def _reshape(c: RuleCtx) -> str:
    shape = c.ints(1)
    if shape is not None and 0 in shape:
        raise NotImplementedError("torch: Reshape with 0 (copy) dims")
    target = shape if shape is not None else f"{c.i(1)}.tolist()"
    return f"torch.reshape({c.i(0)}, {target})"


@TORCH.register("Transpose")
def _transpose(c: RuleCtx) -> str:
    return f"{c.i(0)}.permute({list(c.attr('perm'))})"


@TORCH.register("Concat")
def _concat(c: RuleCtx) -> str:
    parts = ", ".join(c.i(k) for k in range(len(c.node.inputs)))
    return f"torch.cat([{parts}], dim={int(c.attr('axis'))})"


@TORCH.register("Split")
def _split(c: RuleCtx) -> str:
    sizes = c.ints(1)
    axis = int(c.attr("axis", 0))
    if sizes is None:
        n = int(c.attr("num_outputs", len(c.node.outputs)))
        return f"torch.tensor_split({c.i(0)}, {n}, dim={axis})"
    return f"torch.split({c.i(0)}, {sizes}, dim={axis})"


@TORCH.register("Slice")
def _slice(c: RuleCtx) -> str:
    steps = c.ints(4) if c.has(4) else None
    if steps and any(st < 0 for st in steps):
        raise NotImplementedError("torch: Slice with a negative step")
    return slice_expr(c, "torch")


@TORCH.register("Gather")
def _gather(c: RuleCtx) -> str:
    axis = int(c.attr("axis", 0)) % len(c.in_type(0).shape)
    idx = c.const(1)
    index = literal(idx.tolist()) if idx is not None and idx.ndim == 0 else c.i(1)
    return f"{c.i(0)}[{', '.join([':'] * axis + [index])}]"


@TORCH.register("Unsqueeze")
def _unsqueeze(c: RuleCtx) -> str:
    axes = c.ints(1)
    if axes is None:
        raise NotImplementedError("torch: Unsqueeze with computed axes")
    rank = len(c.out_type().shape)
    y = c.i(0)
    for a in sorted(a % rank for a in axes):
        y = f"{y}.unsqueeze({a})"
    return y


@TORCH.register("Squeeze")
def _squeeze(c: RuleCtx) -> str:
    axes = c.ints(1) if c.has(1) else None
    return f"{c.i(0)}.squeeze({tuple(axes)})" if axes else f"{c.i(0)}.squeeze()"


@TORCH.register("Expand")
def _expand(c: RuleCtx) -> str:
    # ONNX Expand broadcasts both ways; Tensor.expand only widens.
    shape = c.ints(1)
    target = literal(shape) if shape is not None else f"{c.i(1)}.tolist()"
    x = c.i(0)
    return f"{x}.expand(torch.broadcast_shapes({x}.shape, {target}))"


@TORCH.register("Pad")
def _pad(c: RuleCtx) -> str:
    pads = c.ints(1)
    if pads is None or c.has(3) or c.attr("mode", "constant") != "constant":
        raise NotImplementedError("torch: Pad other than constant with constant pads")
    value = f", value=float({c.i(2)})" if c.has(2) else ""
    return f"F.pad({c.i(0)}, {_torch_pad(pads)}{value})"


@TORCH.register("Tile")
def _tile(c: RuleCtx) -> str:
    reps = c.ints(1)
    return f"{c.i(0)}.repeat({reps if reps is not None else f'{c.i(1)}.tolist()'})"


@TORCH.register("Shape")
def _shape(c: RuleCtx) -> str:
    start, end = c.attr("start"), c.attr("end")
    sl = f"[{'' if start is None else start}:{'' if end is None else end}]"
    return f"torch.tensor({c.i(0)}.shape{sl}, dtype=torch.int64)"


@TORCH.register("ConstantOfShape")
def _constant_of_shape(c: RuleCtx) -> str:
    dt = c.out_type().dtype
    return f"torch.full({c.i(0)}.tolist(), {literal(c.attr('value', 0.0))}, dtype={_dt(dt)})"


# -- losses ---------------------------------------------------------------------------------
@TORCH.register("NegativeLogLikelihoodLoss")
def _nll(c: RuleCtx) -> str:
    weight = c.i(2) if c.has(2) else "None"
    ignore = c.attr("ignore_index")
    ignore_arg = f", ignore_index={int(ignore)}" if ignore is not None else ""
    reduction = literal(str(c.attr("reduction", "mean")))
    return f"F.nll_loss({c.i(0)}, {c.i(1)}, {weight}{ignore_arg}, reduction={reduction})"


TORCH.not_yet("tracelog.Unsupported", reason="the source op could not be recorded")

HELPERS: dict[str, str] = {  # emitted into a program only when a rule uses them
    "_batch_norm_train": '''
def _batch_norm_train(x, scale, bias, running_mean, running_var, eps, momentum, axes):
    """Batch norm in training mode: batch statistics over `axes`; returns the
    output and the updated running statistics (unbiased variance)."""
    channel = [d for d in range(x.dim()) if d not in axes]
    if channel == [1]:
        new_mean, new_var = running_mean.clone(), running_var.clone()
        y = F.batch_norm(x, new_mean, new_var, scale, bias, True, momentum, eps)
        return y, new_mean, new_var
    shape = [1] * x.dim()
    shape[channel[0]] = -1
    var, mean = torch.var_mean(x, dim=axes, unbiased=False)
    y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    n = x.numel() // mean.numel()
    new_mean = (1 - momentum) * running_mean + momentum * mean.detach()
    new_var = (1 - momentum) * running_var + momentum * var.detach() * n / (n - 1)
    return y, new_mean, new_var
''',
    "_dropout": '''
def _dropout(x, rate, rng, key):
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        mask = torch.as_tensor(rng[key]).to(x.dtype)
    else:
        keep = torch.rand(x.shape, generator=rng, dtype=x.dtype) >= rate
        mask = keep.to(x.dtype)
    return x * (mask / (1.0 - rate)), mask > 0
''',
}


def target():  # noqa: ANN201 - a Target, built on use to keep imports light
    from tracelog.emit.program import Target

    return Target(
        name="torch",
        title="PyTorch",
        table=TORCH,
        helpers=HELPERS,
        reserved=IMPORTS,
        template="torch.py.j2",
        file_name="program_torch.py",
        const_expr="torch.tensor({value}, dtype=torch.{dtype})",
        layout_note=(
            "Layout: the recording was channels-last (NHWC); this program runs NCHW\n"
            "inside. Transposes kept, per function:\n{layout}"
        ),
        passes=(to_channels_first,),
    )
