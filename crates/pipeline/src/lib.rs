//! weft's services: everything that changes state.
//!
//! - [`ingest`]: the uplink pipeline, ingest log → decode → process →
//!   enrich → store → publish, behind [`Ingest`].
//! - [`catalog`] caches device types and devices for the hot path.
//! - [`rules`] evaluates alarm rules on the stored units (handed over by
//!   the committer) and keeps the alarms.
#![deny(missing_docs)]

pub mod catalog;
pub mod changes;
pub mod channels;
pub mod context;
pub mod decode;
pub mod entity;
pub mod filter;
pub mod history;
pub mod ingest;
pub mod pages;
pub mod registrations;
pub mod rules;
pub mod subscriptions;

pub use catalog::{Catalog, CatalogError, TypeEntry};
pub use decode::Produced;
pub use ingest::{AcceptError, Ingest, PipelineConfig, CONSUMER, ENTITY_FLUSH_INTERVAL};
