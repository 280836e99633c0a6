// What every view uses: `view()` to register the paths it draws (Argo UI's:
// /workflows/NAMESPACE/NAME), `el()` for the DOM (no framework), links, durations, phase
// badges, the status line; and the router. A view's render returns a function that stops what
// it started (its watch, its log stream) when the page moves on.


const views = [];

// Register `render(root, params)` for paths matching `pattern` ("/workflows/:namespace").
export function view(pattern, render) {
  const names = [];
  const regex = new RegExp(
    "^" + pattern.replace(/:(\w+)/g, (_, name) => (names.push(name), "([^/]+)")) + "/?$",
  );
  views.push({ regex, names, render });
}

// An element: el("a", {href: "/x", class: "link"}, "text", child...). A property that is a
// function is a listener ("onclick"); `null`/`false` children are left out.
export function el(tag, properties = {}, ...children) {
  const element = tag === "svg" || tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.replace("svg:", ""))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(properties || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (typeof value === "function") element.addEventListener(key.replace(/^on/, ""), value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

// A link inside the page: followed without reloading it.
export function link(href, ...children) {
  return el("a", { href, "data-link": true }, ...children);
}

export function navigate(href) {
  history.pushState(null, "", href);
  route();
}

// "1m 5s", "2h 3m": a duration as Argo's UI shows one.
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// Seconds between two of Argo's timestamps (the second missing: now).
export function elapsed(started, finished) {
  if (!started) return null;
  return ((finished ? Date.parse(finished) : Date.now()) - Date.parse(started)) / 1000;
}

// A phase as a coloured badge (its colour from the stylesheet: .phase-Succeeded, ...).
export function phaseBadge(phase) {
  const shown = phase || "Pending";
  return el("span", { class: `phase phase-${shown}`, dataset: { phase: shown } }, shown);
}

// A message in the page's status line (errors the user should see), cleared after a while.
export function say(text, kind = "info") {
  const line = document.getElementById("status-line");
  line.textContent = text;
  line.dataset.kind = kind;
  clearTimeout(say.timer);
  if (kind !== "error") say.timer = setTimeout(() => (line.textContent = ""), 6000);
}

let stopCurrent = () => {};

export async function route() {
  stopCurrent();
  stopCurrent = () => {};
  const root = document.getElementById("main");
  root.replaceChildren();
  const path = location.pathname;
  for (const { regex, names, render } of views) {
    const match = regex.exec(path);
    if (!match) continue;
    const params = Object.fromEntries(names.map((name, i) => [name, decodeURIComponent(match[i + 1])]));
    for (const [key, value] of new URLSearchParams(location.search)) params[key] ??= value;
    try {
      stopCurrent = (await render(root, params)) || (() => {});
    } catch (error) {
      root.append(el("p", { class: "error", role: "alert" }, error.message));
    }
    markCurrent(path);
    return;
  }
  root.append(el("p", { class: "error" }, `Nothing at ${path}.`));
}

function markCurrent(path) {
  if (path === "/") path = "/workflows"; // the list, by another name
  for (const a of document.querySelectorAll("header nav a")) {
    const current = path.startsWith(a.getAttribute("href")) ? "page" : null;
    if (current) a.setAttribute("aria-current", current);
    else a.removeAttribute("aria-current");
  }
}

// The token prompt: a dialog, shown when the server answers 401.
export function askForToken() {
  const dialog = document.getElementById("token-dialog");
  const input = dialog.querySelector("input");
  input.value = "";
  dialog.showModal();
  return new Promise((resolve, reject) => {
    dialog.onclose = () => {
      if (dialog.returnValue === "ok" && input.value.trim()) resolve(input.value.trim());
      else reject(new Error("a token is required: the server was started with --auth-token"));
    };
  });
}
