// One device: its record and state, the latest values, a zoomable history
// chart per numeric measure (uPlot, from the QuantumLeap API, extended
// live), its live event log (SSE), its network-server events, the failed
// uplinks of its type, and its downlink queue with a form to add to it.
import { get, call, live, qs } from "../api.js";
import { h, fill, title, errorBox, showError, table, time, ago, json, measureValue, show, parseBytes, toHex } from "../ui.js";

/** Attributes of the device's entity that are not measures. */
const NOT_MEASURES = new Set(["dateObserved", "location", "id", "type"]);

/** Points kept per chart. */
const MAX_POINTS = 2000;

export default async function device(main, { arg: id, onLeave }) {
  const d = await get(`/api/v1/devices/${encodeURIComponent(id)}`);
  const latest = {};
  const latestBox = h("div", { id: "latest" });
  const charts = h("div", { id: "charts" });
  const log = h("div", { class: "log", id: "event-log", "aria-live": "polite", "aria-label": "Live data units" });
  const liveState = h("span", { class: "muted", id: "live-state" }, "connecting…");
  fill(main,
    title(`Device ${d.id}`),
    h("div", { class: "card" },
      h("p", {},
        d.name ? h("strong", {}, d.name, " · ") : null,
        "type ", d.type ? h("a", { href: `#/types/${encodeURIComponent(d.type)}` }, d.type) : "—",
        " · channel ", d.channel || "—"),
      Object.keys(d.records || {}).length ? h("p", { class: "muted" }, "records: ", JSON.stringify(d.records)) : null,
      Object.keys(d.state || {}).length ? h("details", {}, h("summary", {}, "Network-server state"), json(d.state)) : null),
    h("h2", {}, "Latest values"), latestBox,
    h("h2", {}, "History"), h("p", { class: "muted" }, "Drag across a chart to zoom in; double-click it (or use Reset zoom) to zoom out."), charts,
    h("h2", {}, "Live data units ", liveState), log);

  const showLatest = () => fill(latestBox, table([
    { title: "Measure", cell: ([k]) => k },
    { title: "Value", cell: ([, v]) => h("span", { "data-measure": v.name }, show(v.value)) },
    { title: "Unit", cell: ([, v]) => v.unit || "" },
    { title: "At", cell: ([, v]) => time(v.at), opt: true },
  ], Object.entries(latest), "No values yet."));

  // The entity's current values (it exists once the first unit came).
  try {
    const e = await get(`/v2/entities/${encodeURIComponent(id)}`);
    for (const [k, a] of Object.entries(e)) {
      if (NOT_MEASURES.has(k) || !a || typeof a !== "object") continue;
      latest[k] = { name: k, value: a.value, unit: a.metadata?.unit?.value || "", at: e.dateObserved?.value };
    }
  } catch { /* no entity yet */ }
  showLatest();

  // History: every attribute of the entity in one query.
  const series = new Map();
  try {
    const hist = await get(`/ql/v2/entities/${encodeURIComponent(id)}${qs({ lastN: 500 })}`);
    const xs = hist.index.map((t) => new Date(t).getTime() / 1000);
    for (const a of hist.attributes || []) {
      if (NOT_MEASURES.has(a.attrName)) continue;
      const pts = [];
      a.values.forEach((v, i) => { if (typeof v === "number") pts.push([xs[i], v]); });
      if (pts.length) series.set(a.attrName, pts);
    }
  } catch { /* no history yet (404) */ }
  const plots = new Map();
  const chartFor = (name) => {
    if (plots.has(name)) return plots.get(name);
    const box = h("div", { class: "card chart", "data-chart": name, "data-points": "0" });
    const reset = h("button", { type: "button" }, "Reset zoom");
    charts.append(h("div", {}, h("div", { class: "row" }, h("strong", {}, name), reset), box));
    const pts = series.get(name) || [];
    series.set(name, pts);
    let plot = null;
    const draw = () => {
      const data = [pts.map((p) => p[0]), pts.map((p) => p[1])];
      box.setAttribute("data-points", String(pts.length));
      if (!window.uPlot) { box.textContent = `${pts.length} points (chart library not loaded)`; return; }
      if (!plot) {
        plot = new window.uPlot({
          width: Math.max(280, box.clientWidth - 24), height: 200,
          cursor: { drag: { x: true, y: false } },
          series: [{}, { label: name, stroke: "#1f5fbf", width: 2, points: { show: pts.length < 60 } }],
        }, data, box);
        reset.onclick = () => plot.setData(data, true);
      } else {
        plot.setData(data, true);
      }
    };
    const entry = { add(t, v) { pts.push([t, v]); if (pts.length > MAX_POINTS) pts.shift(); draw(); }, draw };
    plots.set(name, entry);
    draw();
    return entry;
  };
  for (const name of series.keys()) chartFor(name);
  if (!series.size) charts.append(h("p", { class: "muted", id: "no-history" }, "No history yet: charts appear with the first numeric value."));

  // Live units of this device.
  const es = live({ stream: "data", devices: id }, (name, unit) => {
    if (name === "error") { liveState.textContent = `stream error: ${show(unit)}`; return; }
    const t = unit.reportedAt || Date.now();
    log.prepend(h("div", {}, `${time(t)}  `, JSON.stringify(unit.measures)));
    while (log.childElementCount > 200) log.lastChild.remove();
    for (const [k, m] of Object.entries(unit.measures || {})) {
      const { value, unit: u } = measureValue(m);
      latest[k] = { name: k, value: value ?? m, unit: u, at: t };
      if (typeof value === "number") {
        document.getElementById("no-history")?.remove();
        chartFor(k).add(t / 1000, value);
      }
    }
    showLatest();
  });
  es.onopen = () => { liveState.textContent = "(live)"; };
  es.onerror = () => { liveState.textContent = "(reconnecting…)"; };
  onLeave(() => es.close());

  // Network-server events and failed uplinks, then downlinks if offered.
  const events = await get(`/api/v1/devices/${encodeURIComponent(id)}/events?limit=20`).catch(() => ({ events: [] }));
  main.append(h("h2", {}, "Network-server events"), table([
    { title: "Event", cell: (e) => e.event },
    { title: "Received", cell: (e) => h("span", { title: time(e.receivedAt) }, ago(e.receivedAt)) },
    { title: "Source", cell: (e) => e.source, opt: true },
    { title: "Body", cell: (e) => h("details", {}, h("summary", {}, "JSON"), json(e.body)), opt: true },
  ], events.events || [], "No events from a network server."));
  if (d.type) {
    const failed = await get(`/api/v1/uplinks/failed${qs({ type: d.type, limit: 20 })}`).catch(() => ({ failures: [] }));
    main.append(h("h2", {}, `Failed uplinks of type ${d.type}`), table([
      { title: "Received", cell: (f) => time(f.receivedAt) },
      { title: "Reason", cell: (f) => f.reason },
      { title: "Description", cell: (f) => f.description },
      { title: "Body", cell: (f) => h("details", {}, h("summary", {}, "JSON"), json(f.body)), opt: true },
    ], failed.failures || [], "None."));
  }
  await downlinks(main, id, onLeave);
}

/** Downlink priorities, as The Things Stack names them. */
const PRIORITIES = ["LOWEST", "LOW", "BELOW_NORMAL", "NORMAL", "ABOVE_NORMAL", "HIGH", "HIGHEST"];

/** How often the downlink list is read again while the page is open. */
const DOWNLINK_REFRESH_MS = 3000;

/**
 * The device's downlink queue (docs/downlinks.md): a form that pushes or
 * replaces (fPort, raw bytes as hex or base64 or a JSON object for the
 * type's encodeDownlink, confirmed, priority, expiry), the queued, sent
 * and failed downlinks with their status and reason, and a flush button.
 */
async function downlinks(main, id, onLeave) {
  const path = `/api/v1/devices/${encodeURIComponent(id)}/downlinks`;
  const mode = h("select", { id: "dl-mode" },
    h("option", { value: "POST" }, "push (append to the queue)"),
    h("option", { value: "PUT" }, "replace (the open downlinks)"));
  const format = h("select", { id: "dl-format" },
    h("option", { value: "hex" }, "hex bytes"),
    h("option", { value: "base64" }, "base64 bytes"),
    h("option", { value: "json" }, "JSON object (encoded by the codec)"));
  const port = h("input", { id: "dl-port", type: "number", min: 1, max: 223, placeholder: "codec", size: 6 });
  const payload = h("textarea", { id: "dl-payload", rows: 2, cols: 40, class: "code", required: true, placeholder: "01 05" });
  const confirmed = h("input", { id: "dl-confirmed", type: "checkbox" });
  const priority = h("select", { id: "dl-priority" }, PRIORITIES.map((p) => h("option", { value: p, selected: p === "NORMAL" }, p)));
  const expires = h("input", { id: "dl-expires", type: "datetime-local" });
  const err = h("div", { class: "error", role: "alert", id: "dl-error", hidden: true });
  const done = h("p", { class: "ok", "aria-live": "polite", id: "dl-done" });
  const form = h("form", { class: "card", id: "downlink" },
    h("div", { class: "row" },
      h("label", { for: "dl-mode" }, "Queue", mode),
      h("label", { for: "dl-format" }, "Payload as", format),
      h("label", { for: "dl-port" }, "fPort (1–223)", port),
      h("label", { for: "dl-priority" }, "Priority", priority),
      h("label", { for: "dl-expires" }, "Expires (optional)", expires),
      h("label", { class: "inline" }, confirmed, "Confirmed")),
    h("label", { for: "dl-payload" }, "Payload", payload),
    err,
    h("p", {}, h("button", { class: "primary", type: "submit", id: "dl-send" }, "Queue downlink"), " ", done));
  const listErr = errorBox(null);
  const list = h("div", { id: "downlink-list", "aria-live": "polite" });
  const flush = h("button", { type: "button", class: "danger", id: "dl-flush" }, "Flush open downlinks");
  const refresh = h("button", { type: "button", id: "dl-refresh" }, "Refresh");

  /** Shows an API error with the codec's own `errors` (a 422 from the encoder). */
  const showFailure = (x) => {
    const errors = x.body?.errors || [];
    fill(err, x.message || String(x), errors.length ? h("ul", {}, errors.map((e) => h("li", {}, show(e)))) : null);
    err.hidden = false;
  };

  const load = async () => {
    try {
      const r = await get(path);
      showError(listErr, null);
      fill(list, table([
        { title: "Status", cell: (d) => h("span", { class: `badge ${d.status}`, "data-status": d.status }, d.status) },
        { title: "Reason", cell: (d) => d.reason || "" },
        { title: "fPort", cell: (d) => d.fPort },
        { title: "Payload", cell: (d) => h("code", {}, toHex(parseBytes(d.frmPayload || "", "base64") || [])) },
        { title: "Data", cell: (d) => (d.data !== undefined ? show(d.data) : d.decoded !== undefined ? show(d.decoded) : "—"), opt: true },
        { title: "Attempts", cell: (d) => String(d.attempts ?? 0), opt: true },
        { title: "Queued", cell: (d) => time(d.createdAt), opt: true },
        { title: "Sent", cell: (d) => time(d.sentAt), opt: true },
      ], (r.downlinks || []).slice().reverse(), "No downlinks."));
    } catch (x) {
      showError(listErr, x);
    }
  };

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    done.textContent = "";
    err.hidden = true;
    const body = { confirmed: confirmed.checked, priority: priority.value };
    if (port.value !== "") body.fPort = Number(port.value);
    if (expires.value) body.expiresAt = new Date(expires.value).toISOString();
    if (format.value === "json") {
      try {
        body.data = JSON.parse(payload.value);
      } catch (x) {
        showFailure(new Error(`The payload is not JSON: ${x.message}`));
        return;
      }
      if (!body.data || typeof body.data !== "object" || Array.isArray(body.data)) {
        showFailure(new Error("The payload must be a JSON object, which the codec's encodeDownlink encodes."));
        return;
      }
    } else {
      const bytes = parseBytes(payload.value, format.value);
      if (!bytes || !bytes.length) { showFailure(new Error(`The payload is not ${format.value} bytes.`)); return; }
      body.bytes = btoa(String.fromCharCode(...bytes));
    }
    try {
      const r = await call(mode.value, path, mode.value === "PUT" ? { downlinks: [body] } : body);
      const n = r.body?.downlinks?.length ?? 1;
      done.textContent = mode.value === "PUT" ? `Queue replaced (${n} queued).` : "Queued.";
      await load();
    } catch (x) {
      showFailure(x);
    }
  });
  flush.addEventListener("click", async () => {
    try {
      const r = await call("DELETE", path);
      done.textContent = `Flushed ${r.body?.flushed ?? 0}.`;
      await load();
    } catch (x) {
      showError(listErr, x);
    }
  });
  refresh.addEventListener("click", load);
  main.append(h("h2", {}, "Downlinks"), form,
    h("div", { class: "row" }, refresh, flush), listErr, list,
    h("p", { class: "muted" }, "Newest first: the open downlinks and the last finished ones. A downlink stays pending until weft has learnt a route to the device from its uplinks (docs/downlinks.md)."));
  await load();
  const timer = setInterval(load, DOWNLINK_REFRESH_MS);
  onLeave(() => clearInterval(timer));
}
