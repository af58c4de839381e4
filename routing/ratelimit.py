"""Rate limits per API key, agent and tenant: requests per minute, tokens per minute, and
requests in flight. Shared by every API process through Redis (one Lua script checks and
takes all three scopes at once), or kept in-process in the embedded mode (one process).

Tokens are counted at admission as the worst case (prompt plus every choice at max_tokens),
like the budget reservation, and the unused part is given back when the request ends."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings

from tenants.errors import RateLimited, ServiceUnavailable

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# A request still "in flight" after this long is forgotten (its API process died).
INFLIGHT_TTL_MS = 15 * 60 * 1000
_SCRIPT = (Path(__file__).parent / "ratelimit.lua").read_text()
# KEYS: per scope its in-flight set and tokens counter; ARGV: request_id unused, then per scope
# has_concurrency has_tpm.
_GIVE_BACK = """
local rid, unused = ARGV[1], tonumber(ARGV[2])
for i = 1, #KEYS / 2 do
  if ARGV[2 * i + 1] == '1' then redis.call('ZREM', KEYS[2 * i - 1], rid) end
  if ARGV[2 * i + 2] == '1' and unused > 0 and redis.call('EXISTS', KEYS[2 * i]) == 1 then
    redis.call('DECRBY', KEYS[2 * i], unused)
  end
end
"""


@dataclass(frozen=True, slots=True)
class LimitScope:
    """One level limits apply at: ("key", id) with its (rpm, tpm, concurrency). `slot` is the
    Redis hash tag of its keys (default: its name); the scopes of one caller share their
    tenant's, so one script can check and take them all on a Redis Cluster."""

    name: str
    rpm: int
    tpm: int
    concurrency: int
    slot: str = ""

    def key(self, suffix: str) -> str:
        """Under FAIRLANE_QUEUE_NAMESPACE: deployments sharing a Redis number their tenants
        and keys alike, and must not count each other's requests."""
        tag = self.slot or self.name
        return f"{settings.FAIRLANE_QUEUE_NAMESPACE}rl:{{{tag}}}:{self.name}:{suffix}"


@dataclass(frozen=True, slots=True)
class Admitted:
    """What to give back when the request ends."""

    request_id: str
    scopes: tuple[LimitScope, ...]
    window: int
    tokens: int


def _window(now: float) -> int:
    return int(now // WINDOW_SECONDS)


def _refusal(limit: str, scope: str, now: float) -> RateLimited:
    retry = 1 if limit == "concurrency" else math.ceil(WINDOW_SECONDS - now % WINDOW_SECONDS)
    what = {
        "rpm": "requests per minute",
        "tpm": "tokens per minute",
        "concurrency": "requests at once",
    }[limit]
    level = scope.split(":", 1)[0]
    return RateLimited(
        f"Rate limit reached: {what} for this {level.replace('_', ' ')}.", retry_after=retry
    )


class RedisLimiter:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.script = client.register_script(_SCRIPT)
        self.give_back = client.register_script(_GIVE_BACK)

    def acquire(self, *, request_id: str, scopes: tuple[LimitScope, ...], tokens: int) -> Admitted:
        now = time.time()
        window = _window(now)
        if not scopes:  # no limits apply: nothing to check or take (no round trip)
            return Admitted(request_id, scopes, window, tokens)
        args, keys = [int(now * 1000), request_id, tokens, INFLIGHT_TTL_MS], []
        for scope in scopes:
            args += [scope.name, scope.rpm, scope.tpm, scope.concurrency]
            keys += [scope.key(f"r:{window}"), scope.key(f"t:{window}"), scope.key("c")]
        try:
            refused = self.script(keys=keys, args=args)
        except redis.RedisError as exc:  # our store is down: retry shortly, nothing was taken
            raise ServiceUnavailable(
                "Rate limits cannot be checked right now; retry shortly.", retry_after=2
            ) from exc
        if refused:
            raise _refusal(refused[0].decode(), refused[1].decode(), now)
        return Admitted(request_id, scopes, window, tokens)

    def release(self, admitted: Admitted, *, tokens_used: int) -> None:
        """Free the concurrency slots and give the unused worst case back to the window it
        was taken from (a window already gone is left alone), in one script."""
        unused = max(admitted.tokens - tokens_used, 0)
        keys, args = [], [admitted.request_id, unused]
        for scope in admitted.scopes:
            keys += [scope.key("c"), scope.key(f"t:{admitted.window}")]
            args += [1 if scope.concurrency else 0, 1 if scope.tpm else 0]
        if keys:
            try:
                self.give_back(keys=keys, args=args)
            except redis.RedisError:  # the slots expire on their own (INFLIGHT_TTL_MS)
                logger.warning(
                    "request %s: rate-limit slots not given back (Redis)",
                    admitted.request_id,
                    exc_info=True,
                )


class LocalLimiter:
    """The same rules in one process (the embedded mode has no Redis)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple, int] = defaultdict(int)
        self.inflight: dict[str, set[str]] = defaultdict(set)

    def acquire(self, *, request_id: str, scopes: tuple[LimitScope, ...], tokens: int) -> Admitted:
        now = time.time()
        window = _window(now)
        with self.lock:
            for scope in scopes:
                if scope.rpm and self.counts[(scope.name, "r", window)] + 1 > scope.rpm:
                    raise _refusal("rpm", scope.name, now)
                if scope.tpm and self.counts[(scope.name, "t", window)] + tokens > scope.tpm:
                    raise _refusal("tpm", scope.name, now)
                if scope.concurrency and len(self.inflight[scope.name]) >= scope.concurrency:
                    raise _refusal("concurrency", scope.name, now)
            for stale in [k for k in self.counts if k[2] < window]:
                del self.counts[stale]
            for scope in scopes:
                self.counts[(scope.name, "r", window)] += 1
                self.counts[(scope.name, "t", window)] += tokens
                if scope.concurrency:
                    self.inflight[scope.name].add(request_id)
        return Admitted(request_id, scopes, window, tokens)

    def release(self, admitted: Admitted, *, tokens_used: int) -> None:
        with self.lock:
            for scope in admitted.scopes:
                self.inflight[scope.name].discard(admitted.request_id)
                key = (scope.name, "t", admitted.window)
                if key in self.counts:
                    self.counts[key] -= max(admitted.tokens - tokens_used, 0)


def scopes_for(caller) -> tuple[LimitScope, ...]:
    """The limits that apply to a caller: its key's, its agent's and its tenant's."""
    scopes = []
    for level, obj in (("key", caller.api_key), ("agent", caller.agent), ("tenant", caller.tenant)):
        rpm, tpm, concurrency = obj.rate_limits
        if rpm or tpm or concurrency:
            scopes.append(
                LimitScope(
                    f"{level}:{obj.pk}", rpm, tpm, concurrency, slot=f"tenant:{caller.tenant.pk}"
                )
            )
    return tuple(scopes)
