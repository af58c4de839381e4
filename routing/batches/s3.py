"""The files storage on an S3-compatible bucket (FAIRLANE_FILES_S3_BUCKET): django-storages'
S3 storage, whose uploads are already streamed (boto3's multipart upload reads the request's
spooled file a part at a time). Its own files download the whole object before the first
read; a file opened here for reading is the object's body as it arrives instead, so a
download or a batch's input is never whole in memory or on disk. Loaded by its dotted path
from STORAGES, so boto3 is imported only where the bucket is configured."""

from __future__ import annotations

import io

from botocore.exceptions import ClientError
from django.core.files.base import File
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

READ_BUFFER_BYTES = 1024 * 1024


class S3FilesStorage(S3Storage):
    def _open(self, name: str, mode: str = "rb") -> File:
        if mode != "rb":
            return super()._open(name, mode)
        key = self._normalize_name(clean_name(name))
        try:
            answer = self.bucket.Object(key).get()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"File does not exist: {name}") from error
            raise
        stream = File(io.BufferedReader(answer["Body"], READ_BUFFER_BYTES), name=name)
        stream.size = int(answer["ContentLength"])
        return stream
