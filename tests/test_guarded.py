"""Issue 18: the guarded fast path. Once a batch's key gave the same graphs K
exact recordings in a row, later batches with that key are counted without
the recorder; every Nth batch, the first of each epoch and any batch whose
guards fail are recorded exactly. Counts must match exact mode's, and
trace.json and ``tracelog show`` say which batches were counted how."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog
from tracelog.cli import show_text


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))


class _Branchy(nn.Module):
    """Calls an extra layer on batches whose inputs are large: a
    data-dependent branch the guards see as another module call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.extra, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        if x.abs().max() > 10:  # data-dependent: the key sees the extra call
            h = F.relu(self.extra(h))
        return self.out(h)


class _Scaled(nn.Module):
    """Multiplies by a plain tensor attribute (a constant of the graph): its
    value changes the graph, though no call or shape does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def _batches(n: int, big: set[int] = frozenset()) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    for i in range(n):
        x = torch.randn(6, 8, generator=g)
        if i in big:
            x = x * 100
        yield x, torch.randint(0, 4, (6,), generator=g)


def _train(
    model: nn.Module,
    log_dir: Path,
    epochs: int = 2,
    per_epoch: int = 12,
    big: set[int] = frozenset(),
    **options: Any,
) -> tracelog.TraceLog:
    torch.manual_seed(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tracelog.Listener(model, log_dir, strict=True, **options) as listener:
        for _ in listener.epochs(epochs):
            for x, y in _batches(per_epoch, big):
                with listener.batch():
                    F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    return tracelog.load(log_dir)


def _rows(log: tracelog.TraceLog) -> list[tuple[Any, ...]]:
    return [
        (e.hash, e.kind, e.phase, e.usage.batches, e.usage.epochs, e.usage.first, e.usage.last)
        for e in log.entries_sorted()
    ]


def test_trace_json_says_exact_and_guarded_per_graph(tmp_path: Path) -> None:
    log = _train(_mlp(), tmp_path / "g", epochs=2, per_epoch=12, guard_after=3, rerecord_every=5)
    trace = json.loads((tmp_path / "g" / "trace.json").read_text())
    # epoch 0: 3 exact to trust the key, then every 5th batch exact again
    # (guarded 3-6, exact 7, guarded 8-11); epoch 1: its first batch exact
    # (exact 0, guarded 1-4, exact 5, guarded 6-9, exact 10, guarded 11)
    for e in trace["entries"]:
        assert (e["batches"], e["exact"], e["guarded"]) == (24, 7, 17)
    assert [(p["exact"], p["guarded"]) for p in trace["pairs"]] == [(7, 17)]
    rec = trace["recording"]
    assert (rec["mode"], rec["guard_after"], rec["rerecord_every"]) == ("guarded", 3, 5)
    assert (rec["exact"], rec["guarded"], rec["branches"]) == (7, 17, 0)
    assert rec["switched_to_exact"] is None
    text = show_text(log, "g")
    header = text.splitlines()[1].split()
    assert header[5:8] == ["batches", "exact", "guarded"]
    assert text.splitlines()[2].split()[5:8] == ["24", "7", "17"]


def test_exact_mode_records_every_batch(tmp_path: Path) -> None:
    exact = _train(_mlp(), tmp_path / "e", mode="exact")
    guarded = _train(_mlp(), tmp_path / "g")
    assert _rows(exact) == _rows(guarded)
    assert all(e.usage.guarded == 0 for e in exact.entries.values())
    assert exact.recording is not None and exact.recording["guarded"] == 0
    assert all(e.usage.guarded > 0 for e in guarded.entries.values())


def test_bad_options_raise_before_training(tmp_path: Path) -> None:
    for options in ({"mode": "fast"}, {"guard_after": 0}, {"rerecord_every": 1}):
        with pytest.raises(ValueError):
            tracelog.Listener(_mlp(), tmp_path / "x", **options)
    assert not (tmp_path / "x").exists()


def test_a_data_dependent_branch_is_counted_right_in_both_modes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = {6, 8, 10}  # guarded batches by then (K=3): the guarded run meets each unseen
    exact = _train(_Branchy(), tmp_path / "e", epochs=2, big=big, mode="exact")
    with caplog.at_level(logging.WARNING, logger="tracelog"):
        guarded = _train(_Branchy(), tmp_path / "g", epochs=2, big=big)
    assert len(exact.graphs) == 3  # two predictions, one loss
    assert _rows(exact) == _rows(guarded)
    assert guarded.unrecorded == exact.unrecorded == 0
    rec = guarded.recording
    assert rec is not None and rec["branches"] >= 1 and rec["switched_to_exact"] is None
    first = rec["branch_batches"][0]
    assert (first["epoch"], first["batch"], first["known"]) == (0, 6, False)
    assert any("data-dependent branch" in r.getMessage() for r in caplog.records)
    assert "a data-dependent branch" in show_text(guarded, "g")
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0


def test_a_branch_never_recorded_exactly_is_counted_unrecorded(tmp_path: Path) -> None:
    """Taken once, on a guarded batch: no exact recording ever shows its
    graphs, so the batch is counted unrecorded with the reason, not for
    another graph."""
    log = _train(_Branchy(), tmp_path / "g", epochs=1, per_epoch=10, big={5})
    assert log.unrecorded == 1 and "data-dependent branch" in log.failures[0]["error"]
    assert log.failures[0]["batch"] == 5
    assert [e.usage.batches for e in log.entries_sorted()] == [9, 9]


def test_a_branch_the_guards_cannot_see_switches_to_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log_dir = tmp_path / "g"
    with caplog.at_level(logging.WARNING, logger="tracelog"):
        with tracelog.Listener(model, log_dir, strict=True, rerecord_every=4) as listener:
            for i, (x, y) in enumerate(_batches(20)):
                if i == 5:
                    model.scale.mul_(2)  # the graph's constant changes: same key
                with listener.batch():
                    F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if i > 8:
                    assert not listener.last_guarded  # exact from the switch on
    log = tracelog.load(log_dir)
    switched = log.recording["switched_to_exact"]
    assert switched is not None and switched["batch"] == 6  # the next exact re-recording
    assert switched["guarded_before"] == 3
    assert any("recorded exactly from here on" in r.getMessage() for r in caplog.records)
    assert "switched to exact mode" in show_text(log, "g")
    # batch 5 (guarded) is counted for the old prediction graph: what the switch warns of
    preds = [e.usage for e in log.entries_sorted() if e.kind == "prediction"]
    assert log.recorded == 20 and [(u.batches, u.guarded) for u in preds] == [(6, 3), (14, 0)]


def _one_batch(listener: Any, model: nn.Module, x: torch.Tensor, around: Any = None) -> bool:
    y = torch.zeros(x.shape[0], dtype=torch.long)
    with listener.batch():
        if around is None:
            F.cross_entropy(model(x), y).backward()
        else:
            with around():
                F.cross_entropy(model(x), y)
    return listener.last_guarded


@pytest.mark.parametrize(
    "change",
    ["shape", "eval", "submodule_eval", "no_grad", "autocast", "target_dtype", "new_param"],
)
def test_each_change_leaves_the_fast_path(tmp_path: Path, change: str) -> None:
    model = _mlp()
    x = torch.randn(6, 8)
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        assert [_one_batch(listener, model, x) for _ in range(5)] == [False] * 3 + [True] * 2
        around: Callable[[], Any] | None = None
        xb = x
        if change == "shape":
            xb = torch.randn(5, 8)
        elif change == "eval":
            model.eval()
        elif change == "submodule_eval":
            model[2].eval()  # the dropout only: same root flag
        elif change == "no_grad":
            around = torch.no_grad
        elif change == "autocast":

            def around() -> Any:
                return torch.autocast("cpu", dtype=torch.bfloat16)

        elif change == "new_param":
            model[3].bias = nn.Parameter(torch.zeros(4))
        if change == "target_dtype":  # the loss's inputs are part of the key
            with listener.batch():
                F.mse_loss(model(x), torch.zeros(6, 4, dtype=torch.float64).float())
            guarded = listener.last_guarded
        else:
            guarded = _one_batch(listener, model, xb, around)
        assert not guarded
        assert listener.log.unrecorded == 0
    assert all(e.usage.batches >= 1 for e in tracelog.load(tmp_path / "g").entries.values())


def test_gradient_accumulation_counts_each_micro_batch(tmp_path: Path) -> None:
    def run(log_dir: Path, **options: Any) -> tracelog.TraceLog:
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with tracelog.Listener(model, log_dir, strict=True, **options) as listener:
            for x, y in _batches(10):
                with listener.batch():
                    for half in (slice(0, 3), slice(3, 6)):
                        F.cross_entropy(model(x[half]), y[half]).backward()
                opt.step()
                opt.zero_grad()
        return tracelog.load(log_dir)

    exact, guarded = run(tmp_path / "e", mode="exact"), run(tmp_path / "g")
    assert _rows(exact) == _rows(guarded) and exact.recorded == 20
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0


def _digits_style(log_dir: Path | None, **options: Any) -> tuple[dict[str, Any], Any]:
    """The README's loop: train batches with a short last one, eval batches
    under no_grad, three epochs, a CNN with batch norm and dropout."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(4 * 4 * 4, 10),
    )
    g = torch.Generator().manual_seed(3)
    x_tr, y_tr = torch.randn(150, 1, 8, 8, generator=g), torch.randint(0, 10, (150,), generator=g)
    x_te, y_te = torch.randn(50, 1, 8, 8, generator=g), torch.randint(0, 10, (50,), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    listener = tracelog.Listener(model, log_dir, strict=True, **options) if log_dir else None
    window = listener.batch if listener else _no_window
    for epoch in range(3):
        if listener:
            listener.set_epoch(epoch)
        model.train()
        for i in range(0, 150, 16):
            with window():
                F.cross_entropy(model(x_tr[i : i + 16]), y_tr[i : i + 16]).backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for i in range(0, 50, 16):
                with window():
                    F.cross_entropy(model(x_te[i : i + 16]), y_te[i : i + 16])
    if listener:
        listener.close()
    return model.state_dict(), tracelog.load(log_dir) if log_dir else None


class _no_window:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_digits_style_counts_equal_and_weights_bitwise(tmp_path: Path) -> None:
    bare, _ = _digits_style(None)
    exact_w, exact = _digits_style(tmp_path / "e", mode="exact")
    guarded_w, guarded = _digits_style(tmp_path / "g", guard_after=2, rerecord_every=4)
    assert _rows(exact) == _rows(guarded)
    assert exact.unrecorded == guarded.unrecorded == 0
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0
    for name, t in bare.items():  # training is not perturbed, recorder on or off
        assert torch.equal(t, exact_w[name]) and torch.equal(t, guarded_w[name]), name
    assert guarded.sample_info == exact.sample_info  # the sample: an exact recording
    assert (tmp_path / "g" / "sample.safetensors").read_bytes() == (
        tmp_path / "e" / "sample.safetensors"
    ).read_bytes()


def test_alternating_shapes_are_each_trusted(tmp_path: Path) -> None:
    """A loader of two batch shapes (buckets): each shape's key is trusted
    after K exact recordings of it, the other shape's batches in between."""
    model = _mlp()
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        guarded = [_one_batch(listener, model, torch.randn(6 - i % 2, 8)) for i in range(12)]
    assert guarded == [False] * 6 + [True] * 6
    log = tracelog.load(tmp_path / "g")
    assert [(e.usage.batches, e.usage.guarded) for e in log.entries_sorted()] == [(12, 6)] * 2


def test_hf_trainer_guarded_counts_equal_exact(tmp_path: Path) -> None:
    """The Trainer's micro-batch windows and its evaluation loop's auto
    windows, guarded: the same counts as exact mode, and guarded batches."""
    pytest.importorskip("transformers", reason="the Hugging Face callback needs transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    import importlib.util
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from tracelog.transformers import TracelogCallback

    path = Path(__file__).parent.parent / "examples" / "hf_trainer_gpt2.py"
    spec = importlib.util.spec_from_file_location("hf_trainer_gpt2", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    logging.getLogger("transformers").setLevel(logging.ERROR)

    def run(out: Path, **options: Any) -> tuple[tracelog.TraceLog, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        config = GPT2Config(
            vocab_size=example.VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2
        )
        model = GPT2LMHeadModel(config)
        with tempfile.TemporaryDirectory() as scratch:
            args = TrainingArguments(
                output_dir=scratch,
                num_train_epochs=2,
                per_device_train_batch_size=4,
                per_device_eval_batch_size=2,
                gradient_accumulation_steps=2,
                eval_strategy="epoch",
                save_strategy="no",
                logging_strategy="no",
                report_to=[],
                use_cpu=True,
                disable_tqdm=True,
                seed=0,
            )
            Trainer(
                model=model,
                args=args,
                train_dataset=example.sequences(24, 1),
                eval_dataset=example.sequences(12, 2),
                callbacks=[TracelogCallback(out, strict=True, **options)],
            ).train()
        return tracelog.load(out), model.state_dict()

    exact, exact_w = run(tmp_path / "e", mode="exact")
    guarded, guarded_w = run(tmp_path / "g")
    assert _rows(exact) == _rows(guarded) and exact.unrecorded == guarded.unrecorded == 0
    assert [e.usage.batches for e in guarded.entries_sorted()] == [12, 12, 12, 12]
    assert all(e.usage.guarded > 0 for e in guarded.entries.values())
    assert all(torch.equal(t, guarded_w[n]) for n, t in exact_w.items())


def test_a_mode_switched_inside_the_window_is_seen(tmp_path: Path) -> None:
    """A trainer may call model.train() after the window opened (with the
    model still in eval mode): the batch is a training batch, never counted
    for the eval graphs its window opened with."""
    model = _mlp()
    x = torch.randn(6, 8)
    y = torch.zeros(6, dtype=torch.long)
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        for _ in range(4):
            _one_batch(listener, model, x)
        model.eval()
        for _ in range(4):  # with grad: the same modes and inputs as the train batches
            _one_batch(listener, model, x)
        with listener.batch():  # opens in eval mode, runs in train mode
            model.train()
            F.cross_entropy(model(x), y).backward()
        assert not listener.last_guarded
    phases = [
        (e.kind, e.phase, e.usage.batches) for e in tracelog.load(tmp_path / "g").entries_sorted()
    ]
    assert phases == [
        ("prediction", "train", 5),
        ("loss", "train", 5),
        ("prediction", "eval", 4),
        ("loss", "eval", 4),
    ]


def test_guard_state_does_not_grow_with_batches(tmp_path: Path) -> None:
    model = _mlp()
    x = torch.randn(6, 8)
    with tracelog.Listener(model, tmp_path / "g", strict=True, rerecord_every=50) as listener:
        for _ in range(400):
            _one_batch(listener, model, x)
        book = listener._book
        assert (len(book.table), len(book.streaks), len(book.trusted)) == (1, 1, 1)
        assert not book.pending and book.branch_count == 0
        assert (book.exact, book.guarded) == (3 + 7, 390)  # K, then 1 in 50 of the other 397
        assert len(listener._static_numbers) == 1  # the static part's facts, numbered once


def test_a_guarded_batch_that_cannot_be_counted_fails_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guarded batch ends in one call (``_end_guarded``); an error counting
    it takes the long way, which counts it unrecorded with the reason, and
    the next batches are counted as before."""
    model = _mlp()
    x = torch.randn(6, 8)
    with tracelog.Listener(model, tmp_path / "g", rerecord_every=50) as listener:
        assert [_one_batch(listener, model, x) for _ in range(5)] == [False] * 3 + [True] * 2

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError("no space left")

        with monkeypatch.context() as patched:  # the one-call count and the long way's
            patched.setattr(listener.log, "count_guarded", broken)
            patched.setattr(listener.log, "count", broken)
            assert not _one_batch(listener, model, x)
        assert [_one_batch(listener, model, x) for _ in range(2)] == [True] * 2
    log = tracelog.load(tmp_path / "g")
    assert (log.recorded, log.unrecorded) == (7, 1)
    assert "no space left" in log.failures[0]["error"] and log.failures[0]["batch"] == 5
    # exact and guarded add up to the batches counted: the failed one is neither
    assert log.recording["guarded"] == 4 and log.recording["exact"] == 3


class _Recurrent(nn.Module):
    """A GRU (a leaf whose call exact windows record whole) under a container."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = nn.GRU(8, 16, batch_first=True), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x.unsqueeze(1).repeat(1, 3, 1))[0][:, -1])


def test_fast_windows_call_only_the_pre_hooks(tmp_path: Path) -> None:
    """A fast window's modules carry one hook each (their pre hook; the root
    its post hook too): the other post hooks come with an exact window's
    recorder, and a user's post hook runs after the listener's either way."""
    model = _Recurrent()
    order: list[str] = []

    def user_hook(module: nn.Module, args: Any, output: Any) -> None:
        window = listener.window  # exact: the scope it is in ("out" if ours had not run)
        order.append(window.stack[-1][0] if getattr(window, "stack", None) else "fast")

    with tracelog.Listener(model, tmp_path / "g", strict=True, rerecord_every=4) as listener:
        model.out.register_forward_hook(user_hook)
        counts = []
        for n in [6] * 8 + [5]:  # the last: a new shape, recorded exactly
            x = torch.randn(n, 8)
            with listener.batch():
                counts.append(sum(len(m._forward_hooks) for m in model.modules()))
                F.cross_entropy(model(x), torch.zeros(n, dtype=torch.long)).backward()
                counts[-1] = (counts[-1], sum(len(m._forward_hooks) for m in model.modules()))
            if listener.last_guarded:
                assert counts[-1] == (2, 2)  # the root's post hook and the user's
        # batches 0-2 exact (K), 3-5 guarded, 6 exact (N=4: every 4th), 7 guarded, 8 exact
        # registered with the recorder: as the window opens, or as a fast one turns exact
        assert counts[:3] == [(4, 4)] * 3 and counts[6] == (4, 4) and counts[8] == (2, 4)
        # the user's post hook ran after ours, which had left the module's scope
        assert order == [""] * 3 + ["fast"] * 3 + ["", "fast", ""]
    exact = _train(_Recurrent(), tmp_path / "e", mode="exact")
    guarded = _train(_Recurrent(), tmp_path / "g2", guard_after=2, rerecord_every=3)
    assert _rows(exact) == _rows(guarded) and guarded.unrecorded == 0
    assert "GRU" in json.dumps([g.to_json() for g in guarded.graphs.values()])
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0


def test_a_parameter_replaced_on_a_submodule_added_later_leaves_the_fast_path(
    tmp_path: Path,
) -> None:
    """The tree version follows modules added after the listener attached:
    replacing a parameter of one is a change of the tree as on the others."""
    model = _mlp()
    x = torch.randn(6, 8)
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        assert [_one_batch(listener, model, x) for _ in range(5)] == [False] * 3 + [True] * 2
        model.append(nn.Linear(4, 4))  # a new submodule: recorded exactly, then trusted
        assert [_one_batch(listener, model, x) for _ in range(5)] == [False] * 3 + [True] * 2
        model[4].bias = nn.Parameter(torch.zeros(4))
        assert not _one_batch(listener, model, x)
        assert listener.log.unrecorded == 0


def test_a_training_loss_is_read_from_its_autograd_graph(tmp_path: Path) -> None:
    """Where the forward's output requires grad, the key reads the loss as its
    backward starts, from the autograd graph: no TorchFunctionMode is pushed
    (exact windows and fast ones alike). In a window without grad, the key's
    mode notes the loss's function calls, and leaves with the window."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[tuple[int, int]] = []
    guarded: list[bool] = []

    def depth() -> int:
        return torch._C._len_torch_function_stack()

    with tracelog.Listener(model, tmp_path / "g", strict=True, guard_after=2) as listener:
        for x, y in _batches(6):
            with listener.batch():
                loss = F.cross_entropy(model(x), y)
                before = depth()
                loss.backward()
                opt.step()
                seen.append((before, depth()))
                opt.zero_grad()
            guarded.append(listener.last_guarded)
        with torch.no_grad(), listener.batch():
            F.cross_entropy(model(x), y)
            in_window = depth()
        assert (in_window, depth()) == (1, 0)
    assert seen == [(0, 0)] * 6
    assert guarded == [False, False, True, True, True, True]


@pytest.mark.parametrize(
    "change",
    ["reduction", "label_smoothing", "loss_function", "extra_term", "ignore_index", "weight"],
)
def test_a_loss_change_leaves_the_fast_path(tmp_path: Path, change: str) -> None:
    """The loss's options and form are in the key (its autograd graph's node
    kinds and saved plain values): the batch after a change is recorded
    exactly, and counted for a new loss graph."""
    model = _mlp()
    x = torch.randn(6, 8)
    y = torch.zeros(6, dtype=torch.long)

    def loss(changed: bool) -> torch.Tensor:
        out = model(x)
        if not changed:
            return F.cross_entropy(out, y)
        if change == "reduction":
            return F.cross_entropy(out, y, reduction="sum")
        if change == "label_smoothing":
            return F.cross_entropy(out, y, label_smoothing=0.1)
        if change == "loss_function":
            return F.multi_margin_loss(out, y)
        if change == "ignore_index":
            return F.cross_entropy(out, y, ignore_index=3)
        if change == "weight":  # a tensor saved where None was: read as its type's name
            return F.cross_entropy(out, y, weight=torch.ones(out.shape[1]))
        return F.cross_entropy(out, y) + out.pow(2).mean()

    guarded = []
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        for i in range(7):
            with listener.batch():
                loss(changed=i >= 5).backward()
            guarded.append(listener.last_guarded)
    assert guarded == [False, False, False, True, True, False, False]
    log = tracelog.load(tmp_path / "g")
    losses = [e.usage.batches for e in log.entries_sorted() if e.kind == "loss"]
    assert sorted(losses) == [2, 5] and log.unrecorded == 0


@pytest.mark.parametrize("by_keyword", [False, True])
def test_autograd_grad_reads_the_loss_too(tmp_path: Path, by_keyword: bool) -> None:
    """A loop taking gradients with torch.autograd.grad: the key reads the loss
    there as well, and guarded counts equal exact ones (the loss passed by
    position, or as ``outputs=``)."""
    rows = []
    for mode in ("exact", "guarded"):
        model = _mlp()
        params = list(model.parameters())
        with tracelog.Listener(model, tmp_path / mode, strict=True, mode=mode) as listener:
            for x, y in _batches(8):
                with listener.batch():
                    loss = F.cross_entropy(model(x), y)
                    if by_keyword:
                        grads = torch.autograd.grad(outputs=loss, inputs=params)
                    else:
                        grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads, strict=True):
                        p -= 0.01 * g
        log = tracelog.load(tmp_path / mode)
        rows.append([(e.kind, e.usage.batches) for e in log.entries_sorted()])
        if mode == "guarded":
            assert sum(e.usage.guarded for e in log.entries.values()) > 0
    assert rows[0] == rows[1]


def test_autograd_outside_a_window_is_untouched() -> None:
    """The wrapped torch.autograd.backward and grad run as before outside a
    window: same results, nothing read."""
    from tracelog.adapters.torch import guards

    guards._wrap_autograd()
    assert torch.autograd.backward.__wrapped__ is guards._WRAPPED["backward"]
    a = torch.randn(3, requires_grad=True)
    (a * a).sum().backward()
    (g,) = torch.autograd.grad((a * 3).sum(), [a])
    torch.testing.assert_close(a.grad, 2 * a.detach())
    torch.testing.assert_close(g, torch.full((3,), 3.0))
    assert getattr(guards._READING, "calls", None) is None


def test_a_loss_graph_that_cannot_be_read_fails_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error reading the loss's autograd graph stops that window's
    recording (the batch counted unrecorded, with the reason); the user's
    backward runs as without a listener."""
    from tracelog.adapters.torch import guards

    def unreadable(roots: Any, stop: Any) -> Any:
        raise RuntimeError("no loss graph here")

    monkeypatch.setattr(guards, "loss_graph", unreadable)
    model = _mlp()
    with tracelog.Listener(model, tmp_path / "g") as listener:
        for x, y in _batches(4):
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            assert all(p.grad is not None for p in model.parameters())
            model.zero_grad()
    log = tracelog.load(tmp_path / "g")
    assert log.unrecorded == 4 and "no loss graph here" in log.failures[0]["error"]


class _Huber(torch.autograd.Function):
    """A custom Function in the loss: its node's saved tensors are read by
    no key (only plain values are)."""

    @staticmethod
    def forward(ctx: Any, diff: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(diff)
        return torch.where(diff.abs() < 1, 0.5 * diff**2, diff.abs() - 0.5).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (diff,) = ctx.saved_tensors
        return grad * diff.clamp(-1, 1) / diff.numel()


def test_a_custom_function_in_the_loss_counts_as_in_exact_mode(tmp_path: Path) -> None:
    rows = []
    for mode in ("exact", "guarded"):
        model = _mlp()
        with tracelog.Listener(model, tmp_path / mode, mode=mode) as listener:
            for x, y in _batches(8):
                with listener.batch():
                    _Huber.apply(model(x) - F.one_hot(y, 4).float()).backward()
                model.zero_grad()
        log = tracelog.load(tmp_path / mode)
        rows.append([(e.kind, e.usage.batches) for e in log.entries_sorted()])
        assert log.unrecorded == 0, log.failures
        if mode == "guarded":
            assert sum(e.usage.guarded for e in log.entries.values()) > 0
    assert rows[0] == rows[1]


class _Gate(nn.Module):
    """Calls the layer it holds on batches whose inputs are large (a
    data-dependent branch), else passes its input through."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) if x.abs().max() > 50 else x


class _Conv(nn.Sequential):
    """A Sequential subclass that only builds (as torchvision's
    Conv2dNormActivation): its call still calls each child once, in order."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(4, 4), nn.ReLU())


class _Reordered(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[0](x) if x.sum() > 0 else self[1](x)


def test_calls_implied_by_a_sequential_root() -> None:
    """Only modules reached from a Sequential root through Sequentials that
    pass through (torch's forward), and held by no other module, have their
    calls implied by the root's call."""
    from tracelog.adapters.torch.guards import implied_calls

    inner = nn.Sequential(nn.Linear(4, 4), _Conv())
    shared = nn.Linear(4, 4)
    model = nn.Sequential(inner, _Gate(shared), shared, _Reordered(nn.ReLU(), nn.Tanh()))
    implied = implied_calls(model)
    named = {path: id(m) for path, m in model.named_modules()}
    assert {p for p, i in named.items() if i in implied} == {
        "0", "0.0", "0.1", "0.1.0", "0.1.1", "1", "3"
    }  # fmt: skip
    # not: the shared layer (a gate calls it or not), the children of a Sequential
    # with its own forward, nor the root
    patched = nn.Sequential(nn.Linear(4, 4))
    patched.forward = lambda x: x  # type: ignore[method-assign]
    assert implied_calls(patched) == set() and implied_calls(_Branchy()) == set()


def test_a_sequential_models_guarded_batches_call_only_the_roots_hooks(tmp_path: Path) -> None:
    """A Sequential root's children carry no hook in a fast window (their calls
    are the root's), their scopes still recorded in exact windows: the graphs
    and counts are exact mode's."""
    model = _mlp()
    with tracelog.Listener(model, tmp_path / "g", strict=True) as listener:
        for i in range(6):
            x = torch.randn(6, 8)
            with listener.batch():
                hooks = sum(len(m._forward_pre_hooks) for m in model[:])
                F.cross_entropy(model(x), torch.zeros(6, dtype=torch.long)).backward()
            assert listener.last_guarded == (i >= 3)
            assert hooks == (0 if listener.last_guarded else 4)  # the scopes' pre hooks
    exact = _train(_mlp(), tmp_path / "e", mode="exact")
    guarded = _train(_mlp(), tmp_path / "g2")
    assert _rows(exact) == _rows(guarded)
    modules = {n.module for g in guarded.graphs.values() for n in g.nodes}
    assert {"0", "1", "2", "3"} <= modules  # each layer's scope, recorded


def test_a_layer_held_by_a_module_added_later_has_its_calls_noted(tmp_path: Path) -> None:
    """A Sequential's layer that a module added after attach holds too (and
    calls or not, by the data) is no longer implied by the root's call: the
    key notes its calls, and the branch is counted as in exact mode."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    def train(log_dir: Path, **options: Any) -> tracelog.TraceLog:
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        with tracelog.Listener(m, log_dir, strict=True, **options) as listener:
            m.insert(2, _Gate(m[0]))  # after attach: the first layer, held twice
            for x, y in _batches(16, big={6, 7, 11}):
                with listener.batch():
                    F.cross_entropy(m(x), y).backward()
                opt.step()
                opt.zero_grad()
        return tracelog.load(log_dir)

    exact = train(tmp_path / "e", mode="exact")
    guarded = train(tmp_path / "g", rerecord_every=50)
    assert _rows(exact) == _rows(guarded) and len(guarded.pairs) == 2
    assert guarded.recording is not None and guarded.recording["branches"] > 0


def test_an_implied_modules_scope_hook_keeps_its_place_among_the_users(tmp_path: Path) -> None:
    """The scope pre hook of a module whose calls the root implies comes and
    goes with exact windows, in the place a hook registered at attach has:
    after the user's pre hooks that were there then, before those added since
    (which see the scope entered)."""
    model = _mlp()
    seen: list[tuple[str, str]] = []

    def user_hook(when: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            stack = getattr(listener.window, "stack", None)
            seen.append((when, stack[-1][0] if stack else "-"))

        return hook

    model[3].register_forward_pre_hook(user_hook("before"))
    with tracelog.Listener(model, tmp_path / "g", strict=True, mode="exact") as listener:
        model[3].register_forward_pre_hook(user_hook("after"))
        for _ in range(2):
            with listener.batch():
                F.cross_entropy(
                    model(torch.randn(6, 8)), torch.zeros(6, dtype=torch.long)
                ).backward()
    assert seen == [("before", ""), ("after", "3")] * 2  # "": the root's scope
