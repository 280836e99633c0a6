// The submit view (not drawn yet).
import { el, view } from "./ui.js";

view("/workflow-templates", (root) => root.append(el("p", { class: "muted" }, "Submit: to come.")));
