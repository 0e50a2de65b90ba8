"""The shared op tests: every op of an emitter's table, on random inputs,
through the code that emitter writes, against onnx.reference and torch."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from op_samples import SAMPLES, OpSample

from tracelog.emit.onnx import graph_to_onnx
from tracelog.ir import TensorType
from tracelog.verify import compare

EMITTERS = ["tensorflow", "torch", "jax"]


def reference(sample: OpSample) -> list[np.ndarray]:
    if not sample.onnx:  # no ONNX function: torch's result
        assert sample.torch is not None, sample.id
        got = sample.torch(*[arr for _, arr in sample.inputs])
        return [np.asarray(r) for r in got] if isinstance(got, tuple) else [np.asarray(got)]
    model = graph_to_onnx(sample.graph())
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, sample.feeds())]


def typed_graph(sample: OpSample):
    ref = reference(sample)
    types = [TensorType(str(r.dtype), tuple(r.shape)) for r in ref]
    return sample.graph(types), ref


def run_emitted(emitter: str, sample: OpSample) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The one-node graph as the emitter writes it, run on the sample inputs."""
    from tracelog.emit import get_target
    from tracelog.emit.inline import import_block
    from tracelog.emit.program import emit_function

    target = get_target(emitter)
    graph, ref = typed_graph(sample)
    text = emit_function(target, graph, "f", [], "0" * 64, {})
    runtime = target.helpers
    used = [runtime.functions[h] for h in runtime.helpers_used(text)]
    parts = [import_block(target.pieces), *runtime.statements, *used, text]
    namespace: dict = {}
    exec(compile("\n\n".join(parts), f"<{sample.id}>", "exec"), namespace)
    if emitter == "tensorflow":
        import tensorflow as tf

        feeds = {name: tf.constant(arr) for name, arr in sample.inputs}
    elif emitter == "torch":
        import torch

        feeds = {name: torch.from_numpy(np.array(arr)) for name, arr in sample.inputs}
    else:
        import jax.numpy as jnp

        feeds = {name: jnp.asarray(arr) for name, arr in sample.inputs}
    if sample.op == "Dropout":  # the recorded-mask path: a mask of ones for ratio 0
        feeds["rng"] = {"mask.0": np.ones(sample.inputs[0][1].shape, bool)}
    elif sample.op in ("RandomUniformLike", "RandomNormalLike", "tracelog.RandomExponentialLike"):
        # the recorded draw
        feeds["rng"] = {"mask.0": ref[0]}
    out = namespace["f"]({}, **feeds)
    return [_numpy(out[o.role]) for o in graph.outputs], ref


def _numpy(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


@pytest.mark.parametrize("emitter", EMITTERS)
def test_every_rule_has_a_sample(emitter: str) -> None:
    from tracelog.emit import get_target

    table = get_target(emitter).table
    sampled = {s.op for s in SAMPLES}
    # "op/variant" keys are forms of one op (integer Div, a reduction over every axis)
    assert sorted({k.partition("/")[0] for k in table.keys()} - sampled) == []


@pytest.mark.parametrize("emitter", EMITTERS)
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.id for s in SAMPLES])
def test_op_agrees_with_onnx_reference_and_torch(emitter: str, sample: OpSample) -> None:
    pytest.importorskip(emitter, reason=f"the {emitter} target needs its framework installed")
    got, ref = run_emitted(emitter, sample)
    for k, (g, r) in enumerate(zip(got, ref, strict=True)):
        c = compare(f"output {k}", g, r, 1e-5, 1e-4)
        assert c.ok, (sample.id, "vs onnx.reference", c)
    if sample.torch is not None:
        want = sample.torch(*[arr for _, arr in sample.inputs])
        want = want[0] if isinstance(want, tuple) else want  # the first of several outputs
        c = compare("output 0", got[0], want, 1e-5, 1e-4)
        assert c.ok, (sample.id, "vs torch", c)


@pytest.mark.parametrize("op", ["tracelog.Log1p", "tracelog.Expm1"])
def test_log1p_and_expm1_functions_keep_small_inputs_digits(op: str) -> None:
    """The ONNX functions of Log1p and Expm1 (onnx.reference and onnxruntime)
    are within a few float32 ulp of the exact values where log(1 + x) and
    exp(x) - 1 written out give 0 (x = 1e-8) or lose half the digits (1e-4)."""
    import onnxruntime as ort

    x = np.array([1e-8, -3e-8, 1e-4, -2e-4, 0.5, -0.9 if op.endswith("Log1p") else -5.0, 3.0])
    x = x.astype(np.float32)
    model = graph_to_onnx(OpSample(op, [("x", x)]).graph())
    wide = x.astype(np.float64)
    exact = np.log1p(wide) if op.endswith("Log1p") else np.expm1(wide)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got in (ReferenceEvaluator(model).run(None, {"x": x})[0], sess.run(None, {"x": x})[0]):
        assert np.all(np.abs(got - exact) <= 4 * np.spacing(np.abs(exact).astype(np.float32)))


def test_erfc_function_keeps_the_tails_digits() -> None:
    """The ONNX function of tracelog.Erfc (Cody's, in float64) on
    onnx.reference and onnxruntime: correctly rounded in float32, within 6
    float64 ulp of mpmath's value, from -6 to 27 (erfc(27) is subnormal),
    where 1 - erf(x) gives 0 beyond x = 4 (float32) and 6 (float64)."""
    import onnxruntime as ort

    mpmath = pytest.importorskip(
        "mpmath",
        reason="the exact erfc values come from mpmath (torch needs sympy, which needs it)",
    )
    mpmath.mp.dps = 40
    x = np.concatenate([np.linspace(-6.0, 27.0, 661), [0.46875, 4.0, 26.5, np.inf, -np.inf]])
    for dtype, ulps in ((np.float32, 0.5), (np.float64, 6.0)):
        xs = x.astype(dtype)
        exact = np.asarray([float(mpmath.erfc(mpmath.mpf(float(v)))) for v in xs])
        wanted = exact.astype(dtype)
        graph = OpSample("tracelog.Erfc", [("x", xs)]).graph([TensorType(str(xs.dtype), xs.shape)])
        model = graph_to_onnx(graph)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for got in (
            ReferenceEvaluator(model).run(None, {"x": xs})[0],
            sess.run(None, {"x": xs})[0],
        ):
            err = np.abs(got.astype(np.float64) - exact)
            bound = ulps * np.spacing(np.abs(wanted)).astype(np.float64)
            assert np.all((err <= bound) | (got == wanted)), (dtype, x[np.argmax(err - bound)])


@pytest.mark.parametrize("op", ["tracelog.Atan2", "tracelog.Hypot"])
def test_atan2_and_hypot_functions_are_within_two_ulp(op: str) -> None:
    """Their ONNX functions (onnx.reference, float32 and float64) against numpy,
    over ten decades either way, signed zeros and infinities: within 2 ulp,
    infinities, NaN and zeros' signs exact."""
    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-30, 3e30]
    a = np.concatenate([rng.normal(size=500) * 10 ** rng.uniform(-5, 5, 500), np.repeat(edges, 8)])
    b = np.concatenate([rng.normal(size=500) * 10 ** rng.uniform(-5, 5, 500), np.tile(edges, 8)])
    ref = np.arctan2 if op.endswith("Atan2") else np.hypot
    for dtype in (np.float32, np.float64):
        ys, xs = a.astype(dtype), b.astype(dtype)
        graph = OpSample(op, [("y", ys), ("x", xs)]).graph([TensorType(str(ys.dtype), ys.shape)])
        with np.errstate(all="ignore"):
            got = ReferenceEvaluator(graph_to_onnx(graph)).run(None, {"y": ys, "x": xs})[0]
        exact = ref(ys.astype(np.float64), xs.astype(np.float64))
        finite = np.isfinite(exact)
        ulp = np.abs(got[finite] - exact[finite]) / np.spacing(np.abs(exact[finite]).astype(dtype))
        assert np.max(ulp) <= 2.0, (op, dtype)
        assert np.array_equal(got[~finite], exact[~finite].astype(dtype), equal_nan=True)
        zero = exact == 0
        assert np.array_equal(np.signbit(got[zero]), np.signbit(exact[zero]))
