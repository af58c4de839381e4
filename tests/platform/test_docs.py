"""The docs site (docs/, mkdocs.yml): every setting the code reads from the environment is in
docs/configuration.md, and the built site draws its Mermaid diagrams without fetching anything
from outside itself. `make docs` (run by `make test`) builds it in strict mode, which fails on
broken links and anchors."""

import ast
import functools
import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.conftest import ROOT
from tests.platform.test_dependencies import requirement_lines

CONFIGURATION = ROOT / "docs" / "configuration.md"
# Every Python file of the project but the tests: runtime code, commands and the benchmarks.
CODE = [
    *(ROOT / "manage.py",),
    *(
        p
        for top in ("platform", "tenants", "routing", "workers")
        for p in sorted((ROOT / top).rglob("*.py"))
    ),
]
READERS = {"env_int", "env_bool", "env_list", "getenv"}
# Reads whose variable is named at run time, not in the code: none of them is a setting.
DYNAMIC = {
    # a provider credential given as a reference, `env:NAME`, names its own variable
    "ref.removeprefix(ENV_PREFIX)",
    # a single sign-on provider's settings are named by its id: FAIRLANE_OIDC_<ID>_ISSUER...
    "prefix + key",
}


def _is_environ(node: ast.AST) -> bool:
    """`os.environ` or a bare `environ`."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _read_name_node(node: ast.AST) -> ast.AST | None:
    """The node that names the variable if `node` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in READERS or (name == "get" and _is_environ(getattr(func, "value", None))):
            return node.args[0]
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and _is_environ(node.value)
    ):
        return node.slice
    return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _parameters_around(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    """Names of the parameters of the functions that enclose `node`."""
    names: set[str] = set()
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            names |= {
                a.arg
                for a in [
                    *args.posonlyargs,
                    *args.args,
                    *args.kwonlyargs,
                    *filter(None, [args.vararg, args.kwarg]),
                ]
            }
    return names


def env_reads_in(source: str) -> tuple[set[str], set[str]]:
    """(variables the source reads by name, the expressions of reads it names at run time).
    A module constant holding the name counts as the name; a helper's own parameter does not
    count at all (its callers are read instead)."""
    tree = ast.parse(source)
    parents = _parents(tree)
    constants = {
        target.id: stmt.value.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }
    names: set[str] = set()
    dynamic: set[str] = set()
    for node in ast.walk(tree):
        arg = _read_name_node(node)
        if arg is None:
            continue
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            names.add(constants[arg.id])
        elif isinstance(arg, ast.Name) and arg.id in _parameters_around(node, parents):
            continue
        else:
            dynamic.add(ast.unparse(arg))
    return names, dynamic


@functools.cache
def code_env_reads() -> tuple[frozenset[str], dict[str, list[str]]]:
    """({variable}, {dynamic read: [files]}) over the whole code."""
    names: set[str] = set()
    dynamic: dict[str, list[str]] = {}
    for path in CODE:
        found, unnamed = env_reads_in(path.read_text())
        names |= found
        for expression in unnamed:
            dynamic.setdefault(expression, []).append(path.relative_to(ROOT).as_posix())
    return frozenset(names), dynamic


def documented(text: str) -> set[str]:
    """Variables listed in the first column of the tables of a docs page."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("|"):
            first = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", first))
    return names


def undocumented(text: str) -> list[str]:
    names, _ = code_env_reads()
    return sorted(names - documented(text))


def test_every_setting_the_code_reads_is_in_the_configuration_page():
    missing = undocumented(CONFIGURATION.read_text())
    assert not missing, (
        f"the code reads these environment variables, but docs/configuration.md does not list "
        f"them (add a row with the default and what it means): {missing}"
    )


def test_the_code_reads_every_fairlane_setting_the_configuration_page_lists():
    names, _ = code_env_reads()
    stale = sorted(
        n
        for n in documented(CONFIGURATION.read_text())
        if n.startswith("FAIRLANE_") and n not in names
    )
    assert not stale, f"docs/configuration.md lists settings no code reads: {stale}"


def test_every_read_the_check_cannot_name_is_a_known_one():
    _, dynamic = code_env_reads()
    unknown = {expr: files for expr, files in dynamic.items() if expr not in DYNAMIC}
    assert not unknown, (
        f"these environment reads name their variable at run time, so the check cannot see "
        f"whether it is documented: name it in the code, or add it to DYNAMIC with why: {unknown}"
    )


def test_the_check_finds_a_setting_missing_from_the_page():
    """It has teeth: a row removed from the page, or a new read in the code, is named."""
    text = CONFIGURATION.read_text()
    without = "\n".join(
        line for line in text.splitlines() if not line.startswith("| `FAIRLANE_RETRIES`")
    )
    assert undocumented(without) == ["FAIRLANE_RETRIES"]
    source = (
        "import os\nfrom environment import env_int\nNAME = 'FAIRLANE_C'\n"
        "A = env_int('FAIRLANE_A', 1)\nB = os.environ.get('FAIRLANE_B', '')\n"
        "C = os.environ[NAME]\nD = os.getenv('FAIRLANE_D')\n"
        "def helper(name):\n    return os.environ.get(name)\n"
        "E = os.environ.get(f'FAIRLANE_{A}')\n"
    )
    assert env_reads_in(source) == (
        {"FAIRLANE_A", "FAIRLANE_B", "FAIRLANE_C", "FAIRLANE_D"},
        {"f'FAIRLANE_{A}'"},
    )
    assert not documented(text) >= {"FAIRLANE_A", "FAIRLANE_B"}


def test_the_docs_requirements_are_pinned():
    requirements = requirement_lines(ROOT / "requirements-docs.txt")
    assert {r.name for r in requirements} >= {"mkdocs", "mkdocs-material"}
    for req in requirements:
        assert re.fullmatch(r"==[^,]+", str(req.specifier)), f"{req} is not pinned"


def test_make_docs_fails_on_a_link_to_no_page(tmp_path):
    """`make docs`, with the Makefile's own flags, on a copy of the docs: it builds, and a link
    to a page that does not exist fails it (mkdocs' --quiet once hid every warning from the
    count that --strict fails on)."""
    dry = subprocess.run(
        ["make", "-n", "docs"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    words = shlex.split(next(line for line in dry.stdout.splitlines() if "mkdocs build" in line))
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    command = [sys.executable, *words[1:]]
    for name in ("mkdocs.yml", "README.md", "workers/engine/README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")

    def build() -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)

    assert build().returncode == 0
    with (tmp_path / "docs" / "testing.md").open("a") as page:
        page.write("\n[a page that is not there](nowhere.md)\n")
    broken = build()
    assert broken.returncode != 0 and "nowhere.md" in broken.stderr + broken.stdout


# --- the built site, in a browser --------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The site built in strict mode and served over HTTP on 127.0.0.1: its base URL."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_site_draws_its_diagram_and_searches_without_fetching_from_outside(site, browser):
    page = browser.new_page()
    outside: list[str] = []

    def route(request_route):
        if urlsplit(request_route.request.url).hostname == "127.0.0.1":
            request_route.continue_()
        else:
            outside.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.goto(f"{site}/architecture/")
    # Material swaps each <pre class="mermaid"> for a <div class="mermaid"> holding the drawing
    # (in a closed shadow root) once Mermaid has rendered it; a diagram that fails stays a <pre>.
    try:
        page.locator("div.mermaid").first.wait_for(state="attached", timeout=15_000)
    except PlaywrightTimeout:
        pytest.fail(f"the diagram was not drawn (requests refused outside the site: {outside})")
    assert page.locator("pre.mermaid").count() == 0, "a diagram was left undrawn"
    # The same diagram, drawn again by the page's Mermaid to read what it drew.
    source = re.search(r"```mermaid\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]
    svg = page.evaluate("async code => (await mermaid.render('check', code)).svg", source)
    for label in ("admission", "fair queue", "GPU workers", "remote backends", "usage ledger"):
        assert label in svg, f"{label!r} not drawn"
    page.goto(f"{site}/")
    page.get_by_role("link", name="Configuration").first.click()
    page.wait_for_url(f"{site}/configuration/")
    # Search runs on the index built into the site, in a worker: Material queries on a key
    # release, and again with the typed text once the worker has loaded its index.
    hit = page.locator(".md-search-result__item")
    page.get_by_role("textbox", name="Search").press_sequentially("brownout")
    try:
        hit.first.wait_for(timeout=15_000)
    except PlaywrightTimeout:
        pytest.fail(f"search found nothing (refused outside the site: {outside})")
    # Any page may rank first (the benchmarks name the brownout too); the section that
    # explains it must be among the results.
    expect(page.locator(".md-search-result__list")).to_contain_text("Brownout")
    assert outside == [], f"the site fetched from outside itself: {outside}"
    page.close()
