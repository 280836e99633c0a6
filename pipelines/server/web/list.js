// The workflows of a namespace, newest first, kept live by the watch stream
// (/api/v1/workflow-events/NS: every workflow ADDED first, then ADDED, MODIFIED, DELETED).
// Filters (phases, a label selector) are the watch's own label selector, so the server
// chooses, and a workflow that leaves the selection comes as DELETED; they are kept in the
// URL's query (?phase=Running,Failed&label=team%3Dml) so a link keeps them.
// Cheap with many workflows: each row is keyed by name and redrawn only when what it shows
// changed; events are applied once per frame; one timer ticks the running rows' durations.

import { ApiError, call, settings, stream } from "./api.js";
import { duration, el, elapsed, link, phaseBadge, view } from "./ui.js";

const PHASES = ["Pending", "Running", "Succeeded", "Failed", "Error"];
const PHASE_LABEL = "workflows.argoproj.io/phase";
const TEMPLATE_LABELS = ["workflows.argoproj.io/workflow-template",
  "workflows.argoproj.io/cluster-workflow-template", "sublimate.dev/pipeline",
  "workflows.argoproj.io/cron-workflow"];
// What a row shows, and no more: a workflow's nodes are not sent.
const FIELDS = ["metadata.name", "metadata.namespace", "metadata.creationTimestamp",
  "metadata.labels", "spec.arguments", "spec.workflowTemplateRef", "status.phase",
  "status.startedAt", "status.finishedAt", "status.progress", "status.message"]
  .map((field) => `result.object.${field}`).join(",");
const SHOWN_PARAMETERS = 3;
const SHOWN_VALUE = 24;

for (const path of ["/", "/workflows", "/workflows/:namespace"]) view(path, renderList);

function renderList(root, params) {
  const namespace = params.namespace || settings.namespace;
  const filters = {
    phases: new Set((params.phase || "").split(",").filter((p) => PHASES.includes(p))),
    label: params.label || "",
  };
  const table = new Table(namespace);
  const state = el("span", { class: "live-state", role: "status", dataset: { state: "connecting" } },
    "connecting");
  const count = el("span", { class: "muted list-count" });
  const labelInput = el("input", {
    type: "search", name: "label", value: filters.label, placeholder: "team=ml,env!=dev",
    "aria-describedby": "label-error", spellcheck: "false", autocomplete: "off", class: "mono",
  });
  const labelError = el("div", { class: "field-error", id: "label-error", dataset: { for: "label" } });
  const phaseBoxes = PHASES.map((phase) => el("label", { class: `phase-toggle phase-toggle-${phase}` },
    el("input", { type: "checkbox", name: "phase", value: phase, checked: filters.phases.has(phase),
      onchange: () => apply() }),
    el("span", {}, phase)));
  const form = el("form", { class: "toolbar list-filters", role: "search", onsubmit: (event) => {
    event.preventDefault();
    apply();
  } },
  el("fieldset", { class: "phase-filter" }, el("legend", { class: "visually-hidden" }, "Phase"),
    ...phaseBoxes),
  el("label", { class: "label-filter" }, el("span", { class: "muted" }, "Labels"), labelInput),
  el("button", { type: "submit" }, "Filter"),
  el("span", { class: "grow" }),
  count, state);

  root.append(el("section", { dataset: { view: "list" }, class: "list-view" },
    el("div", { class: "list-head" },
      el("h1", {}, "Workflows"),
      el("span", { class: "muted" }, "in namespace ", el("b", {}, namespace)),
      el("span", { class: "grow" }),
      link("/workflow-templates", el("span", { class: "button" }, "Submit a workflow"))),
    form, labelError, table.element));

  let stopWatch = () => {};
  const setState = (text, kind, why = "") => {
    state.textContent = text;
    state.dataset.state = kind;
    state.title = why || (kind === "live" ? "updated live from the server's watch" : "");
  };
  table.onCount = (shown) => {
    count.textContent = shown === 1 ? "1 workflow" : `${shown} workflows`;
  };

  function start() {
    stopWatch();
    table.clear(filters);
    labelError.textContent = "";
    labelInput.removeAttribute("aria-invalid");
    const selectors = [];
    if (filters.phases.size) selectors.push(`${PHASE_LABEL} in (${[...filters.phases].join(",")})`);
    if (filters.label.trim()) selectors.push(filters.label.trim());
    stopWatch = watch(namespace, selectors.join(","), table, setState, (error) => {
      // a selector the server refuses: said at its field, nothing watched
      labelError.textContent = error.message;
      labelInput.setAttribute("aria-invalid", "true");
      table.failed();
    });
  }

  function apply() {
    filters.phases = new Set(phaseBoxes.map((box) => box.querySelector("input"))
      .filter((input) => input.checked).map((input) => input.value));
    filters.label = labelInput.value.trim();
    const query = new URLSearchParams();
    if (filters.phases.size) query.set("phase", [...filters.phases].join(","));
    if (filters.label) query.set("label", filters.label);
    const search = query.toString();
    history.replaceState(null, "", location.pathname + (search ? `?${search}` : ""));
    start();
  }

  start();
  const ticker = setInterval(() => table.tick(), 1000);
  return () => {
    stopWatch();
    clearInterval(ticker);
  };
}

// The watch, opened again after a pause when it breaks (the server restarted): the
// workflows it sends again are upserted, and those deleted meanwhile are found by a list.
function watch(namespace, labelSelector, table, setState, refused) {
  const controller = new AbortController();
  (async () => {
    let broken = false;
    while (!controller.signal.aborted) {
      let opened = null;
      try {
        setState(broken ? "reconnecting" : "connecting", "connecting");
        const events = stream(`/api/v1/workflow-events/${encodeURIComponent(namespace)}`, {
          "listOptions.labelSelector": labelSelector, fields: FIELDS,
        }, controller.signal);
        // open at its first event, or after a quiet moment without an error (no workflows)
        const opening = () => {
          if (opened === false) return;
          clearTimeout(opened);
          opened = false;
          setState("live", "live");
          if (broken) reconcile(namespace, labelSelector, table);
          table.loaded();
        };
        opened = setTimeout(opening, 500);
        for await (const event of events) {
          opening();
          table.push(event);
        }
        if (controller.signal.aborted) return;
        throw new Error("the server ended the stream");
      } catch (error) {
        clearTimeout(opened);
        if (controller.signal.aborted) return;
        if (error instanceof ApiError && error.status === 400) {
          setState("stopped", "stopped");
          refused(error);
          return;
        }
        broken = true;
        setState("reconnecting…", "reconnecting", `the stream broke: ${error.message}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();
  return () => controller.abort();
}

// After a reconnection: rows of workflows no longer there (deleted while the stream was down).
async function reconcile(namespace, labelSelector, table) {
  try {
    const list = await call("GET", `/api/v1/workflows/${encodeURIComponent(namespace)}`, undefined,
      { "listOptions.labelSelector": labelSelector });
    table.keepOnly(new Set((list.items || []).map((item) => item.metadata.name)));
  } catch {
    // the next reconnection tries again
  }
}

// The table: rows keyed by name, in order of creation (newest first).
class Table {
  constructor(namespace) {
    this.namespace = namespace;
    this.rows = new Map(); // name -> {tr, key, cells, signature, workflow}
    this.order = []; // rows, newest first
    this.running = new Set();
    this.pending = new Map();
    this.frame = null;
    this.onCount = () => {};
    this.body = el("tbody");
    this.empty = el("p", { class: "muted list-empty" }, "Loading…");
    this.table = el("table", { class: "workflows" },
      el("colgroup", {}, ...["name", "phase", "started", "duration", "progress", "pipeline", "parameters"]
        .map((name) => el("col", { class: `col-${name}` }))),
      el("thead", {}, el("tr", {}, ...["Name", "Phase", "Started", "Duration", "Progress", "Pipeline",
        "Parameters"].map((text) => el("th", { scope: "col" }, text)))),
      this.body);
    this.element = el("div", { class: "table-scroll" }, this.table, this.empty);
  }

  clear(filters) {
    this.filters = filters;
    this.rows.clear();
    this.order = [];
    this.running.clear();
    this.pending.clear();
    this.body.replaceChildren();
    this.empty.textContent = "Loading…";
    this.empty.hidden = false;
    this.isLoaded = false;
  }

  loaded() {
    this.isLoaded = true;
    this.update();
  }

  failed() {
    this.empty.textContent = "No workflows shown: the label selector is not valid.";
    this.empty.hidden = false;
  }

  push(event) {
    const name = event?.object?.metadata?.name;
    if (!name) return;
    this.pending.set(name, event);
    if (this.frame === null) {
      // once per frame; a hidden tab's frames wait, so a timer too
      const flush = () => this.flush();
      this.frame = requestAnimationFrame(flush);
      this.timer = setTimeout(flush, 250);
    }
  }

  flush() {
    cancelAnimationFrame(this.frame);
    clearTimeout(this.timer);
    this.frame = null;
    const events = [...this.pending.values()];
    this.pending.clear();
    for (const { type, object } of events) {
      if (type === "DELETED") this.remove(object.metadata.name);
      else this.upsert(object);
    }
    this.update();
  }

  keepOnly(names) {
    for (const name of [...this.rows.keys()]) if (!names.has(name)) this.remove(name);
    this.update();
  }

  remove(name) {
    const row = this.rows.get(name);
    if (!row) return;
    row.tr.remove();
    this.rows.delete(name);
    this.running.delete(name);
    this.order.splice(this.order.indexOf(row), 1);
  }

  upsert(workflow) {
    const name = workflow.metadata.name;
    const signature = JSON.stringify([workflow.metadata.labels, workflow.spec, workflow.status]);
    let row = this.rows.get(name);
    if (row && row.signature === signature) return;
    if (!row) {
      row = { name, key: sortKey(workflow), cells: {}, tr: null };
      row.tr = el("tr", { dataset: { workflow: name } });
      for (const cell of ["name", "phase", "started", "duration", "progress", "pipeline", "parameters"]) {
        row.cells[cell] = el("td", { class: `cell-${cell}` });
        row.tr.append(row.cells[cell]);
      }
      row.cells.name.append(link(`/workflows/${encodeURIComponent(this.namespace)}/${encodeURIComponent(name)}`,
        name));
      // newest first: the first row older than this one comes after it
      let at = this.order.findIndex((other) => other.key < row.key);
      if (at < 0) at = this.order.length;
      this.body.insertBefore(row.tr, this.order[at]?.tr || null);
      this.order.splice(at, 0, row);
      this.rows.set(name, row);
    }
    row.signature = signature;
    row.workflow = workflow;
    drawRow(row, workflow);
    const phase = workflow.status?.phase || "Pending";
    if (phase === "Running" || phase === "Pending") this.running.add(name);
    else this.running.delete(name);
  }

  update() {
    const shown = this.rows.size;
    this.onCount(shown);
    this.table.hidden = shown === 0;
    if (shown) {
      this.empty.hidden = true;
    } else if (this.isLoaded) {
      const filtered = this.filters.phases.size || this.filters.label;
      this.empty.replaceChildren(filtered
        ? "No workflows match these filters."
        : el("span", {}, "No workflows in this namespace yet. ",
          link("/workflow-templates", "Submit one from a template"), "."));
      this.empty.hidden = false;
    }
  }

  // every second: the running rows' durations; every half minute, every row's "5m ago"
  tick() {
    for (const name of this.running) {
      const row = this.rows.get(name);
      if (row) drawDuration(row.cells.duration, row.workflow);
    }
    this.ticks = ((this.ticks || 0) + 1) % 30;
    if (this.ticks === 0) for (const row of this.order) drawStarted(row.cells.started, row.workflow);
  }
}

function sortKey(workflow) {
  return `${workflow.metadata.creationTimestamp || ""} ${workflow.metadata.name}`;
}

function drawRow(row, workflow) {
  const status = workflow.status || {};
  const phase = status.phase || "Pending";
  row.tr.dataset.phase = phase;
  const badge = phaseBadge(phase);
  if (status.message) badge.title = status.message;
  row.cells.phase.replaceChildren(badge);
  drawStarted(row.cells.started, workflow);
  drawDuration(row.cells.duration, workflow);
  row.cells.progress.textContent = status.progress || "";
  row.cells.progress.classList.add("num");
  const labels = workflow.metadata.labels || {};
  const from = TEMPLATE_LABELS.map((label) => labels[label]).find(Boolean)
    || workflow.spec?.workflowTemplateRef?.name || "";
  row.cells.pipeline.replaceChildren(from ? el("span", { class: "pipeline" }, from) : "");
  row.cells.parameters.replaceChildren(...parameterChips(workflow));
}

function drawStarted(cell, workflow) {
  const started = workflow.status?.startedAt || workflow.metadata.creationTimestamp;
  if (!started) {
    cell.textContent = "";
    return;
  }
  const seconds = elapsed(started);
  cell.replaceChildren(el("time", { datetime: started, title: new Date(started).toLocaleString() },
    ago(seconds)));
}

function ago(seconds) {
  if (seconds < 45) return "just now";
  if (seconds < 3600) return `${Math.max(1, Math.round(seconds / 60))}m ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)}h ago`;
  return `${Math.round(seconds / 86400)}d ago`;
}

function drawDuration(cell, workflow) {
  const status = workflow.status || {};
  cell.textContent = status.startedAt ? duration(elapsed(status.startedAt, status.finishedAt)) : "";
  cell.classList.add("num");
}

// "epochs=3 · lr=0.1 · +4": the first parameters, each shortened; every one in the title.
function parameterChips(workflow) {
  const parameters = workflow.spec?.arguments?.parameters || [];
  if (!parameters.length) return [];
  const text = (p) => `${p.name}=${p.value ?? p.default ?? ""}`;
  const chips = parameters.slice(0, SHOWN_PARAMETERS).map((p) => {
    const full = text(p);
    return el("span", { class: "chip mono" },
      full.length > SHOWN_VALUE ? `${full.slice(0, SHOWN_VALUE - 1)}…` : full);
  });
  if (parameters.length > SHOWN_PARAMETERS) {
    chips.push(el("span", { class: "chip more" }, `+${parameters.length - SHOWN_PARAMETERS}`));
  }
  return [el("span", { class: "chips", title: parameters.map(text).join("\n") }, ...chips)];
}
