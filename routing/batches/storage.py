"""The files storage: Django's storage API under the `fairlane_files` alias (settings:
FAIRLANE_FILES_STORAGE_BACKEND and its options), the local filesystem under the data directory
by default, an S3-compatible bucket (FAIRLANE_FILES_S3_BUCKET: routing/batches/s3.py) where
configured. Names are the tenant's id then the file's, so a tenant's files share a prefix."""

from __future__ import annotations

from django.core.files.storage import Storage, storages


def files_storage() -> Storage:
    return storages["fairlane_files"]


def storage_name(*, tenant_id: int, file_id: str) -> str:
    return f"{tenant_id}/{file_id}.jsonl"
