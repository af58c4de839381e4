"""Every third-party module that runtime code imports comes from a distribution that
requirements.txt declares, or that something it declares requires. `make run` installs
requirements.txt only, so an import satisfied by a test extra works in the suite and breaks
the first command a new user runs (numpy did exactly that)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("platform", "tenants", "routing", "workers")
# Development tools that runtime code never imports (an import-linter contract checks that):
# the benchmarks, whose baselines may need the test extras.
NOT_RUNTIME = ("routing/bench", "workers/bench", "workers/engine/bench")


def runtime_files() -> list[Path]:
    files = []
    for top in RUNTIME:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(NOT_RUNTIME):
                files.append(path)
    return files


def local_names() -> set[str]:
    """Our own top-level modules: the apps, and platform/'s modules (a source root)."""
    apps = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    return apps | {p.stem for p in (ROOT / "platform").glob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every absolute import, lazy ones inside functions included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def requirement_lines(path: Path) -> list[Requirement]:
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs.append(Requirement(line))
    return reqs


def closure(requirements: list[Requirement]) -> set[str]:
    """The declared distributions and, through installed metadata, everything they require
    (with the extras asked for, under this interpreter's markers)."""
    seen: set[str] = set()
    todo = [(req, frozenset(req.extras)) for req in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = name + "[" + ",".join(sorted(extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for spec in requires:
            child = Requirement(spec)
            environments = [{**default_environment(), "extra": e} for e in extras or {""}]
            if child.marker is None or any(child.marker.evaluate(env) for env in environments):
                todo.append((child, frozenset(child.extras)))
    return {k for k in seen if "[" not in k}


def undeclared_imports(requirements: list[Requirement]) -> dict[str, list[str]]:
    """{module: [files]} for third-party imports no declared distribution provides."""
    declared = closure(requirements)
    optional = {canonicalize_name(r.name) for r in requirement_lines(ROOT / "requirements-gpu.txt")}
    providers = metadata.packages_distributions()
    ours = local_names()
    problems: dict[str, list[str]] = {}
    for path in runtime_files():
        for module in imported_modules(path):
            if module in sys.stdlib_module_names or module in ours or module == "__future__":
                continue
            dists = {canonicalize_name(d) for d in providers.get(module, [])}
            if dists & (declared | optional):
                continue
            problems.setdefault(module, []).append(path.relative_to(ROOT).as_posix())
    return problems


def test_every_runtime_import_is_declared_in_requirements_txt():
    problems = undeclared_imports(requirement_lines(ROOT / "requirements.txt"))
    assert not problems, (
        "runtime code imports modules that requirements.txt does not provide (add the "
        f"distribution, pinned): {problems}"
    )


def test_the_check_fails_when_a_runtime_dependency_is_removed():
    """The check has teeth: without numpy's line, numpy's importers are named."""
    requirements = [
        r
        for r in requirement_lines(ROOT / "requirements.txt")
        if canonicalize_name(r.name) != "numpy"
    ]
    problems = undeclared_imports(requirements)
    assert "numpy" in problems
    assert any(f.startswith(("routing/", "workers/")) for f in problems["numpy"])


def test_requirements_are_pinned():
    """`==` pins only: a range lets a fresh clone install something CI never ran (and an
    unpinned torch pulls gigabytes of CUDA wheels)."""
    for name in ("requirements.txt", "requirements-test.txt", "requirements-gpu.txt"):
        for req in requirement_lines(ROOT / name):
            assert re.fullmatch(r"==[^,]+", str(req.specifier)), f"{name}: {req} is not pinned"
