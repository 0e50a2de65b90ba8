"""Keras in, PyTorch out: train a small CNN on scikit-learn's digits with
``model.fit`` and the tracelog callback, emit the run as a PyTorch program,
and check parity: predictions, batch-norm statistics, loss and every
parameter gradient, PyTorch against TensorFlow.

    python examples/keras_digits_to_torch.py --out runs/keras_digits

``fit`` runs its steps as a traced tf.function (Keras' default); pass
``--eager`` to compile with ``run_eagerly=True`` instead. The log is the same.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from sklearn.datasets import load_digits

import tracelog
from tracelog.cli import show_text
from tracelog.keras import TracelogCallback


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="digits"),
            keras.layers.Conv2D(16, 3, padding="same", name="conv1"),
            keras.layers.BatchNormalization(name="bn1"),
            keras.layers.ReLU(name="relu1"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dropout(0.25, name="drop"),
            keras.layers.Dense(10, name="out"),
        ],
        name="digits_cnn",
    )


def digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    x = (d.images[..., None] / 16.0).astype(np.float32)  # [1797, 8, 8, 1], NHWC
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(y))
    return x[perm], y[perm]


def record(
    log_dir: Path, epochs: int = 3, batch_size: int = 64, eager: bool = False
) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        run_eagerly=eager,
    )
    x, y = digits()
    history = model.fit(
        x,
        y,
        epochs=epochs,
        batch_size=batch_size,
        validation_split=0.2,
        verbose=0,
        # overwrite: each run of the example records into the same directory again
        callbacks=[TracelogCallback(log_dir, overwrite=True)],
    )
    for epoch in range(epochs):
        h = {k: v[epoch] for k, v in history.history.items()}
        print(
            f"epoch {epoch}: train loss {h['loss']:.3f}, "
            f"validation accuracy {h['val_accuracy']:.3f}"
        )
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/keras_digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="compile with run_eagerly=True")
    args = parser.parse_args(argv)
    log_dir = Path(args.out)
    record(log_dir, args.epochs, eager=args.eager)
    print(show_text(tracelog.load(log_dir), str(log_dir)))
    program = tracelog.emit(log_dir, target="torch")
    print(f"\nwrote {program}; running it as a plain script:\n")
    # The program stands alone: PyTorch, NumPy and safetensors, no tracelog.
    run = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    print(run.stdout + run.stderr[-2000:])
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
