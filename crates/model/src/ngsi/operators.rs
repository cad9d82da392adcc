//! Orion's update operators: an attribute value that is an object whose
//! single key is an operator (`{"$inc": 2}`) is computed from the
//! attribute's current value instead of replacing it.
//!
//! | operator | on the current value | when there is none (creation) |
//! |---|---|---|
//! | `$inc` n | add n | `0 + n` |
//! | `$mul` n | multiply by n | `0` |
//! | `$min` v / `$max` v | keep the smaller / larger | `min(0, v)` / `max(0, v)` |
//! | `$push` v, or `{"$each": […], "$position": i}` | append (insert at i) | `[v]` / the list |
//! | `$addToSet` v (or `$each`) | append what is absent | `[v]` |
//! | `$pull` v / `$pullAll` […] | remove every equal item | not created |
//! | `$set` {k: v} | add or overwrite sub-keys | `{k: v}` |
//! | `$unset` {k: _} | remove sub-keys (a non-object is left alone) | not created |
//!
//! `$set` and `$unset` may be combined when their keys are disjoint. An
//! operator that cannot apply to the current value (`$inc` on a string,
//! `$set` on a number) fails the request with a 500, as Orion's store
//! does. Operators apply to writes through the NGSI API only; device data
//! is never read as operators.

use serde_json::{Map, Number, Value};

use super::{AttrMap, Attribute, Entity, NgsiError};

/// What an operator value resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// The attribute's new value.
    Value(Value),
    /// The attribute is not created (`$pull`, `$pullAll`, `$unset` on an
    /// attribute that does not exist).
    Skip,
}

/// Whether `value` is an operator object (one known operator key, or
/// `$set` with `$unset`).
pub fn is_operator(value: &Value) -> bool {
    let Value::Object(map) = value else {
        return false;
    };
    match map.len() {
        1 => map.keys().all(|k| OPERATORS.contains(&k.as_str())),
        2 => map.contains_key("$set") && map.contains_key("$unset"),
        _ => false,
    }
}

const OPERATORS: [&str; 10] = [
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$push",
    "$addToSet",
    "$pull",
    "$pullAll",
    "$set",
    "$unset",
];

/// Resolves the operators in `attrs` against `entity`'s current values
/// (none: the entity is being created), in place. Attributes whose
/// operator creates nothing are removed from `attrs`. An operator value
/// sent without a type is a `StructuredValue`, as in Orion.
pub fn resolve_operators(entity: Option<&Entity>, attrs: &mut AttrMap) -> Result<(), NgsiError> {
    let mut skipped = Vec::new();
    for (name, attr) in attrs.iter_mut() {
        let current = entity.and_then(|e| e.attrs.get(name));
        if !resolve_attr(current, attr)? {
            skipped.push(name.to_string());
        }
    }
    for name in skipped {
        attrs.remove(&name);
    }
    Ok(())
}

/// Resolves one attribute's operator against the current attribute;
/// `false` when the attribute is not to be written at all.
pub fn resolve_attr(current: Option<&Attribute>, attr: &mut Attribute) -> Result<bool, NgsiError> {
    if !is_operator(&attr.value) {
        return Ok(true);
    }
    match apply(current.map(|a| &a.value), &attr.value)? {
        Resolved::Skip => Ok(false),
        Resolved::Value(value) => {
            // An operator sent without a type keeps the type `parse_attr`
            // gave its object, `StructuredValue`, whatever it results in,
            // as the real Orion 4.7.0 stores it.
            attr.value = value;
            Ok(true)
        }
    }
}

/// Applies the operator object `op` to `current` (none: creation).
pub fn apply(current: Option<&Value>, op: &Value) -> Result<Resolved, NgsiError> {
    let Value::Object(map) = op else {
        return Ok(Resolved::Value(op.clone()));
    };
    if map.len() == 2 {
        let (set, unset) = (&map["$set"], &map["$unset"]);
        if let (Value::Object(s), Value::Object(u)) = (set, unset) {
            if let Some(k) = s.keys().find(|k| u.contains_key(*k)) {
                return Err(store_error(format!(
                    "Updating the path '{k}' would create a conflict at '{k}'"
                )));
            }
        }
        let after_set = match apply(current, &single("$set", set))? {
            Resolved::Value(v) => v,
            Resolved::Skip => return Ok(Resolved::Skip),
        };
        return apply(Some(&after_set), &single("$unset", unset));
    }
    let (name, operand) = map.iter().next().expect("one key, checked by the caller");
    let zero = Value::from(0);
    match name.as_str() {
        "$inc" => arithmetic(
            current.unwrap_or(&zero),
            operand,
            name,
            |a, b| a + b,
            |a, b| a.checked_add(b),
        ),
        "$mul" => match current {
            None => Ok(Resolved::Value(zero)),
            Some(c) => arithmetic(c, operand, name, |a, b| a * b, |a, b| a.checked_mul(b)),
        },
        "$min" | "$max" => {
            let current = current.unwrap_or(&zero);
            let keep_current = match compare(current, operand) {
                Some(order) => {
                    (name == "$min" && order.is_le()) || (name == "$max" && order.is_ge())
                }
                None => {
                    return Err(store_error(format!(
                        "{name} cannot compare {} with {}",
                        kind(current),
                        kind(operand)
                    )))
                }
            };
            Ok(Resolved::Value(if keep_current {
                current.clone()
            } else {
                operand.clone()
            }))
        }
        "$push" | "$addToSet" => {
            let (items, position) = each(operand)?;
            let mut array = match current {
                None => Vec::new(),
                Some(Value::Array(a)) => a.clone(),
                Some(other) => {
                    return Err(store_error(format!(
                        "The field to which {name} applies must be an array, not {}",
                        kind(other)
                    )))
                }
            };
            let items: Vec<Value> = if name == "$addToSet" {
                let mut fresh: Vec<Value> = Vec::new();
                for item in items {
                    if !array.contains(&item) && !fresh.contains(&item) {
                        fresh.push(item);
                    }
                }
                fresh
            } else {
                items
            };
            let at = position.map_or(array.len(), |p| p.min(array.len()));
            array.splice(at..at, items);
            Ok(Resolved::Value(Value::Array(array)))
        }
        "$pull" | "$pullAll" => {
            let remove: Vec<Value> = match (name.as_str(), operand) {
                ("$pullAll", Value::Array(list)) => list.clone(),
                ("$pullAll", other) => {
                    return Err(store_error(format!(
                        "$pullAll requires an array argument but was given {}",
                        kind(other)
                    )))
                }
                (_, v) => vec![v.clone()],
            };
            match current {
                None => Ok(Resolved::Skip),
                Some(Value::Array(a)) => Ok(Resolved::Value(Value::Array(
                    a.iter().filter(|v| !remove.contains(v)).cloned().collect(),
                ))),
                Some(other) => Err(store_error(format!(
                    "Cannot apply {name} to a non-array value ({})",
                    kind(other)
                ))),
            }
        }
        "$set" => {
            let Value::Object(fields) = operand else {
                return Err(store_error(format!(
                    "$set requires an object argument but was given {}",
                    kind(operand)
                )));
            };
            let mut object = match current {
                None => Map::new(),
                Some(Value::Object(o)) => o.clone(),
                Some(other) => {
                    return Err(store_error(format!(
                        "Cannot create field in element {}",
                        kind(other)
                    )))
                }
            };
            for (k, v) in fields {
                object.insert(k.clone(), v.clone());
            }
            Ok(Resolved::Value(Value::Object(object)))
        }
        "$unset" => match current {
            None => Ok(Resolved::Skip),
            Some(Value::Object(o)) => {
                let mut object = o.clone();
                if let Value::Object(fields) = operand {
                    // The other fields keep their places.
                    for k in fields.keys() {
                        object.shift_remove(k);
                    }
                }
                Ok(Resolved::Value(Value::Object(object)))
            }
            Some(other) => Ok(Resolved::Value(other.clone())),
        },
        _ => Ok(Resolved::Value(op.clone())),
    }
}

/// `{name: operand}`.
fn single(name: &str, operand: &Value) -> Value {
    let mut map = Map::new();
    map.insert(name.to_string(), operand.clone());
    Value::Object(map)
}

/// The items of `$push`/`$addToSet`: one value, or `{"$each": […],
/// "$position": i}`.
fn each(operand: &Value) -> Result<(Vec<Value>, Option<usize>), NgsiError> {
    match operand {
        Value::Object(m) if m.contains_key("$each") => {
            let Some(Value::Array(items)) = m.get("$each") else {
                return Err(store_error("The argument to $each must be an array".into()));
            };
            let position =
                match m.get("$position") {
                    None => None,
                    Some(p) => Some(p.as_u64().ok_or_else(|| {
                        store_error("$position must be a non-negative integer".into())
                    })? as usize),
                };
            Ok((items.clone(), position))
        }
        other => Ok((vec![other.clone()], None)),
    }
}

/// `$inc`/`$mul`: integers stay integers while they fit, otherwise the
/// result is a double.
fn arithmetic(
    current: &Value,
    operand: &Value,
    name: &str,
    float: impl Fn(f64, f64) -> f64,
    int: impl Fn(i64, i64) -> Option<i64>,
) -> Result<Resolved, NgsiError> {
    let (Value::Number(a), Value::Number(b)) = (current, operand) else {
        return Err(store_error(format!(
            "Cannot apply {name} to a value of non-numeric type. {} is {}",
            if current.is_number() {
                "the argument"
            } else {
                "the field"
            },
            kind(if current.is_number() {
                operand
            } else {
                current
            })
        )));
    };
    let result = match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => int(x, y).map(Number::from),
        _ => None,
    }
    .or_else(|| Number::from_f64(float(a.as_f64()?, b.as_f64()?)));
    match result {
        Some(n) => Ok(Resolved::Value(Value::Number(n))),
        None => Err(store_error(format!("{name} overflowed"))),
    }
}

/// Orders two values of the same kind (numbers, strings); `None` for
/// anything else.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// A value's JSON kind, for error texts.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Orion reports an operator its database refused as a 500 carrying the
/// database's message.
fn store_error(message: String) -> NgsiError {
    NgsiError::new(
        500,
        "InternalServerError",
        format!("Database Error (collection: orion.entities - update_forced(): {message})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::default_type;
    use serde_json::json;

    fn value(current: Option<Value>, op: Value) -> Value {
        match apply(current.as_ref(), &op).unwrap() {
            Resolved::Value(v) => v,
            Resolved::Skip => panic!("skipped"),
        }
    }

    #[test]
    fn numbers() {
        assert_eq!(value(Some(json!(5)), json!({"$inc": 2})), json!(7));
        assert_eq!(value(Some(json!(5)), json!({"$inc": -2.5})), json!(2.5));
        assert_eq!(value(None, json!({"$inc": 3})), json!(3));
        assert_eq!(value(Some(json!(4)), json!({"$mul": 3})), json!(12));
        assert_eq!(value(None, json!({"$mul": 3})), json!(0));
        assert_eq!(value(Some(json!(4)), json!({"$min": 3})), json!(3));
        assert_eq!(value(Some(json!(4)), json!({"$min": 9})), json!(4));
        assert_eq!(value(Some(json!(4)), json!({"$max": 9})), json!(9));
        assert_eq!(value(None, json!({"$max": -1})), json!(0));
        assert_eq!(value(Some(json!("b")), json!({"$max": "c"})), json!("c"));
        assert_eq!(
            value(Some(json!(i64::MAX)), json!({"$inc": 1})),
            json!(i64::MAX as f64 + 1.0)
        );
        let err = apply(Some(&json!("x")), &json!({"$inc": 1})).unwrap_err();
        assert_eq!((err.status, err.error), (500, "InternalServerError"));
    }

    #[test]
    fn arrays() {
        assert_eq!(value(Some(json!([1])), json!({"$push": 2})), json!([1, 2]));
        assert_eq!(
            value(Some(json!([1])), json!({"$push": {"$each": [2, 3]}})),
            json!([1, 2, 3])
        );
        assert_eq!(
            value(
                Some(json!([1, 2])),
                json!({"$push": {"$each": [-1, 0], "$position": 0}})
            ),
            json!([-1, 0, 1, 2])
        );
        assert_eq!(value(None, json!({"$push": 1})), json!([1]));
        assert_eq!(
            value(Some(json!([1, 2])), json!({"$addToSet": 2})),
            json!([1, 2])
        );
        assert_eq!(
            value(Some(json!([1, 2])), json!({"$addToSet": 3})),
            json!([1, 2, 3])
        );
        assert_eq!(
            value(Some(json!([1, 2, 1, 3])), json!({"$pull": 1})),
            json!([2, 3])
        );
        assert_eq!(
            value(Some(json!([1, 2, 3])), json!({"$pullAll": [1, 3]})),
            json!([2])
        );
        assert_eq!(apply(None, &json!({"$pull": 1})).unwrap(), Resolved::Skip);
        assert!(apply(Some(&json!(1)), &json!({"$push": 1})).is_err());
    }

    #[test]
    fn objects() {
        assert_eq!(
            value(
                Some(json!({"a": 1, "b": 2})),
                json!({"$set": {"b": 3, "c": 4}})
            ),
            json!({"a": 1, "b": 3, "c": 4})
        );
        assert_eq!(value(None, json!({"$set": {}})), json!({}));
        assert_eq!(
            value(Some(json!({"a": 1, "b": 2})), json!({"$unset": {"a": 1}})),
            json!({"b": 2})
        );
        assert_eq!(value(Some(json!(7)), json!({"$unset": {"a": 1}})), json!(7));
        assert_eq!(
            apply(None, &json!({"$unset": {"a": 1}})).unwrap(),
            Resolved::Skip
        );
        assert_eq!(
            value(
                Some(json!({"a": 1, "b": 2})),
                json!({"$set": {"c": 3}, "$unset": {"a": 1}})
            ),
            json!({"b": 2, "c": 3})
        );
        assert!(apply(
            Some(&json!({})),
            &json!({"$set": {"a": 1}, "$unset": {"a": 1}})
        )
        .is_err());
        assert!(apply(Some(&json!(1)), &json!({"$set": {"a": 1}})).is_err());
    }

    #[test]
    fn only_operator_objects_are_operators() {
        assert!(is_operator(&json!({"$inc": 1})));
        assert!(is_operator(&json!({"$set": {}, "$unset": {}})));
        assert!(!is_operator(&json!({"$inc": 1, "x": 2})));
        assert!(!is_operator(&json!({"$foo": 1})));
        assert!(!is_operator(&json!({"a": 1})));
        assert!(!is_operator(&json!(1)));
    }

    /// As the real Orion 4.7.0 stores it: an operator sent without a type
    /// leaves a `StructuredValue`, whatever it results in; one sent with
    /// a type keeps that type. `$unset` leaves the other fields in place.
    #[test]
    fn an_operator_without_a_type_is_a_structured_value() {
        let current = Attribute::new(json!(1), "Number");
        let mut attr = Attribute::new(json!({"$inc": 2}), default_type(&json!({})));
        assert!(resolve_attr(Some(&current), &mut attr).unwrap());
        assert_eq!(
            (attr.value, attr.attr_type.as_str()),
            (json!(3), "StructuredValue")
        );
        let mut typed = Attribute::new(json!({"$inc": 2}), "Number");
        assert!(resolve_attr(Some(&current), &mut typed).unwrap());
        assert_eq!(typed.attr_type, "Number");
        let mut new = Attribute::new(json!({"$push": "x"}), default_type(&json!({})));
        assert!(resolve_attr(None, &mut new).unwrap());
        assert_eq!(new.value, json!(["x"]));
        let object = json!({"a": 1, "b": 2, "c": 3});
        let Resolved::Value(left) = apply(Some(&object), &json!({"$unset": {"a": 1}})).unwrap()
        else {
            panic!("skipped")
        };
        let keys: Vec<&String> = left.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["b", "c"]);
    }

    /// `$min`/`$max` on a `DateTime` compare instants, whatever the
    /// spelling of the dates (as the real Orion 4.7.0 does).
    #[test]
    fn min_and_max_compare_dates() {
        let current = crate::ngsi::parse_attr(
            "t",
            &json!({"value": "2024-05-01T00:00:00Z", "type": "DateTime"}),
        )
        .unwrap();
        let mut min = crate::ngsi::parse_attr(
            "t",
            &json!({"value": {"$min": "2024-01-01T00:00:00Z"}, "type": "DateTime"}),
        )
        .unwrap();
        assert!(resolve_attr(Some(&current), &mut min).unwrap());
        assert_eq!(min.value, json!("2024-01-01T00:00:00.000Z"));
        let mut max = crate::ngsi::parse_attr(
            "t",
            &json!({"value": {"$max": "2024-01-01T00:00:00Z"}, "type": "DateTime"}),
        )
        .unwrap();
        assert!(resolve_attr(Some(&current), &mut max).unwrap());
        assert_eq!(max.value, json!("2024-05-01T00:00:00.000Z"));
        assert!(crate::ngsi::parse_attr(
            "t",
            &json!({"value": {"$min": "soon"}, "type": "DateTime"})
        )
        .is_err());
    }
}
