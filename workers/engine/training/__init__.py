"""Training the byte-level preset pair (target ``small`` and its ``draft``) on offline text.

The text is the Python standard library's own sources, present on every machine that runs
Python; a seeded split holds files out for perplexity. Plain PyTorch, no Django: run it as
``python -m workers.engine.training`` or ``python manage.py preset_train``.
"""

from workers.engine.training.data import Corpus, corpus_load
from workers.engine.training.train import (
    RECIPES,
    TrainRecipe,
    ensure_trained,
    train_pair,
    train_preset,
    trained_dir,
)

__all__ = [
    "RECIPES",
    "Corpus",
    "TrainRecipe",
    "corpus_load",
    "ensure_trained",
    "train_pair",
    "train_preset",
    "trained_dir",
]
