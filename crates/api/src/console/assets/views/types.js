// Device types: the list, and an editor per type with a highlighted codec
// editor, the server's validation on save, the dry-run decode of the
// editor's decoder (saved or not) on hex or base64 input, the dry-run
// encode of a downlink object by the editor's encodeDownlink, and TTN
// device-repository examples run against it.
import { get, call } from "../api.js";
import { h, fill, title, errorBox, showError, table, json, parseBytes, toHex, measureValue, show } from "../ui.js";
import { codeEditor } from "../highlight.js";

const TEMPLATE = `function decodeUplink(input) {
  // input.bytes: the payload's bytes; input.fPort: its port.
  return { data: { battery: input.bytes[0] } };
}
`;

export default async function types(main, { arg, params }) {
  if (arg) return editor(main, arg === "+new" ? null : arg, params.has("saved"));
  const all = await get("/api/v1/device-types");
  fill(main, title("Device types"),
    h("p", {}, h("a", { href: "#/types/+new", id: "new-type" }, "New device type")),
    table([
      { title: "Name", cell: (t) => h("a", { href: `#/types/${encodeURIComponent(t.name)}` }, t.name) },
      { title: "Entity type", cell: (t) => t.entityType || t.name, opt: true },
      { title: "Decoder", cell: (t) => (t.decoder ? t.decoder.language || "javascript" : "none") },
      { title: "Devices", cell: (t) => h("a", { href: `#/devices?type=${encodeURIComponent(t.name)}` }, "list") },
    ], all, "No device types yet."));
}

async function editor(main, name, justSaved) {
  const existing = name ? await get(`/api/v1/device-types/${encodeURIComponent(name)}`) : {};
  const nameInput = h("input", { id: "type-name", value: name || "", required: true, readonly: !!name, pattern: "[A-Za-z0-9_\\-]+" });
  const entityType = h("input", { id: "type-entity", value: existing.entityType || "" });
  const code = codeEditor("type-script", "Decoder script (JavaScript)", existing.decoder?.script ?? (name ? "" : TEMPLATE));
  const mappings = h("textarea", { id: "type-mappings", rows: 3, class: "code" }, JSON.stringify(existing.processor?.mappings || [], null, 0));
  const saveErr = errorBox(null);
  const saved = h("span", { class: "ok", "aria-live": "polite", id: "type-saved" }, justSaved ? "Saved." : "");
  let savedScript = existing.decoder?.script ?? null;
  const form = h("form", { class: "card", id: "type-form" },
    h("div", { class: "row" },
      h("label", { for: "type-name" }, "Name", nameInput),
      h("label", { for: "type-entity" }, "NGSI entity type (default: the name)", entityType)),
    h("label", { for: "type-script" }, "Decoder (decodeUplink(input) or convert(object); encodeDownlink(input) for downlinks)"), code.element,
    h("label", { for: "type-mappings" }, "Processor mappings (JSON array of {from, to})", mappings),
    saveErr,
    h("p", {}, h("button", { class: "primary", type: "submit", id: "type-save" }, "Save"), " ", saved,
      name ? [" ", h("button", { type: "button", class: "danger", id: "type-delete", onclick: remove }, "Delete")] : null));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    saved.textContent = "";
    const n = nameInput.value.trim();
    const body = {};
    if (entityType.value.trim()) body.entityType = entityType.value.trim();
    if (code.get().trim()) body.decoder = { language: "javascript", script: code.get() };
    try {
      const m = JSON.parse(mappings.value || "[]");
      if (m.length) body.processor = { mappings: m };
    } catch (x) {
      showError(saveErr, new Error(`Mappings are not valid JSON: ${x.message}`));
      return;
    }
    try {
      await call("PUT", `/api/v1/device-types/${encodeURIComponent(n)}`, body);
      showError(saveErr, null);
      savedScript = code.get();
      saved.textContent = "Saved.";
      if (!name) location.hash = `#/types/${encodeURIComponent(n)}?saved`;
    } catch (x) {
      showError(saveErr, x);
    }
  });
  async function remove() {
    if (!confirm(`Delete device type ${name}?`)) return;
    try {
      await call("DELETE", `/api/v1/device-types/${encodeURIComponent(name)}`);
      location.hash = "#/types";
    } catch (x) {
      showError(saveErr, x);
    }
  }

  // The dry run: of the editor's decoder (the saved type's when the
  // editor is empty).
  const editorDecoder = () => (code.get().trim() ? { decoder: { language: "javascript", script: code.get() } } : {});
  const input = h("input", { id: "test-input", size: 40, placeholder: "01755C03673401" });
  const format = h("select", { id: "test-format" }, h("option", { value: "hex" }, "hex"), h("option", { value: "base64" }, "base64"));
  const port = h("input", { id: "test-port", type: "number", min: 0, max: 255, value: 1 });
  const deviceId = h("input", { id: "test-device", value: "console-test", size: 14 });
  const result = h("div", { id: "test-result", "aria-live": "polite" });
  const testForm = h("form", { class: "card", id: "test-form" },
    h("div", { class: "row" },
      h("label", { for: "test-input" }, "Payload", input),
      h("label", { for: "test-format" }, "As", format),
      h("label", { for: "test-port" }, "fPort", port),
      h("label", { for: "test-device" }, "Device id", deviceId),
      h("button", { type: "submit", id: "test-run" }, "Test")),
    h("p", { class: "muted" }, "Runs the decoder in the editor, saved or not, with the type's mappings; nothing is stored."),
    result);
  testForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!name) { fill(result, errorBox(new Error("Save the type first."))); return; }
    const bytes = parseBytes(input.value, format.value);
    if (!bytes) { fill(result, errorBox(new Error(`The payload is not valid ${format.value}.`))); return; }
    const unsaved = code.get() !== (savedScript ?? "");
    fill(result, await dryRun(name, { bytes: toHex(bytes), fPort: Number(port.value), id: deviceId.value.trim() || "console-test", ...editorDecoder() }), unsaved ? h("p", { class: "muted", id: "test-unsaved" }, "This ran the editor's unsaved decoder; Save to keep it.") : null);
  });

  // The encode dry run: a downlink object through the editor's
  // encodeDownlink (the saved type's when the editor is empty).
  const editorEncoder = () => (code.get().trim() ? { encoder: { language: "javascript", script: code.get() } } : {});
  const encData = h("textarea", { id: "enc-data", rows: 3, class: "code", placeholder: '{"command": "ring", "duration": 5}' });
  const encPort = h("input", { id: "enc-port", type: "number", min: 1, max: 223, placeholder: "codec's" });
  const encVars = h("input", { id: "enc-variables", size: 30, placeholder: '{"offset": "5"}' });
  const encResult = h("div", { id: "enc-result", "aria-live": "polite" });
  const encForm = h("form", { class: "card", id: "enc-form" },
    h("label", { for: "enc-data" }, "Downlink data (a JSON object, as queued)", encData),
    h("div", { class: "row" },
      h("label", { for: "enc-port" }, "fPort (optional)", encPort),
      h("label", { for: "enc-variables" }, "Device variables (optional JSON object of text)", encVars),
      h("button", { type: "submit", id: "enc-run" }, "Encode")),
    h("p", { class: "muted" }, "Runs the encodeDownlink in the editor, saved or not; nothing is queued or sent."),
    encResult);
  encForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!name) { fill(encResult, errorBox(new Error("Save the type first."))); return; }
    const body = { ...editorEncoder() };
    try {
      body.data = JSON.parse(encData.value || "{}");
    } catch (x) {
      fill(encResult, errorBox(new Error(`The data is not valid JSON: ${x.message}`)));
      return;
    }
    if (encVars.value.trim()) {
      try {
        body.variables = JSON.parse(encVars.value);
      } catch (x) {
        fill(encResult, errorBox(new Error(`The variables are not valid JSON: ${x.message}`)));
        return;
      }
    }
    if (encPort.value.trim()) body.fPort = Number(encPort.value);
    const unsaved = code.get() !== (savedScript ?? "");
    fill(encResult, await encodeRun(name, body), unsaved ? h("p", { class: "muted", id: "enc-unsaved" }, "This ran the editor's unsaved encoder; Save to keep it.") : null);
  });

  // TTN examples.
  const imported = h("textarea", { id: "ttn-import", rows: 5, class: "code", placeholder: '{"uplinkDecoder":{"examples":[{"description":"…","input":{"fPort":1,"bytes":[1,117,92]},"output":{"data":{"battery":92}}}]}}' });
  const examplesOut = h("div", { id: "ttn-results" });
  const importForm = h("form", { class: "card", id: "ttn-form" },
    h("label", { for: "ttn-import" }, "A TTN device-repository codec definition as JSON (or its examples array); a `script` or `decoderScript` field, if present, fills the editor (Save to keep it); the examples run against the editor's decoder", imported),
    h("p", {}, h("button", { type: "submit", id: "ttn-run" }, "Import and run examples")),
    examplesOut);
  importForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    let def;
    try {
      def = JSON.parse(imported.value);
    } catch (x) {
      fill(examplesOut, errorBox(new Error(`Not JSON: ${x.message}`)));
      return;
    }
    const script = def.script || def.decoderScript;
    if (script) code.set(script);
    const examples = Array.isArray(def) ? def : def.uplinkDecoder?.examples || def.examples || [];
    if (!name) { fill(examplesOut, errorBox(new Error("Save the type first."))); return; }
    const rows = [];
    for (const ex of examples) {
      const bytes = ex.input?.bytes || [];
      const expected = ex.output || {};
      let got, pass;
      try {
        const r = await call("POST", `/api/v1/device-types/${encodeURIComponent(name)}/decode`, { bytes: toHex(bytes), fPort: ex.input?.fPort ?? 1, id: "console-test", ...editorDecoder() });
        got = r.body.units?.[0]?.measures;
        pass = !expected.errors?.length && sameData(expected.data, got);
      } catch (x) {
        if (x.body?.error === "InvalidScript") { fill(examplesOut, errorBox(x)); return; }
        got = x.body || x.message;
        pass = !!expected.errors?.length;
      }
      rows.push({ ex, got, pass });
    }
    fill(examplesOut, table([
      { title: "Example", cell: (r) => r.ex.description || "—" },
      { title: "Result", cell: (r) => h("span", { class: r.pass ? "ok" : "error", "data-pass": String(r.pass) }, r.pass ? "pass" : "differs") },
      { title: "Expected", cell: (r) => json(r.ex.output), opt: true },
      { title: "Decoded", cell: (r) => json(r.got) },
    ], rows, "The definition has no examples."));
  });

  fill(main, title(name ? `Device type ${name}` : "New device type"), form,
    h("h2", {}, "Test the decoder"), testForm,
    h("h2", {}, "Test the encoder"), encForm,
    h("h2", {}, "Import a TTN codec with examples"), importForm);
}

/** Runs the dry run on `sample` (an encoded body) and shows units, warnings and errors. */
async function dryRun(name, sample) {
  try {
    const r = await call("POST", `/api/v1/device-types/${encodeURIComponent(name)}/decode`, sample);
    const units = r.body.units || [];
    const warnings = r.body.warnings || [];
    return h("div", {},
      units.map((u) => h("div", {},
        h("p", {}, `Unit for device ${u.device?.id ?? "—"}`),
        table([
          { title: "Measure", cell: ([k]) => k },
          { title: "Value", cell: ([n, m]) => h("span", { "data-measure": n }, show(measureValue(m).value ?? m)) },
          { title: "Unit", cell: ([, m]) => measureValue(m).unit },
        ], Object.entries(u.measures || {}), "No measures."))),
      warnings.length ? h("div", { class: "warn", id: "test-warnings" }, h("strong", {}, "Warnings"), h("ul", {}, warnings.map((w) => h("li", {}, show(w))))) : null,
      h("details", {}, h("summary", {}, "Units as JSON"), json(units)));
  } catch (x) {
    const errors = x.body?.errors || [];
    return h("div", { class: "error", role: "alert", id: "test-errors" },
      h("strong", {}, x.body?.reason || x.message), errors.length ? h("ul", {}, errors.map((e) => h("li", {}, show(e)))) : null);
  }
}

/** Runs the encode dry run on `body` and shows the bytes (hex and base64), the port and warnings, or the codec's errors. */
async function encodeRun(name, body) {
  try {
    const r = await call("POST", `/api/v1/device-types/${encodeURIComponent(name)}/encode`, body);
    const warnings = r.body.warnings || [];
    return h("div", {},
      h("dl", { class: "encoded" },
        h("dt", {}, "Hex"), h("dd", {}, h("code", { id: "enc-hex" }, r.body.hex.toUpperCase() || "(no bytes)")),
        h("dt", {}, "Base64"), h("dd", {}, h("code", { id: "enc-base64" }, r.body.bytes || "(no bytes)")),
        h("dt", {}, "fPort"), h("dd", { id: "enc-fport" }, String(r.body.fPort))),
      warnings.length ? h("div", { class: "warn", id: "enc-warnings" }, h("strong", {}, "Warnings"), h("ul", {}, warnings.map((w) => h("li", {}, show(w))))) : null);
  } catch (x) {
    const errors = x.body?.errors || [];
    const warnings = x.body?.warnings || [];
    return h("div", { class: "error", role: "alert", id: "enc-errors" },
      h("strong", {}, x.message),
      errors.length ? h("ul", {}, errors.map((e) => h("li", {}, show(e)))) : null,
      warnings.length ? [h("p", {}, "Warnings"), h("ul", {}, warnings.map((w) => h("li", {}, show(w))))] : null);
  }
}

/** Whether the example's expected data equals what the unit measured. */
function sameData(expected, measures) {
  const canon = (v) => JSON.stringify(v, Object.keys(v || {}).sort());
  return expected !== undefined && canon(expected) === canon(measures);
}
