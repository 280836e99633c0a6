"""Fields a workflow uses beside its template kinds: a static output parameter (``value``), a
volume mount named by a parameter (with ``volumeClaimTemplates``), and the workflow-level
``spec.retryStrategy`` that every template inherits."""

from __future__ import annotations

from pathlib import Path

from sublimate.pipelines.runner import NodePhase
from sublimate.pipelines.runner.harness import run

STATIC_OUTPUT = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: static-}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {name: tag, template: tag, arguments: {parameters: [{name: build, value: "42"}]}}
    - - name: show
        template: show
        arguments:
          parameters: [{name: tag, value: "{{steps.tag.outputs.parameters.image}}"}]
  - name: tag
    inputs:
      parameters: [{name: build}]
    container: {command: ["true"]}
    outputs:
      parameters:
      - {name: image, value: "registry.local/model:{{inputs.parameters.build}}",
         globalName: image}
  - name: show
    inputs:
      parameters: [{name: tag}]
    container: {command: [echo, "{{inputs.parameters.tag}}"]}
"""


def test_a_static_output_value_is_the_pods_output(tmp_path: Path) -> None:
    done = run(STATIC_OUTPUT, home=tmp_path, echo=False, timeout=60)
    done.assert_succeeded()
    assert done.node("tag").outputs == {"image": "registry.local/model:42"}
    assert done.node("show").result == "registry.local/model:42"
    assert done.outputs == {"image": "registry.local/model:42"}
    # a steps template's outputs come from its children: Argo errs at run time
    composite = STATIC_OUTPUT.replace(
        "  - name: main\n    steps:",
        "  - name: main\n    outputs:\n      parameters: [{name: x, value: '1'}]\n    steps:")
    failed = run(composite, home=tmp_path, echo=False, timeout=60)
    root = failed.node(failed.name)
    assert (root.phase, root.message) == (
        NodePhase.ERROR, "output parameters must have a valueFrom specified")


MOUNT_BY_PARAMETER = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: mounts-}
spec:
  entrypoint: main
  volumeClaimTemplates:
  - metadata: {name: workdir}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  - metadata: {name: cache}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  arguments:
    parameters: [{name: volume, value: workdir}]
  templates:
  - name: main
    steps:
    - - name: write
        template: write
        arguments: {parameters: [{name: vol, value: "{{workflow.parameters.volume}}"}]}
    - - {name: read, template: read}
  - name: write
    inputs:
      parameters: [{name: vol}]
    container:
      command: [sh, -c, "echo written > /data/file"]
      volumeMounts: [{name: "{{inputs.parameters.vol}}", mountPath: /data}]
  - name: read
    container:
      command: [cat, /work/file]
      volumeMounts: [{name: workdir, mountPath: /work}]
"""


def test_a_volume_mount_named_by_a_parameter(tmp_path: Path) -> None:
    done = run(MOUNT_BY_PARAMETER, home=tmp_path, echo=False, timeout=60)
    done.assert_succeeded()
    assert done.node("read").result == "written"
    unknown = run(MOUNT_BY_PARAMETER, {"volume": "scratch"}, home=tmp_path, echo=False,
                  timeout=60)
    write = unknown.node("write")
    assert (write.phase, write.message) == (
        NodePhase.ERROR, "volume 'scratch' not found in workflow spec")


SPEC_RETRIES = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: flaky-}
spec:
  entrypoint: main
  retryStrategy: {limit: 2, retryPolicy: OnFailure}
  templates:
  - name: main
    steps:
    - - {name: flaky, template: flaky}
      - {name: once, template: once}
  - name: flaky   # fails on its first try: the workflow's strategy retries it
    script:
      # {{retries}}, not a marker file: every pod has its own filesystem, as on Argo
      command: [sh]
      source: |
        if [ {{retries}} -ge 1 ]; then echo second; exit 0; fi
        exit 1
  - name: once    # its own (empty) strategy wins: no retries
    retryStrategy: {}
    container: {command: ["false"]}
"""


def test_the_workflow_retry_strategy_is_every_templates_default(tmp_path: Path) -> None:
    done = run(SPEC_RETRIES, home=tmp_path / "home",
               echo=False, timeout=60)
    flaky = done.node("flaky")
    assert (flaky.type, flaky.phase, flaky.result) == ("Retry", NodePhase.SUCCEEDED, "second")
    assert [done.node(f"flaky({i})").phase for i in (0, 1)] == ["Failed", "Succeeded"]
    once = done.node("once")
    assert (once.type, once.phase) == ("Pod", NodePhase.FAILED)
    assert "once(0)" not in done.nodes
    # the steps and the workflow's own node run under it too (operator.go: every template)
    assert done.node(done.name).type == "Retry"
