"""The CTC loss of speech-style models (F.ctc_loss, nn.CTCLoss): aten._ctc_loss
records as tracelog.CTCLoss, its reduction (zero_infinity's where, the mean's
division by the target lengths) as the ops after it. A recurrent model over
[N, T, F] batches whose log-probabilities go time-major to the loss, over two
batches of different sizes with lengths varied per sample, padded and
concatenated targets, lengths as tensors and as int lists, blank 0 and not,
an impossible alignment zeroed: each program target runs its own alpha
recursion (torch its F.ctc_loss) and passes with its float64 rows, gradients
included; ONNX runs the op's function (a Loop over the steps) in float64 on
onnx.reference and in float32 on onnxruntime."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
nn = torch.nn

T, FEATURES, CLASSES = 11, 3, 9


class _Speech(nn.Module):
    def __init__(self, time_major: bool) -> None:
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, 8, batch_first=True)
        self.head = nn.Linear(8, CLASSES)
        self.time_major = time_major

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = self.head(self.rnn(x)[0]).log_softmax(-1)
        return log_probs.transpose(0, 1) if self.time_major else log_probs


# (reduction, zero_infinity, blank, targets' form, lengths' form)
CASES = {
    "mean": ("mean", False, 0, "padded", "tensor"),
    "sum-zero-infinity": ("sum", True, 0, "padded", "tensor"),
    "none-blank3": ("none", False, 3, "padded", "tensor"),
    "mean-concatenated-blank8": ("mean", True, 8, "concatenated", "tensor"),
    "mean-int-lengths": ("mean", False, 0, "padded", "list"),
}


def _record(case: str, log_dir: Path) -> tracelog.TraceLog:
    reduction, zero_infinity, blank, form, lengths_as = CASES[case]
    torch.manual_seed(0)
    model = _Speech(time_major=case != "mean")
    ctc = nn.CTCLoss(blank=blank, reduction=reduction, zero_infinity=zero_infinity)
    listener = tracelog.Listener(model, log_dir, strict=True)
    for n in (6, 4):
        x = torch.randn(n, T, FEATURES)
        steps = torch.randint(6, T + 1, (n,))
        lengths = torch.randint(0, 4, (n,))
        labels = torch.randint(0, CLASSES - 1, (n, 3))
        labels = labels + (labels >= blank).long()  # never the blank
        labels[0, 1] = labels[0, 0]  # a repeated label: a blank must come between
        if zero_infinity:
            steps[1], lengths[1] = 2, 3  # 3 labels in 2 steps: impossible
        if form == "concatenated":
            labels = torch.cat([labels[k, : lengths[k]] for k in range(n)])
        lens = (steps.tolist(), lengths.tolist()) if lengths_as == "list" else (steps, lengths)
        with listener.batch():
            out = model(x)
            log_probs = out if model.time_major else out.transpose(0, 1)
            loss = ctc(log_probs, labels, *lens)
            (loss.sum() if reduction == "none" else loss).backward()
        model.zero_grad()
    log = listener.close()
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.CTCLoss" in ops and "tracelog.Unsupported" not in ops, ops
    if form == "padded" and lengths_as == "tensor":
        # the labels and lengths are the loss graph's targets: one graph of each kind
        # for both batch sizes (the batch-dim replay sizes the op's outputs itself)
        assert [e.usage.batches for e in log.entries.values()] == [2, 2]
    return log


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax", "onnx"])
def test_ctc_loss_translates(target: str, case: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    _record(case, tmp_path)
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    names = {c.name for c in translated}
    assert {"prediction [float64]", "loss [float64]"} <= names, names
    if target != "onnx":  # a program: the gradients by the target's autodiff
        assert "grad head.weight [float64]" in names, names
    assert all(c.ok for c in translated), report.table()


@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax", "onnx"])
def test_unbatched_ctc_loss_translates(target: str, tmp_path: Path) -> None:
    """log_probs [T, C] with 1-D targets and 0-d lengths: torch gives them a batch
    of 1 before aten._ctc_loss, whose lengths stay 0-d."""
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, CLASSES)
    with tracelog.Listener(model, tmp_path, strict=True) as listener:
        for steps in (T, 7):  # the rows are the steps
            with listener.batch():
                log_probs = model(torch.randn(steps, FEATURES)).log_softmax(-1)
                labels = torch.tensor([3, 3, 5])
                F.ctc_loss(log_probs, labels, torch.tensor(steps), torch.tensor(3)).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    if target != "onnx":
        assert "grad weight [float64]" in {c.name for c in translated}, report.table()
    assert all(c.ok for c in translated), report.table()
