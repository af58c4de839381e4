"""The audit chain under load while PostgreSQL's sessions are terminated and the API process is
SIGKILLed and started again: 8 clients create agents and change them through the management
API the whole time. After it, the chain verifies end to end (`audit_verify`), every agent that
exists has exactly one creation record and no record names an agent that does not exist (a
change and its record commit together or not at all), each agent's last update record holds
its present description, every 201 a client saw is in the database, and a request whose
session was cut was answered 503 with Retry-After."""

import asyncio
import signal
import subprocess
import sys
import uuid

import httpx
import pytest
from django.conf import settings
from django.db import connections

from tests.chaos.load import api_restarted, clients_run, until
from tests.chaos.services import Database
from tests.conftest import ROOT, child_env
from tests.servers import AsgiServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLIENTS = 8


def test_the_audit_chain_holds_through_killed_sessions_and_a_killed_api_process(tenant, api_key):
    connections.close_all()
    db = Database(settings.DATABASES["default"]["NAME"])
    env = child_env(
        DATABASE_URL=db.url,
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_DB_POOL_TIMEOUT_SECONDS="5",
    )
    before = {row[0] for row in db.query("SELECT id FROM tenants_agent")}
    servers = [AsgiServer(env)]
    headers = {"Authorization": f"Bearer {api_key[1]}"}
    created: dict[str, str] = {}  # name -> id, from the 201s clients saw
    described: dict[str, str] = {}  # id -> the description a 200 to its PATCH set
    failures: list[httpx.Response] = []  # every answer but a 2xx
    killed = []
    try:

        async def request(http: httpx.AsyncClient, n: int, i: int) -> None:
            base = f"{servers[-1].url}/api/tenants/{tenant.slug}/agents/"
            name = f"c{n}-{i}"
            answer = await http.post(base, json={"name": name}, headers=headers)
            if answer.status_code != 201:
                failures.append(answer)
                return
            agent_id = created[name] = answer.json()["id"]
            if i % 2:
                text = f"changed by {name}"
                answer = await http.patch(
                    f"{base}{agent_id}/", json={"description": text}, headers=headers
                )
                if answer.status_code == 200:
                    described[agent_id] = text
                else:
                    failures.append(answer)

        async def scenario() -> None:
            stop = asyncio.Event()
            load = asyncio.ensure_future(clients_run(CLIENTS, request, stop))
            await until(lambda: len(created) >= 20, 60, "agents created")
            for _ in range(2):
                killed.append(await asyncio.to_thread(db.terminate_connections))
                await asyncio.sleep(0.5)
            mark = len(created)
            await until(lambda: len(created) >= mark + 20, 60, "agents created after the kills")
            await api_restarted(servers, env)  # killed mid-transaction, as it may be
            killed.append(await asyncio.to_thread(db.terminate_connections))
            mark = len(created)
            await until(lambda: len(created) >= mark + 30, 60, "agents created after the restart")
            stop.set()
            await load

        asyncio.run(scenario())

        assert sum(killed) > 0, killed  # sessions of ours were really terminated
        assert servers[0].proc.wait(timeout=10) == -signal.SIGKILL
        # A session cut under a request: 503 in the API's error shape, with Retry-After
        # (nothing changed; a retry helps), never a 4xx or a bare 500.
        for answer in failures:
            assert answer.status_code == 503, (answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "service_unavailable"
            assert answer.headers["retry-after"] == "2"

        agents = {
            str(agent_id): (name, description)
            for agent_id, name, description in db.query(
                "SELECT id, name, description FROM tenants_agent"
            )
            if agent_id not in before
        }
        assert {name: agent_id for agent_id, (name, _) in agents.items()}.items() >= (
            created.items()
        )  # every 201 a client saw is in the database
        records = db.query(
            "SELECT action, object_id, after FROM tenants_auditrecord "
            "WHERE object_type = 'agent' AND tenant_id = %s ORDER BY seq",
            tenant.pk,
        )
        creations = [object_id for action, object_id, _ in records if action == "agent.create"]
        ours = [object_id for object_id in creations if object_id not in {str(b) for b in before}]
        assert sorted(ours) == sorted(agents), "a creation without its record, or the reverse"
        last_update = {
            object_id: after
            for action, object_id, after in records
            if action == "agent.update" and object_id in agents
        }
        for agent_id, (_, description) in agents.items():
            if description:
                assert last_update[agent_id]["description"] == description, agent_id
            else:
                assert agent_id not in last_update, agent_id
        for agent_id, text in described.items():  # every 200 to a PATCH is in the database
            assert agents[agent_id][1] == text

        verified = subprocess.run(
            [sys.executable, "manage.py", "audit_verify"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        for server in servers:
            server.stop()
        db.drop()
