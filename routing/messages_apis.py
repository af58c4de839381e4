"""Anthropic's Messages API at /v1/messages and /v1/messages/count_tokens: the key as
`x-api-key` (Anthropic's) or `Authorization: Bearer`, `anthropic-version` accepted whatever its
value, errors in Anthropic's shape and statuses, so its SDK raises its own exception classes.
The views are routing.apis' (auth, drain, metrics, trace); only parse and render differ."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from routing.apis import answer_headers, openai_view
from routing.drain import Drained, drain
from routing.services import messages
from routing.services.answers import Started
from routing.sync import db_call
from routing.wire.anthropic_render import error_body, error_status, sse_event
from routing.wire.body import json_load
from routing.wire.render import json_bytes
from tenants.errors import ApplicationError, InvalidRequest, error_headers


def anthropic_error(exc: ApplicationError) -> HttpResponse:
    """The one HTTP rendering of an error in Anthropic's shape."""
    return JsonResponse(error_body(exc), status=error_status(exc), headers=error_headers(exc))


def _authorization(request: HttpRequest) -> str | None:
    key = request.headers.get("x-api-key")
    return f"Bearer {key}" if key else request.headers.get("Authorization")


def _body(request: HttpRequest):
    if request.content_type != "application/json":
        raise InvalidRequest("Send a JSON body with Content-Type: application/json.")
    try:
        return json_load(request.body)
    except RequestDataTooBig:
        raise InvalidRequest("The request body is too large.") from None


async def _events(started: Started):
    try:
        async with drain.watch():
            async for name, payload in messages.messages_stream(started):
                yield sse_event(name, payload)
    except Drained as exc:  # the process is shutting down: end the stream cleanly
        yield sse_event("error", error_body(exc))


anthropic_view = openai_view("POST", refusal=anthropic_error, authorization=_authorization)


@anthropic_view
async def messages_create(request, caller):
    started = await messages.messages_start(
        runtime=request.runtime, caller=caller, body=_body(request)
    )
    # Anthropic's clients read `request-id`.
    headers = {**answer_headers(started), "request-id": started.job.request_id}
    if started.stream:
        return StreamingHttpResponse(
            _events(started),
            content_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return HttpResponse(
        json_bytes(await messages.messages_collect(started)),
        content_type="application/json",
        headers=headers,
    )


@anthropic_view
async def messages_count_tokens(request, caller):
    body = _body(request)
    return JsonResponse(
        await db_call(messages.messages_count)(runtime=request.runtime, caller=caller, body=body)
    )
