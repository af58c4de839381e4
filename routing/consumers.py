"""Websocket streaming of the /v1 API at /ws/v1/chat: several requests at once per socket,
told apart by client-chosen ids.

Client frames (JSON text):
  {"type": "auth", "api_key": "fl-..."}     unless the handshake sent Authorization: Bearer
  {"type": "chat.completions", "id": "a1", "body": {...same body as POST /v1/chat/completions},
   "traceparent": "00-..." (optional; else the handshake's traceparent header, else a new trace)}
  {"type": "completions", "id": "b1", "body": {...same body as POST /v1/completions}}
  {"type": "messages", "id": "c1", "body": {...same body as POST /v1/messages}}
  {"type": "responses", "id": "d1", "body": {...same body as POST /v1/responses}}
  {"type": "cancel", "id": "a1"}
Server frames:
  {"type": "auth.ok", "tenant": ..., "agent": ...}
  {"type": "chunk", "id": "a1", "data": <the SSE chunk object (a Responses event for responses)>}
  {"type": "event", "id": "c1", "event": <Anthropic's event name>, "data": <its object>}
  {"type": "done", "id": "a1", "usage": {...}, "trace_id": "<32 hex>"}
  {"type": "error", "id": "a1" | null, "error": {"message", "type", "code", "param"}}
A bad frame gets an error frame and the socket stays open; failed authentication closes it
with code 4001 after the error frame.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path

from routing import services
from routing.admission import Caller, caller_authenticate
from routing.drain import drain
from routing.responses.services import response_events, response_start
from routing.services import messages
from routing.wire.body import json_load
from routing.wire.render import Chunk, UsageChunk
from tenants.errors import (
    DATABASE_TRANSIENT,
    ApplicationError,
    AuthenticationFailed,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    error_body_for,
)
from workers.serving.trace import span_start, trace_current, trace_enter

logger = logging.getLogger(__name__)

MAX_REQUESTS_PER_SOCKET = 32
AUTH_TIMEOUT_SECONDS = 10
CLOSE_AUTH_FAILED = 4001
CLOSE_TRY_AGAIN = 1013  # RFC 6455: try again later
# A request frame's type -> the /v1 endpoint it stands for.
ENDPOINTS = {
    "chat.completions": "chat",
    "completions": "completion",
    "messages": "messages",
    "responses": "responses",
}


class CompletionConsumer(AsyncWebsocketConsumer):
    # No channel layer: nothing is sent to these sockets through one (a run's tokens come
    # from its own stream). With the Redis layer every socket held a blocking read on Redis
    # that outlasted redis-py's default 5 s socket timeout: the consumer crashed and the
    # socket was dropped without a close frame after 5 s.
    channel_layer_alias = "no channel layer"

    async def connect(self) -> None:
        drain.install()
        self.caller: Caller | None = None
        self.runs: dict[str, asyncio.Task] = {}
        headers = dict(self.scope.get("headers", []))
        authorization = headers.get(b"authorization", b"").decode("latin1")
        await self.accept()
        if authorization:
            await self._authenticate(authorization)
        else:
            self.auth_timer = asyncio.get_running_loop().call_later(
                AUTH_TIMEOUT_SECONDS, lambda: asyncio.ensure_future(self._auth_timeout())
            )

    async def _auth_timeout(self) -> None:
        if self.caller is None:
            await self._send_error(None, AuthenticationFailed("No auth frame in time."))
            await self.close(code=CLOSE_AUTH_FAILED)

    async def _authenticate(self, authorization: str) -> None:
        try:
            caller = await database_sync_to_async(caller_authenticate)(authorization=authorization)
        except DATABASE_TRANSIENT:
            await self._send_error(None, ServiceUnavailable(retry_after=2))
            await self.close(code=CLOSE_TRY_AGAIN)
            return
        except ApplicationError as exc:
            await self._send_error(None, exc)
            await self.close(code=CLOSE_AUTH_FAILED)
            return
        self.caller = caller
        await self._send(
            {"type": "auth.ok", "tenant": caller.tenant.slug, "agent": caller.agent.name}
        )

    async def disconnect(self, code) -> None:
        if getattr(self, "auth_timer", None) is not None:
            self.auth_timer.cancel()
        for task in self.runs.values():
            task.cancel()  # each run's stream closes, which aborts it in the engine

    async def close(self, code=None, reason=None) -> None:
        """Close once. Frames the client sent before it read our close are ignored: answering
        them sent after the close, which the ASGI server refuses (and it was logged as a
        crash)."""
        if getattr(self, "is_closing", False):
            return
        self.is_closing = True
        await super().close(code=code, reason=reason)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """One frame; whatever it holds, the socket stays open (a frame is a process
        boundary: a bug of ours is logged and answered with an error frame)."""
        if getattr(self, "is_closing", False):
            return
        try:
            await self._receive(text_data, bytes_data)
        except Exception:
            logger.exception("websocket frame failed")
            await self._send_error(None, ApplicationError())

    async def _receive(self, text_data, bytes_data) -> None:
        try:
            frame = json_load(text_data if text_data is not None else bytes_data or b"")
        except InvalidRequest as exc:
            await self._send_error(None, exc)
            return
        if not isinstance(frame, dict):
            await self._send_error(None, InvalidRequest("Frames must be JSON objects."))
            return
        frame_type, frame_id = frame.get("type"), frame.get("id")
        if frame_type == "auth":
            if self.caller is None:
                await self._authenticate(f"Bearer {frame.get('api_key') or ''}")
            return
        if self.caller is None:
            await self._send_error(frame_id, AuthenticationFailed("Authenticate first."))
            await self.close(code=CLOSE_AUTH_FAILED)
            return
        if frame_type == "cancel":
            task = self.runs.get(frame_id) if isinstance(frame_id, str) else None
            if task is None:
                await self._send_error(
                    frame_id, InvalidRequest("No such request in flight.", param="id")
                )
            else:
                task.cancel()
            return
        if not isinstance(frame_type, str) or frame_type not in ENDPOINTS:
            await self._send_error(
                frame_id,
                InvalidRequest(
                    f"Unknown frame type {frame_type!r}; use auth, {', '.join(ENDPOINTS)} "
                    "or cancel.",
                    param="type",
                ),
            )
            return
        if not isinstance(frame_id, str) or not 0 < len(frame_id) <= 64 or frame_id in self.runs:
            await self._send_error(
                frame_id,
                InvalidRequest(
                    "Each request needs a new string id of up to 64 characters.", param="id"
                ),
            )
            return
        if len(self.runs) >= MAX_REQUESTS_PER_SOCKET:
            await self._send_error(
                frame_id,
                RateLimited(
                    f"At most {MAX_REQUESTS_PER_SOCKET} requests in flight per socket.",
                    retry_after=1,
                ),
            )
            return
        body = frame.get("body")
        if isinstance(body, dict):
            body = {**body, "stream": True}
            if frame_type not in {"messages", "responses"}:
                body["stream_options"] = {"include_usage": True}
        # The request's trace: the frame's own `traceparent`, else the handshake's.
        parent = frame.get("traceparent")
        if not isinstance(parent, str):
            parent = dict(self.scope.get("headers", [])).get(b"traceparent", b"").decode("latin-1")
        task = asyncio.create_task(self._run(frame_id, ENDPOINTS[frame_type], body, parent))
        self.runs[frame_id] = task
        task.add_done_callback(functools.partial(self._run_ended, frame_id))

    def _run_ended(self, frame_id: str, _task: asyncio.Task) -> None:
        self.runs.pop(frame_id, None)

    async def _run(self, frame_id: str, endpoint: str, body, traceparent: str) -> None:
        span = span_start(f"WS {endpoint}", kind="server", parent=traceparent, frame=frame_id)
        trace_enter(span.trace, received=time.time())  # this task is the request's own
        try:
            async with drain.watch():  # a shutdown's deadline cuts it cleanly
                await self._stream(frame_id, endpoint, body)
        except ApplicationError as exc:
            await self._send_error(frame_id, exc)
        except DATABASE_TRANSIENT:  # the database blinked: retry
            logger.warning("websocket request %s: the database did not answer", frame_id)
            await self._send_error(frame_id, ServiceUnavailable(retry_after=2))
        except asyncio.CancelledError:
            await self._send({"type": "done", "id": frame_id, "cancelled": True})
            raise
        except Exception:  # a consumer task is a process boundary: log, tell the client
            logger.exception("websocket request %s failed", frame_id)
            await self._send_error(frame_id, ApplicationError())
        finally:
            span.end()

    @property
    def _caller(self) -> Caller:
        """The socket's caller: frames before authentication are refused in _receive."""
        if self.caller is None:
            raise AuthenticationFailed("Authenticate first.")
        return self.caller

    async def _stream(self, frame_id: str, endpoint: str, body) -> None:
        if endpoint == "messages":
            await self._stream_messages(frame_id, body)
            return
        if endpoint == "responses":
            await self._stream_response(frame_id, body)
            return
        started = await services.generation_start(
            runtime=self.scope["runtime"], caller=self._caller, endpoint=endpoint, body=body
        )
        async for rendered in services.started_chunks(started):
            match rendered:
                case Chunk(body=chunk):
                    await self._send({"type": "chunk", "id": frame_id, "data": chunk})
                case UsageChunk(body=chunk):
                    await self._send(
                        {
                            "type": "done",
                            "id": frame_id,
                            "usage": chunk["usage"],
                            "trace_id": _trace_id(),
                        }
                    )
                case ApplicationError() as error:
                    await self._send_error(frame_id, error)

    async def _stream_messages(self, frame_id: str, body) -> None:
        """Anthropic's events, one frame each; `done` with the message's usage."""
        started = await messages.messages_start(
            runtime=self.scope["runtime"], caller=self._caller, body=body
        )
        usage = None
        async for name, data in messages.messages_stream(started):
            await self._send({"type": "event", "id": frame_id, "event": name, "data": data})
            if name == "message_delta":
                usage = data.get("usage")
            elif name == "message_stop":
                await self._send(
                    {"type": "done", "id": frame_id, "usage": usage, "trace_id": _trace_id()}
                )

    async def _stream_response(self, frame_id: str, body) -> None:
        """The Responses API's events as chunks; `done` carries the usage of the last."""
        response = await response_start(
            runtime=self.scope["runtime"], caller=self._caller, body=body
        )
        last: dict = {}
        async for group in response_events(response):
            for event in group:
                last = event
                await self._send({"type": "chunk", "id": frame_id, "data": event})
        await self._send(
            {
                "type": "done",
                "id": frame_id,
                "usage": last["response"]["usage"],
                "trace_id": _trace_id(),
            }
        )

    async def _send(self, frame: dict) -> None:
        if getattr(self, "is_gone", False) or getattr(self, "is_closing", False):
            return
        try:
            await self.send(text_data=json.dumps(frame, separators=(",", ":")))
        except Exception as exc:  # the socket is gone: stop its requests (each is settled)
            self.is_gone = True
            logger.warning(
                "websocket send failed (%s: %s); cancelling its %d request(s): %s",
                type(exc).__name__,
                exc,
                len(self.runs),
                sorted(self.runs),
            )
            for task in list(self.runs.values()):
                task.cancel()  # the run sending this one too: it stops at its next await

    async def _send_error(self, frame_id, exc: ApplicationError) -> None:
        await self._send(error_frame(exc, frame_id))


def error_frame(exc: ApplicationError, frame_id: str | None) -> dict:
    """The one websocket rendering of an application error: the same body as HTTP's. The
    frame's id is echoed only when it is one a request could have had."""
    if not (isinstance(frame_id, str) and len(frame_id) <= 64):
        frame_id = None
    return {"type": "error", "id": frame_id, **error_body_for(exc)}


# API-key authenticated, so no Origin check: a cross-site page cannot ride a cookie here.
websocket_urlpatterns = [
    path("ws/v1/chat", CompletionConsumer.as_asgi()),
]


def _trace_id() -> str | None:
    """The request's trace id, for its `done` frame (the task's current trace)."""
    current = trace_current()
    trace = current.trace if current is not None else None
    return trace.trace_id if trace is not None else None
