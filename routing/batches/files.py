"""Files: a tenant's uploads and batch outputs (services and selectors). The bytes go
through the files storage (routing/batches/storage.py) in chunks, never whole in memory; the
row says whose they are, so every read is scoped to the tenant (another tenant's file is a
404, as a file that does not exist)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage
from django.db import transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from routing.batch_models import FilePurpose, StoredFile
from routing.batches.storage import files_storage, storage_name
from routing.errors import StorageQuotaExceeded
from tenants.errors import InvalidRequest, NotFound
from tenants.models import Tenant

logger = logging.getLogger(__name__)

UPLOAD_PURPOSES = (FilePurpose.BATCH, FilePurpose.USER_DATA)
CHUNK_BYTES = 64 * 1024


def purpose_clean(value: object) -> str:
    if value not in UPLOAD_PURPOSES:
        raise InvalidRequest(
            f"'purpose' must be one of {', '.join(UPLOAD_PURPOSES)}.", param="purpose"
        )
    return str(value)


def files_used_bytes(*, tenant: Tenant) -> int:
    total = StoredFile.objects.filter(tenant=tenant).aggregate(total=Sum("num_bytes"))["total"]
    return int(total or 0)


def file_store(
    *, tenant: Tenant, filename: str, purpose: str, content: File, quota: bool = True
) -> StoredFile:
    """Keep `content` (read in chunks by the storage) as a file of `tenant`; an upload
    (`quota`) is refused when the tenant's files would pass their quota (a batch's outputs
    count towards it but are always written). The quota is checked under a lock on the
    tenant's row, so two uploads at once cannot both squeeze under it."""
    num_bytes = content.size or 0
    row = StoredFile(
        tenant=tenant,
        filename=(filename or "file.jsonl")[-255:],
        purpose=purpose,
        num_bytes=num_bytes,
        created_at=timezone.now(),
    )
    row.storage_name = files_storage().save(
        storage_name(tenant_id=tenant.pk, file_id=row.id), content
    )
    try:
        with transaction.atomic():
            Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
            limit = settings.FAIRLANE_FILES_TENANT_QUOTA_BYTES
            used = files_used_bytes(tenant=tenant)
            if quota and used + num_bytes > limit:
                raise StorageQuotaExceeded(
                    f"This upload ({num_bytes} bytes) would take your files past their "
                    f"storage quota of {limit} bytes ({used} bytes in use); delete files "
                    "you no longer need.",
                    param="file",
                )
            row.save(force_insert=True)
    except BaseException:
        files_storage().delete(row.storage_name)
        raise
    return row


def file_list(
    *, tenant: Tenant, purpose: str = "", after: str = "", limit: int = 20, ascending: bool = False
) -> tuple[list[StoredFile], bool]:
    """A page of the tenant's files (newest first unless `ascending`), after the file
    `after`; and whether more follow."""
    files: QuerySet[StoredFile] = StoredFile.objects.filter(tenant=tenant)
    if purpose:
        files = files.filter(purpose=purpose)
    order = ("created_at", "id") if ascending else ("-created_at", "-id")
    files = files.order_by(*order)
    if after:
        cursor = (
            StoredFile.objects.filter(tenant=tenant, pk=after).first() if storable(after) else None
        )
        if cursor is None:
            raise NotFound(f"No file '{after}' to list after.", param="after")
        if ascending:
            files = files.filter(created_at__gte=cursor.created_at).exclude(
                created_at=cursor.created_at, id__lte=cursor.id
            )
        else:
            files = files.filter(created_at__lte=cursor.created_at).exclude(
                created_at=cursor.created_at, id__gte=cursor.id
            )
    page = list(files[: limit + 1])
    return page[:limit], len(page) > limit


def storable(value: str) -> bool:
    """Whether an id can name a row: PostgreSQL's text holds no NUL, so one with a NUL names
    none (and must not reach a query, which refuses it)."""
    return "\x00" not in value


def file_get(*, tenant: Tenant, file_id: str) -> StoredFile:
    row = (
        StoredFile.objects.filter(tenant=tenant, pk=file_id).first() if storable(file_id) else None
    )
    if row is None:
        raise NotFound(f"No such File object: {file_id}", param="file_id")
    return row


def file_chunks(*, row: StoredFile) -> Iterator[bytes]:
    """The file's bytes, a chunk at a time."""
    with files_storage().open(row.storage_name, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


def file_lines(*, row: StoredFile) -> Iterator[bytes]:
    """The file's lines, read a chunk at a time (a batch's input)."""
    with files_storage().open(row.storage_name, "rb") as handle:
        yield from handle


def file_delete(*, tenant: Tenant, file_id: str) -> StoredFile:
    row = file_get(tenant=tenant, file_id=file_id)
    row.delete()
    files_storage().delete(row.storage_name)
    return row


def files_orphans_sweep(
    *, older_than: timedelta | None = None, storage: Storage | None = None
) -> int:
    """Delete the stored objects no file row names, and say how many. A file's bytes are
    written before its row commits, and its row is deleted before its bytes: a process killed
    between the two (or a storage delete that failed) leaves bytes nobody can read or delete,
    counted against no quota. Only objects older than `older_than` (default
    FAIRLANE_FILES_ORPHAN_GRACE_SECONDS) go, so an upload whose row is about to commit stays;
    only names of our shape (`<tenant id>/<file id>.jsonl`) are looked at, so nothing else a
    shared bucket or directory holds is touched."""
    storage = storage or files_storage()
    if older_than is None:
        older_than = timedelta(seconds=settings.FAIRLANE_FILES_ORPHAN_GRACE_SECONDS)
    cutoff = timezone.now() - older_than
    try:
        tenants, _ = storage.listdir("")
    except FileNotFoundError:  # nothing stored yet
        return 0
    removed = 0
    for tenant_dir in (d for d in tenants if d.isdigit()):
        _, names = storage.listdir(tenant_dir)
        names = [n for n in names if n.endswith(".jsonl")]
        if not names:
            continue
        named = set(
            StoredFile.objects.filter(tenant_id=int(tenant_dir)).values_list(
                "storage_name", flat=True
            )
        )
        for name in names:
            path = f"{tenant_dir}/{name}"
            if path in named or storage.get_modified_time(path) > cutoff:
                continue
            storage.delete(path)
            removed += 1
            logger.info("files: deleted %s, stored bytes no file row names", path)
    return removed
