// HTTP access to the /v1 API: the key lives in sessionStorage; a 401 sends the user to /login.

const KEY = "tuneyard.apiKey";

// An error answer. The API sends `{"error": {"code", "message", "current_status"?}}`, or
// `{"errors": [{"loc", "msg", "fix"}]}` for a 422 (api/errors.py); a body that is not JSON
// (a proxy's error page) arrives here as `{"text": ...}`.
export class ApiError extends Error {
  constructor(status, body) {
    super(messageOf(status, body));
    this.status = status;
    this.body = body;
    this.code = body?.error?.code ?? null;
    this.currentStatus = body?.error?.current_status ?? null; // set on a 409 about a job's state
    this.errors = Array.isArray(body?.errors) ? body.errors : [];
  }
}

// One line for the user: the API's message, else the field errors, else the status.
export function messageOf(status, body) {
  if (body?.error?.message) return body.error.message;
  if (Array.isArray(body?.errors) && body.errors.length) {
    return body.errors.map((e) => `${e.loc}: ${e.msg}`).join("; ");
  }
  return body?.text ? `HTTP ${status}: ${body.text}` : `HTTP ${status}`;
}

export const apiKey = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

export function toLogin() {
  if (location.pathname === "/login") return; // several requests may fail at once: go once
  const next = location.pathname + location.search;
  history.pushState({}, "", `/login?next=${encodeURIComponent(next)}`);
  window.dispatchEvent(new PopStateEvent("popstate"));
}

export async function api(path, { method = "GET", body, query } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const headers = { Accept: "application/json" };
  const key = apiKey.get();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { text: text.slice(0, 300) }; }
  if (response.status === 401) {
    apiKey.clear();
    toLogin();
    throw new ApiError(401, data);
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// The records of a collection answer (`{"data": [...], ...}`).
export function itemsOf(body) {
  return (body && Array.isArray(body.data)) ? body.data : [];
}
