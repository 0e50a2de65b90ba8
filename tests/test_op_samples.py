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

EMITTERS = ["tensorflow"]


def reference(sample: OpSample) -> list[np.ndarray]:
    model = graph_to_onnx(sample.graph())
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, sample.feeds())]


def typed_graph(sample: OpSample):
    ref = reference(sample)
    types = [TensorType(str(r.dtype), tuple(r.shape)) for r in ref]
    return sample.graph(types), ref


def run_tensorflow(sample: OpSample) -> tuple[list[np.ndarray], list[np.ndarray]]:
    import tensorflow as tf

    from tracelog.emit import get_target
    from tracelog.emit.program import emit_function

    target = get_target("tensorflow")
    graph, ref = typed_graph(sample)
    helpers: set[str] = set()
    text = emit_function(target, graph, "f", [], "0" * 64, {}, helpers)
    source = "\n\n".join(
        ["import numpy as np\nimport tensorflow as tf"]
        + [target.helpers[h] for h in sorted(helpers)]
        + [text]
    )
    namespace: dict = {}
    exec(compile(source, f"<{sample.id}>", "exec"), namespace)  # noqa: S102
    feeds = {name: tf.constant(arr) for name, arr in sample.inputs}
    out = namespace["f"]({}, **feeds)
    return [np.asarray(out[o.role]) for o in graph.outputs], ref


RUNNERS = {"tensorflow": run_tensorflow}


@pytest.mark.parametrize("emitter", EMITTERS)
def test_every_rule_has_a_sample(emitter: str) -> None:
    from tracelog.emit import get_target

    table = get_target(emitter).table
    sampled = {s.op for s in SAMPLES}
    assert sorted(set(table.keys()) - sampled) == []


@pytest.mark.parametrize("emitter", EMITTERS)
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.id for s in SAMPLES])
def test_op_agrees_with_onnx_reference_and_torch(emitter: str, sample: OpSample) -> None:
    pytest.importorskip(emitter, reason=f"the {emitter} target needs its framework installed")
    got, ref = RUNNERS[emitter](sample)
    for k, (g, r) in enumerate(zip(got, ref, strict=True)):
        c = compare(f"output {k}", g, r, 1e-5, 1e-4)
        assert c.ok, (sample.id, "vs onnx.reference", c)
    if sample.torch is not None:
        want = sample.torch(*[arr for _, arr in sample.inputs])
        c = compare("output 0", got[0], want, 1e-5, 1e-4)
        assert c.ok, (sample.id, "vs torch", c)
