"""`tracelog compare`: a PyTorch model and a separately written Keras model
of the same architecture, weights copied across by hand (the dense kernel's
rows permuted for Keras' NHWC flatten), each trained for a batch on the same
data. The structures must agree and the numbers match in float64; a Keras
variant with one layer changed must read as that layer, in both models."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import record, validate_against_schema

import tracelog
from tracelog.cli import main as cli
from tracelog.compare import SCHEMA_FILE, Step, from_canonical, to_canonical

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytest.importorskip("tensorflow", reason="a Keras model is one side of the comparison")
keras = pytest.importorskip("keras", reason="a Keras model is one side of the comparison")
pytest.importorskip("jax", reason="parity runs each log's JAX program")

FORMATS = ("text", "markdown", "json")
N, CLASSES = 6, 3


class TorchCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(6 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu1(self.conv1(x)))
        return self.fc(torch.flatten(self.relu2(self.conv2(x)), 1))


def keras_cnn(activation: str = "relu", padding: str = "same") -> Any:
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(4, 3, padding="same", activation="relu", name="c1"),
            layers.MaxPooling2D(2, name="pool"),
            layers.Conv2D(6, 3, padding=padding, activation=activation, name="c2"),
            layers.Flatten(name="flat"),
            layers.Dense(CLASSES, name="fc"),
        ],
        name="cnn",
    )


class TorchMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc2(F.relu(self.fc1(x)))))


def keras_mlp() -> Any:
    d = keras.layers.Dense
    return keras.Sequential(
        [
            keras.Input((4,)),
            d(4, activation="relu", name="d1"),
            d(4, activation="gelu", name="d2"),  # written out by Keras: x * erf ...
            d(CLASSES, name="out"),
        ],
        name="mlp",
    )


class TorchGAP(nn.Module):
    """Conv -> [BatchNorm] -> ReLU -> global average pool -> Linear."""

    def __init__(self, bn: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4) if bn else nn.Identity()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.gap(F.relu(self.bn(self.conv(x)))), 1))


def keras_gap(bn: bool) -> Any:
    layers = keras.layers
    norm = [layers.BatchNormalization(epsilon=1e-5, momentum=0.9, name="bn")] if bn else []
    return keras.Sequential(
        [keras.Input((8, 8, 1)), layers.Conv2D(4, 3, padding="same", name="conv")]
        + norm
        + [layers.ReLU(), layers.GlobalAveragePooling2D(), layers.Dense(CLASSES, name="fc")],
        name="gap",
    )


class TorchDepthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(2, 4, 3, padding=1, groups=2)
        self.fc = nn.Linear(4 * 8 * 8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(torch.tanh(self.dw(x)), 1))


def keras_depthwise() -> Any:
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="tanh"),
            layers.Flatten(),
            layers.Dense(CLASSES, name="fc"),
        ],
        name="dw",
    )


def copy_depthwise(src: TorchDepthwise, dst: Any) -> None:
    """torch (in * mult, 1, kh, kw), channel c * mult + m -> Keras (kh, kw, in, mult)."""
    w = src.dw.weight.detach().numpy().reshape(2, 2, 3, 3).transpose(2, 3, 0, 1)
    dst.layers[0].set_weights([w, src.dw.bias.detach().numpy()])
    fc = src.fc.weight.detach().numpy()
    dst.get_layer("fc").set_weights(
        [
            fc.reshape(CLASSES, 4, 8, 8).transpose(2, 3, 1, 0).reshape(-1, CLASSES),
            src.fc.bias.detach().numpy(),
        ]
    )


def copy_cnn(src: TorchCNN, dst: Any) -> None:
    """What a user porting by hand writes: OIHW -> HWIO, and the dense kernel's
    rows from torch's (C, H, W) flatten order to Keras' (H, W, C)."""
    sd = {k: v.detach().numpy() for k, v in src.state_dict().items()}
    for t, k in (("conv1", "c1"), ("conv2", "c2")):
        dst.get_layer(k).set_weights([sd[f"{t}.weight"].transpose(2, 3, 1, 0), sd[f"{t}.bias"]])
    w = sd["fc.weight"].reshape(CLASSES, 6, 4, 4).transpose(2, 3, 1, 0).reshape(-1, CLASSES)
    dst.get_layer("fc").set_weights([w, sd["fc.bias"]])


def copy_mlp(src: TorchMLP, dst: Any) -> None:
    for t, k in (("fc1", "d1"), ("fc2", "d2"), ("out", "out")):
        layer = getattr(src, t)
        dst.get_layer(k).set_weights([layer.weight.detach().numpy().T, layer.bias.detach().numpy()])


def keras_record(model: Any, x: np.ndarray, y: np.ndarray, log_dir: Path, loss: Any = None) -> None:
    """One batch of fit (a traced step) with the tracelog callback."""
    from tracelog.keras import TracelogCallback

    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[TracelogCallback(log_dir)])


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 1, 8, 8)).astype(np.float32)
    xm = rng.standard_normal((N, 4)).astype(np.float32)
    y = rng.integers(0, CLASSES, N)
    out = {name: tmp_path_factory.mktemp(name) for name in ("torch", "torch_mlp")}
    torch.manual_seed(0)
    cnn, mlp = TorchCNN(), TorchMLP()
    keras.utils.set_random_seed(0)
    kcnn, kmlp = keras_cnn(), keras_mlp()
    copy_cnn(cnn, kcnn)
    copy_mlp(mlp, kmlp)
    batch = [(torch.from_numpy(x), torch.from_numpy(y))]
    record(cnn, out["torch"], batch, F.cross_entropy, eval_batches=0)
    record(mlp, out["torch_mlp"], [(torch.from_numpy(xm), batch[0][1])], F.cross_entropy)
    nhwc = x.transpose(0, 2, 3, 1)
    models = {
        "keras": kcnn,
        "keras_tanh": keras_cnn(activation="tanh"),
        "keras_valid": keras_cnn(padding="valid"),
    }
    for name, model in models.items():
        out[name] = tmp_path_factory.mktemp(name)
        keras_record(model, nhwc, y, out[name] / "log")
        out[name] = out[name] / "log"
    out["keras_mlp"] = tmp_path_factory.mktemp("keras_mlp") / "log"
    keras_record(kmlp, xm, y, out["keras_mlp"])
    torch.manual_seed(0)
    dw, kdw = TorchDepthwise(), keras_depthwise()
    copy_depthwise(dw, kdw)
    out["torch_dw"] = tmp_path_factory.mktemp("torch_dw")
    x2 = rng.standard_normal((N, 2, 8, 8)).astype(np.float32)
    record(dw, out["torch_dw"], [(torch.from_numpy(x2), batch[0][1])], F.cross_entropy)
    out["keras_dw"] = tmp_path_factory.mktemp("keras_dw") / "log"
    keras_record(kdw, x2.transpose(0, 2, 3, 1), y, out["keras_dw"])
    torch.manual_seed(0)
    drop = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(4 * 8 * 8, CLASSES),
    )
    kdrop = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
            keras.layers.Dropout(0.5),  # on NHWC data: its mask is NHWC
            keras.layers.Flatten(),
            keras.layers.Dropout(0.3),  # after the flatten: its mask in (H, W, C) order
            keras.layers.Dense(CLASSES, name="fc"),
        ],
        name="drop",
    )
    sd = {k: v.detach().numpy() for k, v in drop.state_dict().items()}
    kdrop.get_layer("conv").set_weights([sd["0.weight"].transpose(2, 3, 1, 0), sd["0.bias"]])
    w = sd["5.weight"].reshape(CLASSES, 4, 8, 8).transpose(2, 3, 1, 0).reshape(-1, CLASSES)
    kdrop.get_layer("fc").set_weights([w, sd["5.bias"]])
    out["torch_drop"] = tmp_path_factory.mktemp("torch_drop")
    record(drop, out["torch_drop"], batch, F.cross_entropy, eval_batches=0)
    out["keras_drop"] = tmp_path_factory.mktemp("keras_drop") / "log"
    keras_record(kdrop, nhwc, y, out["keras_drop"])
    torch.manual_seed(0)
    reg = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    kreg = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)],
        name="reg",
    )
    kreg.set_weights(
        [
            w
            for m in (reg[0], reg[2])
            for w in (m.weight.detach().numpy().T, m.bias.detach().numpy())
        ]
    )
    yr = rng.standard_normal((N, 2)).astype(np.float32)
    out["torch_mse"] = tmp_path_factory.mktemp("torch_mse")
    record(reg, out["torch_mse"], [(torch.from_numpy(xm), torch.from_numpy(yr))], F.mse_loss)
    out["keras_mse"] = tmp_path_factory.mktemp("keras_mse") / "log"
    keras_record(kreg, xm, yr, out["keras_mse"], keras.losses.MeanSquaredError())
    for bn in (False, True):
        name = "bn" if bn else "gap"
        torch.manual_seed(0)
        net, model = TorchGAP(bn), keras_gap(bn)
        model.get_layer("conv").set_weights(
            [net.conv.weight.detach().numpy().transpose(2, 3, 1, 0), net.conv.bias.detach().numpy()]
        )
        model.get_layer("fc").set_weights(
            [net.fc.weight.detach().numpy().T, net.fc.bias.detach().numpy()]
        )
        out[f"torch_{name}"] = tmp_path_factory.mktemp(f"torch_{name}")
        record(net, out[f"torch_{name}"], batch, F.cross_entropy, eval_batches=0)
        out[f"keras_{name}"] = tmp_path_factory.mktemp(f"keras_{name}") / "log"
        keras_record(model, nhwc, y, out[f"keras_{name}"])
    return out


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli(["compare", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _validate(doc: dict[str, Any]) -> None:
    validate_against_schema(doc, SCHEMA_FILE)


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_and_keras_cnn_agree(logs, capsys, fmt: str) -> None:
    code, out, err = _run(capsys, str(logs["torch"]), str(logs["keras"]), "--format", fmt)
    assert code == 0, out + err
    if fmt == "json":
        doc = json.loads(out)
        _validate(doc)
        assert doc["equal"] and doc["structure"]["first_difference"] is None
        rows = {r["output"]: r for r in doc["parity"]["rows"]}
        anchored = {f"{k} [A vs torch float64]" for k in ("prediction", "loss")}
        assert set(rows) == {"prediction", "loss"} | anchored | {
            f"grad {p}" for p in ("conv1.weight", "conv1.bias", "conv2.weight")
        } | {f"grad {p}" for p in ("conv2.bias", "fc.weight", "fc.bias")}
        assert all(r["ok"] for r in rows.values())
        pairs = {p["a"]: p for p in doc["parameters"]}
        assert pairs["fc.weight"]["b"].endswith("fc/kernel")
        assert pairs["conv2.weight"]["b_shape"] == [3, 3, 4, 6]
        # the tool maps A's weights onto B as the hand copy did, flatten order included
        assert all(p["own_diff"] == 0 for p in pairs.values()), pairs
    else:
        assert "parity ok" in out and "9 ops agree" in out
        assert "fc.weight" in out and "fc/kernel" in out


def test_flatten_order_reaches_the_dense_rows(logs) -> None:
    """B's dense kernel is A's weight transposed with its rows in NHWC order:
    the steps the normal form found reproduce the hand copy exactly."""
    result = tracelog.compare(logs["torch"], logs["keras"])
    pair = next(p for p in result.pairs if p.a.name == "fc.weight")
    assert any(s.kind == "rows" for s in pair.b.steps)
    w = np.arange(CLASSES * 96, dtype=np.float64).reshape(CLASSES, 96)
    want = w.reshape(CLASSES, 6, 4, 4).transpose(2, 3, 1, 0).reshape(-1, CLASSES)
    got = from_canonical(to_canonical(w, pair.a.steps), pair.b.steps)
    np.testing.assert_array_equal(got, want)
    steps = (Step("transpose", (1, 0)), Step("rows", (2, 0, 1)))
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(from_canonical(to_canonical(x, steps), steps), x)


@pytest.mark.parametrize(
    ("variant", "field", "a_path", "b_layer", "a_value", "b_value"),
    [
        ("keras_tanh", "op", "relu2", "c2", "Relu", "Tanh"),
        ("keras_valid", "pads", "conv2", "c2", [1, 1, 1, 1], [0, 0, 0, 0]),
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_one_layer_changed_names_it_in_both(
    logs, capsys, variant: str, field: str, a_path: str, b_layer: str, a_value, b_value, fmt
) -> None:
    code, out, err = _run(capsys, str(logs["torch"]), str(logs[variant]), "--format", fmt)
    assert code == 1 and err == "", out + err
    if fmt == "json":
        doc = json.loads(out)
        _validate(doc)
        d = doc["structure"]["first_difference"]
        assert doc["parity"] is None and not doc["equal"]
        assert d["field"] == field and d["graph"] == "prediction"
        assert d["a"]["path"] == a_path and d["b"]["path"].split("/")[-1] == b_layer
        if field == "op":
            assert (d["a"]["op"], d["b"]["op"]) == (a_value, b_value)
        else:
            assert (d["a"]["value"], d["b"]["value"]) == (a_value, b_value)
            assert d["a"]["module_type"] == "Conv2d" and d["b"]["module_type"] == "Conv2D"
    else:
        line = next(x for x in out.splitlines() if "first difference" in x)
        assert f"A {a_path} (" in line and f"/{b_layer} (" in line, line
        assert str(a_value).replace(" ", "") in line.replace(" ", ""), line


@pytest.mark.parametrize("which", ["torch", "keras"])
def test_a_log_agrees_with_itself(logs, capsys, which: str) -> None:
    code, out, _ = _run(capsys, str(logs[which]), str(logs[which]))
    assert code == 0 and "parity ok" in out


def test_gemm_and_matmul_add_are_one_linear_and_gelu_by_meaning(logs, capsys) -> None:
    from tracelog.compare import normal_form

    a, b = tracelog.load(logs["torch_mlp"]), tracelog.load(logs["keras_mlp"])
    assert "Gemm" in str([n.op for g in a.graphs.values() for n in g.nodes])
    assert "MatMul" in str([n.op for g in b.graphs.values() for n in g.nodes])
    ops = [(o.op, o.attrs.get("approximate")) for o in normal_form(b).ops][:4]
    assert ops == [("Linear", None), ("Relu", None), ("Linear", None), ("Gelu", "none")]
    assert "Erf" in str([n.op for g in b.graphs.values() for n in g.nodes])
    code, out, err = _run(capsys, str(logs["torch_mlp"]), str(logs["keras_mlp"]))
    assert code == 0 and "parity ok" in out, out + err


def test_mapping_overrides_the_structural_match(logs, capsys, tmp_path) -> None:
    a, b = str(logs["torch_mlp"]), str(logs["keras_mlp"])
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"fc1.weight": "mlp/d1/kernel"}))
    code, out, err = _run(capsys, a, b, "--mapping", str(same), "--format", "json")
    doc = json.loads(out)
    _validate(doc)
    assert code == 0, out + err
    by = {p["a"]: p["matched_by"] for p in doc["parameters"]}
    assert by["fc1.weight"] == "mapping" and by["fc2.weight"] == "structure"
    # fc1 and fc2 have one shape: a swapped mapping is legal, and parity says it is wrong
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps({"fc1.weight": "mlp/d2/kernel", "fc2.weight": "mlp/d1/kernel"}))
    code, out, err = _run(capsys, a, b, "--mapping", str(swapped))
    assert code == 1 and "parity FAILED" in out, out + err
    assert "grad fc1.weight" in out and "NO" in out


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"fc1.weight": "mlp/nowhere"}, "which no op of B reads"),
        ({"nowhere": "mlp/d1/kernel"}, "which no op of A reads"),
        ({"fc1.weight": "mlp/out/kernel"}, "the shapes differ"),
        ({"fc1.weight": "mlp/d2/kernel"}, "mapped from more than one"),
        ([1, 2], "want a JSON object"),
    ],
)
def test_user_errors_are_one_line(logs, capsys, tmp_path, mapping, message: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mapping))
    code, out, err = _run(
        capsys, str(logs["torch_mlp"]), str(logs["keras_mlp"]), "--mapping", str(path)
    )
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_missing_log_is_one_line(logs, capsys, tmp_path) -> None:
    code, out, err = _run(capsys, str(logs["torch"]), str(tmp_path / "absent"))
    assert code == 2 and out == "" and err.startswith("tracelog: error:") and err.count("\n") == 1


def test_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        cli(["compare", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--mapping" in out


def test_global_pooling_and_a_flatten_of_ones(logs, capsys) -> None:
    """torch: ReduceMean keeping dims, then a flatten of the 1x1; Keras: a
    ReduceMean over NHWC's axes 1, 2 dropping them: one op, logical axes [2, 3]."""
    from tracelog.compare import normal_form

    ops = [normal_form(tracelog.load(logs[k])).ops for k in ("torch_gap", "keras_gap")]
    assert [(o.op, o.attrs.get("axes")) for o in ops[0] if o.op == "ReduceMean"] == [
        ("ReduceMean", [2, 3])
    ]
    assert [o.op for o in ops[0]] == [o.op for o in ops[1]]
    code, out, err = _run(capsys, str(logs["torch_gap"]), str(logs["keras_gap"]))
    assert code == 0 and "parity ok" in out, out + err


def test_batch_norm_running_variance_convention_is_a_difference(logs, capsys) -> None:
    """PyTorch's running variance takes the unbiased batch variance, Keras'
    the biased one: the same forward, different buffers. It is reported at
    the batch norm of both, not normalised away."""
    code, out, err = _run(capsys, str(logs["torch_bn"]), str(logs["keras_bn"]))
    line = next(x for x in out.splitlines() if "first difference" in x)
    assert code == 1, out + err
    assert "A bn (BatchNorm2d) BatchNormTraining unbiased 1" in line, line
    assert "gap/bn (BatchNormalization) BatchNormTraining unbiased 0" in line, line


def test_depthwise_kernel_maps_through_its_reshape(logs, capsys) -> None:
    """Keras' (kh, kw, in, mult) depthwise kernel reaches its Conv through a
    Reshape and a Transpose: the steps map torch's (in * mult, 1, kh, kw) onto
    it as the hand copy did."""
    code, out, err = _run(capsys, str(logs["torch_dw"]), str(logs["keras_dw"]), "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["parity"]["ok"], out + err
    pair = next(p for p in doc["parameters"] if p["a"] == "dw.weight")
    assert pair["b_shape"] == [3, 3, 2, 2] and pair["own_diff"] == 0, pair


def test_element_wise_chains_are_named_by_what_they_compute() -> None:
    from tracelog.compare import PROBE, _erf, _gelu, _named

    x = PROBE
    keras_gelu = 0.5 * x * (1 - _erf(-x * float(np.float32(0.70710677))))
    assert _named(keras_gelu) == ("Gelu", {"approximate": "none"})
    assert _named(_gelu(x, "tanh")) == ("Gelu", {"approximate": "tanh"})
    assert _named(x / (1 + np.exp(-x)) * 2 - x)[0] == "Elementwise"  # not an activation
    op, attrs = _named(np.where(x >= 0, x, np.float32(0.2) * x))
    assert op == "LeakyRelu" and attrs["alpha"] == float(np.float32(0.2))
    with np.errstate(all="ignore"):
        assert _named(np.log(x))[0] == "Elementwise"


def test_dropout_masks_are_fed_to_b_in_its_layout(logs, capsys) -> None:
    """A's recorded masks reach B relaid (NCHW -> NHWC; after the flatten, in
    B's flatten order), and B's ratio 0.3 (float32 in Keras) runs as A's: the
    float64 parity then holds to rounding. Masks left as drawn would differ."""
    a, b = tracelog.load(logs["torch_drop"]), tracelog.load(logs["keras_drop"])
    assert a.sample()["mask/0"].shape == (N, 4, 8, 8) and b.sample()["mask/0"].shape == (N, 8, 8, 4)
    code, out, err = _run(capsys, str(logs["torch_drop"]), str(logs["keras_drop"]))
    assert code == 0 and "parity ok" in out, out + err


def test_mapping_file_not_json_is_one_line(logs, capsys, tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{fc1.weight: d1}")
    code, out, err = _run(capsys, str(logs["torch"]), str(logs["keras"]), "--mapping", str(path))
    assert code == 2 and out == "" and "is not JSON" in err and err.count("\n") == 1, err
    code, _, err = _run(
        capsys, str(logs["torch"]), str(logs["keras"]), "--mapping", str(tmp_path / "no.json")
    )
    assert code == 2 and "cannot read --mapping" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("pair", ["", "_drop", "_dw"])
def test_keras_as_a_and_torch_as_b(logs, pair: str) -> None:
    """The other direction: Keras' NHWC batch, masks and kernels mapped onto
    the PyTorch model; B's own weights are what the mapping gives."""
    result = tracelog.compare(logs[f"keras{pair}"], logs[f"torch{pair}"])
    assert result.equal, tracelog.compare.dumps(result, "text")
    assert all(p.own_diff == 0 for p in result.pairs)


def test_data_input_shapes_compared_in_the_logical_layout() -> None:
    from tracelog.compare import NormalForm, _first_difference

    def form(shape: list[Any]) -> NormalForm:
        return NormalForm([], [], [], None, [shape])

    assert _first_difference(form(["batch", 1, 8, 8]), form(["batch", 1, "seq", "seq"])) is None
    d = _first_difference(form(["batch", 1, 8, 8]), form(["batch", 1, 6, 6]))
    assert d is not None and d.line() == (
        "first difference: data input shapes: A [[batch,1,8,8]] vs B [[batch,1,6,6]]"
    )


def test_mean_squared_error_per_sample_then_over_the_batch_is_one_mean(logs, capsys) -> None:
    """torch: ReduceMean over everything; Keras: a mean per sample, summed over
    the batch and divided by its size. One ReduceMean over logical axes [0, 1]."""
    from tracelog.compare import normal_form

    for which in ("torch_mse", "keras_mse"):
        last = normal_form(tracelog.load(logs[which])).ops[-1]
        assert (last.op, last.attrs.get("axes"), last.shape) == ("ReduceMean", [0, 1], [])
    code, out, err = _run(capsys, str(logs["torch_mse"]), str(logs["keras_mse"]))
    assert code == 0 and "parity ok" in out, out + err


def test_silu_and_elu_agree_with_keras_swish_and_elu(capsys, tmp_path) -> None:
    """PyTorch's SiLU (one tracelog.SiLU op) and ELU (Celu at alpha 1) against
    Keras' swish (Sigmoid and Mul) and elu (Celu): the same structure by
    meaning, and parity through programs that run each chain as its named op
    where a target has one (SiLU) and as written where none does (Elu)."""
    torch.manual_seed(0)
    tm = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8), nn.ELU(), nn.Linear(8, 3))
    keras.utils.set_random_seed(0)
    km = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="swish"),
            keras.layers.Dense(8, activation="elu"),
            keras.layers.Dense(3),
        ]
    )
    for t, k in zip((0, 2, 4), km.layers, strict=True):
        k.set_weights([tm[t].weight.detach().numpy().T, tm[t].bias.detach().numpy()])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32) * 3
    y = rng.integers(0, 3, 8)
    record(tm, tmp_path / "torch", [(torch.from_numpy(x), torch.from_numpy(y))], F.cross_entropy)
    keras_record(km, x, y, tmp_path / "keras")
    code, out, err = _run(capsys, str(tmp_path / "torch"), str(tmp_path / "keras"))
    assert code == 0 and "parity ok" in out, out + err
