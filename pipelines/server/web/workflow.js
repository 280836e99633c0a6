// The workflow view, /workflows/NAMESPACE/NAME: its header (phase, times, progress, message),
// its actions, the graph of its nodes and the panel of the node chosen (?node=ID in the
// address, so a link opens it). Kept live by a watch of this one workflow
// (fieldSelector metadata.name=NAME): each event redraws only what changed.

import { actionsBar } from "./actions.js";
import { call, watchWorkflows, workflowPath } from "./api.js";
import { createGraph, groupHiding } from "./graph.js";
import { createNodePanel } from "./node.js";
import { duration, el, elapsed, link, navigate, phaseBadge, view } from "./ui.js";

view("/workflows/:namespace/:name", render);

async function render(root, params) {
  const { namespace, name } = params;
  const section = el("section", { class: "workflow-view", dataset: { view: "workflow", workflow: name } });
  root.append(section);

  const title = el("h1", {}, name);
  const badge = el("span", { class: "workflow-phase" });
  const live = el("span", { class: "live-state", role: "status", dataset: { state: "live" } }, "live");
  const facts = el("dl", { class: "workflow-facts" });
  const message = el("p", { class: "workflow-message", hidden: true });
  const gone = el("p", { class: "workflow-gone", role: "alert", hidden: true });
  const actionsSlot = el("div", { class: "workflow-actions" });
  const head = el("div", { class: "workflow-head" },
    el("nav", { class: "crumbs", "aria-label": "Breadcrumb" },
      link(`/workflows/${encodeURIComponent(namespace)}`, "Workflows"), " / ", el("span", {}, namespace)),
    el("div", { class: "workflow-title" }, title, badge, live),
    facts, message, gone);

  let workflow = null;
  let selected = params.node || null;
  let actionsKey = null;
  let pendingDraw = 0;
  let stopped = false;

  const select = (id) => {
    selected = id;
    const url = new URL(location.href);
    if (id) url.searchParams.set("node", id);
    else url.searchParams.delete("node");
    history.replaceState(history.state, "", url);
    draw();
  };
  const graph = createGraph({ onSelect: (id) => select(id), label: `Graph of the nodes of ${name}` });
  const panel = createNodePanel({
    namespace, name,
    onSelect: (id) => {
      openGroupsOf(id);
      select(id);
      graph.focusNode(id);
    },
    onExpand: (id) => graph.expand(id),
    onCollapse: (id) => graph.collapse(id),
    isExpanded: (id) => graph.isExpanded(id),
  });
  section.append(head, actionsSlot,
    el("div", { class: "panel-grid workflow-grid" }, el("div", { class: "card graph-card" }, graph.element), panel.element));

  function openGroupsOf(id) {
    if (!workflow || !id) return;
    for (const group of groupHiding(workflow, id)) if (!graph.isExpanded(group)) graph.expand(group);
  }

  function header() {
    const status = workflow.status || {};
    const phase = status.phase || "Pending";
    if (badge.dataset.phase !== phase) {
      badge.replaceChildren(phaseBadge(phase));
      badge.dataset.phase = phase;
      section.dataset.phase = phase;
    }
    const rows = [];
    const fact = (label, value, extra = {}) => {
      if (value === undefined || value === null || value === "") return;
      rows.push(el("div", { class: "fact" }, el("dt", {}, label), el("dd", extra, value)));
    };
    fact("Started", status.startedAt ? new Date(status.startedAt).toLocaleString() : "not yet");
    fact("Duration", duration(elapsed(status.startedAt, status.finishedAt)),
      { class: "workflow-duration", dataset: status.startedAt && !status.finishedAt ? { tickFrom: status.startedAt } : {} });
    fact("Progress", status.progress);
    if (status.finishedAt) fact("Finished", new Date(status.finishedAt).toLocaleString());
    const entry = workflow.spec?.entrypoint || workflow.status?.storedWorkflowTemplateSpec?.entrypoint;
    fact("Entrypoint", entry);
    const template = workflow.spec?.workflowTemplateRef?.name;
    if (template) fact("From template", template);
    const parameters = workflow.spec?.arguments?.parameters || [];
    if (parameters.length) {
      fact("Parameters", parameters.map((p) => `${p.name}=${p.value ?? ""}`).join("  "), { class: "mono" });
    }
    facts.replaceChildren(...rows);
    message.hidden = !status.message;
    message.textContent = status.message || "";
    message.classList.toggle("error", phase === "Failed" || phase === "Error");
  }

  function actions() {
    const nodes = Object.values(workflow.status?.nodes || {});
    const key = JSON.stringify([workflow.status?.phase, workflow.spec?.suspend, workflow.spec?.shutdown,
      nodes.filter((n) => n.type === "Suspend" && n.phase === "Running").map((n) => n.id),
      workflow.status?.finishedAt, workflow.metadata?.resourceVersion === undefined]);
    if (key === actionsKey) return;
    actionsKey = key;
    const before = actionsSlot.firstElementChild;
    const focused = before && before.contains(document.activeElement) ? document.activeElement : null;
    const focusIndex = focused ? [...before.querySelectorAll("button, a, select, input")].indexOf(focused) : -1;
    let bar;
    try {
      bar = actionsBar(workflow, onActionDone);
    } catch (error) {
      bar = el("p", { class: "error" }, `actions: ${error.message}`);
    }
    actionsSlot.replaceChildren(bar);
    if (focusIndex >= 0) bar.querySelectorAll("button, a, select, input")[focusIndex]?.focus();
  }

  function onActionDone(outcome) {
    const other = outcome?.metadata?.name;
    if (other && other !== name) {
      navigate(`/workflows/${encodeURIComponent(outcome.metadata.namespace || namespace)}/${encodeURIComponent(other)}`);
    }
  }

  function draw() {
    if (!workflow || stopped) return;
    const nodes = workflow.status?.nodes || {};
    openGroupsOf(selected); // (a node of the address not there yet: the panel waits for it)
    graph.update(workflow, selected);
    const item = graph.items()?.get(selected);
    if (selected && !nodes[selected] && !item) panel.show(workflow, null, null);
    else panel.show(workflow, selected, item);
  }

  // Events come faster than frames at times: the latest is drawn, once per frame.
  function received(next) {
    if (workflow && !next.status?.storedWorkflowTemplateSpec && workflow.status?.storedWorkflowTemplateSpec) {
      next.status = { ...next.status, storedWorkflowTemplateSpec: workflow.status.storedWorkflowTemplateSpec };
    }
    workflow = next;
    if (pendingDraw) return;
    pendingDraw = requestAnimationFrame(() => {
      pendingDraw = 0;
      refresh();
    });
  }

  function refresh() {
    if (!workflow || stopped) return;
    header();
    actions();
    draw();
  }

  workflow = await call("GET", workflowPath(namespace, name));
  refresh();
  if (selected) graph.show(selected);

  let stopWatch = watchWorkflows(namespace, { fieldSelector: `metadata.name=${name}` }, (event) => {
    if (event.type === "DELETED") {
      gone.hidden = false;
      gone.textContent = "This workflow was deleted: what is shown is what it was last.";
      section.dataset.deleted = "true";
      live.textContent = "deleted";
      live.dataset.state = "stopped";
      stopWatch();
      return;
    }
    if (event.object) received(event.object);
  }, (state) => {
    live.textContent = state === "live" ? "live" : state;
    live.dataset.state = state === "live" ? "live" : "reconnecting";
    if (state !== "live" && /not found/.test(state) && section.dataset.deleted !== "true") {
      gone.hidden = false;
      gone.textContent = "This workflow is no longer on the server.";
    }
  });

  // the running durations tick
  const ticker = setInterval(() => {
    for (const dd of section.querySelectorAll("[data-tick-from]")) {
      dd.textContent = duration(elapsed(dd.dataset.tickFrom));
    }
  }, 1000);

  return () => {
    stopped = true;
    stopWatch();
    stopWatch = () => {};
    clearInterval(ticker);
    cancelAnimationFrame(pendingDraw);
    graph.destroy();
    panel.destroy();
  };
}
