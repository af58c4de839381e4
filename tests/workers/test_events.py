"""The request path's events cross Redis as one JSON object each, in the shape stream readers
(and operators with redis-cli) read: a `type` and the event's fields."""

import json

import pytest

from workers.serving.events import (
    Accepted,
    Done,
    Embedding,
    Failed,
    Finish,
    Tokens,
    TokenUsage,
    event_decode,
    event_encode,
)

EVENTS = [
    Accepted(),
    Tokens(
        choice=1,
        text="hi",
        token_ids=(5, 6),
        logprobs=(-0.5, -1.0),
        top_logprobs=({"5": -0.5}, {"6": -1.0}),
    ),
    Tokens(choice=0, text="x", entries=({"token": "x", "logprob": -0.1},), logprobs=(-0.1,)),
    Finish(choice=1, reason="length"),
    Embedding(index=2, b64="AAAA"),
    Failed(code="invalid_request", message="bad", param="messages"),
    Failed(code="backend_unavailable", message="load failed", retryable=True, retry_after=3),
    Done(
        status="ok",
        usage=TokenUsage(prompt_tokens=7, completion_tokens=2, cached_tokens=4),
        cost_microcents=99,
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_survives_the_redis_round_trip(event):
    assert event_decode(event_encode(event).encode()) == event


def test_the_wire_keeps_the_shape_stream_readers_use():
    token = json.loads(event_encode(EVENTS[1]))
    assert token == {
        "type": "token",
        "choice": 1,
        "text": "hi",
        "token_ids": [5, 6],
        "logprobs": [-0.5, -1.0],
        "top_logprobs": [{"5": -0.5}, {"6": -1.0}],
    }
    done = json.loads(event_encode(EVENTS[-1]))
    assert done == {
        "type": "done",
        "status": "ok",
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 2,
            "total_tokens": 9,
            "cached_tokens": 4,
            "cost_microcents": 99,
        },
    }
    assert json.loads(event_encode(EVENTS[5])) == {
        "type": "error",
        "code": "invalid_request",
        "message": "bad",
        "param": "messages",
    }
    assert json.loads(event_encode(Accepted())) == {"type": "accepted"}


def test_an_unknown_event_type_is_refused():
    with pytest.raises(ValueError):
        event_decode('{"type": "splice"}')
