// The node panel: what one node of a workflow did (its facts, inputs, outputs, artifacts to
// download), its pod's logs (followed while it runs) and, for a train step, its training
// panel. `show(workflow, id, item)` is called on each update of the workflow: the facts are
// drawn again when the node changed; the logs and the training panel only when another node
// is chosen.

import { settings, stream, workflowPath } from "./api.js";
import { trainingPanel } from "./training.js";
import { duration, el, elapsed, phaseBadge, say } from "./ui.js";

const DONE = new Set(["Succeeded", "Failed", "Error", "Skipped", "Omitted"]);
const MAX_LOG_LINES = 5000; // lines kept on the page; older ones are dropped, saying so

// Argo's pod name for a node (workflow/util/pod_name.go, v2): the workflow's for its root,
// else <workflow>-<template>-<fnv32a(node name)>; as the server names pods in its log stream.
export function podName(workflowName, node) {
  if (node.name === workflowName) return workflowName;
  const template = (node.templateName || "").split(".").pop();
  const prefix = template ? `${workflowName}-${template}` : workflowName;
  return `${prefix.slice(0, 242)}-${fnv32a(node.name)}`;
}

function fnv32a(text) {
  let hash = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(text)) {
    hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  }
  return hash >>> 0;
}

export function artifactHref(namespace, workflowName, nodeId, artifact) {
  return `/artifact-files/${encodeURIComponent(namespace)}/workflows/${encodeURIComponent(workflowName)}/${
    encodeURIComponent(nodeId)}/outputs/${encodeURIComponent(artifact)}`;
}

function time(stamp) {
  if (!stamp) return "";
  const date = new Date(stamp);
  return Number.isNaN(date.getTime()) ? stamp : date.toLocaleString();
}

// The pod whose logs a node shows, and the container: a Pod's own; a Retry's last attempt's;
// a containerSet's Container node's, in its pod.
function logSource(workflow, node) {
  const nodes = workflow.status?.nodes || {};
  if (!node) return null;
  if (node.type === "Pod") return { pod: node, container: "main", node };
  if (node.type === "Retry") {
    const last = (node.children || []).map((id) => nodes[id]).filter(Boolean).pop();
    return last ? logSource(workflow, last) : null;
  }
  if (node.type === "Container") {
    const pod = Object.values(nodes).find((other) => (other.children || []).includes(node.id));
    return pod ? { pod, container: node.displayName || node.name.split(".").pop(), node } : null;
  }
  return null;
}

export function createNodePanel({ namespace, name, onSelect, onExpand, onCollapse, isExpanded }) {
  const body = el("div", { class: "node-body" });
  const element = el("aside", { class: "card node-panel", "aria-label": "Node", id: "node-panel" }, body);
  let shownId;
  let factsKey = "";
  let facts = null; // the element with the node's facts
  let logs = null; // {controller, pre, key}
  let training = null;
  let empty = true;

  function stopLogs() {
    logs?.controller.abort();
    logs = null;
  }

  function stopTraining() {
    if (training && typeof training.stop === "function") training.stop();
    training = null;
  }

  function clear() {
    stopLogs();
    stopTraining();
    body.replaceChildren();
    facts = null;
    factsKey = "";
  }

  function placeholder() {
    clear();
    empty = true;
    body.append(
      el("h2", {}, "Nodes"),
      el("p", { class: "muted" }, "Choose a node in the graph to see what it did, its outputs and its logs."),
      el("p", { class: "muted node-keys" }, el("kbd", {}, "Tab"), " reaches the graph, ",
        el("kbd", {}, "←"), el("kbd", {}, "↑"), el("kbd", {}, "↓"), el("kbd", {}, "→"), " move between nodes, ",
        el("kbd", {}, "Enter"), " opens one; drag to pan, the wheel zooms."));
  }

  function show(workflow, id, item) {
    const node = id ? workflow.status?.nodes?.[id] : null;
    if (!id || (!node && !item)) {
      if (!empty || shownId !== undefined) {
        shownId = undefined;
        placeholder();
      }
      return;
    }
    if (id !== shownId) {
      clear();
      empty = false;
      shownId = id;
      facts = el("div", { class: "node-facts" });
      body.append(facts);
      startLogs(workflow, node);
      const panel = node ? trainingPanel(workflow, node) : null;
      if (panel) {
        training = panel;
        body.append(el("section", { class: "node-training" }, panel));
      }
    }
    const key = JSON.stringify([node, item?.pending, item?.expanded, workflow.status?.phase]);
    if (key !== factsKey) {
      factsKey = key;
      facts.replaceChildren(...describe(workflow, node, item));
    }
    const source = node ? logSource(workflow, node) : null;
    if (source && !logs) startLogs(workflow, node);
    else if (source && logs && logs.source.pod.id !== source.pod.id) restartLogs(workflow, source);
  }

  function describe(workflow, node, item) {
    if (!node) {
      return [
        el("div", { class: "node-title" }, el("h2", {}, item.label), phaseBadge("Pending")),
        el("p", { class: "muted" }, "Not started yet: this task of the spec has no node so far."),
        el("dl", { class: "facts" },
          el("dt", {}, "Name"), el("dd", { class: "mono" }, item.name || item.label),
          item.sub ? [el("dt", {}, "Template"), el("dd", { class: "mono" }, item.sub)] : null),
      ];
    }
    const phase = node.type === "Suspend" && node.phase === "Running" ? "Suspended" : node.phase;
    const rows = [];
    const fact = (label, value, mono = false) => {
      if (value === undefined || value === null || value === "") return;
      rows.push(el("dt", {}, label), el("dd", mono ? { class: "mono" } : {}, value));
    };
    fact("Type", node.type);
    fact("Template", node.templateName || node.templateRef?.template, true);
    fact("Name", node.name, true);
    fact("Id", node.id, true);
    if (node.type === "Pod") fact("Pod", podName(workflow.metadata.name, node), true);
    fact("Started", time(node.startedAt));
    fact("Finished", time(node.finishedAt));
    if (node.startedAt) {
      const took = duration(elapsed(node.startedAt, node.finishedAt));
      rows.push(el("dt", {}, "Duration"),
        el("dd", { dataset: node.finishedAt ? {} : { tickFrom: node.startedAt } }, took));
    }
    fact("Exit code", node.outputs?.exitCode, true);
    if (node.memoizationStatus) {
      fact("Memoized", `${node.memoizationStatus.hit ? "hit" : "miss"} (${node.memoizationStatus.cacheName || "cache"}: ${node.memoizationStatus.key || ""})`);
    }
    fact("Pod IP", node.podIP, true);
    const parts = [
      el("div", { class: "node-title" }, el("h2", {}, node.displayName || node.name), phaseBadge(phase)),
      node.message ? el("p", { class: `node-message${DONE.has(node.phase) && node.phase !== "Succeeded" ? " error" : ""}` }, node.message) : null,
      el("dl", { class: "facts" }, ...rows),
    ];
    const groupTools = groupActions(workflow, node, item);
    if (groupTools) parts.push(groupTools);
    parts.push(...inputs(node), ...outputs(workflow, node));
    return parts.filter(Boolean);
  }

  // A Retry's attempts and a loop's items: opened in the graph, or chosen from here.
  function groupActions(workflow, node, item) {
    const nodes = workflow.status?.nodes || {};
    if (node.type !== "Retry" && node.type !== "TaskGroup") return null;
    const kids = (node.children || []).map((kid) => nodes[kid]).filter(Boolean);
    if (!kids.length) return null;
    const open = isExpanded(node.id);
    const word = node.type === "Retry" ? "attempts" : "items";
    const canToggle = node.type === "Retry" || item?.expandable || open;
    const list = el("ol", { class: "node-kids" }, ...kids.slice(0, 200).map((kid) => el("li", {},
      el("button", { type: "button", class: "linkish", onclick: () => onSelect(kid.id) },
        kid.displayName || kid.name), " ", phaseBadge(kid.phase))));
    return el("section", { class: "node-group" },
      el("h3", {}, `${kids.length} ${word}`),
      canToggle ? el("button", { type: "button", "aria-expanded": String(open),
        onclick: () => (open ? onCollapse(node.id) : onExpand(node.id)) },
      open ? `Collapse the ${word} in the graph` : `Show every one of the ${word} in the graph`) : null,
      list,
      kids.length > 200 ? el("p", { class: "muted" }, `and ${kids.length - 200} more`) : null);
  }

  function inputs(node) {
    const parameters = node.inputs?.parameters || [];
    const artifacts = node.inputs?.artifacts || [];
    if (!parameters.length && !artifacts.length) return [];
    return [el("h3", {}, "Inputs"), table(["Parameter", "Value"],
      parameters.map((p) => [p.name, p.value ?? p.default ?? ""])),
    artifacts.length ? el("p", { class: "muted" }, `Artifacts: ${artifacts.map((a) => a.name).join(", ")}`) : null];
  }

  function outputs(workflow, node) {
    const out = node.outputs || {};
    const found = [];
    const parameters = out.parameters || [];
    const hasResult = out.result !== undefined && out.result !== null && out.result !== "";
    if (parameters.length || hasResult) {
      found.push(el("h3", {}, "Outputs"));
      if (parameters.length) found.push(table(["Parameter", "Value"], parameters.map((p) => [p.name, p.value ?? ""])));
      if (hasResult) {
        found.push(el("div", { class: "node-result" }, el("span", { class: "muted" }, "Result"),
          el("pre", { class: "logs result" }, out.result)));
      }
    }
    const artifacts = out.artifacts || [];
    if (artifacts.length) {
      found.push(el("h3", {}, "Artifacts"), el("ul", { class: "node-artifacts", "aria-label": "Artifacts" }, ...artifacts.map((artifact) => {
        const href = artifactHref(namespace, name, node.id, artifact.name);
        return el("li", {}, el("a", {
          href, download: true, dataset: { artifact: artifact.name }, title: `Download the artifact ${artifact.name}`,
          onclick: (event) => download(event, href, artifact.name),
        }, el("span", { "aria-hidden": "true" }, "⤓ "), artifact.name));
      })));
    }
    return found;
  }

  function table(headers, rows) {
    return el("table", { class: "node-table" },
      el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows.map((row) => el("tr", {}, ...row.map((cell, i) => el("td", i ? { class: "mono" } : {}, String(cell)))))));
  }

  // --- logs

  function startLogs(workflow, node) {
    const source = logSource(workflow, node);
    if (!source) return;
    const pre = el("pre", { class: "logs", id: "node-logs", tabindex: "0", "aria-label": "Logs", "aria-live": "off" });
    const state = el("span", { class: "muted logs-state" });
    body.append(el("section", { class: "node-logs" },
      el("div", { class: "logs-head" }, el("h3", {}, source.container === "main" ? "Logs" : `Logs of ${source.container}`), state),
      pre));
    logs = { pre, state, controller: new AbortController(), source };
    readLogs(workflow, source);
  }

  // Another pod to show (a Retry's new attempt): its lines instead.
  function restartLogs(workflow, source) {
    logs.controller.abort();
    logs.controller = new AbortController();
    logs.source = source;
    logs.pre.replaceChildren();
    readLogs(workflow, source);
  }

  async function readLogs(workflow, source) {
    const mine = logs;
    const follow = !DONE.has(workflow.status?.phase) && !DONE.has(source.pod.phase);
    const { pre, state, controller } = mine;
    state.textContent = follow ? "following" : "";
    state.dataset.state = follow ? "following" : "done";
    let lines = 0;
    let dropped = 0;
    let queued = [];
    let frame = 0;
    const flush = () => {
      frame = 0;
      if (!queued.length) return;
      const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
      pre.append(document.createTextNode(queued.join("")));
      queued = [];
      while (lines > MAX_LOG_LINES && pre.firstChild) {
        const first = pre.firstChild;
        const count = (first.textContent.match(/\n/g) || []).length;
        if (first.classList?.contains("dropped")) break;
        first.remove();
        lines -= count;
        dropped += count;
      }
      if (dropped) {
        let note = pre.querySelector(".dropped");
        if (!note) pre.prepend((note = el("span", { class: "dropped muted" })));
        note.textContent = `… ${dropped} earlier lines not shown\n`;
      }
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    };
    try {
      for await (const entry of stream(`${workflowPath(namespace, name)}/log`, {
        podName: podName(name, source.pod),
        "logOptions.container": source.container,
        "logOptions.follow": follow ? "true" : "",
      }, controller.signal)) {
        if (!entry || entry.content === undefined) continue;
        queued.push(`${entry.content}\n`);
        lines++;
        if (!frame) frame = requestAnimationFrame(flush);
      }
      flush();
      if (logs === mine && !controller.signal.aborted) {
        state.textContent = "";
        state.dataset.state = "done";
        if (!lines && !pre.textContent) pre.append(el("span", { class: "muted" }, "No lines."));
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      state.textContent = `the log stream stopped: ${error.message}`;
      state.dataset.state = "error";
    }
  }

  // A download that carries the token (a plain link cannot send it): fetched, then saved.
  async function download(event, href, artifact) {
    if (!settings.token) return; // the link itself works
    event.preventDefault();
    try {
      const response = await fetch(href, { headers: { Authorization: `Bearer ${settings.token}` } });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      const blob = await response.blob();
      const disposition = response.headers.get("Content-Disposition") || "";
      const file = /filename="([^"]+)"/.exec(disposition)?.[1] || artifact;
      const url = URL.createObjectURL(blob);
      const a = el("a", { href: url, download: file, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      say(`download of ${artifact} failed: ${error.message}`, "error");
    }
  }

  placeholder();
  return {
    element,
    show,
    destroy: clear,
    get shownId() {
      return shownId;
    },
  };
}
