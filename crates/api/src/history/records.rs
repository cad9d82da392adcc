//! Stored history rows put back together as QuantumLeap's rows, and cut
//! as QuantumLeap cuts them.
//!
//! weft stores one row per (entity, attribute, time index, recorded
//! state); QuantumLeap one row per recorded entity state, with a column
//! per attribute, in one table per entity type. A [`Record`] is such a
//! row: the values one recorded state (one notification) gave its
//! attributes. QuantumLeap applies `lastN`, `limit` and `offset` to each
//! table's rows (its SQL `LIMIT`/`OFFSET`), so on the type-wide endpoints
//! they count the records of every entity of the type together, and on
//! `/v2/attrs…` each type separately ([`Grouping`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;
use weft_model::geo::{GeoQuery, Shape};
use weft_model::history::format_index;
use weft_store::{AggrMethod, HistoryQuery, HistoryRow, Store};

use super::params::{Params, DEFAULT_LIMIT};
use super::{QlError, Scope};

/// One recorded entity state: QuantumLeap's row.
#[derive(Debug, Clone, Default)]
pub(crate) struct Record {
    /// The time index (epoch ms); with an aggregation, the bucket's start.
    pub time: i64,
    /// The recorded state ([`HistoryRow::instance`]).
    pub instance: i64,
    /// The attributes' values, by name.
    pub values: BTreeMap<String, Value>,
}

/// One entity's records, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct EntityRecords {
    /// The records, ordered by (time, instance).
    pub records: Vec<Record>,
}

impl EntityRecords {
    /// The names of the attributes the records hold, in order.
    pub fn attr_names(&self) -> Vec<&str> {
        let names: std::collections::BTreeSet<&str> = self
            .records
            .iter()
            .flat_map(|r| r.values.keys().map(String::as_str))
            .collect();
        names.into_iter().collect()
    }

    /// The `index` of the records: their times as QuantumLeap writes them.
    pub fn index(&self) -> Vec<Value> {
        self.records
            .iter()
            .map(|r| Value::String(format_index(r.time)))
            .collect()
    }

    /// The values of `attr` along the records (`null` where a record has
    /// none).
    pub fn values(&self, attr: &str) -> Vec<Value> {
        let name = self.name_of(attr);
        self.records
            .iter()
            .map(|r| r.values.get(name).cloned().unwrap_or(Value::Null))
            .collect()
    }

    /// Whether the records have `attr` (a column, even if null).
    pub fn has(&self, attr: &str) -> bool {
        let name = self.name_of(attr);
        self.records.iter().any(|r| r.values.contains_key(name))
    }

    /// The name `attr` is stored under in the records: itself, or the one
    /// equal to it but for ASCII case (names asked in a path match stored
    /// ones whatever their case).
    fn name_of<'a>(&'a self, attr: &'a str) -> &'a str {
        let Some(first) = self.records.first() else {
            return attr;
        };
        if first.values.contains_key(attr) {
            return attr;
        }
        first
            .values
            .keys()
            .find(|k| k.eq_ignore_ascii_case(attr))
            .map_or(attr, String::as_str)
    }
}

/// Records per entity, keyed and ordered by (type, id).
pub(crate) type Found = BTreeMap<(String, String), EntityRecords>;

/// Whose records `lastN`, `limit` and `offset` count together: the rows of
/// one QuantumLeap table (a type), or of one entity (its entity-scoped
/// endpoints, whose `WHERE entity_id = …` leaves that entity's rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// Each entity alone.
    Entity,
    /// Every entity of a type together.
    Type,
}

/// What a query asks of the history besides its parameters.
pub(crate) struct Selection {
    /// Only this type (from the path, else the `type` parameter).
    pub entity_type: Option<String>,
    /// Only these ids (from the path, else `id`/`idPattern`).
    pub ids: Vec<String>,
    /// Only these attributes (from the path, else `attrs`).
    pub attrs: Vec<String>,
    /// How the rows are counted.
    pub grouping: Grouping,
}

/// The records `params` and `selection` ask for, cut as QuantumLeap cuts
/// them; with an aggregation, one record per entity and bucket.
pub(crate) async fn fetch(
    store: &Arc<dyn Store>,
    scope: &Scope,
    params: &Params,
    selection: Selection,
) -> Result<Found, QlError> {
    let mut ids = selection.ids;
    if ids.is_empty() && params.id_pattern.is_some() {
        ids = store
            .history_entities(
                &scope.tenant,
                selection.entity_type.as_deref(),
                scope.service_path.as_deref(),
            )
            .await?
            .into_iter()
            .map(|e| e.entity_id)
            .filter(|id| params.wants_id(id))
            .collect();
        if ids.is_empty() {
            return Ok(Found::new());
        }
    }
    let mut columns = Columns::default();
    let mut asked = selection.attrs;
    let mut selection_type = selection.entity_type;
    if let Some(ty) = &selection_type {
        if columns.of(store, &scope.tenant, ty).await?.is_empty() {
            // A type matches whatever its case, as QuantumLeap's
            // lower-cased table names do.
            if let Some(stored) = type_in_other_case(store, scope, ty).await? {
                selection_type = Some(stored);
            }
        }
    }
    if let (Some(ty), false) = (&selection_type, asked.is_empty()) {
        // Asked names match stored ones whatever their case, as
        // QuantumLeap's lower-cased columns do.
        let known = columns.of(store, &scope.tenant, ty).await?;
        asked = asked.iter().map(|a| resolve(known, a)).collect();
    }
    // Every recorded state in range is a record (QuantumLeap's row, null
    // in the columns it lacks): the store reads the attributes asked and
    // marks the states holding none of them. Without a type the names
    // asked may stand for others in another case: every attribute is
    // read then, and the records projected on what was asked below.
    let read = if selection_type.is_some() {
        asked.clone()
    } else {
        Vec::new()
    };
    let base = HistoryQuery {
        tenant: scope.tenant.clone(),
        service_path: scope.service_path.clone(),
        entity_ids: ids,
        entity_type: selection_type,
        attrs: read,
        every_state: true,
        from: params.from.as_ref().map(|d| d.1),
        to: params.to.as_ref().map(|d| d.1),
        last_n: None,
        offset: 0,
        limit: DEFAULT_LIMIT,
    };
    if let Some((method, period)) = params.aggregate {
        // The type's other attributes: where states hold only those, the
        // attributes asked aggregate to null (`None`: not known, any).
        let others = match &base.entity_type {
            Some(ty) if !asked.is_empty() => Some(
                columns
                    .of(store, &scope.tenant, ty)
                    .await?
                    .iter()
                    .filter(|c| !asked.contains(c))
                    .cloned()
                    .collect(),
            ),
            _ => None,
        };
        let q = HistoryQuery {
            attrs: asked,
            ..base
        };
        return aggregate(store, &q, method, period, others).await;
    }
    let take = params.last_n.map_or(params.limit, |n| n.min(params.limit));
    let newest_first = params.last_n.is_some();
    let rows = if let Some(geo) = &params.geo {
        geo_rows(store, &base, geo).await?
    } else {
        leading_rows(
            store,
            &base,
            newest_first,
            params.offset.saturating_add(take),
        )
        .await?
    };
    let found = cut(
        records(rows),
        selection.grouping,
        newest_first,
        params.offset,
        take,
    );
    let mut out = Found::new();
    for ((ty, id), mut e) in found {
        let known = columns.of(store, &scope.tenant, &ty).await?;
        let shown: Vec<String> = if asked.is_empty() {
            known.to_vec()
        } else {
            asked.iter().map(|a| resolve(known, a)).collect()
        };
        if shown.is_empty() || shown.iter().any(|a| !known.contains(a)) {
            // A type without one of the columns asked: QuantumLeap's
            // SELECT of its table fails, and the type is left out.
            continue;
        }
        for r in &mut e.records {
            let mut values = std::mem::take(&mut r.values);
            r.values = shown
                .iter()
                .map(|name| (name.clone(), values.remove(name).unwrap_or(Value::Null)))
                .collect();
        }
        out.insert((ty, id), e);
    }
    Ok(out)
}

/// The stored type equal to `entity_type` but for ASCII case, if the
/// tenant has history of one.
async fn type_in_other_case(
    store: &Arc<dyn Store>,
    scope: &Scope,
    entity_type: &str,
) -> Result<Option<String>, QlError> {
    Ok(store
        .history_entities(&scope.tenant, None, None)
        .await?
        .into_iter()
        .map(|e| e.entity_type)
        .find(|t| t.eq_ignore_ascii_case(entity_type)))
}

/// The attribute names of each type met in one query
/// ([`Store::history_attributes`], QuantumLeap's columns), read once.
#[derive(Default)]
struct Columns(BTreeMap<String, Vec<String>>);

impl Columns {
    async fn of(
        &mut self,
        store: &Arc<dyn Store>,
        tenant: &str,
        entity_type: &str,
    ) -> Result<&[String], QlError> {
        if !self.0.contains_key(entity_type) {
            let names = store.history_attributes(tenant, entity_type).await?;
            self.0.insert(entity_type.to_string(), names);
        }
        Ok(&self.0[entity_type])
    }
}

/// The stored name `asked` stands for: itself when stored, else the
/// stored name equal to it but for ASCII case, else itself.
fn resolve(known: &[String], asked: &str) -> String {
    if known.iter().any(|k| k == asked) {
        return asked.to_string();
    }
    known
        .iter()
        .find(|k| k.eq_ignore_ascii_case(asked))
        .cloned()
        .unwrap_or_else(|| asked.to_string())
}

/// Most rows one history query returns per series (the store's cap).
const PAGE_ROWS: usize = DEFAULT_LIMIT;

/// Most rows a type-wide cut reads per series (100 pages): an `offset`
/// reaching past it sees only the rows before it, so one request cannot
/// make weft hold a whole type's history in memory.
const MAX_LEADING_ROWS: usize = 100 * PAGE_ROWS;

/// The first `count` rows of every series of `q` (the newest `count`
/// with `newest_first`; at most [`MAX_LEADING_ROWS`]), paged through the
/// store: a superset of every
/// record a type-wide cut of `count` records can keep, since a record
/// among a type's first `count` is among its own series' first `count`.
async fn leading_rows(
    store: &Arc<dyn Store>,
    q: &HistoryQuery,
    newest_first: bool,
    count: usize,
) -> Result<Vec<HistoryRow>, QlError> {
    let count = count.min(MAX_LEADING_ROWS);
    let mut out = Vec::new();
    let mut skipped = 0;
    while skipped < count {
        let page = (count - skipped).min(PAGE_ROWS);
        let rows = store
            .query_history(&HistoryQuery {
                last_n: newest_first.then_some(count),
                offset: skipped,
                limit: page,
                ..q.clone()
            })
            .await?;
        if rows.is_empty() {
            break;
        }
        out.extend(rows);
        skipped += page;
    }
    Ok(out)
}

/// Rows of `q` at the times their entity's `location` matched `geo`
/// (QuantumLeap filters each stored state by its location). The filter
/// looks at the first 10,000 values of each series in range.
async fn geo_rows(
    store: &Arc<dyn Store>,
    q: &HistoryQuery,
    geo: &GeoQuery,
) -> Result<Vec<HistoryRow>, QlError> {
    let locations = store
        .query_history(&HistoryQuery {
            attrs: vec!["location".to_string()],
            every_state: false,
            ..q.clone()
        })
        .await?;
    let inside: HashSet<(String, String, i64, i64)> = locations
        .into_iter()
        .filter(|r| {
            serde_json::from_str::<Value>(&r.value)
                .ok()
                .and_then(|v| Shape::from_attribute(&r.attr_type, &v).ok().flatten())
                .is_some_and(|shape| geo.matches(&shape))
        })
        .map(|r| (r.entity_type, r.entity_id, r.time, r.instance))
        .collect();
    Ok(store
        .query_history(q)
        .await?
        .into_iter()
        .filter(|r| {
            inside.contains(&(
                r.entity_type.clone(),
                r.entity_id.clone(),
                r.time,
                r.instance,
            ))
        })
        .collect())
}

/// Aggregates per entity, attribute and bucket as records (one per
/// bucket); a numeric method over values none of which is a number is
/// QuantumLeap's 404.
async fn aggregate(
    store: &Arc<dyn Store>,
    q: &HistoryQuery,
    method: AggrMethod,
    period: Option<weft_store::AggrPeriod>,
    others: Option<Vec<String>>,
) -> Result<Found, QlError> {
    // QuantumLeap groups the rows of the type's table: an entity with rows
    // in range but no value of an attribute asked aggregates to null (a
    // count 0) for it. The buckets where the type's other attributes have
    // rows show that; they are aggregated in the same call (every
    // attribute when the type, and so its other attributes, is unknown).
    let asked = &q.attrs;
    let fill = !asked.is_empty();
    let read = match &others {
        _ if !fill => q.clone(),
        Some(others) => HistoryQuery {
            attrs: asked.iter().chain(others).cloned().collect(),
            ..q.clone()
        },
        None => HistoryQuery {
            attrs: Vec::new(),
            ..q.clone()
        },
    };
    let (aggs, elsewhere): (Vec<_>, Vec<_>) = store
        .aggregate_history(&read, method, period)
        .await?
        .into_iter()
        .partition(|a| !fill || asked.contains(&a.attr));
    if method != AggrMethod::Count && !aggs.is_empty() && aggs.iter().all(|a| a.value.is_none()) {
        return Err(QlError::api(
            StatusCode::NOT_FOUND,
            "AggrMethod cannot be applied",
            "AggrMethod cannot be applied on type TEXT and BOOLEAN.",
        ));
    }
    let bucket_of = |a: &weft_store::HistoryAggregate| match period {
        Some(_) => a.bucket,
        // One value per entity: every attribute's in one record.
        None => 0,
    };
    let mut by_entity: BTreeMap<(String, String), BTreeMap<i64, Record>> = BTreeMap::new();
    for a in &elsewhere {
        let bucket = bucket_of(a);
        by_entity
            .entry((a.entity_type.clone(), a.entity_id.clone()))
            .or_default()
            .entry(bucket)
            .or_insert_with(|| Record {
                time: bucket,
                ..Record::default()
            });
    }
    for a in aggs {
        let bucket = bucket_of(&a);
        let record = by_entity
            .entry((a.entity_type, a.entity_id))
            .or_default()
            .entry(bucket)
            .or_insert_with(|| Record {
                time: bucket,
                ..Record::default()
            });
        let value = match (method, a.value) {
            (_, None) => Value::Null,
            // A count is a whole number; every other aggregate of
            // QuantumLeap's float columns a float (`20.0`).
            (AggrMethod::Count, Some(n)) => Value::from(n as i64),
            (_, Some(n)) => Value::from(n),
        };
        record.values.insert(a.attr, value);
    }
    if fill {
        // Every record answers every attribute asked: SQL's COUNT of
        // nulls is 0, its other aggregates null.
        let none = match method {
            AggrMethod::Count => Value::from(0),
            _ => Value::Null,
        };
        for record in by_entity.values_mut().flat_map(|r| r.values_mut()) {
            for attr in asked {
                record.values.entry(attr.clone()).or_insert(none.clone());
            }
        }
    }
    Ok(by_entity
        .into_iter()
        .map(|(key, records)| {
            (
                key,
                EntityRecords {
                    records: records.into_values().collect(),
                },
            )
        })
        .collect())
}

/// Rows grouped into records per entity.
fn records(rows: Vec<HistoryRow>) -> Found {
    let mut by_entity: BTreeMap<(String, String), BTreeMap<(i64, i64), Record>> = BTreeMap::new();
    for r in rows {
        let value = render_value(&r.attr_type, &r.value);
        by_entity
            .entry((r.entity_type, r.entity_id))
            .or_default()
            .entry((r.time, r.instance))
            .or_insert_with(|| Record {
                time: r.time,
                instance: r.instance,
                values: BTreeMap::new(),
            })
            .values
            .insert(r.attr, value);
    }
    by_entity
        .into_iter()
        .map(|(key, records)| {
            (
                key,
                EntityRecords {
                    records: records.into_values().collect(),
                },
            )
        })
        .collect()
}

/// A record's (time, instance) and its entity's (type, id).
type RecordAt<'a> = (i64, i64, &'a (String, String));

/// Keeps, of each group's records in (time, instance) order, `take`
/// after skipping `skip` — counted from the newest with `newest_first`
/// (QuantumLeap's `ORDER BY time_index DESC` for `lastN`) — and drops the
/// entities left without records.
fn cut(found: Found, grouping: Grouping, newest_first: bool, skip: usize, take: usize) -> Found {
    let mut groups: BTreeMap<(&str, &str), Vec<RecordAt<'_>>> = BTreeMap::new();
    for (key, e) in &found {
        let group = match grouping {
            Grouping::Entity => (key.0.as_str(), key.1.as_str()),
            Grouping::Type => (key.0.as_str(), ""),
        };
        let list = groups.entry(group).or_default();
        list.extend(e.records.iter().map(|r| (r.time, r.instance, key)));
    }
    let mut kept: HashSet<(&(String, String), i64, i64)> = HashSet::new();
    for (_, mut list) in groups {
        list.sort_unstable();
        let chosen: Box<dyn Iterator<Item = _>> = if newest_first {
            Box::new(list.iter().rev().skip(skip).take(take))
        } else {
            Box::new(list.iter().skip(skip).take(take))
        };
        kept.extend(chosen.map(|&(t, i, key)| (key, t, i)));
    }
    let kept: HashSet<((String, String), i64, i64)> = kept
        .into_iter()
        .map(|(k, t, i)| (k.clone(), t, i))
        .collect();
    found
        .into_iter()
        .filter_map(|(key, mut e)| {
            e.records
                .retain(|r| kept.contains(&(key.clone(), r.time, r.instance)));
            (!e.records.is_empty()).then_some((key, e))
        })
        .collect()
}

/// A stored value as QuantumLeap answers it, cast to its attribute's type
/// as QuantumLeap casts what it stores (its user manual's "Data Casting"
/// table): `Number` a float, `Integer` an integer (numeric text parsed),
/// `DateTime` and date-time `Property` values in its index format, `Text`
/// the value's text, `StructuredValue` an object or array — and `null`
/// where the cast fails; `geo:point` as `"lat, lon"`.
pub(super) fn render_value(attr_type: &str, json: &str) -> Value {
    let value: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let as_float = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let date = |s: &str| weft_model::ngsi::parse_datetime(s).map(format_index);
    match attr_type {
        _ if value.is_null() => value,
        "Number" => as_float(&value).map_or(Value::Null, Value::from),
        "Integer" => match &value {
            Value::Number(n) if n.is_i64() || n.is_u64() => value,
            v => as_float(v).map_or(Value::Null, |f| Value::from(f.trunc() as i64)),
        },
        "DateTime" | "ISO8601" => value
            .as_str()
            .and_then(date)
            .map_or(Value::Null, Value::String),
        "Text" => match &value {
            Value::String(_) => value,
            v => Value::String(python_text(v)),
        },
        "StructuredValue" => match &value {
            Value::Object(_) | Value::Array(_) => value,
            _ => Value::Null,
        },
        "Property" => match value.as_str().and_then(date) {
            Some(d) => Value::String(d),
            None => value,
        },
        "geo:point" => match &value {
            Value::String(s) => {
                let parts: Vec<&str> = s.split(',').map(str::trim).collect();
                Value::String(parts.join(", "))
            }
            _ => value,
        },
        _ => value,
    }
}

/// A value as QuantumLeap's text column holds it: Python's `str()` of the
/// value (`True`, `1.0`, `['a', 'b']`, `{'k': 'v'}`).
fn python_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => weft_model::history::python::repr(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn found(entities: &[(&str, &str, &[i64])]) -> Found {
        entities
            .iter()
            .map(|(ty, id, times)| {
                let records = times
                    .iter()
                    .map(|&t| Record {
                        time: t,
                        instance: 0,
                        values: [("a".to_string(), json!(t))].into(),
                    })
                    .collect();
                ((ty.to_string(), id.to_string()), EntityRecords { records })
            })
            .collect()
    }

    fn times(f: &Found) -> Vec<(String, Vec<i64>)> {
        f.iter()
            .map(|(k, e)| (k.1.clone(), e.records.iter().map(|r| r.time).collect()))
            .collect()
    }

    #[test]
    fn a_type_wide_cut_counts_every_entity_of_the_type_together() {
        let f = found(&[("Room", "a", &[1, 3, 5]), ("Room", "b", &[2, 4, 6])]);
        let newest = cut(f.clone(), Grouping::Type, true, 0, 2);
        assert_eq!(
            times(&newest),
            [("a".into(), vec![5]), ("b".into(), vec![6])]
        );
        let page = cut(f.clone(), Grouping::Type, false, 1, 3);
        assert_eq!(
            times(&page),
            [("a".into(), vec![3]), ("b".into(), vec![2, 4])]
        );
        let per_entity = cut(f, Grouping::Entity, true, 1, 1);
        assert_eq!(
            times(&per_entity),
            [("a".into(), vec![3]), ("b".into(), vec![4])]
        );
    }

    #[test]
    fn values_are_rendered_as_quantumleap_answers_them() {
        assert_eq!(render_value("Number", "3"), json!(3.0));
        assert_eq!(render_value("Integer", "3"), json!(3));
        assert_eq!(
            render_value("DateTime", "\"2026-01-01T00:00:00Z\""),
            json!("2026-01-01T00:00:00.000+00:00")
        );
        assert_eq!(render_value("geo:point", "\"1.5,2\""), json!("1.5, 2"));
        // QuantumLeap's casting table.
        for (ty, stored, answered) in [
            ("Number", "true", json!(null)),
            ("Number", "\"1.0\"", json!(1.0)),
            ("Integer", "1.0", json!(1)),
            ("Integer", "\"1.0\"", json!(1)),
            ("Integer", "\"2017-06-19T11:46:45.00Z\"", json!(null)),
            ("DateTime", "1", json!(null)),
            ("Text", "1.0", json!("1.0")),
            ("Text", "true", json!("True")),
            ("Text", "[\"a\",\"b\"]", json!("['a', 'b']")),
            ("Text", "{\"test\":\"test\"}", json!("{'test': 'test'}")),
            ("StructuredValue", "\"1.0\"", json!(null)),
            ("StructuredValue", "[\"a\"]", json!(["a"])),
            (
                "Property",
                "\"2017-06-19T11:46:45.00Z\"",
                json!("2017-06-19T11:46:45.000+00:00"),
            ),
            ("Property", "1", json!(1)),
        ] {
            assert_eq!(render_value(ty, stored), answered, "{ty} {stored}");
        }
    }
}
