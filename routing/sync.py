"""Synchronous database work called from the event loop, on the loop's thread pool.

asgiref's default (`thread_sensitive=True`) runs all of a process's synchronous work on one
thread, so under load every request's admission, hold and settlement queued behind the others'
database round trips. Request-path calls are self-contained (no transaction spans two of them),
so they may run on any thread: each thread has its own connection (from the pool where
FAIRLANE_DB_POOL_SIZE sets one), closed or returned after every call.

The hop is the loop's own `run_in_executor` with the caller's context, rather than channels'
`database_sync_to_async`, which costs what a request on the hot path cannot spare (issue 35's
profile: the hops and their tidy-up were about 16 % of an API process's CPU): it tidies the
thread's connections both before and after each call (`close_old_connections`, 15-25 µs each
even with no connection, asgiref's `Local` per lookup), and asgiref's `SyncToAsync` copies the
call's context variables back into the caller's and registers the thread for `async_to_sync`,
which nothing on these paths uses. Here the tidy-up runs once, after the call: every call that
takes a connection on these threads ends by closing it or giving it back to the pool, so none
is left over from a call before. As with asgiref, cancelling the caller cancels a call that no
thread has taken yet, and otherwise only the wait for it."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")


def db_call(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`func` as a coroutine function run on a pool thread, the thread's database connection
    closed or given back to the pool when it returns."""

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        context = contextvars.copy_context()
        run = functools.partial(context.run, _tidied, func, args, kwargs)
        return await asyncio.get_running_loop().run_in_executor(None, run)

    return call


def _tidied(func: Callable[..., R], args: tuple, kwargs: dict) -> R:
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()
