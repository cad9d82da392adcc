//! Update operations as pure functions over an [`Entity`]. The broker
//! loads the entity, applies one of these (on a copy, if it must be able
//! to back out), checks [`Entity::check_locations`], stores it and hands
//! the returned changes to subscriptions.
//!
//! Rules:
//! - Updating an attribute keeps its metadata and adds/overwrites the
//!   request's metadata, unless `overrideMetadata` (then the request's
//!   metadata replace them). A request attribute without `type` gets the
//!   default type of its value (`1785_error_on_empty_attr_type` step 04).
//! - An attribute's and the entity's `dateModified` move only when a value,
//!   type or metadata actually changed, or with `forcedUpdate`.
//! - Partial failures apply what they can and report the rest, which the
//!   HTTP layer turns into Orion's 422 (`3499_partial_update_response`).

use serde_json::Value;

use super::parse::check_value;
use super::{AttrMap, Attribute, Entity, MetadataMap, NgsiError};

/// The `options` that change how updates apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateOptions {
    /// `options=append` on POST attrs (`appendStrict` in batches): existing
    /// attributes are errors instead of being updated.
    pub append_strict: bool,
    /// `options=overrideMetadata`: the request's metadata replace the
    /// attribute's instead of being merged into them.
    pub override_metadata: bool,
    /// `options=forcedUpdate`: count every touched attribute as changed
    /// (dates move, subscriptions fire) even if nothing differs.
    pub forced: bool,
    /// NGSI-LD's identity: a creation is refused when the tenant has an
    /// entity of that id, whatever its type and service path (checked
    /// with the creation, under the context's lock).
    pub unique_id: bool,
}

/// What happened to one attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The attribute did not exist.
    Created,
    /// The attribute existed and was written (maybe with equal content).
    Updated,
    /// The attribute was removed.
    Deleted,
}

/// One attribute touched by an operation, for subscriptions
/// (`previousValue`, `onlyChangedAttrs`, `notifyOnMetadataChange`).
#[derive(Debug, Clone, PartialEq)]
pub struct AttrChange {
    /// Attribute name.
    pub name: String,
    /// Created, updated or deleted.
    pub kind: ChangeKind,
    /// The attribute before the operation (None when created).
    pub previous: Option<Attribute>,
    /// Whether value, type or metadata differ from before (always true for
    /// created and deleted attributes, and with `forcedUpdate`).
    pub modified: bool,
}

impl AttrChange {
    /// Whether the value or type changed (not only metadata), for
    /// subscriptions with `notifyOnMetadataChange: false`.
    pub fn value_changed(&self, current: Option<&Attribute>) -> bool {
        match (&self.previous, current) {
            (Some(p), Some(c)) => !json_eq(&p.value, &c.value) || p.attr_type != c.attr_type,
            _ => true,
        }
    }
}

/// The result of a multi-attribute operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateOutcome {
    /// Attributes touched, in request order.
    pub changes: Vec<AttrChange>,
    /// Attributes refused: missing ones for update, existing ones for
    /// strict append.
    pub failed: Vec<String>,
    /// How many attributes the request carried.
    pub requested: usize,
}

impl UpdateOutcome {
    /// Whether anything actually changed (the entity's `dateModified`
    /// moved and subscriptions have something to see).
    pub fn entity_modified(&self) -> bool {
        self.changes.iter().any(|c| c.modified)
    }

    /// Names of the attributes that actually changed.
    pub fn modified_names(&self) -> Vec<&str> {
        self.changes
            .iter()
            .filter(|c| c.modified)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// For PATCH: Orion's 422 when attributes did not exist, e.g.
    /// `do not exist: E - [ C, D ]` (Unprocessable when nothing applied,
    /// PartialUpdate otherwise). `entity_type` is the type the request
    /// named, if any (`E/T - […]` then).
    pub fn missing_error(&self, entity_id: &str, entity_type: Option<&str>) -> Option<NgsiError> {
        self.error_with("do not exist: ", entity_id, entity_type)
    }

    /// For strict append: `one or more of the attributes in the request
    /// already exist: E - [ A, B ]`, Unprocessable or PartialUpdate.
    pub fn existing_error(&self, entity_id: &str, entity_type: Option<&str>) -> Option<NgsiError> {
        self.error_with(
            "one or more of the attributes in the request already exist: ",
            entity_id,
            entity_type,
        )
    }

    fn error_with(&self, prefix: &str, id: &str, t: Option<&str>) -> Option<NgsiError> {
        if self.failed.is_empty() {
            return None;
        }
        let text = format!("{prefix}{}", attrs_fragment(id, t, &self.failed));
        Some(if self.failed.len() >= self.requested {
            NgsiError::unprocessable(text)
        } else {
            NgsiError::partial_update(text)
        })
    }
}

/// One entity's part of a 422 text: `E - [ A, B ]` or `E/T - [ A ]`.
/// Batch operations join several with `, `.
pub fn attrs_fragment(entity_id: &str, entity_type: Option<&str>, names: &[String]) -> String {
    let label = match entity_type {
        Some(t) => format!("{entity_id}/{t}"),
        None => entity_id.to_string(),
    };
    format!("{label} - [ {} ]", names.join(", "))
}

/// POST `/v2/entities/{id}/attrs` (and batch `append`/`appendStrict`):
/// adds new attributes; updates existing ones, or with
/// [`UpdateOptions::append_strict`] refuses them.
pub fn append(entity: &mut Entity, attrs: AttrMap, opts: UpdateOptions, now: i64) -> UpdateOutcome {
    apply(entity, attrs, opts, now, Mode::Append)
}

/// PATCH `/v2/entities/{id}/attrs` (and batch `update`): updates existing
/// attributes; missing ones are refused (`1278_patch_unknown_attribute`).
pub fn update(entity: &mut Entity, attrs: AttrMap, opts: UpdateOptions, now: i64) -> UpdateOutcome {
    apply(entity, attrs, opts, now, Mode::Update)
}

/// PUT `/v2/entities/{id}/attrs` (and batch `replace`): the entity's
/// attributes become exactly the request's. Attributes kept by name keep
/// their creation date; metadata are replaced, not merged.
pub fn replace(
    entity: &mut Entity,
    attrs: AttrMap,
    opts: UpdateOptions,
    now: i64,
) -> UpdateOutcome {
    let keep: Vec<String> = attrs.keys().map(str::to_string).collect();
    let mut outcome = UpdateOutcome::default();
    let existing: Vec<String> = entity.attrs.keys().map(str::to_string).collect();
    for name in existing {
        if !keep.contains(&name) {
            let prev = entity.attrs.remove(&name);
            outcome.changes.push(AttrChange {
                name,
                kind: ChangeKind::Deleted,
                previous: prev,
                modified: true,
            });
        }
    }
    let opts = UpdateOptions {
        override_metadata: true,
        ..opts
    };
    let rest = apply(entity, attrs, opts, now, Mode::Append);
    outcome.changes.extend(rest.changes);
    outcome.requested = rest.requested;
    if outcome.entity_modified() {
        entity.date_modified = now;
    }
    outcome
}

/// PUT `/v2/entities/{id}/attrs/{name}`: replaces one existing attribute
/// (404 "The entity does not have such an attribute" otherwise).
pub fn update_attr(
    entity: &mut Entity,
    name: &str,
    attr: Attribute,
    opts: UpdateOptions,
    now: i64,
) -> Result<AttrChange, NgsiError> {
    if !entity.attrs.contains_key(name) {
        return Err(NgsiError::attribute_not_found());
    }
    let mut one = AttrMap::new();
    one.insert(name, attr);
    let outcome = apply(entity, one, opts, now, Mode::Update);
    outcome
        .changes
        .into_iter()
        .next()
        .ok_or_else(NgsiError::attribute_not_found)
}

/// DELETE `/v2/entities/{id}/attrs/{name}`
/// (`0993_DELETE_v2_entity_attr/delete_not_exist_attr.test`: 404 when
/// missing). Deleting `dateExpires` makes a transient entity permanent.
pub fn delete_attr(entity: &mut Entity, name: &str, now: i64) -> Result<AttrChange, NgsiError> {
    let previous = entity
        .attrs
        .remove(name)
        .ok_or_else(NgsiError::attribute_not_found)?;
    entity.date_modified = now;
    entity.refresh_expiration();
    Ok(AttrChange {
        name: name.to_string(),
        kind: ChangeKind::Deleted,
        previous: Some(previous),
        modified: true,
    })
}

/// PUT `/v2/entities/{id}/attrs/{name}/value`: sets the value and keeps
/// type and metadata (`0999_update_single_attr_value_by_eid`,
/// `1188_empty_attribute_value`). The value is checked against the
/// attribute's type (forbidden characters, `DateTime`, `geo:json`).
pub fn set_attr_value(
    entity: &mut Entity,
    name: &str,
    value: Value,
    opts: UpdateOptions,
    now: i64,
) -> Result<AttrChange, NgsiError> {
    let attr = entity
        .attrs
        .get_mut(name)
        .ok_or_else(NgsiError::attribute_not_found)?;
    let value = check_value(&attr.attr_type, &attr.metadata, value)?;
    let previous = attr.clone();
    let modified = opts.forced || !json_eq(&attr.value, &value);
    attr.value = value;
    if modified {
        attr.date_modified = now;
        entity.date_modified = now;
    }
    entity.refresh_expiration();
    Ok(AttrChange {
        name: name.to_string(),
        kind: ChangeKind::Updated,
        previous: Some(previous),
        modified,
    })
}

#[derive(PartialEq)]
enum Mode {
    Append,
    Update,
}

fn apply(
    entity: &mut Entity,
    attrs: AttrMap,
    opts: UpdateOptions,
    now: i64,
    mode: Mode,
) -> UpdateOutcome {
    let mut outcome = UpdateOutcome {
        requested: attrs.len(),
        ..Default::default()
    };
    for (name, new) in attrs {
        match entity.attrs.get_mut(&name) {
            Some(_) if opts.append_strict && mode == Mode::Append => outcome.failed.push(name),
            Some(existing) => {
                let previous = existing.clone();
                let metadata = if opts.override_metadata {
                    new.metadata
                } else {
                    merge_metadata(existing.metadata.clone(), new.metadata)
                };
                let modified = opts.forced
                    || !json_eq(&existing.value, &new.value)
                    || existing.attr_type != new.attr_type
                    || !metadata_eq(&existing.metadata, &metadata);
                existing.value = new.value;
                existing.attr_type = new.attr_type;
                existing.metadata = metadata;
                if modified {
                    existing.date_modified = now;
                }
                outcome.changes.push(AttrChange {
                    name,
                    kind: ChangeKind::Updated,
                    previous: Some(previous),
                    modified,
                });
            }
            None if mode == Mode::Update => outcome.failed.push(name),
            None => {
                let mut attr = new;
                attr.date_created = now;
                attr.date_modified = now;
                entity.attrs.insert(name.clone(), attr);
                outcome.changes.push(AttrChange {
                    name,
                    kind: ChangeKind::Created,
                    previous: None,
                    modified: true,
                });
            }
        }
    }
    if outcome.entity_modified() {
        entity.date_modified = now;
    }
    entity.refresh_expiration();
    outcome
}

fn merge_metadata(mut base: MetadataMap, new: MetadataMap) -> MetadataMap {
    for (k, v) in new {
        base.insert(k, v);
    }
    base
}

fn metadata_eq(a: &MetadataMap, b: &MetadataMap) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, m)| {
            b.get(k)
                .is_some_and(|n| n.md_type == m.md_type && json_eq(&n.value, &m.value))
        })
}

/// JSON equality with numbers compared as numbers (`1` equals `1.0`, as
/// in Orion, which keeps numbers as doubles).
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::{parse_attrs, parse_entity, render, Format};
    use serde_json::json;

    fn entity(body: Value) -> Entity {
        let mut e = parse_entity(&body, false).unwrap();
        e.stamp_created(1000);
        e
    }

    fn attrs(body: Value) -> AttrMap {
        parse_attrs(&body, false).unwrap()
    }

    // 3499_partial_update_response/single_all_combinations_update.test
    #[test]
    fn patch_missing_attributes() {
        let mut e = entity(json!({"id":"E","type":"T","A":{"value":1},"B":{"value":2}}));
        let o = update(
            &mut e,
            attrs(json!({"C":{"value":1},"D":{"value":1}})),
            UpdateOptions::default(),
            2000,
        );
        let err = o.missing_error("E", None).unwrap();
        assert_eq!(
            err.to_json(),
            json!({"error":"Unprocessable","description":"do not exist: E - [ C, D ]"})
        );
        assert_eq!(err.status, 422);
        let o = update(
            &mut e,
            attrs(json!({"A":{"value":5},"C":{"value":1}})),
            UpdateOptions::default(),
            2000,
        );
        assert_eq!(
            o.missing_error("E", Some("T")).unwrap().to_json(),
            json!({"error":"PartialUpdate","description":"do not exist: E/T - [ C ]"})
        );
        assert_eq!(e.attrs.get("A").unwrap().value, json!(5));
        assert_eq!(e.date_modified, 2000);
    }

    // 1278_patch_unknown_attribute/patch_unknown_attribute.test
    #[test]
    fn patch_unknown_attribute_changes_nothing() {
        let mut e = entity(json!({"id":"E1","type":"T1","A1":{"value":0}}));
        let before = e.clone();
        let o = update(
            &mut e,
            attrs(json!({"A2":{"value":1}})),
            UpdateOptions::default(),
            2000,
        );
        assert_eq!(
            o.missing_error("E1", None).unwrap().description,
            "do not exist: E1 - [ A2 ]"
        );
        assert_eq!(e, before);
    }

    // 3499_partial_update_response/single_all_combinations_appendstrict.test,
    // 1682_ngsiv2_entity_id/ngsiv2_entity_id_revisited.test step 04-05
    #[test]
    fn strict_append() {
        let strict = UpdateOptions {
            append_strict: true,
            ..Default::default()
        };
        let mut e = entity(json!({"id":"E","type":"T","A":{"value":20},"B":{"value":2}}));
        let o = append(
            &mut e,
            attrs(json!({"A":{"value":1},"B":{"value":1}})),
            strict,
            2000,
        );
        assert_eq!(
            o.existing_error("E", None).unwrap().to_json(),
            json!({"error":"Unprocessable","description":"one or more of the attributes in the request already exist: E - [ A, B ]"})
        );
        let o = append(
            &mut e,
            attrs(json!({"B":{"value":1},"C":{"value":"foo"}})),
            strict,
            2000,
        );
        assert_eq!(
            o.existing_error("E", Some("T")).unwrap().to_json(),
            json!({"error":"PartialUpdate","description":"one or more of the attributes in the request already exist: E/T - [ B ]"})
        );
        assert_eq!(e.attrs.get("A").unwrap().value, json!(20));
        assert_eq!(e.attrs.get("B").unwrap().value, json!(2));
        assert_eq!(e.attrs.get("C").unwrap().value, json!("foo"));
    }

    // 1682_ngsiv2_entity_id step 03: non-strict append updates existing attributes.
    #[test]
    fn append_updates_and_adds() {
        let mut e = entity(json!({"id":"E1","A":{"value":1}}));
        let o = append(
            &mut e,
            attrs(json!({"A":{"value":20},"B":{"value":"x"}})),
            UpdateOptions::default(),
            2000,
        );
        assert!(o.failed.is_empty());
        assert_eq!(
            o.changes.iter().map(|c| c.kind).collect::<Vec<_>>(),
            [ChangeKind::Updated, ChangeKind::Created]
        );
        assert_eq!(o.changes[0].previous.as_ref().unwrap().value, json!(1));
        assert!(o.changes[1].previous.is_none());
        assert_eq!(e.attrs.get("B").unwrap().date_created, 2000);
    }

    // 1785_error_on_empty_attr_type step 02/04: an update without type takes the value's default type.
    #[test]
    fn update_without_type_takes_default_type() {
        let mut e = entity(json!({"id":"E1","type":"T1","A1":{"type":"at1","value":"01"}}));
        update(
            &mut e,
            attrs(json!({"A1":{"value":"02"}})),
            UpdateOptions::default(),
            2000,
        );
        assert_eq!(
            render(&e, Format::Normalized, None, None),
            json!({"id":"E1","type":"T1","A1":{"metadata":{},"type":"Text","value":"02"}})
        );
    }

    #[test]
    fn dates_move_only_on_real_changes_unless_forced() {
        let mut e = entity(json!({"id":"E","A":{"value":1,"metadata":{"m":{"value":1}}}}));
        let o = update(
            &mut e,
            attrs(json!({"A":{"value":1.0}})),
            UpdateOptions::default(),
            2000,
        );
        assert!(!o.entity_modified());
        assert_eq!(e.date_modified, 1000);
        assert_eq!(e.attrs.get("A").unwrap().date_modified, 1000);
        // metadata kept (merge)
        assert!(e.attrs.get("A").unwrap().metadata.contains_key("m"));
        // forcedUpdate (3389_forced_update_option)
        let forced = UpdateOptions {
            forced: true,
            ..Default::default()
        };
        let o = update(&mut e, attrs(json!({"A":{"value":1}})), forced, 3000);
        assert!(o.entity_modified());
        assert_eq!(e.date_modified, 3000);
        // a metadata change is a change
        let o = update(
            &mut e,
            attrs(json!({"A":{"value":1,"metadata":{"m":{"value":2}}}})),
            UpdateOptions::default(),
            4000,
        );
        assert_eq!(o.modified_names(), ["A"]);
        assert!(!o.changes[0].value_changed(e.attrs.get("A")));
        assert_eq!(e.attrs.get("A").unwrap().date_modified, 4000);
        assert_eq!(e.attrs.get("A").unwrap().date_created, 1000);
    }

    #[test]
    fn override_metadata_replaces() {
        let mut e = entity(json!({"id":"E","A":{"value":1,"metadata":{"m1":{"value":1}}}}));
        let opts = UpdateOptions {
            override_metadata: true,
            ..Default::default()
        };
        update(
            &mut e,
            attrs(json!({"A":{"value":1,"metadata":{"m2":{"value":2}}}})),
            opts,
            2000,
        );
        let md = &e.attrs.get("A").unwrap().metadata;
        assert_eq!(md.keys().collect::<Vec<_>>(), ["m2"]);
        update(
            &mut e,
            attrs(json!({"A":{"value":1,"metadata":{"m3":{"value":3}}}})),
            UpdateOptions::default(),
            2000,
        );
        assert_eq!(
            e.attrs
                .get("A")
                .unwrap()
                .metadata
                .keys()
                .collect::<Vec<_>>(),
            ["m2", "m3"]
        );
    }

    // 0987_put_attributes: PUT attrs replaces the whole set.
    #[test]
    fn replace_all_attributes() {
        let mut e = entity(json!({"id":"E","A":{"value":1},"B":{"value":2}}));
        let o = replace(
            &mut e,
            attrs(json!({"B":{"value":3},"C":{"value":4}})),
            UpdateOptions::default(),
            2000,
        );
        assert_eq!(e.attrs.keys().collect::<Vec<_>>(), ["B", "C"]);
        let kinds: Vec<_> = o
            .changes
            .iter()
            .map(|c| (c.name.as_str(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("A", ChangeKind::Deleted),
                ("B", ChangeKind::Updated),
                ("C", ChangeKind::Created)
            ]
        );
        assert_eq!(e.attrs.get("B").unwrap().date_created, 1000);
    }

    // 0993_DELETE_v2_entity_attr/delete_not_exist_attr.test
    #[test]
    fn delete_attribute() {
        let mut e = entity(json!({"id":"E1","A":{"value":1}}));
        assert_eq!(
            delete_attr(&mut e, "none", 2000).unwrap_err().to_json(),
            json!({"error":"NotFound","description":"The entity does not have such an attribute"})
        );
        let c = delete_attr(&mut e, "A", 2000).unwrap();
        assert_eq!(c.previous.unwrap().value, json!(1));
        assert!(e.attrs.is_empty());
    }

    // 1188_empty_attribute_value, 0999_update_single_attr_value_by_eid_fake_field_cases
    #[test]
    fn set_value_keeps_type() {
        let mut e = parse_entity(&json!({"id":"E1","type":"T1","A1":"1"}), true).unwrap();
        set_attr_value(&mut e, "A1", json!(""), UpdateOptions::default(), 1).unwrap();
        set_attr_value(&mut e, "A1", json!(5), UpdateOptions::default(), 1).unwrap();
        assert_eq!(
            render(&e, Format::Normalized, None, None),
            json!({"id":"E1","type":"T1","A1":{"metadata":{},"type":"Text","value":5}})
        );
        set_attr_value(&mut e, "A1", json!({"type":1}), UpdateOptions::default(), 1).unwrap();
        assert_eq!(e.attrs.get("A1").unwrap().value, json!({"type":1}));
        assert_eq!(
            set_attr_value(&mut e, "A1", json!("a<b"), UpdateOptions::default(), 1)
                .unwrap_err()
                .description,
            "Invalid characters in attribute value"
        );
        assert_eq!(
            set_attr_value(&mut e, "X", json!(1), UpdateOptions::default(), 1)
                .unwrap_err()
                .status,
            404
        );
    }

    // 1039_ngsiv2_date_support/basic_dates_support.test step 05: value checked on update.
    #[test]
    fn put_attr_checks() {
        let mut e =
            entity(json!({"id":"E","d":{"type":"DateTime","value":"2050-04-05T14:00:00.123Z"}}));
        assert_eq!(
            set_attr_value(&mut e, "d", json!("bar"), UpdateOptions::default(), 1)
                .unwrap_err()
                .description,
            "date has invalid format in attribute value"
        );
        let a = crate::ngsi::parse_attr(
            "d",
            &json!({"type":"DateTime","value":"2018-12-03T13:21:42.456"}),
        )
        .unwrap();
        update_attr(&mut e, "d", a.clone(), UpdateOptions::default(), 2).unwrap();
        assert_eq!(
            e.attrs.get("d").unwrap().value,
            json!("2018-12-03T13:21:42.456Z")
        );
        assert_eq!(
            update_attr(&mut e, "zz", a, UpdateOptions::default(), 2)
                .unwrap_err()
                .status,
            404
        );
    }

    #[test]
    fn batch_fragments() {
        assert_eq!(
            attrs_fragment("E1", Some("T"), &["B".into(), "C".into()]),
            "E1/T - [ B, C ]"
        );
    }
}
