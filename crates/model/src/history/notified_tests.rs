//! What QuantumLeap 1.0 stores for each kind of notified attribute, as
//! observed on the real one (`op/query` answers each stored type and
//! value).

use serde_json::{json, Value};

use super::*;

/// Reads `{"id":"E","type":"T", …attrs}`.
fn read(attrs: Value) -> Result<Option<NotifiedEntity>, NotifiedError> {
    let mut obj = json!({"id": "E", "type": "T"});
    obj.as_object_mut()
        .unwrap()
        .extend(attrs.as_object().unwrap().clone());
    NotifiedEntity::read("E", "T", obj.as_object().unwrap())
}

/// The stored `(type, value)` of each attribute, in order.
fn stored(attrs: Value) -> Vec<(String, String, Value)> {
    read(attrs)
        .unwrap()
        .unwrap()
        .entity
        .attrs
        .iter()
        .map(|(n, a)| (n.to_string(), a.attr_type.clone(), a.value.clone()))
        .collect()
}

fn one(name: &str, attr_type: &str, value: Value) -> (String, String, Value) {
    (name.to_string(), attr_type.to_string(), value)
}

/// NGSI-LD properties take the type of their value; relationships their
/// object; `@context` and sub-properties are not stored.
#[test]
fn ngsi_ld_properties_take_their_values_type() {
    let got = stored(json!({
        "@context": "https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context.jsonld",
        "i": {"type": "Property", "value": 20, "unitCode": "CEL", "sub": {"type": "Property", "value": 7}},
        "f": {"type": "Property", "value": 1.5},
        "b": {"type": "Property", "value": true},
        "s": {"type": "Property", "value": "hello"},
        "d": {"type": "Property", "value": "2026-02-02T00:00:00Z"},
        "t": {"type": "Property", "value": {"@type": "DateTime", "@value": "2026-03-03T00:00:00Z"}},
        "bad": {"type": "Property", "value": {"@type": "DateTime", "@value": "nope"}},
        "o": {"type": "Property", "value": {"a": 1}},
        "a": {"type": "Property", "value": [1, 2]},
        "n": {"type": "Property"},
        "r": {"type": "Relationship", "object": "urn:ngsi-ld:X:1"},
        "nv": {"value": 5},
    }));
    assert_eq!(
        got,
        vec![
            one("i", "Integer", json!(20)),
            one("f", "Number", json!(1.5)),
            one("b", "Boolean", json!(true)),
            one("s", "Text", json!("hello")),
            one("d", "DateTime", json!("2026-02-02T00:00:00Z")),
            one("t", "DateTime", json!("2026-03-03T00:00:00Z")),
            one("bad", "DateTime", Value::Null),
            one("o", "StructuredValue", json!({"a": 1})),
            one("a", "Array", json!([1, 2])),
            one("n", "Text", Value::Null),
            one("r", "Relationship", json!("urn:ngsi-ld:X:1")),
            one("nv", "Integer", json!(5)),
        ]
    );
}

/// NGSIv2 attributes keep their type; keys beside type and value are
/// accepted and not stored; a `DateTime` that is not a date is null.
#[test]
fn ngsiv2_attributes_keep_their_type() {
    let got = stored(json!({
        "t": {"type": "Number", "value": 20, "observedAt": "2026-01-01T00:00:00Z", "unitCode": "CEL",
              "metadata": {"m": {"type": "Text", "value": "x"}}},
        "when": {"type": "DateTime", "value": "not a date"},
        "w2": {"type": "DateTime", "value": 5},
        "w3": {"type": "ISO8601", "value": "2026-01-01"},
        "e": {"type": "Number", "value": ""},
        "x": {"type": "Text", "value": ""},
    }));
    assert_eq!(
        got,
        vec![
            one("t", "Number", json!(20)),
            one("when", "DateTime", Value::Null),
            one("w2", "DateTime", Value::Null),
            one("w3", "ISO8601", json!("2026-01-01")),
            one("e", "Number", Value::Null),
            one("x", "Text", json!("")),
        ]
    );
}

/// Locations not named `location` keep their type, written as
/// QuantumLeap writes them back.
#[test]
fn other_locations_keep_their_type() {
    let got = stored(json!({
        "p": {"type": "geo:point", "value": "3,4"},
        "q": {"type": "geo:point", "value": "1e-7, 12345678901234567"},
        "l": {"type": "geo:line", "value": ["1,2", "3, 4.5"]},
        "g": {"type": "geo:json", "value": {"type": "Point", "coordinates": [1, 2.5]}},
        "gp": {"type": "GeoProperty", "value": {"type": "LineString", "coordinates": [[0, 0], [2, 2]]}},
        "f": {"type": "geo:json", "value": {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}},
    }));
    assert_eq!(
        got,
        vec![
            one("p", "geo:point", json!("3.0, 4.0")),
            one("q", "geo:point", json!("1e-07, 1.2345678901234568e+16")),
            one("l", "geo:line", json!(["1.0, 2.0", "3.0, 4.5"])),
            one(
                "g",
                "geo:json",
                json!({"type": "Point", "coordinates": [1.0, 2.5]})
            ),
            one(
                "gp",
                "GeoProperty",
                json!({"type": "LineString", "coordinates": [[0.0, 0.0], [2.0, 2.0]]})
            ),
            one("f", "geo:json", Value::Null),
        ]
    );
    // Floats, as PostGIS answers them.
    let Value::Object(g) = &got[3].2 else {
        panic!()
    };
    assert_eq!(g["coordinates"].to_string(), "[1.0,2.5]");
}

/// `location` becomes GeoJSON, whatever its type, with a centroid: the
/// mean of the points given.
#[test]
fn location_becomes_geojson_with_a_centroid() {
    let cases = [
        (
            json!({"type": "geo:point", "value": "3, 4"}),
            json!({"type": "Point", "coordinates": [4.0, 3.0]}),
            "3.0, 4.0",
        ),
        (
            json!({"type": "GeoProperty", "value": {"type": "Point", "coordinates": [1, 2]}}),
            json!({"type": "Point", "coordinates": [1.0, 2.0]}),
            "2.0, 1.0",
        ),
        (
            json!({"type": "geo:line", "value": ["1.123456789,2.0000005", "3,4.0000015"]}),
            json!({"type": "LineString", "coordinates": [[2.000001, 1.123457], [4.000001, 3.0]]}),
            "2.0617283945000002, 3.000001",
        ),
        (
            json!({"type": "geo:polygon", "value": ["0,0", "0,1", "1,1", "0,0"]}),
            json!({"type": "Polygon", "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]}),
            "0.25, 0.5",
        ),
        (
            json!({"type": "geo:box", "value": ["1,2", "3,5"]}),
            json!({"type": "Polygon", "coordinates": [[[5.0, 3.0], [2.0, 3.0], [2.0, 1.0], [5.0, 1.0], [5.0, 3.0]]]}),
            "2.0, 3.5",
        ),
        (
            json!({"type": "geo:json", "value": {"type": "Polygon", "coordinates": [[[0, 0], [0, 2], [2, 2], [2, 0], [0, 0]]]}}),
            json!({"type": "Polygon", "coordinates": [[[0.0, 0.0], [0.0, 2.0], [2.0, 2.0], [2.0, 0.0], [0.0, 0.0]]]}),
            "0.8, 0.8",
        ),
        (
            json!({"type": "geo:json", "value": {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}}),
            Value::Null,
            "2.0, 1.0",
        ),
    ];
    for (location, geometry, centroid) in cases {
        let got = stored(json!({"location": location.clone()}));
        assert_eq!(
            got,
            vec![
                one("location", "geo:json", geometry),
                one("location_centroid", "geo:point", json!(centroid)),
            ],
            "{location}"
        );
    }
}

/// A value QuantumLeap cannot read refuses the entity.
#[test]
fn what_cannot_be_read_is_an_error() {
    assert!(matches!(
        read(json!({"a": 5})),
        Err(NotifiedError::NotNormalized { .. })
    ));
    for bad in [
        json!({"type": "geo:point", "value": "abc"}),
        json!({"type": "geo:json", "value": "abc"}),
        json!({"type": "geo:box", "value": ["1,2"]}),
    ] {
        assert!(
            matches!(
                read(json!({"location": bad.clone()})),
                Err(NotifiedError::BadLocation { .. })
            ),
            "{bad}"
        );
    }
}

/// An entity none of whose attributes has a value is dropped.
#[test]
fn an_entity_without_values_is_dropped() {
    assert_eq!(read(json!({"a": {"type": "Number"}})).unwrap(), None);
    assert_eq!(
        read(json!({"a": {"type": "Number", "value": 0.0}})).unwrap(),
        None
    );
    assert!(read(json!({"a": {"type": "Number", "value": 0}}))
        .unwrap()
        .is_some());
}

fn index(attrs: Value) -> i64 {
    read(attrs).unwrap().unwrap().time_index(None, 7)
}

fn ms(t: &str) -> i64 {
    parse_datetime(t).unwrap()
}

/// QuantumLeap's order: attribute `observedAt` keys (newest), then
/// `modifiedAt` keys, then the entity's own `observedAt` and
/// `modifiedAt`, then `dateModified`; NGSIv2 metadata named `observedAt`
/// is not read, nor `dateObserved`.
#[test]
fn ngsi_ld_times_index_the_entity() {
    let t = |d: u32| format!("2025-01-{d:02}T00:00:00Z");
    let v = |extra: Value| {
        let mut a = json!({"type": "Number", "value": 1});
        a.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        a
    };
    assert_eq!(
        index(
            json!({"a": v(json!({"observedAt": t(2)})), "b": v(json!({"observedAt": t(5)})),
                     "c": v(json!({"observedAt": "bad"}))})
        ),
        ms(&t(5))
    );
    assert_eq!(
        index(json!({"modifiedAt": t(2), "a": v(json!({"modifiedAt": t(1)}))})),
        ms(&t(1)),
        "an attribute's modifiedAt before the entity's"
    );
    assert_eq!(
        index(json!({"observedAt": t(2), "modifiedAt": t(3), "a": v(json!({}))})),
        ms(&t(2))
    );
    assert_eq!(
        index(json!({"modifiedAt": t(2), "a": v(json!({})),
                     "dateModified": {"type": "DateTime", "value": t(4)}})),
        ms(&t(2))
    );
    assert_eq!(
        index(json!({"a": v(json!({})), "dateModified": {"type": "DateTime", "value": t(4)}})),
        ms(&t(4))
    );
    assert_eq!(
        index(
            json!({"a": v(json!({"metadata": {"observedAt": {"type": "DateTime", "value": t(3)}}})),
                     "dateObserved": {"type": "DateTime", "value": t(6)}})
        ),
        7,
        "NGSIv2 observedAt metadata and dateObserved are not QuantumLeap's"
    );
    assert_eq!(
        index(
            json!({"a": v(json!({"metadata": {"dateModified": {"type": "DateTime", "value": t(3)}}}))})
        ),
        ms(&t(3))
    );
}
