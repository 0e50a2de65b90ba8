"""TracelogCallback overhead on Keras `fit`, measured side by side in one run:
the same small CNN trained for one epoch with and without the callback,
interleaved so that machine noise hits both alike, in graph mode (Keras'
default: the first batch of each traced step replayed eagerly, the rest
counted by a py_function) and with run_eagerly=True (every batch recorded).
Each fit traces its step functions anew in both arms. Prints seconds per
epoch and the ratio.

    python benchmarks/keras_fit_overhead.py [--batches 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from tracelog.keras import TracelogCallback


def cnn() -> keras.Model:
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            L.Conv2D(16, 3, padding="same"),
            L.BatchNormalization(),
            L.ReLU(),
            L.MaxPooling2D(),
            L.Flatten(),
            L.Dropout(0.25),
            L.Dense(10),
        ]
    )


def one_epoch(model: keras.Model, x: np.ndarray, y: np.ndarray, callback: bool) -> float:
    model.train_function = None  # both arms trace anew, as a fit with the callback does
    with tempfile.TemporaryDirectory() as d:
        callbacks = [TracelogCallback(d)] if callback else []
        start = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((32 * args.batches, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    print(f"{'mode':<6} {'plain s/epoch':>14} {'callback s/epoch':>17} {'ratio':>7}")
    for mode, eager in (("graph", False), ("eager", True)):
        keras.utils.set_random_seed(0)
        model = cnn()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=eager)
        one_epoch(model, x[:64], y[:64], False)  # warm-up
        plain, traced = [], []
        for _ in range(args.rounds):
            plain.append(one_epoch(model, x, y, False))
            traced.append(one_epoch(model, x, y, True))
        p, t = statistics.median(plain), statistics.median(traced)
        print(f"{mode:<6} {p:>14.3f} {t:>17.3f} {t / p:>7.2f}")


if __name__ == "__main__":
    main()
