"""deploy/kubernetes, checked offline: every document against the schemas of its kind (built-in kinds with
kubernetes-validate in strict mode, KEDA's ScaledObject and TriggerAuthentication with the JSON Schemas that
scripts/derive_keda_schemas.py derives from KEDA's CRDs), then what metarl needs of them: one Deployment per pool,
one ScaledObject per scalable queue, the security contexts of the pools that run agent-written code, the Secret's
keys, and command lines the real CLI parser accepts. Broken copies of the manifests must fail."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft202012Validator

from metarl.messaging import dispatch
from metarl.messaging.celery_app import make_app
from metarl.messaging.queues import QUEUES
from metarl.runconfig import load_run
from metarl.store.records import Stage
from metarl_cli.arguments import build_parser

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
SCHEMAS = MANIFESTS / "schemas"
KUBERNETES_VERSION = "1.33.0"
"""The oldest Kubernetes the manifests are written for: pod-level appArmorProfile (1.30) and user namespaces on by default (1.33)."""
KEDA_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("keda.sh/v1alpha1", "TriggerAuthentication")}
NAMESPACE = "metarl"
SECRET = "metarl-secrets"
SINGLE_POOLS = {"outer"}
"""Pools that are never scaled: one pod, one process."""
SCALABLE_POOLS = [pool for pool in QUEUES if pool not in SINGLE_POOLS]
AGENT_CODE_POOLS = {"probe", "train"}
"""The pools that run agent-written code under bubblewrap (docker-compose.yml gives them the same security options)."""
SECRET_KEYS = {"METARL_DATABASE_URL", "METARL_BROKER_URL", "METARL_EVAL_SECRET", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
CACHE = "/home/metarl/.cache"


class ManifestInvalid(Exception):
    pass


def load_documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every non-empty document of every YAML file under deploy/kubernetes."""
    found = []
    for path in sorted([*MANIFESTS.rglob("*.yaml"), *MANIFESTS.rglob("*.yml")]):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                found.append((str(path.relative_to(MANIFESTS)), document))
    return found


def keda_validator(api_version: str, kind: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"keda-{kind.lower()}-{api_version.split('/')[1]}.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def validate_document(document: dict[str, Any]) -> None:
    """Raise ManifestInvalid unless the document passes the schema of its kind (and the CRD's CEL rule we rely on)."""
    if not isinstance(document, dict) or not isinstance(document.get("apiVersion"), str) or not isinstance(document.get("kind"), str):
        raise ManifestInvalid(f"not a Kubernetes object: {str(document)[:80]}")
    key = (document["apiVersion"], document["kind"])
    if key in KEDA_KINDS:
        errors = sorted(keda_validator(*key).iter_errors(document), key=lambda error: list(error.path))
        if errors:
            raise ManifestInvalid("; ".join(f"{'.'.join(map(str, error.path))}: {error.message}" for error in errors))
        spec = document["spec"]
        # The CRD's x-kubernetes-validations rule (CEL, which JSON Schema does not evaluate): min <= max (max defaults to 100).
        if document["kind"] == "ScaledObject" and spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
            raise ManifestInvalid("minReplicaCount must be less than or equal to maxReplicaCount")
        return
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        raise ManifestInvalid(f"{'.'.join(map(str, err.path))}: {err.message}") from None
    except kubernetes_validate.SchemaNotFoundError as err:
        raise ManifestInvalid(err.message) from None


DOCUMENTS = load_documents()


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {document["metadata"]["name"]: document for _, document in DOCUMENTS if document.get("kind") == kind}


def deployment(pool: str) -> dict[str, Any]:
    return objects("Deployment")[f"metarl-{pool}"]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(workload)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def workloads() -> dict[str, dict[str, Any]]:
    return {**objects("Deployment"), **objects("Job")}


# --------------------------------------------------------------------------------------------


def test_the_manifests_are_there() -> None:
    names = {name for name, _ in DOCUMENTS}
    assert {"namespace.yaml", "config.yaml", "secrets.example.yaml", "migrate-job.yaml", "orchestrator.yaml", "keda.yaml", "metrics.yaml"} <= names
    assert len(DOCUMENTS) >= 15


@pytest.mark.parametrize(("name", "document"), DOCUMENTS, ids=[f"{name}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}" for name, doc in DOCUMENTS])
def test_every_document_passes_its_schema(name: str, document: dict[str, Any]) -> None:
    validate_document(document)
    if document["kind"] != "Namespace":
        assert document["metadata"].get("namespace") == NAMESPACE, f"{name}: {document['kind']} outside the namespace"


def test_keda_schemas_name_their_source() -> None:
    for path in sorted(SCHEMAS.glob("keda-*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(schema)
        comment = schema["$comment"]
        assert "KEDA v" in comment and "config/crd/bases/keda.sh_" in comment, path.name
        assert schema["x-metarl-source"]["keda_version"] in comment
    assert {path.name for path in SCHEMAS.glob("keda-*.json")} == {"keda-scaledobject-v1alpha1.json", "keda-triggerauthentication-v1alpha1.json"}


# Broken copies: each must fail the check that the good ones pass.


def _first(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [document for _, document in DOCUMENTS if document["kind"] == kind and (name is None or document["metadata"]["name"] == name)]
    assert found, (kind, name)
    return copy.deepcopy(found[0])


def _misspelled_container_field(doc: dict[str, Any]) -> None:
    container = pod_spec(doc)["containers"][0]
    container["imagePullPolicyy"] = container.pop("imagePullPolicy", "IfNotPresent")


def _misspelled_pod_field(doc: dict[str, Any]) -> None:
    pod_spec(doc)["securityContext"]["seccompProfiles"] = pod_spec(doc)["securityContext"].pop("seccompProfile")


def _replicas_as_text(doc: dict[str, Any]) -> None:
    doc["spec"]["replicas"] = "one"


def _bad_seccomp_type(doc: dict[str, Any]) -> None:
    pod_spec(doc)["securityContext"]["seccompProfile"]["type"] = 3


def _trigger_without_metadata(doc: dict[str, Any]) -> None:
    del doc["spec"]["triggers"][0]["metadata"]


def _list_length_as_number(doc: dict[str, Any]) -> None:
    doc["spec"]["triggers"][0]["metadata"]["listLength"] = 4  # KEDA's trigger metadata is a map of strings


def _misspelled_scaled_object_field(doc: dict[str, Any]) -> None:
    doc["spec"]["minReplicas"] = doc["spec"].pop("minReplicaCount")


def _min_above_max(doc: dict[str, Any]) -> None:
    doc["spec"]["minReplicaCount"] = doc["spec"]["maxReplicaCount"] + 1


def _no_triggers(doc: dict[str, Any]) -> None:
    doc["spec"]["triggers"] = []


def _secret_ref_without_key(doc: dict[str, Any]) -> None:
    del doc["spec"]["secretTargetRef"][0]["key"]


def _unknown_api_version(doc: dict[str, Any]) -> None:
    doc["apiVersion"] = "apps/v1beta9"


def _service_port_as_text(doc: dict[str, Any]) -> None:
    doc["spec"]["ports"][0]["port"] = "nine"


BROKEN: list[tuple[str, str | None, Callable[[dict[str, Any]], None]]] = [
    ("Deployment", "metarl-agent", _misspelled_container_field),
    ("Deployment", "metarl-probe", _misspelled_pod_field),
    ("Deployment", "metarl-outer", _replicas_as_text),
    ("Deployment", "metarl-train", _bad_seccomp_type),
    ("Job", None, _misspelled_container_field),
    ("Service", None, _service_port_as_text),
    ("Deployment", "metarl-orchestrator", _unknown_api_version),
    ("ScaledObject", None, _trigger_without_metadata),
    ("ScaledObject", None, _list_length_as_number),
    ("ScaledObject", None, _misspelled_scaled_object_field),
    ("ScaledObject", None, _min_above_max),
    ("ScaledObject", None, _no_triggers),
    ("TriggerAuthentication", None, _secret_ref_without_key),
]


@pytest.mark.parametrize(("kind", "name", "mutate"), BROKEN, ids=[f"{kind}-{mutate.__name__.strip('_')}" for kind, _, mutate in BROKEN])
def test_a_broken_manifest_fails(kind: str, name: str | None, mutate: Callable[[dict[str, Any]], None]) -> None:
    document = _first(kind, name)
    validate_document(copy.deepcopy(document))  # the original passes ...
    mutate(document)
    with pytest.raises(ManifestInvalid):  # ... the broken copy does not
        validate_document(document)


def test_the_validator_checks_strictly() -> None:
    """kubernetes-validate without strict mode would accept unknown fields: make sure the strict schemas are the ones used."""
    document = _first("Deployment", "metarl-agent")
    _misspelled_container_field(document)
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=False)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    with pytest.raises(jsonschema.ValidationError):
        keda_validator("keda.sh/v1alpha1", "ScaledObject").validate({**_first("ScaledObject"), "extra": 1})


# What metarl needs of them.


@pytest.mark.parametrize("pool", QUEUES)
def test_one_deployment_per_pool(pool: str) -> None:
    workload = deployment(pool)
    (container,) = pod_spec(workload)["containers"]
    argv = container["command"]
    assert argv[:4] == ["metarl", "worker", "--pool", pool]
    args = build_parser().parse_args(argv[1:])
    assert args.pool == pool
    if pool in SINGLE_POOLS:
        assert args.concurrency == 1 and args.autoscale is None, "one update at a time"
        assert workload["spec"]["replicas"] == 1
    else:
        low, high = args.autoscale.split(",")
        assert low == high, args.autoscale
    assert {env["secretRef"]["name"] for env in container.get("envFrom", [])} == {SECRET}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod_spec(workload)["volumes"]}
    assert "emptyDir" in volumes[mounts[CACHE]], "the model cache is per pod"
    assert volumes[mounts["/app/configs"]]["configMap"]["name"] == "metarl-config"
    selector = workload["spec"]["selector"]["matchLabels"]
    assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items(), "the selector must match the pod template"


@pytest.mark.parametrize("pool", SCALABLE_POOLS)
def test_one_scaled_object_per_scalable_queue(pool: str) -> None:
    scaled = objects("ScaledObject")
    (mine,) = [so for so in scaled.values() if so["spec"]["scaleTargetRef"]["name"] == f"metarl-{pool}"]
    assert mine["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    assert mine["spec"]["minReplicaCount"] >= 1, "a pool holds its countdown polls out of the list: never scale it to zero"
    (trigger,) = mine["spec"]["triggers"]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == pool
    assert int(trigger["metadata"]["listLength"]) >= 1
    auth = objects("TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    parameters = {ref["parameter"]: ref for ref in auth["spec"]["secretTargetRef"]}
    assert {ref["name"] for ref in parameters.values()} == {SECRET}
    assert "address" in parameters, "the Redis address comes from the Secret"
    # listLength is the number of processes per pod (pools.yaml's --autoscale N,N)
    args = build_parser().parse_args(pod_spec(deployment(pool))["containers"][0]["command"][1:])
    assert int(trigger["metadata"]["listLength"]) == int(args.autoscale.split(",")[0])


def test_single_processes_are_not_scaled() -> None:
    targets = {so["spec"]["scaleTargetRef"]["name"] for so in objects("ScaledObject").values()}
    assert targets == {f"metarl-{pool}" for pool in SCALABLE_POOLS}
    assert "metarl-orchestrator" not in targets and "metarl-outer" not in targets


def test_celery_keeps_every_message_in_the_plain_list() -> None:
    """keda.yaml counts the list named like the queue: kombu uses other keys only for messages with a priority."""
    app = make_app("redis://127.0.0.1:6379/0")
    assert app.conf.task_default_priority is None
    assert not {"priority_steps", "sep", "queue_order_strategy"} & set(app.conf.broker_transport_options)
    assert {queue.name for queue in app.conf.task_queues} == set(QUEUES)
    sent: list[dict[str, Any]] = []

    class Recorder:
        def send_task(self, name: str, **options: Any) -> None:
            sent.append(options)

    for stage in Stage:
        if stage in dispatch.STAGE_TASKS:
            dispatch.send_stage(Recorder(), stage, 1, 0, countdown=5.0)
    dispatch.send_outer(Recorder(), 1)
    assert sent and all("priority" not in options for options in sent)
    assert {options["queue"] for options in sent} == set(QUEUES)


def test_orchestrator_is_single_and_runs_the_mounted_config() -> None:
    orchestrator = deployment("orchestrator")
    assert orchestrator["spec"]["replicas"] == 1
    assert orchestrator["spec"]["strategy"]["type"] == "Recreate", "the old pod is gone before the new one starts"
    (container,) = pod_spec(orchestrator)["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "run" and str(args.config) == "/app/configs/run.toml" and args.no_workers and args.quiet
    mount = next(mount for mount in container["volumeMounts"] if mount["mountPath"] == "/app/configs")
    volume = next(volume for volume in pod_spec(orchestrator)["volumes"] if volume["name"] == mount["name"])
    assert "run.toml" in objects("ConfigMap")[volume["configMap"]["name"]]["data"]


def test_migrate_job_and_metrics() -> None:
    (job,) = objects("Job").values()
    (container,) = pod_spec(job)["containers"]
    assert container["command"] == ["metarl", "db", "upgrade"]
    metrics = deployment("metrics")
    (container,) = pod_spec(metrics)["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "metrics" and args.host == "0.0.0.0"
    service = objects("Service")["metarl-metrics"]
    assert service["spec"]["selector"].items() <= metrics["spec"]["template"]["metadata"]["labels"].items()
    port = service["spec"]["ports"][0]
    named = {entry["name"]: entry["containerPort"] for entry in container["ports"]}
    assert port["port"] == args.port and named[port["targetPort"]] == args.port


@pytest.mark.parametrize("pool", QUEUES)
def test_only_the_pools_that_run_agent_code_leave_the_default_profiles(pool: str) -> None:
    spec = pod_spec(deployment(pool))
    pod_security = spec["securityContext"]
    (container,) = spec["containers"]
    if pool in AGENT_CODE_POOLS:  # docker-compose.yml: seccomp=unconfined, apparmor=unconfined, systempaths=unconfined
        assert pod_security["seccompProfile"]["type"] == "Unconfined"
        assert pod_security["appArmorProfile"]["type"] == "Unconfined"
        assert container["securityContext"]["procMount"] == "Unmasked"
        assert spec["hostUsers"] is False, "Kubernetes allows procMount Unmasked only in a user namespace"
    else:
        assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
        assert "appArmorProfile" not in pod_security and "procMount" not in container.get("securityContext", {})


@pytest.mark.parametrize("name", sorted(workloads()))
def test_every_pod_runs_unprivileged_with_the_secret(name: str) -> None:
    workload = workloads()[name]
    spec = pod_spec(workload)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    for container in containers(workload):
        security = container.get("securityContext", {})
        assert not security.get("privileged") and security.get("allowPrivilegeEscalation") is False, (name, container["name"])
        assert not security.get("capabilities", {}).get("add"), (name, container["name"])
        assert container["image"] == "metarl:latest", "the placeholder image, the same for every process"
        assert {env["secretRef"]["name"] for env in container.get("envFrom", [])} == {SECRET}, (name, container["name"])


def test_the_secret_example_has_every_key_and_only_placeholders() -> None:
    (secret,) = [document for name, document in DOCUMENTS if name == "secrets.example.yaml"]
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == SECRET
    values = secret["stringData"]
    assert SECRET_KEYS <= set(values), sorted(SECRET_KEYS - set(values))
    referenced = {ref["key"] for auth in objects("TriggerAuthentication").values() for ref in auth["spec"]["secretTargetRef"]}
    assert referenced <= set(values), sorted(referenced - set(values))
    for key in ("METARL_EVAL_SECRET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "REPLACE" in values[key], f"{key} must be an obvious placeholder"
    assert "REPLACE" in values["METARL_DATABASE_URL"], "the database password is a placeholder"
    for key, value in values.items():
        assert value == "" or "REPLACE" in value or "example" in value, f"{key}: {value!r} does not look like a placeholder"


def test_the_run_config_loads_and_uses_the_shared_store(tmp_path: Path) -> None:
    """config.yaml's run.toml is a valid run config where the pods put it (/app/configs, task specs at /app/tasks_specs)."""
    (configmap,) = objects("ConfigMap").values()
    configs = tmp_path / "configs"
    configs.mkdir()
    (tmp_path / "tasks_specs").symlink_to(REPO / "tasks_specs")
    (configs / "run.toml").write_text(configmap["data"]["run.toml"], encoding="utf-8")
    config, specs = load_run(configs / "run.toml")
    assert set(specs) == set(config.run.tasks)
    assert config.artifacts.root.startswith("s3://"), "every host must reach the artifacts: a shared object store"
