"""The training text: the standard library's .py files as bytes, split into train and held-out."""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.engine.tokenizer import PRESET_SPECIAL_TOKENS

# The preset tokenizer: ids 0..4 are special tokens, byte b is id 5 + b.
BYTE_OFFSET = len(PRESET_SPECIAL_TOKENS)
EOS_ID = PRESET_SPECIAL_TOKENS.index("</s>")
# One file in this many (by a hash of its path) is held out.
HELDOUT_EVERY = 20


@dataclass(slots=True)
class Corpus:
    """Token ids (int16) of every train file, and of every held-out file, each file ended by
    </s>."""

    train: torch.Tensor
    heldout: torch.Tensor
    heldout_files: list[Path]
    fingerprint: str  # of the file list and sizes: the same stdlib gives the same corpus

    def windows(self, split: str, *, num: int, length: int, seed: int) -> torch.Tensor:
        """``num`` seeded windows of ``length`` tokens from a split: [num, length] int64."""
        data = self.train if split == "train" else self.heldout
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(data) - length, (num,), generator=g)
        return torch.stack([data[s : s + length] for s in starts.tolist()]).long()


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the standard library (site-packages excluded), in a stable order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [
        f
        for f in root.rglob("*.py")
        if not {"site-packages", "dist-packages", "__pycache__"} & set(f.parts)
    ]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def is_heldout(relative: str) -> bool:
    return (
        int.from_bytes(hashlib.blake2b(relative.encode(), digest_size=4).digest(), "little")
        % HELDOUT_EVERY
        == 0
    )


def encode_bytes(data: bytes) -> list[int]:
    return [b + BYTE_OFFSET for b in data]


def corpus_load(root: Path | None = None) -> Corpus:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train: list[torch.Tensor] = []
    heldout: list[torch.Tensor] = []
    heldout_files: list[Path] = []
    digest = hashlib.blake2b(digest_size=8)
    for path in stdlib_files(root):
        relative = path.relative_to(root).as_posix()
        data = path.read_bytes()
        digest.update(f"{relative}:{len(data)}\n".encode())
        ids = (
            torch.frombuffer(bytearray(data + b"\0"), dtype=torch.uint8).to(torch.int16)
            + BYTE_OFFSET
        )
        ids[-1] = EOS_ID
        (heldout if is_heldout(relative) else train).append(ids)
        if is_heldout(relative):
            heldout_files.append(path)
    if not train or not heldout:
        raise RuntimeError(f"no standard library sources under {root}")
    return Corpus(torch.cat(train), torch.cat(heldout), heldout_files, digest.hexdigest())
