"""What real models hold and do that toy models don't: a loss computed inside
``forward`` (Hugging Face models given ``labels=``), 0-dim tensors of every
dtype, non-persistent buffers, tied weights and parameters shared across
modules. Each is recorded for real and checked on every target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracelog
from tracelog.adapters.torch import TorchListener

TARGETS = ["torch", "tensorflow", "jax", "onnx"]


class TinyLM(nn.Module):
    """A causal LM whose forward computes the shifted LM loss when given
    labels, as Hugging Face models do, returning a dict with loss and logits."""

    def __init__(self, vocab: int = 11, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2 ties wte and lm_head
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)
        self.register_buffer("step", torch.tensor(3))  # a 0-dim int buffer

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        h = torch.tanh(self.mix(self.embed(input_ids))) * self.scale
        logits = self.head(h)
        out = {"logits": logits}
        if labels is not None:
            shift_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1])
            shift_labels = labels[:, 1:].reshape(-1)
            out["loss"] = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
        return out


def _train_lm(log_dir: Path, batches: int = 2, eval_batch: bool = True) -> TorchListener:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    listener = TorchListener(model, log_dir, strict=True)
    for _ in range(batches):
        ids = torch.randint(0, 11, (3, 6), generator=g)
        labels = ids.clone()
        labels[0, 4:] = -100
        with listener.batch():
            loss = model(input_ids=ids, labels=labels)["loss"]
            loss.backward()
        opt.step()
        opt.zero_grad()
    if eval_batch:
        model.eval()
        with torch.no_grad(), listener.batch():
            model(input_ids=ids, labels=labels)
        model.train()
    listener.close()
    return listener


@pytest.fixture(scope="module")
def lm_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("lm") / "run"
    _train_lm(log_dir)
    return log_dir


def test_loss_inside_forward_splits_by_data(lm_log: Path) -> None:
    log = tracelog.load(lm_log)
    train = [p for p in log.pairs.values() if p.phase == "train"]
    assert len(train) == 1 and train[0].loss is not None
    assert train[0].usage.batches == 2  # other labels, same graphs: labels are data
    pred, loss = log.graph(train[0].prediction), log.graph(train[0].loss)
    # the prediction graph ends at the logits and does not read the labels
    assert [o.role for o in pred.outputs] == ["prediction.logits"]
    assert [v.name for v in pred.inputs] == ["input_ids"]
    # the loss graph reads the logits and the labels, and the shift of the labels is recorded
    loss_inputs = {v.name for v in loss.inputs}
    assert {"prediction.logits", "labels"} <= loss_inputs
    assert "NegativeLogLikelihoodLoss" in {n.op for n in loss.nodes}
    assert "Slice" in {n.op for n in loss.nodes}
    # labels are never baked in as constants: no int64 tensor constant in the loss graph
    assert not [v.name for v in loss.values.values() if v.kind == "const" and v.type.shape[1:]]
    # the eval batch (no backward) finds its loss by the output's name
    evals = [p for p in log.pairs.values() if p.phase == "eval"]
    assert len(evals) == 1 and evals[0].loss == train[0].loss


@pytest.mark.parametrize("target", TARGETS)
def test_loss_inside_forward_checks_on_every_target(lm_log: Path, target: str) -> None:
    pytest.importorskip(
        {"torch": "torch", "tensorflow": "tensorflow", "jax": "jax", "onnx": "onnxruntime"}[target],
        reason=f"the {target} target needs its framework installed",
    )
    report = tracelog.check(lm_log, target)
    assert report.ok, report


def test_tied_and_non_persistent_state(lm_log: Path) -> None:
    log = tracelog.load(lm_log)
    weights = log.weights()
    assert "scale" in weights  # non-persistent: not in state_dict, but graphs read it
    params = [p["name"] for p in log.model["params"]]
    assert params.count("embed.weight") + params.count("head.weight") == 1  # one, tied
    sample = log.sample()
    assert "grad/embed.weight" in sample  # both uses' gradients in one


class ZeroDim(nn.Module):
    """0-dim tensors of every dtype on the recorded path."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("offset", torch.tensor(2, dtype=torch.int64))
        self.register_buffer("flag", torch.tensor(True))
        self.register_buffer("gain", torch.tensor(1.5, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.gain.float()
        y = y + self.offset.float() * self.flag.float()
        return y * torch.tensor(0.25)


def test_zero_dim_tensors_of_every_dtype_record(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ZeroDim()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for _ in range(2):
            x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    log = tracelog.load(tmp_path / "run")
    assert not log.failures
    report = tracelog.check(tmp_path / "run", "torch")
    assert report.ok, report


class ShiftRight(nn.Module):
    """A decoder input made by writing into views of a fresh tensor, as
    Hugging Face's T5/BART shift_tokens_right does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = 2
        shifted.masked_fill_(shifted == -100, 0)
        return self.head(self.embed(shifted))


def test_writes_into_views_update_their_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ShiftRight()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for t in (5, 7):
            labels = torch.randint(0, 11, (3, t))
            labels[0, -1] = -100
            with listener.batch():
                logits = model(labels)
                F.cross_entropy(logits.reshape(-1, 11), labels.clamp(min=0).reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    log = tracelog.load(tmp_path / "run")
    train = [p for p in log.pairs.values() if p.phase == "train"]
    assert len(train) == 1 and train[0].usage.batches == 2  # one graph for both lengths
    ops = {n.op for n in log.graph(train[0].prediction).nodes}
    assert "Concat" in ops and "tracelog.Unsupported" not in ops
    for target in TARGETS:
        report = tracelog.check(tmp_path / "run", target)
        assert report.ok, report


class RelativeBias(nn.Module):
    """BEiT's relative position index, built in the forward by writes into views
    of views (``coords[:, :, 0] += k``: slice, slice, select; ``index[0, 0:] = k``:
    select, slice), read into a learned bias table; and a write into a view of a
    view of the data (``h[:, 1:][:, 0] = 0``)."""

    def __init__(self, window: int = 3) -> None:
        super().__init__()
        self.window = window
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2 + 3))
        self.lin = nn.Linear(window * window + 1, window * window + 1)

    def index(self) -> torch.Tensor:
        w = self.window
        coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij"))
        flat = torch.flatten(coords, 1)
        rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += w - 1
        rel[:, :, 1] += w - 1
        rel[:, :, 0] *= 2 * w - 1
        n = (2 * w - 1) ** 2 + 3
        index = torch.zeros(size=(w * w + 1,) * 2, dtype=rel.dtype)
        index[1:, 1:] = rel.sum(-1)
        index[0, 0:] = n - 3
        index[0:, 0] = n - 2
        index[0, 0] = n - 1
        return index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index().reshape(-1)].reshape(x.shape[-1], x.shape[-1])
        h = self.lin(x).clone()
        h[:, 1:][:, 0] = 0.0
        return h @ bias


def test_writes_into_views_of_views_update_their_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = RelativeBias()
    with torch.no_grad():  # the index as torch computes it, and the data write
        want = model.index()
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for n in (4, 6):
            with listener.batch():
                F.mse_loss(model(torch.randn(n, 10)), torch.zeros(n, 10)).backward()
    log = tracelog.load(tmp_path / "run")
    (pred,) = [log.graph(p.prediction) for p in log.pairs.values()]
    assert "Unsupported" not in {n.op for n in pred.nodes}
    assert want[0, 0] == 27 and want[1, 0] == 26 and want[0, 1] == 25  # cls rows
    for target in TARGETS:
        report = tracelog.check(tmp_path / "run", target)
        assert report.ok, report.table()
        assert any("[float64]" in c.name for c in report.comparisons)


class WholeViews(nn.Module):
    """Writes through views of a whole tensor: an in-place dropout on a
    flattened pool output (Hugging Face's MobileNetV2 classifier), a write into
    a transposed view and into a permuted one; and a write through a strided
    view into a tensor nothing reads after it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.drop = nn.Dropout(0.3, inplace=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        pooled = F.adaptive_avg_pool2d(h, 1)
        flat = self.drop(torch.flatten(pooled, 1))  # mul_ into a view of pooled
        t = h.clone()
        t.transpose(1, 3).mul_(0.5)  # a write into a transposed view of t
        t.permute(0, 2, 3, 1).add_(1.0)  # and into a permuted one
        unused = h.clone()
        unused[:, ::2] = 0.0  # a strided write: unsupported, but nothing reads it
        return self.head(flat) + t.mean(dim=(1, 2, 3)).unsqueeze(1) + pooled.sum()


def test_writes_through_whole_views_update_their_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = WholeViews()
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for n in (4, 3):
            with listener.batch():
                F.mse_loss(model(torch.randn(n, 3, 5, 5)), torch.zeros(n, 2)).backward()
    log = tracelog.load(tmp_path / "run")
    (pred,) = [log.graph(p.prediction) for p in log.pairs.values()]
    assert "Unsupported" not in {n.op for n in pred.nodes}
    # the dead strided write did not cost the sample its reference
    assert log.sample_info is not None and log.sample_info["reference"] == "float64"
    for target in TARGETS:
        report = tracelog.check(tmp_path / "run", target)
        assert report.ok, report.table()
        assert any("[float64]" in c.name for c in report.comparisons)


def test_a_write_into_a_view_it_cannot_express_is_unsupported_not_stale(tmp_path: Path) -> None:
    """A write through a strided view is not modelled: the base becomes an
    Unsupported value from there on, so emission refuses instead of computing
    with the base as it was before the write."""

    class Strided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x).clone()
            h[:, ::2] = 0.0
            return h

    model = Strided()
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        with listener.batch():
            F.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 4)).backward()
    log = tracelog.load(tmp_path / "run")
    (pred,) = [log.graph(p.prediction) for p in log.pairs.values()]
    unsupported = [n for n in pred.nodes if n.op == "Unsupported"]
    assert [n.attrs["source"] for n in unsupported] == ["tracelog.view_write"]
    with pytest.raises(tracelog.UnsupportedOpError):
        tracelog.emit(tmp_path / "run", target="torch")


@pytest.mark.parametrize(
    "text",
    ["batch", "batch*4", "seq", "seq-1", "batch*seq", "batch*seq-batch", "batch*seq2*2+3", 7],
)
def test_symbolic_dims_round_trip(text: int | str) -> None:
    from tracelog.ir import TensorType, format_dim, parse_dim

    assert format_dim(parse_dim(text)) == text
    assert TensorType.from_json({"dtype": "float32", "shape": [text]}).shape == (text,)


@pytest.mark.parametrize("text", ["seq*batch", "batch*1", "x", "batch+", "seq10", "__import__"])
def test_non_canonical_or_foreign_dims_are_refused(text: str) -> None:
    from tracelog.ir import TensorType

    with pytest.raises(ValueError):
        TensorType.from_json({"dtype": "float32", "shape": [text]})


def test_dim_arithmetic() -> None:
    from tracelog.ir import dim_mul, dim_scale, dim_value

    assert dim_value("batch*seq-batch", {"batch": 4, "seq": 12}) == 44
    assert dim_mul("batch", "seq-1") == "batch*seq-batch"
    assert dim_scale("seq", 3) == "seq*3"


def test_sequence_length_is_a_symbol_down_to_model_onnx(tmp_path: Path) -> None:
    """Batches of lengths 6, 9 and 4 share one graph; the shifted LM loss's
    dims are polynomials, and model.onnx declares the length as a dim_param."""
    import onnx

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for t in (6, 9, 4):
            ids = torch.randint(0, 11, (3, t))
            with listener.batch():
                model(input_ids=ids, labels=ids.clone())["loss"].backward()
            opt.step()
            opt.zero_grad()
    log = tracelog.load(tmp_path / "run")
    (pair,) = log.pairs.values()
    assert pair.usage.batches == 3
    pred, loss = log.graph(pair.prediction), log.graph(pair.loss)
    assert pred.values["input_ids"].type.shape == ("batch", "seq")
    dims = {d for v in loss.values.values() for d in v.type.shape if isinstance(d, str)}
    assert {"seq-1", "batch*seq-batch"} <= dims
    for target in TARGETS:
        assert tracelog.check(tmp_path / "run", target).ok
    proto = onnx.load(str(tmp_path / "run" / "model.onnx"))
    params = {d.dim_param for i in proto.graph.input for d in i.type.tensor_type.shape.dim}
    assert {"batch", "seq"} <= params


def test_embedding_padding_row_gets_no_gradient(tmp_path: Path) -> None:
    """nn.Embedding(padding_idx=...) leaves the padding row's gradient zero
    (OPT, BART): a plain Gather gave it the sum of its uses on every target."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 3))
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        with listener.batch():
            ids = torch.tensor([[0, 1, 2], [3, 0, 0]])
            F.cross_entropy(model(ids), torch.tensor([0, 2])).backward()
    sample = tracelog.load(tmp_path / "run").sample()
    assert not sample["grad/0.weight"][0].any()
    for target in ["torch", "tensorflow", "jax"]:
        report = tracelog.check(tmp_path / "run", target)
        assert report.ok, report
