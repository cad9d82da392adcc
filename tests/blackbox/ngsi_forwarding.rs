//! NGSIv2 forwarding to registered context providers, seen from a client:
//! a second weft (auth off) plays the provider, queries and updates of
//! what it provides are forwarded and merged, `options=skipForwarding`
//! stays local, a dead, silent or babbling provider fails the forwarded
//! part only, the registration counts what was sent, and a small receiver
//! checks what a forwarded request carries. Also Orion's operational
//! endpoints (`/statistics`, `/cache/statistics`, `/admin/log`,
//! `/log/trace`, `/admin/sem`, `/v2`, `/version`).

use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::util::*;

/// A weft playing the context provider: auth off, as an Orion-style
/// provider expects no weft key.
fn provider() -> Server {
    Server::start_with_env(&[("WEFT_AUTH", "off")])
}

/// Registers `entities`/`attrs` at `provider_url` on `c`; the id.
async fn register(
    c: &Client,
    headers: &[(&str, &str)],
    entities: Value,
    attrs: Value,
    provider_url: &str,
    mode: &str,
) -> String {
    let body = json!({
        "dataProvided": {"entities": entities, "attrs": attrs},
        "provider": {"http": {"url": provider_url}, "supportedForwardingMode": mode}
    });
    let (status, h, reply) = call(c, "POST", "/v2/registrations", headers, Some(&body)).await;
    assert_eq!(status, 201, "{reply}");
    h["location"].to_str().unwrap()["/v2/registrations/".len()..].to_string()
}

async fn create(c: &Client, headers: &[(&str, &str)], entity: Value) {
    let (status, _, reply) = call(c, "POST", "/v2/entities", headers, Some(&entity)).await;
    assert_eq!(status, 201, "{reply}");
}

/// The local broker and its provider: the provider holds `Room1`'s
/// temperature and pressure and all of `Room2`; the broker holds `Room1`'s
/// humidity and registers the provider for `Room1`'s temperature and for
/// every `Room` (`idPattern .*`) without an attribute list.
async fn broker_and_provider() -> (Server, Server, String, String) {
    let cp = provider();
    let broker = Server::start();
    let (b, p) = (broker.client(), cp.client_with(None));
    create(
        &p,
        &[],
        json!({"id": "Room1", "type": "Room",
               "temperature": {"value": 23, "type": "Number"},
               "pressure": {"value": 720, "type": "Number"}}),
    )
    .await;
    create(
        &p,
        &[],
        json!({"id": "Room2", "type": "Room", "temperature": {"value": 19, "type": "Number"}}),
    )
    .await;
    create(
        &b,
        &[],
        json!({"id": "Room1", "type": "Room", "humidity": {"value": 40, "type": "Number"}}),
    )
    .await;
    let url = format!("{}/v2", cp.url);
    let by_id = register(
        &b,
        &[],
        json!([{"id": "Room1", "type": "Room"}]),
        json!(["temperature"]),
        &url,
        "all",
    )
    .await;
    let any = register(
        &b,
        &[],
        json!([{"idPattern": ".*", "type": "Room"}]),
        json!([]),
        &url,
        "query",
    )
    .await;
    (broker, cp, by_id, any)
}

/// A query of a provided attribute is answered by the provider and merged
/// with the local attributes: retrieve, one attribute, its value, the
/// listing and `op/query`; an entity only the provider has is found too.
#[tokio::test]
async fn queries_are_forwarded_and_merged() {
    let (broker, _cp, by_id, _any) = broker_and_provider().await;
    let b = broker.client();

    let (status, _, e) = call(&b, "GET", "/v2/entities/Room1?type=Room", &[], None).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["humidity"]["value"], 40, "{e}");
    assert_eq!(e["temperature"]["value"], 23, "{e}");
    assert_eq!(e["temperature"]["type"], "Number");

    let (status, _, a) = call(
        &b,
        "GET",
        "/v2/entities/Room1/attrs/temperature?type=Room",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["value"], 23);
    let (status, _, v) = call(
        &b,
        "GET",
        "/v2/entities/Room1/attrs/temperature/value?type=Room",
        &[("Accept", "text/plain")],
        None,
    )
    .await;
    assert_eq!((status, v), (200, json!(23)));

    let (status, _, attrs) = call(&b, "GET", "/v2/entities/Room1/attrs", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(attrs["temperature"]["value"], 23, "{attrs}");
    assert!(attrs.get("id").is_none());

    // Only on the provider: built from its answer.
    let (status, _, e2) = call(&b, "GET", "/v2/entities/Room2?type=Room", &[], None).await;
    assert_eq!(status, 200, "{e2}");
    assert_eq!(e2["temperature"]["value"], 19);

    let (status, h, list) = call(
        &b,
        "GET",
        "/v2/entities?type=Room&options=count,keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(h["fiware-total-count"], "2", "{list}");
    let room1 = list.as_array().unwrap().iter().find(|e| e["id"] == "Room1");
    let room1 = room1.expect("Room1 listed");
    assert_eq!(
        (room1["humidity"].clone(), room1["temperature"].clone()),
        (json!(40), json!(23))
    );
    assert!(list.as_array().unwrap().iter().any(|e| e["id"] == "Room2"));

    let query = json!({"entities": [{"id": "Room2", "type": "Room"}]});
    let (status, _, found) = call(&b, "POST", "/v2/op/query", &[], Some(&query)).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found[0]["id"], "Room2", "{found}");
    assert_eq!(found[0]["temperature"]["value"], 19);

    // The registration counts what was forwarded to it.
    let (_, _, reg) = call(&b, "GET", &format!("/v2/registrations/{by_id}"), &[], None).await;
    let info = &reg["forwardingInformation"];
    assert!(info["timesSent"].as_u64().unwrap() >= 1, "{reg}");
    assert!(
        info["lastSuccess"].is_string() && info["lastForwarding"].is_string(),
        "{reg}"
    );
    assert!(info.get("lastFailure").is_none(), "{reg}");
}

/// `options=skipForwarding` answers from local data only.
#[tokio::test]
async fn skip_forwarding_stays_local() {
    let (broker, _cp, by_id, _any) = broker_and_provider().await;
    let b = broker.client();
    let (status, _, e) = call(
        &b,
        "GET",
        "/v2/entities/Room1?type=Room&options=skipForwarding",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(e["humidity"]["value"], 40);
    assert!(e.get("temperature").is_none(), "{e}");
    let (status, _, err) = call(
        &b,
        "GET",
        "/v2/entities/Room2?type=Room&options=skipForwarding",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"], "NotFound");
    let (_, _, list) = call(
        &b,
        "GET",
        "/v2/entities?options=skipForwarding,keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(
        list,
        json!([{"id": "Room1", "type": "Room", "humidity": 40}])
    );
    let (_, _, reg) = call(&b, "GET", &format!("/v2/registrations/{by_id}"), &[], None).await;
    assert!(reg.get("forwardingInformation").is_none(), "{reg}");
}

/// Updates of provided attributes are applied by the provider (PATCH,
/// PUT attribute, PUT value, `op/update`), local ones locally, and
/// nothing of the provider's is stored in the broker.
#[tokio::test]
async fn updates_are_forwarded() {
    let (broker, cp, _by_id, _any) = broker_and_provider().await;
    let (b, p) = (broker.client(), cp.client_with(None));

    let patch = json!({"temperature": {"value": 30, "type": "Number"}, "humidity": {"value": 41}});
    let (status, _, reply) = call(
        &b,
        "PATCH",
        "/v2/entities/Room1/attrs?type=Room",
        &[],
        Some(&patch),
    )
    .await;
    assert_eq!(status, 204, "{reply}");
    provided_temperature(&p, 30).await;
    let (_, _, local) = call(
        &b,
        "GET",
        "/v2/entities/Room1?type=Room&options=skipForwarding,keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(
        local,
        json!({"id": "Room1", "type": "Room", "humidity": 41})
    );

    let (status, _, reply) = call(
        &b,
        "PUT",
        "/v2/entities/Room1/attrs/temperature?type=Room",
        &[],
        Some(&json!({"value": 31, "type": "Number"})),
    )
    .await;
    assert_eq!(status, 204, "{reply}");
    provided_temperature(&p, 31).await;

    let resp = b
        .http
        .put(format!(
            "{}/v2/entities/Room1/attrs/temperature/value?type=Room",
            b.url
        ))
        .header("Content-Type", "text/plain")
        .body("32")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    provided_temperature(&p, 32).await;

    let batch = json!({"actionType": "update", "entities": [
        {"id": "Room1", "type": "Room", "temperature": {"value": 33, "type": "Number"}}
    ]});
    let (status, _, reply) = call(&b, "POST", "/v2/op/update", &[], Some(&batch)).await;
    assert_eq!(status, 204, "{reply}");
    provided_temperature(&p, 33).await;
}

/// Asserts the provider's `Room1` temperature.
async fn provided_temperature(p: &Client, value: i64) {
    let (_, _, e) = call(p, "GET", "/v2/entities/Room1?type=Room", &[], None).await;
    assert_eq!(e["temperature"]["value"], value, "{e}");
}

/// A provider that refuses connections: queries answer from local data,
/// an entity nobody has is 404, an update of a provided attribute is
/// Orion's 404, and the registration shows the failure.
#[tokio::test]
async fn a_dead_provider_fails_only_the_forwarded_part() {
    let broker = Server::start();
    let b = broker.client();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v2", l.local_addr().unwrap())
    };
    create(
        &b,
        &[],
        json!({"id": "E1", "type": "T", "A": {"value": 1, "type": "Number"}}),
    )
    .await;
    let reg = register(
        &b,
        &[],
        json!([{"id": "E1", "type": "T"}]),
        json!(["B"]),
        &dead,
        "all",
    )
    .await;
    register(
        &b,
        &[],
        json!([{"id": "E2", "type": "T"}]),
        json!([]),
        &dead,
        "all",
    )
    .await;

    let (status, _, e) = call(&b, "GET", "/v2/entities/E1?type=T", &[], None).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["A"]["value"], 1);
    assert!(e.get("B").is_none());
    let (status, _, err) = call(&b, "GET", "/v2/entities/E2?type=T", &[], None).await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(
        err,
        json!({"error": "NotFound", "description": "The requested entity has not been found. Check type and id"})
    );

    let (status, _, err) = call(
        &b,
        "PATCH",
        "/v2/entities/E1/attrs?type=T",
        &[],
        Some(&json!({"B": {"value": 2}})),
    )
    .await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"], "NotFound");
    // A local attribute beside it is applied; the provided one is named.
    let (status, _, err) = call(
        &b,
        "PATCH",
        "/v2/entities/E1/attrs?type=T",
        &[],
        Some(&json!({"A": {"value": 5}, "B": {"value": 2}})),
    )
    .await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(
        err,
        json!({"error": "PartialUpdate",
               "description": "Some of the following attributes were not updated: { E1-T : [B] }"})
    );
    let (_, _, e) = call(
        &b,
        "GET",
        "/v2/entities/E1?type=T&options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(e["A"], 5);

    let (_, _, r) = call(&b, "GET", &format!("/v2/registrations/{reg}"), &[], None).await;
    let info = &r["forwardingInformation"];
    assert!(info["timesSent"].as_u64().unwrap() >= 2, "{r}");
    assert!(info["lastFailure"].is_string(), "{r}");
    assert!(info.get("lastSuccess").is_none(), "{r}");
}

/// Providers that accept the connection and never answer hold a query up
/// to the forwarding timeout, once for all of them: two silent providers
/// one after the other would take twice as long.
#[tokio::test]
async fn silent_providers_are_bounded_by_one_timeout() {
    let broker = Server::start_with_env(&[("WEFT_NGSI__FORWARD_TIMEOUT", "2s")]);
    let b = broker.client();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v2", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    create(&b, &[], json!({"id": "E1", "type": "T", "A": {"value": 1}})).await;
    for attr in ["B", "C"] {
        let entities = json!([{"id": "E1", "type": "T"}]);
        register(&b, &[], entities, json!([attr]), &url, "all").await;
    }
    let started = Instant::now();
    let (status, _, e) = call(&b, "GET", "/v2/entities/E1?type=T", &[], None).await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["A"]["value"], 1);
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(3500), "{elapsed:?}");
}

/// What a provider receives, captured by a small HTTP receiver that
/// answers with `answer`.
struct Receiver {
    url: String,
    rx: mpsc::UnboundedReceiver<(String, HeaderMap, Value)>,
}

impl Receiver {
    async fn start(status: u16, answer: &'static str) -> Receiver {
        let (tx, rx) = mpsc::unbounded_channel();
        let handler = move |uri: axum::http::Uri, headers: HeaderMap, body: String| {
            let tx = tx.clone();
            async move {
                let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
                let _ = tx.send((uri.path().to_string(), headers, body));
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "application/json")],
                    answer,
                )
            }
        };
        let app = axum::Router::new()
            .route("/cp/op/query", post(handler.clone()))
            .route("/cp/op/update", post(handler));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/cp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, rx }
    }

    fn try_next(&mut self) -> Option<(String, HeaderMap, Value)> {
        self.rx.try_recv().ok()
    }
}

/// A forwarded query carries the tenant, the service path as received,
/// the correlator with `; cbfwd=1` and the NGSIv2 body, and never the
/// weft key of the client; a provider answering garbage adds nothing and
/// breaks nothing.
#[tokio::test]
async fn forwarded_requests_carry_orions_headers() {
    let broker = Server::start();
    let b = broker.client();
    let mut cp = Receiver::start(200, "<html>not NGSI</html>").await;
    let scope = [("Fiware-Service", "tenant1"), ("Fiware-ServicePath", "/a")];
    create(
        &b,
        &scope,
        json!({"id": "E1", "type": "T", "A": {"value": 1}}),
    )
    .await;
    register(
        &b,
        &scope,
        json!([{"id": "E1", "type": "T"}]),
        json!(["B"]),
        &cp.url,
        "all",
    )
    .await;
    let mut headers = scope.to_vec();
    headers.push(("Fiware-Correlator", "corr-123"));
    let (status, _, e) = call(&b, "GET", "/v2/entities/E1?type=T", &headers, None).await;
    assert_eq!(status, 200, "{e}");
    assert!(e.get("B").is_none());
    let (path, h, body) = cp.try_next().expect("the provider was asked");
    assert_eq!(path, "/cp/op/query");
    assert_eq!(h["fiware-service"], "tenant1");
    assert_eq!(h["fiware-servicepath"], "/a");
    assert_eq!(h["fiware-correlator"], "corr-123; cbfwd=1");
    assert_eq!(h["content-type"], "application/json; charset=utf-8");
    assert!(h["user-agent"].to_str().unwrap().starts_with("orion/"));
    assert!(h.get("x-auth-token").is_none() && h.get("authorization").is_none());
    assert_eq!(
        body,
        json!({"entities": [{"id": "E1", "type": "T"}], "attrs": ["B"]})
    );

    // Another tenant's request reaches no registration of tenant1.
    let (status, _, _) = call(
        &b,
        "GET",
        "/v2/entities/E1?type=T",
        &[("Fiware-Service", "tenant2")],
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert!(cp.try_next().is_none());

    // An update is `op/update` with `actionType: update`.
    let (status, _, err) = call(
        &b,
        "PUT",
        "/v2/entities/E1/attrs/B?type=T",
        &scope,
        Some(&json!({"value": 7, "type": "Number"})),
    )
    .await;
    // 200 is not how a provider acknowledges an update (204): Orion's 404.
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"], "NotFound");
    let (path, _, body) = cp.try_next().expect("the update was forwarded");
    assert_eq!(path, "/cp/op/update");
    assert_eq!(
        body,
        json!({"actionType": "update", "entities": [
            {"id": "E1", "type": "T", "B": {"value": 7, "type": "Number", "metadata": {}}}
        ]})
    );
}

/// `supportedForwardingMode` decides which requests reach the provider,
/// and a `legacyForwarding` (NGSIv1) provider gets none.
#[tokio::test]
async fn forwarding_modes_are_honoured() {
    let broker = Server::start();
    let b = broker.client();
    let mut cp = Receiver::start(404, "").await;
    register(
        &b,
        &[],
        json!([{"id": "Q", "type": "T"}]),
        json!([]),
        &cp.url,
        "update",
    )
    .await;
    register(
        &b,
        &[],
        json!([{"id": "U", "type": "T"}]),
        json!([]),
        &cp.url,
        "query",
    )
    .await;
    register(
        &b,
        &[],
        json!([{"id": "N", "type": "T"}]),
        json!([]),
        &cp.url,
        "none",
    )
    .await;
    let legacy = json!({
        "dataProvided": {"entities": [{"id": "L", "type": "T"}]},
        "provider": {"http": {"url": cp.url}, "legacyForwarding": true}
    });
    let (status, _, _) = call(&b, "POST", "/v2/registrations", &[], Some(&legacy)).await;
    assert_eq!(status, 201);
    for id in ["Q", "N", "L"] {
        let (status, _, _) = call(&b, "GET", &format!("/v2/entities/{id}?type=T"), &[], None).await;
        assert_eq!(status, 404);
        assert!(cp.try_next().is_none(), "{id} was forwarded as a query");
    }
    for id in ["U", "N", "L"] {
        let (status, _, _) = call(
            &b,
            "PATCH",
            &format!("/v2/entities/{id}/attrs?type=T"),
            &[],
            Some(&json!({"A": {"value": 1}})),
        )
        .await;
        assert_eq!(status, 404);
        assert!(cp.try_next().is_none(), "{id} was forwarded as an update");
    }
    // The provider of Q takes updates and says it has no Q: Orion's 404.
    let (status, _, err) = call(
        &b,
        "PATCH",
        "/v2/entities/Q/attrs?type=T",
        &[],
        Some(&json!({"A": {"value": 1}})),
    )
    .await;
    assert_eq!((status, err["error"].clone()), (404, json!("NotFound")));
    assert_eq!(cp.try_next().expect("forwarded").0, "/cp/op/update");
}

/// Orion's operational endpoints answer in Orion's shapes.
#[tokio::test]
async fn operational_endpoints() {
    let server = Server::start();
    let c = server.client();
    let (status, _, stats) = call(&c, "GET", "/statistics", &[], None).await;
    assert_eq!(status, 200);
    assert!(stats["uptime_in_secs"].is_u64() && stats["measuring_interval_in_secs"].is_u64());
    let (status, _, reset) = call(&c, "DELETE", "/statistics", &[], None).await;
    assert_eq!(
        (status, reset),
        (200, json!({"message": "All statistics counter reset"}))
    );
    let (_, _, stats) = call(&c, "GET", "/statistics", &[], None).await;
    assert_eq!(stats["measuring_interval_in_secs"], 0, "{stats}");

    let (status, _, cache) = call(&c, "GET", "/cache/statistics", &[], None).await;
    assert_eq!(status, 200);
    for key in ["ids", "refreshs", "inserts", "removes", "updates", "items"] {
        assert!(cache.get(key).is_some(), "{key} in {cache}");
    }
    let (status, _, _) = call(&c, "DELETE", "/cache/statistics", &[], None).await;
    assert_eq!(status, 200);

    let (status, _, log) = call(&c, "GET", "/admin/log", &[], None).await;
    assert_eq!((status, log["level"].clone()), (200, json!("WARN")));
    let (status, _, _) = call(&c, "PUT", "/admin/log?level=debug", &[], Some(&json!({}))).await;
    assert_eq!(status, 200);
    let (_, _, log) = call(&c, "GET", "/admin/log", &[], None).await;
    assert_eq!(log["level"], "DEBUG");
    let (status, _, err) = call(&c, "PUT", "/admin/log?level=LOUD", &[], Some(&json!({}))).await;
    assert_eq!((status, err["error"].clone()), (400, json!("BadRequest")));
    let (_, _, log) = call(&c, "GET", "/admin/log", &[], None).await;
    assert_eq!(log["level"], "DEBUG", "a refused level changes nothing");

    let (status, _, trace) = call(&c, "GET", "/log/trace", &[], None).await;
    assert_eq!((status, trace), (200, json!({"tracelevels": "empty"})));
    let (status, _, sem) = call(&c, "GET", "/admin/sem", &[], None).await;
    assert_eq!(
        (status, sem["subCache"].clone()),
        (200, json!({"status": "free"}))
    );

    let (status, _, entry) = call(&c, "GET", "/v2", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(entry["registrations_url"], "/v2/registrations");
    let (status, _, version) = call(&c, "GET", "/version", &[], None).await;
    assert_eq!(status, 200);
    for key in [
        "version",
        "uptime",
        "git_hash",
        "compile_time",
        "compiled_by",
        "compiled_in",
        "release_date",
        "machine",
        "doc",
    ] {
        assert!(version["orion"][key].is_string(), "{key} in {version}");
    }
    let (status, h, _) = call(&c, "POST", "/statistics", &[], Some(&json!({}))).await;
    assert_eq!((status, h["allow"].to_str().unwrap()), (405, "GET, DELETE"));
}

/// A registration is reached from its own service path (or a query
/// covering it), not from another one; an update without service path
/// reaches only the registrations made at `/`.
#[tokio::test]
async fn registrations_are_scoped_by_service_path() {
    let broker = Server::start();
    let b = broker.client();
    let mut cp = Receiver::start(404, "").await;
    let at_a = [("Fiware-ServicePath", "/a")];
    register(
        &b,
        &at_a,
        json!([{"id": "E", "type": "T"}]),
        json!([]),
        &cp.url,
        "all",
    )
    .await;

    let (status, _, _) = call(&b, "GET", "/v2/entities/E?type=T", &[], None).await;
    assert_eq!(status, 404);
    assert_eq!(cp.try_next().expect("/# reaches /a").0, "/cp/op/query");
    let (status, _, _) = call(
        &b,
        "GET",
        "/v2/entities/E?type=T",
        &[("Fiware-ServicePath", "/b")],
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert!(cp.try_next().is_none(), "/b reached a registration of /a");

    let patch = json!({"A": {"value": 1}});
    let (status, _, _) = call(
        &b,
        "PATCH",
        "/v2/entities/E/attrs?type=T",
        &[],
        Some(&patch),
    )
    .await;
    assert_eq!(status, 404);
    assert!(cp.try_next().is_none(), "an update at / reached /a");
    let (status, _, _) = call(
        &b,
        "PATCH",
        "/v2/entities/E/attrs?type=T",
        &at_a,
        Some(&patch),
    )
    .await;
    assert_eq!(status, 404);
    let (path, h, _) = cp.try_next().expect("an update at /a reaches /a");
    assert_eq!(
        (path.as_str(), h["fiware-servicepath"].to_str().unwrap()),
        ("/cp/op/update", "/a")
    );
}

/// `/admin/metrics` counts requests per service and subservice, with
/// Orion's keys, and resets.
#[tokio::test]
async fn admin_metrics_count_per_service() {
    let server = Server::start();
    let c = server.client();
    let scope = [
        ("Fiware-Service", "metrics1"),
        ("Fiware-ServicePath", "/gardens/north"),
    ];
    create(&c, &scope, json!({"id": "E1", "type": "T"})).await;
    let (status, _, _) = call(&c, "GET", "/v2/entities/nope", &scope, None).await;
    assert_eq!(status, 404);
    let (status, _, m) = call(&c, "GET", "/admin/metrics", &[], None).await;
    assert_eq!(status, 200, "{m}");
    let north = &m["services"]["metrics1"]["subservs"]["gardens/north"];
    assert_eq!(north["incomingTransactions"], 2, "{m}");
    assert_eq!(north["incomingTransactionErrors"], 1, "{m}");
    assert!(
        north["incomingTransactionRequestSize"].as_u64().unwrap() > 0,
        "{m}"
    );
    assert!(north["serviceTime"].is_f64(), "{m}");
    assert_eq!(m["services"]["metrics1"]["sum"]["incomingTransactions"], 2);
    // The request that read them counts too, without tenant nor path.
    let (_, _, m) = call(&c, "GET", "/admin/metrics", &[], None).await;
    let root = &m["services"]["default-service"]["subservs"]["root-subserv"];
    assert_eq!(root["incomingTransactions"], 1, "{m}");

    let (_, _, before) = call(&c, "GET", "/admin/metrics?reset=true", &[], None).await;
    assert_eq!(
        before["services"]["metrics1"]["sum"]["incomingTransactions"],
        2
    );
    let (_, _, after) = call(&c, "GET", "/admin/metrics", &[], None).await;
    assert!(after["services"].get("metrics1").is_none(), "{after}");
    let (status, _, _) = call(&c, "DELETE", "/admin/metrics", &[], None).await;
    assert_eq!(status, 204);
}

/// Paging spans local and provided entities: local ones first, then the
/// provider's, which is asked for as many as the page needs even past its
/// own default page of 20.
#[tokio::test]
async fn listings_page_across_local_and_provided_entities() {
    let cp = provider();
    let broker = Server::start();
    let (b, p) = (broker.client(), cp.client_with(None));
    let entities: Vec<Value> = (1..=25)
        .map(|i| json!({"id": format!("P{i:02}"), "type": "T", "A": {"value": i}}))
        .collect();
    let batch = json!({"actionType": "append", "entities": entities});
    let (status, _, reply) = call(&p, "POST", "/v2/op/update", &[], Some(&batch)).await;
    assert_eq!(status, 204, "{reply}");
    create(&b, &[], json!({"id": "L1", "type": "T"})).await;
    let url = format!("{}/v2", cp.url);
    register(
        &b,
        &[],
        json!([{"idPattern": ".*", "type": "T"}]),
        json!([]),
        &url,
        "all",
    )
    .await;

    let (status, h, list) = call(
        &b,
        "GET",
        "/v2/entities?type=T&limit=30&options=count,keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(h["fiware-total-count"], "26");
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 26, "{ids:?}");
    assert_eq!((ids[0], ids[1], ids[25]), ("L1", "P01", "P25"));

    let (_, _, page) = call(
        &b,
        "GET",
        "/v2/entities?type=T&offset=24&limit=5",
        &[],
        None,
    )
    .await;
    let ids: Vec<&str> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["P24", "P25"]);
}
