"""What a record keeps of an object: its fields as JSON, with every secret masked. A field is
masked by its name (secret, password, token, credential, hash, private, pepper), and any value
that looks like one of our keys or tokens is masked wherever it appears."""

from __future__ import annotations

import datetime
import decimal
import re
import uuid
from typing import overload

from django.db import models

MASK = "[masked]"
SECRET_NAME = re.compile(
    r"secret|passw|token|credential|hash|private|pepper|authorization", re.IGNORECASE
)
SECRET_VALUE = re.compile(
    r"fl-[a-z0-9]{12}-[A-Za-z0-9]{43}|scim-[a-z0-9]{12}-[A-Za-z0-9]{43}"
    r"|Bearer\s+\S+|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
# Noisy fields a person never changes (health figures, probe samples, timestamps of use).
NOISE = {
    "probe_samples",
    "health",
    "health_checked_at",
    "health_ok_at",
    "health_detail",
    "probe_p50_ms",
    "probe_p95_ms",
    "probe_error_rate",
    "last_error",
    "last_error_at",
    "last_used_at",
    "last_login",
    "updated_at",
}


def jsonable(value):
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def masked(value, name: str = ""):
    """`value` with secrets replaced: by the name it is stored under, or by its look."""
    if name and SECRET_NAME.search(name):
        return MASK if value not in (None, "", [], {}) else value
    if isinstance(value, dict):
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str) and SECRET_VALUE.search(value):
        return SECRET_VALUE.sub(MASK, value)
    return value


@overload
def snapshot(obj: None, *, exclude: tuple[str, ...] = ()) -> None: ...
@overload
def snapshot(obj: models.Model, *, exclude: tuple[str, ...] = ()) -> dict: ...
def snapshot(obj: models.Model | None, *, exclude: tuple[str, ...] = ()) -> dict | None:
    """The object's concrete fields (foreign keys by id), masked. None: no object."""
    if obj is None:
        return None
    data = {}
    for field in obj._meta.concrete_fields:
        if field.name in NOISE or field.name in exclude:
            continue
        data[field.attname] = jsonable(getattr(obj, field.attname))
    return masked(data)


def diff(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Only what changed, when both sides exist (a create or a delete keeps the whole side)."""
    if before is None or after is None:
        return before, after
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return {k: before.get(k) for k in keys}, {k: after.get(k) for k in keys}
