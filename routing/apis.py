"""The OpenAI-compatible /v1 API: async views that authenticate, call one service and render
JSON or an SSE stream. Errors have OpenAI's body and status, so client libraries raise their
proper exception classes."""

from __future__ import annotations

import functools
import json
import logging
import time

import orjson
from channels.db import database_sync_to_async
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from routing import services
from routing.admission import caller_authenticate, caller_cached
from routing.drain import Drained, drain
from routing.errors import ServiceUnavailable
from routing.metrics import API_REQUESTS, API_RESPONSE_START
from routing.sync import db_call
from routing.wire.render import (
    SSE_DONE, Chunk, ErrorChunk, UsageChunk, json_bytes, model_object, sse,
)
from tenants.apis.errors import error_response
from tenants.errors import (
    ApplicationError, InvalidRequest, MethodNotAllowed, ModelNotFound, error_body_for,
    error_from_code,
)
from workers.engine import EngineError
from workers.outbox import TRANSIENT
from workers.trace import Span, span_start, trace_enter
from workers.versions import version_tag

logger = logging.getLogger(__name__)


def openai_view(method: str):
    """API-key auth (no cookies, so no CSRF), one method, errors in OpenAI's shape."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            started = time.perf_counter()
            drain.install()
            # The request's span, under the caller's trace when it sent one; current for the
            # rest of this request's task (the view, then its stream).
            span = span_start(f"{method} {request.path}", kind="server",
                              parent=request.headers.get("traceparent"))
            trace_enter(span.trace, received=time.time())
            try:
                request.get_host()  # ALLOWED_HOSTS, which CommonMiddleware checks for the rest
                if request.method != method:
                    raise MethodNotAllowed(f"Use {method} for {request.path}.")
                authorization = request.headers.get("Authorization")
                caller = caller_cached(authorization=authorization) or await db_call(
                    caller_authenticate)(authorization=authorization)
                async with drain.watch():  # a shutdown's deadline cuts it cleanly
                    response = await view(request, caller, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - each is answered by _refusal
                response = _refusal(request, exc)
            API_REQUESTS.labels(view.__name__, response.status_code).inc()
            API_RESPONSE_START.labels(view.__name__).observe(time.perf_counter() - started)
            response["x-fairlane-trace-id"] = span.trace.trace_id
            span.set(**{"http.response.status_code": response.status_code,
                        "fairlane.request_id": response.get("x-request-id")})
            if response.status_code >= 500:
                span.fail(f"HTTP {response.status_code}")
            if response.streaming:
                response.streaming_content = _span_ending(response.streaming_content, span)
            else:
                span.end()
            return response

        return wrapper

    return decorate


def _refusal(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The OpenAI-shaped answer to what a view raised; anything else is raised again."""
    match exc:
        case DisallowedHost():
            return error_response(InvalidRequest("Invalid Host header."))
        case ApplicationError():
            return error_response(exc)
        case EngineError():  # the engine refused the input (e.g. a token id)
            return error_response(error_from_code(exc.code, exc.message, param=exc.param))
        case _ if isinstance(exc, TRANSIENT):  # the database blinked: retry
            logger.warning("%s %s: the database did not answer", request.method, request.path,
                           exc_info=exc)
            return error_response(ServiceUnavailable(retry_after=2))
    raise exc


async def _span_ending(chunks, span: Span):
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        span.end()


def _json_body(request: HttpRequest):
    if request.content_type != "application/json":
        raise InvalidRequest("Send a JSON body with Content-Type: application/json.")
    try:
        body = request.body
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:  # the stdlib's reading (NaN, a lone surrogate, ...)
            return json.loads(body)
    except RequestDataTooBig:
        raise InvalidRequest("The request body is too large.") from None
    except RecursionError:
        raise InvalidRequest("The JSON body is nested too deeply.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None


async def _sse(started: services.Started):
    try:
        async with drain.watch():
            async for chunk in services.started_chunks(started):
                match chunk:
                    case Chunk(body=body) | UsageChunk(body=body):
                        yield sse(body)
                    case ErrorChunk(error=error):
                        yield sse(error_body_for(error))
    except Drained as exc:  # the process is shutting down: end the stream cleanly
        yield sse(error_body_for(exc))
    yield SSE_DONE


async def _answer(started: services.Started) -> HttpResponse:
    headers = {"x-request-id": started.job.request_id}
    if started.backend:
        headers["x-fairlane-backend"] = started.backend
    if started.cascade:
        headers["x-fairlane-cascade"] = started.cascade
    if started.brownout:
        headers["x-fairlane-brownout"] = started.brownout
    if version := version_tag(started.job.model):
        headers["x-fairlane-model-version"] = version
    if started.stream:
        return StreamingHttpResponse(
            _sse(started), content_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return HttpResponse(json_bytes(await services.started_collect(started)),
                        content_type="application/json", headers=headers)


@openai_view("POST")
async def chat_completions(request, caller):
    started = await services.generation_start(caller=caller, endpoint="chat",
                                              body=_json_body(request))
    return await _answer(started)


@openai_view("POST")
async def completions(request, caller):
    started = await services.generation_start(caller=caller, endpoint="completion",
                                              body=_json_body(request))
    return await _answer(started)


@openai_view("POST")
async def embeddings(request, caller):
    return JsonResponse(await services.embeddings_create(caller=caller, body=_json_body(request)))


_created = int(time.time())


@openai_view("GET")
async def models(request, caller):
    available = await database_sync_to_async(services.models_available)(caller=caller)
    return JsonResponse({"object": "list",
                         "data": [model_object(name, _created) for name in available]})


@openai_view("GET")
async def model_detail(request, caller, model_id: str):
    available = await database_sync_to_async(services.models_available)(caller=caller)
    if model_id in available:
        return JsonResponse(model_object(model_id, _created))
    raise ModelNotFound(f"The model '{model_id}' does not exist or you do not have access to it.",
                        param="model")
