"""Quantized checkpoints: the source directory's files, with the decoder's linear layers stored
as codes and scales (safetensors, engine tensor names) and ``quantization_config`` in config.json.
Its own module, not the package's: it loads the model, and the loader reads ``checkpoint``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.engine.loader import model_load
from workers.engine.quant.checkpoint import QUANT_METHOD
from workers.engine.quant.modules import BITS, quantize_model


def quantized_save(
    source: str | Path, target: str | Path, method: str, *, group_size: int = 128
) -> Path:
    """Quantize the checkpoint at ``source`` on the CPU and write it to ``target``."""
    source, target = Path(source), Path(target)
    raw = json.loads((source / "config.json").read_text())
    model = model_load(
        source,
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_positions=raw.get("max_position_embeddings", 2048),
    )
    quantize_model(model, method, group_size=group_size, is_prepared=False)
    state = {name: t.contiguous() for name, t in model.state_dict().items()}
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, target / path.name)
    raw["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "method": method,
        "bits": BITS[method],
        "group_size": group_size,
    }
    (target / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
    save_file(
        state,
        str(target / "model.safetensors"),
        metadata={"format": "pt", "fairlane_names": "engine"},
    )
    return target
