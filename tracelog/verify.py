"""Check that a log's IR means what the source framework computed.

The recorded sample batch is replayed through the sample's prediction and
loss graphs, serialised to ONNX and run by an independent runtime
(onnx.reference.ReferenceEvaluator, or onnxruntime). Predictions, buffer
updates and the loss must match what the framework produced.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelog.emit.onnx import graph_to_onnx
from tracelog.errors import LogError
from tracelog.ir import Graph
from tracelog.log import TraceLog
from tracelog.sample import (
    LOSS_KEY,
    grad_key,
    output_key,
    reference_key,
    sample_feeds,
    update_key,
)

RUNTIMES = ("reference", "onnxruntime")


@dataclass
class Comparison:
    name: str
    max_abs: float
    max_rel: float
    ok: bool
    # against a float64 reference: the source's own float32 error, and how many
    # times it (or the float32 floor) the error is; None: judged by atol/rtol
    source_err: float | None = None
    ratio: float | None = None

    @property
    def is_note(self) -> bool:
        """A row that says something of the rows (a run that could not be made,
        float32 runs drawn again), with no error of its own: a line of its own."""
        return self.name.startswith("[") and self.max_abs != self.max_abs


@dataclass
class Report:
    """Per-output comparisons; on a mismatch, where the first divergence is."""

    title: str
    comparisons: list[Comparison] = field(default_factory=list)
    divergence: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.comparisons) and all(c.ok for c in self.comparisons)

    def table(self) -> str:
        width = max([len(c.name) for c in self.comparisons if not c.is_note] + [6])
        calibrated = any(c.source_err is not None for c in self.comparisons)
        if calibrated:
            head = f"{'output':<{width}}  {'max abs err':>12}  {'source err':>14}  {'ratio':>7}  ok"
        else:
            head = f"{'output':<{width}}  {'max abs err':>12}  {'max rel err':>12}  ok"
        lines = [self.title, head]
        for c in self.comparisons:
            verdict = "yes" if c.ok else "NO"
            if c.is_note:
                lines.append(c.name)
            elif calibrated:
                own = "-" if c.source_err is None else f"{c.source_err:.3e}"
                ratio = "-" if c.ratio is None else f"{c.ratio:.2f}"
                lines.append(
                    f"{c.name:<{width}}  {c.max_abs:>12.3e}  {own:>14}  {ratio:>7}  {verdict}"
                )
            else:
                lines.append(
                    f"{c.name:<{width}}  {c.max_abs:>12.3e}  {c.max_rel:>12.3e}  {verdict}"
                )
        if self.divergence:
            lines.append(self.divergence)
        lines.append("parity: ok" if self.ok else "parity: MISMATCH")
        return "\n".join(lines)


def unreferenced(log: TraceLog) -> str:
    """For a check's title where the sample has no float64 reference: why not
    (trace.json's ``reference``), as "; no float64 reference: ..."."""
    note = log.sample_info.get("reference", "") if log.sample_info else ""
    return f"; no float64 reference: {note[len('none: '):]}" if note.startswith("none: ") else ""


def compare(name: str, got: Any, want: Any, atol: float, rtol: float) -> Comparison:
    got_a, want_a = np.asarray(got), np.asarray(want)
    if got_a.shape != want_a.shape:
        return Comparison(
            f"{name} (shape {got_a.shape} != {want_a.shape})", float("inf"), float("inf"), False
        )
    if got_a.size == 0:
        return Comparison(name, 0.0, 0.0, True)
    g = got_a.astype(np.float64)
    w = want_a.astype(np.float64)
    # the same infinity, or NaN on both sides (log(0) where a later Where drops
    # it), is agreement, not an error of inf - inf = NaN
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(g - w))
    err = np.where(np.isnan(err), np.inf, err)
    rel = err / np.maximum(np.abs(np.where(np.isfinite(w), w, 0.0)), 1e-12)
    ok = bool(np.all(err <= atol + rtol * np.abs(np.where(same, 0.0, w))))
    return Comparison(name, float(err.max()), float(rel.max()), ok)


def _parity() -> types.ModuleType:
    """The parity runtime every program inlines, with the names a program
    defines around it bound to tracelog's own (the sample's keys; arrays are
    numpy here): the ONNX target and the IR are judged by the programs' very
    functions, not a copy of them."""
    from tracelog import sample as sample_format
    from tracelog.emit.runtime import parity

    for name in ("reference_key", "grad_key", "update_key", "scale_key"):
        setattr(parity, name, getattr(sample_format, name))
    parity._numpy = np.asarray  # type: ignore[assignment]
    return parity


class SampleJudge:
    """The programs' verdicts on one sample's outputs: its median scales and
    the source's typical float32 error, computed once for all of its rows."""

    def __init__(self, sample: dict[str, np.ndarray]) -> None:
        # bfloat16 (ml_dtypes': not numpy kind "f") widened to float32, exactly,
        # as the programs' _load reads it, so every target's rows judge alike
        self.sample = {
            k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in sample.items()
        }
        sample = self.sample
        self.parity = _parity()
        self.medians = self.parity._typical_scales(sample)
        self.largest = self.parity._largest_scales(sample)
        self.typical = self.parity._typical_error(sample, self.medians)

    def checked(self, name: str, got: Any, key: str, atol: float, rtol: float) -> Comparison:
        """`got` (float32) against the sample's entry `key`: against its float64
        reference within FLOAT32_FACTOR of the source's own float32 error where
        the sample has one (the programs' _calibrated), else within atol/rtol
        of the recorded value."""
        ref = self.sample.get(reference_key(key))
        if ref is None:
            return compare(name, got, self.sample[key], atol, rtol)
        is_grad = key.startswith(grad_key(""))
        floor = self.parity._floor(self.sample, key, self.medians, is_grad)
        row = self.parity._calibrated(
            name,
            got,
            self.sample[key],
            ref,
            self.typical[self.parity._kind(key)],
            floor,
            self.largest[is_grad],
        )
        return Comparison(*row)

    def translated(self, name: str, got: Any, key: str) -> Comparison:
        """A float64 result against the sample's float64 reference of `key`:
        within TRANSLATION_RTOL of the output's scale (the programs'
        _translated: its largest value, or the near-zero floor, or the size of
        the terms it sums)."""
        is_grad = key.startswith(grad_key(""))
        floor = self.parity._floor(self.sample, key, self.medians, is_grad)
        ref = self.sample[reference_key(key)]
        row = self.parity._translated(
            name, got, ref, floor, self.sample[key], self.largest[is_grad]
        )
        return Comparison(*row)


def translation(log: TraceLog, runtime: str = "reference") -> list[Comparison]:
    """The translation check of the IR: the sample's prediction and loss graphs
    in float64 (tracelog.passes.precision), run by an ONNX runtime on the
    recorded batch, against the sample's float64 reference."""
    from tracelog.passes.precision import promoted_arrays, promoted_float64

    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch (no training batch with a loss)")
    sample = log.sample()
    weights = promoted_arrays(log.weights())
    feeds = promoted_arrays(sample_feeds(sample))
    found: list[Comparison] = []
    judge = SampleJudge(sample)

    def against(name: str, value: Any, key: str) -> None:
        if reference_key(key) in sample:
            found.append(judge.translated(f"{name} [float64]", value, key))

    pred = promoted_float64(log.graph(info["prediction"]))
    got = run_graph(pred, feeds, runtime=runtime, constants=weights)
    for role, value in got.items():
        if role.startswith("prediction"):
            against(role, value, output_key(role))
        elif role.startswith("update:"):
            against(role, value, update_key(role.split(":", 1)[1]))
    loss = promoted_float64(log.graph(info["loss"]))
    got_loss = run_graph(loss, {**feeds, **got}, runtime=runtime, constants=weights)
    against("loss", got_loss["loss"], LOSS_KEY)
    return found


def _sequence_lens_ops() -> list[type]:
    """onnx.reference's LSTM, GRU and RNN with ONNX's sequence_lens, which they ignore:
    each row runs alone on its first lens[b] steps (the reverse direction starts at
    lens[b] - 1), and Y is zeros past its length. The cell's math stays onnx's; RNN
    also takes Relu (onnx's knows Tanh and Affine)."""
    from onnx.reference.ops.op_gru import GRU
    from onnx.reference.ops.op_lstm import LSTM
    from onnx.reference.ops.op_rnn import RNN_14

    def _run(
        self: Any,
        X: Any,
        W: Any,
        R: Any,
        B: Any = None,
        sequence_lens: Any = None,
        *rest: Any,
        **attrs: Any,
    ) -> Any:
        base = super(type(self), self)._run
        seq = X.shape[0]
        if sequence_lens is None or bool((np.asarray(sequence_lens) == seq).all()):
            return base(X, W, R, B, None, *rest, **attrs)
        rows = []
        for k, n in enumerate(np.asarray(sequence_lens).tolist()):
            states = [None if s is None else s[:, k : k + 1] for s in rest[:2]]  # initial h, c
            out = base(X[:n, k : k + 1], W, R, B, None, *states, *rest[2:], **attrs)
            y = np.zeros((seq, *out[0].shape[1:]), out[0].dtype)
            y[:n] = out[0]
            rows.append((y, *out[1:]))
        return tuple(np.concatenate([r[j] for r in rows], axis=-2) for j in range(len(rows[0])))

    def choose_act(self: Any, name: str, alpha: Any, beta: Any) -> Any:
        # onnx 1.23's RNN knows Tanh and Affine only; nn.RNN(nonlinearity="relu") is Relu
        if name in ("Relu", "relu"):
            return lambda x: np.maximum(x, 0)
        return super(type(self), self).choose_act(name, alpha, beta)

    return [
        type(name, (base,), {"_run": _run, "choose_act": choose_act})
        for name, base in (("LSTM", LSTM), ("GRU", GRU), ("RNN", RNN_14))
    ]


def _conv_transpose() -> type:
    """onnx.reference's ConvTranspose, groups and output_padding computed as
    ONNX defines them: onnx 1.23 slices a grouped weight by output channel and
    writes one channel per group (onnx/onnx#8446), and fails on an
    output_padding that reaches a dilated kernel's last tap. Here each group
    runs alone (its input channels, its weight rows) with no output_padding, the
    end padding less output_padding cropped (zeros where output_padding is the
    larger), then the bias added."""
    from onnx.reference.ops.op_conv_transpose import ConvTranspose

    def _run(self: Any, X: Any, W: Any, B: Any = None, **attrs: Any) -> Any:
        base = super(type(self), self)._run
        if attrs.get("auto_pad") not in (None, "NOTSET") or attrs.get("output_shape"):
            return base(X, W, B, **attrs)
        nd = X.ndim - 2
        group = int(attrs.pop("group", None) or 1)
        extra = list(attrs.pop("output_padding", None) or [0] * nd)
        pads = list(attrs.pop("pads", None) or [0] * (2 * nd))
        ends = [max(pads[nd + i] - extra[i], 0) for i in range(nd)]
        zeros = [max(extra[i] - pads[nd + i], 0) for i in range(nd)]
        k = X.shape[1] // group
        y = np.concatenate(
            [
                base(
                    X[:, g * k : (g + 1) * k],
                    W[g * k : (g + 1) * k],
                    None,
                    group=1,
                    pads=pads[:nd] + ends,
                    output_padding=[0] * nd,
                    **attrs,
                )[0]
                for g in range(group)
            ],
            axis=1,
        )
        y = np.pad(y, [(0, 0), (0, 0), *[(0, z) for z in zeros]])
        if B is not None:
            y = y + np.asarray(B).reshape(1, -1, *[1] * nd)
        return (y.astype(X.dtype),)

    return type("ConvTranspose", (ConvTranspose,), {"_run": _run})


def _erf() -> type:
    """onnx.reference's Erf in float64 for float64 data (onnx 1.23 computes
    every Erf in float32)."""
    import math

    from onnx.reference.ops.op_erf import Erf

    def _run(self: Any, x: Any) -> Any:
        if x.dtype != np.float64:
            return super(type(self), self)._run(x)
        return (np.vectorize(math.erf, otypes=[np.float64])(x),)

    return type("Erf", (Erf,), {"_run": _run})


def _resize() -> type:
    """onnx.reference's Resize with its float attributes as Python floats
    (onnx 1.23 hands cubic_coeff_a over as a numpy float32, and under numpy's
    promotion rules every cubic weight is then computed in float32: 7e-7 off
    torch's float64 bicubic on a 4 -> 6 resize)."""
    from onnx.reference.ops.op_resize import Resize

    def _run(self: Any, X: Any, *inputs: Any, **attrs: Any) -> Any:
        for name in ("cubic_coeff_a", "extrapolation_value"):
            if isinstance(attrs.get(name), np.floating):
                attrs[name] = float(attrs[name])
        return super(type(self), self)._run(X, *inputs, **attrs)

    return type("Resize", (Resize,), {"_run": _run})


def _average_pool() -> type:
    """onnx.reference's AveragePool with ceil_mode computed as the spec (and
    torch, onnxruntime) reads it: the last window starts inside the input or
    its begin padding, and the divisor counts the explicit padding
    (count_include_pad) but never ceil_mode's overhang. onnx 1.23 pads the
    overhang into the window: HF EfficientNet's pooler, AvgPool2d(320,
    ceil_mode=True) over 4x4, read 0 (and NaN without count_include_pad)."""
    from numpy.lib.stride_tricks import sliding_window_view
    from onnx.reference.ops.op_average_pool import AveragePool_19

    def _run(self: Any, x: Any, **attrs: Any) -> Any:
        auto_pad = attrs.get("auto_pad")
        if not attrs.get("ceil_mode") or auto_pad not in (None, "NOTSET", b"NOTSET"):
            return super(type(self), self)._run(x, **attrs)
        k = list(attrs["kernel_shape"])
        n = len(k)
        s = list(attrs.get("strides") or [1] * n)
        d = list(attrs.get("dilations") or [1] * n)
        p = list(attrs.get("pads") or [0] * 2 * n)
        windows = [d[i] * (k[i] - 1) + 1 for i in range(n)]
        over = []  # ceil_mode's overhang past the end padding, per axis
        for i in range(n):
            size, span = x.shape[2 + i], x.shape[2 + i] + p[i] + p[i + n]
            out = -(-(span - windows[i]) // s[i]) + 1
            if (out - 1) * s[i] >= size + p[i]:
                out -= 1
            over.append(max(0, (out - 1) * s[i] + windows[i] - span))

        def pooled(a: np.ndarray, pads: list[tuple[int, int]]) -> np.ndarray:
            """Windowed sums of `a` zero-padded by `pads` on its last n axes."""
            a = np.pad(a, [(0, 0)] * (a.ndim - n) + pads)
            axes = tuple(range(a.ndim - n, a.ndim))
            v = sliding_window_view(a, windows, axis=axes)
            steps = tuple(slice(None, None, st) for st in s) + tuple(
                slice(None, None, dd) for dd in d
            )
            index: tuple[Any, ...] = (Ellipsis, *steps)
            return np.asarray(v[index]).sum(axis=tuple(range(-n, 0)))

        total = pooled(x, [(p[i], p[i + n] + over[i]) for i in range(n)])
        ones = np.ones(x.shape[2:], dtype=x.dtype)
        if attrs.get("count_include_pad"):
            ones = np.pad(ones, [(p[i], p[i + n]) for i in range(n)], constant_values=1)
            counts = pooled(ones, [(0, over[i]) for i in range(n)])
        else:
            counts = pooled(ones, [(p[i], p[i + n] + over[i]) for i in range(n)])
        return ((total / counts).astype(x.dtype),)

    return type("AveragePool", (AveragePool_19,), {"_run": _run})


def _runner(model: Any, runtime: str) -> Any:
    if runtime == "reference":
        from onnx.reference import ReferenceEvaluator

        ops = [*_sequence_lens_ops(), _conv_transpose(), _erf(), _resize(), _average_pool()]

        class Evaluator(ReferenceEvaluator):
            """onnx.reference with our ops in the model's functions too (it
            builds a function's evaluator as its own class, without new_ops)."""

            def __init__(self, proto: Any, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("new_ops", ops)
                super().__init__(proto, *args, **kwargs)

        ev = Evaluator(model)
        return lambda feeds: ev.run(None, feeds)
    if runtime == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        return lambda feeds: sess.run(None, feeds)
    raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")


def run_model(
    model: Any, feeds: dict[str, np.ndarray], *, runtime: str = "reference"
) -> list[np.ndarray]:
    """Run an ONNX model on the feeds it declares as inputs; its outputs in order."""
    wanted = {i.name for i in model.graph.input}
    results = _runner(model, runtime)({k: v for k, v in feeds.items() if k in wanted})
    return [np.asarray(r) for r in results]


def run_graph(
    graph: Graph,
    feeds: dict[str, np.ndarray],
    *,
    runtime: str = "reference",
    constants: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run one IR graph through an ONNX runtime; outputs keyed by role."""
    model = graph_to_onnx(graph, constants=constants, replay_masks=True)
    wanted = {i.name for i in model.graph.input}
    results = _runner(model, runtime)({k: v for k, v in feeds.items() if k in wanted})
    return {out.role: np.asarray(r) for out, r in zip(graph.outputs, results, strict=True)}


def all_values(
    graph: Graph,
    feeds: dict[str, np.ndarray],
    *,
    runtime: str = "reference",
    constants: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Every node output of a graph, by IR value name, from an ONNX runtime."""
    model = graph_to_onnx(graph, constants=constants, replay_masks=True, expose_all=True)
    wanted = {i.name for i in model.graph.input}
    results = _runner(model, runtime)({k: v for k, v in feeds.items() if k in wanted})
    return {o.name: np.asarray(r) for o, r in zip(model.graph.output, results, strict=True)}


def verify(
    log_or_dir: TraceLog | str | os.PathLike[str],
    *,
    runtime: str = "reference",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> Report:
    log = log_or_dir if isinstance(log_or_dir, TraceLog) else TraceLog.load(log_or_dir)
    info = log.sample_info
    if not info:
        raise LogError("this log has no recorded sample batch (no training batch with a loss)")
    sample = log.sample()
    weights = log.weights()
    report = Report(
        f"IR vs recorded batch, run by {runtime} (atol {atol:g}, rtol {rtol:g}){unreferenced(log)}"
    )

    pred = log.graph(info["prediction"])
    feeds = sample_feeds(sample)
    got = run_graph(pred, feeds, runtime=runtime, constants=weights)
    for role, value in got.items():
        if role.startswith("prediction"):
            report.comparisons.append(compare(role, value, sample[output_key(role)], atol, rtol))
        elif role.startswith("update:"):
            buf = role.split(":", 1)[1]
            report.comparisons.append(compare(role, value, sample[update_key(buf)], atol, rtol))

    loss = log.graph(info["loss"])
    loss_feeds = dict(feeds)
    loss_feeds.update(got)  # the loss graph reads the prediction graph's outputs by role
    got_loss = run_graph(loss, loss_feeds, runtime=runtime, constants=weights)
    report.comparisons.append(compare("loss", got_loss["loss"], sample[LOSS_KEY], atol, rtol))
    return report
