"""What a TensorFlow program carries besides its graph functions: parameters
as tf.Variable, gradients by tf.GradientTape, and the helpers op spellings
call (inlined only when used)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:  # defined by the program: its generated code and the parity check
    PARAMETERS: list[list[Any]] = []
    PREDICT: dict[str, Callable[..., dict[str, Any]]] = {}

    def _load(path: str, narrow: bool = False) -> dict[str, Any]: ...


# the modules this program names float32 through (the float64 translation check
# reads them with float32 meaning float64)
FLOAT_MODULES = ("tf",)

Step = Callable[[dict[str, Any]], tuple[dict[str, Any], Any]]


class Model(tf.Module):
    """The recorded model as a tf.Module, to keep training in TensorFlow.

    Each parameter and buffer is a tf.Variable named by its source path
    (trainable if it trained), in a tree of tf.Modules by the path's segments
    (split on "." and "/"): so model.trainable_variables is what an optimizer
    takes, and checkpoints follow the module tree. A segment's attribute is
    module_attr(segment): "s_" and the segment (model.s_layer1.s_0), an
    identifier no attribute of tf.Module is. model(*inputs, training=...)
    runs the recorded prediction graph of that phase (PREDICT["train"] or
    PREDICT["eval"]; training defaults to False, as Keras layers do),
    assigns the buffer updates it returns (running statistics) to the buffer
    variables, as the source's layers do, and returns the predictions by
    role. Model(weights) takes weights.safetensors' path (or {source name:
    array}, as load_params gives) and declares each variable with the value,
    shape and dtype it holds (PARAMETERS names them, the weights size them),
    and keeps the stored constants the graphs read; load(weights_path)
    assigns a file's values again."""

    def __init__(self, weights: str | dict[str, Any]) -> None:
        super().__init__(name="model")
        arrays = _load(weights, narrow=True) if isinstance(weights, str) else weights
        for name, trains in PARAMETERS:
            *path, leaf = re.split(r"[./]", name)
            owner: tf.Module = self
            for part in path:
                if not hasattr(owner, module_attr(part)):
                    setattr(owner, module_attr(part), tf.Module(name=None))
                owner = getattr(owner, module_attr(part))
                if not isinstance(owner, tf.Module):
                    raise ValueError(f"parameter {name!r}: {part!r} is a parameter and a module")
            if hasattr(owner, module_attr(leaf)):
                raise ValueError(f"parameter {name!r}: its path is taken")
            value = tf.Variable(arrays[name], trainable=trains, name=name)
            setattr(owner, module_attr(leaf), value)
        self.constants = {k: tf.constant(v) for k, v in arrays.items() if k.startswith("const/")}

    def load(self, weights_path: str) -> None:
        """Assign weights.safetensors' values to the variables; keep its stored constants."""
        arrays = _load(weights_path, narrow=True)
        variables = self.source_params()
        for name, *_ in PARAMETERS:
            variables[name].assign(arrays[name])
        self.constants = {k: tf.constant(v) for k, v in arrays.items() if k.startswith("const/")}

    def source_params(self) -> dict[str, Any]:
        """{source name: variable}, and the stored constants: what the graph
        functions read from params."""
        found: dict[str, Any] = {}
        for name, *_ in PARAMETERS:
            node: Any = self
            for part in re.split(r"[./]", name):
                node = getattr(node, module_attr(part))
            found[name] = node
        found.update(self.constants)
        return found

    def __call__(self, *inputs: Any, training: bool = False, rng: Any = None) -> dict[str, Any]:
        phase = "train" if training else "eval"
        if phase not in PREDICT:
            raise NotImplementedError(f"the log recorded no {phase} batch: no {phase} graph")
        params = self.source_params()
        outputs = PREDICT[phase](params, *inputs, rng=rng)
        for role, value in outputs.items():
            if role.startswith("update:"):
                params[role[len("update:") :]].assign(value)
        return {role: v for role, v in outputs.items() if not role.startswith("update:")}


def _module_params(params: dict[str, Any]) -> dict[str, Any]:
    """The check's parameters as Model holds them: a Model built from them,
    read back by source_params(), so the check's gradients are the module's
    own variables'. Names no module tree can hold (a parameter "a" beside
    "a/b.weight": Model's ValueError) are checked as given."""
    try:
        return Model(params).source_params()
    except ValueError:
        return params


def module_attr(segment: str) -> str:
    """The attribute of a source path's segment in Model's tree: "s_" and the
    segment, any character but letters, digits and "_" written as its code
    point in hex between underscores ("-": "_2d_"): a valid identifier that no
    tf.Module attribute is (two segments that read the same are an error)."""
    return "s_" + re.sub(r"[^A-Za-z0-9_]", lambda m: f"_{ord(m[0]):x}_", segment)


def _as_param(array: np.ndarray, trainable: bool) -> tf.Variable:
    return tf.Variable(array, trainable=trainable)


def _as_const(array: np.ndarray) -> tf.Tensor:
    return tf.constant(array)


def _bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the bfloat16 numpy dtype TF ships."""
    return bits.view(tf.bfloat16.as_numpy_dtype)


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x)


def _value_and_grads(step: Step, params: dict[str, Any], trainable: list[str]) -> tuple:
    """step(params) under a GradientTape; gradients of its loss for the
    trainable variables, in order."""
    with tf.GradientTape() as tape:
        outputs, loss = step(params)
    grads = tape.gradient(loss, [params[name] for name in trainable])
    # an embedding's gradient arrives as IndexedSlices
    return outputs, loss, [None if g is None else tf.convert_to_tensor(g) for g in grads]


# Below this many values summed into each, TensorFlow's own column sum is as
# accurate as PyTorch's (1.2x its error at 256 rows, 3x at 4096) and cheaper: the
# helpers below then leave the sum, or the broadcast, to TensorFlow.
SUMMED_ALIKE = 256


def _rows(x: tf.Tensor, axes: list[int]) -> tuple[tf.Tensor, tf.Tensor]:
    """x with `axes` moved last and flattened into one (a row per kept
    element), and x's shape with `axes` as 1 (keepdims'). TensorFlow's CPU Sum
    over leading axes (a column sum, as a bias's gradient over a batch's rows)
    adds each column in one running float32 sum, 4 to 12 times further from
    the exact sum than PyTorch's at 4096 rows and more; over the innermost axis
    it is as accurate as PyTorch's. So the program's long sums over such axes,
    and the gradients of its broadcasts along them, sum rows."""
    rank = len(x.shape)
    summed = sorted({a % rank for a in axes})
    kept = [i for i in range(rank) if i not in summed]
    sizes = tf.unstack(tf.shape(x))
    kept_shape = tf.stack([tf.constant(1) if i in summed else sizes[i] for i in range(rank)])
    if kept and max(kept) > min(summed):
        x = tf.transpose(x, kept + summed)
    lead = tf.gather(kept_shape, tf.constant(kept, tf.int32))
    return tf.reshape(x, tf.concat([lead, [-1]], 0)), kept_shape


def _summed_alike(x: tf.Tensor, axes: list[int]) -> bool:
    """Does a sum of x over `axes` add fewer than SUMMED_ALIKE values into each
    (static sizes: eager)? TensorFlow's own column sum is as accurate there
    (1.2x PyTorch's error at 256 rows) and cheaper."""
    n = 1
    for a in axes:
        size = x.shape[a]
        if size is None:
            return False
        n *= size
    return n < SUMMED_ALIKE


def _reduce_sum(x: tf.Tensor, axes: list[int], keepdims: bool) -> tf.Tensor:
    """tf.math.reduce_sum(x, axes, keepdims), a long sum along the innermost axis."""
    return _row_reduced(tf.math.reduce_sum, x, axes, keepdims)


def _reduce_mean(x: tf.Tensor, axes: list[int], keepdims: bool) -> tf.Tensor:
    """tf.math.reduce_mean(x, axes, keepdims), a long sum along the innermost axis."""
    return _row_reduced(tf.math.reduce_mean, x, axes, keepdims)


def _row_reduced(
    reduce: Callable[..., tf.Tensor], x: tf.Tensor, axes: list[int], keepdims: bool
) -> tf.Tensor:
    """reduce (tf.math.reduce_sum or reduce_mean) over `axes`: TensorFlow's own
    for a short sum, else over _rows' innermost axis."""
    if _summed_alike(x, axes):
        return reduce(x, axes, keepdims=keepdims)
    rows, kept_shape = _rows(x, axes)
    y = reduce(rows, axis=-1)
    return tf.reshape(y, kept_shape) if keepdims else y


def _broadcast(x: tf.Tensor, *others: Any) -> tf.Tensor:
    """x broadcast against `others`, the other operands of its element-wise
    op, whose gradient is a long sum along the innermost axis (x as it is
    where that sum is short: the op broadcasts it)."""
    wide = x.shape
    for other in others:
        wide = tf.broadcast_static_shape(wide, tf.TensorShape(getattr(other, "shape", ())))
    n, own = wide.num_elements(), x.shape.num_elements()
    if n is not None and own is not None and n < SUMMED_ALIKE * max(own, 1):
        return x
    shape = tf.shape(x)
    for other in others:
        shape = tf.broadcast_dynamic_shape(shape, tf.shape(other))
    return _broadcast_rows(x, shape)


def _bias_add(y: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """y + bias, the bias's gradient a long sum along the innermost axis."""
    return y + _broadcast(bias, y)


def _broadcast_to(x: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """tf.broadcast_to(x, shape), whose gradient is a long sum along the
    innermost axis."""
    n, own = tf.get_static_value(tf.reduce_prod(shape)), x.shape.num_elements()
    if n is not None and own is not None and n < SUMMED_ALIKE * max(own, 1):
        return tf.broadcast_to(x, shape)
    return _broadcast_rows(x, shape)


@tf.custom_gradient
def _broadcast_rows(x: tf.Tensor, shape: tf.Tensor) -> Any:
    """tf.broadcast_to(x, shape), whose gradient sums along the innermost axis."""

    def grad(dy: tf.Tensor) -> tuple[tf.Tensor, None]:
        wide = [1] * (len(dy.shape) - len(x.shape)) + list(x.shape)
        axes = [i for i, n in enumerate(wide) if n == 1 and dy.shape[i] != 1]
        if not axes:
            return tf.reshape(dy, tf.shape(x)), None
        return tf.reshape(_reduce_sum(dy, axes, False), tf.shape(x)), None

    return tf.broadcast_to(x, shape), grad


def _gate_table() -> dict[str, Any]:
    """The gates this target's programs call (the parity check's _GateView:
    ops whose derivative jumps at a kink), by the global each is reached
    through and its attribute path: relu, max and min (a clip is the two),
    leaky_relu."""
    return {
        "tf": {
            "nn": {"relu": "relu", "leaky_relu": "leaky_relu"},
            "math": {"maximum": "max", "minimum": "min"},
        }
    }


def _gate_sign(value: tf.Tensor, kink: Any) -> tf.Tensor:
    """sign(value - kink) per element, as the comparisons decide it (int8)."""
    return tf.cast(value > kink, tf.int8) - tf.cast(value < kink, tf.int8)


def _gate_where(mask: np.ndarray, x: Any, y: tf.Tensor) -> tf.Tensor:
    """x where the recorded mask holds, else y, in y's dtype."""
    return tf.where(mask, tf.cast(x, y.dtype), y)


def _batch_norm_train(
    x: tf.Tensor,
    scale: tf.Tensor,
    bias: tf.Tensor,
    running_mean: tf.Tensor,
    running_var: tf.Tensor,
    eps: float,
    momentum: float,
    axes: list[int],
    channel_axis: int,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Batch norm in training mode as PyTorch computes it on the CPU: batch
    statistics, output and gradients accumulated in float64, cast once; the
    running variance updates with the unbiased one. (The float32 arithmetic
    left the scale and bias gradients, sums over the batch, several times
    less accurate than PyTorch's own.)"""
    shape = [1] * len(x.shape)
    shape[channel_axis] = -1
    x64 = tf.cast(x, tf.float64)
    mean, var = tf.nn.moments(x64, axes=axes)
    a = tf.cast(scale, tf.float64) / tf.sqrt(var + eps)
    # centred before scaling: the scale's gradient is then sum(dy * (x - mean)), as
    # PyTorch's backward sums it (x * a + (bias - mean * a) differentiates to
    # sum(dy * x) - mean * sum(dy), which cancels by |mean| / std of the channel)
    centred = x64 - tf.reshape(mean, shape)
    y = tf.cast(
        centred * tf.reshape(a, shape) + tf.reshape(tf.cast(bias, tf.float64), shape), x.dtype
    )
    n = tf.cast(tf.size(x) // tf.size(mean), tf.float64)
    new_mean = (1.0 - momentum) * running_mean + momentum * tf.cast(mean, x.dtype)
    new_var = (1.0 - momentum) * running_var + momentum * tf.cast(var * n / (n - 1.0), x.dtype)
    return y, new_mean, new_var


def _batch_norm_train_weighted(
    x: tf.Tensor,
    scale: tf.Tensor,
    bias: tf.Tensor,
    running_mean: tf.Tensor,
    running_var: tf.Tensor,
    eps: float,
    momentum: float,
    decay: float,
    unbiased: bool,
    axes: list[int],
    channel_axis: int,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Batch norm in training mode whose running statistics update as
    decay * running + momentum * batch statistic (Keras: decay is its momentum),
    the variance biased unless `unbiased`; the output through
    tf.nn.batch_normalization, the kernel Keras calls."""
    shape = [1] * len(x.shape)
    shape[channel_axis] = -1
    mean, var = tf.nn.moments(x, axes=axes)
    y = tf.nn.batch_normalization(
        x,
        tf.reshape(mean, shape),
        tf.reshape(var, shape),
        tf.reshape(bias, shape),
        tf.reshape(scale, shape),
        eps,
    )
    mean, var = tf.stop_gradient(mean), tf.stop_gradient(var)
    if unbiased:
        n = tf.cast(tf.size(x) // tf.size(mean), x.dtype)
        var = var * n / (n - 1.0)
    return y, decay * running_mean + momentum * mean, decay * running_var + momentum * var


def _batch_norm_eval(
    x: tf.Tensor,
    scale: tf.Tensor,
    bias: tf.Tensor,
    mean: tf.Tensor,
    var: tf.Tensor,
    eps: float,
    channel_axis: int,
) -> tf.Tensor:
    shape = [1] * len(x.shape)
    shape[channel_axis] = -1
    y = (x - tf.reshape(mean, shape)) / tf.sqrt(tf.reshape(var, shape) + eps)
    return _bias_add(y * _broadcast(tf.reshape(scale, shape), y), tf.reshape(bias, shape))


def _gelu(x: tf.Tensor, approximate: bool) -> tf.Tensor:
    """GELU as PyTorch and ONNX define it: x/2 (1 + erf(x / sqrt 2)), or with
    approximate the tanh form. (tf.nn.gelu is off by ~1e-9 in float64: its
    kernel's constants are float32.)"""
    if approximate:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + tf.math.tanh(inner))
    return 0.5 * x * (1.0 + tf.math.erf(x * 0.7071067811865476))


def _leaky_relu(x: tf.Tensor, alpha: float) -> tf.Tensor:
    """LeakyRelu as relu(x) + alpha (x - relu(x)): exact on either side of 0
    in any dtype (alpha x in float32 is the kernel's own product), with the
    slope as its gradient at 0, as PyTorch and TF's kernel have it.
    (tf.nn.leaky_relu takes alpha as a float32 attribute: 0.1 is
    0.10000000149 in a float64 run, 1.5e-8 off.)"""
    positive = tf.nn.relu(x)
    return positive + (x - positive) * alpha


def _fmod(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """C's fmod, the dividend's sign (ONNX Mod with fmod=1, torch.fmod): the
    value tf.truncatemod's kernel gives, and fmod's gradient, which TensorFlow
    registers none for: 1 for a, -trunc(a / b) for b (the added terms are 0)."""
    r = tf.stop_gradient(tf.truncatemod(a, b))
    if not a.dtype.is_floating:
        return r
    q = tf.stop_gradient(a / b)
    q = tf.where(q < 0, tf.math.ceil(q), tf.math.floor(q))
    return r + (a - tf.stop_gradient(a)) - (b - tf.stop_gradient(b)) * q


def _hypot(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """sqrt(x^2 + y^2) as torch.hypot and jnp.hypot compute it, without the
    squares' overflow or underflow (TensorFlow has no hypot): scaled by
    m = max(|x|, |y|) (1 where m is 0), inf where either is infinite."""
    m = tf.math.maximum(tf.math.abs(x), tf.math.abs(y))
    m = tf.where(m == 0, tf.ones_like(m), m)
    h = m * tf.math.sqrt(tf.math.square(x / m) + tf.math.square(y / m))
    inf = tf.math.logical_or(tf.math.is_inf(x), tf.math.is_inf(y))
    return tf.where(inf, tf.constant(float("inf"), h.dtype), h)


def _erfinv(x: tf.Tensor) -> tf.Tensor:
    """erfinv as torch computes it, in float64 whatever x's dtype: TensorFlow's
    own kernel loses digits near 0 (2e4 float32 ulp at 3e-5, 1e-11 in float64
    at 1e-5) and near +-1 (inf at 1 - 2^-53). Beyond |x| = 1/2 it is
    -ndtri((1 - |x|) / 2) / sqrt(2), 1 - |x| exact there (tf.math.ndtri keeps
    a small argument's digits); within, two Newton steps on erf(y) = x from
    tf.math.erfinv's value. Gradients flow through both."""
    wide = tf.cast(x, tf.float64)
    a = tf.math.abs(wide)
    c = tf.clip_by_value(wide, -0.5, 0.5)
    y = tf.math.erfinv(c)
    for _ in range(2):
        y = y - (tf.math.erf(y) - c) * 0.88622692545275801365 * tf.math.exp(y * y)
    tail = tf.math.ndtri(tf.math.minimum(1.0 - a, 0.5) / 2.0) * -0.70710678118654752440
    tail = tf.where(wide < 0, -tail, tail)
    return tf.cast(tf.where(a <= 0.5, y, tail), x.dtype)


def _log_ndtr(x: tf.Tensor) -> tf.Tensor:
    """log of the standard normal CDF, as torch.special.log_ndtr computes it
    (TensorFlow has no log_ndtr), in float64 whatever x's dtype:
    log1p(-erfc(x / sqrt(2)) / 2) above 0, log(erfc(-x / sqrt(2)) / 2) down to
    -20, below it -x^2 / 2 - log(-x) - log(2 pi) / 2 + log(1 + sum (-1)^n
    (2n - 1)!! / x^(2n)), n <= 10 (the asymptotic series: erfc underflows).
    Each branch reads its inputs clamped, so the others' gradients are finite."""
    wide = tf.cast(x, tf.float64)
    hi = tf.math.log1p(-0.5 * tf.math.erfc(tf.math.maximum(wide, 0.0) * 0.70710678118654752440))
    mid = tf.math.erfc(tf.clip_by_value(wide, -20.0, 0.0) * -0.70710678118654752440)
    mid = tf.math.log(0.5 * mid)
    lo = tf.math.minimum(wide, -20.0)
    inv = 1.0 / (lo * lo)
    series, term = tf.ones_like(lo), tf.ones_like(lo)
    for n in range(1, 11):
        term = term * -(2 * n - 1) * inv
        series = series + term
    far = -0.5 * lo * lo - tf.math.log(-lo) - 0.91893853320467274178 + tf.math.log(series)
    y = tf.where(wide > 0, hi, tf.where(wide > -20.0, mid, far))
    return tf.cast(y, x.dtype)


def _solve_broadcast(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """X with A X = B, A's and B's batch dims broadcast (tf.linalg.solve takes
    equal ones): each is broadcast to the common batch shape, and each matrix
    of the batch is factored on its own, as torch.linalg.solve does."""
    batch = tf.broadcast_dynamic_shape(tf.shape(a)[:-2], tf.shape(b)[:-2])
    a = tf.broadcast_to(a, tf.concat([batch, tf.shape(a)[-2:]], 0))
    b = tf.broadcast_to(b, tf.concat([batch, tf.shape(b)[-2:]], 0))
    return tf.linalg.solve(a, b)


def _layer_norm(
    x: tf.Tensor, scale: tf.Tensor, bias: tf.Tensor | None, axes: list[int], eps: float
) -> tf.Tensor:
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    y = (x - mean) / tf.sqrt(var + eps) * _broadcast(scale, x)
    return y if bias is None else _bias_add(y, bias)


def _attention(
    q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None, scale: float, causal: bool
) -> tf.Tensor:
    """softmax(q @ k^T * scale + mask) @ v over [..., length, dim], as torch's
    scaled_dot_product_attention: is_causal masks each query's later keys, and a
    query whose keys are all masked gives 0 (not NaN) and no gradient."""
    scores = tf.linalg.matmul(q, k, transpose_b=True) * scale
    if mask is not None:
        scores = scores + mask
    ninf = tf.constant(-np.inf, scores.dtype)
    if causal:
        rows, cols = tf.shape(q)[-2], tf.shape(k)[-2]
        scores = tf.where(tf.range(cols)[None, :] <= tf.range(rows)[:, None], scores, ninf)
    dead = tf.math.reduce_max(scores, axis=-1, keepdims=True) == ninf
    zeros = tf.zeros_like(scores)
    weights = tf.nn.softmax(tf.where(dead, zeros, scores), axis=-1)
    return tf.linalg.matmul(tf.where(dead, zeros, weights), v)


def _dropout(x: tf.Tensor, rate: Any, rng: Any, key: str) -> tuple[tf.Tensor, tf.Tensor]:
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay), a tf.random.Generator, or None for the
    global generator."""
    if isinstance(rng, dict):
        mask = tf.cast(rng[key], x.dtype)
    else:
        gen = rng if rng is not None else tf.random.get_global_generator()
        mask = tf.cast(gen.uniform(tf.shape(x)) >= tf.cast(rate, tf.float32), x.dtype)
    return x * (mask / (1.0 - rate)), tf.cast(mask, tf.bool)


def _uniform(like: tf.Tensor, low: float, high: float, rng: Any, key: str) -> tf.Tensor:
    """Values drawn uniformly from [low, high), of like's shape and dtype. rng: a
    dict of recorded draws (parity replay), a tf.random.Generator, or None for the
    global generator."""
    if isinstance(rng, dict):
        return tf.cast(rng[key], like.dtype)
    gen = rng if rng is not None else tf.random.get_global_generator()
    return gen.uniform(tf.shape(like), low, high, dtype=like.dtype)


def _normal(like: tf.Tensor, mean: float, scale: float, rng: Any, key: str) -> tf.Tensor:
    """Values drawn from N(mean, scale^2), of like's shape and dtype. rng: a dict of
    recorded draws (parity replay), a tf.random.Generator, or None for the global
    generator."""
    if isinstance(rng, dict):
        return tf.cast(rng[key], like.dtype)
    gen = rng if rng is not None else tf.random.get_global_generator()
    return gen.normal(tf.shape(like), mean, scale, dtype=like.dtype)


def _exponential(like: tf.Tensor, rng: Any, key: str) -> tf.Tensor:
    """Values drawn from the exponential distribution of rate 1, of like's shape and
    dtype: -log(1 - U), U uniform in [0, 1). rng: a dict of recorded draws (parity
    replay), a tf.random.Generator, or None for the global generator."""
    if isinstance(rng, dict):
        return tf.cast(rng[key], like.dtype)
    gen = rng if rng is not None else tf.random.get_global_generator()
    return -tf.math.log1p(-gen.uniform(tf.shape(like), 0.0, 1.0, dtype=like.dtype))


def _topk(x: tf.Tensor, k: int | None, axis: int, largest: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """ONNX TopK: the k largest (smallest) along axis, in order, equal elements
    lower index first (a stable argsort, cut to k, and the values it picks; None:
    the whole axis)."""
    order = "DESCENDING" if largest else "ASCENDING"
    indices = tf.argsort(x, axis=axis, direction=order, stable=True)
    if k is not None:
        indices = tf.gather(indices, tf.range(k), axis=axis)
    values = tf.experimental.numpy.take_along_axis(x, indices, axis=axis)
    return values, tf.cast(indices, tf.int64)


def _nll_loss(
    logp: tf.Tensor,
    target: tf.Tensor,
    weight: tf.Tensor | None,
    reduction: str,
    ignore_index: int | None,
) -> tf.Tensor:
    """ONNX NegativeLogLikelihoodLoss: class axis 1, targets of shape [N, ...]."""
    c = logp.shape[1]
    perm = [0] + list(range(2, len(logp.shape))) + [1]
    flat = tf.reshape(tf.transpose(logp, perm), [-1, c])
    t = tf.reshape(target, [-1])
    valid = (
        tf.ones_like(t, dtype=tf.bool) if ignore_index is None else tf.not_equal(t, ignore_index)
    )
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


def _dilate_kernel(w: tf.Tensor, rates: list[int]) -> tf.Tensor:
    """An HWIO kernel with (rate - 1) zeros between taps: a dilated convolution
    as a plain one, which TensorFlow can differentiate on the CPU."""
    kh, kw, cin, cout = w.shape
    taps = [[i * rates[0], j * rates[1]] for i in range(kh) for j in range(kw)]
    shape = [(kh - 1) * rates[0] + 1, (kw - 1) * rates[1] + 1, cin, cout]
    return tf.scatter_nd(taps, tf.reshape(w, [kh * kw, cin, cout]), shape)


def _grouped_conv2d(
    x: tf.Tensor, w: tf.Tensor, groups: int, strides: list[int], padding: list[list[int]]
) -> tf.Tensor:
    """Grouped convolution (NHWC input, OIHW weights) as one conv per group."""
    xs = tf.split(x, groups, axis=3)
    ws = tf.split(tf.transpose(w, [2, 3, 1, 0]), groups, axis=3)
    ys = [tf.nn.conv2d(a, b, strides=strides, padding=padding) for a, b in zip(xs, ws, strict=True)]
    return tf.concat(ys, axis=3)


def _conv_nd(
    x: tf.Tensor,
    w: tf.Tensor,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    groups: int,
) -> tf.Tensor:
    """A 1-D or 3-D ONNX Conv on channels-last x with OI... weights: explicit
    pads by tf.pad (conv1d/conv3d take only SAME or VALID), a dilated kernel
    spread with zeros (TF's CPU kernels have no dilated gradients), groups as
    one convolution each."""
    n = len(x.shape) - 2
    for axis, rate in enumerate(dilations):
        w = _dilate_axis(w, axis + 2, rate)
    w = tf.transpose(w, [*range(2, n + 2), 1, 0])  # OI... -> ...IO
    x = tf.pad(x, [[0, 0], *([pads[i], pads[i + n]] for i in range(n)), [0, 0]])
    xs, ws = tf.split(x, groups, axis=-1), tf.split(w, groups, axis=-1)
    # conv3d with its data_format spelled out: tf.nn.convolution leaves it None,
    # which Conv3D's registered gradient cannot read
    conv = (
        (lambda a, b: tf.nn.conv1d(a, b, strides[0], "VALID"))
        if n == 1
        else (lambda a, b: tf.nn.conv3d(a, b, [1, *strides, 1], "VALID", data_format="NDHWC"))
    )
    ys = [conv(a, b) for a, b in zip(xs, ws, strict=True)]
    return ys[0] if groups == 1 else tf.concat(ys, axis=-1)


# -- vision: group norm, transposed convolution, resize (issue 12) --
def _group_norm(
    x: tf.Tensor, scale: tf.Tensor, bias: tf.Tensor, groups: int, eps: float, channel_axis: int
) -> tf.Tensor:
    """ONNX GroupNormalization: statistics per sample and group of channels
    (channel_axis: 1, or the last axis for channels-last data), the variance
    as the mean of squared deviations, not E[x^2] - E[x]^2. The mean gets one
    correction pass, so that over values far from zero the rounding of their
    sum does not swamp the deviations."""
    rank = len(x.shape)
    c = x.shape[channel_axis]
    shape = tf.shape(x)
    split = [shape[:channel_axis], [groups, c // groups], shape[channel_axis + 1 :]]
    g = tf.reshape(x, tf.concat(split, 0))
    axes = [d for d in range(1, rank + 1) if d != channel_axis]
    rough = tf.math.reduce_mean(g, axis=axes, keepdims=True)
    mean = rough + tf.math.reduce_mean(g - rough, axis=axes, keepdims=True)
    var = tf.math.reduce_mean(tf.math.squared_difference(g, mean), axis=axes, keepdims=True)
    y = tf.reshape((g - mean) / tf.sqrt(var + eps), shape)
    param = [1] * rank
    param[channel_axis] = -1
    return _bias_add(y * _broadcast(tf.reshape(scale, param), y), tf.reshape(bias, param))


def _dilate_axis(t: tf.Tensor, axis: int, rate: int) -> tf.Tensor:
    """t with rate - 1 zeros between neighbours along a static axis."""
    if rate == 1:
        return t
    shape = list(t.shape)
    padding = [[0, 0]] * (len(shape) + 1)
    padding[axis + 1] = [0, rate - 1]
    spread = tf.reshape(
        tf.pad(tf.expand_dims(t, axis + 1), padding),
        shape[:axis] + [shape[axis] * rate] + shape[axis + 1 :],
    )
    return tf.gather(spread, list(range((shape[axis] - 1) * rate + 1)), axis=axis)


def _conv_transpose(
    x: tf.Tensor,
    w: tf.Tensor,
    b: tf.Tensor | None,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    output_padding: list[int],
    group: int,
    channels_last: bool,
) -> tf.Tensor:
    """ONNX ConvTranspose with TensorFlow's transposed-convolution kernels,
    which run channels last: the full (VALID) output, then `pads` cropped from
    each end, output_padding positions kept from the end crop (zeros where it
    runs out), then the bias. TF's CPU kernels take no dilation: the kernel gets zeros
    between its taps instead (the same sums). Groups run one by one."""
    n = len(x.shape) - 2
    if not channels_last:
        x = tf.transpose(x, [0, *range(2, n + 2), 1])
    k = list(w.shape[2:])
    keff = [d * (kk - 1) + 1 for kk, d in zip(k, dilations, strict=True)]
    shape = tf.shape(x)
    full = [(shape[1 + i] - 1) * strides[i] + keff[i] for i in range(n)]
    ys = []
    for xg, wg in zip(tf.split(x, group, axis=-1), tf.split(w, group, axis=0), strict=True):
        wg = tf.transpose(wg, [*range(2, n + 2), 1, 0])  # (k..., C_out/g, C_in/g)
        for i, d in enumerate(dilations):
            wg = _dilate_axis(wg, i, d)
        out_shape = tf.stack([shape[0], *full, wg.shape[-2]])
        ys.append(tf.nn.conv_transpose(xg, wg, out_shape, strides, padding="VALID"))
    y = ys[0] if group == 1 else tf.concat(ys, axis=-1)
    ends = [pads[n + i] - output_padding[i] for i in range(n)]
    crop = [slice(pads[i], -e if e > 0 else None) for i, e in enumerate(ends)]
    y = y[tuple([slice(None), *crop, slice(None)])]
    if any(e < 0 for e in ends):
        y = tf.pad(y, [[0, 0], *([0, max(-e, 0)] for e in ends), [0, 0]])
    if b is not None:
        y = _bias_add(y, b)  # channels last: the bias broadcasts along the last axis
    return y if channels_last else tf.transpose(y, [0, n + 1, *range(1, n + 1)])


def _resize_taps(
    n_in: int, n_out: int, scale: float, mode: str, coord: str, nearest: str, cubic_a: float
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Resize along one axis (no roi, antialias or exclude_outside): the
    input index of each output position's taps [n_out, k] and their weights
    [n_out, k], in float64 as onnx.reference computes them; out-of-range taps
    read the edge."""
    y = np.arange(n_out, dtype=np.float64)
    # ONNX's resized length is n_in * scale, before its floor
    if coord == "align_corners":
        x = np.zeros(n_out) if n_out == 1 else y * (n_in - 1) / (n_in * scale - 1)
    elif coord == "asymmetric":
        x = y / scale
    else:  # half_pixel
        x = (y + 0.5) / scale - 0.5
    if mode == "nearest":
        rounded = {
            "floor": np.floor(x),
            "ceil": np.ceil(x),
            "round_prefer_floor": np.ceil(x - 0.5),
            "round_prefer_ceil": np.floor(x + 0.5),
        }[nearest]
        return np.clip(rounded, 0, n_in - 1).astype(np.int64)[:, None], np.ones((n_out, 1))
    base = np.floor(x)
    t = x - base
    if mode == "linear":
        offsets, weights = [0, 1], [1 - t, t]
    else:  # cubic: Keys' kernel with a = cubic_a, over the taps at -1, 0, 1, 2
        a = cubic_a

        def keys(s: np.ndarray) -> np.ndarray:
            s = np.abs(s)
            near = ((a + 2) * s - (a + 3)) * s * s + 1
            return np.where(s <= 1, near, ((a * s - 5 * a) * s + 8 * a) * s - 4 * a)

        offsets, weights = [-1, 0, 1, 2], [keys(t + 1), keys(t), keys(1 - t), keys(2 - t)]
    index = np.clip(base.astype(np.int64)[:, None] + np.asarray(offsets), 0, n_in - 1)
    return index, np.stack(weights, axis=1)


def _resized(
    n_in: int, k: int, scales: list[float] | None, sizes: list[int] | None
) -> tuple[int, float]:
    """Axis k's output length and scale: sizes[k] and sizes[k] / n_in, or
    floor(n_in * scales[k]) and scales[k] (ONNX Resize)."""
    if sizes is not None:
        return sizes[k], sizes[k] / n_in
    assert scales is not None
    return int(np.floor(n_in * scales[k])), scales[k]


def _resize(
    x: tf.Tensor,
    axes: list[int],
    scales: list[float] | None,
    sizes: list[int] | None,
    mode: str,
    coord: str,
    nearest: str,
    cubic_a: float,
) -> tf.Tensor:
    """ONNX Resize, one axis after another: a weighted sum of gathered taps
    (a plain gather for nearest), the tables computed from the static shape.
    tf.image.resize is not used: its nearest rounds half-pixel centres, its
    bicubic is Keys' a = -0.5, and it takes no scale that differs from out / in."""
    for k, axis in enumerate(axes):
        n_in = int(x.shape[axis])
        n_out, scale = _resized(n_in, k, scales, sizes)
        if scale == 1.0 and n_out == n_in:
            continue
        index, weight = _resize_taps(n_in, n_out, scale, mode, coord, nearest, cubic_a)
        shape = [1] * len(x.shape)
        shape[axis] = n_out
        taps = [tf.gather(x, index[:, j], axis=axis) for j in range(index.shape[1])]
        if mode == "nearest":
            x = taps[0]
            continue
        w = [tf.constant(weight[:, j].reshape(shape), x.dtype) for j in range(len(taps))]
        x = tf.add_n([t * wj for t, wj in zip(taps, w, strict=True)])
    return x


def _recurrent(
    cell: str,
    x: tf.Tensor,
    w: tf.Tensor,
    r: tf.Tensor,
    b: tf.Tensor | None,
    states: list[tf.Tensor | None],
    direction: str,
    lens: tf.Tensor | None = None,
) -> tuple[tf.Tensor, ...]:
    """An ONNX LSTM, GRU or RNN node (layout 0), `cell` "lstm", "gru", "gru0" (GRU with
    linear_before_reset=0), "tanh" or "relu": one tf.scan over time per direction.
    With `lens` (ONNX sequence_lens) a row's steps from its length on output zeros and
    keep its state. Returns Y [seq, dirs, batch, hidden] and the final states
    [dirs, batch, hidden]."""
    hidden = int(r.shape[-1])
    valid = None
    if lens is not None:
        steps = tf.range(tf.shape(x)[0], dtype=lens.dtype)
        valid = steps[:, None] < lens[None, :]
    ys, finals = [], []
    for d in range(int(w.shape[0])):
        if b is None:
            wb = rb = tf.zeros([int(w.shape[1])], x.dtype)
        else:
            wb, rb = tf.split(b[d], 2)
        # every step's input projection at once
        xw = tf.einsum("tbi,gi->tbg", x, w[d]) + wb
        zeros = tf.zeros_like(xw[0, :, :hidden])
        init = tuple(zeros if s is None else s[d] for s in states)
        reverse = direction == "reverse" or d == 1
        y, final = _recurrent_direction(cell, xw, r[d], rb, init, reverse, valid)
        ys.append(y)
        finals.append(final)
    y = tf.stack(ys, axis=1)
    return (y, *(tf.stack([f[k] for f in finals]) for k in range(len(states))))


def _recurrent_direction(
    cell: str,
    xw: tf.Tensor,
    r: tf.Tensor,
    rb: tf.Tensor,
    init: tuple,
    reverse: bool,
    valid: tf.Tensor | None,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """One direction of a layer: each step's hidden state, and the final carry."""
    if valid is None:

        def step(carry: tuple, xw_t: tf.Tensor) -> tuple:
            return _recurrent_cell(cell, carry, xw_t, r, rb)

        # tf.scan keeps each step's carry at its step's index, reversed or not
        carries = tf.scan(step, xw, init, reverse=reverse)
        return carries[0], [c[0] if reverse else c[-1] for c in carries]

    def masked(acc: tuple, xs: tuple) -> tuple:
        xw_t, valid_t = xs
        carry = acc[1:]
        new = _recurrent_cell(cell, carry, xw_t, r, rb)
        keep = valid_t[:, None]  # past a row's length: the state stays, the output is 0
        new = tuple(tf.where(keep, n, c) for n, c in zip(new, carry, strict=True))
        return (tf.where(keep, new[0], tf.zeros_like(new[0])), *new)

    acc = tf.scan(masked, (xw, valid), (tf.zeros_like(init[0]), *init), reverse=reverse)
    return acc[0], [c[0] if reverse else c[-1] for c in acc[1:]]


def _recurrent_cell(cell: str, carry: tuple, xw: tf.Tensor, r: tf.Tensor, rb: tf.Tensor) -> tuple:
    """One step, from xw = x W^T + Wb: an LSTM (ONNX's gates i, o, f, c), a GRU (z, r, h;
    "gru": linear_before_reset=1, as torch and Keras' default compute it: the reset gate
    scales h R_h^T + Rb_h; "gru0": it scales h before R_h, Keras' reset_after=False) or
    an RNN with tanh or relu."""
    h = carry[0]
    if cell == "gru0":
        hidden = int(h.shape[-1])
        xz, xr, xh = tf.split(xw, 3, axis=-1)
        hzr = tf.linalg.matmul(h, r[: 2 * hidden], transpose_b=True) + rb[: 2 * hidden]
        hz, hr_ = tf.split(hzr, 2, axis=-1)
        z = tf.math.sigmoid(xz + hz)
        rh = tf.math.sigmoid(xr + hr_) * h
        n = tf.math.tanh(
            xh + tf.linalg.matmul(rh, r[2 * hidden :], transpose_b=True) + rb[2 * hidden :]
        )
        return ((1.0 - z) * n + z * h,)
    hr = tf.linalg.matmul(h, r, transpose_b=True) + rb
    if cell == "lstm":
        i, o, f, g = tf.split(xw + hr, 4, axis=-1)
        c = tf.math.sigmoid(f) * carry[1] + tf.math.sigmoid(i) * tf.math.tanh(g)
        return tf.math.sigmoid(o) * tf.math.tanh(c), c
    if cell == "gru":
        xz, xr, xh = tf.split(xw, 3, axis=-1)
        hz, hr_, hh = tf.split(hr, 3, axis=-1)
        z = tf.math.sigmoid(xz + hz)
        n = tf.math.tanh(xh + tf.math.sigmoid(xr + hr_) * hh)
        return ((1.0 - z) * n + z * h,)
    return (tf.nn.relu(xw + hr) if cell == "relu" else tf.math.tanh(xw + hr),)


def _lstm(
    x: tf.Tensor,
    w: tf.Tensor,
    r: tf.Tensor,
    b: tf.Tensor | None,
    h0: tf.Tensor | None,
    c0: tf.Tensor | None,
    direction: str,
    lens: tf.Tensor | None = None,
) -> tuple[tf.Tensor, ...]:
    return _recurrent("lstm", x, w, r, b, [h0, c0], direction, lens)


def _gru(
    x: tf.Tensor,
    w: tf.Tensor,
    r: tf.Tensor,
    b: tf.Tensor | None,
    h0: tf.Tensor | None,
    direction: str,
    lens: tf.Tensor | None = None,
    linear_before_reset: int = 1,
) -> tuple[tf.Tensor, ...]:
    return _recurrent("gru" if linear_before_reset else "gru0", x, w, r, b, [h0], direction, lens)


def _rnn(
    x: tf.Tensor,
    w: tf.Tensor,
    r: tf.Tensor,
    b: tf.Tensor | None,
    h0: tf.Tensor | None,
    direction: str,
    activation: str,
    lens: tf.Tensor | None = None,
) -> tuple[tf.Tensor, ...]:
    return _recurrent(activation, x, w, r, b, [h0], direction, lens)


# -- CTC loss ---------------------------------------------------------------------------
def _ctc_logsumexp(*xs: tf.Tensor) -> tf.Tensor:
    """log(sum(exp(xs))) as torch's CTC kernel sums it (shifted by the largest, 0
    where all are -inf, the terms in order); -inf where all are, with no
    gradient there (not NaN: the log's and the shift's are masked)."""
    top = functools.reduce(tf.math.maximum, xs)
    shift = tf.stop_gradient(tf.where(tf.math.is_finite(top), top, tf.zeros_like(top)))
    total = functools.reduce(lambda a, b: a + b, [tf.math.exp(x - shift) for x in xs])
    some = total > 0
    summed = shift + tf.math.log(tf.where(some, total, tf.ones_like(total)))
    return tf.where(some, summed, tf.fill(tf.shape(total), tf.constant(-np.inf, total.dtype)))


def _ctc_loss(
    log_probs: tf.Tensor,
    targets: tf.Tensor,
    input_lengths: tf.Tensor,
    target_lengths: tf.Tensor,
    blank: int,
    zero_infinity: bool,
) -> tf.Tensor:
    """tracelog.CTCLoss: each sample's -log p(target | log_probs [T, N, C]), by the
    alpha recursion in log space over the targets with blanks around them (a
    tf.scan over time; a sample's alpha stays put past its input length).
    targets [N, S] padded or 1-D concatenated (each sample's labels read from
    its offset); inf for an impossible alignment, or 0 with no gradient where
    zero_infinity. tf.nn.ctc_loss is not it: it takes a log_softmax of its own,
    and its gradient at an impossible alignment is not zero_infinity's."""
    log_probs = tf.convert_to_tensor(log_probs)
    dtype = log_probs.dtype
    n, c = tf.shape(log_probs)[1], tf.shape(log_probs)[2]
    # (a 0-d length: an unbatched call, its log_probs and targets given a batch of 1)
    lengths = tf.reshape(tf.cast(target_lengths, tf.int64), [-1])
    steps = tf.reshape(tf.cast(input_lengths, tf.int64), [-1])
    targets = tf.cast(targets, tf.int64)
    if targets.shape.rank == 1:  # concatenated: sample k's labels start after those before it
        width = tf.shape(targets, out_type=tf.int64)[0]
        start = tf.math.cumsum(lengths) - lengths
        at = start[:, None] + tf.range(width)[None, :]
        targets = tf.gather(targets, tf.clip_by_value(at, 0, tf.maximum(width - 1, 0)))
    labels = tf.clip_by_value(targets, 0, tf.cast(c, tf.int64) - 1)  # past a length: not read
    width = tf.shape(labels)[1]
    blanks = tf.fill([n, width], tf.constant(blank, tf.int64))
    ext = tf.reshape(tf.stack([blanks, labels], axis=2), [n, 2 * width])
    ext = tf.concat([ext, tf.fill([n, 1], tf.constant(blank, tf.int64))], axis=1)
    two_back = tf.concat([tf.fill([n, 2], tf.constant(blank, tf.int64)), ext[:, :-2]], axis=1)
    skip = tf.math.logical_and(ext != blank, ext != two_back)
    picked = tf.gather(
        log_probs,
        tf.broadcast_to(ext[None], [tf.shape(log_probs)[0], n, 2 * width + 1]),
        axis=2,
        batch_dims=2,
    )
    ninf = tf.fill([n, 1], tf.constant(-np.inf, dtype))
    pos = tf.range(2 * width + 1, dtype=tf.int64)[None, :]
    opened = pos < 1 + tf.cast(lengths > 0, tf.int64)[:, None]
    first = tf.where(opened, picked[0], tf.constant(-np.inf, dtype))

    def step(alpha: tf.Tensor, row: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        lp, t = row
        one_back = tf.concat([ninf, alpha[:, :-1]], axis=1)
        two = tf.concat([ninf, ninf, alpha[:, :-2]], axis=1)
        two = tf.where(skip, two, tf.constant(-np.inf, dtype))
        moved = _ctc_logsumexp(alpha, one_back, two) + lp
        return tf.where((t < steps)[:, None], moved, alpha)

    times = tf.range(1, tf.shape(log_probs, out_type=tf.int64)[0])
    alpha = tf.scan(step, (picked[1:], times), initializer=first)
    alpha = tf.concat([first[None], alpha], axis=0)[-1]
    end = 2 * lengths
    last = tf.gather(alpha, end[:, None], axis=1, batch_dims=1)[:, 0]
    before = tf.gather(alpha, tf.maximum(end - 1, 0)[:, None], axis=1, batch_dims=1)[:, 0]
    before = tf.where(lengths > 0, before, tf.constant(-np.inf, dtype))
    loss = -_ctc_logsumexp(last, before)
    if zero_infinity:
        loss = tf.where(tf.math.is_inf(loss), tf.zeros_like(loss), loss)
    return loss


INLINED = ("_as_param", "_as_const", "_bfloat16", "module_attr")
# The parity check's (tracelog.emit.harness): inlined into standalone programs only.
CHECK = ("_numpy", "_value_and_grads", "_module_params", "_gate_table", "_gate_sign", "_gate_where")
