//! What the embedded broker does with a device's PUBLISH, on weft's tokio
//! runtime: check the topic names the device that logged in, read it into
//! uplinks (or a command answer) and commit them to the ingest log. The
//! [`Verdict`] tells the connection whether it may acknowledge: a QoS 1
//! PUBACK is sent only for [`Verdict::Done`], so an acknowledged message
//! is always in the ingest log.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_pipeline::{uplink, AcceptError, Services};

use crate::topics::{self, Format, Message, Route};

use super::SOURCE;

/// How long one message keeps trying to enter an overloaded ingest log
/// before its connection is closed unacknowledged. Meanwhile the device's
/// other messages wait behind it (MQTT's own flow control: the broker
/// stops reading the connection once its in-flight window is full).
const INGEST_RETRY_FOR: Duration = Duration::from_secs(10);

/// What the connection does with a message once weft has looked at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Finished with: committed, an answer recorded, or refused for good (a
    /// payload weft cannot read is counted and logged; resending it would
    /// not help). Acknowledged.
    Done,
    /// The topic names another device than the one logged in: nothing is
    /// kept and the connection is closed, as an ACL's deny-and-disconnect
    /// does; MQTT 3.1.1 has no negative PUBACK.
    Denied,
    /// The ingest log did not take it (overloaded, or weft is stopping):
    /// not acknowledged, the connection is closed and the device sends it
    /// again when it reconnects.
    NotCommitted,
}

/// The tokio side of the broker: reads and commits what devices publish.
pub(super) struct Uplinks {
    services: Arc<Services>,
    route: Route,
    shutdown: CancellationToken,
}

impl Uplinks {
    /// Reads with the `[mqtt] api_keys` of `api_keys`.
    pub(super) fn new(
        services: Arc<Services>,
        api_keys: std::collections::BTreeMap<String, String>,
        shutdown: CancellationToken,
    ) -> Uplinks {
        Uplinks {
            services,
            route: Route {
                api_keys,
                unknown_keys_use_device_type: true,
                source: SOURCE.to_string(),
                f_port: 1,
                device_level: 1,
                ..Route::default()
            },
            shutdown,
        }
    }

    /// One message `device` published on `topic`: read it and append its
    /// uplinks; returns once they are committed (or why not).
    pub(super) async fn publish(&self, device: &str, topic: &str, payload: &[u8]) -> Verdict {
        let count = |o: &'static str| {
            metrics::counter!("weft_mqtt_messages_total", "source" => SOURCE, "outcome" => o)
                .increment(1);
        };
        count("received");
        let Some((format, named)) = route_of(topic) else {
            // Not one of weft's topics: the broker relays nothing between
            // devices, so there is no one to hand it to (docs/mqtt.md).
            count("ignored");
            return Verdict::Done;
        };
        if named != device {
            count("refused");
            tracing::warn!(
                device = %device.escape_default(),
                topic = %topic.escape_default(),
                "MQTT broker: a device published on another device's topic; disconnected"
            );
            return Verdict::Denied;
        }
        let legacy_answer = topic.ends_with("/cmdexe")
            && !topic.trim_start_matches('/').starts_with("json/")
            && !topic.trim_start_matches('/').starts_with("ul/");
        let format = if legacy_answer && !payload.trim_ascii_start().starts_with(b"{") {
            Format::IotaUl
        } else {
            format
        };
        let uplinks = match topics::read(format, &self.route, topic, payload, weft_model::now_ms())
        {
            Ok(Message::Uplinks(u)) => u,
            Ok(Message::Ignored) => return Verdict::Done,
            Ok(Message::CommandAnswer {
                device,
                answers,
                pins,
            }) => {
                match uplink::command_result(&self.services, &device, &answers, &pins).await {
                    Ok(answered) if !answered.is_empty() => count("committed"),
                    Ok(_) => {
                        count("refused");
                        tracing::warn!(%device, %topic, "MQTT broker: command answer names no command of the device");
                    }
                    Err(e) => {
                        count("refused");
                        tracing::warn!(%device, %topic, "MQTT broker: command answer refused: {e}");
                    }
                }
                return Verdict::Done;
            }
            Err(reason) => {
                count("refused");
                tracing::warn!(%device, %topic, "MQTT broker: message refused: {reason}");
                return Verdict::Done;
            }
        };
        if self.shutdown.is_cancelled() {
            count("unacknowledged");
            return Verdict::NotCommitted;
        }
        let arrival = uplink::Arrival {
            uplinks,
            parsed: None,
            route: topics::downlink_route(format, SOURCE, topic, payload),
        };
        let patience = uplink::Patience::Retry {
            stop: self.shutdown.clone(),
            max_delay: Duration::from_secs(2),
            give_up_after: Some(INGEST_RETRY_FOR),
        };
        match uplink::accept(&self.services, arrival, &patience).await {
            Ok(()) => {
                count("committed");
                Verdict::Done
            }
            Err(AcceptError::Forbidden(reason)) => {
                count("refused");
                tracing::warn!(%device, %topic, "MQTT broker: message refused: {reason}");
                Verdict::Done
            }
            Err(e) => {
                count("unacknowledged");
                tracing::warn!(error = %e, %device, "MQTT broker: the ingest log did not take a message; closing the connection unacknowledged");
                Verdict::NotCommitted
            }
        }
    }
}

/// The format of a broker topic and the device it names; `None` for a
/// topic that is not one of weft's.
pub(super) fn route_of(topic: &str) -> Option<(Format, &str)> {
    let levels: Vec<&str> = topic
        .strip_prefix('/')
        .unwrap_or(topic)
        .split('/')
        .collect();
    match levels.as_slice() {
        ["json", _, device, "attrs", ..] => Some((Format::IotaJson, device)),
        ["ul", _, device, "attrs", ..] => Some((Format::IotaUl, device)),
        ["json", _, device, "cmdexe"] => Some((Format::IotaJson, device)),
        ["ul", _, device, "cmdexe"] => Some((Format::IotaUl, device)),
        // The older answer topic, `/{apikey}/{device}/cmdexe`, says no
        // protocol: a JSON object is IoT Agent JSON's, anything else
        // UltraLight's.
        [_, device, "cmdexe"] if topic.starts_with('/') => Some((Format::IotaJson, device)),
        ["devices", device, "up"] if !topic.starts_with('/') => Some((Format::Plain, device)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_their_device() {
        assert_eq!(route_of("/json/k/d1/attrs"), Some((Format::IotaJson, "d1")));
        assert_eq!(
            route_of("json/k/d1/attrs/t"),
            Some((Format::IotaJson, "d1"))
        );
        assert_eq!(route_of("/ul/k/d2/attrs"), Some((Format::IotaUl, "d2")));
        assert_eq!(route_of("/k/d2/cmdexe"), Some((Format::IotaJson, "d2")));
        assert_eq!(route_of("/ul/k/d2/cmdexe"), Some((Format::IotaUl, "d2")));
        assert_eq!(route_of("devices/d3/up"), Some((Format::Plain, "d3")));
        assert_eq!(route_of("devices/d3/down"), None);
        assert_eq!(route_of("/devices/d3/up"), None);
    }
}
