"""TraceLog: unique graphs with usage counts, and the log directory on disk.

A log directory holds
- trace.json: format version, framework facts, the unique graphs in canonical
  form, their usage counts, and the sha256 of the two tensor files;
- weights.safetensors: final parameters and buffers (and large constants);
- sample.safetensors: one recorded training batch (inputs, targets, dropout
  masks, outputs, loss, parameter gradients, parameters and buffers of that
  moment, and the buffers after it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracelog.errors import LogError
from tracelog.ir import Graph
from tracelog.sample import SAMPLE_FILE, SampleInfo, decode_sample, encode_sample

FORMAT = "tracelog"
FORMAT_VERSION = 1
TRACE_FILE = "trace.json"
WEIGHTS_FILE = "weights.safetensors"
MAX_FAILURE_DETAILS = 20

Position = tuple[int, int]  # (epoch, batch index within the epoch and phase)


@dataclass
class Usage:
    batches: int = 0
    epochs: list[int] = field(default_factory=list)
    first: Position | None = None
    last: Position | None = None

    def add(self, epoch: int, batch: int) -> None:
        self.batches += 1
        if not self.epochs or self.epochs[-1] != epoch:
            if epoch not in self.epochs:
                self.epochs.append(epoch)
                self.epochs.sort()
        if self.first is None:
            self.first = (epoch, batch)
        self.last = (epoch, batch)

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
        return cls(int(d["batches"]), [int(e) for e in d["epochs"]], first, last)


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
        self.failures: list[dict[str, Any]] = []
        self.sample_info: SampleInfo | None = None
        self.constants: dict[str, np.ndarray] = {}
        self._dir: Path | None = None

    # -- building ---------------------------------------------------------------
    def add_graph(self, graph: Graph) -> str:
        """Store a graph once, in canonical form; return its hash."""
        canon = graph.canonical()
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
    ) -> None:
        for h in (prediction, loss):
            if h is None:
                continue
            key = (h, phase)
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = GraphEntry(h, self.graphs[h].kind, phase)
            entry.usage.add(epoch, batch)
        pkey = (phase, prediction, loss or "")
        pair = self.pairs.get(pkey)
        if pair is None:
            pair = self.pairs[pkey] = PairEntry(phase, prediction, loss)
        pair.usage.add(epoch, batch)
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
        return self._load_tensors(WEIGHTS_FILE, _decode_tensors)

    def sample(self) -> dict[str, np.ndarray]:
        return self._load_tensors(SAMPLE_FILE, decode_sample)

    def _load_tensors(
        self, name: str, decode: Callable[[bytes], dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        if self._dir is None:
            raise LogError("this log has not been written or loaded from disk")
        path = self._dir / name
        try:
            return decode(path.read_bytes())
        except Exception as e:  # OSError, or safetensors' own error type
            raise LogError(f"{path}: cannot read tensors ({_one_line(e)})") from None

    # -- serialisation ------------------------------------------------------------
    def to_json(self, files: dict[str, str]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "framework": self.framework,
            "model": self.model,
            "batches": {
                "recorded": self.recorded,
                "unrecorded": self.unrecorded,
                "failures": self.failures,
            },
            "graphs": {h: self.graphs[h].to_json() for h in sorted(self.graphs)},
            "entries": [
                {"hash": e.hash, "kind": e.kind, "phase": e.phase, **e.usage.to_json()}
                for e in self.entries_sorted()
            ],
            "pairs": [
                {"phase": p.phase, "prediction": p.prediction, "loss": p.loss, **p.usage.to_json()}
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
        """Write the log directory. Each file is replaced atomically, trace.json
        last, and trace.json carries the sha256 of the others, so a reader never
        takes a half-written directory for a whole one."""
        from safetensors.numpy import save

        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: _contiguous(v) for k, v in weights.items()}
        for digest, arr in self.constants.items():
            tensors[f"const/{digest}"] = _contiguous(arr)
        blobs = {WEIGHTS_FILE: save(tensors)}
        if sample is not None:
            blobs[SAMPLE_FILE] = encode_sample(sample, sample_metadata)
        files = {}
        for name, blob in blobs.items():
            _atomic_write(path / name, blob)
            files[name] = hashlib.sha256(blob).hexdigest()
        text = json.dumps(self.to_json(files), indent=1, sort_keys=True) + "\n"
        _atomic_write(path / TRACE_FILE, text.encode())
        self._dir = path
        return path

    @classmethod
    def load(cls, log_dir: str | os.PathLike[str]) -> TraceLog:
        """Read a log directory back. Any defect gives one LogError line."""
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
        if not isinstance(version, int):
            raise LogError(f"{trace} is corrupt: its format version is {version!r}")
        if version > FORMAT_VERSION:
            raise LogError(
                f"{trace} has format version {version}, newer than this tracelog reads "
                f"({FORMAT_VERSION}); upgrade tracelog"
            )
        try:
            log = cls._from_json(d)
        except LogError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LogError(f"{trace} is corrupt: {type(e).__name__} {_one_line(e)}") from None
        for name, expected in d["files"].items():
            f = path / name
            if not f.is_file():
                raise LogError(f"{path} is incomplete: {name} is missing")
            if hashlib.sha256(f.read_bytes()).hexdigest() != expected:
                raise LogError(f"{f} is corrupt or truncated: its sha256 differs from {TRACE_FILE}")
        log._dir = path
        return log

    @classmethod
    def _from_json(cls, d: dict[str, Any]) -> TraceLog:
        log = cls(d["framework"])
        log.model = dict(d.get("model", {}))
        for h, g in d["graphs"].items():
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
        log.sample_info = d.get("sample")
        return log


def load(log_dir: str | os.PathLike[str]) -> TraceLog:
    """Read a log directory written by a listener."""
    return TraceLog.load(log_dir)


def _decode_tensors(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return dict(load(data))


def _contiguous(a: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (a loss) into shape (1,)
    return np.require(a, requirements="C")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]
