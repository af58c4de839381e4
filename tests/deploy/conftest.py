import pytest

from tests.deploy.manifests import render_all


@pytest.fixture(scope="session")
def manifests(tmp_path_factory) -> dict[str, list[dict]]:
    """deploy/k8s rendered by `kubectl kustomize` (tests/deploy/manifests.py), once."""
    return render_all(tmp_path_factory.mktemp("k8s"))
