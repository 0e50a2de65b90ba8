"""Layer norm, softmax, log-softmax and GELU written out by hand in a torch
model (BERT's LayerNorm, HF GPT-2's gelu_new, exp / sum) record as the one op
they mean, and every target's program runs its fused kernel with parity; a
near miss (epsilon outside the square root, a maximum over another axis, a
rounded constant) stays written out."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tracelog
from tests.helpers import assert_translated, record

Fn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _layer_norm(m: nn.Module, h: torch.Tensor, eps_inside: bool = True) -> torch.Tensor:
    u = h.mean(-1, keepdim=True)
    s = (h - u).pow(2).mean(-1, keepdim=True)
    d = torch.sqrt(s + 1e-5) if eps_inside else torch.sqrt(s) + 1e-5
    return m.w * ((h - u) / d) + m.b


def _softmax(h: torch.Tensor, max_dim: int = -1) -> torch.Tensor:
    z = torch.exp(h - h.max(dim=max_dim, keepdim=True).values)
    return z / z.sum(-1, keepdim=True)


def _log_softmax(h: torch.Tensor) -> torch.Tensor:
    u = h - h.max(-1, keepdim=True).values
    return u - torch.log(torch.exp(u).sum(-1, keepdim=True))


def _gelu_tanh(h: torch.Tensor, scale: float = math.sqrt(2.0 / math.pi)) -> torch.Tensor:
    return 0.5 * h * (1.0 + torch.tanh(scale * (h + 0.044715 * torch.pow(h, 3.0))))


def _gelu_erf(h: torch.Tensor) -> torch.Tensor:
    return h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))


# name -> (the written-out function, the op it records as, or None: stays written out)
CASES: dict[str, tuple[Fn, str | None]] = {
    "layer_norm": (_layer_norm, "LayerNormalization"),
    "softmax": (lambda m, h: _softmax(h), "Softmax"),
    "log_softmax": (lambda m, h: _log_softmax(h), "LogSoftmax"),
    "gelu_tanh": (lambda m, h: _gelu_tanh(h), "Gelu"),
    "gelu_erf": (lambda m, h: _gelu_erf(h), "Gelu"),
    # near misses
    "layer_norm_eps_outside_sqrt": (lambda m, h: _layer_norm(m, h, eps_inside=False), None),
    "softmax_max_over_batch": (lambda m, h: _softmax(h, max_dim=0), None),
    "gelu_tanh_rounded_constant": (lambda m, h: _gelu_tanh(h, scale=0.7978845608), None),
}
WRITTEN = {"Exp", "Erf", "Tanh", "ReduceMean", "ReduceMax", "Sqrt"}


class Block(nn.Module):
    def __init__(self, fn: Fn) -> None:
        super().__init__()
        self.fn = fn
        self.lin = nn.Linear(6, 8)
        self.w, self.b = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fn(self, self.lin(x)))


@pytest.fixture(scope="module", params=sorted(CASES))
def written_log(request, tmp_path_factory) -> tuple[str, Path, tracelog.TraceLog]:
    torch.manual_seed(0)
    batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(2)]
    d = tmp_path_factory.mktemp(request.param)
    log = record(Block(CASES[request.param][0]), d, batches, nn.functional.cross_entropy)
    return request.param, d, log


def test_records_the_op_it_means(written_log) -> None:
    case, _, log = written_log
    fused = CASES[case][1]
    pred = log.graphs[log.entries_sorted()[0].hash]
    ops = pred.op_histogram()
    if fused is None:
        assert not {"LayerNormalization", "Softmax", "LogSoftmax", "Gelu"} & set(ops), ops
        return
    assert ops[fused] == 1 and not WRITTEN & set(ops), ops
    assert set(ops) <= {fused, "Gemm"}, ops


@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax", "onnx"])
def test_every_target_matches_torch(written_log, target: str) -> None:
    case, log_dir, _ = written_log
    if target == "jax" and CASES[case][1] is None:
        pytest.skip("the near misses run on torch, TensorFlow and ONNX (JAX compiles slowly)")
    assert_translated(tracelog.check(log_dir, target=target))
