"""Request logs (opt-in per tenant): nothing is kept while they are off (checked in the
database); when on, each request's prompt and answer are kept beside its ledger row, redacted
and encrypted at rest, streamed requests too; retention deletes them; only the tenant's admins
read them; deleting them all is one audited action."""

import json
import time
from datetime import timedelta

import pytest
from celery import current_app
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from routing.backend_store import agent_routing_set
from tenants.models import RequestLog, RequestLogPolicy, Role, UsageRecord
from tenants.services.request_logs import (
    Redaction,
    content_open,
    content_redact,
    image_hash,
    request_log_policy_set,
    request_log_write,
    request_logs_expire,
    request_logs_known_off,
)
from tests.governance.conftest import last_record
from tests.governance.test_audit_integrity import consume
from tests.routing.conftest import fakes, key, tiny  # noqa: F401  (fixtures)
from tests.routing.test_routing import chat, register, streamed
from tests.routing.test_websocket import application  # noqa: F401  (fixture: embedded)

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_KEY_TEXT = "sk-proj-" + "A1b2C3d4" * 5
PROMPT = f"Mail ana@example.com, card 4111 1111 1111 1111, my key is {SECRET_KEY_TEXT}"


def logs_on(tenant, **choices):
    defaults = {"retention_days": 7, "redact_emails": True, "redact_numbers": False}
    return request_log_policy_set(tenant=tenant, enabled=True, **{**defaults, **choices})


def wait_for_logs(count: int, deadline: float = 10.0) -> list[RequestLog]:
    """The write follows the answer (a tracked task): poll for it."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        logs = list(RequestLog.objects.order_by("pk"))
        if len(logs) >= count:
            return logs
        time.sleep(0.05)
    raise AssertionError(f"expected {count} request logs, found {RequestLog.objects.count()}")


def table_rows() -> int:
    """The table itself, read with SQL (no manager, no filter in between)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM tenants_requestlog")
        return cursor.fetchone()[0]


def raw_content(request_id: str) -> bytes:
    with connection.cursor() as cursor:
        cursor.execute("SELECT content FROM tenants_requestlog WHERE request_id = %s", [request_id])
        return bytes(cursor.fetchone()[0])


@pytest.fixture
def backend(fakes, agent):  # noqa: F811
    fake = fakes("openai", reply_tokens=5)
    register("remote", fake)
    agent_routing_set(agent=agent, chain=["remote"])
    return fake


async def test_off_by_default_nothing_is_stored(key, agent, backend, tenant):  # noqa: F811
    response = await chat(key, content=PROMPT)
    assert response.status_code == 200, response.content
    payloads = await streamed(await chat(key, stream=True, content=PROMPT))
    assert payloads[-1] == "[DONE]"

    def settled():
        end = time.monotonic() + 10
        while UsageRecord.objects.count() < 2 and time.monotonic() < end:
            time.sleep(0.05)
        return UsageRecord.objects.count()

    assert await database_sync_to_async(settled)() == 2
    assert await database_sync_to_async(table_rows)() == 0


async def test_on_stores_redacted_encrypted_content_beside_the_ledger_row(
    key,  # noqa: F811
    agent,
    backend,
    tenant,
):
    await database_sync_to_async(logs_on)(tenant, redact_numbers=True)
    response = await chat(key, content=PROMPT)
    assert response.status_code == 200, response.content
    [log] = await database_sync_to_async(wait_for_logs)(1)
    row = await database_sync_to_async(UsageRecord.objects.get)(request_id=log.request_id)
    assert row.tenant_id == log.tenant_id == tenant.pk and log.endpoint == "chat"

    content = content_open(log.content)
    [message] = content["messages"]
    assert message["role"] == "user"
    text = message["content"]
    assert SECRET_KEY_TEXT not in text and "[REDACTED:secret]" in text
    assert "ana@example.com" not in text and "[REDACTED:email]" in text
    assert "4111" not in text and "[REDACTED:number]" in text
    assert content["output"] == [{"index": 0, "text": "t0 t1 t2 t3 t4 ", "finish_reason": "stop"}]
    assert content["status"] == UsageRecord.Status.OK

    raw = await database_sync_to_async(raw_content)(log.request_id)
    assert b"t0 t1" not in raw and b"messages" not in raw and b"REDACTED" not in raw
    assert Fernet  # the column is a Fernet token, opened only with the configured key
    assert raw.startswith(b"gAAAAA")


async def test_streamed_requests_are_logged_with_their_finish_reason(
    key,  # noqa: F811
    agent,
    backend,
    tenant,
):
    await database_sync_to_async(logs_on)(tenant)
    payloads = await streamed(await chat(key, stream=True, content="hello there"))
    assert payloads[-1] == "[DONE]"
    [log] = await database_sync_to_async(wait_for_logs)(1)
    content = content_open(log.content)
    assert content["messages"] == [{"role": "user", "content": "hello there"}]
    assert content["output"][0]["text"] == "t0 t1 t2 t3 t4 "
    assert content["output"][0]["finish_reason"] == "stop"


async def test_turning_logs_off_stops_storage_at_once(key, agent, backend, tenant):  # noqa: F811
    await database_sync_to_async(logs_on)(tenant)
    await chat(key)
    await database_sync_to_async(wait_for_logs)(1)
    await database_sync_to_async(request_log_policy_set)(
        tenant=tenant, enabled=False, retention_days=7, redact_emails=True, redact_numbers=False
    )
    await chat(key)

    def settled_twice():
        end = time.monotonic() + 10
        while UsageRecord.objects.count() < 2 and time.monotonic() < end:
            time.sleep(0.05)

    await database_sync_to_async(settled_twice)()
    assert await database_sync_to_async(RequestLog.objects.count)() == 1


def test_retention_deletes_logs_past_their_tenants_days(tenant, other_tenant):
    logs_on(tenant, retention_days=7)
    logs_on(other_tenant, retention_days=30)
    now = timezone.now()
    for t, request_id, age in (
        (tenant, "old", 8),
        (tenant, "young", 6),
        (other_tenant, "other-old", 8),
        (other_tenant, "other-ancient", 31),
    ):
        assert request_log_write(
            tenant_id=t.pk,
            request_id=request_id,
            endpoint="chat",
            model="m",
            content={"messages": []},
            now=now - timedelta(days=age),
        )
    assert request_logs_expire(now=now) == 2
    assert set(RequestLog.objects.values_list("request_id", flat=True)) == {"young", "other-old"}
    call_command("request_logs_expire")  # the same, as a command: nothing more is due
    assert RequestLog.objects.count() == 2


def test_redaction_keeps_the_shape_and_hashes_images():
    png = "data:image/png;base64,iVBORw0KGgo="
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "password: hunter2hunter2 call +49 170 1234567"},
                {"type": "image_url", "image_url": {"url": png}},
            ],
        }
    ]
    kept = content_redact(messages, Redaction(emails=False, numbers=False))
    assert kept[0]["content"][0]["text"] == "password: [REDACTED:secret] call +49 170 1234567"
    assert kept[0]["content"][1] == {"type": "image_url", "image_sha256": image_hash(png)}
    assert png not in json.dumps(kept)
    numbers = content_redact("call +49 170 1234567 in 2026", Redaction(numbers=True))
    assert numbers == "call [REDACTED:number] in 2026"


def _stored(tenant, request_id="req-1"):
    logs_on(tenant)
    request_log_write(
        tenant_id=tenant.pk,
        request_id=request_id,
        endpoint="chat",
        model="m",
        content={"messages": [{"role": "user", "content": "the plans"}], "output": []},
    )


def test_admins_read_and_export_their_own_tenants_logs_only(
    portal_as, tenant, other_tenant, member_of
):
    _stored(tenant)
    _stored(other_tenant, "req-other")
    client, _ = portal_as(Role.ADMIN)
    page = client.get("/portal/t/acme/request-logs/")
    assert page.status_code == 200 and b"req-1" in page.content and b"req-other" not in page.content
    detail = client.get("/portal/t/acme/request-logs/req-1/")
    assert detail.status_code == 200 and b"the plans" in detail.content
    assert client.get("/portal/t/acme/request-logs/req-other/").status_code == 404
    assert client.get("/portal/t/globex/request-logs/req-other/").status_code == 404
    export = client.get("/portal/t/acme/request-logs.jsonl")
    lines = [json.loads(line) for line in consume(export).splitlines()]
    assert [line["request_id"] for line in lines] == ["req-1"]
    assert lines[0]["messages"][0]["content"] == "the plans"

    member, _ = portal_as(Role.MEMBER)
    assert member.get("/portal/t/acme/request-logs/").status_code == 403
    assert member.get("/portal/t/acme/request-logs/req-1/").status_code == 403
    assert member.get("/portal/t/acme/request-logs.jsonl").status_code == 403
    assert member.post("/portal/t/acme/request-logs/delete/").status_code == 403
    assert RequestLog.objects.filter(tenant=tenant).count() == 1


def test_the_policy_is_set_in_the_portal_and_audited(portal_as, tenant):
    client, user = portal_as(Role.ADMIN)
    response = client.post(
        "/portal/t/acme/request-logs/",
        {"enabled": "on", "retention_days": "3", "redact_emails": "on"},
    )
    assert response.status_code == 302
    policy = RequestLogPolicy.objects.get(tenant=tenant)
    assert (policy.enabled, policy.retention_days, policy.redact_emails) == (True, 3, True)
    record = last_record(action="request_logs.policy")
    assert record.tenant_id == tenant.pk and record.actor == user.username
    assert record.after["enabled"] is True
    bad = client.post("/portal/t/acme/request-logs/", {"enabled": "on", "retention_days": "0"})
    assert bad.status_code == 400
    assert RequestLogPolicy.objects.get(tenant=tenant).retention_days == 3


def test_deleting_all_logs_is_one_audited_action(portal_as, tenant, other_tenant):
    _stored(tenant, "a")
    _stored(tenant, "b")
    _stored(other_tenant, "c")
    client, user = portal_as(Role.ADMIN)
    response = client.post("/portal/t/acme/request-logs/delete/")
    assert response.status_code == 302 and response["Location"].endswith("?deleted=2")
    assert list(RequestLog.objects.values_list("request_id", flat=True)) == ["c"]
    record = last_record(action="request_logs.delete_all")
    assert record.tenant_id == tenant.pk and record.actor == user.username
    assert record.after == {"deleted": 2}


def test_rotation_re_encrypts_under_the_new_key(tenant, settings):
    old = Fernet.generate_key().decode()
    settings.FAIRLANE_REQUEST_LOG_KEYS = [old]
    _stored(tenant)
    new = Fernet.generate_key().decode()
    settings.FAIRLANE_REQUEST_LOG_KEYS = [new, old]
    call_command("request_logs_rotate")
    settings.FAIRLANE_REQUEST_LOG_KEYS = [new]
    log = RequestLog.objects.get()
    assert content_open(log.content)["messages"][0]["content"] == "the plans"
    assert Fernet(new.encode()).decrypt(bytes(log.content))


def test_the_beat_and_the_embedded_servers_loop_both_keep_the_retention(
    tenant, embedded_runtime, settings
):
    """Distributed: the beat runs the task. Embedded (no beat): a loop of the runtime."""
    entry = next(
        e
        for e in settings.CELERY_BEAT_SCHEDULE.values()
        if e["task"].endswith("request_logs_expire")
    )
    assert entry["task"] in current_app.tasks
    logs_on(tenant, retention_days=1)
    old = timezone.now() - timedelta(days=2)
    for request_id in ("by-task", "by-loop"):
        request_log_write(
            tenant_id=tenant.pk,
            request_id=request_id,
            endpoint="chat",
            model="m",
            content={},
            now=old,
        )
        if request_id == "by-task":
            assert current_app.tasks[entry["task"]]() == 1
    [loop] = [loop for loop in embedded_runtime.loops.loops if loop.name == "request-log-expirer"]
    loop.wake()  # its thread runs a step now, as it does every FAIRLANE_REQUEST_LOG_SWEEP_SECONDS
    end = time.monotonic() + 10
    while RequestLog.objects.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not RequestLog.objects.exists()


async def test_the_websocket_and_our_own_engine_are_logged_too(application, key, tenant):  # noqa: F811
    """The embedded mode's own engine (the `tiny` preset), streamed over /ws/v1/chat."""
    await database_sync_to_async(logs_on)(tenant)
    ws = WebsocketCommunicator(
        application, "/ws/v1/chat", headers=[(b"authorization", f"Bearer {key}".encode())]
    )
    assert (await ws.connect())[0]
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi ana@example.com"}]}
    await ws.send_json_to(
        {"type": "chat.completions", "id": "a", "body": {**body, "max_tokens": 6, "temperature": 0}}
    )
    frames = []
    while not frames or frames[-1]["type"] not in ("done", "error"):
        frames.append(await ws.receive_json_from(timeout=60))
    await ws.disconnect()
    assert frames[-1]["type"] == "done", frames
    text = "".join(
        f["data"]["choices"][0]["delta"].get("content") or ""
        for f in frames
        if f["type"] == "chunk" and f["data"]["choices"]
    )
    [log] = await database_sync_to_async(wait_for_logs)(1)
    content = content_open(log.content)
    assert content["messages"] == [{"role": "user", "content": "hi [REDACTED:email]"}]
    assert content["output"][0]["text"] == text and content["output"][0]["finish_reason"]
    assert log.model == "tiny" and content["status"] == UsageRecord.Status.OK


def test_a_tenant_found_keeping_no_logs_skips_the_database_until_it_turns_them_on(tenant, settings):
    write = {"request_id": "r", "endpoint": "chat", "model": "m", "content": {}}
    assert not request_logs_known_off(tenant_id=tenant.pk)
    assert not request_log_write(tenant_id=tenant.pk, **write)  # off: read once ...
    assert request_logs_known_off(tenant_id=tenant.pk)  # ... then remembered
    logs_on(tenant)  # in this process at once (others within the setting's seconds)
    assert not request_logs_known_off(tenant_id=tenant.pk)
    assert request_log_write(tenant_id=tenant.pk, **write)
    settings.FAIRLANE_REQUEST_LOG_OFF_CACHE_SECONDS = 0
    request_log_policy_set(
        tenant=tenant, enabled=False, retention_days=7, redact_emails=True, redact_numbers=False
    )
    assert not request_log_write(tenant_id=tenant.pk, **{**write, "request_id": "s"})
    assert not request_logs_known_off(tenant_id=tenant.pk)
    assert list(RequestLog.objects.values_list("request_id", flat=True)) == ["r"]
