"""Random draws in the loss graph: a dropout (or any draw) that runs after the
model's returned predictions, as an auxiliary head applied inside the loss
(Hugging Face's DPT segmentation head, given ``labels=``) or a loss function
that applies dropout. The loss graph's draws are keyed apart from the
prediction graph's (``loss_mask.<k>``; the sample's ``loss_mask/<k>``), the
loss function takes them as its own ``rng``, and every target's check feeds
them: with the forward drawing too (masks of the same shape, so a mix-up of
the two would not fail loudly), each target translates to float64 rounding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402
from tracelog.sample import loss_mask_key, mask_key  # noqa: E402

F = torch.nn.functional
nn = torch.nn
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _Hidden(nn.Module):
    """(logits, hidden); with `drop`, a dropout in the forward too."""

    def __init__(self, drop: bool) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 8)  # applied in the loss only
        self.drop = nn.Dropout(0.2) if drop else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.head(self.drop(h)), h


def _aux_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """An auxiliary head on the hidden states, with dropout, in the loss."""
    x, y = batch
    logits, hidden = model(x)
    aux = F.dropout(model.aux(hidden), 0.1, training=True)
    return F.cross_entropy(logits, y) + aux.pow(2).mean()


class _Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _noisy_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss function with its own dropout and additive noise (rand_like)."""
    dropped = F.dropout(pred, 0.25, training=True)
    return F.mse_loss(dropped + 0.01 * torch.rand_like(pred), target)


def _loss_fn_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return _noisy_loss(model(x), y)


class _Block(nn.Module):
    """A module with a dropout, called in the forward and (twice) in the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.tanh(self.fc(x)))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.b0, self.b1 = _Block(), _Block()
        self.aux0, self.aux1 = _Block(), _Block()
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.b1(self.b0(self.inp(x)))
        return self.out(h), h


def _blocks_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    logits, h = model(x)
    return F.cross_entropy(logits, y) + model.aux1(model.aux0(h)).pow(2).mean()


class _SegmenterWithAux(nn.Module):
    """A loss inside the forward, as Hugging Face's DPT segmentation model:
    given labels, an auxiliary head (with its dropout) runs for the loss only."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)
        self.aux_head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        h = torch.tanh(self.body(x))
        logits = self.head(self.drop(h))
        out = {"logits": logits}
        if labels is not None:
            aux = self.aux_head(h)
            out["loss"] = F.cross_entropy(logits, labels) + 0.4 * F.cross_entropy(aux, labels)
        return out


def _in_forward_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return model(x, labels=y)["loss"]


Step = Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
CASES: dict[str, tuple[Callable[[], nn.Module], Step, int]] = {
    # name: the model, its step, and the targets' width (classes; 4: regression)
    "aux_head": (lambda: _Hidden(drop=False), _aux_step, 3),
    "aux_head_and_forward": (lambda: _Hidden(drop=True), _aux_step, 3),
    "loss_function": (_Regressor, _loss_fn_step, 4),
    "module_kinds": (_Blocks, _blocks_step, 3),
    "loss_in_forward": (_SegmenterWithAux, _in_forward_step, 3),
}
# how many masks each graph's draws give the sample: (prediction, loss)
DRAWS = {
    "aux_head": (0, 1),
    "aux_head_and_forward": (1, 1),
    "loss_function": (1, 2),
    "module_kinds": (2, 2),
    "loss_in_forward": (1, 1),
}


def _record(log_dir: Path, name: str) -> Path:
    make, step, width = CASES[name]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for _ in range(2):
            x = torch.randn(5, 6, generator=g)
            y = (
                torch.randn(5, width, generator=g)
                if name == "loss_function"
                else torch.randint(0, width, (5,), generator=g)
            )
            with listener.batch():
                step(model, (x, y)).backward()
            opt.step()
            opt.zero_grad()
    return log_dir


@pytest.fixture(scope="module", params=list(CASES))
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return request.param, _record(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def recorded(case: tuple[str, Path]) -> Path:
    return case[1]


def test_the_sample_keeps_each_graphs_draws_apart(case: tuple[str, Path]) -> None:
    name, recorded = case
    log = tracelog.load(recorded)
    assert log.unrecorded == 0, log.failures
    info = log.sample_info
    assert info is not None
    pred, loss = log.graph(info["prediction"]), log.graph(info["loss"])
    ops = set(pred.op_histogram()) | set(loss.op_histogram())
    assert "tracelog.Unsupported" not in ops, ops
    n_pred, n_loss = DRAWS[name]
    assert info["masks"] == n_pred and info.get("loss_masks", 0) == n_loss
    sample = log.sample()
    assert sorted(k for k in sample if "mask/" in k) == sorted(
        [mask_key(k) for k in range(n_pred)] + [loss_mask_key(k) for k in range(n_loss)]
    )
    drawn = [n for n in loss.nodes if n.op in ("Dropout", "RandomUniformLike")]
    assert len(drawn) == n_loss
    for k, node in enumerate(drawn):
        out = loss.values[node.outputs[0]].type
        assert sample[loss_mask_key(k)].shape[1:] == tuple(out.shape[1:])


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_replays_the_loss_draws(recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    tracelog.emit(recorded, target=target)
    assert_translated(tracelog.check(recorded, target))


def test_the_loss_function_takes_its_draws_as_rng(case: tuple[str, Path]) -> None:
    """The program's loss function takes rng, reads its draws by the loss
    graph's keys, and the recorded step feeds it the sample's loss masks. A
    module kind that draws stays a function in the prediction graph and is
    written out in the loss graph (its keys are the loss graph's)."""
    name, recorded = case
    text = tracelog.emit(recorded, target="torch").read_text()
    loss_def = next(line for line in text.splitlines() if line.startswith("def loss_train"))
    assert loss_def.endswith("rng=None):"), loss_def
    assert '"loss_mask.0"' in text and "rng=loss_masks_as_rng(sample)" in text
    if name == "module_kinds":
        loss_fn = text[text.index("def loss_train") :]
        assert 'block(params, "b1.", b0_drop, rng=rng, mask_base=1)' in text
        assert '"loss_mask.1"' in loss_fn and "block(" not in loss_fn.split("return")[0]


def test_fresh_loss_draws_are_not_the_predictions(tmp_path: Path) -> None:
    """Run as a training program with one jax.random key for both functions,
    the loss graph's k-th draw is not the prediction graph's k-th."""
    jax = pytest.importorskip("jax", reason="the JAX target needs jax installed")
    from tracelog.emit.runtime import jax_program

    ones = jax.numpy.ones((64, 64), dtype=jax.numpy.float32)
    key = jax.random.PRNGKey(0)
    pred, _ = jax_program._dropout(ones, 0.5, key, "mask.0")
    loss, _ = jax_program._dropout(ones, 0.5, key, "loss_mask.0")
    again, _ = jax_program._dropout(ones, 0.5, key, "loss_mask.0")
    assert not np.array_equal(np.asarray(pred), np.asarray(loss))
    assert np.array_equal(np.asarray(loss), np.asarray(again))


@pytest.fixture(scope="module")
def keras_recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras loss with a dropout of its own (the Keras adapter shares the
    split and the sample with the PyTorch one), the model dropping too."""
    pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
    keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")
    from tracelog.keras import TracelogCallback

    keras.utils.set_random_seed(0)
    drop = keras.layers.Dropout(0.25)

    def loss_fn(y: Any, p: Any) -> Any:
        return keras.ops.mean(keras.ops.square(drop(p, training=True) - y))

    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(8),
        ]
    )
    model.compile(optimizer="sgd", loss=loss_fn, run_eagerly=True)
    rng = np.random.default_rng(0)
    x, y = rng.random((10, 6), dtype=np.float32), rng.random((10, 8), dtype=np.float32)
    log_dir = tmp_path_factory.mktemp("keras") / "log"
    model.fit(x, y, batch_size=5, verbose=0, callbacks=[TracelogCallback(log_dir, strict=True)])
    info = tracelog.load(log_dir).sample_info
    assert info is not None and info["masks"] == 1 and info.get("loss_masks") == 1
    return log_dir


@pytest.mark.parametrize("target", TARGETS)
def test_a_keras_loss_that_drops_translates(keras_recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    tracelog.emit(keras_recorded, target=target)
    assert_translated(tracelog.check(keras_recorded, target))
