"""The JAX target: how jax.numpy, jax.nn and jax.lax spell each IR op.

Templates use the fields of the shared op table (`tracelog.emit.rules`);
functions are kept for what a template cannot say. The emitted functions are
pure functions of a params pytree, so they work under jax.jit and jax.grad.
Programs enable 64-bit types (int64 indices and counters stay int64); every
float constant carries its dtype, so float32 graphs stay float32. Shapes are
NumPy values, static under jax.jit.
"""

from __future__ import annotations

import math

from tracelog.emit.program import Target
from tracelog.emit.rules import (
    PYTHON_BASE,
    RuleCtx,
    Spellings,
    not_yet_everywhere,
    pool_ceil_extra,
    scaled_gemm,
)
from tracelog.passes.layout import to_channels_first

JAX = Spellings("jax", base=PYTHON_BASE)
# constants as NumPy arrays: static under jax.jit, dtype kept
TARGET = Target(
    "jax",
    JAX,
    "tracelog.emit.runtime.jax_program",
    "np.asarray({value}, dtype=np.{dtype})",
    (to_channels_first,),
    const_exprs={"bfloat16": "np.asarray({value}, dtype=jnp.bfloat16)"},
    data_dependent=(
        "# A graph selects by the data (a boolean mask, nonzero): its sizes are not static,\n"
        "# so jax.jit cannot trace it; the check and the step run op by op.\n"
        "STATIC_SHAPES = False"
    ),
)

JAX.spell(
    {
        "Relu": "jax.nn.relu({0})",
        "Tanh": "jnp.tanh({0})",
        "Sigmoid": "jax.nn.sigmoid({0})",
        "Sqrt": "jnp.sqrt({0})",
        "Exp": "jnp.exp({0})",
        "Log": "jnp.log({0})",
        "Abs": "jnp.abs({0})",
        "Neg": "jnp.negative({0})",
        "Reciprocal": "jnp.reciprocal({0})",
        "Erf": "lax.erf({0})",
        "Softplus": "jax.nn.softplus({0})",
        "Floor": "jnp.floor({0})",
        "Ceil": "jnp.ceil({0})",
        "Not": "jnp.logical_not({0})",
        "Identity": "{0}",
        "Pow": "jnp.power({0}, {1})",
        "Div/int": "lax.div({0}, {1})",  # truncates, as ONNX integer Div does
        "Equal": "jnp.equal({0}, {1})",
        "Less": "jnp.less({0}, {1})",
        "Greater": "jnp.greater({0}, {1})",
        "And": "jnp.logical_and({0}, {1})",
        "Or": "jnp.logical_or({0}, {1})",
        "Max": "jnp.maximum({0}, {1})",
        "Min": "jnp.minimum({0}, {1})",
        "Celu": "jax.nn.celu({0}, {alpha})",
        "LeakyRelu": "jax.nn.leaky_relu({0}, {alpha})",
        # fused kernels (issue 15): jax.nn.gelu, jax.nn.softmax / log_softmax; the normalisations
        # are runtime helpers (JAX has no batch/layer-norm primitive) over jnp.mean and lax
        "Gelu": "jax.nn.gelu({0}, approximate={tanh})",
        "Clip": "jnp.clip({0}, {lo}, {hi})",
        "Where": "jnp.where({0}, {1}, {2})",
        "Cast": "{0}.astype(jnp.{to})",
        "Softmax": "jax.nn.softmax({0}, axis={axis})",
        "LogSoftmax": "jax.nn.log_softmax({0}, axis={axis})",
        "MatMul": "jnp.matmul({0}, {1})",
        "Einsum": "jnp.einsum({equation}, {operands})",
        "tracelog.StopGradient": "lax.stop_gradient({0})",
        "tracelog.SiLU": "jax.nn.silu({0})",
        "tracelog.Log1p": "jnp.log1p({0})",
        "tracelog.Expm1": "jnp.expm1({0})",
        "BatchNormalization": "_batch_norm_eval({0}, {1}, {2}, {3}, {4}, {eps})",
        "tracelog.BatchNormTraining": (
            "_batch_norm_train({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {axes})"
        ),
        # Keras' update (tracelog.ops BatchNormTraining: decay, unbiased)
        "tracelog.BatchNormTraining/weighted": (
            "_batch_norm_train_weighted({0}, {1}, {2}, {3}, {4}, {eps}, {momentum}, {decay}, "
            "{unbiased}, {axes})"
        ),
        "LayerNormalization": "_layer_norm({0}, {1}, {bias}, {axes_t}, {eps})",
        "Dropout": "_dropout({0}, {1}, rng, {key})",
        "RandomUniformLike": "_uniform({0}, {low}, {high}, rng, {key})",
        "RandomNormalLike": "_normal({0}, {mean}, {scale}, rng, {key})",
        "tracelog.RandomExponentialLike": "_exponential({0}, rng, {key})",
        "GlobalAveragePool": "jnp.mean({0}, axis={axes_t}, keepdims=True)",
        "ReduceMean": "jnp.mean({0}, axis={axes_t}, keepdims={keep})",
        "ReduceSum": "jnp.sum({0}, axis={axes_t}, keepdims={keep})",
        "ReduceMax": "jnp.max({0}, axis={axes_t}, keepdims={keep})",
        "ReduceMin": "jnp.min({0}, axis={axes_t}, keepdims={keep})",
        "ReduceProd": "jnp.prod({0}, axis={axes_t}, keepdims={keep})",
        "ArgMax": "jnp.argmax({0}, axis={axis}, keepdims={keep})",
        "Concat": "jnp.concatenate([{parts}], axis={axis})",
        # a shape being assembled: NumPy keeps it static under jax.jit
        "Concat/shape": "np.concatenate([{parts}], axis=0)",
        "Slice": "{0}[{index}]",
        "Gather": "jnp.take({0}, {index}, axis={axis})",
        "NegativeLogLikelihoodLoss": "_nll_loss({0}, {1}, {weight}, {reduction}, {ignore})",
        # the static shape, as a NumPy array: it stays concrete under jax.jit
        "Shape": "np.asarray({0}.shape{range}, dtype=np.int64)",
        "Reshape": "jnp.reshape({0}, {ints_t})",
        "Reshape/operand": "jnp.reshape({0}, tuple({1}))",
        "Reshape/unit_dims": "{0}[{index}]",
        "Transpose": "jnp.transpose({0}, {perm_t})",
        "Split": "jnp.split({0}, {cuts}, axis={axis})",
        "Split/even": "jnp.array_split({0}, {n}, axis={axis})",
        "Unsqueeze": "jnp.expand_dims({0}, {axes_t})",
        "Squeeze": "jnp.squeeze({0}, axis={axes_t})",
        "Squeeze/all": "jnp.squeeze({0})",
        "Expand": "jnp.broadcast_to({0}, jnp.broadcast_shapes({0}.shape, {ints_t}))",
        "Expand/operand": "jnp.broadcast_to({0}, jnp.broadcast_shapes({0}.shape, tuple({1})))",
        "Tile": "jnp.tile({0}, {ints_t})",
        "Tile/operand": "jnp.tile({0}, tuple({1}))",
        "Pad": "jnp.pad({0}, {pairs_t})",
        "Pad/valued": "jnp.pad({0}, {pairs_t}, constant_values={2})",
        "ConstantOfShape": (
            "jnp.full(tuple(np.asarray({0}).tolist()), {value}, dtype=jnp.{dtype})"
        ),
    }
)
not_yet_everywhere(JAX)


@JAX.register("Gemm")
def _gemm(c: RuleCtx) -> str:
    a = f"{c.i(0)}.T" if c.f["transA"] else c.i(0)
    b = f"{c.i(1)}.T" if c.f["transB"] else c.i(1)
    product = f"{a} @ {b}" if c.f["alpha"] == 1.0 else f"({a} @ {b})"
    return scaled_gemm(c, product)


def _groups(c: RuleCtx) -> str:
    """A depthwise convolution's group count as its input's channels (the
    same text for every width: layers of other widths share a function)."""
    group = c.f["group"]
    return f"{c.i(0)}.shape[1]" if group != 1 and c.in_type(0).shape[1] == group else str(group)


@JAX.register("Conv")
def _conv(c: RuleCtx) -> str:
    n = c.rank() - 2
    if not 1 <= n <= 3:
        raise NotImplementedError(f"{n}-D Conv")
    p, spatial = c.f["pads"], "DHW"[3 - n :]
    edges = [f"({p[i]}, {p[i + n]})" for i in range(n)]
    padding = f"({edges[0]},)" if n == 1 else f"({', '.join(edges)})"
    y = (
        f"lax.conv_general_dilated({c.i(0)}, {c.i(1)}, "
        f"window_strides={tuple(c.f['strides'])}, "
        f"padding={padding}, "
        f"rhs_dilation={tuple(c.f['dilations'])}, "
        f"dimension_numbers=('NC{spatial}', 'OI{spatial}', 'NC{spatial}'), "
        f"feature_group_count={_groups(c)})"
    )
    bias_shape = ", ".join(["1", "-1"] + ["1"] * n)
    return f"{y} + {c.i(2)}.reshape({bias_shape})" if c.has(2) else y


def _window(c: RuleCtx, pads: list[int] | None = None) -> str:
    """lax.reduce_window's window, strides and padding for an NC... pool
    (the node's pads unless given: ceil_mode's overhang is padding too)."""
    k, s, p = c.f["kernel"], c.f["strides"], c.f["pads"] if pads is None else pads
    n = len(k)
    edges = "".join(f", ({p[i]}, {p[i + n]})" for i in range(n))
    return f"{(1, 1, *k)}, {(1, 1, *s)}, ((0, 0), (0, 0){edges})"


def _ceil_pads(c: RuleCtx) -> tuple[list[int], list[int]]:
    """The node's pads with ceil_mode's overhang added past each end, and the
    overhang alone (as pads)."""
    n, pads = len(c.f["kernel"]), c.f["pads"]
    extra = pool_ceil_extra(c)
    return pads[:n] + [e + x for e, x in zip(pads[n:], extra, strict=True)], [0] * n + extra


@JAX.register("MaxPool")
def _max_pool(c: RuleCtx) -> str:
    if c.f["dilations"] != [1] * len(c.f["kernel"]):
        raise NotImplementedError("dilated MaxPool")
    return f"lax.reduce_window({c.i(0)}, -jnp.inf, lax.max, {_window(c, _ceil_pads(c)[0])})"


@JAX.register("AveragePool")
def _avg_pool(c: RuleCtx) -> str:
    pads, overhang = _ceil_pads(c)
    window, x, k = _window(c, pads), c.i(0), c.f["kernel"]
    total = f"lax.reduce_window({x}, 0.0, lax.add, {window})"
    if not any(overhang) and (c.f["include_pad"] or not any(pads)):
        return f"{total} / {math.prod(k)}"
    if not c.f["include_pad"]:
        return f"{total} / lax.reduce_window(jnp.ones_like({x}), 0.0, lax.add, {window})"
    # the divisor counts the padding, never ceil_mode's overhang
    n = len(k)
    edges = "".join(f", ({pads[i]}, {c.f['pads'][i + n]})" for i in range(n))
    ones = f"jnp.pad(jnp.ones_like({x}), ((0, 0), (0, 0){edges}), constant_values=1)"
    return f"{total} / lax.reduce_window({ones}, 0.0, lax.add, {_window(c, overhang)})"


# -- vision: group norm, transposed convolution, resize (issue 12) --
JAX.spell(
    {
        "GroupNormalization": "_group_norm({0}, {1}, {2}, {groups}, {eps}, {channel_axis})",
        "ConvTranspose": (
            "_conv_transpose({0}, {1}, {bias}, {strides}, {pads}, {dilations}, "
            "{output_padding}, {group})"
        ),
        "Resize": "_resize({0}, {axes}, {scales}, {sizes}, {mode}, {coord}, {nearest}, {cubic_a})",
    }
)


# -- attention, masks and indexing (issue 12) ---------------------------------------------
JAX.spell(
    {
        "Sin": "jnp.sin({0})",
        "Cos": "jnp.cos({0})",
        "LessOrEqual": "jnp.less_equal({0}, {1})",
        "GreaterOrEqual": "jnp.greater_equal({0}, {1})",
        "Xor": "jnp.logical_xor({0}, {1})",
        "BitwiseAnd": "jnp.bitwise_and({0}, {1})",
        "BitwiseOr": "jnp.bitwise_or({0}, {1})",
        "BitwiseXor": "jnp.bitwise_xor({0}, {1})",
        "BitwiseNot": "jnp.bitwise_not({0})",
        "Mod": "jnp.remainder({0}, {1})",  # the divisor's sign, as ONNX Mod (fmod=0)
        "Trilu": "jnp.{tri}({0}, {k})",
        "CumSum": "jnp.cumsum({0}, axis={axis}, dtype={0}.dtype)",
        "GatherElements": "jnp.take_along_axis({0}, {1}, axis={axis})",
        "Compress": "jnp.compress({1}, {0}, axis={axis})",
        "NonZero": "jnp.stack(jnp.nonzero({0})).astype(jnp.int64)",
        "TopK": "_topk({0}, {k}, {axis}, {largest})",
    }
)

_JAX_SCATTER = {"none": "set", "add": "add", "mul": "multiply", "max": "max", "min": "min"}


@JAX.register("ScatterElements")
def _scatter_elements(c: RuleCtx) -> str:
    # x.at[i_0, ..., index, ..., i_r]: the index along the axis, the grid elsewhere
    a, idx = c.f["axis"], c.i(1)
    grid = f"jnp.indices({idx}.shape, sparse=True)"
    where = f"{grid}[:{a}] + ({idx},) + {grid}[{a + 1}:]"
    return f"jnp.asarray({c.i(0)}).at[{where}].{_JAX_SCATTER[c.f['reduction']]}({c.i(2)})"


for _variant in ("add", "mul", "max", "min"):
    JAX.add(f"ScatterElements/{_variant}", _scatter_elements)


# -- recurrent layers (issue 12) --
JAX.spell(
    {
        "LSTM": "_lstm({0}, {1}, {2}, {bias}, {h0}, {c0}, {direction}{extra}){take}",
        "GRU": "_gru({0}, {1}, {2}, {bias}, {h0}, {direction}{extra}){take}",
        "RNN": "_rnn({0}, {1}, {2}, {bias}, {h0}, {direction}, {activation}{extra}){take}",
    }
)


# -- scaled dot-product attention (issue 15): _attention calls jax.nn.dot_product_attention
# where it means what the op means (see its docstring), and writes it out elsewhere
JAX.spell({"tracelog.Attention": "_attention({0}, {1}, {2}, {mask}, {scale}, {causal})"})


# -- element-wise math: trigonometric and hyperbolic functions, rounding, special
# functions, running products (each the framework's own kernel) --
JAX.spell(
    {
        "Tan": "jnp.tan({0})",
        "Asin": "jnp.arcsin({0})",
        "Acos": "jnp.arccos({0})",
        "Atan": "jnp.arctan({0})",
        "Sinh": "jnp.sinh({0})",
        "Cosh": "jnp.cosh({0})",
        "Asinh": "jnp.arcsinh({0})",
        "Acosh": "jnp.arccosh({0})",
        "Atanh": "jnp.arctanh({0})",
        "Round": "jnp.round({0})",
        "IsNaN": "jnp.isnan({0})",
        "IsInf": "jnp.isinf({0})",
        "IsInf/pos": "jnp.isposinf({0})",
        "IsInf/neg": "jnp.isneginf({0})",
        "Mod/fmod": "jnp.fmod({0}, {1})",
        "tracelog.Atan2": "jnp.arctan2({0}, {1})",
        "tracelog.Hypot": "jnp.hypot({0}, {1})",
        "tracelog.Erfc": "lax.erfc({0})",
        "tracelog.Lgamma": "lax.lgamma({0})",
        "Det": "jnp.linalg.det({0})",
        "tracelog.Inverse": "jnp.linalg.inv({0})",
        "tracelog.Solve": "jnp.linalg.solve({0}, {1})",
        "tracelog.SlogDet": "tuple(jnp.linalg.slogdet({0}))",
        "tracelog.Cholesky": "jnp.linalg.cholesky({0})",
        "tracelog.SolveTriangular": "lax.linalg.triangular_solve({0}, {1}, left_side=True, lower={lower})",
        "tracelog.SolveTriangular/broadcast": "_solve_triangular_broadcast({0}, {1}, {lower})",
        "tracelog.Digamma": "lax.digamma({0})",
        "tracelog.Trigamma": "lax.polygamma(jnp.ones_like({0}), {0})",
        # lax.erf_inv is 1e-10 off near +-1 in float64 (60 float32 ulp): beyond |x| = 1/2,
        # -ndtri((1 - |x|) / 2) / sqrt(2), 1 - |x| exact there (jax's ndtri keeps its digits)
        "tracelog.Erfinv": (
            "jnp.where(jnp.abs({0}) <= 0.5, lax.erf_inv(jnp.where(jnp.abs({0}) <= 0.5, {0}, 0.0)), "
            "jnp.sign({0}) * jax.scipy.special.ndtri(jnp.minimum(1 - jnp.abs({0}), 0.5) / 2) "
            "* -0.7071067811865476)"
        ),
        "tracelog.Ndtri": "jax.scipy.special.ndtri({0})",
        # log1p(-ndtr(-x)) above 0, where log_ndtr takes log(ndtr(x)) up to 8 (5 in float32)
        # and loses the digits of 1 - ndtr(x); 10 terms of its asymptotic series below -20
        "tracelog.LogNdtr": (
            "jnp.where({0} > 0, jnp.log1p(-jax.scipy.special.ndtr(-jnp.where({0} > 0, {0}, 0))), "
            "jax.scipy.special.log_ndtr(jnp.where({0} > 0, 0, {0}), series_order=10))"
        ),
        "tracelog.I0": "jax.scipy.special.i0({0})",
        "tracelog.I0e": "jax.scipy.special.i0e({0})",
        "tracelog.I1": "jax.scipy.special.i1({0})",
        "tracelog.I1e": "jax.scipy.special.i1e({0})",
        "tracelog.CumProd": "jnp.cumprod({0}, axis={axis})",
    }
)


# -- CTC loss: the runtime's alpha recursion in log space, a lax.scan over time
JAX.spell({"tracelog.CTCLoss": "_ctc_loss({0}, {1}, {2}, {3}, {blank}, {zero_infinity})"})
