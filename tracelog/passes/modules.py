"""The module structure of a graph: where each module's calls are, what a call
reads and gives, and which calls compute the same thing.

Module-shaped programs (issue 15) write each distinct module structure once
and call it where it occurs; this pass finds those structures. A *call* of a
module is a maximal run of consecutive nodes whose module path is the
module's or under it (a module called twice, weights shared, has two calls).
Calls nest as the paths do: a ModuleList without ops of its own
(``transformer.h``) is a call holding its children's calls.

A call's *kind* is a digest of what it computes, with the names that differ
between occurrences taken out: its data inputs by position and type, its
parameters and buffers by their path relative to the module (``attn.c_attn.
weight``) and type, constants by value (or stored digest), its nodes (op,
attributes, relative module path, module type; inputs as references to the
call's inputs, parameters, constants or earlier nodes) and which of its values
leave it. Dims are the IR's, so ``batch`` and sequence symbols match across
calls and a block of other widths is another kind. Twelve GPT-2 layers are
twelve calls of one kind; a block with its activation changed is a kind of
its own.

Pure functions over :class:`~tracelog.ir.Graph`; nothing here imports a
framework.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tracelog.ir import Graph, Node, _norm_attr

# module path separators: torch writes "layer1.0.conv1", Keras "sequential/conv2d"
SEPARATORS = "./"


@dataclass
class ModuleCall:
    """One call of a module: nodes[start:end] of its graph."""

    path: str  # "" for the root
    module_type: str
    start: int
    end: int
    inputs: list[str] = field(default_factory=list)  # data read from before the call
    params: list[str] = field(default_factory=list)  # parameters and buffers read
    consts: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # values read after the call
    children: list[ModuleCall] = field(default_factory=list)
    kind: str = ""
    # a block that only the names show (_flat_groups): "block_1" holding
    # "block_1_expand", "block_1_expand_BN", ... of a flat Keras model
    virtual: bool = False

    @property
    def size(self) -> int:
        return self.end - self.start

    def walk(self) -> list[ModuleCall]:
        """This call and every call under it, in order."""
        found = [self]
        for c in self.children:
            found += c.walk()
        return found


def relative(path: str, prefix: str) -> str:
    """``path`` under the module ``prefix``, with the prefix and its separator
    taken off (the whole path for the root)."""
    if not prefix:
        return path
    return path[len(prefix) + 1 :] if path != prefix else ""


def _under(path: str, prefix: str) -> bool:
    if not prefix:
        return True
    return path == prefix or (
        path.startswith(prefix) and path[len(prefix) : len(prefix) + 1] in SEPARATORS
    )


def _child(path: str, prefix: str) -> str | None:
    """The module one level under ``prefix`` that ``path`` lies in; None for
    the prefix's own nodes."""
    if path == prefix:
        return None
    rest = relative(path, prefix)
    cut = min((i for i in (rest.find(s) for s in SEPARATORS) if i >= 0), default=len(rest))
    if not rest[:cut]:  # an empty segment ("/", "a./b"): no module to split off there
        return None
    return rest[:cut] if not prefix else f"{prefix}{path[len(prefix)]}{rest[:cut]}"


def module_calls(graph: Graph) -> ModuleCall:
    """The root call (every node) with the calls under it, each with its
    inputs, outputs and kind."""
    readers = last_reads(graph)
    root = _calls(graph, "", 0, len(graph.nodes))
    _flat_groups(root)
    for call in root.walk():
        _interface(graph, call, readers)
        call.kind = _kind(graph, call)
    return root


def _calls(graph: Graph, path: str, start: int, end: int) -> ModuleCall:
    nodes = graph.nodes
    own_type = next((n.module_type for n in nodes[start:end] if n.module == path), "")
    call = ModuleCall(path, own_type, start, end)
    i = start
    while i < end:
        child = _child(nodes[i].module, path)
        if child is None:
            i += 1
            continue
        j = i + 1
        while j < end and _under(nodes[j].module, child):
            j += 1
        call.children.append(_calls(graph, child, i, j))
        i = j
    return call


# the word separator of flat layer names (Keras' "block_1_expand_BN")
FLAT = "_"


def _flat_groups(call: ModuleCall) -> None:
    """Blocks that only the names show, as calls: a Keras functional model's
    layers are siblings named "block_1_expand", "block_1_expand_BN", ...,
    "block_2_add", so its blocks are runs of consecutive sibling calls whose
    names (under the parent) share leading "_"-words. Each such run of two
    or more calls becomes a virtual call of the shared name ("block_1"),
    grouped again inside by the next word; a run that would hold all of its
    parent's children adds no level. A sibling named as the group itself
    ("dense" among "dense_1", "dense_2") is the group's own nodes. Calls
    whose names share nothing stay as they are, so a model without such
    names keeps its calls."""
    for child in call.children:
        _flat_groups(child)
    call.children = _grouped(call.children, call.path, 0)


def _word_path(child: ModuleCall, parent: str) -> str | None:
    """The child's name under its parent, where it is one flat name."""
    rest = relative(child.path, parent)
    return rest if rest and not any(s in rest for s in SEPARATORS) else None


def _grouped(children: list[ModuleCall], parent: str, skip: int = 0) -> list[ModuleCall]:
    """`children` (calls under `parent`) with each run of two or more that
    share their first `skip` + 1 words grouped, under the words all of the
    run share; where every child shares them, by the next word instead."""
    split = [(w.split(FLAT) if (w := _word_path(c, parent)) else None) for c in children]
    out: list[ModuleCall] = []
    i = 0
    while i < len(children):
        head = split[i]
        if head is None or len(head) <= skip:
            out.append(children[i])
            i += 1
            continue
        j = i + 1
        while (
            j < len(children) and (s := split[j]) is not None and s[: skip + 1] == head[: skip + 1]
        ):
            j += 1
        if j - i == len(children):  # every child shares the stem: no level for it
            longest = max(len(s or []) for s in split)
            return _grouped(children, parent, skip + 1) if skip + 1 < longest else children
        if j - i >= 2:
            name = FLAT.join(_common_words([s for s in split[i:j] if s is not None]))
            first = children[i].path
            out.append(_group(children[i:j], first[: len(parent) + 1] + name if parent else name))
        else:
            out.append(children[i])
        i = j
    return out


def _common_words(names: list[list[str]]) -> list[str]:
    common = names[0]
    for words in names[1:]:
        k = 0
        while k < min(len(common), len(words)) and common[k] == words[k]:
            k += 1
        common = common[:k]
    return common


def _group(run: list[ModuleCall], path: str) -> ModuleCall:
    """The virtual call holding `run`: a member named as the group gives
    the group its own nodes (its children become the group's)."""
    children: list[ModuleCall] = []
    for c in run:
        children.extend(c.children if c.path == path else [c])
    return ModuleCall(
        path, "", run[0].start, run[-1].end, children=_grouped(children, path), virtual=True
    )


def last_reads(graph: Graph, outputs: bool = True) -> dict[str, int]:
    """Each value's last reader's node index (len(nodes) for a graph output,
    unless `outputs` is False: then only nodes count as readers)."""
    last: dict[str, int] = {}
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            if i:
                last[i] = k
    if outputs:
        for out in graph.outputs:
            last[out.name] = len(graph.nodes)
    return last


def _interface(graph: Graph, call: ModuleCall, last_read: dict[str, int]) -> None:
    made: set[str] = set()
    seen: set[str] = set()
    for n in graph.nodes[call.start : call.end]:
        for i in n.inputs:
            if not i or i in made or i in seen:
                continue
            seen.add(i)
            kind = graph.values[i].kind
            if kind in ("param", "buffer"):
                call.params.append(i)
            elif kind == "const":
                call.consts.append(i)
            else:
                call.inputs.append(i)
        made.update(o for o in n.outputs if o)
    call.outputs = [
        o
        for n in graph.nodes[call.start : call.end]
        for o in n.outputs
        if o and last_read.get(o, -1) >= call.end
    ]


def signature(graph: Graph, call: ModuleCall) -> dict[str, Any]:
    """What the call computes, without the names that differ between its
    occurrences (see the module docstring): what its kind digests."""
    ref: dict[str, str] = {}
    for k, name in enumerate(call.inputs):
        ref[name] = f"in{k}"
    for name in call.params:
        # a virtual block's members keep their separators ("/kernel", "_BN/gamma")
        ref[name] = "p:" + (name[len(call.path) :] if call.virtual else relative(name, call.path))
    for k, name in enumerate(call.consts):
        ref[name] = f"c{k}"
    nodes = []
    for k, n in enumerate(graph.nodes[call.start : call.end]):
        for j, o in enumerate(n.outputs):
            if o:
                ref[o] = f"v{k}.{j}"
        nodes.append(_node_signature(n, call.path, ref))
    values = graph.values
    return {
        "module_type": call.module_type,
        "inputs": [values[i].type.to_json() for i in call.inputs],
        "params": [
            [ref[p], values[p].kind, values[p].trainable, values[p].type.to_json()]
            for p in call.params
        ],
        "consts": [values[c].to_json() | {"name": ref[c]} for c in call.consts],
        "nodes": nodes,
        "outputs": [ref[o] for o in call.outputs],
    }


def _node_signature(n: Node, path: str, ref: dict[str, str]) -> list[Any]:
    return [
        n.domain,
        n.op,
        {k: _norm_attr(v) for k, v in sorted(n.attrs.items())},
        relative(n.module, path),
        n.module_type,
        [ref.get(i, "") if i else "" for i in n.inputs],
        [bool(o) for o in n.outputs],
    ]


def _kind(graph: Graph, call: ModuleCall) -> str:
    text = json.dumps(signature(graph, call), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class Structure:
    """A graph's module structure in numbers: how many nodes a program writes
    out in full, and how many with each repeated kind written once and
    called (one line a call)."""

    nodes: int
    written_once: int
    kinds: Counter[tuple[str, str]]  # (module type, kind) -> calls, for kinds called twice or more

    def summary(self) -> str:
        repeated = ", ".join(
            f"{calls} x {mtype or '?'}" for (mtype, _), calls in self.kinds.most_common()
        )
        return (
            f"{self.nodes} nodes; {self.written_once} lines with each repeated module kind "
            f"written once ({repeated or 'none repeated'})"
        )


def structure(graph: Graph) -> Structure:
    """The nodes a module-shaped program writes: each call's own nodes, a
    line per child call, and a child's body only at the first call of its
    kind; a kind counts as repeated when it is called twice or more."""
    root = module_calls(graph)
    calls = Counter(c.kind for c in root.walk())
    types = {c.kind: c.module_type for c in root.walk()}
    defined: set[str] = set()

    def lines(call: ModuleCall) -> int:
        own = call.size - sum(c.size for c in call.children)
        total = own
        for child in call.children:
            if calls[child.kind] < 2:
                total += lines(child)
                continue
            total += 1
            if child.kind not in defined:
                defined.add(child.kind)
                total += lines(child)
        return total

    written = lines(root)
    repeated = Counter({(types[k], k): n for k, n in calls.items() if n >= 2 and k != root.kind})
    return Structure(len(graph.nodes), written, repeated)
