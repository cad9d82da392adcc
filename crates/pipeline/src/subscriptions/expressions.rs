//! The JEXL context of a notification: what the identifiers of a
//! `${…}` macro or of `condition.jexlExpression` stand for.
//!
//! As in Orion ("Macro substitution", "Metadata support"):
//! - `id`, `type`: the entity's; `service`, `servicePath`, `authToken`:
//!   from the request that made the change (the tenant, the entity's
//!   path, the `X-Auth-Token`, empty when there was none);
//! - every attribute of the entity, by name, whether or not the change
//!   touched it (an attribute named like a builtin above wins);
//! - `metadata`: attribute name → metadata name → value, with the builtin
//!   metadata added (`previousValue`, `actionType`, `dateCreated`,
//!   `dateModified`); it wins over an attribute named `metadata`.
//!
//! Evaluating is [`weft_model::jexl`]'s job; this module only gathers the
//! values.

use serde_json::{Map, Value};
use weft_model::ngsi::subscription::AlterationType;
use weft_model::ngsi::{format_datetime, AttrChange, ChangeKind, Entity};

use crate::context::Origin;

/// What a context is built from: the entity after the change and how it
/// changed.
pub struct Source<'a> {
    /// The entity (after the change; before it, for a deletion).
    pub entity: &'a Entity,
    /// Tenant (empty: the default one).
    pub tenant: &'a str,
    /// The entity's service path.
    pub service_path: &'a str,
    /// Attributes the change touched, with their state before it.
    pub touched: &'a [AttrChange],
    /// The kind of change.
    pub alteration: AlterationType,
    /// The request that made the change (none for device data).
    pub origin: Option<&'a Origin>,
}

impl Source<'_> {
    /// The `Fiware-Service` the change came with: the tenant, or (when
    /// weft runs without tenants) the header as sent.
    pub fn service(&self) -> &str {
        match self.tenant {
            "" => self.origin.and_then(|o| o.service.as_deref()).unwrap_or(""),
            tenant => tenant,
        }
    }

    /// The `X-Auth-Token` of the request that made the change.
    pub fn auth_token(&self) -> Option<&str> {
        self.origin.and_then(|o| o.auth_token.as_deref())
    }

    /// The JEXL context.
    pub fn context(&self) -> Map<String, Value> {
        let e = self.entity;
        let mut ctx = Map::new();
        ctx.insert("id".into(), e.id.clone().into());
        ctx.insert("type".into(), e.entity_type.clone().into());
        ctx.insert("service".into(), self.service().into());
        ctx.insert("servicePath".into(), self.service_path.into());
        ctx.insert("authToken".into(), self.auth_token().unwrap_or("").into());
        for (name, attr) in e.attrs.iter() {
            ctx.insert(name.to_string(), attr.value.clone());
        }
        ctx.insert("metadata".into(), Value::Object(self.metadata()));
        ctx
    }

    /// `metadata`: every attribute's metadata values, builtins included.
    fn metadata(&self) -> Map<String, Value> {
        let mut out = Map::new();
        for (name, attr) in self.entity.attrs.iter() {
            let mut md: Map<String, Value> = attr
                .metadata
                .iter()
                .map(|(k, m)| (k.to_string(), m.value.clone()))
                .collect();
            let touched = self.touched.iter().find(|c| c.name == name);
            if attr.date_created > 0 {
                md.insert(
                    "dateCreated".into(),
                    format_datetime(attr.date_created).into(),
                );
            }
            if attr.date_modified > 0 {
                md.insert(
                    "dateModified".into(),
                    format_datetime(attr.date_modified).into(),
                );
            }
            if let Some(previous) = self.previous_value(touched, &attr.value) {
                md.insert("previousValue".into(), previous);
            }
            if let Some(action) = self.action_type(touched) {
                md.insert("actionType".into(), action.into());
            }
            out.insert(name.to_string(), Value::Object(md));
        }
        out
    }

    /// The value before the change: none for a created entity or
    /// attribute; the current one for an attribute the change did not
    /// touch.
    fn previous_value(&self, touched: Option<&AttrChange>, current: &Value) -> Option<Value> {
        if self.alteration == AlterationType::EntityCreate {
            return None;
        }
        match touched {
            Some(c) => c.previous.as_ref().map(|p| p.value.clone()),
            None => Some(current.clone()),
        }
    }

    /// `append`, `update` or `delete` for the attributes the change
    /// touched.
    fn action_type(&self, touched: Option<&AttrChange>) -> Option<&'static str> {
        if self.alteration == AlterationType::EntityCreate {
            return Some("append");
        }
        touched.map(|c| match c.kind {
            ChangeKind::Created => "append",
            ChangeKind::Updated => "update",
            ChangeKind::Deleted => "delete",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_model::ngsi::{Attribute, Metadata};

    fn entity() -> Entity {
        let mut e = Entity::new("E1", "T");
        let mut a = Attribute::new(json!(4), "Number");
        a.metadata.insert(
            "MD1".to_string(),
            Metadata {
                value: json!("m"),
                md_type: "Text".into(),
            },
        );
        e.attrs.insert("A".to_string(), a);
        e.attrs
            .insert("B".to_string(), Attribute::new(json!("b"), "Text"));
        e.attrs.insert(
            "metadata".to_string(),
            Attribute::new(json!("shadowed"), "Text"),
        );
        e.attrs
            .insert("service".to_string(), Attribute::new(json!("attr"), "Text"));
        e
    }

    #[test]
    fn context_has_builtins_attributes_and_metadata() {
        let e = entity();
        let touched = [AttrChange {
            name: "A".into(),
            kind: ChangeKind::Updated,
            previous: Some(Attribute::new(json!(1), "Number")),
            modified: true,
        }];
        let origin = Origin {
            correlator: "c".into(),
            service: None,
            auth_token: Some("tok".into()),
            custom_notification: false,
        };
        let ctx = Source {
            entity: &e,
            tenant: "t1",
            service_path: "/p",
            touched: &touched,
            alteration: AlterationType::EntityChange,
            origin: Some(&origin),
        }
        .context();
        assert_eq!(ctx["id"], json!("E1"));
        assert_eq!(ctx["type"], json!("T"));
        assert_eq!(ctx["servicePath"], json!("/p"));
        assert_eq!(ctx["authToken"], json!("tok"));
        // An attribute wins over a builtin, `metadata` over an attribute.
        assert_eq!(ctx["service"], json!("attr"));
        assert_eq!(ctx["A"], json!(4));
        let md = &ctx["metadata"];
        assert_eq!(md["A"]["MD1"], json!("m"));
        assert_eq!(md["A"]["previousValue"], json!(1));
        assert_eq!(md["A"]["actionType"], json!("update"));
        // Untouched: previous value is the current one, no action type.
        assert_eq!(md["B"]["previousValue"], json!("b"));
        assert!(md["B"].get("actionType").is_none());
    }

    #[test]
    fn created_entities_have_no_previous_values() {
        let e = entity();
        let ctx = Source {
            entity: &e,
            tenant: "",
            service_path: "/",
            touched: &[],
            alteration: AlterationType::EntityCreate,
            origin: None,
        }
        .context();
        assert!(ctx["metadata"]["A"].get("previousValue").is_none());
        assert_eq!(ctx["metadata"]["A"]["actionType"], json!("append"));
        assert_eq!(ctx["authToken"], json!(""));
    }
}
