"""A model version's manifest: an in-toto Statement (v1) naming every file of the model
directory (relative path, sha256, size) and, as its predicate, the model's name, version,
source and license. It is written as canonical JSON (sorted keys, no spaces, UTF-8) so its
bytes, which the detached signature covers, are the same wherever it is rebuilt."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST_NAME = "fairlane-manifest.json"
SIGNATURE_NAME = "fairlane-manifest.sig"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://fairlane.dev/model-manifest/v1"
OWN_FILES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
_CHUNK = 1 << 20


def canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing found under a model directory, not followed if it is a link."""

    name: str  # POSIX path relative to the directory
    kind: str  # "file", "symlink" or "other" (a FIFO, a socket, a device)
    size: int = 0


def directory_walk(root: Path) -> list[Entry]:
    """Everything under `root` except the manifest and its signature, sorted by name. Links
    are reported, never followed, so nothing outside `root` is ever opened."""
    found: list[Entry] = []

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = prefix + entry.name
                if entry.is_symlink():
                    found.append(Entry(name, "symlink"))
                elif entry.is_dir(follow_symlinks=False):
                    walk(Path(entry.path), name + "/")
                elif entry.is_file(follow_symlinks=False):
                    if name not in OWN_FILES:
                        found.append(Entry(name, "file", entry.stat(follow_symlinks=False).st_size))
                else:
                    found.append(Entry(name, "other"))

    walk(root, "")
    return sorted(found, key=lambda e: e.name)


def is_safe_name(name: str) -> bool:
    """A relative POSIX path that stays inside the directory: no `..`, no absolute path, no
    empty or `.` parts, no backslashes (a Windows separator on the way in)."""
    if not name or "\\" in name or "\x00" in name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in name.split("/"))


def statement_build(root: Path, *, name: str, version: str, source: str, license: str) -> dict:
    """The manifest of the directory as it is now (regular files only; see verify for what
    may not be there at all)."""
    subjects = []
    for entry in directory_walk(root):
        if entry.kind != "file":
            raise ValueError(f"{entry.name}: a {entry.kind} cannot be part of a signed model")
        subjects.append(
            {
                "name": entry.name,
                "digest": {"sha256": sha256_file(root / entry.name)},
                "annotations": {"size": entry.size},
            }
        )
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {"name": name, "version": version, "source": source, "license": license},
    }


def manifest_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
