"""Vision ops (issue 12) recorded from real training steps: group norm,
transposed convolution, 1-D and 3-D convolution, upsampling and unfolding, each replayed on an ONNX runtime and
emitted for every target with its parity check; plus the index arithmetic
behind nearest upsampling, and the layout pass around Resize."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")
pytest.importorskip("onnx", reason="the recorded IR is replayed on onnx.reference")

import torch.nn.functional as F  # noqa: E402
from helpers import assert_translated  # noqa: E402
from torch import nn  # noqa: E402

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.adapters.torch.rules_vision import torch_nearest_index  # noqa: E402
from tracelog.emit.inline import inlinable  # noqa: E402
from tracelog.ir import ConstData, Graph, Node, Output, TensorType, Value  # noqa: E402
from tracelog.passes.layout import to_channels_first, to_channels_last  # noqa: E402
from tracelog.verify import run_graph, verify  # noqa: E402

TARGETS = ["tensorflow", "jax", "torch", "onnx"]


class Decoder(nn.Module):
    """ConvTranspose2d with stride, padding, output_padding, dilation, groups
    (depthwise too), ConvTranspose1d; GroupNorm with 1, 2, 3 and 6 groups
    (affine and not), on 4-D and 3-D data."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.grouped = nn.ConvTranspose2d(
            4, 6, (2, 3), stride=(2, 1), padding=(0, 1), dilation=(2, 1), groups=2
        )
        self.depthwise = nn.ConvTranspose2d(  # output_padding 1 reaches the stride 1
            6, 6, 3, padding=2, output_padding=1, dilation=2, groups=6, bias=False
        )
        self.line = nn.ConvTranspose1d(6, 2, 3, stride=3, padding=1, output_padding=2, groups=2)
        self.one = nn.GroupNorm(1, 4)
        self.three = nn.GroupNorm(3, 6)
        self.six = nn.GroupNorm(6, 6, affine=False)
        self.flat = nn.GroupNorm(2, 6, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.six(self.depthwise(self.three(self.grouped(self.one(self.up(x))))))
        return self.line(self.flat(h.mean(dim=2)))


class Resampling(nn.Module):
    """nn.Upsample / F.interpolate by scale and by size: nearest, nearest-exact,
    bilinear and bicubic (up and down, antialiased too), align_corners both ways, 1-D linear and trilinear;
    pooling as vision models use it: ceil_mode, 1-D and 3-D, adaptive pooling
    to sizes that do not divide the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")  # Resize
        self.pools2d = nn.ModuleList(
            [
                nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
                nn.AvgPool2d(3, 2, ceil_mode=True),
                nn.AvgPool2d(2, padding=1, ceil_mode=True, count_include_pad=False),
                nn.AdaptiveAvgPool2d((3, 4)),
                nn.AdaptiveMaxPool2d((3, 4)),
            ]
        )
        self.pools1d = nn.ModuleList([nn.MaxPool1d(4, ceil_mode=True), nn.AdaptiveMaxPool1d(5)])
        self.pools3d = nn.ModuleList(
            [nn.MaxPool3d(2), nn.AvgPool3d(2, ceil_mode=True), nn.AdaptiveAvgPool3d((2, 1, 2))]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # [n, 3, 7, 6]
        ups = [
            self.up(h),
            F.interpolate(h, size=(9, 8), mode="nearest"),  # torch's index table: Gather
            F.interpolate(h, scale_factor=2, mode="nearest-exact"),
            F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(h, scale_factor=1.5, mode="bilinear"),  # 7 * 1.5 -> 10, by 1 / 1.5
            F.interpolate(h, size=(5, 3), mode="bilinear", align_corners=True),
            F.interpolate(h, scale_factor=2, mode="bicubic"),
            # by size: weights at fractions no float32 holds (onnx.reference's
            # cubic weights were float32 even on float64 data: verify._resize)
            F.interpolate(h, size=(9, 5), mode="bicubic", align_corners=True),
            F.interpolate(h, size=(5, 4), mode="bicubic"),
            # antialiased (PIL's filters): two products with torch's own weights
            F.interpolate(h, size=(4, 3), mode="bilinear", antialias=True),
            F.interpolate(h, scale_factor=0.6, mode="bicubic", antialias=True),
            F.interpolate(h, size=(9, 8), mode="bilinear", antialias=True, align_corners=True),
        ]
        total = sum((y * y).mean(dim=(2, 3)) for y in ups)
        total = total + sum(p(h).mean(dim=(2, 3)) for p in self.pools2d)
        line = h.flatten(2)
        total = total + F.interpolate(line, scale_factor=1.5, mode="linear").mean(dim=2)
        total = total + sum(p(line).mean(dim=2) for p in self.pools1d)
        cube = h.reshape(h.shape[0], 3, 7, 2, 3)
        total = total + F.interpolate(cube, size=(3, 3, 4), mode="trilinear").mean(dim=(2, 3, 4))
        return total + sum(p(cube).mean(dim=(2, 3, 4)) for p in self.pools3d)


class Convolutions(nn.Module):
    """Conv1d and Conv3d as audio, text and video models use them: stride,
    asymmetric padding, dilation, groups, depthwise, no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.line = nn.Conv1d(2, 4, 3, stride=2, padding=1)
        self.line_dilated = nn.Conv1d(4, 4, 3, padding=2, dilation=2, groups=2)
        self.line_depthwise = nn.Conv1d(4, 8, 5, padding=2, groups=4, bias=False)
        self.cube = nn.Conv3d(2, 4, (1, 3, 3), stride=(1, 2, 1), padding=(0, 1, 2))
        self.cube_dilated = nn.Conv3d(4, 6, 2, dilation=(1, 2, 1), groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        line = self.line_depthwise(torch.relu(self.line_dilated(self.line(x.reshape(n, 2, 48)))))
        cube = self.cube_dilated(torch.tanh(self.cube(x.reshape(n, 2, 2, 6, 4))))
        return line.mean(dim=2) + cube.mean(dim=(2, 3, 4)).repeat(1, 2)[:, :8]


class Unfolding(nn.Module):
    """nn.Unfold (aten.im2col), as ConvBERT's span convolution uses it (a
    (k, 1) kernel padded to keep the length) and with dilation, asymmetric
    padding and stride; a convolution first so the input carries a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.span = nn.Unfold((3, 1), padding=(1, 0))
        self.strided = nn.Unfold((2, 3), dilation=(2, 1), padding=(0, 1), stride=(1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # [n, 3, 7, 6]
        span = self.span(h)  # [n, 9, 42]
        strided = self.strided(h)  # [n, 18, 15]
        return (span * span).mean(dim=2).repeat(1, 2) + torch.tanh(strided).mean(dim=2)


def _record(model: nn.Module, x: torch.Tensor, log_dir: Path) -> tracelog.TraceLog:
    """One real training step under a listener; the loss after the forward."""
    listener = TorchListener(model, log_dir, strict=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with listener.batch():
        loss = (model(x) ** 2).mean()
        loss.backward()
    opt.step()
    return listener.close()


def _ops(log_dir: Path) -> set[str]:
    log = tracelog.load(log_dir)
    return {n.qualified_op for g in log.graphs.values() for n in g.nodes}


CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], set[str], str]] = {
    # name: (model, input shape, ops the graph must hold, ONNX runtime that replays it)
    # onnx.reference's grouped ConvTranspose is tracelog.verify's (onnx/onnx#8446)
    "decoder": (Decoder, (2, 3, 3, 4), {"ConvTranspose", "GroupNormalization"}, "reference"),
    "convolutions": (Convolutions, (2, 96), {"Conv"}, "reference"),
    "unfolding": (Unfolding, (2, 2, 7, 6), {"Pad", "Slice", "Concat"}, "reference"),
    "resampling": (
        Resampling,
        (2, 2, 7, 6),
        {"Resize", "Gather", "MaxPool", "AveragePool", "Einsum", "Slice"},
        "reference",
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    build, shape, ops, runtime = CASES[request.param]
    torch.manual_seed(0)
    log_dir = tmp_path_factory.mktemp(request.param)
    log = _record(build(), torch.randn(*shape), log_dir)
    assert log.unrecorded == 0, log.failures
    return log_dir, ops, runtime


def test_records_onnx_ops_that_replay_what_torch_computed(recorded) -> None:
    log_dir, ops, runtime = recorded
    found = _ops(log_dir)
    assert ops <= found and "tracelog.Unsupported" not in found, found
    report = verify(log_dir, runtime=runtime)
    assert report.ok, report.table()


@pytest.mark.parametrize("target", TARGETS)
def test_emitted_program_reproduces_the_step(recorded, target: str) -> None:
    pytest.importorskip(
        {"torch": "torch", "onnx": "onnxruntime"}.get(target, target),
        reason=f"the {target} target needs its framework installed",
    )
    log_dir, _, _ = recorded
    report = tracelog.check(log_dir, target)
    assert report.ok, report.table()
    if target == "onnx":  # model.onnx in float64 on onnx.reference, grouped ConvTranspose too
        assert_translated(report)


@pytest.mark.parametrize("target", ["tensorflow", "jax"])
def test_group_norm_statistics_do_not_cancel(target: str) -> None:
    """Values far from zero (mean 1000, spread 1): ONNX's function body, E[x^2] -
    E[x]^2 in float32, loses the variance to cancellation (onnx.reference and
    onnxruntime give NaN here); the runtimes' helper, mean((x - mean)^2), stays
    within torch's own float32 error of the float64 result."""
    pytest.importorskip(target, reason=f"the {target} target needs its framework installed")
    runtime = __import__(f"tracelog.emit.runtime.{target}_program", fromlist=["_group_norm"])
    torch.manual_seed(0)
    x, g, b = torch.randn(2, 8, 6, 6) + 1000.0, torch.rand(8) + 0.5, torch.randn(8)
    exact = F.group_norm(x.double(), 2, g.double(), b.double()).numpy()
    own = np.abs(F.group_norm(x, 2, g, b).numpy() - exact).max()
    got = runtime._group_norm(*(t.numpy() for t in (x, g, b)), 2, 1e-5, 1)
    assert np.abs(np.asarray(got) - exact).max() <= 2 * own
    xs = x.numpy().reshape(2, 2, -1)
    naive = (xs * xs).mean(-1) - xs.mean(-1) ** 2  # what ONNX's body computes
    assert np.abs(naive - x.double().numpy().reshape(2, 2, -1).var(-1)).max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exact", [False, True])
def test_nearest_index_is_torchs(dtype: torch.dtype, exact: bool) -> None:
    """The adapter's copy of torch's nearest index arithmetic (which decides
    between Resize and a Gather) against torch's kernel, on sizes and scale
    factors where float32 rounding matters."""
    mode = "nearest-exact" if exact else "nearest"
    for n_in in range(1, 40):
        x = torch.arange(n_in, dtype=dtype).reshape(1, 1, n_in)
        for n_out in range(1, 2 * n_in + 3):
            got = F.interpolate(x, size=n_out, mode=mode)[0, 0].long().numpy()
            want = torch_nearest_index(n_in, n_out, None, exact, str(dtype)[6:])
            assert np.array_equal(got, want), (n_in, n_out)
        for scale in (0.5, 1 / 3, 0.7, 1.5, 1.7, 2.0, 2.2, 3.0, 3.3):
            if int(n_in * scale) < 1:
                continue
            got = F.interpolate(x, scale_factor=scale, mode=mode)[0, 0].long().numpy()
            want = torch_nearest_index(n_in, len(got), scale, exact, str(dtype)[6:])
            assert np.array_equal(got, want), (n_in, scale)


def test_resize_runs_nhwc_between_convolutions(tmp_path: Path) -> None:
    """TensorFlow's layout pass moves Resize's axes with the data: no
    transpose around it (its numbers: the upsample case's TensorFlow check)."""

    class ConvUpConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(2, 3, 1), nn.Conv2d(3, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.interpolate(self.a(x), scale_factor=2, mode="bilinear"))

    torch.manual_seed(0)
    log = _record(ConvUpConv(), torch.randn(2, 2, 3, 4), tmp_path / "log")
    (pred,) = [g for g in log.graphs.values() if g.kind == "prediction"]
    lowered, report = to_channels_last(pred)
    (resize,) = [n for n in lowered.nodes if n.op == "Resize"]
    assert resize.attrs["axes"] == [1, 2]
    assert len(report.kept) == 2, report.summary()  # the data input in, the output back


def test_a_transpose_sinks_through_resize_and_computes_the_same() -> None:
    """Resize over axes [1, 2] of NHWC data is Resize over [2, 3] of NCHW."""
    values = {
        "x": Value("x", TensorType("float32", (2, 3, 4, 5)), "input"),
        "sizes": Value("sizes", TensorType("int64", (2,)), "const", const=ConstData([7, 3])),
        "t": Value("t", TensorType("float32", (2, 4, 5, 3)), "node"),
        "y": Value("y", TensorType("float32", (2, 7, 3, 3)), "node"),
    }
    attrs = {"axes": [1, 2], "mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    nodes = [
        Node("Transpose", ["x"], ["t"], {"perm": [0, 2, 3, 1]}),
        Node("Resize", ["t", "", "", "sizes"], ["y"], attrs),
    ]
    graph = Graph("prediction", values, nodes, [Output("y", "prediction")])
    after, _ = to_channels_first(graph)
    assert [(n.op, n.attrs.get("axes")) for n in after.nodes] == [
        ("Resize", [2, 3]),
        ("Transpose", None),
    ]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)}
    np.testing.assert_allclose(
        run_graph(after, feeds)["prediction"], run_graph(graph, feeds)["prediction"], rtol=1e-6
    )


def test_resize_tables_are_one_code_in_both_runtimes() -> None:
    """TensorFlow and JAX programs carry the same copy of the Resize tables."""
    tf = inlinable("tracelog.emit.runtime.tensorflow_program").functions
    jax = inlinable("tracelog.emit.runtime.jax_program").functions
    for name in ("_resize_taps", "_resized"):
        assert tf[name] == jax[name], name


@pytest.mark.parametrize(
    "how",
    [
        dict(mode="bilinear", align_corners=False),
        dict(mode="bilinear", align_corners=True),
        dict(mode="bicubic", align_corners=False),
        dict(mode="nearest"),
    ],
    ids=["bilinear", "bilinear-aligned", "bicubic", "nearest"],
)
def test_a_resize_to_its_own_size_is_the_tensor(how: dict, tmp_path: Path) -> None:
    """Interpolated to its own size (BEiT's bias table, at the window it was made
    for), every mode samples each element at itself: no Resize node (the one
    written made onnxruntime's optimizer fail in BEiT's ONNX model), the same values."""

    class Same(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            return F.interpolate(h, size=h.shape[-2:], **how) + 0.5 * h

    torch.manual_seed(0)
    log = _record(Same(), torch.randn(3, 2, 5, 4), tmp_path)  # no size a multiple of 3
    assert log.unrecorded == 0
    ops = _ops(tmp_path)
    assert "Resize" not in ops and "Gather" not in ops, ops
    report = tracelog.check(tmp_path, "onnx")
    assert report.ok, report.table()


class SpanUnfold(nn.Module):
    """ConvBERT's span gathering: token features [n, c, seq, 1] unfolded by a
    (3, 1) kernel keeping the length, and a dilated one that shortens it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.span = nn.Unfold((3, 1), padding=(1, 0))
        self.dilated = nn.Unfold((2, 1), dilation=(3, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids).transpose(1, 2).unsqueeze(-1)  # [n, 4, seq, 1]
        return (self.span(h) ** 2).mean(dim=2) + torch.tanh(self.dilated(h)).mean(dim=2).repeat(
            1, 3
        )[:, :12]


@pytest.mark.parametrize("target", TARGETS)
def test_unfold_over_a_sequence_length_follows_it(target: str, tmp_path: Path) -> None:
    """Batches of lengths 7 and 10 share one graph: each tap's Slice ends from
    the padded axis's end, so the taps are seq and seq-3 long at any length."""
    pytest.importorskip(
        {"torch": "torch", "onnx": "onnxruntime"}.get(target, target),
        reason=f"the {target} target needs its framework installed",
    )
    torch.manual_seed(0)
    model = SpanUnfold()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TorchListener(model, tmp_path / "run", strict=True) as listener:
        for t in (7, 10):
            with listener.batch():
                (model(torch.randint(0, 11, (2, t))) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    log = tracelog.load(tmp_path / "run")
    (pair,) = log.pairs.values()
    assert pair.usage.batches == 2 and log.unrecorded == 0, log.failures
    dims = {d for v in log.graph(pair.prediction).values.values() for d in v.type.shape}
    assert {"seq", "seq-3"} <= dims, dims
    report = tracelog.check(tmp_path / "run", target)
    assert report.ok, report.table()
