"""Progress for the command line: one status line on stderr (tqdm), shown only
when the work takes longer than a second, only on a terminal, never with
``--quiet``. Library code names its stages with ``stage("...")``, a no-op
unless the CLI has a progress line open: the Python API prints nothing."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DELAY_S = 1.0  # work shorter than this shows nothing
REFRESH_S = 0.2

_current: Progress | None = None


def stage(text: str) -> None:
    """Name what runs now (shown on the CLI's progress line, if one is open)."""
    p = _current
    if p is not None:
        p.text = text


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class Progress:
    """The status line: a thread draws it after ``DELAY_S`` and redraws the
    elapsed time while a stage blocks (an import of TensorFlow, a run)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._start = time.time()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._draw, name="tracelog-progress", daemon=True)

    def _draw(self) -> None:
        if self._done.wait(DELAY_S):
            return
        try:
            from tqdm import tqdm
        except ImportError:  # progress is a nicety: never an error
            return
        size = shutil.get_terminal_size()
        bar: Any = tqdm(
            total=None,
            file=sys.stderr,
            leave=False,
            bar_format="{desc} [{elapsed}]",
            desc=self.text,
            # a terminal that reports no size (a bare pty) would hide the line
            ncols=size.columns or 80,
            nrows=size.lines or 24,
        )
        bar.start_t = self._start  # elapsed since the command began, not since the line
        try:
            while not self._done.wait(REFRESH_S):
                bar.set_description_str(self.text, refresh=False)
                bar.refresh()
        finally:
            bar.close()  # leave=False: the line is cleared before the command prints

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


@contextmanager
def progress(text: str, enabled: bool) -> Iterator[None]:
    """A progress line for the work inside (nothing when not ``enabled``)."""
    global _current
    if not enabled:
        yield
        return
    with Progress(text) as p:
        _current = p
        try:
            yield
        finally:
            _current = None
