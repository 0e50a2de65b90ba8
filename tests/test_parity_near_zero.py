"""The parity check on an output that cancels to near zero (a conv bias before a
training batch norm: its gradient is zero in exact arithmetic), in a model
whose other gradients are far smaller than the terms that bias sums (SwiftFormer:
1e-5 layer scales; HF EfficientNet: activations of 1e-16). The scale of such an
output is the size of its terms, as the source's own rounding shows it, capped
at the largest output of its kind (parity._terms), not at the median one."""

from __future__ import annotations

import numpy as np

from tracelog.verify import SampleJudge

KEY = "grad/stem.conv.bias"


def _bias_grad(dtype: type, reverse: bool = False) -> np.ndarray:
    """The gradient of a conv bias feeding a training batch norm: the sum over
    batch and space of batch norm's input gradient, a * (dy - mean(dy) - xhat *
    mean(dy * xhat)), zero in exact arithmetic; its terms are of size 1.
    Summed one term after another, as a kernel's loop accumulates; `reverse`:
    in the other order (another program's rounding)."""
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((2, 256)).astype(dtype) for _ in range(2))
    xhat = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    dx = 1.3 * (dy - dy.mean(1, keepdims=True) - xhat * (dy * xhat).mean(1, keepdims=True))
    return np.cumsum(dx[:, ::-1] if reverse else dx, 1, dtype=dtype)[:, -1]


def _put(sample: dict[str, np.ndarray], key: str, ref: np.ndarray) -> None:
    """An output the source computed in float32 (its float64 value rounded
    once) beside its float64 reference."""
    sample[key] = ref.astype(np.float32)
    sample["ref64/" + key] = ref


def _sample() -> dict[str, np.ndarray]:
    """Forty gradients of 1e-7 (behind a 1e-5 layer scale), the stem's conv
    weight gradient of 0.9, and the stem's conv bias gradient, zero in exact
    arithmetic: the median gradient scale is 1e-7, the bias sums terms of 1."""
    rng = np.random.default_rng(1)
    sample: dict[str, np.ndarray] = {}
    for k in range(40):
        _put(sample, f"grad/block{k}.weight", 1e-7 * rng.standard_normal(16))
    _put(sample, "grad/stem.conv.weight", 0.9 * np.tanh(rng.standard_normal(16)))
    sample[KEY] = _bias_grad(np.float32)
    sample["ref64/" + KEY] = _bias_grad(np.float64)
    return sample


def test_a_cancelling_gradient_is_judged_at_the_size_of_its_terms() -> None:
    sample = _sample()
    ref, source = sample["ref64/" + KEY], sample[KEY].astype(np.float64)
    assert np.abs(ref).max() < 1e-14 and 1e-8 < np.abs(source - ref).max() < 1e-5
    judge = SampleJudge(sample)
    # float64 summed in another order: rounding of terms of 1, far above the
    # median gradient scale's 1e-9 x 1e-7; the median cap failed this row
    other = _bias_grad(np.float64, reverse=True)
    assert np.abs(other - ref).max() > 1e-9 * judge.medians[True]
    assert judge.translated("bias [float64]", other, KEY).ok
    # a program in float32 that rounds as the source does, in another order
    assert judge.checked("bias", _bias_grad(np.float32, reverse=True), KEY, 0, 0).ok


def test_a_wrong_cancelling_gradient_still_fails() -> None:
    sample = _sample()
    ref = sample["ref64/" + KEY]
    judge = SampleJudge(sample)
    # off by 1e-6 of its terms: no float64 rounding; a wrong formula is off by ~1
    assert not judge.translated("bias [float64]", ref + 1e-6, KEY).ok
    assert not judge.translated("bias [float64]", ref + 1.0, KEY).ok
    # in float32, off by 1e-3 of its terms, 1e4 float32 ulps
    assert not judge.checked("bias", (ref + 1e-3).astype(np.float32), KEY, 0, 0).ok


def test_the_cap_still_bounds_an_inflated_estimate() -> None:
    """A source whose float32 error on the output is 1e3 (its upstream
    ill-conditioned, not its terms 1e10): the terms are taken at most as the
    largest gradient (0.9), so a float64 error of 1e-6 still fails."""
    sample = _sample()
    ref = sample["ref64/" + KEY]
    sample[KEY] = (ref + 1e3).astype(np.float32)
    judge = SampleJudge(sample)
    assert judge.translated("bias [float64]", ref + 1e-10, KEY).ok
    assert not judge.translated("bias [float64]", ref + 1e-6, KEY).ok


def test_cancelling_outputs_are_not_the_typical_error_of_their_kind() -> None:
    """HF EfficientNet's shape: weight gradients of 1e-17 (its activations are
    1e-16), a classifier bias gradient of 0.3, and batch-norm bias gradients
    that cancel to 1e-18 from terms of 1e-2, above the near-zero floor (1e-5 of
    the median, 1e-22). Their float32 relative errors (1e8) are no measure of
    what float32 costs the others: counted in the 90th percentile, they let a
    weight gradient 10% off pass; left out, it fails, and the cancelling ones
    are judged at the size of their terms."""
    rng = np.random.default_rng(2)
    sample: dict[str, np.ndarray] = {}
    for k in range(12):
        ref = 1e-17 * rng.standard_normal(16)
        sample[f"grad/conv{k}.weight"] = (ref * (1 + 1e-7 * rng.standard_normal(16))).astype(
            np.float32
        )
        sample[f"ref64/grad/conv{k}.weight"] = ref
    for k in range(4):  # float32 noise of terms of 1e-2 around float64 noise of 1e-18
        ref = 1e-18 * rng.standard_normal(16)
        sample[f"grad/bn{k}.bias"] = (ref + 1e-9 * rng.standard_normal(16)).astype(np.float32)
        sample[f"ref64/grad/bn{k}.bias"] = ref
    bias = 0.3 * np.tanh(rng.standard_normal(5))
    sample["grad/classifier.bias"] = bias.astype(np.float32)
    sample["ref64/grad/classifier.bias"] = bias
    judge = SampleJudge(sample)
    assert judge.typical["grad"] < 1e-5
    ref = sample["ref64/grad/conv0.weight"]
    assert not judge.checked("w", ref * 1.1, "grad/conv0.weight", 0, 0).ok
    assert judge.checked("w", ref * (1 + 1e-7), "grad/conv0.weight", 0, 0).ok
    # a cancelling one: float32 noise of its terms passes, an error of its terms fails
    ref = sample["ref64/grad/bn0.bias"]
    assert judge.checked("b", ref + 2e-9, "grad/bn0.bias", 0, 0).ok
    assert not judge.checked("b", ref + 1e-3, "grad/bn0.bias", 0, 0).ok


def _small_sample() -> dict[str, np.ndarray]:
    """Forty forward outputs of about 1e-2 and logits of about 1e-17 (HF
    EfficientNet's small config: batch-norm weights of 0.02 over many
    layers), which do not cancel: the source's float32 error on them is a few
    ulps of their own size. The median forward scale puts the near-zero floor
    at 1e-7, ten orders above them."""
    rng = np.random.default_rng(2)
    sample: dict[str, np.ndarray] = {}
    for k in range(40):
        _put(sample, f"output/hidden{k}", 1e-2 * rng.standard_normal(16))
    _put(sample, "output/logits", 1e-17 * rng.standard_normal(10))
    return sample


def test_a_small_output_that_does_not_cancel_is_judged_at_its_own_size() -> None:
    sample = _small_sample()
    ref = sample["ref64/output/logits"]
    judge = SampleJudge(sample)
    assert np.abs(ref).max() < 1e-5 * judge.medians[False]  # below the floor
    # right: float64 rounding of its own size, and float32 rounding as the source's
    assert judge.translated("logits [float64]", ref * (1 + 1e-15), "output/logits").ok
    assert judge.checked("logits", ref.astype(np.float32), "output/logits", 0, 0).ok
    # wrong by a factor of 2, by a sign, or zero: at the floor (1e-7) all passed
    for wrong in (2 * ref, -ref, np.zeros_like(ref)):
        assert not judge.translated("logits [float64]", wrong, "output/logits").ok
    # the float32 check keeps the floor (parity._own_size): accuracy, not correctness
    assert judge.checked("logits", (2 * ref).astype(np.float32), "output/logits", 0, 0).ok


def test_a_small_output_the_source_computed_exactly_keeps_the_floor() -> None:
    """No rounding of the source to read (its float32 value is the float64
    one): whether the output cancels is unknown, and the floor stands."""
    sample = _small_sample()
    ref = sample["ref64/output/logits"].astype(np.float32).astype(np.float64)
    sample["ref64/output/logits"] = ref
    judge = SampleJudge(sample)
    assert judge.translated("logits [float64]", ref + 1e-20, "output/logits").ok


def test_an_output_near_float32_underflow_keeps_the_floor() -> None:
    """Values of 1e-35 (HF EfficientNet's squeeze-excite weight gradients):
    one ulp of them is within float32's subnormals, so the source's rounding
    of them is no reading of their terms: judged at the floor, as before."""
    sample = _small_sample()
    tiny = 1e-35 * np.random.default_rng(3).standard_normal(10)
    _put(sample, "output/logits", tiny)
    judge = SampleJudge(sample)
    assert judge.translated("logits [float64]", 2 * tiny, "output/logits").ok


def test_an_output_holding_a_mask_fill_is_judged_at_its_other_values() -> None:
    """Splinter's question answering logits hold torch.finfo(float32).min at
    masked positions: judged at that scale, a wrong logit passed both checks.
    The fills (both sides equal) are left out of the scale; a fill the program
    does not reproduce fails."""
    from tracelog.verify import _parity

    parity = _parity()  # the programs' runtime, bound as the ONNX target binds it
    fill = float(np.finfo(np.float32).min)
    ref = np.array([[fill, 0.5, 0.9], [0.2, fill, -0.4]])
    source = ref.astype(np.float32)
    assert parity._magnitude(ref) == 0.9
    assert parity._magnitude(np.array([fill, fill])) == -fill  # all fills: their size
    right, wrong = ref.copy(), ref.copy()
    wrong[0, 2] *= 1 + 1e-6  # far below float32's resolution of the fill's scale
    assert parity._translated("logits", right, ref, 0.0, source, 1.0)[3]
    assert not parity._translated("logits", wrong, ref, 0.0, source, 1.0)[3]
    unfilled = ref.copy()
    unfilled[0, 0] = -1e9  # the program masked with another value
    assert not parity._translated("logits", unfilled, ref, 0.0, source, 1.0)[3]
    # the float32 row: an error of 1e-3 on a logit of 0.9 is no float32 rounding
    off = ref.copy()
    off[1, 2] += 1e-3
    assert not parity._calibrated("logits", off, source, ref, 0.0, 0.0)[3]
