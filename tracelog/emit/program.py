"""Build a program from a log: one function per unique graph, the parity
check, a jinja2 skeleton, black. Target specifics come from a Target."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from tracelog.emit.common import (
    EmitTable,
    Namespace,
    RuleCtx,
    check_supported,
    const_value,
    format_source,
    literal,
    shape_text,
    usage_comment,
)
from tracelog.errors import LogError, UnsupportedOpError
from tracelog.ir import Graph
from tracelog.log import GraphEntry, TraceLog


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    table: EmitTable
    helpers: dict[str, str]
    reserved: tuple[str, ...]
    template: str
    file_name: str
    const_expr: str  # format with {value} and {dtype}
    layout_note: str  # said in the header when a pass changed the layout: format with {layout}
    # rewrites before emission; each returns (graph, report with .changed and .summary())
    passes: tuple[Callable[[Graph], tuple[Graph, Any]], ...] = ()


PARITY = '''
def load_params(path):
    """Read weights.safetensors: parameters as trainable objects of this
    framework, buffers as plain tensors, large constants by key."""
    arrays = load_file(path)
    params = {{name: _as_param(arrays[name], trainable) for name, trainable in PARAMETERS}}
    params.update({{k: _as_const(v) for k, v in arrays.items() if k.startswith("const/")}})
    return params


def _compare(name, got, want, atol, rtol):
    got = np.asarray(_numpy(got), dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return name, float("inf"), float("inf"), False
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-12)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    return name, float(err.max(initial=0.0)), float(rel.max(initial=0.0)), ok


{sample_step}


def sample_params(log_dir):
    """The parameters and buffers as they were when the sample batch ran."""
    sample = load_file(os.path.join(log_dir, "sample.safetensors"))
    weights = load_file(os.path.join(log_dir, "weights.safetensors"))
    params = {{}}
    for name, trainable in PARAMETERS:
        key = "param/" + name if "param/" + name in sample else "buffer/" + name
        params[name] = _as_param(sample[key], trainable)
    params.update({{k: _as_const(v) for k, v in weights.items() if k.startswith("const/")}})
    return params


def check_parity(log_dir, atol=1e-5, rtol=1e-4, grad_atol=1e-4):
    """Replay the recorded batch with the parameters of that moment; compare
    predictions, buffer updates, loss and parameter gradients."""
    sample = load_file(os.path.join(log_dir, "sample.safetensors"))
    params = sample_params(log_dir)
    trainable = [name for name, flag in PARAMETERS if flag]

    def step(p):
        return sample_step(p, sample{trace_arg})

    rows = []
    for label, (outputs, loss, grads) in _runs(step, params, trainable):
        for role, value in outputs.items():
            if role.startswith("prediction"):
                rows.append(_compare(role + label, value, sample["output/" + role], atol, rtol))
            elif role.startswith("update:"):
                want = sample["update/" + role[7:]]
                rows.append(_compare(role + label, value, want, atol, rtol))
        rows.append(_compare("loss" + label, loss, sample["loss"], atol, rtol))
        for name, grad in zip(trainable, grads, strict=True):
            if "grad/" + name in sample:
                want = sample["grad/" + name]
                got = np.zeros_like(want) if grad is None else grad
                rows.append(_compare("grad " + name + label, got, want, grad_atol, rtol))
    return rows


def main():
    log_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = check_parity(log_dir)
    width = max(len(r[0]) for r in rows)
    print(f"{{'output':<{{width}}}}  {{'max abs err':>12}}  {{'max rel err':>12}}  ok")
    for name, err, rel, ok in rows:
        print(f"{{name:<{{width}}}}  {{err:>12.3e}}  {{rel:>12.3e}}  {{'yes' if ok else 'NO'}}")
    ok = all(r[3] for r in rows)
    print("parity: ok" if ok else "parity: MISMATCH")
    return 0 if ok else 1
'''


def _function_names(log: TraceLog) -> dict[str, str]:
    """One name per unique graph, from its kind and the phase it first ran in."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for e in log.entries_sorted():
        if e.hash in names:
            continue
        base = ("predict_" if e.kind == "prediction" else "loss_") + e.phase
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name)
        names[e.hash] = name
    return names


# names the program defines at module level, besides its graph functions
PROGRAM_NAMES = (
    "PARAMETERS", "load_params", "sample_step", "sample_params", "check_parity", "main",
    "_compare", "params", "rng", "_trace", "_traces",
    # defined by every target's template
    "_as_param", "_as_const", "_numpy", "_value_and_grads", "_runs",
)  # fmt: skip


def _function_namespace(target: Target) -> Namespace:
    return Namespace(target.reserved + tuple(target.helpers) + PROGRAM_NAMES)


def _arg_names(target: Target, graph: Graph) -> list[str]:
    """The printed names of a graph function's data arguments (as emit_function
    names them: first, in order, in a fresh namespace)."""
    ns = _function_namespace(target)
    return [ns.name(v.name, ("v", v.name)) for v in graph.inputs]


def emit_function(
    target: Target,
    graph: Graph,
    fname: str,
    entries: list[GraphEntry],
    digest: str,
    constants: dict[str, np.ndarray],
    helpers: set[str],
    trace: bool = False,
) -> str:
    ns = _function_namespace(target)
    names: dict[str, str] = {"": "None"}
    args = []
    for v in graph.inputs:
        names[v.name] = ns.name(v.name, ("v", v.name))
        args.append(names[v.name])
    lines: list[str] = []
    for v in graph.values.values():
        if v.kind in ("param", "buffer"):
            names[v.name] = ns.name(v.name, ("v", v.name))
            lines.append(f"{names[v.name]} = params[{literal(v.name)}]")
        elif v.kind == "const":
            if v.const is not None and v.const.digest is not None:
                names[v.name] = f"params[{literal('const/' + v.const.digest)}]"
            else:
                value = const_value(v, constants)
                names[v.name] = target.const_expr.format(
                    value=literal(value.tolist()), dtype=v.type.dtype
                )
    n_dropout = 0
    for node in graph.nodes:
        outs = [ns.name(o, ("v", o)) if o else "_" for o in node.outputs]
        for o, printed in zip(node.outputs, outs, strict=True):
            if o:
                names[o] = printed
        ctx = RuleCtx(graph, node, names, constants, helpers, outs)
        if node.op == "Dropout" and not node.domain:
            ctx.mask_key = f"mask.{n_dropout}"
            n_dropout += 1
        try:
            expr = target.table[node.qualified_op](ctx)
        except NotImplementedError as e:
            # a form of the op (attributes, computed operands) this target's rule
            # cannot write: reported as a missing rule is, one line, exit 2
            raise UnsupportedOpError(
                target.name, [(f"{node.qualified_op} ({e})", 1, [node.module])]
            ) from None
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(node.attrs.items()))
        where = f"{node.module or '<root>'} ({node.module_type})" if node.module_type else "<loss>"
        shapes = ", ".join(shape_text(graph.values[o].type) for o in node.outputs if o)
        lines.append(f"# {node.qualified_op}({attrs}) {where} -> {shapes}")
        lines.append(f"{', '.join(outs)} = {expr}")
        if trace:
            for o, printed in zip(node.outputs, outs, strict=True):
                if o:
                    lines.append(f"_trace[{literal(o)}] = {printed}")
    if graph.kind == "prediction":
        ret = ", ".join(f"{literal(o.role)}: {names[o.name]}" for o in graph.outputs)
        lines.append(f"return {{{ret}}}")
        sig = ", ".join(["params", *args, "rng=None"] + (["_trace=None"] if trace else []))
    else:
        lines.append(f"return {names[graph.output('loss').name]}")
        sig = ", ".join(["params", *args] + (["_trace=None"] if trace else []))
    header = [
        f"# {graph.kind} graph {digest[:12]}, {len(graph.nodes)} ops. {usage_comment(entries)}",
        f"def {fname}({sig}):",
    ]
    doc = (
        '    """Returns {role: tensor}: predictions and buffer updates."""'
        if graph.kind == "prediction"
        else '    """Returns the loss."""'
    )
    return "\n".join(header + [doc] + ["    " + line for line in lines])


def build_program(log: TraceLog, target: Target, trace: bool = False) -> str:
    check_supported(log, target.table, target.name)
    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch, so no parity check can be emitted")
    # Rules may read constant values (shapes, axes, indices); the large ones
    # live in the weights file.
    stored = any(v.const and v.const.digest for g in log.graphs.values() for v in g.constants)
    constants = log.weights() if stored else {}
    fnames = _function_names(log)
    helpers: set[str] = set()
    functions = []
    layout_lines = []
    for digest, fname in fnames.items():
        entries = [e for e in log.entries_sorted() if e.hash == digest]
        graph = log.graphs[digest]
        for rewrite in target.passes:
            graph, report = rewrite(graph)
            if (
                report is not None
                and getattr(report, "kept", None) is not None
                and graph is not log.graphs[digest]
            ):
                if report.changed or report.kept:
                    layout_lines.append(f"  {fname}: {report.summary()}")
        functions.append(
            emit_function(target, graph, fname, entries, digest, constants, helpers, trace)
        )
    parameters = [(p["name"], bool(p["trainable"])) for p in log.model.get("params", [])]
    parameters += [(b["name"], False) for b in log.model.get("buffers", [])]
    pred, loss = log.graph(info["prediction"]), log.graph(info["loss"])
    sample_step = _sample_step(
        target, pred, loss, fnames[info["prediction"]], fnames[info["loss"]], trace
    )
    trace_arg = ", {'prediction': {}, 'loss': {}}" if trace else ""
    parity = PARITY.format(sample_step=sample_step, trace_arg=trace_arg)
    fw = log.framework
    layout = (
        target.layout_note.format(layout="\n".join(layout_lines)) + "\n\n" if layout_lines else ""
    )
    description = (
        f"Emitted by tracelog from a {fw.get('name')} {fw.get('version')} training log of\n"
        f"{log.model.get('class', 'a model')} ({log.recorded} batches recorded): "
        f"{len(log.graphs)} unique graphs, one function each,\nwith their usage counts.\n\n"
        f"{layout}"
        "Run it as a script beside weights.safetensors and sample.safetensors (or pass\n"
        "the log directory) to replay the recorded batch and print the parity table."
    )
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tracelog", "templates"),
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
    )
    text = env.get_template(target.template).render(
        title=f"{target.title} program for {log.model.get('class', 'a model')}, generated by tracelog.",
        description=description,
        parameters=literal([list(p) for p in parameters])
        .replace("[[", "[\n    [")
        .replace("]]", "],\n]"),
        helpers=[target.helpers[h].strip() + "\n" for h in sorted(helpers)],
        functions=functions,
        parity=parity.strip(),
    )
    return format_source(text)


def _sample_step(
    target: Target, pred: Graph, loss: Graph, pname: str, lname: str, trace: bool = False
) -> str:
    def from_sample(key: str) -> str:
        return "_as_const(sample[" + literal(key) + "])"

    pargs = ", ".join(
        f"{n}={from_sample('input/' + v.name)}"
        for n, v in zip(_arg_names(target, pred), pred.inputs, strict=True)
    )
    largs = []
    for v in loss.inputs:
        if any(o.role == v.name for o in pred.outputs):
            largs.append("outputs[" + literal(v.name) + "]")
        elif v.name.startswith("target"):
            largs.append(from_sample("target/" + v.name))
        else:
            largs.append(from_sample("input/" + v.name))
    names = _arg_names(target, loss)
    lcall = ", ".join(f"{n}={a}" for n, a in zip(names, largs, strict=True))
    ptrace = ", _trace=_traces['prediction']" if trace else ""
    ltrace = ", _trace=_traces['loss']" if trace else ""
    return (
        f"def sample_step(params, sample{', _traces' if trace else ''}):\n"
        '    """The recorded batch: its prediction graph, then its loss graph."""\n'
        '    rng = {k.replace("/", "."): v for k, v in sample.items() if k.startswith("mask/")}\n'
        f"    outputs = {pname}(params, {pargs}, rng=rng{ptrace})\n"
        f"    loss = {lname}(params, {lcall}{ltrace})\n"
        "    return outputs, loss"
    )


def write_program(log_dir: str | os.PathLike[str], target: Target, out: str | None = None) -> Path:
    log = TraceLog.load(log_dir)
    text = build_program(log, target)
    path = Path(out) if out else Path(log_dir) / target.file_name
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
