from django.apps import AppConfig


class WorkersConfig(AppConfig):
    """The GPU workers, the model catalog and artifacts. What runs where (embedded or
    distributed) is the runtime's, built by each process's start-up (routing/runtimes.py)."""

    name = "workers"
