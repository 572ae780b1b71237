"""Kubernetes objects that run a recipe on N nodes x G GPUs: Trainer v2 TrainJob, JobSet, PyTorchJob.

Each pod runs `torchrun -m shoal.train RECIPE --out OUT` with the node count, processes per node
and rendezvous given the way that object kind gives them:

- TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2, the current standard): the
  referenced runtime's torch plugin injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR/PORT, which torchrun reads as its flags. Kueue: a queue-name label and suspend.
- JobSet (jobset.x-k8s.io/v1alpha2), for clusters without Trainer v2: one Indexed Job of N pods;
  node rank = the pod's completion index, rendezvous at pod 0 by its stable DNS name.
- PyTorchJob (kubeflow.org/v1, training-operator v1): Worker replicas with an elasticPolicy (c10d
  rendezvous, restarts); the operator sets torchrun's PET_* variables.

The API schemas catch misspelled fields and wrong types (tests validate against the published
models); `check` holds the rules they cannot express (CEL rules such as numProcPerNode >= 1, names
that must be DNS labels, an empty image).
"""

from __future__ import annotations

import json
import re

from shoal.errors import UserError

PORT = 29500
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check(name: str, nodes: int, gpus_per_node: int, image: str, queue: str = "", run_out: str = "/") -> None:
    """The constraints the schemas cannot express."""
    if not run_out.startswith("/"):  # relative: under each container's own working folder, lost with the pod
        raise UserError("--run-out", run_out, "give an absolute path on the volume every pod mounts, e.g. "
                                              "/checkpoints/pretrain (a relative one is each container's own)")
    if nodes < 1:
        raise UserError("--nodes", nodes, "must be a positive integer")
    if gpus_per_node < 1:
        raise UserError("--gpus-per-node", gpus_per_node, "must be >= 1 (numProcPerNode: one process per GPU)")
    if not image.strip():
        raise UserError("--image", image, "give the container image that has shoal and the recipe, "
                                          "e.g. ghcr.io/you/shoal:latest")
    if any(c.isspace() for c in image):
        raise UserError("--image", image, "an image reference has no spaces")
    # JobSet names pods <name>-node-<i>-<j> and the headless service <name>: keep room in 63 characters
    if len(name) > 40 or not _DNS_LABEL.match(name):
        raise UserError("--name", name, "use lowercase letters, digits and '-', starting with a letter, "
                                        "at most 40 characters (it becomes pod and service names)")
    if queue and not _DNS_LABEL.match(queue):
        raise UserError("--queue", queue, "a Kueue LocalQueue name: lowercase letters, digits and '-'")


def _train_args(recipe: str, out: str) -> list[str]:
    return ["-m", "shoal.train", recipe, "--out", out]


def _resources(gpus: int) -> dict:
    return {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}


def trainjob(name: str, recipe: str, out: str, nodes: int, gpus: int, image: str, queue: str = "") -> dict:
    labels = {"app.kubernetes.io/name": "shoal"}
    spec: dict = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "trainer": {"image": image, "command": ["torchrun"], "args": _train_args(recipe, out),
                    "numNodes": nodes, "numProcPerNode": gpus, "resourcesPerNode": _resources(gpus),
                    "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]},
    }
    if queue:  # Kueue admits the job, then unsuspends it
        labels["kueue.x-k8s.io/queue-name"] = queue
        spec["suspend"] = True
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "labels": labels}, "spec": spec}


def jobset(name: str, recipe: str, out: str, nodes: int, gpus: int, image: str, queue: str = "") -> dict:
    # Pod i of the Indexed Job is node i; pod 0 hosts the rendezvous at its DNS name
    # <jobset>-<replicatedJob>-<job index>-<pod index>.<jobset> (JobSet's headless service).
    head = f"{name}-node-0-0.{name}"
    torchrun = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus}", "--node-rank=$(JOB_COMPLETION_INDEX)",
                "--rdzv-backend=static", f"--master-addr={head}", f"--master-port={PORT}",
                *_train_args(recipe, out)]
    container = {"name": "shoal", "image": image, "command": torchrun, "resources": _resources(gpus),
                 "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}], "ports": [{"containerPort": PORT}]}
    labels = {"app.kubernetes.io/name": "shoal", **({"kueue.x-k8s.io/queue-name": queue} if queue else {})}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "labels": labels,
                         # one pod per machine: GPUs of a node are not shared between two of our pods
                         "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname"}},
            "spec": {
                **({"suspend": True} if queue else {}),
                "failurePolicy": {"maxRestarts": 3},  # restart the whole set; shoal resumes from its checkpoint
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["node"]},
                "network": {"enableDNSHostnames": True},
                "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                    "parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}}],
            }}


def pytorchjob(name: str, recipe: str, out: str, nodes: int, gpus: int, image: str, queue: str = "") -> dict:
    container = {"name": "pytorch",  # the operator looks for the container by this name
                 "image": image, "command": ["torchrun", *_train_args(recipe, out)], "resources": _resources(gpus),
                 "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]}
    labels = {"app.kubernetes.io/name": "shoal", **({"kueue.x-k8s.io/queue-name": queue} if queue else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "labels": labels},
            "spec": {
                **({"runPolicy": {"suspend": True}} if queue else {}),
                "nprocPerNode": str(gpus),  # a string in the v1 API
                "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": nodes, "maxReplicas": nodes,
                                  "maxRestarts": 3},
                "pytorchReplicaSpecs": {"Worker": {"replicas": nodes, "restartPolicy": "OnFailure",
                                                   "template": {"spec": {"containers": [container]}}}},
            }}


KINDS = {"trainjob": trainjob, "jobset": jobset, "pytorchjob": pytorchjob}
MARK = 'app.kubernetes.io/name: "shoal"'
"""The label every object carries, as to_yaml writes it near the top: a later write replaces only a file
that holds it, never a person's own object of the same name."""


def to_yaml(obj, indent: int = 0) -> str:
    """Block YAML for dicts, lists, strings, numbers and booleans (strings JSON-quoted, which YAML reads as-is)."""
    pad = " " * indent
    if isinstance(obj, dict):
        lines = []
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 2)}")
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(lines)
    if isinstance(obj, list):
        lines = []
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                body = to_yaml(v, indent + 2)
                lines.append(f"{pad}- {body.lstrip()}")
            else:
                lines.append(f"{pad}- {_scalar(v)}")
        return "\n".join(lines)
    return pad + _scalar(obj)


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (dict, list)):
        return "{}" if isinstance(v, dict) else "[]"
    return json.dumps(str(v))
