// The compare view, /compare?a=RUN&b=RUN: two training runs of the namespace side by side, as
// `sublimate report A B` compares them (GET /api/sublimate/v1/compare/NS?a=&b=): the settings
// that differ, the final figures with their differences, the curves on one chart each.

import { call, settings } from "./api.js";
import { lineChart, stackedBars } from "./chart.js";
import { el, link, phaseBadge, say, view } from "./ui.js";
// The training view (/workflows/NS/NAME/training) registers itself there; imported here so
// that it is registered whatever imports the page's entry makes.
import "./training.js";

const SPLIT = [{ key: "compute", label: "compute" }, { key: "comm", label: "communication" },
  { key: "data", label: "data" }];

function number(value, key) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (key.endsWith("ratio")) return `${(value * 100).toFixed(2)}%`;
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 100 ? value.toFixed(0) : value.toFixed(4);
}

function delta(figure) {
  if (figure.delta === null || figure.delta === undefined) return el("td", { class: "num muted" }, "–");
  const sign = figure.delta > 0 ? "+" : figure.delta < 0 ? "−" : "±";
  const size = Math.abs(figure.delta);
  const text = `${sign}${figure.key.endsWith("ratio") ? `${(size * 100).toFixed(2)} pt` : number(size, figure.key)}`;
  const ratio = figure.ratio && figure.delta !== 0 && !figure.key.endsWith("ratio")
    ? ` (${figure.ratio >= 1 ? "+" : "−"}${Math.abs((figure.ratio - 1) * 100).toFixed(1)}%)` : "";
  let judged = "same";
  if (figure.delta !== 0 && figure.better) {
    judged = (figure.delta > 0) === (figure.better === "higher") ? "better" : "worse";
  } else if (figure.delta !== 0) judged = "differs";
  return el("td", { class: `num delta delta-${judged}`, dataset: { delta: judged },
    title: figure.better ? `${figure.better} is better; B − A` : "B − A" }, text + ratio);
}

function runHead(run, label, which) {
  const href = `/workflows/${encodeURIComponent(settings.namespace)}/${encodeURIComponent(run.workflow)}`;
  return el("div", { class: `card compare-run run-${which}`, dataset: { run: run.workflow } },
    el("div", { class: "compare-tag" }, el("span", { class: `swatch series-${which === "a" ? 0 : 1}` }), which.toUpperCase()),
    el("h3", {}, link(href, run.workflow), " ", phaseBadge(run.phase)),
    el("p", { class: "muted small" }, label),
    el("p", { class: "small" }, link(`${href}/training`, "training view")));
}

async function workflows(namespace) {
  const listed = await call("GET", `/api/v1/workflows/${encodeURIComponent(namespace)}`);
  return (listed.items || [])
    .sort((a, b) => (b.metadata.creationTimestamp || "").localeCompare(a.metadata.creationTimestamp || ""));
}

view("/compare", async (root, params) => {
  const namespace = settings.namespace;
  const pick = (which, chosen, items) => el("label", { class: "compare-pick" }, `Run ${which.toUpperCase()} `,
    el("select", { name: which, "aria-label": `run ${which.toUpperCase()}` },
      el("option", { value: "" }, "— choose a run —"),
      items.map((w) => el("option", { value: w.metadata.name, selected: w.metadata.name === chosen },
        `${w.metadata.name} (${w.status?.phase || "Pending"})`))));
  const items = await workflows(namespace);
  const result = el("div", { class: "compare-result", "aria-live": "polite" });
  const form = el("form", { class: "toolbar compare-form" },
    pick("a", params.a, items), pick("b", params.b, items),
    el("button", { type: "submit", class: "primary" }, "Compare"),
    el("button", { type: "button", onclick: () => {
      const [a, b] = [form.elements.a.value, form.elements.b.value];
      form.elements.a.value = b;
      form.elements.b.value = a;
      form.requestSubmit();
    } }, "Swap"));
  root.append(el("div", { dataset: { view: "compare" } },
    el("h1", {}, "Compare runs"),
    el("p", { class: "muted" }, `Two training runs of namespace ${namespace}, as `, el("code", {}, "sublimate report A B"), " compares them."),
    form, result));
  // an address naming runs that are not in the list (another namespace's, removed): kept
  for (const which of ["a", "b"]) {
    const select = form.elements[which];
    if (params[which] && select.value !== params[which]) {
      select.append(el("option", { value: params[which], selected: true }, params[which]));
    }
  }
  const charts = [];
  const stopCharts = () => charts.splice(0).forEach((chart) => chart.stop());

  async function show(a, b) {
    stopCharts();
    if (!a || !b) {
      result.replaceChildren(el("p", { class: "muted" }, "Choose two runs."));
      return;
    }
    result.replaceChildren(el("p", { class: "muted" }, "Comparing…"));
    let answer;
    try {
      answer = await call("GET", `/api/sublimate/v1/compare/${encodeURIComponent(namespace)}`, undefined, { a, b });
    } catch (error) {
      result.replaceChildren(el("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    const [runA, runB] = answer.runs;
    const [labelA, labelB] = answer.labels;
    const settingsTable = answer.settings.length
      ? el("table", { class: "compare-settings" },
        el("thead", {}, el("tr", {}, el("th", {}, "setting"), el("th", {}, "A"), el("th", {}, "B"))),
        el("tbody", {}, answer.settings.map((s) => el("tr", { dataset: { setting: s.name } },
          el("td", {}, el("code", {}, s.name)), el("td", { class: "num" }, s.a ?? "–"), el("td", { class: "num" }, s.b ?? "–")))))
      : el("p", { class: "muted" }, "The same settings.");
    const figures = el("table", { class: "compare-figures" },
      el("thead", {}, el("tr", {}, el("th", {}, "figure"), el("th", {}, "A"), el("th", {}, "B"), el("th", {}, "B − A"))),
      el("tbody", {}, answer.figures.map((f) => el("tr", { dataset: { figure: f.key } },
        el("td", {}, f.label), el("td", { class: "num" }, number(f.a, f.key)),
        el("td", { class: "num" }, number(f.b, f.key)), delta(f)))));
    const curve = (key, run) => run.epochs.filter((p) => p[key] != null).map((p) => [p.epoch, p[key]]);
    const pair = (key) => [{ name: `A: ${labelA}`, points: curve(key, runA), color: 0 },
      { name: `B: ${labelB}`, points: curve(key, runB), color: 1 }];
    const loss = lineChart({ title: "Training loss", x: "epoch", y: "loss", integerX: true });
    const accuracy = lineChart({ title: "Test accuracy", x: "epoch", y: "accuracy", integerX: true, format: (v) => v.toFixed(4) });
    const throughput = lineChart({ title: "Throughput", x: "epoch", y: "samples/s", integerX: true, yMin: 0 });
    charts.push(loss, accuracy, throughput);
    const splits = [["a", runA], ["b", runB]].flatMap(([which, run]) =>
      Object.entries(run.time_split || {}).map(([label, parts]) => ({ name: `${which.toUpperCase()} ${label}`, parts })));
    result.replaceChildren(
      el("div", { class: "compare-runs" }, runHead(runA, labelA, "a"), runHead(runB, labelB, "b")),
      answer.shared ? el("p", { class: "muted" }, "Both: ", answer.shared) : null,
      el("div", { class: "compare-tables" },
        el("section", {}, el("h2", {}, "Settings that differ"), settingsTable),
        el("section", {}, el("h2", {}, "Final figures"), figures)),
      el("h2", {}, "Curves"),
      el("div", { class: "chart-grid" }, loss, accuracy, throughput),
      splits.length ? stackedBars(splits, SPLIT, "Where each process's step time went") : null);
    loss.update(pair("loss"));
    accuracy.update(pair("test_accuracy"));
    throughput.update(pair("samples_per_second"));
    if (runA.workflow === runB.workflow) say("A and B are the same run.");
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const [a, b] = [form.elements.a.value, form.elements.b.value];
    const query = new URLSearchParams({ a, b });
    history.replaceState(null, "", `/compare?${query}`);
    show(a, b);
  });
  await show(params.a, params.b);
  return stopCharts;
});
