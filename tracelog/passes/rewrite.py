"""A small pattern-rewrite driver over IR graphs (after tinygrad's
``PatternMatcher``/``graph_rewrite``; STYLE.md section 6).

A pass is a list of ``(pattern, rule)`` pairs, indexed by the root pattern's
op. A pattern is a small tree: the root node's op, attribute conditions, and
for each input either a variable (binds the value name), ``None`` (anything)
or another pattern (the input's producer must match it). A rule gets the
``Match`` and returns the nodes that replace the root, or None when it does
not apply. The driver runs the rules to a fixed point and

- gives every replacement node the root's ``module``, ``module_type`` and
  ``source`` (provenance stays with the source op that made the root);
- keeps the root's output names wherever they are still read, so graph
  outputs and later consumers are untouched;
- removes matched inner nodes that nothing reads any more.

A rule for a fusion with several results (batch norm: the output and the
running-statistics updates) reads past its pattern with ``Match.producer`` and
``Match.readers``, names the extra nodes it folds with ``Match.absorb``, and
may give its replacement outputs that an absorbed node produced: that node
goes, and the replacement takes its place for every reader.

An inner pattern matches only a node whose outputs have no other reader
(single use), so a rewrite never folds away a node another reader needs; ``shared=True``
lets a pattern read through a node that others also read (it then stays).

    GEMM = Rewrites([
        # MatMul(a, Transpose(w, [1, 0])) -> Gemm(a, w, transB=1)
        (P("MatMul", "a", P("Transpose", "w", perm=[1, 0], shared=True)),
         lambda m: [m.node_as("Gemm", [m["a"], m["w"]], transB=1)]),
    ])
    graph, report = rewrite(graph, GEMM)
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

import numpy as np

from tracelog.ir import ConstData, Graph, Node, TensorType, Value, _norm_attr


class P:
    """A node pattern. ``P("Gemm", "a", P("Transpose", "w"), ...)``: a Gemm whose
    first input binds ``a`` and whose second is a Transpose of ``w``; a trailing
    ``...`` allows further inputs (the rule reads them from the root)."""

    def __init__(
        self,
        op: str | tuple[str, ...],
        *src: P | str | EllipsisType | None,
        domain: str = "",
        name: str | None = None,
        where: Callable[[Node], bool] | None = None,
        shared: bool = False,
        out: int = 0,
        **attrs: Any,
    ) -> None:
        self.ops = (op,) if isinstance(op, str) else tuple(op)
        self.open = bool(src) and src[-1] is Ellipsis  # more inputs allowed
        self.src: tuple[P | str | None, ...] = tuple(s for s in src if s is not Ellipsis)
        self.domain = domain
        self.name = name  # binds the matched node: Match.nodes[name]
        self.where = where  # a predicate on the node
        self.shared = shared  # an inner node may have other readers
        self.out = out  # which output of this node the parent reads
        self.attrs = {k: _norm_attr(v) for k, v in attrs.items()}  # required values

    def keys(self) -> list[tuple[str, str]]:
        return [(self.domain, op) for op in self.ops]

    def __repr__(self) -> str:
        return f"P({'|'.join(self.ops)}, {', '.join(map(repr, self.src))})"


Rule = Callable[["Match"], Sequence[Node] | None]


class Rewrites:
    """An ordered list of (pattern, rule); ``a + b`` tries a's rules first."""

    def __init__(self, rules: Iterable[tuple[P, Rule]] = ()) -> None:
        self.rules = list(rules)
        self.pdict: dict[tuple[str, str], list[tuple[P, Rule]]] = {}
        for pat, fn in self.rules:
            for key in pat.keys():
                self.pdict.setdefault(key, []).append((pat, fn))

    def __add__(self, other: Rewrites) -> Rewrites:
        return Rewrites(self.rules + other.rules)

    def __len__(self) -> int:
        return len(self.rules)


@dataclass
class RewriteReport:
    fired: Counter[str] = field(default_factory=Counter)  # rule name -> times
    # (root, replacement nodes) per firing, in order: callers that keep per-node
    # facts outside the graph (the Builder's regions) carry them over
    replaced: list[tuple[Node, list[Node]]] = field(default_factory=list)

    def summary(self) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(self.fired.items())) or "no rewrites"


class Match:
    """What a rule sees: the root, bound values and nodes, and ways to make
    new values in the graph."""

    def __init__(
        self,
        graph: Graph,
        root: Node,
        producer: dict[str, Node] | None = None,
        uses: Counter[str] | None = None,
    ) -> None:
        self.graph = graph
        self.root = root
        self._uses = uses
        self.vars: dict[str, str] = {}
        self.nodes: dict[str, Node] = {}
        self.inner: list[Node] = []  # matched nodes below the root, for dead-code removal
        self.absorbed: list[Node] = []  # nodes outside the pattern the rule folds (absorb)
        self._producer = producer

    def __getitem__(self, var: str) -> str:
        return self.vars[var]

    def type(self, value: str) -> TensorType:
        return self.graph.values[value].type

    def fresh(self, ty: TensorType, base: str = "rw") -> str:
        """A new node value of type ty."""
        for k in itertools.count(len(self.graph.values)):
            name = f"{base}{k}"
            if name not in self.graph.values:
                self.graph.values[name] = Value(name, ty, "node")
                return name
        raise AssertionError("unreachable")

    def const(self, data: list[Any], dtype: str, base: str = "rwk") -> str:
        """A new small constant (a list, inline in the log)."""
        name = self.fresh(TensorType(dtype, (len(data),)), base)
        value = self.graph.values[name]
        value.kind, value.const = "const", ConstData(data=list(data))
        return name

    def ints(self, value: str) -> list[int] | None:
        """A constant input's values as ints; None where it is computed."""
        v = self.graph.values.get(value)
        if v is None or v.kind != "const" or v.const is None or v.const.data is None:
            return None
        # inline data nests as the constant's shape does ([[0, 1], [2, 3]])
        return [int(x) for x in np.asarray(v.const.data).reshape(-1).tolist()]

    def floats(self, value: str) -> list[float] | None:
        """A constant input's values as floats; None where it is computed."""
        v = self.graph.values.get(value)
        if v is None or v.kind != "const" or v.const is None or v.const.data is None:
            return None
        return [float(x) for x in np.asarray(v.const.data, dtype=np.float64).reshape(-1).tolist()]

    def producer(self, value: str) -> Node | None:
        """The node that computes ``value``; None for inputs, parameters, constants."""
        if self._producer is None:
            self._producer = {o: n for n in self.graph.nodes for o in n.outputs if o}
        return self._producer.get(value)

    def readers(self, value: str) -> list[Node]:
        """The nodes that read ``value``, in graph order."""
        return [n for n in self.graph.nodes if value in n.inputs]

    def uses(self, value: str) -> int:
        """How often ``value`` is read (by node inputs and as a graph output)."""
        if self._uses is None:
            self._uses = _readers(self.graph)
        return self._uses[value]

    def is_output(self, value: str) -> bool:
        return any(o.name == value for o in self.graph.outputs)

    def absorb(self, *nodes: Node) -> None:
        """Nodes outside the pattern that the replacement folds: they go where
        nothing reads them afterwards, or where the replacement defines their outputs."""
        self.absorbed.extend(nodes)

    def read_before_root(self, value: str) -> bool:
        """Whether a node before the root reads ``value`` (a replacement that
        redefines it, placed at the root, would come too late)."""
        for n in self.graph.nodes:
            if n is self.root:
                return False
            if value in n.inputs:
                return True
        return False

    def node_as(
        self,
        op: str,
        inputs: Sequence[str],
        attrs: Mapping[str, Any] | None = None,
        *,
        domain: str = "",
        **more: Any,
    ) -> Node:
        """A node with the root's outputs (the usual one-for-one replacement);
        attributes from ``attrs`` and keywords."""
        return Node(op, list(inputs), list(self.root.outputs), {**(attrs or {}), **more}, domain)


def _readers(graph: Graph) -> Counter[str]:
    """How often each value is read: by node inputs and as a graph output."""
    uses: Counter[str] = Counter(i for n in graph.nodes for i in n.inputs if i)
    uses.update(o.name for o in graph.outputs)
    return uses


def _match(pat: P, node: Node, m: Match, producer: dict[str, Node], readers: Counter[str]) -> bool:
    if not _fits(pat, node):
        return False
    for sub, value in zip(pat.src, node.inputs, strict=False):
        if not _match_input(sub, value, m, producer, readers):
            return False
    if pat.name is not None:
        m.nodes[pat.name] = node
    return True


def _fits(pat: P, node: Node) -> bool:
    """The node itself matches: its op, attributes, input count and predicate
    (its inputs are _match_input's)."""
    if node.domain != pat.domain or node.op not in pat.ops:
        return False
    if any(_norm_attr(node.attrs.get(k)) != v for k, v in pat.attrs.items()):
        return False
    if len(node.inputs) < len(pat.src) or (not pat.open and len(node.inputs) != len(pat.src)):
        return False
    return pat.where is None or pat.where(node)


def _match_input(
    sub: P | str | None,
    value: str,
    m: Match,
    producer: dict[str, Node],
    readers: Counter[str],
) -> bool:
    """One input of a matching node against its sub-pattern: anything, a
    variable (binds the value), or a pattern its single-use producer matches."""
    if sub is None:
        return True
    if isinstance(sub, str):
        return m.vars.setdefault(sub, value) == value  # a variable binds one value
    child = producer.get(value)
    if child is None or child.outputs.index(value) != sub.out:
        return False
    if not sub.shared and sum(readers[o] for o in child.outputs if o) != 1:
        return False  # another reader needs this node: not ours to fold
    if not _match(sub, child, m, producer, readers):
        return False
    m.inner.append(child)
    return True


def rule_name(fn: Rule) -> str:
    return getattr(fn, "__name__", repr(fn)).lstrip("_")


def rewrite(graph: Graph, rules: Rewrites, *, limit: int = 10_000) -> tuple[Graph, RewriteReport]:
    """The graph rewritten with ``rules`` to a fixed point (a new Graph; nodes
    no rule touched are shared with the input) and how often each rule fired.
    Raises RuntimeError after ``limit`` firings (rules that undo each other)."""
    g = Graph(graph.kind, dict(graph.values), list(graph.nodes), list(graph.outputs))
    report = RewriteReport()
    if not rules.pdict:
        return g, report
    while _step(g, rules, report):
        if len(report.replaced) >= limit:
            raise RuntimeError(f"rewrite found no fixed point after {limit} rewrites")
    return g, report


def _step(g: Graph, rules: Rewrites, report: RewriteReport) -> bool:
    """Apply the first rule that fires, scanning nodes in order; whether one did."""
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    readers = _readers(g)
    for idx, root in enumerate(g.nodes):
        for pat, fn in rules.pdict.get((root.domain, root.op), ()):
            m = Match(g, root, producer, readers)
            if not _match(pat, root, m, producer, readers):
                continue
            values_before = set(g.values)
            new = fn(m)
            if new is None:
                for name in set(g.values) - values_before:  # values a declined rule made
                    del g.values[name]
                continue
            nodes = list(new)
            _replace(g, idx, m, nodes, readers)
            report.fired[rule_name(fn)] += 1
            report.replaced.append((root, nodes))
            return True
    return False


def _replace(g: Graph, idx: int, m: Match, new: list[Node], readers: Counter[str]) -> None:
    root = m.root
    defined = {o for n in new for o in n.outputs if o}
    lost = [o for o in root.outputs if o and readers[o] and o not in defined]
    if lost:
        raise ValueError(f"a rewrite of {root.qualified_op} drops {lost}, which are still read")
    for n in new:  # provenance: the source op that made the root
        n.module, n.module_type, n.source = root.module, root.module_type, root.source
    # absorbed nodes whose results the replacement now computes (a fusion's extra outputs)
    taken = [n for n in m.absorbed if any(o in defined for o in n.outputs if o)]
    for n in taken:
        kept = [o for o in n.outputs if o and o not in defined and readers[o]]
        if kept:
            raise ValueError(f"a rewrite takes {n.qualified_op}'s outputs but not {kept}")
    g.nodes[idx : idx + 1] = new
    for o in root.outputs:
        if o and o not in defined:
            g.values.pop(o, None)
    g.nodes = [n for n in g.nodes if not any(n is t for t in taken)]
    # matched inner and absorbed nodes nothing reads any more go, to a fixed point
    # (each removal can leave another unread)
    readers = _readers(g)
    candidates = [*m.inner, *m.absorbed]
    removed = True
    while removed:
        removed = False
        for cand in reversed(candidates):
            at = next((k for k, n in enumerate(g.nodes) if n is cand), None)
            if at is None or any(readers[o] for o in cand.outputs if o):
                continue
            del g.nodes[at]
            readers.subtract(i for i in cand.inputs if i)
            for o in cand.outputs:
                if o and o not in defined:
                    g.values.pop(o, None)
            removed = True
