"""Files under load while the API process is SIGKILLed and started again and PostgreSQL's
sessions are terminated: 6 clients upload files of 64-256 KiB (and delete some) the whole time.
After it, and after the orphan sweep: every upload a client saw answered is there with its
exact bytes, every delete a client saw answered is gone, every listed file's bytes are there,
the storage holds exactly the bytes the rows name (what a kill left between writing the bytes
and committing the row is swept), and the sweep leaves alone what is too young or not ours."""

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from django.conf import settings
from django.db import connections

from tests.chaos.load import api_restarted, clients_run, until
from tests.chaos.services import Database
from tests.conftest import ROOT, child_env
from tests.routing.conftest import key, tiny  # noqa: F401
from tests.servers import AsgiServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLIENTS = 6


def _content(name: str, size: int) -> bytes:
    line = b'{"custom_id": "%s", "pad": "%s"}\n' % (name.encode(), b"x" * 200)
    return (line * (size // len(line) + 1))[:size]


def _stored(files_dir) -> set[str]:
    return {
        str(path.relative_to(files_dir)) for path in files_dir.rglob("*.jsonl") if path.is_file()
    }


def test_files_hold_through_a_killed_api_process_and_killed_sessions(key, tenant, tmp_path):  # noqa: F811
    connections.close_all()
    db = Database(settings.DATABASES["default"]["NAME"])
    files_dir = tmp_path / "files"
    env = child_env(
        DATABASE_URL=db.url,
        FAIRLANE_ENGINE_MODE="embedded",
        FAIRLANE_FILES_DIR=str(files_dir),
        FAIRLANE_DB_POOL_TIMEOUT_SECONDS="5",
    )
    servers = [AsgiServer(env)]
    headers = {"Authorization": f"Bearer {key}"}
    uploaded: dict[str, str] = {}  # file id -> sha256 of the bytes, from the 200s clients saw
    deleted: set[str] = set()  # file ids a 200 to DELETE named
    # Deletes whose answer was lost (the process killed under it) or a 503 (a session cut
    # as it committed): either outcome is right, but it must be whole.
    unsure: set[str] = set()
    failures: list[httpx.Response] = []
    killed = []
    try:

        async def request(http: httpx.AsyncClient, n: int, i: int) -> None:
            url = f"{servers[-1].url}/v1/files"
            data = _content(f"c{n}-{i}", (64 + (n * 37 + i * 53) % 192) * 1024)
            answer = await http.post(
                url,
                headers=headers,
                data={"purpose": "user_data"},
                files={"file": (f"c{n}-{i}.jsonl", data)},
            )
            if answer.status_code != 200:
                failures.append(answer)
                return
            file_id = answer.json()["id"]
            uploaded[file_id] = hashlib.sha256(data).hexdigest()
            if i % 3 == 2:
                unsure.add(file_id)
                answer = await http.delete(f"{url}/{file_id}", headers=headers)
                if answer.status_code == 200:
                    deleted.add(file_id)
                    unsure.discard(file_id)
                else:
                    failures.append(answer)

        async def scenario() -> None:
            stop = asyncio.Event()
            load = asyncio.ensure_future(clients_run(CLIENTS, request, stop))
            await until(lambda: len(uploaded) >= 15, 60, "files uploaded")
            killed.append(await asyncio.to_thread(db.terminate_connections))
            mark = len(uploaded)
            await until(lambda: len(uploaded) >= mark + 15, 60, "files uploaded after the kill")
            await api_restarted(servers, env)  # killed mid-upload, as it may be
            mark = len(uploaded)
            await until(lambda: len(uploaded) >= mark + 15, 60, "files uploaded after the restart")
            stop.set()
            await load

        asyncio.run(scenario())
        assert sum(killed) > 0 and servers[0].proc.wait(timeout=10) == -signal.SIGKILL
        for answer in failures:  # a session cut under a request: 503, nothing else
            assert answer.status_code == 503, (answer.status_code, answer.text)
            assert answer.headers["retry-after"]

        # What a kill leaves between writing a file's bytes and committing its row, made
        # here as it would be: an hour-old object no row names, besides a young one (an
        # upload whose row is about to commit) and a name that is not ours.
        tenant_dir = files_dir / str(tenant.pk)
        old, young, foreign = (
            tenant_dir / "file-orphan-old.jsonl",
            tenant_dir / "file-orphan-young.jsonl",
            files_dir / "operator-notes.txt",
        )
        for path in (old, young, foreign):
            path.write_bytes(b"{}\n")
        an_hour_ago = time.time() - 3700
        os.utime(old, (an_hour_ago, an_hour_ago))

        def sweep(*args: str) -> None:
            swept = subprocess.run(
                [sys.executable, "manage.py", "files_orphans_sweep", *args],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert swept.returncode == 0, swept.stderr[-2000:]

        sweep()
        assert not old.exists() and young.exists() and foreign.exists()
        young.unlink()

        rows = dict(db.query("SELECT id, storage_name FROM routing_storedfile"))
        # Every byte stored is a row's (whatever the kill left was swept, as an hour later),
        # and every row's bytes are stored.
        sweep("--older-than", "0")
        assert _stored(files_dir) == set(rows.values())
        assert foreign.exists()

        with httpx.Client(base_url=servers[-1].url, headers=headers, timeout=30) as http:
            for file_id, digest in uploaded.items():
                answer = http.get(f"/v1/files/{file_id}/content")
                if file_id in deleted or (file_id in unsure and answer.status_code == 404):
                    assert answer.status_code == 404, file_id
                    assert file_id not in rows  # its row went with its bytes
                else:
                    assert answer.status_code == 200, (file_id, answer.text)
                    assert hashlib.sha256(answer.content).hexdigest() == digest, file_id
            listed = http.get("/v1/files", params={"limit": 10_000}).json()["data"]
            assert {f["id"] for f in listed} == set(rows)
            assert set(uploaded) - deleted - unsure <= set(rows)
    finally:
        for server in servers:
            server.stop()
        db.drop()
