// Devices: searched and paged by the server (limit/offset/q, with the
// total in X-Total-Count), so 100,000 devices cost one page each time.
import { call, qs } from "../api.js";
import { h, fill, title, errorBox, pager, ago, time, table } from "../ui.js";

const LIMIT = 50;

function battery(state) {
  const s = state && state.status;
  if (!s) return "—";
  if (s.batteryLevelUnavailable) return "n/a";
  if (typeof s.batteryLevel === "number") return `${Math.round(s.batteryLevel)} %`;
  if (s.externalPowerSource) return "external";
  return "—";
}

function status(d) {
  const kinds = Object.keys(d.state || {});
  if (!kinds.length) return "—";
  const latest = kinds.map((k) => d.state[k]).sort((a, b) => (b.receivedAt || 0) - (a.receivedAt || 0))[0];
  return latest.event || kinds[0];
}

export default async function devices(main, { params }) {
  const q = params.get("q") || "";
  const type = params.get("type") || "";
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const go = (o, nq = q, nt = type) => { location.hash = `#/devices${qs({ q: nq, type: nt, offset: o || undefined })}`; };
  const search = h("input", { id: "device-search", type: "search", value: q, placeholder: "id or name" });
  const typeInput = h("input", { id: "device-type-filter", value: type, placeholder: "any" });
  const form = h("form", { class: "row", role: "search" },
    h("label", { for: "device-search" }, "Search", search),
    h("label", { for: "device-type-filter" }, "Type", typeInput),
    h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (e) => { e.preventDefault(); go(0, search.value.trim(), typeInput.value.trim()); });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  fill(main, title("Devices"), form, body);
  try {
    const resp = await call("GET", `/api/v1/devices${qs({ limit: LIMIT, offset, q, type })}`);
    const total = Number(resp.headers.get("x-total-count"));
    const rows = resp.body;
    const nav = () => pager({ offset, limit: LIMIT, shown: rows.length, total, go, label: "devices" });
    fill(body, nav(),
      table([
        { title: "Device", cell: (d) => h("a", { href: `#/device/${encodeURIComponent(d.id)}` }, d.id) },
        { title: "Name", cell: (d) => d.name || "—", opt: true },
        { title: "Type", cell: (d) => d.type || "—" },
        { title: "Channel", cell: (d) => d.channel || "—", opt: true },
        { title: "Last seen", cell: (d) => h("span", { title: time(d.lastSeen) }, ago(d.lastSeen)) },
        { title: "Battery", cell: (d) => battery(d.state), opt: true },
        { title: "Status", cell: (d) => status(d), opt: true },
      ], rows, q || type ? "No device matches." : "No devices yet."),
      nav());
    body.setAttribute("data-total", String(total));
  } catch (e) {
    fill(body, errorBox(e));
  }
}
