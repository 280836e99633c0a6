"""Data templates: the keys under an artifact location in the home's repository, filtered and
mapped by expressions, fanned out to a step per file."""

from __future__ import annotations

import json
from pathlib import Path

from sublimate.pipelines.runner import NodePhase
from sublimate.pipelines.runner.harness import run

# A nightly job: shards land in the lake; the data template picks the CSV ones and a step
# processes each (Argo's examples/data-transformations.yaml, on the local repository).
PIPELINE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: shards-}
spec:
  entrypoint: main
  arguments:
    parameters: [{name: prefix, value: landing}]
  templates:
  - name: main
    steps:
    - - {name: land, template: land}
    - - {name: pick, template: pick}
    - - name: process
        template: process
        arguments:
          parameters: [{name: key, value: "{{item}}"}]
        withParam: "{{steps.pick.outputs.result}}"
  - name: land
    script:
      command: [sh]
      source: |
        mkdir -p /tmp/shards/2026/b /tmp/shards/2026/a
        echo 1 > /tmp/shards/2026/a/part-0.csv
        echo 2 > /tmp/shards/2026/b/part-1.csv
        echo x > /tmp/shards/2026/notes.txt
    outputs:
      artifacts:
      - name: shards
        path: /tmp/shards
        archive: {none: {}}
        s3: {bucket: lake, key: "{{workflow.parameters.prefix}}/{{workflow.name}}"}
  - name: pick
    data:
      source:
        artifactPaths:
          name: landed
          s3: {bucket: lake, key: "{{workflow.parameters.prefix}}"}
      transformation:
      - expression: 'filter(data, {# endsWith ".csv"})'
      - expression: 'map(data, {"s3://lake/" + #})'
  - name: process
    inputs:
      parameters: [{name: key}]
    container: {command: [echo, "processing {{inputs.parameters.key}}"]}
"""


def test_a_data_template_lists_filters_and_fans_out(tmp_path: Path) -> None:
    done = run(PIPELINE, home=tmp_path, echo=False, timeout=60)
    done.assert_succeeded()
    pick = done.node("pick")
    assert pick.type == "Pod"  # it runs a pod on Argo (argoexec data)
    keys = json.loads(pick.result or "")
    assert keys == [f"s3://lake/landing/{done.name}/2026/a/part-0.csv",
                    f"s3://lake/landing/{done.name}/2026/b/part-1.csv"]
    processed = sorted(n.result or "" for n in done.nodes.values() if n.template == "process"
                       and n.type == "Pod")
    assert processed == [f"processing {key}" for key in keys]


def test_a_missing_key_and_an_empty_listing_are_argos(tmp_path: Path) -> None:
    lister = PIPELINE.replace("    - - {name: land, template: land}\n", "")
    absent = run(lister.replace("value: landing", "value: never-written"), home=tmp_path,
                 echo=False, timeout=60)
    pick = absent.node("pick")
    assert (pick.phase, pick.message) == (
        NodePhase.FAILED, "unable to process data template: unable to process data source: "
        "unable to source artifact paths: no key found of name never-written")
    assert absent.phase == NodePhase.FAILED
    # a key that exists with nothing under it lists as nil: filter and map make it []
    (tmp_path / "artifacts" / "repository" / "lake" / "empty").mkdir(parents=True)
    empty = run(lister.replace("value: landing", "value: empty"), home=tmp_path, echo=False,
                timeout=60)
    assert (empty.node("pick").phase, empty.node("pick").result) == (NodePhase.SUCCEEDED, "[]")
    assert empty.node("process").phase == NodePhase.SKIPPED  # an empty loop


LISTING = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: listing-}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {name: store, template: store}
    - - {name: pick, template: pick}
  - name: store
    script: {command: [sh], source: "mkdir /out && echo x > /out/own && ln -s HOST /out/sub"}
    outputs:
      artifacts: [{name: out, path: /out, archive: {none: {}}, s3: {key: planted}}]
  - name: pick
    data:
      source: {artifactPaths: {name: listed, s3: {key: KEY}}}
      transformation: [{expression: "data"}]
"""


def test_a_link_stored_in_the_repository_lists_no_host_folder(tmp_path: Path) -> None:
    # A folder stored as it is keeps a pod's links: one to a host folder listed that folder's
    # files (their names) as keys.
    host = tmp_path / "host"
    host.mkdir()
    (host / "hostfile").write_text("x")
    for key, listed in [("planted", ["planted/own"]), ("planted/sub", None)]:
        done = run(LISTING.replace("HOST", str(host)).replace("KEY", key),
                   home=tmp_path / key.replace("/", "-"), echo=False, timeout=60)
        pick = done.node("pick")
        if listed is None:  # the link leads nowhere inside the repository: no such key
            assert pick.phase == NodePhase.FAILED
            assert pick.message.endswith("no key found of name planted/sub")
        else:
            assert json.loads(pick.result or "") == listed
