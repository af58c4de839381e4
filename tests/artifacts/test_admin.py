"""The admin shows what workers found (refused anywhere wins) and takes trusted keys as
`ed25519:` text or PEM, storing them normalised with their key id; bad keys are form errors."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workers.artifacts.keys import key_id, public_text
from workers.models import ModelVerification, ServedModel, TrustedKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client, make_user):
    admin = make_user("root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    return client


def test_served_models_show_each_workers_last_check(operator):
    model = ServedModel.objects.create(name="llama", source="/models/llama")
    ModelVerification.objects.create(model=model, worker="celery@gpu-1", status="verified")
    ModelVerification.objects.create(
        model=model,
        worker="celery@gpu-2",
        status="refused",
        reasons="hash_mismatch: model.safetensors: sha256 differs",
    )
    ServedModel.objects.create(name="fresh", source="preset:tiny")
    listing = operator.get("/admin/workers/servedmodel/").content.decode()
    assert "refused (celery@gpu-2)" in listing and "not loaded yet" in listing
    detail = operator.get(f"/admin/workers/servedmodel/{model.pk}/change/").content.decode()
    assert "hash_mismatch: model.safetensors" in detail and "celery@gpu-1" in detail
    refused = operator.get("/admin/workers/modelverification/?status__exact=refused")
    assert refused.status_code == 200 and "celery@gpu-2" in refused.content.decode()


def test_a_trusted_key_is_added_as_pem_and_stored_normalised(operator):
    key = Ed25519PrivateKey.generate().public_key()
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    response = operator.post(
        "/admin/workers/trustedkey/add/", {"name": "release", "public_key": pem, "is_active": "on"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    row = TrustedKey.objects.get(name="release")
    assert (row.public_key, row.key_id) == (public_text(key), key_id(key))


def test_a_bad_key_is_a_form_error_and_stores_nothing(operator):
    response = operator.post(
        "/admin/workers/trustedkey/add/",
        {"name": "junk", "public_key": "ssh-rsa AAAA", "is_active": "on"},
    )
    assert response.status_code == 200 and "ed25519:" in response.content.decode()
    assert not TrustedKey.objects.exists()


def test_adding_a_model_in_the_admin_checks_it_and_records_provenance(
    operator, signed_model, trusted
):
    fields = {
        "name": "signed",
        "source": str(signed_model),
        "description": "",
        "price_input_per_mtok": 0,
        "price_output_per_mtok": 0,
        "price_cached_per_mtok": 0,
        "is_enabled": "on",
        "runtime": "engine",
        "quantization": "",
        "quantization_group_size": 128,
        "speculative_method": "",
        "speculative_tokens": 4,
        "speculative_draft": "",
        **{
            f"verifications-{k}": v
            for k, v in (
                ("TOTAL_FORMS", 0),
                ("INITIAL_FORMS", 0),
                ("MIN_NUM_FORMS", 0),
                ("MAX_NUM_FORMS", 1000),
            )
        },
    }
    (signed_model / "notes.txt").write_text("added after signing")
    refused = operator.post("/admin/workers/servedmodel/add/", fields)
    assert refused.status_code == 200 and "extra_file: notes.txt" in refused.content.decode()
    assert not ServedModel.objects.exists()
    (signed_model / "notes.txt").unlink()
    added = operator.post("/admin/workers/servedmodel/add/", fields)
    assert added.status_code == 302, added.content.decode()[:3000]
    row = ServedModel.objects.get(name="signed")
    assert row.signer == key_id(trusted.public_key()) and row.manifest_digest
