//! Property tests of NGSI payload parsing: whatever bytes a client sends
//! as a body, and whatever JSON they hold — deeply nested included —
//! parsing answers an entity, attributes or an error, and never panics;
//! values nested deeper than the NGSI limit are refused. And of
//! rendering: the normalized form streamed for entity changes is,
//! byte for byte, what `render` makes. The cases per
//! property are bounded so `cargo test` takes seconds;
//! `PROPTEST_CASES=100000 cargo test -p weft-model proptest` runs longer.

mod proptests {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};
    use weft_model::ngsi::parse::MAX_NESTING;
    use weft_model::ngsi::render::Normalized;
    use weft_model::ngsi::{
        parse_attrs, parse_body, parse_entity, render, Attribute, Entity, Format, Metadata,
    };

    /// Names NGSI gives meaning to, so generated objects look like
    /// entities and attributes often enough to get past the first check.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("id".to_string()),
            Just("type".to_string()),
            Just("value".to_string()),
            Just("metadata".to_string()),
            Just("location".to_string()),
            Just("coordinates".to_string()),
            Just("dateCreated".to_string()),
            Just("temperature".to_string()),
            Just("geo:json".to_string()),
            Just("geo:point".to_string()),
            Just("DateTime".to_string()),
            Just("Point".to_string()),
            "\\PC{0,6}",
        ]
    }

    /// JSON values, with NGSI's names as keys and types.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            key().prop_map(Value::String),
            Just(json!("2026-01-02T03:04:05.000Z")),
            Just(json!("41.3,2.1")),
            Just(json!([2.1, 41.3])),
        ];
        leaf.prop_recursive(16, 256, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A value `depth` levels deep: arrays and objects around a leaf,
    /// built without recursion.
    fn nested(depth: usize, objects: bool) -> Value {
        let mut v = json!(1);
        for i in 0..depth {
            v = if objects && i % 2 == 0 {
                Value::Object(Map::from_iter([("k".to_string(), v)]))
            } else {
                Value::Array(vec![v])
            };
        }
        v
    }

    /// Entities as the store holds them: attributes and metadata in any
    /// order, any values, `dateExpires` among them now and then.
    fn entity() -> impl Strategy<Value = Entity> {
        let name = prop_oneof![key(), Just("dateExpires".to_string())];
        let metadata = prop::collection::vec((key(), json(), "\\PC{0,4}"), 0..4);
        prop::collection::vec((name, json(), "\\PC{0,4}", metadata), 0..7).prop_map(|attrs| {
            let mut e = Entity::new("E", "T");
            for (name, value, attr_type, metadata) in attrs {
                if name == "id" || name == "type" {
                    continue;
                }
                let mut a = Attribute::new(value, attr_type);
                for (md_name, md_value, md_type) in metadata {
                    a.metadata.insert(
                        md_name,
                        Metadata {
                            value: md_value,
                            md_type,
                        },
                    );
                }
                e.attrs.insert(name, a);
            }
            e
        })
    }

    /// `cases` cases per property, unless `PROPTEST_CASES` asks for another
    /// number (a longer run: `PROPTEST_CASES=100000`).
    fn config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::default();
        if std::env::var_os("PROPTEST_CASES").is_none() {
            config.cases = cases;
        }
        config
    }

    proptest! {
        #![proptest_config(config(1024))]

        /// Any bytes, read as a body, parse or fail cleanly.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let text = String::from_utf8_lossy(&bytes);
            if let Ok(v) = parse_body(&text) {
                let _ = parse_entity(&v, false);
                let _ = parse_attrs(&v, true);
            }
        }

        /// Any JSON text parses or fails cleanly, and what it holds
        /// parses as an entity or attributes, normalized or keyValues,
        /// or fails with an error.
        #[test]
        fn arbitrary_json_never_panics(value in json()) {
            let text = value.to_string();
            prop_assert!(parse_body(&text).is_ok(), "{}", text);
            for key_values in [false, true] {
                let _ = parse_entity(&value, key_values);
                let _ = parse_attrs(&value, key_values);
                let entity = json!({"id": "e", "type": "T", "a": value.clone()});
                let _ = parse_entity(&entity, key_values);
                let attrs = json!({"a": value.clone(), "b": {"value": value.clone(), "metadata": {"m": value.clone()}}});
                let _ = parse_attrs(&attrs, key_values);
            }
        }

        /// Bodies nested far deeper than any parser should follow fail
        /// cleanly: the JSON parser stops, nothing overflows.
        #[test]
        fn deeply_nested_text_fails_cleanly(depth in 0usize..20_000, objects in any::<bool>()) {
            let (open, close) = if objects { ("{\"k\":", "}") } else { ("[", "]") };
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let parsed = parse_body(&text);
            if depth > 128 {
                prop_assert!(parsed.is_err(), "depth {}", depth);
            }
        }

        /// An entity change's normalized entity, written straight from the
        /// entity, is byte for byte what `render` makes of it.
        #[test]
        fn the_streamed_normalized_form_is_renders(e in entity()) {
            let streamed = serde_json::to_string(&Normalized(&e)).unwrap();
            prop_assert_eq!(streamed, render(&e, Format::Normalized, None, None).to_string());
        }

        /// An attribute value nested deeper than the NGSI limit is refused;
        /// one within it is kept.
        #[test]
        fn attribute_values_are_bounded_in_depth(depth in 0usize..300, objects in any::<bool>()) {
            let value = nested(depth, objects);
            let entity = json!({"id": "e", "type": "T", "a": {"value": value.clone()}});
            let parsed = parse_entity(&entity, false);
            prop_assert_eq!(parsed.is_ok(), depth <= MAX_NESTING, "depth {}", depth);
            let kv = json!({"a": value});
            prop_assert_eq!(parse_attrs(&kv, true).is_ok(), depth <= MAX_NESTING, "depth {}", depth);
        }
    }
}
