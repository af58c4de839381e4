"""Durable settlement: a request's charge is never lost because the ledger was unreachable.

Every run is settled where it ends (`Outbox.settle`, the runtime's): at once when the database
answers, which is the usual case. When it does not (a connection refused or cut, a
pool timeout), the settlement becomes a record keyed by its request id in an outbox, retried
until `budget_settle` succeeds. `budget_settle` is idempotent per request id (the ledger's
request_id is unique), so a record applied twice charges once.

- Distributed: a Redis stream (`fl:settle`, prefixed by FAIRLANE_QUEUE_NAMESPACE) read by the
  consumer group `settlers`. Every API process and GPU worker that settles retries it from a
  loop of its own, and the beat's `workers.tasks.settlements_retry` too; an entry a consumer
  took but did not finish (it died) is claimed by another after a minute.
- Embedded (and when Redis is down as well): one JSON file per record under
  FAIRLANE_SETTLEMENT_DIR/<database>, retried by the process that owns that directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from redis import Redis

from tenants.errors import DATABASE_TRANSIENT, NotFound
from tenants.loops import BackgroundLoop
from tenants.models import Tenant
from tenants.services.budgets import budget_release
from tenants.services.ledger import Usage, budget_settle

logger = logging.getLogger(__name__)

GROUP = "settlers"
CLAIM_IDLE_MS = 60_000
IDLE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Settlement:
    """One request's charge, as settled by whoever ran it."""

    request_id: str
    tenant_id: int
    cost_microcents: int
    usage: dict[str, Any]  # Usage's fields
    at: float  # when it was settled (epoch seconds): the ledger row's time
    release: bool = False  # free the hold and record nothing (the request never ran)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Settlement:
        return cls(**json.loads(raw))


def settlement_apply(record: Settlement) -> None:
    if record.release:
        try:
            budget_release(tenant=Tenant(pk=record.tenant_id), request_id=record.request_id)
        except NotFound:  # its reservation never committed: nothing is held
            pass
        return
    budget_settle(
        tenant=Tenant(pk=record.tenant_id),
        request_id=record.request_id,
        cost_microcents=record.cost_microcents,
        usage=Usage(**record.usage),
        now=datetime.fromtimestamp(record.at, UTC),
    )


def _apply(record: Settlement) -> bool:
    """Settle one record: True when it is done with (settled, or refused for good and logged),
    False when the ledger is unreachable (keep it)."""
    try:
        settlement_apply(record)
        return True
    except DATABASE_TRANSIENT:  # the ledger is unreachable: worth retrying
        return False
    except Exception:  # a record that can never settle (its reservation is gone): say so
        logger.exception("request %s: settlement refused; dropping it", record.request_id)
        return True
    finally:
        close_old_connections()


class FileOutbox:
    """Records as files, one per request id (written atomically, removed once settled)."""

    def __init__(self, root: Path) -> None:
        database = settings.DATABASES["default"]
        tag = hashlib.sha256(
            f"{database.get('HOST')}:{database.get('PORT')}/{database['NAME']}".encode()
        ).hexdigest()[:16]
        self.dir = Path(root) / tag  # records settle only against the database they are for

    def put(self, record: Settlement) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{record.request_id}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(record.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def retry(self) -> tuple[int, int]:
        """(settled, left)."""
        paths = sorted(self.dir.glob("*.json")) if self.dir.exists() else []
        done = 0
        for path in paths:
            if not _apply(Settlement.from_json(path.read_bytes())):
                return done, len(paths) - done
            path.unlink(missing_ok=True)
            done += 1
        return done, 0


class RedisOutbox:
    """Records in a Redis stream read by a consumer group."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.key = settings.FAIRLANE_QUEUE_NAMESPACE + "fl:settle"
        self.consumer = f"{socket.gethostname()}:{os.getpid()}"
        self._has_group = False

    def put(self, record: Settlement) -> None:
        self.client.xadd(self.key, {"r": record.to_json()})

    def _group(self) -> None:
        if not self._has_group:
            try:
                self.client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
            except Exception as exc:  # BUSYGROUP: it exists
                if "BUSYGROUP" not in str(exc):
                    raise
            self._has_group = True

    def retry(self) -> tuple[int, int]:
        self._group()
        # Entries another consumer took and never finished (it died), then ours, then new.
        try:
            self.client.xautoclaim(self.key, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=100)
        except Exception as exc:  # NOGROUP: Redis lost the group (restarted without disk)
            if "NOGROUP" in str(exc):
                self._has_group = False
            raise
        done = 0
        for start in ("0", ">"):
            reply = self.client.xreadgroup(GROUP, self.consumer, {self.key: start}, count=100)
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                if not _apply(Settlement.from_json(fields[b"r"])):
                    return done, len(entries)
                self.client.xack(self.key, GROUP, entry_id)
                self.client.xdel(self.key, entry_id)
                done += 1
        return done, 0


class Outbox:
    """Where a settlement goes when the ledger does not answer, and the loop that retries
    it: a Redis stream where the runtime has Redis (any process may finish it), else (or when
    Redis fails too) files this process retries."""

    def __init__(self, *, root: Path, client: Redis | None = None) -> None:
        self.files = FileOutbox(root)
        self.stream = RedisOutbox(client) if client is not None else None
        self.loop = BackgroundLoop("settlement-outbox", self._step, interval=lambda: IDLE_SECONDS)

    def settle(self, record: Settlement) -> bool:
        """Settle now, or queue the record for retries when the ledger is unreachable. True
        when it settled now."""
        self.loop.start()  # it first settles what earlier processes left
        if _apply(record):
            return True
        logger.warning(
            "request %s: the ledger is unreachable; settlement queued for retry", record.request_id
        )
        self.put(record)
        return False

    def put(self, record: Settlement) -> None:
        try:
            if self.stream is not None:
                self.stream.put(record)
                self.loop.wake()
                return
        except Exception:
            logger.warning(
                "request %s: Redis refused the settlement too; keeping it on disk",
                record.request_id,
                exc_info=True,
            )
        self.files.put(record)
        self.loop.wake()

    def retry(self) -> dict[str, int]:
        """Settle what the outbox holds, as far as the ledger answers: {"settled", "left"}."""
        settled = left = 0
        for outbox in (self.files, self.stream):
            if outbox is None:
                continue
            try:
                done, rest = outbox.retry()
            except Exception:  # Redis trouble: its records wait for the next round
                logger.warning("retrying %s failed", type(outbox).__name__, exc_info=True)
                done, rest = 0, 1
            settled, left = settled + done, left + rest
        if settled:
            logger.info("settled %d queued settlement(s); %d left", settled, left)
        return {"settled": settled, "left": left}

    def _step(self) -> float:
        # Retry soon while records wait; otherwise look now and then for records that other
        # processes left (and wake at once when this one queues one).
        left = self.retry()["left"]
        return settings.FAIRLANE_SETTLEMENT_RETRY_SECONDS if left else IDLE_SECONDS
