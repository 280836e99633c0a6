"""A CI job's Hera script, as Hera's documentation shapes one: build a Workflow, create it on the
Argo Server named by the environment, poll it until it ends, read its outputs. Nothing in it
knows about sublimate: the test runs it unchanged against `sublimate server`.

Environment: ARGO_SERVER_URL (e.g. https://argo.example.com:2746), ARGO_NAMESPACE, and
RESULT_FILE, where it writes what it read (the test checks it).
"""

import json
import os
import time

from hera.workflows import Container, Parameter, Steps, Workflow, WorkflowsService
from hera.workflows.models import ValueFrom

namespace = os.environ.get("ARGO_NAMESPACE", "argo")
service = WorkflowsService(host=os.environ["ARGO_SERVER_URL"], verify_ssl=False,
                           namespace=namespace)

with Workflow(generate_name="ci-check-", entrypoint="main", namespace=namespace,
              labels={"ci": "true"}, workflows_service=service) as workflow:
    say = Container(
        name="say", image="alpine:3.20", command=["sh", "-c"],
        args=["printf '%s' '{{inputs.parameters.word}}' > /tmp/word"],
        inputs=[Parameter(name="word")],
        outputs=[Parameter(name="word", value_from=ValueFrom(path="/tmp/word"),
                           global_name="last-word")],
    )
    with Steps(name="main"):
        say(name="first", arguments={"word": "hello"})
        say(name="second", arguments={"word": "world"})

created = workflow.create()
name = created.metadata.name
deadline = time.monotonic() + 120
while True:
    current = service.get_workflow(name, namespace=namespace)
    if current.status and current.status.phase in ("Succeeded", "Failed", "Error"):
        break
    if time.monotonic() > deadline:
        raise SystemExit(f"{name} did not end in 120 s")
    time.sleep(0.2)

nodes = current.status.nodes or {}
words = {node.display_name: [p.value for p in (node.outputs.parameters or [])]
         for node in nodes.values() if node.type == "Pod" and node.outputs}
globals_ = {p.name: p.value for p in (current.status.outputs.parameters or [])}
with open(os.environ["RESULT_FILE"], "w") as out:
    json.dump({"name": name, "phase": current.status.phase, "words": words,
               "outputs": globals_}, out)
print(f"{name}: {current.status.phase}")
