"""`python manage.py bench gateway`: Fairlane as a gateway under concurrent load, beside the
upstream alone and (with --litellm VENV) LiteLLM's proxy, in the same run on the same machine.

One lean OpenAI-format upstream (routing/bench/upstream.py, its own process) answers every chat
completion at once with 16 tokens. Fairlane runs in its distributed configuration (PostgreSQL,
Redis, uvicorn with uvloop and httptools, `--api-workers` processes; a comma list measures
each count) with an openai_compatible backend for the upstream and a budget that never runs
out, so every request is still held against its budgets before it is sent and settled after.
LiteLLM (a peer, not a dependency: `python -m venv V && V/bin/pip install 'litellm[proxy]'`)
runs its proxy with 2 workers and no database (so it meters nothing).

For each client count, the modes (JSON, stream and the other front doors) and the targets take
turns, round after round, so drift on a shared machine hits all of them alike; the median
round is reported. Closed-loop clients hold
keep-alive connections (routing/bench/loadgen.py). Printed: requests/s, p50/p99 latency and the
latency added over the upstream alone, TTFT for streams, CPU per request of each server's
processes, the ratios Fairlane/LiteLLM and N/1 API processes, and whether Fairlane's ledger
equals what the upstream served. The last line is one JSON object (also under bench-results/).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from django.conf import settings

from routing.bench.loadgen import Target, load
from routing.bench.processes import Process, free_port
from routing.bench.sysstat import Sample

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench-gateway"
BACKEND = "bench-gateway-upstream"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--clients", default="1,16,64", help="client counts (comma list)")
    p.add_argument(
        "--modes",
        default="json,stream",
        help="json, stream (chat completions), messages, messages-stream, responses, "
        "responses-stream (the same requests through /v1/messages or /v1/responses, "
        "Fairlane only); a comma list",
    )
    p.add_argument("--api-workers", default="2", help="Fairlane API processes (comma list)")
    p.add_argument("--litellm", type=Path, default=None, help="a venv with litellm[proxy]")
    p.add_argument(
        "--baseline",
        default=None,
        help="a commit of this repository (checked out in a temporary `git worktree`, removed "
        "at the end) or another checkout's directory, run beside this one with each "
        "--api-workers count: before/after",
    )
    p.add_argument(
        "--passthrough",
        action="store_true",
        help="also a bare uvicorn + aiohttp pass-through with each --api-workers count "
        "(routing/bench/passthrough.py): the ceiling on this machine",
    )
    p.add_argument(
        "--budgets",
        default="",
        help="a comma list of budget counts (1-4): for each, a tenant of its own whose "
        "requests are held on that many budgets (the tenant's, then the agent's, the API "
        "key's and one for the benchmark's model), measured as target fairlane-bN-<procs>",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per round")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per setting and target")
    p.add_argument("--tokens", type=int, default=16, help="tokens in every answer")
    p.add_argument("--quick", action="store_true", help="1 round of 3 s: a smoke test only")
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "gateway.json")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.rounds = 3.0, 1.0, 1
    args.clients = [int(c) for c in args.clients.split(",")]
    args.modes = args.modes.split(",")
    args.api_workers = [int(n) for n in args.api_workers.split(",")]
    args.budgets = [int(n) for n in args.budgets.split(",") if n]
    if any(not 1 <= n <= 4 for n in args.budgets):
        p.error("--budgets takes counts from 1 to 4")
    return args


def _require_distributed() -> None:
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        sys.exit(
            "bench gateway measures the distributed configuration: set DATABASE_URL to "
            "PostgreSQL and REDIS_URL (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/"
            "fairlane REDIS_URL=redis://127.0.0.1:6379/0)"
        )


def _wait_ready(url: str, process: Process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if process.proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited:\n{process.output()[-3000:]}")
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer:\n{process.output()[-3000:]}")


def _env(**extra) -> dict:
    import os

    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "settings",
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def budgeted_caller(slug: str, budgets: tuple[str, ...] = ("tenant", "agent")):
    """A bench tenant, agent and key (revoked afterwards) whose requests are held on
    `budgets` (of tenant, agent, api_key, model: MODEL's), each never running out."""
    from tenants.models import Agent, Budget, Scope, Tenant
    from tenants.services.budgets import budget_create
    from tenants.services.keys import api_key_create
    from tenants.services.tenancy import agent_create, tenant_create

    tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(
        name=f"Benchmarks ({slug})", slug=slug, owner=None
    )
    agent = Agent.objects.filter(tenant=tenant, name="bench-gateway").first() or agent_create(
        tenant=tenant, name="bench-gateway"
    )
    key, plain = api_key_create(
        tenant=tenant, agent=agent, name="bench gateway", scopes=[Scope.INFERENCE]
    )
    owners = {
        "tenant": {},
        "agent": {"agent": agent},
        "api_key": {"api_key": key},
        "model": {"model_names": [MODEL]},
    }
    for scope in budgets:
        owner = Budget(tenant=tenant, **owners[scope])
        if not Budget.objects.filter(tenant=tenant, owner_key=owner.owner_key_of()).exists():
            budget_create(tenant=tenant, limit_microcents=10**15, **owners[scope])
    return tenant, agent, key, plain


def fairlane_setup(upstream_url: str):
    """A bench tenant, agent, key (revoked afterwards), budgets that never run out, and an
    openai_compatible backend for the upstream serving MODEL (upstream name via-fairlane)."""
    from routing.backend_store import backend_model_set, backend_register

    tenant, agent, key, plain = budgeted_caller("bench")
    backend = backend_register(
        name=BACKEND, kind="openai_compatible", base_url=upstream_url, credential="sk-bench"
    )
    backend_model_set(
        backend=backend,
        model=MODEL,
        upstream_name="via-fairlane",
        price_input_per_mtok=10_000_000,
        price_output_per_mtok=40_000_000,
    )
    return tenant, agent, key, plain


def litellm_start(venv: Path, upstream_url: str, workdir: Path) -> tuple[Process, int, str]:
    """LiteLLM's proxy with 2 workers and no database; clients authenticate with its master
    key (it refuses to start without one), checked in memory."""
    import secrets

    master = "sk-" + secrets.token_urlsafe(24)
    config = workdir / "litellm.yaml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": "openai/via-litellm",
                            "api_base": upstream_url + "/v1",
                            "api_key": "sk-bench",
                        },
                    }
                ],
                "litellm_settings": {"drop_params": True},
                "general_settings": {"master_key": master},
            }
        )
    )
    port = free_port()
    process = Process(
        [
            str(venv / "bin" / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "2",
            # uvicorn kills a worker that takes over 5 s to start; LiteLLM's import
            # takes longer than that on a busy 2-core machine
            "--timeout_worker_healthcheck",
            "120",
        ],
        {
            k: v
            for k, v in _env(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR").items()
            # no database: LiteLLM would use ours (and meter into it)
            if k not in ("DATABASE_URL", "REDIS_URL")
        },
        "bench-litellm",
    )
    _wait_ready(f"http://127.0.0.1:{port}/health/liveliness", process, timeout=180)
    return process, port, master


@contextlib.contextmanager
def baseline_checkout(spec: str | None) -> Iterator[Path | None]:
    """The --baseline's code: a directory as it is, or a commit checked out (detached) in a
    temporary worktree of this repository for the run."""
    if spec is None or Path(spec).is_dir():
        yield Path(spec).resolve() if spec else None
        return
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(f"--baseline {spec}: neither a directory nor a commit of this repository")
    commit = found.stdout.strip()
    parent = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    checkout = parent / commit[:12]
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", "--quiet", str(checkout), commit], check=True)
    try:
        yield checkout
    finally:
        subprocess.run([*git, "remove", "--force", str(checkout)], check=False)
        shutil.rmtree(parent, ignore_errors=True)


def fairlane_start(workers: int, checkout: Path = ROOT) -> tuple[Process, int]:
    """uvicorn serving `checkout` (this one, or a --baseline), with this process's secret key
    so that both read the same API keys and credentials."""
    port = free_port()
    env = _env(
        FAIRLANE_ENGINE_MODE="distributed",
        SECRET_KEY=settings.SECRET_KEY,
        PYTHONPATH=f"{checkout}:{checkout / 'platform'}",
    )
    process = Process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--lifespan",
            "off",
            "--no-access-log",
            "--log-level",
            "warning",
            "--timeout-worker-healthcheck",
            "120",
        ],
        env,
        f"bench-{'fairlane' if checkout == ROOT else 'baseline'}-{workers}",
        cwd=checkout,
    )
    _wait_ready(f"http://127.0.0.1:{port}/healthz", process)
    return process, port


def passthrough_start(workers: int, upstream_url: str) -> tuple[Process, int]:
    port = free_port()
    process = Process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "routing.bench.passthrough:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--lifespan",
            "off",
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        _env(UPSTREAM=upstream_url),
        f"bench-passthrough-{workers}",
    )
    _wait_ready(f"http://127.0.0.1:{port}/v1/models", process)
    return process, port


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000, 2)


def _api(mode: str) -> str:
    return mode.removesuffix("-stream") if mode.startswith(("messages", "responses")) else "chat"


def measure(targets: dict[str, tuple[Target, Process | None]], args) -> list[dict]:
    """Per client count, every mode and target takes its turn round after round (so a phase
    of a shared machine falls on all of them alike: the front doors' ratios to chat compare
    like with like); each row is the median round."""
    rows = []
    for clients in args.clients:
        serving = {  # only this checkout of Fairlane speaks /v1/messages and /v1/responses
            mode: {
                name: pair
                for name, pair in targets.items()
                if _api(mode) == "chat" or name.startswith("fairlane")
            }
            for mode in args.modes
        }
        rounds: dict[tuple[str, str], list[dict]] = {
            (mode, name): [] for mode in args.modes for name in serving[mode]
        }
        for _ in range(args.rounds):
            for mode in args.modes:
                for name, (target, process) in serving[mode].items():
                    result, seconds, (start, end) = load(
                        target,
                        clients=clients,
                        stream=mode.endswith("stream"),
                        api=_api(mode),
                        seconds=args.seconds,
                        warmup=args.warmup,
                        probe=functools.partial(Sample.take, process),
                    )
                    rounds[mode, name].append(
                        {
                            "rps": result.completed / seconds,
                            "errors": result.errors,
                            "p50_ms": _pct(result.latencies, 0.5),
                            "p99_ms": _pct(result.latencies, 0.99),
                            "ttft_p50_ms": _pct(result.ttfts, 0.5),
                            **start.until(end, result.completed),
                            "error_samples": result.error_samples,
                        }
                    )
        for mode in args.modes:
            for name in serving[mode]:
                runs = rounds[mode, name]
                median = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
                rows.append(
                    {
                        "target": name,
                        "clients": clients,
                        "mode": mode,
                        **{k: (round(v, 1) if k == "rps" else v) for k, v in median.items()},
                        "rps_rounds": [round(r["rps"], 1) for r in runs],
                        "cpu_rounds": [r["cpu_ms_per_request"] for r in runs],
                    }
                )
            _print_setting(rows[-len(serving[mode]) :])
    return rows


def _print_setting(rows: list[dict]) -> None:
    direct = next((r for r in rows if r["target"] == "direct"), None)
    for r in rows:
        added = ""
        if direct and r is not direct and r["p50_ms"] is not None and direct["p50_ms"] is not None:
            key = "ttft_p50_ms" if r["mode"].endswith("stream") else "p50_ms"
            if r[key] is not None and direct[key] is not None:
                r["added_p50_ms"] = round(r[key] - direct[key], 2)
                added = (
                    f" added {'TTFT ' if r['mode'].endswith('stream') else ''}p50 "
                    f"{r['added_p50_ms']} ms"
                )
        print(
            f"{r['mode']:6} {r['clients']:3} clients  {r['target']:12} {r['rps']:8.1f} req/s  "
            f"p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  TTFT p50 {r['ttft_p50_ms']} ms"
            f"{added}  cpu/req {r['cpu_ms_per_request']} ms "
            f"(db+redis {r['db_redis_cpu_ms_per_request']}, "
            f"db transactions/req {r.get('db_xacts_per_request')}, "
            f"load {r['loadgen_cpu_ms_per_request']})  machine busy {r['machine_busy_pct']} % "
            f"(stolen {r['machine_stolen_pct']} %)  errors {r['errors']}  "
            f"rounds {r['rps_rounds']}",
            flush=True,
        )


def ratios(rows: list[dict], workers: list[int]) -> dict:
    out = {}
    by = {(r["target"], r["clients"], r["mode"]): r for r in rows}
    for (target, clients, mode), row in by.items():
        if target.startswith("passthrough-") and target != "passthrough-1":
            one = by.get(("passthrough-1", clients, mode))
            if one and one["rps"]:
                out[f"{target}/passthrough-1 {mode} {clients}"] = round(row["rps"] / one["rps"], 2)
        if not target.startswith("fairlane"):
            continue
        if mode.startswith(("messages", "responses")):  # a front door's CPU per request over chat's
            chat = by.get((target, clients, "stream" if mode.endswith("stream") else "json"))
            if chat and (paired := _paired_ratio(row, chat)) is not None:
                out[f"{target} {mode}/chat cpu per request {clients}"] = paired
        peer = by.get(("litellm", clients, mode))
        if peer and peer["rps"]:
            out[f"{target}/litellm {mode} {clients}"] = round(row["rps"] / peer["rps"], 2)
        if target.startswith("fairlane-b") and not target.startswith("fairlane-b1-"):
            one_budget = by.get(("fairlane-b1-" + target.rsplit("-", 1)[1], clients, mode))
            if one_budget and one_budget["rps"]:
                out[f"{target}/fairlane-b1 {mode} {clients}"] = round(
                    row["rps"] / one_budget["rps"], 2
                )
                # Each round's ratio (the two ran next to each other), then their median.
                paired = sorted(
                    mine / theirs
                    for mine, theirs in zip(
                        row["rps_rounds"], one_budget["rps_rounds"], strict=False
                    )
                    if theirs
                )
                if paired:
                    out[f"{target}/fairlane-b1 paired {mode} {clients}"] = round(
                        paired[len(paired) // 2], 3
                    )
        before = by.get((target.replace("fairlane", "baseline"), clients, mode))
        if before and before["rps"]:
            out[f"{target}/baseline {mode} {clients}"] = round(row["rps"] / before["rps"], 2)
        one = by.get(("fairlane-1", clients, mode))
        if one and one["rps"] and target != "fairlane-1":
            out[f"{target}/fairlane-1 {mode} {clients}"] = round(row["rps"] / one["rps"], 2)
            if clients > 1:  # a lone client never fills a process: no ceiling for it
                most = rps_ceiling(
                    row, by.get(("direct", clients, mode)), processes=int(target.rsplit("-", 1)[1])
                )
                if most is not None:
                    out[f"{target}/fairlane-1 ceiling {mode} {clients}"] = round(
                        most / one["rps"], 2
                    )
    return out


def _paired_ratio(row: dict, chat: dict) -> float | None:
    """The median over rounds of the front door's CPU per request over chat's in the same
    round (adjacent in time: a drift of the machine cancels out of each ratio)."""
    pairs = sorted(
        mine / theirs
        for mine, theirs in zip(row.get("cpu_rounds", []), chat.get("cpu_rounds", []), strict=False)
        if mine and theirs
    )
    return round(pairs[len(pairs) // 2], 3) if pairs else None


def rps_ceiling(
    row: dict, direct: dict | None, *, processes: int, cores: int | None = None
) -> float | None:
    """The most requests/s `processes` API processes could serve on this machine at the CPU
    per request measured in `row`: each process at most one core (the GIL), and all of them
    together at most the cores the host left (less its stolen share) after what every request
    also costs PostgreSQL and Redis, the load generator and the upstream (its CPU per request
    when called directly, `direct`). Set against one process's requests/s, it says how far a
    second process can lift a gateway on this machine at all: on 2 cores shared with the
    database and the load, less than 2x however the gateway is built."""
    api = row.get("cpu_ms_per_request") or 0
    if api <= 0:
        return None
    others = (
        (row.get("db_redis_cpu_ms_per_request") or 0)
        + (row.get("loadgen_cpu_ms_per_request") or 0)
        + ((direct or {}).get("cpu_ms_per_request") or 0)
    )
    cores = cores or os.cpu_count() or 1
    free = cores * (1 - (row.get("machine_stolen_pct") or 0) / 100)
    return min(processes * 1000 / api, free * 1000 / (api + others))


def ledger_check(agents, since, upstream_url: str) -> dict:
    """Fairlane's ledger for this run against what the upstream served through Fairlane."""
    from django.db.models import Count, Sum

    from tenants.models import Reservation, UsageRecord

    time.sleep(2)  # settlements of the last answers
    served = (
        httpx.get(upstream_url + "/stats", timeout=10).json()["by_model"].get("via-fairlane", {})
    )
    ledger = UsageRecord.objects.filter(agent__in=agents, created_at__gte=since).aggregate(
        rows=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    held = Reservation.objects.filter(agent__in=agents, status="held").count()
    return {
        "upstream_requests": served.get("requests", 0),
        "ledger_rows": ledger["rows"],
        "upstream_prompt_tokens": served.get("prompt_tokens", 0),
        "ledger_prompt_tokens": ledger["prompt"] or 0,
        "upstream_completion_tokens": served.get("completion_tokens", 0),
        "ledger_completion_tokens": ledger["completion"] or 0,
        "reservations_held": held,
    }


def run(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    _require_distributed()
    with baseline_checkout(args.baseline) as baseline:
        return _run(args, baseline)


def _run(args: argparse.Namespace, baseline: Path | None) -> dict:
    from django.utils import timezone

    from routing.models import Backend
    from tenants.services.keys import api_key_revoke

    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    started: list[Process] = []
    up_port = free_port()
    upstream = Process(
        [
            sys.executable,
            "-m",
            "routing.bench.upstream",
            "--port",
            str(up_port),
            "--tokens",
            str(args.tokens),
        ],
        _env(),
        "bench-upstream",
    )
    started.append(upstream)
    upstream_url = f"http://127.0.0.1:{up_port}"
    keys = []
    try:
        _wait_ready(upstream_url + "/v1/models", upstream)
        tenant, agent, key, plain = fairlane_setup(upstream_url)
        keys.append(key)
        scopes = ("tenant", "agent", "api_key", "model")
        budgeted = {n: budgeted_caller(f"bench-b{n}", scopes[:n]) for n in args.budgets}
        keys += [k for _, _, k, _ in budgeted.values()]
        targets = {
            "direct": (Target("direct", "127.0.0.1", up_port, "sk-bench", "fake-model"), upstream)
        }
        if args.litellm:
            process, port, master = litellm_start(args.litellm, upstream_url, workdir)
            started.append(process)
            targets["litellm"] = (Target("litellm", "127.0.0.1", port, master, MODEL), process)
        for n in args.api_workers if args.passthrough else ():
            process, port = passthrough_start(n, upstream_url)
            started.append(process)
            targets[f"passthrough-{n}"] = (
                Target(f"passthrough-{n}", "127.0.0.1", port, "sk-bench", "fake-model"),
                process,
            )
        for n in args.api_workers if baseline else ():
            process, port = fairlane_start(n, baseline)
            started.append(process)
            targets[f"baseline-{n}"] = (
                Target(f"baseline-{n}", "127.0.0.1", port, plain, MODEL),
                process,
            )
        for n in args.api_workers:
            process, port = fairlane_start(n)
            started.append(process)
            targets[f"fairlane-{n}"] = (
                Target(f"fairlane-{n}", "127.0.0.1", port, plain, MODEL),
                process,
            )
            for count, (_, _, _, budgeted_plain) in budgeted.items():
                targets[f"fairlane-b{count}-{n}"] = (
                    Target(f"fairlane-b{count}-{n}", "127.0.0.1", port, budgeted_plain, MODEL),
                    process,
                )
        since = timezone.now()
        httpx.post(upstream_url + "/stats/reset", timeout=10)
        print(
            f"bench gateway: {args.rounds} round(s) of {args.seconds:g} s (+{args.warmup:g} s "
            f"warm-up) per target and setting; targets {list(targets)}",
            flush=True,
        )
        rows = measure(targets, args)
        figures = {
            "bench": "gateway",
            "rows": rows,
            "ratios": ratios(rows, args.api_workers),
            "ledger": ledger_check(
                [agent, *(a for _, a, _, _ in budgeted.values())], since, upstream_url
            ),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
    finally:
        for process in reversed(started):
            process.stop()
        for key in keys:
            api_key_revoke(key=key)
        Backend.objects.filter(name=BACKEND).delete()
    for name, value in figures["ratios"].items():
        print(f"ratio {name}: {value}")
    ledger = figures["ledger"]
    exact = (
        ledger["ledger_rows"] == ledger["upstream_requests"]
        and ledger["ledger_prompt_tokens"] == ledger["upstream_prompt_tokens"]
        and ledger["ledger_completion_tokens"] == ledger["upstream_completion_tokens"]
    )
    figures["ledger"]["exact"] = exact
    print(
        f"ledger: {ledger['ledger_rows']} rows for {ledger['upstream_requests']} upstream "
        f"requests; completion tokens {ledger['ledger_completion_tokens']} vs "
        f"{ledger['upstream_completion_tokens']} served; {'exact' if exact else 'MISMATCH'}"
    )
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(figures, indent=1))
    print(
        json.dumps(
            {k: v for k, v in figures.items() if k != "rows"}
            | {"summary": {f"{r['target']} {r['mode']} {r['clients']}": r["rps"] for r in rows}}
        )
    )
    return figures


if __name__ == "__main__":
    run(sys.argv[1:])
