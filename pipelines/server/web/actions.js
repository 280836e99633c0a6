// A workflow's actions: actionsBar(workflow, onDone) returns the toolbar the workflow view
// shows above its graph, with only the buttons that apply to the workflow as it is now
// (Argo UI's workflow-operations): Resume (suspended, or a suspend node waiting; one with
// supplied outputs asks for them first), Suspend, Stop and Terminate (running), Retry (failed),
// Resubmit (finished), Delete (after a confirmation). The view redraws the bar from the watch;
// `onDone(action, result)` is called after an action succeeded.

import { call, workflowPath } from "./api.js";
import { el, navigate, say } from "./ui.js";

const DONE = new Set(["Succeeded", "Failed", "Error"]);

export function actionsBar(workflow, onDone = () => {}) {
  const { name, namespace } = workflow.metadata;
  const phase = workflow.status?.phase || "Pending";
  const running = !DONE.has(phase);
  const waiting = suspendNodes(workflow);
  const path = workflowPath(namespace, name);
  const bar = el("div", { class: "toolbar actions", role: "toolbar", "aria-label": "Workflow actions",
    dataset: { actions: name } });

  const act = (action, label, options = {}) => {
    const button = el("button", { type: "button", class: options.kind || null, dataset: { action },
      title: options.title || null }, label);
    button.addEventListener("click", async () => {
      if (options.confirm && !(await confirmDialog(options.confirm, button))) return;
      let values = null;
      if (options.ask) {
        values = await options.ask(button);
        if (values === null) return;
      }
      const buttons = [...bar.querySelectorAll("button")];
      buttons.forEach((b) => (b.disabled = true));
      try {
        const result = await options.run(values);
        say(options.said || `${label}: ${name}`);
        onDone(action, result);
        if (options.then) options.then(result);
      } catch (error) {
        say(`${label} ${name}: ${error.message}`, "error");
      } finally {
        buttons.forEach((b) => (b.disabled = false));
      }
    });
    bar.append(button);
  };

  if (running && (workflow.spec?.suspend || waiting.length)) {
    const asking = waiting.find((node) => suppliedOutputs(workflow, node).length);
    act("resume", "Resume", {
      kind: "primary",
      ask: asking ? (button) => outputsDialog(workflow, asking, button) : null,
      run: (values) => values
        ? call("PUT", `${path}/set`, {
          namespace, name, nodeFieldSelector: `id=${asking.id}`,
          outputParameters: JSON.stringify(values),
        })
        : call("PUT", `${path}/resume`, { namespace, name }),
      said: `Resumed ${name}`,
    });
  }
  if (running && !workflow.spec?.suspend) {
    act("suspend", "Suspend", { run: () => call("PUT", `${path}/suspend`, { namespace, name }),
      said: `Suspended ${name}: nothing new starts until it is resumed` });
  }
  if (running) {
    act("stop", "Stop", {
      title: "Running steps get SIGTERM; the exit handler runs",
      confirm: { title: `Stop ${name}?`, text: "Its running steps are sent SIGTERM and its exit handler runs; it ends Failed.", action: "Stop" },
      run: () => call("PUT", `${path}/stop`, { namespace, name }), said: `Stopping ${name}`,
    });
    act("terminate", "Terminate", {
      kind: "danger", title: "Every process is killed now, the exit handler's too",
      confirm: { title: `Terminate ${name}?`, text: "Every process it runs is killed now, its exit handler's too.", action: "Terminate", danger: true },
      run: () => call("PUT", `${path}/terminate`, { namespace, name }), said: `Terminated ${name}`,
    });
  }
  if (phase === "Failed" || phase === "Error") {
    act("retry", "Retry", { kind: "primary", title: "Run its failed steps again, keeping what succeeded",
      run: () => call("PUT", `${path}/retry`, { namespace, name }), said: `Retrying ${name}` });
  }
  if (DONE.has(phase)) {
    act("resubmit", "Resubmit", { title: "A new workflow of the same spec",
      run: () => call("PUT", `${path}/resubmit`, { namespace, name }),
      then: (created) => navigate(`/workflows/${encodeURIComponent(created.metadata.namespace || namespace)}/${
        encodeURIComponent(created.metadata.name)}`),
      said: `Resubmitted ${name}` });
  }
  act("delete", "Delete", {
    kind: "danger",
    confirm: { title: `Delete ${name}?`, text: running
      ? "It is running: it is ended first. Its run folder and logs are removed."
      : "Its run folder and logs are removed.", action: "Delete", danger: true },
    run: () => call("DELETE", path),
    then: () => navigate(`/workflows/${encodeURIComponent(namespace)}`),
    said: `Deleted ${name}`,
  });
  return bar;
}

// Suspend nodes waiting to be resumed.
function suspendNodes(workflow) {
  return Object.values(workflow.status?.nodes || {})
    .filter((node) => node.type === "Suspend" && node.phase === "Running");
}

// The output parameters a suspend node's template asks to be supplied when resumed.
function suppliedOutputs(workflow, node) {
  const templates = [...(workflow.spec?.templates || []),
    ...(workflow.status?.storedWorkflowTemplateSpec?.templates || [])];
  const template = templates.find((t) => t.name === node.templateName);
  return (template?.outputs?.parameters || []).filter((p) => p.valueFrom && "supplied" in p.valueFrom);
}

// A modal dialog: `build(form)` fills it; resolves with `result(form)` on OK, null on cancel.
function modal(title, build, result, returnFocus, { action = "OK", danger = false } = {}) {
  const heading = `dialog-title-${Math.random().toString(36).slice(2)}`;
  const form = el("form", { method: "dialog" });
  const dialog = el("dialog", { "aria-labelledby": heading, class: "action-dialog" }, form);
  form.append(el("h2", { id: heading }, title));
  build(form);
  // (Cancel is no submit button: Enter in a field means the action)
  form.append(el("menu", {},
    el("button", { type: "button", onclick: () => dialog.close("cancel") }, "Cancel"),
    el("button", { value: "ok", type: "submit", class: danger ? "danger-filled" : "primary",
      dataset: { confirm: "" } }, action)));
  document.body.append(dialog);
  dialog.showModal();
  (form.querySelector("input, select") || form.querySelector("button[value=ok]")).focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      const value = ok ? result(form) : null;
      dialog.remove();
      if (returnFocus?.isConnected) returnFocus.focus();
      resolve(value);
    });
  });
}

function confirmDialog({ title, text, action, danger }, button) {
  return modal(title, (form) => form.append(el("p", {}, text)), () => true, button, { action, danger });
}

// Resume with values: a field for each supplied output (a select for an enum).
function outputsDialog(workflow, node, button) {
  const outputs = suppliedOutputs(workflow, node);
  return modal(`Resume ${node.displayName || node.name}`, (form) => {
    form.append(el("p", { class: "muted" }, "This step waits for values before the workflow goes on."));
    for (const output of outputs) {
      const id = `output-${output.name}`;
      const byDefault = output.default ?? output.valueFrom?.default ?? "";
      const input = output.enum?.length
        ? el("select", { id, name: output.name },
          ...output.enum.map(String).map((choice) => el("option", { value: choice,
            selected: choice === String(byDefault) }, choice)))
        : el("input", { id, name: output.name, value: String(byDefault), autocomplete: "off" });
      form.append(el("div", { class: "field" },
        el("label", { for: id }, el("span", { class: "mono" }, output.name)),
        output.description ? el("div", { class: "help" }, output.description) : null, input));
    }
  }, (form) => Object.fromEntries(outputs.map((output) => [output.name,
    form.querySelector(`[name="${CSS.escape(output.name)}"]`).value])), button, { action: "Resume" });
}
