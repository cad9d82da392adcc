// Pages: the page templates, each previewed as weft renders it, in a
// sandboxed frame (no scripts, no access to the console).
import { get, call } from "../api.js";
import { h, fill, title, table, errorBox } from "../ui.js";

export default async function pages(main, { arg }) {
  const names = await get("/api/v1/pages");
  const list = (Array.isArray(names) ? names : Object.keys(names)).map((n) => (typeof n === "string" ? n : n.name));
  fill(main, title("Pages"), table([
    { title: "Page", cell: (n) => h("a", { href: `#/pages/${encodeURIComponent(n)}` }, n) },
    { title: "Open", cell: (n) => h("a", { href: `/pages/${n}`, target: "_blank", rel: "noopener" }, `/pages/${n}`), opt: true },
  ], list, "No pages yet."));
  if (!arg) return;
  const frame = h("iframe", { class: "preview", sandbox: "", title: `Preview of page ${arg}` });
  main.append(h("h2", {}, `Preview: ${arg}`), frame);
  try {
    const r = await call("GET", `/pages/${arg}`);
    frame.srcdoc = typeof r.body === "string" ? r.body : JSON.stringify(r.body, null, 2);
  } catch (e) {
    frame.replaceWith(errorBox(e));
  }
}
