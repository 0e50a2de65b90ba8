"""The ONNX target: one model.onnx holding every unique graph of a log.

Each unique graph is a local function (domain "tracelog.graphs", named as the
program emitters name it: predict_train, loss_train, ...) whose doc string
carries its usage counts. The main graph runs the sample batch's prediction
function and then its loss function, with the batch dim as the dim_param
"batch" and the final parameters and buffers as initializers named by module
path (also graph inputs, so a caller may feed other values).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracelog.emit.common import Namespace, check_supported, usage_comment
from tracelog.emit.onnx import (
    _graph_nodes,
    _onnx,
    const_array,
    mask_inputs,
    mask_type,
    value_info,
)
from tracelog.emit.shaped import KindFunction, kind_functions, kind_word
from tracelog.errors import LogError
from tracelog.ir import Graph, Value
from tracelog.log import TraceLog
from tracelog.ops import ONNX_IR_VERSION, ONNX_OPSET, TRACELOG_DOMAIN, TRACELOG_OPSET, is_random
from tracelog.passes.modules import ModuleCall, module_calls
from tracelog.registry import Table
from tracelog.sample import LOSS_KEY, draw_key, output_key, update_key

if TYPE_CHECKING:
    from tracelog.verify import Comparison, Report

GRAPHS_DOMAIN = "tracelog.graphs"
# each module kind called twice or more: a function, called once per call
MODULES_DOMAIN = "tracelog.modules"

# The ONNX "table": every vocabulary op serialises as itself; tracelog ops as
# the ONNX functions their schemas give. Kept as a table so that the shared
# coverage checks treat all targets alike.
TABLE: Table[Any] = Table("onnx")


def _fill_table() -> None:
    from tracelog.ops import vocabulary

    for schema in vocabulary():
        if schema.domain == TRACELOG_DOMAIN and schema.function is None:
            reason = schema.no_function or "the source op could not be recorded"
            TABLE.not_yet(schema.qualified, reason=reason)
        else:
            TABLE.add(schema.qualified, schema)


_fill_table()


class _Modules:
    """Module-shaped functions (issue 15): each module kind called twice or
    more (tracelog.emit.shaped, by kind digest: ONNX functions carry no
    shapes, but a kind's constants and attributes are its own) is one local
    function in domain MODULES_DOMAIN, written from its first call, taking
    the call's data inputs, then its parameters and buffers, then its masks;
    every call is one node. The model's functions list holds them inner
    kinds first."""

    def __init__(self, kinds: dict[str, KindFunction], replay_masks: bool, constants: Any) -> None:
        self.kinds = kinds
        self.replay_masks = replay_masks
        self.constants = constants
        self.functions: dict[str, Any] = {}  # kind function name -> FunctionProto
        self.op_functions: dict[str, Any] = {}
        # node names are unique in a model (onnxruntime refuses a repeat); a module
        # called more than once (ALBERT's one shared layer) names its later calls :2, :3
        self.called: dict[str, int] = {}

    def nodes(self, graph: Graph, call: ModuleCall, mask_base: int) -> tuple[list[Any], list[Any]]:
        """The NodeProtos of the call's nodes (its children of a kind written
        as a function: one node each) and the mask inputs they read."""
        out: list[Any] = []
        masks: list[Any] = []
        at, k = call.start, mask_base
        for child in call.children:
            made, read = self._range(graph, at, child.start, k)
            out += made
            masks += read
            k += len(read)
            if child.kind in self.kinds:
                made, read = [self._call(graph, child, k)], self._masks(graph, child, k)
            else:
                made, read = self.nodes(graph, child, k)
            out += made
            masks += read
            k += len(read)
            at = child.end
        made, read = self._range(graph, at, call.end, k)
        return out + made, masks + read

    def _range(self, graph: Graph, start: int, end: int, k: int) -> tuple[list[Any], list[Any]]:
        nodes, ops, masks = _graph_nodes(graph, self.replay_masks, start, end, k)
        self.op_functions.update(ops)
        return nodes, masks

    def _masks(self, graph: Graph, call: ModuleCall, k: int) -> list[Any]:
        if not self.replay_masks:
            return []
        random = [node for node in graph.nodes[call.start : call.end] if is_random(node)]
        return [
            value_info(draw_key(graph.kind, k + j), mask_type(graph, r))
            for j, r in enumerate(random)
        ]

    def _call(self, graph: Graph, call: ModuleCall, k: int) -> Any:
        kf = self.kinds[call.kind]
        self._define(kf)
        masks = [m.name for m in self._masks(graph, call, k)]
        name = f"{call.path}/{kf.name}"
        seen = self.called[name] = self.called.get(name, 0) + 1
        return _onnx().helper.make_node(
            kf.name,
            [*call.inputs, *call.params, *masks],
            call.outputs,
            domain=MODULES_DOMAIN,
            name=name if seen == 1 else f"{name}:{seen}",
            doc_string=f"{call.path} ({call.module_type})",
        )

    def _define(self, kf: KindFunction) -> None:
        if kf.name in self.functions:
            return
        onnx = _onnx()
        graph, call = kf.graph, kf.call
        body, masks = self.nodes(graph, call, 0)
        read = {i for n in body for i in n.input}
        consts = [graph.values[c] for c in call.consts if c in read]
        self.functions[kf.name] = onnx.helper.make_function(
            MODULES_DOMAIN,
            kf.name,
            [*call.inputs, *call.params, *(m.name for m in masks)],
            list(call.outputs),
            _const_nodes(consts, self.constants) + body,
            opset_imports=_opsets(),
            doc_string=(
                f"{call.module_type or kind_word(call)} ({kf.kind}): {call.size} ops; "
                f"written from {call.path}"
            ),
        )


def _opsets() -> list[Any]:
    helper = _onnx().helper
    return [
        helper.make_opsetid("", ONNX_OPSET),
        helper.make_opsetid(TRACELOG_DOMAIN, TRACELOG_OPSET),
        helper.make_opsetid(MODULES_DOMAIN, 1),
    ]


def _const_nodes(values: list[Value], constants: Any) -> list[Any]:
    onnx = _onnx()
    return [
        onnx.helper.make_node(
            "Constant",
            [],
            [v.name],
            name=f"const/{v.name}",
            value=onnx.numpy_helper.from_array(const_array(v, constants), v.name),
        )
        for v in values
    ]


def _function(graph: Graph, name: str, doc: str, modules: _Modules) -> tuple[Any, list[str]]:
    nodes, masks = modules.nodes(graph, module_calls(graph), 0)
    read = {i for n in nodes for i in n.input}
    const_nodes = _const_nodes([v for v in graph.constants if v.name in read], modules.constants)
    inputs = [v.name for v in graph.values.values() if v.kind in ("input", "param", "buffer")]
    mask_names = [m.name for m in masks]
    fn = _onnx().helper.make_function(
        GRAPHS_DOMAIN,
        name,
        inputs + mask_names,
        [o.name for o in graph.outputs],
        const_nodes + nodes,
        opset_imports=_opsets(),
        doc_string=doc,
    )
    return fn, mask_names


def build_model(
    log: TraceLog,
    *,
    replay_masks: bool = False,
    params_as_inputs: bool = False,
    float64: bool = False,
) -> Any:
    """The ModelProto of a log. With replay_masks, training Dropout takes its
    mask from inputs "mask.<k>" (the loss graph's "loss_mask.<k>"; for parity
    replay); without, Dropout runs as ONNX defines it, drawing its own masks.
    Parameters and buffers are initializers; with params_as_inputs they are
    graph inputs instead. With float64, the model computes in float64 where
    the log's graphs compute in float32 (tracelog.passes.precision: the
    translation check's model)."""
    from tracelog.emit.program import _function_names
    from tracelog.passes.precision import promoted_arrays, promoted_float64

    onnx = _onnx()
    helper = onnx.helper
    check_supported(log, TABLE, "onnx")
    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch to build the main graph from")
    weights = log.weights()
    graphs = dict(log.graphs)
    if float64:
        weights = promoted_arrays(weights)
        graphs = {digest: promoted_float64(g) for digest, g in graphs.items()}
    fnames = _function_names(log)
    functions: list[Any] = []
    masks_of: dict[str, list[str]] = {}
    kinds = kind_functions([graphs[d] for d in fnames], Namespace([*fnames.values()]))
    modules = _Modules(kinds, replay_masks, weights)
    for digest, fname in fnames.items():
        entries = [e for e in log.entries_sorted() if e.hash == digest]
        graph = graphs[digest]
        doc = f"{graph.kind} graph {digest[:12]}, {len(graph.nodes)} ops. {usage_comment(entries)}"
        fn, masks = _function(graph, fname, doc, modules)
        functions.append(fn)
        masks_of[digest] = masks
    op_functions = modules.op_functions

    log.graph(info["prediction"]), log.graph(info["loss"])  # a LogError where one is missing
    pred, loss = graphs[info["prediction"]], graphs[info["loss"]]
    pred_roles = [o.role for o in pred.outputs]
    inputs: list[Any] = []
    seen: set[str] = set()
    initializers = []
    for g in (pred, loss):
        for v in g.values.values():
            if v.name in seen or v.kind not in ("input", "param", "buffer") or v.name in pred_roles:
                continue
            seen.add(v.name)
            if v.kind in ("param", "buffer") and not params_as_inputs:
                initializers.append(onnx.numpy_helper.from_array(weights[v.name], v.name))
            else:
                inputs.append(value_info(v.name, v.type))
    if replay_masks:  # the loss graph's keyed apart (draw_key): no name is both's
        inputs += [value_info(name, ty) for g in (pred, loss) for name, ty in mask_inputs(g)]
    # the loss output: "loss", unless an input of the main graph holds that name
    loss_out = "loss"
    while loss_out in seen or loss_out in pred_roles:
        loss_out += "_"
    call_pred = helper.make_node(
        fnames[info["prediction"]],
        [v.name for v in pred.values.values() if v.kind in ("input", "param", "buffer")]
        + masks_of[info["prediction"]],
        pred_roles,
        domain=GRAPHS_DOMAIN,
        name="prediction",
    )
    call_loss = helper.make_node(
        fnames[info["loss"]],
        [v.name for v in loss.values.values() if v.kind in ("input", "param", "buffer")]
        + masks_of[info["loss"]],
        [loss_out],
        domain=GRAPHS_DOMAIN,
        name="loss",
    )
    outputs = [value_info(o.role, pred.values[o.name].type) for o in pred.outputs]
    outputs.append(value_info(loss_out, loss.values[loss.output("loss").name].type))
    fw = log.framework
    graph = helper.make_graph(
        [call_pred, call_loss],
        "tracelog",
        inputs,
        outputs,
        initializer=initializers,
        doc_string=(
            f"The recorded sample batch's prediction and loss graphs of a {fw.get('name')} "
            f"{fw.get('version')} run of {log.model.get('class', 'a model')}; every unique "
            f"graph of the run is a function in domain {GRAPHS_DOMAIN}."
        ),
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", ONNX_OPSET),
            helper.make_opsetid(TRACELOG_DOMAIN, TRACELOG_OPSET),
            helper.make_opsetid(GRAPHS_DOMAIN, 1),
            helper.make_opsetid(MODULES_DOMAIN, 1),
        ],
        functions=[op_functions[k] for k in sorted(op_functions)]
        + list(modules.functions.values())
        + functions,
        ir_version=ONNX_IR_VERSION,
        producer_name="tracelog",
    )
    usage = [
        {"function": fnames[e.hash], "kind": e.kind, "phase": e.phase, **e.usage.to_json()}
        for e in log.entries_sorted()
    ]
    helper.set_model_props(
        model,
        {
            "tracelog.framework": json.dumps(fw, sort_keys=True),
            "tracelog.usage": json.dumps(usage, sort_keys=True),
        },
    )
    return model


def write_model(log_dir: str | os.PathLike[str], out: str | None = None) -> Path:
    from tracelog.emit.targets import file_name

    log = TraceLog.load(log_dir, check_tensors=False)  # the tensors: as read
    model = build_model(log)
    path = Path(out) if out else Path(log_dir) / file_name("onnx")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(model.SerializeToString(deterministic=True))
    os.replace(tmp, path)
    return path


def check_model(log_dir: str | os.PathLike[str], *, atol: float, rtol: float) -> Report:
    """Write model.onnx, check it with onnx.checker (full), and run its
    replay form with the recorded batch: predictions, buffer updates and loss
    (ONNX has no autodiff, so no gradients). Where the sample has a float64
    reference, two checks, as every program's: the translation (the model in
    float64 on onnx.reference against the reference, rows "... [float64]",
    within TRANSLATION_RTOL) and float32 (onnxruntime against the reference,
    within FLOAT32_FACTOR of the source's own float32 error); without one,
    onnxruntime against the recorded values within atol/rtol."""
    import onnxruntime as ort

    from tracelog.emit.runtime.parity import FLOAT32_FACTOR, TRANSLATION_RTOL
    from tracelog.sample import reference_key, sample_feeds
    from tracelog.verify import Comparison, Report, SampleJudge, run_model, unreferenced

    onnx = _onnx()
    path = write_model(log_dir)
    onnx.checker.check_model(str(path), full_check=True)
    log = TraceLog.load(log_dir, check_tensors=False)  # the tensors: as read
    model = build_model(log, replay_masks=True, params_as_inputs=True)
    sample = log.sample()
    feeds = sample_feeds(sample)
    runtime = recorded_dtype_runtime(log)
    if runtime == "onnxruntime":
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        wanted = {i.name for i in sess.get_inputs()}
        results = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    else:
        # typed throughout: onnx.reference loads a context-dependent function op
        # (Gelu's body depends on its input type) only where it knows the types
        import onnx.inliner

        typed = onnx.shape_inference.infer_shapes(onnx.inliner.inline_local_functions(model))
        results = run_model(typed, feeds, runtime="reference")
    run_by = (
        "onnxruntime" if runtime == "onnxruntime" else "onnx.reference, in bfloat16 where logged"
    )
    if any(k.startswith(reference_key("")) for k in sample):
        title = (
            f"{path.name}: translation ([float64] rows: the model in float64 on onnx.reference "
            f"vs the float64 reference, within {TRANSLATION_RTOL:g} of each output's largest "
            f"value) and the recorded dtypes ({run_by}, vs the reference, within "
            f"{FLOAT32_FACTOR:g}x the source's own error in them: the ratio)"
        )
        report = Report(title, translation_rows(log, sample))
    else:
        title = (
            f"{path.name} vs recorded batch, run by {run_by} (atol {atol:g}, rtol {rtol:g})"
            f"{unreferenced(log)}"
        )
        report = Report(title)
    roles = [out.name for out in model.graph.output][:-1]  # the loss comes last
    judge = SampleJudge(sample)
    info = log.sample_info
    assert info is not None  # log.sample() read it
    trained = [
        v.name
        for graph in (info["prediction"], info["loss"])
        for v in log.graph(graph).params
        if v.trainable
    ]
    report.comparisons[:0] = [Comparison(*row) for row in judge.parity._unread(sample, trained)]
    for role, value in zip(roles, results, strict=False):
        key = _sample_key(role)
        if key is not None:
            report.comparisons.append(judge.checked(role, value, key, atol, rtol))
    report.comparisons.append(judge.checked("loss", results[-1], LOSS_KEY, atol, rtol))
    if not report.ok:
        from tracelog.parity import accuracy_only, first_divergence

        report.divergence = accuracy_only(report) or first_divergence(
            log, None, log_dir, atol, rtol
        )
    return report


def recorded_dtype_runtime(log: TraceLog) -> str:
    """What runs a log's model in its recorded dtypes: onnxruntime, or
    onnx.reference where a graph computes in bfloat16. onnxruntime's CPU
    provider has no bfloat16 kernel for arithmetic (1.32: Add, Mul, Div, Gemm,
    MatMul, Relu, Erf, Tanh, Exp, Sqrt, ReduceMean, Softmax, LogSoftmax, Conv
    ...; data movement only); onnx.reference computes bfloat16 through
    ml_dtypes, each op's result rounded to bfloat16 as the model declares."""
    if any(v.type.dtype == "bfloat16" for g in log.graphs.values() for v in g.values.values()):
        return "reference"
    return "onnxruntime"


def _sample_key(role: str) -> str | None:
    """The sample's key of a main-graph output (None: a feature the loss graph
    reads, checked through the loss)."""
    if role.startswith("prediction"):
        return output_key(role)
    if role.startswith("update:"):
        return update_key(role[len("update:") :])
    return None


def translation_rows(log: TraceLog, sample: dict[str, np.ndarray]) -> list[Comparison]:
    """The translation check of the ONNX target: the log's model in float64
    (build_model(float64=True)) run by onnx.reference on the recorded batch,
    against the sample's float64 reference; one row saying why where it could
    not run."""
    from tracelog.passes.precision import promoted_arrays
    from tracelog.sample import reference_key, sample_feeds
    from tracelog.verify import Comparison, SampleJudge, run_model

    model = build_model(log, replay_masks=True, params_as_inputs=True, float64=True)
    try:  # log(0) where a later Where drops it, as in float32: no warnings
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            feeds = promoted_arrays(sample_feeds(sample))
            results = run_model(model, feeds, runtime="reference")
    except Exception as e:  # an op onnx.reference cannot run in float64
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        return [Comparison(f"[float64] not run ({reason})", float("nan"), float("nan"), True)]
    *roles, _ = [o.name for o in model.graph.output]
    judge = SampleJudge(sample)
    found = []
    for role, value in zip(roles, results, strict=False):
        key = _sample_key(role)
        if key is not None and reference_key(key) in sample:
            found.append(judge.translated(f"{role} [float64]", value, key))
    if reference_key(LOSS_KEY) in sample:
        found.append(judge.translated("loss [float64]", results[-1], LOSS_KEY))
    return found
