//! The catalog: device types (how a type's uplinks are decoded and mapped)
//! and devices (what is known of each device), managed through the API
//! and read by the pipeline.

use async_trait::async_trait;
use serde_json::{Map, Value};
use weft_model::{Device, DeviceEvent, DeviceType};

use crate::Result;

/// Filters of `GET /api/v1/devices`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFilter {
    /// Only devices of this type.
    pub device_type: Option<String>,
    /// Only devices on this channel.
    pub channel: Option<String>,
    /// Only devices whose records hold all these label values
    /// (compared as strings; numbers and booleans by their JSON text).
    pub records: Vec<(String, String)>,
}

/// A page of `GET /api/v1/devices` as the console asks for it: the
/// filter, a search, and where the page starts. Paging and search run in
/// the database, so a page of 100,000 devices costs what a page of ten
/// does (the id order is the primary key's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DevicePageQuery {
    /// Type, channel and record filters, as for a full listing.
    pub filter: DeviceFilter,
    /// Only devices whose id or name contains this, ignoring case
    /// (already lower-cased; `None`: all).
    pub search: Option<String>,
    /// Most devices on the page.
    pub limit: usize,
    /// Devices skipped before the page, in id order.
    pub offset: usize,
}

/// A device as a page of the listing shows it: the device with when it
/// was last heard of and its network-server state.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSummary {
    /// The device as registered (or as first seen).
    pub device: Device,
    /// Epoch ms of the latest of its stored data units' `reportedAt` and
    /// its events' arrival; `None` when nothing came yet.
    pub last_seen: Option<i64>,
    /// As [`CatalogStore::device_state`].
    pub state: Map<String, Value>,
}

/// One page of devices and how many match in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DevicePage {
    /// How many devices match the query's filter and search.
    pub total: u64,
    /// The page, in id order.
    pub devices: Vec<DeviceSummary>,
}

/// Device types and devices: configuration that the API creates, replaces
/// and deletes, and that the pipeline reads to process uplinks. (The
/// pipeline also adds devices seen for the first time, with its batches:
/// [`ProcessedBatch::new_devices`](crate::ProcessedBatch::new_devices).)
#[async_trait]
pub trait CatalogStore: Send + Sync {
    // --- device types -----------------------------------------------------

    /// Creates or replaces a device type; `true` if it was created.
    async fn put_device_type(&self, name: &str, device_type: &DeviceType) -> Result<bool>;
    /// All device types, by name.
    async fn list_device_types(&self) -> Result<Vec<(String, DeviceType)>>;
    /// Deletes a device type; `true` if it existed.
    async fn delete_device_type(&self, name: &str) -> Result<bool>;

    // --- devices ----------------------------------------------------------

    /// Creates or replaces a device (`device.id` is the key); `true` if created.
    async fn put_device(&self, device: &Device) -> Result<bool>;
    /// Devices matching `filter`, ordered by id.
    async fn list_devices(&self, filter: &DeviceFilter) -> Result<Vec<Device>>;
    /// One page of the devices matching `query`, in id order, with the
    /// count of all that match.
    async fn page_devices(&self, query: &DevicePageQuery) -> Result<DevicePage>;
    /// Deletes a device, with its events and state; `true` if it existed.
    async fn delete_device(&self, id: &str) -> Result<bool>;

    // --- device events (stored with the pipeline's batches) ----------------

    /// The device's state left by network-server events: per kind of
    /// event (`join`, `status`, `location`, `ack`, `txack`, …), the
    /// summary of the latest ([`DeviceEvent::summary`]), for at most
    /// [`DEVICE_STATE_KINDS`] kinds. Empty when none arrived.
    async fn device_state(&self, device_id: &str) -> Result<Map<String, Value>>;
    /// The device's latest events, newest first, at most `limit`
    /// (optionally only those named `event`). The last
    /// [`DEVICE_EVENTS_KEPT`] of each device are kept.
    async fn device_events(
        &self,
        device_id: &str,
        event: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeviceEvent>>;
}

/// How many events of each device are kept: enough to see what a device
/// went through lately (a day of status reports, its last joins), while a
/// chatty device cannot grow the table without bound. The state keeps the
/// latest of each kind however old.
pub const DEVICE_EVENTS_KEPT: usize = 200;

/// Most kinds of event a device's state holds: the kinds network servers
/// send are a dozen; past this many, events of a new kind are still kept
/// as events but add no state, so a sender inventing names cannot grow a
/// device's record without bound.
pub const DEVICE_STATE_KINDS: usize = 32;

/// Helper for backends: whether `device` passes the record filters and
/// the search of `query` (for the backends' Rust-side filtering).
pub fn device_matches(device: &Device, query: &DevicePageQuery) -> bool {
    let records = query.filter.records.iter().all(|(label, value)| {
        record_text(&device.records, label).as_deref() == Some(value.as_str())
    });
    let found = query.search.as_deref().is_none_or(|q| {
        device.id.to_lowercase().contains(q) || device.name.to_lowercase().contains(q)
    });
    records && found
}

/// Helper for backends: whether a (lower-cased) search can be looked for
/// in a device's stored JSON text before its name is read out of it. A
/// text without quotes, backslashes or control characters (what JSON
/// escapes) that occurs in the id or the name occurs in the JSON text as
/// it is, so a row whose text lacks it cannot match.
pub fn search_in_json_text(search: &str) -> bool {
    !search
        .chars()
        .any(|c| c == '"' || c == '\\' || c.is_control())
}

/// Helper for backends: a device's records as the `(label, text)` pairs a
/// [`DeviceFilter`] compares against.
pub fn record_text(records: &Map<String, Value>, label: &str) -> Option<String> {
    records.get(label).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}
