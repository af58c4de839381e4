"""model_keygen, model_sign, model_verify, model_trust and model_register as an operator
runs them."""

import io
import os
import shutil

import pytest
from django.core.management import CommandError, call_command

from tests.artifacts.conftest import flip_byte
from workers.artifacts.keys import key_id, private_load
from workers.artifacts.manifest import MANIFEST_NAME, SIGNATURE_NAME
from workers.models import ServedModel, TrustedKey

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def model(tmp_path, pristine):
    return shutil.copytree(pristine, tmp_path / "llama-tiny")


@pytest.fixture(autouse=True)
def strict(settings):
    settings.FAIRLANE_MODEL_SIGNATURES = "require"
    settings.FAIRLANE_TRUSTED_KEYS = []


def test_keygen_sign_trust_verify_register(tmp_path, model):
    keyfile = str(tmp_path / "release.pem")
    out = run("model_keygen", keyfile)
    kid = key_id(private_load(keyfile).public_key())
    assert kid in out and os.stat(keyfile).st_mode & 0o777 == 0o600
    assert (tmp_path / "release.pem.pub").read_text().startswith("ed25519:")

    out = run(
        "model_sign",
        str(model),
        "--key",
        keyfile,
        "--model-version",
        "2024-06",
        "--source",
        "hf://org/llama-tiny@abc",
        "--licence",
        "apache-2.0",
    )
    assert kid in out and (model / MANIFEST_NAME).exists() and (model / SIGNATURE_NAME).exists()

    with pytest.raises(CommandError, match=f"untrusted_key: signed by {kid}"):
        run("model_verify", str(model))
    assert "OK under policy 'warn'" in run("model_verify", str(model), "--policy", "warn")

    assert kid in run("model_trust", "release", str(tmp_path / "release.pem.pub"))
    assert TrustedKey.objects.get(key_id=kid).name == "release"
    out = run("model_verify", str(model))
    assert f"signature: trusted by {kid}" in out and "'2024-06'" in out and "OK" in out

    out = run("model_register", "llama", str(model))
    row = ServedModel.objects.get(name="llama")
    assert (row.signer, row.origin, row.license) == (kid, "hf://org/llama-tiny@abc", "apache-2.0")
    assert row.manifest_digest in out


def test_verify_says_exactly_what_is_wrong(tmp_path, model):
    run("model_keygen", str(tmp_path / "k.pem"), "--trust", "k")
    run("model_sign", str(model), "--key", str(tmp_path / "k.pem"))
    flip_byte(model / "model.safetensors")
    (model / "generation_config.json").unlink()
    (model / "notes.md").write_text("x")
    with pytest.raises(CommandError) as caught:
        run("model_verify", str(model))
    message = str(caught.value)
    for expected in (
        "hash_mismatch: model.safetensors",
        "missing_file: generation_config.json",
        "extra_file: notes.md",
    ):
        assert expected in message


def test_sign_refuses_a_directory_workers_would_refuse(tmp_path, model):
    run("model_keygen", str(tmp_path / "k.pem"))
    (model / "training_args.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(CommandError, match="pickle: training_args.bin"):
        run("model_sign", str(model), "--key", str(tmp_path / "k.pem"))
    assert not (model / MANIFEST_NAME).exists()


def test_sign_with_the_dev_key_and_revoke_a_registry_key(tmp_path, model, settings):
    settings.FAIRLANE_DEV_SIGNING_KEY = str(tmp_path / "dev.pem")
    run("model_sign", str(model), "--dev-key")
    assert "OK under policy 'require'" in run("model_verify", str(model))
    run("model_keygen", str(tmp_path / "k.pem"), "--trust", "k")
    kid = TrustedKey.objects.get(name="k").key_id
    assert kid in run("model_trust", "--list")
    run("model_trust", "--revoke", kid)
    assert kid not in run("model_trust", "--list")


def test_bad_key_input_is_a_clear_error(tmp_path, model):
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(CommandError, match="not an unencrypted PEM private key"):
        run("model_sign", str(model), "--key", str(tmp_path / "junk.pem"))
    with pytest.raises(CommandError, match="ed25519"):
        run("model_trust", "x", "ed25519:AAAA")
    with pytest.raises(CommandError, match="exists"):
        run("model_keygen", str(tmp_path / "junk.pem"))
