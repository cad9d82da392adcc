//! Property tests of the query language: whatever a client sends as `q`
//! or `mq`, parsing answers (a query or an error naming the problem) and
//! never panics, and evaluating a parsed query against any JSON never
//! panics. The cases per property are bounded so `cargo test` takes
//! seconds; `PROPTEST_CASES=100000 cargo test -p weft-model proptest`
//! runs longer.

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::ngsi::format_datetime;

/// Characters the grammar gives meaning to, and a few it forbids, so
/// generated strings reach deep into the parser instead of failing at
/// the first character.
fn query_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("a".to_string()),
        Just("temp".to_string()),
        Just("x.y".to_string()),
        Just("'a.b'".to_string()),
        Just("'".to_string()),
        Just("metadata".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just(":".to_string()),
        Just(">".to_string()),
        Just(">=".to_string()),
        Just("<".to_string()),
        Just("<=".to_string()),
        Just("~=".to_string()),
        Just("!".to_string()),
        Just(";".to_string()),
        Just(",".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        Just("true".to_string()),
        Just("null".to_string()),
        Just("2026-01-02T03:04:05.000Z".to_string()),
        Just("(".to_string()),
        Just("[a-z]+".to_string()),
        "-?[0-9]{1,4}(\\.[0-9]{0,3})?(e-?[0-9]{1,3})?",
        "\\PC{0,3}",
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

/// JSON values, deeply nested ones included.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::String),
        Just(Value::String("2026-01-02T03:04:05.000Z".into())),
    ];
    leaf.prop_recursive(48, 256, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z.]{0,4}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
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

    /// Any string parses to a query or an error, as `q` and as `mq`; a
    /// parsed query evaluates against any value without panicking.
    #[test]
    fn arbitrary_strings_never_panic(q in "\\PC{0,64}", value in json()) {
        for parsed in [Query::parse(&q), Query::parse_mq(&q)] {
            match parsed {
                Ok(query) => {
                    let _ = query.matches(|_| Some(&value));
                    let _ = query.matches_with(&JsonResolver(&value));
                }
                Err(e) => prop_assert!(!e.description().is_empty()),
            }
        }
    }

    /// Strings made of the grammar's own pieces parse or fail cleanly, and
    /// what parses evaluates against any value, with and without metadata.
    #[test]
    fn grammar_shaped_strings_never_panic(q in query_text(), value in json()) {
        for query in [Query::parse(&q), Query::parse_mq(&q)].into_iter().flatten() {
            let _ = query.matches(|_| Some(&value));
            let _ = query.matches_with(&JsonResolver(&value));
            let _ = query.matches(|_| None);
            // Each item has a path, and each item takes a character.
            prop_assert!(query.paths().count() <= q.len());
        }
    }

    /// A date-time literal reads back as the instant it was written from
    /// (ISO-8601 with milliseconds, as NGSI displays it).
    #[test]
    fn datetimes_round_trip(ms in -62_135_596_800_000i64..253_402_300_799_999) {
        let text = format_datetime(ms);
        prop_assert_eq!(parse_datetime(&text), Some(ms), "{}", text);
        let query = Query::parse(&format!("t=={text}")).unwrap();
        let value = Value::String(text.clone());
        prop_assert!(query.matches(|_| Some(&value)), "{}", text);
    }

    /// Numbers as the query language reads them: what Rust prints for a
    /// finite double reads back as that double.
    #[test]
    fn numbers_round_trip(x in any::<f64>().prop_filter("finite", |x| x.is_finite())) {
        prop_assert_eq!(parse_number(&x.to_string()), Some(x));
    }
}
