"""Which module calls a program writes as functions (issue 15, module-shaped
programs): the kinds of tracelog.passes.modules that are called more than
once, each written once, from its first call, and called wherever it occurs.

A kind becomes a function when
- it is called at least twice in the program (its graphs together: a block
  of the same structure in the training and the evaluation graph is one
  definition),
- it has at least MIN_NODES nodes (a one-op module is clearer as its
  statement than as a call of a one-statement function), and
- every call reads its parameters and buffers under its own module path, one
  separator after it (``transformer.h.3.`` + ``attn.c_attn.weight``): the
  function reads ``params[prefix + relative path]``, so a call that reads a
  shared weight from elsewhere (tied embeddings) stays inline.
Everything else is written inline, as before. The tracing program of the
first-divergence search stays flat (one line per node, keyed by IR name).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tracelog.emit.common import Namespace
from tracelog.emit.names import role
from tracelog.ir import Graph
from tracelog.ops import is_random
from tracelog.passes.modules import SEPARATORS, ModuleCall, module_calls

# the fewest nodes a kind needs to be written as a function
MIN_NODES = 2
# the fewest lines a kind's parameter list needs to be declared apart (a
# one-row list says less than its row)
MIN_LIST_LINES = 3


@dataclass
class KindFunction:
    """One module kind written as a function: where its first call is."""

    kind: str
    name: str
    graph: Graph
    call: ModuleCall
    needs_params: bool  # reads parameters, buffers or stored constants
    needs_prefix: bool  # reads parameters or buffers by path
    random: bool  # draws dropout masks: takes rng and mask_base


def prefix_of(call: ModuleCall) -> str | None:
    """The call's module path with the separator its parameters and child
    modules are written with after it (``transformer.h.3.``), or None where
    they disagree or lie elsewhere. A call that reads no parameter and has no
    child module takes no prefix ("")."""
    under = [*call.params, *(c.path for c in call.children)]
    if not under:
        return ""
    seps = set()
    for name in under:
        if not (name.startswith(call.path) and len(name) > len(call.path) + 1):
            return None
        seps.add(name[len(call.path)])
    if len(seps) != 1 or not seps <= set(SEPARATORS):
        return None
    return call.path + seps.pop()


def kind_word(call: ModuleCall) -> str:
    """What a kind's function is named after: its module type (``GPT2Block``
    -> ``gpt2_block``); for a container with no ops of its own (no type
    recorded), its path's last word (``transformer.h.0.mlp`` -> ``mlp``)."""
    if call.module_type:
        return role(call.module_type)
    words = [w for w in re.split(f"[{re.escape(SEPARATORS)}]", call.path) if w]
    named = [w for w in words if not w.isdigit()]
    return named[-1] if named else "module"


def random_count(graph: Graph, start: int, end: int) -> int:
    """Random (mask-drawing) nodes among graph.nodes[start:end]."""
    return sum(1 for n in graph.nodes[start:end] if is_random(n))


def _stored_const(graph: Graph, call: ModuleCall) -> bool:
    return any(
        (c := graph.values[name].const) is not None and c.digest is not None for name in call.consts
    )


def kind_functions(graphs: list[Graph], program: Namespace) -> dict[str, KindFunction]:
    """The kinds written as functions, by kind, in the order of their first
    call (graph by graph, outer modules before inner), each named in the
    program namespace after its module type (``GPT2Block`` -> ``gpt2_block``)."""
    roots = [(g, module_calls(g)) for g in graphs]
    counts: Counter[str] = Counter()
    eligible: dict[str, bool] = {}
    first: dict[str, tuple[Graph, ModuleCall]] = {}
    for graph, root in roots:
        for call in root.walk()[1:]:
            counts[call.kind] += 1
            first.setdefault(call.kind, (graph, call))
            # a call whose values nothing reads after it has nothing to return
            ok = call.size >= MIN_NODES and bool(call.outputs) and prefix_of(call) is not None
            eligible[call.kind] = eligible.get(call.kind, True) and ok
    found: dict[str, KindFunction] = {}
    for kind, (graph, call) in first.items():
        if counts[kind] < 2 or not eligible[kind]:
            continue
        name = program.name(kind_word(call), ("kind", kind))
        found[kind] = KindFunction(
            kind,
            name,
            graph,
            call,
            needs_params=bool(call.params) or _stored_const(graph, call),
            needs_prefix=bool(call.params),
            random=random_count(graph, call.start, call.end) > 0,
        )
    return found


def top_calls(call: ModuleCall, kinds: dict[str, KindFunction]) -> list[ModuleCall]:
    """The calls of kinds written as functions that no such call holds."""
    if call.kind in kinds and call.path:
        return [call]
    return [c for child in call.children for c in top_calls(child, kinds)]


Row = list[Any]  # [name, trains, shape, dtype]
Line = Row | tuple[str, str]  # a row, or (prefix, a kind's list name): its rows under prefix


@dataclass
class ParameterRows:
    """PARAMETERS as a program declares it: each module kind's parameters and
    buffers once, by path under the module (``kinds``: its own rows and a line
    per call of a kind under it), and the program's list of single rows and
    one line per call of a kind (``rows``), so that a deeper model adds a
    line a layer, not a layer's rows."""

    kinds: dict[str, list[Line]] = field(default_factory=dict)  # list name -> lines
    rows: list[Line] = field(default_factory=list)


def parameter_rows(
    rows: list[Row],
    graphs: list[Graph],
    kinds: dict[str, KindFunction],
    program: Namespace,
) -> ParameterRows:
    """The log's rows, those of each call of a kind written as a function said
    by one line. A call is said so only when its rows are exactly its kind's
    (the same relative names, flags, shapes and dtypes, as its kind's first
    call has them) and no other such line says any of them; every other row
    is written as before."""
    book = _Declarations({row[0]: row for row in rows}, kinds, program)
    claimed: dict[str, tuple[str, str]] = {}
    for graph in graphs:
        for call in top_calls(module_calls(graph), kinds):
            prefix = prefix_of(call) or ""
            own = book.kind_list(kinds[call.kind])
            if own is None or any(p in claimed for p in call.params):
                continue
            if book.rows_of(call, prefix) == own[2]:
                claimed.update((p, (prefix, own[0])) for p in call.params)
    found = ParameterRows(rows=_said(rows, claimed))
    found.kinds = book.used_by(found.rows)
    return found


def _said(rows: list[Row], claimed: dict[str, tuple[str, str]]) -> list[Line]:
    """The rows in their order, each claimed one replaced by its call's line
    (once, where its first row was)."""
    said: set[tuple[str, str]] = set()
    lines: list[Line] = []
    for row in rows:
        if row[0] not in claimed:
            lines.append(row)
        elif claimed[row[0]] not in said:
            said.add(claimed[row[0]])
            lines.append(claimed[row[0]])
    return lines


@dataclass
class _Declarations:
    """Each kind's parameter list, declared from its first call."""

    by_name: dict[str, Row]
    kinds: dict[str, KindFunction]
    program: Namespace
    # kind -> (list name, its lines, its rows by relative name)
    lists: dict[str, tuple[str, list[Line], dict[str, Row]]] = field(default_factory=dict)

    def rows_of(self, call: ModuleCall, prefix: str) -> dict[str, Row] | None:
        if not call.params or any(p not in self.by_name for p in call.params):
            return None
        return {p[len(prefix) :]: self.by_name[p][1:] for p in call.params}

    def kind_list(self, kf: KindFunction) -> tuple[str, list[Line], dict[str, Row]] | None:
        """The kind's list (inner kinds' lists declared first), or None for a
        kind without parameters or with some the log does not list."""
        if kf.kind in self.lists:
            return self.lists[kf.kind]
        call, prefix = kf.call, prefix_of(kf.call) or ""
        flat = self.rows_of(call, prefix)
        if flat is None:
            return None
        inner: dict[str, tuple[str, str]] = {}  # param -> (prefix under this one, list name)
        for child in (c for ch in call.children for c in top_calls(ch, self.kinds)):
            sub = self.kind_list(self.kinds[child.kind])
            child_prefix = prefix_of(child) or ""
            if sub is not None and self.rows_of(child, child_prefix) == sub[2]:
                inner.update((p, (child_prefix[len(prefix) :], sub[0])) for p in child.params)
        relative = [[p[len(prefix) :], *self.by_name[p][1:]] for p in call.params]
        lines = _said(relative, {p[len(prefix) :]: v for p, v in inner.items()})
        if len(lines) < MIN_LIST_LINES:
            return None
        name = self.program.name(f"{kf.name}_parameters".upper(), ("p", kf.kind))
        self.lists[kf.kind] = (name, lines, flat)
        return self.lists[kf.kind]

    def used_by(self, lines: list[Line]) -> dict[str, list[Line]]:
        """The lists `lines` read, with those they read, inner ones first."""
        by_list = {name: own for name, own, _ in self.lists.values()}
        used: set[str] = set()

        def use(name: str) -> None:
            if name not in used:
                used.add(name)
                for line in by_list[name]:
                    if isinstance(line, tuple):
                        use(line[1])

        for line in lines:
            if isinstance(line, tuple):
                use(line[1])
        return {name: own for name, own in by_list.items() if name in used}
