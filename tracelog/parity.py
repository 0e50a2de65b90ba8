"""Parity: run the emitted program on the recorded batch and compare it with
what the source framework computed. On a mismatch, replay node by node
against onnx.reference to name the first node whose output diverges (for
the ONNX target, against the PyTorch program's nodes)."""

from __future__ import annotations

import importlib.util
import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracelog.emit import targets
from tracelog.emit.harness import attach
from tracelog.emit.program import Target, build_program, write_program
from tracelog.emit.runtime.parity import FLOAT32_FACTOR, TRANSLATION_RTOL
from tracelog.ir import Node
from tracelog.log import TraceLog
from tracelog.passes.layout import TO_NHWC
from tracelog.progress import stage
from tracelog.sample import input_key, sample_feeds
from tracelog.verify import Comparison, Report, all_values, compare, unreferenced


def _import_path(path: Path, target: str | None = None) -> types.ModuleType:
    """The program at `path` as a module; with its `target`, with the parity
    check attached (tracelog.emit.harness: what its __main__ runs)."""
    spec = importlib.util.spec_from_file_location(f"tracelog_program_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if target is not None:
        attach(module.__dict__, target)
    return module


def _module_from_text(text: str, name: str, target: str | None = None) -> types.ModuleType:
    # Text that tracelog itself generated from a validated log (names sanitised,
    # literals through repr): running it is running the emitted program.
    module = types.ModuleType(name)
    exec(compile(text, f"<{name}>", "exec"), module.__dict__)
    if target is not None:
        attach(module.__dict__, target)
    return module


def check(
    log_dir: str | os.PathLike[str],
    target: str = "tensorflow",
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    grad_atol: float = 1e-4,
    draw: int = 0,
) -> Report:
    """Emit `target`'s program (or model) into the log directory, run its
    parity check on the recorded batch, and report per-output errors (`.ok`).
    A bfloat16 log: each target runs in the dtypes the source ran in (the ONNX
    model on onnx.reference, as onnxruntime has no bfloat16 arithmetic).

    `draw` k > 0 (program targets, a sample with a float64 reference): only
    the float32 rows of the batch and weights nudged by one ulp in pattern k,
    each against the program in float64 on the same values and the draw's
    own gate decisions: another draw of float32 rounding on the sample (a
    ratio above 2 that is one draw's reads near 1 on another)."""
    spec = targets.get(target)
    return spec.check(log_dir, atol=atol, rtol=rtol, grad_atol=grad_atol, draw=draw)


def check_program(
    log_dir: str | os.PathLike[str],
    tgt: Target,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    grad_atol: float = 1e-4,
    draw: int = 0,
) -> Report:
    """Write a program target's program and run its own parity check (`draw`:
    check())."""
    stage("checking the log's tensor files")
    log = TraceLog.load(log_dir)  # the program reads them as they are: the sha256s first
    stage(f"writing {tgt.name}'s program")
    path = write_program(log_dir, tgt)
    stage(f"importing {path.name} and its framework")
    module = _import_path(path, tgt.name)
    stage(f"running {path.name} on the recorded batch")
    rows = module.check_parity(str(log_dir), atol, rtol, grad_atol, draw)
    comparisons = [Comparison(*row) for row in rows]
    if draw:
        title = (
            f"{path.name}: float32 on the sample nudged by one ulp (draw {draw}) vs the "
            f"program in float64 on the same values and the float32 run's gates, within "
            f"{FLOAT32_FACTOR:g}x the source's own error: the ratio"
        )
        return Report(title, comparisons)
    if any(c.name.endswith(" [float64]") for c in comparisons):
        title = (
            f"{path.name}: translation ([float64] rows: in float64 vs the float64 reference, "
            f"within {TRANSLATION_RTOL:g} of each output's largest value) and the recorded "
            f"dtypes (float32; bfloat16/float16 where the source ran them) vs the reference, "
            f"within {FLOAT32_FACTOR:g}x the source's own error in them: the ratio"
        )
    else:
        title = (
            f"{path.name} vs recorded batch (atol {atol:g}, rtol {rtol:g}; gradients atol "
            f"{grad_atol:g}){unreferenced(log)}"
        )
    report = Report(title, comparisons)
    if not report.ok:
        report.divergence = accuracy_only(report)
    if not report.ok and report.divergence is None:
        stage("a mismatch: replaying node by node for the first divergence")
        report.divergence = first_divergence(TraceLog.load(log_dir), tgt, log_dir, atol, rtol)
    return report


def _program_trace(
    log: TraceLog,
    target: Target,
    log_dir: str | os.PathLike[str],
    float64: bool,
    edit: Callable[[str], str] | None,
) -> dict[str, dict[str, Any]]:
    """Every value the emitted program computes on the sample batch, by IR
    value name, per graph kind ("prediction", "loss"): in float64 as its
    translation check runs it, or as recorded. `edit` changes the tracing
    program's text first (a test's mutation)."""
    text = build_program(log, target, trace=True)
    module = _module_from_text(edit(text) if edit else text, "tracelog_trace")
    traces: dict[str, dict[str, object]] = {"prediction": {}, "loss": {}}
    if float64:
        stored = module._load(os.path.join(log_dir, "sample.safetensors"))
        with module._in_float64():
            params = module.sample_params(str(log_dir), float64=True)
            module.sample_step(params, module._promoted(stored), traces)
    else:
        module.sample_step(module.sample_params(str(log_dir)), log.sample(), traces)
    return {kind: {k: module._numpy(v) for k, v in t.items()} for kind, t in traces.items()}


def _graph_values(log: TraceLog, graphs: TraceLog, float64: bool) -> list[tuple[str, Any, dict]]:
    """(kind, graph, every node output by IR name) for the sample's prediction
    and loss graphs of `graphs` (a log, or the same log as a target loaded
    it), run by onnx.reference on `log`'s sample batch, in float64 where asked
    (the graphs widened by tracelog.passes.precision)."""
    from tracelog.passes.precision import promoted_arrays, promoted_float64

    info: dict[str, Any] = dict(log.sample_info or {})
    sample, weights = log.sample(), log.weights()
    feeds = sample_feeds(sample)
    pred, loss = graphs.graph(info["prediction"]), graphs.graph(info["loss"])
    if float64:
        pred, loss = promoted_float64(pred), promoted_float64(loss)
        feeds, weights = promoted_arrays(feeds), promoted_arrays(weights)
    ref_pred = all_values(pred, feeds, constants=weights)
    loss_feeds = dict(feeds)
    for out in pred.outputs:
        if out.name in ref_pred:
            loss_feeds[out.role] = ref_pred[out.name]
        elif input_key(out.name) in sample:
            loss_feeds[out.role] = feeds.get(input_key(out.name), sample[input_key(out.name)])
    ref_loss = all_values(loss, loss_feeds, constants=weights)
    return [("prediction", pred, ref_pred), ("loss", loss, ref_loss)]


def _paired(
    graphs: list[tuple[str, Any, dict]], traces: dict[str, dict[str, Any]]
) -> list[tuple[str, Node, str, Any, Any]]:
    """(kind, node, value name, graph value, program value) for every node
    output both sides computed; a value the program computed channels-last
    (the layout pass) is compared in that layout."""
    found = []
    for kind, graph, values in graphs:
        trace = traces[kind]
        channels_last = _channels_last_names(trace)
        for node in graph.nodes:
            for o in node.outputs:
                if o not in values:
                    continue
                want = values[o]
                if o in trace:
                    got = trace[o]
                elif o in channels_last and np.ndim(want) == 4:
                    got, want = trace[channels_last[o]], np.transpose(want, TO_NHWC)
                else:
                    continue
                found.append((kind, node, o, want, got))
    return found


def accuracy_only(report: Report) -> str | None:
    """The line for a report whose translation rows all pass and whose float32
    rows fail: the program computes the source's function, less accurately
    in float32 than the source did (no node is wrong, so none is searched
    for). None otherwise."""
    translation = [c for c in report.comparisons if c.name.endswith("[float64]")]
    if not translation or not all(c.ok for c in translation):
        return None
    worst = max((c.ratio for c in report.comparisons if c.ratio is not None), default=0.0)
    return (
        "the translation check passes: the float32 rows fail on accuracy (the program's "
        f"float32 error up to {worst:.1f}x the source's own, above {FLOAT32_FACTOR:g}x), "
        "not on a wrong node"
    )


def node_comparisons(
    log: TraceLog,
    target: Target,
    log_dir: str | os.PathLike[str],
    atol: float,
    rtol: float,
    *,
    float64: bool = False,
    edit: Callable[[str], str] | None = None,
) -> list[tuple[str, Node, Comparison]]:
    """Every node output of the sample's prediction and loss graphs, as the
    emitted program computes it, against onnx.reference on the same inputs.
    Values the program computes in another layout are compared in it.

    float64: both run in float64 (the program as its translation check runs
    it, the graphs widened by tracelog.passes.precision), each node judged
    within TRANSLATION_RTOL of its largest value (near-zero values: NEAR_ZERO
    of the median scale), so float32 rounding never points at a node. `edit`
    changes the tracing program's text first (a test's mutation)."""
    traces = _program_trace(log, target, log_dir, float64, edit)
    paired = _paired(_graph_values(log, log, float64), traces)
    return _judged(paired, float64, atol, rtol, program_is_reference=False)


def model_node_comparisons(
    log: TraceLog,
    log_dir: str | os.PathLike[str],
    atol: float,
    rtol: float,
    *,
    float64: bool = False,
) -> list[tuple[str, Node, Comparison]]:
    """The ONNX target's nodes (the graphs as the ONNX target loads them,
    run by onnx.reference) against the PyTorch program's values of the same
    nodes: a program built by another emitter, whose own translation check
    ties it to the source. (The IR and model.onnx share their node
    serialisation, so the IR alone cannot point at an ONNX node.)"""
    from tracelog.emit import get_target, onnx_model

    source = TraceLog.load(log_dir)  # `log` may be the ONNX target's own reading of it
    graphs = onnx_model.TraceLog.load(log_dir)  # the log as the ONNX target reads it
    traces = _program_trace(source, get_target("torch"), log_dir, float64, None)
    paired = _paired(_graph_values(source, graphs, float64), traces)
    return _judged(paired, float64, atol, rtol, program_is_reference=True)


def _judged(
    paired: list[tuple[str, Node, str, Any, Any]],
    float64: bool,
    atol: float,
    rtol: float,
    program_is_reference: bool,
) -> list[tuple[str, Node, Comparison]]:
    judge = _translation_judge([graph_value for *_, graph_value, _ in paired])
    found = []
    for kind, node, name, graph_value, program_value in paired:
        got, want = (
            (graph_value, program_value)
            if program_is_reference
            else (
                program_value,
                graph_value,
            )
        )
        c = judge(name, got, want) if float64 else compare(name, got, want, atol, rtol)
        found.append((kind, node, c))
    return found


def _translation_judge(values: list[np.ndarray]) -> Callable[[str, Any, Any], Comparison]:
    """A node's float64 value against the float64 graph's: within
    TRANSLATION_RTOL of its largest value, or of NEAR_ZERO times the median
    scale of all nodes' values where it is smaller (a value that cancels to
    near zero carries the rounding of the terms it came from)."""
    from tracelog.emit.runtime.parity import NEAR_ZERO, _error

    scales = [
        float(np.abs(v[np.isfinite(v)]).max(initial=0.0))
        for v in values
        if np.asarray(v).dtype.kind == "f" and np.size(v)
    ]
    floor = NEAR_ZERO * float(np.median(scales)) if scales else 0.0

    def judge(name: str, got: Any, want: Any) -> Comparison:
        g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if g.shape != w.shape:
            return Comparison(name, float("inf"), float("inf"), False)
        err = _error(g, w)
        scale = max(float(np.abs(w[np.isfinite(w)]).max(initial=0.0)), floor)
        return Comparison(name, err, err / max(scale, 1e-300), err <= TRANSLATION_RTOL * scale)

    return judge


def _channels_last_names(trace: dict[str, object]) -> dict[str, str]:
    """IR value name -> the program's name for its NHWC twin ("v5" -> "v5_nhwc")."""
    twins: dict[str, str] = {}
    for name in sorted(trace):
        base, sep, _ = name.partition("_nhwc")
        if sep and base not in twins:
            twins[base] = name
    return twins


def first_divergence(
    log: TraceLog,
    target: Target | None,
    log_dir: str | os.PathLike[str],
    atol: float,
    rtol: float,
    *,
    edit: Callable[[str], str] | None = None,
) -> str:
    """Name the first node (prediction graph, then loss graph) whose output in
    the emitted program differs from onnx.reference on the recorded batch:
    searched in float64 (node_comparisons), where float32 rounding cannot
    point at the wrong node; in float32 within atol/rtol where the float64
    run cannot be made (a bfloat16 log, a kernel with no float64 form).
    target None: the ONNX target's model, node by node against the PyTorch
    program (model_node_comparisons)."""
    for float64 in (True, False):
        try:
            if target is None:
                found = model_node_comparisons(log, log_dir, atol, rtol, float64=float64)
            else:
                found = node_comparisons(
                    log, target, log_dir, atol, rtol, float64=float64, edit=edit
                )
        except (
            Exception
        ) as e:  # onnx.reference lacks or miscomputes some ops (grouped ConvTranspose)
            if float64:
                continue
            first = str(e).splitlines()[0][:120] if str(e) else ""
            return f"the divergent node could not be located: {type(e).__name__}: {first}"
        precision = "in float64" if float64 else f"in float32 (atol {atol:g}, rtol {rtol:g})"
        for kind, node, c in found:
            if not c.ok:
                where = (node.module or "<root>") if kind == "prediction" else "<loss>"
                return (
                    f"first divergent node {precision}: {node.qualified_op} in {kind} graph at "
                    f"{where} ({node.module_type or 'loss'}), output {c.name}: "
                    f"max abs err {c.max_abs:.3e}"
                )
        if float64:
            return "no single node diverges in float64: the outputs differ past the graph"
        return "no single node diverges beyond tolerance: the error accumulates over nodes"
    raise AssertionError("unreachable")
