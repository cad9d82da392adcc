//! Orion's metrics API (`GET /admin/metrics`, `?reset=true`, `DELETE`):
//! per tenant ("service") and service path ("subservice"), how many
//! requests the NGSI surface served, their sizes, errors and average
//! service time, and how many requests it sent to context providers.
//!
//! The counters are process-wide, as Orion's are: the NGSI surface
//! records every request it answers ([`record_incoming`]) and forwarding
//! ([`crate::forwarding`]) what it sends ([`record_outgoing`]), both from
//! places that hold no shared state of their own, so the table is one
//! static behind a mutex (one short lock per request). weft's Prometheus
//! metrics at `/metrics`
//! are the richer view; this one exists for Orion's tooling.
//!
//! Outgoing transactions count forwards to context providers;
//! notifications are counted in `/metrics`
//! (`weft_notifications_sent_total`) instead.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value};

/// Key of the default tenant (no `Fiware-Service`), as in Orion; `-`
/// cannot occur in a tenant name, so it collides with none.
pub const DEFAULT_SERVICE: &str = "default-service";

/// Key of the root service path `/`, as in Orion.
pub const ROOT_SUBSERVICE: &str = "root-subserv";

/// The counters of one (service, subservice).
#[derive(Debug, Clone, Default, PartialEq)]
struct Counters {
    incoming: u64,
    incoming_request_bytes: u64,
    incoming_response_bytes: u64,
    incoming_errors: u64,
    service_time_secs: f64,
    outgoing: u64,
    outgoing_request_bytes: u64,
    outgoing_response_bytes: u64,
    outgoing_errors: u64,
}

impl Counters {
    fn add(&mut self, other: &Counters) {
        self.incoming += other.incoming;
        self.incoming_request_bytes += other.incoming_request_bytes;
        self.incoming_response_bytes += other.incoming_response_bytes;
        self.incoming_errors += other.incoming_errors;
        self.service_time_secs += other.service_time_secs;
        self.outgoing += other.outgoing;
        self.outgoing_request_bytes += other.outgoing_request_bytes;
        self.outgoing_response_bytes += other.outgoing_response_bytes;
        self.outgoing_errors += other.outgoing_errors;
    }

    /// Orion's metric names; metrics still at zero are left out.
    fn render(&self) -> Value {
        let mut out = Map::new();
        let mut put = |name: &str, v: u64| {
            if v > 0 {
                out.insert(name.into(), v.into());
            }
        };
        put("incomingTransactions", self.incoming);
        put(
            "incomingTransactionRequestSize",
            self.incoming_request_bytes,
        );
        put(
            "incomingTransactionResponseSize",
            self.incoming_response_bytes,
        );
        put("incomingTransactionErrors", self.incoming_errors);
        put("outgoingTransactions", self.outgoing);
        put(
            "outgoingTransactionRequestSize",
            self.outgoing_request_bytes,
        );
        put(
            "outgoingTransactionResponseSize",
            self.outgoing_response_bytes,
        );
        put("outgoingTransactionErrors", self.outgoing_errors);
        if self.incoming > 0 {
            out.insert(
                "serviceTime".into(),
                (self.service_time_secs / self.incoming as f64).into(),
            );
        }
        Value::Object(out)
    }
}

/// service → subservice → counters. Nested so that a request is counted
/// with two lookups by `&str`, allocating only for a new key.
type Table = BTreeMap<String, BTreeMap<String, Counters>>;

/// Where a request is counted: (service, subservice), borrowed when the
/// request named neither.
pub type Keys = (Cow<'static, str>, Cow<'static, str>);

/// The counters of `keys`, created at zero the first time.
fn counters<'t>(t: &'t mut Table, keys: &Keys) -> &'t mut Counters {
    if !t.contains_key(keys.0.as_ref()) {
        t.insert(keys.0.to_string(), BTreeMap::new());
    }
    let subservs = t.get_mut(keys.0.as_ref()).expect("inserted above");
    if !subservs.contains_key(keys.1.as_ref()) {
        subservs.insert(keys.1.to_string(), Counters::default());
    }
    subservs.get_mut(keys.1.as_ref()).expect("inserted above")
}

static TABLE: Mutex<Table> = Mutex::new(BTreeMap::new());

/// The table; a poisoned lock still holds valid counters.
fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The keys a request is counted under, from its raw `Fiware-Service` and
/// `Fiware-ServicePath`: `None` when either is invalid (Orion leaves such
/// requests out). A list of paths counts under the first; `/a/#` under
/// `a`.
pub fn keys(service: Option<&str>, service_path: Option<&str>) -> Option<Keys> {
    let service = match service {
        None | Some("") => Cow::Borrowed(DEFAULT_SERVICE),
        Some(s) => Cow::Owned(weft_model::ngsi::tenancy::check_tenant(s).ok()?),
    };
    let subservice = match service_path {
        None => Cow::Borrowed(ROOT_SUBSERVICE),
        Some(raw) => {
            let first = weft_model::ngsi::tenancy::parse_service_paths(raw)
                .ok()?
                .into_iter()
                .next()?;
            let path = first.strip_suffix("/#").unwrap_or(&first);
            match path.trim_start_matches('/') {
                "" => Cow::Borrowed(ROOT_SUBSERVICE),
                p => Cow::Owned(p.to_string()),
            }
        }
    };
    Some((service, subservice))
}

/// Counts one request the surface answered.
pub fn record_incoming(
    keys: &Keys,
    request_bytes: u64,
    response_bytes: u64,
    error: bool,
    elapsed: Duration,
) {
    let mut t = table();
    let c = counters(&mut t, keys);
    c.incoming += 1;
    c.incoming_request_bytes += request_bytes;
    c.incoming_response_bytes += response_bytes;
    c.incoming_errors += u64::from(error);
    c.service_time_secs += elapsed.as_secs_f64();
}

/// Counts one request sent to a context provider.
pub fn record_outgoing(keys: &Keys, request_bytes: u64, response_bytes: u64, error: bool) {
    let mut t = table();
    let c = counters(&mut t, keys);
    c.outgoing += 1;
    c.outgoing_request_bytes += request_bytes;
    c.outgoing_response_bytes += response_bytes;
    c.outgoing_errors += u64::from(error);
}

/// The document of `GET /admin/metrics`; with `reset`, the counters start
/// again from zero in the same step.
pub fn render(reset: bool) -> Value {
    let snapshot = {
        let mut t = table();
        if reset {
            std::mem::take(&mut *t)
        } else {
            t.clone()
        }
    };
    render_table(&snapshot)
}

/// Empties the counters (`DELETE /admin/metrics`).
pub fn reset() {
    table().clear();
}

fn render_table(t: &Table) -> Value {
    let mut services = Map::new();
    let mut total = Counters::default();
    for (service, subservs) in t {
        let mut rendered = Map::new();
        let mut sum = Counters::default();
        for (subservice, c) in subservs {
            rendered.insert(subservice.clone(), c.render());
            sum.add(c);
        }
        total.add(&sum);
        let mut s = Map::new();
        s.insert("subservs".into(), Value::Object(rendered));
        s.insert("sum".into(), sum.render());
        services.insert(service.clone(), Value::Object(s));
    }
    let mut out = Map::new();
    out.insert("services".into(), Value::Object(services));
    out.insert("sum".into(), total.render());
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_follow_orion() {
        let k = |s: Option<&str>, p: Option<&str>| keys(s, p);
        assert_eq!(
            k(None, None),
            Some(("default-service".into(), "root-subserv".into()))
        );
        assert_eq!(k(Some("Tenant1"), Some("/a/b")).unwrap().1, "a/b");
        assert_eq!(
            k(Some("t"), Some("/a/#, /b")).unwrap(),
            ("t".into(), "a".into())
        );
        assert_eq!(k(Some("t"), Some("/")).unwrap().1, "root-subserv");
        assert_eq!(k(Some("bad-name"), None), None);
        assert_eq!(k(None, Some("relative")), None);
    }

    #[test]
    fn the_table_renders_per_service_and_sums() {
        let mut t = Table::new();
        let c = Counters {
            incoming: 2,
            incoming_request_bytes: 10,
            incoming_errors: 1,
            service_time_secs: 1.0,
            ..Counters::default()
        };
        let s = t.entry("s".into()).or_default();
        s.insert("a".into(), c.clone());
        s.insert("root-subserv".into(), c);
        let v = render_table(&t);
        assert_eq!(
            v["services"]["s"]["subservs"]["a"],
            json!({"incomingTransactions": 2, "incomingTransactionRequestSize": 10,
                   "incomingTransactionErrors": 1, "serviceTime": 0.5})
        );
        assert_eq!(v["services"]["s"]["sum"]["incomingTransactions"], 4);
        assert_eq!(v["sum"]["incomingTransactionErrors"], 2);
        assert_eq!(
            render_table(&Table::new()),
            json!({"services": {}, "sum": {}})
        );
    }
}
