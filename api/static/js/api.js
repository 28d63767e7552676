// HTTP access to the /v1 API: the key lives in sessionStorage; a 401 sends the user to /login.

const KEY = "tuneyard.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    super(messageOf(status, body));
    this.status = status;
    this.body = body;
    this.errors = (body && body.errors) || [];
  }
}

function messageOf(status, body) {
  if (!body) return `HTTP ${status}`;
  if (body.error && body.error.message) return body.error.message;
  if (typeof body.detail === "string") return body.detail;
  if (body.detail && body.detail.message) return body.detail.message;
  if (body.message) return body.message;
  if (body.errors && body.errors.length) return body.errors.map((e) => `${e.loc}: ${e.msg}`).join("; ");
  return `HTTP ${status}`;
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
  try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
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
