// The page's entry: the views (each registers its paths with ui.view), the links and the
// back button, the token prompt; then the first route.

import { onTokenNeeded, settings } from "./api.js";
import "./compare.js";
import "./list.js";
import "./submit.js";
import "./training.js";
import { askForToken, navigate, route } from "./ui.js";
import "./workflow.js";

document.addEventListener("click", (event) => {
  const a = event.target.closest("a[data-link]");
  if (!a || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", route);
onTokenNeeded(askForToken);
document.getElementById("namespace").textContent = settings.namespace;
route();
