//! weft's domain model: the types every other crate speaks, and the pure
//! logic over them. Nothing here does I/O, so everything here is tested by
//! plain unit tests.
//!
//! - [`uplink`]: what a device or network server sent, as kept in the ingest log.
//! - [`unit`]: the data unit, the canonical record the pipeline produces.
//! - [`device`]: device types (decoder + processor) and devices (records, static data).
//! - [`device_event`]: network servers' events about devices that are not
//!   uplinks (joins, status, acks, …) and the state they leave.
//! - [`downlink`]: downlinks queued for devices, and the routes that reach them.
//! - [`mapping`]: the processor's field mappings from an uplink body to a data unit.
//! - [`query`]: the NGSI Simple Query Language (`q`, `mq`), shared by live
//!   filters, NGSI queries, subscriptions and rules.
//! - [`ngsi`]: NGSIv2 context entities: attributes, metadata, their
//!   representations and Orion's validation rules.
//! - [`ngsi_ld`]: NGSI-LD over the same entities: `@context`s, the
//!   NGSI-LD representations, its errors.
//! - [`geo`]: geometry for `geo:json` attributes and geo-queries.
//! - [`page`]: page templates in Knot.x 1.x markup, split into static parts and snippets.
//! - [`validate`]: what names, labels and fields of definitions may be, in one place.
//! - [`rule`]: alarm rules (scope, condition, `for`, `repeat`, inactivity).
//! - [`alarm`]: alarms, their lifecycle and the events announcing changes.
//! - [`channel`]: durations of the durable channels' API (DSPS).
//! - [`jexl`]: JEXL expressions and `${…}` templates of custom notifications.
//! - [`json`]: depth and number limits on JSON kept as clients sent it.
//! - [`apikey`]: API keys: roles, scopes, secrets and their hashes.
#![deny(missing_docs)]

pub mod alarm;
pub mod apikey;
pub mod channel;
pub mod device;
pub mod device_event;
pub mod downlink;
pub mod geo;
pub mod history;
pub mod jexl;
pub mod json;
pub mod mapping;
pub mod ngsi;
pub mod ngsi_ld;
pub mod page;
pub mod query;
pub mod rule;
pub mod secret;
pub mod unit;
pub mod uplink;
pub mod validate;

pub use alarm::{Alarm, AlarmChange, AlarmEvent, AlarmState, Severity};
pub use device::{Decoder, Device, DeviceType, Mapping, Processor, SubDevice};
pub use device_event::DeviceEvent;
pub use downlink::{Downlink, DownlinkRoute, DownlinkStatus};
pub use rule::{Rule, RuleSpec};
pub use unit::{DataUnit, DeviceInfo, FailedUplink, FailureReason};
pub use uplink::{NewUplink, Uplink, UplinkFormat, UplinkPins};

/// Milliseconds since the Unix epoch, the time unit of data units.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
