// Submit: the WorkflowTemplates of a namespace, and a form built from one's
// spec.arguments.parameters (label: the name, help: its description, an enum as a select, its
// value as the default; the entrypoint when the template has several). Submitting asks
// POST /api/v1/workflows/NS/submit, as `argo submit --from workflowtemplate/NAME` does; a
// refusal that names a parameter ("parameter 'epochs': ...", the runner's words and the
// server's for sublimate's pipelines' settings) is shown at that parameter's field.

import { call, settings } from "./api.js";
import { el, link, navigate, view } from "./ui.js";

const DESCRIPTION = "workflows.argoproj.io/description";
const TYPES = "sublimate.dev/parameter-types"; // sublimate's pipelines: each parameter's type
const PIPELINE = "sublimate.dev/pipeline";
const NAMED = /^parameter '([^']+)'(:\s*)?([\s\S]*)$/;

view("/workflow-templates", (root) => renderTemplates(root, settings.namespace));
view("/workflow-templates/:namespace", (root, { namespace }) => renderTemplates(root, namespace));
view("/workflow-templates/:namespace/:name", renderForm);

const templatePath = (namespace, name) =>
  `/api/v1/workflow-templates/${encodeURIComponent(namespace)}${name ? `/${encodeURIComponent(name)}` : ""}`;

async function renderTemplates(root, namespace) {
  const section = el("section", { class: "submit-view", dataset: { view: "templates" } },
    el("div", { class: "list-head" }, el("h1", {}, "Submit a workflow"),
      el("span", { class: "muted" }, "from a WorkflowTemplate in namespace ", el("b", {}, namespace))));
  root.append(section);
  const list = await call("GET", templatePath(namespace));
  const items = (list.items || []).sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  if (!items.length) {
    section.append(el("p", { class: "muted list-empty" }, "No WorkflowTemplates in this namespace. ",
      "Install sublimate's pipelines with ", el("code", {}, "sublimate install --argo-server URL"),
      ", or create one through the API."));
    return;
  }
  section.append(el("ul", { class: "template-list" }, ...items.map((template) => {
    const { name, labels = {}, annotations = {} } = template.metadata;
    const parameters = template.spec?.arguments?.parameters || [];
    return el("li", { dataset: { template: name } },
      el("div", { class: "template-title" },
        link(`/workflow-templates/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`, name),
        labels[PIPELINE] ? el("span", { class: "chip" }, `pipeline ${labels[PIPELINE]}`) : null),
      annotations[DESCRIPTION] ? el("p", { class: "muted template-description" },
        firstSentence(annotations[DESCRIPTION])) : null,
      el("p", { class: "muted template-meta" },
        parameters.length === 1 ? "1 parameter" : `${parameters.length} parameters`));
  })));
}

async function renderForm(root, { namespace, name }) {
  const section = el("section", { class: "submit-view", dataset: { view: "submit" } });
  root.append(section);
  const template = await call("GET", templatePath(namespace, name));
  const spec = template.spec || {};
  const annotations = template.metadata.annotations || {};
  const types = parseTypes(annotations[TYPES]);
  const parameters = spec.arguments?.parameters || [];

  const fields = new Map(); // name -> {input, error, parameter}
  const formError = el("div", { class: "form-error", role: "alert", hidden: true });
  const submit = el("button", { type: "submit", class: "primary" }, "Submit");
  const entrypoints = (spec.templates || []).map((t) => t.name);
  let entrypoint = null;
  if (entrypoints.length > 1) {
    entrypoint = el("select", { name: "entrypoint", id: "field-entrypoint" },
      ...entrypoints.map((option) => el("option", { value: option, selected: option === spec.entrypoint },
        option)));
  }

  const form = el("form", { class: "submit-form", novalidate: true, onsubmit: (event) => {
    event.preventDefault();
    send();
  } },
  entrypoint ? el("div", { class: "field field-entrypoint" },
    el("label", { for: "field-entrypoint" }, "Entrypoint"), entrypoint,
    el("div", { class: "help" }, "The template the workflow starts from.")) : null,
  parameters.length
    ? el("fieldset", { class: "parameters" }, el("legend", {}, "Parameters"),
      el("div", { class: "field-grid" }, ...parameters.map((parameter) => {
        const field = parameterField(parameter, types[parameter.name]);
        fields.set(parameter.name, { ...field, parameter });
        return field.element;
      })))
    : el("p", { class: "muted" }, "This template takes no parameters."),
  formError,
  el("div", { class: "form-actions" }, submit,
    link(`/workflow-templates/${encodeURIComponent(namespace)}`, "Cancel")));

  section.append(
    el("nav", { class: "crumbs", "aria-label": "Breadcrumb" },
      link(`/workflow-templates/${encodeURIComponent(namespace)}`, "Templates"), " / ",
      el("span", {}, name)),
    el("div", { class: "list-head" }, el("h1", {}, name),
      template.metadata.labels?.[PIPELINE]
        ? el("span", { class: "chip" }, `pipeline ${template.metadata.labels[PIPELINE]}`) : null),
    annotations[DESCRIPTION] ? el("p", { class: "muted template-description" }, annotations[DESCRIPTION]) : null,
    form);
  (fields.values().next().value?.input || submit).focus({ preventScroll: true });

  function clearErrors() {
    formError.hidden = true;
    formError.textContent = "";
    for (const { input, error } of fields.values()) {
      input.removeAttribute("aria-invalid");
      error.textContent = "";
      error.hidden = true;
    }
  }

  async function send() {
    clearErrors();
    // what differs from a default, and what has none: the arguments the run shows
    const given = [];
    for (const [key, { input, parameter }] of fields) {
      const byDefault = parameter.value ?? parameter.default;
      if (byDefault === undefined || byDefault === null || String(byDefault) !== input.value) {
        if (input.value !== "" || (byDefault !== undefined && byDefault !== null)) given.push(`${key}=${input.value}`);
      }
    }
    const submitOptions = { parameters: given };
    if (entrypoint && entrypoint.value !== spec.entrypoint) submitOptions.entryPoint = entrypoint.value;
    submit.disabled = true;
    submit.textContent = "Submitting…";
    try {
      const workflow = await call("POST", `/api/v1/workflows/${encodeURIComponent(namespace)}/submit`, {
        namespace, resourceKind: "WorkflowTemplate", resourceName: name, submitOptions,
      });
      navigate(`/workflows/${encodeURIComponent(workflow.metadata.namespace || namespace)}/${
        encodeURIComponent(workflow.metadata.name)}`);
    } catch (error) {
      submit.disabled = false;
      submit.textContent = "Submit";
      showError(error.message);
    }
  }

  function showError(message) {
    const named = NAMED.exec(message || "");
    const field = named && fields.get(named[1]);
    if (field) {
      field.input.setAttribute("aria-invalid", "true");
      // "parameter 'epochs': 'x' is not an integer" says "'x' is not an integer" at epochs
      field.error.textContent = named[2] && named[3] ? named[3] : message;
      field.error.hidden = false;
      field.input.focus();
      return;
    }
    formError.textContent = message || "the server refused the workflow";
    formError.hidden = false;
    formError.scrollIntoView({ block: "nearest" });
  }
}

// One parameter's field: a select for an enum, else a text input (checked by the server:
// its refusal says why at the field).
function parameterField(parameter, type = {}) {
  const id = `parameter-${parameter.name}`;
  const byDefault = parameter.value ?? parameter.default;
  const value = byDefault === undefined || byDefault === null ? "" : String(byDefault);
  const errorId = `${id}-error`;
  const helpId = `${id}-help`;
  let input;
  if (parameter.enum?.length) {
    const choices = parameter.enum.map(String);
    if (!choices.includes(value)) choices.unshift(value);
    input = el("select", { id, name: id,
      "aria-describedby": parameter.description ? `${helpId} ${errorId}` : errorId },
      ...choices.map((choice) => el("option", { value: choice, selected: choice === value }, choice)));
  } else {
    const numeric = type.type === "integer" || type.type === "number";
    input = el("input", {
      id, name: id, value, "aria-describedby": parameter.description ? `${helpId} ${errorId}` : errorId, autocomplete: "off",
      spellcheck: "false", inputmode: numeric ? (type.type === "integer" ? "numeric" : "decimal") : null,
      required: byDefault === undefined || byDefault === null,
    });
  }
  const hints = [];
  if (type.type && type.type !== "string") hints.push(type.type);
  if (type.minimum !== undefined) hints.push(`≥ ${type.minimum}`);
  if (type.maximum !== undefined) hints.push(`≤ ${type.maximum}`);
  const error = el("div", { class: "field-error", id: errorId, dataset: { for: parameter.name }, hidden: true });
  const element = el("div", { class: "field", dataset: { parameter: parameter.name } },
    el("label", { for: id },
      el("span", { class: "mono field-name" }, parameter.name),
      hints.length ? el("span", { class: "field-type muted" }, hints.join(" ")) : null,
      input.required ? el("span", { class: "field-type muted" }, "required") : null),
    input, error,
    parameter.description
      ? el("div", { class: "help", id: helpId, title: parameter.description }, parameter.description)
      : null);
  return { element, input, error };
}

function parseTypes(text) {
  try {
    const types = JSON.parse(text || "{}");
    return types && typeof types === "object" ? types : {};
  } catch {
    return {};
  }
}

function firstSentence(text) {
  const end = text.search(/\.\s/);
  return end > 0 && end < 200 ? text.slice(0, end + 1) : text.slice(0, 200);
}
