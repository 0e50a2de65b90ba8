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
    elif sample.op in ("RandomUniformLike", "RandomNormalLike"):  # the recorded draw
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
