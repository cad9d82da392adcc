// Channels: the durable pull channels with their subscribers and how far
// behind each one is (weft's /api/v1/channels, paged), the bridges that
// publish weft's events into channels, and channel traffic from /metrics.
import { get, call, qs } from "../api.js";
import { h, fill, title, table, json, errorBox, pager, ago, time } from "../ui.js";
import { parseMetrics } from "./overview.js";

/** Channels per page. */
const PAGE = 50;

/** "12 (oldest 3 min old)" for a backlog as the API gives it. */
function backlogText(b) {
  if (!b || !b.messages) return "0";
  return b.oldestMessageAt ? `${b.messages} (oldest ${ago(b.oldestMessageAt).replace(" ago", "")} old)` : String(b.messages);
}

export default async function channels(main, { params }) {
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const go = (o) => { location.hash = `#/channels${qs({ offset: o || undefined })}`; };

  // The listing needs an admin key: say so in its place, show the rest.
  let listed = null, total = 0;
  try {
    const r = await call("GET", `/api/v1/channels${qs({ limit: PAGE, offset })}`);
    listed = r.body;
    total = Number(r.headers.get("x-total-count") || listed.length);
  } catch (e) {
    listed = e;
  }
  const bridges = await get("/api/v1/bridges");
  const list = Array.isArray(bridges) ? bridges : Object.entries(bridges).map(([name, b]) => ({ name, ...b }));
  let metrics = null;
  try { metrics = parseMetrics(await get("/metrics")); } catch (e) { metrics = e; }
  const m = metrics instanceof Error ? null : metrics;

  const channelsBox = h("div", { id: "channel-list" });
  if (listed instanceof Error) {
    fill(channelsBox, errorBox(listed));
  } else {
    fill(channelsBox,
      pager({ offset, limit: PAGE, shown: listed.length, total, go, label: "channels" }),
      table([
        { title: "Channel", cell: (c) => h("strong", {}, c.id) },
        { title: "Subscribers", cell: (c) => subscribers(c) },
        { title: "Waiting for the slowest", cell: (c) => h("span", { "data-channel-backlog": c.id }, backlogText(c.backlog)) },
        { title: "Last active", cell: (c) => h("span", { title: time(c.lastActive) }, ago(c.lastActive)), opt: true },
      ], listed, "No channels yet: a channel appears with its first message or subscriber."));
  }

  fill(main, title("Channels"),
    h("h2", {}, "Channels and subscribers"),
    h("p", { class: "muted" }, "A subscriber's backlog is what it has not acknowledged yet; an idle subscriber expires (docs/channels.md)."),
    channelsBox,
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
    h("p", { class: "muted" }, "Messages are published and pulled through the channels' own API (/channel/…); see docs/channels.md."));
}

/** A channel's subscribers: each with its backlog and when it was last seen. */
function subscribers(c) {
  if (!c.subscribers.length) return h("span", { class: "muted" }, "none");
  return h("ul", { class: "plain" }, c.subscribers.map((s) =>
    h("li", {}, h("code", {}, s.id), " — backlog ",
      h("span", { "data-backlog": `${c.id}/${s.id}` }, backlogText(s.backlog)),
      h("span", { class: "muted", title: time(s.lastSeen) }, ` · seen ${ago(s.lastSeen)}`))));
}
