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
import functools
import itertools
import os
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
    shape_text,
    usage_comment,
)
from tracelog.emit.inline import Inlinable, import_block, inlinable, used_names
from tracelog.emit.names import value_candidates
from tracelog.emit.onnx import const_array
from tracelog.emit.rules import RuleCtx, Spellings, write
from tracelog.errors import LogError, UnsupportedOpError
from tracelog.ir import Graph, Node, Value
from tracelog.log import GraphEntry, TraceLog
from tracelog.ops import is_random
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

    @cached_property
    def pieces(self) -> list[Inlinable]:
        """The modules a program takes imports, statements and functions
        from: the target's runtime, then the parity check."""
        return [inlinable(self.runtime), inlinable(PARITY_RUNTIME)]

    @cached_property
    def keys(self) -> list[str]:
        """The sample key functions every program carries (tracelog.sample:
        only these functions; the rest of that module is the package's)."""
        return [
            inlinable(sample_format.__name__).functions[f.__name__] for f in sample_format.INLINED
        ]

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


PARITY_RUNTIME = "tracelog.emit.runtime.parity"

ENTRY_POINT = 'if __name__ == "__main__":\n    sys.exit(main())'

# names the generated part of a program defines at module level
PROGRAM_NAMES = ("PARAMETERS", "sample_step", "params", "rng", "_trace", "_traces")


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
) -> str:
    body = _Body(target, graph, constants, program or Namespace(target.reserved), trace)
    args = [body.bind(v.name) for v in graph.inputs]
    lines = body.value_lines() + body.node_lines()
    ret, sig = _return_and_signature(graph, body.names, args, trace)
    lines.append(ret)
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


@dataclass
class _Body:
    """One graph function being written: its own namespace (seeded with every
    name the program defines) and the printed name of each value."""

    target: Target
    graph: Graph
    constants: dict[str, np.ndarray]
    program: Namespace
    trace: bool = False
    names: dict[str, str] = field(default_factory=lambda: {"": "None"})

    def __post_init__(self) -> None:
        self.ns = self.program.child()
        self.candidates = value_candidates(self.graph)

    def bind(self, value: str) -> str:
        """The printed name of a value the function defines (a fresh one):
        node outputs by module and role (tracelog.emit.names), inputs and
        parameters by their own names."""
        self.names[value] = self.ns.name(self.candidates.get(value, value), ("v", value))
        return self.names[value]

    def value_lines(self) -> list[str]:
        """A line reading each parameter and buffer from params; constants are
        named by their expression, with no line."""
        lines: list[str] = []
        for v in self.graph.values.values():
            if v.kind in ("param", "buffer"):
                lines.append(f"{self.bind(v.name)} = params[{literal(v.name)}]")
            elif v.kind == "const":
                self.names[v.name] = _const_text(self.target, v, self.constants)
        return lines

    def node_lines(self) -> list[str]:
        """Per node: a comment saying what it is, its statement, and with trace
        the lines recording its outputs."""
        lines: list[str] = []
        n_random = 0
        for node in self.graph.nodes:
            outs = [self.bind(o) if o else "_" for o in node.outputs]
            ctx = RuleCtx(self.graph, node, self.names, self.constants, outs)
            if is_random(node):  # takes its recorded mask from rng when replayed
                ctx.mask_key = sample_format.rng_key(n_random)
                n_random += 1
            lines += [_node_comment(self.graph, node), _statement(self.target, ctx)]
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


def _node_comment(graph: Graph, node: Node) -> str:
    """# op(attributes) module (module type) -> output shapes."""
    attrs = ", ".join(f"{k}={v}" for k, v in sorted(node.attrs.items()))
    where = f"{node.module or '<root>'} ({node.module_type})" if node.module_type else "<loss>"
    shapes = ", ".join(shape_text(graph.values[o].type) for o in node.outputs if o)
    return comment_text(f"# {node.qualified_op}({attrs}) {where} -> {shapes}")


def _return_and_signature(
    graph: Graph, names: dict[str, str], args: list[str], trace: bool
) -> tuple[str, str]:
    """The return statement and the parameter list: a prediction graph returns
    {role: tensor} and takes rng; a loss graph returns the loss."""
    traced = ["_trace=None"] if trace else []
    if graph.kind == "prediction":
        ret = ", ".join(f"{literal(o.role)}: {names[o.name]}" for o in graph.outputs)
        return f"return {{{ret}}}", ", ".join(["params", *args, "rng=None", *traced])
    return f"return {names[graph.output('loss').name]}", ", ".join(["params", *args, *traced])


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
    log: TraceLog, target: Target, trace: bool = False, line_length: int = LINE_LENGTH
) -> str:
    check_supported(log, target.table, target.name)
    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch, so no parity check can be emitted")
    # Rules may read constant values (shapes, axes, indices); the large ones
    # live in the weights file.
    stored = any(v.const and v.const.digest for g in log.graphs.values() for v in g.constants)
    constants = log.weights() if stored else {}
    program, fnames = _program_namespace(target, log)
    functions = []
    layout_lines: list[str] = []
    for digest, fname in fnames.items():
        entries = [e for e in log.entries_sorted() if e.hash == digest]
        graph = _lowered(target, log.graphs[digest], fname, layout_lines)
        functions.append(
            emit_function(target, graph, fname, entries, digest, constants, trace, program)
        )
    parameters = [(p["name"], bool(p["trainable"])) for p in log.model.get("params", [])]
    parameters += [(b["name"], False) for b in log.model.get("buffers", [])]
    pred, loss = log.graph(info["prediction"]), log.graph(info["loss"])
    runtime, parity = target.pieces
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
        "the log directory) to replay the recorded batch and print the parity table."
    )
    fixed = [runtime.functions[n] for n in (*runtime.inlined, *helpers)]
    step = _sample_step(
        program,
        pred,
        loss,
        (fnames[info["prediction"]], fnames[info["loss"]]),
        set(log.sample()),
        trace,
    )
    # a target's runtime may replace a parity default (_runs: JAX runs twice)
    tail = [*target.keys, step]
    tail += [parity.functions[n] for n in parity.inlined if n not in runtime.functions]
    prelude = [*runtime.statements, *parity.statements]
    # imports only for the names the program reads (pyflakes-clean)
    used: set[str] = set()
    for code in (*prelude, *fixed, *functions, *tail, ENTRY_POINT):
        used |= used_names(code)
    head = _template().render(
        title=f"{targets.get(target.name).title} program generated by tracelog.",
        description=description,
        imports=import_block(target.pieces, used),
        notes=[
            f"# Recorded from {literal(str(fw.get('name')))} "
            f"{literal(str(fw.get('version')))}, model class {model_class}.",
            *(f"# {line}" for line in layout.splitlines()),
        ],
        prelude=prelude,
        # one row a line (black keeps a trailing comma's explosion); never a
        # textual edit of the literal, which may hold any text in its strings
        parameters="[\n" + "".join(f"    {literal(list(p))},\n" for p in parameters) + "]",
    )
    blocks = [_formatted(text, line_length) for text in (*fixed, *functions, *tail)]
    return _program_text(format_source(head, line_length), blocks)


def _program_text(head: str, blocks: list[str]) -> str:
    """The program: its formatted head (docstring, imports, PARAMETERS), then
    each top-level function, formatted on its own, two blank lines apart as
    black sets them, then the script entry point. Black formats top-level
    definitions independently, so this is the text black gives for the whole
    (the tests check it on every program they emit), at a fraction of the cost:
    the inlined runtime, most of every program, is formatted once per process."""
    parts = [head.rstrip("\n"), *(block.rstrip("\n") for block in blocks)]
    parts.append(ENTRY_POINT)
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
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tracelog", "templates"),
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("program_head.py.j2")


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
    their sample keys) or data inputs."""
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
) -> Path:
    log = TraceLog.load(log_dir)
    text = build_program(log, target, line_length=line_length)
    path = Path(out) if out else Path(log_dir) / targets.file_name(target.name)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
