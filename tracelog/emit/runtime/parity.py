"""The parity check of an emitted program: load the recorded sample, replay
the sample batch through the program's functions, and compare predictions,
buffer updates, loss and gradients with the recording.

A standalone program inlines it (``tracelog.emit.inline``); any other program
runs it from tracelog (``tracelog.emit.harness``: the same code, executed in
the program's namespace). The names below under TYPE_CHECKING are what the
program defines around these functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # defined by the program: its target's runtime and its generated code
    from tracelog.emit.runtime.weights import _load
    from tracelog.sample import (
        buffer_key,
        grad_key,
        output_key,
        param_key,
        reference_key,
        scale_key,
        update_key,
    )

    # [name, trains]: the stored weights give each one's shape and dtype
    PARAMETERS: list[list[Any]] = []
    # the program's framework modules that name float32
    FLOAT_MODULES: tuple[str, ...] = ()

    def _as_param(array: np.ndarray, trainable: bool) -> Any: ...
    def _as_const(array: np.ndarray) -> Any: ...
    def _numpy(x: Any) -> np.ndarray: ...
    def _value_and_grads(
        step: Callable[[dict[str, Any]], tuple[dict[str, Any], Any]],
        params: dict[str, Any],
        trainable: list[str],
    ) -> tuple[dict[str, Any], Any, list[Any]]: ...
    def sample_step(params: dict[str, Any], sample: dict[str, np.ndarray]) -> tuple[Any, Any]: ...
    def _gate_table() -> dict[str, Any]: ...
    def _gate_sign(value: Any, kink: Any) -> Any: ...
    def _gate_where(mask: np.ndarray, x: Any, y: Any) -> Any: ...


# (output, max abs err, max rel err, ok, the source's own float32 error, ratio); the
# last two are None where the sample has no float64 reference
Row = tuple[str, float, float, bool, float | None, float | None]

# Against the sample's float64 reference, a float32 result is within FLOAT32_FACTOR
# times the source framework's own float32 error (see _calibrated); for an output
# the source computes exactly, within FLOOR_ULPS float32 ulps of its largest value.
FLOAT32_FACTOR = 4.0
FLOOR_ULPS = 4.0
# The translation check: the program run in float64 against the float64 reference,
# within this many times each output's scale (_translated: its largest value, or the
# size of the terms it sums where it cancels to near zero): float64 rounding, with
# room for a network's depth; a wrong translation is off by far more.
TRANSLATION_RTOL = 1e-9
# an output below this times the median scale of its kind counts as zero
NEAR_ZERO = 1e-5
# a reference value at least this large is a fill, not a result (a masked logit
# written as torch.finfo(float32).min: Splinter's question answering): an output's
# scale leaves its fills out (_magnitude), and an error there is judged at it
FILL = 1e30
# Where the translation holds and the recorded-dtype run fails, runs on the sample
# with every float input and parameter nudged by one ulp (_nudged), up to this many:
# one that passes on every output shows the failure was a branch decided by
# rounding (an activation's input within float32 error of its kink), a draw the
# source could as well have lost, not this program's accuracy (_redrawn).
REDRAWS = 3
# Gates: ops whose derivative jumps where an input crosses a kink (a ReLU at 0, a
# clamp at its bounds, max and min where their operands meet). Rounding puts an
# input within float32 error of a kink on either side of it, and the gradient
# then flows in one run and is blocked in the other, whatever either run's
# accuracy (Keras ResNet50 to JAX: one conv4_block2_1 ReLU input, 1.1e-5 in
# float64, below 0 in float32, read 3.02x TensorFlow's error on that layer's
# kernel gradient). So the recorded-dtype run is judged against this program in
# float64 taking the recorded-dtype run's decision at each gate (_gate_matched):
# its rounding, not its coin flips. The outputs entry a run returns its gates in:
GATES_KEY = "gates"


class _GateMismatch(Exception):
    """A replay met other gates than its recording made (_Gates.call)."""


class _Gates:
    """The gates one run passes, through the target's gate functions
    (_gate_table). Recording: each call's decisions, sign(value - kink) per
    element and kink, as the framework's int8 arrays (in `seen`). Replaying:
    each call takes the next recorded decisions in order (numpy arrays, in
    `replay`), the framework's own op deciding only at a recorded tie."""

    def __init__(self, replay: list[np.ndarray] | None = None) -> None:
        self.seen: list[Any] = []
        self.replay = replay
        self.at = 0

    def call(self, kind: str, run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        y = run(*args, **kwargs)
        kinks = _kinks(kind, args, kwargs)
        if self.replay is None:
            self.seen.extend(_gate_sign(value, kink) for value, kink in kinks)
            return y
        signs = self.replay[self.at : self.at + len(kinks)]
        self.at += len(kinks)
        shape = tuple(int(d) for d in y.shape)
        if len(signs) < len(kinks) or any(s.shape != shape for s in signs):
            raise _GateMismatch(f"gate {self.at} ({kind}) is not the recorded one")
        return _replayed(kind, args, kwargs, y, signs) if kinks else y


def _bounds(args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A clip's (lower, upper) bounds, None where absent (torch.clamp's min=,
    jnp.clip's a_min= or min=)."""
    lo = args[1] if len(args) > 1 else kwargs.get("min", kwargs.get("a_min"))
    hi = args[2] if len(args) > 2 else kwargs.get("max", kwargs.get("a_max"))
    return lo, hi


def _kinks(kind: str, args: tuple, kwargs: dict[str, Any]) -> list[tuple[Any, Any]]:
    """A gate call's (value, kink) pairs: the gate opens where value > kink.
    None for a call not spelled as the programs spell it (its operand, or a
    leaky ReLU's slope, not given as these read them): it is left ungated."""
    if not args:
        return []
    if kind in ("relu", "leaky_relu"):
        given = kind == "relu" or _slope(args, kwargs) is not None
        return [(args[0], 0.0)] if given else []
    if kind == "clip":
        return [(args[0], b) for b in _bounds(args, kwargs) if b is not None]
    return [(args[0], args[1])] if len(args) > 1 else []


def _replayed(kind: str, args: tuple, kwargs: dict[str, Any], y: Any, signs: list[Any]) -> Any:
    """A gate's result on the side of each kink that the recorded `signs`
    (_kinks' order) say, with that side's gradient; `y`, the framework's own
    result, where a sign is a tie."""
    x = args[0]
    if kind in ("relu", "leaky_relu"):
        below = x * 0 if kind == "relu" else x * _slope(args, kwargs)
        return _gate_where(signs[0] > 0, x, _gate_where(signs[0] < 0, below, y))
    if kind == "clip":  # min(max(x, lo), hi), as torch.clamp and jnp.clip
        lo, hi = _bounds(args, kwargs)
        sides = iter(signs)
        low = next(sides) if lo is not None else None
        high = next(sides) if hi is not None else None
        inside = np.ones(signs[0].shape, dtype=bool)
        if low is not None:
            inside &= low > 0
        if high is not None:
            inside &= high < 0
        out = _gate_where(inside, x, y)
        if low is not None:
            out = _gate_where(low < 0, lo, out)
        if high is not None:
            out = _gate_where(high > 0, hi, out)
        return out
    first, second = (signs[0] > 0, signs[0] < 0) if kind == "max" else (signs[0] < 0, signs[0] > 0)
    return _gate_where(first, x, _gate_where(second, args[1], y))


def _slope(args: tuple, kwargs: dict[str, Any]) -> Any:
    """A leaky ReLU's negative slope (torch and JAX by position or as
    negative_slope=, TensorFlow as alpha=); None where not given."""
    return args[1] if len(args) > 1 else kwargs.get("negative_slope", kwargs.get("alpha"))


class _GateView:
    """A framework module as a gated run sees it: the functions its `table`
    names (the target's _gate_table: attribute, or a nested table for a
    submodule) call through `gates`; everything else as it is."""

    def __init__(self, module: Any, table: dict[str, Any], gates: _Gates) -> None:
        self._module, self._table, self._gates = module, table, gates

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        kind = self._table.get(name)
        if isinstance(kind, dict):
            return _GateView(attr, kind, self._gates)
        if kind is None:
            return attr
        gates = self._gates

        def gate(*args: Any, **kwargs: Any) -> Any:
            return gates.call(kind, attr, *args, **kwargs)

        return gate


@contextlib.contextmanager
def _gated(gates: _Gates) -> Iterator[None]:
    """Run this program's own code with its gate functions through `gates`."""
    names = globals()
    table = _gate_table()
    saved = {name: names[name] for name in table if name in names}
    names.update({name: _GateView(module, table[name], gates) for name, module in saved.items()})
    try:
        yield
    finally:
        names.update(saved)


def _with_gates(
    step: Callable[[dict[str, Any]], tuple[Any, Any]], gates: _Gates
) -> Callable[[dict[str, Any]], tuple[Any, Any]]:
    """`step`, each run of it starting its gates afresh and returning what it
    recorded in its outputs (under jax.jit: as the traced function's results)."""

    def run(p: dict[str, Any]) -> tuple[Any, Any]:
        gates.seen, gates.at = [], 0
        outputs, loss = step(p)
        return {**outputs, GATES_KEY: gates.seen}, loss

    return run


def _recorded(
    runner: Callable[..., Any],
    step: Callable[[dict[str, Any]], tuple[Any, Any]],
    params: dict[str, Any],
    trainable: list[str],
    gates: _Gates,
) -> Any:
    """runner(step, params, trainable) (_runs or _run) with the gates
    recorded in `gates`; where recording fails, without (its decisions then
    pair up with no other run's): a gate the program calls inside a
    transformation of its own, whose values do not outlive it."""
    try:
        with _gated(gates):
            return runner(_with_gates(step, gates), params, trainable)
    except Exception:
        gates.seen = []
        return runner(step, params, trainable)


def _signs(run: tuple[dict[str, Any], Any, list[Any]]) -> list[np.ndarray]:
    """The gate decisions a recording run returned (_with_gates)."""
    return [np.asarray(_numpy(s), dtype=np.int8) for s in run[0].get(GATES_KEY, [])]


def _compare(name: str, got: Any, want: np.ndarray, atol: float, rtol: float) -> Row:
    got = np.asarray(_numpy(got), dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return name, float("inf"), float("inf"), False, None, None
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-12)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    return name, float(err.max(initial=0.0)), float(rel.max(initial=0.0)), ok, None, None


def _error(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref|; equal values (the same infinity) agree, NaN is inf."""
    with np.errstate(invalid="ignore"):
        err = np.where(got == ref, 0.0, np.abs(got - ref))
    return float(np.nan_to_num(err, nan=np.inf).max(initial=0.0))


def _magnitude(ref: np.ndarray) -> float:
    """The largest finite |value| of a reference output, fills (at least FILL)
    left out where it holds any other value: a masked logit of -3.4e38 put
    every other logit's error at that scale, where a wrong one passed."""
    found = np.abs(ref[np.isfinite(ref)]) if ref.dtype.kind == "f" else np.abs(ref)
    kept = found[found < FILL]
    return float((kept if kept.size else found).max(initial=0.0))


def _terms(source: np.ndarray, ref: np.ndarray, largest: float) -> float:
    """The size of the terms an output sums, as the source's own rounding shows
    it (its error over its dtype's epsilon), up to the `largest` scale of its
    kind (_largest_scales): an output that cancels to near zero (a gradient
    zero in exact arithmetic: a bias before a batch norm) carries rounding of
    that size. The cap bounds an estimate that an ill-conditioned upstream
    inflates; it is the largest output of the kind, not a typical one: the
    terms of a cancelling sum are no smaller for the kind's other outputs
    being small (SwiftFormer's 1e-5 layer scales put the median gradient at
    1.7e-7 while its stem's conv biases sum terms of 1; HF EfficientNet's
    weight gradients are 1e-17, its activations 1e-16, while its batch norms'
    bias gradients sum activation gradients of 1e-2)."""
    if source.dtype.kind != "f":
        return 0.0
    own = _error(np.asarray(source, dtype=np.float64), np.asarray(ref, dtype=np.float64))
    return min(own / float(np.finfo(source.dtype).eps), largest)


def _calibrated(
    name: str,
    got: Any,
    source: np.ndarray,
    ref: np.ndarray,
    typical: float,
    floor: float,
    largest: float = 0.0,
    source_ref: np.ndarray | None = None,
) -> Row:
    """The program's result against the float64 reference, judged by the source
    framework's own error against the same reference: (name, error, relative
    error, within FLOAT32_FACTOR, the source's error, ratio). The unit is the
    larger of the source's error on this output, and FLOOR_ULPS ulps (of the
    recorded dtype) or the source's `typical` relative error on outputs of its
    kind (_typical_error), whichever is larger, of the output's largest value (for an output near
    zero, below `floor` (_floor) or NEAR_ZERO of the size of the terms it sums
    (_terms: a sum that cancels), of the larger of `floor` and that size): one output's error
    is one draw of rounding noise (a sum that happens to round well), the
    typical one of its kind a steadier measure of what float32 costs on this
    model. (`source_ref`: the reference the source's error is measured
    against, where `ref` is a nudged run's: _redrawn.)"""
    got = np.asarray(_numpy(got), dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return name, float("inf"), float("inf"), False, None, None
    err = _error(got, ref)
    mine = ref if source_ref is None else np.asarray(source_ref, dtype=np.float64)
    own = _error(np.asarray(source, dtype=np.float64), mine)
    eps = float(np.finfo(source.dtype).eps) if source.dtype.kind == "f" else 0.0
    scale = _magnitude(ref)
    terms = _terms(source, mine, largest)
    if scale < max(floor, NEAR_ZERO * terms):
        scale = max(floor, terms)
    unit = max(own, max(FLOOR_ULPS * eps, typical) * scale, np.finfo(np.float64).tiny)
    rel = err / max(scale, 1e-300)
    return name, err, rel, err <= FLOAT32_FACTOR * unit, own, err / unit


def _kind(key: str) -> str:
    """The kind of output a sample key holds, for its typical float32 error
    (_typical_error): "grad", "update" (a running statistic: decay times its
    stored value plus momentum times the batch's, whose error is the batch
    statistic's diluted by the momentum, 100x in Keras) or "forward" (the
    predictions and the loss computed from them)."""
    if key.startswith(grad_key("")):
        return "grad"
    return "update" if key.startswith(update_key("")) else "forward"


def _typical_error(sample: dict[str, np.ndarray], medians: dict[bool, float]) -> dict[str, float]:
    """What float32 costs the source on this model, per kind of output
    (_kind): the 90th percentile, over the outputs of that kind with a
    reference that do not cancel to near zero (at or above _floor and NEAR_ZERO
    of the size of the terms they sum, _terms), of the
    source's own float32 error relative to the output's largest value. (An
    output near zero has a relative error of no meaning: a gradient zero in
    exact arithmetic reads as 1e9; its own rounding is judged through _terms.)
    The loss is a forward output: a scalar whose error is its inputs' summed
    with signs, so its own is one draw that may cancel (MobileNetV2 at batch
    4: 6e-7 from per-row errors of 4e-4), and a running statistic's is the
    momentum's share of its batch statistic's, 100x smaller than what float32
    costs the predictions the loss is computed from."""
    found: dict[str, list[float]] = {"grad": [], "update": [], "forward": []}
    largest = _largest_scales(sample)
    for key, value in sample.items():
        ref = sample.get(reference_key(key))
        if ref is None or value.dtype.kind != "f":
            continue
        is_grad = key.startswith(grad_key(""))
        scale = _magnitude(ref)
        # a sum that cancels (NEAR_ZERO of its terms) is near zero too, where the
        # kind's median scale is no measure of it (HF EfficientNet: bias gradients
        # of 1e-18 summing terms of 1e-2 beside weight gradients of 1e-17 read 1e8)
        terms = _terms(value, ref, largest[is_grad])
        if scale > 0 and scale >= max(_floor(sample, key, medians, is_grad), NEAR_ZERO * terms):
            own = _error(value.astype(np.float64), ref.astype(np.float64))
            found[_kind(key)].append(own / scale)
    return {kind: float(np.quantile(errs, 0.9)) if errs else 0.0 for kind, errs in found.items()}


def _promoted(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every floating array in float64 (the translation check's inputs)."""
    return {k: a.astype(np.float64) if a.dtype.kind == "f" else a for k, a in arrays.items()}


def _nudged(arrays: dict[str, Any], draw: int) -> dict[str, Any]:
    """`arrays` with each float32 (float16, float64) array moved by one ulp,
    up or down element by element in a pattern fixed by `draw` (0: unchanged),
    but where it would become subnormal (zeros stay zeros).
    (Not for a sample with bfloat16 arrays: read narrow they are framework
    tensors, read wide float32 arrays, and would be nudged in one form only.)"""
    if draw == 0:
        return arrays
    rng = np.random.default_rng(draw)
    nudged = dict(arrays)
    for key in sorted(arrays):
        a = arrays[key]
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            continue
        up = rng.random(a.shape) < 0.5
        moved = np.where(up, np.nextafter(a, np.inf), np.nextafter(a, -np.inf)).astype(a.dtype)
        # a zero's neighbours are subnormal, which TensorFlow's and XLA's CPU kernels
        # flush to 0 while the float64 run keeps their sign (a ReLU at a zero bias
        # then opens in one run only): a value that would become subnormal stays
        nudged[key] = np.where(np.abs(moved) < np.finfo(a.dtype).tiny, a, moved)
    return nudged


def sample_params(log_dir: str, float64: bool = False, draw: int = 0) -> dict[str, Any]:
    """The parameters and buffers as they were when the sample batch ran, in
    their recorded dtypes (in float64 for the translation check); `draw`:
    nudged (_nudged)."""
    sample = _nudged(_load(os.path.join(log_dir, "sample.safetensors"), narrow=not float64), draw)
    weights = _load(os.path.join(log_dir, "weights.safetensors"), narrow=not float64)
    if float64:
        sample, weights = _promoted(sample), _promoted(weights)
    params = {}
    for name, trainable, *_ in PARAMETERS:
        key = param_key(name) if param_key(name) in sample else buffer_key(name)
        params[name] = _as_param(sample[key], trainable)
    params.update({k: _as_const(v) for k, v in weights.items() if k.startswith("const/")})
    return params


def _module_params(params: dict[str, Any]) -> dict[str, Any]:
    """The check's parameters as the target's module object holds them, so
    that the check runs the graph functions on what a user trains (a target
    runtime replaces this default: PyTorch's and TensorFlow's Model, JAX's
    params_tree); as given here."""
    return params


# the float dtypes the translation check's run reads as float64: the reference
# replays every float op in float64, autocast's casts to bfloat16 included
_NARROW_FLOATS = ("float32", "bfloat16", "float16")


class _Float64View:
    """A framework module as the translation check's run sees it: the same
    module, with float32 (and the half types casts name) meaning float64."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, "float64" if name in _NARROW_FLOATS else name)


@contextlib.contextmanager
def _in_float64() -> Iterator[None]:
    """Run this program's own code with every float32 it names read as float64."""
    names = globals()
    saved = {name: names[name] for name in FLOAT_MODULES}
    names.update({name: _Float64View(module) for name, module in saved.items()})
    try:
        yield
    finally:
        names.update(saved)


def _translated(
    name: str, got: Any, ref: np.ndarray, floor: float, source: np.ndarray, largest: float
) -> Row:
    """The float64 run's result against the float64 reference: within
    TRANSLATION_RTOL of the output's scale. The scale is its largest value, or
    `floor` (_floor) where that is larger, or the size of the terms the output
    sums (_terms): a gradient that is zero in exact arithmetic is float64
    noise of the size of those terms."""
    got = np.asarray(_numpy(got), dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return name, float("inf"), float("inf"), False, None, None
    err = _error(got, ref)
    terms = _terms(source, ref, largest)
    size = _magnitude(ref)
    own_size = _own_size(size, floor, terms, source.dtype)
    scale = max(size, terms) if own_size else max(size, floor, terms)
    rel = err / max(scale, 1e-300)
    return name, err, rel, err <= TRANSLATION_RTOL * scale, None, None


def _own_size(size: float, floor: float, terms: float, dtype: Any) -> bool:
    """Is an output below `floor` (_floor) judged at its own size by the
    translation check? Where the source's own rounding (_terms) shows that it
    sums terms of about its size, within 1/NEAR_ZERO of it: it is small, not a
    sum that cancels, and a wrong value of its size must fail (HF
    EfficientNet's small config: logits of 6e-18 beside a median forward scale
    of 1e-2). Where the source computed it exactly (no rounding to read: terms
    0), or it cancels, the floor stands; and where it is so small that
    subnormals of the source's `dtype` could move it by an ulp (below tiny /
    eps**2: a sum of up to 1/eps terms each flushed to zero), its rounding is
    no reading of its terms (the same model's squeeze-excite weight gradients
    of 5e-35). The float32 check keeps the floor for all of these: their
    accuracy is not what the model's rests on, and a sum that partly cancels
    (a running mean of 1e-10 summing activations of 1e-6) reads as a kernel's
    summation order (onnxruntime's ReduceMean 8x torch's error there)."""
    if not (size < floor and 0.0 < terms and size >= NEAR_ZERO * terms):
        return False
    info = np.finfo(dtype)
    return size >= float(info.tiny) / float(info.eps) ** 2


def _typical_scales(sample: dict[str, np.ndarray], q: float = 0.5) -> dict[bool, float]:
    """The median (quantile `q`) largest |value| of the reference's outputs of
    each kind: gradients (True) and the others (False)."""
    scales: dict[bool, list[float]] = {True: [], False: []}
    for key, ref in sample.items():
        if key.startswith(reference_key("")):
            scales[key.startswith(reference_key(grad_key("")))].append(_magnitude(ref))
    return {kind: float(np.quantile(found, q)) if found else 0.0 for kind, found in scales.items()}


def _largest_scales(sample: dict[str, np.ndarray]) -> dict[bool, float]:
    """The largest |value| of the reference's outputs of each kind: the cap of
    _terms."""
    return _typical_scales(sample, 1.0)


def _floor(
    sample: dict[str, np.ndarray], key: str, medians: dict[bool, float], is_grad: bool
) -> float:
    """The scale below which an output is judged at a larger one: NEAR_ZERO of
    the median scale of its kind (_typical_scales), or for the loss, where the
    sample has it, its sensitivity to its input's rounding (scale_key) if larger."""
    found = sample.get(scale_key(key))
    return max(NEAR_ZERO * medians[is_grad], float(found) if found is not None else 0.0)


def _runs(
    step: Callable[[dict[str, Any]], tuple[Any, Any]], params: dict[str, Any], trainable: list[str]
) -> list[tuple[str, tuple[dict[str, Any], Any, list[Any]]]]:
    """The runs the parity check compares with the recording: one, eager (a
    target's runtime may define its own, as JAX does: jitted and op by op)."""
    return [("", _value_and_grads(step, params, trainable))]


def _run(
    step: Callable[[dict[str, Any]], tuple[Any, Any]], params: dict[str, Any], trainable: list[str]
) -> tuple[dict[str, Any], Any, list[Any]]:
    """The one run a draw or a gate-matched reference takes: the first of
    _runs (a target's runtime may define it: JAX's runs only the jitted one)."""
    return _runs(step, params, trainable)[0][1]


def _outputs(
    sample: dict[str, np.ndarray], trainable: list[str], run: tuple[dict[str, Any], Any, list[Any]]
) -> list[tuple[str, Any, str, bool]]:
    """(name, value, sample key, is a gradient) for each output a run computed
    that the sample recorded."""
    outputs, loss, grads = run
    found = []
    for role, value in outputs.items():
        if role.startswith("prediction"):
            found.append((role, value, output_key(role), False))
        elif role.startswith("update:"):
            found.append((role, value, update_key(role[len("update:") :]), False))
    found.append(("loss", loss, "loss", False))
    for name, grad in zip(trainable, grads, strict=True):
        if grad_key(name) in sample:
            got = np.zeros_like(sample[grad_key(name)]) if grad is None else grad
            found.append(("grad " + name, got, grad_key(name), True))
    return found


def _unread(sample: dict[str, np.ndarray], trainable: list[str]) -> list[Row]:
    """A failing row for each parameter the source differentiated (a nonzero
    gradient in the sample) that this program does not train: its graphs hold
    it as a constant of the recorded batch, or dropped it. Comparing only the
    parameters the graphs read would pass such a translation. And one for each
    gradient the sample marks as a custom autograd Function's own backward
    (tracelog.sample.custom_backward_key): the reference differentiates the
    recorded forward as the program does, so no other row sees it."""
    rows: list[Row] = []
    for key in sorted(sample):
        name = key[len(grad_key("")) :]
        if not key.startswith(grad_key("")) or name in trainable:
            continue
        grad = np.asarray(sample.get(reference_key(key), sample[key]), dtype=np.float64)
        if np.any(grad != 0):
            row = f"grad {name} (the source's; no graph trains it)"
            rows.append((row, float(np.abs(grad).max()), float("nan"), False, None, None))
    # gradients that came through a custom autograd Function's own backward in
    # training, off the recorded ops' derivative (the sample marks them)
    for key in sorted(sample):
        if key.startswith("custom_backward/"):
            off, scale = (float(v) for v in np.asarray(sample[key]).reshape(-1)[:2])
            row = f"grad {key.split('/', 1)[1]} (the source's, by a custom autograd backward)"
            rows.append((row, off, off / max(scale, 1e-300), False, None, None))
    return rows


def _translation(
    log_dir: str, sample: dict[str, np.ndarray], trainable: list[str]
) -> tuple[list[Row], list[np.ndarray] | None]:
    """The translation check: this program in float64 against the reference
    (rows "... [float64]"); one row saying why where it cannot run. With the
    rows, the run's gate decisions (_Gates; None where it did not run)."""
    wide = _promoted(sample)
    medians = _typical_scales(sample)
    largest = _largest_scales(sample)

    def step64(p: dict[str, Any]) -> tuple[Any, Any]:
        return sample_step(p, wide)

    rows = []
    gates = _Gates()
    signs = None
    try:
        with _in_float64():
            params = _module_params(sample_params(log_dir, float64=True))
            runs = _recorded(_runs, step64, params, trainable, gates)
            signs = _signs(runs[0][1])
            for label, run in runs:
                for name, value, key, is_grad in _outputs(sample, trainable, run):
                    if reference_key(key) in sample:
                        ref, floor = sample[reference_key(key)], _floor(
                            sample, key, medians, is_grad
                        )
                        row = f"{name}{label} [float64]"
                        found = _translated(row, value, ref, floor, sample[key], largest[is_grad])
                        rows.append(found)
    # a kernel this framework has in float32 only (MaxPool3D in TF)
    except Exception as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        rows = [(f"[float64] not run ({reason})", float("nan"), float("nan"), True, None, None)]
        signs = None
    return rows, signs


def _flips(narrow: list[np.ndarray], wide: list[np.ndarray] | None) -> int | None:
    """How many gate elements two runs decided differently; None where their
    gates do not pair up one to one."""
    if wide is None or len(narrow) != len(wide):
        return None
    if any(a.shape != b.shape for a, b in zip(narrow, wide, strict=True)):
        return None
    return sum(int(np.count_nonzero(a != b)) for a, b in zip(narrow, wide, strict=True))


def _gate_matched(
    log_dir: str,
    sample: dict[str, np.ndarray],
    trainable: list[str],
    signs: list[np.ndarray] | None,
    draw: int = 0,
) -> dict[str, np.ndarray] | None:
    """This program in float64 on the sample (nudged by `draw`: _nudged),
    taking at each gate the decisions `signs` that a recorded-dtype run made
    there (_Gates): {sample key: output}. The translation check has shown
    that the program in float64 computes the reference's function; this run
    computes it on the branches the recorded-dtype run took. None where the
    replay met other gates than were recorded; `signs` None: on its own
    branches."""
    wide = _promoted(_nudged(sample, draw))
    gates = _Gates(replay=signs)

    def step64(p: dict[str, Any]) -> tuple[Any, Any]:
        return sample_step(p, wide)

    with _in_float64():
        params = _module_params(sample_params(log_dir, float64=True, draw=draw))
        if signs is None:
            run = _run(step64, params, trainable)
        else:
            try:
                with _gated(gates):
                    run = _run(_with_gates(step64, gates), params, trainable)
            except _GateMismatch:
                return None
    if signs is not None and gates.at != len(signs):
        return None
    return {key: _numpy(v) for _, v, key, _ in _outputs(sample, trainable, run)}


def _judged(
    sample: dict[str, np.ndarray],
    name: str,
    value: Any,
    key: str,
    is_grad: bool,
    typical: dict[str, float],
    medians: dict[bool, float],
    largest: dict[bool, float],
    refs: dict[str, np.ndarray] | None = None,
) -> Row:
    """A recorded-dtype run's row for an output with a reference, by
    _calibrated; against `refs` where given (a gate-matched or nudged run's
    outputs), the source's error still against the recorded reference."""
    ref = sample[reference_key(key)]
    return _calibrated(
        name,
        value,
        sample[key],
        ref if refs is None else refs[key],
        typical[_kind(key)],
        _floor(sample, key, medians, is_grad),
        largest[is_grad],
        source_ref=None if refs is None else ref,
    )


def _matched_note(gates: int, flips: int | None) -> Row:
    """The row saying the float32 rows below are judged gate-matched."""
    flipped = (
        "the float64 run's gates did not pair up with them"
        if flips is None
        else f"rounding put {flips} elements on the other side of a kink than the float64 run"
    )
    note = (
        f"[float32] judged against this program in float64 taking the float32 run's "
        f"decisions at its {gates} gates (ReLU, clamp, max, min): {flipped}"
    )
    return note, float("nan"), float("nan"), True, None, None


def check_parity(
    log_dir: str,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    grad_atol: float = 1e-4,
    draw: int = 0,
) -> list[Row]:
    """Replay the recorded batch with the parameters of that moment; compare
    predictions, buffer updates, loss and parameter gradients.

    Where the sample holds a float64 reference (ref64/ entries), two checks:
    the translation (this program in float64 against the reference, rows
    "... [float64]", within TRANSLATION_RTOL), the verdict on correctness; and
    the recorded-dtype run (this program in the dtypes the source ran in:
    float32, and bfloat16 or float16 where the source fed or cast to them)
    against the reference, within FLOAT32_FACTOR of the source's own error in
    those dtypes: _calibrated. Without a
    reference (logs from before it, or a replay that failed): this program in
    float32 against the recorded float32 values within atol/rtol (gradients:
    grad_atol).

    With `draw` k > 0, only the recorded-dtype rows of the sample nudged by one
    ulp in pattern k (_drawn): another draw of float32 rounding on it."""
    sample = _load(os.path.join(log_dir, "sample.safetensors"))
    trainable = [name for name, flag, *_ in PARAMETERS if flag]
    has_reference = any(reference_key(k) in sample for k in sample)
    if draw:
        return _draw_only(log_dir, sample, trainable, has_reference, draw)
    rows, signs64 = _translation(log_dir, sample, trainable) if has_reference else ([], None)
    rows = _unread(sample, trainable) + rows
    if has_reference and np.asarray(sample["loss"]).dtype == np.float64:
        return rows  # recorded in float64: the translation check is the whole check
    params = _module_params(sample_params(log_dir))
    medians = _typical_scales(sample)
    largest = _largest_scales(sample)
    typical = _typical_error(sample, medians)
    # fed as the source fed them: bfloat16 data stays bfloat16
    feeds = _load(os.path.join(log_dir, "sample.safetensors"), narrow=True)

    def step(p: dict[str, Any]) -> tuple[Any, Any]:
        return sample_step(p, feeds)

    gates = _Gates()
    if has_reference:
        # float32 accuracy is the program's as it trains (JAX: jitted); that its
        # other runs compute the same function, the translation check has shown
        # (only the first of _runs is run: JAX's op-by-op run compiles each op)
        runs = [("", _recorded(_run, step, params, trainable, gates))]
    else:
        runs = _runs(step, params, trainable)

    def judged(refs: dict[str, np.ndarray] | None) -> list[Row]:
        found: list[Row] = []
        for label, run in runs:
            for name, value, key, is_grad in _outputs(sample, trainable, run):
                if reference_key(key) in sample:
                    found.append(
                        _judged(
                            sample,
                            name + label,
                            value,
                            key,
                            is_grad,
                            typical,
                            medians,
                            largest,
                            refs,
                        )
                    )
                else:
                    tol = grad_atol if is_grad else atol
                    found.append(_compare(name + label, value, sample[key], tol, rtol))
        return found

    narrow = judged(None)
    # an output the reference lacks (a gradient its replay did not take) is
    # judged on the recorded values alone, and no draw judges it again
    plain = {
        name + label
        for label, run in runs
        for name, _, key, _ in _outputs(sample, trainable, run)
        if reference_key(key) not in sample
    }
    translated = bool(rows) and all(r[3] and r[5] is None and r[1] == r[1] for r in rows)
    if has_reference and translated:
        # judged on the branches the float32 run took: against this program in
        # float64 taking its decisions, where any differ from the float64 run's
        signs = _signs(runs[0][1])
        flips = _flips(signs, signs64)
        refs = _gate_matched(log_dir, sample, trainable, signs) if flips != 0 else None
        if refs is not None:
            narrow = [_matched_note(len(signs), flips), *judged(refs)]
    all_arrays = all(isinstance(v, np.ndarray) for v in feeds.values())  # no bfloat16
    referenced = [r for r in narrow if r[0] not in plain]
    if has_reference and translated and all_arrays and not all(r[3] for r in referenced):
        redrawn = _redrawn(log_dir, sample, trainable, referenced, typical, medians)
        narrow = redrawn + [r for r in narrow if r[0] in plain]
    return rows + narrow


def _draw_only(
    log_dir: str,
    sample: dict[str, np.ndarray],
    trainable: list[str],
    has_reference: bool,
    draw: int,
) -> list[Row]:
    """check_parity(draw=k): the rows of draw k (_drawn), where it can be taken."""
    if not has_reference:
        raise ValueError("a draw is judged against a float64 reference: this sample has none")
    stored = _load(os.path.join(log_dir, "sample.safetensors"), narrow=True)
    if not all(isinstance(v, np.ndarray) for v in stored.values()):
        raise ValueError("a draw nudges float32 values: this sample holds bfloat16 ones")
    medians = _typical_scales(sample)
    return _drawn(log_dir, sample, trainable, _typical_error(sample, medians), medians, draw)


def _drawn(
    log_dir: str,
    sample: dict[str, np.ndarray],
    trainable: list[str],
    typical: dict[str, float],
    medians: dict[bool, float],
    draw: int,
) -> list[Row]:
    """The recorded-dtype rows of one draw: this program on the sample nudged
    by one ulp (_nudged) against itself in float64 on the same values, taking
    the recorded-dtype run's gate decisions (_gate_matched; which the
    translation check has shown computes the reference's function), each
    judged by the source's own error against the recorded reference."""
    feeds = _nudged(_load(os.path.join(log_dir, "sample.safetensors"), narrow=True), draw)

    def step(p: dict[str, Any]) -> tuple[Any, Any]:
        return sample_step(p, feeds)

    gates = _Gates()
    params = _module_params(sample_params(log_dir, draw=draw))
    run = _recorded(_run, step, params, trainable, gates)
    refs = _gate_matched(log_dir, sample, trainable, _signs(run), draw)
    if refs is None:  # gates that did not replay: the float64 run on its own branches
        refs = _gate_matched(log_dir, sample, trainable, None, draw)
    assert refs is not None
    largest = _largest_scales(sample)
    return [
        _judged(sample, name, value, key, is_grad, typical, medians, largest, refs)
        for name, value, key, is_grad in _outputs(sample, trainable, run)
        if reference_key(key) in sample
    ]


def _redrawn(
    log_dir: str,
    sample: dict[str, np.ndarray],
    trainable: list[str],
    failed: list[Row],
    typical: dict[str, float],
    medians: dict[bool, float],
) -> list[Row]:
    """The recorded-dtype run failed where the translation holds: run again on
    the sample nudged by one ulp (_nudged; the reference of each draw is this
    program in float64 on the same nudged values, which the translation check
    has shown computes the reference's function), up to REDRAWS times. The
    first draw that passes on every output gives the rows, after a row saying
    so: the recorded inputs' failure was a branch decided by rounding (a ReLU's
    input within float32 error of 0 whose gradient flows in one run and not in
    the other), which the source, one draw itself, happened to win. A program
    whose formulas are less accurate fails every draw: the recorded run's rows
    stand, after a row saying that no draw passed."""
    worst = max((r[5] for r in failed if not r[3] and r[5] is not None), default=float("inf"))
    n_failed = sum(not r[3] for r in failed)
    for draw in range(1, REDRAWS + 1):
        rows = _drawn(log_dir, sample, trainable, typical, medians, draw)
        if all(r[3] for r in rows):
            note = (
                f"[float32] {n_failed} outputs failed on the recorded values (ratio up to "
                f"{worst:.1f}) and all pass on them nudged by one ulp (draw {draw}, below): "
                "a branch decided by rounding, not the program's accuracy"
            )
            return [(note, float("nan"), float("nan"), True, None, None), *rows]
    note = (
        f"[float32] {n_failed} outputs failed on the recorded values (ratio up to "
        f"{worst:.1f}, below) and on them nudged by one ulp in each of {REDRAWS} draws: "
        "the program's float32 accuracy"
    )
    return [(note, float("nan"), float("nan"), False, None, None), *failed]


def print_table(rows: list[Row]) -> None:
    """One line per output: its error against the recorded value, and where
    there is a float64 reference the source's own float32 error against it and
    the ratio of this program's error against it to that."""
    # a row that says something of the rows ("[float32] ...": no error of its
    # own) is a line of its own
    width = max([len(r[0]) for r in rows if r[1] == r[1] or r[0][:1] != "["] + [6])
    print(f"{'output':<{width}}  {'max abs err':>12}  {'source err':>14}  {'ratio':>7}  ok")
    for name, err, _rel, ok, own, ratio in rows:
        if err != err and name[:1] == "[":
            print(name)
            continue
        own_text = "-" if own is None else f"{own:.3e}"
        ratio_text = "-" if ratio is None else f"{ratio:.2f}"
        print(
            f"{name:<{width}}  {err:>12.3e}  {own_text:>14}  {ratio_text:>7}  {'yes' if ok else 'NO'}"
        )


def main() -> int:
    log_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = check_parity(log_dir)
    print_table(rows)
    ok = all(r[3] for r in rows)
    print("parity: ok" if ok else "parity: MISMATCH")
    return 0 if ok else 1


# What a standalone program inlines from this module, in this order (the check).
INLINED = (
    "_magnitude",
    "_terms",
    "_compare",
    "_error",
    "_calibrated",
    "_kind",
    "_typical_error",
    "_promoted",
    "sample_params",
    "_in_float64",
    "_translated",
    "_own_size",
    "_typical_scales",
    "_largest_scales",
    "_floor",
    "_translation",
    "_module_params",
    "_runs",
    "_run",
    "_outputs",
    "_unread",
    "_nudged",
    "_bounds",
    "_slope",
    "_kinks",
    "_replayed",
    "_gated",
    "_with_gates",
    "_recorded",
    "_signs",
    "_flips",
    "_gate_matched",
    "_judged",
    "_matched_note",
    "_draw_only",
    "_drawn",
    "_redrawn",
    "check_parity",
    "print_table",
    "main",
)
