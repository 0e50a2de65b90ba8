"""What a PyTorch program carries besides its graph functions: parameters as
torch.nn.Parameter (so the program trains as it stands), gradients by
torch.autograd, and the helpers op spellings call (inlined only when used)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # defined by the program: its generated code and the parity check
    PARAMETERS: list[list[Any]] = []
    PREDICT: dict[str, Callable[..., dict[str, Any]]] = {}

    def _load(path: str, narrow: bool = False) -> dict[str, Any]: ...


# the modules this program names float32 through (the float64 translation check
# reads them with float32 meaning float64)
FLOAT_MODULES = ("torch",)

Step = Callable[[dict[str, Any]], tuple[dict[str, Any], Any]]


class Model(torch.nn.Module):
    """The recorded model as a torch.nn.Module, to keep training in PyTorch.

    Its parameters (torch.nn.Parameter, those that trained) and buffers (the
    rest) sit in a tree of modules by their source paths, so its state_dict
    keys are the source's names, with Keras' "/" read as "." (state_key).
    forward(*inputs) runs the recorded prediction graph of the module's mode
    (PREDICT["train"] or PREDICT["eval"]), writes the buffer updates that
    graph returns (running statistics) into the buffers, as the source's
    layers do, and returns the predictions by role. Model(weights) takes
    weights.safetensors' path (or {source name: array}, as load_params
    gives), declares each parameter and buffer in the shape and dtype it
    holds (PARAMETERS names them, the weights size them), loads them with
    load_state_dict(strict=True), and keeps the stored constants the graphs
    read (non-persistent buffers)."""

    def __init__(self, weights: str | dict[str, Any]) -> None:
        super().__init__()
        arrays = _load(weights, narrow=True) if isinstance(weights, str) else weights
        state = state_dict_from(arrays)
        _declare(self, PARAMETERS, state)
        self.load_state_dict(state, strict=True)
        for key, array in arrays.items():
            if key.startswith("const/"):  # "/" is a legal buffer name; "." is not
                self.register_buffer(key, _as_const(array).detach(), persistent=False)

    def source_params(self) -> dict[str, Any]:
        """{source name: tensor}: what the graph functions read from params."""
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        found = {row[0]: own[state_key(row[0])] for row in PARAMETERS}
        found.update((k, v) for k, v in own.items() if k.startswith("const/"))
        return found

    def forward(self, *inputs: Any, rng: Any = None) -> dict[str, Any]:
        phase = "train" if self.training else "eval"
        if phase not in PREDICT:
            raise NotImplementedError(f"the log recorded no {phase} batch: no {phase} graph")
        params = self.source_params()
        outputs = PREDICT[phase](params, *inputs, rng=rng)
        with torch.no_grad():
            for role, value in outputs.items():
                if role.startswith("update:"):
                    params[role[len("update:") :]].copy_(value)
        return {role: v for role, v in outputs.items() if not role.startswith("update:")}


def _as_param(array: np.ndarray | torch.Tensor, trainable: bool) -> torch.Tensor:
    tensor = _as_const(array)
    return torch.nn.Parameter(tensor) if trainable else tensor


def _as_const(array: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(array, torch.Tensor):  # bfloat16 (_bfloat16)
        return array.clone()
    if array.dtype.name == "bfloat16":  # ml_dtypes' (a log's sample as tracelog reads it)
        return _bfloat16(np.asarray(array).view(np.uint16))
    return torch.from_numpy(np.array(array))


def _bfloat16(bits: np.ndarray) -> torch.Tensor:
    """bfloat16 bit patterns (uint16) as a torch.bfloat16 tensor (numpy has none)."""
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        # numpy has no bfloat16: widened to float32, exactly (by name: in the
        # float64 run, torch.bfloat16 reads as torch.float64)
        return (x.float() if str(x.dtype) == "torch.bfloat16" else x).numpy()
    return np.asarray(x)


def _value_and_grads(step: Step, params: dict[str, Any], trainable: list[str]) -> tuple:
    """step(params); gradients of its loss for the trainable parameters, in
    order, by torch.autograd."""
    outputs, loss = step(params)
    grads = torch.autograd.grad(loss, [params[name] for name in trainable], allow_unused=True)
    return outputs, loss, grads


def _gate_table() -> dict[str, Any]:
    """The gates this target's programs call (the parity check's _GateView:
    ops whose derivative jumps at a kink), by the global each is reached
    through and its attribute: relu, clip (bounds), max and min (between
    operands), leaky_relu."""
    return {
        "torch": {"relu": "relu", "clamp": "clip", "maximum": "max", "minimum": "min"},
        "F": {"relu": "relu", "leaky_relu": "leaky_relu"},
    }


def _gate_sign(value: torch.Tensor, kink: Any) -> torch.Tensor:
    """sign(value - kink) per element, as the comparisons decide it (int8)."""
    return (value > kink).to(torch.int8) - (value < kink).to(torch.int8)


def _gate_where(mask: np.ndarray, x: Any, y: torch.Tensor) -> torch.Tensor:
    """x where the recorded mask holds, else y (x may be a bound: a number). A
    0-d mask's comparison is a numpy scalar (a clamp of the loss): made an array."""
    return torch.where(torch.from_numpy(np.asarray(mask)).to(y.device), x, y)


def _batch_norm_train(
    x: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
    momentum: float,
    axes: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def _batch_norm_train_weighted(
    x: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
    momentum: float,
    decay: float,
    unbiased: bool,
    axes: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch norm in training mode whose running statistics update as
    decay * running + momentum * batch statistic (Keras: decay is its momentum),
    the variance biased unless `unbiased`. Computed as Keras computes it, in x's
    dtype: tf.nn.moments (the mean, then the mean squared deviation from it, the
    mean's gradient stopped there) and tf.nn.batch_normalization (x * inv +
    (bias - mean * inv), inv = rsqrt(var + eps) * scale). At batch 4, where
    the statistics of 4 values amplify the convolutions' rounding, any other
    rounding of it was a noisier draw than TensorFlow's: ResNet50's gradients
    1.5x TF's float32 error (ratio 3.3) with torch's fused kernel in float64,
    1.0x (ratio 1.3) with Keras' formula (EfficientNetB0: 2.5 and 1.9)."""
    shape = [1] * x.dim()
    for d in range(x.dim()):
        shape[d] = 1 if d in axes else x.shape[d]
    mean = x.mean(dim=axes, keepdim=True)
    var = torch.square(x - mean.detach()).mean(dim=axes, keepdim=True)
    inv = torch.rsqrt(var + eps) * scale.reshape(shape)
    y = x * inv + (bias.reshape(shape) - mean * inv)
    # the running statistics updated in float64 from float64 moments and
    # rounded once, to the statistic's dtype (as the JAX helper)
    var64, mean64 = torch.var_mean(x.detach().double(), dim=axes, unbiased=unbiased)
    new_mean = decay * running_mean.double() + momentum * mean64
    new_var = decay * running_var.double() + momentum * var64
    return y, new_mean.to(running_mean.dtype), new_var.to(running_var.dtype)


def _dropout(x: torch.Tensor, rate: Any, rng: Any, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        mask = torch.as_tensor(rng[key]).to(x.dtype)
    else:
        keep = torch.rand(x.shape, generator=rng, dtype=x.dtype) >= rate
        mask = keep.to(x.dtype)
    return x * (mask / (1.0 - rate)), mask > 0


def _uniform(like: torch.Tensor, low: float, high: float, rng: Any, key: str) -> torch.Tensor:
    """Values drawn uniformly from [low, high), of like's shape and dtype. rng: a
    dict of recorded draws (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        return torch.as_tensor(rng[key]).to(like.dtype)
    u = torch.rand(like.shape, generator=rng, dtype=like.dtype, device=like.device)
    return low + (high - low) * u


def _normal(like: torch.Tensor, mean: float, scale: float, rng: Any, key: str) -> torch.Tensor:
    """Values drawn from N(mean, scale^2), of like's shape and dtype. rng: a dict of
    recorded draws (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        return torch.as_tensor(rng[key]).to(like.dtype)
    z = torch.randn(like.shape, generator=rng, dtype=like.dtype, device=like.device)
    return mean + scale * z


def _exponential(like: torch.Tensor, rng: Any, key: str) -> torch.Tensor:
    """Values drawn from the exponential distribution of rate 1, of like's shape and
    dtype. rng: a dict of recorded draws (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        return torch.as_tensor(rng[key]).to(like.dtype)
    return torch.empty(like.shape, dtype=like.dtype, device=like.device).exponential_(generator=rng)


def _topk(
    x: torch.Tensor, k: int | None, axis: int, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """ONNX TopK: the k largest (smallest) along axis, in order, equal elements
    lower index first (a stable sort, cut to k; None: the whole axis)."""
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    if k is None:
        return values, indices
    return values.narrow(axis, 0, k), indices.narrow(axis, 0, k)


def _causal_masked(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """An additive attention mask with each query's later keys masked too (is_causal's
    top-left alignment), for F.scaled_dot_product_attention, which takes one of the two."""
    later = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    return torch.where(later, torch.tensor(float("-inf"), dtype=mask.dtype), mask)


def _gates(w: torch.Tensor, order: list[int]) -> torch.Tensor:
    """A stacked-gate weight or bias [gates * hidden, ...] with its gates reordered."""
    parts = w.chunk(len(order))
    return torch.cat([parts[k] for k in order])


def _recurrent(
    fn: Callable[..., Any],
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    states: list[torch.Tensor | None],
    direction: str,
    order: list[int],
    lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """An ONNX LSTM, GRU or RNN node (layout 0) through torch's own fused layer `fn`
    (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu): one layer, both directions
    at once, the weights back in torch's gate order (`order`: torch's k-th gate is ONNX's
    gate order[k]). With `lens` (ONNX sequence_lens) the layer runs on a packed
    sequence, as nn.LSTM does: zeros past each row's length, its state kept from there.
    Returns Y [seq, dirs, batch, hidden] and the final states."""
    dirs, hidden = w.shape[0], r.shape[-1]
    params = []
    for d in range(dirs):
        params += [_gates(w[d], order), _gates(r[d], order)]
        if b is not None:
            params += [_gates(half, order) for half in b[d].chunk(2)]  # Wb, Rb
    zeros = x.new_zeros(dirs, x.shape[1], hidden)
    hx = [zeros if s is None else s for s in states]
    if lens is not None:
        return _recurrent_packed(fn, x, params, b is not None, hx, direction, lens)
    if direction == "reverse":
        x = x.flip(0)
    # dropout 0: the layer alone (train=True keeps the kernel torch trains with)
    y, *finals = fn(
        x, hx if len(hx) > 1 else hx[0], params, b is not None, 1, 0.0, True, dirs == 2, False
    )
    y = y.reshape(y.shape[0], y.shape[1], dirs, hidden).transpose(1, 2)
    return (y.flip(0) if direction == "reverse" else y, *finals)


def _reverse_rows(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """x [seq, batch, ...] with each row's first lens[b] steps reversed, the rest in place."""
    t = torch.arange(x.shape[0], device=x.device)[:, None]
    n = lens.to(device=x.device, dtype=torch.int64)[None, :]
    index = torch.where(t < n, n - 1 - t, t)
    index = index.reshape(*index.shape, *[1] * (x.dim() - 2)).expand(x.shape)
    return x.gather(0, index)


def _recurrent_packed(
    fn: Callable[..., Any],
    x: torch.Tensor,
    params: list[torch.Tensor],
    biased: bool,
    hx: list[torch.Tensor],
    direction: str,
    lens: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The layer over a packed sequence (torch's packed overloads of `fn`); one reverse
    direction runs forward over each row's steps reversed (ONNX starts it at lens - 1)."""
    rnn = torch.nn.utils.rnn
    dirs, hidden = hx[0].shape[0], hx[0].shape[2]
    if direction == "reverse":
        x = _reverse_rows(x, lens)
    packed = rnn.pack_padded_sequence(
        x, lens.to(device="cpu", dtype=torch.int64), enforce_sorted=False
    )
    order, unorder = packed.sorted_indices, packed.unsorted_indices
    assert order is not None and unorder is not None  # set by enforce_sorted=False
    hx = [s.index_select(1, order) for s in hx]
    data, *finals = fn(
        packed.data,
        packed.batch_sizes,
        hx if len(hx) > 1 else hx[0],
        params,
        biased,
        1,
        0.0,
        True,
        dirs == 2,
    )
    out = rnn.PackedSequence(
        data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
    )
    y, _ = rnn.pad_packed_sequence(out, total_length=x.shape[0])
    if direction == "reverse":
        y = _reverse_rows(y, lens)
    y = y.reshape(y.shape[0], y.shape[1], dirs, hidden).transpose(1, 2)
    return (y, *(f.index_select(1, unorder) for f in finals))


def _gru_reset_before(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    direction: str,
    lens: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """ONNX GRU with linear_before_reset=0 (Keras reset_after=False): the reset gate
    scales h before R_h. torch has no such kernel: one step at a time."""
    dirs, hidden = w.shape[0], r.shape[-1]
    seq = x.shape[0]
    ys, finals = [], []
    for d in range(dirs):
        wb, rb = (x.new_zeros(2, 3 * hidden) if b is None else b[d].reshape(2, -1)).unbind(0)
        xw = torch.einsum("tbi,gi->tbg", x, w[d]) + wb
        h = x.new_zeros(x.shape[1], hidden) if h0 is None else h0[d]
        out: list[torch.Tensor] = [h] * seq
        reverse = direction == "reverse" or d == 1
        for t in reversed(range(seq)) if reverse else range(seq):
            xz, xr, xh = xw[t].chunk(3, dim=-1)
            hz, hr = (h @ r[d, : 2 * hidden].T + rb[: 2 * hidden]).chunk(2, dim=-1)
            z = torch.sigmoid(xz + hz)
            rh = torch.sigmoid(xr + hr) * h
            n = torch.tanh(xh + rh @ r[d, 2 * hidden :].T + rb[2 * hidden :])
            new = (1.0 - z) * n + z * h
            if lens is None:
                h = out[t] = new
                continue
            # past a row's length: state kept, 0 out
            keep = (t < lens.to(torch.int64))[:, None]
            h = torch.where(keep, new, h)
            out[t] = torch.where(keep, new, torch.zeros_like(new))
        ys.append(torch.stack(out))
        finals.append(h)
    return torch.stack(ys, dim=1), torch.stack(finals)


def _lstm(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    c0: torch.Tensor | None,
    direction: str,
    lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """ONNX LSTM (gates i, o, f, c) as torch.lstm (gates i, f, g, o)."""
    return _recurrent(torch.lstm, x, w, r, b, [h0, c0], direction, [0, 2, 3, 1], lens)


def _gru(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    direction: str,
    lens: torch.Tensor | None = None,
    linear_before_reset: int = 1,
) -> tuple[torch.Tensor, ...]:
    """ONNX GRU with linear_before_reset=1 (gates z, r, h) as torch.gru (gates r, z, n)."""
    if not linear_before_reset:
        return _gru_reset_before(x, w, r, b, h0, direction, lens)
    return _recurrent(torch.gru, x, w, r, b, [h0], direction, [1, 0, 2], lens)


def _rnn(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    direction: str,
    activation: str,
    lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """ONNX RNN with a tanh or relu activation as torch.rnn_tanh / torch.rnn_relu."""
    fn = torch.rnn_relu if activation == "relu" else torch.rnn_tanh
    return _recurrent(fn, x, w, r, b, [h0], direction, [0], lens)


def state_key(name: str) -> str:
    """A source parameter's state_dict key in Model: its path, Keras' "/"
    read as "." (an empty path segment is "_")."""
    return ".".join(part or "_" for part in re.split(r"[./]", name))


def _declare(
    module: torch.nn.Module, rows: list[list[Any]], state: dict[str, torch.Tensor]
) -> None:
    """Declare PARAMETERS' rows in `module`: a child module per path segment,
    a Parameter for each trainable row and a buffer for the others, zeros of
    the shape and dtype `state` (state_dict_from) holds under its key."""
    for name, trains in rows:
        *path, leaf = state_key(name).split(".")
        owner = module
        for part in path:
            if part not in owner._modules:
                if hasattr(owner, part):  # an nn.Module attribute ("training", "forward")
                    raise ValueError(f"parameter {name!r}: module name {part!r} is taken")
                owner.add_module(part, torch.nn.Module())
            owner = owner._modules[part]  # type: ignore[assignment]
        if hasattr(owner, leaf):
            raise ValueError(f"parameter {name!r}: state_dict key {state_key(name)!r} is taken")
        tensor = torch.zeros_like(state[state_key(name)])
        if trains:
            owner.register_parameter(leaf, torch.nn.Parameter(tensor))
        else:
            owner.register_buffer(leaf, tensor)


def state_dict_from(weights: str | dict[str, Any]) -> dict[str, torch.Tensor]:
    """weights.safetensors (its path, or {source name: array}) as Model's
    state_dict: PARAMETERS' rows by state_key."""
    arrays = _load(weights, narrow=True) if isinstance(weights, str) else weights
    return {state_key(row[0]): _as_const(arrays[row[0]]).detach() for row in PARAMETERS}


def _module_params(params: dict[str, Any]) -> dict[str, Any]:
    """The check's parameters as Model holds them: a Model built from them,
    read back by source_params(), so the check's gradients are the module's
    own Parameters'. Names no module tree can hold (a parameter "a" beside
    "a/b.weight": _declare's ValueError) are checked as given."""
    try:
        return Model(params).source_params()
    except ValueError:
        return params


# Inlined into every program; every other function here is a helper, inlined on use.
INLINED = ("_as_param", "_as_const", "_bfloat16", "state_key", "_declare", "state_dict_from")
# The parity check's (tracelog.emit.harness): inlined into standalone programs only.
CHECK = ("_numpy", "_value_and_grads", "_module_params", "_gate_table", "_gate_sign", "_gate_where")


def _resize_axes(
    x: torch.Tensor,
    axes: list[int],
    size: list[int] | None,
    scale_factor: list[float] | None,
    **how: Any,
) -> torch.Tensor:
    """F.interpolate over any axes of x (ONNX Resize's `axes`; F.interpolate
    resizes the trailing axes of [N, C, ...]): the other axes move in front
    and merge into the channels of a batch of one, and come back after."""
    rest = [a for a in range(x.dim()) if a not in axes]
    order = rest + list(axes)
    y = x.permute(*order)
    lead = y.shape[: len(rest)]
    y = y.reshape(1, -1, *y.shape[len(rest) :])
    y = F.interpolate(y, size=size, scale_factor=scale_factor, **how)
    y = y.reshape(*lead, *y.shape[2:])
    return y.permute(*[order.index(a) for a in range(x.dim())])
