"""Repeated failed sign-ins are throttled per username and per client address, in the shared
cache (Redis when configured, so every API process counts together)."""

import hashlib

from django.conf import settings
from django.core.cache import cache

PREFIX = "fl:login-fail:"


def _keys(*, username: str, address: str) -> list[str]:
    def digest(value: str) -> str:  # usernames are not written into the cache as they are
        return hashlib.sha256(value.encode()).hexdigest()[:32]
    return [f"{PREFIX}u:{digest(username.strip().lower())}", f"{PREFIX}a:{digest(address)}"]


def login_blocked(*, username: str, address: str) -> bool:
    counts = cache.get_many(_keys(username=username, address=address))
    # The address allows several people behind one NAT a few more tries than one username.
    limit = settings.FAIRLANE_LOGIN_MAX_FAILURES
    return any(count >= (limit if ":u:" in key else limit * 4) for key, count in counts.items())


def login_failed(*, username: str, address: str) -> None:
    for key in _keys(username=username, address=address):
        if cache.add(key, 1, timeout=settings.FAIRLANE_LOGIN_WINDOW_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=settings.FAIRLANE_LOGIN_WINDOW_SECONDS)


def login_succeeded(*, username: str) -> None:
    cache.delete(_keys(username=username, address="")[0])
