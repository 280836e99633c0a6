// The page speaks only Argo Server's API (and sublimate's few additions under
// /api/sublimate/), as Argo's UI does. A token, when the server asks for one, is kept for the
// tab (sessionStorage) and sent as `Authorization: Bearer ...`; streams (watch, logs) are read
// with fetch, not EventSource, so that they carry it too.

const TOKEN_KEY = "sublimate-token";

export const settings = {
  namespace: document.querySelector('meta[name="sublimate-namespace"]').content,
  get token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  },
  set token(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

export class ApiError extends Error {
  // status: the HTTP status; code: the gRPC code (3 invalid, 5 not found, 16 unauthenticated)
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Called when the server wants a token (401): resolves with one to try, or rejects.
let askForToken = async () => {
  throw new ApiError(401, 16, "a token is required");
};
export function onTokenNeeded(ask) {
  askForToken = ask;
}

function headers(extra = {}) {
  const found = { ...extra };
  if (settings.token) found.Authorization = `Bearer ${settings.token}`;
  return found;
}

async function failure(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    // not JSON: said by status alone
  }
  return new ApiError(response.status, body.code ?? 0, body.message || response.statusText);
}

// One request of the API: its JSON answer, or an ApiError.
export async function call(method, path, body, query) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  for (;;) {
    const response = await fetch(url, {
      method,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      settings.token = await askForToken();
      continue;
    }
    if (!response.ok) throw await failure(response);
    return response.json();
  }
}

// The results of a streamed answer (server-sent events), as they come, until `signal` aborts
// it or the server ends it. Each is the event's `result`.
export async function* stream(path, query, signal) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  let response;
  for (;;) {
    response = await fetch(url, { headers: headers({ Accept: "text/event-stream" }), signal });
    if (response.status === 401) {
      settings.token = await askForToken();
      continue;
    }
    break;
  }
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      pending += value;
      let end;
      while ((end = pending.indexOf("\n\n")) >= 0) {
        const event = pending.slice(0, end);
        pending = pending.slice(end + 2);
        const data = event
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trim())
          .join("\n");
        if (!data) continue; // a heartbeat
        const parsed = JSON.parse(data);
        if (parsed.error) throw new ApiError(500, parsed.error.code, parsed.error.message);
        yield parsed.result;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// Workflows of a namespace as they change: `onEvent({type, object})` for each, first every
// one as ADDED. Returns a function that stops watching. A watch that breaks (the server
// restarted) is opened again after a pause, and says so through `onState`.
export function watchWorkflows(namespace, selectors, onEvent, onState = () => {}) {
  const controller = new AbortController();
  (async () => {
    while (!controller.signal.aborted) {
      try {
        onState("live");
        for await (const event of stream(`/api/v1/workflow-events/${namespace}`, {
          "listOptions.labelSelector": selectors.labelSelector,
          "listOptions.fieldSelector": selectors.fieldSelector,
        }, controller.signal)) {
          onEvent(event);
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        onState(`reconnecting (${error.message})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();
  return () => controller.abort();
}

export const workflowPath = (namespace, name) =>
  `/api/v1/workflows/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
