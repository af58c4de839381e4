"""The site's own middleware: static files through WhiteNoise without leaving the async
request path, and the runtime on every request.

WhiteNoise's middleware is sync-only, and one sync-only middleware makes Django run every
request (the streaming /v1 API included) through thread hops. This wrapper is async-capable
and asks WhiteNoise only about paths under STATIC_URL: a dictionary lookup and a file open.
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from whitenoise.middleware import WhiteNoiseMiddleware

from routing.runtimes import runtime_installed


class StaticFilesMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        self.whitenoise = WhiteNoiseMiddleware(get_response=None)
        self.prefix = "/" + settings.STATIC_URL.strip("/") + "/"

    def _static(self, request):
        if not request.path_info.startswith(self.prefix):
            return None
        whitenoise = self.whitenoise
        found = (
            whitenoise.find_file(request.path_info)
            if whitenoise.autorefresh
            else whitenoise.files.get(request.path_info)
        )
        return whitenoise.serve(found, request) if found is not None else None

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return self._static(request) or self.get_response(request)

    async def _acall(self, request):
        return self._static(request) or await self.get_response(request)


class RuntimeMiddleware:
    """Puts the process's runtime (routing/runtimes.py) on every request of the site: the ops
    dashboard, /readyz and the pages read the pool and the counters through it."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        request.runtime = runtime_installed()
        return self.get_response(request)  # awaited by the caller when it is async
