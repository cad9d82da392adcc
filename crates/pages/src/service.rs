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

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use weft_model::ngsi::{format_datetime, render, Format};
use weft_model::query::Query;
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
        if let Some(q) = self.entities.as_ref().and_then(|e| e.q.as_deref()) {
            Query::parse(q).map_err(|e| format!("entities.q: {}", e.description()))?;
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

/// Replaces `{param.x}` and `{header.x}` placeholders (missing: empty).
fn fill(template: &str, params: &Map<String, Value>, request: &RequestInfo) -> String {
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
        if let Some(p) = name.strip_prefix("param.") {
            match params.get(p) {
                Some(Value::String(s)) => out.push_str(s),
                Some(v) => out.push_str(&v.to_string()),
                None => {}
            }
        } else if let Some(h) = name.strip_prefix("header.") {
            if let Some(v) = request.headers.get(&h.to_ascii_lowercase()) {
                out.push_str(v);
            }
        } else {
            out.push('{');
            out.push_str(name);
            out.push('}');
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What services call.
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
            client: reqwest::Client::new(),
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
            let url = fill(&h.url, params, request);
            let mut req = self.client.get(&url).timeout(h.timeout);
            for name in &h.headers {
                if let Some(v) = request.headers.get(&name.to_ascii_lowercase()) {
                    req = req.header(name.as_str(), v.as_str());
                }
            }
            let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
            if !resp.status().is_success() {
                return Err(format!("{url} answered {}", resp.status()));
            }
            let body = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
            return serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"));
        }
        if let Some(e) = &svc.entities {
            let q = match e.q.as_deref() {
                Some(q) => {
                    Some(Query::parse(&fill(q, params, request)).map_err(|e| e.description())?)
                }
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
}
