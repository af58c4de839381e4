"""Property-based fuzzing (Hypothesis) of the live /v1 API: hostile bodies over HTTP and
hostile frames over the websocket (/ws/v1/chat), against uvicorn serving the platform in the
embedded mode with the `tiny` model, with a real key. Seeded, a bounded number of examples
(FAIRLANE_FUZZ_SEED and FAIRLANE_FUZZ_SCALE change both: tests/routing/hostile.py), no example
database; each test prints how many cases it ran.

The promise: no 5xx; every refusal in the API's error shape (an HTTP body, or an error frame);
a stream is `data:` lines that parse as JSON; a socket stays open after any frame (or, refusing
authentication, closes with a close frame and code 4001), never dropped without one."""

from __future__ import annotations

import collections
import json
import re
import uuid

import httpx
import pytest
from django.conf import settings as django_settings
from hypothesis import given, note, seed
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.routing.hostile import (
    ENDPOINTS,
    SEED,
    bodies,
    encoded,
    examples,
    string_literal,
    texts,
    values,
)

pytestmark = pytest.mark.django_db(transaction=True)
ERROR_KEYS = {"message", "type", "code", "param"}


def report(capsys, name: str, cases: int, detail: str = "") -> None:
    with capsys.disabled():
        print(f"\n[fuzz] {name}: {cases} cases, seed {SEED}{detail}")


def assert_error_body(error: dict) -> None:
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and isinstance(error["code"], str), error


# --- HTTP ---------------------------------------------------------------------------------------


@st.composite
def large_bodies(draw, endpoint: str) -> str:
    """A small valid request padded to just under, at, or past the size limit."""
    limit = django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    size = draw(st.sampled_from([limit - 200, limit + 1, 2 * limit]))
    text = string_literal("a" * size)
    if endpoint == "chat":
        return '{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":' + text + "}]}"
    field = '"prompt"' if endpoint == "completion" else '"input"'
    return '{"model":"tiny",' + field + ":" + text + "}"


http_cases = st.sampled_from(sorted(ENDPOINTS)).flatmap(
    lambda endpoint: st.tuples(
        st.just(endpoint),
        st.one_of(bodies(endpoint), bodies(endpoint), bodies(endpoint), large_bodies(endpoint)),
    )
)


def assert_event_stream(text: str) -> None:
    """`data:` lines, one an event, each JSON (a chunk or an error body), then [DONE]; and no
    line break a client's str.splitlines() would see that the SSE format does not."""
    assert text.splitlines() == re.split(r"\r\n|\r|\n", text.removesuffix("\n")), text[:2000]
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", text[-2000:]
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event, event
        body = json.loads(event[len("data: ") :])
        if "error" in body:
            assert_error_body(body["error"])
        else:
            assert body["object"] in {"chat.completion.chunk", "text_completion"}, body


def test_fuzz_http_bodies_get_an_answer_or_a_4xx_never_a_5xx(embedded_server, key, capsys):
    cases, statuses = [0], collections.Counter()
    client = httpx.Client(
        base_url=embedded_server.url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )

    @examples(250)
    @seed(SEED)
    @given(http_cases)
    def check(case):
        endpoint, text = case
        cases[0] += 1
        note(f"POST {ENDPOINTS[endpoint]} {text[:500]!r}{' ...' if len(text) > 500 else ''}")
        response = client.post(
            ENDPOINTS[endpoint], content=encoded(text), headers={"Content-Type": "application/json"}
        )
        statuses[response.status_code] += 1
        note(f"answered {response.status_code}: {response.text[:1000]!r}")
        assert response.status_code < 500
        if response.status_code >= 400:
            assert response.headers["content-type"] == "application/json"
            assert_error_body(response.json()["error"])
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert_event_stream(response.text)
        else:
            assert isinstance(response.json(), dict)

    try:
        check()
    finally:
        client.close()
    report(capsys, "HTTP bodies against a live server", cases[0], f" {dict(statuses)}")


# --- websocket ----------------------------------------------------------------------------------

frame_ids = st.one_of(
    st.sampled_from(['"a"', '"b"', '""', '"' + "x" * 65 + '"', "1", "null"]),
    st.builds(string_literal, texts(max_size=8)),
    values,
)


@st.composite
def frames(draw, key: str) -> str | bytes:
    """One client frame: an auth frame, a request with a hostile body, a cancel, or anything."""
    kind = draw(
        st.sampled_from(["request"] * 4 + ["auth", "cancel", "value", "deep", "text", "bytes"])
    )
    if kind == "request":
        endpoint = draw(st.sampled_from(["chat", "completion"]))
        frame_type = "chat.completions" if endpoint == "chat" else "completions"
        frame = f'{{"type":"{frame_type}","id":{draw(frame_ids)},"body":{draw(bodies(endpoint))}}}'
    elif kind == "auth":
        api_key = draw(st.one_of(st.just(string_literal(key)), values))
        frame = '{"type":"auth","api_key":' + api_key + "}"
    elif kind == "cancel":
        frame = '{"type":"cancel","id":' + draw(frame_ids) + "}"
    elif kind == "deep":
        frame = draw(
            st.sampled_from(["[" * 100_000 + "]" * 100_000, '{"type":' * 5_000 + "1" + "}" * 5_000])
        )
    elif kind == "text":
        frame = draw(texts())
    else:
        frame = draw(values)
    try:  # a text frame must be UTF-8: one holding raw surrogates goes as a binary frame
        frame.encode("utf-8")
    except UnicodeEncodeError:
        return encoded(frame)
    return encoded(frame) if kind == "bytes" else frame


def request_id(frame: str | bytes) -> str | None:
    """The id of a request frame that must end in a done or an error frame with that id."""
    try:
        parsed = json.loads(frame)
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # a lone surrogate: refused
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    if (
        isinstance(parsed, dict)
        and parsed.get("type") in ("chat.completions", "completions")
        and isinstance(parsed.get("id"), str)
        and 0 < len(parsed["id"]) <= 64
    ):
        return parsed["id"]
    return None


def check_frame(raw) -> dict:
    frame = json.loads(raw)
    assert frame["type"] in {"auth.ok", "chunk", "done", "error"}, frame
    if frame["type"] == "error":
        assert_error_body(frame["error"])
        assert frame["error"]["code"] != "internal_error", frame  # a 5xx: a bug of ours
    return frame


def test_fuzz_websocket_frames_get_a_frame_back_never_a_dropped_socket(
    embedded_server, key, capsys
):
    url = embedded_server.url.replace("http://", "ws://") + "/ws/v1/chat"
    cases, sent, closes = [0], [0], collections.Counter()

    @examples(150)
    @seed(SEED)
    @given(st.booleans(), st.lists(frames(key), min_size=1, max_size=4))
    def check(header_auth, client_frames):
        cases[0] += 1
        sent[0] += len(client_frames)
        note(f"header auth: {header_auth}; frames: " + repr([f[:300] for f in client_frames]))
        headers = {"Authorization": f"Bearer {key}"} if header_auth else {}
        sentinel = f"sentinel-{uuid.uuid4().hex[:8]}"
        waiting = {i for i in map(request_id, client_frames) if i} | {sentinel}
        with connect(
            url, additional_headers=headers, max_size=None, open_timeout=30, close_timeout=5
        ) as ws:
            if header_auth:
                assert check_frame(ws.recv(timeout=30))["type"] == "auth.ok"
            try:
                for frame in client_frames:
                    ws.send(frame)
                ws.send(json.dumps({"type": "cancel", "id": sentinel}))
                while waiting:
                    frame = check_frame(ws.recv(timeout=60))
                    if frame["type"] in {"done", "error"}:
                        waiting.discard(frame["id"])
            except ConnectionClosed as closed:
                note(f"closed: {closed!r}")
                assert closed.rcvd is not None, "the socket was dropped without a close frame"
                assert closed.rcvd.code == 4001, closed  # authentication refused
                closes[closed.rcvd.code] += 1

    check()
    report(
        capsys,
        "websocket connections against a live server",
        cases[0],
        f" ({sent[0]} frames; closed by the server: {dict(closes)})",
    )
