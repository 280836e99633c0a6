// A train step's panel: its run as it trains (loss, accuracy, throughput, where each node's
// step time goes, stragglers), the per-step fault-tolerance timeline when the run has one, and
// the report's plots once it ends. trainingPanel(workflow, node) returns the element, or null
// for a node that is not a sublimate train step; the element's `stop()` ends its polling. The
// page's own full view of it is /workflows/NAMESPACE/NAME/training(?node=ID).
//
// Everything comes from GET /api/sublimate/v1/workflows/NS/NAME/training (training_server.py),
// polled while the step runs.

import { call, settings, workflowPath } from "./api.js";
import { lineChart, short, stackedBars } from "./chart.js";
import { el, link, phaseBadge, view } from "./ui.js";

const TRAIN_MODULE = "sublimate.components.steps.train";
const POLL_MS = 1500;
const ENDED = new Set(["Succeeded", "Failed", "Error", "Skipped", "Omitted"]);
const SPLIT = [{ key: "compute", label: "compute" }, { key: "comm", label: "communication" },
  { key: "data", label: "data" }];

// Every template the workflow knows: its own, a template's it came from, the stored ones.
function templates(workflow) {
  const status = workflow.status || {};
  return [
    ...(workflow.spec?.templates || []),
    ...(status.storedWorkflowTemplateSpec?.templates || []),
    ...Object.values(status.storedTemplates || {}),
  ];
}

function runsTrain(template) {
  const body = template.container || template.script || {};
  return [...(body.command || []), ...(body.args || []), body.source || ""]
    .some((word) => String(word).includes(TRAIN_MODULE));
}

export function isTrainNode(workflow, node) {
  if (!node || !node.templateName || !["Pod", "Retry"].includes(node.type || "Pod")) return false;
  return templates(workflow).some((t) => t.name === node.templateName && runsTrain(t));
}

const trainingUrl = (namespace, name) =>
  `/api/sublimate/v1/workflows/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}/training`;

// A PNG of the API as a blob: URL (an <img src> would not carry the token).
async function imageUrl(path) {
  const response = await fetch(path, {
    headers: settings.token ? { Authorization: `Bearer ${settings.token}` } : {},
  });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return URL.createObjectURL(await response.blob());
}

const percent = (value) => (value === null || value === undefined ? "–" : `${(value * 100).toFixed(1)}%`);

function stat(label, value, key) {
  return el("div", { class: "stat", dataset: { stat: key } }, el("span", { class: "stat-label" }, label),
    el("span", { class: "stat-value" }, value));
}

// The lanes of a per-step run: a lane per node, a bar per process that ran on it over the
// steps it took part in (a replacement in its own colour), a cross where one was lost.
// Positions are percentages of the lane, so it fits any width.
function timeline(recovery) {
  const spans = recovery.timeline || [];
  const failures = recovery.failures || [];
  const nodes = [...new Set([...(recovery.nodes || []), ...spans.map((s) => s.node),
    ...failures.map((f) => f.node)])].sort((a, b) => a - b);
  const last = Math.max(1, ...spans.map((s) => s.to_step), ...failures.map((f) => f.step || 0));
  const at = (step) => `${((100 * step) / last).toFixed(3)}%`;
  const lanes = el("div", { class: "lanes", role: "list",
    "aria-label": `steps each node took part in, ${failures.length} lost` });
  for (const node of nodes) {
    const track = el("div", { class: "lane-track" });
    for (const span of spans.filter((s) => s.node === node)) {
      const what = `node${node}${span.replacement ? " (replacement)" : ""}: steps ${span.from_step}–${span.to_step}`;
      const bar = el("span", { class: `lane-span${span.replacement ? " replacement" : ""}`, title: what,
        dataset: { node, from: span.from_step, to: span.to_step } });
      bar.style.left = at(span.from_step);
      bar.style.width = `max(3px, ${at(span.to_step - span.from_step)})`;
      track.append(bar);
    }
    for (const failure of failures.filter((f) => f.node === node)) {
      const mark = el("span", { class: "lane-loss", dataset: { lost: failure.step ?? "" },
        title: `node${node} lost${failure.step != null ? ` after step ${failure.step}` : " in its start-up"}` }, "×");
      mark.style.left = at(failure.step ?? 0);
      track.append(mark);
    }
    const lost = failures.filter((f) => f.node === node).length;
    lanes.append(el("div", { class: "lane", role: "listitem", dataset: { lane: node },
      "aria-label": `node${node}: ${spans.filter((s) => s.node === node).map((s) => `steps ${s.from_step} to ${s.to_step}${s.replacement ? " (replacement)" : ""}`).join(", ") || "no step yet"}${lost ? `, lost ${lost} time(s)` : ""}` },
    el("span", { class: "lane-name" }, `node${node}`), track));
  }
  const axis = el("div", { class: "lane-axis", "aria-hidden": "true" });
  for (const value of [0, Math.round(last / 2), last]) {
    const tick = el("span", {}, value === last ? `step ${value}` : `${value}`);
    tick.style.left = at(value);
    axis.append(tick);
  }
  lanes.append(el("div", { class: "lane" }, el("span", { class: "lane-name" }), axis));
  const unit = recovery.unit || "step";
  const words = failures.map((f) => el("li", {},
    `node${f.node} lost ${f.step != null ? `after ${unit} ${f.step}` : "in its start-up"}`,
    f.steps_lost != null ? `, ${f.steps_lost} ${unit}(s) lost` : "",
    f.survivors_stalled_seconds != null ? `, the others went on ${f.survivors_stalled_seconds.toFixed(1)}s later` : "",
    f.replacement_trained_after_seconds != null ? `, replaced: trained again ${f.replacement_trained_after_seconds.toFixed(1)}s after starting` : ""));
  const committed = recovery.steps_attempted
    ? `${recovery.steps_committed} of ${recovery.steps_attempted} group-${unit}s committed (${percent(recovery.steps_committed / recovery.steps_attempted)})`
    : "";
  return el("section", { class: "training-block timeline", dataset: { timeline: recovery.live ? "live" : "final" } },
    el("h4", {}, "Fault tolerance ", el("span", { class: "muted" }, recovery.live ? "(so far)" : "")),
    el("p", { class: "muted small" }, `${failures.length} node(s) lost`, committed ? `; ${committed}` : "",
      recovery.job_restarts ? `; ${recovery.job_restarts} job restart(s)` : ""),
    lanes,
    el("ul", { class: "chart-legend" },
      el("li", { class: "span-first" }, el("span", { class: "swatch" }), "took part"),
      el("li", { class: "span-replacement" }, el("span", { class: "swatch" }), "replacement"),
      el("li", { class: "span-lost" }, el("span", { class: "swatch cross" }, "×"), "lost")),
    words.length ? el("ul", { class: "losses" }, words) : null);
}

function stragglers(answer) {
  const summary = answer.stragglers;
  const now = answer.stragglers_now || [];
  if (!summary && !now.length) {
    return el("p", { class: "muted small", dataset: { stragglers: "unknown" } }, "Stragglers: not judged by this run.");
  }
  const ranks = summary?.ranks || [];
  if (!ranks.length) {
    const checked = summary?.epochs_checked ?? 0;
    return el("p", { class: "small", dataset: { stragglers: "none" } },
      `Stragglers: none in ${checked} epoch${checked === 1 ? "" : "s"}.`);
  }
  return el("div", { class: "small", dataset: { stragglers: ranks.length } }, el("b", {}, "Stragglers"),
    el("ul", { class: "losses" }, ranks.map((r) => el("li", { class: "straggler" },
      el("b", {}, `${r.node} (rank ${r.rank})`),
      `: ${r.ratio_mean.toFixed(1)}× the median rank's work in ${r.epochs.length}/${summary.epochs_checked} epochs`,
      ` (max ${r.ratio_max.toFixed(1)}×), mostly ${r.cause}, +${(r.excess_seconds_per_step * 1000).toFixed(2)} ms/step`))));
}

// The panel for `node` of `workflow` (null when it is not a train step).
export function trainingPanel(workflow, node, { full = false } = {}) {
  if (!isTrainNode(workflow, node)) return null;
  const namespace = workflow.metadata.namespace;
  const name = workflow.metadata.name;
  const state = el("span", { class: "muted", role: "status" }, "waiting for the first epoch…");
  const stats = el("div", { class: "stats" });
  const loss = lineChart({ title: "Training loss", x: "epoch", y: "loss", integerX: true, empty: "after the first epoch" });
  const accuracy = lineChart({ title: "Test accuracy", x: "epoch", y: "accuracy", integerX: true, format: (v) => v.toFixed(4), empty: "after the first epoch" });
  const throughput = lineChart({ title: "Throughput", x: "epoch", y: "samples/s", integerX: true, yMin: 0, empty: "after the first epoch" });
  const comm = lineChart({ title: "Communication share of step time", x: "epoch", y: "%", integerX: true, yMin: 0, yMax: 100, format: (v) => `${v.toFixed(1)}%`, empty: "after the first epoch" });
  const charts = [loss, accuracy, throughput, comm];
  const split = el("div", { class: "split" });
  const straggling = el("div", { class: "stragglers", title: "" });
  const recovery = el("div");
  const plots = el("div");
  const notes = el("details", { class: "not-recorded small" });
  const fullLink = full ? null : link(`/workflows/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}/training?node=${encodeURIComponent(node.id)}`, "Full view");
  const panel = el("section", { class: `training${full ? " training-full" : ""}`, dataset: { training: node.id }, "aria-label": "Training" },
    el("div", { class: "training-head" }, el("h3", {}, "Training"), state, el("span", { class: "grow" }), fullLink),
    stats, el("div", { class: "chart-grid" }, ...charts), split, straggling, recovery, plots, notes);

  let stopped = false;
  let timer = null;
  let plotsShown = "";
  let plotUrls = [];

  function render(answer) {
    const epochs = answer.epochs || [];
    const last = epochs.at(-1) || {};
    const total = answer.epochs_total;
    panel.dataset.state = answer.state;
    panel.dataset.epochs = epochs.length;
    state.replaceChildren(
      answer.state === "waiting" ? "waiting for the first epoch…" :
        answer.state === "training" ? `training: epoch ${last.epoch ?? 0}${total ? ` of ${total}` : ""}` :
          "ended", answer.node ? " " : "", answer.node ? phaseBadge(answer.node.phase) : "");
    const participants = answer.processes && Object.values(answer.processes).map((r) => r.at(-1)?.participants).find((p) => p != null);
    stats.replaceChildren(
      stat("epoch", last.epoch != null ? `${last.epoch}${total ? ` / ${total}` : ""}` : "–", "epoch"),
      stat("step", answer.progress?.step ?? last.step ?? "–", "step"),
      stat("loss", last.loss != null ? last.loss.toFixed(4) : "–", "loss"),
      stat("test accuracy", answer.summary?.test?.accuracy != null ? answer.summary.test.accuracy.toFixed(4)
        : last.test_accuracy != null ? last.test_accuracy.toFixed(4) : "–", "accuracy"),
      stat("samples/s", last.samples_per_second != null ? short(last.samples_per_second) : "–", "throughput"),
      participants != null ? stat("nodes", participants, "participants") : null,
    );
    const processes = Object.entries(answer.processes || {});
    loss.update([{ name: "job", points: epochs.filter((p) => p.loss != null).map((p) => [p.epoch, p.loss]) }]);
    accuracy.update([{ name: "after each epoch", points: epochs.filter((p) => p.test_accuracy != null).map((p) => [p.epoch, p.test_accuracy]) }]);
    throughput.update([
      { name: "job", points: epochs.filter((p) => p.samples_per_second != null).map((p) => [p.epoch, p.samples_per_second]) },
      ...processes.map(([label, records], i) => ({ name: label, color: i + 1,
        points: records.filter((r) => r.local_samples_per_second != null).map((r) => [r.epoch, r.local_samples_per_second]) }))
        .filter((s) => s.points.length),
    ]);
    comm.update(processes.map(([label, records], i) => ({ name: label, color: i + 1,
      points: records.filter((r) => r.comm_seconds != null).map((r) => {
        const total = (r.data_seconds || 0) + (r.compute_seconds || 0) + (r.comm_seconds || 0);
        return [r.epoch, total > 0 ? (100 * r.comm_seconds) / total : 0];
      }) })));
    const rows = Object.entries(answer.time_split || {}).map(([label, parts]) => ({ name: label, parts }));
    split.replaceChildren(rows.length ? stackedBars(rows, SPLIT, "Where each process's step time went (whole run)") : "");
    straggling.replaceChildren(answer.state === "waiting" ? "" : stragglers(answer));
    straggling.className = answer.state === "waiting" ? "stragglers" : "stragglers training-block";
    const ft = answer.fault_tolerance;
    recovery.replaceChildren(ft && (ft.timeline?.length || ft.failures?.length) ? timeline(ft) : "");
    notes.replaceChildren(el("summary", {}, "Not recorded"),
      el("ul", {}, (answer.not_recorded || []).map((line) => el("li", {}, line))));
    showPlots(answer.plots || []);
  }

  async function showPlots(list) {
    const key = list.map((p) => p.url).join(" ");
    if (key === plotsShown) return;
    plotsShown = key;
    if (!list.length) {
      plots.replaceChildren();
      return;
    }
    const order = ["loss", "accuracy", "throughput", "time-split", "recovery"];
    const shown = list.filter((p) => p.name !== "overview")
      .sort((a, b) => (order.indexOf(a.name) + 99) % 99 - (order.indexOf(b.name) + 99) % 99);
    const grid = el("div", { class: "plot-grid" });
    plots.replaceChildren(el("section", { class: "training-block", dataset: { plots: shown.length } },
      el("h4", {}, "Report"), grid));
    for (const plot of shown) {
      const img = el("img", { alt: `report plot: ${plot.title}`, dataset: { plot: plot.name }, loading: "lazy" });
      const open = el("a", { href: "#", class: "plot-open" }, img);
      grid.append(el("figure", { class: "plot" }, open, el("figcaption", {}, plot.title)));
      try {
        const url = await imageUrl(plot.url);
        if (stopped) return URL.revokeObjectURL(url);
        plotUrls.push(url);
        img.src = url;
        open.href = url;
        open.target = "_blank";
        open.rel = "noopener";
      } catch (error) {
        img.replaceWith(el("span", { class: "error small" }, error.message));
      }
    }
  }

  async function poll() {
    if (stopped) return;
    let answer;
    try {
      answer = await call("GET", trainingUrl(namespace, name), undefined, { node: node.id });
    } catch (error) {
      if (stopped) return;
      state.replaceChildren(el("span", { class: "error" }, error.message));
      timer = setTimeout(poll, POLL_MS * 3);
      return;
    }
    if (stopped) return;
    render(answer);
    // The report's plots come from the evaluate step, after this one: watched until the
    // workflow ends.
    const done = ENDED.has(answer.phase) && (answer.plots.length || answer.state !== "training");
    if (!done) timer = setTimeout(poll, answer.state === "ended" ? POLL_MS * 2 : POLL_MS);
  }

  panel.stop = () => {
    stopped = true;
    clearTimeout(timer);
    charts.forEach((chart) => chart.stop());
    plotUrls.forEach((url) => URL.revokeObjectURL(url));
    plotUrls = [];
  };
  poll();
  return panel;
}

// The full view of a workflow's train step (the panel, with room to breathe); before the
// step starts, the workflow is looked at again until it does.
view("/workflows/:namespace/:name/training", async (root, { namespace, name, node: nodeId }) => {
  const back = `/workflows/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
  const badge = el("span");
  const body = el("div", { class: "training-body" }, el("p", { class: "muted" }, "Loading…"));
  root.append(el("div", { dataset: { view: "training" } },
    el("p", { class: "muted small crumbs" }, link(back, name), " / training"),
    el("h1", {}, name, " ", badge), body));
  let stopped = false;
  let panel = null;
  let timer = null;
  async function look() {
    const workflow = await call("GET", workflowPath(namespace, name));
    if (stopped) return;
    badge.replaceChildren(phaseBadge(workflow.status?.phase));
    const trains = Object.values(workflow.status?.nodes || {}).filter((n) => isTrainNode(workflow, n));
    const node = trains.find((n) => n.id === nodeId) ||
      trains.sort((a, b) => (a.type !== "Pod") - (b.type !== "Pod"))[0];
    if (node) {
      panel = trainingPanel(workflow, node, { full: true });
      body.replaceChildren(panel);
      return;
    }
    const ended = ENDED.has(workflow.status?.phase);
    body.replaceChildren(el("p", { class: "muted" }, !templates(workflow).some(runsTrain)
      ? "This workflow has no sublimate train step."
      : ended ? "Its train step never ran." : "Waiting for its train step to start…"));
    if (!ended && templates(workflow).some(runsTrain)) {
      timer = setTimeout(() => look().catch(failed), POLL_MS);
    }
  }
  function failed(error) {
    if (!stopped) body.replaceChildren(el("p", { class: "error", role: "alert" }, error.message));
  }
  await look();
  return () => {
    stopped = true;
    clearTimeout(timer);
    panel?.stop();
  };
});
