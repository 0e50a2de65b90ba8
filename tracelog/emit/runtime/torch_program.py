"""What a PyTorch program carries besides its graph functions: parameters as
torch.nn.Parameter (so the program trains as it stands), gradients by
torch.autograd, and the helpers op spellings call (inlined only when used)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file  # noqa: F401 - the program's weight loader

Step = Callable[[dict[str, Any]], tuple[dict[str, Any], Any]]


def _as_param(array: np.ndarray, trainable: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(array))
    return torch.nn.Parameter(tensor) if trainable else tensor


def _as_const(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array))


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _value_and_grads(step: Step, params: dict[str, Any], trainable: list[str]) -> tuple:
    """step(params); gradients of its loss for the trainable parameters, in
    order, by torch.autograd."""
    outputs, loss = step(params)
    grads = torch.autograd.grad(loss, [params[name] for name in trainable], allow_unused=True)
    return outputs, loss, grads


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


def _dropout(x: torch.Tensor, rate: Any, rng: Any, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout in training mode; returns the output and the mask. rng: a dict
    of recorded masks (parity replay), a torch.Generator, or None."""
    if isinstance(rng, dict):
        mask = torch.as_tensor(rng[key]).to(x.dtype)
    else:
        keep = torch.rand(x.shape, generator=rng, dtype=x.dtype) >= rate
        mask = keep.to(x.dtype)
    return x * (mask / (1.0 - rate)), mask > 0


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
) -> tuple[torch.Tensor, ...]:
    """An ONNX LSTM, GRU or RNN node (layout 0) through torch's own fused layer `fn`
    (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu): one layer, both directions
    at once, the weights back in torch's gate order (`order`: torch's k-th gate is ONNX's
    gate order[k]). Returns Y [seq, dirs, batch, hidden] and the final states."""
    dirs, hidden = w.shape[0], r.shape[-1]
    params = []
    for d in range(dirs):
        params += [_gates(w[d], order), _gates(r[d], order)]
        if b is not None:
            params += [_gates(half, order) for half in b[d].chunk(2)]  # Wb, Rb
    zeros = x.new_zeros(dirs, x.shape[1], hidden)
    hx = [zeros if s is None else s for s in states]
    if direction == "reverse":
        x = x.flip(0)
    # dropout 0: the layer alone (train=True keeps the kernel torch trains with)
    y, *finals = fn(
        x, hx if len(hx) > 1 else hx[0], params, b is not None, 1, 0.0, True, dirs == 2, False
    )
    y = y.reshape(y.shape[0], y.shape[1], dirs, hidden).transpose(1, 2)
    return (y.flip(0) if direction == "reverse" else y, *finals)


def _lstm(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    c0: torch.Tensor | None,
    direction: str,
) -> tuple[torch.Tensor, ...]:
    """ONNX LSTM (gates i, o, f, c) as torch.lstm (gates i, f, g, o)."""
    return _recurrent(torch.lstm, x, w, r, b, [h0, c0], direction, [0, 2, 3, 1])


def _gru(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    direction: str,
) -> tuple[torch.Tensor, ...]:
    """ONNX GRU with linear_before_reset=1 (gates z, r, h) as torch.gru (gates r, z, n)."""
    return _recurrent(torch.gru, x, w, r, b, [h0], direction, [1, 0, 2])


def _rnn(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    h0: torch.Tensor | None,
    direction: str,
    activation: str,
) -> tuple[torch.Tensor, ...]:
    """ONNX RNN with a tanh or relu activation as torch.rnn_tanh / torch.rnn_relu."""
    fn = torch.rnn_relu if activation == "relu" else torch.rnn_tanh
    return _recurrent(fn, x, w, r, b, [h0], direction, [0])


# Inlined into every program; every other function here is a helper, inlined on use.
INLINED = ("_as_param", "_as_const", "_numpy", "_value_and_grads")
