"""The runtime image: its Dockerfile agrees with the lock, its build script refuses bad input before
building anything, and the built image runs the default pipeline (images/prove.sh).

.ci/run builds the image (images/build.sh) before the test suite; elsewhere the last test skips
until `images/build.sh` has been run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sublimate.components.base.runtime import DEFAULT_IMAGE
from tests.conftest import REPO, buildah_container_names, require

DOCKERFILE = REPO / "images" / "Dockerfile"
LOCAL_IMAGE = "localhost/sublimate:" + DEFAULT_IMAGE.rsplit(":", 1)[1]


def _lock() -> dict[str, str]:
    lines = (REPO / "images" / "requirements.lock").read_text().splitlines()
    pins = (line.split("==", 1) for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, version in pins}


def _dockerfile_defaults() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))


def test_the_lock_pins_every_runtime_dependency() -> None:
    """A dependency added to pyproject.toml without re-running images/lock.sh would leave the
    image without it: the project itself is installed with --no-deps."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lock = _lock()
    unpinned, outside = [], []
    for requirement in map(Requirement, project["dependencies"]):
        version = lock.get(canonicalize_name(requirement.name))
        if version is None:
            unpinned.append(requirement.name)
        elif Version(version) not in requirement.specifier:
            outside.append(f"{requirement.name}=={version} ({requirement.specifier})")
    assert unpinned == [] and outside == [], "run images/lock.sh: " + ", ".join(unpinned + outside)


def test_the_dockerfile_installs_the_locks_torch_from_public_sources_by_default() -> None:
    defaults = _dockerfile_defaults()
    assert defaults["TORCH_VERSION"] == _lock()["torch"]
    # A laptop with docker builds it as it is: this machine's wheel folder and CA bundle are
    # images/build.sh's choices, never the Dockerfile's defaults.
    assert defaults["BASE_IMAGE"].startswith("docker.io/library/python:3.11")
    assert defaults["TORCH_SOURCE"] == "https://download.pytorch.org/whl/cpu"
    text = DOCKERFILE.read_text()
    assert [path for path in ("/opt/wheels", "/etc/xdg/pip", "/opt/pypi") if path in text] == []


@pytest.mark.parametrize(("arguments", "message"), [
    (["--builder", "kaniko"], "--builder must be auto, docker, buildah or podman, not 'kaniko'"),
    (["--torch", "/no/such/wheels"], "--torch /no/such/wheels: no such folder"),
    (["--ca", "/no/such/ca.crt"], "--ca /no/such/ca.crt: no such file"),
    (["--tag"], "--tag needs a value"),
    (["--layers"], "unknown argument '--layers'"),
])
def test_the_build_script_refuses_bad_arguments_before_building(arguments: list[str],
                                                                 message: str) -> None:
    completed = subprocess.run(["bash", str(REPO / "images" / "build.sh"), *arguments],
                               capture_output=True, text=True, timeout=30)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith(f"build: {message}"), completed.stderr


def _image_is_built() -> bool:
    if shutil.which("buildah"):
        inspect = ["buildah", "inspect", "--type", "image", LOCAL_IMAGE]
    elif shutil.which("docker"):
        inspect = ["docker", "image", "inspect", LOCAL_IMAGE]
    else:
        return False
    return subprocess.run(inspect, capture_output=True).returncode == 0


def test_the_image_runs_the_default_pipeline_on_the_mounted_volume() -> None:
    """stage-data -> train -> evaluate inside the image, as user 10001, with a host folder at
    /mnt/sublimate: prove.sh checks from the host that the results are in that folder, owned by
    that user, and as accurate as a local run."""
    require(_image_is_built(), f"{LOCAL_IMAGE} is not built (images/build.sh; needs buildah)")
    completed = subprocess.run(["bash", str(REPO / "images" / "prove.sh"), LOCAL_IMAGE],
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-4000:]
    found = re.fullmatch(r"accuracy=([\d.]+) run=(sublimate-train-\w+)\n", completed.stdout)
    assert found, completed.stdout
    assert float(found.group(1)) >= 0.95
    assert "as 10001:10001 on a folder mounted at /mnt/sublimate" in completed.stderr


def test_sublimate_run_containers_runs_the_default_pipeline_in_the_image(tmp_path) -> None:
    """`sublimate run --containers` on the host: each of the three steps runs in the image the
    manifest names (ghcr.io/sublimate-ml/sublimate:0.1.0, tagged so by build.sh), as the
    template's user 10001 on the run's volume; nothing of the run stays in buildah's store."""
    import json

    from tests.conftest import run_cli

    require(_image_is_built(), f"{LOCAL_IMAGE} is not built (images/build.sh; needs buildah)")
    require(shutil.which("buildah"), "buildah is not installed (apt-get install buildah)")
    home = tmp_path / "home"
    completed = run_cli("run", "--containers", "-q", "-o", "json", home=home, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    status = json.loads(completed.stdout)
    root = next(node for node in status["nodes"] if node["parent"] is None)
    assert float(root["outputs"]["parameters"]["accuracy"]) >= 0.95
    (run,) = (home / "volumes" / "sublimate-data" / "runs").iterdir()
    # A process-mode run as root leaves root's files; in the image the steps are user 10001.
    assert (run / "metrics.json").stat().st_uid == 10001
    assert (run / "model.pt").stat().st_uid == 10001
    # Its containers are named for its nodes, whose ids start with the workflow's name; other
    # tests' runs may have containers of their own at this moment.
    assert not [name for name in buildah_container_names() if status["name"] in name]
