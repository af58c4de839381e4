from django.apps import AppConfig

_collector_registered = False


class RoutingConfig(AppConfig):
    name = "routing"

    def ready(self) -> None:
        global _collector_registered
        if not _collector_registered:
            from prometheus_client import REGISTRY

            from routing.metrics import BackendCollector

            REGISTRY.register(BackendCollector())
            _collector_registered = True
