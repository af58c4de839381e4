from django.apps import AppConfig

_collector_registered = False


class WorkersConfig(AppConfig):
    name = "workers"

    def ready(self) -> None:
        # The GPU worker's Celery signal handlers (load engines, heartbeat, drain on shutdown).
        import workers.worker  # noqa: F401
        from workers.modes import mode_get

        mode_get()  # embedded or distributed: chosen once, here

        global _collector_registered
        if not _collector_registered:
            from prometheus_client import REGISTRY

            from workers.metrics import (
                EngineCollector, QueueCollector, ReplicaCollector, VerifyCollector,
            )
            from workers.request_times import RequestTimesCollector

            REGISTRY.register(EngineCollector())
            REGISTRY.register(RequestTimesCollector())
            REGISTRY.register(QueueCollector())
            REGISTRY.register(VerifyCollector())
            REGISTRY.register(ReplicaCollector())
            _collector_registered = True
