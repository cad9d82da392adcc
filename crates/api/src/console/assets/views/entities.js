// NGSI entities: Orion's query (type, id pattern, q) paged by the server
// with its total count, in any tenant; each entity's JSON on demand.
import { call, qs } from "../api.js";
import { h, fill, title, errorBox, json, pager, table } from "../ui.js";

const LIMIT = 50;

export default async function entities(main, { params }) {
  const p = Object.fromEntries(["type", "idPattern", "q", "service", "path"].map((k) => [k, params.get(k) || ""]));
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const go = (o) => { location.hash = `#/entities${qs({ ...p, offset: o || undefined })}`; };
  const inputs = {};
  const labels = { type: "Type", idPattern: "Id pattern (regex)", q: "q (Simple Query Language)", service: "Tenant (Fiware-Service)", path: "Service path" };
  const form = h("form", { class: "row", role: "search" },
    Object.entries(labels).map(([k, l]) => h("label", { for: `ent-${k}` }, l, inputs[k] = h("input", { id: `ent-${k}`, value: p[k], size: k === "q" ? 28 : 14 }))),
    h("button", { type: "submit" }, "Query"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = `#/entities${qs(Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value.trim()])))}`;
  });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  fill(main, title("NGSI entities"), form, body);
  const headers = {};
  if (p.service) headers["Fiware-Service"] = p.service;
  if (p.path) headers["Fiware-ServicePath"] = p.path;
  try {
    const resp = await call("GET", `/v2/entities${qs({ type: p.type, idPattern: p.idPattern, q: p.q, limit: LIMIT, offset, options: "count" })}`, undefined, headers);
    const total = Number(resp.headers.get("fiware-total-count"));
    const rows = resp.body;
    const nav = () => pager({ offset, limit: LIMIT, shown: rows.length, total, go, label: "entities" });
    fill(body, nav(), table([
      { title: "Id", cell: (e) => e.id },
      { title: "Type", cell: (e) => e.type },
      { title: "Attributes", cell: (e) => Object.keys(e).filter((k) => k !== "id" && k !== "type").join(", "), opt: true },
      { title: "JSON", cell: (e) => h("details", {}, h("summary", {}, "view"), json(e)) },
    ], rows, "No entity matches."), nav());
  } catch (e) {
    fill(body, errorBox(e));
  }
}
