"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN): each call recorded whole and written as one
ONNX LSTM / GRU / RNN node per layer, whatever the sequence length; checked against
onnx.reference (onnxruntime where onnx.reference lacks the activation) and, with
gradients, on every target."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import numpy as np  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402
from tracelog.sample import LOSS_KEY, output_key, reference_key  # noqa: E402
from tracelog.verify import verify  # noqa: E402

nn = torch.nn
SEQ, BATCH, FEATURES = 6, 3, 3


class _Recurrent(nn.Module):
    """Two recurrent layers of one kind in a row: the first takes an initial state the
    model learns, the second ONNX's default (zero) state; batch-first data either way."""

    def __init__(self, cls: type[nn.Module], first: dict[str, Any], second: dict[str, Any]) -> None:
        super().__init__()
        self.first = f = cls(FEATURES, 5, **first)
        self.second = cls(5 * (1 + f.bidirectional), 4, **second)
        self.h0 = nn.Parameter(torch.randn(f.num_layers * (1 + f.bidirectional), 1, 5) * 0.5)
        self.c0 = nn.Parameter(torch.randn_like(self.h0) * 0.5)
        self.head = nn.Linear(4 * (1 + self.second.bidirectional), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f, s = self.first, self.second
        if not f.batch_first:
            x = x.transpose(0, 1)
        h0 = self.h0.expand(-1, x.shape[0 if f.batch_first else 1], -1).contiguous()
        state = (h0, self.c0.expand_as(h0).contiguous()) if isinstance(f, nn.LSTM) else h0
        y, _ = f(x, state)
        y, _ = s(y if f.batch_first == s.batch_first else y.transpose(0, 1))
        return self.head(y if s.batch_first else y.transpose(0, 1))


CASES: dict[str, Callable[[], nn.Module]] = {
    # 2 layers, bidirectional, batch-first, initial (h, c), dropout; then 1 layer
    # sequence-first
    "lstm": lambda: _Recurrent(
        nn.LSTM, dict(num_layers=2, bidirectional=True, batch_first=True, dropout=0.3), {}
    ),
    # 2 layers sequence-first, initial h, dropout; then bidirectional batch-first, no bias
    "gru": lambda: _Recurrent(
        nn.GRU,
        dict(num_layers=2, dropout=0.3),
        dict(bidirectional=True, batch_first=True, bias=False),
    ),
    # relu, 2 layers, bidirectional, batch-first, initial h, dropout; then tanh sequence-first
    "rnn": lambda: _Recurrent(
        nn.RNN,
        dict(num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True, dropout=0.3),
        {},
    ),
}


def _train(model: nn.Module, log_dir: Path | None, seq: int = SEQ, steps: int = 2) -> Any:
    """`steps` SGD steps (and one eval batch) of model on random data, under a listener
    writing to log_dir (none: no listener)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    listener = tracelog.Listener(model, log_dir, strict=True) if log_dir else None
    for _ in range(steps):
        x, y = torch.randn(BATCH, seq, FEATURES, generator=g), torch.randn(
            BATCH, seq, 2, generator=g
        )
        model.train()
        with listener.batch() if listener else _nothing():
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad(), listener.batch() if listener else _nothing():
        model(torch.randn(BATCH, seq, FEATURES, generator=g))
    if listener:
        listener.close()
    return model


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {}
    for name, build in CASES.items():
        torch.manual_seed(0)
        dirs[name] = tmp_path_factory.mktemp(name)
        _train(build(), dirs[name])
    return dirs


@pytest.mark.parametrize("case", CASES)
def test_each_layer_is_one_node(recorded: dict[str, Path], case: str) -> None:
    log = tracelog.load(recorded[case])
    phases = set()
    for entry in log.entries_sorted():
        ops = [n.op for n in log.graphs[entry.hash].nodes]
        assert "Unsupported" not in ops
        if entry.kind == "prediction":
            phases.add(entry.phase)
            assert ops.count(case.upper()) == 3  # two layers, then one
            # the first call's dropout between its layers, in training only
            assert ops.count("Dropout") == (1 if entry.phase == "train" else 0)
    assert phases == {"train", "eval"}


@pytest.mark.parametrize("case", CASES)
def test_ir_means_what_torch_computed(recorded: dict[str, Path], case: str) -> None:
    # onnx.reference (onnx 1.23) knows tanh and affine RNN activations, not relu
    runtimes = ["onnxruntime"] + ([] if case == "rnn" else ["reference"])
    for runtime in runtimes:
        report = verify(recorded[case], runtime=runtime)
        assert report.ok, report.table()


@pytest.mark.parametrize("case", CASES)
def test_float64_reference_keeps_the_dropout_between_layers(
    recorded: dict[str, Path], case: str
) -> None:
    # the sample's float64 replay of the batch runs the call a layer at a time with
    # the keep masks the kernel drew: every output, the loss and each gradient
    # within float32 rounding of what torch computed (a mask left out, or laid over
    # the batch-first output untransposed, moves them by the dropout's size)
    log = tracelog.load(recorded[case])
    assert log.sample_info is not None and log.sample_info["reference"] == "float64"
    assert log.sample_info["masks"] == 1  # the first call's mask between its layers
    sample = log.sample()
    grads = [k for k in sample if k.startswith("grad/")]
    assert any(k.endswith("weight_hh_l1") for k in grads)
    for key in [LOSS_KEY, output_key("prediction"), *grads]:
        ref = sample[reference_key(key)]
        assert ref.dtype == np.float64
        np.testing.assert_allclose(sample[key], ref, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES)
def test_parity_with_gradients(recorded: dict[str, Path], case: str, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    report = tracelog.check(recorded[case], target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)  # the translation verdict
    if target != "onnx":
        assert any(c.name.startswith("grad first.weight_hh_l0") for c in report.comparisons)


def test_program_size_does_not_grow_with_sequence_length(tmp_path: Path) -> None:
    texts: dict[int, dict[str, str]] = {}
    for seq in (5, 9):
        torch.manual_seed(0)
        _train(CASES["lstm"](), tmp_path / str(seq), seq=seq, steps=1)
        texts[seq] = {
            t: tracelog.emit(tmp_path / str(seq), t).read_text()
            for t in ("torch", "tensorflow", "jax")
        }
    for t in texts[5]:
        # the same program but for the sequence length in shape comments
        assert len(texts[5][t]) == len(texts[9][t]), t
        assert texts[5][t].count("\n") == texts[9][t].count("\n"), t


class _Plain(nn.Module):
    """One recurrent layer with the state it makes itself (zeros), batch-first data."""

    def __init__(self, cls: type[nn.Module], batch_first: bool) -> None:
        super().__init__()
        self.rnn = cls(FEATURES, 4, num_layers=2, dropout=0.3, batch_first=batch_first)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = not self.rnn.batch_first
        y, _ = self.rnn(x.transpose(0, 1) if t else x)
        return self.head(y.transpose(0, 1) if t else y)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN], ids=["lstm", "gru", "rnn"])
def test_batch_dim_found_when_the_sequence_is_as_long(
    tmp_path: Path, cls: type[nn.Module], batch_first: bool
) -> None:
    """The batch-dim replay reruns each recorded call (its zero state remade at batch
    B + 1) and its masks, so a sequence as long as the batch keeps its length."""
    torch.manual_seed(0)
    _train(_Plain(cls, batch_first), tmp_path, seq=BATCH, steps=1)
    log = tracelog.load(tmp_path)
    for graph in log.graphs.values():
        for node in graph.nodes:
            if node.op in ("LSTM", "GRU", "RNN", "Dropout"):
                shape = graph.values[node.outputs[0]].type.shape  # [seq, (dirs,) batch, ...]
                batch = shape[1] if node.op == "Dropout" else shape[2]
                assert (shape[0], batch) == (BATCH, "batch"), (node.op, shape)
    assert tracelog.check(tmp_path, "torch").ok


def test_training_is_not_perturbed(tmp_path: Path) -> None:
    """Weights and the generator's state are bitwise those of a run without a listener."""
    runs = []
    for log_dir in (None, tmp_path / "log"):
        torch.manual_seed(0)
        model = _train(CASES["lstm"](), log_dir, steps=3)
        runs.append(({k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()))
    (plain, plain_rng), (listened, listened_rng) = runs
    assert plain.keys() == listened.keys()
    assert all(torch.equal(plain[k], listened[k]) for k in plain)
    assert torch.equal(plain_rng, listened_rng)


def test_fast_paths_of_other_modules_are_kept(tmp_path: Path) -> None:
    """The recurrent calls' TorchFunctionMode sits only in leaf modules: attention in
    inference still takes its fused fast path under the listener (a TorchFunctionMode on
    the stack turns it off: has_torch_function)."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    with tracelog.Listener(layer, tmp_path / "log") as listener:
        with torch.no_grad(), listener.batch():
            layer(torch.randn(2, 3, 8))
        log = listener.log
    sources = {n.attrs.get("source") for g in log.graphs.values() for n in g.nodes}
    assert "aten._native_multi_head_attention.default" in sources


sys.path.insert(0, str(Path(__file__).parent))
import real_models  # noqa: E402


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["lstm_classifier", "gru_tagger"])
def test_real_models(tmp_path_factory: pytest.TempPathFactory, name: str, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    log_dir = tmp_path_factory.getbasetemp() / f"real-{name}"
    if not (log_dir / "trace.json").exists():
        real_models.train(real_models.BY_NAME[name], log_dir, strict=True)
    report = tracelog.check(log_dir, target)
    assert report.ok, report.table()


def test_the_recurrent_scope_is_pushed_only_for_recurrent_layers(tmp_path: Path) -> None:
    """Inside an exact window a recurrent layer's forward runs with the scope's
    TorchFunctionMode on the stack; another leaf's (a Linear) runs without it,
    its torch function calls never going through Python."""
    model = nn.Sequential(nn.GRU(4, 8, batch_first=True), _Last(), nn.Linear(8, 2))
    depth: dict[str, int] = {}

    def note(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            depth[name] = torch._C._len_torch_function_stack()

        return hook

    with tracelog.Listener(model, tmp_path / "log", mode="exact") as listener:
        model[0].register_forward_pre_hook(lambda m, a: note("gru")(m, a, None))
        model[2].register_forward_pre_hook(lambda m, a: note("linear")(m, a, None))
        with listener.batch():
            model(torch.randn(3, 5, 4)).sum().backward()
    assert depth == {"gru": 1, "linear": 0}


class _Last(nn.Module):
    def forward(self, out: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return out[0][:, -1]
