"""ASGI entry point: HTTP through Django, websockets through Channels.

Serve with `uvicorn asgi:application` and PYTHONPATH=.:platform (see the Makefile).
"""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django_asgi_app = get_asgi_application()  # populates the app registry before routing imports

# The Celery app must be the current app before any shared task is sent, or tasks go to
# Celery's default broker instead of ours.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from routing.batches.runner import batch_runner_start  # noqa: E402
from routing.consumers import websocket_urlpatterns  # noqa: E402
from routing.runtimes import runtime_serve  # noqa: E402

import celery_app  # noqa: E402, F401
from api_handler import ApiASGIHandler, RuntimeScope, split_http  # noqa: E402

# The process's runtime, built once from FAIRLANE_ENGINE_MODE (unless its start-up installed
# one already) and handed to every request (request.runtime) and websocket (scope["runtime"]).
batch_runner_start(runtime_serve())

application = ProtocolTypeRouter(
    {
        "http": split_http(ApiASGIHandler(), django_asgi_app),
        # Routes wrap themselves in an Origin check where they use cookies; the /v1 sockets
        # authenticate with API keys, which programs send without an Origin header.
        "websocket": RuntimeScope(URLRouter(websocket_urlpatterns)),
    }
)

# What start-up built (Django's apps and URL patterns, the models, the runtime's caches) lives
# as long as the process: frozen out of the cyclic collector's reach, so that its collections no
# longer walk it on the request path; and the youngest generation is collected once 7,000 more
# objects were made than freed rather than 700, by when most of a request's are gone. Under 16
# clients this took the collector from 4.3 % of an API process's CPU to 1.0-1.2 % (perf,
# docs/benchmarks.md).
gc.collect()
gc.freeze()
gc.set_threshold(7000, 10, 10)
