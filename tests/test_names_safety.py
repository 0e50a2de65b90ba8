"""User-derived text never reaches an emitted program raw.

Generated names (module paths, class names, parameter names; every line
terminator Python or a tool recognises, quotes, triple quotes, backslashes,
`#`, NUL, non-ASCII, and code that would create a sentinel file) go through
every writer of names, comments and literals, and through whole models:
recorded, emitted for every target, and run. Every program compiles, is
black-clean, runs with parity, and never creates the sentinel. A second
property makes every name collide with the names programs use inside."""

from __future__ import annotations

import ast
import itertools
import keyword
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelog.emit import PROGRAM_TARGETS, get_target
from tracelog.emit.common import Namespace, comment_text, format_source, literal, usage_comment
from tracelog.emit.program import module_comment
from tracelog.ir import Graph, Node, TensorType, Value
from tracelog.log import GraphEntry, Usage

LINE_ENDS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
TRICKY = [
    *LINE_ENDS,
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    "#",
    "\x00",
    "é",
    "λ",
    "𝔘",
    " ",
    "\t",
    "{",
    "}",
    "[[",
    "]]",
    "],",
]


def _payload(sentinel: str) -> st.SearchStrategy[str]:
    """Text that runs code if it reaches a program raw: after any line end,
    or after a closing quote of any kind."""
    code = f"__import__('pathlib').Path({sentinel!r}).touch()"
    breaks = st.sampled_from([*LINE_ENDS, "'''", '"""', "')", '")', "#"])
    return st.builds(lambda a, b, c: f"{a}{b}{code}{b}{c}", st.text(max_size=3), breaks, breaks)


def _names(sentinel: str = "/nonexistent/sentinel", surrogates: bool = True) -> st.SearchStrategy:
    chars = st.characters(exclude_categories=() if surrogates else ("Cs",))
    pieces = st.lists(st.one_of(st.sampled_from(TRICKY), chars), max_size=24)
    tricky = pieces.map("".join)
    return st.one_of(tricky, _payload(sentinel))


RESERVED = get_target("tensorflow").reserved + get_target("torch").reserved


# -- every writer of names, comments and literals: 4 x 2,500 generated names ------------------
@settings(max_examples=2500, deadline=None)
@given(_names(), st.sampled_from(RESERVED))
def test_sanitised_names_are_fresh_identifiers(name: str, reserved: str) -> None:
    ns = Namespace([reserved])
    got = ns.name(name)
    assert got.isidentifier() and got.isascii() and not keyword.iskeyword(got)
    assert got != reserved and ns.name(reserved) != reserved


@settings(max_examples=2500, deadline=None)
@given(_names())
def test_comments_cannot_end_their_line(name: str) -> None:
    line = "# " + comment_text(name)
    assert len(line.splitlines()) == 1 and line.isprintable()
    tree = ast.parse(line + "\nx = 1\n")
    assert [type(n) for n in tree.body] == [ast.Assign]


@settings(max_examples=2500, deadline=None)
@given(_names())
def test_literals_read_back_as_the_text(name: str) -> None:
    assert ast.literal_eval(literal(name)) == name
    assert len(ast.parse(f"y = {literal(name)}\n").body) == 1


@settings(max_examples=2500, deadline=None)
@given(_names(), _names(), _names())
def test_node_and_usage_comments_are_one_line(module: str, module_type: str, phase: str) -> None:
    values = {
        "x": Value("x", TensorType("float32", ("batch", 3)), "input"),
        "v0": Value("v0", TensorType("float32", ("batch", 3)), "node"),
    }
    node = Node("Relu", ["x"], ["v0"], {"note": module}, module=module, module_type=module_type)
    graph = Graph("prediction", values, [node], [])
    entry = GraphEntry("0" * 64, "prediction", phase, Usage(3, [0], (0, 0), (0, 2)))
    for line in (module_comment(graph, [node]), comment_text("# " + usage_comment([entry]))):
        assert len(line.splitlines()) == 1
        assert [type(n) for n in ast.parse(line + "\nx = 1\n").body] == [ast.Assign]


# -- whole models named by such names: recorded, emitted, run ---------------------------------
torch = pytest.importorskip("torch", reason="recording a model needs torch")


def _attr_name(name: str) -> bool:
    """Names torch takes for a submodule or parameter."""
    return bool(name) and "." not in name and not hasattr(torch.nn.Module(), name)


def _model(class_name: str, layer: str, scale: str, arg: str = "x") -> torch.nn.Module:
    namespace: dict[str, object] = {}
    exec(  # a forward whose data argument has the given name
        f"def forward(self, {arg}):\n"
        f"    return self.__dict__['_modules'][{layer!r}]({arg}) * self.__dict__['_parameters'][{scale!r}]\n",
        namespace,
    )
    cls = type(class_name, (torch.nn.Module,), {"forward": namespace["forward"]})
    model = cls()
    model.add_module(layer, torch.nn.Linear(3, 2))
    model.register_parameter(scale, torch.nn.Parameter(torch.tensor([1.5, -0.5])))
    return model


_RUNS = itertools.count()  # a fresh log directory per generated model


def _record(model: torch.nn.Module, log_dir: Path, penalised: str | None = None) -> None:
    """One training batch; with `penalised`, the loss also reads that
    parameter (so the loss graph holds a user name beside its own inputs)."""
    from tracelog.adapters.torch import TorchListener

    torch.manual_seed(0)
    listener = TorchListener(model, log_dir, strict=True)
    with listener.batch():
        loss = torch.nn.functional.mse_loss(model(torch.randn(4, 3)), torch.randn(4, 2))
        if penalised is not None:
            loss = loss + 0.1 * (model.__dict__["_parameters"][penalised] ** 2).sum()
        loss.backward()
    log = listener.close()
    assert log.recorded == 1 and log.unrecorded == 0, log.failures


def _emit_and_run_all(log_dir: Path, checked: int | None = None) -> None:
    """Every target: the program is written, compiles, is black-clean and is
    imported (its top-level code runs). Its parity check runs and passes for
    every target, or, with `checked`, for one: the property tests rotate the
    full check over the targets (ONNX included), one per generated model, so
    each target checks a quarter of them and the suite stays within its time."""
    import tracelog
    from tracelog.emit import targets
    from tracelog.emit.program import write_program
    from tracelog.parity import _import_path

    every = [*PROGRAM_TARGETS, "onnx"]
    for target in PROGRAM_TARGETS:
        path = write_program(log_dir, get_target(target))
        text = path.read_text(encoding="utf-8")
        compile(text, str(path), "exec")
        assert format_source(text) == text, f"{target}: not black-clean"
        _import_path(path)
    import onnx

    from tracelog.emit.onnx_model import write_model

    onnx.checker.check_model(str(write_model(log_dir)), full_check=True)
    for target in every if checked is None else [every[checked % len(every)]]:
        report = tracelog.check(log_dir, target)  # writes the program, runs its parity check
        assert report.ok, report.table()
        assert (log_dir / targets.file_name(target)).exists()


@settings(
    max_examples=int(os.environ.get("TRACELOG_NAME_MODELS", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_models_named_by_any_text_emit_safe_programs(tmp_path: Path, data: st.DataObject) -> None:
    sentinel = str(tmp_path / "SENTINEL")
    names = _names(sentinel, surrogates=False)
    class_name = data.draw(
        names.filter(lambda n: "\x00" not in n), "class name"
    )  # type() refuses NUL
    # torch refuses "." in these names: drawn without it, not filtered (filtering
    # most draws away fails hypothesis' health check)
    attr_names = names.map(lambda n: n.replace(".", "_")).filter(_attr_name)
    layer = data.draw(attr_names, "submodule name")
    scale = data.draw(attr_names.filter(lambda n: n != layer), "parameter name")
    run = next(_RUNS)
    log_dir = tmp_path / f"log{run}"
    _record(_model(class_name, layer, scale), log_dir, scale)
    _emit_and_run_all(log_dir, checked=run)
    assert not Path(sentinel).exists(), "text from a name ran as code"


# every name a program defines or uses inside its functions
INTERNAL = sorted(
    {n for n in RESERVED if n.isidentifier() and not keyword.iskeyword(n)}
    | {"x", "target", "v0", "v1", "c0", "h1", "k0", "predict_train", "loss_train", "rng"}
    | {"prediction", "loss", "target_1", "const0", "batch_size_float32_0"}
    # values named by role (tracelog.emit.names): root and loss ops of these models
    | {"mul", "mul_1", "sub", "pow", "add", "reduce_mean", "reduce_sum", "gemm", "gemm_0"}
    | set(get_target("jax").reserved)
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_names_equal_to_internal_names_keep_parity(tmp_path: Path, data: st.DataObject) -> None:
    internal = st.sampled_from(INTERNAL)
    layer = data.draw(internal.filter(_attr_name), "submodule name")
    scale = data.draw(internal.filter(_attr_name).filter(lambda n: n != layer), "parameter")
    arg = data.draw(
        internal.filter(lambda n: n not in (layer, scale, "self") and not n.startswith("__")),
        "data argument",
    )
    run = next(_RUNS)
    log_dir = tmp_path / f"log{run}"
    _record(_model(data.draw(internal, "class name"), layer, scale, arg), log_dir, scale)
    _emit_and_run_all(log_dir, checked=run)


def test_a_parameter_named_like_a_canonical_value_keeps_its_graph(tmp_path: Path) -> None:
    """A parameter called v0 (the canonical name of the first node value)
    used to be overwritten by that value in the stored graph."""
    import tracelog

    _record(_model("M", "c0", "v0"), tmp_path / "log")
    log = tracelog.load(tmp_path / "log")
    (graph,) = [log.graphs[e.hash] for e in log.entries_sorted() if e.kind == "prediction"]
    assert graph.values["v0"].kind == "param" and graph.values["c0.weight"].kind == "param"
    assert any(n.op == "Mul" and "v0" in n.inputs for n in graph.nodes)
    _emit_and_run_all(tmp_path / "log")


def test_brackets_in_a_name_stay_inside_its_literal(tmp_path: Path) -> None:
    """PARAMETERS was laid out by replacing "[[" and "]]" in its literal's
    text, which broke a name holding them out of its string."""
    _record(_model("M", "a[[b", "c]]d"), tmp_path / "log", "c]]d")
    _emit_and_run_all(tmp_path / "log")
