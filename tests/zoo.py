"""Small torch models, one per op family of the core vocabulary. Each case
names the ops its prediction and loss graphs must hold; the op tests record
each case for real and check the IR against ONNX runtimes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    model: Callable[[], nn.Module]
    x: Callable[[int], torch.Tensor]
    y: Callable[[int], torch.Tensor]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    pred_ops: set[str]
    loss_ops: set[str] = field(default_factory=set)
    eval_ops: set[str] = field(default_factory=set)


def _img(c: int = 3, hw: int = 8) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.randn(n, c, hw, hw)


def _vec(d: int) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.randn(n, d)


def _cls(k: int) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.randint(0, k, (n,))


def _ce(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(p, y)


CE_OPS = {"LogSoftmax", "NegativeLogLikelihoodLoss"}


class Seq(nn.Sequential):
    pass


class ConvNet(nn.Module):
    def __init__(self, **conv: int | bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, **conv)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return self.head(h.mean(dim=(2, 3)))


class Shapes(nn.Module):
    """flatten, view, permute, transpose, cat, stack, split, chunk, slicing."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [n, 2, 3, 4]
        a = x.permute(0, 3, 1, 2)  # [n, 4, 2, 3]
        b = a.transpose(2, 3).reshape(x.shape[0], -1)  # [n, 24]
        p, q = torch.chunk(b, 2, dim=1)  # [n, 12] x2
        r, s, t = torch.split(b, [10, 10, 4], dim=1)
        st = torch.stack([p, q], dim=1).flatten(1)  # [n, 24]
        h = torch.cat([st[:, :12], r[:, 2:], s[:, ::5], t], dim=1)  # 12 + 8 + 2 + 4 = 26
        h = h[:, 1:25]
        return self.fc(h + b.view(-1, 24))


class Elementwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        pos = torch.exp(h * 0.1)  # positive
        h = h - pos / 3.0
        h = h * torch.sqrt(pos) + torch.log(pos + 1.0) + h.pow(2) * 0.01
        return torch.rsqrt(pos) - 2 * h


class Reductions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x).view(-1, 3, 4)
        m = h.mean(dim=1)  # [n, 4]
        s = h.sum(dim=2, keepdim=True).squeeze(2)  # [n, 3]
        mx = h.max(dim=1).values  # [n, 4]
        am = torch.amax(h, dim=2)  # [n, 3]
        return torch.cat([m + mx, s * am], dim=1)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        out = self.b(h)
        out += x  # in-place residual add, as torchvision's ResNet writes it
        return F.relu(out)


class Attentionish(nn.Module):
    """matmul and bmm over [n, t, d], Softmax, LayerNorm, GELU, Embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8, bias=False)
        self.ln = nn.LayerNorm(8)
        self.out = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [n, 5] int64
        e = self.emb(tokens)
        q, k = self.q(e), self.k(e)
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 8**0.5, dim=-1)
        h = self.ln(torch.matmul(att, e) + e)
        return self.out(F.gelu(h).mean(dim=1))


class Activations(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.acts = nn.ModuleList(
            [nn.ReLU(), nn.GELU(), nn.Tanh(), nn.Sigmoid(), nn.SiLU(), nn.LeakyReLU(0.2)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        total = h
        for act in self.acts:
            total = total + act(h)
        return F.log_softmax(total, dim=1) + F.softmax(total, dim=1)


class Pools(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.maxp = nn.MaxPool2d(2)
        self.avgp = nn.AvgPool2d(2, stride=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.ap2 = nn.AdaptiveAvgPool2d(3)
        self.fc = nn.Linear(4 + 36, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.maxp(F.relu(self.conv(x)))  # [n, 4, 4, 4]
        a = self.gap(self.avgp(h)).flatten(1)  # [n, 4]
        tall = torch.cat([h, h[:, :, :2]], dim=2)  # [n, 4, 6, 4]
        square = torch.cat([tall, tall[:, :, :, :2]], dim=3)  # [n, 4, 6, 6]
        b = self.ap2(square).flatten(1)  # adaptive 6 -> 3: [n, 36]
        return self.fc(torch.cat([a, b], dim=1))


class BN1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.bn(self.fc(x))))


class CNNBnDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(torch.flatten(h, 1)))


class StraightThrough(nn.Module):
    """detach: a straight-through estimator, whose gradient skips the rounding."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h + (torch.floor(h * 2) / 2 - h).detach()


CASES: list[Case] = [
    Case(
        "linear",
        lambda: Seq(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 4)),
        _vec(6),
        _cls(4),
        _ce,
        {"Gemm", "Relu"},
        CE_OPS,
    ),
    Case(
        "straight_through",
        StraightThrough,
        _vec(6),
        _cls(5),
        _ce,
        {"tracelog.StopGradient", "Floor"},
        CE_OPS,
    ),
    Case(
        "linear_nobias",
        lambda: Seq(nn.Linear(6, 4, bias=False)),
        _vec(6),
        _cls(4),
        _ce,
        {"Gemm"},
        CE_OPS,
    ),
    Case(
        "conv_plain",
        lambda: ConvNet(),
        _img(4),
        _cls(5),
        _ce,
        {"Conv", "ReduceMean", "Gemm"},
        CE_OPS,
    ),
    Case(
        "conv_stride_pad",
        lambda: ConvNet(stride=2, padding=1),
        _img(4),
        _cls(5),
        _ce,
        {"Conv"},
        CE_OPS,
    ),
    Case(
        "conv_dilation",
        lambda: ConvNet(dilation=2, padding=2),
        _img(4),
        _cls(5),
        _ce,
        {"Conv"},
        CE_OPS,
    ),
    Case(
        "conv_groups_nobias",
        lambda: ConvNet(groups=4, bias=False),
        _img(4),
        _cls(5),
        _ce,
        {"Conv"},
        CE_OPS,
    ),
    Case(
        "bn1d",
        BN1d,
        _vec(6),
        _cls(4),
        _ce,
        {"tracelog.BatchNormTraining", "Add"},
        CE_OPS,
        {"BatchNormalization"},
    ),
    Case(
        "cnn_bn_dropout",
        CNNBnDrop,
        _img(3),
        _cls(5),
        _ce,
        {"Conv", "tracelog.BatchNormTraining", "MaxPool", "Dropout", "Reshape", "Gemm"},
        CE_OPS,
        {"BatchNormalization"},
    ),
    Case(
        "activations",
        Activations,
        _vec(6),
        _cls(6),
        lambda p, y: F.nll_loss(p, y),
        {"Relu", "Gelu", "Tanh", "Sigmoid", "tracelog.SiLU", "LeakyRelu", "Softmax", "LogSoftmax"},
        {"NegativeLogLikelihoodLoss"},
    ),
    # AdaptiveAvgPool2d(1) reaches the dispatcher as mean over (-1, -2): ReduceMean.
    Case("pools", Pools, _img(3), _cls(5), _ce, {"MaxPool", "AveragePool", "ReduceMean"}, CE_OPS),
    Case(
        "shapes",
        Shapes,
        lambda n: torch.randn(n, 2, 3, 4),
        lambda n: torch.randn(n, 6),
        F.mse_loss,
        {"Transpose", "Reshape", "Split", "Concat", "Slice", "Unsqueeze"},
        {"Sub", "Mul", "ReduceMean"},
    ),
    Case(
        "elementwise",
        Elementwise,
        _vec(6),
        lambda n: torch.randn(n, 6),
        F.l1_loss,
        {"Mul", "Div", "Sub", "Pow", "Sqrt", "Exp", "Log", "Reciprocal"},
        {"Sub", "Abs", "ReduceMean"},
    ),
    Case(
        "reductions",
        Reductions,
        _vec(6),
        lambda n: (torch.rand(n, 7) > 0.5).float(),
        F.binary_cross_entropy_with_logits,
        {"ReduceMean", "ReduceSum", "ReduceMax", "Squeeze"},
        {"Softplus", "Relu", "ReduceMean"},
    ),
    Case(
        "residual",
        Residual,
        _vec(8),
        lambda n: torch.randn(n, 8),
        F.mse_loss,
        {"Add", "Relu", "Gemm"},
    ),
    Case(
        "attention",
        Attentionish,
        lambda n: torch.randint(0, 11, (n, 5)),
        _cls(3),
        _ce,
        {"Gather", "MatMul", "Softmax", "LayerNormalization", "Gelu", "Transpose", "Div"},
        CE_OPS,
    ),
]
