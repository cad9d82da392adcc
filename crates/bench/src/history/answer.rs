//! Reading QuantumLeap's answers: an attribute's series
//! (`{"index":[…],"values":[…]}`, with `id`, `type`, `attrName` around it
//! on some endpoints), an entity's states read whole (the index and every
//! attribute's values, [`table`]), an entity's per-attribute counts, and
//! the empty answers: QuantumLeap 1.0's 404 `{"error":"Not Found",…}`
//! (weft's too) and `[]`, which QuantumLeap's master gives with 200.
//!
//! Answers are decoded into typed structs that skip what the bench does
//! not read, so the query phase's clients (on the same 2 cores as the
//! server) spend as little as they can on a 3600-value body.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::payload::parse_iso;

/// Whether a status and body are QuantumLeap 1.0's answer to a query that
/// found nothing: 404 `{"error":"Not Found",…}`.
pub fn is_not_found(status: u16, body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct ErrorAnswer {
        error: String,
    }
    status == 404
        && serde_json::from_slice::<ErrorAnswer>(body).is_ok_and(|e| e.error == "Not Found")
}

/// Whether a body is an empty answer: `[]`, or QuantumLeap 1.0's
/// not-found object ([`is_not_found`]).
fn is_empty_answer(body: &[u8]) -> Result<bool, String> {
    if is_not_found(404, body) {
        return Ok(true);
    }
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => {
            let v: Vec<serde::de::IgnoredAny> =
                serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
            if v.is_empty() {
                Ok(true)
            } else {
                Err(format!(
                    "expected an object or [], got a list of {}",
                    v.len()
                ))
            }
        }
        Some(b'{') => Ok(false),
        _ => Err(format!(
            "expected JSON, got {:?}",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        )),
    }
}

/// An attribute's values only (the query phase checks these).
#[derive(Deserialize)]
struct ValuesOnly {
    values: Vec<Option<f64>>,
}

/// The values of a series answer, `null` as `None`; none for `[]`.
pub fn values(body: &[u8]) -> Result<Vec<Option<f64>>, String> {
    if is_empty_answer(body)? {
        return Ok(Vec::new());
    }
    let v: ValuesOnly =
        serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
    Ok(v.values)
}

/// An attribute's times and values (the verify phase checks both).
#[derive(Deserialize)]
struct IndexedValues {
    index: Vec<String>,
    values: Vec<Option<f64>>,
}

/// The `(time, value)` pairs of a series answer, in answer order; none for
/// `[]`. Fails on a time that is not ISO-8601, a `null` or non-numeric
/// value, or an index and values of different lengths.
pub fn pairs(body: &[u8]) -> Result<Vec<(i64, f64)>, String> {
    if is_empty_answer(body)? {
        return Ok(Vec::new());
    }
    let v: IndexedValues =
        serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
    if v.index.len() != v.values.len() {
        return Err(format!(
            "{} index entries for {} values",
            v.index.len(),
            v.values.len()
        ));
    }
    v.index
        .iter()
        .zip(&v.values)
        .map(|(t, value)| {
            let time = parse_iso(t).ok_or_else(|| format!("index entry {t:?} is not a time"))?;
            let value = value.ok_or_else(|| format!("null value at {t}"))?;
            Ok((time, value))
        })
        .collect()
}

/// One attribute of an entity answer.
#[derive(Deserialize)]
struct AttrValues {
    #[serde(rename = "attrName")]
    name: String,
    values: Vec<Option<f64>>,
}

/// An entity answer (`GET /entities/{id}`).
#[derive(Deserialize)]
struct EntityAnswer {
    attributes: Vec<AttrValues>,
}

/// Rows per attribute from an `aggrMethod=count` entity answer: the sum of
/// each attribute's (non-null) counts, whatever buckets they fall in; no
/// attribute for `[]`. An attribute whose every count is `null` is `None`:
/// not counted at all, which is what QuantumLeap 1.0 answers for a
/// `DateTime` attribute such as `TimeInstant` (its `count` is `null`, its
/// `min` and `max` the earliest and latest time), not zero rows.
pub fn counts(body: &[u8]) -> Result<BTreeMap<String, Option<u64>>, String> {
    if is_empty_answer(body)? {
        return Ok(BTreeMap::new());
    }
    let v: EntityAnswer =
        serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
    Ok(v.attributes
        .into_iter()
        .map(|a| {
            let counted = a.values.iter().any(Option::is_some);
            let n = a.values.iter().flatten().map(|c| *c as u64).sum();
            (a.name, counted.then_some(n))
        })
        .collect())
}

/// An entity's states read whole (`GET /entities/{id}?attrs=…` without an
/// aggregation): the time of each state and, per attribute, its value in
/// each state as answered (`null` where the state has none). Values stay
/// JSON: a `DateTime` attribute answers ISO-8601 text, a number a number.
#[derive(Debug, Default, PartialEq)]
pub struct Table {
    /// The time index, epoch ms, in answer order.
    pub times: Vec<i64>,
    /// Each attribute's values, one per entry of `times`.
    pub columns: BTreeMap<String, Vec<serde_json::Value>>,
}

/// One attribute of an entity answer, values of any type.
#[derive(Deserialize)]
struct Column {
    #[serde(rename = "attrName")]
    name: String,
    values: Vec<serde_json::Value>,
}

/// An entity answer read whole.
#[derive(Deserialize)]
struct EntityColumns {
    index: Vec<String>,
    attributes: Vec<Column>,
}

/// Reads an entity answer whole ([`Table`]); an empty table for `[]` or
/// QuantumLeap 1.0's not-found. Fails on an index entry that is not a
/// time, an attribute answered twice, or one whose values do not match
/// the index one for one.
pub fn table(body: &[u8]) -> Result<Table, String> {
    if is_empty_answer(body)? {
        return Ok(Table::default());
    }
    let v: EntityColumns =
        serde_json::from_slice(body).map_err(|e| format!("unreadable answer: {e}"))?;
    let times = v
        .index
        .iter()
        .map(|t| parse_iso(t).ok_or_else(|| format!("index entry {t:?} is not a time")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut columns = BTreeMap::new();
    for a in v.attributes {
        if a.values.len() != times.len() {
            return Err(format!(
                "{} values of {} for {} index entries",
                a.values.len(),
                a.name,
                times.len()
            ));
        }
        if let Some(name) = columns.insert(a.name.clone(), a.values).map(|_| a.name) {
            return Err(format!("{name} answered twice"));
        }
    }
    Ok(Table { times, columns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_series_answers() {
        let body = br#"{"id":"Room:1","type":"Room","attrName":"temperature",
            "index":["2025-01-01T00:01:00.000+00:00","2025-01-01T00:02:00.000+00:00"],
            "values":[1,2.5]}"#;
        assert_eq!(values(body), Ok(vec![Some(1.0), Some(2.5)]));
        assert_eq!(
            pairs(body),
            Ok(vec![(1_735_689_660_000, 1.0), (1_735_689_720_000, 2.5)])
        );
        assert_eq!(values(b" []"), Ok(vec![]));
        assert_eq!(pairs(b"[]\n"), Ok(vec![]));
        assert_eq!(
            values(br#"{"index":["x"],"values":[null]}"#),
            Ok(vec![None])
        );
        assert!(pairs(br#"{"index":["x"],"values":[1]}"#)
            .unwrap_err()
            .contains("not a time"));
        assert!(pairs(br#"{"index":[],"values":[1]}"#).is_err());
        assert!(values(b"[1]").is_err());
        assert!(values(b"oops").is_err());
        assert!(values(br#"{"values":["text"]}"#).is_err());
    }

    #[test]
    fn reads_counts_per_attribute() {
        let body = br#"{"id":"Room:1","type":"Room","index":["2025-01-01T00:01:00.000+00:00"],
            "attributes":[{"attrName":"TimeInstant","values":[40]},
                          {"attrName":"pressure","values":[40]},
                          {"attrName":"temperature","values":[39,null,1]}]}"#;
        let c = counts(body).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(
            (c["TimeInstant"], c["pressure"], c["temperature"]),
            (Some(40), Some(40), Some(40))
        );
        assert!(counts(b"[]").unwrap().is_empty());
        let not_found =
            br#"{"error":"Not Found","description":"No records were found for such query."}"#;
        assert!(is_not_found(404, not_found));
        assert!(!is_not_found(200, not_found));
        assert!(counts(not_found).unwrap().is_empty());
        assert_eq!(values(not_found), Ok(vec![]));
    }

    /// QuantumLeap 1.0 (Timescale) counts no `DateTime` attribute: its
    /// answer to `aggrMethod=count&attrs=TimeInstant,temperature,pressure`
    /// after three notifications, as sent. `null` is "not counted", not 0.
    #[test]
    fn a_null_count_is_not_zero_rows() {
        let body = br#"{"attributes":[{"attrName":"TimeInstant","values":[null]},
            {"attrName":"pressure","values":[3]},{"attrName":"temperature","values":[3]}],
            "entityId":"Room:7","entityType":"Room","index":[]}"#;
        let c = counts(body).unwrap();
        assert_eq!(
            (c["TimeInstant"], c["pressure"], c["temperature"]),
            (None, Some(3), Some(3))
        );
        // Per-minute buckets: every TimeInstant bucket null.
        let body = br#"{"attributes":[{"attrName":"TimeInstant","values":[null,null]},
            {"attrName":"temperature","values":[1,null]}],"index":["a","b"]}"#;
        let c = counts(body).unwrap();
        assert_eq!((c["TimeInstant"], c["temperature"]), (None, Some(1)));
    }

    /// An entity read whole, as QuantumLeap 1.0 and weft both answer it
    /// (QuantumLeap's key order): the notified `TimeInstant` is the time
    /// index and also an attribute, its values written like the index.
    #[test]
    fn reads_an_entity_whole() {
        let body = br#"{"attributes":[
            {"attrName":"TimeInstant","values":["2025-01-01T00:01:00.000+00:00","2025-01-01T00:02:00.000+00:00"]},
            {"attrName":"pressure","values":[720,null]},
            {"attrName":"temperature","values":[1.0,2.0]}],
            "entityId":"Room:7","entityType":"Room",
            "index":["2025-01-01T00:01:00.000+00:00","2025-01-01T00:02:00.000+00:00"]}"#;
        let t = table(body).unwrap();
        assert_eq!(t.times, [1_735_689_660_000, 1_735_689_720_000]);
        assert_eq!(t.columns.len(), 3);
        assert_eq!(t.columns["TimeInstant"][1], "2025-01-01T00:02:00.000+00:00");
        assert_eq!(
            t.columns["pressure"],
            [serde_json::json!(720), serde_json::Value::Null]
        );
        assert_eq!(t.columns["temperature"][0], 1.0);
        let not_found =
            br#"{"error":"Not Found","description":"No records were found for such query."}"#;
        assert_eq!(table(not_found), Ok(Table::default()));
        assert_eq!(table(b"[]"), Ok(Table::default()));
        let short = br#"{"index":["2025-01-01T00:01:00Z"],"attributes":[{"attrName":"pressure","values":[]}]}"#;
        assert!(table(short).unwrap_err().contains("0 values of pressure"));
        let twice = br#"{"index":[],"attributes":[{"attrName":"a","values":[]},{"attrName":"a","values":[]}]}"#;
        assert!(table(twice).unwrap_err().contains("twice"));
        assert!(table(br#"{"index":["x"],"attributes":[]}"#)
            .unwrap_err()
            .contains("not a time"));
    }
}
