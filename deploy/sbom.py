"""Write a CycloneDX SBOM (JSON) of Fairlane's runtime environment: what requirements.txt
installs, with everything it pulls in, at the versions installed in this environment.

cyclonedx-py (cyclonedx-bom, a test extra) describes the whole environment; development tools
installed beside the runtime (pytest, transformers, ...) are then dropped by walking the
requirements' dependency closure (extras included) from requirements.txt.

    python deploy/sbom.py [-o var/sbom.cdx.json]     (make sbom)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path = ROOT / "requirements.txt") -> list[Requirement]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def closure(roots: list[Requirement]) -> set[str]:
    """Canonical names of the installed distributions the roots need, extras followed."""
    wanted: dict[str, set[str]] = {}
    queue = [(r.name, set(r.extras)) for r in roots]
    while queue:
        name, extras = queue.pop()
        key = canonicalize_name(name)
        if key in wanted and extras <= wanted[key]:
            continue
        wanted.setdefault(key, set()).update(extras)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a marker excluded it here (another platform's dependency)
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(
                req.marker.evaluate({"extra": e}) for e in (wanted[key] or {""})
            ):
                queue.append((req.name, set(req.extras)))
    return {name for name in wanted if _installed(name)}


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _version() -> str:
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "0+unknown"


def sbom_build() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "env.cdx.json"
        # --no-validate: this raw BOM of the whole venv is not what is written (it is cut to
        # the runtime closure below); validating it cost ~30 s of CPU in lark's IRI grammar.
        # tests/deploy/test_sbom.py validates the BOM that is written, against the schema.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cyclonedx_py",
                "environment",
                sys.executable,
                "--output-reproducible",
                "--spec-version",
                "1.6",
                "--no-validate",
                "-o",
                str(raw),
            ],
            check=True,
        )
        bom = json.loads(raw.read_text())
    runtime = closure(pins())
    keep = [c for c in bom["components"] if canonicalize_name(c["name"]) in runtime]
    refs = {c["bom-ref"] for c in keep}
    root_refs = sorted(
        c["bom-ref"]
        for c in keep
        if canonicalize_name(c["name"]) in {canonicalize_name(p.name) for p in pins()}
    )
    bom["components"] = keep
    bom["dependencies"] = [{"ref": "fairlane", "dependsOn": root_refs}] + [
        {"ref": d["ref"], "dependsOn": [r for r in d.get("dependsOn", []) if r in refs]}
        for d in bom["dependencies"]
        if d["ref"] in refs
    ]
    bom["metadata"]["component"] = {
        "type": "application",
        "bom-ref": "fairlane",
        "name": "fairlane",
        "version": _version(),
    }
    return bom


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(ROOT / "var" / "sbom.cdx.json"))
    args = parser.parse_args()
    bom = sbom_build()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bom, indent=2, sort_keys=True) + "\n")
    print(
        f"wrote {out}: {len(bom['components'])} runtime components (CycloneDX {bom['specVersion']})"
    )


if __name__ == "__main__":
    main()
