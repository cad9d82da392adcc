// Rules: the list, and a JSON editor per rule whose save shows the
// server's validation message next to the form.
import { get, call } from "../api.js";
import { h, fill, title, errorBox, showError, table } from "../ui.js";

const TEMPLATE = {
  name: "Hot", enabled: true, scope: { types: [] }, condition: "temperature>40",
  clear: "temperature<35", alarm: { type: "hot", severity: "major", description: "{{device.id}} at {{temperature}}" },
};

export default async function rules(main, { arg, params }) {
  if (arg) return editor(main, arg === "+new" ? null : arg, params.has("saved"));
  const all = await get("/api/v1/rules");
  const list = Array.isArray(all) ? all : Object.values(all);
  fill(main, title("Rules"),
    h("p", {}, h("a", { href: "#/rules/+new", id: "new-rule" }, "New rule")),
    table([
      { title: "Id", cell: (r) => h("a", { href: `#/rules/${encodeURIComponent(r.id)}` }, r.id) },
      { title: "Name", cell: (r) => r.name || "—", opt: true },
      { title: "Condition", cell: (r) => r.condition || (r.script ? "script" : r.inactivity ? `inactive ${r.inactivity}` : "—") },
      { title: "Alarm", cell: (r) => `${r.alarm?.type} (${r.alarm?.severity || "indeterminate"})` },
      { title: "Enabled", cell: (r) => (r.enabled === false ? "no" : "yes"), opt: true },
    ], list, "No rules yet."));
}

async function editor(main, id, justSaved) {
  const existing = id ? await get(`/api/v1/rules/${encodeURIComponent(id)}`) : TEMPLATE;
  const body = { ...existing };
  delete body.id;
  const idInput = h("input", { id: "rule-id", value: id || "", required: true, readonly: !!id });
  const text = h("textarea", { id: "rule-json", rows: 16, class: "code", spellcheck: "false" }, JSON.stringify(body, null, 2));
  const err = errorBox(null);
  const saved = h("span", { class: "ok", "aria-live": "polite", id: "rule-saved" }, justSaved ? "Saved." : "");
  const form = h("form", { class: "card", id: "rule-form" },
    h("label", { for: "rule-id" }, "Id", idInput),
    h("label", { for: "rule-json" }, "Rule (JSON; fields in docs/rules.md)", text),
    err,
    h("p", {}, h("button", { class: "primary", type: "submit", id: "rule-save" }, "Save"), " ", saved,
      id ? [" ", h("button", { type: "button", class: "danger", onclick: remove }, "Delete")] : null));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    saved.textContent = "";
    const rid = idInput.value.trim();
    try {
      JSON.parse(text.value);
    } catch (x) {
      showError(err, new Error(`Not valid JSON: ${x.message}`));
      return;
    }
    try {
      await call("PUT", `/api/v1/rules/${encodeURIComponent(rid)}`, text.value);
      showError(err, null);
      saved.textContent = "Saved.";
      if (!id) location.hash = `#/rules/${encodeURIComponent(rid)}?saved`;
    } catch (x) {
      showError(err, x);
    }
  });
  async function remove() {
    if (!confirm(`Delete rule ${id}?`)) return;
    try {
      await call("DELETE", `/api/v1/rules/${encodeURIComponent(id)}`);
      location.hash = "#/rules";
    } catch (x) {
      showError(err, x);
    }
  }
  fill(main, title(id ? `Rule ${id}` : "New rule"), form);
}
