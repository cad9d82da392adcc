//! Alarms as NGSI context: every alarm is an entity of type `Alarm` (id =
//! the alarm id) in the default tenant at service path `/`, updated on
//! every change, so NGSI subscriptions (`"entities":[{"idPattern":".*",
//! "type":"Alarm"}]`, `q=severity==critical;state==active`) notify on alarms
//! like on any other context change.

use serde_json::json;
use weft_model::ngsi::{append, format_datetime, AttrMap, Attribute, Entity, NgsiError};
use weft_model::Alarm;

use crate::context::{Context, DEFAULT_TENANT};

/// The NGSI entity type of alarms.
pub const ALARM_ENTITY_TYPE: &str = "Alarm";

/// The attributes an alarm has as an entity.
fn attributes(a: &Alarm) -> AttrMap {
    let mut attrs = AttrMap::new();
    let text = |v: &str| Attribute::new(json!(v), "Text");
    let time = |ms: i64| Attribute::new(json!(format_datetime(ms)), "DateTime");
    attrs.insert("alarmType", text(&a.alarm_type));
    attrs.insert("category", text(&a.category));
    attrs.insert("subCategory", text(&a.sub_category));
    attrs.insert("severity", text(a.severity.as_str()));
    attrs.insert("state", text(a.state.as_str()));
    attrs.insert("acked", Attribute::new(json!(a.acked), "Boolean"));
    attrs.insert(
        "refDevice",
        Attribute::new(json!(a.device.id), "Relationship"),
    );
    attrs.insert("deviceName", text(&a.device.name));
    attrs.insert("rule", text(&a.rule));
    attrs.insert("description", text(&a.description));
    attrs.insert("count", Attribute::new(json!(a.count), "Number"));
    attrs.insert("raisedAt", time(a.raised_at));
    attrs.insert("updatedAt", time(a.updated_at));
    if let Some(t) = a.cleared_at {
        attrs.insert("clearedAt", time(t));
    }
    attrs
}

/// Creates or updates the alarm's entity.
pub(super) async fn upsert(context: &Context, alarm: &Alarm) -> Result<(), NgsiError> {
    let now = weft_model::now_ms();
    let mut entity = Entity::new(alarm.id.clone(), ALARM_ENTITY_TYPE);
    entity.attrs = attributes(alarm);
    context
        .upsert(
            DEFAULT_TENANT,
            "/",
            Some(ALARM_ENTITY_TYPE),
            entity,
            |new| {
                new.stamp_created(now);
                Ok(())
            },
            |e, attrs| Ok(append(e, attrs, Default::default(), now)),
        )
        .await
        .map(|_| ())
}
