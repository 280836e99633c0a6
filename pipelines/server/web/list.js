// The list view (not drawn yet).
import { el, view } from "./ui.js";

view("/", (root) => root.append(el("p", { class: "muted" }, "Workflows: to come.")));
view("/workflows", (root) => root.append(el("p", { class: "muted" }, "Workflows: to come.")));
