"""A ResNet-18 in torchvision's layout, trained on scikit-learn's digits
upscaled to 32x32, recorded, emitted as a TensorFlow program and checked:
predictions, batch-norm updates, loss and all parameter gradients.

    python examples/resnet18_torch_to_tf.py --out runs/resnet18
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import tracelog
import tracelog.cli


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision.models.resnet18's structure and parameter names."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def digits32(limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return (x[:limit], y[:limit]) if limit else (x, y)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/resnet18")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N images")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    x, y = digits32(args.limit)
    n_train = int(0.8 * len(y))
    model = ResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # overwrite: each run of the example records into the same directory again
    with tracelog.Listener(model, args.out, overwrite=True) as listener:
        for epoch in listener.epochs(args.epochs):
            model.train()
            for i in range(0, n_train, args.batch_size):
                xb, yb = (
                    x[i : min(i + args.batch_size, n_train)],
                    y[i : min(i + args.batch_size, n_train)],
                )
                with listener.batch():
                    loss = F.cross_entropy(model(xb), yb)
                    loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            correct = 0
            with torch.no_grad(), listener.batch():
                pred = model(x[n_train:])
                F.cross_entropy(pred, y[n_train:])
            correct = int((pred.argmax(1) == y[n_train:]).sum())
            print(
                f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {correct / (len(y) - n_train):.3f}"
            )
    print(tracelog.cli.show_text(tracelog.load(args.out), args.out))
    program = tracelog.emit(args.out, target="tensorflow")
    print(f"wrote {program}")

    # Judged against PyTorch's own float64 replay of the recorded batch: the
    # program in float64 within 1e-9 (translation), and in float32 within 4x
    # PyTorch's own float32 error (about 1e-5 on these twenty conv + batch-norm
    # layers, so no fixed atol of 1e-5 could judge it).
    report = tracelog.check(args.out, target="tensorflow")
    print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
