// Channels: the bridges that publish weft's events into durable channels,
// and channel traffic from /metrics. (DSPS's API has no channel listing.)
import { get } from "../api.js";
import { h, fill, title, table, json, errorBox } from "../ui.js";
import { parseMetrics } from "./overview.js";

export default async function channels(main) {
  const bridges = await get("/api/v1/bridges");
  const list = Array.isArray(bridges) ? bridges : Object.entries(bridges).map(([name, b]) => ({ name, ...b }));
  let metrics = null;
  try { metrics = parseMetrics(await get("/metrics")); } catch (e) { metrics = e; }
  const m = metrics instanceof Error ? null : metrics;
  fill(main, title("Channels"),
    h("h2", {}, "Bridges"),
    table([
      { title: "Name", cell: (b) => b.name },
      { title: "Stream", cell: (b) => b.stream },
      { title: "Channel", cell: (b) => b.channel },
      { title: "Filter", cell: (b) => (b.filter ? json(b.filter) : "—"), opt: true },
    ], list, "No bridges."),
    h("h2", {}, "Traffic"),
    m ? h("div", { class: "tiles" },
      [["weft_channel_messages_published_total", "Messages published"],
        ["weft_channel_webhooks_sent_total", "Webhooks sent"],
        ["weft_channel_webhooks_failed_total", "Webhooks failed"],
        ["weft_channel_webhooks_dropped_total", "Webhooks dropped"],
        ["weft_channel_subscribers_expired_total", "Subscribers expired"]].map(([k, l]) =>
        h("div", { class: "tile" }, h("div", { class: "v" }, String(m[k] || 0)), h("div", { class: "l" }, l))))
      : errorBox(metrics),
    h("p", { class: "muted" }, "Messages and subscribers live in the channels' own API (/channel/…); see docs/channels.md."));
}
