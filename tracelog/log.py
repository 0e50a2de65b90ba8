"""TraceLog: unique graphs with usage counts, and the log directory on disk.

A log directory holds
- trace.json: format version, framework facts, the hashes of the unique
  graphs, their usage counts, the run's state (complete, or interrupted with
  the time of its last checkpoint), and the sha256 of the two tensor files;
- graphs/<sha256>.json: each unique graph in canonical form, in a file of its
  own named by its hash;
- weights.safetensors: parameters and buffers (final at close, else as of the
  last time they were written) and large constants;
- sample.safetensors: one recorded training batch (inputs, targets, dropout
  masks, outputs, loss, parameter gradients, parameters and buffers of that
  moment, and the buffers after it).

Crash safety (format version 2). A listener writes the log as training goes
(``LogWriter``): a new unique graph, and the sample, when first recorded;
the counts at checkpoints (every ``checkpoint_every_s`` seconds or
``checkpoint_every_batches`` batches, whichever comes first). Why graphs in
files of their own: a graph is immutable and named by its hash, so it is
written once and verified by its name, and a checkpoint rewrites only the
small trace.json (counts), however many graphs the run has. One trace.json
holding every graph would make each checkpoint cost the size of all graphs.
Every file is written atomically (a temp file in the same directory, fsync,
rename, fsync of the directory), and in an order that keeps the directory
whole at every instant: graph files, the sample and the weights first,
trace.json (which names them) last. trace.json says ``"state":
"interrupted"`` until ``close()`` writes ``"complete"``, so a log whose run
was killed reads as interrupted, its counts as of its last checkpoint.

The weights are rewritten when a new graph brings constants, at close, on the
interrupted paths (atexit, a Keras ``fit`` that raises) and, with
``checkpoint_weights=True``, at every checkpoint. A kill between writing the
weights and writing trace.json leaves weights newer than trace.json's sha256
of them: an interrupted log accepts them when their safetensors header is
whole and names the same run.

Version 1 logs (every graph inline in trace.json) are still read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import Any

import numpy as np

from tracelog.errors import LogError, LogExistsError
from tracelog.ir import Graph, is_dim
from tracelog.sample import (
    SAMPLE_FILE,
    SampleInfo,
    decode_sample,
    decode_tensors,
    encode_sample,
    encode_tensors,
    tensor_pieces,
)

logger = logging.getLogger("tracelog")

FORMAT = "tracelog"
FORMAT_VERSION = 2
TRACE_FILE = "trace.json"
WEIGHTS_FILE = "weights.safetensors"
GRAPHS_DIR = "graphs"
MAX_FAILURE_DETAILS = 20
COMPLETE = "complete"
INTERRUPTED = "interrupted"
RUN_KEY = "tracelog_run"  # weights.safetensors metadata: the run that wrote it
_HASH = re.compile(r"[0-9a-f]{64}")

Position = tuple[int, int]  # (epoch, batch index within the epoch and phase)


@dataclass
class Usage:
    batches: int = 0
    epochs: list[int] = field(default_factory=list)
    first: Position | None = None
    last: Position | None = None
    # of ``batches``, those counted by the guarded fast path (not recorded op by op)
    guarded: int = 0

    def add(self, epoch: int, batch: int, guarded: bool = False) -> None:
        self.batches += 1
        self.guarded += guarded
        if not self.epochs or self.epochs[-1] != epoch:
            if epoch not in self.epochs:
                self.epochs.append(epoch)
                self.epochs.sort()
        # min/max: a guarded batch whose graph became known later is counted late
        pos = (epoch, batch)
        last = self.last
        if last is None:
            self.first = self.last = pos
        elif pos > last:  # the usual case: a later batch
            self.last = pos
        elif pos < self.first:  # type: ignore[operator]
            self.first = pos

    def counts_json(self) -> dict[str, int]:
        """How the batches were counted: recorded op by op, or under guards."""
        return {"exact": self.batches - self.guarded, "guarded": self.guarded}

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "epochs": self.epochs,
            "first": list(self.first) if self.first else None,
            "last": list(self.last) if self.last else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Usage:
        first = tuple(d["first"]) if d.get("first") is not None else None
        last = tuple(d["last"]) if d.get("last") is not None else None
        guarded = int(d.get("guarded", 0))  # absent before the guarded fast path
        return cls(int(d["batches"]), [int(e) for e in d["epochs"]], first, last, guarded)


@dataclass
class GraphEntry:
    hash: str
    kind: str
    phase: str
    usage: Usage = field(default_factory=Usage)


@dataclass
class PairEntry:
    """Which prediction graph ran with which loss graph (loss may be absent)."""

    phase: str
    prediction: str
    loss: str | None
    usage: Usage = field(default_factory=Usage)


class TraceLog:
    """The unique graphs of a run and how often each ran."""

    def __init__(self, framework: dict[str, Any] | None = None) -> None:
        self.framework: dict[str, Any] = dict(framework or {})
        self.model: dict[str, Any] = {}
        self.graphs: dict[str, Graph] = {}
        self.entries: dict[tuple[str, str], GraphEntry] = {}
        self.pairs: dict[tuple[str, str, str], PairEntry] = {}
        self.recorded = 0
        self.unrecorded = 0
        # optimizer steps of the run (a listener that counts them: torch); with
        # gradient accumulation, fewer than the training batches (forward passes)
        self.optimizer_steps: int | None = None
        # a torch.distributed run: backend, world_size, the rank that wrote this
        # log and the ranks that record (None: a single process)
        self.distributed: dict[str, Any] | None = None
        self.failures: list[dict[str, Any]] = []
        # how batches were recorded (mode, K, N, guarded batches, branches
        # noticed, a switch back to exact mode); None: every batch op by op
        self.recording: dict[str, Any] | None = None
        self.sample_info: SampleInfo | None = None
        self.constants: dict[str, np.ndarray] = {}
        # the run's state on disk: complete, or interrupted (with its last checkpoint)
        self.run: dict[str, Any] = {"state": COMPLETE}
        self._dir: Path | None = None
        # tensor files not yet checked against trace.json's sha256 (load(check_tensors=False))
        self._unchecked: dict[str, str] = {}

    @property
    def interrupted(self) -> bool:
        """Did the run that wrote this log not close (killed, raised, never closed)?"""
        return self.run.get("state") != COMPLETE

    # -- building ---------------------------------------------------------------
    def add_graph(self, graph: Graph) -> str:
        """Store a graph once, in canonical form; return its hash."""
        canon = graph.canonical()
        for v in canon.values.values():
            # a dim load() would refuse must fail this batch, not make the log unreadable
            if not all(is_dim(d) for d in v.type.shape):
                raise ValueError(f"a value of shape {list(v.type.shape)!r} (not a dim a log holds)")
        digest = canon.digest()
        self.graphs.setdefault(digest, canon)
        return digest

    def count(
        self,
        phase: str,
        prediction: str,
        loss: str | None,
        epoch: int,
        batch: int,
        guarded: bool = False,
    ) -> None:
        """Count one batch for its graphs (``guarded``: counted by guards)."""
        for h in (prediction, loss):
            if h is None:
                continue
            key = (h, phase)
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = GraphEntry(h, self.graphs[h].kind, phase)
            entry.usage.add(epoch, batch, guarded)
        pkey = (phase, prediction, loss or "")
        pair = self.pairs.get(pkey)
        if pair is None:
            pair = self.pairs[pkey] = PairEntry(phase, prediction, loss)
        pair.usage.add(epoch, batch, guarded)
        self.recorded += 1

    def usages(self, phase: str, prediction: str, loss: str | None) -> tuple[Usage, ...]:
        """The usages ``count`` adds to for this pair (its graphs' and its own),
        for ``count_guarded``; the pair must have been counted before."""
        found = [self.entries[(h, phase)].usage for h in (prediction, loss) if h is not None]
        found.append(self.pairs[(phase, prediction, loss or "")].usage)
        return tuple(found)

    def count_guarded(self, usages: tuple[Usage, ...], epoch: int, batch: int) -> None:
        """``count(..., guarded=True)`` with the pair's ``usages`` known: a
        guarded batch (every batch of a long run; the usual one, a later
        batch of the same epoch, in a few steps)."""
        pos = (epoch, batch)
        for u in usages:
            last = u.last
            if last is not None and last[0] == epoch and pos > last:  # epoch listed already
                u.batches += 1
                u.guarded += 1
                u.last = pos
            else:
                u.add(epoch, batch, True)
        self.recorded += 1

    def count_failure(self, phase: str, epoch: int, batch: int, error: str) -> None:
        self.unrecorded += 1
        if len(self.failures) < MAX_FAILURE_DETAILS:
            self.failures.append({"phase": phase, "epoch": epoch, "batch": batch, "error": error})

    # -- queries ------------------------------------------------------------------
    def entries_sorted(self) -> list[GraphEntry]:
        """Entries in order of first use, prediction before loss at a tie."""
        kind_order = {"prediction": 0, "loss": 1}
        phase_order = {"train": 0, "eval": 1}

        def key(e: GraphEntry) -> tuple[Any, ...]:
            first = e.usage.first or (0, 0)
            return (phase_order.get(e.phase, 2), first, kind_order.get(e.kind, 2), e.hash)

        return sorted(self.entries.values(), key=key)

    def graph(self, digest: str) -> Graph:
        try:
            return self.graphs[digest]
        except KeyError:
            raise LogError(f"no graph with hash {digest} in this log") from None

    def weights(self) -> dict[str, np.ndarray]:
        return self._load_tensors(WEIGHTS_FILE, decode_tensors)

    def sample(self) -> dict[str, np.ndarray]:
        return self._load_tensors(SAMPLE_FILE, decode_sample)

    def sample_keys(self) -> set[str]:
        """The sample's keys, read from its file's header only (a program
        names the entries it reads; the arrays are the check's)."""
        if self._dir is None:
            raise LogError("this log has not been written or loaded from disk")
        from safetensors import safe_open

        path = self._dir / SAMPLE_FILE
        try:
            with safe_open(str(path), framework="numpy") as f:  # the header only
                return set(f.keys())
        except Exception as e:  # OSError, a file that is not safetensors
            raise LogError(f"{path}: cannot read tensors ({_one_line(e)})") from None

    def _load_tensors(
        self, name: str, decode: Callable[[bytes], dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        if self._dir is None:
            raise LogError("this log has not been written or loaded from disk")
        path = self._dir / name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise LogError(f"{path}: cannot read tensors ({_one_line(e)})") from None
        expected = self._unchecked.get(name)
        if expected is not None:  # loaded with check_tensors=False: checked as read
            newer_ok = self.interrupted and name == WEIGHTS_FILE
            _check_bytes(path, data, expected, newer_ok, self.run)
            del self._unchecked[name]
        try:
            return decode(data)
        except Exception as e:  # safetensors' own error type
            raise LogError(f"{path}: cannot read tensors ({_one_line(e)})") from None

    # -- serialisation ------------------------------------------------------------
    def to_json(self, files: dict[str, str]) -> dict[str, Any]:
        """trace.json: graphs by hash only (each one is graphs/<hash>.json)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "run": self.run,
            "framework": self.framework,
            "model": self.model,
            "batches": {
                "recorded": self.recorded,
                "unrecorded": self.unrecorded,
                "failures": self.failures,
                **(
                    {}
                    if self.optimizer_steps is None
                    else {"optimizer_steps": self.optimizer_steps}
                ),
            },
            **({} if self.distributed is None else {"distributed": self.distributed}),
            "graphs": sorted(self.graphs),
            **({} if self.recording is None else {"recording": self.recording}),
            "entries": [
                {
                    "hash": e.hash,
                    "kind": e.kind,
                    "phase": e.phase,
                    **e.usage.to_json(),
                    **e.usage.counts_json(),
                }
                for e in self.entries_sorted()
            ],
            "pairs": [
                {
                    "phase": p.phase,
                    "prediction": p.prediction,
                    "loss": p.loss,
                    **p.usage.to_json(),
                    **p.usage.counts_json(),
                }
                for p in sorted(
                    self.pairs.values(),
                    key=lambda p: (p.phase, p.usage.first or (0, 0), p.prediction, p.loss or ""),
                )
            ],
            "sample": self.sample_info,
            "files": files,
        }

    def write(
        self,
        log_dir: str | os.PathLike[str],
        weights: dict[str, np.ndarray],
        sample: dict[str, np.ndarray] | None,
        sample_metadata: dict[str, str] | None = None,
    ) -> Path:
        """Write the whole log directory as a complete log (see the module's
        docstring for the order of the writes). Raises OSError on failure."""
        writer = LogWriter(self, log_dir, lambda: weights)
        if sample is not None:
            writer.set_sample(sample, sample_metadata)
        writer.write(weights=True, state=COMPLETE)
        return Path(log_dir)

    @classmethod
    def load(cls, log_dir: str | os.PathLike[str], check_tensors: bool = True) -> TraceLog:
        """Read a log directory back. Any defect gives one LogError line.
        ``check_tensors=False``: the tensor files are checked against their
        sha256 when they are read (``weights()``, ``sample()``), not now; for
        a reader that needs only the graphs (emit writes a program from them,
        which reads the weights when it runs)."""
        path = Path(log_dir)
        trace = path / TRACE_FILE
        if not trace.is_file():
            raise LogError(f"{path} is not a tracelog log: {TRACE_FILE} not found")
        try:
            d = json.loads(trace.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LogError(f"{trace} is corrupt or truncated: {_one_line(e)}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise LogError(f"{trace} is not a tracelog log (no 'format': '{FORMAT}')")
        version = d.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise LogError(f"{trace} is corrupt: its format version is {version!r}")
        if version > FORMAT_VERSION:
            raise LogError(
                f"{trace} has format version {version}, newer than this tracelog reads "
                f"({FORMAT_VERSION}); upgrade tracelog"
            )
        files = _checked_files(trace, d.get("files"))
        try:
            log = cls._from_json(d, path)
        except LogError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LogError(f"{trace} is corrupt: {type(e).__name__} {_one_line(e)}") from None
        for name, expected in files.items():
            f = _tensor_file(path, name)
            if check_tensors:
                newer_ok = log.interrupted and name == WEIGHTS_FILE
                _check_bytes(f, f.read_bytes(), expected, newer_ok, log.run)
            else:
                log._unchecked[name] = expected
        log._dir = path
        return log

    @classmethod
    def _from_json(cls, d: dict[str, Any], path: Path) -> TraceLog:
        log = cls(d["framework"])
        log.model = dict(d.get("model", {}))
        run = d.get("run", {"state": COMPLETE})  # version 1: written only at close
        if not isinstance(run, dict):
            raise LogError(f"{path / TRACE_FILE} is corrupt: its 'run' is {type(run).__name__}")
        log.run = dict(run)
        graphs = d["graphs"]
        found = graphs.items() if isinstance(graphs, dict) else _graph_files(path, graphs)
        for h, g in found:
            graph = Graph.from_json(g)
            if graph.digest() != h:
                raise LogError(f"graph {h[:12]} does not match its hash: the log is corrupt")
            log.graphs[h] = graph
        for e in d["entries"]:
            if e["hash"] not in log.graphs:
                raise LogError(f"entry names unknown graph {e['hash'][:12]}: the log is corrupt")
            log.entries[(e["hash"], e["phase"])] = GraphEntry(
                e["hash"], e["kind"], e["phase"], Usage.from_json(e)
            )
        for p in d["pairs"]:
            log.pairs[(p["phase"], p["prediction"], p["loss"] or "")] = PairEntry(
                p["phase"], p["prediction"], p["loss"], Usage.from_json(p)
            )
        b = d["batches"]
        log.recorded, log.unrecorded = int(b["recorded"]), int(b["unrecorded"])
        log.failures = list(b["failures"])
        steps = b.get("optimizer_steps")  # absent before it was counted, and from Keras
        log.optimizer_steps = None if steps is None else int(steps)
        log.sample_info = d.get("sample")
        dist_facts = d.get("distributed")  # absent from single-process runs
        log.distributed = dict(dist_facts) if isinstance(dist_facts, dict) else None
        recording = d.get("recording")  # absent before the guarded fast path
        log.recording = dict(recording) if isinstance(recording, dict) else None
        return log


def _graph_files(path: Path, hashes: Any) -> list[tuple[str, Any]]:
    """Version 2: each graph read from graphs/<hash>.json."""
    if not isinstance(hashes, list):
        raise LogError(f"{path / TRACE_FILE} is corrupt: its 'graphs' is {type(hashes).__name__}")
    found = []
    for h in hashes:
        if not isinstance(h, str) or not _HASH.fullmatch(h):
            raise LogError(f"{path / TRACE_FILE} is corrupt: {h!r} is not a graph hash")
        f = path / GRAPHS_DIR / f"{h}.json"
        try:
            found.append((h, json.loads(f.read_text(encoding="utf-8"))))
        except FileNotFoundError:
            raise LogError(f"{path} is incomplete: {GRAPHS_DIR}/{h}.json is missing") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LogError(f"{f} is corrupt or truncated: {_one_line(e)}") from None
    return found


def _checked_files(trace: Path, files: Any) -> dict[str, str]:
    """trace.json's ``files``: a mapping of plain file names inside the log
    directory to sha256 digests; anything else is refused."""
    if not isinstance(files, dict):
        raise LogError(
            f"{trace} is corrupt: its 'files' is {type(files).__name__}, not a mapping of "
            "file names to sha256"
        )
    for name, digest in files.items():
        parts = Path(name).parts
        if (
            not name
            or os.path.isabs(name)
            or len(parts) != 1
            or parts[0] in (".", "..")
            or "\\" in name
            or "\0" in name
        ):
            raise LogError(
                f"{trace} is corrupt: 'files' names {name!r}, which is not a file in the "
                "log directory; refused"
            )
        if not isinstance(digest, str):
            raise LogError(f"{trace} is corrupt: the sha256 of {name!r} is {digest!r}")
    return files


def _tensor_file(path: Path, name: str) -> Path:
    """A tensor file trace.json names: a plain file in the log directory."""
    f = path / name
    if f.is_symlink() or not f.is_file():
        raise LogError(f"{path} is incomplete: {name} is missing")
    return f


def _check_bytes(f: Path, data: bytes, expected: str, newer_ok: bool, run: dict[str, Any]) -> None:
    if hashlib.sha256(data).hexdigest() == expected:
        return
    if newer_ok and run.get("id") and _whole_and_from(data, run["id"]):
        return  # weights written after the run's last checkpoint (see the module docstring)
    raise LogError(f"{f} is corrupt or truncated: its sha256 differs from {TRACE_FILE}")


def stored_dtypes(log_dir: str | os.PathLike[str]) -> set[str]:
    """The safetensors dtypes (``F32``, ``BF16``, ...) of the log's tensor
    files, read from their headers only; files missing or unreadable add none."""
    found: set[str] = set()
    for name in (WEIGHTS_FILE, SAMPLE_FILE):
        try:
            with open(Path(log_dir) / name, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            found.update(v["dtype"] for k, v in header.items() if k != "__metadata__")
        except (OSError, struct.error, ValueError, TypeError, KeyError, AttributeError):
            continue
    return found


def _whole_and_from(data: bytes, run_id: str) -> bool:
    """Is this safetensors file whole (its header's offsets reach its end) and
    written by the run ``run_id``?"""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        meta = header.get("__metadata__") or {}
    except (struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return 8 + n + max(ends, default=0) == len(data) and meta.get(RUN_KEY) == run_id


def load(log_dir: str | os.PathLike[str]) -> TraceLog:
    """Read a log directory written by a listener."""
    return TraceLog.load(log_dir)


def _contiguous(a: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (a loss) into shape (1,)
    return np.require(a, requirements="C")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


# -- writing as training goes ---------------------------------------------------------------------
# the default batch count between checkpoints, and the most of a run's time that
# checkpoints taken by that count may cost (a fast step: 200 batches of a 0.5 ms
# MLP step are 0.1 s, and a checkpoint costs 1-2 ms, its fsyncs most of it)
DEFAULT_EVERY_BATCHES = 200
DEFAULT_MAX_SHARE = 0.01


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a listener writes the counts (trace.json) between new graphs:
    after ``every_s`` seconds or ``every_batches`` batches, whichever comes
    first (checked at the end of each batch); ``weights`` rewrites the
    weights at every checkpoint too (else at new constants, close and the
    interrupted paths). ``every_batches=None``: every DEFAULT_EVERY_BATCHES
    batches, spaced so that those checkpoints cost at most DEFAULT_MAX_SHARE
    of the run's time (the last checkpoint's cost, measured); a number given
    is kept exactly."""

    every_s: float = 5.0
    every_batches: int | None = None
    weights: bool = False

    def __post_init__(self) -> None:
        given = self.every_batches
        if not self.every_s > 0 or (given is not None and given < 1):
            raise ValueError(
                "checkpoint_every_s must be > 0 and checkpoint_every_batches >= 1, got "
                f"{self.every_s!r} and {given!r}"
            )

    @property
    def batches(self) -> int:
        return DEFAULT_EVERY_BATCHES if self.every_batches is None else self.every_batches


class LogWriter:
    """Writes one run's log directory as it grows. ``write`` raises OSError
    (or a serialisation error); ``checkpoint`` catches, warns once per
    reason and returns False: training goes on."""

    def __init__(
        self,
        log: TraceLog,
        log_dir: str | os.PathLike[str],
        weights: Callable[[], dict[str, np.ndarray]],
        policy: CheckpointPolicy | None = None,
        model_facts: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.log = log
        self.model_facts = model_facts
        self.path = Path(log_dir)
        self.weights = weights
        self.policy = policy or CheckpointPolicy()
        self.run_id = secrets.token_hex(8)
        self.files: dict[str, str] = {}  # written tensor files and their sha256
        self._graphs_written: set[str] = set()
        self._constants_written: set[str] = set()
        self._sample: tuple[dict[str, np.ndarray], dict[str, str] | None] | None = None
        self._since = 0
        self._last = time.monotonic()
        self._cost = 0.0  # seconds the last write took
        self._warned: set[str] = set()
        self.last_checkpoint: str | None = None  # UTC time of the last trace.json written

    def set_sample(
        self, sample: dict[str, np.ndarray], metadata: dict[str, str] | None = None
    ) -> None:
        """The sample, written with the next write (and retried until it is)."""
        self._sample = (sample, metadata)

    def batch_done(self) -> bool:
        """A batch was counted: checkpoint if one is due, or a new graph or the
        sample waits to be written."""
        self._since += 1
        policy = self.policy
        elapsed = time.monotonic() - self._last
        given = policy.every_batches  # policy.batches, less a call: this runs every batch
        batches = DEFAULT_EVERY_BATCHES if given is None else given
        counted = self._since >= batches and (
            given is not None or elapsed * DEFAULT_MAX_SHARE >= self._cost
        )
        due = (
            counted
            or elapsed >= policy.every_s
            # graphs are only ever added, and written ones are the log's: a new
            # one shows in the count (no scan of the log's graphs every batch)
            or len(self._graphs_written) != len(self.log.graphs)
            or self._sample is not None
        )
        return self.checkpoint() if due else True

    def checkpoint(self, *, weights: bool = False, state: str = INTERRUPTED) -> bool:
        """Write what changed; on failure warn (once per reason) and go on."""
        try:
            self.write(weights=weights or self.policy.weights, state=state)
        except Exception as e:  # fail open: OSError, a dtype safetensors can't take, ...
            self.warn(e, state)
            return False
        return True

    def write(self, *, weights: bool, state: str) -> None:
        started = time.monotonic()
        try:
            self._write(weights=weights, state=state)
        finally:
            self._since, self._last = 0, time.monotonic()
            self._cost = self._last - started

    def _write(self, *, weights: bool, state: str) -> None:
        if self.model_facts is not None:
            self.log.model = self.model_facts()
        self.path.mkdir(parents=True, exist_ok=True)
        for h in sorted(set(self.log.graphs) - self._graphs_written):
            text = indented_json(self.log.graphs[h].to_json()) + "\n"
            _atomic_write(self.path / GRAPHS_DIR / f"{h}.json", text.encode())
            self._graphs_written.add(h)
        if self._sample is not None:
            self._write_sample(*self._sample)
        new_constants = not self._constants_written.issuperset(self.log.constants)
        if weights or new_constants or WEIGHTS_FILE not in self.files:
            self._write_weights(final=state == COMPLETE)
        at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        # a complete log names no run or time: a seeded run gives byte-identical files
        self.log.run = (
            {"state": state}
            if state == COMPLETE
            else {"state": state, "id": self.run_id, "checkpoint": at}
        )
        if SAMPLE_FILE not in self.files:
            self.log.sample_info = None  # taken but not on disk: not in this trace.json
        text = indented_json(self.log.to_json(dict(self.files))) + "\n"
        _atomic_write(self.path / TRACE_FILE, text.encode())
        self.last_checkpoint = at
        self.log._dir = self.path

    def _write_sample(self, sample: dict[str, np.ndarray], metadata: dict[str, str] | None) -> None:
        try:
            pieces = tensor_pieces(sample, metadata) or [encode_sample(sample, metadata)]
        except Exception as e:  # a dtype safetensors cannot take: no retry would help
            self._sample = None
            self.log.sample_info = None
            self._sample_lost(f"{type(e).__name__}: {_one_line(e)}")
            return
        # OSError: retried at the next write
        self.files[SAMPLE_FILE] = _hashed_write(self.path / SAMPLE_FILE, pieces)
        self._sample = None

    def _sample_lost(self, reason: str) -> None:
        logger.warning(
            "tracelog: the sample batch could not be stored (%s); the log at %s has no sample "
            "(emit works; check needs a sample)",
            reason,
            self.path,
        )

    def _write_weights(self, final: bool) -> None:
        tensors = {k: _contiguous(v) for k, v in self.weights().items()}
        constants = dict(self.log.constants)
        for digest, arr in constants.items():
            tensors[f"const/{digest}"] = _contiguous(arr)
        metadata = None if final else {RUN_KEY: self.run_id}
        pieces = tensor_pieces(tensors, metadata) or [encode_tensors(tensors, metadata)]
        self.files[WEIGHTS_FILE] = _hashed_write(self.path / WEIGHTS_FILE, pieces)
        self._constants_written.update(constants)

    def warn(self, e: BaseException, state: str) -> None:
        reason = f"{type(e).__name__}: {_one_line(e)}"
        if reason in self._warned:
            return
        self._warned.add(reason)
        kept = (
            f"the log there is as of its checkpoint at {self.last_checkpoint}"
            if self.last_checkpoint
            else "no log was written there"
        )
        what = "the final log (close)" if state == COMPLETE else "a checkpoint"
        logger.warning(
            "tracelog: could not write %s to %s (%s); %s; training goes on",
            what,
            self.path,
            reason,
            kept,
        )


def holds_log(log_dir: str | os.PathLike[str]) -> bool:
    """Does this directory hold a tracelog log (whole, interrupted or partial)?"""
    path = Path(log_dir)
    return any((path / n).exists() for n in (TRACE_FILE, GRAPHS_DIR, WEIGHTS_FILE, SAMPLE_FILE))


def claim_log_dir(log_dir: str | os.PathLike[str], overwrite: bool) -> None:
    """Before recording into ``log_dir``: refuse a directory that holds a log,
    or (``overwrite=True``) remove that log and every program emitted from it."""
    if not holds_log(log_dir):
        return
    if not overwrite:
        raise LogExistsError(
            f"{log_dir} already holds a tracelog log; pass overwrite=True to replace it "
            "(its emitted programs are removed too) or record into another directory"
        )
    remove_log(log_dir)


def remove_log(log_dir: str | os.PathLike[str]) -> None:
    """Remove a log's files and the programs emitted from it (trace.json first,
    so a half-removed directory is no log). Other files are left alone."""
    from tracelog.emit import targets

    path = Path(log_dir)
    names = [TRACE_FILE, WEIGHTS_FILE, SAMPLE_FILE]
    names += [targets.file_name(t) for t in targets.names()]
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (path / name).unlink()
    graphs = path / GRAPHS_DIR
    if graphs.is_dir():
        for f in graphs.iterdir():
            if _HASH.fullmatch(f.stem) or f.name.startswith("."):
                f.unlink()
        with contextlib.suppress(OSError):  # not empty: files that are not ours stay
            graphs.rmdir()
    for f in path.glob(".*.tmp*"):  # temp files of a run killed mid-write
        f.unlink()


def indented_json(obj: Any) -> str:
    """``json.dumps(obj, indent=1, sort_keys=True)``, the same text, in half
    the time: json's C encoder takes no indent, its Python one runs a
    generator per container (a 150 kB graph: 30 ms). Anything but plain
    dicts with str keys, lists, tuples, str, int, float, bool and None goes
    to json itself."""
    try:
        return _json_text(obj, "\n")
    except _NotPlain:
        return json.dumps(obj, indent=1, sort_keys=True)


class _NotPlain(Exception):
    pass


_INFINITIES = {float("inf"): "Infinity", float("-inf"): "-Infinity"}


def _json_text(o: Any, nl: str) -> str:
    kind = type(o)
    if kind is str:
        return _json_str(o)
    if kind is dict:
        if not o:
            return "{}"
        inner = nl + " "
        if any(type(k) is not str for k in o):
            raise _NotPlain  # json's own conversion of the keys, and its errors
        items = [_json_str(k) + ": " + _json_text(o[k], inner) for k in sorted(o)]
        return "{" + inner + ("," + inner).join(items) + nl + "}"
    if kind is list or kind is tuple:
        if not o:
            return "[]"
        inner = nl + " "
        return "[" + inner + ("," + inner).join([_json_text(v, inner) for v in o]) + nl + "]"
    if kind is int:
        return int.__repr__(o)
    if kind is bool:
        return "true" if o else "false"
    if o is None:
        return "null"
    if kind is float:
        return "NaN" if o != o else _INFINITIES.get(o) or float.__repr__(o)
    raise _NotPlain


# below this many bytes a file's sha256 is taken inline, not on a helper thread
_HASH_ALONE = 1 << 20


def _hashed_write(path: Path, pieces: list[bytes | memoryview]) -> str:
    """``_atomic_write(path, pieces)``; the sha256 of the bytes written. The
    hash of a large file is taken on a helper thread while this one writes
    and syncs it (both release the GIL: two cores, not one after the other)."""
    if sum(len(p) for p in pieces) < _HASH_ALONE:
        _atomic_write(path, pieces)
        return _sha256(pieces).hexdigest()
    found: list[Any] = []

    def digest() -> None:
        try:
            found.append(_sha256(pieces).hexdigest())
        except BaseException as e:  # raised where the write is, after it
            found.append(e)

    hashing = threading.Thread(target=digest, name="tracelog-sha256", daemon=True)
    hashing.start()
    try:
        _atomic_write(path, pieces)
    finally:
        hashing.join()
    if isinstance(found[0], BaseException):
        raise found[0]
    return str(found[0])


def _sha256(pieces: list[bytes | memoryview]) -> Any:
    h = hashlib.sha256()
    for p in pieces:
        h.update(p)
    return h


def _atomic_write(path: Path, data: bytes | list[bytes | memoryview]) -> None:
    """Replace ``path`` by ``data`` (bytes, or pieces written one after the
    other) all at once: a temp file in the same directory, fsync, rename,
    fsync of the directory. On any error the temp file is removed and the
    old file (if any) stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for piece in [data] if isinstance(data, bytes) else data:
                _fill(f, piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _fill(f: Any, data: bytes | memoryview) -> None:
    f.write(data)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a platform that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
