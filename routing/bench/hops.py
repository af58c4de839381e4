"""`python manage.py bench hops`: how many of our functions one chat completion passes through,
counted rather than read off the code.

One non-streamed chat completion is sent in-process (httpx's ASGI transport -> the ASGI app ->
Django -> admission -> the walk -> the embedded engine, and its answer back). A profile hook
on every thread notes the stack of our own frames (platform/, routing/, tenants/, workers/;
not the engine's insides, not libraries) at four points of the request's path:

  admit    the budget reservation (tenants.services.budgets.budget_reserve)
  engine   the request handed to the engine (AsyncEngine.submit)
  answer   a token coming back from the engine (workers.run_loops._token_event)
  settle   the charge written (workers.serving.outbox.Outbox.settle)

A hop is one of our functions on one of those stacks; the figure is their union (each counted
once), with the files they live in and the threads the path crossed. Run it in two checkouts
to compare. The last line printed is one JSON object.

`--distributed` counts the distributed mode (REDIS_URL and PostgreSQL): the API's side and a
GPU worker's, whose pull, run and heartbeat threads are started in this process (a worker is
the same code in its own process), with two more points: `enqueue` (the job put on the fair
queue, workers.dispatch.QueueDispatcher._enqueue) and `receive` (an event read back from the
worker's stream, workers.serving.events.event_decode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
OURS = tuple(str(ROOT / d) + "/" for d in ("platform", "routing", "tenants", "workers"))
NOT_PATH = ("/bench/", "/management/")
ENGINE_INSIDE = str(ROOT / "workers" / "engine") + "/"
PROBES = {
    ("budget_reserve", "tenants/services/budgets.py"): "admit",
    ("submit", "workers/engine/async_engine.py"): "engine",
    ("_token_event", "workers/runs.py"): "answer",
    ("settle", "workers/serving/outbox.py"): "settle",
    ("_enqueue", "workers/dispatch.py"): "enqueue",
    ("event_decode", "workers/serving/events.py"): "receive",
}
POINTS = ("admit", "enqueue", "engine", "answer", "receive", "settle")


def _ours(filename: str) -> bool:
    return filename.startswith(OURS) and not any(part in filename for part in NOT_PATH)


def _stack(frame) -> list[tuple[str, str]]:
    """Our frames from the outermost in, engine internals folded into their entry point."""
    found = []
    while frame is not None:
        name = frame.f_code.co_filename
        if _ours(name) and (not name.startswith(ENGINE_INSIDE) or name.endswith("async_engine.py")):
            found.append((str(Path(name).relative_to(ROOT)), frame.f_code.co_qualname))
        frame = frame.f_back
    return found[::-1]


class Recorder:
    def __init__(self) -> None:
        self.stacks: dict[str, list[tuple[str, str]]] = {}
        self.threads: dict[str, str] = {}

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        for (func, suffix), point in PROBES.items():
            if code.co_name == func and code.co_filename.endswith(suffix):  # the last one
                self.stacks[point] = _stack(frame)
                self.threads[point] = threading.current_thread().name


async def _one(model: str, key: str, recorder: Recorder) -> int:
    from asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Count the hops."}],
            "max_tokens": 4,
        }
        # From the first request on, so that every thread it starts is profiled too.
        threading.setprofile(recorder)
        sys.setprofile(recorder)
        try:
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            await asyncio.sleep(1.0)  # the settlement runs after the answer
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        if response.status_code != 200:
            raise SystemExit(f"the request failed: {response.status_code} {response.text}")
        return response.status_code


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench hops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="the distributed mode: the API's side and a GPU worker's",
    )
    args = p.parse_args(argv)
    from django.conf import settings

    from routing.bench.serving import _setup
    from routing.runtimes import runtime_build, runtime_install
    from workers.worker import worker_services_start

    if args.distributed:
        if not settings.REDIS_URL:
            raise SystemExit("bench hops --distributed needs REDIS_URL (and PostgreSQL)")
        settings.FAIRLANE_WORKER_MODELS = ["bench-tiny"]
    # The API's runtime, which hosts the GPU worker's engines too in the distributed mode.
    runtime = runtime_install(
        runtime_build("distributed" if args.distributed else "embedded", engines=args.distributed)
    )
    model, key, api_key = _setup("tiny")
    recorder = Recorder()
    threading.setprofile(recorder)  # the worker's threads, started next, are profiled too
    services = worker_services_start(runtime) if args.distributed else None
    try:
        status = asyncio.run(_one(model, key, recorder))
    finally:
        from tenants.services.keys import api_key_revoke

        api_key_revoke(key=api_key)
        if services is not None:
            services.puller.stop(drain_timeout=10)
            services.stop()
    hops: dict[tuple[str, str], None] = {}
    for point in POINTS:
        if point not in recorder.stacks and point in ("enqueue", "receive"):
            continue  # the embedded mode has no queue between them
        stack = recorder.stacks.get(point, [])
        print(f"{point} ({recorder.threads.get(point, '-')}): {len(stack)} frames")
        for file, func in stack:
            print(f"    {file}:{func}")
            hops.setdefault((file, func), None)
    files = sorted({file for file, _ in hops})
    threads = sorted(set(recorder.threads.values()))
    print(f"status {status}: {len(hops)} hops in {len(files)} files, threads {', '.join(threads)}")
    print(
        json.dumps(
            {
                "mode": "distributed" if args.distributed else "embedded",
                "status": status,
                "hops": len(hops),
                "files": len(files),
                "threads": len(threads),
                "per_point": {p: len(s) for p, s in recorder.stacks.items()},
            }
        )
    )
