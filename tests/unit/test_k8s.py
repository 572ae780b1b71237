"""`shoal k8s`: the objects validate against the published API types, match golden files, and bad
input is one line, exit 2.

TrainJob and JobSet are checked field by field against Kubeflow Trainer's API models
(kubeflow-trainer-api, generated from the CRDs' OpenAPI schemas; it ships JobSet v1alpha2 and
core/v1 too): a field the type does not have fails, as does a wrong type. The PyTorchJob's pod
template is checked the same way against core/v1 PodTemplateSpec; its envelope against the v1
field names (the kubeflow-training package needs the kubernetes client, too heavy for the tests).
"""

import json
import os
import types
import typing
from pathlib import Path

import pytest

from shoal.cli.main import main
from shoal.launch.k8s import KINDS

models = pytest.importorskip("kubeflow_trainer_api.models", reason="pip install -e '.[dev]' (kubeflow-trainer-api)")
yaml = pytest.importorskip("yaml")
GOLDEN = Path(__file__).parent / "golden" / "k8s"
REPO = Path(__file__).resolve().parents[2]
ARGS = ["recipes/tiny.toml", "--nodes", "2", "--gpus-per-node", "4", "--image", "ghcr.io/example/shoal:0.1",
        "--queue", "team-a"]


def strict(model, data, path="") -> None:
    """Validate data against a generated pydantic model, refusing fields the type does not declare
    (the models' own from_dict ignores them, so a typo would pass)."""
    from pydantic import BaseModel

    if isinstance(model, type) and issubclass(model, BaseModel) and "actual_instance" in model.model_fields:
        model.from_json(json.dumps(data))  # a oneOf (Quantity, IntOrString): the model picks the type
        return
    if isinstance(model, type) and issubclass(model, BaseModel):
        assert isinstance(data, dict), f"{path}: expected an object, got {data!r}"
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        unknown = set(data) - set(fields)
        assert not unknown, f"{path}: {model.__name__} has no field {sorted(unknown)}"
        for key, value in data.items():
            strict(fields[key].annotation, value, f"{path}.{key}")
        assert model.from_dict(data) is not None  # types, enums and required fields, by the model itself
        return
    origin, args = typing.get_origin(model), typing.get_args(model)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return strict(inner[0], data, path) if len(inner) == 1 else None
    if origin is list:
        assert isinstance(data, list), f"{path}: expected a list"
        for i, v in enumerate(data):
            strict(args[0], v, f"{path}[{i}]")
    elif origin is dict:
        assert isinstance(data, dict), f"{path}: expected a map"
        for k, v in data.items():
            strict(args[1], v, f"{path}.{k}")
    elif origin is typing.Annotated:
        strict(args[0], data, path)


PYTORCHJOB_FIELDS = {  # kubeflow.org/v1, from the training-operator's KubeflowOrgV1* models' attribute maps
    "spec": {"elasticPolicy", "nprocPerNode", "pytorchReplicaSpecs", "runPolicy"},
    "elasticPolicy": {"maxReplicas", "maxRestarts", "metrics", "minReplicas", "nProcPerNode", "rdzvBackend",
                      "rdzvConf", "rdzvHost", "rdzvId", "rdzvPort", "standalone"},
    "replica": {"replicas", "restartPolicy", "template"},
}


def check_pytorchjob(obj) -> None:
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"} and obj["apiVersion"] == "kubeflow.org/v1"
    strict(models.IoK8sApimachineryPkgApisMetaV1ObjectMeta, obj["metadata"], "metadata")
    spec = obj["spec"]
    assert set(spec) <= PYTORCHJOB_FIELDS["spec"], spec.keys()
    assert set(spec["elasticPolicy"]) <= PYTORCHJOB_FIELDS["elasticPolicy"]
    assert isinstance(spec["nprocPerNode"], str)  # *string in the v1 API
    assert set(spec["pytorchReplicaSpecs"]) <= {"Master", "Worker"}
    for name, replica in spec["pytorchReplicaSpecs"].items():
        assert set(replica) <= PYTORCHJOB_FIELDS["replica"]
        strict(models.IoK8sApiCoreV1PodTemplateSpec, replica["template"], f"{name}.template")
        assert replica["template"]["spec"]["containers"][0]["name"] == "pytorch"


VALIDATE = {
    "trainjob": lambda o: strict(models.TrainerV1alpha1TrainJob, o),
    "jobset": lambda o: strict(models.JobsetV1alpha2JobSet, o),
    "pytorchjob": check_pytorchjob,
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out, cwd = tmp_path_factory.mktemp("k8s"), os.getcwd()
    os.chdir(REPO)  # the recipe path is relative, as it is inside the image
    try:
        assert main(["k8s", *ARGS, "--out", str(out)]) == 0
    finally:
        os.chdir(cwd)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_objects_validate_against_the_api_types(written, kind):
    obj = yaml.safe_load((written / f"{kind}.yaml").read_text())
    VALIDATE[kind](obj)


@pytest.mark.parametrize("kind", list(KINDS))
def test_golden(written, kind):
    got = (written / f"{kind}.yaml").read_text()
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        (GOLDEN / f"{kind}.yaml").write_text(got)
    assert got == (GOLDEN / f"{kind}.yaml").read_text(), "regenerate with SHOAL_UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("kind,where,typo", [
    ("trainjob", ("spec", "trainer"), "numProcsPerNode"),
    ("jobset", ("spec",), "replicatedJob"),
    ("pytorchjob", ("spec", "elasticPolicy"), "rdzvBackEnd"),
])
def test_a_typo_fails_validation(written, kind, where, typo):
    obj = yaml.safe_load((written / f"{kind}.yaml").read_text())
    node = obj
    for key in where:
        node = node[key]
    node[typo] = node.pop(next(iter(node)))
    with pytest.raises(AssertionError):
        VALIDATE[kind](obj)


def test_a_wrong_type_fails_validation(written):
    obj = yaml.safe_load((written / "trainjob.yaml").read_text())
    obj["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(Exception):
        VALIDATE["trainjob"](obj)


@pytest.mark.parametrize("change,field", [
    ({"--image": ""}, "--image"), ({"--image": "a b"}, "--image"), ({"--gpus-per-node": "0"}, "--gpus-per-node"),
    ({"--nodes": "0"}, "--nodes"), ({"--nodes": "3"}, "train.global_batch"),  # 12 ranks: the recipe's batch does not split
])
def test_bad_input_is_one_line(change, field, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    args = list(ARGS)
    for flag, value in change.items():
        args[args.index(flag) + 1] = value
    assert main(["k8s", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shoal k8s: error: {field}=") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
