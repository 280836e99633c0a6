// The compare view (not drawn yet).
import { el, view } from "./ui.js";

view("/compare", (root) => root.append(el("p", { class: "muted" }, "Compare: to come.")));
