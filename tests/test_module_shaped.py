"""Module-shaped programs (issue 15 item 1): a module structure called more
than once is written once, as a function, and called where it occurs, on a
Hugging Face GPT-2 recorded at two depths; its dropout masks (keyed from
mask_base) and parameters (read by prefix) are proven by the parity check;
the tracing program of the first-divergence search stays flat."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest
import torch

import tracelog
from tracelog.emit import get_target
from tracelog.emit.common import Namespace
from tracelog.emit.harness import attach
from tracelog.emit.program import build_program, emit_function, emit_kind_function
from tracelog.emit.shaped import distinct, kind_functions, prefix_of
from tracelog.ir import Graph, Node, Output, TensorType, Value
from tracelog.log import TraceLog
from tracelog.passes.modules import module_calls

transformers = pytest.importorskip("transformers", reason="the GPT-2 case needs transformers")


def _record_gpt2(log_dir: Path, n_layer: int) -> Path:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_embd=16, n_layer=n_layer, n_head=2
    )  # dropout on (0.1): the blocks' masks come from the sample
    model = transformers.GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tracelog.Listener(model, log_dir) as listener:
        for _ in range(2):
            ids = torch.randint(0, 32, (2, 6))
            with listener.batch():
                model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    return log_dir


@pytest.fixture(scope="module")
def gpt2_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("gpt2")
    return {n: _record_gpt2(root / f"gpt2_{n}", n) for n in (2, 4)}


def _changed(a: str, b: str) -> list[str]:
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("target", ["tensorflow", "jax"])
def test_depth_adds_a_call_a_layer_not_a_layer(gpt2_logs: dict[int, Path], target: str) -> None:
    texts = {n: build_program(TraceLog.load(d), get_target(target)) for n, d in gpt2_logs.items()}
    for n, text in texts.items():
        assert text.count("\ndef gpt2_block(") == 1
        assert text.count("= gpt2_block(") == n  # one call a layer
        assert text.count(", GPT2_BLOCK_PARAMETERS),") == n  # under(prefix, ...) a layer
    changed = _changed(texts[2], texts[4])
    added = [line for line in changed if line.startswith("+")]
    # two more layers: two PARAMETERS lines, two calls (black may wrap one
    # over a few lines), and the lines that read the last layer's output or
    # say the graph's digest; no layer's worth of statements
    assert len(changed) <= 20, "\n".join(changed)
    assert sum("gpt2_block(" in line for line in added) == 2
    assert sum("GPT2_BLOCK_PARAMETERS" in line for line in added) == 2
    # the layers' own statements are in the one definition, not in the diff
    assert not any("c_attn" in line or "softmax" in line for line in changed)


@pytest.mark.parametrize("target", ["tensorflow", "jax", "torch"])
def test_module_shaped_program_passes_parity(gpt2_logs: dict[int, Path], target: str) -> None:
    """The calls read the right parameters (prefix + path under the module)
    and the right recorded dropout masks (mask_base + k): any slip fails the
    float64 translation rows."""
    if target == "jax":
        pytest.importorskip("jax", reason="the JAX target needs jax installed")
    log_dir = gpt2_logs[4]
    text = build_program(TraceLog.load(log_dir), get_target(target))
    assert "mask_base" in text and "rng_key(mask_base" in text
    spec = importlib.util.spec_from_loader("tracelog_shaped", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(text, "<program>", "exec"), module.__dict__)
    attach(module.__dict__, target)  # the parity check, as its __main__ runs it
    rows = module.check_parity(str(log_dir))
    assert any(r[0].endswith("[float64]") for r in rows)
    assert all(r[3] for r in rows), [r for r in rows if not r[3]]


def test_the_tracing_program_stays_flat(gpt2_logs: dict[int, Path]) -> None:
    """The first-divergence search pairs every IR value with the program's:
    its program writes every node out, keyed by IR name."""
    text = build_program(TraceLog.load(gpt2_logs[2]), get_target("jax"), trace=True)
    assert "def gpt2_block(" not in text
    assert "_trace[" in text


def test_kind_functions_name_values_under_their_module(gpt2_logs: dict[int, Path]) -> None:
    """Inside a kind's function, values and parameters are named relative to
    the module (a one-module change is a one-definition diff), and
    parameters are read by the call's prefix."""
    text = build_program(TraceLog.load(gpt2_logs[2]), get_target("jax"))
    body = text.split("\ndef gpt2_block(", 1)[1].split("\n\n\n", 1)[0]
    # LayerNorm: a one-op kind with parameters, called under the block's prefix
    assert 'layer_norm(params, prefix + "ln_1.", x)' in body
    layer_norm = text.split("\ndef layer_norm(", 1)[1].split("\n\n\n", 1)[0]
    assert 'params[prefix + "weight"]' in layer_norm
    assert 'prefix + "attn."' in body  # GPT2Attention: a kind of its own, called from here
    assert "transformer_h_0" not in body and "transformer.h.0" not in body


def _chain(modules: list[tuple[str, str]]) -> Graph:
    """x through (module, weight) blocks of Gemm + Relu, then a one-op Tanh
    module "s" twice: a hand-built graph for the kind rules."""
    f32 = TensorType("float32", ("batch", 4))
    values = {"x": Value("x", f32, "input")}
    nodes, prev = [], "x"
    steps: list[tuple[str, str, str | None]] = []
    for module, weight in modules:
        steps += [("Gemm", module, weight), ("Relu", module, None)]
    steps += [("Tanh", "s", None), ("Relu", "", None), ("Tanh", "s", None)]
    for k, (op, module, weight) in enumerate(steps):
        out = f"v{k}"
        values[out] = Value(out, f32, "node")
        inputs = [prev]
        if weight:
            values.setdefault(weight, Value(weight, TensorType("float32", (4, 4)), "param", True))
            inputs.append(weight)
        attrs = {"transB": 1} if op == "Gemm" else {}
        nodes.append(Node(op, inputs, [out], attrs, "", module, "Block" if weight else "Act"))
        prev = out
    return Graph("prediction", values, nodes, [Output(prev, "prediction")])


def _jax_texts(graph: Graph) -> tuple[list[str], str, str]:
    """The graph's JAX kind functions, and its function written with them
    (module-shaped) and without (flat)."""
    target = get_target("jax")
    program = Namespace(target.reserved)
    kinds = kind_functions([graph], program)
    texts = [emit_kind_function(target, kf, kinds, {}, program) for kf in distinct(kinds)]
    shaped = emit_function(target, graph, "f", [], "0" * 64, {}, program=program, kinds=kinds)
    flat = emit_function(target, graph, "g", [], "0" * 64, {}, program=Namespace(target.reserved))
    return texts, shaped, flat


def test_which_kinds_become_functions() -> None:
    """Called twice with two ops or more, parameters under its own path: a
    function; a one-op module, or one reading a weight from elsewhere (tied),
    stays inline."""
    graph = _chain(
        [("a.0", "a.0.weight"), ("a.1", "a.1.weight"), ("t.0", "w.weight"), ("t.1", "w.weight")]
    )
    kinds = kind_functions([graph], Namespace())
    written = {kf.call.path: kf for kf in kinds.values()}
    assert set(written) == {"a.0"}  # "a.1" is a call of the same kind
    kf = written["a.0"]
    assert kf.name == "block" and kf.needs_params and kf.needs_prefix and not kf.random
    assert prefix_of(kf.call) == "a.0."
    root = module_calls(graph)
    tied = [c for c in root.walk() if c.path.startswith("t.")]
    assert len({c.kind for c in tied}) == 1 and prefix_of(tied[0]) is None


def _nested(inner: str) -> Graph:
    """Two blocks a.0, a.1, each a Gemm in its child `inner` and a Gemm and a
    Relu of its own: kinds nested in kinds."""
    f32 = TensorType("float32", ("batch", 4))
    values = {"x": Value("x", f32, "input")}
    nodes, prev = [], "x"
    for k in range(2):
        for module, op, weight in [
            (f"a.{k}.{inner}", "Gemm", f"a.{k}.{inner}.weight"),
            (f"a.{k}", "Gemm", f"a.{k}.weight"),
            (f"a.{k}", "Relu", None),
        ]:
            out = f"v{len(nodes)}"
            values[out] = Value(out, f32, "node")
            inputs = [prev]
            if weight:
                values[weight] = Value(weight, TensorType("float32", (4, 4)), "param", True)
                inputs.append(weight)
            attrs = {"transB": 1} if op == "Gemm" else {}
            mtype = "Linear" if module.endswith(inner) else "Block"
            nodes.append(Node(op, inputs, [out], attrs, "", module, mtype))
            prev = out
    return Graph("prediction", values, nodes, [Output(prev, "prediction")])


@pytest.mark.parametrize("inner", ["", "prefix", "updates", "mask_base"])
def test_module_shaped_hand_built_program_runs(inner: str) -> None:
    """The kind function and its calls, emitted for the hand-built graph, give
    the flat program's values (JAX target, numpy inputs); a submodule named
    like a kind function's argument does not take its name."""
    pytest.importorskip("jax", reason="the JAX target needs jax installed")
    import numpy as np

    if inner:
        graph = _nested(inner)
        weights = [n for n, v in graph.values.items() if v.kind == "param"]
    else:
        weights = ["a.0.weight", "a.1.weight"]
        graph = _chain([("a.0", weights[0]), ("a.1", weights[1])])
    texts, shaped, flat = _jax_texts(graph)
    assert "= block(params, " in shaped and "block(" not in flat
    if inner:  # the child's output, named after it, would be `prefix = linear(...)`
        assert f"{inner}_1 = linear(params, prefix + {inner + '.'!r}, x)" in texts[0]
    scope: dict[str, object] = {}
    exec("import jax.numpy as jnp\nimport jax\n" + "\n\n".join([*texts, shaped, flat]), scope)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal((4, 4)).astype("float32") for n in weights}
    x = rng.standard_normal((3, 4)).astype("float32")
    got = scope["f"](params, x)["prediction"]
    want = scope["g"](params, x)["prediction"]
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_onnx_model_defines_each_kind_once(gpt2_logs: dict[int, Path]) -> None:
    """The ONNX target's idiom: each repeated module kind is one local function
    (domain tracelog.modules), called by one node a layer; the model passes
    the checker and its parity check (float64 translation rows included)."""
    onnx = pytest.importorskip("onnx", reason="the ONNX target needs onnx installed")
    from tracelog.emit.onnx_model import GRAPHS_DOMAIN, MODULES_DOMAIN, build_model

    for n, log_dir in gpt2_logs.items():
        model = build_model(TraceLog.load(log_dir))
        onnx.checker.check_model(model)
        kinds = [f.name for f in model.functions if f.domain == MODULES_DOMAIN]
        assert kinds.count("gpt2_block") == 1
        # an inner kind is defined before the kinds that call it
        assert kinds.index("gpt2_attention") < kinds.index("gpt2_block")
        predict = next(
            f for f in model.functions if f.domain == GRAPHS_DOMAIN and f.name == "predict_train"
        )
        assert [node.op_type for node in predict.node].count("gpt2_block") == n
    report = tracelog.check(gpt2_logs[4], "onnx")
    assert report.ok, report.table()


def test_flat_named_blocks_are_kind_functions() -> None:
    """A Keras-style model's blocks, which only its flat layer names show
    ("block_1_dense", "block_1_dense_relu", ...), are written once and called
    with their name as the prefix; the program gives the flat program's values."""
    pytest.importorskip("jax", reason="the JAX target needs jax installed")
    import numpy as np
    from test_module_structure import _flat

    graph = _flat(
        [
            (f"block_{k}_dense{s}", op)
            for k in (1, 2, 3)
            for s, op in (("", "Gemm"), ("_relu", "Relu"))
        ]
    )
    texts, shaped, flat = _jax_texts(graph)
    assert len(texts) == 1 and "params[prefix + '/kernel']" in texts[0]
    assert [line.strip() for line in shaped.splitlines() if "= dense(" in line] == [
        "block_1_dense_relu = dense(params, 'block_1_dense', x)",
        "block_2_dense_relu = dense(params, 'block_2_dense', block_1_dense_relu)",
        "block_3_dense_relu = dense(params, 'block_3_dense', block_2_dense_relu)",
    ]
    scope: dict[str, object] = {}
    exec("import jax.numpy as jnp\nimport jax\n" + "\n\n".join([*texts, shaped, flat]), scope)
    rng = np.random.default_rng(0)
    weights = [n for n, v in graph.values.items() if v.kind == "param"]
    params = {n: rng.standard_normal((4, 4)).astype("float32") for n in weights}
    x = rng.standard_normal((3, 4)).astype("float32")
    got = scope["f"](params, x)["prediction"]
    want = scope["g"](params, x)["prediction"]
    assert np.array_equal(np.asarray(got), np.asarray(want))


class _SharedLayer(torch.nn.Module):
    """ALBERT's shape: one block module called at every depth (its parameters
    shared), so every call of the kind has the same module path."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.Sequential(
            torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)
        )
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = x + self.block(x)
        return self.head(x)


def test_onnx_names_each_call_of_a_shared_module_once(tmp_path: Path) -> None:
    """onnxruntime refuses a model whose nodes share a name (the checker does
    not look): the later calls of a module called more than once are :2, :3."""
    pytest.importorskip("onnx", reason="the ONNX target needs onnx installed")
    ort = pytest.importorskip("onnxruntime", reason="the check runs on onnxruntime")
    from tracelog.emit.onnx_model import MODULES_DOMAIN, build_model

    torch.manual_seed(0)
    model = _SharedLayer()
    with tracelog.Listener(model, tmp_path) as listener, listener.batch():
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        torch.nn.functional.mse_loss(model(x), y).backward()
    onnx_model = build_model(TraceLog.load(tmp_path))
    names = [
        node.name
        for graph in (onnx_model.graph, *onnx_model.functions)
        for node in graph.node
        if node.domain == MODULES_DOMAIN
    ]
    assert len(set(names)) == len(names), names
    assert {"block.0/linear", "block.0/linear:2", "block.0/linear:3"} <= set(names), names
    ort.InferenceSession(onnx_model.SerializeToString())  # raised: two nodes with same name
    report = tracelog.check(tmp_path, "onnx")
    assert report.ok, report.table()
