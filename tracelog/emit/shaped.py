"""Which module calls a program writes as functions (issue 15, module-shaped
programs): the kinds of tracelog.passes.modules that are called more than
once, each written once, from its first call, and called wherever it occurs.

A kind becomes a function when
- it is called at least twice in the program, its graphs together (a block of
  the same structure in the training and the evaluation graph is one
  definition), and kinds whose code is the same text count as one: a module
  kind digests its shapes, but a batch norm's or a convolution's code does not
  depend on its width, so MobileNetV2's 52 batch norms of 15 widths are one
  function (``same_code``: the inlined function's text, its comments' shapes
  left out; the function's comments then give the dims the calls share and
  ``?`` for the others);
- it has at least MIN_NODES nodes, or reads parameters (a one-op module
  without parameters is clearer as its statement than as a call of a
  one-statement function; one with parameters is a call in one line instead
  of a line per parameter and its statement); and
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tracelog.emit.common import Namespace
from tracelog.emit.names import role
from tracelog.ir import Graph
from tracelog.ops import is_random
from tracelog.passes.modules import (
    FLAT,
    SEPARATORS,
    ModuleCall,
    last_reads,
    module_calls,
    relative,
)

# the fewest nodes a kind without parameters needs to be written as a function
MIN_NODES = 2
# the fewest parameters a kind needs for its list to be declared apart: a
# call's one line then says three rows or more (a Linear's two stay rows)
MIN_LIST_ROWS = 3


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
    # per output: the buffer path under the module it is the new value of,
    # written into `updates` (update_paths); None for the outputs returned
    updates: tuple[str | None, ...] = ()
    # the first call of each other kind (other shapes) this function computes
    also: list[tuple[Graph, ModuleCall]] = field(default_factory=list)


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
    if len(seps) == 1 and (call.virtual or seps <= set(SEPARATORS)):
        return call.path + seps.pop()
    # a virtual block with a member named as itself reads "/kernel" and "_BN/gamma"
    return call.path if call.virtual else None


def kind_word(call: ModuleCall) -> str:
    """What a kind's function is named after: its module type (``GPT2Block``
    -> ``gpt2_block``); for a container with no ops of its own (no type
    recorded), its path's last word (``transformer.h.0.mlp`` -> ``mlp``)."""
    if call.module_type:
        return role(call.module_type)
    if call.virtual:
        return _block_word(call)
    words = [w for w in re.split(f"[{re.escape(SEPARATORS)}]", call.path) if w]
    named = [w for w in words if not w.isdigit()]
    return named[-1] if named else "module"


def _block_word(call: ModuleCall) -> str:
    """A virtual block's name: its last word, digits off ("block_1" and
    "conv2_block1" -> "block"); for a numbered unit ("conv2_block1_1"), its
    members' words where they are few ("conv_bn_relu")."""
    words = [w for w in re.split(f"[{re.escape(SEPARATORS + FLAT)}]", call.path) if w]
    last = words[-1].rstrip("0123456789") if words else ""
    if last:
        return role(last)
    members = [relative(c.path, call.path) for c in call.children]
    if 0 < len(members) <= 3 and all(members):
        return role("_".join(members))
    named = [w.rstrip("0123456789") for w in words]
    return role(next((w for w in reversed(named) if w), "block"))


def random_count(graph: Graph, start: int, end: int) -> int:
    """Random (mask-drawing) nodes among graph.nodes[start:end]."""
    return sum(1 for n in graph.nodes[start:end] if is_random(n))


def random_prefix(graph: Graph, start: int = 0, end: int | None = None) -> list[int]:
    """prefix[k]: the random nodes among graph.nodes[start:start + k], so
    that a count from `start` is a lookup (one per dropout, not a scan: a
    deep graph's dropouts would otherwise cost its length each)."""
    prefix = [0]
    for n in graph.nodes[start:end]:
        prefix.append(prefix[-1] + is_random(n))
    return prefix


def _stored_const(graph: Graph, call: ModuleCall) -> bool:
    return any(
        (c := graph.values[name].const) is not None and c.digest is not None for name in call.consts
    )


def kind_functions(
    graphs: list[Graph],
    program: Namespace,
    same_code: Callable[[KindFunction], str] | None = None,
    roots: Mapping[int, ModuleCall] | None = None,
) -> dict[str, KindFunction]:
    """The kinds written as functions, by kind, in the order of their first
    call (graph by graph, outer modules before inner), each named in the
    program namespace after its module type (``GPT2Block`` -> ``gpt2_block``).
    With `same_code` (a kind's code, written from its first call), kinds with
    the same code share one function: they map to the same KindFunction.
    `roots`: the graphs' module calls already found, by id(graph)."""
    counts: Counter[str] = Counter()
    eligible: dict[str, bool] = {}
    first: dict[str, KindFunction] = {}
    for graph in graphs:
        reads = last_reads(graph, outputs=False)
        roles: dict[str, list[str]] = {}
        for out in graph.outputs:
            roles.setdefault(out.name, []).append(out.role)
        for call in root_of(graph, roots).walk()[1:]:
            # a call that draws in the loss graph is written out there (draws_inline)
            counts[call.kind] += not draws_inline(graph, call)
            updates = update_paths(call, reads, roles)
            if call.kind not in first:
                first[call.kind] = KindFunction(
                    call.kind,
                    "",
                    graph,
                    call,
                    needs_params=bool(call.params) or _stored_const(graph, call),
                    needs_prefix=bool(call.params),
                    random=random_count(graph, call.start, call.end) > 0,
                    updates=updates,
                )
            # a call whose values nothing reads after it has nothing to return
            ok = (
                (call.size >= MIN_NODES or bool(call.params))
                and bool(call.outputs)
                and prefix_of(call) is not None
                and updates == first[call.kind].updates
            )
            eligible[call.kind] = eligible.get(call.kind, True) and ok
    lead: dict[str, str] = {}  # kind -> the first kind with its code
    by_code: dict[str, str] = {}
    for kind, kf in first.items():
        if eligible[kind]:
            lead[kind] = by_code.setdefault(same_code(kf), kind) if same_code else kind
    calls: Counter[str] = Counter()
    for kind, head in lead.items():
        calls[head] += counts[kind]
    found: dict[str, KindFunction] = {}
    for kind, head in lead.items():
        if calls[head] < 2:
            continue
        if head in found:
            found[head].also.append((first[kind].graph, first[kind].call))
            found[kind] = found[head]
            continue
        kf = found[kind] = first[kind]
        kf.name = program.name(kind_word(kf.call), ("kind", kind))
    return found


def draws_inline(graph: Graph, call: ModuleCall) -> bool:
    """Whether a module call is written out where a kind function would be
    called: one that draws (a dropout) in the loss graph, whose draws are
    keyed by the loss graph's own keys (tracelog.sample.draw_key), which a
    kind function's keys (from mask_base) are not. A program's calls of the
    kind elsewhere are calls."""
    return graph.kind == "loss" and random_count(graph, call.start, call.end) > 0


def update_paths(
    call: ModuleCall, reads: dict[str, int], roles: dict[str, list[str]]
) -> tuple[str | None, ...]:
    """Per output of the call: where it leaves the call only as a buffer's new
    value (its one role is ``update:`` + a buffer the call reads under its
    prefix, and no node after the call reads it), the buffer's path under the
    prefix; else None. A kind's function writes these into the graph
    function's `updates` dict, so a batch norm's call is one line and the
    prediction function's return does not list every running statistic.
    `reads`: each value's last reading node (last_reads(graph, outputs=False));
    `roles`: each value's roles among the graph's outputs."""
    prefix = prefix_of(call)
    paths: list[str | None] = []
    for o in call.outputs:
        path = None
        held = roles.get(o, [])
        if prefix and len(held) == 1 and held[0].startswith("update:"):
            buffer = held[0][len("update:") :]
            if buffer.startswith(prefix) and buffer in call.params and reads.get(o, -1) < call.end:
                path = buffer[len(prefix) :]
        paths.append(path)
    return tuple(paths)


def root_of(graph: Graph, roots: Mapping[int, ModuleCall] | None) -> ModuleCall:
    """The graph's module calls: from `roots` (by id(graph)) where found
    there, else found now (module_calls digests every call: a program
    finds them once per graph, not once per use)."""
    found = roots.get(id(graph)) if roots is not None else None
    return found if found is not None else module_calls(graph)


def distinct(kinds: dict[str, KindFunction]) -> list[KindFunction]:
    """Each function once, in the order of its first kind."""
    return list({id(kf): kf for kf in kinds.values()}.values())


def merged_shape(shapes: Iterable[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """The dims calls of different shapes share, ``?`` for the others; None
    where their ranks differ."""
    shapes = list(shapes)
    if len({len(s) for s in shapes}) != 1:
        return None
    return tuple(dims[0] if len(set(dims)) == 1 else "?" for dims in zip(*shapes, strict=True))


def top_calls(call: ModuleCall, kinds: dict[str, KindFunction]) -> list[ModuleCall]:
    """The calls of kinds written as functions that no such call holds."""
    if call.kind in kinds and call.path:
        return [call]
    return [c for child in call.children for c in top_calls(child, kinds)]


Row = list[Any]  # [name, trains]
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
    roots: Mapping[int, ModuleCall] | None = None,
) -> ParameterRows:
    """The log's rows, those of each call of a kind written as a function said
    by one line. A call is said so only when its rows are exactly its kind's
    (the same relative names, flags, shapes and dtypes, as its kind's first
    call has them) and no other such line says any of them; every other row
    is written as before."""
    book = _Declarations({row[0]: row for row in rows}, kinds, program)
    claimed: dict[str, tuple[str, str]] = {}
    for graph in graphs:
        for call in top_calls(root_of(graph, roots), kinds):
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
    by_lines: dict[str, str] = field(default_factory=dict)  # repr(lines) -> list name

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
        if len(flat) < MIN_LIST_ROWS:
            return None
        # kinds whose rows are the same (blocks of other code, same weights) share a list
        same = self.by_lines.get(repr(lines))
        name = same or self.program.name(f"{kf.name}_parameters".upper(), ("p", kf.kind))
        self.by_lines.setdefault(repr(lines), name)
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
