"""Secrets and ConfigMaps for local runs: read from manifests beside the workflow, in an
``--objects`` folder or given to the harness, with the kubelet's semantics (env, envFrom,
volumes; optional, missing keys, prefixes, file modes), a secret's value masked in every output
the runner writes, and a secret volume kept off the disk."""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path

from sublimate.pipelines.runner import NodePhase
from sublimate.pipelines.runner.harness import run
from sublimate.pipelines.runner.pods.k8s_objects import SHM, secret_root
from tests.conftest import run_cli

PASSWORD = "hunter2-correct-horse"
OBJECTS = textwrap.dedent(f"""
    apiVersion: v1
    kind: Secret
    metadata: {{name: warehouse}}
    type: Opaque
    data:
      password: {base64.b64encode(PASSWORD.encode()).decode()}
    stringData:
      user: etl-robot
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {{name: etl-settings}}
    data:
      batch: "500"
    binaryData:
      seed.bin: AAEC
""")

# An ETL step reading a database credential three ways, as workflows do on Argo.
ETL = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: etl-}
spec:
  entrypoint: load
  volumes:
  - name: credentials
    secret:
      secretName: warehouse
      defaultMode: 0440
      items: [{key: password, path: db/password, mode: 0640}]  # 0400 on this machine
  - name: settings
    configMap: {name: etl-settings}
  templates:
  - name: load
    script:
      command: [sh]
      env:
      - name: DB_PASSWORD
        valueFrom: {secretKeyRef: {name: warehouse, key: password}}
      - name: DB_PORT
        valueFrom: {configMapKeyRef: {name: etl-settings, key: port, optional: true}}
      envFrom:
      - {prefix: WH_, secretRef: {name: warehouse}}
      - configMapRef: {name: etl-settings}
      volumeMounts:
      - {name: credentials, mountPath: /etc/warehouse}
      - {name: settings, mountPath: /etc/etl}
      source: |
        echo "env $DB_PASSWORD as $WH_user, batch $batch, port ${DB_PORT-unset}"
        echo "envFrom $WH_password"
        echo "file $(cat /etc/warehouse/db/password) mode $(stat -c %a /etc/warehouse/db/password)"
        echo "folders $(stat -c %a /etc/warehouse /etc/warehouse/db | tr '\\n' ' ')"
        echo "settings $(ls /etc/etl | tr '\\n' ' ')"
        echo "where $(df --output=fstype /etc/warehouse/db/password | tail -1)"
        echo "reversed $(printf %s "$DB_PASSWORD" | rev)"
        printf %s "$DB_PASSWORD" > /tmp/connection
    outputs:
      parameters:
      - {name: connection, globalName: connection, valueFrom: {path: /tmp/connection}}
"""


def _expect_read_three_ways(log: str) -> None:
    assert "env *** as ***, batch 500, port unset" in log  # the user is the Secret's too
    assert "envFrom ***" in log
    assert "file *** mode 400" in log  # only the owner's read bit: nobody else may read it
    assert "folders 700 700 " in log
    assert "settings batch seed.bin " in log  # every key a file, binaryData's too
    assert f"reversed {PASSWORD[::-1]}" in log  # the value itself reached the step
    assert PASSWORD not in log


def test_a_secret_read_three_ways_and_masked_everywhere(tmp_path: Path, home: Path) -> None:
    """Objects beside the workflow (in the same folder) and in an --objects folder."""
    for where in ("beside", "objects"):
        folder = tmp_path / where
        folder.mkdir()
        (folder / "etl.yaml").write_text(ETL)
        objects_dir = folder / "cluster"
        objects_dir.mkdir()
        (folder if where == "beside" else objects_dir).joinpath("objects.yaml").write_text(
            OBJECTS)
        args = ["--objects", str(objects_dir)] if where == "objects" else []
        done = run_cli("run", str(folder / "etl.yaml"), *args, "-o", "json", home=home)
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout and PASSWORD not in done.stderr  # -o json, console
        result = json.loads(done.stdout)
        (node,) = result["nodes"]
        _expect_read_three_ways(node["outputs"]["result"])
        assert result["outputs"]["parameters"] == {"connection": "***"}
        run_dir = Path(result["run_dir"])
        for path in run_dir.rglob("*"):  # status.json, main.log, workflow.yaml, ...
            if path.is_file() and path.name != "connection":  # the step's own file
                assert PASSWORD.encode() not in path.read_bytes(), path
        _expect_read_three_ways((run_dir / "nodes").glob("*/main.log").__next__().read_text())
        assert not secret_root(run_dir).exists()  # the secret's tmpfs files are gone


def test_harness_objects_and_the_kubelets_refusals(tmp_path: Path) -> None:
    import yaml

    objects = list(yaml.safe_load_all(OBJECTS))
    done = run(ETL, home=tmp_path, echo=False, timeout=60, objects=objects)
    done.assert_succeeded()
    _expect_read_three_ways(done.node(done.name).result or "")
    assert done.outputs == {"connection": "***"}
    # tmpfs: the secret's file never touched the disk
    assert "where tmpfs" in (done.node(done.name).result or "") or not SHM.is_dir()

    missing = run(ETL, home=tmp_path, echo=False, timeout=60)  # no manifests at all
    node = missing.node(missing.name)
    assert (node.phase, node.message.split(" (")[0]) == (
        NodePhase.ERROR, 'CreateContainerConfigError: secret "warehouse" not found')
    no_key = run(ETL.replace("key: password}", "key: pasword}"), home=tmp_path, echo=False,
                 timeout=60, objects=objects)
    assert no_key.node(no_key.name).message == (
        "CreateContainerConfigError: couldn't find key pasword in Secret default/warehouse")
    bad_item = run(ETL.replace("{key: password, path: db/password", "{key: nope, path: x"),
                   home=tmp_path, echo=False, timeout=60, objects=objects)
    assert bad_item.node(bad_item.name).message == (
        "MountVolume.SetUp failed for volume 'credentials': secret references non-existent "
        "secret key: nope")
    optional = ETL.replace("secretName: warehouse\n", "secretName: other\n      optional: true\n")
    missing_volume = run(optional, home=tmp_path, echo=False, timeout=60, objects=objects)
    result = missing_volume.node(missing_volume.name).result or ""
    assert missing_volume.succeeded and "file  mode" in result  # an empty volume


def test_a_secret_named_twice_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(OBJECTS)
    (tmp_path / "b.yaml").write_text(OBJECTS.split("---")[0])
    (tmp_path / "etl.yaml").write_text(ETL)
    done = run(tmp_path / "etl.yaml", home=tmp_path / "home", echo=False, timeout=60)
    message = done.node(done.name).message
    assert message == (f"Secret 'warehouse' is defined twice: in {tmp_path / 'a.yaml'} and "
                       f"{tmp_path / 'b.yaml'}")


def test_a_secret_in_a_failed_pods_termination_message_is_masked_on_disk_too(
        tmp_path: Path, home: Path) -> None:
    # The node's message masked the value, but the termination-log file the run folder keeps
    # held it as the pod wrote it (locally at $SUBLIMATE_TERMINATION_LOG: Kubernetes'
    # /dev/termination-log).
    (tmp_path / "objects.yaml").write_text(OBJECTS)
    (tmp_path / "fail.yaml").write_text(textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {generateName: fail-}
        spec:
          entrypoint: main
          templates:
          - name: main
            script:
              command: [sh]
              env:
              - name: DB_PASSWORD
                valueFrom: {secretKeyRef: {name: warehouse, key: password}}
              source: |
                echo "cannot connect with $DB_PASSWORD" > "$SUBLIMATE_TERMINATION_LOG"
                exit 3
        """))
    done = run_cli("run", str(tmp_path / "fail.yaml"), "-o", "json", home=home)
    assert done.returncode != 0
    result = json.loads(done.stdout)
    (node,) = result["nodes"]
    assert node["message"] == "Error (exit code 3): cannot connect with ***"
    run_dir = Path(result["run_dir"])
    logs = list(run_dir.rglob("termination-log"))
    assert logs, "the run folder keeps the pod's termination log"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
