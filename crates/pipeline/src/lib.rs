//! weft's services: everything that changes state, each service owning
//! its own, wired together once by [`Services::start`].
//!
//! - [`ingest`]: the way uplinks come in and the consumer that turns the
//!   ingest log into data units (log → [`decode`] → commit → publish),
//!   behind [`Ingest`].
//! - [`catalog`]: device types and devices, cached for the hot path.
//! - [`context`]: every tenant's NGSI entities; [`entity`] says how device
//!   data becomes an entity.
//! - [`ngsi_write`]: the NGSI write, every change clients make to
//!   entities as one typed operation (commands, forwarding, operators,
//!   stamps, the atomic write).
//! - [`subscriptions`] and [`registrations`]: NGSI subscriptions (and the
//!   notifications they send) and registrations; [`forwarding`]: what
//!   goes to registered context providers, and how their answers merge;
//!   [`orion_metrics`]: Orion's request counters.
//! - [`ld_contexts`]: the `@context`s NGSI-LD requests name, fetched
//!   once and kept.
//! - [`history`]: entity changes and notifications recorded as time series.
//! - [`rules`]: alarm rules evaluated on stored units, and their alarms.
//! - [`channels`]: durable pull channels and the bridges feeding them.
//! - [`downlinks`]: per-device downlink queues, their delivery through
//!   the route each device's uplinks came by, and NGSI commands.
//! - [`partitions`]: the stored cursors of the pipeline's partitions, and
//!   the device data applied again to the entities from them.
//! - [`filter`]: the event filter the live stream and the bridges share.
//! - [`outbound`]: the one HTTP client and retry policy of everything
//!   weft sends out (notifications, forwards, downlinks, webhooks, page
//!   services).
//! - [`keys`]: API keys held in memory by hash, their rate limits, and
//!   their creation, revocation and bootstrap.
//! - [`definitions`]: every service's in-memory definitions kept in step
//!   with what other nodes change (a task per service reloading from the
//!   store what the bus says changed).
//! - [`cluster`]: this node among the others: its heartbeat, and the work
//!   done once across the cluster, run only while this node holds its
//!   lease.
//! - [`uplink`]: the uplink journey: credentials' pins, accept (the one
//!   way in for HTTP and MQTT), command results, and one module per
//!   network server's format.
//! - [`services`]: the services wired together, the value the API holds.
//!
//! Pages, which only read these services, are a crate of their own
//! (`weft-pages`).
#![deny(missing_docs)]

pub mod balance;
pub mod catalog;
pub mod changes;
pub mod channels;
pub mod cluster;
pub mod context;
pub mod decode;
pub mod definitions;
pub mod downlinks;
pub mod entity;
pub mod filter;
pub mod forwarding;
pub mod history;
pub mod ingest;
pub mod keys;
pub mod ld_contexts;
pub mod mqtt;
pub mod ngsi_write;
pub mod orion_metrics;
pub mod outbound;
pub mod partitions;
pub mod registrations;
pub mod rules;
pub mod services;
pub mod subscriptions;
#[cfg(test)]
mod testkit;
pub mod uplink;

pub use catalog::{Catalog, CatalogError, TypeEntry};
pub use decode::Produced;
pub use ingest::{AcceptError, Ingest, IngestConfig, CONSUMER, ENTITY_FLUSH_INTERVAL};
pub use services::{Services, ServicesConfig};
