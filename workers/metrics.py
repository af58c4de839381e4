"""Engine figures for Prometheus, collected at scrape time: this process's engines in the
embedded mode, the GPU workers' heartbeats in the distributed one."""

from __future__ import annotations

import logging

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

GAUGES = {
    "kv_blocks_used": "KV cache blocks holding tokens of live sequences",
    "kv_blocks_free": "KV cache blocks free (including cached, evictable ones)",
    "kv_blocks_total": "KV cache blocks in the pool",
    "num_running": "sequences in the running batch",
    "num_waiting": "sequences waiting to be scheduled",
    "prefix_hit_rate": "share of prompt tokens served from the prefix cache",
    "batch_seqs_mean": "mean sequences per engine step",
}
COUNTERS = {
    "num_generated_tokens": "tokens generated",
    "num_preemptions": "sequences preempted (recomputed later) for lack of KV blocks",
    "num_steps": "engine steps",
}


def engine_stats() -> dict[tuple[str, str], dict]:
    """(where, model) -> the engine's counters."""
    if settings.FAIRLANE_ENGINE_MODE == "embedded":
        from workers.host import host_get

        return {("embedded", model): stats for model, stats in host_get().stats().items()}
    from workers.worker import workers_live

    return {(beat["id"], model): stats for beat in workers_live()
            for model, stats in beat.get("stats", {}).items()}


class EngineCollector:
    def describe(self):
        """The families without their values: registering must not reach Redis or engines."""
        return list(self._families().values())

    def _families(self) -> dict:
        families = {name: GaugeMetricFamily(f"fairlane_engine_{name}", help_text,
                                            labels=["worker", "model"])
                    for name, help_text in GAUGES.items()}
        families.update({name: CounterMetricFamily(f"fairlane_engine_{name}", help_text,
                                                   labels=["worker", "model"])
                         for name, help_text in COUNTERS.items()})
        return families

    def collect(self):
        try:
            stats = engine_stats()
        except Exception:  # a scrape must not fail because Redis blinked
            logger.exception("engine stats unavailable")
            stats = {}
        families = self._families()
        for (where, model), values in stats.items():
            for name, family in families.items():
                if name in values:
                    family.add_metric([where, model], float(values[name]))
        yield from families.values()
