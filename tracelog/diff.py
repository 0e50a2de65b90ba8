"""A semantic diff of two logs: what changed in the model, not in the text.

Graphs are matched by kind and phase (in order of first use where a log has
several of one kind and phase; identical graphs pair first). Inside a pair of
graphs, nodes are matched by module path and position, never by value names:
the nodes are cut into runs of one module path, the runs aligned by path, and
the nodes of paired runs aligned by (op, attributes), so that one inserted
layer reads as one module added and not as every later node changed.

What is reported, per graph: modules added, removed or changed; in a changed
module, nodes added or removed, op, attribute, input (constants such as a
dropout rate, parameters read), output dtype and shape changes (symbolic dims
as they are, ``batch``). Per log: parameters and buffers added, removed, or
changed in shape, dtype or trainability. Usage counts are shown, and count as
differences only with ``counts=True``; the model class and framework are shown
only.

Pure functions over :class:`~tracelog.log.TraceLog`; nothing here imports a
framework. ``tracelog.diff(a, b)`` is :func:`diff`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracelog.errors import LogError
from tracelog.ir import Graph, Node, TensorType, Value
from tracelog.log import GraphEntry, TraceLog
from tracelog.ops import OPS

FORMAT = "tracelog-diff"
VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("diff.schema.json")

# Change.what: what differs
MODULE_TYPE = "module type"
NODE_ADDED = "node added"
NODE_REMOVED = "node removed"
OP = "op"
ATTR = "attr"
INPUT = "input"
DTYPE = "dtype"
SHAPE = "shape"
OUTPUT = "output"  # a graph output (role) added, removed, retyped
DATA_INPUT = "data input"  # a graph's data input added, removed, renamed, retyped
CHANGE_KINDS = (MODULE_TYPE, NODE_ADDED, NODE_REMOVED, OP, ATTR, INPUT, DTYPE, SHAPE)
IO_KINDS = (DATA_INPUT, OUTPUT)

ADDED, REMOVED, CHANGED, SAME = "added", "removed", "changed", "same"
_KIND_ORDER = {"prediction": 0, "loss": 1}
_PHASE_ORDER = {"train": 0, "eval": 1}
_MARK = {ADDED: "+", REMOVED: "-", CHANGED: "~"}


@dataclass(frozen=True)
class Change:
    """One difference. ``node`` is the node's position among its module's
    nodes in the graph (the new graph's; the old one's for a removed node),
    None where no node is meant; ``field`` names the part that changed
    (an attribute, ``input 1 (ratio)``, ``output 0``); old/new are JSON values."""

    what: str
    op: str = ""
    node: int | None = None
    field: str = ""
    old: Any = None
    new: Any = None

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "op": self.op,
            "node": self.node,
            "field": self.field,
            "old": _jsonable(self.old),
            "new": _jsonable(self.new),
        }


def _jsonable(v: Any) -> Any:
    """Strict JSON: a non-finite float (a constant's -inf) as its text, "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


@dataclass
class ModuleDiff:
    """The changes under one module path of one graph."""

    path: str
    status: str  # added | removed | changed
    old_type: str
    new_type: str
    changes: list[Change] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status,
            "old_type": self.old_type,
            "new_type": self.new_type,
            "changes": [c.to_json() for c in self.changes],
        }


@dataclass
class GraphDiff:
    """One graph of either log, paired by kind and phase (index: its place
    among the graphs of that kind and phase, in order of first use)."""

    kind: str
    phase: str
    index: int
    status: str  # same | changed | added | removed
    old_hash: str | None
    new_hash: str | None
    old_usage: dict[str, Any] | None
    new_usage: dict[str, Any] | None
    modules: list[ModuleDiff] = field(default_factory=list)
    io: list[Change] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.phase})" + (f" #{self.index + 1}" if self.index else "")

    @property
    def counts_changed(self) -> bool:
        if self.old_usage is None or self.new_usage is None:
            return False
        keys = ("batches", "epochs")
        return any(self.old_usage[k] != self.new_usage[k] for k in keys)

    def differences(self, counts: bool) -> int:
        if self.status in (ADDED, REMOVED):
            return 1
        n = len(self.io) + sum(len(m.changes) for m in self.modules)
        return n + int(counts and self.counts_changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "phase": self.phase,
            "index": self.index,
            "status": self.status,
            "old_hash": self.old_hash,
            "new_hash": self.new_hash,
            "old_usage": self.old_usage,
            "new_usage": self.new_usage,
            "counts_changed": self.counts_changed,
            "io": [c.to_json() for c in self.io],
            "modules": [m.to_json() for m in self.modules],
        }


@dataclass
class ParamDiff:
    """A parameter or buffer added, removed or changed (kind, dtype, shape,
    trainable); old/new as {"kind", "dtype", "shape", "trainable"}."""

    name: str
    module: str
    status: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": self.module,
            "status": self.status,
            "old": self.old,
            "new": self.new,
        }


@dataclass
class LogDiff:
    """The semantic diff of two logs. ``equal`` when nothing differs (usage
    counts only with ``counts``); ``info`` (model class, framework, batch
    totals) is shown and never a difference."""

    old: str
    new: str
    counts: bool
    graphs: list[GraphDiff]
    params: list[ParamDiff]
    info: list[Change]

    @property
    def differences(self) -> int:
        return sum(g.differences(self.counts) for g in self.graphs) + len(self.params)

    @property
    def equal(self) -> bool:
        return self.differences == 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict, valid against ``diff.schema.json`` (SCHEMA_FILE)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "old": self.old,
            "new": self.new,
            "equal": self.equal,
            "differences": self.differences,
            "counts_compared": self.counts,
            "graphs": [g.to_json() for g in self.graphs],
            "parameters": [p.to_json() for p in self.params],
            "info": [c.to_json() for c in self.info],
        }

    def to_text(self) -> str:
        """For a terminal."""
        return _text(self)

    def to_markdown(self) -> str:
        """To paste in a pull request (GitHub-flavoured markdown)."""
        return _markdown(self)


# -- the diff ---------------------------------------------------------------------


def diff(
    old: TraceLog | str | os.PathLike[str],
    new: TraceLog | str | os.PathLike[str],
    *,
    counts: bool = False,
) -> LogDiff:
    """The semantic diff of two logs (TraceLog objects or log directories).
    Raises tracelog.LogError for a directory that is not a readable log."""
    a, a_name = _load(old)
    b, b_name = _load(new)
    params = _diff_params(a, b)
    graphs = [_diff_pair(a, b, ea, eb, kind, phase, i) for kind, phase, i, ea, eb in _pairs(a, b)]
    return LogDiff(a_name, b_name, counts, graphs, params, _info(a, b))


def _load(log: TraceLog | str | os.PathLike[str]) -> tuple[TraceLog, str]:
    if isinstance(log, TraceLog):
        return log, str(log._dir) if log._dir is not None else "<log>"
    return TraceLog.load(log), os.fspath(log)


def _pairs(
    a: TraceLog, b: TraceLog
) -> list[tuple[str, str, int, GraphEntry | None, GraphEntry | None]]:
    """Entries of both logs paired by (kind, phase): identical graphs first,
    the rest in order of first use."""
    groups: dict[tuple[str, str], tuple[list[GraphEntry], list[GraphEntry]]] = {}
    for side, log in enumerate((a, b)):
        for e in log.entries_sorted():
            groups.setdefault((e.kind, e.phase), ([], []))[side].append(e)
    out: list[tuple[str, str, int, GraphEntry | None, GraphEntry | None]] = []
    order = sorted(groups, key=lambda k: (_PHASE_ORDER.get(k[1], 2), _KIND_ORDER.get(k[0], 2), k))
    for kind, phase in order:
        olds, news = groups[(kind, phase)]
        paired: list[tuple[GraphEntry | None, GraphEntry | None]] = []
        rest_new = list(news)
        rest_old: list[GraphEntry] = []
        for e in olds:
            same = next((n for n in rest_new if n.hash == e.hash), None)
            if same is None:
                rest_old.append(e)
            else:
                rest_new.remove(same)
                paired.append((e, same))
        for i in range(max(len(rest_old), len(rest_new))):
            paired.append(
                (
                    rest_old[i] if i < len(rest_old) else None,
                    rest_new[i] if i < len(rest_new) else None,
                )
            )
        paired.sort(key=lambda p: _pair_order(p, olds, news))
        out += [(kind, phase, i, ea, eb) for i, (ea, eb) in enumerate(paired)]
    return out


def _pair_order(
    p: tuple[GraphEntry | None, GraphEntry | None], olds: list[GraphEntry], news: list[GraphEntry]
) -> tuple[int, int]:
    """Old graphs in their order, then the graphs only the new log has."""
    if p[0] is not None:
        return (0, olds.index(p[0]))
    assert p[1] is not None
    return (1, news.index(p[1]))


def _diff_pair(
    a: TraceLog,
    b: TraceLog,
    ea: GraphEntry | None,
    eb: GraphEntry | None,
    kind: str,
    phase: str,
    index: int,
) -> GraphDiff:
    gd = GraphDiff(
        kind,
        phase,
        index,
        SAME,
        ea.hash if ea else None,
        eb.hash if eb else None,
        ea.usage.to_json() if ea else None,
        eb.usage.to_json() if eb else None,
    )
    if ea is None or eb is None:
        gd.status = ADDED if ea is None else REMOVED
        return gd
    if ea.hash != eb.hash:
        ga, gb = a.graphs[ea.hash], b.graphs[eb.hash]
        gd.io = _diff_io(ga, gb)
        gd.modules = GraphMatcher(ga, gb).modules()
        gd.status = CHANGED if gd.io or gd.modules else SAME
    return gd


# -- inside a pair of graphs --------------------------------------------------------


def _segments(g: Graph) -> list[tuple[str, list[int]]]:
    """Runs of consecutive nodes under one module path: (path, node indices)."""
    runs: list[tuple[str, list[int]]] = []
    for i, n in enumerate(g.nodes):
        if runs and runs[-1][0] == n.module:
            runs[-1][1].append(i)
        else:
            runs.append((n.module, [i]))
    return runs


def _positions(g: Graph) -> list[int]:
    """Each node's position among the nodes of its module path."""
    seen: dict[str, int] = {}
    out = []
    for n in g.nodes:
        out.append(seen.get(n.module, 0))
        seen[n.module] = out[-1] + 1
    return out


def _attr_sig(n: Node) -> str:
    return json.dumps(n.attrs, sort_keys=True)


def _matcher(a: Sequence[Any], b: Sequence[Any]) -> difflib.SequenceMatcher[Any]:
    return difflib.SequenceMatcher(None, a, b, autojunk=False)


class GraphMatcher:
    """Aligns two graphs' nodes by module path and position, and lists what
    differs, grouped by module path."""

    def __init__(self, old: Graph, new: Graph) -> None:
        self.old, self.new = old, new
        self.pos_old, self.pos_new = _positions(old), _positions(new)
        self.by_module: dict[str, list[Change]] = {}

    def modules(self) -> list[ModuleDiff]:
        sa, sb = _segments(self.old), _segments(self.new)
        ops = _matcher([p for p, _ in sa], [p for p, _ in sb]).get_opcodes()
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                for (path, na), (_, nb) in zip(sa[i1:i2], sb[j1:j2], strict=True):
                    self._align(path, na, nb)
                continue
            for _, na in sa[i1:i2]:
                for i in na:
                    self._removed(i)
            for _, nb in sb[j1:j2]:
                for j in nb:
                    self._added(j)
        return self._grouped()

    def _align(self, path: str, na: list[int], nb: list[int], attrs: bool = True) -> None:
        """Nodes of one module's paired runs, aligned by (op, attributes); what
        differs there is aligned again by op alone (a node whose attributes
        changed pairs with its old self), and what still differs pairs node
        by node, the longer side's rest added or removed."""

        def key(g: Graph, i: int) -> tuple[str, str]:
            return (g.nodes[i].qualified_op, _attr_sig(g.nodes[i]) if attrs else "")

        ka, kb = [key(self.old, i) for i in na], [key(self.new, j) for j in nb]
        for tag, i1, i2, j1, j2 in _matcher(ka, kb).get_opcodes():
            if tag == "replace" and attrs:
                self._align(path, na[i1:i2], nb[j1:j2], attrs=False)
                continue
            pairs = list(zip(na[i1:i2], nb[j1:j2], strict=False))
            for i, j in pairs:
                self._compare(path, i, j)
            for i in na[i1 + len(pairs) : i2]:
                self._removed(i)
            for j in nb[j1 + len(pairs) : j2]:
                self._added(j)

    def _note(self, path: str, change: Change) -> None:
        self.by_module.setdefault(path, []).append(change)

    def _removed(self, i: int) -> None:
        n = self.old.nodes[i]
        sig = _node_sig(n, self.old)
        self._note(n.module, Change(NODE_REMOVED, n.qualified_op, self.pos_old[i], "", sig, None))

    def _added(self, j: int) -> None:
        n = self.new.nodes[j]
        sig = _node_sig(n, self.new)
        self._note(n.module, Change(NODE_ADDED, n.qualified_op, self.pos_new[j], "", None, sig))

    def _compare(self, path: str, i: int, j: int) -> None:
        a, b = self.old.nodes[i], self.new.nodes[j]
        at = self.pos_new[j]
        op = b.qualified_op
        if a.qualified_op != b.qualified_op:
            self._note(path, Change(OP, op, at, "", _op_sig(a), _op_sig(b)))
        else:
            for key in sorted(set(a.attrs) | set(b.attrs)):
                va, vb = a.attrs.get(key), b.attrs.get(key)
                if va != vb:
                    self._note(path, Change(ATTR, op, at, key, va, vb))
        for k in range(max(len(a.inputs), len(b.inputs))):
            da = _source(self.old, a.inputs[k]) if k < len(a.inputs) else None
            db = _source(self.new, b.inputs[k]) if k < len(b.inputs) else None
            if da != db:
                self._note(path, Change(INPUT, op, at, _input_name(b, k), da, db))
        for k in range(max(len(a.outputs), len(b.outputs))):
            ta = _type(self.old, a.outputs[k]) if k < len(a.outputs) else None
            tb = _type(self.new, b.outputs[k]) if k < len(b.outputs) else None
            where = f"output {k}"
            if ta is None or tb is None:
                if ta != tb:
                    self._note(path, Change(SHAPE, op, at, where, _type_json(ta), _type_json(tb)))
                continue
            if ta.dtype != tb.dtype:
                self._note(path, Change(DTYPE, op, at, where, ta.dtype, tb.dtype))
            if ta.shape != tb.shape:
                self._note(path, Change(SHAPE, op, at, where, list(ta.shape), list(tb.shape)))

    def _grouped(self) -> list[ModuleDiff]:
        types_old = _module_types(self.old)
        types_new = _module_types(self.new)
        out = []
        for path in self._module_order():
            changes = self.by_module.get(path, [])
            ta, tb = types_old.get(path), types_new.get(path)
            if ta is not None and tb is not None and ta != tb:
                changes.insert(0, Change(MODULE_TYPE, "", None, "", ta, tb))
            if not changes:
                continue
            status = ADDED if ta is None else REMOVED if tb is None else CHANGED
            out.append(ModuleDiff(path, status, ta or "", tb or "", changes))
        return out

    def _module_order(self) -> list[str]:
        """Module paths in order of first appearance: the new graph's, then
        the paths only the old graph has."""
        order = dict.fromkeys(n.module for n in self.new.nodes)
        order.update(dict.fromkeys(n.module for n in self.old.nodes))
        return list(order)


def _module_types(g: Graph) -> dict[str, str]:
    types: dict[str, str] = {}
    for n in g.nodes:
        types.setdefault(n.module, n.module_type)
    return types


def _type(g: Graph, name: str) -> TensorType | None:
    v = g.values.get(name)
    return v.type if v is not None else None


def _type_json(t: TensorType | None) -> Any:
    return None if t is None else str(t)


def _source(g: Graph, name: str) -> Any:
    """What an input reads, as far as a diff compares it: a parameter or
    buffer by name, a data input by name, a constant by value (small) or
    digest, nothing for a node's value (its producer is compared itself)."""
    if not name:
        return None
    v = g.values.get(name)
    if v is None or v.kind == "node":
        return "(computed)"
    if v.kind == "const":
        c = v.const
        if c is not None and c.digest is None:
            return c.data
        return f"constant {c.digest[:12] if c and c.digest else '?'} {v.type}"
    return f"{v.kind} {v.name}"


def _input_name(n: Node, k: int) -> str:
    schema = OPS.get((n.domain, n.op))
    if schema is None or not schema.inputs:
        return f"input {k}"
    names = schema.inputs
    name = names[min(k, len(names) - 1)].rstrip("?*")
    return f"input {k} ({name})"


def _op_sig(n: Node) -> str:
    attrs = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(n.attrs.items()))
    return f"{n.qualified_op}({attrs})" if attrs else n.qualified_op


def _node_sig(n: Node, g: Graph) -> str:
    types = [str(t) for t in (_type(g, o) for o in n.outputs if o) if t is not None]
    return f"{_op_sig(n)} -> {', '.join(types)}" if types else _op_sig(n)


def _diff_io(a: Graph, b: Graph) -> list[Change]:
    """Data inputs by position, outputs by role."""
    out = []
    ia, ib = a.inputs, b.inputs
    for k in range(max(len(ia), len(ib))):
        va = _value_sig(ia[k]) if k < len(ia) else None
        vb = _value_sig(ib[k]) if k < len(ib) else None
        if va != vb:
            out.append(Change(DATA_INPUT, "", None, f"input {k}", va, vb))
    oa = {o.role: _type_json(_type(a, o.name)) for o in a.outputs}
    ob = {o.role: _type_json(_type(b, o.name)) for o in b.outputs}
    for role in list(dict.fromkeys([*oa, *ob])):
        if oa.get(role) != ob.get(role):
            out.append(Change(OUTPUT, "", None, role, oa.get(role), ob.get(role)))
    return out


def _value_sig(v: Value) -> str:
    return f"{v.name}: {v.type}"


# -- parameters and facts --------------------------------------------------------------


def _params(log: TraceLog) -> dict[str, tuple[dict[str, Any], str]]:
    """Each parameter and buffer of the log's graphs: its facts and the module
    path of the first node reading it (else the name up to its last dot)."""
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for e in log.entries_sorted():
        g = log.graphs[e.hash]
        readers: dict[str, str] = {}
        for n in g.nodes:
            for i in n.inputs:
                readers.setdefault(i, n.module)
        for v in g.values.values():
            if v.kind in ("param", "buffer") and v.name not in found:
                facts = {
                    "kind": v.kind,
                    "dtype": v.type.dtype,
                    "shape": list(v.type.shape),
                    "trainable": v.trainable,
                }
                found[v.name] = (facts, readers.get(v.name, v.name.rpartition(".")[0]))
    return found


def _diff_params(a: TraceLog, b: TraceLog) -> list[ParamDiff]:
    pa, pb = _params(a), _params(b)
    out = []
    for name in dict.fromkeys([*pb, *pa]):
        fa, ma = pa.get(name, (None, ""))
        fb, mb = pb.get(name, (None, ""))
        if fa == fb:
            continue
        status = ADDED if fa is None else REMOVED if fb is None else CHANGED
        out.append(ParamDiff(name, mb or ma, status, fa, fb))
    return out


def _info(a: TraceLog, b: TraceLog) -> list[Change]:
    facts = [
        ("model", a.model.get("class"), b.model.get("class")),
        ("framework", _framework(a), _framework(b)),
        ("batches recorded", a.recorded, b.recorded),
        ("batches unrecorded", a.unrecorded, b.unrecorded),
    ]
    return [Change("info", "", None, f, x, y) for f, x, y in facts if x != y]


def _framework(log: TraceLog) -> str:
    fw = log.framework
    return f"{fw.get('name', '?')} {fw.get('version', '')}".strip()


# -- snapshots: a log's graphs and counts in one file (no tensors) ----------------------


def snapshot(log: TraceLog | str | os.PathLike[str]) -> str:
    """A log's graphs, entries and counts as one JSON text (the version 1
    trace.json layout, graphs inline, no tensors, nothing that varies from run
    to run: no run id, times, framework version or sample). Deterministic, so
    it can be kept as a golden file; :func:`load_snapshot` reads it back."""
    trace, _ = _load(log)
    d = trace.to_json({})
    d["version"] = 1
    d["graphs"] = {h: trace.graphs[h].to_json() for h in sorted(trace.graphs)}
    d["run"] = {"state": "complete"}
    d["framework"] = {"name": trace.framework.get("name", "?")}
    d["sample"] = None
    d["batches"]["failures"] = []
    return json.dumps(d, indent=1, sort_keys=True) + "\n"


def load_snapshot(text: str, where: str = "<snapshot>") -> TraceLog:
    """A TraceLog (graphs and counts, no tensors) from :func:`snapshot`'s text."""
    try:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != "tracelog":
            raise ValueError("not a tracelog snapshot")
        return TraceLog._from_json(d, Path(where))
    except LogError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise LogError(f"{where} is not a readable tracelog snapshot: {e}") from None


# -- rendering ---------------------------------------------------------------------


def _fmt(v: Any) -> str:
    """A JSON value for people: floats to 6 significant digits (a float32
    dropout rate of 0.1 reads 0.1), shapes as [batch, 8]."""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def _tensor(facts: dict[str, Any] | None) -> str:
    if facts is None:
        return "none"
    text = f"{facts['dtype']}{_fmt(facts['shape'])}"
    if facts["kind"] == "buffer":
        text += " (buffer)"
    elif not facts["trainable"]:
        text += " (frozen)"
    return text


def _change_line(c: Change) -> str:
    """One change, without its module."""
    at = f"node {c.node} {c.op}: " if c.node is not None else ""
    if c.what == NODE_ADDED:
        return f"{at}added {c.new}"
    if c.what == NODE_REMOVED:
        return f"{at}removed {c.old}"
    if c.what == MODULE_TYPE:
        return f"module type {c.old} -> {c.new}"
    if c.what == OP:
        return f"{at}op {c.old} -> {c.new}"
    if c.what == ATTR:
        return f"{at}attribute {c.field} {_fmt(c.old)} -> {_fmt(c.new)}"
    if c.what == INPUT:
        return f"{at}{c.field} {_fmt(c.old)} -> {_fmt(c.new)}"
    if c.what in (DTYPE, SHAPE):
        return f"{at}{c.field} {c.what} {_fmt(c.old)} -> {_fmt(c.new)}"
    return f"{c.what} {c.field}: {_fmt(c.old)} -> {_fmt(c.new)}"


def _module_label(m: ModuleDiff) -> str:
    path = m.path or "<root>"
    if m.old_type and m.new_type and m.old_type != m.new_type:
        return f"{path} ({m.old_type} -> {m.new_type})"
    t = m.new_type or m.old_type
    return f"{path} ({t})" if t else path


def _usage(u: dict[str, Any] | None) -> str:
    if u is None:
        return "none"
    n = u["batches"]
    epochs = u["epochs"]
    span = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {_fmt(epochs)}"
    return f"{n} batch{'es' if n != 1 else ''}, {span}" if epochs else f"{n} batches"


def _summary(d: LogDiff) -> str:
    n = d.differences
    if n == 0:
        return "no differences"
    return f"{n} difference{'s' if n != 1 else ''}"


def _text(d: LogDiff) -> str:
    lines = [f"{d.old} -> {d.new}: {_summary(d)}"]
    same = []
    for g in d.graphs:
        if g.status == SAME and not g.counts_changed:
            same.append(g.label)
            continue
        h = f"{(g.old_hash or '-')[:12]} -> {(g.new_hash or '-')[:12]}"
        lines.append(f"{g.label}: {g.status}  {h}")
        for c in g.io:
            lines.append(f"  ~ {_change_line(c)}")
        for m in g.modules:
            lines.append(f"  {_MARK[m.status]} {_module_label(m)}")
            lines += [f"      {_change_line(c)}" for c in m.changes]
        if g.counts_changed:
            note = "" if d.counts else " (shown; --counts compares counts)"
            lines.append(f"  usage: {_usage(g.old_usage)} -> {_usage(g.new_usage)}{note}")
    if same:
        lines.append("unchanged: " + ", ".join(same))
    if d.params:
        lines.append("parameters:")
        for p in d.params:
            change = _tensor(p.new if p.status == ADDED else p.old)
            if p.status == CHANGED:
                change += f" -> {_tensor(p.new)}"
            lines.append(f"  {_MARK[p.status]} {p.name}  {change}")
    for c in d.info:
        lines.append(f"note: {c.field} {_fmt(c.old)} -> {_fmt(c.new)} (not a difference)")
    return "\n".join(lines)


def _md(text: Any) -> str:
    """Text from a log inside a markdown table cell: as code, with the
    characters that could end the span, the cell or the row made harmless."""
    s = _fmt(text).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    ticks = "``" if "`" in s else "`"
    return f"{ticks} {s} {ticks}" if ticks == "``" else f"`{s}`"


def _md_module(m: ModuleDiff) -> str:
    label = _md(m.path or "<root>")
    if m.old_type and m.new_type and m.old_type != m.new_type:
        return f"{label} ({_md(m.old_type)} → {_md(m.new_type)})"
    t = m.new_type or m.old_type
    return f"{label} ({_md(t)})" if t else label


def _md_change(c: Change) -> str:
    at = f"node {c.node} {_md(c.op)}: " if c.node is not None else ""
    if c.what == NODE_ADDED:
        return f"{at}added {_md(c.new)}"
    if c.what == NODE_REMOVED:
        return f"{at}removed {_md(c.old)}"
    if c.what == MODULE_TYPE:
        return f"module type {_md(c.old)} → {_md(c.new)}"
    what = {OP: "op", ATTR: f"attribute {_md(c.field)}"}.get(c.what, _md(c.field) + f" {c.what}")
    if c.what == INPUT:
        what = _md(c.field)
    return f"{at}{what} {_md(c.old)} → {_md(c.new)}"


def _markdown(d: LogDiff) -> str:
    lines = [f"### tracelog diff: {_summary(d)}", "", f"{_md(d.old)} → {_md(d.new)}", ""]
    same = []
    for g in d.graphs:
        if g.status == SAME and not g.counts_changed:
            same.append(g.label)
            continue
        h = f"{_md((g.old_hash or '-')[:12])} → {_md((g.new_hash or '-')[:12])}"
        lines += [f"**{g.label}**: {g.status} ({h})", ""]
        rows = [(" ", "(graph)", _md_change(c)) for c in g.io]
        for m in g.modules:
            rows += [(_MARK[m.status], _md_module(m), _md_change(c)) for c in m.changes]
        if rows:
            lines += ["| | module | change |", "|---|---|---|"]
            lines += [f"| {mark} | {mod} | {ch} |" for mark, mod, ch in rows]
            lines.append("")
        if g.counts_changed:
            note = "" if d.counts else " (shown; not compared without `--counts`)"
            lines += [f"usage: {_usage(g.old_usage)} → {_usage(g.new_usage)}{note}", ""]
    if same:
        lines += ["unchanged: " + ", ".join(same), ""]
    if d.params:
        lines += ["**parameters**", "", "| | name | old | new |", "|---|---|---|---|"]
        for p in d.params:
            old = _md(_tensor(p.old)) if p.old else ""
            new = _md(_tensor(p.new)) if p.new else ""
            lines.append(f"| {_MARK[p.status]} | {_md(p.name)} | {old} | {new} |")
        lines.append("")
    for c in d.info:
        lines.append(f"note: {c.field} {_md(c.old)} → {_md(c.new)} (not a difference)  ")
    return "\n".join(lines).rstrip() + "\n"


def dumps(d: LogDiff, fmt: str) -> str:
    """The diff in one of FORMATS."""
    if fmt == "json":
        return json.dumps(d.to_json(), indent=1, sort_keys=True, allow_nan=False)
    if fmt == "markdown":
        return d.to_markdown().rstrip("\n")
    return d.to_text()


FORMATS = ("text", "markdown", "json")


def unified(old: str, new: str, old_name: str, new_name: str) -> str:
    """A unified diff of two texts (programs), for failure messages."""
    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), old_name, new_name)
    )


class _CallableModule(types.ModuleType):
    """``tracelog.diff(a, b)`` is the public API and ``tracelog.diff`` this
    module (as with ``tracelog.emit``): the module itself is the callable."""

    def __call__(
        self,
        old: TraceLog | str | os.PathLike[str],
        new: TraceLog | str | os.PathLike[str],
        *,
        counts: bool = False,
    ) -> LogDiff:
        return diff(old, new, counts=counts)


sys.modules[__name__].__class__ = _CallableModule
