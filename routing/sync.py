"""Synchronous database work called from the event loop, on the loop's thread pool.

asgiref's default (`thread_sensitive=True`) runs all of a process's synchronous work on one
thread, so under load every request's admission, hold and settlement queued behind the others'
database round trips. Request-path calls are self-contained (no transaction spans two of them),
so they may run on any thread: each thread has its own connection (from the pool where
FAIRLANE_DB_POOL_SIZE sets one), closed or returned as channels does after every call."""

from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from channels.db import database_sync_to_async

P = ParamSpec("P")
R = TypeVar("R")


def db_call(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`func` as a coroutine function run on a pool thread (channels' connection clean-up)."""
    return database_sync_to_async(func, thread_sensitive=False)
