//! Reading one notification as Orion sends it (attrsFormat `normalized`):
//!
//! ```text
//! POST /notify
//! Content-Type: application/json; charset=utf-8
//! Fiware-Service: <tenant>
//! Fiware-ServicePath: /
//! Fiware-Correlator: <id>
//!
//! {"subscriptionId":"<id>","data":[{"id":"Room7","type":"Room",
//!   "a1":{"type":"Number","value":1234567042,"metadata":{}},…}]}
//! ```
//!
//! The sink reads tens of thousands of these a second on a machine it
//! shares with the server, so a body is parsed into borrowed strings and
//! only what the checks need is kept: the subscription, the entity, and the
//! newest [stamp] among the attributes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use super::stamp;

/// What the checks need from a notification body.
#[derive(Debug, PartialEq, Eq)]
pub struct Notification<'a> {
    /// Which subscription fired.
    pub subscription_id: Cow<'a, str>,
    /// The entity it carries (Orion sends one per notification).
    pub entity_id: Cow<'a, str>,
    /// The largest attribute value that is a send-time stamp (non-negative
    /// integer, not 0): the value of the update that triggered the
    /// notification. `None` when every attribute is still at its creation
    /// value, or none was sent.
    pub newest: Option<u64>,
}

/// A notification body, as deserialised.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(rename = "subscriptionId", borrow)]
    subscription_id: Cow<'a, str>,
    #[serde(borrow)]
    data: Vec<Entity<'a>>,
}

/// An entity of `data`: its id and the newest stamp among its attributes.
struct Entity<'a> {
    id: Option<Cow<'a, str>>,
    newest: Option<u64>,
}

/// A normalized attribute: only `value` is read (`type`, `metadata` skipped).
#[derive(Deserialize)]
struct Attribute {
    #[serde(default)]
    value: serde_json::Value,
}

/// A string borrowed from the body when it has no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Entity<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntityVisitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for EntityVisitor<'a> {
            type Value = Entity<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an NGSIv2 entity in normalized form")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Entity<'a>, M::Error> {
                let mut entity = Entity {
                    id: None,
                    newest: None,
                };
                while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
                    match key.as_ref() {
                        "id" => entity.id = Some(map.next_value::<Text<'de>>()?.0),
                        "type" => {
                            map.next_value::<IgnoredAny>()?;
                        }
                        _ => {
                            let attribute: Attribute = map.next_value()?;
                            let stamp = match &attribute.value {
                                serde_json::Value::Number(n) => stamp::from_json(n),
                                _ => None,
                            };
                            if let Some(v) = stamp.filter(|&v| v > 0) {
                                entity.newest = Some(entity.newest.map_or(v, |n| n.max(v)));
                            }
                        }
                    }
                }
                Ok(entity)
            }
        }

        deserializer.deserialize_map(EntityVisitor(std::marker::PhantomData))
    }
}

/// Parses a notification body; `Err` says why it is not one the bench
/// can account for (unreadable, or not exactly one entity with an id).
pub fn parse(body: &[u8]) -> Result<Notification<'_>, String> {
    let body: Body = serde_json::from_slice(body).map_err(|e| format!("unreadable body: {e}"))?;
    let count = body.data.len();
    let mut data = body.data.into_iter();
    let (Some(entity), None) = (data.next(), data.next()) else {
        return Err(format!("expected 1 entity in data, got {count}"));
    };
    let Some(entity_id) = entity.id else {
        return Err("the entity in data has no id".to_string());
    };
    Ok(Notification {
        subscription_id: body.subscription_id,
        entity_id,
        newest: entity.newest,
    })
}

/// The headers of a notification the checks look at.
#[derive(Debug, Default, Clone, Copy)]
pub struct Headers<'a> {
    /// `Content-Type`.
    pub content_type: Option<&'a [u8]>,
    /// `Fiware-Service`.
    pub service: Option<&'a [u8]>,
    /// `Fiware-ServicePath`.
    pub service_path: Option<&'a [u8]>,
    /// `Fiware-Correlator`.
    pub correlator: Option<&'a [u8]>,
}

/// Checks the headers Orion sends with every notification: a JSON content
/// type, the subscription's tenant in `Fiware-Service`, a
/// `Fiware-ServicePath`, and a `Fiware-Correlator`. `Err` names the first
/// one that is off.
pub fn check_headers(h: &Headers<'_>, tenant: &str) -> Result<(), String> {
    let show = |v: Option<&[u8]>| match v {
        Some(v) => format!("{:?}", String::from_utf8_lossy(v)),
        None => "missing".to_string(),
    };
    let json = h.content_type.is_some_and(|v| {
        let media = v.split(|&b| b == b';').next().unwrap_or_default();
        media.trim_ascii().eq_ignore_ascii_case(b"application/json")
    });
    if !json {
        return Err(format!(
            "Content-Type is {}, not application/json",
            show(h.content_type)
        ));
    }
    if h.service != Some(tenant.as_bytes()) {
        return Err(format!(
            "Fiware-Service is {}, not {tenant:?}",
            show(h.service)
        ));
    }
    if h.service_path.is_none_or(|v| !v.starts_with(b"/")) {
        return Err(format!("Fiware-ServicePath is {}", show(h.service_path)));
    }
    if h.correlator.is_none_or(<[u8]>::is_empty) {
        return Err(format!("Fiware-Correlator is {}", show(h.correlator)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORION: &str = r#"{"subscriptionId":"5f0e1c6ab811114222833344","data":[{"id":"Room7","type":"Room","a1":{"type":"Number","value":1234567042,"metadata":{}},"a2":{"type":"Number","value":0,"metadata":{}},"a3":{"type":"Number","value":1234999001.0,"metadata":{}}}]}"#;

    #[test]
    fn parses_an_orion_notification() {
        let n = parse(ORION.as_bytes()).unwrap();
        assert_eq!(n.subscription_id, "5f0e1c6ab811114222833344");
        assert_eq!(n.entity_id, "Room7");
        assert!(matches!(n.entity_id, Cow::Borrowed(_)));
        // The newest stamp wins, whatever its rendering.
        assert_eq!(n.newest, Some(1_234_999_001));
    }

    #[test]
    fn attributes_without_stamps() {
        // Only creation values (an initial notification): no stamp.
        let body = r#"{"subscriptionId":"s","data":[{"id":"Room1","type":"Room","a1":{"type":"Number","value":0,"metadata":{}}}]}"#;
        assert_eq!(parse(body.as_bytes()).unwrap().newest, None);
        // Other shapes of values are skipped, not errors; key order is free.
        let body = r#"{"data":[{"a1":{"value":"x"},"a2":{"value":{"k":[1,2]}},"a3":{"value":null},"a4":{"type":"Number"},"a5":{"value":-5},"a6":{"value":7.5},"type":"Room","id":"Room\u0031"}],"subscriptionId":"s"}"#;
        let n = parse(body.as_bytes()).unwrap();
        assert_eq!(n.newest, None);
        assert_eq!(n.entity_id, "Room1");
        assert!(matches!(n.entity_id, Cow::Owned(_)), "unescaped");
        // Entity id and type only: nothing to stamp.
        let body = r#"{"subscriptionId":"s","data":[{"id":"Room1","type":"Room"}]}"#;
        assert_eq!(parse(body.as_bytes()).unwrap().newest, None);
    }

    #[test]
    fn refuses_what_it_cannot_account_for() {
        for (body, why) in [
            ("nope", "unreadable"),
            (r#"{"data":[]}"#, "unreadable"),
            (r#"{"subscriptionId":"s","data":[]}"#, "got 0"),
            (
                r#"{"subscriptionId":"s","data":[{"id":"A"},{"id":"B"}]}"#,
                "got 2",
            ),
            (
                r#"{"subscriptionId":"s","data":[{"type":"Room"}]}"#,
                "no id",
            ),
            (
                r#"{"subscriptionId":"s","data":[{"id":"A","a1":5}]}"#,
                "unreadable",
            ),
            (r#"{"subscriptionId":7,"data":[{"id":"A"}]}"#, "unreadable"),
        ] {
            let err = parse(body.as_bytes()).unwrap_err();
            assert!(err.contains(why), "{body}: {err}");
        }
    }

    #[test]
    fn checks_orion_headers() {
        let good = Headers {
            content_type: Some(b"application/json; charset=utf-8"),
            service: Some(b"benchabc"),
            service_path: Some(b"/"),
            correlator: Some(b"3f2a-11"),
        };
        assert_eq!(check_headers(&good, "benchabc"), Ok(()));
        let plain = Headers {
            content_type: Some(b"Application/JSON"),
            ..good
        };
        assert_eq!(check_headers(&plain, "benchabc"), Ok(()));

        let err = |h: Headers<'_>| check_headers(&h, "benchabc").unwrap_err();
        assert!(err(Headers {
            content_type: Some(b"text/plain"),
            ..good
        })
        .contains("Content-Type is \"text/plain\""));
        assert!(err(Headers {
            content_type: None,
            ..good
        })
        .contains("Content-Type is missing"));
        assert!(err(Headers {
            service: Some(b"other"),
            ..good
        })
        .contains("Fiware-Service is \"other\", not \"benchabc\""));
        assert!(err(Headers {
            service: None,
            ..good
        })
        .contains("Fiware-Service is missing"));
        assert!(err(Headers {
            service_path: None,
            ..good
        })
        .contains("Fiware-ServicePath"));
        assert!(err(Headers {
            correlator: Some(b""),
            ..good
        })
        .contains("Fiware-Correlator"));
    }
}
