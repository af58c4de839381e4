"""Engine figures for Prometheus, collected at scrape time from the runtime's pool (this
process's engines in the embedded mode, the GPU workers' heartbeats in the distributed one):
the engines' counters, the fair queues' depths (what the autoscaler scales GPU workers on),
models refused at load and the replica pools. `pool_collectors_register` registers them once
per process and points them at the runtime now installed."""

from __future__ import annotations

import collections
import logging

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from workers.models import ServedModel
from workers.serving.catalog import ModelInfo
from workers.serving.request_times import RequestTimesCollector
from workers.serving.runtime import Pool

logger = logging.getLogger(__name__)

GAUGES = {
    "kv_blocks_used": "KV cache blocks holding tokens of live sequences",
    "kv_blocks_free": "KV cache blocks free (including cached, evictable ones)",
    "kv_blocks_total": "KV cache blocks in the pool",
    "num_running": "sequences in the running batch",
    "num_waiting": "sequences waiting to be scheduled",
    "prefix_hit_rate": "share of prompt tokens served from the prefix cache",
    "batch_seqs_mean": "mean sequences per engine step",
    "kv_cache_usage": "share of the KV cache in use (models on vLLM: its kv_cache_usage_perc)",
    "kv_tier_blocks_used": "KV blocks held in the CPU tier",
    "kv_tier_blocks_total": "KV blocks the CPU tier holds at most (0: no tier)",
    # Speculative decoding, with vLLM's definitions.
    "spec_decode_mean_acceptance_length": "1 + accepted draft tokens / drafts",
    "spec_decode_draft_acceptance_rate": "accepted draft tokens / draft tokens",
}
COUNTERS = {
    "num_generated_tokens": "tokens generated",
    "num_preemptions": "sequences preempted (their KV blocks kept in the prefix cache or CPU "
    "tier where they can be, the rest recomputed), for lack of KV blocks or for fairness",
    "num_fair_preemptions": "of those, sequences preempted so that a tenant under its share of "
    "the slots could run (fairness inside the batch)",
    "num_steps": "engine steps",
    "kv_tier_hits": "KV blocks copied back from the CPU tier instead of recomputed",
    "kv_tier_blocks_saved": "KV blocks copied into the CPU tier",
    "kv_tier_blocks_evicted": "KV blocks the full CPU tier evicted (least recently used)",
    "kv_tier_bytes_saved": "bytes copied from the KV cache into the CPU tier",
    "kv_tier_bytes_restored": "bytes copied from the CPU tier back into the KV cache",
    "kv_tier_copy_seconds": "seconds spent copying KV blocks to and from the CPU tier",
    "spec_decode_num_drafts": "speculative steps of a sequence (drafts verified)",
    "spec_decode_num_draft_tokens": "draft tokens proposed and verified",
    "spec_decode_num_accepted_tokens": "draft tokens the target accepted",
}
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"


class PoolCollector:
    """A collector reading the runtime's pool (set when a runtime is installed)."""

    pool: Pool | None = None


class EngineCollector(PoolCollector):
    def describe(self):
        """The families without their values: registering must not reach Redis or engines."""
        return list(self._families().values())

    def _families(self) -> dict:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: GaugeMetricFamily(
                f"fairlane_engine_{name}", help_text, labels=["worker", "model"]
            )
            for name, help_text in GAUGES.items()
        }
        families.update(
            {
                name: CounterMetricFamily(
                    f"fairlane_engine_{name}", help_text, labels=["worker", "model"]
                )
                for name, help_text in COUNTERS.items()
            }
        )
        families[PER_POSITION] = CounterMetricFamily(
            f"fairlane_engine_{PER_POSITION}",
            "draft tokens accepted at each draft position",
            labels=["worker", "model", "position"],
        )
        return families

    def collect(self):
        try:
            stats = self.pool.engine_stats() if self.pool is not None else {}
        except Exception:  # a scrape must not fail because Redis blinked
            logger.exception("engine stats unavailable")
            stats = {}
        families = self._families()
        for (where, model), values in stats.items():
            for name, family in families.items():
                if name == PER_POSITION:
                    for position, count in enumerate(values.get(name) or []):
                        family.add_metric([where, model, str(position)], float(count))
                elif name in values:
                    family.add_metric([where, model], float(values[name]))
        yield from families.values()


# -- the queues: what KEDA / the HPA scale the GPU workers on ----------------------------------


class QueueCollector(PoolCollector):
    """`fairlane_queue_depth{model,lane}` and vLLM's name for the same figure,
    `fairlane_num_requests_waiting{model}` (fair queue plus sequences waiting inside engines)."""

    def describe(self):
        return list(self._families())

    def _families(self):
        return (
            GaugeMetricFamily(
                "fairlane_queue_depth",
                "requests waiting in the fair queue",
                labels=["model", "lane"],
            ),
            GaugeMetricFamily(
                "fairlane_num_requests_waiting",
                "requests waiting for a GPU worker (vLLM's num_requests_waiting)",
                labels=["model"],
            ),
        )

    def collect(self):
        depth, waiting = self._families()
        totals: collections.Counter[str] = collections.Counter()
        try:
            pool = self.pool
            for (model, lane), value in (pool.queue_depths() if pool else {}).items():
                depth.add_metric([model, lane], value)
                totals[model] += value
            for (_, model), stats in (pool.engine_stats() if pool else {}).items():
                totals[model] += int(stats.get("num_waiting", 0))
        except Exception:  # a scrape must not fail because Redis or the database blinked
            logger.exception("queue depths unavailable")
        for model, value in sorted(totals.items()):
            waiting.add_metric([model], value)
        yield depth
        yield waiting


# -- models refused at load (workers/artifacts) ------------------------------------------------


class VerifyCollector(PoolCollector):
    def describe(self):
        return [self._family()]

    def _family(self):
        return CounterMetricFamily(
            "fairlane_model_verify_failures",
            "model loads refused because the model's files failed verification",
            labels=["model", "reason"],
        )

    def collect(self):
        family = self._family()
        try:
            failures = self.pool.verify_failures() if self.pool is not None else {}
            for (model, reason), value in sorted(failures.items()):
                family.add_metric([model, reason], value)
        except Exception:
            logger.exception("verify failure counts unavailable")
        yield family


# -- replica pools: what the autoscaler keeps between a model's minimum and maximum -------------


class ReplicaCollector(PoolCollector):
    """`fairlane_model_replicas{model}` (live workers hosting it), the operator's bounds
    `fairlane_model_replicas_min/max{model}`, and each serving version's share of its requests
    `fairlane_model_version_weight{model,version}`."""

    def describe(self):
        return list(self._families())

    def _families(self):
        return (
            GaugeMetricFamily(
                "fairlane_model_replicas", "live GPU workers hosting the model", labels=["model"]
            ),
            GaugeMetricFamily(
                "fairlane_model_replicas_min",
                "the fewest workers that should host the model",
                labels=["model"],
            ),
            GaugeMetricFamily(
                "fairlane_model_replicas_max",
                "the most workers that should host the model",
                labels=["model"],
            ),
            GaugeMetricFamily(
                "fairlane_model_version_weight",
                "percent of the model's requests its version takes",
                labels=["model", "version"],
            ),
        )

    def collect(self):
        replicas, low, high, weight = self._families()
        try:
            workers = self.pool.worker_states() if self.pool is not None else []
            hosting = collections.Counter(model for worker in workers for model in worker.engines)
            for row in ServedModel.objects.filter(is_enabled=True).prefetch_related("versions"):
                replicas.add_metric([row.name], hosting[row.name])
                low.add_metric([row.name], row.min_replicas)
                high.add_metric([row.name], row.max_replicas)
                for label, _, _, share in ModelInfo.of(row).versions:
                    weight.add_metric([row.name, label], share)
        except Exception:  # a scrape must not fail because Redis or the database blinked
            logger.exception("replica counts unavailable")
        yield from (replicas, low, high, weight)


COLLECTORS = (EngineCollector(), QueueCollector(), VerifyCollector(), ReplicaCollector())
TIMES = RequestTimesCollector()
_registered = False


def pool_collectors_register(pool: Pool, client) -> None:
    """Register this process's pool collectors (once) and point them at the runtime's `pool`
    and Redis `client`."""
    global _registered
    if not _registered:
        for collector in (*COLLECTORS, TIMES):
            REGISTRY.register(collector)
        _registered = True
    for collector in COLLECTORS:
        collector.pool = pool
    TIMES.client = client
