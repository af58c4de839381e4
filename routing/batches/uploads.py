"""A multipart upload read as Django reads one, each file straight to a temporary file
on disk (never whole in memory) and refused as soon as it passes FAIRLANE_FILE_MAX_BYTES."""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, TemporaryFileUploadHandler
from django.http import HttpRequest
from django.http.multipartparser import MultiPartParserError

from routing.errors import FileTooLarge
from tenants.errors import InvalidRequest


def too_large() -> FileTooLarge:
    limit = settings.FAIRLANE_FILE_MAX_BYTES
    return FileTooLarge(
        f"The file is larger than this server's limit of {limit} bytes "
        f"({limit / 1024 / 1024:g} MiB).",
        param="file",
    )


class SizeLimit(FileUploadHandler):
    """Counts each file's bytes as they arrive and stops the upload past the limit."""

    def new_file(self, *args, **kwargs) -> None:
        super().new_file(*args, **kwargs)
        self.seen = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.seen += len(raw_data)
        if self.seen > settings.FAIRLANE_FILE_MAX_BYTES:
            raise too_large()
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


def upload_read(request: HttpRequest) -> tuple[dict[str, str], UploadedFile]:
    """The form's fields and its `file` (synchronous: it reads the body)."""
    if request.content_type != "multipart/form-data":
        raise InvalidRequest("Upload the file as multipart/form-data.")
    length = int(request.headers.get("Content-Length") or 0)
    # The form's other fields and boundaries take a few hundred bytes beyond the file.
    if length > settings.FAIRLANE_FILE_MAX_BYTES + 64 * 1024:
        raise too_large()
    request.upload_handlers = [SizeLimit(request), TemporaryFileUploadHandler(request)]
    try:
        fields = {key: request.POST.get(key, "") for key in request.POST}
        upload = request.FILES.get("file")
    except MultiPartParserError as exc:
        raise InvalidRequest(f"The multipart body could not be read: {exc}") from None
    if upload is None:
        raise InvalidRequest("Send the file as the form field 'file'.", param="file")
    return fields, upload
