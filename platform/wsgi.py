"""WSGI entry point (management API and pages only; streaming and websockets need asgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
application = get_wsgi_application()

# The Celery app must be the current app before any shared task is sent, or tasks go to
# Celery's default broker instead of ours.
import celery_app  # noqa: E402, F401
