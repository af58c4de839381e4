"""The /v1 API's own Django handler: the same URLs and views, without the middleware stack.

Django runs each MiddlewareMixin middleware of an async request through two thread hops
(process_request, process_response); with sessions, CSRF, auth, messages and the rest that is
a dozen hops per request, for features an API-key endpoint does not use. /v1 views validate
the Host header and record their own metrics (routing.apis)."""

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

API_PREFIX = "/v1/"


class ApiASGIHandler(ASGIHandler):
    async def __call__(self, scope, receive, send):
        # Django wraps each request in a ThreadSensitiveContext, which gives it an executor of
        # its own: a new thread per request for the request_started/finished signals' sync
        # receivers. /v1 views do their database work on the loop's pool (routing/sync.py),
        # so those receivers share asgiref's one thread instead.
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(handler)


def split_http(api_app, site_app):
    """An ASGI app sending /v1/ to the lean handler and everything else to the full site."""

    async def app(scope, receive, send):
        target = api_app if scope["path"].startswith(API_PREFIX) else site_app
        await target(scope, receive, send)

    return app
