"""The JAX program's params pytree and pure apply (issue 15 item 4): a
PyTorch run emitted to JAX gives params_tree (nested dicts shaped like the
module tree) and apply(tree, *inputs, train=...) -> (predictions, updates),
so that a training step is jax.grad over apply's loss and a functional
state update (combine); judged against the program's own sample_step and
gradients."""

from __future__ import annotations

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

jax = pytest.importorskip("jax", reason="the JAX target needs jax installed")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()
        )
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.body(x).mean((2, 3))))


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    batches = [(torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,))) for _ in range(2)]
    found = tmp_path_factory.mktemp("jax_module")
    record(Net(), found, batches, F.cross_entropy)  # train batches, then an eval batch
    return found


@pytest.fixture(scope="module")
def program(log_dir: Path) -> ModuleType:
    text = build_program(TraceLog.load(log_dir), get_target("jax"))
    module = ModuleType("tracelog_jax_module")
    exec(compile(text, "<program>", "exec"), module.__dict__)
    attach(module.__dict__, "jax")  # the parity check, as its __main__ runs it
    return module


def _sample(program: ModuleType, log_dir: Path) -> tuple[dict, dict]:
    sample = program._load(str(log_dir / "sample.safetensors"), narrow=True)
    return sample, program.sample_params(str(log_dir))


def test_the_tree_is_shaped_like_the_module_tree(log_dir: Path, program: ModuleType) -> None:
    tree = program.init_from(str(log_dir / "weights.safetensors"))
    assert sorted(tree) == ["body", "head"]
    assert sorted(tree["body"]) == ["0", "1"]
    assert sorted(tree["body"]["1"]) == sorted(n for n, _ in Net().body[1].state_dict().items())
    weights = program._load(str(log_dir / "weights.safetensors"), narrow=True)
    np.testing.assert_array_equal(tree["head"]["weight"], weights["head.weight"])
    flat = program.flat_params(tree)
    assert sorted(flat) == sorted(n for n, *_ in program.PARAMETERS)
    structure = jax.tree_util.tree_structure
    assert structure(program.params_tree(flat)) == structure(tree)
    trains, rest = program.partition(tree)
    assert sorted(program.flat_params(trains)) == sorted(n for n, _ in Net().named_parameters())
    assert sorted(program.flat_params(rest)) == sorted(n for n, _ in Net().named_buffers())
    assert program.flat_params(program.combine(rest, trains)).keys() == flat.keys()
    with pytest.raises(ValueError, match="its path is taken"):
        program.params_tree({"a/b": 1, "a.b": 2})
    with pytest.raises(ValueError, match="is a parameter and a module"):
        program.params_tree({"a.b": 1, "a/b.c": 2})


def test_jitted_apply_is_the_sample_step(log_dir: Path, program: ModuleType) -> None:
    sample, params = _sample(program, log_dir)
    rng = program.masks_as_rng(sample)  # the recorded dropout mask
    x = program._as_const(sample[program.input_key("x")])
    want, _ = jax.jit(lambda p: program.sample_step(p, sample))(params)
    got, updates = jax.jit(program.apply)(program.params_tree(params), x, rng=rng)
    assert set(got) == {r for r in want if not r.startswith("update:")}
    for role, value in got.items():
        np.testing.assert_array_equal(value, want[role])
    flat = program.flat_params(updates)
    assert sorted(flat) == sorted(r[len("update:") :] for r in want if r.startswith("update:"))
    for name, value in flat.items():
        np.testing.assert_array_equal(value, want["update:" + name])
    state = program.combine(program.params_tree(params), updates)
    assert (
        int(state["body"]["1"]["num_batches_tracked"])
        == int(params["body.1.num_batches_tracked"]) + 1
    )
    # eval: train is static under jit; no updates
    evaluated = jax.jit(program.apply, static_argnames="train")
    preds, none = evaluated(program.params_tree(params), x, train=False)
    np.testing.assert_array_equal(
        preds["prediction"], jax.jit(program.PREDICT["eval"])(params, x)["prediction"]
    )
    assert none == {}


def test_a_jax_grad_sgd_step_is_the_programs(log_dir: Path, program: ModuleType) -> None:
    sample, params = _sample(program, log_dir)
    trainable = [n for n, t, *_ in program.PARAMETERS if t]
    _, _, want = program._value_and_grads(
        lambda p: program.sample_step(p, sample), params, trainable
    )
    rng = program.masks_as_rng(sample)
    x = program._as_const(sample[program.input_key("x")])
    target = program._as_const(sample[program.target_key("target")])

    def loss_fn(trains: dict, rest: dict) -> tuple:
        tree = program.combine(rest, trains)
        predictions, updates = program.apply(tree, x, rng=rng)
        loss = program.loss_train(program.flat_params(tree), **predictions, target=target)
        return loss, updates

    trains, rest = program.partition(program.params_tree(params))
    grads, updates = jax.jit(jax.grad(loss_fn, has_aux=True))(trains, rest)
    flat_grads = program.flat_params(grads)
    assert sorted(flat_grads) == sorted(trainable)
    for name, grad in zip(trainable, want, strict=True):
        np.testing.assert_array_equal(flat_grads[name], grad)
    stepped = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, trains, grads)
    state = program.combine(rest, stepped, updates)
    flat = program.flat_params(state)
    for name, grad in zip(trainable, want, strict=True):
        np.testing.assert_array_equal(flat[name], params[name] - 0.1 * grad)
    assert not np.array_equal(flat["body.1.running_mean"], params["body.1.running_mean"])


def test_a_phase_without_a_graph_is_a_clear_error(log_dir: Path, program: ModuleType) -> None:
    _, params = _sample(program, log_dir)
    graph = program.PREDICT.pop("eval")
    try:
        with pytest.raises(NotImplementedError, match="no eval graph"):
            program.apply(program.params_tree(params), np.zeros((1, 3, 6, 6)), train=False)
    finally:
        program.PREDICT["eval"] = graph
