"""deploy/k8s, validated without a cluster: the base, every overlay and the optional component,
rendered by kustomize itself (`kubectl kustomize`: tests/deploy/manifests.py),
every manifest against the Kubernetes schemas (kubernetes-validate, strict), KEDA's
ScaledObject and the ServiceMonitor against schemas of the fields we use, yamllint, and the
deployment's own rules (drain, probes, one beat, no secrets, a PDB and a scaler per pool,
GPUs only in the GPU overlay)."""

import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.manifests import K8S, OVERLAYS, of

VERSIONS = ("1.31.0", "1.37.0")
CRDS = {"ScaledObject", "ServiceMonitor"}


def containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def one(docs, kind, name):
    found = of(docs, kind, name)
    assert len(found) == 1, (kind, name)
    return found[0]


def env_of(container) -> dict:
    names = [e["name"] for e in container.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env in {container['name']}: {names}"
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(manifests, overlay, version):
    checked = 0
    for doc in manifests[overlay]:
        if doc["kind"] in CRDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 10


SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "advanced": {
                    "type": "object",
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {"behavior": {"type": "object"}},
                        }
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "prometheus"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                                "required": ["serverAddress", "query", "threshold"],
                            },
                        },
                    },
                },
            },
        },
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "required": ["matchLabels"]},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port", "path"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                            "authorization": {"type": "object", "required": ["credentials"]},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scaled_objects_and_the_service_monitor_are_well_formed(manifests, overlay):
    docs = manifests[overlay]
    deployments = {d["metadata"]["name"]: d for d in of(docs, "Deployment")}
    for scaled in of(docs, "ScaledObject"):
        jsonschema.validate(scaled, SCALED_OBJECT)
        target = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
        assert target["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
        depth, *floor = [t["metadata"] for t in scaled["spec"]["triggers"]]
        assert "fairlane_queue_depth" in depth["query"] and depth["threshold"] == "5"
        assert scaled["spec"]["cooldownPeriod"] >= 60
        # The models' floor, unless the pool may go to zero.
        if scaled["spec"]["minReplicaCount"] > 0:
            assert [(t["query"].split("{")[0], t["threshold"]) for t in floor] == [
                ("max(fairlane_model_replicas_min", "1")
            ]
        else:
            assert not floor
        models = env_of(containers(target)[0])["FAIRLANE_WORKER_MODELS"].split(",")
        for trigger in (depth, *floor):
            pattern = re.search(r'model=~"([^"]+)"', trigger["query"])[1]
            assert all(re.fullmatch(pattern, m) for m in models), (pattern, models)
    monitor = one(docs, "ServiceMonitor", "fairlane-api")
    jsonschema.validate(monitor, SERVICE_MONITOR)
    service = one(docs, "Service", "fairlane-api")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_drain_probe_and_take_secrets_only_by_reference(manifests, overlay):
    docs = manifests[overlay]
    assert not of(docs, "Secret")
    config = one(docs, "ConfigMap", "fairlane-config")["data"]
    assert {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "FAIRLANE_API_KEY_PEPPER",
        "FAIRLANE_METRICS_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "FAIRLANE_FILES_S3_BUCKET",
    }.isdisjoint(config)
    drain = int(config["FAIRLANE_DRAIN_TIMEOUT_SECONDS"])
    for doc in of(docs, "Deployment") + of(docs, "Job"):
        pod = doc["spec"]["template"]["spec"]
        for container in containers(doc):
            refs = [e.get("secretRef", {}).get("name") for e in container.get("envFrom", [])]
            assert "fairlane-secrets" in refs, doc["metadata"]["name"]
            # The files bucket's settings and credentials, from their own Secret.
            files = [e["secretRef"] for e in container["envFrom"] if "secretRef" in e]
            assert {"name": "fairlane-files", "optional": True} in files, doc["metadata"]["name"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        if component in ("api", "worker"):
            assert pod["terminationGracePeriodSeconds"] >= drain
            assert "preStop" in containers(doc)[0]["lifecycle"]
    api = containers(one(docs, "Deployment", "fairlane-api"))[0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"name": "Host", "value": "localhost"} in api["readinessProbe"]["httpGet"]["httpHeaders"]
    assert "localhost" in env_of(api)["ALLOWED_HOSTS"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_beat_a_migration_job_an_hpa_and_a_pdb_per_pool(manifests, overlay):
    docs = manifests[overlay]
    beat = one(docs, "Deployment", "fairlane-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    job = one(docs, "Job", "fairlane-migrate")
    assert containers(job)[0]["command"][-2:] == ["migrate", "--noinput"]
    hpa = one(docs, "HorizontalPodAutoscaler", "fairlane-api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "fairlane-api"
    pdbs = of(docs, "PodDisruptionBudget")
    for deployment in of(docs, "Deployment"):
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        if component not in ("api", "worker"):
            continue
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert any(p["spec"]["selector"]["matchLabels"].items() <= labels.items() for p in pdbs)
        if component == "worker":
            command = containers(deployment)[0]["command"]
            assert command[command.index("-Q") + 1] == "gpu"  # hosts models; no housekeeping
            assert of(docs, "ScaledObject", deployment["metadata"]["name"])
    housekeeping = containers(one(docs, "Deployment", "fairlane-housekeeping"))[0]["command"]
    assert housekeeping[housekeeping.index("-Q") + 1] == "default"


def test_gpus_only_in_the_gpu_overlay_and_scale_to_zero_only_when_asked(manifests):
    for name, docs in manifests.items():
        worker = one(docs, "Deployment", "fairlane-worker-default")
        pod, container = worker["spec"]["template"]["spec"], containers(worker)[0]
        device = env_of(container)["FAIRLANE_ENGINE_DEVICE"]
        if name.startswith("gpu"):
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 and device == "cuda"
            assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert container["image"] == "registry.example.com/fairlane-gpu:0.1.0"
        else:
            assert "nvidia.com/gpu" not in str(worker) and device == "cpu"
        minimum = one(docs, "ScaledObject", "fairlane-worker-default")["spec"]["minReplicaCount"]
        assert minimum == (0 if name == "gpu+scale-to-zero" else 1)
    dev = manifests["dev"]
    volumes = one(dev, "Deployment", "fairlane-worker-default")["spec"]["template"]["spec"][
        "volumes"
    ]
    assert next(v for v in volumes if v["name"] == "models") == {"name": "models", "emptyDir": {}}
    assert one(dev, "ConfigMap", "fairlane-config")["data"]["FAIRLANE_DEV_SIGNING_KEY"]
    assert (
        one(manifests["gpu"], "ConfigMap", "fairlane-config")["data"]["FAIRLANE_DEV_SIGNING_KEY"]
        == ""
    )


def test_yamllint_passes_strictly():
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", str(K8S / ".yamllint.yaml"), str(K8S)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
