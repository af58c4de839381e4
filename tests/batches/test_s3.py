"""The files storage on an S3-compatible bucket (the distributed mode's storage), tested
against moto's S3 server: a real HTTP server on loopback, in a thread of the test process,
which the API server (its own process) reaches over the socket with boto3. Through the official
`openai` client: an upload lands in the bucket (a large one as a multipart upload), comes back
byte-identical, is deleted from the bucket with its file; another tenant's file is a 404; a
whole batch reads its input from the bucket and writes its outputs there. The credentials
reach boto3 from the environment and appear nowhere in the server's output."""

import io
import json
import uuid
from datetime import timedelta

import boto3
import openai
import pytest
from moto.server import ThreadedMotoServer

from routing.batch_models import StoredFile
from routing.batches.s3 import S3FilesStorage
from tenants.models import Scope
from tenants.services.keys import api_key_create
from tests.batches.test_batches import _create, _jsonl, _line, _until_at_rest, _upload
from tests.conftest import child_env
from tests.servers import AsgiServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)

BUCKET = "fairlane-files"
PREFIX = "deployment-a"
ACCESS_KEY = "AKIAFAIRLANETEST0001"
SECRET_KEY = "fairlane-s3-secret-never-logged"
# Above boto3's multipart threshold (8 MiB), so the upload goes in parts.
BIG_BYTES = 12 * 1024 * 1024


@pytest.fixture(scope="module")
def s3():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = boto3.resource(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    ).Bucket(BUCKET)
    bucket.create()
    yield endpoint, bucket
    server.stop()


@pytest.fixture(scope="module")
def batch_server(django_db_setup, django_db_blocker, s3):
    endpoint, _ = s3
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_FILES_S3_BUCKET=BUCKET,
            FAIRLANE_FILES_S3_ENDPOINT_URL=endpoint,
            FAIRLANE_FILES_S3_REGION="us-east-1",
            FAIRLANE_FILES_S3_PREFIX=PREFIX,
            FAIRLANE_FILES_S3_ADDRESSING_STYLE="path",
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            FAIRLANE_FILE_MAX_BYTES=str(2 * BIG_BYTES),
            FAIRLANE_BATCH_POLL_SECONDS="0.2",
            FAIRLANE_BATCH_IN_FLIGHT="4",
            LOG_LEVEL="DEBUG",
        )
    )
    yield server
    server.stop()


def _storage(endpoint: str, **options) -> S3FilesStorage:
    """The files storage on moto's bucket, built in this process as the server builds its own."""
    return S3FilesStorage(
        bucket_name=BUCKET,
        endpoint_url=endpoint,
        region_name="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        **options,
    )


def _keys(bucket) -> set[str]:
    return {o.key for o in bucket.objects.all()}


def _key(file_id: str) -> str:
    return f"{PREFIX}/{StoredFile.objects.get(pk=file_id).storage_name}"


def test_upload_lands_in_the_bucket_comes_back_identical_and_delete_removes_it(client, s3):
    _, bucket = s3
    data = b"".join(b'{"custom_id": "r%d", "pad": "%s"}\n' % (i, b"x" * 200) for i in range(100))
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    key = _key(uploaded.id)
    assert key in _keys(bucket)
    assert bucket.Object(key).get()["Body"].read() == data
    # Private: the owner's grant only, no public (AllUsers) one.
    assert {g["Grantee"]["Type"] for g in bucket.Object(key).Acl().grants} == {"CanonicalUser"}
    assert client.files.content(uploaded.id).read() == data
    assert client.files.delete(uploaded.id).deleted
    assert key not in _keys(bucket)
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)


def test_a_large_upload_is_multipart_and_streams_back(client, s3, batch_server):
    _, bucket = s3
    line = b'{"custom_id": "big", "pad": "' + b"y" * 1000 + b'"}\n'
    data = line * (BIG_BYTES // len(line))
    uploaded = client.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="user_data")
    assert uploaded.bytes == len(data)
    stored = bucket.Object(_key(uploaded.id))
    assert stored.content_length == len(data)
    # S3 names a multipart object's ETag by its number of parts.
    assert stored.e_tag.strip('"').endswith("-2"), stored.e_tag
    with client.files.with_streaming_response.content(uploaded.id) as answer:
        assert b"".join(answer.iter_bytes()) == data
    assert SECRET_KEY not in batch_server.output()


def test_another_tenants_file_is_not_found(client, s3, batch_server, other_tenant, other_agent):
    _, bucket = s3
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    other_key = api_key_create(tenant=other_tenant, agent=other_agent, scopes=[Scope.INFERENCE])[1]
    other = openai.OpenAI(api_key=other_key, base_url=batch_server.url + "/v1", max_retries=0)
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(uploaded.id)
    assert _key(uploaded.id) in _keys(bucket)
    assert client.files.content(uploaded.id).read() == b"{}\n"


def test_a_batch_reads_its_input_from_the_bucket_and_writes_its_outputs_there(client, s3, budget):
    _, bucket = s3
    input_id = _upload(client, [_line(i) for i in range(5)])
    batch = _create(client, input_id)
    done = _until_at_rest(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed) == (5, 5)
    outputs = _jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == [f"req-{i}" for i in range(5)]
    assert all(o["response"]["status_code"] == 200 for o in outputs)
    keys = _keys(bucket)
    for file_id in (input_id, done.output_file_id):
        assert _key(file_id) in keys
    stored = bucket.Object(_key(done.output_file_id)).get()["Body"].read()
    assert [json.loads(x) for x in stored.splitlines()] == outputs


def test_the_storage_reads_an_object_as_it_arrives(s3):
    endpoint, bucket = s3
    storage = _storage(endpoint, file_overwrite=False)
    bucket.put_object(Key="stream/big.jsonl", Body=b"a\n" * (BIG_BYTES // 2))
    with storage.open("stream/big.jsonl", "rb") as handle:
        # The object's body as it comes, not a temporary copy of the whole object.
        assert isinstance(handle.file, io.BufferedReader)
        assert handle.size == BIG_BYTES
        assert next(iter(handle)) == b"a\n"
    with pytest.raises(FileNotFoundError):
        storage.open("stream/missing.jsonl", "rb")


def test_the_orphan_sweep_deletes_only_bytes_no_row_names_in_the_bucket(client, s3, tenant):
    """The sweep on the bucket: an object of our shape that no row names goes once past the
    grace period; the uploaded file's object and keys not of our shape stay."""
    from routing.batches.files import files_orphans_sweep

    endpoint, bucket = s3
    uploaded = client.files.create(file=("kept.jsonl", io.BytesIO(b"{}\n")), purpose="user_data")
    orphan = f"{PREFIX}/{tenant.pk}/file-{uuid.uuid4().hex}.jsonl"
    not_ours = [f"{PREFIX}/notes.txt", f"{PREFIX}/{tenant.pk}/notes.txt", "elsewhere/1/x.jsonl"]
    for name in (orphan, *not_ours):
        bucket.put_object(Key=name, Body=b"{}\n")
    storage = _storage(endpoint, location=PREFIX, addressing_style="path")
    assert files_orphans_sweep(storage=storage) == 0  # younger than the grace: kept
    # At least the orphan (earlier tests' objects lost their rows to the database's reset).
    assert files_orphans_sweep(storage=storage, older_than=timedelta(0)) >= 1
    keys = _keys(bucket)
    assert orphan not in keys and _key(uploaded.id) in keys and set(not_ours) <= keys
    assert client.files.content(uploaded.id).read() == b"{}\n"
