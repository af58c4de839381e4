"""The OpenAI-compatible /v1 API: async views that authenticate, call one service and render
JSON or an SSE stream. Errors have OpenAI's body and status, so client libraries raise their
proper exception classes."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from channels.db import database_sync_to_async
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from routing import services
from routing.admission import caller_authenticate, caller_cached
from routing.drain import Drained, drain
from routing.metrics import API_REQUESTS, API_RESPONSE_START
from routing.sync import db_call
from routing.wire.body import json_load
from routing.wire.render import (
    SSE_DONE,
    Chunk,
    UsageChunk,
    json_bytes,
    model_object,
    sse,
)
from tenants.apis.errors import error_response
from tenants.errors import (
    DATABASE_TRANSIENT,
    ApplicationError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    ServiceUnavailable,
    error_body_for,
)
from workers.serving.trace import Span, span_start, trace_enter
from workers.serving.versions import version_tag

logger = logging.getLogger(__name__)


def _bearer_header(request: HttpRequest) -> str | None:
    return request.headers.get("Authorization")


def openai_view(
    *methods: str,
    refusal: Callable[[ApplicationError], HttpResponse] = error_response,
    authorization: Callable[[HttpRequest], str | None] = _bearer_header,
):
    """API-key auth (no cookies, so no CSRF), its methods (a path such as /v1/files or
    /v1/responses/{id} answers two, the view tells them apart), errors in OpenAI's shape;
    another front door passes its own error rendering (`refusal`) and where its key is
    (`authorization`: the `Authorization` header's value)."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            started = time.perf_counter()
            drain.install()
            # The request's span, under the caller's trace when it sent one; current for the
            # rest of this request's task (the view, then its stream).
            span = span_start(
                f"{request.method} {request.path}",
                kind="server",
                parent=request.headers.get("traceparent"),
            )
            trace_enter(span.trace, received=time.time())
            try:
                request.get_host()  # ALLOWED_HOSTS, which CommonMiddleware checks for the rest
                if request.method not in methods:
                    # RFC 9110: a 405 says what is allowed.
                    raise MethodNotAllowed(
                        f"Use {' or '.join(methods)} for {request.path}.",
                        headers={"Allow": ", ".join(methods)},
                    )
                credential = authorization(request)
                caller = caller_cached(authorization=credential) or await db_call(
                    caller_authenticate
                )(authorization=credential)
                async with drain.watch():  # a shutdown's deadline cuts it cleanly
                    response = await view(request, caller, *args, **kwargs)
            except Exception as exc:
                response = _refusal(request, exc, refusal)
            API_REQUESTS.labels(view.__name__, response.status_code).inc()
            API_RESPONSE_START.labels(view.__name__).observe(time.perf_counter() - started)
            response["x-fairlane-trace-id"] = span.trace.trace_id
            span.set(
                **{
                    "http.response.status_code": response.status_code,
                    "fairlane.request_id": response.get("x-request-id"),
                }
            )
            if response.status_code >= 500:
                span.fail(f"HTTP {response.status_code}")
            if response.streaming:
                response.streaming_content = _span_ending(response.streaming_content, span)
            else:
                span.end()
            return response

        return wrapper

    return decorate


def _refusal(
    request: HttpRequest, exc: Exception, render: Callable[[ApplicationError], HttpResponse]
) -> HttpResponse:
    """The answer to what a view raised, rendered in its API's shape."""
    match exc:
        case DisallowedHost():
            return render(InvalidRequest("Invalid Host header."))
        case ApplicationError():
            return render(exc)
        case _ if isinstance(exc, DATABASE_TRANSIENT):  # the database blinked: retry
            logger.warning(
                "%s %s: the database did not answer", request.method, request.path, exc_info=exc
            )
            return render(ServiceUnavailable(retry_after=2))
    # A bug of ours: logged here (a view is a process boundary) and answered like any error,
    # so it is counted in the request metrics the 5xx alert reads.
    logger.error("%s %s failed", request.method, request.path, exc_info=exc)
    return render(ApplicationError())


async def _span_ending(chunks, span: Span):
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        span.end()


def json_body(request: HttpRequest):
    if request.content_type != "application/json":
        raise InvalidRequest("Send a JSON body with Content-Type: application/json.")
    try:
        body = request.body
    except RequestDataTooBig:
        raise InvalidRequest("The request body is too large.") from None
    return json_load(body)


async def _sse(started: services.Started):
    try:
        async with drain.watch():
            async for chunk in services.started_chunks(started):
                match chunk:
                    case Chunk(body=body) | UsageChunk(body=body):
                        yield sse(body)
                    case ApplicationError() as error:
                        yield sse(error_body_for(error))
    except Drained as exc:  # the process is shutting down: end the stream cleanly
        yield sse(error_body_for(exc))
    yield SSE_DONE


def answer_headers(started: services.Started) -> dict[str, str]:
    """What every front door's answer says of its run: the request id, the backend, the
    cascade, the brownout, the demotion and the model's version, where they apply."""
    headers = {"x-request-id": started.job.request_id}
    if started.backend:
        headers["x-fairlane-backend"] = started.backend
    if started.cascade:
        headers["x-fairlane-cascade"] = started.cascade
    if started.brownout:
        headers["x-fairlane-brownout"] = started.brownout
    if started.demoted:
        headers["x-fairlane-demoted"] = started.demoted
    if version := version_tag(started.job.model):
        headers["x-fairlane-model-version"] = version
    return headers


async def _answer(started: services.Started) -> HttpResponseBase:
    headers = answer_headers(started)
    if started.stream:
        return StreamingHttpResponse(
            _sse(started),
            content_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return HttpResponse(
        json_bytes(await services.started_collect(started)),
        content_type="application/json",
        headers=headers,
    )


@openai_view("POST")
async def chat_completions(request, caller):
    started = await services.generation_start(
        runtime=request.runtime, caller=caller, endpoint="chat", body=json_body(request)
    )
    return await _answer(started)


@openai_view("POST")
async def completions(request, caller):
    started = await services.generation_start(
        runtime=request.runtime, caller=caller, endpoint="completion", body=json_body(request)
    )
    return await _answer(started)


@openai_view("POST")
async def embeddings(request, caller):
    return JsonResponse(
        await services.embeddings_create(
            runtime=request.runtime, caller=caller, body=json_body(request)
        )
    )


_created = int(time.time())


@openai_view("GET")
async def models(request, caller):
    available = await database_sync_to_async(services.models_available)(
        runtime=request.runtime, caller=caller
    )
    return JsonResponse(
        {
            "object": "list",
            "data": [model_object(name, _created, context) for name, context in available.items()],
        }
    )


@openai_view("GET")
async def model_detail(request, caller, model_id: str):
    available = await database_sync_to_async(services.models_available)(
        runtime=request.runtime, caller=caller
    )
    if model_id in available:
        return JsonResponse(model_object(model_id, _created, available[model_id]))
    raise ModelNotFound(
        f"The model '{model_id}' does not exist or you do not have access to it.", param="model"
    )
