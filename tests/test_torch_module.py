"""The PyTorch program's Model (issue 15 item 4): a Keras run emitted to
PyTorch gives a torch.nn.Module whose state_dict keys are the source's names
(Keras' "/" read as "."), which loads weights.safetensors with
load_state_dict(strict=True), runs its mode's recorded graph, writes the
running statistics into its buffers as Keras' BatchNormalization does, and
trains a step with torch.optim.SGD; judged against the program's own
functions and the recorded sample."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import tracelog
from tracelog.emit import get_target
from tracelog.emit.harness import attach
from tracelog.emit.program import build_program
from tracelog.log import TraceLog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")


# Keras 3 paths start with the model's name (given: the default counts models)
_BN_MEAN = "net.bn.moving_mean"


def _cnn():
    return keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dense(3, name="fc"),
        ],
        name="net",
    )


@pytest.fixture(scope="module")
def keras_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracelog.keras import TracelogCallback

    log_dir = tmp_path_factory.mktemp("keras_cnn") / "log"
    keras.utils.set_random_seed(0)
    model = _cnn()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=True)
    rng = np.random.default_rng(0)
    x, y = rng.random((20, 6, 6, 2), dtype=np.float32), rng.integers(0, 3, 20)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        validation_split=0.2,
        verbose=0,
        callbacks=[TracelogCallback(log_dir)],
    )
    return log_dir


@pytest.fixture(scope="module")
def program(keras_log: Path) -> ModuleType:
    text = build_program(TraceLog.load(keras_log), get_target("torch"))
    module = ModuleType("tracelog_torch_module")
    exec(compile(text, "<program>", "exec"), module.__dict__)
    attach(module.__dict__, "torch")  # the parity check, as its __main__ runs it
    return module


def test_state_dict_keys_are_the_source_names(keras_log: Path, program: ModuleType) -> None:
    log = tracelog.load(keras_log)
    names = [p["name"] for p in log.model["params"]] + [b["name"] for b in log.model["buffers"]]
    weights = str(keras_log / "weights.safetensors")
    model = program.Model(weights)  # declared in the stored shapes and dtypes, loaded
    assert sorted(model.state_dict()) == sorted(n.replace("/", ".") for n in names)
    assert _BN_MEAN in model.state_dict()  # a Keras non-trainable weight: a buffer
    trainable = {n.replace("/", ".") for n, t, *_ in program.PARAMETERS if t}
    assert {n for n, _ in model.named_parameters()} == trainable
    result = model.load_state_dict(program.state_dict_from(weights), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    loaded = program.Model(weights)
    for key, value in program.state_dict_from(weights).items():
        assert torch.equal(loaded.state_dict()[key], value)


def _sample_model(program: ModuleType, log_dir: Path) -> torch.nn.Module:
    """A Model holding the parameters and buffers as the sample batch saw them."""
    params = program.sample_params(str(log_dir))
    model = program.Model(str(log_dir / "weights.safetensors"))
    state = {program.state_key(n): torch.as_tensor(v).detach() for n, v in params.items()}
    model.load_state_dict(state, strict=True)
    return model


def test_forward_runs_the_recorded_graph_and_updates_buffers(
    keras_log: Path, program: ModuleType
) -> None:
    sample = program._load(str(keras_log / "sample.safetensors"), narrow=True)
    params = program.sample_params(str(keras_log))
    want, _ = program.sample_step(params, sample)
    model = _sample_model(program, keras_log)
    x = program._as_const(sample["input/x"])
    before = model.get_buffer(_BN_MEAN).clone()
    got = model.train()(x)
    # the same function on the same values: bit for bit
    assert set(got) == {r for r in want if not r.startswith("update:")}
    for role, value in got.items():
        assert torch.equal(value, want[role]), role
    after = model.get_buffer(_BN_MEAN)
    assert torch.equal(after, want["update:" + _BN_MEAN.replace(".", "/")])
    assert not torch.equal(after, before)
    # the recording's own output for the batch, as the parity check judges it
    rows = program.check_parity(str(keras_log))
    assert all(r[3] for r in rows), [r for r in rows if not r[3]]


def test_eval_mode_runs_the_eval_graph_without_updates(
    keras_log: Path, program: ModuleType
) -> None:
    assert set(program.PREDICT) == {"train", "eval"}  # validation batches were recorded
    model = _sample_model(program, keras_log).eval()
    before = model.get_buffer(_BN_MEAN).clone()
    x = torch.rand(5, 6, 6, 2)
    with torch.no_grad():
        y = model(x)
    assert next(iter(y.values())).shape[0] == 5
    assert torch.equal(model.get_buffer(_BN_MEAN), before)


def test_sgd_trains_a_step_through_the_module(keras_log: Path, program: ModuleType) -> None:
    """loss.backward() fills the Parameters' .grad as the program's own
    autodiff computes them, and torch.optim.SGD steps them."""
    sample = program._load(str(keras_log / "sample.safetensors"), narrow=True)
    params = program.sample_params(str(keras_log))
    trainable = [n for n, t, *_ in program.PARAMETERS if t]
    _, _, want = program._value_and_grads(
        lambda p: program.sample_step(p, sample), params, trainable
    )
    model = _sample_model(program, keras_log)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _, loss = program.sample_step(model.source_params(), sample)
    loss.backward()
    for name, grad in zip(trainable, want, strict=True):
        key = program.state_key(name)
        assert torch.equal(model.get_parameter(key).grad, grad), name
    opt.step()
    for name, grad in zip(trainable, want, strict=True):
        key = program.state_key(name)
        assert torch.equal(model.get_parameter(key), before[key].add(grad, alpha=-0.1)), name


def test_a_name_that_cannot_be_a_module_attribute_is_a_clear_error(program: ModuleType) -> None:
    state = {key: torch.zeros(2) for key in ("training.kernel", "a.b")}
    with pytest.raises(ValueError, match="module name 'training' is taken"):
        program._declare(torch.nn.Module(), [["training/kernel", True]], state)
    with pytest.raises(ValueError, match="is taken"):
        program._declare(torch.nn.Module(), [["a/b", True], ["a.b", True]], state)
