"""Event-stream lines as the adapters read them (routing.backends.base.sse_lines): the same
lines httpx's aiter_lines gives, however the bytes are split into pieces."""

import json

import httpx
import pytest

from routing.backends.base import sse_lines

pytestmark = pytest.mark.asyncio

BODY = (
    b': OPENROUTER PROCESSING\r\n\r\nevent: message\r\ndata: {"a": "\xc3\xa9"}\r\n\r\n'
    b'data: {"b": 1}\n\ndata: x\rdata: y\r\ndata: [DONE]'
)


class Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


async def _lines(pieces: list[bytes]) -> list[bytes]:
    response = httpx.Response(200, stream=Pieces(pieces))
    return [line async for line in sse_lines(response)]


async def _httpx_lines(pieces: list[bytes]) -> list[bytes]:
    response = httpx.Response(200, stream=Pieces(pieces))
    return [line.encode() async for line in response.aiter_lines()]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(BODY)])
async def test_lines_match_httpx_whatever_the_pieces(size):
    pieces = [BODY[i : i + size] for i in range(0, len(BODY), size)]
    lines = await _lines(pieces)
    assert lines == await _httpx_lines(pieces)
    assert lines[:4] == [
        b": OPENROUTER PROCESSING",
        b"",
        b"event: message",
        'data: {"a": "é"}'.encode(),
    ]
    assert lines[-3:] == [b"data: x", b"data: y", b"data: [DONE]"]


async def test_a_crlf_split_between_pieces_is_one_line_end():
    assert await _lines([b"data: 1\r", b"\ndata: 2\r\n"]) == [b"data: 1", b"data: 2"]


@pytest.mark.parametrize("text", ["a\u2028b", "a\u2029b", "a\x85b", "\u2028\x85\u2029é\n"])
async def test_a_chunk_holding_a_unicode_line_break_stays_one_line(text):
    """orjson writes U+2028, U+2029 and U+0085 raw; str.splitlines() ends a line at each."""
    from routing.wire.render import sse

    frame = sse({"choices": [{"delta": {"content": text}}]})
    lines = await _httpx_lines([frame])
    assert lines[0].startswith(b"data: ") and lines[1:] == [b""]
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == text
