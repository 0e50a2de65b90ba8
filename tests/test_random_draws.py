"""Random draws in the forward (torch.rand, randn, their _like forms, uniform_ and
normal_): stochastic depth as Hugging Face writes it (keep_prob + rand, floored in
place), a variational autoencoder's noise, and additive uniform noise. Each is one
RandomUniformLike / RandomNormalLike node; the sample keeps the values the batch drew
(as drawn, before the in-place floor) and every target's replay takes them back, so
the translation check holds to float64 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402
from tracelog.sample import mask_key  # noqa: E402

nn = torch.nn


class _Stochastic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(6, 8)  # a mean and a log-variance, 4 each
        self.dec = nn.Linear(4, 6)
        self.block = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        mu, logvar = h[:, :4], h[:, 4:]
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        y = self.dec(z)
        keep = 0.7  # transformers' drop_path
        r = keep + torch.rand((y.shape[0], 1), dtype=y.dtype, device=y.device)
        r.floor_()
        y = y + self.block(y).div(keep) * r
        noise = torch.empty_like(y).uniform_(-0.1, 0.1)
        return y + noise + 0.01 * torch.randn(y.shape[0], 6).normal_(2.0, 0.5)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("draws")
    torch.manual_seed(0)
    model = _Stochastic()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for n in (8, 5):  # a second batch size: the draws' batch dim is symbolic
            x = torch.randn(n, 6, generator=g)
            with listener.batch():
                nn.functional.mse_loss(model(x), x).backward()
            opt.step()
            opt.zero_grad()
    return log_dir


def test_each_draw_is_a_node_and_the_sample_keeps_it_as_drawn(recorded: Path) -> None:
    log = tracelog.load(recorded)
    pred = log.graph(log.sample_info["prediction"])
    ops = [n.op for n in pred.nodes]
    assert "Unsupported" not in ops
    # randn's values are overwritten by normal_, which reads only its shape: 2 normals
    assert ops.count("RandomUniformLike") == 2 and ops.count("RandomNormalLike") == 2
    assert len(log.graphs) == 2  # one prediction and one loss graph for both batch sizes
    assert log.sample_info["reference"] == "float64"
    sample = log.sample()
    draws = [sample[mask_key(k)] for k in range(log.sample_info["masks"])]
    assert len(draws) == 4 and all(d.dtype == np.float32 for d in draws)
    uniform = [d for d in draws if d.shape == (8, 1)]
    assert len(uniform) == 1  # drop path's rand as drawn: in [0, 1), not floored
    assert ((uniform[0] >= 0) & (uniform[0] < 1)).all() and (uniform[0] % 1 != 0).any()
    noise = [d for d in draws if d.shape == (8, 6) and np.abs(d).max() <= 0.1]
    assert len(noise) == 1 and np.abs(noise[0]).max() > 0.01  # uniform_(-0.1, 0.1)


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_replays_the_draws(recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    report = tracelog.check(recorded, target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)


def test_fresh_draws_follow_their_distribution() -> None:
    """Run as a training program (no recorded draws), each target draws anew:
    in [low, high), of the like's shape and dtype; JAX folds each node's
    number into the key, so two nodes (two dropouts) never draw alike."""
    from tracelog.emit.runtime import torch_program

    like = torch.zeros(2000, 3)
    u = torch_program._uniform(like, 0.2, 0.7, None, "mask.0")
    assert u.shape == like.shape and u.dtype == like.dtype
    assert 0.2 <= float(u.min()) and float(u.max()) < 0.7 and abs(float(u.mean()) - 0.45) < 0.02
    z = torch_program._normal(like, 2.0, 0.5, None, "mask.1")
    assert abs(float(z.mean()) - 2.0) < 0.05 and abs(float(z.std()) - 0.5) < 0.05
    jax = pytest.importorskip("jax", reason="the JAX runtime needs jax")
    from tracelog.emit.runtime import jax_program

    key = jax.random.key(0)
    ones = jax.numpy.ones((64, 64))
    first, _ = jax_program._dropout(ones, 0.5, key, "mask.0")
    second, _ = jax_program._dropout(ones, 0.5, key, "mask.1")
    assert not bool((first == second).all())
    u = jax_program._uniform(ones, -1.0, 1.0, key, "mask.2")
    assert float(u.min()) >= -1.0 and float(u.max()) < 1.0 and u.dtype == ones.dtype


class _RandomMasking(nn.Module):
    """ViT-MAE's random masking: sort uniform noise per sample, keep the tokens
    of the smallest draws (argsort, gather), restore the order (argsort of the
    shuffle); and a top-k pooling of the kept tokens' scores."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.score = nn.Linear(8, 1)
        self.head = nn.Linear(8 + 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # [B, L, 8]
        n, length, dim = h.shape
        keep = length // 2
        noise = torch.rand(n, length, device=x.device)
        shuffle = torch.argsort(noise, dim=1)
        restore = torch.argsort(shuffle, dim=1)
        kept = torch.gather(h, 1, shuffle[:, :keep].unsqueeze(-1).repeat(1, 1, dim))
        mask = torch.ones(n, length)
        mask[:, :keep] = 0
        mask = torch.gather(mask, 1, restore)
        top, _ = torch.topk(self.score(kept).squeeze(-1), 2, dim=1)
        pooled = (h * (1 - mask).unsqueeze(-1)).sum(1) / keep
        return self.head(torch.cat([pooled, top], dim=1))


@pytest.mark.parametrize("target", TARGETS)
def test_random_masking_sorts_the_recorded_noise(target: str, tmp_path: Path) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    model = _RandomMasking()
    with tracelog.Listener(model, tmp_path, strict=True) as listener, listener.batch():
        x, y = torch.randn(4, 6, 3), torch.randn(4, 2)
        nn.functional.mse_loss(model(x), y).backward()
    log = tracelog.load(tmp_path)
    ops = [n.op for g in log.graphs.values() for n in g.nodes]
    assert "Unsupported" not in ops and ops.count("TopK") == 3
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)
