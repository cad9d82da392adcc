// Alarms: filtered and paged by the server, refreshed live from the
// `alarms` stream, each with ack and clear.
import { call, get, live, qs } from "../api.js";
import { h, fill, title, errorBox, showError, table, time, pager } from "../ui.js";

const LIMIT = 50;

export default async function alarms(main, { params, onLeave }) {
  const state = params.get("state") ?? "active";
  const severity = params.get("severity") || "";
  const device = params.get("device") || "";
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const go = (o, p = {}) => { location.hash = `#/alarms${qs({ state, severity, device, ...p, offset: o || undefined })}`; };
  const stateSel = h("select", { id: "alarm-state" }, ["active", "cleared", "any"].map((s) => h("option", { value: s, selected: (state || "any") === s }, s)));
  const sevSel = h("select", { id: "alarm-severity" }, ["", "critical", "major", "minor", "warning", "indeterminate"].map((s) => h("option", { value: s, selected: severity === s }, s || "any")));
  const devInput = h("input", { id: "alarm-device", value: device });
  const form = h("form", { class: "row" },
    h("label", { for: "alarm-state" }, "State", stateSel),
    h("label", { for: "alarm-severity" }, "Severity", sevSel),
    h("label", { for: "alarm-device" }, "Device", devInput),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = `#/alarms${qs({ state: stateSel.value === "any" ? "any" : stateSel.value, severity: sevSel.value, device: devInput.value.trim() })}`;
  });
  const err = errorBox(null);
  const body = h("div", { id: "alarm-list" });
  const liveNote = h("p", { class: "muted" }, "Live: the list refreshes when an alarm changes.");
  fill(main, title("Alarms"), form, err, body, liveNote);

  async function load() {
    try {
      const rows = await get(`/api/v1/alarms${qs({ state: state === "any" ? "" : state, severity, device, limit: LIMIT + 1, offset })}`);
      const more = rows.length > LIMIT;
      const page = rows.slice(0, LIMIT);
      const act = (a, verb) => async (e) => {
        e.currentTarget.disabled = true;
        try {
          await call("POST", `/api/v1/alarms/${encodeURIComponent(a.id)}/${verb}`);
          showError(err, null);
          await load();
        } catch (x) {
          showError(err, x);
          e.currentTarget.disabled = false;
        }
      };
      fill(body, table([
        { title: "Severity", cell: (a) => h("span", { class: `badge ${a.severity}` }, a.severity) },
        { title: "Type", cell: (a) => a.type },
        { title: "Device", cell: (a) => h("a", { href: `#/device/${encodeURIComponent(a.device?.id || "")}` }, a.device?.id || "—") },
        { title: "State", cell: (a) => h("span", { class: `badge ${a.state}` }, a.state, a.acked ? " · acked" : "") },
        { title: "Description", cell: (a) => a.description || "", opt: true },
        { title: "Raised", cell: (a) => time(a.raisedAt), opt: true },
        { title: "Count", cell: (a) => String(a.count), opt: true },
        { title: "Actions", cell: (a) => h("span", { class: "row" },
          h("button", { type: "button", "data-ack": a.id, disabled: a.acked, onclick: act(a, "ack") }, "Ack"),
          h("button", { type: "button", "data-clear": a.id, disabled: a.state === "cleared", onclick: act(a, "clear") }, "Clear")) },
      ], page, "No alarms."), pager({ offset, limit: LIMIT, shown: page.length, total: null, hasMore: more, go, label: "alarms" }));
    } catch (x) {
      showError(err, x);
    }
  }
  await load();
  let pending = null;
  const es = live({ stream: "alarms" }, () => {
    if (!pending) pending = setTimeout(() => { pending = null; load(); }, 300);
  });
  onLeave(() => { es.close(); clearTimeout(pending); });
}
