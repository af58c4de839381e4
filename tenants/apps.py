from django.apps import AppConfig

_collector_registered = False


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        global _collector_registered
        from tenants import cache
        from tenants.models import Agent, ApiKey, Budget, BudgetWindow, Tenant

        # Windows too: a cached window row that was deleted must not be held against (their
        # counters change by UPDATE, which sends no signal and needs none: never cached).
        cache.connect(ApiKey, Tenant, Agent, Budget, BudgetWindow)
        if not _collector_registered:
            from prometheus_client import REGISTRY

            from tenants.metrics import SharedCountsCollector

            REGISTRY.register(SharedCountsCollector())
            _collector_registered = True
