// NGSI subscriptions: status, last success and failure, and how each is
// being delivered (live, or from the change log with what it still owes),
// paged by the server.
import { call, qs } from "../api.js";
import { h, fill, title, errorBox, json, pager, table, time } from "../ui.js";

const LIMIT = 50;

export default async function subscriptions(main, { params }) {
  const service = params.get("service") || "";
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const go = (o) => { location.hash = `#/subscriptions${qs({ service, offset: o || undefined })}`; };
  const tenant = h("input", { id: "sub-service", value: service });
  const form = h("form", { class: "row" }, h("label", { for: "sub-service" }, "Tenant (Fiware-Service)", tenant), h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (e) => { e.preventDefault(); location.hash = `#/subscriptions${qs({ service: tenant.value.trim() })}`; });
  const body = h("div", {});
  fill(main, title("Subscriptions"), form, body);
  try {
    const headers = service ? { "Fiware-Service": service } : {};
    const resp = await call("GET", `/v2/subscriptions${qs({ limit: LIMIT, offset, options: "count" })}`, undefined, headers);
    const total = Number(resp.headers.get("fiware-total-count"));
    const rows = resp.body;
    const deliveries = (await call("GET", "/api/v1/subscriptions/delivery", undefined, headers)).body;
    const delivery = new Map(deliveries.map((d) => [d.id, d]));
    const owed = (s) => {
      const d = delivery.get(s.id);
      if (!d) return "—";
      const what = d.fromLog ? `from the log, ${d.owed} to go` : (d.owed ? `live, ${d.owed} on their way` : "live");
      const since = d.oldestOwed ? ` since ${time(d.oldestOwed)}` : "";
      return h("span", { class: d.failing ? "error" : (d.fromLog ? "warn" : "ok") }, what + since);
    };
    const n = (s) => s.notification || {};
    fill(body, pager({ offset, limit: LIMIT, shown: rows.length, total, go, label: "subscriptions" }), table([
      { title: "Id", cell: (s) => s.id },
      { title: "Description", cell: (s) => s.description || "—", opt: true },
      { title: "Status", cell: (s) => h("span", { class: s.status === "active" ? "ok" : "warn" }, s.status || "—") },
      { title: "To", cell: (s) => n(s).http?.url || n(s).httpCustom?.url || n(s).mqtt?.url || "—", opt: true },
      { title: "Sent", cell: (s) => String(n(s).timesSent ?? 0) },
      { title: "Delivery", cell: owed },
      { title: "Last success", cell: (s) => time(n(s).lastSuccess) },
      { title: "Last failure", cell: (s) => n(s).lastFailure ? h("span", { class: "error" }, time(n(s).lastFailure), n(s).lastFailureReason ? ` — ${n(s).lastFailureReason}` : "") : "—" },
      { title: "JSON", cell: (s) => h("details", {}, h("summary", {}, "view"), json(s)), opt: true },
    ], rows, "No subscriptions."));
  } catch (e) {
    fill(body, errorBox(e));
  }
}
