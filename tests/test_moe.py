"""Mixture-of-experts layers as transformers writes them (its grouped_mm
experts, the default on the CPU): tokens sorted by expert, each expert's
count by histc, the experts' products by torch._grouped_mm over the sorted
rows, and the order restored through an inverse permutation written into
torch.empty_like. Each translates on every target, as does a tiny Mixtral
and its token-by-token loop of experts (nonzero per expert: count symbols)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm is new in torch 2.8"
)


class _GroupedExperts(nn.Module):
    """Top-2 routing over 4 experts, as transformers' grouped_mm_experts_forward."""

    def __init__(self, width: int = 8, hidden: int = 12, experts: int = 4) -> None:
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(width, experts)
        self.up = nn.Parameter(torch.randn(experts, hidden, width) * 0.3)
        self.down = nn.Parameter(torch.randn(experts, width, hidden) * 0.3)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(tokens), dim=-1), 2, dim=-1)
        expert_ids, perm = torch.sort(chosen.reshape(-1))
        rows = tokens[perm // 2]
        per_expert = torch.histc(expert_ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
        h = F.silu(torch._grouped_mm(rows, self.up.transpose(-2, -1), offs=offsets))
        out = torch._grouped_mm(h, self.down.transpose(-2, -1), offs=offsets)
        out = out * weights.reshape(-1)[perm].unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.size(0))
        mixed = out[inverse].view(tokens.shape[0], 2, -1).sum(dim=1)
        return self.head(mixed.view(x.shape)).mean(dim=1)


def _check(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    assert_translated(tracelog.check(tmp_path, target))


def _record(tmp_path: Path, model: nn.Module, batches: list[Any], step: Any) -> Any:
    with tracelog.Listener(model, tmp_path, mode="exact", strict=True) as listener:
        for batch in batches:
            with listener.batch():
                step(model, batch).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops, ops
    return log


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_experts_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(4, 5, 8), torch.arange(4) % 3) for _ in range(2)]
    log = _record(
        tmp_path,
        _GroupedExperts(),
        batches,
        lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
    )
    assert [e.usage.batches for e in log.entries.values() if e.kind == "prediction"] == [2]
    _check(target, tmp_path)


class _Histogram(nn.Module):
    """histc of the data (values on its edges, between them, outside the range)
    scaling a prediction: the bins must be torch's to the element."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counts = torch.histc(x, bins=5, min=-1.0, max=2.0)
        scale = torch.arange(1.0, 6.0)
        return self.fc(x) * (counts * scale).sum() + counts[0]


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_histc_bins_as_torch_does(target: str, tmp_path: Path) -> None:
    edges = torch.linspace(-1.0, 2.0, 6)
    x = torch.cat([edges, torch.tensor([-1.5, 2.5, 0.1, 1.9])]).reshape(-1, 1)
    torch.manual_seed(0)
    _record(
        tmp_path,
        _Histogram(),
        [(x, torch.arange(10) % 4)],
        lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
    )
    _check(target, tmp_path)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_a_tiny_mixtral_translates(target: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="Mixtral comes from transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    model = transformers.MixtralForCausalLM(config)
    batches = [torch.randint(0, 64, (2, 8)) for _ in range(2)]
    _record(tmp_path, model, batches, lambda m, ids: m(input_ids=ids, labels=ids).loss)
    _check(target, tmp_path)
