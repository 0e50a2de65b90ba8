"""The one program emitter: a log -> a runnable, black-formatted program.

One function per unique graph (its statements written by the shared op table
and the target's spellings, `tracelog.emit.rules`), the sample step, and the
code every program carries, inlined from real modules
(`tracelog.emit.runtime`, `tracelog.sample`). A target supplies only what
differs: its spellings, its runtime module (imports, parameter objects,
autodiff, helpers), its constant syntax and its layout passes.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from tracelog import sample as sample_format
from tracelog.emit import targets
from tracelog.emit.common import (
    LINE_LENGTH,
    Namespace,
    check_supported,
    comment_text,
    format_source,
    identifier,
    literal,
    usage_comment,
)
from tracelog.emit.inline import Inlinable, called_names, import_block, inlinable, used_names
from tracelog.emit.names import value_candidates
from tracelog.emit.onnx import const_array
from tracelog.emit.rules import RuleCtx, Spellings, write
from tracelog.emit.shaped import (
    KindFunction,
    ParameterRows,
    distinct,
    draws_inline,
    kind_functions,
    kind_word,
    merged_shape,
    parameter_rows,
    prefix_of,
    random_prefix,
    root_of,
)
from tracelog.errors import LogError, UnsupportedOpError
from tracelog.ir import Graph, Node, Value
from tracelog.log import GraphEntry, TraceLog
from tracelog.ops import is_random, traits_of
from tracelog.passes.modules import ModuleCall, module_calls, relative
from tracelog.sample import target_key


@dataclass(frozen=True)
class Target:
    """What a program target supplies to the shared emitter."""

    name: str
    table: Spellings
    runtime: str  # its module, tracelog.emit.runtime.<target>_program (read, never imported)
    const_expr: str  # format with {value} and {dtype}
    # rewrites before emission; each returns (graph, report with .changed, .kept, .summary())
    passes: tuple[Callable[[Graph], tuple[Graph, Any]], ...] = ()
    # said in the header when a pass changed the layout: format with {layout}
    layout_note: str = (
        "Layout: the recording was channels-last (NHWC); this program runs NCHW\n"
        "inside. Transposes kept, per function:\n{layout}"
    )
    # a dtype whose constants the target writes otherwise (JAX: numpy has no bfloat16)
    const_exprs: Mapping[str, str] = field(default_factory=dict)
    # the statement a program gets where a graph's sizes depend on the data (an op
    # of trait data_dependent: x[mask]); JAX's turns its jit off
    data_dependent: str = ""

    @cached_property
    def pieces(self) -> list[Inlinable]:
        """The modules a program takes imports, statements and functions
        from: the target's runtime, the weights loader, the parity check."""
        return [inlinable(self.runtime), inlinable(WEIGHTS_RUNTIME), inlinable(PARITY_RUNTIME)]

    @cached_property
    def check(self) -> list[str]:
        """The parity check's code: its constants, the target runtime's
        CHECK functions and the helpers they call, the sample's key
        functions, the check's own functions (a runtime's function of the
        same name replaces the default: JAX's _runs). A standalone program
        inlines it; tracelog.emit.harness runs it in any other program."""
        runtime, _, parity = self.pieces
        own = "\n".join(runtime.functions[n] for n in runtime.check)
        names = [*runtime.check, *runtime.helpers_used(own)]
        return [
            *parity.statements,
            *(runtime.functions[n] for n in names),
            *self.keys,
            *(parity.functions[n] for n in parity.inlined if n not in runtime.functions),
        ]

    @cached_property
    def keys(self) -> list[str]:
        """The sample key functions the parity check carries (tracelog.sample:
        only these functions; the rest of that module is the package's)."""
        return [
            inlinable(sample_format.__name__).functions[f.__name__] for f in sample_format.INLINED
        ]

    def keys_called(self, code: str) -> list[str]:
        """The key functions `code` calls (sample_step's), with those they
        call, in tracelog.sample's order: a program that leaves the check to
        tracelog carries these only."""
        texts = dict(zip((f.__name__ for f in sample_format.INLINED), self.keys, strict=True))
        found: set[str] = set()
        todo = [code]
        while todo:
            called = called_names(todo.pop())
            for name in texts.keys() - found:
                if name in called:
                    found.add(name)
                    todo.append(texts[name])
        return [text for name, text in texts.items() if name in found]

    @cached_property
    def reserved(self) -> tuple[str, ...]:
        """Names the program defines besides its graph functions' own."""
        names: set[str] = set(PROGRAM_NAMES) | {f.__name__ for f in sample_format.INLINED}
        for piece in self.pieces:
            names |= piece.defined_names()
        return tuple(sorted(names))

    @property
    def helpers(self) -> Inlinable:
        return self.pieces[0]


WEIGHTS_RUNTIME = "tracelog.emit.runtime.weights"
PARITY_RUNTIME = "tracelog.emit.runtime.parity"

ENTRY_POINT = 'if __name__ == "__main__":\n    sys.exit(main())'


def entry_point(target: Target) -> str:
    """The __main__ of a program that does not carry the parity check: the
    check is tracelog's, run in the program's namespace (harness.main); a
    machine without tracelog gets one line saying so."""
    return (
        'if __name__ == "__main__":\n'
        "    try:  # the parity check on the recorded batch is tracelog's\n"
        "        from tracelog.emit.harness import main\n"
        "    except ImportError:\n"
        "        sys.exit(\n"
        '            "the parity check needs tracelog (pip install tracelog);"\n'
        '            " emit with --standalone for a program that carries it"\n'
        "        )\n"
        f'    sys.exit(main(globals(), "{target.name}"))'  # a registered name: [a-z]+
    )


# names the generated part of a program defines at module level
PROGRAM_NAMES = (
    *("PARAMETERS", "PREDICT", "sample_step", "params", "rng", "_trace", "_traces"),
    # a kind function's arguments
    *("prefix", "updates", "mask_base"),
)


def _function_names(log: TraceLog, ns: Namespace | None = None) -> dict[str, str]:
    """One name per unique graph, from its kind and the phase it first ran in
    (predict_train, loss_eval, predict_train_2, ...), taken in `ns`: the
    phase comes from the log, so it passes the sanitiser like any name."""
    ns = ns or Namespace()
    names: dict[str, str] = {}
    for e in log.entries_sorted():
        if e.hash in names:
            continue
        base = identifier(("predict_" if e.kind == "prediction" else "loss_") + e.phase)
        name, n = base, 1
        while not ns.free(name):
            n += 1
            name = f"{base}_{n}"
        names[e.hash] = ns.name(name)
    return names


def _program_namespace(target: Target, log: TraceLog) -> tuple[Namespace, dict[str, str]]:
    """The program's one namespace: every name it defines at module level
    (imports, inlined code, generated names, one function per graph). Each
    graph function names its values in a child of it, so no user name can
    take a name the program uses."""
    ns = Namespace(target.reserved)
    return ns, _function_names(log, ns)


def _arg_names(program: Namespace, graph: Graph) -> list[str]:
    """The printed names of a graph function's data arguments (as emit_function
    names them: first, in order, in a fresh child of the program namespace)."""
    ns = program.child()
    return [ns.name(v.name, ("v", v.name)) for v in graph.inputs]


def _statement(target: Target, c: RuleCtx) -> str:
    try:
        expr = write(target.table, c)
    except NotImplementedError as e:
        # a form of the op (attributes, computed operands) this target cannot
        # write: reported as a missing rule is, one line, exit 2
        raise UnsupportedOpError(
            target.name, [(f"{c.node.qualified_op} ({e})", 1, [c.node.module])]
        ) from None
    if c.node.op == "Split" and len(c.outs) == 1:
        # one part (unbind over a dim of 1, torch.where of a 1-D mask): the
        # frameworks' split still returns a sequence of parts
        return f"{c.outs[0]} = {expr}[0]"
    return f"{', '.join(c.outs)} = {expr}"


def emit_function(
    target: Target,
    graph: Graph,
    fname: str,
    entries: list[GraphEntry],
    digest: str,
    constants: dict[str, np.ndarray],
    trace: bool = False,
    program: Namespace | None = None,
    kinds: Mapping[str, KindFunction] | None = None,
    roots: Mapping[int, ModuleCall] | None = None,
) -> str:
    """One graph's function. With `kinds` (module-shaped, tracelog.emit.shaped),
    a call of a kind written as a function is one line; without, and always
    when tracing, every node is written out."""
    book = {} if trace or kinds is None else kinds
    root = root_of(graph, roots) if book else None
    body = _Body(target, graph, constants, program or Namespace(target.reserved), trace, book)
    args = [body.bind(v.name) for v in graph.inputs]
    if root is None:
        lines = body.value_lines([(0, len(graph.nodes))])
        lines += body.node_lines(0, len(graph.nodes))
    else:
        lines = body.value_lines(body.written(root)) + body.call_lines(root)
        if body.sent:  # the buffer updates that calls of kind functions write
            lines.insert(0, "updates = {}")
    ret, sig = _return_and_signature(graph, body.names, args, trace, body.sent)
    lines = _live(lines + [ret])
    header = [
        comment_text(
            f"# {graph.kind} graph {digest[:12]}, {len(graph.nodes)} ops. {usage_comment(entries)}"
        ),
        f"def {fname}({sig}):",
    ]
    doc = (
        '    """Returns {role: tensor}: predictions and buffer updates."""'
        if graph.kind == "prediction"
        else '    """Returns the loss."""'
    )
    return "\n".join(header + [doc] + ["    " + line for line in lines])


def emit_kind_function(
    target: Target,
    kf: KindFunction,
    kinds: Mapping[str, KindFunction],
    constants: dict[str, np.ndarray],
    program: Namespace,
) -> str:
    """A module kind's function, written from its first call: its parameters
    read as params[prefix + their path under the module], its values named
    relative to the module, its dropout masks keyed from mask_base."""
    call, graph = kf.call, kf.graph
    body = _Body(target, graph, constants, program, False, kinds, call, kf.also)
    args = [body.bind(v, "x") for v in call.inputs]
    lines = body.value_lines(body.written(call, inline=True)) + body.call_lines(call, inline=True)
    returned = []
    for o, path in zip(call.outputs, kf.updates or [None] * len(call.outputs), strict=True):
        if path is None:
            returned.append(body.names[o])
        elif o not in body.sent:  # (a call of an inner kind wrote it)
            lines.append(f'updates["update:" + prefix + {literal(path)}] = {body.names[o]}')
    if returned:
        lines.append("return " + ", ".join(returned))
    lines = _live(lines)
    sig = [*(["params"] if kf.needs_params else []), *(["prefix"] if kf.needs_prefix else [])]
    sig += args + (["updates"] if any(kf.updates) else [])
    sig += ["rng=None", "mask_base=0"] if kf.random else []
    n_calls = f"{len(call.outputs)} output{'s' if len(call.outputs) != 1 else ''}"
    header = [
        comment_text(
            f"# {call.module_type or kind_word(call)} ({kf.kind}): {call.size} ops, {n_calls}; "
            f"written from {call.path}"
        ),
        f"def {kf.name}({', '.join(sig)}):",
    ]
    return "\n".join(header + ["    " + line for line in lines])


def _live(lines: list[str]) -> list[str]:
    """A function body's lines less each assignment whose names no later line
    reads, and a comment left over none: the value a node computes only for
    an input the target's spelling leaves out (TopK's K where it sorts a whole
    symbolic axis: `_topk(x, None, ...)`) would be an unused local, which
    pyflakes flags. The statements written are free of side effects (a dead
    random draw's only skips a fresh run's generator ahead). Reads are every
    identifier in a line but attributes (keywords too: more stays, never less)."""
    live: set[str] = set()
    kept: list[str] = []
    for line in reversed(lines):
        if line.lstrip().startswith("#"):
            if kept and not kept[-1].lstrip().startswith("#"):
                kept.append(line)  # over a run of lines some of which stay
            continue
        bound = _BINDS.match(line)
        if bound is not None:
            if live.isdisjoint(bound.group(1).split(", ")):
                continue
            line_reads = line[bound.end() :]
        else:
            line_reads = line
        live.update(_IDENTIFIER.findall(line_reads))
        kept.append(line)
    return kept[::-1]


# `a = ...`, `a, _ = ...`: a statement binding names only (not `x[k] = ...`)
_BINDS = re.compile(r"([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*) = ")
_IDENTIFIER = re.compile(r"(?<![.\w])[A-Za-z_]\w*")  # not an attribute (x.shape)


# a module comment's shape, left out of the text kinds are compared by
_SHAPE_COMMENT = re.compile(r" -> \[[^\]\n]*\]$", re.MULTILINE)


def _kind_code(target: Target, constants: dict[str, np.ndarray], kf: KindFunction) -> str:
    """What a kind computes, as the text of its function with everything
    inlined and no header, its comments' shapes left out: kinds with the same
    text are one function (tracelog.emit.shaped)."""
    probe = dataclasses.replace(kf, name="kind", needs_params=True, also=[])
    text = emit_kind_function(target, probe, {}, constants, Namespace(target.reserved))
    return _SHAPE_COMMENT.sub("", text.split("\n", 1)[1])


@dataclass
class _Body:
    """One function being written (a graph's, or a module kind's from its
    first call `at`): its own namespace (seeded with every name the program
    defines) and the printed name of each value."""

    target: Target
    graph: Graph
    constants: dict[str, np.ndarray]
    program: Namespace
    trace: bool = False
    kinds: Mapping[str, KindFunction] = field(default_factory=dict)
    at: ModuleCall | None = None  # a kind function's call; None for a graph function
    # a kind function's calls of other shapes (first call each): its comments' dims
    also: list[tuple[Graph, ModuleCall]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=lambda: {"": "None"})
    # values calls of kind functions wrote into `updates` (named nowhere here)
    sent: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ns = self.program.child()
        if self.at is None:
            self.random = random_prefix(self.graph)
        else:
            self.random = random_prefix(self.graph, self.at.start, self.at.end)
        base = self.at.path if self.at is not None else ""
        nodes = self.graph.nodes
        if self.at is not None:  # names relative to the module: a one-module diff
            nodes = [
                dataclasses.replace(n, module=relative(n.module, base))
                for n in nodes[self.at.start : self.at.end]
            ]
        self.candidates = value_candidates(Graph(self.graph.kind, self.graph.values, nodes, []))
        self.takes = frozenset(self.at.inputs) if self.at is not None else frozenset()

    def bind(self, value: str, candidate: str | None = None) -> str:
        """The printed name of a value the function defines (a fresh one):
        node outputs by module and role (tracelog.emit.names), inputs and
        parameters by their own names."""
        candidate = candidate or self.candidates.get(value, value)
        self.names[value] = self.ns.name(candidate, ("v", value))
        return self.names[value]

    def _called(self, call: ModuleCall) -> bool:
        """Whether a call is one line calling its kind's function (else its
        nodes are written out: tracelog.emit.shaped.draws_inline)."""
        return call.kind in self.kinds and not (self.at is None and draws_inline(self.graph, call))

    def written(self, call: ModuleCall, inline: bool = False) -> list[tuple[int, int]]:
        """The node ranges call_lines writes out (the rest are calls)."""
        if not inline and self._called(call):
            return []
        ranges: list[tuple[int, int]] = []
        at = call.start
        for child in call.children:
            ranges.append((at, child.start))
            ranges += self.written(child)
            at = child.end
        return [*ranges, (at, call.end)]

    def value_lines(self, written: list[tuple[int, int]]) -> list[str]:
        """A line reading each parameter and buffer that the nodes written out
        read (a kind function: by its path under the module), in the order of
        the graph's values; constants are named by their expression, with no
        line."""
        values = self.graph.values
        used = {
            i
            for start, end in written
            for n in self.graph.nodes[start:end]
            for i in n.inputs
            if i and values[i].kind in ("param", "buffer")
        }
        lines: list[str] = []
        if self.at is not None:
            cut = len(prefix_of(self.at) or "")
            for name in self.at.params:
                if name in used:
                    rel = name[cut:]
                    lines.append(f"{self.bind(name, rel)} = params[prefix + {literal(rel)}]")
            consts = [values[c] for c in self.at.consts]
        else:
            for v in values.values():
                if v.kind in ("param", "buffer") and v.name in used:
                    lines.append(f"{self.bind(v.name)} = params[{literal(v.name)}]")
            consts = list(values.values())
        for v in consts:
            if v.kind == "const":
                self.names[v.name] = _const_text(self.target, v, self.constants)
        return lines

    def call_lines(self, call: ModuleCall, inline: bool = False) -> list[str]:
        """The call's nodes, each child call of a kind written as a function
        as one line calling it, the others written out (recursively). With
        inline, the call itself is written out (a kind function's body)."""
        if not inline and self._called(call):
            return self._call(call)
        lines: list[str] = []
        at = call.start
        for child in call.children:
            lines += self.node_lines(at, child.start)
            lines += self.call_lines(child)
            at = child.end
        return lines + self.node_lines(at, call.end)

    def _call(self, call: ModuleCall) -> list[str]:
        """`outs = kind_fn(params, prefix, inputs, rng=rng, mask_base=k)`."""
        kf = self.kinds[call.kind]
        args = [self.names[i] for i in call.inputs]
        prefix = prefix_of(call) or ""
        if kf.needs_prefix:
            if self.at is None:
                args.insert(0, literal(prefix))
            else:  # under this function's module: its prefix and the path below
                args.insert(0, f"prefix + {literal(prefix[len(prefix_of(self.at) or ''):])}")
        if kf.needs_params:
            args.insert(0, "params")
        if any(kf.updates):
            args.append("updates")
        if kf.random:
            base = self._random_before(call.start)
            args += ["rng=rng", f"mask_base={base}"]
        paths = kf.updates or (None,) * len(call.outputs)
        self.sent.update(o for o, path in zip(call.outputs, paths, strict=True) if path)
        outs = [self.bind(o) for o, path in zip(call.outputs, paths, strict=True) if path is None]
        # no comment: the call names its module by its prefix, and the kind's
        # definition says what it computes
        text = f"{kf.name}({', '.join(args)})"
        return [f"{', '.join(outs)} = {text}" if outs else text]

    def _random_before(self, index: int) -> str:
        """The key base of the random nodes from `index` on: how many come
        before it in this function (after mask_base, in a kind function)."""
        start = self.at.start if self.at is not None else 0
        k = self.random[index - start]
        if self.at is None:
            return str(k)
        return f"mask_base + {k}" if k else "mask_base"

    def _module_comment(self, index: int, end: int) -> str:
        """The comment over the run of nodes of one module from `index`."""
        nodes = self.graph.nodes
        stop = index + 1
        while stop < end and nodes[stop].module == nodes[index].module:
            stop += 1
        base = self.at.path if self.at is not None else None
        shape = None
        if self.at is not None and self.also:  # the node's output in every call
            offset, out = stop - 1 - self.at.start, nodes[stop - 1].outputs
            j = next((j for j, o in enumerate(out) if o), None)
            if j is not None:
                calls = [(self.graph, self.at), *self.also]
                shape = merged_shape(
                    g.values[g.nodes[c.start + offset].outputs[j]].type.shape for g, c in calls
                )
        return module_comment(self.graph, nodes[index:stop], base, shape)

    def node_lines(self, start: int, end: int) -> list[str]:
        """Per node of graph.nodes[start:end] its statement, with trace the
        lines recording its outputs; a comment over each module's run of
        nodes (comments per module, not per line)."""
        lines: list[str] = []
        for index in range(start, end):
            node = self.graph.nodes[index]
            outs = [self.bind(o) if o else "_" for o in node.outputs]
            ctx = RuleCtx(self.graph, node, self.names, self.constants, outs, takes=self.takes)
            if is_random(node):  # takes its recorded mask from rng when replayed
                k = self._random_before(index)
                if self.at is None:  # the loss graph's keys are its own (draw_key)
                    ctx.mask_key = sample_format.draw_key(self.graph.kind, int(k))
                else:
                    ctx.mask_expr = f"rng_key({k})"
            if index == start or self.graph.nodes[index - 1].module != node.module:
                lines.append(self._module_comment(index, end))
            lines.append(_statement(self.target, ctx))
            if self.trace:
                traced = zip(node.outputs, outs, strict=True)
                lines += [f"_trace[{literal(o)}] = {p}" for o, p in traced if o]
        return lines


_FLOATS = ("float64", "float32", "float16", "bfloat16")


def _const_text(target: Target, v: Value, constants: dict[str, np.ndarray]) -> str:
    """A constant: a read of the weights file where it is stored there, else
    its values written out in the target's syntax."""
    if v.const is not None and v.const.digest is not None:
        return f"params[{literal('const/' + v.const.digest)}]"
    value = const_array(v, constants)
    if v.type.dtype in _FLOATS:  # inline values as recorded: float32 rounds them alike
        value = np.asarray(v.const.data if v.const is not None else value, dtype=np.float64)
    expr = target.const_exprs.get(v.type.dtype, target.const_expr)
    return expr.format(value=literal(value.tolist()), dtype=v.type.dtype)


# a module's comment lists its ops up to this many kinds, else counts them
COMMENT_OPS = 4


def module_comment(
    graph: Graph, nodes: list[Node], base: str | None = None, shape: tuple[Any, ...] | None = None
) -> str:
    """# module (module type): its ops -> the shape of its last value (or
    `shape`: a kind function's, over its calls of several shapes). In a
    module kind's function (`base`: its first call's path) the module is
    named relative to it; the loss graph's nodes have no module."""
    node = nodes[-1]
    module = node.module or "<root>"
    if base is not None:
        module = relative(node.module, base)
    where = f"{module} ({node.module_type})".lstrip() if node.module_type else "<loss>"
    kinds = list(dict.fromkeys(n.qualified_op for n in nodes))
    ops = ", ".join(kinds) if len(kinds) <= COMMENT_OPS else f"{len(nodes)} ops"
    out = next((o for o in node.outputs if o), "")
    dims = shape if shape is not None else graph.values[out].type.shape if out else None
    arrow = f" -> [{', '.join(str(d) for d in dims)}]" if out and dims is not None else ""
    return comment_text(f"# {where}: {ops}{arrow}")


def _return_and_signature(
    graph: Graph, names: dict[str, str], args: list[str], trace: bool, sent: set[str]
) -> tuple[str, str]:
    """The return statement and the parameter list: a prediction graph returns
    {role: tensor} (the updates kind functions wrote as ``**updates``, where
    the first of them was) and takes rng; a loss graph returns the loss, and
    takes rng where it draws (a dropout after the predictions)."""
    traced = ["_trace=None"] if trace else []
    if graph.kind == "prediction":
        items: list[str] = []
        for o in graph.outputs:
            if o.name not in sent:
                items.append(f"{literal(o.role)}: {names[o.name]}")
            elif "**updates" not in items:
                items.append("**updates")
        return f"return {{{', '.join(items)}}}", ", ".join(["params", *args, "rng=None", *traced])
    rng = ["rng=None"] if any(is_random(n) for n in graph.nodes) else []
    return f"return {names[graph.output('loss').name]}", ", ".join(["params", *args, *rng, *traced])


def _lowered(target: Target, graph: Graph, fname: str, notes: list[str]) -> Graph:
    """The graph after the target's passes; what a layout pass kept, in notes."""
    for rewrite in target.passes:
        before = graph
        graph, report = rewrite(graph)
        kept = getattr(report, "kept", None)
        if kept is not None and graph is not before and (report.changed or kept):
            notes.append(comment_text(f"  {fname}: {report.summary()}"))
    return graph


def build_program(
    log: TraceLog,
    target: Target,
    trace: bool = False,
    line_length: int = LINE_LENGTH,
    standalone: bool = False,
) -> str:
    """The program's text. It carries its model, its weights loader and the
    recorded batch's step; a `standalone` one (and the tracing program, which
    tracelog runs itself) also carries the parity check, so that its
    __main__ runs with no tracelog installed; any other program's __main__
    runs tracelog's (tracelog.emit.harness)."""
    check_supported(log, target.table, target.name)
    standalone = standalone or trace
    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch, so no parity check can be emitted")
    # Rules may read constant values (shapes, axes, indices); the large ones
    # live in the weights file.
    stored = any(v.const and v.const.digest for g in log.graphs.values() for v in g.constants)
    constants = log.weights() if stored else {}
    program, fnames = _program_namespace(target, log)
    layout_lines: list[str] = []
    lowered = {d: _lowered(target, log.graphs[d], f, layout_lines) for d, f in fnames.items()}
    # module-shaped: each repeated module kind once, as a function (the
    # tracing program stays flat: one line per IR node)
    kinds: dict[str, KindFunction] = {}
    roots: dict[int, ModuleCall] = {}
    if not trace:
        roots = {id(g): module_calls(g) for g in lowered.values()}
        same_code = functools.partial(_kind_code, target, constants)
        kinds = kind_functions(list(lowered.values()), program, same_code, roots)
    functions = [
        emit_kind_function(target, kf, kinds, constants, program) for kf in distinct(kinds)
    ]
    for digest, fname in fnames.items():
        entries = [e for e in log.entries_sorted() if e.hash == digest]
        functions.append(
            emit_function(
                target,
                lowered[digest],
                fname,
                entries,
                digest,
                constants,
                trace,
                program,
                kinds,
                roots,
            )
        )
    parameters = [_row(p, bool(p["trainable"])) for p in log.model.get("params", [])]
    parameters += [_row(b, False) for b in log.model.get("buffers", [])]
    declared = parameter_rows(parameters, list(lowered.values()), kinds, program, roots)
    pred, loss = log.graph(info["prediction"]), log.graph(info["loss"])
    runtime, weights, parity = target.pieces
    helpers = runtime.helpers_used("\n".join(functions))
    fw = log.framework
    model_class = literal(str(log.model.get("class", "a model")))
    # the header's notes are comments: layout notes name modules, and no
    # docstring holds text from the log
    layout = target.layout_note.format(layout="\n".join(layout_lines)) if layout_lines else ""
    description = (
        f"Emitted by tracelog from a training log ({int(log.recorded)} batches recorded):\n"
        f"{len(log.graphs)} unique graphs, one function each, with their usage counts.\n\n"
        "Run it as a script beside weights.safetensors and sample.safetensors (or pass\n"
        "the log directory) to replay the recorded batch and print the parity table"
        + (
            ".\n"
            if standalone
            else "\n(the check is tracelog's; `tracelog emit --standalone` inlines it)."
        )
    ).rstrip("\n")
    fixed = [runtime.functions[n] for n in (*runtime.inlined, *helpers)]
    check = [c for c in target.check if c not in fixed] if standalone else []
    step = _sample_step(
        program,
        pred,
        loss,
        (fnames[info["prediction"]], fnames[info["loss"]]),
        log.sample_keys(),
        trace,
    )
    tail = [_predict_table(log, fnames), *([] if standalone else target.keys_called(step)), step]
    if target.data_dependent and any(
        "data_dependent" in traits_of(n) for g in lowered.values() for n in g.nodes
    ):
        tail.insert(0, target.data_dependent)
    tail += [weights.functions[n] for n in weights.inlined]
    prelude = [*runtime.statements, *weights.statements]
    entry = ENTRY_POINT if standalone else entry_point(target)
    # imports only for the names the program reads (pyflakes-clean)
    used: set[str] = set()
    for code in (*prelude, *fixed, *functions, *tail, *check, entry):
        used |= used_names(code)
    intro = _template("program_head.py.j2").render(
        title=f"{targets.get(target.name).title} program generated by tracelog.",
        description=description,
        imports=import_block(target.pieces, used),
        notes=[
            f"# Recorded from {literal(str(fw.get('name')))} "
            f"{literal(str(fw.get('version')))}, model class {model_class}.",
            *(f"# {line}" for line in layout.splitlines()),
        ],
    )
    tables = _template("program_parameters.py.j2").render(
        # one row a line (black keeps a trailing comma's explosion); never a
        # textual edit of the literal, which may hold any text in its strings
        kind_parameters=_kind_parameters(declared, kinds, weights.functions["under"]),
        parameters=_rows_text(declared.rows),
    )
    blocks = [_formatted(text, line_length) for text in (*fixed, *functions, *tail, *check)]
    return _program_text(_head(intro, prelude, tables, line_length), blocks, entry)


def head_source(intro: str, prelude: list[str], tables: str) -> str:
    """The program's head as written before black: the docstring, imports and
    notes (`intro`, ending in a comment), each prelude statement after a blank
    line, then two blank lines and the parameter tables."""
    return intro + "".join(f"\n{statement}\n" for statement in prelude) + "\n\n" + tables


def _head(intro: str, prelude: list[str], tables: str, line_length: int) -> str:
    """``format_source(head_source(...))`` in pieces: black formats top-level
    statements independently, so the prelude (the runtime's statements, the
    same in every program of a target) is formatted once per process, as
    the inlined functions are; the intro and the tables, which differ per
    log, are formatted on their own. Between the pieces, the blank lines
    black sets: the source's one between the notes and a statement and
    between statements, two around a class or def; the source's two before
    the tables."""
    parts = [format_source(intro, line_length).rstrip("\n")]
    before = ""
    for statement in prelude:
        text = _formatted(statement, line_length).rstrip("\n")
        parts.append("\n\n\n" if _is_definition(text) or _is_definition(before) else "\n\n")
        parts.append(text)
        before = text
    parts.append("\n\n\n")
    parts.append(format_source(tables, line_length))
    return "".join(parts)


def _is_definition(text: str) -> bool:
    """A top-level def, class or decorated definition, comments before it
    aside (black sets two blank lines around one)."""
    code = [line for line in text.splitlines() if not line.startswith("#")]
    return bool(code) and code[0].startswith(("def ", "async def ", "class ", "@"))


def _predict_table(log: TraceLog, fnames: dict[str, str]) -> str:
    """PREDICT: each phase's prediction graph function (the one that ran the
    most batches of that phase), which a target's module object runs in its
    mode (the PyTorch program's Model)."""
    best: dict[str, tuple[int, str]] = {}
    for e in log.entries_sorted():
        if e.kind == "prediction" and e.usage.batches > best.get(e.phase, (-1, ""))[0]:
            best[e.phase] = (e.usage.batches, fnames[e.hash])
    table = ", ".join(f"{literal(phase)}: {name}" for phase, (_, name) in sorted(best.items()))
    return (
        "# The prediction graph of each phase, by the batches it ran (Model runs its mode's).\n"
        f"PREDICT = {{{table}}}"
    )


def _row(entry: dict[str, Any], trains: bool) -> list[Any]:
    """A PARAMETERS row: [name, trains]. Its shape and dtype are the stored
    weights' (a target's module is declared from weights.safetensors), so a
    kind's rows are the same at every width and its calls share them."""
    return [str(entry["name"]), trains]


def _kind_parameters(declared: ParameterRows, kinds: Mapping[str, KindFunction], under: str) -> str:
    """Each module kind's parameter rows, by path under the module, inner
    kinds first: one line a row or a call of an inner kind (black keeps a
    trailing comma's explosion), after `under`, which the calls' lines call."""
    types = {
        kf.name.upper() + "_PARAMETERS": kf.call.module_type or kind_word(kf.call)
        for kf in kinds.values()
    }
    blocks = []
    for name, lines in declared.kinds.items():
        kind = types.get(name, "module")
        blocks.append(
            comment_text(f"# {kind}: parameters and buffers under the module.")
            + f"\n{name} = {_rows_text(lines)}\n\n"
        )
    return "".join([f"{under}\n\n\n"] if blocks else []) + "".join(blocks)


def _rows_text(lines: list[Any]) -> str:
    """A list of rows and of a kind's rows under a prefix; never a textual
    edit of a literal, which may hold any text in its strings."""
    text = []
    for line in lines:
        if isinstance(line, tuple):
            prefix, name = line
            text.append(f"    *under({literal(prefix)}, {name}),\n")
        else:
            text.append(f"    {literal(list(line))},\n")
    return "[\n" + "".join(text) + "]"


def _program_text(head: str, blocks: list[str], entry: str = ENTRY_POINT) -> str:
    """The program: its formatted head (docstring, imports, PARAMETERS), then
    each top-level function, formatted on its own, two blank lines apart as
    black sets them, then the script entry point. Black formats top-level
    definitions independently, so this is the text black gives for the whole
    (the tests check it on every program they emit), at a fraction of the cost:
    the inlined runtime, most of every program, is formatted once per process."""
    parts = [head.rstrip("\n"), *(block.rstrip("\n") for block in blocks)]
    parts.append(entry)
    return "\n\n\n".join(parts) + "\n"


# statements of a function body formatted in one call to black: black's time
# per statement grows with the size of the block it formats (2.4 ms at 250
# statements, 4.3 ms at 2,000), so a deep model's graph function is formatted
# in pieces of this many statements, which keeps emission linear in its size
CHUNK_STATEMENTS = 64
_CHUNK_HEADER = "def _chunk():\n"


@functools.lru_cache(maxsize=1024)
def _formatted(text: str, line_length: int, chunk: int = CHUNK_STATEMENTS) -> str:
    """One top-level definition, black-formatted at `line_length`; the same
    text is formatted once per line length (the runtime's functions recur in
    every program). A long function body is formatted `chunk` statements at a
    time, each piece inside a stand-in ``def`` so that it keeps its indent:
    black formats one statement of a block without looking at the others, so
    the pieces joined are the text black gives for the whole."""
    lines = text.splitlines(keepends=True)
    cuts = _chunk_cuts(text, lines, chunk)
    if not cuts:
        return format_source(text, line_length)
    pieces = [format_source("".join(lines[: cuts[0]]), line_length)]
    for start, end in zip(cuts, [*cuts[1:], len(lines)], strict=True):
        body = format_source(_CHUNK_HEADER + "".join(lines[start:end]), line_length)
        pieces.append(body[len(_CHUNK_HEADER) :])
    return "".join(pieces)


def _chunk_cuts(text: str, lines: list[str], chunk: int) -> list[int]:
    """The line indices where a function's body is cut into pieces of `chunk`
    statements: after a statement's last line, where the next piece starts
    with neither a blank line (black drops one after a def line) nor a string
    statement (black would take it for the stand-in def's docstring). None
    for anything but one long function."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return []
    body = tree.body[0].body
    cuts: list[int] = []
    since = 0
    for prev, stmt in itertools.pairwise(body):
        since += 1
        at = prev.end_lineno or prev.lineno  # the 0-based index of the line after prev
        starts_string = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if since >= chunk and lines[at].strip() and not starts_string:
            cuts.append(at)
            since = 0
    return cuts


@functools.cache
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tracelog", "templates"),
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(name)


def _sample_step(
    program: Namespace,
    pred: Graph,
    loss: Graph,
    functions: tuple[str, str],
    sample_keys: set[str],
    trace: bool = False,
) -> str:
    """sample_step(params, sample): the recorded batch through its prediction
    graph, then its loss graph, whose inputs are predictions, targets (by
    their sample keys) or data inputs, and whose draws (if any) are the
    sample's loss masks."""
    pname, lname = functions

    def from_sample(key: str) -> str:
        return f"_as_const(sample[{key}])"

    pargs = ", ".join(
        f"{n}={from_sample(f'input_key({literal(v.name)})')}"
        for n, v in zip(_arg_names(program, pred), pred.inputs, strict=True)
    )
    largs = []
    for v in loss.inputs:
        if any(o.role == v.name for o in pred.outputs):
            largs.append("outputs[" + literal(v.name) + "]")
        elif target_key(v.name) in sample_keys:
            largs.append(from_sample(f"target_key({literal(v.name)})"))
        else:
            largs.append(from_sample(f"input_key({literal(v.name)})"))
    names = _arg_names(program, loss)
    lcall = ", ".join(f"{n}={a}" for n, a in zip(names, largs, strict=True))
    if any(is_random(n) for n in loss.nodes):
        lcall += ", rng=loss_masks_as_rng(sample)"
    ptrace = ", _trace=_traces['prediction']" if trace else ""
    ltrace = ", _trace=_traces['loss']" if trace else ""
    return (
        f"def sample_step(params, sample{', _traces=None' if trace else ''}):\n"
        '    """The recorded batch: its prediction graph, then its loss graph."""\n'
        f"    outputs = {pname}(params, {pargs}, rng=masks_as_rng(sample){ptrace})\n"
        f"    loss = {lname}(params, {lcall}{ltrace})\n"
        "    return outputs, loss"
    )


def write_program(
    log_dir: str | os.PathLike[str],
    target: Target,
    out: str | None = None,
    line_length: int = LINE_LENGTH,
    standalone: bool = False,
) -> Path:
    log = TraceLog.load(log_dir, check_tensors=False)  # the tensors: as read
    text = build_program(log, target, line_length=line_length, standalone=standalone)
    path = Path(out) if out else Path(log_dir) / targets.file_name(target.name)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
