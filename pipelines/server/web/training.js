// A train node's panel (not drawn yet): trainingPanel(workflow, node) returns an element, or
// null for a node that is not a train step.
export function trainingPanel(_workflow, _node) {
  return null;
}
