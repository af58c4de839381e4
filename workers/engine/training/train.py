"""Seeded training of the preset pair, cached under the models directory like the presets.

``train_pair`` trains the target (``small``) and the draft (``draft``) with fixed recipes: a
fixed number of AdamW steps on seeded windows of the train split, then the held-out perplexity
on fixed windows of held-out files. The result is an ordinary Hugging Face-format directory
``<root>/<preset>-py-seed<seed>`` with a marker (recipe, corpus fingerprint, figures); a
directory whose marker matches the recipe is reused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from workers.engine.presets import model_files_write, preset_config
from workers.engine.training.data import Corpus, corpus_load
from workers.engine.training.grow import grow
from workers.engine.training.model import TrainableLlama

TRAINED_FORMAT_VERSION = 1
MARKER = "fairlane_trained.json"
EVAL_WINDOWS = 48
EVAL_SEED = 99


@dataclass(slots=True, frozen=True)
class TrainRecipe:
    preset: str
    num_steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    # Start from this trained preset, grown to this shape (see grow.py), instead of from scratch.
    grown_from: str | None = None

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.num_steps - self.warmup_steps, 1)
        return self.lr * (
            self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        )


# Sized for a shared 2-core machine: together well under 15 minutes (the README has figures).
# The draft trains first, from scratch; the target starts as the grown draft.
RECIPES: dict[str, TrainRecipe] = {
    "draft": TrainRecipe(
        "draft", num_steps=320, batch_size=8, seq_len=128, lr=4e-3, warmup_steps=20
    ),
    "small": TrainRecipe(
        "small",
        num_steps=80,
        batch_size=4,
        seq_len=128,
        lr=1e-3,
        warmup_steps=8,
        grown_from="draft",
    ),
}
Log = Callable[[str], None]


def trained_dir(preset: str, root: str | Path, seed: int = 0) -> Path:
    return Path(root) / f"{preset}-py-seed{seed}"


def ensure_trained(
    preset: str,
    root: str | Path,
    *,
    seed: int = 0,
    corpus: Corpus | None = None,
    log: Log = print,
    max_seconds: float | None = None,
) -> Path:
    """The trained directory for ``preset``: reused when its marker matches, else trained now."""
    path = trained_dir(preset, root, seed)
    recipe = RECIPES[preset]
    marker = _marker_read(path)
    if (
        marker
        and marker.get("recipe") == _recipe_key(preset)
        and marker.get("seed") == seed
        and marker.get("version") == TRAINED_FORMAT_VERSION
        and not marker.get("is_truncated")
    ):
        log(f"{preset}: cached at {path}")
        return path
    start = None
    if recipe.grown_from is not None:
        base = ensure_trained(
            recipe.grown_from, root, seed=seed, corpus=corpus, log=log, max_seconds=max_seconds
        )
        start = _trained_load(base, recipe.seq_len)
    corpus = corpus or corpus_load()
    model, figures = train_preset(
        recipe, corpus, seed=seed, log=log, max_seconds=max_seconds, start=start
    )
    _write(
        path,
        model,
        {
            "recipe": _recipe_key(preset),
            "seed": seed,
            "version": TRAINED_FORMAT_VERSION,
            "corpus": corpus.fingerprint,
            **figures,
        },
    )
    return path


def train_pair(
    root: str | Path, *, seed: int = 0, log: Log = print, max_seconds: float | None = None
) -> dict[str, Any]:
    """Train (or reuse) the draft, then the target; returns each one's path and marker.

    ``max_seconds`` bounds the pair's training together; a model stopped by it is saved, marked
    truncated, and trained again on the next call."""
    deadline = None if max_seconds is None else time.perf_counter() + max_seconds
    corpus = corpus_load()
    result = {}
    for preset in ("draft", "small"):
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
        path = ensure_trained(preset, root, seed=seed, corpus=corpus, log=log, max_seconds=left)
        result[preset] = {"path": str(path), **(_marker_read(path) or {})}
    return result


def train_preset(
    recipe: TrainRecipe,
    corpus: Corpus,
    *,
    seed: int,
    log: Log = print,
    max_seconds: float | None = None,
    start: TrainableLlama | None = None,
) -> tuple[TrainableLlama, dict[str, Any]]:
    """Train one preset; ``start`` is the trained model it is grown from (if its recipe says so)."""
    torch.manual_seed(seed)
    model = TrainableLlama(preset_config(recipe.preset), max_positions=recipe.seq_len)
    if start is not None:
        grow(start, model, generator=torch.Generator().manual_seed(seed))
        log(
            f"{recipe.preset}: grown from {recipe.grown_from} (held-out loss"
            f" {heldout_loss(model, corpus, recipe.seq_len):.4f} before training)"
        )
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": recipe.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=recipe.lr,
        betas=(0.9, 0.95),
    )
    num_params = sum(p.numel() for p in model.parameters())
    log(
        f"{recipe.preset}: {num_params / 1e6:.2f} M parameters, {recipe.num_steps} steps of "
        f"{recipe.batch_size}x{recipe.seq_len} tokens, {len(corpus.train) / 1e6:.1f} M train tokens"
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    losses = _train_loop(
        model,
        optimizer,
        recipe,
        corpus,
        seed=seed,
        log=log,
        deadline=None if max_seconds is None else started + max_seconds,
    )
    step = len(losses)
    if step < recipe.num_steps:
        log(f"{recipe.preset}: stopped by the time limit after {step} steps")
    tail = losses[-max(len(losses) // 10, 1) :] or [float("nan")]  # (no step before the deadline)
    figures = {
        "num_parameters": num_params,
        "num_steps_done": step,
        "is_truncated": step < recipe.num_steps,
        "train_seconds": round(time.perf_counter() - started, 1),
        "train_cpu_seconds": round(time.process_time() - cpu_started, 1),
        "train_loss": round(sum(tail) / len(tail), 4),
        "heldout_loss": round(heldout_loss(model, corpus, recipe.seq_len), 4),
    }
    figures["heldout_ppl"] = round(math.exp(figures["heldout_loss"]), 3)
    log(
        f"{recipe.preset}: train loss {figures['train_loss']}, held-out loss"
        f" {figures['heldout_loss']}"
        f" (perplexity {figures['heldout_ppl']} per byte) in {figures['train_seconds']} s"
    )
    return model, figures


def _train_loop(
    model: TrainableLlama,
    optimizer: torch.optim.Optimizer,
    recipe: TrainRecipe,
    corpus: Corpus,
    *,
    seed: int,
    log: Log,
    deadline: float | None,
) -> list[float]:
    """AdamW steps on seeded train windows until the recipe's steps or the deadline; the losses."""
    started, losses = time.perf_counter(), []
    model.train()
    for step in range(recipe.num_steps):
        if deadline is not None and time.perf_counter() > deadline:
            break
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr_at(step)
        batch = corpus.windows(
            "train", num=recipe.batch_size, length=recipe.seq_len + 1, seed=seed * 1_000_003 + step
        )
        loss = model.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == recipe.num_steps - 1:
            log(
                f"{recipe.preset}: step {step} loss {loss.item():.3f}"
                f" ({time.perf_counter() - started:.0f} s)"
            )
    return losses


@torch.no_grad()
def heldout_loss(model: TrainableLlama, corpus: Corpus, seq_len: int) -> float:
    """Mean next-byte cross-entropy (nats) over fixed held-out windows."""
    model.eval()
    windows = corpus.windows("heldout", num=EVAL_WINDOWS, length=seq_len + 1, seed=EVAL_SEED)
    losses = [model.loss(windows[i : i + 8]).item() for i in range(0, len(windows), 8)]
    model.train()
    return sum(losses) / len(losses)


_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _trained_load(path: Path, max_positions: int) -> TrainableLlama:
    """A trained directory back as a trainable model (transformers' names, q/k/v and gate/up
    fused)."""
    model = TrainableLlama(
        json.loads((path / "config.json").read_text()), max_positions=max_positions
    )
    state: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in load_file(str(path / "model.safetensors")).items():
        module, _, kind = name.removeprefix("model.").replace(".self_attn.", ".").rpartition(".")
        parent, _, proj = module.rpartition(".")
        if proj in _FUSED:
            fused, index = _FUSED[proj]
            pieces.setdefault(f"{parent}.{fused}.{kind}", {})[index] = tensor
        else:
            state[f"{module}.{kind}"] = tensor
    state.update(
        {key: torch.cat([parts[i] for i in sorted(parts)]) for key, parts in pieces.items()}
    )
    model.load_state_dict(state)
    return model


def _recipe_key(preset: str) -> dict[str, Any]:
    """What a cached model must have been trained with: its recipe, and its base's."""
    recipe = RECIPES[preset]
    return {**asdict(recipe), "base": _recipe_key(recipe.grown_from) if recipe.grown_from else None}


def _write(path: Path, model: TrainableLlama, marker: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model_files_write(staging, model.config, model.hf_state_dict())
        (staging / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        shutil.rmtree(path, ignore_errors=True)
        os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _marker_read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
