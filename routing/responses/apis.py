"""/v1/responses: OpenAI's Responses API. Create answers JSON or a stream of semantic events;
stored responses are read, deleted and listed per tenant (another tenant's is a 404)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from routing.apis import answer_headers, json_body, openai_view
from routing.drain import Drained, drain
from routing.responses import store
from routing.responses.services import (
    ResponseStarted,
    response_collect,
    response_events,
    response_start,
)
from routing.sync import db_call
from routing.wire.render import json_bytes
from routing.wire.responses_render import responses_sse
from tenants.errors import InvalidRequest

MAX_LIMIT = 100


async def _sse(response: ResponseStarted) -> AsyncIterator[bytes]:
    try:
        async with drain.watch():
            async for group in response_events(response):
                yield b"".join(responses_sse(event) for event in group)
    except Drained as exc:  # the process is shutting down: end the stream cleanly
        yield responses_sse(response.render.failure(exc.code, exc.message))


@openai_view("POST")
async def responses(request, caller) -> HttpResponseBase:
    response = await response_start(runtime=request.runtime, caller=caller, body=json_body(request))
    if response.stream:
        return StreamingHttpResponse(
            _sse(response),
            content_type="text/event-stream",
            headers={
                **answer_headers(response.started),
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
    return HttpResponse(
        json_bytes(await response_collect(response)),
        content_type="application/json",
        headers=answer_headers(response.started),
    )


@openai_view("GET", "DELETE")
async def response_detail(request, caller, response_id: str) -> HttpResponse:
    if request.method == "DELETE":
        await db_call(store.stored_response_delete)(tenant=caller.tenant, response_id=response_id)
        body = {"id": response_id, "object": "response", "deleted": True}
    else:
        found = await db_call(store.stored_response_get)(
            tenant=caller.tenant, response_id=response_id
        )
        return HttpResponse(found.body, content_type="application/json")
    return HttpResponse(json_bytes(body), content_type="application/json")


def _page(items: list[dict], query) -> dict:
    """OpenAI's cursor page: `order` (desc by default), `after` an item id, `limit` 1-100."""
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
    raw = query.get("limit") or "20"
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}.", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidRequest(f"No input item with id '{after}'.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[: int(raw)]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > len(data),
    }


@openai_view("GET")
async def response_input_items(request, caller, response_id: str) -> HttpResponse:
    found = await db_call(store.stored_response_get)(tenant=caller.tenant, response_id=response_id)
    page = _page(json.loads(found.items), request.GET)
    return HttpResponse(json_bytes(page), content_type="application/json")
