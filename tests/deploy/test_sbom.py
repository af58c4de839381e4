"""`make sbom` writes a valid CycloneDX SBOM of the runtime environment that lists every pin of
requirements.txt at its pinned version, and no development tool."""

import json
import os
import subprocess

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packaging.utils import canonicalize_name

from deploy.sbom import ROOT, pins


@pytest.fixture(scope="module")
def sbom(tmp_path_factory):
    out = tmp_path_factory.mktemp("sbom") / "fairlane.cdx.json"
    done = subprocess.run(
        ["make", "-s", "sbom", f"SBOM={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_text()


def test_the_sbom_is_valid_cyclonedx(sbom):
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    bom = json.loads(sbom)
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6")
    assert bom["metadata"]["component"]["name"] == "fairlane"


def test_every_pin_is_listed_at_its_pinned_version(sbom):
    components = {canonicalize_name(c["name"]): c for c in json.loads(sbom)["components"]}
    assert {"torch", "django", "celery", "cryptography"} <= components.keys()
    for pin in pins():
        component = components.get(canonicalize_name(pin.name))
        assert component, f"{pin.name} is missing from the SBOM"
        # torch is the CPU build: 2.13.0+cpu satisfies ==2.13.0 (PEP 440 local versions)
        assert pin.specifier.contains(component["version"]), (pin, component["version"])
        assert component["purl"].startswith(f"pkg:pypi/{canonicalize_name(pin.name)}@")
    assert components["torch"]["version"].startswith("2.13.0")


def test_only_the_runtime_closure_is_listed(sbom):
    bom = json.loads(sbom)
    names = {canonicalize_name(c["name"]) for c in bom["components"]}
    assert names.isdisjoint({"pytest", "transformers", "openai", "playwright", "cyclonedx-bom"})
    assert {"psycopg-binary", "psycopg-pool", "uvloop", "sqlparse"} <= names  # extras, deps
    root = next(d for d in bom["dependencies"] if d["ref"] == "fairlane")
    assert len(root["dependsOn"]) == len(pins())
