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

from helpers import assert_translated, load_whole  # noqa: E402

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
    return load_whole(tmp_path)


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


class _ExpertModules(nn.Module):
    """SwitchTransformers' and NLLB-MoE's loop: the experts hit found by
    nonzero and iterated in Python (Tensor.__iter__: unbind), each expert a
    module picked by the index read, its tokens by torch.where. Tokens go to
    the expert of their id (mod 4), so a batch sets each expert's count."""

    def __init__(self, width: int = 8, experts: int = 4, by_index: bool = False) -> None:
        super().__init__()
        self.by_index = by_index  # `for i in range(len(hit)): hit[i]`: a select per row
        self.embed = nn.Embedding(20, width)
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))
        self.head = nn.Linear(width, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        tokens = h.reshape(-1, h.shape[-1])
        probs = F.softmax(self.router(tokens), dim=-1)
        mask = F.one_hot(ids.reshape(-1) % len(self.experts), len(self.experts)).permute(1, 0)
        out = torch.zeros_like(tokens)
        hit = torch.greater(mask.sum(dim=-1), 0).nonzero()
        for expert in [hit[i] for i in range(len(hit))] if self.by_index else hit:
            (rows,) = torch.where(mask[expert].squeeze(0))
            y = self.experts[int(expert[0])](tokens[rows]) * probs[rows, expert, None]
            out.index_add_(0, rows, y)
        return self.head(out.view(h.shape)).mean(dim=1)


@pytest.mark.parametrize("target", TARGETS)
def test_experts_iterated_in_python_translate(target: str, tmp_path: Path) -> None:
    # the number of experts hit is a number of the graph (one unbind output per
    # expert), not a symbol; each expert's count is one, a count of 1 (expert 3
    # in the first batch) and counts equal to the batch size (4) among them
    torch.manual_seed(0)
    first = torch.tensor([[0, 1, 2, 3, 0, 1], [4, 5, 6, 8, 9, 10], [12, 13, 14, 16, 17, 0],
                          [1, 2, 5, 6, 9, 10]])  # fmt: skip
    second = torch.tensor([[0, 1, 2, 3, 7], [4, 5, 6, 11, 8], [8, 9, 10, 15, 12],
                           [12, 13, 14, 19, 16]])  # fmt: skip
    batches = [(ids, torch.arange(4) % 3) for ids in (first, second)]
    log = _record(
        tmp_path,
        _ExpertModules(),
        batches,
        lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
    )
    assert log.unrecorded == 0
    _check(target, tmp_path)


@pytest.mark.parametrize("by_index", [False, True], ids=["unbind", "select"])
@pytest.mark.parametrize("mode", ["exact", "guarded"])
def test_a_batch_that_hits_fewer_experts_is_a_graph_of_its_own(
    mode: str, by_index: bool, tmp_path: Path
) -> None:
    """The number of experts hit is a number of the graph: a batch of the same
    shape that hits three of the four is another graph pair, in exact mode
    and in guarded mode (its calls of the expert modules differ: the key),
    and the batches that hit all four keep theirs."""
    torch.manual_seed(0)
    model = _ExpertModules(by_index=by_index)
    all_four = torch.tensor([[0, 1, 2, 3, 0, 1], [4, 5, 6, 7, 8, 9], [1, 2, 3, 5, 6, 7],
                             [0, 4, 8, 3, 7, 11]])  # fmt: skip
    three = all_four.clone()
    three[three % 4 == 3] = 2  # expert 3 gets no token
    labels = torch.arange(4) % 3
    # a guarded batch that notices the branch is held until an exact recording
    # shows its path: the next batch of that path is recorded exactly
    order = [all_four] * 5 + [three, three] + [all_four]
    with tracelog.Listener(model, tmp_path, mode=mode, strict=True) as listener:
        for ids in order:
            with listener.batch():
                F.cross_entropy(model(ids), labels).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    pairs = sorted(p.usage.batches for p in log.pairs.values() if p.phase == "train")
    assert pairs == [2, 6], [(p.prediction[:8], p.usage) for p in log.pairs.values()]
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops, ops
    if mode == "guarded":
        assert sum(p.usage.guarded for p in log.pairs.values()) > 0
    # the experts hit (the first NonZero) are counted by a number in each graph
    for p in log.pairs.values():
        graph = log.graph(p.prediction)
        hit = next(n for n in graph.nodes if n.op == "NonZero")
        assert "count" not in str(graph.values[hit.outputs[0]].type), graph.values[hit.outputs[0]]
