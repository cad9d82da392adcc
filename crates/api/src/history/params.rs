//! The query parameters of QuantumLeap's `GET` endpoints, checked in
//! QuantumLeap's order with its answers: what breaks its specification
//! (a type, an enumeration, a minimum) is a 400 problem JSON, as its
//! request validation answers; then its own checks (`aggrPeriod` without
//! `aggrMethod`, `aggrMethod` without `attrs`, the options it does not
//! implement, the geographical parameters); then the dates (422).

use std::collections::HashMap;

use axum::http::StatusCode;
use weft_model::geo::GeoQuery;
use weft_model::ngsi::parse_datetime;
use weft_store::{AggrMethod, AggrPeriod};

use super::QlError;

/// Default and largest `limit` of a query: QuantumLeap's `DEFAULT_LIMIT`,
/// which also silently caps a larger one (its issue #417).
pub const DEFAULT_LIMIT: usize = 10_000;

/// A query's parameters, checked.
#[derive(Debug, Default)]
pub(crate) struct Params {
    /// `type`.
    pub entity_type: Option<String>,
    /// `id`, a comma list.
    pub ids: Vec<String>,
    /// `idPattern`, compiled.
    pub id_pattern: Option<regex::Regex>,
    /// `attrs`, a comma list (empty: every attribute).
    pub attrs: Vec<String>,
    /// `fromDate` as given, and as epoch milliseconds.
    pub from: Option<(String, i64)>,
    /// `toDate` as given, and as epoch milliseconds.
    pub to: Option<(String, i64)>,
    /// `lastN`.
    pub last_n: Option<usize>,
    /// `limit`, capped at [`DEFAULT_LIMIT`].
    pub limit: usize,
    /// `offset`.
    pub offset: usize,
    /// `aggrMethod` and `aggrPeriod`.
    pub aggregate: Option<(AggrMethod, Option<AggrPeriod>)>,
    /// `georel`, `geometry` and `coords`.
    pub geo: Option<GeoQuery>,
}

/// Which endpoint the parameters are for: an attribute in the path makes
/// `attrs` unnecessary for an aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attrs {
    /// One attribute, named in the path.
    InPath,
    /// Any number, from `attrs`.
    FromQuery,
}

impl Params {
    /// Checks the raw query `q` of an endpoint.
    pub fn parse(q: &HashMap<String, String>, attrs_from: Attrs) -> Result<Params, QlError> {
        let text = |name: &str| q.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let last_n = integer(q, "lastN", 1)?;
        let limit = integer(q, "limit", 1)?;
        let offset = integer(q, "offset", 0)?;
        let method = one_of(text("aggrMethod"), &["count", "sum", "avg", "min", "max"])?;
        let period = one_of(
            text("aggrPeriod"),
            &["year", "month", "day", "hour", "minute", "second"],
        )?;
        let scope = one_of(text("aggrScope"), &["entity", "global"])?;
        let options = one_of(text("options"), &["keyValues", "values"])?;
        if period.is_some() && method.is_none() {
            return Err(QlError::api(
                StatusCode::BAD_REQUEST,
                "Bad parameters use",
                "aggrMethod is compulsory when using aggrPeriod.",
            ));
        }
        if options.is_some() || scope == Some("global") {
            return Err(QlError::api(
                StatusCode::NOT_IMPLEMENTED,
                "Not implemented option",
                "aggrScope and options are not yet implemented.",
            ));
        }
        let attrs = list(text("attrs"));
        if let Some(m) = method {
            if attrs_from == Attrs::FromQuery && attrs.is_empty() {
                return Err(QlError::api(
                    StatusCode::BAD_REQUEST,
                    "Bad parameters use",
                    format!("Specified aggrMethod = {m} but missing attrs parameter."),
                ));
            }
        }
        let geo = geo_query(text("georel"), text("geometry"), text("coords"))?;
        if geo.is_some() && method.is_some() {
            return Err(QlError::api(
                StatusCode::BAD_REQUEST,
                "Bad parameters use",
                "Geographical parameters cannot be combined with aggrMethod.",
            ));
        }
        let id_pattern = match text("idPattern") {
            None => None,
            // QuantumLeap appends `($|.*)` and matches case-insensitively
            // from the start of the id: a prefix match.
            Some(p) => Some(
                regex::RegexBuilder::new(&format!("^(?:{p})"))
                    .case_insensitive(true)
                    .build()
                    .map_err(|_| {
                        QlError::bad_parameter(format!("'{p}' is not a valid regular expression"))
                    })?,
            ),
        };
        Ok(Params {
            entity_type: text("type").map(str::to_string),
            ids: list(text("id")),
            id_pattern,
            attrs,
            from: date(text("fromDate"))?,
            to: date(text("toDate"))?,
            last_n,
            limit: limit.unwrap_or(DEFAULT_LIMIT).min(DEFAULT_LIMIT),
            offset: offset.unwrap_or(0),
            aggregate: method.map(|m| (aggr_method(m), period.map(aggr_period))),
            geo,
        })
    }

    /// Whether `id` passes `id` and `idPattern`.
    pub fn wants_id(&self, id: &str) -> bool {
        (self.ids.is_empty() || self.ids.iter().any(|i| i == id))
            && self.id_pattern.as_ref().is_none_or(|p| p.is_match(id))
    }
}

/// A comma list, blanks dropped.
fn list(v: Option<&str>) -> Vec<String> {
    v.map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// An integer parameter of at least `minimum`, as the specification
/// declares `lastN`, `limit` and `offset`.
fn integer(
    q: &HashMap<String, String>,
    name: &str,
    minimum: usize,
) -> Result<Option<usize>, QlError> {
    let Some(raw) = q.get(name) else {
        return Ok(None);
    };
    let n: i64 = raw.trim().parse().map_err(|_| {
        QlError::bad_parameter(format!(
            "Wrong type, expected 'integer' for query parameter '{name}'"
        ))
    })?;
    if n < minimum as i64 {
        return Err(QlError::bad_parameter(format!(
            "{n} is less than the minimum of {minimum}"
        )));
    }
    Ok(Some(usize::try_from(n).unwrap_or(usize::MAX)))
}

/// A parameter whose value must be one of `allowed`.
fn one_of<'a>(v: Option<&'a str>, allowed: &[&str]) -> Result<Option<&'a str>, QlError> {
    match v {
        Some(v) if !allowed.contains(&v) => Err(QlError::bad_parameter(format!(
            "'{v}' is not one of [{}]",
            allowed
                .iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        v => Ok(v),
    }
}

fn aggr_method(m: &str) -> AggrMethod {
    match m {
        "count" => AggrMethod::Count,
        "sum" => AggrMethod::Sum,
        "avg" => AggrMethod::Avg,
        "min" => AggrMethod::Min,
        _ => AggrMethod::Max,
    }
}

fn aggr_period(p: &str) -> AggrPeriod {
    match p {
        "year" => AggrPeriod::Year,
        "month" => AggrPeriod::Month,
        "day" => AggrPeriod::Day,
        "hour" => AggrPeriod::Hour,
        "minute" => AggrPeriod::Minute,
        _ => AggrPeriod::Second,
    }
}

/// `fromDate`/`toDate`: an ISO-8601 date-time (a date alone means its
/// midnight UTC), else QuantumLeap's 422. Double quotes around it are
/// dropped, as QuantumLeap drops them (clients quote dates in URLs).
fn date(v: Option<&str>) -> Result<Option<(String, i64)>, QlError> {
    let Some(quoted) = v else { return Ok(None) };
    let raw = quoted.trim_matches('"');
    let parsed = parse_datetime(raw).or_else(|| {
        // A date alone, or a time without a zone (taken as UTC).
        parse_datetime(&format!("{raw}T00:00:00Z")).or_else(|| parse_datetime(&format!("{raw}Z")))
    });
    match parsed {
        Some(ms) => Ok(Some((raw.to_string(), ms))),
        None => Err(QlError::api(
            StatusCode::UNPROCESSABLE_ENTITY,
            "<class 'exceptions.exceptions.InvalidParameterValue'>",
            format!("The parameter value '{quoted}' for parameter **fromDate** or **toDate** is not valid."),
        )),
    }
}

/// The geographical parameters, all three or none: anything else, or a
/// value that does not parse, is QuantumLeap's 400 `ValueError`;
/// `equals`, which it does not support, its 422.
fn geo_query(
    georel: Option<&str>,
    geometry: Option<&str>,
    coords: Option<&str>,
) -> Result<Option<GeoQuery>, QlError> {
    let invalid = || {
        QlError::api(
            StatusCode::BAD_REQUEST,
            "ValueError",
            "Invalid geographical query parameters",
        )
    };
    match (georel, geometry, coords) {
        (None, None, None) => Ok(None),
        (Some(rel), Some(_), Some(_)) if rel.starts_with("equals") => Err(QlError::api(
            StatusCode::UNPROCESSABLE_ENTITY,
            "NotSupportedQuery",
            "This geographical query is not supported",
        )),
        (Some(_), Some(_), Some(_)) => GeoQuery::from_params(georel, geometry, coords)
            .map_err(|_| invalid())?
            .map(Some)
            .ok_or_else(invalid),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &[(&str, &str)], attrs: Attrs) -> Result<Params, QlError> {
        let q = q
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Params::parse(&q, attrs)
    }

    fn status(r: Result<Params, QlError>) -> u16 {
        use axum::response::IntoResponse;
        r.map_or_else(|e| e.into_response().status().as_u16(), |_| 200)
    }

    #[test]
    fn checks_follow_quantumleaps_answers() {
        assert_eq!(status(parse(&[("lastN", "0")], Attrs::InPath)), 400);
        assert_eq!(status(parse(&[("limit", "x")], Attrs::InPath)), 400);
        assert_eq!(status(parse(&[("offset", "-1")], Attrs::InPath)), 400);
        assert_eq!(
            status(parse(&[("aggrMethod", "median")], Attrs::InPath)),
            400
        );
        assert_eq!(status(parse(&[("aggrPeriod", "day")], Attrs::InPath)), 400);
        assert_eq!(
            status(parse(&[("options", "keyValues")], Attrs::InPath)),
            501
        );
        assert_eq!(
            status(parse(&[("aggrScope", "global")], Attrs::InPath)),
            501
        );
        assert_eq!(
            status(parse(&[("aggrScope", "entity")], Attrs::InPath)),
            200
        );
        assert_eq!(
            status(parse(&[("aggrMethod", "avg")], Attrs::FromQuery)),
            400
        );
        assert_eq!(status(parse(&[("aggrMethod", "avg")], Attrs::InPath)), 200);
        assert_eq!(
            status(parse(&[("fromDate", "yesterday")], Attrs::InPath)),
            422
        );
        assert_eq!(status(parse(&[("georel", "near")], Attrs::InPath)), 400);
        let equals = [
            ("georel", "equals"),
            ("geometry", "point"),
            ("coords", "1,2"),
        ];
        assert_eq!(status(parse(&equals, Attrs::InPath)), 422);
        let p = parse(
            &[("limit", "20000"), ("fromDate", "2026-01-01")],
            Attrs::InPath,
        )
        .unwrap();
        assert_eq!(p.limit, DEFAULT_LIMIT, "a larger limit is capped");
        assert_eq!(
            p.from.unwrap().1,
            parse_datetime("2026-01-01T00:00:00Z").unwrap()
        );
    }

    #[test]
    fn id_pattern_is_a_case_insensitive_prefix_match() {
        let p = parse(&[("idPattern", "room")], Attrs::InPath).unwrap();
        assert!(p.wants_id("Room:1"));
        assert!(!p.wants_id("MyRoom"));
    }
}
