"""Sample inputs per IR op: a one-node graph, random inputs, and (where torch
has the same operation) what torch computes. The shared op tests run every
sample through every emitter and compare with onnx.reference and torch.
A test fails when an op of an emitter's table has no sample here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelog.ir import ConstData, Graph, Node, Output, TensorType, Value

Array = np.ndarray


@dataclass
class OpSample:
    op: str  # qualified: "Conv", "tracelog.BatchNormTraining"
    inputs: list[tuple[str, Array]]  # runtime inputs, in node input order ("" skips)
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, Array] = field(default_factory=dict)  # constant inputs by name
    order: list[str] | None = None  # node input order when consts interleave
    n_out: int = 1
    torch: Callable[..., Any] | None = None  # torch's result from the runtime inputs
    name: str = ""
    # the op has no ONNX function: torch is the only oracle
    onnx: bool = True

    @property
    def id(self) -> str:
        return self.name or self.op

    def graph(self, out_types: list[TensorType] | None = None) -> Graph:
        """The one-node graph; every output is a graph output. Without
        out_types the outputs get placeholder types (enough for onnx.reference)."""
        domain, _, op = self.op.rpartition(".")
        values: dict[str, Value] = {}
        for name, arr in self.inputs:
            values[name] = Value(name, TensorType(str(arr.dtype), arr.shape), "input")
        for name, arr in self.consts.items():
            values[name] = Value(
                name,
                TensorType(str(arr.dtype), arr.shape),
                "const",
                const=ConstData(data=arr.tolist()),
            )
        order = self.order or [n for n, _ in self.inputs] + list(self.consts)
        outs = [f"y{k}" for k in range(self.n_out)]
        for k, o in enumerate(outs):
            ty = out_types[k] if out_types else TensorType("float32", ())
            values[o] = Value(o, ty, "node")
        roles = ["prediction"] + [f"prediction.{k}" for k in range(1, self.n_out)]
        return Graph(
            "prediction",
            values,
            [Node(op, order, outs, dict(self.attrs), domain=domain, module="m", module_type="Op")],
            [Output(o, r) for o, r in zip(outs, roles, strict=True)],
        )

    def feeds(self) -> dict[str, Array]:
        return dict(self.inputs)


def _r(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> Array:
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, shape).astype(np.float32)


def _i(*v: int) -> Array:
    return np.asarray(v, dtype=np.int64)


def _t(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch function of numpy arrays, returning numpy."""

    def run(*arrays: Array) -> Array:
        import torch

        return fn(*[torch.from_numpy(a) for a in arrays]).detach().numpy()

    return run


def _samples() -> list[OpSample]:
    import torch
    import torch.nn.functional as F

    x = _r(2, 3, 4)
    pos = _r(2, 3, 4, lo=0.1, hi=3.0)
    img = _r(2, 3, 6, 6)
    s: list[OpSample] = []
    unary = {
        "Relu": torch.relu, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Exp": torch.exp,
        "Abs": torch.abs, "Neg": torch.neg, "Erf": torch.erf, "Softplus": F.softplus,
        "Floor": torch.floor, "Ceil": torch.ceil, "Identity": lambda a: a.clone(),
    }  # fmt: skip
    for op, fn in unary.items():
        s.append(OpSample(op, [("x", x)], torch=_t(fn)))
    for op, fn in {"Sqrt": torch.sqrt, "Log": torch.log, "Reciprocal": torch.reciprocal}.items():
        s.append(OpSample(op, [("x", pos)], torch=_t(fn)))
    s.append(OpSample("Not", [("x", x > 0)], torch=_t(torch.logical_not)))
    s.append(
        OpSample("LeakyRelu", [("x", x)], {"alpha": 0.2}, torch=_t(lambda a: F.leaky_relu(a, 0.2)))
    )
    s.append(OpSample("Gelu", [("x", x)], {"approximate": "none"}, torch=_t(F.gelu)))
    s.append(
        OpSample(
            "Gelu",
            [("x", x)],
            {"approximate": "tanh"},
            torch=_t(lambda a: F.gelu(a, approximate="tanh")),
            name="Gelu-tanh",
        )
    )
    s.append(
        OpSample(
            "Clip",
            [("x", x)],
            consts={
                "lo": np.float32(-0.5) * np.ones((), np.float32),
                "hi": np.ones((), np.float32),
            },
            torch=_t(lambda a: a.clamp(-0.5, 1.0)),
        )
    )
    s.append(
        OpSample(
            "Clip",
            [("x", x)],
            consts={"lo": np.zeros((), np.float32)},
            torch=_t(lambda a: a.clamp(min=0.0)),
            name="Clip-min-only",
        )
    )
    y = _r(3, 4, seed=1)
    for op, fn in {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}.items():
        s.append(OpSample(op, [("a", x), ("b", y)], torch=_t(fn)))
    s.append(
        OpSample(
            "Div",
            [("a", _i(7, -7, 9)), ("b", _i(2, 2, -4))],
            torch=_t(lambda a, b: torch.div(a, b, rounding_mode="trunc")),
            name="Div-int",
        )
    )
    s.append(OpSample("Pow", [("a", pos), ("b", y)], torch=_t(torch.pow)))
    for op, fn in {"Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt}.items():
        s.append(OpSample(op, [("a", np.round(x)), ("b", np.round(y))], torch=_t(fn)))
    for op, fn in {"And": torch.logical_and, "Or": torch.logical_or}.items():
        s.append(OpSample(op, [("a", x > 0), ("b", y > 0)], torch=_t(fn)))
    s.append(OpSample("Max", [("a", x), ("b", y)], torch=_t(torch.maximum)))
    s.append(OpSample("Min", [("a", x), ("b", y)], torch=_t(torch.minimum)))
    s.append(OpSample("Where", [("c", x > 0), ("a", x), ("b", y)], torch=_t(torch.where)))
    s.append(OpSample("Cast", [("x", x)], {"to": "int64"}, torch=_t(lambda a: a.to(torch.int64))))
    s.append(OpSample("Softmax", [("x", x)], {"axis": 1}, torch=_t(lambda a: torch.softmax(a, 1))))
    s.append(
        OpSample(
            "LogSoftmax", [("x", x)], {"axis": -1}, torch=_t(lambda a: torch.log_softmax(a, -1))
        )
    )
    s.append(OpSample("MatMul", [("a", x), ("b", _r(4, 5))], torch=_t(torch.matmul)))
    s.append(OpSample("tracelog.StopGradient", [("x", x)], torch=_t(lambda a: a.detach())))
    s.append(OpSample("tracelog.SiLU", [("x", x)], torch=_t(torch.nn.functional.silu)))
    tiny = x * 1e-6  # where log(1 + x) and exp(x) - 1 written out lose x's digits
    s.append(OpSample("tracelog.Log1p", [("x", tiny)], torch=_t(torch.log1p)))
    s.append(OpSample("tracelog.Log1p", [("x", np.abs(x) * 3)], torch=_t(torch.log1p)))
    s.append(OpSample("tracelog.Expm1", [("x", tiny)], torch=_t(torch.expm1)))
    s.append(OpSample("tracelog.Expm1", [("x", x)], torch=_t(torch.expm1)))
    # Keras' MultiHeadAttention projections and scores
    q, k = _r(2, 5, 3, 4, seed=3), _r(2, 6, 3, 4, seed=4)
    eq = "aecd,abcd->acbe"
    s.append(
        OpSample(
            "Einsum",
            [("k", k), ("q", q)],
            {"equation": eq},
            torch=_t(lambda a, b: torch.einsum(eq, a, b)),
        )
    )
    s.append(
        OpSample(
            "Gemm",
            [("a", _r(3, 4)), ("w", _r(5, 4)), ("c", _r(5))],
            {"transB": 1, "alpha": 0.5, "beta": 2.0},
            torch=_t(lambda a, w, c: 0.5 * a @ w.T + 2.0 * c),
        )
    )
    w = _r(4, 3, 3, 3, seed=2)
    s.append(
        OpSample(
            "Conv",
            [("x", img), ("w", w), ("b", _r(4))],
            {
                "kernel_shape": [3, 3],
                "strides": [2, 1],
                "pads": [1, 0, 1, 0],
                "dilations": [1, 1],
                "group": 1,
            },
            torch=_t(lambda a, k, b: F.conv2d(a, k, b, stride=(2, 1), padding=(1, 0))),
        )
    )
    s.append(
        OpSample(
            "Conv",
            [("x", img), ("w", w)],
            {
                "kernel_shape": [3, 3],
                "strides": [1, 1],
                "pads": [2, 2, 2, 2],
                "dilations": [2, 2],
                "group": 1,
            },
            torch=_t(lambda a, k: F.conv2d(a, k, padding=2, dilation=2)),
            name="Conv-dilated",
        )
    )
    s.append(
        OpSample(
            "Conv",
            [("x", img), ("w", _r(6, 1, 3, 3))],
            {
                "kernel_shape": [3, 3],
                "strides": [1, 1],
                "pads": [1, 1, 1, 1],
                "dilations": [1, 1],
                "group": 3,
            },
            torch=_t(lambda a, k: F.conv2d(a, k, padding=1, groups=3)),
            name="Conv-depthwise",
        )
    )
    img4 = _r(2, 4, 5, 5)
    s.append(
        OpSample(
            "Conv",
            [("x", img4), ("w", _r(6, 2, 3, 3))],
            {
                "kernel_shape": [3, 3],
                "strides": [1, 1],
                "pads": [0, 0, 0, 0],
                "dilations": [1, 1],
                "group": 2,
            },
            torch=_t(lambda a, k: F.conv2d(a, k, groups=2)),
            name="Conv-grouped",
        )
    )
    s.append(
        OpSample(
            "MaxPool",
            [("x", img)],
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
            torch=_t(lambda a: F.max_pool2d(a, 3, 2, 1)),
        )
    )
    s.append(
        OpSample(
            "AveragePool",
            [("x", img)],
            {
                "kernel_shape": [2, 2],
                "strides": [2, 2],
                "pads": [1, 1, 1, 1],
                "count_include_pad": 1,
            },
            torch=_t(lambda a: F.avg_pool2d(a, 2, 2, 1)),
        )
    )
    # Keras' "same" average pool: asymmetric padding the divisor leaves out
    s.append(
        OpSample(
            "AveragePool",
            [("x", img)],
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 1]},
            name="AveragePool_exclude_pad",
        )
    )
    s.append(
        OpSample("GlobalAveragePool", [("x", img)], torch=_t(lambda a: F.adaptive_avg_pool2d(a, 1)))
    )
    c = img.shape[1]
    stats = [
        ("scale", _r(c, lo=0.5)),
        ("bias", _r(c)),
        ("mean", _r(c)),
        ("var", _r(c, lo=0.5, hi=2.0)),
    ]
    s.append(
        OpSample(
            "BatchNormalization",
            [("x", img), *stats],
            {"epsilon": 1e-5},
            torch=_t(lambda a, g, b, m, v: F.batch_norm(a, m, v, g, b, False, 0.0, 1e-5)),
        )
    )

    def bn_train(a, g, b, m, v):
        return F.batch_norm(a, m.clone(), v.clone(), g, b, True, 0.1, 1e-5)

    s.append(
        OpSample(
            "tracelog.BatchNormTraining",
            [("x", img), *stats],
            {"epsilon": 1e-5, "momentum": 0.1, "axes": [0, 2, 3]},
            n_out=3,
            torch=_t(bn_train),
        )
    )

    def bn_train_weighted(a, g, b, m, v):
        # Keras' update (decay * moving + momentum * batch statistic, the biased
        # variance) is checked against the op's ONNX function on onnx.reference
        return F.batch_norm(a, None, None, g, b, True, 0.0, 1e-3)

    s.append(
        OpSample(
            "tracelog.BatchNormTraining",
            [("x", img), *stats],
            {"epsilon": 1e-3, "momentum": 0.01, "decay": 0.99, "unbiased": 0, "axes": [0, 2, 3]},
            n_out=3,
            torch=_t(bn_train_weighted),
            name="BatchNormTraining-weighted",
        )
    )
    s.append(
        OpSample(
            "LayerNormalization",
            [("x", x), ("g", _r(4)), ("b", _r(4))],
            {"axis": -1, "epsilon": 1e-5},
            torch=_t(lambda a, g, b: F.layer_norm(a, (4,), g, b)),
        )
    )
    s.append(
        OpSample(
            "Dropout",
            [("x", x)],
            consts={"ratio": np.float32(0.0) * np.ones((), np.float32), "train": np.ones((), bool)},
            n_out=2,
            torch=_t(lambda a: a.clone()),  # ratio 0: deterministic, the same in every runtime
        )
    )
    for largest, k in ((1, 2), (0, 3)):
        s.append(
            OpSample(
                "TopK",
                [("x", x)],
                {"axis": 1, "largest": largest, "sorted": 1},
                consts={"k": np.array([k], np.int64)},
                n_out=2,
                torch=_t(lambda a, k=k, largest=largest: torch.topk(a, k, 1, bool(largest))[0]),
                name=f"TopK/{'largest' if largest else 'smallest'}",
            )
        )
    # random draws at a single value (low == high, scale 0): every runtime, a replay fed
    # the reference's values or a fresh draw, gives the same tensor
    s.append(OpSample("RandomUniformLike", [("x", x)], {"low": 0.5, "high": 0.5}))
    s.append(OpSample("RandomNormalLike", [("x", x)], {"mean": 0.25, "scale": 0.0}))
    # no parameter makes it constant: the program is fed onnx.reference's draw
    s.append(OpSample("tracelog.RandomExponentialLike", [("x", x)]))
    for op, fn in {
        "ReduceMean": lambda a: a.mean(dim=(0, 2), keepdim=True),
        "ReduceSum": lambda a: a.sum(dim=(0, 2), keepdim=True),
        "ReduceMax": lambda a: a.amax(dim=(0, 2), keepdim=True),
        "ReduceMin": lambda a: a.amin(dim=(0, 2), keepdim=True),
        "ReduceProd": lambda a: a.prod(dim=0, keepdim=True).prod(dim=2, keepdim=True),
    }.items():
        s.append(OpSample(op, [("x", x)], {"keepdims": 1}, consts={"axes": _i(0, 2)}, torch=_t(fn)))
    s.append(
        OpSample(
            "ReduceMean",
            [("x", x)],
            {"keepdims": 0},
            torch=_t(lambda a: a.mean()),
            name="ReduceMean-all",
        )
    )
    s.append(
        OpSample("ArgMax", [("x", x)], {"axis": 1, "keepdims": 0}, torch=_t(lambda a: a.argmax(1)))
    )
    s.append(
        OpSample(
            "Reshape", [("x", x)], consts={"shape": _i(-1, 6)}, torch=_t(lambda a: a.reshape(-1, 6))
        )
    )
    s.append(
        OpSample(
            "Transpose", [("x", x)], {"perm": [2, 0, 1]}, torch=_t(lambda a: a.permute(2, 0, 1))
        )
    )
    s.append(
        OpSample(
            "Concat",
            [("a", x), ("b", x * 2)],
            {"axis": 1},
            torch=_t(lambda a, b: torch.cat([a, b], 1)),
        )
    )
    s.append(
        OpSample(
            "Split",
            [("x", x)],
            {"axis": 2},
            consts={"split": _i(1, 3)},
            n_out=2,
            torch=_t(lambda a: torch.split(a, [1, 3], 2)[0]),
        )
    )
    s.append(
        OpSample(
            "Slice",
            [("x", x)],
            consts={"starts": _i(1), "ends": _i(2**63 - 1), "axes": _i(2), "steps": _i(2)},
            torch=_t(lambda a: a[:, :, 1::2]),
        )
    )
    s.append(
        OpSample(
            "Gather",
            [("x", x)],
            {"axis": 1},
            consts={"i": np.asarray(2, np.int64)},
            torch=_t(lambda a: a[:, 2]),
        )
    )
    s.append(
        OpSample(
            "Gather",
            [("w", _r(5, 3)), ("i", _i(4, 0, 4, 2))],
            {"axis": 0},
            torch=_t(lambda w, i: F.embedding(i, w)),
            name="Gather-embedding",
        )
    )
    s.append(
        OpSample(
            "Unsqueeze",
            [("x", x)],
            consts={"axes": _i(1, -1)},
            torch=_t(lambda a: a.unsqueeze(1).unsqueeze(-1)),
        )
    )
    s.append(
        OpSample(
            "Squeeze",
            [("x", _r(2, 1, 4))],
            consts={"axes": _i(1)},
            torch=_t(lambda a: a.squeeze(1)),
        )
    )
    s.append(
        OpSample(
            "Expand",
            [("x", _r(3, 1))],
            consts={"shape": _i(2, 1, 4)},
            torch=_t(lambda a: a.expand(2, 3, 4)),
        )
    )
    s.append(
        OpSample(
            "Pad",
            [("x", img)],
            {"mode": "constant"},
            consts={"pads": _i(0, 0, 1, 0, 0, 0, 2, 1)},
            torch=_t(lambda a: F.pad(a, (0, 1, 1, 2))),
        )
    )
    s.append(
        OpSample(
            "Tile", [("x", x)], consts={"reps": _i(1, 2, 1)}, torch=_t(lambda a: a.repeat(1, 2, 1))
        )
    )
    s.append(
        OpSample(
            "Shape",
            [("x", x)],
            {"start": 0, "end": 2},
            torch=_t(lambda a: torch.tensor(a.shape[:2])),
        )
    )
    s.append(
        OpSample(
            "ConstantOfShape",
            [("s", _i(2, 3))],
            {"value": 1.5},
            torch=None,  # torch.full needs a Python shape; onnx.reference is the oracle
        )
    )
    logp = np.log(np.random.default_rng(3).dirichlet(np.ones(5), size=6)).astype(np.float32)
    tgt = _i(0, 4, 2, 2, 1, 3)
    s.append(
        OpSample(
            "NegativeLogLikelihoodLoss",
            [("p", logp), ("t", tgt)],
            {"reduction": "mean", "ignore_index": 2},
            torch=_t(lambda p, t: F.nll_loss(p, t, ignore_index=2)),
        )
    )
    s.append(
        OpSample(
            "NegativeLogLikelihoodLoss",
            [("p", logp), ("t", tgt), ("w", _r(5, lo=0.1, hi=1.0))],
            {"reduction": "sum"},
            torch=_t(lambda p, t, w: F.nll_loss(p, t, w, reduction="sum")),
            name="NegativeLogLikelihoodLoss-weighted",
        )
    )
    s += _elementwise_samples({sample.op for sample in s}, x)
    # inputs and constants in the node's input order
    for sample in s:
        if sample.consts and sample.order is None:
            sample.order = [n for n, _ in sample.inputs] + list(sample.consts)
    return s


def _elementwise_samples(sampled: set[str], x: Array) -> list[OpSample]:
    """A sample for every one-input element-wise op of the vocabulary that has
    none above, from its schema: numeric attributes at half their ONNX default,
    so a spelling that drops an attribute is caught. onnx.reference is the oracle."""
    from tracelog.ops import vocabulary

    found = []
    for schema in vocabulary():
        if "elementwise" in schema.traits and schema.inputs == ("X",):
            if schema.qualified not in sampled:
                attrs = {k: d * 0.5 for k, d in schema.defaults if isinstance(d, float)}
                found.append(OpSample(schema.qualified, [("x", x)], attrs))
    return found


def _vision_samples() -> list[OpSample]:
    """Group norm, transposed convolution and resize (issue 12), in the forms
    the torch adapter writes and the edges each target spells apart."""
    import torch.nn.functional as F

    img = _r(2, 6, 5, 4)
    s: list[OpSample] = []
    s.append(
        OpSample(
            "GroupNormalization",
            [("x", img), ("g", _r(6, lo=0.5)), ("b", _r(6))],
            {"num_groups": 3, "epsilon": 1e-5},
            torch=_t(lambda a, g, b: F.group_norm(a, 3, g, b)),
        )
    )
    s.append(
        OpSample(
            "GroupNormalization",
            [("x", _r(2, 4, 7)), ("g", _r(4, lo=0.5)), ("b", _r(4))],
            {"num_groups": 2, "epsilon": 1e-3},
            torch=_t(lambda a, g, b: F.group_norm(a, 2, g, b, 1e-3)),
            name="GroupNormalization-1d",
        )
    )

    def conv_t(
        name: str, x: Array, w: Array, b: Array | None, attrs: dict[str, Any], fn: Any
    ) -> None:
        inputs = [("x", x), ("w", w)] + ([("b", b)] if b is not None else [])
        kernel = {"kernel_shape": list(w.shape[2:])}
        s.append(OpSample("ConvTranspose", inputs, {**kernel, **attrs}, torch=fn, name=name))

    conv_t(
        "ConvTranspose",
        _r(2, 3, 4, 5),
        _r(3, 4, 3, 3, seed=1),
        _r(4),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]},
        _t(lambda a, k, c: F.conv_transpose2d(a, k, c, 2, 1, (1, 0))),
    )
    # onnx.reference (1.23) computes grouped ConvTranspose wrongly (onnx/onnx#8446):
    # grouped forms are checked against torch and onnxruntime in test_vision_ops.py
    conv_t(
        "ConvTranspose-dilated",
        _r(2, 4, 4, 3),
        _r(4, 3, 2, 3, seed=2),
        None,
        {"strides": [2, 1], "pads": [0, 2, 0, 2], "dilations": [3, 2]},
        _t(lambda a, k: F.conv_transpose2d(a, k, None, (2, 1), (0, 2), 0, 1, (3, 2))),
    )
    conv_t(
        "ConvTranspose-1d",
        _r(2, 4, 5),
        _r(4, 3, 3, seed=4),
        _r(3),
        {"strides": [3], "pads": [1, 1], "output_padding": [2]},
        _t(lambda a, k, c: F.conv_transpose1d(a, k, c, 3, 1, 2)),
    )
    conv_t(  # pads torch cannot take: asymmetric, and output_padding past the end pad
        "ConvTranspose-asymmetric",
        _r(1, 2, 3, 4),
        _r(2, 3, 3, 2, seed=5),
        _r(3),
        {"strides": [2, 3], "pads": [0, 1, 2, 0], "output_padding": [1, 2]},
        None,
    )
    conv_t(
        "ConvTranspose-3d",
        _r(1, 2, 3, 2, 3),
        _r(2, 2, 2, 2, 2, seed=6),
        _r(2),
        {"strides": [2, 1, 2], "pads": [1, 0, 0, 1, 0, 0]},
        _t(lambda a, k, c: F.conv_transpose3d(a, k, c, (2, 1, 2), (1, 0, 0))),
    )

    def resize(
        name: str, x: Array, attrs: dict[str, Any], scales: list[float] | None, fn: Any
    ) -> None:
        axes = list(range(2, x.ndim))
        if scales is not None:
            consts = {"scales": np.asarray(scales, np.float32)}
            order = ["x", "", "scales"]
        else:
            consts = {"sizes": _i(*attrs.pop("sizes"))}
            order = ["x", "", "", "sizes"]
        a = {"axes": axes, **attrs}
        s.append(OpSample("Resize", [("x", x)], a, consts, order, torch=fn, name=name))

    nearest = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}
    resize(
        "Resize",
        img,
        {**nearest, "nearest_mode": "floor"},
        [2.0, 3.0],
        _t(lambda a: F.interpolate(a, scale_factor=(2.0, 3.0))),
    )
    exact = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel"}
    resize(
        "Resize-nearest-exact-sizes",
        img,
        {**exact, "nearest_mode": "round_prefer_ceil", "sizes": [8, 3]},
        None,
        _t(lambda a: F.interpolate(a, size=(8, 3), mode="nearest-exact")),
    )
    linear = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    resize(
        "Resize-linear-scales",
        img,
        linear,
        [1.5, 2.0],  # 5 * 1.5 = 7.5: the output is 7, the coordinates still by 1.5
        _t(lambda a: F.interpolate(a, scale_factor=(1.5, 2.0), mode="bilinear")),
    )
    resize(
        "Resize-linear-align-corners",
        img,
        {"mode": "linear", "coordinate_transformation_mode": "align_corners", "sizes": [9, 3]},
        None,
        _t(lambda a: F.interpolate(a, size=(9, 3), mode="bilinear", align_corners=True)),
    )
    resize(
        "Resize-linear-1d",
        _r(2, 3, 5),
        {**linear, "sizes": [8]},
        None,
        _t(lambda a: F.interpolate(a, size=8, mode="linear")),
    )
    resize(
        "Resize-cubic",
        img,
        {"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75},
        [2.0, 2.0],
        _t(lambda a: F.interpolate(a, scale_factor=2, mode="bicubic")),
    )
    # pools with ceil_mode (the last window may overhang the end padding) and in 1-D and 3-D
    ceil = {"strides": [2, 2], "ceil_mode": 1}
    s.append(
        OpSample(
            "MaxPool",
            [("x", img)],
            {"kernel_shape": [2, 3], "pads": [1, 0, 1, 0], **ceil},
            torch=_t(lambda a: F.max_pool2d(a, (2, 3), 2, (1, 0), ceil_mode=True)),
            name="MaxPool-ceil",
        )
    )
    for include in (1, 0):
        s.append(
            OpSample(
                "AveragePool",
                [("x", img)],
                {
                    "kernel_shape": [3, 3],
                    "pads": [1, 1, 1, 1],
                    "count_include_pad": include,
                    **ceil,
                },
                torch=_t(
                    lambda a, inc=bool(include): F.avg_pool2d(
                        a, 3, 2, 1, ceil_mode=True, count_include_pad=inc
                    )
                ),
                name=f"AveragePool-ceil-{'include' if include else 'exclude'}",
            )
        )
    vol = _r(2, 3, 5, 4, 5)
    s.append(
        OpSample(
            "MaxPool",
            [("x", vol)],
            {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2], "pads": [0, 1, 1, 0, 1, 1]},
            torch=_t(lambda a: F.max_pool3d(a, (2, 2, 3), (2, 1, 2), (0, 1, 1))),
            name="MaxPool-3d",
        )
    )
    s.append(
        OpSample(
            "AveragePool",
            [("x", vol)],
            {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1},
            torch=_t(lambda a: F.avg_pool3d(a, 2, ceil_mode=True)),
            name="AveragePool-3d-ceil",
        )
    )
    s.append(
        OpSample(
            "AveragePool",
            [("x", _r(2, 3, 7))],
            {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 0},
            torch=_t(lambda a: F.avg_pool1d(a, 3, 2, 1, count_include_pad=False)),
            name="AveragePool-1d",
        )
    )
    return s


def _math_samples() -> list[OpSample]:
    """Trigonometric and hyperbolic functions, rounding, special functions and
    running products: each inside its domain, and where its edges are (ties
    of Round, signed zeros and infinities of Atan2 and Hypot, Erfc's tail)."""
    import torch

    x, y = _r(2, 3, 4), _r(3, 4, seed=1)
    u = np.tanh(x) * np.float32(0.9)  # in (-1, 1)
    s: list[OpSample] = []
    for op, fn, arr in (
        ("Tan", torch.tan, u),
        ("Asin", torch.asin, u),
        ("Acos", torch.acos, u),
        ("Atan", torch.atan, x * 3),
        ("Sinh", torch.sinh, x),
        ("Cosh", torch.cosh, x),
        ("Asinh", torch.asinh, x * 3),
        ("Acosh", torch.acosh, x * x + 1),
        ("Atanh", torch.atanh, u),
    ):
        s.append(OpSample(op, [("x", arr)], torch=_t(fn)))
    # near +-1 and 0, where erfinv's digits come from 1 - |x| and x
    near_one = np.asarray([0.9999, -0.99999, 0.999999, 1e-6, -0.5, 0.5], np.float32)
    erfinv_x = np.concatenate([u.reshape(-1), near_one])
    s.append(OpSample("tracelog.Erfinv", [("x", erfinv_x)], torch=_t(torch.erfinv)))
    # the tails (small p: ndtri is not sqrt(2) erfinv(2p - 1) there), the middle
    ndtri_p = np.concatenate(
        [np.tanh(x.reshape(-1)) * 0.49 + 0.5, [1e-30, 1e-6, 0.02, 0.5, 0.98, 0.9999]]
    ).astype(np.float32)
    s.append(OpSample("tracelog.Ndtri", [("p", ndtri_p)], torch=_t(torch.special.ndtri)))
    # the far left tail (log(ndtr(x)) is -inf below -13 in float32), 0, the right tail
    log_ndtr_x = np.concatenate(
        [x.reshape(-1) * 4, [-40.0, -20.0, -10.0, -0.5, 0.0, 0.5, 6.0, 12.0]]
    ).astype(np.float32)
    s.append(OpSample("tracelog.LogNdtr", [("x", log_ndtr_x)], torch=_t(torch.special.log_ndtr)))
    # both sides of the series' split at |x| = 8, 0, large |x| (I0 and I1 near float32's
    # overflow at 88: exp(|x|) alone overflows first)
    bessel_x = np.concatenate(
        [x.reshape(-1) * 5, [0.0, 8.0, -8.0, 7.99, 8.01, 30.0, -45.0, 85.0]]
    ).astype(np.float32)
    for op, fn in (
        ("tracelog.I0", torch.special.i0),
        ("tracelog.I0e", torch.special.i0e),
        ("tracelog.I1", torch.special.i1),
        ("tracelog.I1e", torch.special.i1e),
    ):
        s.append(OpSample(op, [("x", bessel_x)], torch=_t(fn)))
    ties = np.asarray([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 3.7], np.float32)
    s.append(
        OpSample("Round", [("x", np.concatenate([ties, x.reshape(-1)]))], torch=_t(torch.round))
    )
    erfc_x = np.concatenate([x.reshape(-1) * 3, np.asarray([-5.0, 0.4, 0.5, 4.5, 9.0, 30.0])])
    s.append(OpSample("tracelog.Erfc", [("x", erfc_x.astype(np.float32))], torch=_t(torch.erfc)))
    # both sides of the reflection at 0.5, the negatives between the poles, near 0
    # and large values
    gamma_x = np.concatenate(
        [np.abs(x.reshape(-1)) * 4 + 0.01, [-2.5, -0.3, 0.25, 0.5, 1.0, 2.0, 1e-3, 30.0, 1e4]]
    ).astype(np.float32)
    s.append(OpSample("tracelog.Lgamma", [("x", gamma_x)], torch=_t(torch.lgamma)))
    s.append(OpSample("tracelog.Digamma", [("x", gamma_x)], torch=_t(torch.digamma)))
    s.append(
        OpSample(
            "tracelog.Trigamma",
            [("x", gamma_x)],
            torch=_t(lambda v: torch.special.polygamma(1, v)),
        )
    )
    wild = np.asarray([np.nan, np.inf, -np.inf, 0.0, -1.5, 2.0], np.float32)
    s.append(OpSample("IsNaN", [("x", wild)], torch=_t(torch.isnan)))
    s.append(OpSample("IsInf", [("x", wild)], torch=_t(torch.isinf)))
    s.append(
        OpSample(
            "IsInf",
            [("x", wild)],
            {"detect_negative": 0},
            torch=_t(torch.isposinf),
            name="IsInf-positive",
        )
    )
    s.append(
        OpSample(
            "IsInf",
            [("x", wild)],
            {"detect_positive": 0},
            torch=_t(torch.isneginf),
            name="IsInf-negative",
        )
    )
    d = np.abs(y) + np.float32(0.3)
    s.append(
        OpSample(
            "Mod", [("a", x * 3), ("b", -d)], {"fmod": 1}, torch=_t(torch.fmod), name="Mod-fmod"
        )
    )
    s.append(
        OpSample(
            "Mod",
            [("a", _i(7, -7, 9, -9)), ("b", _i(2, 2, -4, -4))],
            {"fmod": 1},
            torch=_t(torch.fmod),
            name="Mod-fmod-int",
        )
    )
    edges = np.asarray([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf], np.float32)
    ey, ex = np.repeat(edges, 6), np.tile(edges, 6)
    s.append(OpSample("tracelog.Atan2", [("y", x), ("x", y)], torch=_t(torch.atan2)))
    s.append(
        OpSample(
            "tracelog.Atan2", [("y", ey), ("x", ex)], torch=_t(torch.atan2), name="Atan2-edges"
        )
    )
    big = np.asarray([3e30, -4e30, 1e-30, 0.0], np.float32)
    s.append(OpSample("tracelog.Hypot", [("x", x), ("y", y)], torch=_t(torch.hypot)))
    s.append(
        OpSample(
            "tracelog.Hypot",
            [("x", np.concatenate([big, ey])), ("y", np.concatenate([big[::-1], ex]))],
            torch=_t(torch.hypot),
            name="Hypot-edges",
        )
    )
    z = x.copy()
    z[0, 1, 2] = 0.0
    s.append(
        OpSample(
            "tracelog.CumProd",
            [("x", z)],
            {"axis": 2},
            torch=_t(lambda a: torch.cumprod(a, 2)),
        )
    )
    s.append(
        OpSample(
            "tracelog.CumProd",
            [("x", _i(3, -2, 5, 0, 7, -1).reshape(2, 3))],
            {"axis": 0},
            torch=_t(lambda a: torch.cumprod(a, 0)),
            name="CumProd-int",
        )
    )
    return s


def _attention_samples() -> list[OpSample]:
    """Attention, masks and indexing (issue 12): integer and boolean tensors
    through comparisons, bitwise ops, Where and Pad; triangles, scans,
    gathers and scatters."""
    import torch

    x, y = _r(2, 3, 4), _r(3, 4, seed=1)
    ints = _i(-7, -1, 0, 3, 12, 2**40).reshape(2, 3)
    ints2 = _i(5, -3, 6, 3, -12, 7).reshape(2, 3)
    s: list[OpSample] = [
        OpSample("Sin", [("x", x)], torch=_t(torch.sin)),
        OpSample("Cos", [("x", x)], torch=_t(torch.cos)),
        OpSample("Xor", [("a", x > 0), ("b", y > 0)], torch=_t(torch.logical_xor)),
        OpSample("BitwiseNot", [("a", ints)], torch=_t(torch.bitwise_not)),
        OpSample("Equal", [("a", x > 0), ("b", y > 0)], torch=_t(torch.eq), name="Equal-bool"),
        OpSample(
            "Cast",
            [("x", np.round(x))],
            {"to": "bool"},
            torch=_t(torch.Tensor.bool),
            name="Cast-bool",
        ),
        OpSample(
            "Where",
            [("c", ints > 0), ("a", ints), ("b", ints2)],
            torch=_t(torch.where),
            name="Where-int",
        ),
        OpSample(
            "Mod",
            [("a", ints)],
            consts={"n": np.asarray(5, np.int64)},
            torch=_t(lambda a: torch.remainder(a, 5)),
        ),
    ]
    for op, fn in {"LessOrEqual": torch.le, "GreaterOrEqual": torch.ge}.items():
        s.append(OpSample(op, [("a", np.round(x)), ("b", np.round(y))], torch=_t(fn)))
        s.append(OpSample(op, [("a", ints), ("b", ints2)], torch=_t(fn), name=f"{op}-int"))
    for op, fn in {
        "BitwiseAnd": torch.bitwise_and,
        "BitwiseOr": torch.bitwise_or,
        "BitwiseXor": torch.bitwise_xor,
    }.items():
        s.append(OpSample(op, [("a", ints), ("b", ints2)], torch=_t(fn)))
    s.append(
        OpSample(
            "Trilu",
            [("x", x)],
            {"upper": 0},
            consts={"k": np.asarray(1, np.int64)},
            torch=_t(lambda a: torch.tril(a, 1)),
        )
    )
    s.append(
        OpSample(
            "Trilu",
            [("x", _r(3, 5) > 0)],
            {"upper": 1},
            consts={"k": np.asarray(-1, np.int64)},
            torch=_t(lambda a: torch.triu(a, -1)),
            name="Trilu-upper-bool",
        )
    )
    s.append(
        OpSample(
            "CumSum",
            [("x", x)],
            consts={"axis": np.asarray(1, np.int64)},
            torch=_t(lambda a: torch.cumsum(a, 1)),
        )
    )
    s.append(
        OpSample(
            "CumSum",
            [("x", ints.astype(np.int32))],
            consts={"axis": np.asarray(-1, np.int64)},
            torch=_t(lambda a: torch.cumsum(a, -1, dtype=torch.int32)),
            name="CumSum-int32",
        )
    )
    data, idx = _r(3, 4), _i(0, 3, 1, 1, 2, 0).reshape(3, 2)
    s.append(
        OpSample(
            "GatherElements",
            [("x", data), ("i", idx)],
            {"axis": 1},
            torch=_t(lambda a, i: torch.gather(a, 1, i)),
        )
    )
    # selections by the data: rows along axis 0, columns along axis 1, the nonzeros
    keep_rows, keep_cols = np.array([True, False, True]), np.array([False, True, True, False])
    s.append(
        OpSample(
            "Compress",
            [("x", data), ("m", keep_rows)],
            {"axis": 0},
            torch=_t(lambda a, m: a[m]),
            name="Compress/rows",
        )
    )
    s.append(
        OpSample(
            "Compress",
            [("x", data), ("m", keep_cols)],
            {"axis": 1},
            torch=_t(lambda a, m: a[:, m]),
            name="Compress/columns",
        )
    )
    s.append(
        OpSample(
            "NonZero",
            [("x", np.where(data > 0, data, 0.0).astype(np.float32))],
            torch=_t(lambda a: torch.nonzero(a).T),
        )
    )
    # unique targets for the plain scatter (which of two writes wins is unspecified)
    unique, upd = _i(2, 0, 1, 2, 0, 2, 0, 1).reshape(2, 4), _r(2, 4, seed=5)
    s.append(
        OpSample(
            "ScatterElements",
            [("x", data), ("i", unique), ("u", upd)],
            {"axis": 0},
            torch=_t(lambda a, i, u: torch.scatter(a, 0, i, u)),
        )
    )
    repeats = _i(1, 1, 0, 3, 3, 0).reshape(3, 2)
    upd2 = _r(3, 2, seed=6)
    for reduction, name in {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}.items():
        s.append(
            OpSample(
                "ScatterElements",
                [("x", data), ("i", repeats), ("u", upd2)],
                {"axis": 1, "reduction": reduction},
                torch=_t(lambda a, i, u, r=name: torch.scatter_reduce(a, 1, i, u, r)),
                name=f"ScatterElements-{reduction}",
            )
        )
    s.append(
        OpSample(
            "Pad",
            [("x", ints)],
            {"mode": "constant"},
            consts={"pads": _i(0, 1, 0, 2), "value": np.asarray(-100, np.int64)},
            torch=_t(lambda a: torch.nn.functional.pad(a, (1, 2), value=-100)),
            name="Pad-valued-int",
        )
    )
    s += _sdpa_samples()
    for sample in s:
        if sample.consts and sample.order is None:
            sample.order = [n for n, _ in sample.inputs] + list(sample.consts)
    return s


def _causal_masked(mask: Array, length: int, keys: int) -> Array:
    """An additive mask with is_causal's mask folded in (torch takes one of the two)."""
    return np.where(np.triu(np.ones((length, keys), bool), 1), -np.inf, mask).astype(mask.dtype)


def _sdpa_samples() -> list[OpSample]:
    """tracelog.Attention against torch's F.scaled_dot_product_attention: 4-D
    (JAX's fused path) and 3-D, a value dim unlike the key dim, a causal mask
    with more keys than queries, an additive mask with a fully masked row (0,
    not NaN), both masks at once, and float64."""
    import torch.nn.functional as F

    q, k, v = _r(2, 3, 4, 5, seed=20), _r(2, 3, 6, 5, seed=21), _r(2, 3, 6, 5, seed=22)
    mask = np.zeros((2, 1, 4, 6), np.float32)
    mask[0, 0, 1, :] = -np.inf  # one query sees no key
    mask[1, 0, :, 2] = -np.inf
    mask[1, 0, 3, 4] = 0.75  # a bias, not only a mask

    def sdpa(scale: float, causal: bool = False, masked: bool = False):
        def run(a, b, c, m=None):
            if masked and causal:
                m = torch_from(_causal_masked(m.numpy(), a.shape[-2], b.shape[-2]))
                causal_ = False
            else:
                causal_ = causal
            return F.scaled_dot_product_attention(a, b, c, m, is_causal=causal_, scale=scale)

        return _t(run)

    def torch_from(a: Array) -> Any:
        import torch

        return torch.from_numpy(a)

    return [
        OpSample(
            "tracelog.Attention",
            [("q", q), ("k", k), ("v", v)],
            {"scale": 0.4, "is_causal": 0},
            torch=sdpa(0.4),
        ),
        OpSample(
            "tracelog.Attention",
            [("q", q[0]), ("k", k[0]), ("v", _r(3, 6, 7, seed=23))],
            {"scale": 0.3, "is_causal": 1},
            torch=sdpa(0.3, causal=True),
            name="Attention-causal-3d",
        ),
        OpSample(
            "tracelog.Attention",
            [("q", q), ("k", k), ("v", v), ("m", mask)],
            {"scale": 0.5, "is_causal": 0},
            torch=sdpa(0.5, masked=True),
            name="Attention-masked",
        ),
        OpSample(
            "tracelog.Attention",
            [("q", q), ("k", k), ("v", _r(2, 3, 6, 3, seed=24)), ("m", mask)],
            {"scale": 0.5, "is_causal": 1},
            torch=sdpa(0.5, causal=True, masked=True),
            name="Attention-masked-causal",
        ),
        OpSample(
            "tracelog.Attention",
            [(n, a.astype(np.float64)) for n, a in (("q", q), ("k", k), ("v", v), ("m", mask))],
            {"scale": 0.5, "is_causal": 0},
            torch=sdpa(0.5, masked=True),
            name="Attention-float64",
        ),
    ]


def _linalg_samples() -> list[OpSample]:
    """Dense linear algebra on a batch of well-conditioned symmetric positive
    definite matrices (Cholesky's domain), and on their Cholesky factors."""
    import torch

    h = _r(2, 3, 3, seed=3)
    spd = (h @ h.transpose(0, 2, 1) / 3 + np.eye(3)).astype(np.float32)
    lower = np.linalg.cholesky(spd.astype(np.float64)).astype(np.float32)
    b = _r(2, 3, 2, seed=4)
    # rows permuted (one swap and one 3-cycle): elimination must pivot, the sign flips
    general = np.stack([spd[0][[1, 0, 2]], spd[1][[2, 0, 1]]])
    linalg = torch.linalg
    return [
        OpSample("Det", [("x", spd)], torch=_t(linalg.det)),
        OpSample("tracelog.Inverse", [("x", spd)], torch=_t(linalg.inv)),
        OpSample("tracelog.Solve", [("a", spd), ("b", b)], torch=_t(linalg.solve)),
        OpSample(
            "tracelog.SlogDet",
            [("x", spd)],
            n_out=2,
            torch=lambda a: tuple(t.numpy() for t in linalg.slogdet(torch.from_numpy(a))),
        ),
        OpSample(
            "tracelog.Inverse", [("x", general)], torch=_t(linalg.inv), name="Inverse/pivoted"
        ),
        OpSample(
            "tracelog.Solve",
            [("a", general), ("b", b)],
            torch=_t(linalg.solve),
            name="Solve/pivoted",
        ),
        OpSample(
            "tracelog.SlogDet",
            [("x", general)],
            n_out=2,
            torch=lambda a: tuple(t.numpy() for t in linalg.slogdet(torch.from_numpy(a))),
            name="SlogDet/pivoted",
        ),
        OpSample("tracelog.Cholesky", [("x", spd)], torch=_t(linalg.cholesky)),
        OpSample(
            "tracelog.SolveTriangular",
            [("a", lower), ("b", b)],
            torch=_t(lambda a, c: linalg.solve_triangular(a, c, upper=False)),
        ),
        OpSample(
            "tracelog.SolveTriangular",
            [("a", lower.transpose(0, 2, 1).copy()), ("b", b)],
            {"upper": 1},
            torch=_t(lambda a, c: linalg.solve_triangular(a, c, upper=True)),
            name="SolveTriangular/upper",
        ),
        OpSample(
            "tracelog.Solve",
            [("a", general[0]), ("b", b)],
            torch=_t(linalg.solve),
            name="Solve/broadcast",
        ),
        OpSample(
            "tracelog.SolveTriangular",
            [("a", lower[0]), ("b", b)],
            torch=_t(lambda a, c: linalg.solve_triangular(a, c, upper=False)),
            name="SolveTriangular/broadcast",
        ),
    ]


_ATTENTION = _attention_samples()
_MATH = _math_samples() + _linalg_samples()
# a hand-written sample replaces the float one _samples() guesses for a new one-input op
_WRITTEN = {a.op for a in _ATTENTION + _MATH}
SAMPLES = [s for s in _samples() if s.name or s.torch or s.op not in _WRITTEN] + _ATTENTION
SAMPLES += _vision_samples()
SAMPLES += _MATH


# -- recurrent layers (issue 12) --
# torch's k-th gate is ONNX's gate _TORCH_GATES[op][k] (LSTM i, f, g, o from i, o, f, c;
# GRU r, z, n from z, r, h)
_TORCH_GATES = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}


def _torch_layer(op: str, direction: str, **flags: Any) -> Callable[..., Any]:
    """What an nn.LSTM / nn.GRU / nn.RNN holding the node's weights computes, as ONNX's Y
    [seq, dirs, batch, hidden]: the torch oracle of a recurrent sample."""

    def run(x: Array, w: Array, r: Array, b: Array | None = None, *states: Array) -> Array:
        import torch

        dirs, hidden = w.shape[0], r.shape[-1]
        cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}[op]
        layer = cls(x.shape[-1], hidden, bias=b is not None, bidirectional=dirs == 2, **flags)
        order = _TORCH_GATES[op]

        def gates(a: Array) -> torch.Tensor:
            parts = np.split(a, len(order))
            return torch.from_numpy(np.concatenate([parts[k] for k in order]))

        for d in range(dirs):
            suffix = "_l0_reverse" if d else "_l0"
            state = {"weight_ih" + suffix: gates(w[d]), "weight_hh" + suffix: gates(r[d])}
            if b is not None:
                wb, rb = np.split(b[d], 2)
                state.update({"bias_ih" + suffix: gates(wb), "bias_hh" + suffix: gates(rb)})
            layer.load_state_dict(state, strict=False)
        xt = torch.from_numpy(x)
        if direction == "reverse":
            xt = xt.flip(0)
        hx = tuple(torch.from_numpy(s) for s in states)
        y, _ = layer(xt, (hx if len(hx) > 1 else hx[0]) if hx else None)
        y = y.reshape(y.shape[0], y.shape[1], dirs, hidden).transpose(1, 2)
        return (y.flip(0) if direction == "reverse" else y).detach().numpy()

    return run


def _recurrent_samples() -> list[OpSample]:
    t, n, i, h = 5, 2, 3, 4
    x = _r(t, n, i, seed=7)
    s = []
    for op, gates, attrs in (
        ("LSTM", 4, {}),
        ("GRU", 3, {"linear_before_reset": 1}),
        ("RNN", 1, {}),
    ):
        for direction, dirs in (("bidirectional", 2), ("reverse", 1)):
            w, r = _r(dirs, gates * h, i, seed=8), _r(dirs, gates * h, h, seed=9)
            b = _r(dirs, 2 * gates * h, seed=10)
            states = [("h0", _r(dirs, n, h, seed=11))]
            if op == "LSTM":
                states.append(("c0", _r(dirs, n, h, seed=12)))
            s.append(
                OpSample(
                    op,
                    [("x", x), ("w", w), ("r", r), ("b", b), *states],
                    {"hidden_size": h, "direction": direction, **attrs},
                    order=["x", "w", "r", "b", "", *(name for name, _ in states)],
                    n_out=1 + len(states),
                    torch=_torch_layer(op, direction),
                    name=f"{op}-{direction}",
                )
            )
        # forward, no bias, no initial state, Y alone: ONNX's defaults
        w, r = _r(1, gates * h, i, seed=13), _r(1, gates * h, h, seed=14)
        s.append(
            OpSample(
                op,
                [("x", x), ("w", w), ("r", r)],
                {"hidden_size": h, **attrs},
                torch=_torch_layer(op, "forward"),
                name=f"{op}-plain",
            )
        )
    return s


SAMPLES += _recurrent_samples()


def _ctc_samples() -> list[OpSample]:
    """tracelog.CTCLoss against its ONNX function and torch's F.ctc_loss: padded
    targets with a repeated label, an empty target and short inputs, blank 0; the
    same concatenated with a nonzero blank; an impossible alignment zeroed."""
    import torch.nn.functional as F

    t, n, c = 8, 4, 5
    logits = np.random.default_rng(7).standard_normal((t, n, c))
    lp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
    padded = np.asarray([[1, 1, 2], [3, 4, 0], [2, 0, 0], [4, 2, 3]], np.int64)
    steps, lengths = _i(8, 6, 3, 7), _i(3, 2, 0, 3)

    def ctc(blank: int, zero_infinity: bool) -> Callable[..., Any]:
        return _t(
            lambda x, y, il, tl: F.ctc_loss(
                x, y, il, tl, blank=blank, reduction="none", zero_infinity=zero_infinity
            )
        )

    s = [
        OpSample(
            "tracelog.CTCLoss",
            [("x", lp), ("y", padded), ("il", steps), ("tl", lengths)],
            {"blank": 0, "zero_infinity": 0},
            torch=ctc(0, False),
        )
    ]
    moved = np.where(padded == 1, 0, padded)  # labels for blank 1
    flat = np.concatenate([moved[k, : lengths[k]] for k in range(n)])
    s.append(
        OpSample(
            "tracelog.CTCLoss",
            [("x", lp), ("y", flat), ("il", steps), ("tl", lengths)],
            {"blank": 1, "zero_infinity": 0},
            torch=ctc(1, False),
            name="CTCLoss-concatenated-blank1",
        )
    )
    short = _i(8, 6, 3, 2)  # 2 steps for 3 labels: impossible
    s.append(
        OpSample(
            "tracelog.CTCLoss",
            [("x", lp), ("y", padded), ("il", short), ("tl", lengths)],
            {"blank": 0, "zero_infinity": 1},
            torch=ctc(0, True),
            name="CTCLoss-zero-infinity",
        )
    )
    return s


SAMPLES += _ctc_samples()
