"""The Celery application, configured from Django settings (CELERY_* names), and the start and
stop of a worker process with its runtime: every worker puts the runtime on the app (its
tasks read `self.app.runtime`); a GPU worker (one consuming FAIRLANE_GPU_QUEUE) also hosts
engines, loads its models and pulls from the fair queue (workers/worker.py).

Named celery_app, not celery: a module named after an installed package would shadow it.
Run a worker with `celery -A celery_app worker` and PYTHONPATH=.:platform.
"""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

app = Celery("fairlane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
_services = None


@signals.worker_ready.connect
def worker_start(sender=None, **kwargs) -> None:
    """Build and start the worker's runtime; a GPU worker loads its models before it
    advertises them, then pulls and heartbeats."""
    global _services
    from django.conf import settings

    from routing.runtimes import runtime_build, runtime_install
    from workers.worker import consumes_gpu_queue, worker_services_start

    is_gpu = sender is not None and consumes_gpu_queue(sender)
    runtime = runtime_install(
        runtime_build(settings.FAIRLANE_ENGINE_MODE, engines=is_gpu), serve=True
    )
    app.runtime = runtime
    if is_gpu:
        _services = worker_services_start(runtime)


@signals.worker_shutdown.connect
def worker_stop(sender=None, **kwargs) -> None:
    """Warm shutdown: stop taking requests, let the running ones finish, stop the loops."""
    from workers.worker import worker_services_stop

    runtime = getattr(app, "runtime", None)
    if runtime is not None:
        worker_services_stop(runtime, _services)
