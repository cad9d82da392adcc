//! The NGSIv2 surface (`/v2`): tenancy, the query language, keyValues
//! round trips and Orion's 405 answers, seen from a client.

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
    assert_eq!(
        get("c").await,
        json!({"type":"Number","value":4,"metadata":{}})
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
    assert_eq!(get("n").await["type"], "Number");
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
}
