// A workflow's actions (not drawn yet): actionsBar(workflow) returns the toolbar the workflow
// view shows above its graph.
import { el } from "./ui.js";

export function actionsBar(workflow) {
  return el("div", { class: "toolbar", dataset: { actions: workflow.metadata.name } });
}
