"""/v1/files with the official `openai` client against a live server (the embedded mode):
upload (streamed to storage), list with its purpose filter and pages, retrieve, content,
delete; another tenant's file is a 404; the size limit is a 413 naming it; the tenant's
storage quota."""

import io

import openai
import pytest

from routing.batch_models import StoredFile
from tenants.models import Scope
from tenants.services.keys import api_key_create
from tests.batches.conftest import FILE_MAX_BYTES, QUOTA_BYTES

pytestmark = pytest.mark.django_db(transaction=True)


def _jsonl(n: int = 2) -> bytes:
    return b"".join(b'{"custom_id": "r%d"}\n' % i for i in range(n))


def test_upload_retrieve_content_delete(client, files_dir):
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.filename) == ("file", "batch", "in.jsonl")
    assert uploaded.bytes == len(_jsonl())
    row = StoredFile.objects.get(pk=uploaded.id)
    assert (files_dir / row.storage_name).read_bytes() == _jsonl()
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes
    assert client.files.content(uploaded.id).read() == _jsonl()
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    assert not (files_dir / row.storage_name).exists()
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_list_filters_by_purpose_and_pages(client):
    ids = [
        client.files.create(file=(f"{i}.jsonl", io.BytesIO(_jsonl())), purpose=purpose).id
        for i, purpose in enumerate(["batch", "user_data", "batch", "batch"])
    ]
    batch_files = [f.id for f in client.files.list(purpose="batch")]
    assert batch_files == [ids[3], ids[2], ids[0]]  # newest first
    assert [f.id for f in client.files.list(purpose="user_data")] == [ids[1]]
    first = client.files.list(limit=2)
    assert [f.id for f in first.data] == [ids[3], ids[2]] and first.has_more
    # The SDK's auto-pagination follows `after` to the end.
    assert [f.id for f in client.files.list(limit=2)] == ids[::-1]
    assert [f.id for f in client.files.list(order="asc")] == ids


def test_bad_purpose_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"
    assert not StoredFile.objects.exists()


def test_another_tenants_file_is_not_found(client, batch_server, other_tenant, other_agent):
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="batch")
    other_key = api_key_create(tenant=other_tenant, agent=other_agent, scopes=[Scope.INFERENCE])[1]
    other = openai.OpenAI(api_key=other_key, base_url=batch_server.url + "/v1", max_retries=0)
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(uploaded.id)
    assert list(other.files.list()) == []
    assert client.files.retrieve(uploaded.id).id == uploaded.id


def test_oversized_upload_is_a_413_naming_the_limit(client):
    big = b"x" * (FILE_MAX_BYTES + 1)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
    assert refused.value.status_code == 413
    assert refused.value.body["code"] == "file_too_large"
    assert str(FILE_MAX_BYTES) in refused.value.body["message"]
    assert not StoredFile.objects.exists()


def test_storage_quota_per_tenant(client, files_dir, tenant):
    chunk = b"y" * (FILE_MAX_BYTES - 100)
    kept = []
    while sum(len(c) for c in kept) + len(chunk) <= QUOTA_BYTES:
        client.files.create(file=("part.jsonl", io.BytesIO(chunk)), purpose="user_data")
        kept.append(chunk)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("part.jsonl", io.BytesIO(chunk)), purpose="user_data")
    assert refused.value.status_code == 413
    assert refused.value.body["code"] == "storage_quota_exceeded"
    assert str(QUOTA_BYTES) in refused.value.body["message"]
    assert StoredFile.objects.count() == len(kept)
    # Nothing of the refused upload is left in storage.
    assert len(list((files_dir / str(tenant.pk)).iterdir())) == len(kept)
