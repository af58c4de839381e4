"""The /v1 API's own Django handler: the same URLs and views, without the middleware stack.

Django runs each MiddlewareMixin middleware of an async request through two thread hops
(process_request, process_response); with sessions, CSRF, auth, messages and the rest that is
a dozen hops per request, for features an API-key endpoint does not use. /v1 views validate
the Host header and record their own metrics (routing.apis).

The request signals' receivers are called in place. Django's handler would run them on
asgiref's one thread: two hops per request, each queued behind every other request's. Django's
own (close_old_connections, reset_queries, close_caches) are skipped: they have nothing to do
on the loop's thread, which holds no database connection (views do their database work on pool
threads that close their own, routing/sync.py), and walking the connections is a profile's
measurable share of a gateway request. Any other receiver is called as Django would
(docs/benchmarks.md has the figures)."""

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

from django import db
from django.conf import settings
from django.core import cache, signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix

from routing.runtimes import runtime_installed

API_PREFIX = "/v1/"
# Paths whose view is known (resolving shows in a gateway request's profile); bounded, since
# /v1/models/<id> takes any id.
RESOLVED_MAX = 256
# Django's receivers of the request signals that find nothing to do on the loop's thread.
_LOOP_IDLE = frozenset({db.reset_queries, db.close_old_connections, cache.close_caches})


def signal_send(signal, sender, **named) -> None:
    """`signal.send`, skipping Django's own receivers that are idle on the loop's thread."""
    for receiver in signal._live_receivers(sender)[0]:  # the synchronous ones
        if receiver not in _LOOP_IDLE:
            receiver(signal=signal, sender=sender, **named)


def response_close(response) -> None:
    """What Django's HttpResponseBase.close does, with the signal sent by signal_send."""
    for closer in response._resource_closers:
        with contextlib.suppress(Exception):
            closer()
    response._resource_closers.clear()
    response.closed = True
    signal_send(signals.request_finished, response._handler_class)


def loop_threads(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's pool for blocking calls: FAIRLANE_API_THREADS threads, not asyncio's default
    of cores + 4 (see the setting): with few threads, many clients' reservations and
    settlements queue for them; `bench gateway --baseline` measures the difference."""
    if settings.FAIRLANE_API_THREADS:
        loop.set_default_executor(
            ThreadPoolExecutor(settings.FAIRLANE_API_THREADS, thread_name_prefix="fairlane-api")
        )


class ApiASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.resolved: dict = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope, receive, send):
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # uvicorn makes the loop (no lifespan): its first request
            self.loop = loop
            loop_threads(loop)
        # Django wraps each request in a ThreadSensitiveContext, which gives it an executor of
        # its own: a new thread per request for the request_started/finished signals' sync
        # receivers. /v1 views do their database work on the loop's pool (routing/sync.py),
        # and those receivers are called in place (handle, below).
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        """Django's ASGIHandler.handle (5.2), with the signals sent and the response closed in
        place rather than on asgiref's thread."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        signal_send(signals.request_started, self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            response_close(error_response)
            return

        async def process_request(request, send):
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client left while the answer was sent
            return response

        # The disconnect listener goes first: it cancels the view when the client leaves.
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            signal_send(signals.request_finished, self.__class__)
        else:
            response_close(response)
        body_file.close()

    def create_request(self, scope, body_file):
        request, error_response = super().create_request(scope, body_file)
        if request is not None:
            request.runtime = runtime_installed()
        return request, error_response

    def resolve_request(self, request):
        """Django's resolution, kept per path: /v1's URLs never change while a process runs."""
        match = self.resolved.get(request.path_info)
        if match is None:
            match = super().resolve_request(request)  # Resolver404 for an unknown path
            if len(self.resolved) < RESOLVED_MAX:
                self.resolved[request.path_info] = match
        request.resolver_match = match
        return match

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(handler)


class RuntimeScope:
    """An ASGI wrapper that puts the process's runtime on a connection's scope (the websocket
    consumers read `scope["runtime"]`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        await self.app({**scope, "runtime": runtime_installed()}, receive, send)


def split_http(api_app, site_app):
    """An ASGI app sending /v1/ to the lean handler and everything else to the full site."""

    async def app(scope, receive, send):
        target = api_app if scope["path"].startswith(API_PREFIX) else site_app
        await target(scope, receive, send)

    return app
