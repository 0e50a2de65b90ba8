"""Emitted TensorFlow programs as users meet them: the golden text, byte-for-
byte determinism, a stand-alone run, unsupported ops, and the two examples."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_lint_clean

import tracelog
from tracelog.cli import main as cli

pytest.importorskip("tensorflow", reason="the TensorFlow target needs tensorflow-cpu")

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden" / "digits_mlp_tensorflow.py"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mlp_log(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("digits_mlp")
    _example("digits_mlp_torch_to_tf").record(log_dir, epochs=1)
    return log_dir


def test_golden_program_text(mlp_log: Path) -> None:
    """A change to the emitted text shows up here as a readable diff. After a
    deliberate change: TRACELOG_UPDATE_GOLDEN=1 pytest tests/test_tensorflow_programs.py"""
    text = tracelog.emit(mlp_log, target="tensorflow").read_text()
    if os.environ.get("TRACELOG_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    want = GOLDEN.read_text()
    diff = "".join(
        difflib.unified_diff(want.splitlines(True), text.splitlines(True), "golden", "emitted")
    )
    assert text == want, diff
    assert_lint_clean(text, GOLDEN.name)  # black at 88, ruff F and I, no config


def test_emission_is_byte_identical_across_processes(mlp_log: Path, tmp_path: Path) -> None:
    outs = []
    for seed in ("0", "12345"):
        out = tmp_path / f"program_{seed}.py"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tracelog.cli",
                "emit",
                str(mlp_log),
                "--target",
                "tensorflow",
                "--out",
                str(out),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


# any attempt to import tracelog inside the program fails loudly
_NO_TRACELOG = (
    "import runpy, sys; sys.modules['tracelog'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_standalone_program_runs_alone_in_a_fresh_process(mlp_log: Path, tmp_path: Path) -> None:
    """--standalone: the program carries the parity check; it runs with no tracelog."""
    program = tracelog.emit(
        mlp_log, target="tensorflow", out=str(tmp_path / "alone.py"), standalone=True
    )
    text = program.read_text()
    assert "tracelog" not in "".join(line for line in text.splitlines() if "import" in line)
    r = subprocess.run(
        [sys.executable, "-c", _NO_TRACELOG, str(program), str(mlp_log)],
        capture_output=True,
        text=True,
        cwd=mlp_log,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity: ok" in r.stdout
    assert "grad fc1.weight" in r.stdout


@pytest.mark.parametrize("target", ["tensorflow", "torch"])
def test_program_model_needs_no_tracelog_and_its_check_is_tracelogs(
    mlp_log: Path, tmp_path: Path, target: str
) -> None:
    """A default program: its model, weights loader and graph functions import
    and run with no tracelog; as a script, it runs tracelog's parity check,
    and says in one line, exit 1, where tracelog is missing."""
    program = tracelog.emit(mlp_log, target=target, out=str(tmp_path / "p.py"))
    text = program.read_text()
    imports = [line for line in text.splitlines() if "import" in line and "tracelog" in line]
    assert imports == ["        from tracelog.emit.harness import main"]  # inside __main__ only
    assert "def check_parity" not in text and "def load_params" in text
    use = (
        "import sys; sys.modules['tracelog'] = None; import runpy; "
        f"m = runpy.run_path({str(program)!r}); "
        f"p = m['load_params']({str(mlp_log / 'weights.safetensors')!r}); "
        "print(sorted(m['PREDICT']), len(p) > 0)"
    )
    r = subprocess.run([sys.executable, "-c", use], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['eval', 'train'] True"
    r = subprocess.run([sys.executable, str(program), str(mlp_log)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity: ok" in r.stdout
    r = subprocess.run(
        [sys.executable, "-c", _NO_TRACELOG, str(program), str(mlp_log)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (  # after TensorFlow's own start-up lines
        "the parity check needs tracelog (pip install tracelog);"
        " emit with --standalone for a program that carries it"
    )


def test_emit_cli_standalone(mlp_log: Path, tmp_path: Path) -> None:
    """--standalone: the program carries the check (its __main__ calls its
    own main); without it, the check is tracelog's."""
    alone, default = tmp_path / "alone.py", tmp_path / "default.py"
    assert (
        cli(["emit", str(mlp_log), "--target", "torch", "--standalone", "--out", str(alone)]) == 0
    )
    assert cli(["emit", str(mlp_log), "--target", "torch", "--out", str(default)]) == 0
    assert "\ndef check_parity(" in alone.read_text()
    assert alone.read_text().endswith('if __name__ == "__main__":\n    sys.exit(main())\n')
    assert "\ndef check_parity(" not in default.read_text()
    # a model file carries no check: one line, exit 2
    assert cli(["emit", str(mlp_log), "--target", "onnx", "--standalone"]) == 2


def test_emit_cli_line_length(mlp_log: Path, tmp_path: Path) -> None:
    """--line-length: black at that length instead of its default (88)."""
    import black

    out = tmp_path / "wide.py"
    assert (
        cli(["emit", str(mlp_log), "--target", "torch", "--line-length", "120", "--out", str(out)])
        == 0
    )
    text = out.read_text()
    assert black.format_str(text, mode=black.Mode(line_length=120)) == text
    assert max(map(len, text.splitlines())) > 88  # not the default's layout
    with pytest.raises(SystemExit) as e:
        cli(["emit", str(mlp_log), "--line-length", "0"])
    assert e.value.code == 2


def test_check_cli_and_report(mlp_log: Path, capsys) -> None:
    assert cli(["check", str(mlp_log), "--target", "tensorflow"]) == 0
    assert "parity: ok" in capsys.readouterr().out
    report = tracelog.check(mlp_log, target="tensorflow")
    assert report.ok and report.divergence is None
    assert {c.name for c in report.comparisons} >= {"prediction", "loss", "grad out.bias"}


def test_mismatch_names_the_first_divergent_node(mlp_log: Path, monkeypatch) -> None:
    from tracelog.emit import tensorflow as tf_emitter

    gemm = tf_emitter.TF["Gemm"]
    calls = {"n": 0}

    def skewed_second_gemm(c):
        calls["n"] += 1
        expr = gemm(c)
        return f"({expr}) * 1.001" if c.node.module == "fc2" else expr

    monkeypatch.setitem(tf_emitter.TF._rules, "Gemm", skewed_second_gemm)
    report = tracelog.check(mlp_log, target="tensorflow")
    assert not report.ok
    assert report.divergence is not None
    assert "Gemm" in report.divergence and "at fc2 (Linear)" in report.divergence


def test_unsupported_op_exits_2_and_lists_it(tmp_path: Path, capsys) -> None:
    class Cumulative(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # erfcx (the scaled complementary error function): an aten op the table
            # does not translate
            return torch.special.erfcx(self.fc(x)) + torch.special.erfcx(x[:, :3])

    model = Cumulative()
    with tracelog.Listener(model, tmp_path / "log") as listener:
        for _ in range(2):
            with listener.batch():
                F.cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 3, (5,))).backward()
    assert tracelog.load(tmp_path / "log").recorded == 2  # the log is still whole
    assert cli(["emit", str(tmp_path / "log"), "--target", "tensorflow"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "aten.special_erfcx.default x2 in <root>" in err
    assert not (tmp_path / "log" / "program_tensorflow.py").exists()
    with pytest.raises(tracelog.UnsupportedOpError) as info:
        tracelog.emit(tmp_path / "log", target="tensorflow")
    assert info.value.ops == [("aten.special_erfcx.default", 2, [""])]


def test_an_op_form_a_target_cannot_write_exits_2_and_names_it(tmp_path: Path, capsys) -> None:
    # JAX has a rule for MaxPool, but not for a dilated one
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.MaxPool2d(2, dilation=2), nn.Flatten(), nn.Linear(8, 3)
    )
    with tracelog.Listener(model, tmp_path / "log") as listener:
        with listener.batch():
            F.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.randint(0, 3, (4,))).backward()
    assert cli(["emit", str(tmp_path / "log"), "--target", "jax"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unsupported by target jax: MaxPool (dilated MaxPool) x1 in 1" in err
    assert not (tmp_path / "log" / "program_jax.py").exists()


@pytest.mark.parametrize("target", ["torch", "jax", "onnx"])
def test_digits_mlp_round_trips_to_the_other_targets(mlp_log: Path, target: str) -> None:
    module = {"torch": "torch", "jax": "jax", "onnx": "onnxruntime"}[target]
    pytest.importorskip(module, reason=f"the {target} target needs {module} installed")
    report = tracelog.check(mlp_log, target=target)
    assert report.ok, report.table()


def test_resnet18_example_parity_and_layout(tmp_path: Path, capsys) -> None:
    module = _example("resnet18_torch_to_tf")
    out = tmp_path / "resnet18"
    assert module.main(["--out", str(out), "--limit", "200", "--batch-size", "40"]) == 0
    printed = capsys.readouterr().out
    assert "parity: ok" in printed
    text = (out / "program_tensorflow.py").read_text()
    assert (
        "predict_train: 2 transposes kept: data input x enters NCHW; back to NCHW for Reshape"
        in text
    )
    # the model's part: module kinds' functions (shared by the train and eval
    # graphs) and the graph functions, before the sample keys; not the runtime's
    # inlined helpers (_rows moves summed axes last)
    body = text.split("\ndef input_key", 1)[0]
    generated = [
        ast.get_source_segment(body, f)
        for f in ast.parse(body).body
        if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
    ]
    lines = [line.strip() for f in generated for line in (f or "").splitlines()]
    transposes = [line for line in lines if "= tf.transpose(" in line]
    assert len(transposes) == 2  # the input, and the exit to flatten: none inside the body
    log = tracelog.load(out)
    (train,) = [e for e in log.entries_sorted() if e.kind == "prediction" and e.phase == "train"]
    assert train.usage.batches == 4
    # the same log to JAX (gradients under jax.jit) and to ONNX, judged as the example is
    pytest.importorskip("jax", reason="the JAX target needs jax installed")
    for target in ("jax", "onnx"):
        report = tracelog.check(out, target=target)
        assert report.ok, report.table()
        assert any(c.name.endswith("[float64]") for c in report.comparisons)
