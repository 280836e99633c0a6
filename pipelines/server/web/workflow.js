// The workflow view (not drawn yet).
import { el, view } from "./ui.js";

view("/workflows/:namespace/:name", (root, { name }) => root.append(el("h1", {}, name)));
