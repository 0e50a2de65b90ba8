"""Issue 16 item 2: DistributedDataParallel on two gloo processes, run by
torchrun from the example. Rank 0 writes the log (counts per rank-0 forward,
optimizer steps beside them, the world size in trace.json); the sample's
gradients are rank 0's own micro-batch's, so the check passes; ``ranks="all"``
gives each rank its own directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_translated, own_gradients

import tracelog
from tracelog.adapters.torch.distributed import placement
from tracelog.cli import main as cli
from tracelog.sample import input_key

ROOT = Path(__file__).parent.parent
TARGETS = ["tensorflow", "jax", "onnx"]


def _torchrun(out: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--standalone", str(ROOT / "examples" / "ddp_two_ranks.py"), "--out", str(out)]
    done = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def rank0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "log"
    _torchrun(out, "--steps", "3", "--accumulate", "2")
    return out


def test_rank0_counts(rank0: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tracelog.load(rank0)
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]
    # one per forward on rank 0 (3 steps x 2 micro-batches), never one per rank
    assert rows == [
        ("prediction", "train", 6),
        ("loss", "train", 6),
        ("prediction", "eval", 1),
        ("loss", "eval", 1),
    ]
    assert log.optimizer_steps == 3
    trace = json.loads((rank0 / "trace.json").read_text())
    assert trace["batches"]["optimizer_steps"] == 3
    dist = trace["distributed"]
    assert (dist["world_size"], dist["rank"], dist["backend"]) == (2, 0, "gloo")
    assert sorted(p.name for p in rank0.parent.iterdir()) == ["log"]  # rank 1 wrote nothing
    assert cli(["show", str(rank0)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "6+1" not in head and "7 batches recorded" in head and "3 optimizer steps" in head
    assert "rank 0 of 2 (gloo)" in head
    # parameter names are the module's, not DDP's `module.` prefix
    assert all(not p["name"].startswith("module.") for p in log.model["params"])


def test_rank0_sample_has_itsown_gradients(rank0: Path) -> None:
    assert own_gradients(rank0) < 1e-5
    info = tracelog.load(rank0).sample_info or {}
    assert "before the all-reduce" in info["grads_from"]


@pytest.mark.parametrize("target", TARGETS)
def test_rank0_check(rank0: Path, target: str) -> None:
    pytest.importorskip(
        {"tensorflow": "tensorflow", "jax": "jax", "onnx": "onnxruntime"}[target],
        reason=f"the {target} target needs its framework",
    )
    assert_translated(tracelog.check(rank0, target))


def test_all_ranks_write_their_own_directories(tmp_path: Path) -> None:
    out = tmp_path / "log"
    _torchrun(out, "--steps", "1", "--ranks", "all")
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    inputs = []
    for rank in (0, 1):
        log = tracelog.load(out / f"rank{rank}")
        assert log.distributed is not None and log.distributed["rank"] == rank
        assert [e.usage.batches for e in log.entries_sorted()] == [1, 1, 1, 1]
        assert own_gradients(out / f"rank{rank}") < 1e-5
        inputs.append(log.sample()[input_key("x")])
    assert not np.array_equal(inputs[0], inputs[1])  # each rank its own shard


def test_placement() -> None:
    facts = {"backend": "gloo", "world_size": 4, "rank": 2}
    assert placement(0, "d", None) == (True, "d")  # one process records, whatever ranks says
    assert placement(0, "d", facts) == (False, "d")
    assert placement(2, "d", facts) == (True, "d")
    assert placement("all", "d", facts) == (True, Path("d") / "rank2")
    assert placement([0, 2], "d", facts) == (True, Path("d") / "rank2")
    assert placement([0, 1], "d", facts)[0] is False
    for bad in ("some", True, [0.5]):
        with pytest.raises(ValueError, match="ranks must be"):
            placement(bad, "d", facts)  # type: ignore[arg-type]


# DDP's options that change its reducer: unused parameters found each backward,
# and a static graph (its first iteration synced: DDP itself asserts under
# no_sync there, tracelog or not)
@pytest.mark.parametrize(
    "options, steps",
    [
        (["--find-unused-parameters", "--accumulate", "2"], 6),
        (["--static-graph"], 3),
    ],
    ids=["find_unused_parameters", "static_graph"],
)
def test_ddp_options_record_as_plain_ddp(tmp_path: Path, options: list[str], steps: int) -> None:
    out = tmp_path / "log"
    _torchrun(out, "--steps", "3", *options)
    log = tracelog.load(out)
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]
    assert rows == [
        ("prediction", "train", steps),
        ("loss", "train", steps),
        ("prediction", "eval", 1),
        ("loss", "eval", 1),
    ]
    assert log.optimizer_steps == 3
    assert own_gradients(out) < 1e-5
    grads = {k for k in log.sample() if k.startswith("grad/")}
    if "--find-unused-parameters" in options:
        # the layer no forward reaches: a parameter of the log, with no gradient
        assert "spare.weight" in {p["name"] for p in log.model["params"]}
        assert not any("spare" in k for k in grads) and "grad/fc1.weight" in grads
    pytest.importorskip("tensorflow", reason="the tensorflow target needs its framework")
    assert_translated(tracelog.check(out, "tensorflow"))
