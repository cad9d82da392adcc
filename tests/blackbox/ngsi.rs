//! The NGSIv2 surface (`/v2`): tenancy, the query language, keyValues
//! round trips and Orion's 405 answers, seen from a client; then two
//! families: builtins (dates, `servicePath`, builtin metadata, numbers as
//! Orion writes them) and transient entities (`dateExpires`).

use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::util::*;

/// One NGSIv2 call: status, headers and JSON body (`Null` when empty).
pub(crate) async fn call(
    c: &Client,
    method: &str,
    path: &str,
    tenant: Option<&str>,
    body: Option<&Value>,
) -> (u16, HeaderMap, Value) {
    let mut req = c
        .http
        .request(method.parse().unwrap(), format!("{}{}", c.url, path));
    if let Some(t) = tenant {
        req = req.header("Fiware-Service", t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// The ids of a listing, in order.
fn ids(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("a JSON array")
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect()
}

/// An entity created in tenant A is invisible from tenant B and from the
/// default tenant, by id and in listings; the tenant name is
/// case-insensitive, as in Orion.
#[tokio::test]
async fn tenants_are_isolated() {
    let server = Server::start();
    let c = server.client();
    let e = json!({"id": "Room1", "type": "Room", "temperature": {"value": 21, "type": "Number"}});
    let (status, headers, _) = call(&c, "POST", "/v2/entities", Some("tenant_a"), Some(&e)).await;
    assert_eq!(status, 201);
    assert_eq!(headers["location"], "/v2/entities/Room1?type=Room");
    assert!(headers.contains_key("fiware-correlator"));

    let (status, _, got) = call(&c, "GET", "/v2/entities/Room1", Some("Tenant_A"), None).await;
    assert_eq!(status, 200);
    assert_eq!(got["temperature"]["value"], 21);

    for tenant in [Some("tenant_b"), None] {
        let (status, _, body) = call(&c, "GET", "/v2/entities/Room1", tenant, None).await;
        assert_eq!(status, 404, "{tenant:?}");
        assert_eq!(body["error"], "NotFound");
        let (_, _, list) = call(&c, "GET", "/v2/entities", tenant, None).await;
        assert_eq!(list, json!([]), "{tenant:?}");
        let (_, _, types) = call(&c, "GET", "/v2/types", tenant, None).await;
        assert_eq!(types, json!([]), "{tenant:?}");
    }

    // The same id may live in another tenant independently.
    let (status, _, _) = call(&c, "POST", "/v2/entities", Some("tenant_b"), Some(&e)).await;
    assert_eq!(status, 201);
    let (status, _, body) = call(&c, "GET", "/v2/entities", Some("bad-name"), None).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["description"],
        "bad character in tenant name - only underscore and alphanumeric characters are allowed"
    );
}

/// `q` and `mq` operators select the expected entities, in creation
/// order, and bad expressions get Orion's 400 texts.
#[tokio::test]
async fn q_and_mq_filter_entities() {
    let server = Server::start();
    let c = server.client();
    let rooms = [("R1", 10, "low"), ("R2", 20, "mid"), ("R3", 30, "high")];
    for (id, temp, level) in rooms {
        let e = json!({"id": id, "type": "Room",
            "temperature": {"value": temp, "type": "Number",
                            "metadata": {"accuracy": {"value": temp / 10, "type": "Number"}}},
            "level": {"value": level, "type": "Text"}});
        let (status, _, _) = call(&c, "POST", "/v2/entities", None, Some(&e)).await;
        assert_eq!(status, 201);
    }
    let cases = [
        ("q=temperature%3E15", vec!["R2", "R3"]),
        ("q=temperature%3C=20", vec!["R1", "R2"]),
        ("q=temperature==10,30", vec!["R1", "R3"]),
        ("q=temperature==15..25", vec!["R2"]),
        ("q=temperature!=20;level==high", vec!["R3"]),
        ("q=level~=i", vec!["R2", "R3"]),
        ("q=!level", vec![]),
        ("mq=temperature.accuracy%3E=2", vec!["R2", "R3"]),
        (
            "q=temperature%3E0&orderBy=!temperature&limit=2",
            vec!["R3", "R2"],
        ),
    ];
    for (query, want) in cases {
        let (status, _, list) = call(&c, "GET", &format!("/v2/entities?{query}"), None, None).await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(ids(&list), want, "{query}");
    }
    let (status, headers, _) =
        call(&c, "GET", "/v2/entities?options=count&limit=1", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["fiware-total-count"], "3");
    let (status, _, body) = call(&c, "GET", "/v2/entities?q=temperature%3E=0..5", None, None).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["description"],
        "ranges only valid for equal and not equal ops"
    );
}

/// An entity created with `options=keyValues` reads back the same in
/// keyValues, and in normalized form with the default attribute types.
#[tokio::test]
async fn key_values_round_trip() {
    let server = Server::start();
    let c = server.client();
    let e = json!({"id": "Car1", "type": "Car", "speed": 98.5, "brand": "Volvo",
                   "on": true, "extras": {"seats": 5}});
    let (status, _, _) = call(&c, "POST", "/v2/entities?options=keyValues", None, Some(&e)).await;
    assert_eq!(status, 201);
    let (_, _, got) = call(&c, "GET", "/v2/entities/Car1?options=keyValues", None, None).await;
    assert_eq!(got, e);
    let (_, _, full) = call(&c, "GET", "/v2/entities/Car1?type=Car", None, None).await;
    assert_eq!(
        full["speed"],
        json!({"type": "Number", "value": 98.5, "metadata": {}})
    );
    assert_eq!(full["extras"]["type"], "StructuredValue");
    let (_, _, values) = call(
        &c,
        "GET",
        "/v2/entities/Car1?options=values&attrs=brand,speed",
        None,
        None,
    )
    .await;
    assert_eq!(values, json!(["Volvo", 98.5]));
    let (status, _, _) = call(
        &c,
        "PATCH",
        "/v2/entities/Car1/attrs?options=keyValues",
        None,
        Some(&json!({"speed": 50})),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, speed) = call(&c, "GET", "/v2/entities/Car1/attrs/speed", None, None).await;
    assert_eq!(speed["value"], 50);
}

/// A known path with a verb it does not serve answers 405 with `Allow` in
/// Orion's order; an unknown path answers Orion's 400.
#[tokio::test]
async fn wrong_verb_and_unknown_path() {
    let server = Server::start();
    let c = server.client();
    let cases = [
        ("PATCH", "/v2/entities/E1/attrs/A1", "GET, PUT, DELETE"),
        ("DELETE", "/v2/entities/E1/attrs", "GET, PATCH, POST, PUT"),
        ("POST", "/v2/entities/E1/attrs/A1/value", "GET, PUT"),
        ("DELETE", "/v2/types", "GET"),
    ];
    for (method, path, allow) in cases {
        let (status, headers, body) = call(&c, method, path, None, Some(&json!({"x": 1}))).await;
        assert_eq!(status, 405, "{method} {path}");
        assert_eq!(headers["allow"], allow, "{method} {path}");
        assert_eq!(
            body,
            json!({"error": "MethodNotAllowed", "description": "method not allowed"})
        );
    }
    let (status, _, body) = call(&c, "GET", "/v2/nothing/here", None, None).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["description"],
        "Service not found. Check your URL as probably it is wrong."
    );
}

/// A device uplink becomes context: the device's entity appears in the
/// default tenant with each measure as an attribute (unit as metadata),
/// its static location as geo:json and `dateObserved`, and follows the
/// device's next uplink.
#[tokio::test]
async fn data_units_update_their_devices_entities() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/dev-ctx",
        Some(
            &json!({"name":"P1","type":"em300th","static":{"location":{"lat":41.15,"lon":-8.61}}}),
        ),
    )
    .await;
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("ctx-1", "dev-ctx", 37, 61, 1_700_000_000_123),
    )
    .await;
    c.unit_eventually("ctx-1").await;

    let (status, _, entity) = call(&c, "GET", "/v2/entities/dev-ctx", None, None).await;
    assert_eq!(status, 200, "{entity}");
    assert_eq!(entity["type"], "TemperatureSensor");
    assert_eq!(
        entity["temperature"],
        json!({"type":"Number","value":37,"metadata":{"unit":{"type":"Text","value":"celsius"}}})
    );
    assert_eq!(entity["airHumidity"]["value"], 61);
    assert_eq!(
        entity["location"],
        json!({"type":"geo:json","value":{"type":"Point","coordinates":[-8.61,41.15]},"metadata":{}})
    );
    assert_eq!(
        entity["dateObserved"],
        json!({"type":"DateTime","value":"2023-11-14T22:13:20.123Z","metadata":{}})
    );
    let (_, _, other) = call(&c, "GET", "/v2/entities/dev-ctx", Some("othertenant"), None).await;
    assert_eq!(other["error"], "NotFound");

    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("ctx-2", "dev-ctx", 45, 60, 1_700_000_001_000),
    )
    .await;
    c.unit_eventually("ctx-2").await;
    let (_, _, hot) = call(
        &c,
        "GET",
        "/v2/entities?q=temperature>40&options=keyValues&attrs=temperature",
        None,
        None,
    )
    .await;
    assert_eq!(
        hot,
        json!([{"id":"dev-ctx","type":"TemperatureSensor","temperature":45}])
    );
}

/// Entities fed by device data survive kill -9: whatever was not yet
/// written in bulk is rebuilt from the stored units at start.
#[tokio::test]
async fn device_entities_survive_kill_9() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    for i in 0..5 {
        let body = decoded_body(
            &format!("k-{i}"),
            &format!("dev-k{i}"),
            20 + i,
            50,
            now_ms(),
        );
        c.uplink("crash", "decoded", "em300th", &body).await;
    }
    c.uplink(
        "crash",
        "decoded",
        "em300th",
        &decoded_body("k-last", "dev-k0", 33, 50, now_ms()),
    )
    .await;
    c.unit_eventually("k-last").await;
    server.kill9();
    server.restart();
    let c = server.client();
    let (status, _, list) = call(
        &c,
        "GET",
        "/v2/entities?type=TemperatureSensor&options=keyValues&attrs=temperature&limit=100",
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let mut got: Vec<(String, i64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["temperature"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    let want: Vec<(String, i64)> = vec![
        ("dev-k0".into(), 33),
        ("dev-k1".into(), 21),
        ("dev-k2".into(), 22),
        ("dev-k3".into(), 23),
        ("dev-k4".into(), 24),
    ];
    assert_eq!(got, want);
}

/// Orion's update operators: each computes the new value from the current
/// one (or from the reference value on creation), in every write that
/// takes attributes; one that cannot apply is a 500 and changes nothing.
#[tokio::test]
async fn update_operators_compute_from_the_current_value() {
    let server = Server::start();
    let c = server.client();
    let create = json!({"id":"E","type":"T",
        "n":{"value":5,"type":"Number"},
        "A":{"value":[1],"type":"StructuredValue"},
        "o":{"value":{"a":1,"b":2},"type":"StructuredValue"},
        "s":{"value":"text","type":"Text"},
        "c":{"value":{"$inc":4}}});
    let (status, _, body) = call(&c, "POST", "/v2/entities", None, Some(&create)).await;
    assert_eq!(status, 201, "{body}");
    let get = |attr: &'static str| {
        let c = &c;
        async move {
            let (_, _, e) = call(c, "GET", "/v2/entities/E", None, None).await;
            e[attr].clone()
        }
    };
    // Sent without a type, an operator leaves a StructuredValue, as the
    // real Orion 4.7.0 stores it.
    assert_eq!(
        get("c").await,
        json!({"type":"StructuredValue","value":4,"metadata":{}})
    );

    let patch = |body: Value| {
        let c = &c;
        async move {
            let (status, _, reply) =
                call(c, "PATCH", "/v2/entities/E/attrs", None, Some(&body)).await;
            (status, reply)
        }
    };
    assert_eq!(patch(json!({"n":{"value":{"$inc":2}}})).await.0, 204);
    assert_eq!(get("n").await["value"], 7);
    assert_eq!(get("n").await["type"], "StructuredValue");
    patch(json!({"A":{"value":{"$push":{"$each":[2,3]}},"type":"StructuredValue"}})).await;
    patch(json!({"A":{"value":{"$addToSet":3},"type":"StructuredValue"}})).await;
    assert_eq!(get("A").await["value"], json!([1, 2, 3]));
    patch(json!({"A":{"value":{"$pull":1},"type":"StructuredValue"}})).await;
    assert_eq!(get("A").await["value"], json!([2, 3]));
    patch(json!({"o":{"value":{"$set":{"c":3},"$unset":{"a":1}}}})).await;
    assert_eq!(get("o").await["value"], json!({"b":2,"c":3}));
    patch(json!({"n":{"value":{"$max":3}}})).await;
    assert_eq!(get("n").await["value"], 7);

    let (status, reply) = patch(json!({"s":{"value":{"$inc":1}}})).await;
    assert_eq!(status, 500, "{reply}");
    assert_eq!(reply["error"], "InternalServerError");
    assert_eq!(get("s").await["value"], "text");

    let (status, _, _) = call(
        &c,
        "PUT",
        "/v2/entities/E/attrs/n/value",
        None,
        Some(&json!({"$mul": 3})),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(get("n").await["value"], 21);
    // `…/value` sets the value alone: with an operator too, the type
    // stays (as the real Orion 4.7.0 keeps it).
    patch(json!({"n":{"value":21,"type":"Number"}})).await;
    let (status, _, _) = call(
        &c,
        "PUT",
        "/v2/entities/E/attrs/n/value",
        None,
        Some(&json!({"$inc": 1})),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        get("n").await,
        json!({"type":"Number","value":22,"metadata":{}})
    );
}

// ---------------------------------------------------------------------
// Builtins: dateCreated, dateModified, dateExpires, servicePath and the
// builtin metadata, rendered only when asked and always meaning the
// builtin in `q` and `orderBy`.
// ---------------------------------------------------------------------

/// One NGSIv2 call with a raw body (sent as `application/json`) and the
/// raw answer, for what serde_json would normalise: number spellings.
async fn call_raw(
    c: &Client,
    method: &str,
    path: &str,
    service_path: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut req = c
        .http
        .request(method.parse().unwrap(), format!("{}{}", c.url, path));
    if let Some(sp) = service_path {
        req = req.header("Fiware-ServicePath", sp);
    }
    if let Some(b) = body {
        req = req
            .header("Content-Type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// Parses an ISO 8601 UTC date as weft renders it, to epoch ms.
fn date_ms(v: &Value) -> i64 {
    weft_model::ngsi::parse_datetime(v.as_str().expect("a date string")).expect("an ISO 8601 date")
}

/// The builtin attributes and metadata appear only when named (`attrs`,
/// `metadata`, or the deprecated `options=dateCreated`/`dateModified`),
/// carry the entity's and the attribute's creation and modification
/// times, and order listings with `orderBy`.
#[tokio::test]
async fn builtin_dates_render_only_when_asked() {
    let server = Server::start();
    let c = server.client();
    let before = now_ms();
    let e1 = json!({"id": "E1", "type": "T", "A": {"value": 1, "type": "Number"}});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&e1)).await.0,
        201
    );
    let (_, _, plain) = call(&c, "GET", "/v2/entities/E1", None, None).await;
    assert_eq!(
        plain,
        json!({"id": "E1", "type": "T", "A": {"type": "Number", "value": 1, "metadata": {}}})
    );

    let (_, _, asked) = call(
        &c,
        "GET",
        "/v2/entities/E1?attrs=dateCreated,dateModified,*",
        None,
        None,
    )
    .await;
    assert_eq!(asked["dateCreated"]["type"], "DateTime");
    assert_eq!(asked["A"]["value"], 1);
    let created = date_ms(&asked["dateCreated"]["value"]);
    assert!(created >= before - 1 && created <= now_ms(), "{asked}");
    assert_eq!(asked["dateModified"], asked["dateCreated"]);

    // Only builtins named: no user attributes.
    let (_, _, only) = call(
        &c,
        "GET",
        "/v2/entities/E1?attrs=dateModified&options=keyValues",
        None,
        None,
    )
    .await;
    assert_eq!(only.as_object().unwrap().len(), 3, "{only}");
    assert!(only["dateModified"].is_string());

    // The deprecated option adds the builtin to every user attribute.
    let (_, _, legacy) = call(
        &c,
        "GET",
        "/v2/entities/E1?options=keyValues,dateCreated",
        None,
        None,
    )
    .await;
    assert_eq!(legacy["A"], 1);
    assert_eq!(legacy["dateCreated"], asked["dateCreated"]["value"]);
    assert!(legacy.get("dateModified").is_none());

    // An update moves the entity's and the attribute's dateModified only.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let patch = json!({"A": {"value": 2, "type": "Number"}});
    assert_eq!(
        call(&c, "PATCH", "/v2/entities/E1/attrs", None, Some(&patch))
            .await
            .0,
        204
    );
    let (_, _, after) = call(
        &c,
        "GET",
        "/v2/entities/E1?attrs=dateCreated,dateModified,A&metadata=dateCreated,dateModified",
        None,
        None,
    )
    .await;
    assert_eq!(after["dateCreated"], asked["dateCreated"]);
    assert!(
        date_ms(&after["dateModified"]["value"]) > created,
        "{after}"
    );
    let md = &after["A"]["metadata"];
    assert_eq!(md["dateCreated"]["value"], asked["dateCreated"]["value"]);
    assert_eq!(md["dateModified"]["value"], after["dateModified"]["value"]);
    assert_eq!(md["dateModified"]["type"], "DateTime");
    // The notification-only builtin metadata never appear in responses.
    let (_, _, none) = call(
        &c,
        "GET",
        "/v2/entities/E1/attrs/A?metadata=previousValue,actionType",
        None,
        None,
    )
    .await;
    assert_eq!(none["metadata"], json!({}), "{none}");
    let (_, _, none) = call(
        &c,
        "GET",
        "/v2/entities/E1?metadata=previousValue,actionType",
        None,
        None,
    )
    .await;
    assert_eq!(none["A"]["metadata"], json!({}), "{none}");

    // orderBy on the builtins: E2 is created later, E1 modified later.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let e2 = json!({"id": "E2", "type": "T"});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&e2)).await.0,
        201
    );
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        call(
            &c,
            "PATCH",
            "/v2/entities/E1/attrs",
            None,
            Some(&json!({"A": {"value": 3}}))
        )
        .await
        .0,
        204
    );
    let (_, _, by_created) = call(&c, "GET", "/v2/entities?orderBy=!dateCreated", None, None).await;
    assert_eq!(ids(&by_created), ["E2", "E1"]);
    let (_, _, by_modified) =
        call(&c, "GET", "/v2/entities?orderBy=!dateModified", None, None).await;
    assert_eq!(ids(&by_modified), ["E1", "E2"]);
    let (_, _, in_q) = call(
        &c,
        "GET",
        &format!(
            "/v2/entities?q=dateCreated>={}",
            after["dateModified"]["value"].as_str().unwrap()
        ),
        None,
        None,
    )
    .await;
    assert_eq!(ids(&in_q), ["E2"]);
}

/// A user attribute named like a builtin is rendered by default and wins
/// in rendering, while `q` still filters on the builtin (Orion's
/// documented behaviour, `0876_entity_dates`).
#[tokio::test]
async fn user_attributes_named_like_builtins_render_but_q_reads_the_builtin() {
    let server = Server::start();
    let c = server.client();
    let e = json!({"id": "E", "type": "T",
        "dateCreated": {"value": "2050-01-01T00:00:00.666", "type": "DateTime"}});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&e)).await.0,
        201
    );
    let (_, _, got) = call(&c, "GET", "/v2/entities/E?options=keyValues", None, None).await;
    assert_eq!(
        got,
        json!({"id": "E", "type": "T", "dateCreated": "2050-01-01T00:00:00.666Z"})
    );
    let (_, _, future) = call(
        &c,
        "GET",
        "/v2/entities?q=dateCreated>2049-01-01",
        None,
        None,
    )
    .await;
    assert_eq!(future, json!([]));
    let (_, _, past) = call(
        &c,
        "GET",
        "/v2/entities?q=dateCreated<2049-01-01&options=keyValues",
        None,
        None,
    )
    .await;
    assert_eq!(ids(&past), ["E"]);
    assert_eq!(past[0]["dateCreated"], "2050-01-01T00:00:00.666Z");
}

/// `servicePath` is a builtin attribute: rendered when named, usable in
/// `q` and `orderBy`.
#[tokio::test]
async fn service_path_builtin() {
    let server = Server::start();
    let c = server.client();
    for (sp, id) in [("/b", "E1"), ("/a", "E2")] {
        let (status, _) = call_raw(
            &c,
            "POST",
            "/v2/entities",
            Some(sp),
            Some(&json!({"id": id, "type": "T"}).to_string()),
        )
        .await;
        assert_eq!(status, 201);
    }
    let (_, text) = call_raw(
        &c,
        "GET",
        "/v2/entities?attrs=servicePath&orderBy=servicePath",
        Some("/#"),
        None,
    )
    .await;
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        list,
        json!([
        {"id": "E2", "type": "T", "servicePath": {"type": "Text", "value": "/a", "metadata": {}}},
        {"id": "E1", "type": "T", "servicePath": {"type": "Text", "value": "/b", "metadata": {}}}])
    );
    let (_, text) = call_raw(
        &c,
        "GET",
        "/v2/entities?q=servicePath==/b&options=keyValues",
        Some("/#"),
        None,
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!([{"id": "E1", "type": "T"}])
    );
    let (_, text) = call_raw(&c, "GET", "/v2/entities", Some("/#"), None).await;
    assert!(!text.contains("servicePath"), "{text}");
}

/// A local receiver of notifications that keeps their raw bodies.
async fn raw_receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/notify",
        axum::routing::post(move |body: String| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(body);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// Numbers are written as Orion writes them, in responses and in
/// notifications: integral values without decimals, at most nine
/// decimals, exponent form beyond the 64-bit range, tiny values as 0.
#[tokio::test]
async fn numbers_are_written_as_orion_writes_them() {
    let server = Server::start();
    let c = server.client();
    let (url, mut notifications) = raw_receiver().await;
    let sub = json!({"subject": {"entities": [{"id": "N", "type": "T"}]},
                     "notification": {"http": {"url": url}, "attrsFormat": "keyValues"}});
    assert_eq!(
        call(&c, "POST", "/v2/subscriptions", None, Some(&sub))
            .await
            .0,
        201
    );
    let body = r#"{"id":"N","type":"T","a":{"value":7.999999999536117},"b":{"value":3.0},
        "c":{"value":1.79e308},"d":{"value":1e-7},"e":{"value":4.9e-324},"f":{"value":0.1},
        "g":{"value":{"x":[2.50,-1.0]}},"h":{"value":12345}}"#;
    assert_eq!(
        call_raw(&c, "POST", "/v2/entities", None, Some(body))
            .await
            .0,
        201
    );
    let expected = r#"{"id":"N","type":"T","a":8,"b":3,"c":1.79e+308,"d":0.0000001,"e":0,"f":0.1,"g":{"x":[2.5,-1]},"h":12345}"#;
    let (status, text) = call_raw(&c, "GET", "/v2/entities/N?options=keyValues", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(text, expected);
    let notified = tokio::time::timeout(std::time::Duration::from_secs(10), notifications.recv())
        .await
        .expect("a notification within 10 s")
        .unwrap();
    assert!(
        notified.contains(&expected[1..expected.len() - 1]),
        "{notified}"
    );
    let (_, text) = call_raw(&c, "GET", "/v2/entities/N/attrs/a/value", None, None).await;
    assert_eq!(text, "8");
}

/// The next notification body of `rx` as JSON (10 s at most).
async fn next_notification(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Value {
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("a notification within 10 s")
        .unwrap();
    serde_json::from_str(&body).expect("a JSON notification")
}

/// Notifications render the builtins named in `notification.attrs`
/// (`servicePath`, the dates, `alterationType`); with `onlyChangedAttrs`
/// the dates and `alterationType` stay while untouched attributes go.
/// An `entityUpdate` subscription fires when a watched attribute is
/// written unchanged even if another one changed (Orion 4647).
#[tokio::test]
async fn notifications_carry_the_builtins_asked_for() {
    let server = Server::start();
    let c = server.client();
    let (url, mut rx) = raw_receiver().await;
    let sub = json!({"subject": {"entities": [{"id": "E", "type": "T"}],
                                 "condition": {"attrs": ["A"], "alterationTypes": ["entityUpdate"]}},
                     "notification": {"http": {"url": url}, "onlyChangedAttrs": true,
                                      "attrs": ["A", "B", "dateModified", "servicePath", "alterationType"]}});
    assert_eq!(
        call(&c, "POST", "/v2/subscriptions", None, Some(&sub))
            .await
            .0,
        201
    );
    let (status, _) = call_raw(
        &c,
        "POST",
        "/v2/entities",
        Some("/x"),
        Some(&json!({"id": "E", "type": "T", "A": {"value": 1}, "B": {"value": 1}}).to_string()),
    )
    .await;
    assert_eq!(status, 201);
    // A written unchanged, B changed: fires for entityUpdate on A.
    let patch = json!({"A": {"value": 1, "type": "Number"}, "B": {"value": 2, "type": "Number"}});
    let (status, _) = call_raw(
        &c,
        "PATCH",
        "/v2/entities/E/attrs",
        Some("/x"),
        Some(&patch.to_string()),
    )
    .await;
    assert_eq!(status, 204);
    let n = next_notification(&mut rx).await;
    let e = &n["data"][0];
    assert_eq!(e["A"]["value"], 1, "{n}");
    assert_eq!(e["B"]["value"], 2, "{n}");
    assert_eq!(e["alterationType"]["value"], "entityChange", "{n}");
    assert_eq!(e["dateModified"]["type"], "DateTime", "{n}");
    // servicePath is not among the three kept with onlyChangedAttrs.
    assert!(e.get("servicePath").is_none(), "{n}");
    // Only B written: A is not in the update, so nothing fires.
    let only_b = json!({"B": {"value": 3, "type": "Number"}});
    call_raw(
        &c,
        "PATCH",
        "/v2/entities/E/attrs",
        Some("/x"),
        Some(&only_b.to_string()),
    )
    .await;
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(500), rx.recv()).await;
    assert!(quiet.is_err(), "{quiet:?}");

    let sub2 = json!({"subject": {"entities": [{"id": "E", "type": "T"}]},
                      "notification": {"http": {"url": url},
                                       "attrs": ["servicePath", "dateCreated"]}});
    assert_eq!(
        call(&c, "POST", "/v2/subscriptions", None, Some(&sub2))
            .await
            .0,
        201
    );
    let b4 = json!({"B": {"value": 4, "type": "Number"}});
    call_raw(
        &c,
        "PATCH",
        "/v2/entities/E/attrs",
        Some("/x"),
        Some(&b4.to_string()),
    )
    .await;
    let n = next_notification(&mut rx).await;
    let e = &n["data"][0];
    assert_eq!(
        e["servicePath"],
        json!({"type": "Text", "value": "/x", "metadata": {}}),
        "{n}"
    );
    assert_eq!(e["dateCreated"]["type"], "DateTime", "{n}");
    assert!(e.get("B").is_none(), "{n}");
}

// ---------------------------------------------------------------------
// Transient entities: a `dateExpires` attribute of type DateTime.
// ---------------------------------------------------------------------

/// An entity with `dateExpires` is served until then (the attribute only
/// when named), gone for every reader at once when the time comes,
/// creatable again, and deleted from storage by the sweep.
#[tokio::test]
async fn transient_entities_expire() {
    let server = Server::start();
    let c = server.client();
    let expires = weft_model::ngsi::format_datetime(now_ms() + 1500);
    let e = json!({"id": "T1", "type": "Ticket", "A": {"value": 1},
        "dateExpires": {"value": expires, "type": "DateTime", "metadata": {"m": {"value": "x"}}}});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&e)).await.0,
        201
    );
    let (_, _, got) = call(&c, "GET", "/v2/entities/T1?options=keyValues", None, None).await;
    assert_eq!(got, json!({"id": "T1", "type": "Ticket", "A": 1}));
    let (_, _, asked) = call(&c, "GET", "/v2/entities/T1?attrs=dateExpires", None, None).await;
    assert_eq!(
        asked["dateExpires"],
        json!({"type": "DateTime", "value": expires, "metadata": {"m": {"type": "Text", "value": "x"}}})
    );
    let (_, _, in_q) = call(
        &c,
        "GET",
        "/v2/entities?q=dateExpires>2000-01-01",
        None,
        None,
    )
    .await;
    assert_eq!(ids(&in_q), ["T1"]);
    let (_, _, types) = call(&c, "GET", "/v2/types", None, None).await;
    assert_eq!(types[0]["attrs"], json!({"A": {"types": ["Number"]}}));

    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let (status, _, _) = call(&c, "GET", "/v2/entities/T1", None, None).await;
    assert_eq!(status, 404);
    assert_eq!(
        call(&c, "GET", "/v2/entities", None, None).await.2,
        json!([])
    );
    let patch = json!({"A": {"value": 2}});
    assert_eq!(
        call(&c, "PATCH", "/v2/entities/T1/attrs", None, Some(&patch))
            .await
            .0,
        404
    );

    // The sweep deletes it for good (counted in the metrics).
    eventually(std::time::Duration::from_secs(15), || async {
        let metrics = c.metrics().await?;
        metrics
            .lines()
            .any(|l| l.starts_with("weft_ngsi_entities_expired_total") && l.ends_with(" 1"))
            .then_some(())
    })
    .await;
    // And the id is free again.
    let again = json!({"id": "T1", "type": "Ticket", "B": {"value": true}});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&again)).await.0,
        201
    );
    let (_, _, got) = call(&c, "GET", "/v2/entities/T1?options=keyValues", None, None).await;
    assert_eq!(got, json!({"id": "T1", "type": "Ticket", "B": true}));
}

/// `dateExpires` can be added, changed and removed like any attribute,
/// survives a restart, and bad values get Orion's 400s and change
/// nothing.
#[tokio::test]
async fn transient_entities_change_persist_and_refuse_bad_dates() {
    let mut server = Server::start();
    let c = server.client();
    let e = json!({"id": "T2", "type": "Ticket", "A": {"value": 1}});
    assert_eq!(
        call(&c, "POST", "/v2/entities", None, Some(&e)).await.0,
        201
    );

    for (body, text) in [
        (
            json!({"dateExpires": {"value": "2040-01-01T00:00:00Z"}}),
            "error processing date expiration attribute, see log traces",
        ),
        (
            json!({"dateExpires": {"value": "tomorrow", "type": "DateTime"}}),
            "date has invalid format in attribute value",
        ),
    ] {
        let (status, _, reply) = call(&c, "POST", "/v2/entities/T2/attrs", None, Some(&body)).await;
        assert_eq!(
            (status, &reply["error"]),
            (400, &json!("BadRequest")),
            "{body}"
        );
        assert_eq!(reply["description"], text);
    }
    let bad_create =
        json!({"id": "T3", "type": "Ticket", "dateExpires": {"value": 5, "type": "Number"}});
    let (status, _, _) = call(&c, "POST", "/v2/entities", None, Some(&bad_create)).await;
    assert_eq!(status, 400);
    assert_eq!(call(&c, "GET", "/v2/entities/T3", None, None).await.0, 404);
    let (_, _, unchanged) = call(
        &c,
        "GET",
        "/v2/entities/T2?attrs=dateExpires,*&options=keyValues",
        None,
        None,
    )
    .await;
    assert_eq!(unchanged, json!({"id": "T2", "type": "Ticket", "A": 1}));

    // Added, then changed with PUT on the attribute, then kept across a restart.
    let add = json!({"dateExpires": {"value": "2090-01-01T00:00:00Z", "type": "DateTime"}});
    assert_eq!(
        call(&c, "POST", "/v2/entities/T2/attrs", None, Some(&add))
            .await
            .0,
        204
    );
    let put = json!({"value": "2091-06-01T00:00:00Z", "type": "DateTime"});
    assert_eq!(
        call(
            &c,
            "PUT",
            "/v2/entities/T2/attrs/dateExpires",
            None,
            Some(&put)
        )
        .await
        .0,
        204
    );
    let dates = "/v2/entities/T2?attrs=dateCreated,dateModified&metadata=dateModified";
    let (_, _, before) = call(&c, "GET", dates, None, None).await;
    server.restart();
    let c = server.client();
    let (_, _, got) = call(
        &c,
        "GET",
        "/v2/entities/T2?attrs=dateExpires&options=keyValues",
        None,
        None,
    )
    .await;
    assert_eq!(got["dateExpires"], "2091-06-01T00:00:00.000Z");
    // The builtin dates are stored with the entity.
    let (_, _, after) = call(&c, "GET", dates, None, None).await;
    assert_eq!(after, before);
    assert!(after["dateCreated"]["value"].is_string(), "{after}");
    let (_, _, in_q) = call(
        &c,
        "GET",
        "/v2/entities?q=dateExpires>2091-01-01",
        None,
        None,
    )
    .await;
    assert_eq!(ids(&in_q), ["T2"]);

    // Removed: the entity is permanent again, even past the old date.
    let past = json!({"value": "2001-01-01T00:00:00Z", "type": "DateTime"});
    assert_eq!(
        call(
            &c,
            "DELETE",
            "/v2/entities/T2/attrs/dateExpires",
            None,
            None
        )
        .await
        .0,
        204
    );
    assert_eq!(call(&c, "GET", "/v2/entities/T2", None, None).await.0, 200);
    // Set in the past: expired at once.
    let readd = json!({"dateExpires": past});
    assert_eq!(
        call(&c, "POST", "/v2/entities/T2/attrs", None, Some(&readd))
            .await
            .0,
        204
    );
    assert_eq!(call(&c, "GET", "/v2/entities/T2", None, None).await.0, 404);
}
