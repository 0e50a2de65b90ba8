"""The batch-dim replay through torch._grouped_mm (transformers' default
grouped experts: Mixtral, Qwen2-MoE, Jamba). Its meta kernel takes bfloat16
only (CUDA's dtypes), though CPU runs float32, so every replay through it
failed and fell back to the guess; where a size of the model equals the batch
(Jamba's mamba_d_state = 4 in a batch of 4), the guess split a dim that is
not the batch's. The replay now reads its shapes from a bfloat16 call.

And a program's function holds no statement whose names nothing reads (a
sort of a whole symbolic axis takes no K in the programs, which the graph's
TopK computes: an unused local, which pyflakes flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_lint_clean, assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.adapters.torch import batch_dims  # noqa: E402
from tracelog.adapters.torch import listener as torch_listener  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402
from tracelog.emit.program import _live  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class _Experts(nn.Module):
    """Top-1 routing of [B, T, 4] tokens over 2 experts, each token's rows
    sorted by expert and multiplied by its expert's matrix in one
    torch._grouped_mm, then put back; a [B, 4, 4] state (4 = the batch size
    of the test) beside it, as Mamba's ssm state."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 2)
        self.experts = nn.Parameter(torch.randn(2, 4, 4) * 0.5)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        state = torch.zeros(b, d, 4) + x[:, :1, :].transpose(1, 2)
        flat = x.reshape(-1, d)
        expert = self.router(flat).argmax(-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.histc(expert.float(), bins=2, min=0, max=1).to(torch.int32)
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        out = torch._grouped_mm(flat[order], self.experts, offs=offsets)
        back = torch.empty_like(out)
        back[order] = out
        h = back.reshape(b, t, d) + state.mean(-1, keepdim=True).transpose(1, 2)
        return self.head(torch.tanh(h).mean(1))


def _record(tmp_path: Path, monkeypatch: Any, found: list[Any]) -> Path:
    def keep(tape: Any, **kwargs: Any) -> Any:
        out = batch_dims.exact_batch_dims(tape, **kwargs)
        found.append(out)
        return out

    monkeypatch.setattr(torch_listener, "exact_batch_dims", keep)
    torch.manual_seed(0)
    model = _Experts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracelog.Listener(model, tmp_path, strict=True) as listener:
        for b in (4, 5):
            x, y = torch.randn(b, 6, 4), torch.randint(0, 3, (b,))
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return tmp_path


def test_the_replay_runs_through_grouped_mm(tmp_path: Path, monkeypatch: Any) -> None:
    found: list[Any] = []
    _record(tmp_path, monkeypatch, found)
    assert found and all(tape is not None for tape in found)  # the replay, not the guess
    log = tracelog.load(tmp_path)
    ops = {op for g in log.graphs.values() for op in g.op_histogram()}
    assert "Unsupported" not in ops and "tracelog.Unsupported" not in ops, ops
    assert len(log.graphs) == 2  # one prediction and one loss graph for both batch sizes


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_translates_and_is_lint_clean(
    tmp_path: Path, monkeypatch: Any, target: str
) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    log_dir = _record(tmp_path, monkeypatch, [])
    assert_translated(tracelog.check(log_dir, target))
    if target != "onnx":
        tracelog.emit(log_dir, target=target)
        text = (log_dir / targets.file_name(target)).read_text()
        assert_lint_clean(text, f"{target} program")


def test_live_drops_what_nothing_reads() -> None:
    lines = [
        "# block (Block): Shape, Mul, TopK",
        "shape = torch.tensor(x.shape[0:1], dtype=torch.int64)",
        "mul = shape * torch.tensor([2], dtype=torch.int64)",
        "top_k, top_k_indices = _topk(x, None, 0, False)",
        "# head (Linear): Gemm",
        "unused = torch.tanh(x)",
        "# tail (Tail): Tanh",
        "updates['update:' + prefix + 'n'] = top_k",
        "return top_k_indices",
    ]
    assert _live(lines) == [
        "# block (Block): Shape, Mul, TopK",
        "top_k, top_k_indices = _topk(x, None, 0, False)",
        "# tail (Tail): Tanh",
        "updates['update:' + prefix + 'n'] = top_k",
        "return top_k_indices",
    ]
    # an attribute of the same name is no read of the local
    assert _live(["shape = f(x)", "y = x.shape", "return y"]) == ["y = x.shape", "return y"]
