"""The neutral graph IR: values, nodes and graphs with ONNX operator semantics.

A Graph is what one training batch computed in one region (prediction or loss).
Its canonical form renames every value by order of first use, so two batches
that ran the same algebra produce byte-identical JSON and the same sha256.
Nothing here knows any framework or target.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

from tracelog.ops import schema_for

BATCH = "batch"
"""The symbolic leading dimension shared by the data inputs."""

Dim = int | str


# the element types a graph may hold
DTYPES = frozenset(
    (
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
    )
)
_SYMBOL = r"(?:batch|seq[2-9]?|count(?:[2-9]|[1-9][0-9])?)"
_TERM = rf"(?:{_SYMBOL}(?:\*{_SYMBOL})*(?:\*[1-9][0-9]*)?|[1-9][0-9]*)"
_DIM = re.compile(rf"-?{_TERM}(?:[+-]{_TERM})*")

# A symbolic dim is a polynomial over the symbols with integer coefficients:
# monomial (a sorted tuple of symbols; () for the constant) -> coefficient.
Poly = dict[tuple[str, ...], int]


def is_dim(d: object) -> bool:
    """A dim a log may hold: a size, or a canonical polynomial over the symbols."""
    return _is_dim(d)


def _is_dim(d: object) -> bool:
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return d >= 0
    return isinstance(d, str) and _DIM.fullmatch(d) is not None and format_dim(parse_dim(d)) == d


def is_symbolic(d: object) -> bool:
    """True for a dim that depends on a symbol: "batch", "batch*4", "seq-1", ..."""
    return isinstance(d, str)


def symbol_key(symbol: str) -> tuple[int, int]:
    """The order of symbols in a dim's text: batch, then seq, seq2, ..., then
    count, count2, ... (how many elements a mask of the data selects)."""
    if symbol == BATCH:
        return (0, 0)
    if symbol.startswith("count"):
        return (2, int(symbol[5:] or 1))
    return (1, int(symbol[3:] or 1))


def parse_dim(d: Dim) -> Poly:
    """A dim as a polynomial: 4 -> {(): 4}; "batch*seq-batch" ->
    {("batch", "seq"): 1, ("batch",): -1}."""
    if isinstance(d, int):
        return {(): d} if d else {}
    return dict(_terms(d))


@functools.lru_cache(maxsize=4096)
def _terms(d: str) -> tuple[tuple[tuple[str, ...], int], ...]:
    """parse_dim's polynomial of a text dim, as items (remembered: a replay
    of the batch dims reads the same few dims thousands of times)."""
    poly: Poly = {}
    for sign, term in re.findall(r"([+-]?)([^+-]+)", d):
        parts = term.split("*")
        coef = int(parts[-1]) if parts[-1].isdigit() else 1
        symbols = tuple(sorted((p for p in parts if not p.isdigit()), key=symbol_key))
        poly[symbols] = poly.get(symbols, 0) + (-coef if sign == "-" else coef)
    return tuple((m, c) for m, c in poly.items() if c)


def format_dim(poly: Poly) -> Dim:
    """The canonical text of a polynomial dim (an int when it is constant):
    higher degree first, symbols in symbol_key order, the constant last."""
    terms = sorted(
        ((m, c) for m, c in poly.items() if c),
        key=lambda mc: (-len(mc[0]), [symbol_key(s) for s in mc[0]]),
    )
    if all(not m for m, _ in terms):
        return sum(c for _, c in terms)
    text = ""
    for m, c in terms:
        body = "*".join(m) + (f"*{abs(c)}" if abs(c) != 1 else "") if m else str(abs(c))
        text += ("-" if c < 0 else ("+" if text else "")) + body
    return text


def dim_value(d: Dim, env: dict[str, int]) -> int:
    """The size of a dim when each symbol has the size `env` gives it."""
    total = 0
    for m, c in _terms(d) if isinstance(d, str) else parse_dim(d).items():
        term = c
        for s in m:
            term *= env[s]
        total += term
    return total


def dim_scale(d: Dim, k: int) -> Dim:
    """k times a dim (a dim merged with k elements of others)."""
    return format_dim({m: c * k for m, c in parse_dim(d).items()})


def dim_mul(a: Dim, b: Dim) -> Dim:
    """The product of two dims (two dims merged into one)."""
    product: Poly = {}
    for ma, ca in parse_dim(a).items():
        for mb, cb in parse_dim(b).items():
            m = tuple(sorted(ma + mb, key=symbol_key))
            product[m] = product.get(m, 0) + ca * cb
    return format_dim(product)


def batch_factor(d: object) -> int:
    """k of "batch*k" (1 for "batch"); a merged dim such as batch x time."""
    poly = parse_dim(d) if isinstance(d, str) else {}
    if len(poly) != 1 or (BATCH,) not in poly:
        raise ValueError(f"not a batch dim: {d!r}")
    return poly[(BATCH,)]


def batch_dim(k: int) -> str:
    if k < 1:  # an empty dim follows no batch ("batch*0" is no dim a log can hold)
        raise ValueError(f"no batch dim has {k} rows per sample")
    return BATCH if k == 1 else f"{BATCH}*{k}"


AttrValue = int | float | str | list[int] | list[float] | list[str]

VALUE_KINDS = ("input", "param", "buffer", "const", "node")
GRAPH_KINDS = ("prediction", "loss")

# Constants with at most this many elements are written inline in trace.json;
# larger ones go to weights.safetensors under "const/<digest>".
INLINE_CONSTANT_LIMIT = 64


def array_digest(dtype: str, shape: tuple[int, ...], data: bytes) -> str:
    """The content key of a constant: sha256 over dtype, shape and bytes."""
    h = hashlib.sha256(f"{dtype}{tuple(shape)}".encode())
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[Dim, ...]

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorType:
        """A type read from a log: a known dtype, dims that are sizes or batch
        symbols (emitters write dims into programs, so nothing else may pass)."""
        dtype, shape = d["dtype"], d["shape"]
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_dim(x) for x in shape):
            raise ValueError(f"malformed shape {shape!r}")
        return cls(dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass
class ConstData:
    """The content of a constant: inline values, or a digest of stored bytes."""

    data: list[Any] | None = None
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data} if self.digest is None else {"digest": self.digest}


@dataclass
class Value:
    name: str
    type: TensorType
    kind: str
    trainable: bool = False
    const: ConstData | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, **self.type.to_json()}
        if self.kind == "param":
            d["trainable"] = self.trainable
        if self.const is not None:
            d.update(self.const.to_json())
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Value:
        const = None
        if d["kind"] == "const":
            const = ConstData(data=d.get("data"), digest=d.get("digest"))
        return cls(
            name=str(d["name"]),
            type=TensorType.from_json(d),
            kind=str(d["kind"]),
            trainable=bool(d.get("trainable", False)),
            const=const,
        )


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    domain: str = ""
    module: str = ""
    module_type: str = ""
    source: str = ""

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op

    def int_attr(self, name: str, default: int | None = None) -> int:
        """Attribute ``name`` as an int; ``default`` where the node has none
        (KeyError with no default)."""
        if name not in self.attrs:
            if default is None:
                raise KeyError(name)
            return default
        v = self.attrs[name]
        if isinstance(v, list):
            raise TypeError(f"{self.qualified_op}: attribute {name} is a list, not an int")
        return int(v)

    def ints_attr(self, name: str, default: Sequence[int] | None = None) -> list[int]:
        """Attribute ``name`` as a list of ints; ``default`` where the node has
        none (KeyError with no default)."""
        if name not in self.attrs:
            if default is None:
                raise KeyError(name)
            return list(default)
        v = self.attrs[name]
        if not isinstance(v, (list, tuple)):
            raise TypeError(f"{self.qualified_op}: attribute {name} is not a list: {v!r}")
        ints: list[int] = []
        for x in v:
            if not isinstance(x, SupportsIndex):
                raise TypeError(f"{self.qualified_op}: attribute {name} holds {x!r}, not an int")
            ints.append(operator.index(x))
        return ints

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "inputs": self.inputs, "outputs": self.outputs}
        if self.domain:
            d["domain"] = self.domain
        if self.attrs:
            d["attrs"] = {k: _norm_attr(v) for k, v in sorted(self.attrs.items())}
        d["module"] = self.module
        d["module_type"] = self.module_type
        d["source"] = self.source
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Node:
        return cls(
            op=str(d["op"]),
            inputs=[str(x) for x in d["inputs"]],
            outputs=[str(x) for x in d["outputs"]],
            attrs=dict(d.get("attrs", {})),
            domain=str(d.get("domain", "")),
            module=str(d.get("module", "")),
            module_type=str(d.get("module_type", "")),
            source=str(d.get("source", "")),
        )


@dataclass
class Output:
    """A graph output. role: "prediction", "prediction.<key>", "feature.<n>",
    "loss" or "update:<buffer path>"."""

    name: str
    role: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "role": self.role}


@dataclass
class Graph:
    kind: str
    values: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)

    # -- views by kind, in order of first appearance --------------------------
    def _of_kind(self, kind: str) -> list[Value]:
        return [v for v in self.values.values() if v.kind == kind]

    @property
    def inputs(self) -> list[Value]:
        return self._of_kind("input")

    @property
    def params(self) -> list[Value]:
        return self._of_kind("param")

    @property
    def buffers(self) -> list[Value]:
        return self._of_kind("buffer")

    @property
    def constants(self) -> list[Value]:
        return self._of_kind("const")

    def output(self, role: str) -> Output:
        for out in self.outputs:
            if out.role == role:
                return out
        raise KeyError(role)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.qualified_op] = hist.get(n.qualified_op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- canonical form -------------------------------------------------------
    def canonical(self) -> Graph:
        """A copy with node outputs renamed v0, v1, ... and constants c0, c1, ...
        in order of first use; values listed in order of first use."""
        names = self._first_use_names()
        values: dict[str, Value] = {}
        for name in names.order:
            v = self.values[name]
            new = Value(names.rename[name], v.type, v.kind, v.trainable, v.const)
            values[new.name] = new
        nodes = [_renamed(n, names.rename) for n in self.nodes]
        outputs = [Output(names.rename[o.name], o.role) for o in self.outputs]
        return Graph(self.kind, values, nodes, outputs)

    def _first_use_names(self) -> _FirstUseNames:
        """The canonical names, walking the graph as it runs: data inputs in
        their declared order, then each node's inputs and outputs, then the
        graph outputs."""
        names = _FirstUseNames(self.values)
        for v in self.values.values():  # data inputs keep their declared order
            if v.kind == "input":
                names.read(v.name)
        for node in self.nodes:
            for i in node.inputs:
                names.read(i)
            for o in node.outputs:
                names.define(o)
        for out in self.outputs:
            names.read(out.name)
        return names

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "values": [v.to_json() for v in self.values.values()],
            "nodes": [n.to_json() for n in self.nodes],
            "outputs": [o.to_json() for o in self.outputs],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Graph:
        values = [Value.from_json(v) for v in d["values"]]
        return cls(
            kind=str(d["kind"]),
            values={v.name: v for v in values},
            nodes=[Node.from_json(n) for n in d["nodes"]],
            outputs=[Output(str(o["name"]), str(o["role"])) for o in d["outputs"]],
        )

    def canonical_json(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 of the canonical JSON. Call on a canonical graph."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    # -- checks ---------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError unless every value is defined once, before use, and
        every node names an op of the vocabulary (or is an Unsupported marker)."""
        defined = {v.name for v in self.values.values() if v.kind != "node"}
        self._check_kinds()
        for node in self.nodes:
            schema = schema_for(node.domain, node.op)
            schema.check_arity(node)
            self._check_defines(node, defined)
        for out in self.outputs:
            if out.name not in defined:
                raise ValueError(f"output {out.role} names undefined value {out.name!r}")

    def _check_kinds(self) -> None:
        """Every value's kind, and the graph's, is one the IR knows."""
        for v in self.values.values():
            if v.kind not in VALUE_KINDS:
                raise ValueError(f"value {v.name!r} has unknown kind {v.kind!r}")
        if self.kind not in GRAPH_KINDS:
            raise ValueError(f"unknown graph kind {self.kind!r}")

    def _check_defines(self, node: Node, defined: set[str]) -> None:
        """node reads only values defined before it and defines typed values
        not defined yet; adds its outputs to ``defined``."""
        for i in node.inputs:
            if i and i not in defined:
                raise ValueError(f"{node.qualified_op} uses {i!r} before it is defined")
        for o in node.outputs:
            if not o:
                continue
            if o in defined:
                raise ValueError(f"{node.qualified_op} redefines {o!r}")
            if o not in self.values:
                raise ValueError(f"{node.qualified_op} output {o!r} has no type")
            defined.add(o)


class _FirstUseNames:
    """Canonical names by order of first use: node outputs v0, v1, ...,
    constants c0, c1, ...; inputs, parameters and buffers keep their names."""

    def __init__(self, values: dict[str, Value]) -> None:
        self.values = values
        self.rename: dict[str, str] = {"": ""}
        self.order: list[str] = []  # the original names, in order of first use
        self.n_const = 0
        self.n_val = 0
        # names that stay: a parameter called "v0" must not meet a node value renamed v0
        self.kept = {n for n, v in values.items() if v.kind not in ("node", "const")}

    def _fresh(self, prefix: str, k: int) -> tuple[str, int]:
        """prefix<k>, or the next k whose name no kept value holds; and the k after it."""
        while f"{prefix}{k}" in self.kept:
            k += 1
        return f"{prefix}{k}", k + 1

    def read(self, name: str) -> None:
        """A value read: named on its first use (a node value must be defined first)."""
        if name in self.rename:
            return
        v = self.values[name]
        if v.kind == "const":
            self.rename[name], self.n_const = self._fresh("c", self.n_const)
        elif v.kind == "node":
            raise ValueError(f"value {name!r} is used before it is defined")
        else:
            self.rename[name] = name
        self.order.append(name)

    def define(self, name: str) -> None:
        """A node output ("" is an omitted one): the next v<k>."""
        if name == "":
            return
        if name in self.rename:
            raise ValueError(f"value {name!r} is defined twice")
        self.rename[name], self.n_val = self._fresh("v", self.n_val)
        self.order.append(name)


def _renamed(n: Node, rename: dict[str, str]) -> Node:
    """n reading and defining the renamed values, its attributes normalized."""
    return Node(
        op=n.op,
        inputs=[rename[i] for i in n.inputs],
        outputs=[rename[o] for o in n.outputs],
        attrs={k: _norm_attr(a) for k, a in sorted(n.attrs.items())},
        domain=n.domain,
        module=n.module,
        module_type=n.module_type,
        source=n.source,
    )


def _norm_attr(v: Any) -> Any:
    """Attributes in one normal form: bools as ints, tuples as lists."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (tuple, list)):
        return [_norm_attr(x) for x in v]
    return v
