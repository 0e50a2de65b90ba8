"""The sample module owns the sample's keys and file format: what a listener
builds reads back the same, and replays find their inputs under it."""

from __future__ import annotations

import numpy as np
import torch
from helpers import record
from zoo import CNNBnDrop

import tracelog
from tracelog.sample import (
    LOSS_KEY,
    build_sample,
    decode_sample,
    encode_sample,
    grad_key,
    input_key,
    mask_key,
    masks_as_rng,
    output_key,
    reference_key,
    rng_key,
    sample_feeds,
    target_key,
    update_key,
)


def _parts() -> dict:
    rng = np.random.default_rng(0)
    return {
        "inputs": {"x": rng.random((2, 3), dtype=np.float32)},
        "targets": {"target": np.array([1, 0]), "target_1": np.array([0.5, 2.0])},
        "masks": [np.array([[True, False, True]])],
        "outputs": {"prediction": rng.random((2, 4), dtype=np.float32)},
        "loss": np.array(0.25, dtype=np.float32),
        "grads": {"fc.weight": np.ones((4, 3), np.float32)},
        "params": {"fc.weight": np.zeros((4, 3), np.float32)},
        "buffers": {"bn.running_mean": np.zeros(4, np.float32)},
        "updates": {"bn.running_mean": np.full(4, 0.1, np.float32)},
    }


def test_build_encode_decode_round_trip() -> None:
    parts = _parts()
    sample = build_sample(**parts)
    assert sorted(sample) == sorted(
        [
            "input/x",
            "target/target",
            "target/target_1",
            "mask/0",
            "output/prediction",
            "loss",
            "grad/fc.weight",
            "param/fc.weight",
            "buffer/bn.running_mean",
            "update/bn.running_mean",
        ]
    )
    back = decode_sample(encode_sample(sample, {"note": "x"}))
    assert sorted(back) == sorted(sample)
    for k, a in sample.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape, k
        np.testing.assert_array_equal(back[k], a)
    assert back[LOSS_KEY].shape == ()  # a 0-d loss stays 0-d


def test_feeds_and_rng_name_graph_inputs() -> None:
    sample = build_sample(**_parts())
    feeds = sample_feeds(sample)
    assert sorted(feeds) == sorted(
        ["x", "target", "target_1", "fc.weight", "bn.running_mean", rng_key(0)]
    )
    assert feeds["fc.weight"] is sample["param/fc.weight"]
    assert list(masks_as_rng(sample)) == [rng_key(0)]


def test_a_recorded_run_writes_the_sample_through_the_module(tmp_path) -> None:
    torch.manual_seed(0)
    model = CNNBnDrop()
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))]
    record(model, tmp_path, batches, torch.nn.functional.cross_entropy, eval_batches=0)
    log = tracelog.load(tmp_path)
    sample = log.sample()
    info = log.sample_info
    assert info is not None
    assert set(info) == {
        "epoch",
        "batch",
        "phase",
        "prediction",
        "loss",
        "masks",
        "grads_from",
        "reference",
    }
    assert info["grads_from"] == "backward" and info["masks"] >= 1
    assert log.sample_keys() == set(sample)  # from the header alone (emit reads no arrays)
    # the float64 replay of the same batch (the same dropout masks): every
    # output, the loss and each gradient, within float32 rounding of the run
    assert info["reference"] == "float64"
    for key in [LOSS_KEY, output_key("prediction")] + [
        grad_key(n) for n, _ in model.named_parameters()
    ]:
        ref = sample[reference_key(key)]
        assert ref.dtype == np.float64
        np.testing.assert_allclose(sample[key], ref, rtol=1e-5, atol=1e-6)
    assert mask_key(info["masks"] - 1) in sample
    assert input_key("x") in sample and target_key("target") in sample
    for name, _p in model.named_parameters():
        assert grad_key(name) in sample, name
    assert any(k.startswith(update_key("")) for k in sample)  # batch-norm statistics
    np.testing.assert_array_equal(
        sample[input_key("x")], batches[0][0].numpy()
    )  # the batch as it ran


def _sample_bytes(tmp_path, name: str) -> bytes:
    torch.manual_seed(0)
    model = CNNBnDrop()
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(2)]
    record(model, tmp_path / name, batches, torch.nn.functional.cross_entropy, eval_batches=0)
    return (tmp_path / name / "sample.safetensors").read_bytes()


def test_the_reference_backward_on_a_helper_thread_gives_the_same_sample(
    tmp_path, monkeypatch
) -> None:
    """The float64 reference's backward runs beside the graphs' building (issue
    18); the sample it gives is byte for byte the one computed in line."""
    import threading

    from tracelog.adapters.torch import listener as torch_listener

    ran_on: list[str] = []
    forward64 = torch_listener.forward64

    def watched(*args, **kwargs):
        rest = forward64(*args, **kwargs)

        def backward():
            ran_on.append(threading.current_thread().name)
            return rest()

        return backward

    monkeypatch.setattr(torch_listener, "forward64", watched)
    in_background = _sample_bytes(tmp_path, "background")
    assert ran_on == ["tracelog-reference64"]
    monkeypatch.setattr(torch_listener.TorchListener, "reference_in_background", False)
    in_line = _sample_bytes(tmp_path, "in_line")
    assert ran_on == ["tracelog-reference64", threading.current_thread().name]
    assert in_background == in_line


def test_a_reference_backward_that_fails_on_its_thread_leaves_the_sample(
    tmp_path, monkeypatch
) -> None:
    from tracelog.adapters.torch import listener as torch_listener

    def failing(*args, **kwargs):
        def backward():
            raise RuntimeError("no float64 kernel for this op")

        return backward

    monkeypatch.setattr(torch_listener, "forward64", failing)
    torch.manual_seed(0)
    model = CNNBnDrop()
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))]
    record(model, tmp_path, batches, torch.nn.functional.cross_entropy, eval_batches=0)
    log = tracelog.load(tmp_path)
    info = log.sample_info
    assert info is not None
    assert info["reference"] == "none: RuntimeError: no float64 kernel for this op"
    sample = log.sample()
    assert LOSS_KEY in sample and reference_key(LOSS_KEY) not in sample


def test_a_reference_off_the_batch_s_own_loss_by_more_than_rounding_is_named() -> None:
    """_reference_off judges the source's loss against the reference's at the
    loss's scale (its value, or its sensitivity to the predictions' rounding
    where larger) in ulps of the batch's narrowest float dtype."""
    from tracelog.adapters.base import _reference_off
    from tracelog.sample import scale_key, without_reference

    f32, bf16 = 2.0**-23, 2.0**-7

    def sample(own: float, ref: float, scale: float | None = None) -> dict:
        s = {LOSS_KEY: np.float32(own), reference_key(LOSS_KEY): np.float64(ref)}
        if scale is not None:
            s[scale_key(LOSS_KEY)] = np.float64(scale)
        return s

    assert _reference_off(sample(0.5163, 0.5163 + 1e-6), f32) is None  # rounding
    off = _reference_off(sample(0.5163, 0.5946), f32)  # another draw replayed: 0.13
    assert off is not None and off.startswith("its loss 0.5946 is 0.0783 from")
    # a small difference of larger terms: judged at how far rounding moves it
    assert _reference_off(sample(1e-4, 1.2e-4), f32) is not None
    assert _reference_off(sample(1e-4, 1.2e-4, scale=10.0), f32) is None
    # an autocast run rounds by bfloat16's epsilon: a float32 bound would misjudge it
    assert _reference_off(sample(2.0, 2.03), bf16) is None
    assert _reference_off(sample(float("nan"), 2.0), f32) is None  # judged elsewhere
    assert _reference_off({LOSS_KEY: np.float32(1.0)}, f32) is None  # no reference
    dropped = without_reference(sample(1.0, 1.0, scale=2.0) | {grad_key("w"): np.ones(2)})
    assert sorted(dropped) == [grad_key("w"), LOSS_KEY]
