"""Issue 16 items 1, 3, 4: the trainers' callbacks (Hugging Face ``Trainer``,
Lightning), ``accelerate`` through the plain listener, gradient accumulation
and bfloat16 autocast, each run from its example: counts (one batch per
forward pass, optimizer steps beside them) and the translation check."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import assert_translated, own_gradients

import tracelog

EXAMPLES = Path(__file__).parent.parent / "examples"
TARGETS = ["tensorflow", "jax", "onnx"]


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(log_dir: Path) -> list[tuple[str, str, int]]:
    log = tracelog.load(log_dir)
    assert log.unrecorded == 0, log.failures
    return [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]


def _ops(log_dir: Path, kind: str, phase: str) -> dict[str, int]:
    log = tracelog.load(log_dir)
    entry = next(e for e in log.entries_sorted() if (e.kind, e.phase) == (kind, phase))
    return log.graphs[entry.hash].op_histogram()


def _check(log_dir: Path, target: str) -> None:
    pytest.importorskip(
        {"tensorflow": "tensorflow", "jax": "jax", "onnx": "onnxruntime"}[target],
        reason=f"the {target} target needs its framework",
    )
    assert_translated(tracelog.check(log_dir, target))


# -- Hugging Face Trainer: a tiny GPT-2, gradient accumulation 2, evaluation ----------------
@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip(
        "transformers", reason="the Hugging Face callback needs transformers (dev extra)"
    )
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (dev extra)")
    out = tmp_path_factory.mktemp("hf") / "log"
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # 8 sequences in batches of 4: 2 micro-batches, 1 optimizer step per epoch
    _example("hf_trainer_gpt2").train(out, epochs=2, n_train=8)
    return out


def test_hf_trainer_counts(hf_run: Path) -> None:
    assert _rows(hf_run) == [
        ("prediction", "train", 4),  # one per forward: 2 micro-batches x 2 epochs
        ("loss", "train", 4),
        ("prediction", "eval", 4),  # 8 evaluation sequences in 2 batches, each epoch
        ("loss", "eval", 4),
    ]
    assert tracelog.load(hf_run).optimizer_steps == 2
    # the loss the model computes inside its forward is the loss graph's, not a prediction
    assert "NegativeLogLikelihoodLoss" in _ops(hf_run, "loss", "train")
    assert "NegativeLogLikelihoodLoss" not in _ops(hf_run, "prediction", "train")
    assert own_gradients(hf_run) < 1e-4


@pytest.mark.parametrize("target", TARGETS)
def test_hf_trainer_translates(hf_run: Path, target: str) -> None:
    _check(hf_run, target)


def _hf_trainer(
    model: Any, out: Path, scratch: str, *, record_after_train: bool = False, **options: Any
) -> Any:
    """A Trainer on the example's sequences, one optimizer step per batch of 4."""
    from transformers import Trainer, TrainingArguments

    from tracelog.transformers import TracelogCallback

    example = _example("hf_trainer_gpt2")
    args = TrainingArguments(
        output_dir=scratch,
        num_train_epochs=1,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        **options,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=example.sequences(16, 1),
        eval_dataset=example.sequences(8, 2),
        callbacks=[TracelogCallback(out, overwrite=True, record_after_train=record_after_train)],
    )


@pytest.mark.parametrize("after", [True, False], ids=["record_after_train", "default"])
def test_hf_evaluate_and_predict_after_train(tmp_path: Path, after: bool) -> None:
    """With record_after_train, trainer.evaluate() and trainer.predict() after
    train() count as eval batches, the log complete after each; by default
    the log is closed when train() ends."""
    pytest.importorskip("transformers", reason="the Hugging Face callback needs transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (dev extra)")
    import tempfile

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    out = tmp_path / "log"
    with tempfile.TemporaryDirectory() as scratch:
        trainer = _hf_trainer(GPT2LMHeadModel(config), out, scratch, record_after_train=after)
        (callback,) = [c for c in trainer.callback_handler.callbacks if hasattr(c, "listener")]
        trainer.train()
        assert _rows(out) == [("prediction", "train", 4), ("loss", "train", 4)]
        trainer.evaluate()  # 8 sequences: 2 batches
        eval_rows = [("prediction", "eval", 2), ("loss", "eval", 2)] if after else []
        assert _rows(out) == [("prediction", "train", 4), ("loss", "train", 4), *eval_rows]
        assert not tracelog.load(out).interrupted
        trainer.predict(_example("hf_trainer_gpt2").sequences(8, 3))
        eval_rows = [("prediction", "eval", 4), ("loss", "eval", 4)] if after else []
        assert _rows(out) == [("prediction", "train", 4), ("loss", "train", 4), *eval_rows]
        assert not tracelog.load(out).interrupted
    callback.close()
    assert callback.listener.closed and not tracelog.load(out).interrupted
    assert tracelog.load(out).optimizer_steps == 4


def test_hf_step_that_raises_loses_nothing_recorded(tmp_path: Path) -> None:
    """The model's forward raises in the 4th step: train() raises it, the
    three steps before are on disk (an interrupted log that checks), the
    failed step is counted unrecorded, and no recording outlives train()."""
    pytest.importorskip("transformers", reason="the Hugging Face callback needs transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (dev extra)")
    import tempfile

    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from transformers import GPT2Config, GPT2LMHeadModel

    class Raising(GPT2LMHeadModel):
        calls = 0

        def forward(self, input_ids: Any = None, labels: Any = None, **kw: Any) -> Any:
            Raising.calls += 1
            if Raising.calls == 4:
                raise RuntimeError("out of memory (simulated)")
            return super().forward(input_ids=input_ids, labels=labels, **kw)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    out = tmp_path / "log"
    with tempfile.TemporaryDirectory() as scratch:
        trainer = _hf_trainer(Raising(config), out, scratch)
        with pytest.raises(RuntimeError, match="simulated"):
            trainer.train()
    assert _get_current_dispatch_mode_stack() == []  # nothing records any more
    log = tracelog.load(out)  # read now, in the same process: nothing waits for exit
    assert log.interrupted
    assert [(e.kind, e.usage.batches) for e in log.entries_sorted()] == [
        ("prediction", 3),
        ("loss", 3),
    ]
    assert (log.recorded, log.unrecorded) == (3, 1)
    _check(out, "tensorflow")


# -- Lightning: a submodule, self.log(on_epoch=True), torchmetrics, validation -------------
@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning", reason="the Lightning callback needs lightning (dev extra)")
    pytest.importorskip(
        "torchmetrics", reason="the Lightning example logs a torchmetrics metric (dev extra)"
    )
    out = tmp_path_factory.mktemp("lightning") / "log"
    _example("lightning_classifier").train(out, epochs=2)
    return out


def test_lightning_counts(lightning_run: Path) -> None:
    # 6 training batches and 3 validation batches (16, 16, 8: one graph) per epoch
    assert _rows(lightning_run) == [
        ("prediction", "train", 12),
        ("loss", "train", 12),
        ("prediction", "eval", 6),
        ("loss", "eval", 6),
    ]
    assert tracelog.load(lightning_run).optimizer_steps == 12
    # the default guarded mode: step windows counted by guards after 3 exact ones
    assert tracelog.load(lightning_run).recording["guarded"] > 0
    # logging and metrics are in neither graph
    assert _ops(lightning_run, "prediction", "train") == {"Gemm": 2, "Relu": 1, "Dropout": 1}
    assert _ops(lightning_run, "prediction", "eval") == {"Gemm": 2, "Relu": 1}
    assert set(_ops(lightning_run, "loss", "eval")) == {"LogSoftmax", "NegativeLogLikelihoodLoss"}


@pytest.mark.parametrize("target", TARGETS)
def test_lightning_translates(lightning_run: Path, target: str) -> None:
    _check(lightning_run, target)


def test_lightning_forward_through_self_and_accumulation(tmp_path: Path) -> None:
    """A training_step calling ``self(x)``, two batches per optimizer step."""
    pytest.importorskip("lightning", reason="the Lightning callback needs lightning (dev extra)")
    pytest.importorskip(
        "torchmetrics", reason="the Lightning example logs a torchmetrics metric (dev extra)"
    )
    example = _example("lightning_classifier")
    # Classifier with a forward, called as self(x) by its training_step
    calls: list[Any] = []

    class ViaForward(example.Classifier):  # type: ignore[name-defined]
        def forward(self, x: Any) -> Any:
            calls.append(1)
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = example.F.cross_entropy(self(x), y)
            self.log("train_loss", loss, on_epoch=True)
            return loss

    example.Classifier = ViaForward
    example.train(tmp_path / "log", epochs=1, accumulate=2)
    assert calls
    assert _rows(tmp_path / "log") == [
        ("prediction", "train", 6),
        ("loss", "train", 6),
        ("prediction", "eval", 3),
        ("loss", "eval", 3),
    ]
    assert tracelog.load(tmp_path / "log").optimizer_steps == 3
    assert own_gradients(tmp_path / "log") < 1e-4


# -- a plain loop: two micro-batches per window; bfloat16 autocast ------------------------
@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("accumulate") / "log"
    _example("accumulate_autocast").train(out, steps=4, accumulate=2)
    return out


def test_accumulation_counts_each_forward(accumulated: Path) -> None:
    assert _rows(accumulated) == [
        ("prediction", "train", 8),
        ("loss", "train", 8),
        ("prediction", "eval", 1),
        ("loss", "eval", 1),
    ]
    log = tracelog.load(accumulated)
    assert log.optimizer_steps == 4
    # the sample is one micro-batch with its own gradients (not the window's sum)
    assert own_gradients(accumulated) < 1e-4


@pytest.mark.parametrize("target", TARGETS)
def test_accumulation_translates(accumulated: Path, target: str) -> None:
    _check(accumulated, target)


@pytest.fixture(scope="module")
def autocast(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bf16") / "log"
    _example("accumulate_autocast").train(out, steps=3, bf16=True)
    return out


def test_autocast_counts_once_with_its_casts(autocast: Path) -> None:
    assert _rows(autocast) == [
        ("prediction", "train", 3),
        ("loss", "train", 3),
        ("prediction", "eval", 1),
        ("loss", "eval", 1),
    ]
    ops = _ops(autocast, "prediction", "train")
    assert ops["Cast"] >= 4  # data and weights to bfloat16 for each Gemm, ...
    graph = tracelog.load(autocast)
    dtypes = {v.type.dtype for g in graph.graphs.values() for v in g.values.values()}
    assert "bfloat16" in dtypes


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_translates(autocast: Path, target: str) -> None:
    _check(autocast, target)


# -- accelerate: the plain listener ---------------------------------------------------------
def test_accelerate_loop(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (dev extra)")
    _example("accelerate_loop").train(tmp_path / "log", epochs=1, accumulate=2)
    assert _rows(tmp_path / "log") == [("prediction", "train", 8), ("loss", "train", 8)]
    assert tracelog.load(tmp_path / "log").optimizer_steps == 4
    _check(tmp_path / "log", "tensorflow")
