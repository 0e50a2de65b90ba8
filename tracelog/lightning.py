"""Lightning integration, public name: ``from tracelog.lightning import TracelogCallback``.

The callback lives in the PyTorch adapter (:mod:`tracelog.adapters.torch.lightning`);
importing this module imports ``lightning.pytorch`` (or ``pytorch_lightning``).
"""

from __future__ import annotations

from tracelog.adapters.torch.lightning import TracelogCallback

__all__ = ["TracelogCallback"]
