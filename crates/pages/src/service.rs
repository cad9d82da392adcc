//! Page services: what a snippet's `data-knotx-service` calls. One of an
//! external HTTP endpoint or weft's own data (an NGSI entity query, a
//! history query, the alarm list, recent data units), with default
//! params. `{param.x}` and `{header.x}` placeholders in the URL and in the
//! internal sources' fields take values from the page request:
//! `data-knotx-params` override the request's query parameters, which
//! override the service's `params`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use url::{Position, Url};
use weft_model::ngsi::{format_datetime, render, Format};
use weft_model::query::Query;
use weft_model::validate::{self, Invalid};
use weft_store::{AlarmQuery, DataQuery, HistoryQuery, Store};

use weft_pipeline::context::{Context, EntityFilter, DEFAULT_TENANT};
use weft_pipeline::rules::RuleEngine;

/// An external HTTP source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSource {
    /// URL template.
    pub url: String,
    /// Request headers passed on from the page request.
    #[serde(default)]
    pub headers: Vec<String>,
    /// Timeout of the call.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(2)
}

/// NGSI entities of the default tenant, in keyValues form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntitiesSource {
    /// Only this type.
    #[serde(rename = "type", default)]
    pub entity_type: Option<String>,
    /// Simple Query Language over attributes.
    #[serde(default)]
    pub q: Option<String>,
    /// At most this many (default 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One attribute's recorded history: `[{"index","value"}]`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySource {
    /// Entity id.
    pub entity: String,
    /// Attribute.
    pub attr: String,
    /// Only the last N values.
    #[serde(rename = "lastN", default)]
    pub last_n: Option<usize>,
}

/// The alarm list, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlarmsSource {
    /// `active` or `cleared`.
    #[serde(default)]
    pub state: Option<String>,
    /// At most this many (default 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Recent data units, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    /// Only this device.
    #[serde(default)]
    pub device: Option<String>,
    /// At most this many (default 20).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Largest `limit` (or `lastN`) a source may ask for.
pub const MAX_LIMIT: usize = 10_000;

/// A page service definition (`PUT /api/v1/page-services/{name}`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageService {
    /// External HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSource>,
    /// NGSI entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entities: Option<EntitiesSource>,
    /// History of an attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<HistorySource>,
    /// Alarms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarms: Option<AlarmsSource>,
    /// Data units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSource>,
    /// Default params.
    #[serde(default)]
    pub params: Map<String, Value>,
    /// Cache policy: results kept for `ttl` and, when a later call fails,
    /// served stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// When to stop calling a failing service for a while.
    #[serde(
        default,
        rename = "circuitBreaker",
        skip_serializing_if = "Option::is_none"
    )]
    pub circuit_breaker: Option<BreakerSpec>,
}

/// A service's cache policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// How long a result is served without calling again (0s: no cache).
    #[serde(default, with = "humantime_serde")]
    pub ttl: Duration,
    /// Serve the last result, however old, when a call fails.
    #[serde(default = "yes", rename = "serveStale")]
    pub serve_stale: bool,
}

/// A service's circuit breaker: after `failures` failed calls in a row the
/// service is not called for `openFor` (its snippets get the stale result
/// or their fallback at once); then one call decides whether it closes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// Failures in a row that open it.
    #[serde(default = "five")]
    pub failures: u32,
    /// How long it stays open.
    #[serde(default = "ten_seconds", rename = "openFor", with = "humantime_serde")]
    pub open_for: Duration,
}

impl Default for BreakerSpec {
    fn default() -> Self {
        BreakerSpec {
            failures: five(),
            open_for: ten_seconds(),
        }
    }
}

fn yes() -> bool {
    true
}

fn five() -> u32 {
    5
}

fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

/// What a render knows of its page request.
#[derive(Debug, Clone, Default)]
pub struct RequestInfo {
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// Headers, names lower-case.
    pub headers: HashMap<String, String>,
}

impl PageService {
    /// Exactly one source must be given.
    pub fn validate(&self) -> Result<(), String> {
        let n = [
            self.http.is_some(),
            self.entities.is_some(),
            self.history.is_some(),
            self.alarms.is_some(),
            self.data.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if n != 1 {
            return Err(
                "a page service needs exactly one of http, entities, history, alarms, data".into(),
            );
        }
        self.check_fields().map_err(|e| e.to_string())?;
        if let Some(q) = self.entities.as_ref().and_then(|e| e.q.as_deref()) {
            Query::parse(q).map_err(|e| format!("entities.q: {}", e.description()))?;
        }
        Ok(())
    }

    /// The source's fields, as [`validate`] has them: an `http` URL
    /// (placeholders allowed), header names, a timeout above zero, names
    /// without control characters, limits from 1 to [`MAX_LIMIT`].
    fn check_fields(&self) -> Result<(), Invalid> {
        let limit = |field: &str, n: Option<usize>| match n {
            Some(n) if !(1..=MAX_LIMIT).contains(&n) => Err(Invalid::new(
                field,
                format!("{n} must be from 1 to {MAX_LIMIT}"),
            )),
            _ => Ok(()),
        };
        if let Some(h) = &self.http {
            validate::http_url_template("http.url", &h.url)?;
            for (i, name) in h.headers.iter().enumerate() {
                validate::header_name(&format!("http.headers[{i}]"), name)?;
            }
            if h.timeout.is_zero() {
                return Err(Invalid::new("http.timeout", "must be longer than 0s"));
            }
        }
        if let Some(e) = &self.entities {
            if let Some(t) = &e.entity_type {
                validate::label("entities.type", t)?;
            }
            limit("entities.limit", e.limit)?;
        }
        if let Some(h) = &self.history {
            validate::label("history.entity", &h.entity)?;
            validate::label("history.attr", &h.attr)?;
            limit("history.lastN", h.last_n)?;
        }
        if let Some(a) = &self.alarms {
            if let Some(state) = &a.state {
                validate::label("alarms.state", state)?;
            }
            limit("alarms.limit", a.limit)?;
        }
        if let Some(d) = &self.data {
            if let Some(device) = &d.device {
                validate::name("data.device", device)?;
            }
            limit("data.limit", d.limit)?;
        }
        for key in self.params.keys() {
            validate::label("params", key).map_err(|e| {
                Invalid::new(
                    "params",
                    format!("name {}: {}", validate::shown(key), e.problem),
                )
            })?;
        }
        if let Some(b) = &self.circuit_breaker {
            if b.failures == 0 {
                return Err(Invalid::new(
                    "circuitBreaker.failures",
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }

    /// The params of one call: the service's, overridden by the request's
    /// query, overridden by the snippet's `data-knotx-params`.
    pub fn params_for(
        &self,
        snippet: Option<&Map<String, Value>>,
        request: &RequestInfo,
    ) -> Map<String, Value> {
        let mut params = self.params.clone();
        for (k, v) in &request.query {
            params.insert(k.clone(), Value::String(v.clone()));
        }
        if let Some(s) = snippet {
            for (k, v) in s {
                params.insert(k.clone(), v.clone());
            }
        }
        params
    }
}

/// Replaces `{param.x}` and `{header.x}` placeholders (missing: empty)
/// in the fields of weft's own sources, which are values, not URLs.
fn fill(template: &str, params: &Map<String, Value>, request: &RequestInfo) -> String {
    substitute(template, |name| lookup(name, params, request))
}

/// Fills the placeholders of an entities source's `q`, each value as one
/// literal of the query: a number or a plain word as it is, anything else
/// quoted (`'a,b'` is the string `a,b`, not a list), so a viewer's value
/// can never add a condition (`;`), a list item (`,`), a range (`..`) or
/// an operator. The query language has no escape for `'`: a value holding
/// one is refused.
fn fill_query(
    template: &str,
    params: &Map<String, Value>,
    request: &RequestInfo,
) -> Result<String, String> {
    let mut refused = None;
    let filled = substitute(template, |name| {
        let value = lookup(name, params, request)?;
        Some(match query_literal(&value) {
            Some(literal) => literal,
            None => {
                refused.get_or_insert_with(|| {
                    format!("the value of {{{name}}} holds a ' that the query cannot take")
                });
                String::new()
            }
        })
    });
    match refused {
        Some(e) => Err(e),
        None => Ok(filled),
    }
}

/// `value` as one literal of the Simple Query Language (see [`fill_query`]);
/// `None` if it holds a `'`.
fn query_literal(value: &str) -> Option<String> {
    let number = {
        let digits = value.strip_prefix('-').unwrap_or(value);
        let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
        !int.is_empty()
            && !frac.is_empty()
            && int.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
    };
    let word = value
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if number || word {
        Some(value.to_string())
    } else if value.contains('\'') {
        None
    } else {
        Some(format!("'{value}'"))
    }
}

/// The value of placeholder `name` (`param.x`, `header.x`; empty when
/// missing), or `None` when `name` is not a placeholder (it stays as
/// written, braces included).
fn lookup(name: &str, params: &Map<String, Value>, request: &RequestInfo) -> Option<String> {
    if let Some(p) = name.strip_prefix("param.") {
        Some(match params.get(p) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        })
    } else {
        name.strip_prefix("header.").map(|h| {
            request
                .headers
                .get(&h.to_ascii_lowercase())
                .cloned()
                .unwrap_or_default()
        })
    }
}

/// Replaces each `{name}` in `template` by what `value` gives for it,
/// leaving those it gives nothing for as they are.
fn substitute(template: &str, mut value: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let name = &after[..end];
        match value(name) {
            Some(v) => out.push_str(&v),
            None => {
                out.push('{');
                out.push_str(name);
                out.push('}');
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What a value put into a service URL is encoded with, in whichever part
/// of the URL it lands (host, path, query, fragment): everything but RFC
/// 3986's unreserved characters (letters, digits, `-._~`). A value is
/// then data in its part and never a delimiter of it: no `/` to add path
/// segments, no `?`, `&`, `=` or `#` to add query parameters or end the
/// query, no `%` to smuggle in an encoded one, no `@` or `:` to change
/// the host. Servers decode it back to the value.
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A placeholder's stand-in while a URL template is parsed: lower-case
/// letters and digits, which the URL parser keeps as they are wherever
/// they stand (hosts are lower-cased).
fn stand_in(i: usize) -> String {
    format!("weftvalue{i}x")
}

/// A service's URL for one call: its `{param.x}` / `{header.x}`
/// placeholders replaced by the call's values, each percent-encoded
/// ([`URL_VALUE`]), so a page viewer chooses values, never the URL's
/// shape. The template is parsed as a URL with a stand-in for each
/// placeholder, so the `url` crate decides which part each lands in; a
/// value that would still change the path (a whole segment `.` or `..`,
/// which every URL parser resolves), or a URL that does not parse, fails
/// the call instead. The URL is answered parsed, as the client takes it;
/// one without placeholders is parsed once.
fn fill_url(
    template: &str,
    params: &Map<String, Value>,
    request: &RequestInfo,
) -> Result<Url, String> {
    let mut values = Vec::new();
    let marked = substitute(template, |name| {
        let value = lookup(name, params, request)?;
        values.push(value);
        Some(stand_in(values.len() - 1))
    });
    let parsed =
        Url::parse(&marked).map_err(|e| format!("the service URL {template} is not a URL: {e}"))?;
    if values.is_empty() {
        return Ok(parsed);
    }
    let shape = parsed.as_str();
    let path_starts = parsed[..Position::BeforePath].len();
    // Where each stand-in ended up, in order.
    let mut places = Vec::with_capacity(values.len());
    for i in 0..values.len() {
        let mark = stand_in(i);
        let mut found = shape.match_indices(&mark);
        match (found.next(), found.next()) {
            (Some((at, _)), None) => places.push((at, i)),
            _ => {
                return Err(format!(
                    "the service URL {template} cannot take its parameters"
                ))
            }
        }
    }
    places.sort_unstable();
    let mut out = String::with_capacity(shape.len() + 32);
    let mut out_path_starts = None;
    let mut from = 0;
    for (at, i) in places {
        if at >= path_starts && out_path_starts.is_none() {
            out.push_str(&shape[from..path_starts]);
            out_path_starts = Some(out.len());
            from = path_starts;
        }
        out.push_str(&shape[from..at]);
        out.extend(utf8_percent_encode(&values[i], URL_VALUE));
        from = at + stand_in(i).len();
    }
    let out_path_starts = match out_path_starts {
        Some(at) => at,
        None => {
            out.push_str(&shape[from..path_starts]);
            from = path_starts;
            out.len()
        }
    };
    out.push_str(&shape[from..]);
    // What will be sent must be what was built: a parser resolving a `.`
    // or `..` segment made of values would change it.
    let sent = Url::parse(&out).map_err(|e| format!("{out} is not a URL: {e}"))?;
    if sent[Position::BeforePath..] != out[out_path_starts..] {
        return Err(format!(
            "a parameter would change the path of the service URL {template}"
        ));
    }
    Ok(sent)
}

/// The most of an external service's answer read (a longer one is the
/// service failing, and the snippet's fallback is rendered).
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// What services call: weft's own data, and external HTTP endpoints
/// through weft's outbound client (`weft_pipeline::outbound::http`: no
/// redirects, the service's own timeout per call).
pub struct Sources {
    client: reqwest::Client,
    store: Arc<dyn Store>,
    context: Arc<Context>,
    rules: Arc<RuleEngine>,
}

impl Sources {
    /// Sources over weft's own data and an HTTP client for external ones.
    pub fn new(store: Arc<dyn Store>, context: Arc<Context>, rules: Arc<RuleEngine>) -> Sources {
        Sources {
            client: weft_pipeline::outbound::http(),
            store,
            context,
            rules,
        }
    }

    /// Makes one call; the JSON it answered, or why it failed.
    pub async fn call(
        &self,
        svc: &PageService,
        params: &Map<String, Value>,
        request: &RequestInfo,
    ) -> Result<Value, String> {
        if let Some(h) = &svc.http {
            let url = fill_url(&h.url, params, request)?;
            let mut req = self.client.get(url.clone()).timeout(h.timeout);
            for name in &h.headers {
                if let Some(v) = request.headers.get(&name.to_ascii_lowercase()) {
                    req = req.header(name.as_str(), v.as_str());
                }
            }
            let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
            if !resp.status().is_success() {
                return Err(format!("{url} answered {}", resp.status()));
            }
            let body = weft_pipeline::outbound::read_body(resp, MAX_ANSWER_BYTES)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            return serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"));
        }
        if let Some(e) = &svc.entities {
            let q = match e.q.as_deref() {
                Some(q) => Some(
                    Query::parse(&fill_query(q, params, request)?).map_err(|e| e.description())?,
                ),
                None => None,
            };
            let filter = EntityFilter {
                types: e
                    .entity_type
                    .iter()
                    .map(|t| fill(t, params, request))
                    .collect(),
                q,
                ..EntityFilter::default()
            };
            let all = self.context.query(DEFAULT_TENANT, &filter);
            return Ok(Value::Array(
                all.iter()
                    .take(e.limit.unwrap_or(100))
                    .map(|s| render(&s.entity, Format::KeyValues, None, None))
                    .collect(),
            ));
        }
        if let Some(h) = &svc.history {
            let rows = self
                .store
                .query_history(&HistoryQuery {
                    tenant: String::new(),
                    entity_ids: vec![fill(&h.entity, params, request)],
                    attrs: vec![fill(&h.attr, params, request)],
                    last_n: h.last_n,
                    limit: 10_000,
                    ..HistoryQuery::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Value::Array(
                rows.iter()
                    .map(|r| {
                        json!({"index": format_datetime(r.time),
                               "value": serde_json::from_str::<Value>(&r.value).unwrap_or(Value::Null)})
                    })
                    .collect(),
            ));
        }
        if let Some(a) = &svc.alarms {
            let alarms = self
                .rules
                .alarms(&AlarmQuery {
                    state: a.state.as_ref().map(|s| fill(s, params, request)),
                    limit: a.limit.unwrap_or(100),
                    ..AlarmQuery::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            return serde_json::to_value(alarms).map_err(|e| e.to_string());
        }
        if let Some(d) = &svc.data {
            let device = d
                .device
                .as_ref()
                .map(|x| fill(x, params, request))
                .filter(|x| !x.is_empty());
            let limit = d.limit.unwrap_or(20);
            // The newest `limit` units: the device index is by storage
            // position, so read forward and keep the tail.
            let mut units = Vec::new();
            let mut after = None;
            loop {
                let page = self
                    .store
                    .query_data(&DataQuery {
                        device: device.clone(),
                        after,
                        limit: 10_000,
                        ..DataQuery::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                let Some(last) = page.last() else { break };
                after = Some(last.seq);
                let full = page.len() == 10_000;
                units.extend(page);
                if units.len() > limit {
                    units.drain(..units.len() - limit);
                }
                if !full {
                    break;
                }
            }
            return Ok(Value::Array(
                units
                    .iter()
                    .filter_map(|u| serde_json::from_str(&u.json).ok())
                    .collect(),
            ));
        }
        Err("the service has no source".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placeholders read params and headers; unknown braces stay.
    #[test]
    fn placeholders() {
        let mut params = Map::new();
        params.insert("id".into(), json!("7"));
        params.insert("n".into(), json!(3));
        let mut req = RequestInfo::default();
        req.headers.insert("accept-language".into(), "pl".into());
        assert_eq!(
            fill(
                "/x/{param.id}?n={param.n}&l={header.Accept-Language}&m={param.none}{other}",
                &params,
                &req
            ),
            "/x/7?n=3&l=pl&m={other}"
        );
    }

    /// A viewer's value is one literal of an entities source's `q`: it
    /// cannot add conditions, list items, ranges or operators.
    #[test]
    fn query_values_stay_literals() {
        let req = RequestInfo::default();
        let q = |v: &str| {
            let mut params = Map::new();
            params.insert("v".into(), json!(v));
            fill_query("name=={param.v};temperature>0", &params, &req)
        };
        assert_eq!(q("kitchen").unwrap(), "name==kitchen;temperature>0");
        assert_eq!(q("-12.5").unwrap(), "name==-12.5;temperature>0");
        assert_eq!(q("a,b").unwrap(), "name=='a,b';temperature>0");
        assert_eq!(q("x;y>0").unwrap(), "name=='x;y>0';temperature>0");
        assert_eq!(q("1..9").unwrap(), "name=='1..9';temperature>0");
        assert_eq!(q("").unwrap(), "name=='';temperature>0");
        assert!(q("x';a==b").is_err());
        for v in ["a,b", "x;y>0", "1..9", "!x", "a==b"] {
            let parsed = Query::parse(&q(v).unwrap()).expect("still one query");
            assert_eq!(parsed.paths().count(), 2, "{v}");
        }
    }

    /// Values land in a service URL percent-encoded for the part they are
    /// in: they cannot add segments, leave the path, add parameters or
    /// end the query; a whole `.`/`..` segment made of values fails.
    #[test]
    fn url_values_are_encoded() {
        let mut params = Map::new();
        for (k, v) in [
            ("id", "../admin?x=1#f"),
            ("lang", "en&admin=true"),
            ("sp", "a b+c%2F"),
            ("dots", ".."),
            ("dot", "."),
            ("host", "other"),
        ] {
            params.insert(k.into(), json!(v));
        }
        params.insert("n".into(), json!(3));
        let req = RequestInfo::default();
        let url = |t: &str| fill_url(t, &params, &req).map(String::from);
        assert_eq!(
            url("http://h:8/x/{param.id}.json?l={param.lang}&n={param.n}&m={param.none}").unwrap(),
            "http://h:8/x/..%2Fadmin%3Fx%3D1%23f.json?l=en%26admin%3Dtrue&n=3&m="
        );
        assert_eq!(
            url("http://h/{param.sp}?q={param.sp}#{param.sp}").unwrap(),
            "http://h/a%20b%2Bc%252F?q=a%20b%2Bc%252F#a%20b%2Bc%252F"
        );
        assert_eq!(
            url("http://{param.host}.example/{param.dots}x/{other}").unwrap(),
            "http://other.example/..x/%7Bother%7D"
        );
        assert_eq!(
            url("http://h/a/{param.dots}?x=1").unwrap_err(),
            "a parameter would change the path of the service URL http://h/a/{param.dots}?x=1"
        );
        assert!(url("http://h/a/{param.dot}/b").is_err());
        assert!(url("http://h/a/{param.dot}{param.dot}/b").is_err());
        assert_eq!(url("http://h/a?{param.dots}").unwrap(), "http://h/a?..");
        assert!(url("{param.host}/x").is_err(), "not a URL");
        assert!(url("http://{param.id}/x").is_err(), "not a host");
    }
}
