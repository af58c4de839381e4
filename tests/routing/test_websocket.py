"""The websocket API through Channels (the real ASGI application, in-process engines)."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator

from tenants.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
    "temperature": 0,
}


@pytest.fixture
def application(embedded):
    from asgi import application

    return application


async def connect(application, key=None):
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    communicator = WebsocketCommunicator(application, "/ws/v1/chat", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def frames_until_done(communicator, ids: set[str], timeout=30) -> dict[str, list[dict]]:
    frames: dict[str, list[dict]] = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        frame = await communicator.receive_json_from(timeout=timeout)
        frames.setdefault(frame.get("id"), []).append(frame)
        if frame["type"] in {"done", "error"} and frame.get("id") in open_ids:
            open_ids.discard(frame["id"])
    return frames


async def test_header_auth_and_two_concurrent_requests_on_one_socket(application, key):
    ws = await connect(application, key)
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.send_json_to({"type": "chat.completions", "id": "a", "body": CHAT})
    await ws.send_json_to(
        {
            "type": "completions",
            "id": "b",
            "body": {"model": "tiny", "prompt": "x", "max_tokens": 5},
        }
    )
    frames = await frames_until_done(ws, {"a", "b"})
    for request_id, max_tokens in (("a", 8), ("b", 5)):
        done = frames[request_id][-1]
        assert done["type"] == "done", frames[request_id]
        chunks = [f["data"] for f in frames[request_id] if f["type"] == "chunk"]
        assert chunks and all(c["object"].endswith(("chunk", "text_completion")) for c in chunks)
        assert done["usage"]["completion_tokens"] <= max_tokens
    assert await database_sync_to_async(UsageRecord.objects.count)() == 2
    await ws.disconnect()


async def test_first_message_auth_and_a_bad_key_closes_4001(application, key):
    ws = await connect(application)
    await ws.send_json_to({"type": "auth", "api_key": key})
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.disconnect()

    ws = await connect(application)
    await ws.send_json_to({"type": "auth", "api_key": key + "x"})
    error = await ws.receive_json_from()
    assert error["type"] == "error" and error["error"]["code"] == "authentication"
    assert (await ws.receive_output())["code"] == 4001


async def test_a_deeply_nested_frame_before_auth_gets_an_error_frame(application, key):
    ws = await connect(application)
    await ws.send_to(text_data="[" * 100_000 + "]" * 100_000)
    error = await ws.receive_json_from()
    assert error["type"] == "error" and "nested too deeply" in error["error"]["message"]
    await ws.send_json_to({"type": "auth", "api_key": key})
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.disconnect()


async def test_requests_before_auth_are_refused(application, key):
    ws = await connect(application)
    await ws.send_json_to({"type": "chat.completions", "id": "a", "body": CHAT})
    assert (await ws.receive_json_from())["error"]["code"] == "authentication"
    assert (await ws.receive_output())["code"] == 4001


@pytest.mark.parametrize(
    "frame,code,param",
    [
        ("not json", "invalid_request", None),
        ("[1, 2]", "invalid_request", None),
        (json.dumps({"type": "teleport", "id": "x"}), "invalid_request", "type"),
        (json.dumps({"type": "chat.completions", "body": CHAT}), "invalid_request", "id"),
        (
            json.dumps({"type": "chat.completions", "id": "x", "body": {**CHAT, "temperature": 9}}),
            "invalid_request",
            "temperature",
        ),
        (
            json.dumps({"type": "chat.completions", "id": "x", "body": "nope"}),
            "invalid_request",
            None,
        ),
        (json.dumps({"type": "cancel", "id": "nothing"}), "invalid_request", "id"),
        # Before authentication too (the socket below is authenticated): nesting beyond any
        # parser's depth, and a lone surrogate in a message (issue 28, findings 4 and 5).
        ("[" * 100_000 + "]" * 100_000, "invalid_request", None),
        (
            '{"type": "chat.completions", "id": "s", "body": {"model": "tiny", "messages": '
            '[{"role": "user", "content": "\\ud800"}]}}',
            "invalid_request",
            "body.messages[0].content",
        ),
    ],
)
async def test_malformed_frames_get_error_frames_and_the_socket_stays_usable(
    application, key, frame, code, param
):
    ws = await connect(application, key)
    await ws.receive_json_from()
    await ws.send_to(text_data=frame)
    error = await ws.receive_json_from()
    assert error["type"] == "error" and error["error"]["code"] == code
    assert error["error"]["param"] == param
    await ws.send_json_to({"type": "chat.completions", "id": "ok", "body": CHAT})
    frames = await frames_until_done(ws, {"ok"})
    assert frames["ok"][-1]["type"] == "done"
    await ws.disconnect()


async def test_cancel_stops_a_request_and_charges_what_was_generated(application, key, slow):
    ws = await connect(application, key)
    await ws.receive_json_from()
    long = {**CHAT, "model": "small", "max_tokens": 1500, "ignore_eos": True}
    await ws.send_json_to({"type": "chat.completions", "id": "long", "body": long})
    while True:  # until generated text arrives (the first chunk only carries the role)
        frame = await ws.receive_json_from(timeout=30)
        if frame["type"] == "chunk" and frame["data"]["choices"][0]["delta"].get("content"):
            break
    await ws.send_json_to({"type": "cancel", "id": "long"})
    frames = await frames_until_done(ws, {"long"})
    assert frames["long"][-1] == {"type": "done", "id": "long", "cancelled": True}
    for _ in range(100):
        record = await database_sync_to_async(
            UsageRecord.objects.filter(status="cancelled").first
        )()
        if record:
            break
        await asyncio.sleep(0.05)
    assert record is not None and 0 < record.completion_tokens < 1500
    await ws.disconnect()


async def test_a_websocket_request_routed_to_a_paid_provider_streams_and_is_metered(
    application, key, fakes
):
    from routing.backend_store import backend_model_set, backend_register

    fake = fakes("openrouter", reply_tokens=4)

    def register():
        backend = backend_register(
            name="router", kind="openrouter", base_url=fake.url, credential=fake.api_key
        )
        backend_model_set(
            backend=backend,
            model="remote-m",
            upstream_name="fake-model",
            price_output_per_mtok=2_000_000_000,
        )

    await database_sync_to_async(register)()
    ws = await connect(application, key)
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.send_json_to(
        {
            "type": "chat.completions",
            "id": "r",
            "body": {
                "model": "remote-m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}],
            },
        }
    )
    frames = (await frames_until_done(ws, {"r"}))["r"]
    text = "".join(
        f["data"]["choices"][0]["delta"].get("content") or ""
        for f in frames
        if f["type"] == "chunk" and f["data"]["choices"]
    )
    assert text == "t0 t1 t2 t3 " and frames[-1]["type"] == "done"
    assert frames[-1]["usage"]["completion_tokens"] == 4
    row = await database_sync_to_async(UsageRecord.objects.get)()
    assert row.backend == "router" and row.completion_tokens == 4
    assert row.cost_microcents == 4 * 200 + 1 * 100  # OpenRouter's own cost: $2/M out, $1/M in
    await ws.disconnect()
