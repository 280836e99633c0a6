// A workflow's nodes as a layered graph, top to bottom, in SVG.
//
// The model (`model()`) follows Argo's UI (workflow-dag.tsx): a node's `children` are its
// edges, StepGroup and TaskGroup nodes are drawn small, a workflow's exit handler comes after
// its last nodes. Where the local runner's tree differs from Argo's controller's (a DAG's
// children are all its tasks, a step's are none), the edges come from the spec instead: a
// DAG's tasks hang from their dependencies, a Steps node's groups follow one another; the
// spec's tasks and steps that have no node yet are drawn greyed (`data-pending`). Retries
// are one node showing the attempt count, loops show their first items and a "+N more"
// node; both expand.
//
// Large graphs: the layout is plain layering (longest path, then each layer ordered by its
// parents' places), computed in one pass; the SVG elements are kept by node id across
// updates, and an update that changes no edge only touches the nodes whose look changed.
// Pan and zoom move the viewBox (wheel, drag, the buttons, the keyboard).

import { el } from "./ui.js";

export const LOOP_LIMIT = 10; // items of a loop drawn before the "+N more" node
const WIDE = { w: 184, h: 40 }; // a node's box
const SMALL = { w: 18, h: 18 }; // a group node's circle
const GAP_X = 26;
const GAP_Y = 58;
const LABEL_CHARS = 22;
const DONE = new Set(["Succeeded", "Failed", "Error", "Skipped", "Omitted"]);
const SMALL_TYPES = new Set(["StepGroup", "TaskGroup"]);

// ------------------------------------------------------------------------------- model

function templatesOf(workflow) {
  const found = new Map();
  const specs = [workflow.status?.storedWorkflowTemplateSpec, workflow.spec];
  for (const spec of specs) {
    for (const template of spec?.templates || []) {
      if (template?.name && !found.has(template.name)) found.set(template.name, template);
    }
  }
  return found;
}

function templateFor(templates, name) {
  if (!name) return null;
  return templates.get(name) || templates.get(String(name).split(".").pop()) || null;
}

// The task names a DAG task waits for: `dependencies`, or the names its `depends` tests.
function dependsOn(task, names) {
  if (Array.isArray(task.dependencies)) return task.dependencies.filter((n) => names.has(n));
  if (typeof task.depends !== "string") return [];
  const found = [];
  for (const match of task.depends.matchAll(/[A-Za-z0-9_-]+(?:\.[A-Za-z]+)?/g)) {
    const name = match[0].split(".")[0];
    if (names.has(name) && !found.includes(name)) found.push(name);
  }
  return found;
}

// The phase a group of hidden nodes shows: the worst of theirs.
function worst(phases) {
  for (const phase of ["Error", "Failed", "Running", "Pending"]) {
    if (phases.includes(phase)) return phase;
  }
  return phases.length ? phases[0] : "Pending";
}

// What to draw of `workflow`: items (id -> {id, kind, label, sub, phase, ...}) in the order
// met, and edges [from, to, dashed]. `expanded`: the Retry and TaskGroup ids opened.
export function model(workflow, expanded = new Set()) {
  const nodes = workflow.status?.nodes || {};
  const byName = new Map();
  for (const node of Object.values(nodes)) byName.set(node.name, node);
  const templates = templatesOf(workflow);
  const items = new Map();
  const edges = [];
  const seen = new Set();
  const edge = (from, to, dashed = false) => edges.push([from, to, dashed]);
  const childNodes = (node) => (node.children || []).map((id) => nodes[id]).filter(Boolean);
  const isHook = (parent, child) =>
    child.name === `${parent.name}.onExit` || child.name.startsWith(`${parent.name}.hooks.`);

  const add = (node, extra = {}) => {
    const phase = node.phase || "Pending";
    const item = {
      id: node.id,
      node,
      kind: SMALL_TYPES.has(node.type) ? "small" : "node",
      type: node.type,
      label: node.displayName || node.name,
      sub: node.templateName || node.type,
      phase,
      suspended: node.type === "Suspend" && phase === "Running",
      ...extra,
    };
    items.set(item.id, item);
    return item;
  };

  const pending = (id, name, label, template, type = "Pod") => {
    const item = {
      id, kind: type === "StepGroup" ? "small" : "node", type, label, sub: template || "",
      phase: "Pending", pending: true, name,
      node: null,
    };
    items.set(id, item);
    return { entry: id, exits: [id] };
  };

  // Draw `node` and what hangs from it; its entry and the ids its successors hang from.
  const place = (node) => {
    if (seen.has(node.id)) return { entry: node.id, exits: [node.id] };
    seen.add(node.id);
    add(node);
    const kids = childNodes(node);
    const hooks = kids.filter((kid) => isHook(node, kid));
    const body = kids.filter((kid) => !isHook(node, kid));
    let exits;
    if (node.type === "Retry") exits = retry(node, body);
    else if (node.type === "TaskGroup") exits = loop(node, body);
    else if (node.type === "DAG") exits = dag(node, body);
    else if (node.type === "Steps") exits = steps(node, body);
    else exits = fan(node.id, body);
    for (const hook of hooks) {
      const hung = place(hook);
      for (const from of exits) edge(from, hung.entry, true);
    }
    return { entry: node.id, exits };
  };

  const fan = (from, kids) => {
    if (!kids.length) return [from];
    const exits = [];
    for (const kid of kids) {
      const placed = place(kid);
      edge(from, placed.entry);
      exits.push(...placed.exits);
    }
    return exits;
  };

  const retry = (node, attempts) => {
    const item = items.get(node.id);
    item.attempts = attempts.length;
    item.expandable = attempts.length > 0;
    item.expanded = expanded.has(node.id);
    item.sub = `${node.templateName || "retry"} · ${attempts.length} attempt${attempts.length === 1 ? "" : "s"}`;
    if (!item.expanded || !attempts.length) {
      for (const attempt of attempts) markHidden(attempt);
      return [node.id];
    }
    let exits = [node.id];
    for (const attempt of attempts) {
      const placed = place(attempt);
      edge(node.id, placed.entry);
      exits = placed.exits;
    }
    return exits;
  };

  const loop = (node, kids) => {
    const item = items.get(node.id);
    item.sub = `${kids.length} item${kids.length === 1 ? "" : "s"}`;
    item.expandable = kids.length > LOOP_LIMIT;
    item.expanded = expanded.has(node.id);
    if (item.expanded || kids.length <= LOOP_LIMIT) return fan(node.id, kids);
    const shown = kids.slice(0, LOOP_LIMIT);
    const hidden = kids.slice(LOOP_LIMIT);
    const exits = fan(node.id, shown);
    const more = `more:${node.id}`;
    const failed = hidden.filter((kid) => kid.phase === "Failed" || kid.phase === "Error").length;
    items.set(more, {
      id: more, kind: "more", type: "more", group: node.id, node: null,
      label: `+${hidden.length} more`,
      sub: failed ? `${failed} failed` : hidden.every((kid) => DONE.has(kid.phase)) ? "all done" : "",
      phase: worst(hidden.map((kid) => kid.phase || "Pending")),
    });
    for (const kid of hidden) markHidden(kid);
    edge(node.id, more);
    exits.push(more);
    return exits;
  };

  // A hidden node (an attempt, a loop item) is still known: a link to it opens its group.
  const markHidden = (node) => {
    seen.add(node.id);
    for (const kid of childNodes(node)) if (!seen.has(kid.id)) markHidden(kid);
  };

  const dag = (node, kids) => {
    const tasks = templateFor(templates, node.templateName)?.dag?.tasks;
    if (!Array.isArray(tasks) || !tasks.length) return fan(node.id, kids);
    const open = !DONE.has(node.phase);
    const names = new Set(tasks.map((task) => task.name));
    const byTask = new Map();
    for (const kid of kids) {
      const task = kid.name.startsWith(`${node.name}.`) ? kid.name.slice(node.name.length + 1) : "";
      if (names.has(task)) byTask.set(task, kid);
    }
    const placed = new Map();
    for (const task of tasks) {
      const kid = byTask.get(task.name);
      if (kid) placed.set(task.name, place(kid));
      else if (open) {
        placed.set(task.name, pending(`pending:${node.id}:${task.name}`, `${node.name}.${task.name}`,
          task.name, task.template || task.templateRef?.template));
      }
    }
    const needed = new Set();
    for (const task of tasks) {
      const to = placed.get(task.name);
      if (!to) continue;
      const deps = dependsOn(task, names).filter((dep) => placed.has(dep));
      if (!deps.length) edge(node.id, to.entry, !!items.get(to.entry)?.pending);
      for (const dep of deps) {
        needed.add(dep);
        for (const from of placed.get(dep).exits) edge(from, to.entry, !!items.get(to.entry)?.pending);
      }
    }
    const exits = [];
    for (const [task, where] of placed) if (!needed.has(task)) exits.push(...where.exits);
    // a child the spec does not name (a spec that changed): under the DAG
    for (const kid of kids) {
      if (!seen.has(kid.id)) {
        const other = place(kid);
        edge(node.id, other.entry);
        exits.push(...other.exits);
      }
    }
    return exits.length ? exits : [node.id];
  };

  const steps = (node, kids) => {
    const groups = templateFor(templates, node.templateName)?.steps;
    const spec = Array.isArray(groups) ? groups.map((g) => (Array.isArray(g) ? g : g?.steps || [])) : [];
    const open = !DONE.has(node.phase);
    const byName = new Map(kids.map((kid) => [kid.name, kid]));
    const count = open ? Math.max(spec.length, kids.length) : kids.length;
    let previous = [node.id];
    const used = new Set();
    for (let i = 0; i < count; i++) {
      const groupName = `${node.name}[${i}]`;
      const group = byName.get(groupName) || (!open ? kids[i] : null);
      let groupId;
      let stepKids = [];
      if (group) {
        used.add(group.id);
        seen.add(group.id);
        add(group);
        groupId = group.id;
        stepKids = childNodes(group);
      } else {
        groupId = `pending:${node.id}[${i}]`;
        pending(groupId, groupName, `[${i}]`, "", "StepGroup");
      }
      for (const from of previous) edge(from, groupId, !group);
      const exits = [];
      const stepNames = new Set();
      for (const step of spec[i] || []) {
        stepNames.add(`${groupName}.${step.name}`);
        const kid = stepKids.find((k) => k.name === `${groupName}.${step.name}`);
        let where;
        if (kid) where = place(kid);
        else if (open) {
          where = pending(`pending:${node.id}[${i}].${step.name}`, `${groupName}.${step.name}`,
            step.name, step.template || step.templateRef?.template);
        } else continue;
        edge(groupId, where.entry, !kid);
        exits.push(...where.exits);
      }
      for (const kid of stepKids) {
        if (stepNames.has(kid.name) || seen.has(kid.id)) continue;
        const where = place(kid);
        edge(groupId, where.entry);
        exits.push(...where.exits);
      }
      previous = exits.length ? exits : [groupId];
    }
    for (const kid of kids) {
      if (!used.has(kid.id) && !seen.has(kid.id)) {
        const where = place(kid);
        edge(node.id, where.entry);
      }
    }
    return previous;
  };

  const name = workflow.metadata?.name;
  const root = nodes[name] || Object.values(nodes).find((node) => node.name === name);
  let rootExits = [];
  if (root) rootExits = place(root).exits;
  else if (!Object.keys(nodes).length && workflow.spec?.entrypoint && DONE.has(workflow.status?.phase) === false) {
    // nothing ran yet: the entry template's tasks or steps, greyed
    const template = templateFor(templates, workflow.spec.entrypoint);
    const type = template?.dag ? "DAG" : template?.steps ? "Steps" : "Pod";
    const virtual = { id: `pending:${name}`, name, displayName: name, type, phase: "Pending",
      templateName: workflow.spec.entrypoint, children: [] };
    rootExits = place(virtual).exits;
    items.get(virtual.id).pending = true;
  }
  // the workflow's exit handler after its last nodes, then whatever else is not drawn yet
  const exit = byName.get(`${name}.onExit`);
  if (exit && !seen.has(exit.id)) {
    const hung = place(exit);
    for (const from of rootExits) edge(from, hung.entry, true);
  }
  const hasParent = new Set();
  for (const node of Object.values(nodes)) for (const kid of node.children || []) hasParent.add(kid);
  for (const node of Object.values(nodes)) {
    if (!seen.has(node.id) && !hasParent.has(node.id)) place(node);
  }
  for (const node of Object.values(nodes)) if (!seen.has(node.id)) place(node);
  return { items, edges };
}

// The group (Retry, TaskGroup) to open so that node `id` is drawn; null if none.
export function groupHiding(workflow, id) {
  const nodes = workflow.status?.nodes || {};
  const parents = new Map();
  for (const node of Object.values(nodes)) for (const kid of node.children || []) parents.set(kid, node.id);
  const found = [];
  for (let at = parents.get(id); at; at = parents.get(at)) {
    const type = nodes[at]?.type;
    if (type === "Retry" || (type === "TaskGroup" && (nodes[at].children || []).length > LOOP_LIMIT)) {
      found.push(at);
    }
  }
  return found;
}

// ------------------------------------------------------------------------------ layout

function sizeOf(item) {
  if (item.kind === "small") {
    const label = item.type === "StepGroup" ? 0 : Math.min(item.label.length, 16) * 6.6 + 8;
    return { w: SMALL.w + label, h: SMALL.h, ax: SMALL.w / 2 };
  }
  return { w: WIDE.w, h: WIDE.h, ax: WIDE.w / 2 };
}

// Positions: {id: {x, y, w, h, ax}} and the whole size; ranks by longest path from a root,
// each rank ordered by the mean place of its parents, centred.
export function layout({ items, edges }) {
  const ids = [...items.keys()];
  const index = new Map(ids.map((id, i) => [id, i]));
  const parents = ids.map(() => []);
  const children = ids.map(() => []);
  const indegree = new Int32Array(ids.length);
  for (const [from, to] of edges) {
    const a = index.get(from);
    const b = index.get(to);
    if (a === undefined || b === undefined || a === b) continue;
    children[a].push(b);
    parents[b].push(a);
    indegree[b]++;
  }
  const rank = new Int32Array(ids.length);
  const queue = [];
  for (let i = 0; i < ids.length; i++) if (!indegree[i]) queue.push(i);
  for (let head = 0; head < queue.length; head++) {
    const i = queue[head];
    for (const j of children[i]) {
      if (rank[j] < rank[i] + 1) rank[j] = rank[i] + 1;
      if (--indegree[j] === 0) queue.push(j);
    }
  }
  const layers = [];
  for (let i = 0; i < ids.length; i++) (layers[rank[i]] ||= []).push(i);
  const order = new Float64Array(ids.length);
  const positions = new Map();
  let width = 0;
  let y = 0;
  const rows = [];
  for (const layer of layers) {
    if (!layer) continue;
    for (const i of layer) {
      const ps = parents[i];
      order[i] = ps.length ? ps.reduce((sum, p) => sum + order[p], 0) / ps.length : i * 1e-6;
    }
    layer.sort((a, b) => order[a] - order[b] || a - b);
    let x = 0;
    let height = 0;
    const row = [];
    for (const i of layer) {
      const size = sizeOf(items.get(ids[i]));
      row.push({ i, x, size });
      x += size.w + GAP_X;
      height = Math.max(height, size.h);
    }
    const rowWidth = x - GAP_X;
    width = Math.max(width, rowWidth);
    layer.forEach((i, k) => (order[i] = k / Math.max(1, layer.length - 1)));
    rows.push({ row, rowWidth, y, height });
    y += height + GAP_Y;
  }
  for (const { row, rowWidth, y: top, height } of rows) {
    const offset = -rowWidth / 2;
    for (const { i, x, size } of row) {
      positions.set(ids[i], { x: offset + x, y: top + (height - size.h) / 2, ...size });
    }
  }
  return { positions, width, height: Math.max(0, y - GAP_Y), rank, ids };
}

function edgePaths(edges, positions) {
  const solid = [];
  const dashed = [];
  for (const [from, to, isDashed] of edges) {
    const a = positions.get(from);
    const b = positions.get(to);
    if (!a || !b) continue;
    const x1 = a.x + a.ax;
    const y1 = a.y + a.h;
    const x2 = b.x + b.ax;
    const y2 = b.y;
    const bend = Math.max(18, (y2 - y1) / 2);
    (isDashed ? dashed : solid).push(
      `M${x1.toFixed(1)} ${y1.toFixed(1)}C${x1.toFixed(1)} ${(y1 + bend).toFixed(1)} ${x2.toFixed(1)} ${(y2 - bend).toFixed(1)} ${x2.toFixed(1)} ${y2.toFixed(1)}`,
    );
  }
  return [solid.join(""), dashed.join("")];
}

// ------------------------------------------------------------------------------- view

function short(text, chars = LABEL_CHARS) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

function lookOf(item, selected) {
  return [item.phase, item.label, item.sub, item.suspended, item.pending, item.expanded,
    item.attempts, item.id === selected].join("|");
}

// The graph's element and its controls: `update(workflow, selectedId)` draws (again) what
// changed; `onSelect(id)` is called when a node is chosen (click, Enter, Space).
export function createGraph({ onSelect, label = "Workflow graph" }) {
  const expanded = new Set();
  const elements = new Map(); // id -> {g, look}
  let current = null; // the last model and layout
  let signature = "";
  let selected = null;
  let focusId = null; // the node Tab reaches (roving tabindex)
  let workflow = null;
  let touched = false; // the user moved the view: updates keep it
  const view = { x: 0, y: 0, scale: 1 };

  const solidEdges = el("svg:path", { class: "edges" });
  const dashedEdges = el("svg:path", { class: "edges dashed" });
  const layer = el("svg:g", { class: "nodes" });
  const svg = el("svg", {
    class: "graph", role: "group", "aria-label": label,
    "aria-roledescription": "graph",
  }, el("svg:g", {}, solidEdges, dashedEdges), layer);
  const zoomBy = (factor) => {
    const box = svg.getBoundingClientRect();
    zoomAt(factor, box.width / 2, box.height / 2);
  };
  const toolbar = el("div", { class: "graph-tools", role: "toolbar", "aria-label": "Graph view" },
    el("button", { type: "button", title: "Zoom in", "aria-label": "Zoom in", onclick: () => zoomBy(1.25) }, "+"),
    el("button", { type: "button", title: "Zoom out", "aria-label": "Zoom out", onclick: () => zoomBy(0.8) }, "−"),
    el("button", { type: "button", title: "Fit the whole graph", onclick: () => { fit(true); } }, "Fit"),
    el("span", { class: "graph-count muted" }));
  const count = toolbar.querySelector(".graph-count");
  const element = el("div", { class: "graph-box" }, toolbar, svg);

  function size() {
    const box = svg.getBoundingClientRect();
    return { w: box.width || 800, h: box.height || 500 };
  }

  function apply() {
    const { w, h } = size();
    svg.setAttribute("viewBox", `${view.x.toFixed(1)} ${view.y.toFixed(1)} ${(w / view.scale).toFixed(1)} ${(h / view.scale).toFixed(1)}`);
  }

  function zoomAt(factor, px, py) {
    const next = Math.min(3, Math.max(0.05, view.scale * factor));
    const gx = view.x + px / view.scale;
    const gy = view.y + py / view.scale;
    view.scale = next;
    view.x = gx - px / next;
    view.y = gy - py / next;
    touched = true;
    apply();
  }

  // The whole graph in view when it fits at a readable size; else its top, at the root.
  function fit(all = false) {
    if (!current) return;
    const { w, h } = size();
    const pad = 24;
    const gw = current.layout.width + 2 * pad;
    const gh = current.layout.height + 2 * pad;
    const whole = Math.min(w / gw, h / gh, 1.15);
    view.scale = all ? Math.max(0.05, whole) : Math.max(0.85, Math.min(whole, 1.1));
    const shownW = w / view.scale;
    const shownH = h / view.scale;
    view.x = -shownW / 2;
    view.y = gh * view.scale <= h ? -pad - (shownH - gh) / 2 : -pad;
    if (all) touched = false;
    apply();
  }

  function reveal(id) {
    const at = current?.layout.positions.get(id);
    if (!at) return;
    const { w, h } = size();
    const vw = w / view.scale;
    const vh = h / view.scale;
    const margin = 20;
    if (at.x < view.x + margin || at.x + at.w > view.x + vw - margin) {
      view.x = at.x + at.w / 2 - vw / 2;
      touched = true;
    }
    if (at.y < view.y + margin || at.y + at.h > view.y + vh - margin) {
      view.y = at.y + at.h / 2 - vh / 2;
      touched = true;
    }
    apply();
  }

  // --- pan: drag anywhere; zoom: the wheel, at the pointer
  let drag = null;
  svg.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y, moved: false, id: event.pointerId };
  });
  svg.addEventListener("pointermove", (event) => {
    if (!drag || event.pointerId !== drag.id) return;
    const dx = event.clientX - drag.x;
    const dy = event.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    if (!drag.moved) svg.setPointerCapture(drag.id);
    drag.moved = true;
    svg.classList.add("dragging");
    view.x = drag.vx - dx / view.scale;
    view.y = drag.vy - dy / view.scale;
    touched = true;
    apply();
  });
  let dragged = false; // the click that ends a drag chooses nothing
  const endDrag = (event) => {
    if (!drag || event.pointerId !== drag.id) return;
    dragged = drag.moved;
    drag = null;
    svg.classList.remove("dragging");
  };
  svg.addEventListener("pointerup", endDrag);
  svg.addEventListener("pointercancel", endDrag);
  svg.addEventListener("click", (event) => {
    if (dragged) {
      dragged = false;
      return;
    }
    const g = event.target.closest?.("g.node");
    if (g) choose(g.dataset.nodeId);
  });
  svg.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = svg.getBoundingClientRect();
    zoomAt(Math.exp(-event.deltaY * 0.0015), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });

  // --- keyboard: Tab reaches one node; arrows move between nodes; Enter or Space chooses
  svg.addEventListener("keydown", (event) => {
    const g = event.target.closest?.("g.node");
    if (!g) return;
    const id = g.dataset.nodeId;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      choose(id);
      return;
    }
    const next = neighbour(id, event.key);
    if (next) {
      event.preventDefault();
      moveFocus(next);
    } else if (event.key === "+" || event.key === "=") zoomBy(1.25);
    else if (event.key === "-") zoomBy(0.8);
  });
  svg.addEventListener("focusin", (event) => {
    const g = event.target.closest?.("g.node");
    if (g) {
      setFocusable(g.dataset.nodeId);
      reveal(g.dataset.nodeId);
    }
  });

  function neighbour(id, key) {
    if (!current) return null;
    const { layout: { positions, rank, ids }, model: { edges } } = current;
    const at = positions.get(id);
    if (!at) return null;
    if (key === "ArrowDown" || key === "ArrowUp") {
      const down = key === "ArrowDown";
      const linked = edges.filter(([a, b]) => (down ? a === id : b === id)).map(([a, b]) => (down ? b : a));
      if (linked.length) return closest(linked, at);
      return null;
    }
    if (key === "ArrowLeft" || key === "ArrowRight") {
      const i = ids.indexOf(id);
      const same = ids.filter((other, j) => rank[j] === rank[i] && other !== id);
      const right = key === "ArrowRight";
      const side = same.filter((other) => (right ? positions.get(other).x > at.x : positions.get(other).x < at.x));
      if (!side.length) return null;
      return closest(side, at);
    }
    return null;
  }

  function closest(candidates, at) {
    let best = null;
    let distance = Infinity;
    for (const id of candidates) {
      const p = current.layout.positions.get(id);
      if (!p) continue;
      const d = Math.abs(p.x + p.ax - at.x - at.ax) + Math.abs(p.y - at.y) * 0.01;
      if (d < distance) [best, distance] = [id, d];
    }
    return best;
  }

  function setFocusable(id) {
    if (focusId === id) return;
    const before = elements.get(focusId);
    if (before) before.g.setAttribute("tabindex", "-1");
    focusId = id;
    const now = elements.get(id);
    if (now) now.g.setAttribute("tabindex", "0");
  }

  function moveFocus(id) {
    setFocusable(id);
    elements.get(id)?.g.focus({ preventScroll: true });
    reveal(id);
  }

  function choose(id) {
    const item = current?.model.items.get(id);
    if (!item) return;
    setFocusable(id);
    if (item.kind === "more") {
      expand(item.group);
      return;
    }
    onSelect(id, item);
  }

  function expand(id) {
    expanded.add(id);
    if (workflow) update(workflow, selected, true);
  }

  function collapse(id) {
    expanded.delete(id);
    if (workflow) update(workflow, selected, true);
  }

  // --- drawing

  function makeNode(item) {
    const g = el("svg:g", {
      class: "node", tabindex: "-1", role: "button",
      dataset: { nodeId: item.id },
    });
    const title = el("svg:title");
    if (item.kind === "small") {
      g.append(title, el("svg:circle", { class: "dot", cx: SMALL.w / 2, cy: SMALL.h / 2, r: SMALL.w / 2 - 1 }),
        el("svg:text", { class: "label small-label", x: SMALL.w + 5, y: SMALL.h / 2 + 4 }));
    } else {
      g.append(title,
        el("svg:rect", { class: "box", x: 0.5, y: 0.5, width: WIDE.w - 1, height: WIDE.h - 1, rx: 8 }),
        el("svg:rect", { class: "stripe", x: 0.5, y: 0.5, width: 5, height: WIDE.h - 1, rx: 2 }),
        el("svg:circle", { class: "dot", cx: 20, cy: WIDE.h / 2, r: 6 }),
        el("svg:text", { class: "label", x: 34, y: 17 }),
        el("svg:text", { class: "sub", x: 34, y: 31 }),
        el("svg:text", { class: "badge", x: WIDE.w - 10, y: 25, "text-anchor": "end" }));
    }
    return { g, look: "", title };
  }

  function paint(entry, item) {
    const { g, title } = entry;
    g.dataset.phase = item.phase;
    g.dataset.displayName = item.node?.displayName || item.label;
    g.dataset.type = item.type || "";
    g.dataset.kind = item.kind;
    toggle(g, "data-pending", item.pending);
    toggle(g, "data-suspended", item.suspended);
    toggle(g, "data-expandable", item.expandable);
    toggle(g, "aria-expanded", item.expandable || item.kind === "more" ? String(!!item.expanded) : null);
    if (item.id === selected) g.setAttribute("aria-current", "true");
    else g.removeAttribute("aria-current");
    g.classList.toggle("selected", item.id === selected);
    const phaseWord = item.pending ? "not started" : item.suspended ? "Suspended" : item.phase;
    const what = item.kind === "more" ? `${item.label} items, ${item.sub || item.phase}; press Enter to show them`
      : `${item.label}: ${phaseWord}${item.attempts ? `, ${item.attempts} attempts` : ""}`;
    g.setAttribute("aria-label", what);
    title.textContent = item.kind === "more" ? what
      : `${item.node?.name || item.name || item.label}\n${item.type || ""} · ${phaseWord}${item.sub ? ` · ${item.sub}` : ""}`;
    const label = g.querySelector(".label");
    if (item.kind === "small") {
      label.textContent = item.type === "StepGroup" ? "" : short(item.label, 16);
      return;
    }
    label.textContent = short(item.label);
    g.querySelector(".sub").textContent = short(item.sub || "", 26);
    g.querySelector(".badge").textContent = item.attempts > 1 ? `×${item.attempts}` : "";
  }

  function toggle(g, attribute, value) {
    if (value === null || value === undefined || value === false) g.removeAttribute(attribute);
    else g.setAttribute(attribute, value === true ? "true" : value);
  }

  // Draw `next` (a workflow); `force`: relayout even if nothing changed.
  function update(next, selectedId = selected, force = false) {
    const started = performance.now();
    workflow = next;
    const before = selected;
    selected = selectedId;
    const built = model(next, expanded);
    const ids = [...built.items.keys()];
    const nextSignature = `${ids.join(",")}#${built.edges.map((e) => e.join(">")).join(",")}`;
    const relayout = force || nextSignature !== signature || !current;
    let positions;
    if (relayout) {
      const placed = layout(built);
      current = { model: built, layout: placed };
      signature = nextSignature;
      positions = placed.positions;
      const [solid, dashed] = edgePaths(built.edges, positions);
      solidEdges.setAttribute("d", solid);
      dashedEdges.setAttribute("d", dashed);
      // elements kept by id; gone ones removed; the DOM order is the layout's (rank, x), so a
      // screen reader reads the graph top to bottom
      const order = [...ids].sort((a, b) => {
        const pa = positions.get(a);
        const pb = positions.get(b);
        return pa.y - pb.y || pa.x - pb.x;
      });
      const keep = new Set(ids);
      for (const [id, entry] of elements) {
        if (!keep.has(id)) {
          entry.g.remove();
          elements.delete(id);
        }
      }
      const fragment = document.createDocumentFragment();
      let previous = null;
      for (const id of order) {
        let entry = elements.get(id);
        if (!entry) {
          entry = makeNode(built.items.get(id));
          elements.set(id, entry);
        }
        const p = positions.get(id);
        const transform = `translate(${p.x.toFixed(1)},${p.y.toFixed(1)})`;
        if (entry.transform !== transform) {
          entry.g.setAttribute("transform", transform);
          entry.transform = transform;
        }
        fragment.append(entry.g);
        previous = entry;
      }
      void previous;
      layer.append(fragment);
    } else {
      current.model = built;
    }
    for (const [id, item] of built.items) {
      const entry = elements.get(id);
      const look = lookOf(item, selected);
      if (entry.look !== look || (before !== selected && (id === before || id === selected))) {
        paint(entry, item);
        entry.look = look;
      }
    }
    if (!elements.has(focusId)) {
      focusId = null;
      setFocusable(elements.has(selected) ? selected : ids[0]);
    }
    const real = ids.filter((id) => built.items.get(id).node).length;
    const pendingCount = ids.filter((id) => built.items.get(id).pending).length;
    count.textContent = `${real} node${real === 1 ? "" : "s"}${pendingCount ? `, ${pendingCount} not started` : ""}`;
    if (relayout && !touched) fit();
    const took = performance.now() - started;
    const record = (window.__graphDraws ||= []);
    record.push({ at: performance.now(), ms: took, nodes: ids.length, relayout });
    if (record.length > 200) record.shift();
    if (window.__graphDrawn === undefined && ids.length) window.__graphDrawn = performance.now();
    return current;
  }

  const resize = new ResizeObserver(() => (touched ? apply() : fit()));
  resize.observe(svg);

  return {
    element,
    update,
    expand,
    collapse,
    isExpanded: (id) => expanded.has(id),
    focusNode: moveFocus,
    // make `id` the node Tab reaches, and bring it into view (without focusing it)
    show: (id) => {
      setFocusable(id);
      reveal(id);
    },
    items: () => current?.model.items,
    destroy: () => resize.disconnect(),
  };
}
