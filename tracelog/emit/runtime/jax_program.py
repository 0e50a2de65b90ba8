"""What a JAX program carries besides its graph functions: parameters as a
pytree of jnp arrays, gradients by jax.value_and_grad (jitted and op by op),
and the helpers op spellings call (inlined only when used)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

if TYPE_CHECKING:  # defined by the program: its generated code and the parity check
    PARAMETERS: list[list[Any]] = []
    PREDICT: dict[str, Callable[..., dict[str, Any]]] = {}

    def load_params(path: str) -> dict[str, Any]: ...


# the modules this program names float32 through (the float64 translation check
# reads them with float32 meaning float64)
FLOAT_MODULES = ("jnp", "np")
# False in a program whose graphs select by the data (x[mask], nonzero): their sizes
# are not static, so jax.jit cannot trace them and every run goes op by op
STATIC_SHAPES = True

jax.config.update("jax_enable_x64", True)  # int64 indices and counters stay int64

Step = Callable[[dict[str, Any]], tuple[dict[str, Any], Any]]


def _as_param(array: np.ndarray, trainable: bool) -> jax.Array:
    return jnp.asarray(array)


def _as_const(array: np.ndarray) -> jax.Array:
    return jnp.asarray(array)


def _bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as jnp.bfloat16."""
    return bits.view(jnp.bfloat16)


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x)


def _value_and_grads(
    step: Step, params: dict[str, Any], trainable: list[str], jit: bool = True
) -> tuple:
    """jax.value_and_grad of step(params)'s loss for the trainable entries of
    the params pytree, under jax.jit or op by op."""

    def loss_fn(train: dict[str, Any], rest: dict[str, Any]) -> tuple[Any, Any]:
        outputs, loss = step({**rest, **train})
        return loss, outputs

    train = {name: params[name] for name in trainable}
    rest = {name: value for name, value in params.items() if name not in train}
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
    traced = jax.jit(value_and_grad) if jit and STATIC_SHAPES else value_and_grad
    (loss, outputs), grads = traced(train, rest)
    return outputs, loss, [grads[name] for name in trainable]


def params_tree(params: dict[str, Any]) -> dict[str, Any]:
    """{source name: array} (load_params, sample_params) as a pytree shaped
    like the module tree: nested dicts by the names' segments (split on "."
    and "/"); stored constants stay at the top under their "const/..." keys,
    which no segment can be (segments hold no "/")."""
    tree: dict[str, Any] = {}
    for name, value in params.items():
        if name.startswith("const/"):
            tree[name] = value
            continue
        *path, leaf = re.split(r"[./]", name)
        node = tree
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"parameter {name!r}: {part!r} is a parameter and a module")
        if leaf in node:
            raise ValueError(f"parameter {name!r}: its path is taken")
        node[leaf] = value
    return tree


def flat_params(tree: dict[str, Any]) -> dict[str, Any]:
    """params_tree's inverse: {source name: leaf} for PARAMETERS' rows the
    tree holds (all of a model's tree; some of an update's or a gradient's),
    and the constants."""
    flat = {}
    for name, *_ in PARAMETERS:
        node: Any = tree
        for part in re.split(r"[./]", name):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            flat[name] = node
    flat.update((k, v) for k, v in tree.items() if k.startswith("const/"))
    return flat


def partition(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tree split in two trees: the parameters that train (what jax.grad
    differentiates) and the rest (buffers, constants)."""
    flat = flat_params(tree)
    trains = {name for name, trainable, *_ in PARAMETERS if trainable}
    return (
        params_tree({k: v for k, v in flat.items() if k in trains}),
        params_tree({k: v for k, v in flat.items() if k not in trains}),
    )


def combine(*trees: dict[str, Any]) -> dict[str, Any]:
    """One tree from several (partition's halves; a tree and apply's
    updates): a later tree's leaves replace an earlier one's."""
    flat: dict[str, Any] = {}
    for tree in trees:
        flat.update(flat_params(tree))
    return params_tree(flat)


def apply(
    tree: dict[str, Any], *inputs: Any, train: bool = True, rng: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded prediction graph of the phase (PREDICT["train"] or
    PREDICT["eval"]) on a params_tree, as a pure function: returns the
    predictions by role and the buffer updates (running statistics) as a
    tree; combine(tree, updates) is the state after the step. Under jax.jit,
    train is static: jax.jit(apply, static_argnames="train")."""
    phase = "train" if train else "eval"
    if phase not in PREDICT:
        raise NotImplementedError(f"the log recorded no {phase} batch: no {phase} graph")
    outputs = PREDICT[phase](flat_params(tree), *inputs, rng=rng)
    updates = {r[len("update:") :]: v for r, v in outputs.items() if r.startswith("update:")}
    predictions = {r: v for r, v in outputs.items() if not r.startswith("update:")}
    return predictions, params_tree(updates)


def init_from(weights_path: str) -> dict[str, Any]:
    """weights.safetensors (and its stored constants) as a params_tree."""
    return params_tree(load_params(weights_path))


def _module_params(params: dict[str, Any]) -> dict[str, Any]:
    """The check's parameters as apply hands them to the graph functions:
    through params_tree and back (flat_params). Names no tree can hold (a
    parameter "a" beside "a/b.weight": params_tree's ValueError) are checked
    as given."""
    try:
        return flat_params(params_tree(params))
    except ValueError:
        return params


def _runs(step: Step, params: dict[str, Any], trainable: list[str]) -> list:
    """The runs the parity check compares with the recording: jitted, as a
    training step runs (only op by op where the sizes are the data's:
    STATIC_SHAPES), and op by op too where TRACELOG_JAX_OP_BY_OP=1 asks
    ("(no jit)" rows): every op compiles on its own there, most of a
    check's time for the same function."""
    if not STATIC_SHAPES:  # the one run there is: its rows are the plain ones
        return [("", _value_and_grads(step, params, trainable, jit=False))]
    runs = [("", _value_and_grads(step, params, trainable, jit=True))]
    if os.environ.get("TRACELOG_JAX_OP_BY_OP") == "1":
        runs.append((" (no jit)", _value_and_grads(step, params, trainable, jit=False)))
    return runs


def _gate_table() -> dict[str, Any]:
    """The gates this target's programs call (the parity check's _GateView:
    ops whose derivative jumps at a kink), by the global each is reached
    through and its attribute path: relu, clip (bounds), max and min
    (between operands), leaky_relu."""
    return {
        "jax": {"nn": {"relu": "relu", "leaky_relu": "leaky_relu"}},
        "jnp": {"maximum": "max", "minimum": "min", "clip": "clip"},
    }


def _gate_sign(value: jax.Array, kink: Any) -> jax.Array:
    """sign(value - kink) per element, as the comparisons decide it (int8)."""
    return jnp.asarray(value > kink, jnp.int8) - jnp.asarray(value < kink, jnp.int8)


def _gate_where(mask: np.ndarray, x: Any, y: jax.Array) -> jax.Array:
    """x where the recorded mask holds, else y (x may be a bound: a number)."""
    return jnp.where(mask, x, y)


def _run(step: Step, params: dict[str, Any], trainable: list[str]) -> tuple:
    """The one run a draw or a gate-matched reference takes: jitted, as a
    training step runs (the parity check's default would run both of _runs)."""
    return _value_and_grads(step, params, trainable, jit=True)


def _batch_norm_train(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    running_mean: jax.Array,
    running_var: jax.Array,
    eps: float,
    momentum: float,
    axes: tuple[int, ...],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Batch norm in training mode as PyTorch computes it on the CPU: batch
    statistics, output and gradients accumulated in float64; the running
    variance updates with the unbiased one. Returns the output and the new
    running statistics."""
    shape = [1 if d in axes else -1 for d in range(x.ndim)]
    x64 = x.astype(jnp.float64)
    mean = jnp.mean(x64, axis=axes)
    var = jnp.mean(jnp.square(x64 - mean.reshape(shape)), axis=axes)
    a = scale.astype(jnp.float64) / jnp.sqrt(var + eps)
    # in float64 too, cast once: the gradients' sums over the batch (the bias's,
    # the scale's) then accumulate in float64, as PyTorch's kernel accumulates.
    # Centred before scaling: the scale's gradient is then sum(dy * (x - mean)),
    # as PyTorch's backward sums it; x * a + (bias - mean * a) differentiates to
    # sum(dy * x) - mean * sum(dy), which cancels by |mean| / std of the channel
    y = (
        (x64 - mean.reshape(shape)) * a.reshape(shape) + bias.astype(jnp.float64).reshape(shape)
    ).astype(x.dtype)
    n = x.size // mean.size
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(x.dtype)
    new_var = (1 - momentum) * running_var + momentum * (var * n / (n - 1)).astype(x.dtype)
    return y, lax.stop_gradient(new_mean), lax.stop_gradient(new_var)


def _batch_norm_train_weighted(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    running_mean: jax.Array,
    running_var: jax.Array,
    eps: float,
    momentum: float,
    decay: float,
    unbiased: bool,
    axes: tuple[int, ...],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Batch norm in training mode whose running statistics update as
    decay * running + momentum * batch statistic (Keras: decay is its momentum),
    the variance biased unless `unbiased`. The output as Keras computes it, in
    x's dtype (tf.nn.moments, tf.nn.batch_normalization), as the PyTorch
    helper does: at batch 4 the float64 kernel's gradients were a noisier draw
    than TensorFlow's (EfficientNetB0: 4.0x TF's float32 error)."""
    shape = [1 if d in axes else -1 for d in range(x.ndim)]
    mean = jnp.mean(x, axis=tuple(axes), keepdims=True)
    var = jnp.mean(jnp.square(x - lax.stop_gradient(mean)), axis=tuple(axes), keepdims=True)
    inv = lax.rsqrt(var + jnp.asarray(eps, x.dtype)) * scale.reshape(shape)
    y = x * inv + (bias.reshape(shape) - mean * inv)
    # the running statistics updated in float64 from float64 moments and
    # rounded once, to the statistic's dtype: the update adds no error of its
    # own (in float32 steps it added up to three roundings)
    x64 = lax.stop_gradient(x).astype(jnp.float64)
    mean64 = jnp.mean(x64, axis=tuple(axes))
    var64 = jnp.var(x64, axis=tuple(axes), ddof=1 if unbiased else 0)
    new_mean = decay * running_mean.astype(jnp.float64) + momentum * mean64
    new_var = decay * running_var.astype(jnp.float64) + momentum * var64
    return y, new_mean.astype(running_mean.dtype), new_var.astype(running_var.dtype)


def _batch_norm_eval(
    x: jax.Array, scale: jax.Array, bias: jax.Array, mean: jax.Array, var: jax.Array, eps: float
) -> jax.Array:
    shape = [1, -1] + [1] * (x.ndim - 2)
    a = scale / jnp.sqrt(var + eps)
    b = bias - mean * a
    return x * a.reshape(shape) + b.reshape(shape)


def _solve_triangular_broadcast(a: jax.Array, b: jax.Array, lower: bool) -> jax.Array:
    """X with A X = B, A triangular, A's and B's batch dims broadcast
    (lax.linalg.triangular_solve takes equal ones; jax.scipy.linalg's
    solve_triangular reads a B one dim short of A with B's last dim n as a
    batch of vectors)."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = jnp.broadcast_to(b, (*batch, *b.shape[-2:]))
    return lax.linalg.triangular_solve(a, b, left_side=True, lower=lower)


def _layer_norm(
    x: jax.Array, scale: jax.Array, bias: jax.Array | None, axes: tuple[int, ...], eps: float
) -> jax.Array:
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + eps) * scale
    return y if bias is None else y + bias


def _attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, scale: float, causal: bool
) -> jax.Array:
    """softmax(q @ k^T * scale + mask) @ v over [..., heads, length, dim] (torch's
    layout), as torch's scaled_dot_product_attention: is_causal masks each query's
    later keys, and a query whose keys are all masked gives 0 (not NaN) and no
    gradient. jax.nn.dot_product_attention (its XLA path, or cuDNN where asked) runs
    4-D float32/16 inputs with one head dim; it takes the softmax in float32 whatever
    the dtype, so float64 (the translation check) is written out."""
    if mask is not None and causal:  # one mask: the dead rows are read from it
        later = np.triu(np.ones((q.shape[-2], k.shape[-2]), dtype=bool), 1)
        mask, causal = jnp.where(later, -jnp.inf, mask), False
    dead = bias = None
    if mask is not None:
        dead = jnp.all(mask == -jnp.inf, axis=-1, keepdims=True)
        bias = jnp.where(dead, 0.0, mask).astype(q.dtype)
    fused = q.ndim == 4 and q.dtype != jnp.float64 and v.shape[-1] == q.shape[-1]
    if fused and q.shape[:2] == k.shape[:2] == v.shape[:2]:
        if bias is not None:
            bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        # [batch, heads, length, dim] <-> JAX's [batch, length, heads, dim]
        heads_second = (0, 2, 1, 3)
        qt, kt, vt = (t.transpose(heads_second) for t in (q, k, v))
        y = jax.nn.dot_product_attention(qt, kt, vt, bias, scale=scale, is_causal=causal)
        y = y.transpose(heads_second)
    else:
        scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * jnp.asarray(scale, q.dtype)
        if bias is not None:
            scores = scores + bias
        if causal:
            later = np.triu(np.ones((q.shape[-2], k.shape[-2]), dtype=bool), 1)
            scores = jnp.where(later, -jnp.inf, scores)
        y = jnp.matmul(jax.nn.softmax(scores, axis=-1), v)
    return y if dead is None else jnp.where(dead, 0.0, y).astype(y.dtype)


def _topk(x: jax.Array, k: int | None, axis: int, largest: bool) -> tuple[jax.Array, jax.Array]:
    """ONNX TopK: the k largest (smallest) along axis, in order, equal elements
    lower index first (a stable argsort, cut to k, and the values it picks; None:
    the whole axis)."""
    indices = jnp.argsort(x, axis=axis, stable=True, descending=largest)
    if k is not None:
        indices = lax.slice_in_dim(indices, 0, k, axis=axis)
    return jnp.take_along_axis(x, indices, axis=axis), indices.astype(jnp.int64)


def _node_key(rng: Any, key: str) -> Any:
    """The key of one random node ("mask.<k>"): rng folded with k, so that no two
    nodes of a step draw alike; a loss graph's ("loss_mask.<k>") from rng folded
    with 1 first, so that the loss's draws are not the prediction's when both
    are given one key."""
    stream, _, k = key.rpartition(".")
    if stream != "mask":
        rng = jax.random.fold_in(rng, 1)
    return jax.random.fold_in(rng, int(k))


def _uniform(like: jax.Array, low: float, high: float, rng: Any, key: str) -> jax.Array:
    """Values drawn uniformly from [low, high), of like's shape and dtype. rng: a
    dict of recorded draws (parity replay) or a jax.random key."""
    if isinstance(rng, dict):
        return jnp.asarray(rng[key]).astype(like.dtype)
    if rng is None:
        raise ValueError("a random draw needs rng: a jax.random key or recorded draws")
    return jax.random.uniform(_node_key(rng, key), like.shape, like.dtype, low, high)


def _exponential(like: jax.Array, rng: Any, key: str) -> jax.Array:
    """Values drawn from the exponential distribution of rate 1, of like's shape and
    dtype. rng: a dict of recorded draws (parity replay) or a jax.random key."""
    if isinstance(rng, dict):
        return jnp.asarray(rng[key]).astype(like.dtype)
    if rng is None:
        raise ValueError("a random draw needs rng: a jax.random key or recorded draws")
    return jax.random.exponential(_node_key(rng, key), like.shape, like.dtype)


def _normal(like: jax.Array, mean: float, scale: float, rng: Any, key: str) -> jax.Array:
    """Values drawn from N(mean, scale^2), of like's shape and dtype. rng: a dict of
    recorded draws (parity replay) or a jax.random key."""
    if isinstance(rng, dict):
        return jnp.asarray(rng[key]).astype(like.dtype)
    if rng is None:
        raise ValueError("a random draw needs rng: a jax.random key or recorded draws")
    z = jax.random.normal(_node_key(rng, key), like.shape, like.dtype)
    return (mean + scale * z).astype(like.dtype)


def _dropout(x: jax.Array, rate: Any, rng: Any, key: str) -> tuple[jax.Array, jax.Array]:
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay) or a jax.random key."""
    if isinstance(rng, dict):
        mask = jnp.asarray(rng[key]).astype(x.dtype)
    elif rng is None:
        raise ValueError("dropout in training mode needs rng: a jax.random key or recorded masks")
    else:
        mask = jax.random.bernoulli(_node_key(rng, key), 1.0 - rate, x.shape).astype(x.dtype)
    # the scale in x's dtype, as ONNX's T: a numpy bfloat16 rate (a constant) in
    # 1.0 - rate is numpy float32, which would widen a bfloat16 x
    return x * (mask / (1.0 - jnp.asarray(rate, x.dtype))), mask > 0


def _nll_loss(
    logp: jax.Array,
    target: jax.Array,
    weight: jax.Array | None,
    reduction: str,
    ignore_index: int | None,
) -> jax.Array:
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


# -- vision: group norm, transposed convolution, resize (issue 12) --
def _group_norm(
    x: jax.Array, scale: jax.Array, bias: jax.Array, groups: int, eps: float, channel_axis: int
) -> jax.Array:
    """ONNX GroupNormalization: statistics per sample and group of channels,
    the variance as the mean of squared deviations (not E[x^2] - E[x]^2). The
    mean gets one correction pass: XLA's CPU sums run in order, and over
    values far from zero their rounding would swamp the deviations."""
    c = x.shape[channel_axis]
    g = x.reshape(x.shape[:channel_axis] + (groups, c // groups) + x.shape[channel_axis + 1 :])
    axes = tuple(d for d in range(1, g.ndim) if d != channel_axis)
    rough = jnp.mean(g, axis=axes, keepdims=True)
    mean = rough + jnp.mean(g - rough, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=axes, keepdims=True)
    y = ((g - mean) / jnp.sqrt(var + eps)).reshape(x.shape)
    shape = [1] * x.ndim
    shape[channel_axis] = -1
    return y * scale.reshape(shape) + bias.reshape(shape)


def _conv_transpose(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array | None,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    output_padding: list[int],
    group: int,
) -> jax.Array:
    """ONNX ConvTranspose (NC... layout) as the convolution whose input
    gradient it is: the input dilated by the strides and padded by
    dilation * (k - 1) - pad on each side (output_padding more at the end; a
    negative pad crops), the kernel flipped with its channels swapped per group."""
    n = x.ndim - 2
    cin, cout_g, k = w.shape[0], w.shape[1], w.shape[2:]
    wg = jnp.swapaxes(w.reshape((group, cin // group, cout_g) + k), 1, 2)
    wf = jnp.flip(wg.reshape((group * cout_g, cin // group) + k), axis=tuple(range(2, 2 + n)))
    padding = [
        (d * (kk - 1) - pads[i], d * (kk - 1) - pads[i + n] + output_padding[i])
        for i, (kk, d) in enumerate(zip(k, dilations, strict=True))
    ]
    spatial = "DHW"[3 - n :]
    y = lax.conv_general_dilated(
        x,
        wf,
        window_strides=(1,) * n,
        padding=padding,
        lhs_dilation=tuple(strides),
        rhs_dilation=tuple(dilations),
        dimension_numbers=("NC" + spatial, "OI" + spatial, "NC" + spatial),
        feature_group_count=group,
    )
    return y if b is None else y + b.reshape((1, -1) + (1,) * n)


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
    x: jax.Array,
    axes: list[int],
    scales: list[float] | None,
    sizes: list[int] | None,
    mode: str,
    coord: str,
    nearest: str,
    cubic_a: float,
) -> jax.Array:
    """ONNX Resize, one axis after another: a weighted sum of gathered taps
    (a plain gather for nearest), the tables computed from the static shape.
    jax.image.resize is not used: its nearest rounds half-pixel centres, its
    cubic is Keys' a = -0.5 with renormalised edges, and it takes no scale
    that differs from out / in."""
    for k, axis in enumerate(axes):
        n_in = x.shape[axis]
        n_out, scale = _resized(n_in, k, scales, sizes)
        if scale == 1.0 and n_out == n_in:
            continue
        index, weight = _resize_taps(n_in, n_out, scale, mode, coord, nearest, cubic_a)
        shape = [1] * x.ndim
        shape[axis] = n_out
        taps = [jnp.take(x, index[:, j], axis=axis) for j in range(index.shape[1])]
        if mode == "nearest":
            x = taps[0]
            continue
        w = [jnp.asarray(weight[:, j].reshape(shape), dtype=x.dtype) for j in range(len(taps))]
        x = sum((t * wj for t, wj in zip(taps[1:], w[1:], strict=True)), taps[0] * w[0])
    return x


def _recurrent(
    cell: str,
    x: jax.Array,
    w: jax.Array,
    r: jax.Array,
    b: jax.Array | None,
    states: list[jax.Array | None],
    direction: str,
    lens: jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    """An ONNX LSTM, GRU or RNN node (layout 0), `cell` "lstm", "gru", "gru0" (GRU with
    linear_before_reset=0), "tanh" or "relu": one lax.scan over time per direction.
    With `lens` (ONNX sequence_lens) a row's steps from its length on output zeros and
    keep its state. Returns Y [seq, dirs, batch, hidden] and the final states
    [dirs, batch, hidden]."""
    hidden = int(r.shape[-1])
    valid = None if lens is None else jnp.arange(x.shape[0])[:, None] < lens[None, :]
    ys, finals = [], []
    for d in range(int(w.shape[0])):
        if b is None:
            wb = rb = jnp.zeros((int(w.shape[1]),), x.dtype)
        else:
            wb, rb = jnp.split(b[d], 2)
        # every step's input projection at once
        xw = jnp.einsum("tbi,gi->tbg", x, w[d]) + wb
        zeros = jnp.zeros((x.shape[1], hidden), x.dtype)
        init = tuple(zeros if s is None else s[d] for s in states)
        reverse = direction == "reverse" or d == 1
        y, final = _recurrent_direction(cell, xw, r[d], rb, init, reverse, valid)
        ys.append(y)
        finals.append(final)
    y = jnp.stack(ys, axis=1)
    return (y, *(jnp.stack([f[k] for f in finals]) for k in range(len(states))))


def _recurrent_direction(
    cell: str,
    xw: jax.Array,
    r: jax.Array,
    rb: jax.Array,
    init: tuple,
    reverse: bool,
    valid: jax.Array | None,
) -> tuple[jax.Array, list[jax.Array]]:
    """One direction of a layer: each step's hidden state, and the final carry."""

    def step(carry: tuple, xs: tuple) -> tuple:
        xw_t, valid_t = xs
        new = _recurrent_cell(cell, carry, xw_t, r, rb)
        if valid_t is None:
            return new, new[0]  # the carry on, the hidden state out
        keep = valid_t[:, None]  # past a row's length: the state stays, the output is 0
        new = tuple(jnp.where(keep, n, c) for n, c in zip(new, carry, strict=True))
        return new, jnp.where(keep, new[0], jnp.zeros_like(new[0]))

    # lax.scan keeps each step's output at its step's index, reversed or not
    y: jax.Array
    final, y = lax.scan(step, init, (xw, valid), reverse=reverse)
    return y, list(final)


def _recurrent_cell(
    cell: str,
    carry: tuple,
    xw: jax.Array,
    r: jax.Array,
    rb: jax.Array,
    relu: Callable[[jax.Array], jax.Array] = jax.nn.relu,
) -> tuple:
    """One step, from xw = x W^T + Wb: an LSTM (ONNX's gates i, o, f, c), a GRU (z, r, h;
    "gru": linear_before_reset=1, as torch and Keras' default compute it: the reset gate
    scales h R_h^T + Rb_h; "gru0": it scales h before R_h, Keras' reset_after=False) or
    an RNN with tanh or relu. (`relu` is bound as the program loads: a gate inside
    lax.scan's step is no gate the parity check can record, its values being the
    scan's own tracers.)"""
    h = carry[0]
    if cell == "gru0":
        hidden = h.shape[-1]
        xz, xr, xh = jnp.split(xw, 3, axis=-1)
        hz, hr_ = jnp.split(h @ r[: 2 * hidden].T + rb[: 2 * hidden], 2, axis=-1)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xh + (jax.nn.sigmoid(xr + hr_) * h) @ r[2 * hidden :].T + rb[2 * hidden :])
        return ((1.0 - z) * n + z * h,)
    hr = h @ r.T + rb
    if cell == "lstm":
        i, o, f, g = jnp.split(xw + hr, 4, axis=-1)
        c = jax.nn.sigmoid(f) * carry[1] + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c
    if cell == "gru":
        xz, xr, xh = jnp.split(xw, 3, axis=-1)
        hz, hr_, hh = jnp.split(hr, 3, axis=-1)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xh + jax.nn.sigmoid(xr + hr_) * hh)
        return ((1.0 - z) * n + z * h,)
    return (relu(xw + hr) if cell == "relu" else jnp.tanh(xw + hr),)


def _lstm(
    x: jax.Array,
    w: jax.Array,
    r: jax.Array,
    b: jax.Array | None,
    h0: jax.Array | None,
    c0: jax.Array | None,
    direction: str,
    lens: jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    return _recurrent("lstm", x, w, r, b, [h0, c0], direction, lens)


def _gru(
    x: jax.Array,
    w: jax.Array,
    r: jax.Array,
    b: jax.Array | None,
    h0: jax.Array | None,
    direction: str,
    lens: jax.Array | None = None,
    linear_before_reset: int = 1,
) -> tuple[jax.Array, ...]:
    return _recurrent("gru" if linear_before_reset else "gru0", x, w, r, b, [h0], direction, lens)


def _rnn(
    x: jax.Array,
    w: jax.Array,
    r: jax.Array,
    b: jax.Array | None,
    h0: jax.Array | None,
    direction: str,
    activation: str,
    lens: jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    return _recurrent(activation, x, w, r, b, [h0], direction, lens)


# -- CTC loss ---------------------------------------------------------------------------
def _ctc_logsumexp(*xs: jax.Array) -> jax.Array:
    """log(sum(exp(xs))) as torch's CTC kernel sums it (shifted by the largest, 0
    where all are -inf, the terms in order); -inf where all are, with no
    gradient there (not NaN: the log's and the shift's are masked)."""
    top = functools.reduce(jnp.maximum, xs)
    shift = lax.stop_gradient(jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top)))
    total = functools.reduce(lambda a, b: a + b, [jnp.exp(x - shift) for x in xs])
    some = total > 0
    summed = shift + jnp.log(jnp.where(some, total, jnp.ones_like(total)))
    return jnp.where(some, summed, jnp.full_like(total, -jnp.inf))


def _ctc_loss(
    log_probs: jax.Array,
    targets: jax.Array,
    input_lengths: jax.Array,
    target_lengths: jax.Array,
    blank: int,
    zero_infinity: bool,
) -> jax.Array:
    """tracelog.CTCLoss: each sample's -log p(target | log_probs [T, N, C]), by the
    alpha recursion in log space over the targets with blanks around them (a
    lax.scan over time; a sample's alpha stays put past its input length).
    targets [N, S] padded or 1-D concatenated (each sample's labels read from
    its offset); inf for an impossible alignment, or 0 with no gradient where
    zero_infinity."""
    t_max, n, c = log_probs.shape
    # (a 0-d length: an unbatched call, its log_probs and targets given a batch of 1)
    lengths = jnp.reshape(jnp.asarray(target_lengths), (-1,)).astype(jnp.int64)
    steps = jnp.reshape(jnp.asarray(input_lengths), (-1,)).astype(jnp.int64)
    targets = jnp.asarray(targets).astype(jnp.int64)
    if targets.ndim == 1:  # concatenated: sample k's labels start after those before it
        width = targets.shape[0]
        start = jnp.cumsum(lengths) - lengths
        at = start[:, None] + jnp.arange(width, dtype=jnp.int64)[None, :]
        targets = jnp.take(targets, jnp.clip(at, 0, max(width - 1, 0)), axis=0)
    width = targets.shape[1]
    labels = jnp.clip(targets, 0, c - 1)  # past a sample's length: never read
    ext = jnp.full((n, 2 * width + 1), blank, jnp.int64).at[:, 1::2].set(labels)
    two_back = jnp.concatenate([jnp.full((n, 2), blank, jnp.int64), ext[:, :-2]], axis=1)
    skip = (ext != blank) & (ext != two_back)
    picked = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (t_max, *ext.shape)), 2)
    ninf = jnp.full((n, 1), -jnp.inf, log_probs.dtype)
    pos = jnp.arange(2 * width + 1)[None, :]
    first = jnp.where(pos < 1 + (lengths > 0)[:, None], picked[0], -jnp.inf)

    def step(alpha: jax.Array, row: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        lp, t = row
        one_back = jnp.concatenate([ninf, alpha[:, :-1]], axis=1)
        two = jnp.concatenate([ninf, ninf, alpha[:, :-2]], axis=1)
        two = jnp.where(skip, two, -jnp.inf)
        moved = _ctc_logsumexp(alpha, one_back, two) + lp
        return jnp.where((t < steps)[:, None], moved, alpha), None

    alpha, _ = lax.scan(step, first, (picked[1:], jnp.arange(1, t_max, dtype=jnp.int64)))
    end = 2 * lengths
    last = jnp.take_along_axis(alpha, end[:, None], 1)[:, 0]
    before = jnp.take_along_axis(alpha, jnp.maximum(end - 1, 0)[:, None], 1)[:, 0]
    before = jnp.where(lengths > 0, before, -jnp.inf)
    loss = -_ctc_logsumexp(last, before)
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), jnp.zeros_like(loss), loss)
    return loss


INLINED = (
    "_as_param",
    "_as_const",
    "_bfloat16",
    "params_tree",
    "flat_params",
    "partition",
    "combine",
    "apply",
    "init_from",
)
# The parity check's (tracelog.emit.harness): inlined into standalone programs only.
CHECK = (
    "_numpy",
    "_value_and_grads",
    "_runs",
    "_run",
    "_module_params",
    "_gate_table",
    "_gate_sign",
    "_gate_where",
)
