"""Each API process's circuit breakers, made visible beyond it.

Breakers and requests in flight are per API process (see routing/breaker.py). A process that
routes requests publishes them every PUBLISH_SECONDS from a thread (never on the request path):
to Redis, where the ops dashboard adds them up (`processes_breakers`: the processes are listed in
a sorted set, tenants/presence.py, read on each refresh without a SCAN of the keyspace), and, in the
multiprocess mode of /metrics, to gauges the scrape adds up (in flight: summed over live
processes; circuit state: the most open)."""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from prometheus_client import Gauge

from routing.breaker import breakers
from tenants.loops import BackgroundLoop
from tenants.presence import Presence

logger = logging.getLogger(__name__)

PUBLISH_SECONDS = 2.0
TTL_SECONDS = 10
PROCESSES = Presence(index="fl:ops:procs", prefix="fl:ops:proc:")
STATES = {"closed": 0, "half_open": 1, "open": 2}


def _snapshot() -> dict[str, dict]:
    return {
        name: {"state": breakers.state(name), "inflight": s["inflight"]}
        for name, s in breakers.snapshot().items()
    }


class BreakerPublisher:
    """The runtime's publisher of this process's breakers (`client`: its Redis, or None),
    started by the first request it routes."""

    def __init__(self, client) -> None:
        self.client = client
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self._gauges = None
        self._published = False
        self.loop = BackgroundLoop(
            "breakers-publisher",
            self.publish,
            interval=lambda: PUBLISH_SECONDS,
            final=self.withdraw,
        )

    def publish(self) -> None:
        snapshot = _snapshot()
        if self.client is not None:
            pipe = self.client.pipeline(transaction=False)
            payload = json.dumps({"ts": time.time(), "backends": snapshot})
            PROCESSES.write(pipe, self.id, payload, TTL_SECONDS)
            pipe.execute()
            self._published = True
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            inflight, circuit = self._multiprocess_gauges()
            for name, state in snapshot.items():
                inflight.labels(name).set(state["inflight"])
                circuit.labels(name).set(STATES.get(state["state"], 0))

    def withdraw(self) -> None:
        """The process stops routing (its loop stops): its breakers leave the dashboard now."""
        if self.client is not None and self._published:
            PROCESSES.withdraw(self.client, self.id)

    def _multiprocess_gauges(self):
        if self._gauges is None:
            self._gauges = (
                Gauge(
                    "fairlane_backend_inflight",
                    "requests in flight at the backend (every live API process)",
                    ["backend"],
                    multiprocess_mode="livesum",
                    registry=None,
                ),
                Gauge(
                    "fairlane_backend_circuit_state",
                    "the most open circuit of any live API process: 0 closed, 1 half-open, 2 open",
                    ["backend"],
                    multiprocess_mode="livemax",
                    registry=None,
                ),
            )
        return self._gauges


def processes_breakers(client) -> dict[str, dict]:
    """Per backend, over every API process that published lately (`client`: the runtime's
    Redis; this process alone without it): requests in flight (summed) and how many processes
    have its circuit in each state."""
    if client is None:
        beats = [{"backends": _snapshot()}]
    else:
        beats = [json.loads(raw) for raw in PROCESSES.read(client)]
    totals: dict[str, dict] = {}
    for beat in beats:
        for name, state in beat["backends"].items():
            entry = totals.setdefault(
                name, {"inflight": 0, "processes": 0, "closed": 0, "half_open": 0, "open": 0}
            )
            entry["inflight"] += state["inflight"]
            entry["processes"] += 1
            entry[state["state"]] = entry.get(state["state"], 0) + 1
    return totals
