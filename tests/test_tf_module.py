"""The TensorFlow program's Model (issue 15 item 4): a PyTorch run emitted to
TensorFlow gives a tf.Module tree whose variables carry the source's names,
trainable as they trained, which loads weights.safetensors, runs its phase's
recorded graph, assigns the running statistics to its buffer variables as
torch's BatchNorm does, and trains a step with tf.GradientTape and
tf.keras.optimizers.SGD; judged against the program's own functions."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import record
from torch import nn

from tracelog.emit import get_target
from tracelog.emit.harness import attach
from tracelog.emit.program import build_program
from tracelog.log import TraceLog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the TensorFlow target needs tensorflow-cpu")

_MEAN = "body.1.running_mean"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()
        )
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    batches = [(torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,))) for _ in range(2)]
    found = tmp_path_factory.mktemp("tf_module")
    record(Net(), found, batches, F.cross_entropy)  # train batches, then an eval batch
    return found


@pytest.fixture(scope="module")
def program(log_dir: Path) -> ModuleType:
    text = build_program(TraceLog.load(log_dir), get_target("tensorflow"))
    module = ModuleType("tracelog_tf_module")
    exec(compile(text, "<program>", "exec"), module.__dict__)
    attach(module.__dict__, "tensorflow")  # the parity check, as its __main__ runs it
    return module


def _sample_model(program: ModuleType, log_dir: Path) -> tuple[object, dict, dict]:
    """A Model holding the values the sample batch saw, the sample and those values."""
    sample = program._load(str(log_dir / "sample.safetensors"), narrow=True)
    params = program.sample_params(str(log_dir))
    model = program.Model(str(log_dir / "weights.safetensors"))
    for name, variable in model.source_params().items():
        variable.assign(params[name])
    return model, sample, params


def test_variables_carry_the_source_names(log_dir: Path, program: ModuleType) -> None:
    names = [torch_name for torch_name, _ in Net().named_parameters()]
    buffers = [torch_name for torch_name, _ in Net().named_buffers()]
    model = program.Model(str(log_dir / "weights.safetensors"))
    assert sorted(v.name for v in model.variables) == sorted(f"{n}:0" for n in names + buffers)
    assert sorted(v.name for v in model.trainable_variables) == sorted(f"{n}:0" for n in names)
    # the tree follows the paths; a digit segment is an attribute too
    assert model.s_body.s_1.s_running_mean.name == f"{_MEAN}:0"
    assert model.s_body.s_1.s_num_batches_tracked.dtype == tf.int64
    loaded = program.Model(str(log_dir / "weights.safetensors"))
    weights = program._load(str(log_dir / "weights.safetensors"), narrow=True)
    for name, variable in loaded.source_params().items():
        np.testing.assert_array_equal(variable.numpy(), weights[name])
        assert not np.all(variable.numpy() == 0) or name.endswith("num_batches_tracked"), name


def test_attribute_names_are_valid_and_distinct(program: ModuleType) -> None:
    segments = ["0", "a_b", "a.b", "a-b", "name", "variables", "_flatten", "", "é"]
    attrs = [program.module_attr(s) for s in segments]
    assert len(set(attrs)) == len(attrs)
    assert all(a.isidentifier() and not hasattr(tf.Module(), a) for a in attrs)


def test_call_runs_the_recorded_graph_and_updates_buffers(
    log_dir: Path, program: ModuleType
) -> None:
    model, sample, params = _sample_model(program, log_dir)
    want, _ = program.sample_step(params, sample)
    before = model.source_params()[_MEAN].numpy().copy()
    got = model(program._as_const(sample[program.input_key("x")]), training=True)
    # the same function on the same values: bit for bit
    assert set(got) == {r for r in want if not r.startswith("update:")}
    for role, value in got.items():
        np.testing.assert_array_equal(value.numpy(), want[role].numpy())
    after = model.source_params()[_MEAN].numpy()
    np.testing.assert_array_equal(after, want["update:" + _MEAN].numpy())
    assert not np.array_equal(after, before)
    steps = model.source_params()["body.1.num_batches_tracked"]
    assert int(steps.numpy()) == int(params["body.1.num_batches_tracked"].numpy()) + 1


def test_eval_runs_the_eval_graph_without_updates(log_dir: Path, program: ModuleType) -> None:
    assert set(program.PREDICT) == {"train", "eval"}
    model, sample, params = _sample_model(program, log_dir)
    before = model.source_params()[_MEAN].numpy().copy()
    x = program._as_const(sample[program.input_key("x")])
    y = model(x)  # training=False, as Keras layers default
    want = program.PREDICT["eval"](params, x)
    np.testing.assert_array_equal(y["prediction"].numpy(), want["prediction"].numpy())
    np.testing.assert_array_equal(model.source_params()[_MEAN].numpy(), before)
    graph = program.PREDICT.pop("eval")
    try:
        with pytest.raises(NotImplementedError, match="no eval graph"):
            model(x)
    finally:
        program.PREDICT["eval"] = graph


def test_sgd_trains_a_step_through_the_module(log_dir: Path, program: ModuleType) -> None:
    """The tape's gradients for model.trainable_variables are the program's
    own, and tf.keras.optimizers.SGD steps the variables by them."""
    model, sample, params = _sample_model(program, log_dir)
    trainable = [n for n, t, *_ in program.PARAMETERS if t]
    _, _, want = program._value_and_grads(
        lambda p: program.sample_step(p, sample), params, trainable
    )
    variables = model.source_params()
    before = {n: variables[n].numpy().copy() for n in trainable}
    with tf.GradientTape() as tape:
        _, loss = program.sample_step(variables, sample)
    grads = tape.gradient(loss, model.trainable_variables)
    by_name = {
        v.name[: -len(":0")]: g for v, g in zip(model.trainable_variables, grads, strict=True)
    }
    for name, grad in zip(trainable, want, strict=True):
        np.testing.assert_array_equal(by_name[name].numpy(), grad.numpy())
    tf.keras.optimizers.SGD(learning_rate=0.1).apply_gradients(
        zip(grads, model.trainable_variables, strict=True)
    )
    for name, grad in zip(trainable, want, strict=True):
        step = before[name] - np.float32(0.1) * grad.numpy()
        np.testing.assert_array_equal(variables[name].numpy(), step)


def test_a_name_that_is_both_a_module_and_a_parameter_is_a_clear_error(
    program: ModuleType, tmp_path: Path
) -> None:
    from safetensors.numpy import save_file

    weights = str(tmp_path / "weights.safetensors")
    save_file({name: np.zeros(1, np.float32) for name in ("a.b", "a/b.c", "a/b")}, weights)
    rows = program.PARAMETERS[:]
    try:
        program.PARAMETERS[:] = [["a.b", True], ["a/b.c", True]]
        with pytest.raises(ValueError, match="is a parameter and a module"):
            program.Model(weights)
        program.PARAMETERS[:] = [["a/b", True], ["a.b", True]]
        with pytest.raises(ValueError, match="its path is taken"):
            program.Model(weights)
    finally:
        program.PARAMETERS[:] = rows


def test_a_tf_function_step_and_a_checkpoint(
    log_dir: Path, program: ModuleType, tmp_path: Path
) -> None:
    """Under tf.function the call runs the same graph and assigns the same
    updates; tf.train.Checkpoint saves and restores the tree by its paths."""
    eager, sample, _ = _sample_model(program, log_dir)
    traced, _, _ = _sample_model(program, log_dir)
    x = program._as_const(sample[program.input_key("x")])
    want = eager(x, training=True)
    got = tf.function(lambda v: traced(v, training=True))(x)
    np.testing.assert_array_equal(got["prediction"].numpy(), want["prediction"].numpy())
    for name, variable in traced.source_params().items():
        np.testing.assert_allclose(variable.numpy(), eager.source_params()[name].numpy(), rtol=1e-6)
    path = tf.train.Checkpoint(model=traced).save(str(tmp_path / "ckpt"))
    keys = {k for k, _ in tf.train.list_variables(path)}
    assert "model/s_body/s_1/s_running_mean/.ATTRIBUTES/VARIABLE_VALUE" in keys
    fresh = program.Model(str(log_dir / "weights.safetensors"))
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    for name, variable in fresh.source_params().items():
        np.testing.assert_array_equal(variable.numpy(), traced.source_params()[name].numpy())
