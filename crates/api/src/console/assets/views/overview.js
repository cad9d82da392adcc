// Overview: the platform's pulse, refreshed every 2 s from /metrics (rates
// are the change between two reads) and the active alarms.
import { get } from "../api.js";
import { h, fill, title, errorBox, showError } from "../ui.js";

/** Sums of each metric family in Prometheus text (labels summed over). */
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const v = Number(m[2]);
    if (Number.isFinite(v)) out[m[1]] = (out[m[1]] || 0) + v;
  }
  return out;
}

/** Seconds as "42 s", "3 min", "5 h"; "—" for none. */
function age(s) {
  if (!s) return "—";
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

const TILES = [
  ["uplinks", "Uplinks / s", (m, r) => r("weft_uplinks_accepted_total")],
  ["failures", "Failed uplinks / s", (m, r) => r("weft_uplinks_failed_total")],
  ["failedTotal", "Failed uplinks (total)", (m) => m.weft_uplinks_failed_total || 0],
  ["units", "Data units / s", (m, r) => r("weft_units_stored_total")],
  ["backlog", "Pipeline backlog", (m) => m.weft_pipeline_backlog || 0],
  ["notified", "Notifications sent / s", (m, r) => r("weft_notifications_sent_total")],
  ["notifyFailed", "Notifications failing (total)", (m) => (m.weft_notifications_failed_total || 0) + (m.weft_notifications_dropped_total || 0)],
  ["webhooks", "Channel webhooks failing (total)", (m) => (m.weft_channel_webhooks_failed_total || 0) + (m.weft_channel_webhooks_dropped_total || 0)],
  ["published", "Channel messages / s", (m, r) => r("weft_channel_messages_published_total")],
  ["channelBacklog", "Channel messages not yet acked (every 10 s)", (m) => m.weft_channel_backlog_messages || 0],
  ["channelOldest", "Oldest of them", (m) => age(m.weft_channel_oldest_unacked_seconds || 0)],
  ["live", "Live connections", (m) => m.weft_live_connections || 0],
];

export default async function overview(main, { onLeave }) {
  const values = {};
  const tiles = h("div", { class: "tiles", "aria-live": "off" },
    h("div", { class: "tile" }, h("div", { class: "v", id: "ov-alarms" }, "…"), h("div", { class: "l" }, h("a", { href: "#/alarms" }, "Active alarms"))),
    TILES.map(([id, label]) => h("div", { class: "tile" }, values[id] = h("div", { class: "v", id: `ov-${id}` }, "…"), h("div", { class: "l" }, label))));
  const err = errorBox(null);
  const stamp = h("p", { class: "muted" });
  fill(main, title("Overview"), err, tiles, stamp,
    h("p", { class: "muted" }, "Refreshed every 2 seconds from /metrics. Rates are per second over the last interval."));
  let prev = null;
  async function tick() {
    try {
      const text = await get("/metrics");
      const m = parseMetrics(text);
      const now = performance.now();
      const rate = (name) => {
        if (!prev) return "…";
        const dt = (now - prev.at) / 1000;
        return dt > 0 ? (((m[name] || 0) - (prev.m[name] || 0)) / dt).toFixed(1) : "…";
      };
      for (const [id, , f] of TILES) values[id].textContent = String(f(m, rate));
      prev = { m, at: now };
      const active = await get("/api/v1/alarms?state=active&limit=1000");
      document.getElementById("ov-alarms").textContent = active.length >= 1000 ? "1000+" : String(active.length);
      stamp.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      showError(err, null);
    } catch (e) {
      showError(err, e);
    }
  }
  await tick();
  const timer = setInterval(tick, 2000);
  onLeave(() => clearInterval(timer));
}
