"""The Celery application, configured from Django settings (CELERY_* names).

Named celery_app, not celery: a module named after an installed package would shadow it.
Run a worker with `celery -A celery_app worker` and PYTHONPATH=.:platform.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

app = Celery("fairlane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
