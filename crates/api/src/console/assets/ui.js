// Small DOM helpers the screens share: element building, tables, paging,
// errors shown where they happen, times and values.

/** Builds an element: `h("a", {href: "#"}, "text", child…)`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** An error box with the server's message (empty when `err` is null). */
export function errorBox(err) {
  if (!err) return h("div", { class: "error", role: "alert", hidden: true });
  return h("div", { class: "error", role: "alert" }, err.message || String(err));
}

/** Shows `err` in `slot` (an element made by errorBox), or hides it. */
export function showError(slot, err) {
  if (!err) { slot.hidden = true; slot.textContent = ""; return; }
  slot.hidden = false;
  slot.textContent = err.message || String(err);
}

/** A labelled input. */
export function field(label, attrs = {}) {
  const input = h(attrs.rows ? "textarea" : "input", attrs);
  return { label: h("label", {}, label, input), input };
}

/** A table: `columns` as [{title, cell(row) → node|text, opt}], `rows`. */
export function table(columns, rows, empty = "Nothing here.") {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("div", { class: "scroll" },
    h("table", {},
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.opt ? "opt" : null }, c.title)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.opt ? "opt" : null }, c.cell(r))))))));
}

/**
 * Previous/next controls for offset paging. `total` may be null
 * (unknown); `hasMore` then says whether a next page exists.
 */
export function pager({ offset, limit, shown, total, hasMore, go, label = "items" }) {
  const last = offset + shown;
  const of = total === null || total === undefined ? "" : ` of ${total}`;
  const more = total === null || total === undefined ? hasMore : last < total;
  return h("div", { class: "pager", role: "navigation", "aria-label": "Pages" },
    h("button", { type: "button", "data-page": "prev", disabled: offset === 0, onclick: () => go(Math.max(0, offset - limit)) }, "‹ Previous"),
    h("span", { class: "muted", "aria-live": "polite", "data-range": "" }, shown ? `${label} ${offset + 1}–${last}${of}` : `no ${label}${of}`),
    h("button", { type: "button", "data-page": "next", disabled: !more, onclick: () => go(offset + limit) }, "Next ›"));
}

/** Epoch ms or ISO text as a local date-time; "—" when absent. */
export function time(t) {
  if (t === null || t === undefined || t === "") return "—";
  const d = new Date(t);
  return isNaN(d) ? String(t) : d.toLocaleString();
}

/** "3 min ago" for an epoch ms. */
export function ago(ms) {
  if (!ms) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 60) return `${Math.max(s, 0)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** A JSON view. */
export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

/** A measure's numeric value and unit: 37 or {"celsius": 37}. */
export function measureValue(m) {
  if (typeof m === "number") return { value: m, unit: "" };
  if (m && typeof m === "object" && !Array.isArray(m)) {
    const keys = Object.keys(m);
    if (keys.length === 1 && typeof m[keys[0]] === "number") return { value: m[keys[0]], unit: keys[0] };
  }
  return { value: null, unit: "" };
}

/** Text of any measure value. */
export function show(v) {
  if (v === null || v === undefined) return "—";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

/** A heading for a screen. */
export function title(text) {
  document.title = `${text} · weft`;
  return h("h1", {}, text);
}

/** Decodes hex ("01 75 5c", "0x0175") or base64 into a byte array; null if neither. */
export function parseBytes(text, format) {
  const t = text.trim();
  if (format === "hex") {
    const clean = t.replace(/^0x/i, "").replace(/[\s:,-]/g, "");
    if (!/^([0-9a-fA-F]{2})*$/.test(clean)) return null;
    return clean.match(/../g)?.map((b) => parseInt(b, 16)) || [];
  }
  try {
    return Array.from(atob(t), (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
}

/** Bytes as uppercase hex. */
export function toHex(bytes) {
  return bytes.map((b) => b.toString(16).padStart(2, "0")).join("").toUpperCase();
}
