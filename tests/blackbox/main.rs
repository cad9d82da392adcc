//! Black-box tests: each starts the real `weft` binary on an ephemeral port
//! with its own data directory and talks to it over HTTP and websockets.
//!
//! - `auth`: API keys on every surface: 401/403/429, tenants and service
//!   paths, ingest keys, the first start's admin key, `auth=off`, CORS.
//! - `alarms`: rules raise, update and clear alarms; ack/clear; for,
//!   repeat, inactivity, scripts; rule state across kill -9.
//! - `channels`: DSPS's durable pull channels: redelivery, ack cursor,
//!   dedup, long poll, expiry, errors, kill -9.
//! - `ingest`: sensae's path, auth and validation, webhooks, idempotency.
//! - `codecs`: decoders, the dry run, time limits.
//! - `codec_limits`: a decoder stuck in a built-in fails its uplinks with a
//!   reason while other types' uplinks flow; its dry run answers.
//! - `downlinks`: per-device downlink queues, delivery through The Things
//!   Stack's webhook, ChirpStack's REST API, Helium's `downlink_url` and
//!   device endpoints (retries, expiry), and NGSI commands.
//! - `console`: the console's files (types, ETags, policy) and the paged
//!   device listing it reads; its browser tests are `tests/console/`.
//! - `live`: the websocket and SSE streams and their filters.
//! - `catalog`: device types and devices, enrichment.
//! - `durability`: kill -9 and restart lose nothing acknowledged.
//! - `history`: QuantumLeap's notify and queries over recorded history.
//! - `hostile`: what devices, codecs and clients send cannot spoof or
//!   break entities, nor carry state from one decode to the next.
//! - `pages`: Knot.x templates rendered from services, fallbacks, one
//!   call per distinct service call, weft's own data as sources; hostile
//!   templates (recursion, deep nesting) and viewer values refused.
//! - `ops`: health and metrics.
//! - `door_checks`: every definition the admin API takes is checked at the
//!   door (400 naming the field, nothing stored); a request head that never
//!   completes has its connection closed, on every listener.
//! - `ngsi`: the NGSIv2 surface: tenancy, q/mq, keyValues, 405s; the
//!   builtin attributes and metadata, Orion's number spelling, transient
//!   entities (`dateExpires`).
//! - `ngsi_subscriptions`: notifications on API and device changes, counters,
//!   a dead endpoint beside a live one, kill -9; `expressions`: JEXL in
//!   custom notifications and conditions, `ngsi` patches, timeouts.
//! - `rule_state`: a script rule's growing `state` is reset at
//!   `[rules] max_state_bytes`, seen by the script and in `/metrics`.
//! - `notification_loop`: subscriptions notifying weft's own `/v2` with a
//!   change to the entity they watch send one notification (Orion's
//!   rule), or stop at the notification depth limit; weft stays
//!   responsive.
//! - `ngsi_registrations`: `/v2/registrations` stored, listed, deleted.
//! - `ngsi_forwarding`: queries and updates forwarded to a second weft
//!   registered as context provider; dead and silent providers; Orion's
//!   operational endpoints.
//! - `ngsi_geo`: locations (GeoJSON features, the simple-location types,
//!   `ignoreType`), geo-queries, `POST /v2/op/query` and the other batch
//!   operations' checks.
//! - `ngsi_ld`: NGSI-LD at `/ngsi-ld/v1` over the same entities as
//!   `/v2`: entities and attributes, `@context`s (a `Link` header, the
//!   body, fetched from a server), representations, tenants, keys,
//!   problem details.
//! - `ngsi_ld_subscriptions`: NGSI-LD subscriptions and their
//!   notifications over HTTP and MQTT (triggers, `q`, `geoQ`, formats,
//!   `showChanges`), changes through `/v2` notifying them, kept across a
//!   restart with their context.
//! - `mqtt`: MQTT sources of every format against a real mosquitto,
//!   kill -9 before the commit, a broker restart; Orion's `mqtt` and
//!   `mqttCustom` notifications; the embedded broker's device logins.
//! - `mqtt_downlinks`: downlinks back over MQTT sources (TTN `down/push`,
//!   ChirpStack `command/down`, IoT Agent `cmd` in JSON and UltraLight),
//!   command answers on `cmdexe`, the embedded broker, a broker that is
//!   down.
//! - `tls`: the API over HTTPS with the configured certificate.
//! - `uplink_attacks`: ingest keys' pins held through decoding, command
//!   results only with a credential for their device, a registered
//!   device's type kept, unreadable reported times refused.
//! - `scale_out`: two nodes on one PostgreSQL and one NATS JetStream:
//!   live events across nodes; decoders, rules, API keys and NGSI
//!   subscriptions changed on one node apply on the other at once; no
//!   start without the configured NATS; one MQTT source shared by both
//!   nodes (each message once, kill -9 of a node).

mod alarms;
mod auth;
mod auth_attacks;
mod catalog;
mod channels;
mod codec_limits;
mod codecs;
mod console;
mod door_checks;
mod downlinks;
mod durability;
mod history;
mod hostile;
mod ingest;
mod live;
mod mqtt;
mod mqtt_broker;
mod mqtt_downlinks;
mod ngsi;
mod ngsi_forwarding;
mod ngsi_geo;
mod ngsi_ld;
mod ngsi_ld_subscriptions;
mod ngsi_registrations;
mod ngsi_subscriptions;
mod notification_loop;
mod notify_outbox;
mod ops;
mod pages;
mod routes;
mod rule_state;
mod scale_out;
mod tls;
mod uplink_attacks;
mod util;
