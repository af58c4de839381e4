"""`python manage.py bench batches`: a batch on the bulk lane beside an interactive client.

One embedded server (uvicorn, the engine in-process, its batch runner on). An interactive
client of one tenant streams chat completions one after another, first alone (the baseline),
then while another tenant's batch of `--lines` lines runs on the same engine. Printed: the
interactive client's latency p50/p95 alone and under the batch and their ratio, and the
batch's throughput in lines per second (its first line taken to its last answered). The last
line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import httpx
import openai
from django.conf import settings

from routing.batch_models import Batch
from routing.bench.processes import AsgiServer
from routing.bench.serving import _pct
from tenants.models import Agent, Scope, Tenant
from tenants.services.keys import api_key_create, api_key_revoke
from tenants.services.tenancy import agent_create, tenant_create
from workers.models import ServedModel
from workers.serving.registration import model_register

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench-tiny"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench batches",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lines", type=int, default=2000, help="lines in the batch (2000)")
    p.add_argument("--requests", type=int, default=40, help="interactive requests per phase")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens each answer (16)")
    p.add_argument("--in-flight", type=int, default=8, help="FAIRLANE_BATCH_IN_FLIGHT (8)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    p.add_argument(
        "--bulk-beside",
        type=int,
        default=None,
        help="FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE for the server (default: its own; "
        "0: no cap, as before the bulk lane gave way)",
    )
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "batches.json")
    return p.parse_args(argv)


def _key(slug: str):
    tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(
        name=f"Benchmarks {slug}", slug=slug, owner=None
    )
    agent = Agent.objects.filter(tenant=tenant, name="bench").first() or agent_create(
        tenant=tenant, name="bench"
    )
    return api_key_create(
        tenant=tenant, agent=agent, name="bench batches", scopes=[Scope.INFERENCE]
    )


async def _interactive(url: str, key: str, num: int, max_tokens: int) -> list[float]:
    """One streaming client, request after request: each one's whole latency (seconds)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me something."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    latencies = []
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        for _ in range(num):
            start = time.perf_counter()
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for _line in response.aiter_lines():
                    pass
            latencies.append(time.perf_counter() - start)
    return latencies


def _batch_input(lines: int, max_tokens: int) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Summarise item {i}."}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        )
        + "\n"
        for i in range(lines)
    ).encode()


def _measure(args, url: str, interactive_key: str, batch_key: str) -> dict:
    asyncio.run(_interactive(url, interactive_key, 2, args.max_tokens))  # the model loaded
    alone = asyncio.run(_interactive(url, interactive_key, args.requests, args.max_tokens))
    client = openai.OpenAI(api_key=batch_key, base_url=url + "/v1", max_retries=2)
    uploaded = client.files.create(
        file=("bench.jsonl", io.BytesIO(_batch_input(args.lines, args.max_tokens))),
        purpose="batch",
    )
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.2)
    under = asyncio.run(_interactive(url, interactive_key, args.requests, args.max_tokens))
    answered_during = client.batches.retrieve(batch.id).request_counts.completed
    while (done := client.batches.retrieve(batch.id)).status not in (
        "completed",
        "failed",
        "expired",
        "cancelled",
    ):
        time.sleep(0.5)
    row = Batch.objects.get(pk=batch.id)  # the database's times, finer than the API's seconds
    seconds = ((row.finalizing_at or row.completed_at) - row.in_progress_at).total_seconds()
    return {
        "alone_p50_ms": 1000 * _pct(alone, 0.5),
        "alone_p95_ms": 1000 * _pct(alone, 0.95),
        "under_batch_p50_ms": 1000 * _pct(under, 0.5),
        "under_batch_p95_ms": 1000 * _pct(under, 0.95),
        "p95_ratio_under_over_alone": _pct(under, 0.95) / _pct(alone, 0.95),
        "batch_status": done.status,
        "batch_completed": done.request_counts.completed,
        "batch_failed": done.request_counts.failed,
        "batch_lines_during_interactive": answered_during,
        "batch_seconds": seconds,
        "batch_lines_per_s": done.request_counts.completed / seconds,
    }


def run(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    model_register(name=MODEL, source="preset:tiny", description="bench batches")
    ServedModel.objects.filter(name=MODEL).update(is_enabled=True)
    interactive, interactive_plain = _key("bench")
    batcher, batcher_plain = _key("bench-batch")
    bulk_beside = (
        {}
        if args.bulk_beside is None
        else {"FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE": str(args.bulk_beside)}
    )
    with tempfile.TemporaryDirectory() as files:
        server = AsgiServer(
            {
                **os.environ,
                "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
                "DJANGO_SETTINGS_MODULE": "settings",
                "FAIRLANE_ENGINE_MODE": "embedded",
                "FAIRLANE_ENGINE_THREADS": str(args.threads),
                "FAIRLANE_FILES_DIR": files,
                "FAIRLANE_BATCH_IN_FLIGHT": str(args.in_flight),
                "FAIRLANE_BATCH_POLL_SECONDS": "0.2",
                "LOG_LEVEL": "WARNING",
                **bulk_beside,
            }
        )
        try:
            figures = _measure(args, server.url, interactive_plain, batcher_plain)
        finally:
            server.stop()
            api_key_revoke(key=interactive)
            api_key_revoke(key=batcher)
            ServedModel.objects.filter(name=MODEL).update(is_enabled=False)
    result = {
        "bench": "batches",
        "lines": args.lines,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "in_flight": args.in_flight,
        "threads": args.threads,
        "bulk_beside": bulk_beside.get(
            "FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE",
            str(settings.FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE),
        ),
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()},
    }
    print(
        f"batches bench: {args.lines} lines on tiny beside one interactive streaming client "
        f"(bulk sequences beside interactive: {result['bulk_beside']}, 0: no cap)"
    )
    print(
        f"  interactive p95 alone {result['alone_p95_ms']:.1f} ms, under the batch "
        f"{result['under_batch_p95_ms']:.1f} ms (x{result['p95_ratio_under_over_alone']:.2f})"
    )
    print(
        f"  batch: {result['batch_completed']} lines in {result['batch_seconds']:.1f} s, "
        f"{result['batch_lines_per_s']:.1f} lines/s ({result['batch_status']})"
    )
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
