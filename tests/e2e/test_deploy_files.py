"""The deployment files: docker-compose.yml, the Dockerfiles and the Kubernetes manifests.

No container engine is needed: the compose file is checked by `docker compose config` when the
compose plugin exists (skipped otherwise), and always by parsing it; manifests must parse as
YAML with the kinds the deployment needs; every command they run must be a `tuneyard` command.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def k8s_documents() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def compose_plugin_available() -> bool:
    if not shutil.which("docker"):
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    return probe.returncode == 0


@pytest.mark.skipif(
    not compose_plugin_available(), reason="the docker compose plugin is not installed"
)
def test_docker_compose_config_accepts_the_file():
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(
    not shutil.which("docker-compose"), reason="docker-compose (v1) is not installed"
)
def test_docker_compose_v1_config_accepts_the_file():
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_compose_has_every_service_with_health_checks_and_volumes():
    compose = load_compose()
    services = compose["services"]
    assert set(services) >= {"postgres", "redis", "migrate", "api", "worker", "scheduler"}
    for name in ("postgres", "redis", "api"):
        assert services[name]["healthcheck"]["test"], name
    assert {"pgdata", "runs"} <= set(compose["volumes"])
    assert any(v.startswith("pgdata:") for v in services["postgres"]["volumes"])
    assert any(v.startswith("runs:") for v in services["worker"]["volumes"])
    gates = services["api"]["depends_on"]
    assert gates["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_worker_reserves_gpus():
    devices = load_compose()["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]


def test_compose_services_share_one_database_and_broker():
    services = load_compose()["services"]
    urls = {
        services[s]["environment"]["TUNEYARD_DATABASE_URL"]
        for s in ("migrate", "api", "worker", "scheduler")
    }
    assert len(urls) == 1 and next(iter(urls)).startswith("postgresql+psycopg://")
    assert services["worker"]["environment"]["TUNEYARD_BROKER_URL"].startswith("redis://redis:")


def test_manifests_parse_with_the_expected_kinds():
    docs = k8s_documents()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Deployment", "tuneyard-api"),
        ("Service", "tuneyard-api"),
        ("Deployment", "tuneyard-worker"),
        ("Deployment", "tuneyard-scheduler"),
        ("Job", "tuneyard-migrate"),
        ("ConfigMap", "tuneyard-config"),
        ("Secret", "tuneyard-secrets"),
    } <= kinds


def test_worker_deployment_limits_gpus_and_api_service_selects_api_pods():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    worker = docs[("Deployment", "tuneyard-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    api = docs[("Deployment", "tuneyard-api")]["spec"]
    service = docs[("Service", "tuneyard-api")]["spec"]
    assert service["selector"].items() <= api["template"]["metadata"]["labels"].items()
    assert api["selector"]["matchLabels"] == api["template"]["metadata"]["labels"]


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_api_image_carries_no_torch_and_worker_image_takes_a_cuda_torch():
    api = re.sub(r"#.*", "", (ROOT / "deploy" / "api.Dockerfile").read_text())
    worker = (ROOT / "deploy" / "worker.Dockerfile").read_text()
    install = re.search(r"pip install (.+)", api).group(1)
    assert "[train]" not in install and "torch" not in install
    assert "'torch' not in sys.modules" in api  # the build proves the API imports without it
    assert re.search(r"ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu\d+", worker)
    assert re.search(r'pip install --extra-index-url "\$\{TORCH_INDEX_URL\}"', worker)
    assert "'.[train,qlora]'" in worker  # the trainer and QLoRA's bitsandbytes


@pytest.mark.parametrize("dockerfile", ["api.Dockerfile", "worker.Dockerfile"])
def test_dockerfile_copy_sources_exist(dockerfile):
    text = (ROOT / "deploy" / dockerfile).read_text()
    for line in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for source in line.split():
            assert (ROOT / source).exists(), f"{dockerfile}: COPY {source} does not exist"


def commands_run_by_deploy_files() -> set[str]:
    commands = set()
    for service in load_compose()["services"].values():
        cmd = service.get("command") or []
        if cmd and cmd[0] == "tuneyard":
            commands.add(cmd[1])
    for doc in k8s_documents():
        for container in (
            doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            probes = [container.get(k, {}).get("exec", {}).get("command", [""])
                      for k in ("livenessProbe", "readinessProbe")]  # fmt: skip
            for cmd in (container.get("command", [""]), *probes):
                if cmd[0] == "tuneyard":
                    commands.add(cmd[1])
    return commands


def test_every_command_the_deploy_files_run_exists():
    from typer.main import get_command

    from cli.main import app

    known = set(get_command(app).commands)
    missing = commands_run_by_deploy_files() - known
    assert not missing, f"deploy files run unknown tuneyard commands: {sorted(missing)}"


# --- images, security and probes --------------------------------------------------------

KUBERNETES_VERSION = "1.31"
TUNEYARD_IMAGES = ("tuneyard-api", "tuneyard-worker")


def pod_specs() -> dict[str, dict]:
    """Workload name -> its pod template spec (Deployments and the migration Job)."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in k8s_documents()
        if d["kind"] in ("Deployment", "Job")
    }


def package_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_manifests_pass_the_kubernetes_schemas_strictly():
    import kubernetes_validate

    for doc in k8s_documents():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_rejects_a_misspelt_field():
    import kubernetes_validate

    bad = next(d for d in k8s_documents() if d["kind"] == "Deployment")
    bad = {**bad, "spec": {**bad["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_images_are_tagged_with_the_package_version_never_latest():
    version = package_version()
    for name, spec in pod_specs().items():
        for container in spec["containers"]:
            image, _, tag = container["image"].partition(":")
            assert image in TUNEYARD_IMAGES and tag == version, (name, container["image"])
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert {i["name"]: i["newTag"] for i in kustomization["images"]} == dict.fromkeys(
        TUNEYARD_IMAGES, version
    )
    images = {s.get("image") for s in load_compose()["services"].values() if s.get("image")}
    images |= {load_compose()["x-api-image"]["image"]}
    for image in (i for i in images if i.split(":")[0] in TUNEYARD_IMAGES):
        assert image.endswith(f"${{TUNEYARD_VERSION:-{version}}}"), image


def test_every_pod_runs_as_non_root_with_nothing_extra():
    for name, spec in pod_specs().items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] and pod["runAsUser"] != 0 and pod["fsGroup"], name
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"]["drop"] == ["ALL"], name
            assert ctx["readOnlyRootFilesystem"] is True, name
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert "/tmp" in mounts, f"{name}: a read-only root needs a writable /tmp"
            parents = [mounts.index(p) for p in mounts if p == "/var/lib/tuneyard"]
            nested = [mounts.index(p) for p in mounts if p.startswith("/var/lib/tuneyard/")]
            assert all(a < b for a in parents for b in nested), f"{name}: parent mount first"


def test_every_container_requests_cpu_and_memory():
    for name, spec in pod_specs().items():
        for container in spec["containers"]:
            requests = container["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name
            assert container["resources"]["limits"].get("memory"), name


@pytest.mark.parametrize(("workload", "role"), [("tuneyard-worker", "worker"),
                                                ("tuneyard-scheduler", "scheduler")])  # fmt: skip
def test_worker_and_scheduler_probe_their_loop_with_tuneyard_health(workload, role):
    container = pod_specs()[workload]["containers"][0]
    live = container["livenessProbe"]["exec"]["command"]
    ready = container["readinessProbe"]["exec"]["command"]
    assert live[:3] == ["tuneyard", "health", role] and "--ready" not in live
    assert ready[:3] == ["tuneyard", "health", role] and "--ready" in ready
    compose = load_compose()["services"][role]["healthcheck"]["test"]
    assert compose[1:4] == ["tuneyard", "health", role]


def test_the_api_has_a_disruption_budget_over_its_pods():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    budget = docs[("PodDisruptionBudget", "tuneyard-api")]["spec"]
    api = docs[("Deployment", "tuneyard-api")]["spec"]
    assert budget["minAvailable"] < api["replicas"]
    assert (
        budget["selector"]["matchLabels"].items() <= api["template"]["metadata"]["labels"].items()
    )


def test_ci_and_both_images_install_from_the_one_constraints_file():
    from importlib.metadata import version

    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins["torch"] == version("torch").split("+")[0], "CI runs a torch the lock does not pin"
    for path in (ROOT / "deploy").glob("*.Dockerfile"):
        text = path.read_text()
        assert "COPY pyproject.toml constraints.txt" in text, path.name
        installs = [line for line in text.splitlines() if "pip install" in line]
        assert installs and all("-c constraints.txt" in line for line in installs), path.name
    assert "-c constraints.txt" in (ROOT / ".ci" / "run").read_text()


def test_the_lock_matches_the_environment_the_tests_run_in():
    result = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "lock.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
