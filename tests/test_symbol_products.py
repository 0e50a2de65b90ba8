"""A dim that is the product of two symbols, met trying more Hugging Face
text families (2026-11-29): X-MOD's language adapters select the rows of one language
(x[mask] over the batch, its count a symbol), run the adapter on them, which
flattens [count, seq, C] to [count*seq, C], and write them back
(new[mask] = ...): a dim that is the product of two symbols beside the batch."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated, load_whole  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _LanguageAdapter(nn.Module):
    """Rows of the batch whose language is 0 go through an adapter (every row
    here, as X-MOD's default language: the count equals the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.adapter = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        languages = 0 * torch.ones(x.shape[0])
        new = torch.zeros_like(h)
        mask = languages == 0
        new[mask] = self.adapter(h[mask])
        return self.head(new + h).mean(dim=1)


def _record(tmp_path: Path, model: nn.Module, shapes: list[tuple[int, int]]) -> tracelog.TraceLog:
    with tracelog.Listener(model, tmp_path, mode="exact", strict=True) as listener:
        for b, t in shapes:
            with listener.batch():
                loss = F.cross_entropy(model(torch.randn(b, t, 8)), torch.arange(b) % 3)
                loss.backward()
            model.zero_grad()
    return load_whole(tmp_path)


@pytest.mark.parametrize("target", TARGETS)
def test_selected_rows_flattened_with_the_sequence(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    # two batch sizes and two lengths: one graph, its selection's rows count*seq
    log = _record(tmp_path, _LanguageAdapter(), [(4, 5), (3, 6)])
    assert [e.usage.batches for e in log.entries.values() if e.kind == "prediction"] == [2]
    assert_translated(tracelog.check(tmp_path, target))
