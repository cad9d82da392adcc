//! A committed change to an entity, as its consumers take it: NGSI
//! subscriptions match it, the live `entities` stream forwards it, and a
//! second node will receive it over the bus.
//!
//! The change is owned (not borrowed from the context's map) because it
//! outlives the write that made it: it is announced only once the store
//! has committed that write, after the context's lock is released.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::render::Normalized;
use super::{AttrChange, Attribute, ChangeKind, Entity};

/// What happened to an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alteration {
    /// Created (every attribute is new).
    Created,
    /// Attributes written (changed or not).
    Updated,
    /// Deleted (the entity is its last state).
    Deleted,
}

impl Alteration {
    /// The name the live stream uses (`created`, `updated`, `deleted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Alteration::Created => "created",
            Alteration::Updated => "updated",
            Alteration::Deleted => "deleted",
        }
    }
}

/// The headers of the request that made a change, which notifications
/// repeat (as Orion propagates them).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// `Fiware-Correlator` (echoed or minted).
    pub correlator: String,
    /// `Fiware-Service` as sent, also when it does not select a tenant
    /// (single-tenant mode).
    pub service: Option<String>,
    /// `X-Auth-Token`, for `${authToken}` and the notification header.
    pub auth_token: Option<String>,
    /// The request is a custom notification (`Ngsiv2-AttrsFormat:
    /// custom`): Orion's self-notification loop protection looks at
    /// these (see [`Origin::correlator_root`]).
    pub custom_notification: bool,
}

impl Origin {
    /// The correlator without its decorations (`; cbnotif=<n>`,
    /// `; cbfwd=<n>`): the request that started a chain of notifications,
    /// as Orion's `correlatorRoot` reads it (up to the first `;`).
    pub fn correlator_root(&self) -> &str {
        correlator_root(&self.correlator)
    }

    /// How many notifications deep the request is: the number of
    /// `cbnotif=` marks its correlator carries (0 for a request no
    /// broker sent). Each broker appends `; cbnotif=<n>` to the correlator
    /// of the request that triggered a notification, so a notification
    /// caused by a notification carries two, and so on.
    pub fn notification_depth(&self) -> usize {
        notification_depth(&self.correlator)
    }
}

/// `correlator` up to its first `;`, trimmed (Orion's `correlatorRoot`).
pub fn correlator_root(correlator: &str) -> &str {
    correlator.split(';').next().unwrap_or_default().trim()
}

/// The number of `cbnotif=` marks in `correlator` (see
/// [`Origin::notification_depth`]).
pub fn notification_depth(correlator: &str) -> usize {
    correlator
        .split(';')
        .skip(1)
        .filter(|part| part.trim_start().starts_with("cbnotif="))
        .count()
}

/// One committed change to an entity: the entity after the change (its
/// last state, for a deletion) and the attributes the operation touched.
#[derive(Debug, Clone)]
pub struct EntityChange {
    /// Tenant (`Fiware-Service`; empty for the default tenant).
    pub tenant: String,
    /// Service path of the entity.
    pub service_path: String,
    /// The entity's state after the change (last state when deleted),
    /// shared with the context's copy: a change is announced to every
    /// listener without copying the entity.
    pub entity: Arc<Entity>,
    /// Kind of change.
    pub alteration: Alteration,
    /// Attributes the operation touched, in request order.
    pub attrs: Vec<AttrChange>,
    /// The request that made the change (none for device data).
    pub origin: Option<Origin>,
}

/// An entity change as the live `entities` stream sends it.
struct Live<'a>(&'a EntityChange);

impl Serialize for Live<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let c = self.0;
        let attrs: Vec<&str> = match c.alteration {
            Alteration::Updated => c.attrs.iter().map(|a| a.name.as_str()).collect(),
            Alteration::Created | Alteration::Deleted => c.entity.attrs.keys().collect(),
        };
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("change", c.alteration.as_str())?;
        map.serialize_entry("service", &c.tenant)?;
        map.serialize_entry("servicePath", &c.service_path)?;
        map.serialize_entry("id", &c.entity.id)?;
        map.serialize_entry("type", &c.entity.entity_type)?;
        map.serialize_entry("attrs", &attrs)?;
        map.serialize_entry("entity", &Normalized(&c.entity))?;
        map.end()
    }
}

impl EntityChange {
    /// The change as the live `entities` stream sends it:
    /// `{"change","service","servicePath","id","type","attrs":[names],
    /// "entity":{normalized}}`. The request's token is never included.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(Live(self)).expect("an entity change serialises")
    }

    /// [`EntityChange::to_json`] as compact JSON bytes, written straight
    /// from the change: every change committed on a node of a cluster is
    /// sent to the others in this form.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&Live(self)).expect("an entity change serialises")
    }

    /// The change as the notification outbox logs it, to be read back by
    /// [`EntityChange::from_log`] when a subscription is served from the
    /// log instead of live: a format byte ([`LOG_FORMAT_LZ4_JSON`]), then
    /// its compact JSON compressed with LZ4 (a logged change is mostly
    /// the entity's attributes, which compress to about a quarter). The
    /// request's token is left out: it is a credential, never kept at
    /// rest, so a notification replayed from the log carries no
    /// `X-Auth-Token`.
    pub fn to_log(&self) -> Vec<u8> {
        let logged = Logged {
            tenant: &self.tenant,
            service_path: &self.service_path,
            entity: &self.entity,
            alteration: match self.alteration {
                Alteration::Created => 'c',
                Alteration::Updated => 'u',
                Alteration::Deleted => 'd',
            },
            attrs: self
                .attrs
                .iter()
                .map(|a| LoggedAttr {
                    name: a.name.clone(),
                    kind: match a.kind {
                        ChangeKind::Created => 'c',
                        ChangeKind::Updated => 'u',
                        ChangeKind::Deleted => 'd',
                    },
                    previous: a.previous.clone(),
                    modified: a.modified,
                })
                .collect(),
            origin: self.origin.as_ref().map(|o| LoggedOrigin {
                correlator: o.correlator.clone(),
                service: o.service.clone(),
                custom_notification: o.custom_notification,
            }),
        };
        let json = serde_json::to_vec(&logged).unwrap_or_default();
        let mut out = Vec::with_capacity(json.len() / 2 + 8);
        out.push(LOG_FORMAT_LZ4_JSON);
        out.extend_from_slice(&lz4_flex::compress_prepend_size(&json));
        out
    }

    /// Reads a change written by [`EntityChange::to_log`].
    pub fn from_log(bytes: &[u8]) -> Result<EntityChange, LogError> {
        let json = match bytes.split_first() {
            Some((&LOG_FORMAT_LZ4_JSON, compressed)) => {
                lz4_flex::decompress_size_prepended(compressed).map_err(|_| LogError::Corrupt)?
            }
            _ => return Err(LogError::Corrupt),
        };
        let logged: LoggedOwned = serde_json::from_slice(&json).map_err(|_| LogError::Corrupt)?;
        let kind = |c: char| match c {
            'c' => ChangeKind::Created,
            'd' => ChangeKind::Deleted,
            _ => ChangeKind::Updated,
        };
        Ok(EntityChange {
            tenant: logged.tenant,
            service_path: logged.service_path,
            entity: Arc::new(logged.entity),
            alteration: match logged.alteration {
                'c' => Alteration::Created,
                'd' => Alteration::Deleted,
                _ => Alteration::Updated,
            },
            attrs: logged
                .attrs
                .into_iter()
                .map(|a| AttrChange {
                    name: a.name,
                    kind: kind(a.kind),
                    previous: a.previous,
                    modified: a.modified,
                })
                .collect(),
            origin: logged.origin.map(|o| Origin {
                correlator: o.correlator,
                service: o.service,
                auth_token: None,
                custom_notification: o.custom_notification,
            }),
        })
    }
}

/// The first byte of a logged change: LZ4-compressed JSON (the only form
/// so far; a later one gets another byte).
pub const LOG_FORMAT_LZ4_JSON: u8 = 1;

/// Why a logged change could not be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// Not a change [`EntityChange::to_log`] wrote.
    #[error("not a logged entity change")]
    Corrupt,
}

/// The log form of a change ([`EntityChange::to_log`]), borrowing what it
/// can.
#[derive(Serialize)]
struct Logged<'a> {
    #[serde(rename = "t")]
    tenant: &'a str,
    #[serde(rename = "p")]
    service_path: &'a str,
    #[serde(rename = "e")]
    entity: &'a Entity,
    #[serde(rename = "k")]
    alteration: char,
    #[serde(rename = "a")]
    attrs: Vec<LoggedAttr>,
    #[serde(rename = "o", skip_serializing_if = "Option::is_none")]
    origin: Option<LoggedOrigin>,
}

/// [`Logged`] read back.
#[derive(Deserialize)]
struct LoggedOwned {
    #[serde(rename = "t")]
    tenant: String,
    #[serde(rename = "p")]
    service_path: String,
    #[serde(rename = "e")]
    entity: Entity,
    #[serde(rename = "k")]
    alteration: char,
    #[serde(rename = "a", default)]
    attrs: Vec<LoggedAttr>,
    #[serde(rename = "o", default)]
    origin: Option<LoggedOrigin>,
}

/// One touched attribute of a logged change.
#[derive(Serialize, Deserialize)]
struct LoggedAttr {
    #[serde(rename = "n")]
    name: String,
    #[serde(rename = "k")]
    kind: char,
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    previous: Option<Attribute>,
    #[serde(rename = "m")]
    modified: bool,
}

/// The origin of a logged change, without its token.
#[derive(Serialize, Deserialize)]
struct LoggedOrigin {
    #[serde(rename = "c")]
    correlator: String,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    service: Option<String>,
    #[serde(rename = "x", default)]
    custom_notification: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::{append, parse_attrs};
    use serde_json::json;

    /// Roots and depths of the correlators Orion and weft send.
    #[test]
    fn correlator_roots_and_depths() {
        let origin = |c: &str| Origin {
            correlator: c.into(),
            ..Origin::default()
        };
        let plain = origin("f320136c-0192-11eb-a893-000c29df7908");
        assert_eq!(
            plain.correlator_root(),
            "f320136c-0192-11eb-a893-000c29df7908"
        );
        assert_eq!(plain.notification_depth(), 0);
        let once = origin("f320136c-0192-11eb-a893-000c29df7908; cbnotif=32");
        assert_eq!(
            once.correlator_root(),
            "f320136c-0192-11eb-a893-000c29df7908"
        );
        assert_eq!(once.notification_depth(), 1);
        let twice = origin("abc; cbnotif=1; cbnotif=3");
        assert_eq!(twice.correlator_root(), "abc");
        assert_eq!(twice.notification_depth(), 2);
        // A forward is not a notification.
        assert_eq!(origin("abc; cbfwd=1").notification_depth(), 0);
        assert_eq!(origin("abc; cbfwd=1; cbnotif=2").notification_depth(), 1);
        assert_eq!(origin("").correlator_root(), "");
    }

    #[test]
    fn live_json_names_the_change_and_the_touched_attributes() {
        let mut entity = Entity::new("dev-1", "Sensor");
        let attrs = parse_attrs(
            &json!({"t": {"value": 1, "type": "Number"}, "h": {"value": 2}}),
            false,
        )
        .unwrap();
        append(&mut entity, attrs, Default::default(), 0);
        let touched = parse_attrs(&json!({"t": 3}), true).unwrap();
        let outcome = append(&mut entity, touched, Default::default(), 1);
        let change = EntityChange {
            tenant: "acme".into(),
            service_path: "/a".into(),
            entity: entity.into(),
            alteration: Alteration::Updated,
            attrs: outcome.changes,
            origin: Some(Origin {
                correlator: "c".into(),
                service: Some("acme".into()),
                auth_token: Some("secret".into()),
                custom_notification: false,
            }),
        };
        let json = change.to_json();
        assert_eq!(json["change"], "updated");
        assert_eq!(json["service"], "acme");
        assert_eq!(json["servicePath"], "/a");
        assert_eq!(json["id"], "dev-1");
        assert_eq!(json["type"], "Sensor");
        assert_eq!(json["attrs"], json!(["t"]));
        assert_eq!(json["entity"]["t"]["value"], 3);
        assert_eq!(json["entity"]["h"]["value"], 2);
        assert!(!json.to_string().contains("secret"));

        // The log keeps everything a notification needs but the token.
        let logged = change.to_log();
        assert!(!String::from_utf8_lossy(&logged).contains("secret"));
        assert!(EntityChange::from_log(b"{}").is_err());
        assert!(EntityChange::from_log(&[LOG_FORMAT_LZ4_JSON, 9, 9]).is_err());
        let back = EntityChange::from_log(&logged).unwrap();
        assert_eq!(back.tenant, "acme");
        assert_eq!(back.service_path, "/a");
        assert_eq!(back.entity, change.entity);
        assert_eq!(back.alteration, Alteration::Updated);
        assert_eq!(back.attrs, change.attrs);
        let origin = back.origin.unwrap();
        assert_eq!(origin.correlator, "c");
        assert_eq!(origin.service.as_deref(), Some("acme"));
        assert_eq!(origin.auth_token, None);
        for alteration in [Alteration::Created, Alteration::Deleted] {
            let c = EntityChange {
                alteration,
                origin: None,
                ..change.clone()
            };
            let back = EntityChange::from_log(&c.to_log()).unwrap();
            assert_eq!(back.alteration, alteration);
            assert!(back.origin.is_none());
        }
    }
}
