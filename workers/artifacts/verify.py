"""What is checked before a model's weights are read, in order; each stage stops the load (and
the rest of the checks, unless asked for all of them) when it finds a problem:

1. the directory itself: no symlinks, no FIFOs or devices, no pickled weights (`.bin`, `.pt`,
   ..., or a pickle by its first bytes), every `*.safetensors` really a safetensors file;
2. the manifest and its signature: readable, canonical, the signature made by the key it names
   over these exact bytes, every name in it a path inside the directory;
3. the files: none missing, none extra, every size as listed;
4. every file's sha256.

Who signed (a trusted key, another key, nobody) is reported as `trust`; the policy that decides
whether an untrusted or unsigned model may load lives in workers/artifacts/load.py. No Django."""

from __future__ import annotations

import base64
import binascii
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from workers.artifacts.keys import KeyProblem, key_id, public_parse
from workers.artifacts.manifest import (
    MANIFEST_NAME,
    PREDICATE_TYPE,
    SIGNATURE_NAME,
    STATEMENT_TYPE,
    Entry,
    canonical,
    directory_walk,
    is_safe_name,
    manifest_digest,
    sha256_file,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill")
TRUSTED, UNTRUSTED, UNSIGNED = "trusted", "untrusted", "unsigned"


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason to refuse: a stable `code` (the metric's label) and what exactly is wrong."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(slots=True)
class Verification:
    problems: list[Problem] = field(default_factory=list)
    trust: str = UNSIGNED
    digest: str = ""
    signer: str = ""
    predicate: dict = field(default_factory=dict)
    files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, code: str, message: str) -> None:
        self.problems.append(Problem(code, message))


def model_verify(
    root: str | Path, trusted: Mapping[str, Ed25519PublicKey], *, exhaustive: bool = False
) -> Verification:
    """Check a model directory against its manifest and `trusted` keys (key id -> key)."""
    root, result = Path(root), Verification()
    if root.is_symlink():
        result.add("symlink", f"{root} is a symbolic link; register the directory it points to")
        return result
    if not root.is_dir():
        result.add("not_found", f"{root} is not a directory")
        return result
    entries = directory_walk(root)
    _check_structure(root, entries, result)
    if result.problems and not exhaustive:
        return result
    statement = _check_signature(root, trusted, result)
    if statement is None or (result.problems and not exhaustive):
        return result
    listed = _check_listing(statement, entries, result)
    if result.problems and not exhaustive:
        return result
    for name, digest in listed.items():
        if (
            (root / name).is_file()
            and not (root / name).is_symlink()
            and sha256_file(root / name) != digest
        ):
            result.add("hash_mismatch", f"{name}: sha256 differs from the manifest")
    return result


def _check_structure(root: Path, entries: list[Entry], result: Verification) -> None:
    for entry in entries:
        if entry.kind == "symlink":
            result.add(
                "symlink",
                f"{entry.name} is a symbolic link (to "
                f"{(root / entry.name).readlink()}); links are never followed",
            )
        elif entry.kind == "other":
            result.add("special_file", f"{entry.name} is not a regular file")
        elif entry.name.lower().endswith(PICKLE_SUFFIXES) or _is_pickle(root / entry.name):
            result.add("pickle", f"{entry.name} is a pickle; weights load only as safetensors")
        elif entry.name.endswith(".safetensors") and not _is_safetensors(
            root / entry.name, entry.size
        ):
            result.add("not_safetensors", f"{entry.name} is not a safetensors file")
    result.files = sum(entry.kind == "file" for entry in entries)


def _is_pickle(path: Path) -> bool:
    """Pickle protocol 2+ starts with 0x80 and the protocol; torch.save writes a zip of one."""
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                return any(n.endswith((".pkl", "/data.pkl")) for n in archive.namelist())
        except (zipfile.BadZipFile, OSError):
            return False
    return False


def _is_safetensors(path: Path, size: int) -> bool:
    """An 8-byte little-endian header length, then a JSON object of that length."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= size - 8 and head[8:9] == b"{"


def _check_signature(
    root: Path, trusted: Mapping[str, Ed25519PublicKey], result: Verification
) -> dict | None:
    """The parsed statement, or None when there is none to compare the files with."""
    manifest_path, signature_path = root / MANIFEST_NAME, root / SIGNATURE_NAME
    if not manifest_path.exists():
        if signature_path.exists():
            result.add("malformed_manifest", f"{SIGNATURE_NAME} without {MANIFEST_NAME}")
        return None  # unsigned: the policy decides
    data = manifest_path.read_bytes()
    result.digest = manifest_digest(data)
    statement = _statement_parse(data, result)
    if statement is None:
        return None
    result.predicate = statement["predicate"]
    if not signature_path.exists():
        return statement  # a manifest nobody signed: unsigned, but the files are still checked
    document = _signature_parse(signature_path.read_bytes(), result)
    if document is None:
        return None
    keyid, signature, embedded = document
    result.signer = keyid
    key = trusted.get(keyid)
    try:
        (key or embedded).verify(signature, data)
    except InvalidSignature:
        result.add(
            "bad_signature",
            f"the signature does not verify with key {keyid}: the "
            "manifest or its signature was changed, or another key made it",
        )
        return None
    result.trust = TRUSTED if key is not None else UNTRUSTED
    return statement


def _statement_parse(data: bytes, result: Verification) -> dict | None:
    try:
        statement = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        result.add("malformed_manifest", f"{MANIFEST_NAME} is not JSON: {exc}")
        return None
    shape_ok = (
        isinstance(statement, dict)
        and statement.get("_type") == STATEMENT_TYPE
        and statement.get("predicateType") == PREDICATE_TYPE
        and isinstance(statement.get("subject"), list)
        and isinstance(statement.get("predicate"), dict)
    )
    if not shape_ok:
        result.add("malformed_manifest", f"{MANIFEST_NAME} is not a Fairlane model Statement")
        return None
    if canonical(statement) != data:
        result.add(
            "malformed_manifest",
            f"{MANIFEST_NAME} is not canonical JSON (sorted keys, no spaces, UTF-8)",
        )
        return None
    return statement


def _signature_parse(data: bytes, result: Verification):
    try:
        document = json.loads(data.decode("utf-8"))
        keyid, public = document["keyid"], public_parse(document["public_key"])
        signature = base64.b64decode(document["sig"], validate=True)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, binascii.Error, KeyProblem):
        result.add("malformed_signature", f"{SIGNATURE_NAME} is unreadable or truncated")
        return None
    if document.get("algorithm") != "ed25519" or len(signature) != 64:
        result.add(
            "malformed_signature",
            f"{SIGNATURE_NAME}: expected a 64-byte Ed25519 signature, got {len(signature)} bytes",
        )
        return None
    if key_id(public) != keyid:
        result.add("malformed_signature", f"{SIGNATURE_NAME}: the public key is not {keyid}")
        return None
    return keyid, signature, public


def _check_listing(statement: dict, entries: list[Entry], result: Verification) -> dict:
    """name -> sha256 of the manifest's subjects, after comparing names and sizes."""
    listed: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for subject in statement["subject"]:
        name = subject.get("name") if isinstance(subject, dict) else None
        digest = (subject.get("digest") or {}).get("sha256") if isinstance(subject, dict) else None
        if not isinstance(name, str) or not is_safe_name(name) or not isinstance(digest, str):
            result.add(
                "path_escape",
                f"the manifest names {name!r}, which is not a path inside the model directory",
            )
            continue
        listed[name] = digest
        sizes[name] = (subject.get("annotations") or {}).get("size", -1)
    present = {entry.name: entry.size for entry in entries if entry.kind == "file"}
    for name in sorted(listed.keys() - present.keys()):
        result.add("missing_file", f"{name} is in the manifest but not in the directory")
    for name in sorted(present.keys() - listed.keys()):
        result.add("extra_file", f"{name} is in the directory but not in the manifest")
    for name in sorted(listed.keys() & present.keys()):
        if sizes[name] != present[name]:
            result.add(
                "size_mismatch", f"{name}: {present[name]} bytes, the manifest says {sizes[name]}"
            )
    return {name: digest for name, digest in listed.items() if name in present}
