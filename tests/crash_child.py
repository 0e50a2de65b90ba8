"""A small torch training for the crash tests: ``python crash_child.py LOG_DIR MODE N``.

Prints the batch number after each batch. MODE: ``run`` (N batches, then
exits without ``close()``), ``sigterm-exit`` (as ``run``, SIGTERM turned into
SystemExit, the documented way to flush on SIGTERM).
"""

from __future__ import annotations

import signal
import sys
import time

import torch

from tracelog.adapters.torch import TorchListener

log_dir, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "sigterm-exit":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
listener = TorchListener(model, log_dir, checkpoint_every_batches=3, checkpoint_every_s=3600.0)
for i in range(n):
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    with listener.batch():
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    print(i + 1, flush=True)
    if n > 100:
        time.sleep(0.005)  # killed from outside: keep the kill within a few batches
# no listener.close(): atexit leaves the log, marked interrupted
