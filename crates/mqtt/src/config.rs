//! `[mqtt]` and `[mqtt.sources.<name>]`: what the configuration says about
//! MQTT, checked once at start ([`SourceConfig::check`]) so a typo stops
//! weft with a message instead of a source that silently never connects.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::topics::Format;

/// `[mqtt]`: the embedded broker and the brokers weft subscribes to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Address of the embedded broker devices publish to (`127.0.0.1:1883`);
    /// none: no embedded broker.
    pub listen: Option<SocketAddr>,
    /// The embedded broker's IoT-Agent API keys and the device type each
    /// stands for (`/json/{apikey}/…`); a key not listed uses the
    /// registered device's type.
    pub api_keys: BTreeMap<String, String>,
    /// Brokers weft subscribes to, by name.
    pub sources: BTreeMap<String, SourceConfig>,
}

/// `[mqtt.sources.<name>]`: one broker weft subscribes to.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    /// `mqtt://host:1883` or `mqtts://host:8883`.
    pub url: String,
    /// `ttn`, `chirpstack`, `iota-json`, `iota-ul` or `plain`.
    pub format: String,
    /// Topic filter subscribed to; each format has a default
    /// ([`Format::default_topic`]), `plain` has none.
    pub topic: Option<String>,
    /// User name on the broker.
    pub username: Option<String>,
    /// Password on the broker.
    pub password: Option<String>,
    /// MQTT client id; `weft-<name>` by default. The broker keeps the
    /// session (and the messages not yet acknowledged) under it, so it
    /// must be stable and, with several weft nodes, differ per node.
    pub client_id: Option<String>,
    /// QoS of the subscription: 1 (at least once, the default), 0 or 2.
    pub qos: u8,
    /// PEM file of the certificate authorities trusted for `mqtts://`
    /// (default: the system's and the web's roots).
    pub ca_file: Option<PathBuf>,
    /// Device type of every message (required for `plain`); for the other
    /// formats it overrides the type found otherwise, as `?type=` does on
    /// the webhook paths.
    pub device_type: Option<String>,
    /// Channel of every message (default: what the message or device says).
    pub channel: Option<String>,
    /// `plain`: the topic level (0-based) holding the device id; default:
    /// the first `+` of `topic`.
    pub device_level: Option<usize>,
    /// `plain`: the topic level (0-based) holding the channel, if any.
    pub channel_level: Option<usize>,
    /// `plain`: fPort handed to the decoder for binary payloads.
    pub f_port: u32,
    /// IoT-Agent formats: API keys and the device type each stands for.
    pub api_keys: BTreeMap<String, String>,
    /// QoS of what weft publishes on this source (downlinks): 1 (the
    /// default: a downlink is sent once the broker's PUBACK came back) or 0
    /// (sent once written to the connection), for brokers that take only
    /// QoS 0.
    pub downlink_qos: u8,
    /// The broker's shared subscription group (`$share/<group>/<topic>`)
    /// the source subscribes through. When weft runs clustered it always
    /// does, with `weft-<name>` unless this names another group, so each
    /// message goes to one node; a single node subscribes plainly unless
    /// this is set.
    pub shared_group: Option<String>,
    /// For tests only: how long each message waits before it is written
    /// to the ingest log, so a test can kill weft between the broker's
    /// delivery and the commit. Never set it in production.
    #[serde(with = "humantime_serde")]
    pub test_commit_delay: Option<Duration>,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            url: String::new(),
            format: String::new(),
            topic: None,
            username: None,
            password: None,
            client_id: None,
            qos: 1,
            ca_file: None,
            device_type: None,
            channel: None,
            device_level: None,
            channel_level: None,
            f_port: 1,
            api_keys: BTreeMap::new(),
            shared_group: None,
            downlink_qos: 1,
            test_commit_delay: None,
        }
    }
}

impl SourceConfig {
    /// The format, topic filter and device level this source runs with,
    /// or what is wrong with it.
    pub fn check(&self, name: &str) -> Result<(Format, String, Option<usize>), String> {
        let at = |what: String| format!("mqtt.sources.{name}: {what}");
        if name == weft_pipeline::mqtt::BROKER_SOURCE {
            return Err(at(format!(
                "the name '{name}' is the embedded broker's; give the source another"
            )));
        }
        if let Some(group) = &self.shared_group {
            if group.is_empty() || group.contains(['/', '+', '#', '\0']) {
                return Err(at(format!(
                    "shared_group '{group}' must be a name without '/', '+' or '#'"
                )));
            }
        }
        weft_pipeline::mqtt::BrokerUrl::parse(&self.url).map_err(at)?;
        let format = Format::parse(&self.format).ok_or_else(|| {
            at(format!(
                "format '{}' is not one of ttn, chirpstack, iota-json, iota-ul, plain",
                self.format
            ))
        })?;
        let topic = match (&self.topic, format.default_topic()) {
            (Some(t), _) => t.clone(),
            (None, Some(t)) => t.to_string(),
            (None, None) => return Err(at("format 'plain' needs a topic".into())),
        };
        if topic.is_empty() || topic.contains('\0') {
            return Err(at(format!("topic '{topic}' is not a topic filter")));
        }
        if self.qos > 2 {
            return Err(at("qos must be 0, 1 or 2".into()));
        }
        if self.downlink_qos > 1 {
            return Err(at("downlink_qos must be 0 or 1".into()));
        }
        if self.username.is_none() && self.password.is_some() {
            return Err(at("a password needs a username".into()));
        }
        let mut level = None;
        if format == Format::Plain {
            if self.device_type.is_none() {
                return Err(at("format 'plain' needs a device_type".into()));
            }
            let levels: Vec<&str> = topic.split('/').collect();
            let at_level = match self.device_level {
                Some(l) => l,
                None => levels.iter().position(|l| *l == "+").ok_or_else(|| {
                    at(
                        "format 'plain' needs device_level or a '+' in topic for the device id"
                            .into(),
                    )
                })?,
            };
            if at_level >= levels.len() || levels[..=at_level].contains(&"#") {
                return Err(at(format!(
                    "device_level {at_level} is not a level of topic '{topic}'"
                )));
            }
            level = Some(at_level);
            if let Some(c) = self.channel_level {
                if c >= levels.len() || levels[..=c].contains(&"#") || c == at_level {
                    return Err(at(format!(
                        "channel_level {c} is not a level of topic '{topic}' apart from the device's"
                    )));
                }
            }
        }
        let named = |e: weft_model::validate::Invalid| at(e.to_string());
        if let Some(device_type) = &self.device_type {
            weft_model::validate::device_type_name("device_type", device_type).map_err(named)?;
        }
        if let Some(channel) = &self.channel {
            weft_model::validate::channel("channel", channel).map_err(named)?;
        }
        for (key, device_type) in &self.api_keys {
            weft_model::validate::device_type_name(&format!("api_keys.{key}"), device_type)
                .map_err(named)?;
        }
        Ok((format, topic, level))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(format: &str) -> SourceConfig {
        SourceConfig {
            url: "mqtt://127.0.0.1:1883".into(),
            format: format.into(),
            ..SourceConfig::default()
        }
    }

    #[test]
    fn formats_have_default_topics_but_plain() {
        let (f, topic, _) = source("ttn").check("a").unwrap();
        assert_eq!((f, topic.as_str()), (Format::Ttn, "v3/+/devices/+/#"));
        assert!(source("plain")
            .check("a")
            .unwrap_err()
            .contains("needs a topic"));
        let mut plain = source("plain");
        plain.topic = Some("site/+/sensors/+/data".into());
        assert!(plain.check("a").unwrap_err().contains("device_type"));
        plain.device_type = Some("thermo".into());
        assert_eq!(plain.check("a").unwrap().2, Some(1));
        plain.device_level = Some(3);
        assert_eq!(plain.check("a").unwrap().2, Some(3));
        plain.device_level = Some(9);
        assert!(plain.check("a").is_err());
        assert!(source("kafka").check("a").is_err());
        let mut bad = source("ttn");
        bad.url = "http://x".into();
        assert!(bad.check("a").is_err());
    }
}
