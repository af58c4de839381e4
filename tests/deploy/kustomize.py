"""A small kustomize for the tests (no kustomize, kubectl or helm here): resources (files and
directories), components, strategic-merge patches (by kind and name, lists merged on their
Kubernetes merge keys, `null` deletes), JSON 6902 patches with a target, `images` and `labels`.
Enough for deploy/k8s; anything else it meets is an error rather than a silent skip."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name"}
KNOWN = {"apiVersion", "kind", "resources", "components", "patches", "images", "labels"}


def render(directory: Path, text: str | None = None) -> list[dict]:
    """The objects of `directory`'s kustomization (or of `text`, read as if it were there)."""
    spec = yaml.safe_load(text or (directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN
    assert not unknown, f"{directory}: the test renderer does not handle {unknown}"
    docs: list[dict] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(
            path.read_text()) if d]
    for entry in spec.get("components", []):
        component = (directory / entry).resolve()
        docs = _patched(docs, yaml.safe_load((component / "kustomization.yaml").read_text()),
                        component)
    docs = _patched(docs, spec, directory)
    for image in spec.get("images", []):
        _retag(docs, image)
    for label in spec.get("labels", []):
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    return docs


def _patched(docs: list[dict], spec: dict, directory: Path) -> list[dict]:
    for patch in spec.get("patches", []):
        if "path" in patch:
            for doc in yaml.safe_load_all((directory / patch["path"]).read_text()):
                if doc:
                    target = _find(docs, doc["kind"], doc["metadata"]["name"])
                    docs[docs.index(target)] = merge(target, doc)
        else:
            body = yaml.safe_load(patch["patch"])
            targets = [d for d in docs if _matches(d, patch["target"])]
            assert targets, f"patch target {patch['target']} matches nothing"
            for target in targets:
                docs[docs.index(target)] = (json6902(target, body) if isinstance(body, list)
                                            else merge(target, body))
    return docs


def _find(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"patch for {kind}/{name}: {len(found)} matches"
    return found[0]


def _matches(doc: dict, target: dict) -> bool:
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    return all([target.get("kind", doc["kind"]) == doc["kind"],
                target.get("group", group) == group,
                target.get("name", doc["metadata"]["name"]) == doc["metadata"]["name"]])


def merge(base, patch, key: str | None = None):
    """Strategic merge: maps merge, `null` deletes, lists of objects merge on their key."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(out[k], v, k) if k in out else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field = MERGE_KEYS[key]
        out = copy.deepcopy(base)
        for item in patch:
            match = next((i for i, b in enumerate(out) if b.get(field) == item.get(field)), None)
            if match is None:
                out.append(copy.deepcopy(item))
            else:
                out[match] = merge(out[match], item)
        return out
    return copy.deepcopy(patch)


def json6902(doc: dict, ops: list[dict]) -> dict:
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p for p in op["path"].split("/")[1:]]
        node = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert op["op"] in ("add", "replace", "remove"), op
        if isinstance(node, list):  # an index (RFC 6902); "-" appends
            last = len(node) if last == "-" else int(last)
            assert op["op"] == "add" or last < len(node), f"no {op['path']}"
        if op["op"] == "remove":
            del node[last]
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(last, op["value"])
        else:
            assert op["op"] == "add" or last in node, f"replace of a missing {op['path']}"
            node[last] = op["value"]
    return out


def containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] != "CronJob" else doc
    return spec.get("initContainers", []) + spec["containers"]


def _retag(docs: list[dict], image: dict) -> None:
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job", "StatefulSet"):
            continue
        for container in containers(doc):
            name, _, tag = container["image"].rpartition(":") if ":" in container[
                "image"].rsplit("/", 1)[-1] else (container["image"], "", "")
            if name == image["name"]:
                container["image"] = (f"{image.get('newName', name)}:"
                                      f"{image.get('newTag', tag or 'latest')}")
