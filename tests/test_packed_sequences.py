"""Recurrent layers over packed sequences (``pack_padded_sequence`` -> nn.LSTM /
nn.GRU / nn.RNN -> ``pad_packed_sequence``): the packing is noted, the layer
becomes one ONNX node per layer with ``sequence_lens``, and padding back is its
output. Batches of other lengths share the graph (the steps are a symbol)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

nn = torch.nn
rnn_utils = torch.nn.utils.rnn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]
LAYERS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


class _Tagger(nn.Module):
    """Embeds, packs by length, runs a recurrent layer, pads back, and scores
    each step and the final state (a sequence tagger's and a classifier's heads)."""

    def __init__(
        self,
        kind: str = "lstm",
        *,
        batch_first: bool = True,
        enforce_sorted: bool = True,
        bidirectional: bool = True,
        layers: int = 2,
        initial_state: bool = False,
        padding_value: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        self.kind, self.batch_first, self.enforce_sorted = kind, batch_first, enforce_sorted
        self.initial_state, self.padding_value = initial_state, padding_value
        self.embed = nn.Linear(5, 6)
        self.rnn = LAYERS[kind](
            6,
            7,
            num_layers=layers,
            batch_first=batch_first,
            bidirectional=bidirectional,
            **options,
        )
        width = 7 * (2 if bidirectional else 1)
        self.head = nn.Linear(width, 3)
        self.state_head = nn.Linear(7, 3)
        self.h0 = nn.Parameter(torch.randn(layers * (2 if bidirectional else 1), 1, 7) * 0.1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        if not self.batch_first:
            h = h.transpose(0, 1)
        packed = rnn_utils.pack_padded_sequence(
            h, lengths, batch_first=self.batch_first, enforce_sorted=self.enforce_sorted
        )
        state: Any = None
        if self.initial_state:
            h0 = self.h0.expand(-1, x.shape[0], -1).contiguous()
            state = (h0, torch.zeros_like(h0)) if self.kind == "lstm" else h0
        out, final = self.rnn(packed, state)
        y, counts = rnn_utils.pad_packed_sequence(
            out, batch_first=self.batch_first, padding_value=self.padding_value
        )
        if not self.batch_first:
            y = y.transpose(0, 1)
        last = final[0] if isinstance(final, tuple) else final
        # a mean over each sequence's own steps (the lengths pad_packed_sequence gives)
        pooled = self.head(y).sum(1) / counts.unsqueeze(1).to(y.dtype)
        return pooled + self.state_head(last).sum(0)


def _batches(enforce_sorted: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two batches of 4, padded to their longest sequence (6 and 8 steps)."""
    torch.manual_seed(0)
    found = []
    for steps, lengths in ((6, [6, 3, 5, 2]), (8, [4, 8, 8, 1])):
        lens = torch.tensor(lengths)
        if enforce_sorted:
            lens = lens.sort(descending=True).values
        x = torch.randn(4, steps, 5)
        x = x * (torch.arange(steps)[None, :, None] < lens[:, None, None])  # padded with 0
        found.append((x, lens))
    return found


def _record(model: nn.Module, log_dir: Path, order: int = 1) -> Any:
    batches = _batches(getattr(model, "enforce_sorted", True))[::order]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with TorchListener(model, log_dir, strict=True) as listener:
        for x, lengths in batches:
            with listener.batch():
                torch.nn.functional.cross_entropy(model(x, lengths), lengths % 3).backward()
            optimizer.step()
            optimizer.zero_grad()
    log = tracelog.load(log_dir)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops and "Unsupported" not in ops, ops
    return log


def _check(target: str, log_dir: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    report = tracelog.check(log_dir, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    if target != "onnx":  # the ONNX model is the forward: programs compare gradients too
        grads = [c for c in translated if c.name.startswith("grad rnn.")]
        assert grads and all(c.ok for c in grads), report.table()


CASES = {
    "lstm, bidirectional, 2 layers": dict(kind="lstm"),
    # lengths in no order: sorted along the batch, the rows and the state gathered,
    # the outputs and final state gathered back (invert_permutation's scatter)
    "gru, sequence-first, initial state, unsorted": dict(
        kind="gru", batch_first=False, initial_state=True, enforce_sorted=False
    ),
    "rnn relu, 1 layer, padding -1": dict(
        kind="rnn", bidirectional=False, layers=1, nonlinearity="relu", padding_value=-1.0
    ),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_packed_recurrent_layers_translate(case: str, target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    log = _record(_Tagger(**CASES[case]), tmp_path)
    predictions = [g for g in log.graphs.values() if g.kind == "prediction"]
    assert len(predictions) == 1  # 6 and 8 steps: one graph, the steps a symbol
    assert [e.usage.batches for e in log.entries.values() if e.kind == "prediction"] == [2]
    ops = predictions[0].op_histogram()
    kind = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}[CASES[case]["kind"]]
    assert ops.get(kind) == CASES[case].get("layers", 2), ops
    graph = predictions[0]
    pads = [n for n in graph.nodes if n.source == "aten._pad_packed_sequence.default"]
    # its second output, the lengths, typed as torch returns them
    assert str(graph.values[pads[-1].outputs[0]].type) == "int64[batch]", pads[-1]
    _check(target, tmp_path)


def test_the_shared_graph_is_the_one_either_length_records(tmp_path: Path) -> None:
    """Recorded from the 8-step batch first, the graph is the one the 6-step
    batch gave: the symbol stands for both lengths."""
    hashes = []
    for order, sub in ((1, "a"), (-1, "b")):
        torch.manual_seed(0)
        log = _record(_Tagger(), tmp_path / sub, order)
        hashes.append(sorted(h for h, g in log.graphs.items() if g.kind == "prediction"))
    assert hashes[0] == hashes[1]
    _check("torch", tmp_path / "b")


def test_reading_the_packed_data_is_unsupported_with_a_reason(tmp_path: Path) -> None:
    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 3)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            packed = rnn_utils.pack_padded_sequence(self.fc(x), lengths, batch_first=True)
            return packed.data.sum() * torch.ones(x.shape[0], 3)

    x, lengths = _batches(True)[0]
    model = Reads()
    with TorchListener(model, tmp_path, strict=False) as listener, listener.batch():
        model(x, lengths).sum().backward()
    log = tracelog.load(tmp_path)
    reasons = [
        n.attrs.get("reason", "")
        for g in log.graphs.values()
        for n in g.nodes
        if n.op == "Unsupported"
    ]
    assert any("packed sequence" in r for r in reasons), reasons


def _hardest_first(scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Online hard example mining: the per-sample losses sorted along the batch
    (a sort of the whole batch dim), weighted by rank, the hardest most."""
    losses = torch.nn.functional.cross_entropy(scores, y, reduction="none")
    ranked, order = losses.sort(descending=True)
    weights = torch.softmax(-torch.arange(ranked.shape[0]).float(), 0)
    hardest = scores.index_select(0, order)[:, 0].mean()  # the rows in that order
    return (ranked * weights).sum() + 0.01 * hardest


@pytest.mark.parametrize("target", ["onnx", "torch", "tensorflow", "jax"])
def test_sorting_along_the_batch_translates(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        x, y = torch.randn(6, 5), torch.arange(6) % 3
        _hardest_first(model(x), y).backward()
    log = tracelog.load(tmp_path)
    ops = [n.op for g in log.graphs.values() for n in g.nodes]
    assert "Unsupported" not in ops and "TopK" in ops, ops
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    assert all(c.ok for c in report.comparisons if c.name.endswith(" [float64]"))
