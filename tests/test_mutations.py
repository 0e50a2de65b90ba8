"""Mutation tests of the translation check (issue 14): a correct emitted
program of a conv net, a transformer layer and an LSTM, with one small wrong
edit at a time, must fail the translation rows (the program in float64
against the source's float64 reference), and the first divergent node,
searched in float64, must be the edited node's module. The unedited programs
pass. One edit is far below float32's resolution: an activation's input
scaled by 1 + 1e-6. The ONNX target takes the same edits in the graphs its
model is built from; its first divergence is found against the PyTorch
program's nodes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import edit_onnx_graphs, record

import tracelog
from tracelog.emit import PROGRAM_TARGETS, get_target
from tracelog.emit.program import build_program
from tracelog.ir import ConstData, Graph, Node, Value
from tracelog.log import TraceLog
from tracelog.parity import _module_from_text, first_divergence


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, 4)  # square: its transpose is a wrong weight of the same shape
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.gelu(self.conv2(x))
        x = torch.tanh(self.fc(self.pool(x).flatten(1)))
        return self.head(x)


class Transformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, activation="gelu", batch_first=True
        )
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x).mean(1))


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...], Callable]] = {
    "convnet": (ConvNet, (6, 3, 6, 6), torch.nn.CrossEntropyLoss(label_smoothing=0.1)),
    "transformer": (Transformer, (4, 5, 8), torch.nn.functional.cross_entropy),
    "lstm": (Recurrent, (4, 5, 4), torch.nn.functional.cross_entropy),
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    found = {}
    for name, (make, shape, loss) in MODELS.items():
        torch.manual_seed(0)
        batches = [(torch.randn(*shape), torch.randint(0, 3, (shape[0],))) for _ in range(2)]
        log_dir = tmp_path_factory.mktemp(name)
        log = record(make(), log_dir, batches, loss, eval_batches=0)
        assert log.sample_info and log.sample_info["reference"] == "float64"
        found[name] = log_dir
    return found


# per target: the text of a parameter transposed (the square fc weight)
_TRANSPOSED = {
    "torch": r"\1.t()",
    "tensorflow": r"tf.transpose(\1)",
    "jax": r"\1.T",
}
# per target: exact GELU (the source's) -> its tanh approximation
_GELU_TANH = {
    "torch": (r'approximate="none"', 'approximate="tanh"'),
    "tensorflow": (r"_gelu\((layer_linear1_reshape_1), False\)", r"_gelu(\1, True)"),
    "jax": (r"approximate=False", "approximate=True"),
}


# The same edits made to the graphs the ONNX target builds model.onnx from: each
# returns whether it changed the graph (tests.helpers.edit_onnx_graphs).
GraphEdit = Callable[[Graph], bool]


def _node(graph: Graph, op: str, module: str | None = None) -> Node | None:
    return next(
        (n for n in graph.nodes if n.op == op and (module is None or n.module == module)), None
    )


def _set_attr(op: str, attr: str, value: object, module: str | None = None) -> GraphEdit:
    def edit(graph: Graph) -> bool:
        node = _node(graph, op, module)
        if node is None:
            return False
        node.attrs[attr] = value
        return True

    return edit


def _drop_input(op: str, module: str, index: int) -> GraphEdit:
    def edit(graph: Graph) -> bool:
        node = _node(graph, op, module)
        if node is None:
            return False
        del node.inputs[index]
        return True

    return edit


def _set_const(op: str, module: str, old: float, new: float) -> GraphEdit:
    """The constant operand of `op` holding `old` (a scale, a smoothing factor) set to `new`."""

    def edit(graph: Graph) -> bool:
        for node in graph.nodes:
            if node.op != op or node.module != module:
                continue
            for name in node.inputs:
                const = graph.values[name].const
                if const is not None and const.data in (old, [old]):
                    graph.values[name].const = ConstData(new if const.data == old else [new])
                    return True
        return False

    return edit


def _scale_input(op: str) -> GraphEdit:
    """op(x) -> op(x * (1 + 1e-6)): a Mul inserted before the first `op`."""

    def edit(graph: Graph) -> bool:
        for k, node in enumerate(graph.nodes):
            if node.op == op:
                x = node.inputs[0]
                ty = graph.values[x].type
                factor, scaled = f"{x}.factor", f"{x}.scaled"
                graph.values[factor] = Value(
                    factor, type(ty)(ty.dtype, ()), "const", const=ConstData([1 + 1e-6])
                )
                graph.values[scaled] = Value(scaled, ty, "node")
                graph.nodes.insert(k, Node("Mul", [x, factor], [scaled]))
                node.inputs[0] = scaled
                return True
        return False

    return edit


def _swap_inputs(op: str, module: str, i: int, j: int) -> GraphEdit:
    def edit(graph: Graph) -> bool:
        node = _node(graph, op, module)
        if node is None:
            return False
        node.inputs[i], node.inputs[j] = node.inputs[j], node.inputs[i]
        return True

    return edit


@dataclass(frozen=True)
class Edit:
    name: str
    model: str
    module: str  # where the first divergent node must be: its module path, or <loss>
    pattern: Callable[[str], tuple[str, str]]  # target -> (regex, replacement)
    graph: GraphEdit  # the same edit in the graphs model.onnx is built from
    # where the module is a call of a kind function (module-shaped programs: fc
    # and head share `linear`), the same edit made at that call only
    call: Callable[[str], tuple[str, str]] | None = None

    def apply(self, target: str, text: str) -> str:
        """The edit made once, in the graph functions (after the inlined runtime)."""
        head, sep, body = text.partition("\ndef predict_train(")
        pattern, replacement = self.pattern(target)
        edited, n = re.subn(pattern, replacement, body, count=1)
        if n == 0 and self.call is not None:
            pattern, replacement = self.call(target)
            edited, n = re.subn(pattern, replacement, body, count=1)
        assert n == 1, f"{self.name}: {pattern!r} not found in the {target} program"
        return head + sep + edited


def _at_call(module: str, param: str, change: str) -> tuple[str, str]:
    """A kind function's call for `module` given params with `param` changed
    (`change`: a replacement template reading it as \\1)."""
    read = f'params["{module}.{param}"]'
    value = change.replace("\\1", read)
    return (
        rf'(\w+)\(\s*params,\s*"{re.escape(module)}\.",',
        rf'\1({{**params, "{module}.{param}": {value}}}, "{module}.",',
    )


EDITS = [
    Edit(
        "batch_norm_epsilon",
        "convnet",
        "bn1",
        lambda t: (r"1e-05,(\s+)0\.1,", r"1e-04,\g<1>0.1,"),
        _set_attr("BatchNormTraining", "epsilon", 1e-4),
    ),
    Edit(
        "weight_transposed",
        "convnet",
        "fc",
        lambda t: (r'(params\["fc\.weight"\])', _TRANSPOSED[t]),
        _set_attr("Gemm", "transB", 0, "fc"),
        lambda t: _at_call("fc", "weight", _TRANSPOSED[t]),
    ),
    Edit(
        "bias_dropped",
        "convnet",
        "conv2",
        lambda t: (r'(params\["conv2\.bias"\])', r"\1 * 0"),
        _drop_input("Conv", "conv2", 2),
        lambda t: _at_call("conv2", "bias", r"\1 * 0"),
    ),
    Edit(
        "label_smoothing_changed",
        "convnet",
        "<loss>",
        lambda t: (r"\(\s*0\.9,", "(0.95,"),
        _set_const("Mul", "", 0.9, 0.95),
    ),
    Edit(
        "activation_input_scaled_by_1e-6",
        "convnet",
        "<root>",
        lambda t: (r"tanh\((fc)\)", r"tanh(\1 * 1.000001)"),
        _scale_input("Tanh"),
    ),
    Edit(
        "attention_scale_changed",
        "transformer",
        "layer.self_attn",
        # the fused attention's scale (torch's scale=, the others' _attention argument)
        lambda t: (r"(None,\s+|scale=)0\.5\b", r"\g<1>0.51"),
        _set_attr("Attention", "scale", 0.51, "layer.self_attn"),
    ),
    Edit(
        "gelu_tanh_approximation",
        "transformer",
        "layer",
        lambda t: _GELU_TANH[t],
        _set_attr("Gelu", "approximate", "tanh"),
    ),
    Edit(
        "gelu_input_scaled_by_1e-6",
        "transformer",
        "layer",
        lambda t: (r"gelu\((layer_linear1_reshape_1), ", r"gelu(\1 * 1.000001, "),
        _scale_input("Gelu"),
    ),
    Edit(
        "lstm_gate_order_swapped",
        "lstm",
        "lstm",
        lambda t: (
            r"\[lstm_split, lstm_split_3, lstm_split_1, lstm_split_2\]",
            "[lstm_split, lstm_split_1, lstm_split_3, lstm_split_2]",
        ),
        _swap_inputs("Concat", "lstm", 1, 2),
    ),
]


def _rows(log_dir: Path, text: str, target: str) -> list[tuple]:
    module = _module_from_text(text, "tracelog_mutation", target)
    return module.check_parity(str(log_dir))


@pytest.mark.parametrize("target", PROGRAM_TARGETS)
@pytest.mark.parametrize("model", list(MODELS))
def test_unedited_programs_pass_both_checks(logs, model: str, target: str) -> None:
    rows = _rows(logs[model], build_program(TraceLog.load(logs[model]), get_target(target)), target)
    assert any(r[0].endswith("[float64]") for r in rows)
    assert all(r[3] for r in rows), [r for r in rows if not r[3]]


@pytest.mark.parametrize("target", PROGRAM_TARGETS)
@pytest.mark.parametrize("edit", EDITS, ids=[e.name for e in EDITS])
def test_each_wrong_edit_fails_the_translation_check_at_its_node(
    logs, edit: Edit, target: str
) -> None:
    log_dir = logs[edit.model]
    log, tgt = TraceLog.load(log_dir), get_target(target)
    rows = _rows(log_dir, edit.apply(target, build_program(log, tgt)), target)
    failed = [r[0] for r in rows if r[0].endswith("[float64]") and not r[3]]
    assert failed, f"{edit.name} passed the translation check on {target}"
    divergence = first_divergence(
        log, tgt, log_dir, 1e-5, 1e-4, edit=lambda text: edit.apply(target, text)
    )
    assert divergence.startswith("first divergent node in float64"), divergence
    assert f" at {edit.module} (" in divergence, divergence


def test_unedited_onnx_models_pass_both_checks(logs) -> None:
    for model, log_dir in logs.items():
        report = tracelog.check(log_dir, "onnx")
        assert any(c.name.endswith("[float64]") for c in report.comparisons), model
        assert report.ok, report.table()


@pytest.mark.parametrize("edit", EDITS, ids=[e.name for e in EDITS])
def test_each_wrong_edit_fails_the_onnx_translation_check_at_its_node(
    logs, edit: Edit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.onnx built from graphs with the edit: its float64 rows fail, and
    the first divergence (the model's nodes against the PyTorch program's, in
    float64) is the edited node's module."""
    edit_onnx_graphs(monkeypatch, edit.graph)
    report = tracelog.check(logs[edit.model], "onnx")
    failed = [c.name for c in report.comparisons if c.name.endswith("[float64]") and not c.ok]
    assert failed, f"{edit.name} passed the ONNX translation check"
    divergence = report.divergence or ""
    assert divergence.startswith("first divergent node in float64"), divergence
    assert f" at {edit.module} (" in divergence, divergence
