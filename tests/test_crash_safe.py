"""Issue 11, items 3-6: a log that survives a crash, no silent overwrite,
fail-open writes (full disk, unwritable path, bfloat16), and the CLI on bad
input. Small models, few batches: these run in seconds."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import record

import tracelog
import tracelog.log as tlog
from tracelog.adapters.torch import TorchListener
from tracelog.cli import main

CHILD = Path(__file__).with_name("crash_child.py")
INTERRUPTED = "interrupted: the run did not close; counts as of the last checkpoint at "
EVERY = 3  # crash_child.py checkpoints every 3 batches


# -- helpers ------------------------------------------------------------------------------------
def _child(log_dir: Path, mode: str, n: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(log_dir), mode, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _kill_after(log_dir: Path, k: int, sig: int, mode: str = "run") -> tuple[int, int]:
    """Run the child until it printed k batches, send ``sig``; return (k,
    batches it printed in all) and check it died of the signal."""
    proc = _child(log_dir, mode, 10**6)
    assert proc.stdout is not None
    for _ in range(k):
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=60)
    printed = k + len(rest.split())
    assert "Traceback" not in err or mode == "sigterm-exit", err
    return printed, proc.returncode


def _show(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["show", str(log_dir)]) == 0
    return capsys.readouterr().out.splitlines()


def _interrupted_log_checks(
    log_dir: Path, capsys: pytest.CaptureFixture[str], low: int, high: int
) -> tracelog.TraceLog:
    """What show and check say about a log whose run did not close."""
    lines = _show(log_dir, capsys)
    assert lines[0].startswith(INTERRUPTED), lines[0]
    rows = [line.split() for line in lines if line[:1].isdigit()]
    assert [(r[1], r[2]) for r in rows] == [("prediction", "train"), ("loss", "train")]
    log = tracelog.load(log_dir)
    assert log.interrupted and log.unrecorded == 0
    assert low <= log.recorded <= high, (low, log.recorded, high)
    assert [int(r[5]) for r in rows] == [log.recorded] * 2
    assert main(["check", str(log_dir), "--target", "torch"]) == 0
    assert "parity: ok" in capsys.readouterr().out
    assert not list(log_dir.rglob(".*.tmp*"))
    return log


def _train(model: torch.nn.Module, steps: int, listener: TorchListener | None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen).to(dtype)
        y = torch.randint(0, 3, (5,), generator=gen)
        if listener is None:
            torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        else:
            with listener.batch():
                torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()
        opt.zero_grad()


def _mlp(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(
        dtype
    )


def _final_weights(model: torch.nn.Module) -> dict[str, bytes]:
    return {
        n: t.detach().contiguous().view(torch.uint8).numpy().tobytes()
        for n, t in model.state_dict().items()
    }


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- item 3: crash-safe log ---------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_run_leaves_a_readable_interrupted_log(tmp_path, capsys, sig) -> None:
    """Default SIGTERM ends Python without atexit, as SIGKILL does: counts
    are those of the last checkpoint, at most one checkpoint behind."""
    printed, rc = _kill_after(tmp_path / "log", 7, sig)
    assert rc == -sig
    _interrupted_log_checks(tmp_path / "log", capsys, printed - EVERY, printed + 1)


def test_sigterm_turned_into_system_exit_flushes_every_batch(tmp_path, capsys) -> None:
    printed, rc = _kill_after(tmp_path / "log", 5, signal.SIGTERM, "sigterm-exit")
    assert rc == 143
    log = tracelog.load(tmp_path / "log")
    # the batch SystemExit interrupted (if any) is counted once, unrecorded
    assert printed <= log.recorded + log.unrecorded <= printed + 1 and log.unrecorded <= 1
    assert _show(tmp_path / "log", capsys)[0].startswith(INTERRUPTED)


def test_a_listener_never_closed_leaves_an_interrupted_log_at_exit(tmp_path, capsys) -> None:
    proc = _child(tmp_path / "log", "run", 7)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.split() == [str(i) for i in range(1, 8)], err
    log = _interrupted_log_checks(tmp_path / "log", capsys, 7, 7)  # atexit: every batch
    assert log.run["checkpoint"] in _show(tmp_path / "log", capsys)[0]


def test_graphs_and_sample_reach_disk_when_first_recorded(tmp_path) -> None:
    model = _mlp()
    listener = TorchListener(model, tmp_path / "log", checkpoint_every_batches=10**6)
    _train(model, 1, listener)
    log = tracelog.load(tmp_path / "log")  # before close: graphs, sample, weights on disk
    assert log.interrupted and log.recorded == 1 and len(log.graphs) == 2
    assert {"loss", "output/prediction"} <= set(log.sample())
    _train(model, 4, listener)
    assert tracelog.load(tmp_path / "log").recorded == 1  # no checkpoint due yet
    listener.close()
    log = tracelog.load(tmp_path / "log")
    assert not log.interrupted and log.recorded == 5 and log.run == {"state": "complete"}


@pytest.mark.parametrize("given", [None, 200])
def test_default_checkpoints_cost_at_most_one_percent(tmp_path, given: int | None) -> None:
    """The default 200 batches wait until the time since the last checkpoint is
    100 times its cost (a fast step's 200 batches take less than that); a
    count given is kept. The last checkpoint's cost is set as if it took 1 s."""
    model = _mlp()
    listener = TorchListener(
        model, tmp_path / "log", checkpoint_every_batches=given, checkpoint_every_s=3600.0
    )
    _train(model, 1, listener)  # the graphs and the sample: written at once
    listener.writer._cost = 1.0
    _train(model, 250, listener)
    recorded = tracelog.load(tmp_path / "log").recorded
    listener.writer._cost = 0.0
    _train(model, 250, listener)
    if given is None:
        assert recorded == 1  # 250 batches in under 100 s: no checkpoint
    else:
        assert recorded == 201  # the 200th batch after the first
    assert tracelog.load(tmp_path / "log").recorded >= 251  # cheap again: at 200 batches
    listener.close()


def test_weights_newer_than_the_last_checkpoint_are_accepted(tmp_path) -> None:
    """A kill between writing the weights and writing trace.json: the log
    still loads (same run, whole file); a foreign weights file does not."""
    model = _mlp()
    listener = TorchListener(model, tmp_path / "log", checkpoint_every_batches=10**6)
    _train(model, 2, listener)
    listener.writer._write_weights(final=False)  # as if killed right after this write
    assert tracelog.load(tmp_path / "log").interrupted
    other = _mlp()
    TorchListener(other, tmp_path / "other").writer._write_weights(final=False)
    (tmp_path / "log" / tlog.WEIGHTS_FILE).write_bytes(
        (tmp_path / "other" / tlog.WEIGHTS_FILE).read_bytes()
    )
    with pytest.raises(tracelog.LogError, match="sha256 differs"):
        tracelog.load(tmp_path / "log")
    listener.close()


def test_a_keras_fit_that_raises_leaves_an_interrupted_log(tmp_path, capsys) -> None:
    keras = pytest.importorskip("keras", reason="the Keras callback needs keras 3")
    from tracelog.keras import TracelogCallback

    class Boom(keras.layers.Layer):
        boom = False

        def call(self, x):
            if self.boom:
                raise RuntimeError("boom")
            return x

    class Counter(keras.callbacks.Callback):
        done = 0

        def on_train_batch_end(self, batch, logs=None) -> None:
            Counter.done += 1
            boom.boom = Counter.done == 4  # the 5th batch raises

    keras.utils.set_random_seed(0)
    boom = Boom()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), boom])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    x = torch.randn(40, 4).numpy()
    y = torch.randn(40, 3).numpy()
    callback = TracelogCallback(tmp_path / "log", checkpoint_every_batches=10**6)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[Counter(), callback])
    assert callback.listener is not None and callback.listener.closed
    assert model.train_function is None or not hasattr(model.train_function, "__wrapped__")
    lines = _show(tmp_path / "log", capsys)
    assert lines[0].startswith(INTERRUPTED)
    log = tracelog.load(tmp_path / "log")
    assert (log.recorded, log.unrecorded) == (4, 1)  # exact: the error path checkpointed
    assert "RuntimeError" in log.failures[0]["error"]
    assert main(["check", str(tmp_path / "log"), "--target", "torch"]) == 0


# -- item 4: no silent overwrite ----------------------------------------------------------------
def test_a_second_listener_on_a_log_raises_before_training(tmp_path) -> None:
    model = _mlp()
    with TorchListener(model, tmp_path / "log") as listener:
        _train(model, 2, listener)
    before = {p: p.read_bytes() for p in (tmp_path / "log").rglob("*") if p.is_file()}
    again = _mlp()
    with pytest.raises(tracelog.LogExistsError, match="already holds a tracelog log.*overwrite"):
        TorchListener(again, tmp_path / "log")
    with pytest.raises(FileExistsError):  # LogExistsError is one
        tracelog.Listener(again, tmp_path / "log")
    assert not again[0]._forward_pre_hooks  # nothing attached to the model
    assert {p: p.read_bytes() for p in (tmp_path / "log").rglob("*") if p.is_file()} == before
    # the callback checks the directory at construction too
    pytest.importorskip("keras", reason="the Keras callback needs keras 3")
    from tracelog.keras import TracelogCallback

    with pytest.raises(tracelog.LogExistsError):
        TracelogCallback(tmp_path / "log")


def test_overwrite_removes_the_old_log_and_its_programs(tmp_path) -> None:
    d = tmp_path / "log"
    model = _mlp()
    with TorchListener(model, d) as listener:
        _train(model, 2, listener)
    tracelog.emit(d, target="torch")
    tracelog.emit(d, target="onnx")
    (d / "notes.txt").write_text("mine")
    assert (d / "program_torch.py").exists() and (d / "model.onnx").exists()
    model = _mlp()
    listener = TorchListener(model, d, overwrite=True)
    left = sorted(p.name for p in d.iterdir())
    assert left == ["notes.txt"]  # the old log and programs are gone before training
    _train(model, 3, listener)
    listener.close()
    assert tracelog.load(d).recorded == 3


# -- item 5: fail-open writes -------------------------------------------------------------------
def _unwritable(tmp_path: Path, how: str) -> Path:
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("running as root: chmod does not stop root from writing")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        return ro / "log"
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file" / "log"  # a path under a file: no one can write it


@pytest.mark.parametrize("how", ["chmod", "under-a-file"])
def test_an_unwritable_log_dir_never_stops_training(tmp_path, caplog, how) -> None:
    d = _unwritable(tmp_path, how)
    plain, recorded = _mlp(), _mlp()
    _train(plain, 4, None)
    listener = TorchListener(recorded, d)
    _train(recorded, 4, listener)
    assert listener.close() is listener.log  # no raise
    assert _final_weights(recorded) == _final_weights(plain)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "no log was written" in warnings[0], warnings
    assert (listener.log.recorded, listener.log.unrecorded) == (4, 0)
    assert not list(tmp_path.rglob(".*.tmp*"))


def test_a_full_disk_keeps_the_last_good_checkpoint(tmp_path, caplog, monkeypatch) -> None:
    d = tmp_path / "log"
    plain, recorded = _mlp(), _mlp()
    _train(plain, 3, None)
    _train(plain, 3, None)
    listener = TorchListener(recorded, d, checkpoint_every_batches=2)
    _train(recorded, 3, listener)  # checkpoints at batch 1 (new graphs, sample) and 3
    good = tracelog.load(d).recorded

    def full(f, data: bytes) -> None:
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tlog, "_fill", full)
    _train(recorded, 3, listener)
    listener.close()
    assert _final_weights(recorded) == _final_weights(plain)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
    assert "as of its checkpoint at" in warnings[0]
    assert not list(d.rglob(".*.tmp*"))  # half-written temp files removed
    log = tracelog.load(d)  # the last good checkpoint, readable, marked interrupted
    assert log.interrupted and log.recorded == good == 3
    assert (listener.log.recorded, listener.log.unrecorded) == (6, 0)


def test_a_failed_sample_counts_its_batch_once(tmp_path, caplog, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise ValueError("cannot take it")

    model = _mlp()
    listener = TorchListener(model, tmp_path / "log")
    monkeypatch.setattr(listener, "_take_sample", broken)
    _train(model, 3, listener)
    log = listener.close()
    assert (log.recorded, log.unrecorded) == (3, 0)
    assert len(_warnings(caplog)) == 1 and "sample" in _warnings(caplog)[0]
    assert tracelog.load(tmp_path / "log").sample_info is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_are_recorded_and_stored(tmp_path, caplog, capsys, dtype) -> None:
    plain, recorded = _mlp(dtype), _mlp(dtype)
    _train(plain, 3, None)
    listener = TorchListener(recorded, tmp_path / "log")
    _train(recorded, 3, listener)
    log = listener.close()
    assert _final_weights(recorded) == _final_weights(plain)
    assert len(_warnings(caplog)) <= 1 and not list(tmp_path.rglob(".*.tmp*"))
    assert (log.recorded, log.unrecorded) == (3, 0)
    loaded = tracelog.load(tmp_path / "log")
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    assert loaded.sample()["param/0.weight"].dtype.name == name
    assert loaded.weights()["0.weight"].dtype.name == name
    assert main(["show", str(tmp_path / "log")]) == 0
    capsys.readouterr()
    # checked: the float64 reference replays the half-precision batch; each
    # target runs in float64 against it, and in the recorded dtype
    assert loaded.sample_info["reference"] == "float64"
    for target in ("torch", "tensorflow", "jax", "onnx"):
        assert main(["check", str(tmp_path / "log"), "--target", target]) == 0, target
        out = capsys.readouterr().out
        assert "prediction [float64]" in out and "parity: ok" in out, target
        if target != "onnx":  # ONNX has no autodiff
            assert "grad 0.weight [float64]" in out


# -- item 6: the CLI on bad input ---------------------------------------------------------------
@pytest.fixture(scope="module")
def small_log(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("small") / "log"
    x = [(torch.randn(5, 4), torch.randint(0, 3, (5,)))]
    record(_mlp(), d, x, torch.nn.functional.cross_entropy, eval_batches=0)
    return d


def _edited(small_log: Path, tmp_path: Path, files: object) -> Path:
    import shutil

    d = tmp_path / "edited"
    shutil.copytree(small_log, d)
    trace = json.loads((d / "trace.json").read_text())
    trace["files"] = files
    (d / "trace.json").write_text(json.dumps(trace))
    return d


@pytest.mark.parametrize(
    "files, message",
    [
        ([], "'files' is list"),
        (None, "'files' is NoneType"),
        ({"/etc/passwd": "0" * 64}, "refused"),
        ({"../trace.json": "0" * 64}, "refused"),
        ({"graphs/../../x": "0" * 64}, "refused"),
        ({"sub/weights.safetensors": "0" * 64}, "refused"),
    ],
    ids=["list", "null", "absolute", "dotdot", "nested-dotdot", "subdir"],
)
def test_bad_files_entries_give_one_line_and_exit_2(small_log, tmp_path, capsys, files, message):
    d = _edited(small_log, tmp_path, files)
    for argv in (["show", str(d)], ["check", str(d), "--target", "torch"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_emit_out_creates_missing_parents_or_says_why_not(small_log, tmp_path, capsys) -> None:
    out = tmp_path / "new" / "deeper" / "p.py"
    assert main(["emit", str(small_log), "--target", "torch", "--out", str(out)]) == 0
    assert out.is_file()
    (tmp_path / "a_file").write_text("")
    bad = tmp_path / "a_file" / "sub" / "p.py"
    assert main(["emit", str(small_log), "--target", "torch", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create" in err and "Traceback" not in err


def test_show_ends_quietly_on_a_closed_pipe(small_log) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before tracelog writes (as `| head -1` after one line)
    proc = subprocess.run(
        [sys.executable, "-m", "tracelog.cli", "show", str(small_log)],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    os.close(w)
    assert proc.returncode in (0, 141) and proc.stderr == "", proc.stderr


def test_a_failed_sample_write_is_retried_and_trace_json_waits_for_it(
    tmp_path, caplog, monkeypatch
) -> None:
    """A large sample (its sha256 taken on a helper thread) whose write fails:
    that checkpoint fails as any write's does (trace.json not written, one
    warning), and the next checkpoint writes it, its sha256 in trace.json."""
    torch.manual_seed(0)
    big = torch.nn.Linear(4, 256 * 256, bias=False)  # 1 MB of weights, gradients beside them
    model = torch.nn.Sequential(big, torch.nn.ReLU(), torch.nn.Linear(256 * 256, 3))
    real = tlog._atomic_write
    failed: list[str] = []

    def sample_fails_once(path: Path, data: object) -> None:
        if path.name == tlog.SAMPLE_FILE and not failed:
            failed.append(path.name)
            raise OSError(errno.EIO, "I/O error")
        real(path, data)

    monkeypatch.setattr(tlog, "_atomic_write", sample_fails_once)
    d = tmp_path / "log"
    listener = TorchListener(model, d, checkpoint_every_batches=1)
    _train(model, 1, listener)  # the first checkpoint: the sample's write fails
    assert failed and not (d / tlog.TRACE_FILE).exists()
    assert len(_warnings(caplog)) == 1 and "I/O error" in _warnings(caplog)[0]
    assert (d / "graphs").is_dir() and list((d / "graphs").iterdir())
    _train(model, 1, listener)  # the next one writes it
    log = listener.close()
    assert (d / tlog.SAMPLE_FILE).stat().st_size > 1 << 20
    on_disk = json.loads((d / tlog.TRACE_FILE).read_text())
    digest = hashlib.sha256((d / tlog.SAMPLE_FILE).read_bytes()).hexdigest()
    assert digest in json.dumps(on_disk["files"])
    assert tracelog.load(d).sample_info is not None and log.recorded == 2
    assert not list(d.rglob(".*.tmp*"))
