"""The PyTorch target: how eager PyTorch (torch.nn.functional) spells each IR op.

Templates use the fields of the shared op table (`tracelog.emit.rules`);
functions are kept for what a template cannot say. Parameters are
torch.nn.Parameter, so the program trains as it stands. Graphs recorded
channels-last (Keras) run NCHW inside (the layout pass). This module writes
text only: it never imports torch.
"""

from __future__ import annotations

from tracelog.emit.program import Target
from tracelog.emit.rules import (
    PYTHON_BASE,
    Each,
    RuleCtx,
    Spellings,
    last_dim_first,
    not_yet_everywhere,
    scaled_gemm,
)
from tracelog.passes.layout import to_channels_first

TORCH = Spellings("torch", base=PYTHON_BASE)
TARGET = Target(
    "torch",
    TORCH,
    "tracelog.emit.runtime.torch_program",
    "torch.tensor({value}, dtype=torch.{dtype})",
    (to_channels_first,),
)

TORCH.spell(
    {
        "Relu": "torch.relu({0})",
        "Tanh": "torch.tanh({0})",
        "Sigmoid": "torch.sigmoid({0})",
        "Sqrt": "torch.sqrt({0})",
        "Exp": "torch.exp({0})",
        "Log": "torch.log({0})",
        "Abs": "torch.abs({0})",
        "Neg": "torch.neg({0})",
        "Reciprocal": "torch.reciprocal({0})",
        "Erf": "torch.erf({0})",
        "Softplus": "F.softplus({0})",
        "Floor": "torch.floor({0})",
        "Ceil": "torch.ceil({0})",
        "Not": "torch.logical_not({0})",
        "Identity": "{0}",
        "Pow": "torch.pow({0}, {1})",
        "Div/int": "torch.div({0}, {1}, rounding_mode='trunc')",
        "Equal": "torch.eq({0}, {1})",
        "Less": "torch.lt({0}, {1})",
        "Greater": "torch.gt({0}, {1})",
        "And": "torch.logical_and({0}, {1})",
        "Or": "torch.logical_or({0}, {1})",
        "Max": "torch.maximum({0}, {1})",
        "Min": "torch.minimum({0}, {1})",
        "Celu": "F.celu({0}, {alpha})",
        "LeakyRelu": "F.leaky_relu({0}, {alpha})",
        # fused kernels (issue 15): F.gelu, torch.softmax/log_softmax, F.batch_norm, F.layer_norm
        # and F.group_norm: ATen's own kernels, whatever the source wrote out
        "Gelu": "F.gelu({0}, approximate={approximate})",
        "Clip": "torch.clamp({0}, {lo}, {hi})",
        "Where": "torch.where({0}, {1}, {2})",
        "Cast": "{0}.to(torch.{to})",
        "Softmax": "torch.softmax({0}, {axis})",
        "LogSoftmax": "torch.log_softmax({0}, {axis})",
        "MatMul": "torch.matmul({0}, {1})",
        "Einsum": "torch.einsum({equation}, {operands})",
        "tracelog.StopGradient": "{0}.detach()",
        "tracelog.SiLU": "F.silu({0})",
        "tracelog.Log1p": "torch.log1p({0})",
        "tracelog.Expm1": "torch.expm1({0})",
        "BatchNormalization": "F.batch_norm({0}, {3}, {4}, {1}, {2}, False, 0.0, {eps})",
        "tracelog.BatchNormTraining": (
            "_batch_norm_train({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {axes})"
        ),
        # Keras' update (tracelog.ops BatchNormTraining: decay, unbiased)
        "tracelog.BatchNormTraining/weighted": (
            "_batch_norm_train_weighted({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {decay}, "
            "{unbiased}, {axes})"
        ),
        "LayerNormalization": "F.layer_norm({0}, {0}.shape[{axis}:], {1}, {bias}, {eps})",
        "Dropout": "_dropout({0}, {1}, rng, {key})",
        "RandomUniformLike": "_uniform({0}, {low}, {high}, rng, {key})",
        "RandomNormalLike": "_normal({0}, {mean}, {scale}, rng, {key})",
        "tracelog.RandomExponentialLike": "_exponential({0}, rng, {key})",
        "ReduceMean": "torch.mean({0}, dim={dims}, keepdim={keep})",
        "ReduceSum": "torch.sum({0}, dim={dims}, keepdim={keep})",
        "ReduceMax": "torch.amax({0}, dim={dims}, keepdim={keep})",
        "ReduceMin": "torch.amin({0}, dim={dims}, keepdim={keep})",
        "ArgMax": "torch.argmax({0}, dim={axis}, keepdim={keep})",
        "GlobalAveragePool": "{0}.mean(dim={axes_t}, keepdim=True)",
        "Transpose": "{0}.permute({perm})",
        "Concat": "torch.cat([{parts}], dim={axis})",
        "Shape": "torch.tensor({0}.shape{range}, dtype=torch.int64)",
        "Slice": "{0}[{index}]",
        "ConstantOfShape": "torch.full({0}.tolist(), {value}, dtype=torch.{dtype})",
        "ReduceProd": Each("dims_desc", "torch.prod({0}, dim={it}, keepdim={keep})"),
        "Reshape": "torch.reshape({0}, {ints})",
        "Reshape/operand": "torch.reshape({0}, {1}.tolist())",
        "Reshape/unit_dims": "{0}[{index}]",
        "Split": "torch.split({0}, {sizes}, dim={axis})",
        "Split/even": "torch.tensor_split({0}, {n}, dim={axis})",
        "Gather": "{0}[{lead}{index}]",
        "Unsqueeze": Each("axes", "{0}.unsqueeze({it})"),
        "Squeeze": "{0}.squeeze({axes_t})",
        "Squeeze/all": "{0}.squeeze()",
        # ONNX Expand broadcasts both ways; Tensor.expand only widens.
        "Expand": "{0}.expand(torch.broadcast_shapes({0}.shape, {ints}))",
        "Expand/operand": "{0}.expand(torch.broadcast_shapes({0}.shape, {1}.tolist()))",
        "Tile": "{0}.repeat({ints})",
        "Tile/operand": "{0}.repeat({1}.tolist())",
        "Pad": "F.pad({0}, {last_first})",
        "Pad/valued": "F.pad({0}, {last_first}, value=float({2}))",
        "NegativeLogLikelihoodLoss": "F.nll_loss({0}, {1}, {weight}, reduction={reduction})",
        "NegativeLogLikelihoodLoss/ignore": (
            "F.nll_loss({0}, {1}, {weight}, ignore_index={ignore}, reduction={reduction})"
        ),
    }
)
not_yet_everywhere(TORCH)
TORCH.not_yet("Slice/reversed", reason="torch tensors take no negative slice step")
TORCH.add("Slice/flip", "torch.flip({0}, {flip})")  # whole axes reversed (Keras go_backwards)


def _symmetric(pads: list[int]) -> list[int] | None:
    half = len(pads) // 2
    return pads[:half] if pads[:half] == pads[half:] else None


def _pool_padding(c: RuleCtx) -> list[int] | None:
    """F.*_pool2d's symmetric padding, or None where the pads need F.pad first
    (asymmetric, or more than half the window, which F.*_pool2d refuses)."""
    padding = _symmetric(c.f["pads"])
    if padding is None or any(p * 2 > k for p, k in zip(padding, c.f["kernel"], strict=True)):
        return None
    return padding


@TORCH.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    a = f"{c.i(0)}.T" if c.f["transA"] else c.i(0)
    if c.f["transB"] and not c.f["transA"] and c.f["alpha"] == 1.0 and c.f["beta"] == 1.0:
        bias = f", {c.i(2)}" if c.has(2) else ""
        return f"F.linear({a}, {c.i(1)}{bias})"  # a Linear layer, as PyTorch writes it
    b = f"{c.i(1)}.T" if c.f["transB"] else c.i(1)
    return scaled_gemm(c, f"torch.matmul({a}, {b})")


@TORCH.register("Conv")
def _conv(c: RuleCtx) -> str:
    n = c.rank() - 2
    if n not in (1, 2, 3):
        raise NotImplementedError("Conv of this rank")
    x = c.i(0)
    padding = _symmetric(c.f["pads"])
    if padding is None:
        x = f"F.pad({x}, {last_dim_first(c.f['pads'])})"
        padding = [0] * n
    # as PyTorch code writes it: the arguments at their defaults left out
    args = [x, c.i(1), *([c.i(2)] if c.has(2) else [])]
    strides, dilations, group = c.f["strides"], c.f["dilations"], c.f["group"]
    args += [f"stride={strides}"] if any(s != 1 for s in strides) else []
    args += [f"padding={padding}"] if any(padding) else []
    args += [f"dilation={dilations}"] if any(d != 1 for d in dilations) else []
    if group != 1:
        args.append(f"groups={_groups(c, group)}")
    return f"F.conv{n}d({', '.join(args)})"


def _groups(c: RuleCtx, group: int) -> str:
    """A depthwise convolution's groups as its input's channels (the same
    number, and the same text for every width: layers of other widths share
    a kind's function); any other group count as the number."""
    return f"{c.i(0)}.shape[1]" if c.in_type(0).shape[1] == group else str(group)


@TORCH.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    k, s, x = c.f["kernel"], c.f["strides"], c.i(0)
    padding = _pool_padding(c)
    if padding is None:
        x = f"F.pad({x}, {last_dim_first(c.f['pads'])}, value=-float('inf'))"
        padding = [0] * len(k)
    n = len(k)
    return f"F.max_pool{n}d({x}, {k}, {s}, {padding}, {c.f['dilations']}, ceil_mode={c.f['ceil']})"


@TORCH.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    k, s, x, ceil = c.f["kernel"], c.f["strides"], c.i(0), c.f["ceil"]
    pool = f"F.avg_pool{len(k)}d"
    padding = _pool_padding(c)
    if padding is not None:
        return (
            f"{pool}({x}, {k}, {s}, {padding}, ceil_mode={ceil}, "
            f"count_include_pad={c.f['include_pad']})"
        )
    pads = last_dim_first(c.f["pads"])
    total = f"{pool}(F.pad({x}, {pads}), {k}, {s}, 0, ceil_mode={ceil})"
    if c.f["include_pad"]:
        return total
    # padding the divisor leaves out (Keras' "same"): window sums over real counts
    ones = f"torch.ones_like({x}[:1, :1])"
    return f"{total} / {pool}(F.pad({ones}, {pads}), {k}, {s}, 0, ceil_mode={ceil})"


# -- vision: group norm, transposed convolution, resize (issue 12) --
def _conv_transpose(c: RuleCtx) -> str:
    n = c.rank() - 2
    if n not in (1, 2, 3):
        raise NotImplementedError("ConvTranspose of this rank")
    f = c.f
    s, d, op, g = f["strides"], f["dilations"], f["output_padding"], f["group"]
    call = f"F.conv_transpose{n}d({c.i(0)}, {c.i(1)}"
    padding = _symmetric(f["pads"])
    # torch takes symmetric padding, and output_padding smaller than stride or dilation
    if padding is not None and all(p < max(a, b) for p, a, b in zip(op, s, d, strict=True)):
        return (
            f"{call}, {f['bias']}, stride={s}, padding={padding}, output_padding={op}, "
            f"groups={g}, dilation={d})"
        )
    # else the full output, cropped by the pads: output_padding positions are kept back
    # from the end crop, zeros where it runs out (no input reaches them); then the bias
    ends = [f["pads"][n + i] - op[i] for i in range(n)]
    crop = ", ".join(f"{f['pads'][i]}:{-e if e > 0 else ''}" for i, e in enumerate(ends))
    y = f"{call}, None, stride={s}, groups={g}, dilation={d})[:, :, {crop}]"
    if any(e < 0 for e in ends):
        y = f"F.pad({y}, {[x for e in reversed(ends) for x in (0, max(-e, 0))]})"
    return y if not c.has(2) else f"{y} + {c.i(2)}.reshape(1, -1{', 1' * n})"


_INTERPOLATE = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _resize(c: RuleCtx) -> str:
    """F.interpolate, for the forms it computes: 'nearest' is asymmetric +
    floor, 'nearest-exact' half_pixel + round_prefer_ceil, the linear modes
    half_pixel (align_corners=False) or align_corners, 'bicubic' Keys' a =
    -0.75. Given a scale factor, torch maps coordinates by 1 / scale (ONNX
    divides by scale: the same up to rounding)."""
    axes = c.f["axes"]
    n = len(axes)
    mode = str(c.attr("mode", "nearest"))
    coord = str(c.attr("coordinate_transformation_mode", "half_pixel"))
    nearest = str(c.attr("nearest_mode", "round_prefer_floor"))
    align = coord == "align_corners"
    if mode == "nearest" and (coord, nearest) == ("asymmetric", "floor"):
        how = "mode='nearest'"
    elif mode == "nearest" and (coord, nearest) == ("half_pixel", "round_prefer_ceil"):
        how = "mode='nearest-exact'"
    elif mode == "linear" and coord != "asymmetric" and n in _INTERPOLATE:
        how = f"mode={_INTERPOLATE[n]!r}, align_corners={align}"
    elif (
        mode == "cubic"
        and coord != "asymmetric"
        and n == 2
        and c.attr("cubic_coeff_a")
        in (
            None,
            -0.75,
        )
    ):
        how = f"mode='bicubic', align_corners={align}"
    else:
        raise NotImplementedError(f"Resize ({mode}, {coord}, {nearest}) has no torch kernel")
    if c.f["sizes"] is None and align:
        # ONNX's align_corners length is in * scale before its floor; torch's is out
        raise NotImplementedError("Resize with align_corners given by scales")
    if axes != list(range(2, c.rank())):  # not the spatial axes of [N, C, ...]
        return f"_resize_axes({c.i(0)}, {axes}, {c.f['sizes']}, {c.f['scales']}, {how})"
    if c.f["sizes"] is not None:
        return f"F.interpolate({c.i(0)}, size={c.f['sizes']}, {how})"
    return f"F.interpolate({c.i(0)}, scale_factor={c.f['scales']}, {how})"


TORCH.spell(
    {
        "GroupNormalization": "F.group_norm({0}, {groups}, {1}, {2}, {eps})",
        "ConvTranspose": _conv_transpose,
        "Resize": _resize,
    }
)


# -- attention, masks and indexing (issue 12) ---------------------------------------------
TORCH.spell(
    {
        "Sin": "torch.sin({0})",
        "Cos": "torch.cos({0})",
        "LessOrEqual": "torch.le({0}, {1})",
        "GreaterOrEqual": "torch.ge({0}, {1})",
        "Xor": "torch.logical_xor({0}, {1})",
        "BitwiseAnd": "torch.bitwise_and({0}, {1})",
        "BitwiseOr": "torch.bitwise_or({0}, {1})",
        "BitwiseXor": "torch.bitwise_xor({0}, {1})",
        "BitwiseNot": "torch.bitwise_not({0})",
        "Mod": "torch.remainder({0}, {1})",  # the divisor's sign, as ONNX Mod (fmod=0)
        "Trilu": "torch.{tri}({0}, {k})",
        # torch.cumsum widens small integers to int64; ONNX CumSum keeps the dtype
        "CumSum": "torch.cumsum({0}, {axis}, dtype={0}.dtype)",
        "GatherElements": "torch.gather({0}, {axis}, {1})",
        "Compress": "{0}[{lead}{1}]",
        "NonZero": "torch.nonzero({0}).T",
        "TopK": "_topk({0}, {k}, {axis}, {largest})",
        "ScatterElements": "torch.scatter({0}, {axis}, {1}, {2})",
        "ScatterElements/add": "torch.scatter_add({0}, {axis}, {1}, {2})",
        "ScatterElements/mul": "torch.scatter_reduce({0}, {axis}, {1}, {2}, 'prod')",
        "ScatterElements/max": "torch.scatter_reduce({0}, {axis}, {1}, {2}, 'amax')",
        "ScatterElements/min": "torch.scatter_reduce({0}, {axis}, {1}, {2}, 'amin')",
    }
)


# -- recurrent layers (issue 12) --
TORCH.spell(
    {
        "LSTM": "_lstm({0}, {1}, {2}, {bias}, {h0}, {c0}, {direction}{extra}){take}",
        "GRU": "_gru({0}, {1}, {2}, {bias}, {h0}, {direction}{extra}){take}",
        "RNN": "_rnn({0}, {1}, {2}, {bias}, {h0}, {direction}, {activation}{extra}){take}",
    }
)


# -- scaled dot-product attention (issue 15) --
@TORCH.register("tracelog.Attention")
def _attention(c: RuleCtx) -> str:
    """F.scaled_dot_product_attention: ATen's fused kernel (flash on CPU, the
    CUDA kernels on a GPU), whose masked-out rows give 0 as the op's do. A
    mask and is_causal together (torch takes one) are one mask."""
    mask, causal = c.f["mask"], c.f["causal"]
    if causal and c.has(3):
        mask, causal = f"_causal_masked({mask}, {c.i(0)}, {c.i(1)})", False
    args = [c.i(0), c.i(1), c.i(2)]
    args += [f"attn_mask={mask}"] if c.has(3) else ["is_causal=True"] if causal else []
    return f"F.scaled_dot_product_attention({', '.join(args)}, scale={c.f['scale']})"


# -- element-wise math: trigonometric and hyperbolic functions, rounding, special
# functions, running products (each the framework's own kernel) --
TORCH.spell(
    {
        "Tan": "torch.tan({0})",
        "Asin": "torch.asin({0})",
        "Acos": "torch.acos({0})",
        "Atan": "torch.atan({0})",
        "Sinh": "torch.sinh({0})",
        "Cosh": "torch.cosh({0})",
        "Asinh": "torch.asinh({0})",
        "Acosh": "torch.acosh({0})",
        "Atanh": "torch.atanh({0})",
        "Round": "torch.round({0})",
        "IsNaN": "torch.isnan({0})",
        "IsInf": "torch.isinf({0})",
        "IsInf/pos": "torch.isposinf({0})",
        "IsInf/neg": "torch.isneginf({0})",
        "Mod/fmod": "torch.fmod({0}, {1})",
        "tracelog.Atan2": "torch.atan2({0}, {1})",
        "tracelog.Hypot": "torch.hypot({0}, {1})",
        "tracelog.Erfc": "torch.special.erfc({0})",
        "tracelog.Lgamma": "torch.lgamma({0})",
        "Det": "torch.linalg.det({0})",
        "tracelog.Inverse": "torch.linalg.inv({0})",
        "tracelog.Solve": "torch.linalg.solve({0}, {1})",
        "tracelog.SlogDet": "torch.linalg.slogdet({0})",
        "tracelog.Cholesky": "torch.linalg.cholesky({0})",
        "tracelog.SolveTriangular": "torch.linalg.solve_triangular({0}, {1}, upper={upper})",
        "tracelog.Digamma": "torch.digamma({0})",
        "tracelog.Trigamma": "torch.special.polygamma(1, {0})",
        "tracelog.Erfinv": "torch.special.erfinv({0})",
        "tracelog.Ndtri": "torch.special.ndtri({0})",
        "tracelog.LogNdtr": "torch.special.log_ndtr({0})",
        "tracelog.I0": "torch.special.i0({0})",
        "tracelog.I0e": "torch.special.i0e({0})",
        "tracelog.I1": "torch.special.i1({0})",
        "tracelog.I1e": "torch.special.i1e({0})",
        "tracelog.CumProd": "torch.cumprod({0}, {axis})",
    }
)


# -- CTC loss: torch's own kernel, unreduced (the reduction is the graph's ops after it)
TORCH.spell(
    {
        "tracelog.CTCLoss": (
            "F.ctc_loss({0}, {1}, {2}, {3}, blank={blank}, reduction='none', "
            "zero_infinity={zero_infinity})"
        ),
    }
)
