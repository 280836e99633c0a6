// A small line chart in SVG, nothing else needed: axes with ticks, several series, a legend,
// the values under the pointer (or the arrow keys: the chart is focusable), the width of its
// container (redrawn when that changes), colours from the stylesheet (.chart .series-N, the
// --chart-N variables, dark theme included).
//
//   const chart = lineChart({ title: "loss", x: "epoch", y: "cross-entropy" });
//   chart.update([{ name: "job", points: [[1, 2.1], [2, 0.7]] }]);   // as often as needed
//   chart.stop();                                                   // when it goes away

import { el } from "./ui.js";

const HEIGHT = 190;
const MARGIN = { top: 10, right: 14, bottom: 30, left: 52 };

// About `count` round tick values between `low` and `high` (1, 2 or 5 times a power of ten).
export function ticks(low, high, count = 5) {
  if (!(high > low)) return [low];
  const raw = (high - low) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((s) => s >= raw) || raw;
  const found = [];
  for (let value = Math.ceil(low / step) * step; value <= high + step * 1e-9; value += step) {
    found.push(Number(value.toPrecision(12)));
  }
  return found;
}

// A number as an axis or a tooltip shows it: few digits, k and M for large ones.
export function short(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const size = Math.abs(value);
  if (size >= 1e6) return `${+(value / 1e6).toPrecision(3)}M`;
  if (size >= 1e4) return `${+(value / 1e3).toPrecision(3)}k`;
  if (size >= 100 || Number.isInteger(value)) return `${Math.round(value)}`;
  return `${+value.toPrecision(3)}`;
}

function extent(values, fallback) {
  const finite = values.filter((v) => Number.isFinite(v));
  return finite.length ? [Math.min(...finite), Math.max(...finite)] : fallback;
}

// options: title, x (axis name), y (axis name), yMin / yMax (fixed limits), format (value ->
// text for the tooltip), integerX (ticks on whole numbers: epochs), empty (what to say with no
// point yet).
export function lineChart(options = {}) {
  const format = options.format || short;
  const svg = el("svg", { class: "chart-svg", height: HEIGHT, role: "img" });
  const legend = el("ul", { class: "chart-legend" });
  const tip = el("div", { class: "chart-tip", hidden: true, "aria-hidden": "true" });
  const frame = el("div", { class: "chart-frame", tabindex: 0 }, svg, tip);
  const figure = el("figure", { class: "chart", dataset: { chart: options.title || "" } },
    el("figcaption", {}, options.title || ""), frame, legend);
  let series = [];
  let width = 0;
  let cursor = null; // the index in `xs` the tooltip shows
  let xs = [];
  let scaleX = () => 0;
  let scaleY = () => 0;
  let plotBox = null;

  function draw() {
    width = Math.max(200, Math.round(frame.clientWidth || 320));
    svg.setAttribute("width", width);
    svg.setAttribute("viewBox", `0 0 ${width} ${HEIGHT}`);
    svg.replaceChildren();
    const left = MARGIN.left;
    const right = width - MARGIN.right;
    const top = MARGIN.top;
    const bottom = HEIGHT - MARGIN.bottom;
    plotBox = { left, right, top, bottom };
    const all = series.flatMap((s) => s.points);
    xs = [...new Set(all.map(([x]) => x))].sort((a, b) => a - b);
    let [x0, x1] = extent(all.map(([x]) => x), [0, 1]);
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    let [y0, y1] = extent(all.map(([, y]) => y), [0, 1]);
    if (options.yMin !== undefined) y0 = Math.min(y0, options.yMin);
    if (options.yMax !== undefined) y1 = Math.max(y1, options.yMax);
    if (y0 === y1) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.1, y1 + Math.abs(y1 || 1) * 0.1];
    const pad = (y1 - y0) * 0.06;
    if (options.yMin === undefined) y0 -= pad;
    if (options.yMax === undefined) y1 += pad;
    scaleX = (x) => left + ((x - x0) / (x1 - x0)) * (right - left);
    scaleY = (y) => bottom - ((y - y0) / (y1 - y0)) * (bottom - top);

    const grid = el("svg:g", { class: "chart-gridlines" });
    const axes = el("svg:g", { class: "chart-axis" });
    for (const value of ticks(y0, y1, 4)) {
      const y = scaleY(value);
      grid.append(el("svg:line", { x1: left, x2: right, y1: y, y2: y }));
      axes.append(el("svg:text", { x: left - 6, y: y + 4, "text-anchor": "end" }, short(value)));
    }
    let xTicks = ticks(x0, x1, Math.max(2, Math.floor((right - left) / 70)));
    if (options.integerX) xTicks = [...new Set(xTicks.map(Math.round))].filter((v) => v >= x0 && v <= x1);
    for (const value of xTicks) {
      const x = scaleX(value);
      axes.append(el("svg:line", { x1: x, x2: x, y1: bottom, y2: bottom + 4 }));
      axes.append(el("svg:text", { x, y: bottom + 16, "text-anchor": "middle" }, short(value)));
    }
    axes.append(el("svg:line", { x1: left, x2: right, y1: bottom, y2: bottom }));
    axes.append(el("svg:line", { x1: left, x2: left, y1: top, y2: bottom }));
    if (options.x) {
      axes.append(el("svg:text", { class: "chart-label", x: right, y: HEIGHT - 2, "text-anchor": "end" }, options.x));
    }
    if (options.y) {
      axes.append(el("svg:text", { class: "chart-label", x: 0, y: 0, "text-anchor": "middle",
        transform: `translate(11 ${(top + bottom) / 2}) rotate(-90)` }, options.y));
    }
    svg.append(grid, axes);

    if (!all.length) {
      svg.append(el("svg:text", { class: "chart-empty", x: (left + right) / 2, y: (top + bottom) / 2,
        "text-anchor": "middle" }, options.empty || "no point yet"));
    }
    series.forEach((s, index) => {
      const group = el("svg:g", { class: `chart-series series-${s.color ?? index}`, dataset: { series: s.name } });
      const points = [...s.points].sort((a, b) => a[0] - b[0]);
      if (points.length > 1) {
        const d = points.map(([x, y], i) => `${i ? "L" : "M"}${scaleX(x).toFixed(1)},${scaleY(y).toFixed(1)}`).join("");
        group.append(el("svg:path", { d, class: "chart-line" }));
      }
      if (points.length <= 60) {
        for (const [x, y] of points) {
          group.append(el("svg:circle", { class: "chart-point", cx: scaleX(x), cy: scaleY(y), r: 2.6 }));
        }
      }
      svg.append(group);
    });
    svg.append(el("svg:line", { class: "chart-cursor", x1: 0, x2: 0, y1: top, y2: bottom, visibility: "hidden" }));
    const overlay = el("svg:rect", { class: "chart-overlay", x: left, y: top, width: right - left, height: bottom - top });
    svg.append(overlay);

    legend.replaceChildren(...series.map((s, index) => el("li", { class: `series-${s.color ?? index}` },
      el("span", { class: "swatch", "aria-hidden": "true" }), s.name)));
    const last = series.map((s) => s.points.length ? `${s.name} ${format(s.points.at(-1)[1])}` : null).filter(Boolean);
    svg.setAttribute("aria-label", `${options.title || "chart"}: ${last.join(", ") || options.empty || "no point yet"}`);
    frame.setAttribute("aria-label", `${options.title || "chart"}; arrow keys show each point's values`);
    if (cursor !== null) show(Math.min(cursor, xs.length - 1));
  }

  function show(index) {
    const line = svg.querySelector(".chart-cursor");
    if (index === null || index < 0 || !xs.length) {
      cursor = null;
      tip.hidden = true;
      line?.setAttribute("visibility", "hidden");
      return;
    }
    cursor = index;
    const x = xs[index];
    const px = scaleX(x);
    line.setAttribute("x1", px);
    line.setAttribute("x2", px);
    line.setAttribute("visibility", "visible");
    const rows = series.map((s, i) => {
      const point = s.points.find(([px2]) => px2 === x);
      return point ? el("div", { class: `series-${s.color ?? i}` },
        el("span", { class: "swatch" }), `${s.name}: `, el("b", {}, format(point[1]))) : null;
    }).filter(Boolean);
    tip.replaceChildren(el("div", { class: "chart-tip-x" }, `${options.x || "x"} ${short(x)}`), ...rows);
    tip.hidden = false;
    const onRight = px > width * 0.6;
    tip.style.left = onRight ? "" : `${px + 10}px`;
    tip.style.right = onRight ? `${width - px + 10}px` : "";
  }

  function nearest(clientX) {
    const box = svg.getBoundingClientRect();
    const x = clientX - box.left;
    let best = null;
    let distance = Infinity;
    xs.forEach((value, index) => {
      const d = Math.abs(scaleX(value) - x);
      if (d < distance) [best, distance] = [index, d];
    });
    return best;
  }

  svg.addEventListener("pointermove", (event) => {
    if (!plotBox || !xs.length) return;
    show(nearest(event.clientX));
  });
  svg.addEventListener("pointerleave", () => show(null));
  frame.addEventListener("keydown", (event) => {
    if (!xs.length) return;
    const moves = { ArrowRight: 1, ArrowLeft: -1, Home: -Infinity, End: Infinity };
    if (event.key === "Escape") return show(null);
    if (!(event.key in moves)) return;
    event.preventDefault();
    const from = cursor ?? (moves[event.key] > 0 ? -1 : xs.length);
    show(Math.max(0, Math.min(xs.length - 1, from + moves[event.key])));
  });
  frame.addEventListener("blur", () => show(null));

  const observer = new ResizeObserver(() => {
    if (Math.round(frame.clientWidth) !== width) draw();
  });
  observer.observe(frame);

  figure.update = (next) => {
    series = next.filter((s) => s && s.points);
    draw();
  };
  figure.stop = () => observer.disconnect();
  figure.update([]);
  return figure;
}

// Horizontal stacked bars, one a row: rows [{name, parts: {key: fraction}}], keys
// [{key, label}] in order; each part's colour from .bar-KEY.
export function stackedBars(rows, keys, caption) {
  const list = el("div", { class: "bars", role: "list" });
  for (const row of rows) {
    const bar = el("div", { class: "bar", role: "img",
      "aria-label": `${row.name}: ${keys.map(({ key, label }) => `${label} ${Math.round((row.parts[key] || 0) * 100)}%`).join(", ")}` });
    for (const { key, label } of keys) {
      const fraction = row.parts[key] || 0;
      if (fraction <= 0) continue;
      const part = el("span", { class: `bar-part bar-${key}`, title: `${label} ${(fraction * 100).toFixed(1)}%` },
        fraction >= 0.12 ? `${Math.round(fraction * 100)}%` : "");
      part.style.width = `${(fraction * 100).toFixed(2)}%`;
      bar.append(part);
    }
    list.append(el("div", { class: "bar-row", role: "listitem", dataset: { row: row.name } },
      el("span", { class: "bar-name" }, row.name), bar));
  }
  const legend = el("ul", { class: "chart-legend" }, ...keys.map(({ key, label }) =>
    el("li", { class: `bar-${key}` }, el("span", { class: "swatch", "aria-hidden": "true" }), label)));
  return el("figure", { class: "chart" }, caption ? el("figcaption", {}, caption) : null, list, legend);
}
