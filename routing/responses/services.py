"""The Responses API's request path: parse, read the chain's earlier turns, then the same
admission, reservation, fair queue, routing and settlement as a chat request (the chat
request it becomes is what every backend is sent, and what is metered), and the run's
events rendered as a response; a response with `store` is kept when it ends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from routing.admission import Caller
from routing.metrics import request_arrived
from routing.responses.store import stored_response_create, stored_response_history
from routing.services import Started, request_start
from routing.services.answers import events_collect, events_to_end
from routing.sync import db_call
from routing.wire.responses import ResponsesRequest, responses_chat_request, responses_request_parse
from routing.wire.responses_render import ResponseRender
from tenants.errors import DATABASE_TRANSIENT
from workers.serving.events import Done, Failed, Finish, Tokens
from workers.serving.runtime import Runtime

logger = logging.getLogger(__name__)


@dataclass
class ResponseStarted:
    """A Responses request a backend has accepted; `items`: the conversation it was sent
    (the chain's and its own input), kept with it when it is stored."""

    started: Started
    render: ResponseRender
    request: ResponsesRequest
    caller: Caller
    items: list[dict]

    @property
    def stream(self) -> bool:
        return self.request.stream


async def response_start(*, runtime: Runtime, caller: Caller, body) -> ResponseStarted:
    request_arrived()  # the start of its time to first token (routing/metrics.py)
    request = responses_request_parse(body)
    history: list[dict] = []
    if request.previous_response_id is not None:
        history = await db_call(stored_response_history)(
            tenant=caller.tenant, response_id=request.previous_response_id
        )
    started = await request_start(
        runtime=runtime,
        caller=caller,
        endpoint="chat",
        request=responses_chat_request(request, history),
    )
    render = ResponseRender(
        request_id=started.job.request_id,
        model=request.model,
        echo=request.echo,
        previous_response_id=request.previous_response_id,
    )
    return ResponseStarted(started, render, request, caller, history + request.items)


async def _store(response: ResponseStarted, body: dict) -> None:
    """Keep it when asked. The answer is served and charged whatever happens here: a
    database that blinks now costs the response its storage (a later chain from it is a 404),
    not the answer."""
    if not response.request.store:
        return
    try:
        await db_call(stored_response_create)(
            tenant=response.caller.tenant,
            agent=response.caller.agent,
            items=response.items,
            body=body,
        )
    except DATABASE_TRANSIENT:
        logger.warning("response %s: the database did not answer; not stored", body["id"])


async def response_events(response: ResponseStarted) -> AsyncIterator[list[dict]]:
    """The streamed events, in order, in the groups one step of the run renders (the
    opening; a token's delta with the item and part it opens; the items' ends), so a stream
    writes each group at once; the last event is the response as it ended (completed,
    incomplete or failed), sent once it is stored, so that a chain may follow at once."""
    render = response.render
    yield render.opening()
    final = None
    async for event in events_to_end(response.started):
        match event:
            case Tokens():
                if rendered := render.tokens(event):
                    yield rendered
            case Finish():
                yield render.finish(event)
            case Failed() if final is None:
                final = render.failure(event.code, event.message)
            case Done(usage=usage) if final is None:
                final = render.closing(usage)
    if final is None:
        final = render.failure("internal_error", "The request ended without a result.")
    await _store(response, final["response"])
    yield [final]


async def response_collect(response: ResponseStarted) -> dict:
    """The whole response, or the run's error."""
    body = await events_collect(response.started, response.render.absorb, response.render.whole)
    await _store(response, body)
    return body
