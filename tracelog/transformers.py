"""Hugging Face ``Trainer`` integration, public name:
``from tracelog.transformers import TracelogCallback``.

The callback lives in the PyTorch adapter
(:mod:`tracelog.adapters.torch.hf_trainer`); importing this module imports
transformers; ``import tracelog`` alone does not.
"""

from __future__ import annotations

from tracelog.adapters.torch.hf_trainer import TracelogCallback

__all__ = ["TracelogCallback"]
