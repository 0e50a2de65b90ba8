"""The code every emitted program carries (tracelog.emit.runtime, the sample's
keys), tested as the modules it is written as, and the inliner that copies it
into programs."""

from __future__ import annotations

import ast
import contextlib
import types

import numpy as np
import pytest

from tracelog import sample as sample_format
from tracelog.emit import PROGRAM_TARGETS, get_target
from tracelog.emit.inline import import_block, inlinable, used_names
from tracelog.emit.runtime import parity, weights


def _parity_with(params: dict[str, bool], runs: object) -> types.SimpleNamespace:
    """parity's functions bound to a NumPy 'target', as a program binds them."""
    names = dict(vars(parity)) | {name: getattr(weights, name) for name in weights.INLINED}
    names.update(
        PARAMETERS=list(params.items()),
        _as_param=lambda a, trainable: np.array(a),
        _as_const=np.asarray,
        _numpy=np.asarray,
        _runs=runs,
        FLOAT_MODULES=(),
        # the NumPy target's gates, reached through `xp` (parity's own code uses np)
        xp=np,
        _gate_table=lambda: {"xp": {"maximum": "max", "minimum": "min", "clip": "clip"}},
        _gate_sign=lambda v, k: np.asarray(v > k, np.int8) - np.asarray(v < k, np.int8),
        _gate_where=lambda mask, x, y: np.where(mask, x, y),
        **{f.__name__: f for f in sample_format.INLINED},
    )
    for statement in inlinable(parity.__name__).statements:  # its classes, bound here
        exec(statement, names)
    ns = types.SimpleNamespace()
    for name in parity.INLINED:
        if name == "_runs":  # the "target" replaces parity's default, as JAX's does
            continue
        fn = getattr(parity, name)
        inner = getattr(fn, "__wrapped__", fn)  # a context manager: rebind its generator
        bound = types.FunctionType(inner.__code__, names, name, inner.__defaults__)
        setattr(ns, name, contextlib.contextmanager(bound) if inner is not fn else bound)
    names.update(vars(ns))
    return ns


def test_compare_flags_shape_and_tolerance() -> None:
    ns = _parity_with({}, None)
    assert ns._compare("a", np.ones(3), np.ones(3), 1e-5, 1e-4)[3]
    assert not ns._compare("a", np.ones(3) + 1e-3, np.ones(3), 1e-5, 1e-4)[3]
    name, err, rel, ok, own, ratio = ns._compare("a", np.ones(2), np.ones(3), 1e-5, 1e-4)
    assert (err, rel, ok, own, ratio) == (float("inf"), float("inf"), False, None, None)


def test_calibrated_judges_float32_by_the_sources_own_error() -> None:
    """Against the float64 reference, the unit of error is the source's own
    float32 error on the output, at least 4 float32 ulps of its largest value
    and the source's typical relative error times that value; the accuracy
    ratio is the program's error over that unit, within 4 passes."""
    ns = _parity_with({}, None)
    ref = np.array([1.0, -2.0, 4.0])
    source = ref + np.array([1e-5, 0.0, 0.0])  # the source's own error: 1e-5
    assert ns._calibrated("a", ref + 3.9e-5, source, ref, 0.0, 0.0)[3]
    name, err, _rel, ok, own, ratio = ns._calibrated("a", ref + 4.1e-5, source, ref, 0.0, 0.0)
    assert not ok and own == pytest.approx(1e-5) and ratio == pytest.approx(4.1)
    exact = ref.astype(np.float32)  # a float32 source that got it exactly
    floor = 4 * 2.0**-23 * 4.0  # 4 float32 ulps of max |ref| = 4
    assert ns._calibrated("a", ref + 3.9 * floor, exact, ref, 0.0, 0.0)[3]
    assert not ns._calibrated("a", ref + 4.1 * floor, exact, ref, 0.0, 0.0)[3]
    # a source that is typically off by 1e-5 relative: 4e-5 on this output is its unit
    found = ns._calibrated("a", ref + 1.5e-4, exact, ref, 1e-5, 0.0)
    assert found[5] == pytest.approx(1.5e-4 / 4e-5)
    # an output near zero is judged at the scale its kind gives (here 4)
    tiny = np.array([1e-20, 0.0])
    assert ns._calibrated("a", tiny + 1e-7, tiny.astype(np.float32), tiny, 0.0, 4.0)[3]
    assert not ns._calibrated("a", tiny + 1e-7, tiny.astype(np.float32), tiny, 0.0, 0.0)[3]
    assert not ns._calibrated("a", np.ones(2), exact, ref, 0.0, 0.0)[3]  # a shape mismatch
    # the same infinity agrees; NaN where the reference is finite does not
    inf = np.array([np.inf, 1.0])
    assert ns._calibrated("a", inf, inf.astype(np.float32), inf, 0.0, 0.0)[3]
    assert not ns._calibrated("a", np.array([np.nan, 1.0]), exact[:2], ref[:2], 0.0, 0.0)[3]


def test_the_loss_is_judged_by_the_forward_outputs_typical_error_not_the_running_stats() -> None:
    """The loss is a batch mean of per-row errors that may cancel (MobileNetV2
    at batch 4: the source's 6e-7 from rows off by 4e-4), and a Keras running
    statistic's error is its batch statistic's diluted 100x by the momentum: a
    program whose predictions, and so whose rows, are no noisier than the
    source's passes on the loss well within 2x, in the programs' runtime and
    in the ONNX target's judge alike."""
    from tracelog.verify import SampleJudge

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 10))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    t = np.array([8, 8, 9, 6])

    def loss(q: np.ndarray) -> float:
        return float(-np.mean(np.log(q[np.arange(4), t])))

    noise = rng.standard_normal((4, 10))
    source = p * (1 + 2e-4 * noise)
    source[np.arange(4), t] = p[np.arange(4), t] * (1 + 2e-4 * np.array([1, -1, 1, -1]))
    program = p * (1 + 1e-4 * rng.standard_normal((4, 10)))  # half the source's noise
    sample = {
        "output/prediction": source.astype(np.float32),
        "ref64/output/prediction": p,
        "loss": np.asarray(loss(source), np.float32),  # rows cancel: a lucky draw
        "ref64/loss": np.asarray(loss(p)),
    }
    for k in range(20):  # running variances: 0.99 * 1 + 0.01 * the batch's
        var = 0.99 + 0.01 * rng.random(8)
        sample[f"update/bn{k}/moving_variance"] = (var * (1 + 1e-5 * 0.01)).astype(np.float32)
        sample[f"ref64/update/bn{k}/moving_variance"] = var
    assert abs(sample["loss"] - sample["ref64/loss"]) < 1e-6 < abs(loss(program) - loss(p))
    judge = SampleJudge(sample)
    for key, got in (("loss", np.asarray(loss(program))), ("output/prediction", program)):
        assert judge.checked(key, got, key, 0.0, 0.0).ratio <= 2.0, key
    ns = _parity_with({}, None)
    medians = ns._typical_scales(sample)
    typical = ns._typical_error(sample, medians)
    assert typical["update"] < 1e-6 < typical["forward"]
    floor = ns._floor(sample, "loss", medians, False)
    row = ns._calibrated(
        "loss",
        loss(program),
        sample["loss"],
        sample["ref64/loss"],
        typical[ns._kind("loss")],
        floor,
    )
    assert row[3] and row[5] == pytest.approx(
        judge.checked("loss", loss(program), "loss", 0, 0).ratio
    )


def test_check_parity_runs_the_translation_check_where_the_sample_has_a_reference(
    tmp_path,
) -> None:
    """With ref64/ entries the program runs twice: in float64 against the
    reference (the translation: rows "[float64]", within 1e-9 of the output's
    largest value) and in float32 against the recording (atol/rtol) with the
    accuracy ratio beside it."""
    from safetensors.numpy import save_file

    w = np.full((2,), 3.0, np.float32)
    x = np.ones(2, np.float32)
    sample = {
        sample_format.input_key("x"): x,
        sample_format.output_key("prediction"): np.full(2, 3.0, np.float32),
        sample_format.reference_key(sample_format.output_key("prediction")): np.full(2, 3.0),
        sample_format.LOSS_KEY: np.asarray(6.0000005, np.float32),  # the source's rounding
        sample_format.reference_key(sample_format.LOSS_KEY): np.asarray(6.0),
        sample_format.param_key("w"): w,
    }
    save_file(sample, str(tmp_path / "sample.safetensors"))
    save_file({"w": w}, str(tmp_path / "weights.safetensors"))
    off = {"by": 0.0}
    dtypes = []

    def runs(step, params, trainable):
        dtypes.append(params["w"].dtype)
        pred = params["w"] * x + off["by"]
        return [("", ({"prediction": pred}, pred.sum(), [x]))]

    ns = _parity_with({"w": True}, runs)
    rows = ns.check_parity(str(tmp_path))
    assert dtypes == [np.float64, np.float32]  # the translation run, then float32
    assert [(r[0], r[3]) for r in rows] == [
        ("prediction [float64]", True),
        ("loss [float64]", True),
        ("prediction", True),
        ("loss", True),
    ]
    assert rows[3][4] == pytest.approx(4.77e-7, rel=0.01)  # the source's own float32 error
    off["by"] = 1e-6  # within atol/rtol, far beyond float64 rounding: a wrong translation
    rows = ns.check_parity(str(tmp_path))
    assert [r[3] for r in rows] == [False, False, True, True]


def test_check_parity_compares_every_recorded_role(tmp_path) -> None:
    from safetensors.numpy import save_file

    w, b = np.full((2,), 3.0, np.float32), np.zeros(2, np.float32)
    sample = {
        sample_format.input_key("x"): np.ones(2, np.float32),
        sample_format.output_key("prediction"): np.full(2, 3.0, np.float32),
        sample_format.update_key("running"): np.ones(2, np.float32),
        sample_format.LOSS_KEY: np.asarray(6.0, np.float32),
        sample_format.grad_key("w"): np.ones(2, np.float32),
        sample_format.param_key("w"): w,
        sample_format.buffer_key("running"): b,
    }
    save_file(sample, str(tmp_path / "sample.safetensors"))
    save_file({"w": w, "running": b}, str(tmp_path / "weights.safetensors"))

    def runs(step, params, trainable):  # a NumPy "autodiff"
        x = sample[sample_format.input_key("x")]
        pred = params["w"] * x
        outputs = {"prediction": pred, "update:running": np.ones(2) * 1.0}
        return [("", (outputs, pred.sum(), [x]))]

    ns = _parity_with({"w": True, "running": False}, runs)
    rows = ns.check_parity(str(tmp_path))
    assert [r[0] for r in rows] == ["prediction", "update:running", "loss", "grad w"]
    assert all(r[3] for r in rows)
    assert set(ns.sample_params(str(tmp_path))) == {"w", "running"}


def _one_param_log(tmp_path, w: np.ndarray, pred64: np.ndarray, pred32: np.ndarray) -> None:
    """A sample of one parameter `w` and one prediction: the reference, and the
    source's own float32 value of it."""
    from safetensors.numpy import save_file

    sample = {
        sample_format.output_key("prediction"): pred32.astype(np.float32),
        sample_format.reference_key(sample_format.output_key("prediction")): pred64,
        sample_format.LOSS_KEY: np.asarray(pred32.sum(), np.float32),
        sample_format.reference_key(sample_format.LOSS_KEY): np.asarray(pred64.sum()),
        sample_format.param_key("w"): w,
    }
    save_file(sample, str(tmp_path / "sample.safetensors"))
    save_file({"w": w}, str(tmp_path / "weights.safetensors"))


def test_a_branch_decided_by_rounding_passes_on_values_nudged_by_an_ulp(tmp_path) -> None:
    """relu(3w - 1) with w the float32 nearest 1/3: 2.98e-8 in float64, 0 in
    float32 (3w rounds to 1), so the float32 run's gate closes where the
    reference's is open, and the source, whose own float32 run kept it open,
    makes the program's error look 1e6 times its own. On w nudged by one ulp
    either way both runs agree (3w is 1 + 2^-23 or 1 - 2^-24, exactly): the
    check passes and says why, with the nudged run's rows."""
    w = np.asarray([1 / 3], np.float32)
    h64 = 3 * w.astype(np.float64) - 1
    assert h64[0] > 0 and (3 * w - 1)[0] == 0
    _one_param_log(tmp_path, w, np.maximum(h64, 0) * 1e8, np.maximum(h64, 0) * 1e8)
    drawn = []

    def runs(step, params, trainable):
        drawn.append(params["w"].copy())
        pred = np.maximum(3 * params["w"] - 1, 0) * 1e8  # in w's dtype
        return [("", ({"prediction": pred}, pred.sum(), []))]

    rows = _parity_with({"w": False}, runs).check_parity(str(tmp_path))
    assert [(r[0], r[3]) for r in rows if not r[0].startswith("[")] == [
        ("prediction [float64]", True),
        ("loss [float64]", True),
        ("prediction", True),
        ("loss", True),
    ]
    note = [r for r in rows if r[0].startswith("[float32]")]
    assert len(note) == 1 and note[0][3] and "nudged by one ulp (draw 1" in note[0][0]
    # float64 translation, float32 recorded, then the draw's float32 and float64
    # (a float32 tie is the float64 run's own branch: no gate decision to take)
    assert [d.dtype for d in drawn] == [np.float64, np.float32, np.float32, np.float64]
    assert drawn[2][0] in (np.nextafter(w[0], np.float32(1)), np.nextafter(w[0], np.float32(0)))
    assert drawn[3][0] == np.float64(drawn[2][0])  # the same nudge, read in float64
    # a draw asked for: its float32 rows alone, the same nudge as the check's
    drawn.clear()
    again = _parity_with({"w": False}, runs).check_parity(str(tmp_path), draw=1)
    assert again == [r for r in rows if not r[0].startswith("[")][2:]
    assert [d.dtype for d in drawn] == [np.float32, np.float64]
    assert drawn[0][0] != w[0] and drawn[1][0] == np.float64(drawn[0][0])


def _gated_one_param(tmp_path, w: np.ndarray, pred64: np.ndarray, gate: str):
    """A NumPy program whose prediction is max(h, 0) * 1e9 for h = w0*w1 +
    w2*w3 - w4, its max reached through the namespace's `xp` (`gate`: a gate
    of the table, or "np": none), and the log whose reference is pred64."""
    _one_param_log(tmp_path, w, pred64, pred64)  # the source: the reference, rounded
    ns = _parity_with({"w": False}, lambda step, params, trainable: [("", (*step(params), []))])
    names = ns.check_parity.__globals__

    def sample_step(params, sample):
        q = params["w"]
        h = q[0:1] * q[1:2] + q[2:3] * q[3:4] - q[4:5]
        pred = (names["xp"] if gate == "xp" else np).maximum(h, 0.0) * 1e9
        return {"prediction": pred}, pred.sum()

    names["sample_step"] = sample_step
    return ns


def test_the_float32_run_is_judged_on_the_branches_it_took(tmp_path) -> None:
    """h = x*w + v*u - c with values (found by search) where float32 rounds h
    to -1.1e-8 and float64 gives +1.95e-10: the float32 run's max(h, 0)
    closes the gate the reference opens, and its error, 0.195, is 1e7 times
    the source's (which kept the gate open). Judged against this program in
    float64 taking the float32 run's decision there, the recorded values'
    rows pass with error 0, after a row saying one element flipped; with the
    gate out of the table the recorded values fail (and pass only nudged)."""
    w = np.asarray([-1.2776802, 0.6304115, 0.5811658, 1.2945588, -0.053111006], np.float32)
    h32 = w[0] * w[1] + w[2] * w[3] - w[4]
    w64 = w.astype(np.float64)
    h64 = w64[0] * w64[1] + w64[2] * w64[3] - w64[4]
    assert h32 < 0 < h64
    pred64 = np.asarray([h64 * 1e9])
    rows = _gated_one_param(tmp_path, w, pred64, "xp").check_parity(str(tmp_path))
    assert [(r[0], r[3]) for r in rows if not r[0].startswith("[")] == [
        ("prediction [float64]", True),
        ("loss [float64]", True),
        ("prediction", True),
        ("loss", True),
    ]
    note = [r[0] for r in rows if r[0].startswith("[float32]")]
    assert len(note) == 1 and "at its 1 gates" in note[0] and "1 elements" in note[0]
    assert next(r for r in rows if r[0] == "prediction")[1] == 0.0
    assert next(r for r in rows if r[0] == "prediction")[4] < 1e-7  # the source's own error
    # gates that cannot be recorded (a gate inside a transformation of the program's
    # own: JAX's lax.scan): the runs go on without them, as with no gates
    ns = _gated_one_param(tmp_path, w, pred64, "xp")

    def unrecordable(value, kink):
        raise RuntimeError("a tracer of an inner transformation")

    ns.check_parity.__globals__["_gate_sign"] = unrecordable
    rows = ns.check_parity(str(tmp_path))
    note = [r[0] for r in rows if r[0].startswith("[float32]")]
    assert len(note) == 1 and "outputs failed on the recorded values" in note[0]
    assert all(r[3] for r in rows if r[0].endswith("[float64]"))
    # the same program with its max ungated: the recorded values fail; a nudged draw passes
    rows = _gated_one_param(tmp_path, w, pred64, "np").check_parity(str(tmp_path))
    note = [r[0] for r in rows if r[0].startswith("[float32]")]
    assert len(note) == 1 and "outputs failed on the recorded values" in note[0]


def test_a_gate_replays_each_side_with_its_gradient_and_ties_as_the_framework() -> None:
    """Each gate kind replayed from recorded signs: the side they say,
    whatever the values say; a recorded tie (0) keeps the framework's own."""
    ns = _parity_with({}, None)
    x, lo, hi = np.array([-1.0, 0.5, 2.0, 3.0]), 0.0, 2.5
    y = np.clip(x, lo, hi)
    opposite = [np.array([1, -1, 0, 1], np.int8), np.array([-1, -1, -1, 1], np.int8)]
    got = ns._replayed("clip", (x, lo, hi), {}, y, opposite)
    # below lo by the recording at 0.5; inside at -1.0 (x kept); at a tie, clip's own
    assert got.tolist() == [-1.0, 0.0, 2.0, 2.5]
    assert ns._replayed("relu", (x,), {}, np.maximum(x, 0), [np.array([1, -1, 0, 0])]).tolist() == [
        -1.0,
        0.0,
        2.0,
        3.0,
    ]
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 1.0, 3.0])
    signs = [np.array([1, -1, 0], np.int8)]  # the recording: a > b, a < b, a tie
    assert ns._replayed("max", (a, b), {}, np.maximum(a, b), signs).tolist() == [1.0, 1.0, 3.0]
    assert ns._replayed("min", (a, b), {}, np.minimum(a, b), signs).tolist() == [2.0, 2.0, 3.0]
    leaky = ns._replayed("leaky_relu", (x, 0.1), {}, x, [np.array([-1, 1, 1, 1], np.int8)])
    assert leaky.tolist() == [-0.1, 0.5, 2.0, 3.0]
    assert ns._kinks("leaky_relu", (x,), {"alpha": 0.2})[0][1] == 0.0
    assert ns._kinks("leaky_relu", (x,), {}) == []  # its slope unknown: left ungated


def test_a_less_accurate_formula_fails_on_every_nudged_draw(tmp_path) -> None:
    """A variance as the mean of squares minus the squared mean, in float32,
    of values near 1000: its error is the formula's, on every draw; the
    recorded run's rows stand, after a row saying no draw passed."""
    w = (1000 + np.random.default_rng(0).standard_normal(64)).astype(np.float32)
    var64 = np.asarray([w.astype(np.float64).var()])
    _one_param_log(tmp_path, w, var64, var64)  # the source: a two-pass variance

    def runs(step, params, trainable):
        v = params["w"]
        pred = np.asarray([np.mean(v * v) - np.mean(v) ** 2], v.dtype)
        return [("", ({"prediction": pred}, pred.sum(), []))]

    rows = _parity_with({"w": False}, runs).check_parity(str(tmp_path))
    translation = [r for r in rows if r[0].endswith("[float64]")]
    assert translation and all(r[3] for r in translation)
    note = [r for r in rows if r[0].startswith("[float32]")]
    assert len(note) == 1 and not note[0][3] and "in each of 3 draws" in note[0][0]
    prediction = next(r for r in rows if r[0] == "prediction")
    assert not prediction[3] and prediction[5] > 100


def test_masks_become_the_rng_dict_the_functions_take() -> None:
    masks = {sample_format.mask_key(k): np.ones(1, bool) for k in (0, 3)}
    assert sorted(sample_format.masks_as_rng({**masks, "loss": 0})) == ["mask.0", "mask.3"]
    assert sample_format.rng_key(3) == "mask.3"


def test_inliner_keeps_functions_as_written_and_drops_checker_only_code() -> None:
    piece = inlinable(parity.__name__)
    assert piece.inlined == parity.INLINED
    assert "check_parity" in piece.functions and "_as_param" not in piece.functions
    text = "\n".join(piece.statements)
    assert "TYPE_CHECKING" not in text and "INLINED" not in text
    for imp in piece.imports:
        assert "tracelog" not in ast.unparse(imp) and "TYPE_CHECKING" not in ast.unparse(imp)
    # comments inside functions survive; docstrings too
    assert (
        "# an embedding's gradient"
        in inlinable(get_target("tensorflow").runtime).functions["_value_and_grads"]
    )


def test_import_block_orders_as_isort() -> None:
    block = import_block(get_target("torch").pieces)
    assert block.split("\n\n")[0].splitlines()[:4] == [
        "import contextlib",
        "import os",
        "import re",
        "import sys",
    ]
    third = block.split("\n\n")[1].splitlines()
    assert third == [
        "import numpy as np",
        "import torch",
        "import torch.nn.functional as F",
        "from safetensors import deserialize",
    ]


def test_import_block_merges_modules_and_keeps_only_used_names() -> None:
    """One `from x import ...` per module (two runtimes both import Callable),
    and with `used`, only the imports that bind a name the program reads."""
    pieces = get_target("jax").pieces
    block = import_block(pieces)
    assert block.count("from collections.abc import") == 1
    assert "from collections.abc import Callable, Iterator" in block
    # a module looked up by name (FLOAT_MODULES) counts as used
    assert {"jnp", "np"} <= used_names('FLOAT_MODULES = ("jnp", "np")')
    assert import_block(pieces, {"jax", "np", "Iterator"}) == (
        "from collections.abc import Iterator\n\nimport jax\nimport numpy as np"
    )


@pytest.mark.parametrize("target", PROGRAM_TARGETS)
def test_helpers_are_inlined_only_when_called(target: str) -> None:
    runtime = get_target(target).helpers
    assert runtime.helpers_used("y = x + 1") == []
    # with the helpers it calls (JAX's dropout folds its node's number into the key)
    called = ["_node_key", "_dropout"] if target == "jax" else ["_dropout"]
    assert runtime.helpers_used("y, m = _dropout(x, r, rng, 'mask.0')") == called
    assert runtime.helpers_used("y = obj._dropout(x)") == []  # a method is not the helper


def test_torch_runtime_dropout_and_batch_norm() -> None:
    torch = pytest.importorskip("torch", reason="the torch runtime needs torch")
    from tracelog.emit.runtime import torch_program as rt

    x = torch.randn(4, 3, 5, 5)
    mask = np.random.default_rng(0).random((4, 3, 5, 5)) > 0.3
    y, m = rt._dropout(x, 0.3, {"mask.0": mask}, "mask.0")
    torch.testing.assert_close(y, x * torch.from_numpy(mask) / 0.7)
    assert torch.equal(m, torch.from_numpy(mask))
    scale, bias = torch.rand(3), torch.rand(3)
    mean, var = torch.zeros(3), torch.ones(3)
    want_mean, want_var = mean.clone(), var.clone()
    want = torch.nn.functional.batch_norm(x, want_mean, want_var, scale, bias, True, 0.1, 1e-5)
    got, new_mean, new_var = rt._batch_norm_train(x, scale, bias, mean, var, 1e-5, 0.1, [0, 2, 3])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(new_var, want_var)
    p = rt._as_param(np.ones(2, np.float32), True)
    assert isinstance(p, torch.nn.Parameter) and not isinstance(
        rt._as_param(np.ones(2, np.float32), False), torch.nn.Parameter
    )


def _keras_batch_norm_run(target: str, x, g, gamma, beta):
    """The target's helper for Keras' batch norm on NCHW `x`: (output, the
    input's gradient for the output gradient `g`, new running mean)."""
    args = (1e-3, 0.01, 0.99, False, [0, 2, 3])
    if target == "torch":
        import torch

        from tracelog.emit.runtime import torch_program as rt

        xs = torch.from_numpy(x).requires_grad_()
        stats = (torch.zeros(6), torch.ones(6))
        y, mean, _ = rt._batch_norm_train_weighted(
            xs, torch.from_numpy(gamma), torch.from_numpy(beta), *stats, *args
        )
        (dx,) = torch.autograd.grad(y, xs, torch.from_numpy(g))
        return y.detach().numpy(), dx.numpy(), mean.numpy()
    import jax
    import jax.numpy as jnp

    from tracelog.emit.runtime import jax_program as rt

    def run(a):
        stats = (jnp.zeros(6, jnp.float32), jnp.ones(6, jnp.float32))
        return rt._batch_norm_train_weighted(a, gamma, beta, *stats, *args)

    (y, mean, _), pullback = jax.vjp(run, jnp.asarray(x))
    (dx,) = pullback((jnp.asarray(g), jnp.zeros(6, jnp.float32), jnp.zeros(6, jnp.float32)))
    return np.asarray(y), np.asarray(dx), np.asarray(mean)


@pytest.mark.parametrize("target", ["torch", "jax"])
def test_keras_batch_norm_rounds_as_keras_does(target: str) -> None:
    """The helper for Keras' batch norm computes Keras' own formula in float32
    (tf.nn.moments, tf.nn.batch_normalization): on a batch of 4 whose channels
    sit far from zero, where that formula's rounding is large, its output and
    input gradient follow TensorFlow's float32 ones, not the exact values (a
    more accurate kernel's error was a different, larger draw at batch 4:
    ResNet50 3.3x TF's on PyTorch, EfficientNetB0 4.0x on JAX)."""
    pytest.importorskip(target, reason=f"the {target} runtime needs {target}")
    tf = pytest.importorskip("tensorflow", reason="TensorFlow computes the source's formula")
    rng = np.random.default_rng(0)
    x = (50.0 + 0.01 * rng.standard_normal((4, 6, 1, 1))).astype(np.float32)
    g = rng.standard_normal((4, 6, 1, 1)).astype(np.float32)
    gamma, beta = rng.random(6).astype(np.float32), rng.random(6).astype(np.float32)
    xt = tf.constant(x.transpose(0, 2, 3, 1))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        mean, var = tf.nn.moments(xt, [0, 1, 2])
        want = tf.nn.batch_normalization(xt, mean, var, beta, gamma, 1e-3)
    want_dx = tape.gradient(want, xt, tf.constant(g.transpose(0, 2, 3, 1)))
    want, want_dx = (np.transpose(t.numpy(), (0, 3, 1, 2)) for t in (want, want_dx))
    y, dx, new_mean = _keras_batch_norm_run(target, x, g, gamma, beta)
    x64 = x.astype(np.float64)
    mean64, var64 = x64.mean((0, 2, 3), keepdims=True), x64.var((0, 2, 3), keepdims=True)
    exact = (x64 - mean64) / np.sqrt(var64 + 1e-3) * gamma.reshape(1, -1, 1, 1)
    exact += beta.reshape(1, -1, 1, 1)
    # Keras' float32 rounding: the exact values rounded agree with it nowhere,
    # the helper (the same ops; JAX's rsqrt may differ by an ulp) almost everywhere
    assert np.mean(exact.astype(np.float32) == want) < 0.25
    assert np.mean(y == want) >= 0.75
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=np.abs(want_dx).max() / 100)
    np.testing.assert_allclose(new_mean, 0.01 * x64.mean((0, 2, 3)), rtol=1e-6)


@pytest.mark.parametrize("target", ["torch", "jax"])
def test_keras_batch_norm_running_statistics_are_rounded_once(target: str) -> None:
    """The running statistics' update (decay * running + momentum * batch
    statistic) runs in float64 and is rounded once to float32: the float32
    result is the exact update correctly rounded, as no float32 formula
    (TensorFlow's included) can do better."""
    pytest.importorskip(target, reason=f"the {target} runtime needs {target}")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    running = (rng.standard_normal(16).astype(np.float32), rng.random(16).astype(np.float32))
    gamma, beta = np.ones(16, np.float32), np.zeros(16, np.float32)
    momentum, decay = 0.009999999776482582, 0.9900000095367432  # Keras' 0.99, in float32
    args = (1e-3, momentum, decay, False, [0, 2, 3])
    if target == "torch":
        import torch

        from tracelog.emit.runtime import torch_program as rt

        stats = tuple(torch.from_numpy(r) for r in running)
        out = rt._batch_norm_train_weighted(
            torch.from_numpy(x), torch.from_numpy(gamma), torch.from_numpy(beta), *stats, *args
        )
    else:
        import jax.numpy as jnp

        from tracelog.emit.runtime import jax_program as rt

        stats = tuple(jnp.asarray(r) for r in running)
        out = rt._batch_norm_train_weighted(jnp.asarray(x), gamma, beta, *stats, *args)
    new_mean, new_var = (np.asarray(t) for t in out[1:])
    x64 = x.astype(np.float64)
    for got, old, batch in zip(
        (new_mean, new_var), running, (x64.mean((0, 2, 3)), x64.var((0, 2, 3))), strict=True
    ):
        exact = decay * old.astype(np.float64) + momentum * batch
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, exact.astype(np.float32))


@pytest.mark.parametrize(
    "axes, scales, mode",
    [
        ([1], [2.0], "nearest"),  # Keras' UpSampling1D: [N, T, C], T repeated
        ([1, 2], [2.0, 3.0], "nearest"),  # UpSampling2D on NHWC data
        ([1, 2], [2.0, 1.5], "linear"),
        ([0, 2], [3.0, 2.0], "nearest"),
    ],
)
def test_torch_runtime_resizes_any_axes_as_onnx_does(axes, scales, mode) -> None:
    torch = pytest.importorskip("torch", reason="the torch runtime needs torch")
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from tracelog.emit.runtime import torch_program as rt

    x = np.random.default_rng(0).standard_normal((2, 4, 5, 3))
    coord = "asymmetric" if mode == "nearest" else "half_pixel"
    node = helper.make_node(
        "Resize",
        ["x", "", "scales"],
        ["y"],
        axes=axes,
        mode=mode,
        coordinate_transformation_mode=coord,
        nearest_mode="floor",
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)],
        [helper.make_tensor("scales", onnx.TensorProto.FLOAT, [len(scales)], scales)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    how = {"mode": "nearest"} if mode == "nearest" else {"mode": "bilinear", "align_corners": False}
    got = rt._resize_axes(torch.from_numpy(x), axes, None, scales, **how)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_load_reads_every_stored_dtype_and_widens_bfloat16_exactly(tmp_path) -> None:
    import ml_dtypes

    arrays = {
        "f32": np.array([1.5, -2.25], np.float32),
        "f16": np.array([[0.1]], np.float16),
        "i64": np.arange(3, dtype=np.int64),
        "b": np.array([True, False]),
        "loss": np.array(0.25, np.float32),  # 0-d stays 0-d
        "bf16": np.array([[1.0, -3.140625], [1e-3, 65280.0]], ml_dtypes.bfloat16),
    }
    path = tmp_path / "t.safetensors"
    path.write_bytes(sample_format.encode_tensors(arrays))
    loaded = weights._load(str(path))
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        got = loaded[name]
        assert got.shape == array.shape, name
        if name == "bf16":
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, array.astype(np.float32))
        else:
            assert got.dtype == array.dtype and got.flags.writeable, name
            np.testing.assert_array_equal(got, array)


def test_solves_broadcast_batch_dims_as_torch_does() -> None:
    """TensorFlow's solve and JAX's triangular_solve take equal batch dims:
    the helpers broadcast them (a [n, n] B against a batch of A included,
    which jax.scipy.linalg.solve_triangular would read as vectors)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    pairs = [(a, rng.standard_normal((4, 4))), (a[0], rng.standard_normal((2, 3, 4, 2)))]

    def solved(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return np.linalg.solve(
            np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:]))
        )

    tf_program = pytest.importorskip(
        "tracelog.emit.runtime.tensorflow_program", reason="its runtime needs TensorFlow"
    )
    jax_program = pytest.importorskip("tracelog.emit.runtime.jax_program", reason="needs JAX")
    import jax

    jax.config.update("jax_enable_x64", True)  # as a JAX program sets it
    for a_, b in pairs:
        got = tf_program._solve_broadcast(a_, b).numpy()
        np.testing.assert_allclose(got, solved(a_, b), rtol=1e-12, atol=1e-12)
        got = np.asarray(jax_program._solve_triangular_broadcast(np.tril(a_), b, True))
        np.testing.assert_allclose(got, solved(np.tril(a_), b), rtol=1e-12, atol=1e-12)
