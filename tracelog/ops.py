"""The op vocabulary: one schema per op.

Ops of the default domain ("") mean exactly what the ONNX specification says
at opset ONNX_OPSET. Where ONNX has no op with the meaning a framework
computes, the op lives in the "tracelog" domain and its meaning is written
down twice: in prose, and as an ONNX function body built only from standard
ops, so that onnx.reference and onnxruntime can still serve as oracles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Node(Protocol):
    """What the vocabulary reads of a node (tracelog.ir.Node has it); the
    vocabulary depends on nothing else in tracelog."""

    @property
    def op(self) -> str: ...
    @property
    def domain(self) -> str: ...
    @property
    def inputs(self) -> Sequence[str]: ...
    @property
    def outputs(self) -> Sequence[str]: ...
    @property
    def attrs(self) -> Mapping[str, object]: ...


ONNX_OPSET = 21
ONNX_IR_VERSION = 10  # the IR version that goes with opset 21
TRACELOG_DOMAIN = "tracelog"
TRACELOG_OPSET = 1


@dataclass(frozen=True)
class OpSchema:
    name: str
    inputs: tuple[str, ...]  # "name?" optional, "name*" variadic
    outputs: tuple[str, ...]  # "name?" optional
    attrs: tuple[str, ...] = ()
    domain: str = ""
    # ONNX's default of each optional numeric attribute that has one (emitters' fields)
    defaults: tuple[tuple[str, float | int], ...] = ()
    # what passes may assume about the op (TRAITS); passes read these, not op-name lists
    traits: frozenset[str] = frozenset()
    doc: str = ""
    function: str | None = field(default=None, compare=False)  # ONNX text body
    # attributes whose default follows from the others (BatchNormTraining's decay is
    # 1 - momentum): the ONNX function body takes every attribute it reads explicitly
    derived: Callable[[Mapping[str, object]], dict[str, object]] | None = field(
        default=None, compare=False
    )
    # a tracelog op without a function: why ONNX export refuses it (the support table)
    no_function: str = field(default="", compare=False)

    def explicit_attrs(self, attrs: Mapping[str, object]) -> dict[str, object]:
        """``attrs`` with the derived defaults filled in (tracelog.emit.onnx)."""
        return {**(self.derived(attrs) if self.derived else {}), **attrs}

    @property
    def qualified(self) -> str:
        return f"{self.domain}.{self.name}" if self.domain else self.name

    def check_arity(self, node: Node) -> None:
        if self.name == "Unsupported" and self.domain == TRACELOG_DOMAIN:
            return
        required = sum(1 for i in self.inputs if not i.endswith(("?", "*")))
        variadic = any(i.endswith("*") for i in self.inputs)
        if len(node.inputs) < required or (not variadic and len(node.inputs) > len(self.inputs)):
            raise ValueError(f"{self.qualified} takes {self.inputs}, got {len(node.inputs)} inputs")
        variadic_out = any(o.endswith("*") for o in self.outputs)
        if len(node.outputs) < 1 or (not variadic_out and len(node.outputs) > len(self.outputs)):
            raise ValueError(
                f"{self.qualified} gives {self.outputs}, got {len(node.outputs)} outputs"
            )
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise ValueError(f"{self.qualified} has no attribute(s) {sorted(unknown)}")


TRAITS = {
    # y[i] = f(x1[i], x2[i], ...) over broadcast inputs, deterministic: a transpose of the
    # inputs commutes with the op (the layout pass moves transposes through it)
    "elementwise": "deterministic per-element function of its (broadcast) inputs",
    # data input 0, axes input 1 (constant axes can be permuted with the data)
    "reduction": "reduces input 0 over the axes given as input 1",
    # row-major order is all the op keeps: a Reshape of its output is one of its input
    "reshape": "changes only the shape of input 0, keeping row-major element order",
    # input 0 is NCHW data; the op can run channels-last (attribute channels_last)
    "channels_first": "reads input 0 as channels-first and can run channels-last",
    # draws a random mask each run: the recorded sample keeps the mask, in node order
    "random": "draws a random mask; the sample keeps it so a replay reproduces the batch",
    # an output's size is the data's (a boolean selection): no static shape to trace
    "data_dependent": "an output's size depends on the input values, not their shapes",
}

OPS: dict[tuple[str, str], OpSchema] = {}


def define(schema: OpSchema) -> OpSchema:
    key = (schema.domain, schema.name)
    if key in OPS:
        raise ValueError(f"op {schema.qualified} is defined twice")
    unknown = schema.traits - TRAITS.keys()
    if unknown:
        raise ValueError(f"op {schema.qualified} has unknown traits {sorted(unknown)}")
    OPS[key] = schema
    return schema


def schema_for(domain: str, name: str) -> OpSchema:
    try:
        return OPS[(domain, name)]
    except KeyError:
        raise NotImplementedError(
            f"op {domain + '.' if domain else ''}{name} is not in the vocabulary"
        ) from None


def traits_of(node: Node) -> frozenset[str]:
    """The traits of a node's op; none for an op outside the vocabulary."""
    schema = OPS.get((node.domain, node.op))
    return schema.traits if schema is not None else frozenset()


def is_random(node: Node) -> bool:
    """The node draws at random (Dropout's mask, RandomUniformLike's values):
    the sample keeps its draw, one per such node in node order, and a replay
    feeds it back (tracelog.sample.mask_key)."""
    return "random" in traits_of(node)


def _onnx(
    name: str, inputs: str, outputs: str, attrs: str = "", doc: str = "", traits: str = ""
) -> None:
    """An ONNX op; attributes written "alpha=0.01" carry ONNX's default."""
    names = tuple(a.partition("=")[0] for a in attrs.split())
    defaults = tuple(
        (key, float(value) if "." in value else int(value))
        for key, _, value in (a.partition("=") for a in attrs.split())
        if value
    )
    define(
        OpSchema(
            name,
            tuple(inputs.split()),
            tuple(outputs.split()),
            names,
            doc=doc or f"ONNX {name}, opset {ONNX_OPSET}.",
            defaults=defaults,
            traits=frozenset(traits.split()),
        )
    )


# -- ONNX ops, grouped as the spec groups them ---------------------------------
for _name in (
    "Relu Tanh Sigmoid Sqrt Exp Log Abs Neg Reciprocal Erf Softplus Identity Not Floor Ceil"
).split():
    _onnx(_name, "X", "Y", traits="elementwise")
_onnx("Celu", "X", "Y", "alpha=1.0", traits="elementwise")
_onnx("LeakyRelu", "X", "Y", "alpha=0.01", traits="elementwise")
_onnx("Gelu", "X", "Y", "approximate", traits="elementwise")
_onnx("Clip", "input min? max?", "output", traits="elementwise")
for _name in "Add Sub Mul Div Pow Equal Less Greater And Or".split():
    _onnx(_name, "A B", "C", traits="elementwise")
_onnx("Max", "data_0*", "max", traits="elementwise")
_onnx("Min", "data_0*", "min", traits="elementwise")
_onnx("Where", "condition X Y", "output", traits="elementwise")
_onnx("Cast", "input", "output", "to", traits="elementwise")
_onnx("Softmax", "input", "output", "axis")
_onnx("LogSoftmax", "input", "output", "axis")
_onnx("MatMul", "A B", "Y")
_onnx("Einsum", "Inputs*", "Output", "equation")
_onnx("Gemm", "A B C?", "Y", "alpha beta transA transB")
# channels_last: set only by the layout pass on graphs lowered for a target
# (tracelog.passes.layout); such a graph is never stored in a log.
_onnx(
    "Conv",
    "X W B?",
    "Y",
    "auto_pad dilations group kernel_shape pads strides channels_last",
    traits="channels_first",
)
_onnx(
    "MaxPool",
    "X",
    "Y Indices?",
    "auto_pad ceil_mode dilations kernel_shape pads storage_order strides channels_last",
    traits="channels_first",
)
_onnx(
    "AveragePool",
    "X",
    "Y",
    "auto_pad ceil_mode count_include_pad dilations kernel_shape pads strides channels_last",
    traits="channels_first",
)
_onnx("GlobalAveragePool", "X", "Y", "channels_last", traits="channels_first")
_onnx(
    "BatchNormalization",
    "X scale B input_mean input_var",
    "Y running_mean? running_var?",
    "epsilon momentum training_mode channels_last",
    traits="channels_first",
)
_onnx(
    "LayerNormalization",
    "X Scale B?",
    "Y Mean? InvStdDev?",
    "axis epsilon stash_type",
)
# element-wise too, but its mask is drawn in the recorded layout: not "elementwise"
_onnx("Dropout", "data ratio? training_mode?", "output mask?", "seed", traits="random")
# random draws of the input's shape and dtype (torch.rand, randn, uniform_, normal_:
# stochastic depth, a VAE's noise); a replay feeds back the values the batch drew
_onnx("RandomUniformLike", "input", "output", "dtype high=1.0 low=0.0 seed", traits="random")
_onnx("RandomNormalLike", "input", "output", "dtype mean=0.0 scale=1.0 seed", traits="random")
for _name in "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd".split():
    _onnx(_name, "data axes?", "reduced", "keepdims noop_with_empty_axes", traits="reduction")
_onnx("ArgMax", "data", "reduced", "axis keepdims select_last_index")
_onnx("Reshape", "data shape", "reshaped", "allowzero", traits="reshape")
_onnx("Transpose", "data", "transposed", "perm")
_onnx("Concat", "inputs*", "concat_result", "axis")
_onnx("Split", "input split?", "outputs*", "axis num_outputs")
_onnx("Slice", "data starts ends axes? steps?", "output")
_onnx("Gather", "data indices", "output", "axis")
_onnx("Unsqueeze", "data axes", "expanded", traits="reshape")
_onnx("Squeeze", "data axes?", "squeezed", traits="reshape")
_onnx("Expand", "input shape", "output")
_onnx("Tile", "input repeats", "output")
_onnx("Pad", "data pads constant_value? axes?", "output", "mode")
_onnx("Shape", "data", "shape", "end start")
_onnx("ConstantOfShape", "input", "output", "value")
_onnx(
    "NegativeLogLikelihoodLoss",
    "input target weight?",
    "loss",
    "ignore_index reduction",
)


# -- tracelog ops --------------------------------------------------------------
def _batch_norm_update(attrs: Mapping[str, object]) -> dict[str, object]:
    """BatchNormTraining's running-statistics update as PyTorch's where the
    node does not say otherwise: decay 1 - momentum, the unbiased variance."""
    momentum = attrs.get("momentum")
    if not isinstance(momentum, (int, float)):
        return {"unbiased": 1}
    return {"decay": 1.0 - float(momentum), "unbiased": 1}


define(
    OpSchema(
        "BatchNormTraining",
        ("X", "scale", "B", "running_mean", "running_var"),
        ("Y", "new_running_mean", "new_running_var"),
        ("epsilon", "momentum", "axes", "channels_last", "decay", "unbiased"),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"channels_first"}),
        derived=_batch_norm_update,
        doc=(
            "Batch normalisation in training mode as PyTorch computes it. Y normalises X with "
            "the batch mean and the biased batch variance over `axes` (all but the channel "
            "axis). The running statistics update with the *unbiased* batch variance: "
            "new_running_mean = (1 - momentum) * running_mean + momentum * mean, "
            "new_running_var = (1 - momentum) * running_var + momentum * var * n / (n - 1), "
            "n the number of elements reduced per channel. ONNX BatchNormalization with "
            "training_mode=1 uses the biased variance and the opposite momentum convention, "
            "hence this op. In ONNX, epsilon and momentum are double scalar tensors (every "
            "float attribute of a tracelog op is): a float attribute is float32 by the "
            "standard, and momentum 0.1 in float32 moves a float64 run's statistics by 1.5e-8. "
            "Keras' update is written with two more attributes: `decay`, the factor of the old "
            "statistic where it is not 1 - momentum (Keras multiplies by its momentum and by "
            "1 - momentum, each rounded to float32 on its own, whose sum is not 1), and "
            "`unbiased` = 0 where the running variance takes the biased batch variance: "
            "new_running_stat = decay * running_stat + momentum * batch_stat. The batch "
            "statistics are taken as each source's kernel takes them: PyTorch's (unbiased = 1) "
            "in float64, cast once (its CPU kernel accumulates a float32 tensor's in double), "
            "Keras' in X's dtype (tf.nn.moments)."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
BatchNormTraining <epsilon, momentum, axes, decay, unbiased>
    (X, scale, B, running_mean, running_var) => (Y, new_running_mean, new_running_var) {
  eps_d = Constant <value: tensor = @epsilon> ()
  eps = CastLike (eps_d, X)
  mom_d = Constant <value: tensor = @momentum> ()
  mom = CastLike (mom_d, X)
  ax = Constant <value_ints: ints = @axes> ()
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, X)
  unb_i = Constant <value_int: int = @unbiased> ()
  unb = Cast <to = 9> (unb_i)
  mean_x = ReduceMean <keepdims = 0> (X, ax)
  mean_x_b = Unsqueeze (mean_x, ax)
  centred_x = Sub (X, mean_x_b)
  squared_x = Mul (centred_x, centred_x)
  var_x = ReduceMean <keepdims = 0> (squared_x, ax)
  x_d = Cast <to = 11> (X)
  mean_d = ReduceMean <keepdims = 0> (x_d, ax)
  mean_d_b = Unsqueeze (mean_d, ax)
  centred_d = Sub (x_d, mean_d_b)
  squared_d = Mul (centred_d, centred_d)
  var_d = ReduceMean <keepdims = 0> (squared_d, ax)
  mean_dx = CastLike (mean_d, X)
  var_dx = CastLike (var_d, X)
  mean = Where (unb, mean_dx, mean_x)
  var = Where (unb, var_dx, var_x)
  mean_b = Unsqueeze (mean, ax)
  centred = Sub (X, mean_b)
  var_b = Unsqueeze (var, ax)
  var_eps = Add (var_b, eps)
  std = Sqrt (var_eps)
  normed = Div (centred, std)
  scale_b = Unsqueeze (scale, ax)
  bias_b = Unsqueeze (B, ax)
  scaled = Mul (normed, scale_b)
  Y = Add (scaled, bias_b)
  n_all = Size (X)
  n_chan = Size (mean)
  n_int = Div (n_all, n_chan)
  n = CastLike (n_int, X)
  n_minus_1 = Sub (n, one)
  bessel_n = Div (n, n_minus_1)
  bessel = Where (unb, bessel_n, one)
  var_unbiased = Mul (var, bessel)
  keep_d = Constant <value: tensor = @decay> ()
  keep = CastLike (keep_d, X)
  old_mean = Mul (running_mean, keep)
  new_mean_part = Mul (mean, mom)
  new_running_mean = Add (old_mean, new_mean_part)
  old_var = Mul (running_var, keep)
  new_var_part = Mul (var_unbiased, mom)
  new_running_var = Add (old_var, new_var_part)
}
""",
    )
)
define(
    OpSchema(
        "StopGradient",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = X, and no gradient flows from Y to X (tf.stop_gradient, torch's detach, "
            "jax.lax.stop_gradient). Keras' batch norm computes the variance around a "
            "stop-gradient mean: in exact arithmetic the gradient through that mean is zero, "
            "in float32 it is rounding noise that near-constant channels amplify, so it is kept."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
StopGradient (X) => (Y) {
  Y = Identity (X)
}
""",
    )
)
define(
    OpSchema(
        "SiLU",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = X * sigmoid(X) (SiLU, swish with beta 1: torch.nn.functional.silu, "
            "tf.nn.silu, jax.nn.silu). One op rather than Sigmoid and Mul, so that a program "
            "runs its framework's own kernel: PyTorch's computes X / (1 + exp(-X)) and its "
            "gradient as dY * s * (1 + X * (1 - s)), s = sigmoid(X), with other rounding than "
            "the product of two ops (a PyTorch program of a PyTorch model is then bitwise the "
            "source's). ONNX has it as Swish only from opset 24."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
SiLU (X) => (Y) {
  S = Sigmoid (X)
  Y = Mul (X, S)
}
""",
    )
)
define(
    OpSchema(
        "RandomExponentialLike",
        ("input",),
        ("output",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"random"}),
        doc=(
            "Values drawn from the exponential distribution of rate 1, of the input's "
            "shape and dtype (torch's exponential_(): F.gumbel_softmax's noise). The "
            "sample keeps the values drawn; a replay feeds them back. The ONNX function "
            "takes -log(1 - U), U uniform in [0, 1)."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
RandomExponentialLike (input) => (output) {
  u = RandomUniformLike (input)
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, u)
  rest = Sub (one, u)
  logs = Log (rest)
  output = Neg (logs)
}
""",
    )
)
define(
    OpSchema(
        "Log1p",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = log(1 + X), accurate where X is small (torch.log1p, tf.math.log1p, "
            "jnp.log1p): log(1 + X) written out loses every digit of X below the "
            "resolution of 1 (X = 1e-8 gives 0 in float32). The ONNX function takes "
            "log(U) * X / (U - 1), U = 1 + X, which is accurate to a few ulp, and X where "
            "U is 1."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
Log1p (X) => (Y) {
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, X)
  zero_f = Constant <value_float = 0.0> ()
  zero = CastLike (zero_f, X)
  u = Add (one, X)
  d = Sub (u, one)
  tiny = Equal (d, zero)
  safe_d = Where (tiny, one, d)
  ratio = Div (X, safe_d)
  logu = Log (u)
  scaled = Mul (logu, ratio)
  Y = Where (tiny, X, scaled)
}
""",
    )
)
define(
    OpSchema(
        "Expm1",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = exp(X) - 1, accurate where X is small (torch.expm1, tf.math.expm1, "
            "jnp.expm1): exp(X) - 1 written out cancels to 0 there. The ONNX function "
            "takes tanh(X / 2) * (exp(X) + 1), with no cancellation."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
Expm1 (X) => (Y) {
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, X)
  half_f = Constant <value_float = 0.5> ()
  half = CastLike (half_f, X)
  h = Mul (X, half)
  t = Tanh (h)
  e = Exp (X)
  e1 = Add (e, one)
  Y = Mul (t, e1)
}
""",
    )
)
# -- element-wise math (trigonometric and hyperbolic functions, rounding, special
# functions, scans): ONNX's op where ONNX has one of the same meaning --
for _name in "Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh IsNaN".split():
    _onnx(_name, "X", "Y", traits="elementwise")
# half to even, as torch.round, tf.math.round and jnp.round
_onnx("Round", "X", "Y", traits="elementwise")
_onnx("IsInf", "X", "Y", "detect_negative=1 detect_positive=1", traits="elementwise")


def _consts(prefix: str, values: Sequence[float]) -> list[str]:
    """ONNX text lines: double constants prefix0, prefix1, ... (full float64
    digits whatever the input's dtype; a function casts where it needs)."""
    return [f"  {prefix}{k} = Constant <value = double {{{v!r}}}> ()" for k, v in enumerate(values)]


def _recurrence(
    out: str, var: str, num: tuple[str, int], den: tuple[str, int], last: int
) -> list[str]:
    """Cody's evaluation of a rational function (W. J. Cody, Rational Chebyshev
    approximations for the error function, Math. Comp. 23, 1969; netlib
    specfun CALERF): xnum = n[last] * v, xden = v, then for i < k:
    xnum = (xnum + n[i]) * v, xden = (xden + d[i]) * v, and
    out = (xnum + n[k]) / (xden + d[k]), k the count of steps."""
    (n, steps), (d, _) = num, den
    lines = [f"  {out}_n0 = Mul ({n}{last}, {var})", f"  {out}_d0 = Identity ({var})"]
    for i in range(steps):
        lines += [
            f"  {out}_na{i} = Add ({out}_n{i}, {n}{i})",
            f"  {out}_n{i + 1} = Mul ({out}_na{i}, {var})",
            f"  {out}_da{i} = Add ({out}_d{i}, {d}{i})",
            f"  {out}_d{i + 1} = Mul ({out}_da{i}, {var})",
        ]
    lines += [
        f"  {out}_top = Add ({out}_n{steps}, {n}{steps})",
        f"  {out}_bottom = Add ({out}_d{steps}, {d}{steps})",
        f"  {out} = Div ({out}_top, {out}_bottom)",
    ]
    return lines


# Cody's coefficients (CALERF): erf on |x| <= 0.46875; erfc on 0.46875 < |x| <= 4;
# erfc on |x| > 4, in 1 / x^2
_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)  # fmt: skip
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)  # fmt: skip
_ERFC_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
           2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
           2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)  # fmt: skip
_ERFC_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
           1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
           3.43936767414372164e03, 1.23033935480374942e03)  # fmt: skip
_ERFC_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
           1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)  # fmt: skip
_ERFC_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
           6.05183413124413191e-2, 2.33520497626869185e-3)  # fmt: skip

_ERFC_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Erfc (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_consts("a", _ERF_A),
        *_consts("b", _ERF_B),
        *_consts("c", _ERFC_C),
        *_consts("d", _ERFC_D),
        *_consts("p", _ERFC_P),
        *_consts("q", _ERFC_Q),
        *_consts("k", (0.46875, 4.0, 28.0, 16.0, 1.0, 2.0, 5.6418958354775628695e-1, 0.0)),
        "  y = Abs (x)",
        # |x| <= 0.46875: 1 - erf(x), erf(x) = x P(x^2) / Q(x^2), at most 0.49
        "  z = Mul (y, y)",
        *_recurrence("erf_r", "z", ("a", 3), ("b", 3), 4),
        "  erf_x = Mul (x, erf_r)",
        "  near = Sub (k4, erf_x)",
        # beyond: erfc(|x|) = exp(-x^2) R(|x|), exp(-x^2) as exp(-s^2) exp(-(y - s)(y + s)),
        # s = y rounded down to 1/16, so that x^2's rounding is not multiplied by x^2;
        # |x| clamped at 28, where erfc underflows to 0 (so inf gives 0, not NaN)
        "  yc = Min (y, k2)",
        "  y16 = Mul (yc, k3)",
        "  y16f = Floor (y16)",
        "  s = Div (y16f, k3)",
        "  ss = Mul (s, s)",
        "  nss = Neg (ss)",
        "  e1 = Exp (nss)",
        "  ys = Sub (yc, s)",
        "  yp = Add (yc, s)",
        "  dl = Mul (ys, yp)",
        "  ndl = Neg (dl)",
        "  e2 = Exp (ndl)",
        "  gauss = Mul (e1, e2)",
        *_recurrence("mid_r", "yc", ("c", 7), ("d", 7), 8),
        "  mid = Mul (gauss, mid_r)",
        "  yf = Max (yc, k1)",
        "  yf2 = Mul (yf, yf)",
        "  w = Div (k4, yf2)",
        *_recurrence("far_r", "w", ("p", 4), ("q", 4), 5),
        "  far_w = Mul (w, far_r)",
        "  far_s = Sub (k6, far_w)",
        "  far_q = Div (far_s, yf)",
        "  far = Mul (gauss, far_q)",
        "  in_mid = LessOrEqual (y, k1)",
        "  tail = Where (in_mid, mid, far)",
        # x < 0: erfc(x) = 2 - erfc(|x|), erfc(|x|) below 0.51: no cancellation
        "  is_neg = Less (x, k7)",
        "  two_minus = Sub (k5, tail)",
        "  beyond = Where (is_neg, two_minus, tail)",
        "  in_near = LessOrEqual (y, k0)",
        "  r = Where (in_near, near, beyond)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

define(
    OpSchema(
        "Erfc",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = erfc(X) = 1 - erf(X), accurate where erf(X) is near 1 (torch.special.erfc, "
            "tf.math.erfc, jax.lax.erfc): 1 - erf(X) written out loses every digit beyond "
            "X = 4 in float32 (erfc(4) = 1.5e-8, below 1's resolution) and 6 in float64. "
            "The ONNX function is Cody's CALERF (Math. Comp. 23, 1969), taken in float64 "
            "whatever X's dtype: 1 - x P(x^2)/Q(x^2) where |X| <= 0.46875, exp(-x^2) R(|x|) "
            "beyond (R a rational function of |x| up to 4, of 1/x^2 after it; exp(-x^2) split "
            "so that x^2's rounding is not amplified), 2 - erfc(|x|) for x < 0; within 6 "
            "float64 ulp of the exact value on [-6, 27] (mpmath; in float32, correctly rounded: "
            "tests/test_op_samples.py)."
        ),
        function=_ERFC_BODY,
    )
)
# Lanczos' approximation with g = 7 and 9 coefficients (the set of Numerical Recipes
# 3rd ed. and Boost's "lanczos13m53" family's smaller cousin): Gamma(x + 1) =
# sqrt(2 pi) t^(x + 1/2) e^-t A(x), t = x + g + 1/2, relative error about 1e-15
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


def _lanczos_log(out: str, var: str) -> list[str]:
    """ONNX text lines: out = lgamma(var) for var >= 0.5 (a float64 name),
    by Lanczos' sum over var - 1."""
    lines = [
        f"  {out}_z = Sub ({var}, one)",
        f"  {out}_a0 = Identity (lz0)",
    ]
    for k in range(1, len(_LANCZOS)):
        lines += [
            f"  {out}_zk{k} = Add ({out}_z, n{k})",
            f"  {out}_q{k} = Div (lz{k}, {out}_zk{k})",
            f"  {out}_a{k} = Add ({out}_a{k - 1}, {out}_q{k})",
        ]
    last = len(_LANCZOS) - 1
    lines += [
        f"  {out}_t = Add ({out}_z, g_half)",  # z + g + 1/2
        f"  {out}_zh = Add ({out}_z, half)",
        f"  {out}_lt = Log ({out}_t)",
        f"  {out}_p = Mul ({out}_zh, {out}_lt)",
        f"  {out}_pt = Sub ({out}_p, {out}_t)",
        f"  {out}_la = Log ({out}_a{last})",
        f"  {out}_s = Add ({out}_pt, {out}_la)",
        f"  {out} = Add ({out}_s, half_log_2pi)",
    ]
    return lines


def _series_at_v_plus_10() -> list[str]:
    """ONNX text lines shared by the digamma and trigamma functions: w = v + 10,
    iw = 1 / w, iw2 = iw^2, and h0 = sum b_k iw2^(k + 1), k = 0..6, by Horner
    from the last term (the asymptotic series' terms past its leading ones)."""
    return [
        "  w = Add (v, n10)",
        "  iw = Div (one, w)",
        "  iw2 = Mul (iw, iw)",
        "  h6 = Mul (b6, iw2)",
        *[
            line
            for k in range(5, -1, -1)
            for line in (f"  ha{k} = Add (h{k + 1}, b{k})", f"  h{k} = Mul (ha{k}, iw2)")
        ],
    ]


_LGAMMA_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Lgamma (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_consts("lz", _LANCZOS),
        *[f"  n{k} = Constant <value = double {{{float(k)!r}}}> ()" for k in range(1, 9)],
        "  one = Constant <value = double {1.0}> ()",
        "  half = Constant <value = double {0.5}> ()",
        "  g_half = Constant <value = double {7.5}> ()",
        "  half_log_2pi = Constant <value = double {0.91893853320467274178}> ()",
        "  pi = Constant <value = double {3.14159265358979323846}> ()",
        "  inf = Constant <value = double {inf}> ()",
        # x >= 0.5: Lanczos; below: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x)
        "  small = Less (x, half)",
        "  mirrored = Sub (one, x)",
        "  arg = Where (small, mirrored, x)",
        *_lanczos_log("lg", "arg"),
        # |sin(pi x)| = |sin(pi (x - round(x)))|: the reduction is exact, so no multiple
        # of pi's rounding reaches the sine where |x| is large
        "  rx = Round (x)",
        "  red = Sub (x, rx)",
        "  px = Mul (pi, red)",
        "  sn = Sin (px)",
        # 1 where the reflection is not taken: no division by zero at 1, 2, 3, ...
        "  sn_used = Where (small, sn, one)",
        "  asn = Abs (sn_used)",
        "  ratio = Div (pi, asn)",
        "  lr = Log (ratio)",
        "  refl = Sub (lr, lg)",
        "  r0 = Where (small, refl, lg)",
        # the poles (0, -1, -2, ...) and the infinities are +inf, as torch's
        "  fl = Floor (x)",
        "  at_int = Equal (fl, x)",
        "  ax = Abs (x)",
        "  is_inf = Equal (ax, inf)",
        "  ci = Less (x, half)",
        "  pole = And (at_int, ci)",
        "  to_inf = Or (pole, is_inf)",
        "  r1 = Where (to_inf, inf, r0)",
        # lgamma(1) = lgamma(2) = 0 exactly (the Lanczos sum leaves an ulp there),
        # as torch's: log-factorials of counts 0 and 1 are 0
        "  two = Constant <value = double {2.0}> ()",
        "  is_one = Equal (x, one)",
        "  is_two = Equal (x, two)",
        "  zero_at = Or (is_one, is_two)",
        "  zero = Constant <value = double {0.0}> ()",
        "  r = Where (zero_at, zero, r1)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

# psi(x) = log x - 1/(2x) - sum B_2k / (2k x^2k), k = 1..7, taken at x + 10 >= 10
# (where the next term is below 5e-17 of it)
_DIGAMMA_ASYMPTOTIC = (
    1.0 / 12,
    -1.0 / 120,
    1.0 / 252,
    -1.0 / 240,
    1.0 / 132,
    -691.0 / 32760,
    1.0 / 12,
)

_DIGAMMA_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Digamma (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_consts("b", _DIGAMMA_ASYMPTOTIC),
        *[f"  n{k} = Constant <value = double {{{float(k)!r}}}> ()" for k in range(0, 11)],
        "  one = Constant <value = double {1.0}> ()",
        "  half = Constant <value = double {0.5}> ()",
        "  pi = Constant <value = double {3.14159265358979323846}> ()",
        "  inf = Constant <value = double {inf}> ()",
        "  ninf = Constant <value = double {-inf}> ()",
        "  nan = Constant <value = double {nan}> ()",
        # x < 0.5: psi(x) = psi(1 - x) - pi / tan(pi x)
        "  small = Less (x, half)",
        "  mirrored = Sub (one, x)",
        "  v = Where (small, mirrored, x)",
        # psi(v) = psi(v + 10) - sum 1 / (v + k), k = 0..9
        "  s0 = Div (one, v)",
        *[
            line
            for k in range(1, 10)
            for line in (
                f"  vk{k} = Add (v, n{k})",
                f"  rk{k} = Div (one, vk{k})",
                f"  s{k} = Add (s{k - 1}, rk{k})",
            )
        ],
        *_series_at_v_plus_10(),
        "  lw = Log (w)",
        "  hw = Mul (half, iw)",
        "  a1 = Sub (lw, hw)",
        "  a2 = Sub (a1, h0)",
        "  psi = Sub (a2, s9)",
        # pi / tan(pi x) as pi cos / sin (onnxruntime has no float64 Tan), at
        # x - round(x): tan has period pi, and the reduction is exact
        "  rx = Round (x)",
        "  red = Sub (x, rx)",
        "  px = Mul (pi, red)",
        "  sn = Sin (px)",
        "  cs = Cos (px)",
        "  pcs = Mul (pi, cs)",
        # 1 where the reflection is not taken: no division by zero at 1, 2, 3, ...
        "  sn_used = Where (small, sn, one)",
        "  ct = Div (pcs, sn_used)",
        "  refl = Sub (psi, ct)",
        "  r0 = Where (small, refl, psi)",
        # at 0: -inf; at the negative integers: NaN; at +inf: +inf (torch's)
        "  fl = Floor (x)",
        "  at_int = Equal (fl, x)",
        "  is_zero = Equal (x, n0)",
        "  neg = Less (x, n0)",
        "  neg_int = And (at_int, neg)",
        "  r1 = Where (neg_int, nan, r0)",
        "  r2 = Where (is_zero, ninf, r1)",
        "  is_inf = Equal (x, inf)",
        "  r = Where (is_inf, inf, r2)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

# psi'(x) = 1/x + 1/(2x^2) + sum B_2k / x^(2k+1), k = 1..7, taken at x + 10 >= 10
# (where the next term, B_16 / x^17, is below 1e-16 of it)
_TRIGAMMA_ASYMPTOTIC = (
    1.0 / 6,
    -1.0 / 30,
    1.0 / 42,
    -1.0 / 30,
    5.0 / 66,
    -691.0 / 2730,
    7.0 / 6,
)

_TRIGAMMA_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Trigamma (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_consts("b", _TRIGAMMA_ASYMPTOTIC),
        *[f"  n{k} = Constant <value = double {{{float(k)!r}}}> ()" for k in range(0, 11)],
        "  one = Constant <value = double {1.0}> ()",
        "  half = Constant <value = double {0.5}> ()",
        "  pi = Constant <value = double {3.14159265358979323846}> ()",
        "  pi2 = Constant <value = double {9.8696044010893586188}> ()",
        "  inf = Constant <value = double {inf}> ()",
        # x < 0.5: psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x)
        "  small = Less (x, half)",
        "  mirrored = Sub (one, x)",
        "  v = Where (small, mirrored, x)",
        # psi'(v) = psi'(v + 10) + sum 1 / (v + k)^2, k = 0..9
        "  iv = Div (one, v)",
        "  s0 = Mul (iv, iv)",
        *[
            line
            for k in range(1, 10)
            for line in (
                f"  vk{k} = Add (v, n{k})",
                f"  ik{k} = Div (one, vk{k})",
                f"  qk{k} = Mul (ik{k}, ik{k})",
                f"  s{k} = Add (s{k - 1}, qk{k})",
            )
        ],
        *_series_at_v_plus_10(),
        "  hw = Mul (half, iw)",
        "  c1 = Add (one, hw)",
        "  c2 = Add (c1, h0)",
        "  tail = Mul (iw, c2)",
        "  psi1 = Add (s9, tail)",
        # sin(pi x) at x - round(x): the reduction is exact, and sin^2 has period 1
        "  rx = Round (x)",
        "  red = Sub (x, rx)",
        "  px = Mul (pi, red)",
        "  sn = Sin (px)",
        # 1 where the reflection is not taken: no division by zero at 1, 2, 3, ...
        "  sn_used = Where (small, sn, one)",
        "  sn2 = Mul (sn_used, sn_used)",
        "  csc2 = Div (pi2, sn2)",
        "  refl = Sub (csc2, psi1)",
        "  r0 = Where (small, refl, psi1)",
        # the poles (0, -1, -2, ...) are +inf; +inf gives 0 and -inf NaN as they come
        "  fl = Floor (x)",
        "  at_int = Equal (fl, x)",
        "  ci = Less (x, half)",
        "  pole = And (at_int, ci)",
        "  ax = Abs (x)",
        "  finite = Less (ax, inf)",
        "  finite_pole = And (pole, finite)",
        "  r = Where (finite_pole, inf, r0)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

define(
    OpSchema(
        "Lgamma",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = log |Gamma(X)| (torch.lgamma, tf.math.lgamma, jax.lax.lgamma): +inf at "
            "0, -1, -2, ... and at +-inf. The ONNX function, in float64 whatever X's dtype: "
            "Lanczos' approximation (g = 7, 9 coefficients) for X >= 0.5, the reflection "
            "log(pi / |sin(pi X)|) - lgamma(1 - X) below; within 1e-13 of the value's "
            "size against scipy.special.gammaln (tests/test_gamma_functions.py)."
        ),
        function=_LGAMMA_BODY,
    )
)
define(
    OpSchema(
        "Digamma",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = digamma(X) = d lgamma(X) / dX (torch.digamma, tf.math.digamma, "
            "jax.lax.digamma): -inf at 0, NaN at the negative integers. The ONNX function, "
            "in float64: psi(X) = psi(X + 10) - sum 1 / (X + k), k < 10, psi(X + 10) by its "
            "asymptotic series (7 terms), and the reflection psi(1 - X) - pi cos(pi X) / sin(pi X) "
            "for X < 0.5; checked against scipy.special.digamma "
            "(tests/test_gamma_functions.py)."
        ),
        function=_DIGAMMA_BODY,
    )
)
define(
    OpSchema(
        "Trigamma",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = trigamma(X) = d digamma(X) / dX, the polygamma function of order 1 "
            "(torch.special.polygamma(1, X), tf.math.polygamma(1, X), jax.lax.polygamma(1, X)): "
            "+inf at 0, -1, -2, ..., 0 at +inf. The ONNX function, in float64: "
            "psi'(X) = psi'(X + 10) + sum 1 / (X + k)^2, k < 10, psi'(X + 10) by its "
            "asymptotic series (7 terms), and the reflection pi^2 / sin^2(pi X) - psi'(1 - X) "
            "for X < 0.5; checked against scipy.special.polygamma "
            "(tests/test_gamma_functions.py)."
        ),
        function=_TRIGAMMA_BODY,
    )
)
# -- inverse error function, normal quantile and log-CDF --
# erfinv and ndtri solve erf(y) = a (a = |x|) by Newton's method from a rough start,
# on the residual whose digits are there: erf(y) - a where a <= 1/2 (y <= 0.477,
# erf by Cody's x P(x^2) / Q(x^2), within 3 ulp there as up to its 0.46875: measured),
# and log erfc(y) - log(1 - a) beyond, 1 - a exact
# (Sterbenz), log erfc(y) = -y^2 + log R(y) with R Cody's erfc(y) exp(y^2): no
# underflow, no cancellation near a = 1; its slope is -2 / (sqrt(pi) R(y)).
_SQRT_PI = 1.7724538509055160273
_ERFINV_SERIES = tuple(  # erfinv(a) = sqrt(pi) / 2 sum s_k a^(2k + 1): the Taylor series
    _SQRT_PI / 2 * c * math.pi**k
    for k, c in enumerate(
        (1.0, 1.0 / 12, 7.0 / 480, 127.0 / 40320, 4369.0 / 5806080, 34807.0 / 182476800)
    )
)
_NEWTON_STEPS = 4


def _erfc_scaled(out: str, var: str) -> list[str]:
    """ONNX text lines: out = R(var) with erfc(var) = exp(-var^2) R(var), for a
    float64 var >= 0.46875 (Cody's rational functions of var up to 4 and of
    1 / var^2 beyond; var clamped at 1e150, where R is 1 / (var sqrt(pi)) to
    float64's digits). Reads the constants c*, d*, p*, q* (_ERFC_C, ...) and
    rk0 = 4, rk1 = 1, rk2 = 1 / sqrt(pi), rk3 = 1e150 (_ERFC_SCALED_CONSTS)."""
    return [
        f"  {out}_y = Min ({var}, rk3)",
        *_recurrence(f"{out}_mid", f"{out}_y", ("c", 7), ("d", 7), 8),
        f"  {out}_yf = Max ({out}_y, rk0)",
        f"  {out}_yf2 = Mul ({out}_yf, {out}_yf)",
        f"  {out}_w = Div (rk1, {out}_yf2)",
        *_recurrence(f"{out}_far_r", f"{out}_w", ("p", 4), ("q", 4), 5),
        f"  {out}_fw = Mul ({out}_w, {out}_far_r)",
        f"  {out}_fs = Sub (rk2, {out}_fw)",
        f"  {out}_far = Div ({out}_fs, {out}_yf)",
        f"  {out}_in_mid = LessOrEqual ({out}_y, rk0)",
        f"  {out} = Where ({out}_in_mid, {out}_mid, {out}_far)",
    ]


def _erfc_constants() -> list[str]:
    """The constants _erfc_scaled and Cody's erf on |x| <= 0.46875 read."""
    return [
        *_consts("a", _ERF_A),
        *_consts("b", _ERF_B),
        *_consts("c", _ERFC_C),
        *_consts("d", _ERFC_D),
        *_consts("p", _ERFC_P),
        *_consts("q", _ERFC_Q),
        *_consts("rk", (4.0, 1.0, 1.0 / _SQRT_PI, 1e150)),
    ]


def _inverse_erf(out: str, a: str, lw: str) -> list[str]:
    """ONNX text lines: out >= 0 with erf(out) = a, for float64 names a = |x|
    in [0, 1) and lw = log(1 - a), 1 - a taken exactly by the caller. Reads
    _erfc_constants() and the constants ik0 = 1/2, ik1 = 0.46875, ik2 = 2 /
    sqrt(pi), ik3 = sqrt(pi) / 2, ik4 = pi, ik5 = 0.2, s* (_ERFINV_SERIES)."""
    lines = [
        f"  {out}_central = LessOrEqual ({a}, ik0)",
        # the start: erfinv's Taylor series (6 terms, 1e-5 at a = 1/2) where a <= 1/2;
        # y^2 = L - log(pi L) / 2, L = -log(1 - a) (erfc's asymptotic form) beyond
        f"  {out}_a2 = Mul ({a}, {a})",
        f"  {out}_h5 = Identity (s5)",
        *[
            line
            for k in range(4, -1, -1)
            for line in (
                f"  {out}_hm{k} = Mul ({out}_h{k + 1}, {out}_a2)",
                f"  {out}_h{k} = Add ({out}_hm{k}, s{k})",
            )
        ],
        f"  {out}_start_c = Mul ({a}, {out}_h0)",
        f"  {out}_big_l = Neg ({lw})",
        f"  {out}_pl = Mul (ik4, {out}_big_l)",
        f"  {out}_lpl = Log ({out}_pl)",
        f"  {out}_hl = Mul (ik0, {out}_lpl)",
        f"  {out}_sq = Sub ({out}_big_l, {out}_hl)",
        f"  {out}_sq_pos = Max ({out}_sq, ik5)",
        f"  {out}_start_t = Sqrt ({out}_sq_pos)",
        f"  {out}_y0 = Where ({out}_central, {out}_start_c, {out}_start_t)",
    ]
    for k in range(_NEWTON_STEPS):
        y, s = f"{out}_y{k}", f"{out}_n{k}"
        lines += [
            # a <= 1/2: y -= (erf(y) - a) / (2 exp(-y^2) / sqrt(pi))
            f"  {s}_z = Mul ({y}, {y})",
            *_recurrence(f"{s}_erf_r", f"{s}_z", ("a", 3), ("b", 3), 4),
            f"  {s}_erf = Mul ({y}, {s}_erf_r)",
            f"  {s}_res = Sub ({s}_erf, {a})",
            f"  {s}_nz = Neg ({s}_z)",
            f"  {s}_g = Exp ({s}_nz)",
            f"  {s}_slope = Mul (ik2, {s}_g)",
            f"  {s}_dc = Div ({s}_res, {s}_slope)",
            f"  {s}_yc = Sub ({y}, {s}_dc)",
            # beyond: y += (log erfc(y) - log(1 - a)) sqrt(pi) R(y) / 2
            f"  {s}_yt = Max ({y}, ik1)",
            *_erfc_scaled(f"{s}_r", f"{s}_yt"),
            f"  {s}_lr = Log ({s}_r)",
            f"  {s}_yt2 = Mul ({s}_yt, {s}_yt)",
            f"  {s}_le = Sub ({s}_lr, {s}_yt2)",
            f"  {s}_f = Sub ({s}_le, {lw})",
            f"  {s}_fr = Mul ({s}_f, {s}_r)",
            f"  {s}_dt = Mul ({s}_fr, ik3)",
            f"  {s}_ytn = Add ({s}_yt, {s}_dt)",
            f"  {out}_y{k + 1} = Where ({out}_central, {s}_yc, {s}_ytn)",
        ]
    lines.append(f"  {out} = Identity ({out}_y{_NEWTON_STEPS})")
    return lines


def _inverse_erf_constants() -> list[str]:
    return [
        *_erfc_constants(),
        *_consts("ik", (0.5, 0.46875, 2.0 / _SQRT_PI, _SQRT_PI / 2, math.pi, 0.2)),
        *_consts("s", _ERFINV_SERIES),
    ]


_ERFINV_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Erfinv (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_inverse_erf_constants(),
        "  one = Constant <value = double {1.0}> ()",
        "  zero = Constant <value = double {0.0}> ()",
        "  inf = Constant <value = double {inf}> ()",
        "  nan = Constant <value = double {nan}> ()",
        "  a = Abs (x)",
        "  w = Sub (one, a)",  # exact for a >= 1/2, where it is read
        "  lw = Log (w)",
        *_inverse_erf("y", "a", "lw"),
        # +-1: +-inf; |x| > 1: NaN (NaN stays NaN)
        "  at_one = Equal (a, one)",
        "  y1 = Where (at_one, inf, y)",
        "  beyond = Less (one, a)",
        "  y2 = Where (beyond, nan, y1)",
        "  neg = Less (x, zero)",
        "  ny = Neg (y2)",
        "  r = Where (neg, ny, y2)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

_NDTRI_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "Ndtri (X) => (Y) {",
        "  p = Cast <to = 11> (X)",
        *_inverse_erf_constants(),
        "  one = Constant <value = double {1.0}> ()",
        "  two = Constant <value = double {2.0}> ()",
        "  zero = Constant <value = double {0.0}> ()",
        "  half = Constant <value = double {0.5}> ()",
        "  sqrt2 = Constant <value = double {1.4142135623730950488}> ()",
        "  inf = Constant <value = double {inf}> ()",
        "  ninf = Constant <value = double {-inf}> ()",
        "  nan = Constant <value = double {nan}> ()",
        # ndtri(p) = sqrt(2) erfinv(2p - 1): 2p - 1 is exact for p >= 1/4, and
        # 1 - |2p - 1| is 2p (p < 1/2) or 2 (1 - p) (p >= 1/2), exactly, down to p's
        # subnormals: no digit of a small p is lost to 2p - 1's rounding
        "  tp = Mul (two, p)",
        "  x = Sub (tp, one)",
        "  a = Abs (x)",
        "  q = Sub (one, p)",
        "  tq = Mul (two, q)",
        "  low = Less (p, half)",
        "  w = Where (low, tp, tq)",
        "  lw = Log (w)",
        *_inverse_erf("y", "a", "lw"),
        "  ys = Mul (sqrt2, y)",
        "  nys = Neg (ys)",
        "  r0 = Where (low, nys, ys)",
        # 0: -inf; 1: +inf; outside [0, 1]: NaN (NaN stays NaN)
        "  at_zero = Equal (p, zero)",
        "  r1 = Where (at_zero, ninf, r0)",
        "  at_one = Equal (p, one)",
        "  r2 = Where (at_one, inf, r1)",
        "  below = Less (p, zero)",
        "  above = Less (one, p)",
        "  outside = Or (below, above)",
        "  r = Where (outside, nan, r2)",
        "  Y = CastLike (r, X)",
        "}",
        "",
    ]
)

_LOG_NDTR_BODY = "\n".join(
    [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        "LogNdtr (X) => (Y) {",
        "  x = Cast <to = 11> (X)",
        *_erfc_constants(),
        *_consts(
            "lk",
            (0.70710678118654752440, 0.46875, 1.0, 0.5, 0.69314718055994530942, 0.0, 40.0, 16.0),
        ),
        # z = |x| / sqrt(2): Phi(x) = erfc(z) / 2 for x <= 0, 1 - erfc(z) / 2 beyond
        "  ax = Abs (x)",
        "  z = Mul (ax, lk0)",
        "  z2 = Mul (z, z)",
        *_recurrence("erf_r", "z2", ("a", 3), ("b", 3), 4),
        "  erf_z = Mul (z, erf_r)",
        "  erfc_near = Sub (lk2, erf_z)",
        "  in_near = LessOrEqual (z, lk1)",
        "  zt = Max (z, lk1)",
        *_erfc_scaled("r", "zt"),
        # x <= 0: log(erfc(z) / 2), beyond z = 0.46875 as -x^2 / 2 + log R(z) - log 2,
        # every term negative (R <= 1): no underflow, no cancellation, down to -inf
        "  xx = Mul (x, x)",
        "  hxx = Mul (xx, lk3)",
        "  lr = Log (r)",
        "  far_lo = Sub (lr, hxx)",
        "  near_lo = Log (erfc_near)",
        "  lo_e = Where (in_near, near_lo, far_lo)",
        "  lo = Sub (lo_e, lk4)",
        # x > 0: log(1 - q), q = erfc(z) / 2, exp(-x^2 / 2) as exp(-s^2 / 2) exp(-(x - s)
        # (x + s) / 2), s = x rounded down to 1/16 (x^2's rounding not amplified; x
        # clamped at 40, where q underflows); log(1 - q) as log(v) q / (1 - v), v = 1 - q
        # (Goldberg's log1p: exact where v rounds to 1)
        "  xc = Min (ax, lk6)",
        "  x16 = Mul (xc, lk7)",
        "  x16f = Floor (x16)",
        "  s = Div (x16f, lk7)",
        "  ss = Mul (s, s)",
        "  hss = Mul (ss, lk3)",
        "  nhss = Neg (hss)",
        "  e1 = Exp (nhss)",
        "  xs = Sub (xc, s)",
        "  xp = Add (xc, s)",
        "  dl = Mul (xs, xp)",
        "  hdl = Mul (dl, lk3)",
        "  nhdl = Neg (hdl)",
        "  e2 = Exp (nhdl)",
        "  gauss = Mul (e1, e2)",
        "  erfc_far = Mul (gauss, r)",
        "  erfc_z = Where (in_near, erfc_near, erfc_far)",
        "  q = Mul (erfc_z, lk3)",
        "  v = Sub (lk2, q)",
        "  lv = Log (v)",
        "  vm = Sub (v, lk2)",
        "  nq = Neg (q)",
        "  at_one = Equal (vm, lk5)",
        "  vm_used = Where (at_one, lk2, vm)",
        "  ratio = Div (nq, vm_used)",
        "  l1p = Mul (lv, ratio)",
        "  hi = Where (at_one, nq, l1p)",
        "  pos = Less (lk5, x)",
        "  r_all = Where (pos, hi, lo)",
        "  Y = CastLike (r_all, X)",
        "}",
        "",
    ]
)

# -- modified Bessel functions of the first kind, orders 0 and 1 --
# Chebyshev series sum c_k T_k(t) (computed for tracelog: interpolation at 60
# Chebyshev nodes of mpmath's values at 50 digits, terms kept down to 1e-18 of the
# largest) of exp(-x) I0(x) and exp(-x) I1(x) / x on [0, 8] (t = x / 4 - 1), and of
# sqrt(x) exp(-x) I0(x) and sqrt(x) exp(-x) I1(x) beyond (t = 16 / x - 1), the split
# of Cephes' i0e and i1e

_I0E_SMALL = (
    0.33839763720473803, -0.3046826723431984, 0.17162090152220877, -0.09490109704804764,
    0.04930528423967071, -0.02373741480589947, 0.010546460394594998,
    -0.004324309995050576, 0.0016394756169413357, -0.0005763755745385824,
    0.00018850288509584165, -5.754195010082104e-05, 1.6448448070728896e-05,
    -4.4167383584587505e-06, 1.1173875391201037e-06, -2.670793853940612e-07,
    6.046995022541919e-08, -1.300025009986248e-08, 2.6598237246823866e-09,
    -5.189795601635263e-10, 9.675809035373237e-11, -1.726826291441556e-11,
    2.95505266312964e-12, -4.856446783111929e-13, 7.676185498604936e-14,
    -1.1685332877993451e-14, 1.715391285555133e-15, -2.431279846547955e-16,
    3.3307945188222384e-17, -4.4153416464793395e-18, 5.669178006921496e-19,
)  # fmt: skip

_I0E_LARGE = (
    0.4022452055070544, 0.0033691164782556943, 6.889758346916825e-05,
    2.8913705208347567e-06, 2.0489185894690638e-07, 2.266668990498178e-08,
    3.3962320257083865e-09, 4.94060238822497e-10, 1.1889147107846439e-11,
    -3.1499165279632416e-11, -1.3215811840447713e-11, -1.7941785315068062e-12,
    7.180124451383666e-13, 3.8527783827421426e-13, 1.54008621752141e-14,
    -4.150569347287222e-14, -9.554846698828307e-15, 3.8116806693526224e-15,
    1.7725601330565263e-15, -3.425485619677219e-16, -2.8276239805165836e-16,
    3.461222867697461e-17, 4.46562142029676e-17, -4.830504485944182e-18,
    -7.233180487874754e-18, 9.921475412173699e-19, 1.193650890845982e-18,
)  # fmt: skip

_I1E_SMALL = (
    0.12629359322181682, -0.17641651835783406, 0.1026436586898471, -0.05294598120809499,
    0.024726449030626516, -0.010564084894626197, 0.004156422944312888,
    -0.0015135724506312532, 0.0005122859561685758, -0.00016176081582589674,
    4.781565107550054e-05, -1.3273163656039436e-05, 3.4702513081376785e-06,
    -8.568720264695455e-07, 2.0032947535521353e-07, -4.445059128796328e-08,
    9.381537386495773e-09, -1.8872497517228294e-09, 3.625590281552117e-10,
    -6.663489723502027e-11, 1.1736186298890901e-11, -1.9839743977649436e-12,
    3.223793365945575e-13, -5.042185504727912e-14, 7.600684294735408e-15,
    -1.1055969477353862e-15, 1.5536319577362005e-16, -2.111421214358166e-17,
    2.7779141127610464e-18, -3.541581772542136e-19,
)  # fmt: skip

_I1E_LARGE = (
    0.38928811750914005, -0.009761097491361469, -0.00011058893876262371,
    -3.882564808877691e-06, -2.512236237870209e-07, -2.6314688468895196e-08,
    -3.835380385964237e-09, -5.589743462196584e-10, -1.8974958123505413e-11,
    3.2526035830154884e-11, 1.4125807436613782e-11, 2.0356285441470896e-12,
    -7.198551776245908e-13, -4.0835511110921974e-13, -2.1015418427726643e-14,
    4.272440016711951e-14, 1.0420276984128802e-14, -3.8144030724370075e-15,
    -1.8803547755107825e-15, 3.3082023109209285e-16, 2.96262899764595e-16,
    -3.209525921993424e-17, -4.6503053684893586e-17, 4.414348323071708e-18,
    7.517296310842105e-18, -9.314178867326884e-19, -1.242193275194891e-18,
)  # fmt: skip


def _clenshaw(out: str, t: str, c: str, n: int) -> list[str]:
    """ONNX text lines: out = sum c_k T_k(t), k < n, by Clenshaw's recurrence
    b_k = 2 t b_(k+1) - b_(k+2) + c_k, out = t b_1 - b_2 + c_0 (constants c0 ...)."""
    lines = [f"  {out}_tt = Add ({t}, {t})", f"  {out}_b{n - 1} = Identity ({c}{n - 1})"]
    lines += [
        f"  {out}_m{n - 2} = Mul ({out}_tt, {out}_b{n - 1})",
        f"  {out}_b{n - 2} = Add ({out}_m{n - 2}, {c}{n - 2})",
    ]
    for k in range(n - 3, 0, -1):
        lines += [
            f"  {out}_m{k} = Mul ({out}_tt, {out}_b{k + 1})",
            f"  {out}_s{k} = Sub ({out}_m{k}, {out}_b{k + 2})",
            f"  {out}_b{k} = Add ({out}_s{k}, {c}{k})",
        ]
    lines += [
        f"  {out}_m0 = Mul ({t}, {out}_b1)",
        f"  {out}_s0 = Sub ({out}_m0, {out}_b2)",
        f"  {out} = Add ({out}_s0, {c}0)",
    ]
    return lines


def _bessel_body(order: int, scaled: bool) -> str:
    """The ONNX function of I0, I0e, I1 or I1e, in float64 whatever X's dtype:
    e = exp(-|x|) I_order(|x|) by the Chebyshev series, I_order(-x) =
    (-1)^order I_order(x), and for the unscaled functions e exp(|x| / 2)^2
    (exp(|x|) alone overflows before I does)."""
    small, large = (_I0E_SMALL, _I0E_LARGE) if order == 0 else (_I1E_SMALL, _I1E_LARGE)
    name = f"I{order}" + ("e" if scaled else "")
    lines = [
        '<domain: "tracelog", opset_import: ["" : 21]>',
        f"{name} (X) => (Y) {{",
        "  x = Cast <to = 11> (X)",
        *_consts("cs", small),
        *_consts("cl", large),
        *_consts("bk", (8.0, 0.25, 1.0, 16.0, 0.5, 0.0)),
        "  ax = Abs (x)",
        # |x| <= 8: the series in t = |x| / 4 - 1
        "  axs = Min (ax, bk0)",
        "  qs = Mul (axs, bk1)",
        "  ts = Sub (qs, bk2)",
        *_clenshaw("fs", "ts", "cs", len(small)),
        # beyond: the series in t = 16 / |x| - 1, over sqrt(|x|)
        "  axl = Max (ax, bk0)",
        "  ql = Div (bk3, axl)",
        "  tl = Sub (ql, bk2)",
        *_clenshaw("fl", "tl", "cl", len(large)),
        "  rt = Sqrt (axl)",
        "  gl = Div (fl, rt)",
        "  in_small = LessOrEqual (ax, bk0)",
    ]
    if order == 0:
        # I0(0) = 1 exactly (the series leaves an ulp there)
        lines += [
            "  e0 = Where (in_small, fs, gl)",
            "  at_zero = Equal (ax, bk5)",
            "  e = Where (at_zero, bk2, e0)",
        ]
    else:
        lines += [
            "  fsx = Mul (fs, axs)",
            "  e = Where (in_small, fsx, gl)",
        ]
    if scaled:
        lines.append("  m = Identity (e)")
    else:
        lines += [
            "  hx = Mul (ax, bk4)",
            "  eh = Exp (hx)",
            "  m1 = Mul (e, eh)",
            # NaN at +-inf (0 times inf), as torch, TensorFlow, JAX and scipy give
            "  m = Mul (m1, eh)",
        ]
    if order == 1:
        lines += [
            "  neg = Less (x, bk5)",
            "  nm = Neg (m)",
            "  r = Where (neg, nm, m)",
        ]
    else:
        lines.append("  r = Identity (m)")
    lines += ["  Y = CastLike (r, X)", "}", ""]
    return "\n".join(lines)


for _order, _scaled, _spell, _doc in (
    (0, False, "torch.special.i0, tf.math.bessel_i0, jax.scipy.special.i0", "I0(X)"),
    (0, True, "torch.special.i0e, tf.math.bessel_i0e, jax.scipy.special.i0e", "exp(-|X|) I0(X)"),
    (1, False, "torch.special.i1, tf.math.bessel_i1, jax.scipy.special.i1", "I1(X)"),
    (1, True, "torch.special.i1e, tf.math.bessel_i1e, jax.scipy.special.i1e", "exp(-|X|) I1(X)"),
):
    define(
        OpSchema(
            f"I{_order}" + ("e" if _scaled else ""),
            ("X",),
            ("Y",),
            (),
            domain=TRACELOG_DOMAIN,
            traits=frozenset({"elementwise"}),
            doc=(
                f"Y = {_doc}, I{_order} the modified Bessel function of the first kind of "
                f"order {_order} ({_spell}). The ONNX function, in float64 whatever X's "
                "dtype: Chebyshev series of exp(-x) I(x) (over x for order 1) on [0, 8] and "
                "of sqrt(x) exp(-x) I(x) beyond (Cephes' split, the coefficients computed "
                "from mpmath), "
                + ("" if _scaled else "times exp(|X| / 2) twice (no early overflow), ")
                + ("even" if _order == 0 else "odd")
                + " in X; within 1e-14 of the value's size against scipy.special and "
                "mpmath (tests/test_special_functions.py)."
            ),
            function=_bessel_body(_order, _scaled),
        )
    )


# Dense linear algebra (torch.linalg, tf.linalg, jnp.linalg): each program target
# runs its own kernel (LU with partial pivoting, Cholesky), gradients by its
# autodiff. ONNX has Det alone: the others' functions are written as ONNX Loops
# over the matrix size (n read from the input's shape, any batch dims before
# the last two), the textbook algorithms LAPACK's unblocked kernels run: Gaussian
# elimination with partial pivoting (the first largest |pivot|, as getf2),
# outer-product Cholesky, substitution on the referenced triangle.
_LINALG_PRELUDE = """
  la_zero_f = Constant <value_float: float = 0.0> ()
  la_one_f = Constant <value_float: float = 1.0> ()
  la_zero_i = Constant <value_int: int = 0> ()
  la_one_i = Constant <value_int: int = 1> ()
  la_true = Cast <to: int = 9> (la_one_i)
  la_m1 = Constant <value_ints: ints = [-1]> ()
  la_m2 = Constant <value_ints: ints = [-2]> ()
  la_m21 = Constant <value_ints: ints = [-2, -1]> ()
  la_n_1d = Shape <start: int = -1> ({x})
  la_n = Squeeze (la_n_1d)
  la_r = Range (la_zero_i, la_n, la_one_i)
  la_zero = CastLike (la_zero_f, {x})
  la_one = CastLike (la_one_f, {x})"""


def _substitution(a: str, b: str, out: str, upper: str, tag: str) -> str:
    """``out`` with ``a`` ``out`` = ``b``, ``a`` triangular (``upper``: a bool
    tensor name), by substitution row by row (backward when upper); only the
    triangle ``a`` is read from (the caller masks it)."""
    return f"""
  {tag}_ab = MatMul ({a}, {b})
  {tag}_ab_shape = Shape ({tag}_ab)
  {tag}_x0 = Expand (la_zero, {tag}_ab_shape)
  {tag}_last = Sub (la_n, la_one_i)
  {out} = Loop (la_n, la_true, {tag}_x0) <body: graph = {tag}_step (int64 {tag}_it, bool {tag}_c, {tag}_x) => (bool {tag}_c_out, {tag}_x_out) {{
    {tag}_c_out = Identity ({tag}_c)
    {tag}_rev = Sub ({tag}_last, {tag}_it)
    {tag}_i = Where ({upper}, {tag}_rev, {tag}_it)
    {tag}_row = Gather <axis: int = -2> ({a}, {tag}_i)
    {tag}_row2 = Unsqueeze ({tag}_row, la_m2)
    {tag}_acc = MatMul ({tag}_row2, {tag}_x)
    {tag}_bi = Gather <axis: int = -2> ({b}, {tag}_i)
    {tag}_bi2 = Unsqueeze ({tag}_bi, la_m2)
    {tag}_num = Sub ({tag}_bi2, {tag}_acc)
    {tag}_d = Gather <axis: int = -1> ({tag}_row, {tag}_i)
    {tag}_d2 = Unsqueeze ({tag}_d, la_m21)
    {tag}_xi = Div ({tag}_num, {tag}_d2)
    {tag}_e = Equal (la_r, {tag}_i)
    {tag}_ef = CastLike ({tag}_e, {tag}_x)
    {tag}_ec = Unsqueeze ({tag}_ef, la_m1)
    {tag}_upd = Mul ({tag}_ec, {tag}_xi)
    {tag}_x_out = Add ({tag}_x, {tag}_upd)
  }}>"""


def _elimination(a: str, b: str | None, tag: str, det: bool) -> str:
    """Gaussian elimination with partial pivoting of ``a`` (and the same row
    operations on ``b``): ``{tag}_u``, upper triangular in its upper triangle,
    and ``{tag}_y``; with ``det``, ``{tag}_sign`` and ``{tag}_logabs`` of ``a``'s
    determinant. A zero pivot column (a singular matrix) is left as it is, as
    getf2 leaves it: the sign is 0 and log |det| is -inf."""
    carried = (
        [f"{tag}_u0"] + ([f"{tag}_y0"] if b else []) + ([f"{tag}_s0", f"{tag}_l0"] if det else [])
    )
    ins = [f"{tag}_u"] + ([f"{tag}_yi"] if b else []) + ([f"{tag}_s", f"{tag}_l"] if det else [])
    outs = (
        [f"{tag}_u_out"]
        + ([f"{tag}_y_out"] if b else [])
        + ([f"{tag}_s_out", f"{tag}_l_out"] if det else [])
    )
    finals = (
        [f"{tag}_uf"]
        + ([f"{tag}_y"] if b else [])
        + ([f"{tag}_sign", f"{tag}_logabs"] if det else [])
    )
    head = f"""
  {tag}_u0 = Identity ({a})"""
    if b:
        head += f"""
  {tag}_y0 = Identity ({b})"""
    if det:
        head += f"""
  {tag}_batch = Shape <end: int = -2> ({a})
  {tag}_s0 = Expand (la_one, {tag}_batch)
  {tag}_l0 = Expand (la_zero, {tag}_batch)"""
    body = f"""
  {', '.join(finals)} = Loop (la_n, la_true, {', '.join(carried)}) <body: graph = {tag}_step (int64 {tag}_k, bool {tag}_c, {', '.join(ins)}) => (bool {tag}_c_out, {', '.join(outs)}) {{
    {tag}_c_out = Identity ({tag}_c)
    {tag}_col = Gather <axis: int = -1> ({tag}_u, {tag}_k)
    {tag}_acol = Abs ({tag}_col)
    {tag}_neg = Neg (la_one)
    {tag}_from_k = GreaterOrEqual (la_r, {tag}_k)
    {tag}_cand = Where ({tag}_from_k, {tag}_acol, {tag}_neg)
    {tag}_p = ArgMax <axis: int = -1, keepdims: int = 1> ({tag}_cand)
    {tag}_at_k = Equal (la_r, {tag}_k)
    {tag}_at_p = Equal (la_r, {tag}_p)
    {tag}_to_k = Where ({tag}_at_p, {tag}_k, la_r)
    {tag}_idx = Where ({tag}_at_k, {tag}_p, {tag}_to_k)
    {tag}_idx_c = Unsqueeze ({tag}_idx, la_m1)
    {tag}_u_shape = Shape ({tag}_u)
    {tag}_u_idx = Expand ({tag}_idx_c, {tag}_u_shape)
    {tag}_us = GatherElements <axis: int = -2> ({tag}_u, {tag}_u_idx)
    {tag}_rowk = Gather <axis: int = -2> ({tag}_us, {tag}_k)
    {tag}_piv = Gather <axis: int = -1> ({tag}_rowk, {tag}_k)
    {tag}_piv_zero = Equal ({tag}_piv, la_zero)
    {tag}_piv_safe = Where ({tag}_piv_zero, la_one, {tag}_piv)
    {tag}_piv1 = Unsqueeze ({tag}_piv_safe, la_m1)
    {tag}_colk = Gather <axis: int = -1> ({tag}_us, {tag}_k)
    {tag}_q = Div ({tag}_colk, {tag}_piv1)
    {tag}_below = Greater (la_r, {tag}_k)
    {tag}_f = Where ({tag}_below, {tag}_q, la_zero)
    {tag}_fc = Unsqueeze ({tag}_f, la_m1)
    {tag}_rk = Unsqueeze ({tag}_rowk, la_m2)
    {tag}_du = Mul ({tag}_fc, {tag}_rk)
    {tag}_u_out = Sub ({tag}_us, {tag}_du)"""
    if b:
        body += f"""
    {tag}_y_shape = Shape ({tag}_yi)
    {tag}_y_idx = Expand ({tag}_idx_c, {tag}_y_shape)
    {tag}_ys = GatherElements <axis: int = -2> ({tag}_yi, {tag}_y_idx)
    {tag}_yk = Gather <axis: int = -2> ({tag}_ys, {tag}_k)
    {tag}_yk2 = Unsqueeze ({tag}_yk, la_m2)
    {tag}_dy = Mul ({tag}_fc, {tag}_yk2)
    {tag}_y_out = Sub ({tag}_ys, {tag}_dy)"""
    if det:
        body += f"""
    {tag}_p0 = Squeeze ({tag}_p, la_m1)
    {tag}_kept = Equal ({tag}_p0, {tag}_k)
    {tag}_flip = Where ({tag}_kept, la_one, {tag}_neg)
    {tag}_psign = Sign ({tag}_piv)
    {tag}_step_sign = Mul ({tag}_flip, {tag}_psign)
    {tag}_s_out = Mul ({tag}_s, {tag}_step_sign)
    {tag}_pabs = Abs ({tag}_piv)
    {tag}_plog = Log ({tag}_pabs)
    {tag}_l_out = Add ({tag}_l, {tag}_plog)"""
    return head + body + "\n  }>"


_LINALG_HEAD = '<domain: "tracelog", opset_import: ["" : 21]>\n'
_CHOLESKY_BODY = _LINALG_HEAD + "Cholesky (X) => (L) {" + _LINALG_PRELUDE.format(x="X") + """
  ch_shape = Shape (X)
  ch_l0 = Expand (la_zero, ch_shape)
  L, ch_rest = Loop (la_n, la_true, ch_l0, X) <body: graph = ch_step (int64 ch_k, bool ch_c, ch_l, ch_a) => (bool ch_c_out, ch_l_out, ch_a_out) {
    ch_c_out = Identity (ch_c)
    ch_col = Gather <axis: int = -1> (ch_a, ch_k)
    ch_d = Gather <axis: int = -1> (ch_col, ch_k)
    ch_s = Sqrt (ch_d)
    ch_s1 = Unsqueeze (ch_s, la_m1)
    ch_q = Div (ch_col, ch_s1)
    ch_from_k = GreaterOrEqual (la_r, ch_k)
    ch_lcol = Where (ch_from_k, ch_q, la_zero)
    ch_lc = Unsqueeze (ch_lcol, la_m1)
    ch_lr = Unsqueeze (ch_lcol, la_m2)
    ch_outer = Mul (ch_lc, ch_lr)
    ch_a_out = Sub (ch_a, ch_outer)
    ch_e = Equal (la_r, ch_k)
    ch_ef = CastLike (ch_e, ch_l)
    ch_new = Mul (ch_lc, ch_ef)
    ch_l_out = Add (ch_l, ch_new)
  }>
}
"""
_SOLVE_TRIANGULAR_BODY = (
    _LINALG_HEAD + "SolveTriangular <upper> (A, B) => (X) {" + _LINALG_PRELUDE.format(x="A") + """
  st_a = Trilu <upper: int = @upper> (A)
  st_up_i = Constant <value_int: int = @upper> ()
  st_up = Cast <to: int = 9> (st_up_i)""" + _substitution("st_a", "B", "X", "st_up", "st") + "\n}\n"
)


def _lu_solve_body(name: str, inputs: str, rhs: str) -> str:
    """``name``'s function: A (broadcast against ``rhs``'s batch dims)
    eliminated with partial pivoting along with ``rhs``, then the upper
    triangular system solved by back substitution."""
    return (
        _LINALG_HEAD
        + f"{name} ({inputs}) => (X) {{"
        + _LINALG_PRELUDE.format(x="A")
        + f"""
  lu_ab = MatMul (A, {rhs})
  lu_rhs_shape = Shape (lu_ab)
  lu_batch = Shape <end: int = -2> (lu_ab)
  lu_nn = Shape <start: int = -2> (A)
  lu_a_shape = Concat <axis: int = 0> (lu_batch, lu_nn)
  lu_a = Expand (A, lu_a_shape)
  lu_b = Expand ({rhs}, lu_rhs_shape)"""
        + _elimination("lu_a", "lu_b", "lu", det=False)
        + """
  lu_ut = Trilu <upper: int = 1> (lu_uf)"""
        + _substitution("lu_ut", "lu_y", "X", "la_true", "bs")
        + "\n}\n"
    )


_SOLVE_BODY = _lu_solve_body("Solve", "A, B", "B")
_INVERSE_BODY = _lu_solve_body("Inverse", "A", "inv_eye").replace(
    "  lu_ab = MatMul (A, inv_eye)",
    """  inv_rc = Unsqueeze (la_r, la_m1)
  inv_is_diag = Equal (inv_rc, la_r)
  inv_eye = CastLike (inv_is_diag, A)
  lu_ab = MatMul (A, inv_eye)""",
)
_SLOGDET_BODY = (
    _LINALG_HEAD
    + "SlogDet (X) => (sign, logabsdet) {"
    + _LINALG_PRELUDE.format(x="X")
    + _elimination("X", None, "lu", det=True)
    + """
  sign = Identity (lu_sign)
  logabsdet = Identity (lu_logabs)
}
"""
)


_LINALG_FUNCTION_DOC = (
    " The ONNX function loops over the matrix size (n from the input's shape, any "
    "batch dims before the last two)"
)
for _name, _ins, _outs, _doc, _body in (
    (
        "Inverse",
        ("A",),
        ("X",),
        "X = A^-1 over the last two dims (torch.linalg.inv)."
        + _LINALG_FUNCTION_DOC
        + ": Gaussian elimination with partial pivoting on [A | I], back substitution.",
        _INVERSE_BODY,
    ),
    (
        "Solve",
        ("A", "B"),
        ("X",),
        "X with A X = B over the last two dims, batch dims broadcast "
        "(torch.linalg.solve, left=True)."
        + _LINALG_FUNCTION_DOC
        + ": Gaussian elimination with partial pivoting on [A | B], back substitution.",
        _SOLVE_BODY,
    ),
    (
        "SlogDet",
        ("X",),
        ("sign", "logabsdet"),
        "The sign and log |det X| over the last two dims (torch.linalg.slogdet); "
        "sign 0 and -inf for a singular X."
        + _LINALG_FUNCTION_DOC
        + ": the pivots of Gaussian elimination with partial pivoting, and the swaps' sign.",
        _SLOGDET_BODY,
    ),
    (
        "Cholesky",
        ("X",),
        ("L",),
        "The lower triangular L with L L^T = X, X symmetric positive definite, its "
        "lower triangle read (torch.linalg.cholesky; upper=True is its transpose)."
        + _LINALG_FUNCTION_DOC
        + ": the outer-product algorithm, a column of L per step.",
        _CHOLESKY_BODY,
    ),
):
    define(OpSchema(_name, _ins, _outs, (), domain=TRACELOG_DOMAIN, doc=_doc, function=_body))


def _lower_by_default(attrs: Mapping[str, object]) -> dict[str, object]:
    """SolveTriangular's function reads ``upper``: 0 where the node leaves it out."""
    return {"upper": 0}


define(
    OpSchema(
        "SolveTriangular",
        ("A", "B"),
        ("X",),
        ("upper",),
        domain=TRACELOG_DOMAIN,
        defaults=(("upper", 0),),
        derived=_lower_by_default,
        doc=(
            "X with A X = B, A triangular (lower, or upper=1; the other triangle is not "
            "read), over the last two dims, batch dims broadcast "
            "(torch.linalg.solve_triangular with left=True, tf.linalg.triangular_solve)."
            + _LINALG_FUNCTION_DOC
            + ": substitution, a row of X per step (backward when upper)."
        ),
        function=_SOLVE_TRIANGULAR_BODY,
    )
)
define(
    OpSchema(
        "Erfinv",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = erfinv(X), the inverse of erf on (-1, 1), +-inf at +-1, NaN beyond "
            "(torch.erfinv, tf.math.erfinv, jax.lax.erf_inv). The ONNX function, in float64 "
            "whatever X's dtype: Newton's method on y >= 0 with erf(y) = |X| from erfinv's "
            "Taylor series (|X| <= 1/2) or erfc's asymptotic form (beyond), "
            f"{_NEWTON_STEPS} steps, on erf(y) - |X| (Cody's erf) where |X| <= 1/2 and on "
            "log erfc(y) - log(1 - |X|) beyond (1 - |X| exact, log erfc by Cody's "
            "erfc(y) exp(y^2)), so that the digits of X near +-1 count; within 1e-14 of the "
            "value's size against scipy.special.erfinv and mpmath, up to 1 - 1e-16 "
            "(tests/test_special_functions.py)."
        ),
        function=_ERFINV_BODY,
    )
)
define(
    OpSchema(
        "Ndtri",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = ndtri(X), the standard normal quantile (the inverse of its CDF) on (0, 1), "
            "-inf at 0, +inf at 1, NaN outside (torch.special.ndtri, tf.math.ndtri, "
            "jax.scipy.special.ndtri). Its own op, not sqrt(2) erfinv(2X - 1): 2X - 1 "
            "rounds away the digits of a small X (ndtri(1e-20) would be -inf). The ONNX "
            "function is Erfinv's Newton iteration, in float64, with 1 - |2X - 1| taken "
            "exactly as 2X or 2(1 - X): within 1e-14 of the value's size against "
            "scipy.special.ndtri and mpmath, down to X's subnormals "
            "(tests/test_special_functions.py)."
        ),
        function=_NDTRI_BODY,
    )
)
define(
    OpSchema(
        "LogNdtr",
        ("X",),
        ("Y",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Y = log of the standard normal CDF at X (torch.special.log_ndtr, "
            "jax.scipy.special.log_ndtr; TensorFlow has no kernel: its programs take "
            "log(erfc(-X / sqrt(2)) / 2) in float64, an asymptotic series below -20, "
            "log1p(-erfc(X / sqrt(2)) / 2) above 0). Its own op: log(ndtr(X)) is -inf "
            "below -38 (float64) and -13 (float32), where this is -X^2 / 2 and more. "
            "The ONNX function, in float64: X <= 0: log(erfc(z) / 2), z = |X| / sqrt(2), "
            "as -X^2 / 2 + log R(z) - log 2 beyond z = 0.46875 (R = erfc(z) exp(z^2), "
            "Cody's rational functions; every term negative, so no cancellation); X > 0: "
            "log1p(-erfc(z) / 2) (Goldberg's log1p), exp(-X^2 / 2) split so that X^2's "
            "rounding is not amplified; within 1e-14 of the value's size against "
            "scipy.special.log_ndtr and mpmath (tests/test_special_functions.py)."
        ),
        function=_LOG_NDTR_BODY,
    )
)
define(
    OpSchema(
        "Atan2",
        ("Y", "X"),
        ("Z",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Z = atan2(Y, X), the angle of the point (X, Y) in [-pi, pi], inputs broadcast "
            "(torch.atan2, tf.math.atan2, jnp.arctan2), signed zeros and infinities as C's "
            "atan2. The ONNX function takes atan(Y / X), plus pi with Y's sign where X is "
            "negative (-0 counted negative); Y / X is taken as Y where both are zero and as "
            "sign(Y) sign(X) where both are infinite. Its error is atan's and the quotient's "
            "rounding: a few ulp."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
Atan2 (Y, X) => (Z) {
  zero_f = Constant <value_float = 0.0> ()
  zero = CastLike (zero_f, Y)
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, Y)
  pi_d = Constant <value = double {3.141592653589793}> ()
  pi = CastLike (pi_d, Y)
  npi = Neg (pi)
  y_zero = Equal (Y, zero)
  x_zero = Equal (X, zero)
  both_zero = And (y_zero, x_zero)
  y_inf = IsInf (Y)
  x_inf = IsInf (X)
  both_inf = And (y_inf, x_inf)
  q = Div (Y, X)
  sy = Sign (Y)
  sx = Sign (X)
  unit = Mul (sy, sx)
  q_inf = Where (both_inf, unit, q)
  ratio = Where (both_zero, Y, q_inf)
  t = Atan (ratio)
  x_below = Less (X, zero)
  inv_x = Div (one, X)
  x_minus_zero = Less (inv_x, zero)
  x_neg = Or (x_below, x_minus_zero)
  y_below = Less (Y, zero)
  inv_y = Div (one, Y)
  y_minus_zero = Less (inv_y, zero)
  y_neg = Or (y_below, y_minus_zero)
  turn = Where (y_neg, npi, pi)
  turned = Add (t, turn)
  Z = Where (x_neg, turned, t)
}
""",
    )
)
define(
    OpSchema(
        "Hypot",
        ("X", "Y"),
        ("Z",),
        (),
        domain=TRACELOG_DOMAIN,
        traits=frozenset({"elementwise"}),
        doc=(
            "Z = sqrt(X^2 + Y^2), inputs broadcast, without overflow or underflow in the "
            "squares (torch.hypot, jnp.hypot; TensorFlow has no kernel: its programs scale "
            "as the ONNX function does); inf where either is infinite, NaN otherwise. The "
            "ONNX function takes m sqrt(1 + (n / m)^2), m = max(|X|, |Y|), n = min(|X|, |Y|) "
            "(0 where m is 0): within 2 ulp."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
Hypot (X, Y) => (Z) {
  zero_f = Constant <value_float = 0.0> ()
  zero = CastLike (zero_f, X)
  one_f = Constant <value_float = 1.0> ()
  one = CastLike (one_f, X)
  inf_f = Constant <value_float = inf> ()
  inf = CastLike (inf_f, X)
  ax = Abs (X)
  ay = Abs (Y)
  m = Max (ax, ay)
  n = Min (ax, ay)
  m_zero = Equal (m, zero)
  safe_m = Where (m_zero, one, m)
  r = Div (n, safe_m)
  r2 = Mul (r, r)
  s = Add (one, r2)
  root = Sqrt (s)
  h = Mul (m, root)
  x_inf = IsInf (X)
  y_inf = IsInf (Y)
  any_inf = Or (x_inf, y_inf)
  Z = Where (any_inf, inf, h)
}
""",
    )
)
define(
    OpSchema(
        "CumProd",
        ("X",),
        ("Y",),
        ("axis",),
        domain=TRACELOG_DOMAIN,
        doc=(
            "Y = the running product of X along `axis` (an int, negative from the end): "
            "Y[..., i, ...] = X[..., 0, ...] * ... * X[..., i, ...] (torch.cumprod, "
            "tf.math.cumprod, jnp.cumprod). ONNX has no running product, and CumSum of "
            "logarithms is wrong for zeros and negative values and loses digits: the ONNX "
            "function takes, for each i, the product over j of X[..., j, ...] where j <= i "
            "and 1 elsewhere (a [n, n] triangle; n^2 memory along the axis), exact for "
            "zeros, negatives and integers."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
CumProd <axis> (X) => (Y) {
  ax = Constant <value_int: int = @axis> ()
  zero = Constant <value_int = 0> ()
  one = Constant <value_int = 1> ()
  first = Constant <value_ints = [0]> ()
  second = Constant <value_ints = [1]> ()
  shape = Shape (X)
  rank = Size (shape)
  ax_shifted = Add (ax, rank)
  ax_pos = Mod (ax_shifted, rank)
  n = Gather <axis = 0> (shape, ax_pos)
  idx = Range (zero, n, one)
  j = Unsqueeze (idx, second)
  i = Unsqueeze (idx, first)
  kept_nn = LessOrEqual (j, i)
  n_1 = Unsqueeze (n, first)
  after = Sub (rank, ax_pos)
  trailing = Sub (after, one)
  trailing_1 = Unsqueeze (trailing, first)
  ones = ConstantOfShape <value = int64[1] {1}> (trailing_1)
  kept_shape = Concat <axis = 0> (n_1, n_1, ones)
  kept = Reshape (kept_nn, kept_shape)
  ax_next = Add (ax_pos, one)
  ax_next_1 = Unsqueeze (ax_next, first)
  x_j = Unsqueeze (X, ax_next_1)
  one_x_f = Constant <value_float = 1.0> ()
  one_x = CastLike (one_x_f, X)
  terms = Where (kept, x_j, one_x)
  ax_1 = Unsqueeze (ax_pos, first)
  Y = ReduceProd <keepdims = 0> (terms, ax_1)
}
""",
    )
)


def _ctc_lse(tag: str, xs: list[str], out: str) -> str:
    """ONNX lines giving ``out`` = log(sum(exp(xs))) as torch's CTC kernel sums it:
    shifted by the largest (0 where all are -inf), the terms in order; -inf
    where all are."""
    lines = [f"  {tag}_top0 = Max ({', '.join(xs)})"]
    lines += [
        f"  {tag}_inf = IsInf ({tag}_top0)",
        f"  {tag}_shift = Where ({tag}_inf, ct_zf, {tag}_top0)",
    ]
    terms = []
    for k, x in enumerate(xs):
        lines += [f"  {tag}_d{k} = Sub ({x}, {tag}_shift)", f"  {tag}_e{k} = Exp ({tag}_d{k})"]
        terms.append(f"{tag}_e{k}")
    acc = terms[0]
    for k, t in enumerate(terms[1:]):
        lines.append(f"  {tag}_s{k} = Add ({acc}, {t})")
        acc = f"{tag}_s{k}"
    lines += [
        f"  {tag}_some = Greater ({acc}, ct_zf)",
        f"  {tag}_safe = Where ({tag}_some, {acc}, ct_onef)",
        f"  {tag}_log = Log ({tag}_safe)",
        f"  {tag}_sum = Add ({tag}_shift, {tag}_log)",
        f"  {out} = Where ({tag}_some, {tag}_sum, ct_ninf)",
    ]
    return "\n".join(lines)


_CTC_BODY = (
    """
<domain: "tracelog", opset_import: ["" : 21]>
CTCLoss <blank, zero_infinity> (log_probs, targets, input_lengths, target_lengths) => (loss) {
  ct_blank = Constant <value_int: int = @blank> ()
  ct_zi_i = Constant <value_int: int = @zero_infinity> ()
  ct_zi = Cast <to: int = 9> (ct_zi_i)
  ct_m1 = Constant <value_ints: ints = [-1]> ()
  ct_zero = Constant <value_int: int = 0> ()
  ct_one = Constant <value_int: int = 1> ()
  ct_two = Constant <value_int: int = 2> ()
  ct_true = Cast <to: int = 9> (ct_one)
  ct_ax0 = Constant <value_ints: ints = [0]> ()
  ct_ax1 = Constant <value_ints: ints = [1]> ()
  ct_ax2 = Constant <value_ints: ints = [2]> ()
  ct_end1 = Constant <value_ints: ints = [-1]> ()
  ct_end2 = Constant <value_ints: ints = [-2]> ()
  ct_ones1 = Constant <value_ints: ints = [1]> ()
  ct_ninf_f = Constant <value_float: float = -inf> ()
  ct_ninf = CastLike (ct_ninf_f, log_probs)
  ct_zero_f = Constant <value_float: float = 0.0> ()
  ct_zf = CastLike (ct_zero_f, log_probs)
  ct_one_f = Constant <value_float: float = 1.0> ()
  ct_onef = CastLike (ct_one_f, log_probs)
  ct_tl_r = Reshape (target_lengths, ct_m1)
  ct_tl = Cast <to: int = 7> (ct_tl_r)
  ct_il_r = Reshape (input_lengths, ct_m1)
  ct_il = Cast <to: int = 7> (ct_il_r)
  ct_tg = Cast <to: int = 7> (targets)
  ct_tg_shape = Shape (ct_tg)
  ct_tg_rank = Size (ct_tg_shape)
  ct_flat = Equal (ct_tg_rank, ct_one)
  ct_padded = If (ct_flat) <then_branch: graph = ct_cat () => (ct_cat_out) {
    ct_w = Size (ct_tg)
    ct_cs = CumSum (ct_tl, ct_zero)
    ct_start = Sub (ct_cs, ct_tl)
    ct_r = Range (ct_zero, ct_w, ct_one)
    ct_start_c = Unsqueeze (ct_start, ct_ax1)
    ct_r_r = Unsqueeze (ct_r, ct_ax0)
    ct_at = Add (ct_start_c, ct_r_r)
    ct_wm1 = Sub (ct_w, ct_one)
    ct_wm1c = Max (ct_wm1, ct_zero)
    ct_at_c = Clip (ct_at, ct_zero, ct_wm1c)
    ct_cat_out = Gather <axis: int = 0> (ct_tg, ct_at_c)
  }, else_branch: graph = ct_pad () => (ct_pad_out) {
    ct_pad_out = Identity (ct_tg)
  }>
  ct_lp_shape = Shape (log_probs)
  ct_t = Gather <axis: int = 0> (ct_lp_shape, ct_zero)
  ct_n = Gather <axis: int = 0> (ct_lp_shape, ct_one)
  ct_c = Gather <axis: int = 0> (ct_lp_shape, ct_two)
  ct_cm1 = Sub (ct_c, ct_one)
  ct_labels = Clip (ct_padded, ct_zero, ct_cm1)
  ct_lab0 = Mul (ct_labels, ct_zero)
  ct_blanks = Add (ct_lab0, ct_blank)
  ct_lab_u = Unsqueeze (ct_labels, ct_ax2)
  ct_bl_u = Unsqueeze (ct_blanks, ct_ax2)
  ct_pair = Concat <axis: int = 2> (ct_bl_u, ct_lab_u)
  ct_n_1 = Unsqueeze (ct_n, ct_ax0)
  ct_ext_shape = Concat <axis: int = 0> (ct_n_1, ct_m1)
  ct_ext0 = Reshape (ct_pair, ct_ext_shape)
  ct_col_shape = Concat <axis: int = 0> (ct_n_1, ct_ones1)
  ct_col = Expand (ct_blank, ct_col_shape)
  ct_ext = Concat <axis: int = 1> (ct_ext0, ct_col)
  ct_ext_cut = Slice (ct_ext, ct_ax0, ct_end2, ct_ax1)
  ct_two_back = Concat <axis: int = 1> (ct_col, ct_col, ct_ext_cut)
  ct_is_blank = Equal (ct_ext, ct_blank)
  ct_not_blank = Not (ct_is_blank)
  ct_same = Equal (ct_ext, ct_two_back)
  ct_differs = Not (ct_same)
  ct_skip = And (ct_not_blank, ct_differs)
  ct_t_1 = Unsqueeze (ct_t, ct_ax0)
  ct_ext_sh = Shape (ct_ext)
  ct_idx_shape = Concat <axis: int = 0> (ct_t_1, ct_ext_sh)
  ct_ext_b = Expand (ct_ext, ct_idx_shape)
  ct_picked = GatherElements <axis: int = 2> (log_probs, ct_ext_b)
  ct_width = Gather <axis: int = 0> (ct_ext_sh, ct_one)
  ct_pos = Range (ct_zero, ct_width, ct_one)
  ct_pos_r = Unsqueeze (ct_pos, ct_ax0)
  ct_has = Greater (ct_tl, ct_zero)
  ct_has_i = Cast <to: int = 7> (ct_has)
  ct_lim = Add (ct_has_i, ct_one)
  ct_lim_c = Unsqueeze (ct_lim, ct_ax1)
  ct_open = Less (ct_pos_r, ct_lim_c)
  ct_p0 = Gather <axis: int = 0> (ct_picked, ct_zero)
  ct_first = Where (ct_open, ct_p0, ct_ninf)
  ct_ninf_col = Expand (ct_ninf, ct_col_shape)
  ct_tm1 = Sub (ct_t, ct_one)
  ct_alpha = Loop (ct_tm1, ct_true, ct_first) <body: graph = ct_step (int64 ct_k, bool ct_cc, ct_a) => (bool ct_cc_out, ct_a_out) {
    ct_cc_out = Identity (ct_cc)
    ct_now = Add (ct_k, ct_one)
    ct_lp_t = Gather <axis: int = 0> (ct_picked, ct_now)
    ct_a1 = Slice (ct_a, ct_ax0, ct_end1, ct_ax1)
    ct_one_back = Concat <axis: int = 1> (ct_ninf_col, ct_a1)
    ct_a2 = Slice (ct_a, ct_ax0, ct_end2, ct_ax1)
    ct_two0 = Concat <axis: int = 1> (ct_ninf_col, ct_ninf_col, ct_a2)
    ct_two_a = Where (ct_skip, ct_two0, ct_ninf)
"""
    + _ctc_lse("ct_l3", ["ct_a", "ct_one_back", "ct_two_a"], "ct_lse")
    + """
    ct_moved = Add (ct_lse, ct_lp_t)
    ct_live = Less (ct_now, ct_il)
    ct_live_c = Unsqueeze (ct_live, ct_ax1)
    ct_a_out = Where (ct_live_c, ct_moved, ct_a)
  }>
  ct_end = Mul (ct_tl, ct_two)
  ct_end_c = Unsqueeze (ct_end, ct_ax1)
  ct_last = GatherElements <axis: int = 1> (ct_alpha, ct_end_c)
  ct_endm1 = Sub (ct_end, ct_one)
  ct_endm1c = Max (ct_endm1, ct_zero)
  ct_endm1_c = Unsqueeze (ct_endm1c, ct_ax1)
  ct_before0 = GatherElements <axis: int = 1> (ct_alpha, ct_endm1_c)
  ct_has_c = Unsqueeze (ct_has, ct_ax1)
  ct_before = Where (ct_has_c, ct_before0, ct_ninf)
"""
    + _ctc_lse("ct_l2", ["ct_last", "ct_before"], "ct_ll")
    + """
  ct_nll_c = Neg (ct_ll)
  ct_nll = Squeeze (ct_nll_c, ct_ax1)
  ct_isinf = IsInf (ct_nll)
  ct_kill = And (ct_isinf, ct_zi)
  loss = Where (ct_kill, ct_zf, ct_nll)
}
"""
)


def _ctc_attrs(attrs: Mapping[str, object]) -> dict[str, object]:
    """CTCLoss's function reads both attributes: 0 where the node leaves one out."""
    return {"blank": 0, "zero_infinity": 0}


define(
    OpSchema(
        "CTCLoss",
        ("log_probs", "targets", "input_lengths", "target_lengths"),
        ("loss",),
        ("blank", "zero_infinity"),
        domain=TRACELOG_DOMAIN,
        defaults=(("blank", 0), ("zero_infinity", 0)),
        doc=(
            "The connectionist temporal classification loss of each sample, unreduced "
            "(torch.nn.functional.ctc_loss with reduction='none'): loss[n] = -log of the "
            "summed probability of every alignment of targets[n] (its first "
            "target_lengths[n] labels) to the first input_lengths[n] steps of log_probs "
            "[T, N, C] (log-probabilities, time-major), label `blank` between and around "
            "the labels. targets is [N, S] padded, or 1-D: the samples' labels "
            "concatenated; the lengths are [N] (0-d for N = 1: torch's unbatched call). An impossible alignment gives inf, or 0 and no gradient where "
            "zero_infinity = 1. A mean over the batch divides each loss by its target "
            "length as ordinary ops after the op. The ONNX function runs the alpha "
            "recursion in log space as torch's kernel sums it, a Loop over the steps "
            "(a sample's alpha kept past its input length), 1-D targets read from each "
            "sample's offset (an If on their rank)."
        ),
        derived=_ctc_attrs,
        function=_CTC_BODY,
    )
)

define(
    OpSchema(
        "Unsupported",
        ("inputs*",),
        ("outputs*",),
        ("source", "reason"),
        domain=TRACELOG_DOMAIN,
        doc=(
            "A source op the adapter could not translate. It keeps the source op's name, the "
            "reason and typed outputs so the log stays complete; emitters refuse it by name."
        ),
    )
)


# -- vision: group norm, transposed convolution, resize (issue 12) --
# GroupNormalization-21: scale and bias per channel (C), not per group as in opset 18.
# ONNX's function body computes the variance as E[x^2] - E[x]^2; the targets compute
# mean((x - mean)^2), which cancels no digits (same meaning, sounder numerics).
_onnx(
    "GroupNormalization",
    "X scale bias",
    "Y",
    "epsilon=0.00001 num_groups stash_type=1 channels_last",
    traits="channels_first",
)
_onnx(
    "ConvTranspose",
    "X W B?",
    "Y",
    "auto_pad dilations group kernel_shape output_padding output_shape pads strides channels_last",
    traits="channels_first",
)
# Resize with `axes` (opset 18+): scales/sizes name the resized axes only, so no
# batch size is written into a graph; the layout pass permutes `axes`.
_onnx(
    "Resize",
    "X roi? scales? sizes?",
    "Y",
    "antialias axes coordinate_transformation_mode cubic_coeff_a=-0.75 exclude_outside "
    "extrapolation_value keep_aspect_ratio_policy mode nearest_mode",
)

# -- attention, masks and indexing (issue 12) -----------------------------------
for _name in "Sin Cos BitwiseNot".split():
    _onnx(_name, "X", "Y", traits="elementwise")
for _name in "LessOrEqual GreaterOrEqual Xor BitwiseAnd BitwiseOr BitwiseXor".split():
    _onnx(_name, "A B", "C", traits="elementwise")
_onnx("Mod", "A B", "C", "fmod=0", traits="elementwise")
_onnx("Trilu", "input k?", "output", "upper=1")
_onnx("CumSum", "x axis", "y", "exclusive=0 reverse=0")
_onnx("GatherElements", "data indices", "output", "axis=0")
# sizes that depend on the data: the slices a 1-D boolean condition selects along
# an axis (x[mask], masked_select), the indices of the nonzero elements as [rank, n]
# (torch.nonzero is its transpose); a jit that traces static shapes cannot run them
_onnx("Compress", "input condition", "output", "axis", traits="data_dependent")
_onnx("NonZero", "X", "Y", traits="data_dependent")
# the k largest (smallest) along an axis, in order, equal elements lower index first
# (torch.sort, argsort, topk: ViT-MAE's random masking sorts its noise)
_onnx("TopK", "X K", "Values Indices", "axis=-1 largest=1 sorted=1")
_onnx("Det", "X", "Y")
_onnx("ScatterElements", "data indices updates", "output", "axis=0 reduction")

# -- recurrent layers (issue 12) --
# X is [seq, batch, input] (layout=0; layout=1 is batch-first), W [dirs, gates*hidden, input],
# R [dirs, gates*hidden, hidden], B [dirs, 2*gates*hidden] (Wb then Rb); Y is
# [seq, dirs, batch, hidden], Y_h and Y_c [dirs, batch, hidden]. Gate order: LSTM i, o, f, c;
# GRU z, r, h (torch's GRU is linear_before_reset=1).
_RECURRENT = "activation_alpha activation_beta activations clip direction hidden_size layout=0"
_onnx(
    "LSTM",
    "X W R B? sequence_lens? initial_h? initial_c? P?",
    "Y? Y_h? Y_c?",
    f"{_RECURRENT} input_forget=0",
)
_onnx("GRU", "X W R B? sequence_lens? initial_h?", "Y? Y_h?", f"{_RECURRENT} linear_before_reset=0")
_onnx("RNN", "X W R B? sequence_lens? initial_h?", "Y? Y_h?", _RECURRENT)

# -- scaled dot-product attention (issue 15) --
define(
    OpSchema(
        "Attention",
        ("Q", "K", "V", "mask?"),
        ("Y",),
        ("scale", "is_causal"),
        domain=TRACELOG_DOMAIN,
        doc=(
            "Scaled dot-product attention as torch's F.scaled_dot_product_attention computes "
            "it: Y = softmax(Q @ K^T * scale + mask) @ V over the last two axes of Q "
            "[..., L, E], K [..., S, E] and V [..., S, Ev] (any leading axes, heads "
            "included; K and V have as many heads as Q: grouped-query heads are repeated "
            "before the op). `mask` is additive, of Q's dtype, broadcast to [..., L, S] "
            "(-inf where a key is masked; a boolean mask is written as 0 / -inf); no mask "
            "means none. `is_causal` = 1 masks key j for query i where j > i (top-left "
            "aligned, as torch's is_causal). A row whose keys are all masked gives 0, and no "
            "gradient, as torch's kernels give (a plain softmax gives NaN there). ONNX's "
            "Attention needs opset 23; this op's function body writes it out at opset 21 "
            "(an absent mask is a scalar 0 there)."
        ),
        function="""
<domain: "tracelog", opset_import: ["" : 21]>
Attention <scale, is_causal> (Q, K, V, mask) => (Y) {
  scale_d = Constant <value: tensor = @scale> ()
  s = CastLike (scale_d, Q)
  qk = Einsum <equation = "...le,...se->...ls"> (Q, K)
  scaled = Mul (qk, s)
  biased = Add (scaled, mask)
  ninf_f = Constant <value_float = -inf> ()
  ninf = CastLike (ninf_f, Q)
  zero_f = Constant <value_float = 0.0> ()
  zero = CastLike (zero_f, Q)
  causal_i = Constant <value_int: int = @is_causal> ()
  causal = Cast <to = 9> (causal_i)
  open = Not (causal)
  start = Constant <value_int = 0> ()
  step = Constant <value_int = 1> ()
  l_1 = Shape <start = -2, end = -1> (Q)
  s_1 = Shape <start = -2, end = -1> (K)
  l = Squeeze (l_1)
  s_n = Squeeze (s_1)
  rows = Range (start, l, step)
  cols = Range (start, s_n, step)
  axis1 = Constant <value_ints = [1]> ()
  rows_c = Unsqueeze (rows, axis1)
  seen = LessOrEqual (cols, rows_c)
  keep = Or (seen, open)
  scores = Where (keep, biased, ninf)
  last = Constant <value_ints = [-1]> ()
  top = ReduceMax <keepdims = 1> (scores, last)
  dead = Equal (top, ninf)
  safe = Where (dead, zero, scores)
  p = Softmax <axis = -1> (safe)
  weights = Where (dead, zero, p)
  Y = Einsum <equation = "...ls,...sd->...ld"> (weights, V)
}
""",
    )
)


def vocabulary() -> list[OpSchema]:
    """Every op, sorted by (domain, name)."""
    return [OPS[k] for k in sorted(OPS)]
