"""Property-based fuzzing (Hypothesis) of the /v1 wire layer in process: the reading of
client JSON (routing/wire/body.py, for HTTP bodies and websocket frames alike) and the
request parsers (routing/wire/parse.py), the SSE rendering (routing/wire/render.py), and the
line splitter the remote adapters read event streams with (routing.backends.base.sse_lines).
Seeded, a bounded number of examples (FAIRLANE_FUZZ_SEED and FAIRLANE_FUZZ_SCALE change
both: tests/routing/hostile.py), no example database; each test prints how many cases
it ran.

The promises: a body is either a typed request whose every string is valid Unicode, or an
InvalidRequest (a 400 in the API's error shape), never another exception; whatever the engine
or a backend produces renders as `data:` lines that a client splits exactly as sent and that
parse as JSON; event-stream lines split at CR, LF and CRLF only, however the bytes arrive."""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass

import httpx
import pytest
from hypothesis import given, note, seed
from hypothesis import strategies as st

from routing.backends.base import sse_lines
from routing.wire.body import json_load
from routing.wire.parse import (
    chat_request_parse,
    completion_request_parse,
    embedding_request_parse,
)
from routing.wire.render import ChatFormat, CompletionFormat, sse
from tenants.errors import InvalidRequest, error_body_for
from tests.routing.hostile import ENDPOINTS, SEED, bodies, encoded, examples, texts
from workers.engine.tokenizer import PRESET_VOCAB_SIZE, Tokenizer, byte_tokenizer_write
from workers.serving.events import Finish, Tokens, TokenUsage, ToolCallDelta

PARSERS = {
    "chat": chat_request_parse,
    "completion": completion_request_parse,
    "embedding": embedding_request_parse,
}


def report(capsys, name: str, cases: int, detail: str = "") -> None:
    """The number of cases a fuzzer ran, on the terminal even when output is captured."""
    with capsys.disabled():
        print(f"\n[fuzz] {name}: {cases} cases, seed {SEED}{detail}")


def strings_in(value, where: str = "body"):
    """Every string (and object key) of a parsed request, with where it is."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield where, str(key)
            yield from strings_in(child, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, child in enumerate(value):
            yield from strings_in(child, f"{where}[{i}]")
    elif is_dataclass(value):
        for field in dataclass_fields(value):
            yield from strings_in(getattr(value, field.name), f"{where}.{field.name}")


# --- the request reader and parsers -----------------------------------------------------------

request_bodies = st.sampled_from(sorted(ENDPOINTS)).flatmap(
    lambda endpoint: st.tuples(st.just(endpoint), bodies(endpoint))
)


def test_fuzz_request_bodies_parse_or_are_refused_as_invalid(capsys):
    cases, outcomes = [0], {"parsed": 0, "refused": 0}

    @examples(4000)
    @seed(SEED)
    @given(request_bodies)
    def check(case):
        endpoint, text = case
        cases[0] += 1
        note(f"POST {ENDPOINTS[endpoint]} {text[:500]!r}{' ...' if len(text) > 500 else ''}")
        try:
            parsed = PARSERS[endpoint](json_load(encoded(text)))
        except InvalidRequest as exc:
            outcomes["refused"] += 1
            assert exc.status == 400 and exc.code == "invalid_request", exc
            assert set(error_body_for(exc)["error"]) == {"message", "type", "code", "param"}
            return
        outcomes["parsed"] += 1
        for _where, value in strings_in(parsed):
            value.encode("utf-8")  # UnicodeEncodeError: a lone surrogate got through

    check()
    report(capsys, "request bodies through the reader and parsers", cases[0], f" {outcomes}")


# --- SSE rendering ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The presets' byte-level tokenizer (no weights needed to render)."""
    path = tmp_path_factory.mktemp("tokenizer")
    byte_tokenizer_write(path, model_max_length=1024)
    return Tokenizer(path)


# What a tokenizer or a backend can produce: any valid Unicode (no lone surrogates; the
# reader refuses them in requests, and decoders never produce them).
output_texts = texts().map(lambda t: t.encode("utf-8", "replace").decode("utf-8"))
logprobs = st.one_of(st.floats(max_value=0.0), st.just(-math.inf), st.just(math.nan))
token_events = st.builds(
    lambda choice, text, ids, lps, tools: Tokens(
        choice=choice,
        text=text,
        token_ids=tuple(ids),
        logprobs=tuple(lps[: len(ids)]) + (0.0,) * (len(ids) - len(lps)),
        top_logprobs=tuple({str(i): lp for i, lp in zip(ids, lps, strict=False)} for _ in ids),
        tool_calls=tuple(tools),
    ),
    st.integers(0, 1),
    output_texts,
    st.lists(st.integers(0, PRESET_VOCAB_SIZE - 1), max_size=4),
    st.lists(logprobs, max_size=4),
    st.lists(
        st.builds(
            ToolCallDelta,
            index=st.integers(0, 2),
            arguments=output_texts,
            id=st.one_of(st.none(), output_texts),
            name=st.one_of(st.none(), output_texts),
        ),
        max_size=2,
    ),
)
events = st.lists(
    st.one_of(
        token_events,
        st.builds(
            Finish,
            choice=st.integers(0, 1),
            reason=st.sampled_from(["stop", "length", "abort", "tool_calls"]),
        ),
    ),
    max_size=6,
)


def finite(value):
    """A body as JSON reads it back: tuples are arrays, NaN and infinities null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(child) for child in value]
    return value


def client_lines(stream: bytes) -> list[str]:
    """The lines an SSE client reads: httpx's, which split at every line break str knows."""

    async def read():
        response = httpx.Response(200, content=stream)
        return [line async for line in response.aiter_lines()]

    return asyncio.run(read())


def test_fuzz_sse_rendering_gives_json_data_lines(tokenizer, capsys):
    cases = [0]

    @examples(400)
    @seed(SEED)
    @given(
        st.sampled_from([ChatFormat, CompletionFormat]),
        st.booleans(),
        st.booleans(),
        events,
        output_texts,
    )
    def check(format_class, wants_logprobs, include_usage, run, error_message):
        cases[0] += 1
        fmt = format_class(
            request_id="r",
            model="tiny",
            num_choices=2,
            tokenizer=tokenizer,
            wants_logprobs=wants_logprobs,
            prompt_texts=["p", ""],
        )
        bodies = fmt.opening(include_usage)
        for event in run:
            match event:
                case Tokens():
                    bodies.append(fmt.token_chunk(event, include_usage))
                case Finish():
                    bodies.append(fmt.finish_chunk(event, include_usage))
        bodies.append(fmt.usage_chunk(TokenUsage(3, len(run), 1)))
        bodies.append(error_body_for(InvalidRequest(error_message or None, param="x")))
        stream = b"".join(sse(body) for body in bodies)
        lines = client_lines(stream)
        assert lines[1::2] == [""] * len(bodies), lines  # each event: one line, one blank
        for line, body in zip(lines[::2], bodies, strict=False):
            assert line.startswith("data: "), line
            assert json.loads(line[len("data: ") :]) == finite(body)
        fmt.response(TokenUsage(3, len(run), 1))  # the whole answer renders too

    check()
    report(capsys, "SSE rendering of streamed chunks", cases[0])


# --- event-stream lines, as the remote adapters read them ----------------------------------------

stream_bytes = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"data: ",
                b"data:",
                b"event: x",
                b": comment",
                b"\r",
                b"\n",
                b"\r\n",
                b"[DONE]",
                b'{"a": 1}',
                b"\xe2\x80\xa8",
                b"\xc2\x85",
                b"\xff",
                b"\x00",
            ]
        ),
        st.binary(max_size=8),
    ),
    max_size=20,
).map(b"".join)


def reference_lines(body: bytes) -> list[bytes]:
    """The SSE format's rule: a line ends at CRLF, LF or CR; the last one may have no end."""
    lines = re.split(rb"\r\n|\r|\n", body)
    return lines[:-1] if lines[-1] == b"" else lines


def test_fuzz_sse_lines_split_at_cr_lf_and_crlf_only(capsys):
    cases = [0]

    class Pieces(httpx.AsyncByteStream):
        def __init__(self, pieces: list[bytes]) -> None:
            self.pieces = pieces

        async def __aiter__(self):
            for piece in self.pieces:
                yield piece

    async def lines_of(pieces: list[bytes]) -> list[bytes]:
        return [line async for line in sse_lines(httpx.Response(200, stream=Pieces(pieces)))]

    @examples(600)
    @seed(SEED)
    @given(stream_bytes, st.lists(st.integers(1, 16), max_size=30))
    def check(body, cuts):
        cases[0] += 1
        pieces, at = [], 0
        for size in cuts:
            pieces.append(body[at : at + size])
            at += size
        pieces.append(body[at:])
        assert asyncio.run(lines_of(pieces)) == reference_lines(body)

    check()
    report(capsys, "event-stream line splitting", cases[0])
