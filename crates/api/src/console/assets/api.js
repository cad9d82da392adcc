// The console's only way to the server: weft's JSON APIs, with the API key
// (kept in sessionStorage, or localStorage when "remember" was ticked) sent
// as `Authorization: Bearer`. With authentication off, no key is needed.

const KEY = "weft.apiKey";

/** The key the user signed in with, or "" (none). */
export function apiKey() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "";
}

/** Keeps `key` for this tab, or on this browser when `remember`. */
export function setApiKey(key, remember) {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  if (key) (remember ? localStorage : sessionStorage).setItem(KEY, key);
}

/** An answer that was not 2xx: the server's `{error, description}`. */
export class ApiError extends Error {
  constructor(status, body) {
    const name = (body && body.error) || `HTTP ${status}`;
    const text = (body && (body.description || body.message)) || "";
    super(text ? `${name}: ${text}` : name);
    this.status = status;
    this.body = body;
  }
}

/**
 * Calls weft: `method` `path` with an optional JSON `body` and headers.
 * Answers `{status, headers, body}` (body parsed when JSON), or throws
 * ApiError for a non-2xx answer.
 */
export async function call(method, path, body, headers = {}) {
  const h = { ...headers };
  const key = apiKey();
  if (key) h["Authorization"] = `Bearer ${key}`;
  let payload;
  if (body !== undefined) {
    h["Content-Type"] = "application/json";
    payload = typeof body === "string" ? body : JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers: h, body: payload });
  } catch (e) {
    throw new ApiError(0, { error: "NetworkError", description: String(e.message || e) });
  }
  const type = resp.headers.get("content-type") || "";
  let parsed = null;
  if (resp.status !== 204) {
    const text = await resp.text();
    parsed = type.includes("json") && text ? safeJson(text) : text;
  }
  if (!resp.ok) {
    if (resp.status === 401) window.dispatchEvent(new CustomEvent("weft:unauthorized"));
    throw new ApiError(resp.status, typeof parsed === "object" ? parsed : { description: parsed });
  }
  return { status: resp.status, headers: resp.headers, body: parsed };
}

function safeJson(text) {
  try { return JSON.parse(text); } catch { return text; }
}

/** GET `path`, answering the parsed body. */
export async function get(path, headers) {
  return (await call("GET", path, undefined, headers)).body;
}

/** A query string from an object, leaving out empty values. */
export function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") p.set(k, v);
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

/**
 * Opens the live SSE stream with `params` (stream, devices, types, …).
 * EventSource cannot send headers: the key goes as `access_token`, which
 * weft accepts on the live stream only. `onEvent(name, data)` gets each
 * event. Answers the EventSource (close it when leaving the screen).
 */
export function live(params, onEvent) {
  const key = apiKey();
  const url = `/api/v1/live/sse${qs({ ...params, access_token: key || undefined })}`;
  const es = new EventSource(url);
  for (const name of ["data", "alarms", "entities", "error"]) {
    es.addEventListener(name, (e) => {
      let data = e.data;
      try { data = JSON.parse(e.data); } catch { /* as text */ }
      onEvent(name, data);
    });
  }
  return es;
}
