from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(0)


@pytest.fixture(scope="session", params=[c.name for c in __import__("zoo").CASES])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each zoo case trained for real with a listener: 2 epochs of a full, a
    full and a short batch (which must dedup through `batch`), plus eval."""
    import torch
    from helpers import record
    from zoo import CASES

    case = next(c for c in CASES if c.name == request.param)
    torch.manual_seed(0)
    model = case.model()
    batches = [(case.x(n), case.y(n)) for n in (6, 6, 4)]
    log_dir = tmp_path_factory.mktemp(case.name)
    log = record(model, log_dir, batches, case.loss, epochs=2)
    return case, log_dir, log
