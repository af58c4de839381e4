from django.apps import AppConfig

_collector_registered = False


class WorkersConfig(AppConfig):
    name = "workers"

    def ready(self) -> None:
        global _collector_registered
        if not _collector_registered:
            from prometheus_client import REGISTRY

            from workers.metrics import EngineCollector

            REGISTRY.register(EngineCollector())
            _collector_registered = True
