"""A model directory signed by a key the test trusts, and the means to tamper with it."""

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workers.artifacts import load
from workers.artifacts.keys import public_text
from workers.artifacts.signing import model_sign
from workers.engine import preset_create

PREDICATE = {
    "name": "tiny-signed",
    "version": "3",
    "source": "hf://example/tiny@abc123",
    "license": "apache-2.0",
}


@pytest.fixture
def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def trusted(settings, signing_key):
    """Trust the signing key (through FAIRLANE_TRUSTED_KEYS), under the strict policy."""
    settings.FAIRLANE_TRUSTED_KEYS = [public_text(signing_key.public_key())]
    settings.FAIRLANE_MODEL_SIGNATURES = "require"
    return signing_key


@pytest.fixture(scope="session")
def pristine(tmp_path_factory) -> Path:
    return preset_create("tiny", tmp_path_factory.mktemp("pristine") / "tiny", seed=3)


@pytest.fixture
def signed_model(tmp_path, pristine, signing_key) -> Path:
    """A fresh copy of the tiny preset, signed by `signing_key`."""
    import shutil

    path = Path(shutil.copytree(pristine, tmp_path / "model"))
    model_sign(path, signing_key, **PREDICATE)
    return path


@pytest.fixture(autouse=True)
def _no_cached_refusals():
    load._refused.clear()
    yield
    load._refused.clear()


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
