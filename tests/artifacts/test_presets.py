"""Presets are signed at creation by the local development key; a preset that is not signed by
it is generated again from its seed, never signed as found."""

import hashlib

import pytest

from tests.artifacts.conftest import flip_byte
from workers.artifacts import presets
from workers.artifacts.keys import key_id, private_load
from workers.artifacts.load import ModelRefused, artifact_check
from workers.artifacts.manifest import MANIFEST_NAME, SIGNATURE_NAME
from workers.artifacts.trust import trusted_keys
from workers.artifacts.verify import TRUSTED, UNSIGNED
from workers.serving.catalog import ModelInfo, model_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def data(settings, tmp_path):
    settings.FAIRLANE_MODEL_DIR = tmp_path / "models"
    settings.FAIRLANE_DEV_SIGNING_KEY = str(tmp_path / "signing" / "dev.pem")
    settings.FAIRLANE_MODEL_SIGNATURES = "require"
    presets._known_signed.clear()
    yield tmp_path
    presets._known_signed.clear()


def digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_a_preset_is_signed_by_the_dev_key_made_on_first_use(data):
    path = model_dir("preset:tiny@7")
    key = private_load(data / "signing" / "dev.pem")
    assert (data / "signing" / "dev.pem").stat().st_mode & 0o777 == 0o600
    result, refusals = artifact_check(path=path)
    assert refusals == [] and result.trust == TRUSTED
    assert result.signer == key_id(key.public_key()) and result.signer in trusted_keys()
    assert result.predicate == {
        "name": "tiny",
        "version": "seed7-format1",
        "source": "preset:tiny@7",
        "license": "NOASSERTION",
    }


def test_a_preset_stripped_of_its_signature_is_made_again_not_blessed(data):
    path = model_dir("preset:tiny@7")
    original = digest(path)
    flip_byte(path / "model.safetensors")
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        (path / name).unlink()
    presets._known_signed.clear()  # a new process
    again = model_dir("preset:tiny@7")
    assert again == path and digest(path) == original
    assert artifact_check(path=path)[1] == []


def test_a_signed_preset_changed_afterwards_is_refused_at_load(data):
    from routing.runtimes import runtime_build

    path = model_dir("preset:tiny@7")
    flip_byte(path / "model.safetensors")
    host = runtime_build("embedded").engine_host
    with pytest.raises(ModelRefused):
        host.engine(ModelInfo(name="tiny7", source="preset:tiny@7"))
    assert model_dir("preset:tiny@7") == path  # not regenerated over a signed directory


def test_another_keys_preset_is_made_again_with_ours(data, settings):
    path = model_dir("preset:tiny@7")
    theirs = (path / SIGNATURE_NAME).read_bytes()
    settings.FAIRLANE_DEV_SIGNING_KEY = str(data / "signing" / "other.pem")
    model_dir("preset:tiny@7")
    assert (path / SIGNATURE_NAME).read_bytes() != theirs
    assert artifact_check(path=path)[0].trust == TRUSTED


def test_without_a_dev_key_presets_are_unsigned_and_require_refuses_them(data, settings):
    settings.FAIRLANE_DEV_SIGNING_KEY = ""
    path = model_dir("preset:tiny@8")
    assert not (path / MANIFEST_NAME).exists() and not (data / "signing").exists()
    result, refusals = artifact_check(path=path)
    assert result.trust == UNSIGNED and [p.code for p in refusals] == ["unsigned"]
