"""The deploy files work, proven without Docker (no engine on this machine): every file the
Dockerfile copies or installs exists, and each docker-compose service's command, run as a
plain process against the local PostgreSQL and Redis with the compose environment, does its
job: migrate migrates, the API serves /readyz, the worker hosts the enabled model and answers
a request through the API, and beat starts its schedule."""

from __future__ import annotations

import re
import shlex
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import child_env, workers_live
from tests.routing.conftest import PRICES
from tests.servers import Process, free_port
from workers.serving.registration import model_register

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def build_context() -> Path:
    return (DEPLOY / COMPOSE["x-fairlane"]["build"]["context"]).resolve()


def test_every_file_the_dockerfile_copies_or_installs_exists():
    context = build_context()
    assert context == ROOT
    assert (
        context / COMPOSE["x-fairlane"]["build"]["dockerfile"]
    ).resolve() == DEPLOY / "Dockerfile"
    checked = 0
    for instruction, args in dockerfile_instructions():
        if instruction in ("COPY", "ADD"):
            *sources, _ = [a for a in shlex.split(args) if not a.startswith("--")]
            for source in sources:
                assert (context / source).exists(), f"{instruction} {source}: no such file"
                checked += 1
        if instruction == "RUN":
            for name in re.findall(r"-r\s+(\S+)", args):
                assert (context / name).exists(), f"RUN installs {name}: no such file"
                checked += 1
    # Any requirements file the Dockerfile mentions (comments included) exists.
    for name in set(re.findall(r"requirements[\w-]*\.txt", DOCKERFILE)):
        assert (context / name).exists(), f"the Dockerfile refers to {name}, which is missing"
    assert checked >= 2
    ignored = (context / ".dockerignore").read_text().split()
    assert {".venv", ".git", "var"} <= set(ignored), "the image would copy the virtualenv"


def _interpolate(value: str, environ: dict) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""

    def one(match: re.Match) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if environ.get(name):
            return environ[name]
        if op == ":?":
            raise AssertionError(f"compose needs {name}: {arg}")
        return arg or ""

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, value)


def compose_env(service: str, *, test_env: dict) -> dict:
    """The service's compose environment, with the database and Redis pointed at the test's,
    and the image's ENV (its /app is this checkout, its /data a temporary folder)."""
    from django.conf import settings

    spec = COMPOSE["services"][service]
    env = dict(test_env)
    # The operator's shell sets SECRET_KEY (compose refuses to start without it); ours is the
    # test process's, so the keys it creates verify in the services.
    for key, value in spec.get("environment", {}).items():
        env[key] = _interpolate(str(value), {"SECRET_KEY": settings.SECRET_KEY})
    for instruction, args in dockerfile_instructions():
        if instruction == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                env[key] = value.replace("/app", str(ROOT))
    env.update(DATABASE_URL=test_env["DATABASE_URL"], REDIS_URL=test_env["REDIS_URL"])
    return env


def service_command(service: str) -> list[str]:
    spec = COMPOSE["services"][service]
    if "command" in spec:
        return list(spec["command"])
    cmd = dict(dockerfile_instructions())["CMD"]
    return list(yaml.safe_load(cmd))  # the exec form is a JSON (so YAML) array


@pytest.fixture
def deploy_env(transactional_db, tmp_path):
    env = child_env(
        FAIRLANE_HEARTBEAT_SECONDS="1", FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-"
    )
    for leaked in ("FAIRLANE_ENGINE_MODE", "FAIRLANE_WORKER_MODELS"):
        env.pop(leaked, None)
    # Beat's first due task comes after one interval: make it one second.
    env["FAIRLANE_HEALTH_INTERVAL_SECONDS"] = "1"
    return env


def start(service: str, env: dict, *, replace: dict | None = None) -> Process:
    command = [replace.get(a, a) if replace else a for a in service_command(service)]
    assert command[0] == "python"
    command[0] = __import__("sys").executable
    return Process(command, env, f"compose-{service}")


def test_compose_migrate_and_api_commands_do_their_jobs(deploy_env, tmp_path):
    migrate = start(
        "migrate",
        compose_env("migrate", test_env=deploy_env) | {"FAIRLANE_DATA_DIR": str(tmp_path)},
    )
    assert migrate.proc.wait(timeout=120) == 0, migrate.output()
    migrate.log.close()

    port = free_port()
    api = start(
        "api",
        compose_env("api", test_env=deploy_env) | {"FAIRLANE_DATA_DIR": str(tmp_path)},
        replace={"0.0.0.0": "127.0.0.1", "8000": str(port)},
    )
    try:
        ready = _wait_http(f"http://127.0.0.1:{port}/readyz", api)
        assert ready.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}
    finally:
        api.stop()


def test_compose_worker_hosts_the_model_and_serves_a_request_through_the_api(
    deploy_env, tmp_path, tenant, agent
):
    from tenants.models import Scope
    from tenants.services.keys import api_key_create

    model_register(name="tiny", source="preset:tiny", **PRICES)
    key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    env = compose_env("worker", test_env=deploy_env) | {"FAIRLANE_DATA_DIR": str(tmp_path)}
    worker = start("worker", env)
    port = free_port()
    api = start(
        "api",
        compose_env("api", test_env=deploy_env) | {"FAIRLANE_DATA_DIR": str(tmp_path)},
        replace={"0.0.0.0": "127.0.0.1", "8000": str(port)},
    )
    try:
        deadline = time.monotonic() + 120  # the worker's start-up: load the model, heartbeat
        while not any("tiny" in w["models"] for w in workers_live()):
            assert time.monotonic() < deadline, worker.output()[-3000:]
            assert worker.proc.poll() is None, worker.output()[-3000:]
            time.sleep(0.5)
        _wait_http(f"http://127.0.0.1:{port}/readyz", api)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
        assert answer.headers["x-fairlane-backend"]  # the local pool: no remote is registered
    finally:
        api.stop()
        worker.stop()


def test_compose_beat_command_starts_its_schedule(deploy_env, tmp_path):
    env = compose_env("beat", test_env=deploy_env) | {"FAIRLANE_DATA_DIR": str(tmp_path)}
    beat = start("beat", env, replace={"/tmp/celerybeat-schedule": str(tmp_path / "schedule")})
    try:
        beat.wait_for("beat: Starting...", timeout=60)
        beat.wait_for("Scheduler: Sending due task", timeout=60)
        assert (tmp_path / "schedule").exists() or list(tmp_path.glob("schedule*"))
    finally:
        beat.stop()


def _wait_http(url: str, process: Process, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == 200:
                return response
        except httpx.HTTPError:
            pass
        assert process.proc.poll() is None, process.output()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{url} never answered 200:\n{process.output()[-3000:]}")
