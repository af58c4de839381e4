"""The check before every load, as a worker's engine host makes it: each tamper case of issue
17 refused before the engine is built (so before any weight is read), with its reason counted
in fairlane_model_verify_failures_total and recorded for the admin; a correctly signed model
loads; the policy's two settings; registration records provenance."""

import json
import os
import shutil
import uuid

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import AsyncClient

from routing.runtimes import runtime_build, runtime_using
from tenants.errors import InvalidRequest
from tests.artifacts.conftest import PREDICATE, flip_byte
from workers import host as host_module
from workers.artifacts import load
from workers.artifacts.keys import key_id
from workers.artifacts.load import ModelRefused
from workers.artifacts.manifest import MANIFEST_NAME, SIGNATURE_NAME
from workers.artifacts.signing import model_sign
from workers.engine import SamplingParams
from workers.models import ModelVerification, ServedModel
from workers.serving.catalog import ModelInfo
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db


@pytest.fixture
def builds(monkeypatch):
    """Every engine the host builds (each build reads the weights)."""
    built = []
    real = host_module.AsyncEngine.from_config

    def spy(config, **options):  # options: the host's scheduling policy
        built.append(config.model)
        return real(config, **options)

    monkeypatch.setattr(host_module.AsyncEngine, "from_config", staticmethod(spy))
    return built


@pytest.fixture
def registered(trusted, signed_model, settings):
    settings.FAIRLANE_QUEUE_NAMESPACE = f"t{uuid.uuid4().hex[:12]}-"  # its own counters
    row = model_register(name="signed", source=str(signed_model))
    return ModelInfo.of(row)


@pytest.fixture
def runtime():
    """An embedded runtime of this test's own, installed: its pool counts the refusals."""
    runtime = runtime_build("embedded")
    with runtime_using(runtime):
        yield runtime
    runtime.engine_host.shutdown()


@pytest.fixture
def engine_host(runtime):
    return runtime.engine_host


def wrong_key(path):
    model_sign(path, Ed25519PrivateKey.generate(), **PREDICATE)


def truncated_signature(path):
    sig = path / SIGNATURE_NAME
    sig.write_bytes(sig.read_bytes()[:-20])


def pickle_bin(path):
    torch.save({"w": torch.zeros(2)}, path / "pytorch_model.bin")


def symlink_out(path):
    outside = path.parent / "outside-tokenizer.json"
    shutil.move(path / "tokenizer.json", outside)
    (path / "tokenizer.json").symlink_to(outside)


def config_changed(path):
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


TAMPERS = {
    "byte_flipped": (lambda p: flip_byte(p / "model.safetensors"), "hash_mismatch"),
    "file_added": (lambda p: (p / "added.json").write_text("{}"), "extra_file"),
    "file_removed": (lambda p: (p / "generation_config.json").unlink(), "missing_file"),
    "file_renamed": (lambda p: os.rename(p / "tokenizer.json", p / "tok.json"), "missing_file"),
    "config_changed": (config_changed, "hash_mismatch"),
    "wrong_key": (wrong_key, "untrusted_key"),
    "truncated_signature": (truncated_signature, "malformed_signature"),
    "pickle_bin": (pickle_bin, "pickle"),
    "symlink_out": (symlink_out, "symlink"),
}


def test_a_correctly_signed_model_loads_and_is_recorded_verified(
    registered, engine_host, builds, signing_key
):
    engine = engine_host.engine(registered)
    assert builds == [str(registered.source)]
    out = engine.engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))
    assert len(out[0].token_ids) == 3
    check = ModelVerification.objects.get(model__name="signed")
    assert check.status == "verified" and check.signer == key_id(signing_key.public_key())
    assert engine_host.hosted() == ["signed"]


@pytest.mark.parametrize("case", sorted(TAMPERS))
def test_a_tampered_model_is_refused_before_any_weight_is_read(
    case, registered, engine_host, builds, signed_model, runtime
):
    tamper, code = TAMPERS[case]
    before = runtime.pool.verify_failures()
    tamper(signed_model)
    with pytest.raises(ModelRefused) as refused:
        engine_host.engine(registered)
    assert code in [p.code for p in refused.value.problems], refused.value.problems
    assert builds == [] and engine_host.hosted() == []
    assert refused.value.status == 503 and str(signed_model) not in refused.value.message
    counted = ("signed", refused.value.problems[0].code)  # one count per refused load
    assert runtime.pool.verify_failures()[counted] == before.get(counted, 0) + 1
    check = ModelVerification.objects.get(model__name="signed")
    assert check.status == "refused" and code in check.reasons


def test_a_refusal_is_remembered_then_checked_again(
    registered, engine_host, builds, signed_model, signing_key, monkeypatch
):
    flip_byte(signed_model / "model.safetensors")
    with pytest.raises(ModelRefused):
        engine_host.engine(registered)
    flip_byte(signed_model / "model.safetensors")  # repaired
    with pytest.raises(ModelRefused):  # within RECHECK_SECONDS: no hashing storm
        engine_host.engine(registered)
    monkeypatch.setattr(load, "RECHECK_SECONDS", 0.0)
    engine_host.engine(registered)
    assert len(builds) == 1
    assert ModelVerification.objects.get(model__name="signed").status == "verified"


def test_warn_loads_unsigned_and_untrusted_models_but_never_tampered_ones(
    registered, engine_host, builds, signed_model, settings
):
    settings.FAIRLANE_MODEL_SIGNATURES = "warn"
    wrong_key(signed_model)
    engine_host.engine(registered)
    assert ModelVerification.objects.get(model__name="signed").status == "untrusted"
    engine_host.shutdown()
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (signed_model / name).unlink()
    engine_host.engine(registered)
    assert ModelVerification.objects.get(model__name="signed").status == "unsigned"
    engine_host.shutdown()
    wrong_key(signed_model)
    flip_byte(signed_model / "model.safetensors", offset=-1)
    model_sign(signed_model, Ed25519PrivateKey.generate(), **PREDICATE)  # fine: untrusted
    (signed_model / "config.json").write_text("{}")  # integrity is enforced under warn too
    with pytest.raises(ModelRefused):
        engine_host.engine(registered)
    assert len(builds) == 2


def test_require_refuses_an_unsigned_model(registered, engine_host, builds, signed_model):
    (signed_model / SIGNATURE_NAME).unlink()
    with pytest.raises(ModelRefused) as refused:
        engine_host.engine(registered)
    assert [p.code for p in refused.value.problems] == ["unsigned"] and builds == []


def test_registration_records_provenance(registered, signing_key):
    row = ServedModel.objects.get(name="signed")
    assert row.manifest_digest.startswith("sha256:") and row.origin == PREDICATE["source"]
    assert (row.signer, row.license) == (key_id(signing_key.public_key()), "apache-2.0")


def test_registration_refuses_what_a_worker_would_refuse(trusted, signed_model, pristine):
    flip_byte(signed_model / "model.safetensors")
    with pytest.raises(InvalidRequest) as caught:
        model_register(name="bad", source=str(signed_model))
    assert "hash_mismatch" in caught.value.message and caught.value.param == "source"
    with pytest.raises(InvalidRequest, match="unsigned"):
        model_register(name="unsigned", source=str(pristine))
    assert not ServedModel.objects.filter(name__in=["bad", "unsigned"]).exists()


def test_metrics_show_the_refusal(registered, engine_host, signed_model, client):
    flip_byte(signed_model / "model.safetensors")
    with pytest.raises(ModelRefused):
        engine_host.engine(registered)
    text = client.get("/metrics").content.decode()
    assert 'fairlane_model_verify_failures_total{model="signed",reason="hash_mismatch"} 1.0' in text


@pytest.mark.django_db(transaction=True)
async def test_embedded_a_request_for_a_refused_model_gets_a_clean_503(
    registered, signed_model, runtime, api_key
):
    flip_byte(signed_model / "model.safetensors")
    response = await AsyncClient().post(
        "/v1/chat/completions",
        {"model": "signed", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
        headers={"Authorization": f"Bearer {api_key[1]}"},
    )
    assert response.status_code == 503, response.content
    error = json.loads(response.content)["error"]
    assert error["code"] == "backend_unavailable" and str(signed_model) not in error["message"]
