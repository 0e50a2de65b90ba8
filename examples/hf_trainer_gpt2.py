"""Record a Hugging Face ``Trainer`` fine-tuning run with
``tracelog.transformers.TracelogCallback``: a GPT-2 from a tiny config (2
layers, 32 wide, random weights, no download) trained on generated token
sequences for a few optimizer steps, with gradient accumulation and an
evaluation each epoch; then show the log and check the translations.

    python examples/hf_trainer_gpt2.py --out runs/hf_gpt2 --targets tensorflow jax onnx
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tracelog.cli import show_and_check
from tracelog.transformers import TracelogCallback

VOCAB, SEQ = 64, 12


def sequences(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Token sequences that count up from a random start (a pattern to learn)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (n, 1), generator=g)
    ids = (starts + torch.arange(SEQ)) % VOCAB
    return [{"input_ids": row, "labels": row} for row in ids]


def train(
    out: Path, *, epochs: int = 2, batch_size: int = 4, accumulate: int = 2, n_train: int = 16
) -> Trainer:
    """``n_train`` sequences in batches of ``batch_size``, an optimizer step every
    ``accumulate`` batches; 8 evaluation sequences after each epoch."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=scratch,
            num_train_epochs=epochs,
            per_device_train_batch_size=batch_size,
            per_device_eval_batch_size=batch_size,
            gradient_accumulation_steps=accumulate,
            learning_rate=1e-3,
            eval_strategy="epoch",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=sequences(n_train, 1),
            eval_dataset=sequences(8, 2),
            callbacks=[TracelogCallback(out, overwrite=True)],
        )
        trainer.train()
    return trainer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/hf_gpt2"))
    p.add_argument("--targets", nargs="*", default=[], help="check these targets")
    args = p.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    train(args.out)
    return show_and_check(args.out, args.targets)


if __name__ == "__main__":
    sys.exit(main())
