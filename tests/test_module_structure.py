"""The module structure of recorded graphs (tracelog.passes.modules): calls of
a module found where its nodes run, their inputs and outputs, and kinds that
are equal exactly when the calls compute the same thing, on real recordings
of a ResNet-style model, a Hugging Face GPT-2 and a hand-built graph with a
module called twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import record
from test_stable_names import ResNetish

import tracelog
from tracelog.ir import Graph, Node, Output, TensorType, Value
from tracelog.passes.modules import ModuleCall, module_calls, relative, structure


def _prediction(log_dir: Path) -> Graph:
    log = tracelog.load(log_dir)
    entry = next(e for e in log.entries_sorted() if e.kind == "prediction" and e.phase == "train")
    return log.graphs[entry.hash]


def _calls(root: ModuleCall) -> dict[str, list[ModuleCall]]:
    found: dict[str, list[ModuleCall]] = {}
    for c in root.walk():
        found.setdefault(c.path, []).append(c)
    return found


@pytest.fixture(scope="module")
def resnets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Graph]:
    graphs = {}
    for name, acts in {"same": ("relu",) * 3, "changed": ("relu", "gelu", "relu")}.items():
        torch.manual_seed(0)
        batches = [(torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,)))]
        log_dir = tmp_path_factory.mktemp(name)
        record(ResNetish(acts), log_dir, batches, F.cross_entropy)
        graphs[name] = _prediction(log_dir)
    return graphs


def test_blocks_of_one_structure_are_one_kind(resnets: dict[str, Graph]) -> None:
    graph = resnets["same"]
    calls = _calls(module_calls(graph))
    blocks = [calls[f"layers.{k}"][0] for k in range(3)]
    assert len({b.kind for b in blocks}) == 1
    assert all(b.module_type == "Block" for b in blocks)
    # each block gives its batch norms' running statistics (graph outputs) and
    # one value on, which the next block reads
    updates = {o.name for o in graph.outputs if o.role.startswith("update:")}
    passed = [[o for o in b.outputs if o not in updates] for b in blocks]
    assert [len(b.outputs) - len(p) for b, p in zip(blocks, passed, strict=True)] == [6, 6, 6]
    assert blocks[1].inputs == passed[0] and blocks[2].inputs == passed[1]
    assert sorted(relative(p, "layers.1") for p in blocks[1].params) == sorted(
        relative(p, "layers.0") for p in blocks[0].params
    )
    # the calls tile the graph: children inside their parent, in order
    layers = calls["layers"][0]
    assert [c.path for c in layers.children] == ["layers.0", "layers.1", "layers.2"]
    assert layers.start == blocks[0].start and layers.end == blocks[2].end
    s = structure(graph)
    assert s.written_once < s.nodes
    assert s.kinds[("Block", blocks[0].kind)] == 3


def test_a_changed_block_is_a_kind_of_its_own(resnets: dict[str, Graph]) -> None:
    calls = _calls(module_calls(resnets["changed"]))
    kinds = [calls[f"layers.{k}"][0].kind for k in range(3)]
    assert kinds[0] == kinds[2] != kinds[1]
    # its convolutions and batch norms are unchanged: the same kinds as elsewhere
    assert calls["layers.1.conv1"][0].kind == calls["layers.0.conv1"][0].kind


def test_gpt2_layers_are_one_kind_and_depth_adds_a_line_a_layer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the GPT-2 case needs transformers")
    written = {}
    for n_layer in (2, 4):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(
            vocab_size=32, n_positions=16, n_embd=16, n_layer=n_layer, n_head=2
        )
        model = transformers.GPT2LMHeadModel(cfg)
        model.config.use_cache = False
        ids = torch.randint(0, 32, (2, 6))
        log_dir = tmp_path / f"gpt2_{n_layer}"
        with tracelog.Listener(model, log_dir) as listener:
            with listener.batch():
                model(input_ids=ids, labels=ids).loss.backward()
        graph = _prediction(log_dir)
        calls = _calls(module_calls(graph))
        layers = [calls[f"transformer.h.{k}"][0] for k in range(n_layer)]
        assert len({c.kind for c in layers}) == 1
        assert all(c.module_type == "GPT2Block" for c in layers)
        written[n_layer] = structure(graph).written_once
    # two more layers: two more calls, nothing else
    assert written[4] - written[2] == 2


def test_a_module_called_twice_is_two_calls_of_one_kind() -> None:
    """Weights shared: one module path, two runs of nodes, each its own call;
    a value made inside a call and read after it is that call's output."""
    values = {
        "x": Value("x", TensorType("float32", ("batch", 4)), "input"),
        "lin.weight": Value("lin.weight", TensorType("float32", (4, 4)), "param", True),
    }
    nodes = []
    prev = "x"
    for k, (op, module, mtype) in enumerate(
        [
            ("Gemm", "lin", "Linear"),
            ("Relu", "", "Net"),
            ("Gemm", "lin", "Linear"),
            ("Tanh", "", "Net"),
        ]
    ):
        out = f"v{k}"
        values[out] = Value(out, TensorType("float32", ("batch", 4)), "node")
        inputs = [prev, "lin.weight"] if op == "Gemm" else [prev]
        nodes.append(
            Node(op, inputs, [out], {"transB": 1} if op == "Gemm" else {}, "", module, mtype)
        )
        prev = out
    graph = Graph("prediction", values, nodes, [Output(prev, "prediction")])
    root = module_calls(graph)
    lin = [c for c in root.children if c.path == "lin"]
    assert [(c.start, c.end) for c in lin] == [(0, 1), (2, 3)]
    assert lin[0].kind == lin[1].kind
    assert lin[0].inputs == ["x"] and lin[0].outputs == ["v0"]
    assert lin[1].inputs == ["v1"] and lin[1].outputs == ["v2"]
    assert root.outputs == ["v3"] and root.params == ["lin.weight"]


@pytest.mark.parametrize("path", ["/", "//", "a./b", "a//b", ".", "a."])
def test_paths_with_empty_segments_end(path: str) -> None:
    """A module path with an empty segment (any text can name a module) is
    split where it has segments and kept whole where it has none."""
    values = {"x": Value("x", TensorType("float32", ("batch", 4)), "input")}
    nodes = []
    prev = "x"
    for k, module in enumerate([path, "", path]):
        out = f"v{k}"
        values[out] = Value(out, TensorType("float32", ("batch", 4)), "node")
        nodes.append(Node("Relu", [prev], [out], {}, "", module, "Act"))
        prev = out
    root = module_calls(Graph("prediction", values, nodes, [Output(prev, "prediction")]))
    covered = sorted(i for c in root.walk() if not c.children for i in range(c.start, c.end))
    assert set(covered) <= {0, 1, 2} and root.start == 0 and root.end == 3


def _flat(modules: list[tuple[str, str]]) -> Graph:
    """A Keras-style graph: layers named flat ("block_1_dense"), each a
    (module, op) with a Gemm's kernel under the layer."""
    f32 = TensorType("float32", ("batch", 4))
    values = {"x": Value("x", f32, "input")}
    nodes, prev = [], "x"
    for module, op in modules:
        out = f"v{len(nodes)}"
        values[out] = Value(out, f32, "node")
        inputs = [prev]
        if op == "Gemm":
            kernel = f"{module}/kernel"
            values[kernel] = Value(kernel, TensorType("float32", (4, 4)), "param", True)
            inputs.append(kernel)
        nodes.append(Node(op, inputs, [out], {}, "", module, "Dense" if op == "Gemm" else "ReLU"))
        prev = out
    return Graph("prediction", values, nodes, [Output(prev, "prediction")])


def test_flat_layer_names_give_their_blocks() -> None:
    """Keras names a functional model's layers flat ("block_1_expand",
    "block_1_expand_relu", "block_2_expand", ...): runs of siblings whose
    names share leading words are the blocks, of one kind where they compute
    the same, each holding its layers; a layer named as the run ("dense"
    before "dense_1") is the block's own; names sharing nothing stay apart."""
    graph = _flat(
        [
            ("stem", "Gemm"),
            *[
                (f"block_{k}_expand{s}", op)
                for k in (1, 2)
                for s, op in (("", "Gemm"), ("_relu", "Relu"))
            ],
            ("dense", "Gemm"),
            ("dense_1", "Gemm"),
            ("head", "Relu"),
        ]
    )
    root = module_calls(graph)
    assert [(c.path, c.virtual) for c in root.children] == [
        ("stem", False),
        ("block", True),
        ("dense", True),
        ("head", False),
    ]
    block = root.children[1]
    # a block is named by all the words its layers share
    assert [c.path for c in block.children] == ["block_1_expand", "block_2_expand"]
    one, two = block.children
    assert one.kind == two.kind and one.virtual and one.params == ["block_1_expand/kernel"]
    # the layer named as the block gives it its own nodes
    assert (one.start, one.end) == (1, 3) and [c.path for c in one.children] == [
        "block_1_expand_relu"
    ]
    dense = root.children[2]
    assert (dense.start, dense.end) == (5, 7) and [c.path for c in dense.children] == ["dense_1"]
    # the calls still tile the graph in order
    assert [(c.start, c.end) for c in root.children] == [(0, 1), (1, 5), (5, 7), (7, 8)]


def test_torch_paths_keep_their_calls(resnets: dict[str, Graph]) -> None:
    """Dotted paths with no shared flat words: no virtual block appears."""
    assert not any(c.virtual for c in module_calls(resnets["same"]).walk())
