"""The import graph (grimp, which import-linter is built on): no module of any package imports
itself round a cycle, and no import hides inside a function to dodge one. Besides this, the
contracts in pyproject.toml (`lint-imports`, run by `make test`) keep the layers, the shared
spine below the GPU worker, and platform/ above the apps."""

import ast
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT

PACKAGES = ("tenants", "routing", "workers")
PLATFORM = ROOT / "platform"
# Imports that must happen inside a function: Django's app loading (an AppConfig's ready(),
# and Celery's signals, which run before Django is set up in a worker), prometheus_client's
# multiprocess mode (read from the environment when the module is first imported), libraries
# loaded only when turned on (OpenTelemetry's SDK, vLLM), and torch where the API process
# never needs it.
LAZY_ALLOWED = {
    "tenants/apps.py",
    "routing/apps.py",
    "workers/apps.py",
    "platform/celery_app.py",
    "platform/metrics_export.py",
    "workers/serving/trace.py",
}
LAZY_LIBRARIES = ("vllm", "torch", "opentelemetry", "transformers", "matplotlib")


def module_cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_package_has_an_import_cycle():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert module_cycles(graph, set(graph.modules)) == []


def test_the_cycle_check_finds_a_cycle_that_is_added(tmp_path, monkeypatch):
    package = tmp_path / "cyclic_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic_pkg import b\n")
    (package / "b.py").write_text("def f():\n    from cyclic_pkg import c\n")  # hidden: still seen
    (package / "c.py").write_text("import cyclic_pkg.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_pkg", cache_dir=None)
    assert module_cycles(graph, set(graph.modules)) == [
        ["cyclic_pkg.a", "cyclic_pkg.b", "cyclic_pkg.c"]
    ]


def _platform_imports() -> dict[str, set[str]]:
    ours = {p.stem for p in PLATFORM.glob("*.py")}
    found = {}
    for path in PLATFORM.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        names |= {
            node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        }
        found[path.stem] = names & ours
    return found


def test_platforms_modules_import_each_other_without_a_cycle():
    imports = _platform_imports()
    for start in imports:
        seen, todo = set(), list(imports[start])
        while todo:
            module = todo.pop()
            assert module != start, f"platform/{start}.py imports itself round a cycle"
            if module not in seen:
                seen.add(module)
                todo.extend(imports.get(module, ()))


def _hidden_imports(path: Path) -> list[str]:
    """Imports inside functions, other than of the lazily loaded libraries."""
    tree = ast.parse(path.read_text())
    hidden = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            hidden += [
                f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                for name in names
                if not name.startswith(LAZY_LIBRARIES)
            ]
    return hidden


@pytest.mark.parametrize("top", [*PACKAGES, "platform"])
def test_runtime_code_hides_no_import_inside_a_function(top):
    hidden = []
    for path in sorted((ROOT / top).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative in LAZY_ALLOWED or "/bench/" in relative or "/migrations/" in relative:
            continue
        hidden += _hidden_imports(path)
    assert hidden == [], "\n".join(hidden)
