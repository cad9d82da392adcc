//! History seen through QuantumLeap's API (release 1.0.0): values
//! recorded from `/v2` updates, device uplinks and `POST /v2/notify` come
//! back from every query endpoint in QuantumLeap's shapes with their time
//! index; every notification is a row of its own; limits count a type's
//! rows; aggregates match values computed here; bad parameters get
//! QuantumLeap's answers; tenants isolate; kill -9 loses nothing
//! acknowledged.

use std::time::Duration;

use serde_json::{json, Value};

use crate::ngsi::call;
use crate::util::*;

/// Turns on the recording of entity changes (off by default).
const RECORD_CHANGES: &[(&str, &str)] = &[("WEFT_HISTORY__RECORD_CHANGES", "true")];

/// A QuantumLeap notification of one Room at `time` (ISO-8601).
fn room(id: &str, time: &str, temperature: f64, pressure: i64) -> Value {
    json!({"id": id, "type": "Room",
           "TimeInstant": {"type": "DateTime", "value": time},
           "temperature": {"type": "Number", "value": temperature},
           "pressure": {"type": "Integer", "value": pressure}})
}

async fn notify(c: &Client, tenant: Option<&str>, entities: Vec<Value>) -> (u16, Value) {
    let mut req = c
        .http
        .post(format!("{}/v2/notify", c.url))
        .json(&json!({"subscriptionId": "5947d174793fe6f7eb5e3961", "data": entities}));
    if let Some(t) = tenant {
        req = req.header("Fiware-Service", t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(c: &Client, tenant: Option<&str>, path: &str) -> (u16, Value) {
    let (status, _, body) = call(c, "GET", path, tenant, None).await;
    (status, body)
}

/// QuantumLeap 1.0's answer to a query that found nothing.
fn no_records() -> Value {
    json!({"error": "Not Found", "description": "No records were found for such query."})
}

fn at(minute: u32, second: u32) -> String {
    format!("2026-03-01T10:{minute:02}:{second:02}.000Z")
}

/// Notified values come back from every entity endpoint, with `lastN`,
/// ranges, paging and aggregates computed per period; a replay is stored
/// once.
#[tokio::test]
async fn notifications_come_back_from_the_query_api() {
    let server = Server::start();
    let c = server.client();
    let temps = [20.0, 21.5, 19.0, 23.5, 22.0, 18.5];
    for (i, t) in temps.iter().enumerate() {
        let minute = if i < 3 { 5 } else { 35 };
        let (status, body) = notify(
            &c,
            None,
            vec![room("Room:1", &at(minute, i as u32), *t, 700 + i as i64)],
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = get(&c, None, "/ql/v2/entities/Room:1/attrs/temperature").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["entityId"], "Room:1");
    assert_eq!(body["entityType"], "Room");
    assert_eq!(body["attrName"], "temperature");
    assert_eq!(body["values"], json!(temps));
    assert_eq!(body["index"][0], "2026-03-01T10:05:00.000+00:00");
    assert_eq!(body["index"].as_array().unwrap().len(), 6);

    let (_, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature/value?lastN=2",
    )
    .await;
    assert_eq!(body["values"], json!([22.0, 18.5]));
    let range = format!(
        "/ql/v2/entities/Room:1/attrs/pressure/value?fromDate={}&toDate={}",
        at(5, 1),
        at(35, 3)
    );
    let (_, body) = get(&c, None, &range).await;
    assert_eq!(body["values"], json!([701, 702, 703]));
    let (_, body) = get(&c, None, "/ql/v2/entities/Room:1/value?limit=2&offset=1").await;
    let attrs = body["attributes"].as_array().unwrap();
    let names: Vec<&str> = attrs
        .iter()
        .map(|a| a["attrName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["TimeInstant", "pressure", "temperature"]);
    assert_eq!(body["index"].as_array().unwrap().len(), 2);
    assert_eq!(attrs[1]["values"], json!([701, 702]));

    // Hourly, per-minute averages computed here.
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?aggrMethod=avg&aggrPeriod=hour",
    )
    .await;
    let mean = temps.iter().sum::<f64>() / temps.len() as f64;
    assert_eq!(body["values"], json!([mean]));
    assert_eq!(body["index"], json!(["2026-03-01T10:00:00.000+00:00"]));
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?aggrMethod=max&aggrPeriod=minute",
    )
    .await;
    assert_eq!(body["values"], json!([21.5, 23.5]));
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/types/Room/attrs/pressure?aggrMethod=count",
    )
    .await;
    assert_eq!(body["entities"][0]["values"], json!([6]));

    // idPattern over the entities of a type, and in the entity listing.
    notify(&c, None, vec![room("Hall:1", &at(5, 0), 30.0, 1)]).await;
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/types/Room/attrs/temperature?idPattern=%5EHall",
    )
    .await;
    let ids: Vec<&str> = body["entities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entityId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["Hall:1"]);
    let (_, body) = get(&c, None, "/ql/v2/entities?idPattern=Room").await;
    assert_eq!(body.as_array().unwrap().len(), 1);
    let (status, _) = get(&c, None, "/ql/v2/entities?idPattern=(").await;
    assert_eq!(status, 400);

    // Errors and empty results.
    let (status, _) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?aggrPeriod=hour",
    )
    .await;
    assert_eq!(status, 400);
    let (status, body) = get(&c, None, "/ql/v2/entities/nobody/attrs/temperature").await;
    assert_eq!((status, body), (404, no_records()));
}

/// Changes made through `/v2` and by device uplinks are recorded without
/// any subscription, and each tenant sees only its own history.
#[tokio::test]
async fn context_changes_are_recorded_per_tenant() {
    let server = Server::start_with_env(RECORD_CHANGES);
    let c = server.client();
    let e = json!({"id": "R2", "type": "Room", "temperature": {"value": 20, "type": "Number"}});
    call(&c, "POST", "/v2/entities", Some("acme"), Some(&e)).await;
    for t in [21, 22] {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let v = json!({"temperature": {"value": t, "type": "Number"}});
        let (status, _, _) =
            call(&c, "PATCH", "/v2/entities/R2/attrs", Some("acme"), Some(&v)).await;
        assert_eq!(status, 204);
    }
    // Moved from the durable feed in the background, but a query waits
    // for what was acknowledged before it: no polling needed.
    let (status, body) = get(
        &c,
        Some("acme"),
        "/ql/v2/entities/R2/attrs/temperature/value",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["values"], json!([20.0, 21.0, 22.0]));
    let (status, body) = get(
        &c,
        Some("other"),
        "/ql/v2/entities/R2/attrs/temperature/value",
    )
    .await;
    assert_eq!((status, body), (404, no_records()));
    let (status, body) = get(&c, None, "/ql/v2/entities/R2/attrs/temperature/value").await;
    assert_eq!((status, body), (404, no_records()));

    c.create_em300th().await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("h-1", "dev-h", 37, 61, 1_700_000_000_000),
    )
    .await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("h-2", "dev-h", 45, 60, 1_700_000_060_000),
    )
    .await;
    let body = eventually(Duration::from_secs(5), || async {
        let (_, body) = get(&c, None, "/ql/v2/entities/dev-h/attrs/temperature").await;
        (body["values"].as_array().map(Vec::len) == Some(2)).then_some(body)
    })
    .await;
    assert_eq!(body["values"], json!([37.0, 45.0]));
    assert_eq!(
        body["index"],
        json!([
            "2023-11-14T22:13:20.000+00:00",
            "2023-11-14T22:14:20.000+00:00"
        ]),
        "device data is filed under when it was observed"
    );
}

/// One invalid entity refuses its whole notification with QuantumLeap's
/// answer, and nothing of it is stored; so does a body that breaks
/// QuantumLeap's schema of a notification, with its request validation's
/// problem JSON (values as Python prints them) or a 415 for a body that
/// is not JSON.
#[tokio::test]
async fn an_invalid_entity_refuses_the_whole_notification() {
    let server = Server::start();
    let c = server.client();
    for (bad, detail) in [
        (
            json!({"type": "Room"}),
            "'id' is a required property - 'data.1'",
        ),
        (
            json!({"id": "X"}),
            "'type' is a required property - 'data.1'",
        ),
        (
            json!({"id": 7, "type": "Room"}),
            "7 is not of type 'string' - 'data.1.id'",
        ),
        (json!("it's"), "\"it's\" is not of type 'object' - 'data.1'"),
    ] {
        let (status, body) = notify(&c, None, vec![room("Room:7", &at(1, 0), 20.0, 1), bad]).await;
        assert_eq!((status, body), (400, problem(detail)));
    }
    let (status, body) = notify(
        &c,
        None,
        vec![
            room("Room:7", &at(1, 0), 20.0, 1),
            json!({"id": "X", "type": "Room", "t": 5}),
        ],
    )
    .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!(
                "Notification not processed or not updated: attribute t of entity X is not in \
                   normalized form (keyValues notifications are not supported)"
            )
        )
    );
    let (status, body) = get(&c, None, "/ql/v2/entities/Room:7/attrs/temperature/value").await;
    assert_eq!((status, body), (404, no_records()), "nothing stored");
    let (status, body) = notify(&c, None, vec![]).await;
    assert_eq!(
        (status, body),
        (200, json!("Notification successfully processed"))
    );
    for (body, content_type, status, detail) in [
        (
            r#"{"x": 1}"#,
            "application/json",
            400,
            "'data' is a required property",
        ),
        (
            r#""it's""#,
            "application/json",
            400,
            "\"it's\" is not of type 'object'",
        ),
        (
            r#"{"data": "x"}"#,
            "application/json",
            400,
            "'x' is not of type 'array' - 'data'",
        ),
        (
            r#"{"data": [], "subscriptionId": 5}"#,
            "application/json",
            400,
            "5 is not of type 'string' - 'subscriptionId'",
        ),
        (
            "not json",
            "application/json",
            400,
            "Request body is not valid JSON",
        ),
        ("", "application/json", 400, "None is not of type 'object'"),
        (
            r#"{"data": []}"#,
            "text/plain",
            415,
            "Invalid Content-type (text/plain), expected JSON data",
        ),
    ] {
        let resp = c
            .http
            .post(format!("{}/ql/v2/notify", c.url))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{body}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{body}"
        );
        let answer = resp.json::<Value>().await.unwrap();
        assert_eq!(answer["detail"], json!(detail), "{body}");
        assert_eq!(answer["status"], json!(status), "{body}");
    }
}

/// NGSI-LD entities, NGSIv2 attributes with NGSI-LD keys, dates that are
/// not dates and locations are stored as QuantumLeap 1.0 stores them, and
/// read back as it answers them: properties typed by their values,
/// relationships by their object, `location` as GeoJSON with a
/// `location_centroid`, the entity filed under its `observedAt`.
#[tokio::test]
async fn notified_entities_are_stored_as_quantumleap_stores_them() {
    let server = Server::start();
    let c = server.client();
    let (status, _) = notify(
        &c,
        None,
        vec![json!({
            "id": "urn:ngsi-ld:Room:1", "type": "Room",
            "@context": "https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context.jsonld",
            "temperature": {"type": "Property", "value": 20, "unitCode": "CEL",
                            "observedAt": "2026-01-01T00:00:00Z"},
            "name": {"type": "Property", "value": "hall"},
            "since": {"type": "Property", "value": "2025-06-01T00:00:00Z"},
            "owner": {"type": "Relationship", "object": "urn:ngsi-ld:Person:1"},
            "pressure": {"type": "Number", "value": 700, "unitCode": "HPA"},
            "checked": {"type": "DateTime", "value": "not a date"},
            "location": {"type": "geo:point", "value": "40.4168, -3.7038"},
            "path": {"type": "geo:line", "value": ["1,2", "3,4"]},
        })],
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = get(&c, None, "/ql/v2/entities/urn:ngsi-ld:Room:1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["index"], json!(["2026-01-01T00:00:00.000+00:00"]));
    let values: std::collections::BTreeMap<&str, &Value> = body["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["attrName"].as_str().unwrap(), &a["values"][0]))
        .collect();
    assert_eq!(
        values,
        [
            ("checked", json!(null)),
            (
                "location",
                json!({"type": "Point", "coordinates": [-3.7038, 40.4168]})
            ),
            ("location_centroid", json!("40.4168, -3.7038")),
            ("name", json!("hall")),
            ("owner", json!("urn:ngsi-ld:Person:1")),
            ("path", json!(["1.0, 2.0", "3.0, 4.0"])),
            ("pressure", json!(700.0)),
            ("since", json!("2025-06-01T00:00:00.000+00:00")),
            ("temperature", json!(20)),
        ]
        .iter()
        .map(|(k, v)| (*k, v))
        .collect()
    );
}

/// kill -9 in the middle of a burst of notifications: every one answered
/// 200 is there after the restart.
#[tokio::test]
async fn kill_9_during_a_notify_burst_loses_no_acknowledged_row() {
    let mut server = Server::start();
    let c = server.client();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let c = c.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10_000u32 {
                let t = parse_time("2026-03-02T00:00:00.000Z") + (w * 100_000 + i) as i64;
                let mut e = room(&format!("Room:{w}"), &iso(t), i as f64, 0);
                e["pressure"]["value"] = json!(i);
                match tokio::time::timeout(Duration::from_secs(2), notify(&c, None, vec![e])).await
                {
                    Ok((200, _)) => acked.lock().unwrap().push((w, t)),
                    _ => break,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.kill9();
    for t in tasks {
        let _ = t.await;
    }
    server.restart();
    let c = server.client();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "the burst got going ({} acked)",
        acked.len()
    );
    for w in 0..8u32 {
        let (_, body) = get(
            &c,
            None,
            &format!("/ql/v2/entities/Room:{w}/attrs/temperature"),
        )
        .await;
        let stored: std::collections::HashSet<String> = body["index"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        for (_, t) in acked.iter().filter(|(x, _)| *x == w) {
            let want = iso(*t).replace('Z', "+00:00");
            assert!(
                stored.contains(&want),
                "acknowledged row {want} of Room:{w} lost"
            );
        }
    }
}

fn parse_time(s: &str) -> i64 {
    weft_model::ngsi::parse_datetime(s).unwrap()
}

fn iso(ms: i64) -> String {
    weft_model::ngsi::format_datetime(ms)
}

/// kill -9 right after a burst of `/v2` updates: the history of every
/// acknowledged update is there after the restart (queued durably with the
/// change, moved into the history after the restart if it had not been).
#[tokio::test]
async fn kill_9_after_updates_loses_no_acknowledged_change_from_history() {
    let mut server = Server::start_with_env(RECORD_CHANGES);
    let c = server.client();
    let e = json!({"id": "R9", "type": "Room", "n": {"value": 0, "type": "Number"},
                   "TimeInstant": {"value": iso(1_000), "type": "DateTime"}});
    call(&c, "POST", "/v2/entities", None, Some(&e)).await;
    for i in 1..=300i64 {
        let v = json!({"n": {"value": i, "type": "Number"},
                       "TimeInstant": {"value": iso(1_000 + i), "type": "DateTime"}});
        let (status, _, _) = call(&c, "PATCH", "/v2/entities/R9/attrs", None, Some(&v)).await;
        assert_eq!(status, 204);
    }
    server.kill9();
    server.restart();
    let c = server.client();
    let want: Vec<f64> = (0..=300).map(|i| i as f64).collect();
    eventually(Duration::from_secs(10), || async {
        let (_, body) = get(&c, None, "/ql/v2/entities/R9/attrs/n/value").await;
        (body["values"] == json!(want)).then_some(())
    })
    .await;
}

/// With `history.quantumleap_listen`, QuantumLeap's unmodified paths work
/// on a second port: `/v2/notify` and `/v2/entities/...`.
#[tokio::test]
async fn quantumleap_paths_on_a_second_listener() {
    let (server, ql_url) = Server::start_with_quantumleap_listener(&[]).await;
    let main = server.client();
    let ql = Client {
        url: ql_url,
        ..main.clone()
    };
    let (status, _) = notify(&ql, None, vec![room("Room:q", &at(0, 0), 19.5, 1)]).await;
    assert_eq!(status, 200);
    let (status, body) = get(&ql, None, "/v2/entities/Room:q/attrs/temperature").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["values"], json!([19.5]));
    let (status, body) = get(&ql, None, "/version").await;
    assert_eq!((status, body), (200, json!({"version": "1.0.0"})));
    // As QuantumLeap writes its answers: Python's indented JSON with
    // sorted keys and a final newline.
    let resp = ql
        .http
        .get(format!("{}/v2/entities/nothing", ql.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.text().await.unwrap(),
        "{\n  \"description\": \"No records were found for such query.\",\n  \"error\": \"Not Found\"\n}\n"
    );
    let resp = ql
        .http
        .get(format!("{}/health", ql.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["cache-control"], "max-age=180");
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"status": "pass"})
    );
    // The main port keeps NGSIv2 at /v2: this is Orion's entity listing.
    let (status, body) = get(&main, None, "/v2/entities").await;
    assert_eq!((status, body), (200, json!([])));
}

/// On by default: an entity change is in history without any setting;
/// with `history.record_changes = false` it adds nothing (only
/// notifications do).
#[tokio::test]
async fn changes_are_recorded_by_default_and_not_when_turned_off() {
    let e = json!({"id": "R3", "type": "Room", "temperature": {"value": 20, "type": "Number"}});
    let server = Server::start();
    let c = server.client();
    let (status, _, _) = call(&c, "POST", "/v2/entities", None, Some(&e)).await;
    assert_eq!(status, 201);
    // In the answer of a query made right after the 201.
    let (status, body) = get(&c, None, "/ql/v2/entities/R3/attrs/temperature/value").await;
    assert_eq!((status, &body["values"]), (200, &json!([20.0])), "{body}");

    let off = Server::start_with_env(&[("WEFT_HISTORY__RECORD_CHANGES", "false")]);
    let c = off.client();
    let (status, _, _) = call(&c, "POST", "/v2/entities", None, Some(&e)).await;
    assert_eq!(status, 201);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, body) = get(&c, None, "/ql/v2/entities/R3/attrs/temperature/value").await;
    assert_eq!((status, body), (404, no_records()));
}

/// The `/attrs` endpoints group an attribute's series by entity type across
/// types; `POST /op/query` answers each entity's latest values with
/// QuantumLeap's error texts for what it does not support.
#[tokio::test]
async fn attrs_endpoints_and_op_query() {
    let server = Server::start();
    let c = server.client();
    let car = |id: &str, time: &str, speed: f64| {
        json!({"id": id, "type": "Car",
               "TimeInstant": {"type": "DateTime", "value": time},
               "speed": {"type": "Number", "value": speed},
               "temperature": {"type": "Number", "value": speed / 10.0}})
    };
    let (status, _) = notify(
        &c,
        None,
        vec![
            room("Room:1", &at(1, 0), 20.0, 700),
            room("Room:2", &at(1, 0), 21.0, 710),
            car("Car:1", &at(1, 0), 50.0),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = notify(
        &c,
        None,
        vec![
            room("Room:1", &at(2, 0), 22.0, 720),
            car("Car:1", &at(2, 0), 60.0),
        ],
    )
    .await;
    assert_eq!(status, 200);

    let (status, body) = get(&c, None, "/ql/v2/attrs/temperature").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attrName"], "temperature");
    let i1 = "2026-03-01T10:01:00.000+00:00";
    let i2 = "2026-03-01T10:02:00.000+00:00";
    assert_eq!(
        body["types"],
        json!([
            {"entityType": "Car", "entities": [
                {"entityId": "Car:1", "index": [i1, i2], "values": [5.0, 6.0]}]},
            {"entityType": "Room", "entities": [
                {"entityId": "Room:1", "index": [i1, i2], "values": [20.0, 22.0]},
                {"entityId": "Room:2", "index": [i1], "values": [21.0]}]}
        ])
    );
    let (_, value) = get(&c, None, "/ql/v2/attrs/temperature/value").await;
    assert_eq!(value["values"], body["types"]);
    // `type` narrows; `lastN` counts the rows of the whole type, as
    // QuantumLeap's one table per type does.
    let (_, body) = get(&c, None, "/ql/v2/attrs/temperature?type=Room&lastN=1").await;
    assert_eq!(
        body["types"],
        json!([{"entityType": "Room", "entities": [
            {"entityId": "Room:1", "index": [i2], "values": [22.0]}]}])
    );
    // QuantumLeap selects the columns asked from each type's table: a
    // type without one of them is left out (as the real one answers).
    let (status, body) = get(&c, None, "/ql/v2/attrs?attrs=speed,pressure").await;
    assert_eq!((status, body), (404, no_records()));
    let (status, body) = get(&c, None, "/ql/v2/attrs?attrs=speed,Temperature").await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["attrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["attrName"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["speed", "temperature"],
        "stored names, any case asked"
    );
    assert_eq!(
        body["attrs"][0]["types"],
        json!([{"entityType": "Car", "entities": [
            {"entityId": "Car:1", "index": [i1, i2], "values": [50.0, 60.0]}]}])
    );
    let (_, value) = get(&c, None, "/ql/v2/attrs/value?attrs=speed,temperature").await;
    assert_eq!(value["values"], body["attrs"]);
    let (status, body) = get(&c, Some("other"), "/ql/v2/attrs/temperature").await;
    assert_eq!((status, body), (404, no_records()), "tenants isolate");

    let query = |body: Value| {
        let c = c.clone();
        async move {
            let (status, _, body) = call(&c, "POST", "/ql/v2/op/query", None, Some(&body)).await;
            (status, body)
        }
    };
    let (status, body) = query(json!({
        "entities": [{"id": "Room:1", "type": "Room"}, {"id": "Car:1", "type": "Car"}],
        "attrs": ["temperature", "pressure"]
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!([
            {"id": "Room:1", "type": "Room",
             "pressure": {"type": "Integer", "value": 720},
             "temperature": {"type": "Number", "value": 22.0},
             "dateModified": {"type": "DateTime", "value": i2}},
            {"id": "Car:1", "type": "Car",
             "temperature": {"type": "Number", "value": 6.0},
             "dateModified": {"type": "DateTime", "value": i2}}
        ])
    );
    let (status, body) =
        query(json!({"entities": [{"id": "Room:9", "type": "Room"}], "attrs": []})).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"error": "Not Found", "description": "No records were found for such query."})
    );
    for (request, message) in [
        (
            json!({"entities": [{"id": "Room:1"}], "attrs": []}),
            "Entity type is required",
        ),
        (
            json!({"entities": [{"type": "Room"}], "attrs": []}),
            "Entity id is required",
        ),
        (
            json!({"entities": [{"id": ".*", "type": "Room", "idPattern": "True"}], "attrs": []}),
            "idPattern is Not Supported",
        ),
        (
            json!({"entities": [{"id": "Room:1", "type": "Room"}], "attrs": [], "expression": {"q": "a>1"}}),
            "expression is Not Supported",
        ),
    ] {
        let (status, body) = query(request).await;
        assert_eq!((status, body), (400, json!(message)));
    }
    let (status, body) = query(json!({"attrs": ["x"]})).await;
    assert_eq!(
        (status, body),
        (400, problem("'entities' is a required property"))
    );
    // QuantumLeap's schema requires `attrs` too, and of several breaches
    // refuses the one nearest the top.
    for (request, detail) in [
        (json!({"entities": "x"}), "'attrs' is a required property"),
        (
            json!({"entities": [], "attrs": null}),
            "None is not of type 'array' - 'attrs'",
        ),
        (
            json!({"entities": [1], "attrs": [2]}),
            "1 is not of type 'object' - 'entities.0'",
        ),
        (
            json!({"entities": [{"id": 1, "type": "Room"}], "attrs": ["a"]}),
            "1 is not of type 'string' - 'entities.0.id'",
        ),
    ] {
        let (status, body) = query(request).await;
        assert_eq!((status, body), (400, problem(detail)));
    }
    // The latest record of the entity, whichever attributes it holds: an
    // attribute asked that it lacks is null there.
    let only_pressure = json!({"id": "Room:2", "type": "Room",
        "TimeInstant": {"type": "DateTime", "value": at(3, 0)},
        "pressure": {"type": "Integer", "value": 730}});
    let (status, _) = notify(&c, None, vec![only_pressure]).await;
    assert_eq!(status, 200);
    let (status, body) = query(json!({
        "entities": [{"id": "Room:2", "type": "Room"}], "attrs": ["temperature"]
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body[0]["temperature"],
        json!({"type": "Number", "value": null})
    );
}

/// QuantumLeap's request validation's answer: a problem JSON.
fn problem(detail: &str) -> Value {
    json!({"detail": detail, "status": 400, "title": "Bad Request", "type": "about:blank"})
}

/// Retention per tenant: with `downsample_after`, rows leave but the
/// per-minute/hour aggregates stay and still answer; with `retention` the
/// rows leave too (the aggregates once their whole hour is past it, see
/// the store's tests); rows already past the horizon when they arrive are
/// not stored.
#[tokio::test]
async fn retention_downsamples_and_expires_per_tenant() {
    let server = Server::start_with_env(&[
        ("WEFT_HISTORY__DOWNSAMPLE_AFTER", "3s"),
        ("WEFT_HISTORY__RETENTION_INTERVAL", "100ms"),
        ("WEFT_HISTORY__TENANTS__GONE__RETENTION", "3s"),
    ]);
    let c = server.client();
    let now = weft_model::now_ms();
    let values = [10.0, 13.0, 20.0];
    for tenant in [None, Some("gone")] {
        for (i, v) in values.iter().enumerate() {
            let time = iso(now - 1_000 - i as i64);
            let (status, _) = notify(&c, tenant, vec![room("Room:1", &time, *v, 1)]).await;
            assert_eq!(status, 200);
        }
        // An hour old on arrival: past both horizons, never stored.
        let (status, _) = notify(
            &c,
            tenant,
            vec![room("Room:1", &iso(now - 3_600_000), 99.0, 1)],
        )
        .await;
        assert_eq!(status, 200);
    }
    let raw = "/ql/v2/entities/Room:1/attrs/temperature";
    let avg = "/ql/v2/entities/Room:1/attrs/temperature?aggrMethod=avg";
    let count = "/ql/v2/entities/Room:1/attrs/temperature?aggrMethod=count&aggrPeriod=minute";
    for tenant in [None, Some("gone")] {
        let (_, body) = get(&c, tenant, raw).await;
        assert_eq!(body["values"], json!([20.0, 13.0, 10.0]), "{tenant:?}");
        let (_, body) = get(&c, tenant, avg).await;
        assert_eq!(body["values"], json!([43.0 / 3.0]), "{tenant:?}");
    }
    // Wait for the rows to pass their horizon and be expired.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (kept_status, kept) = get(&c, None, raw).await;
        let (gone_status, gone) = get(&c, Some("gone"), raw).await;
        if kept_status == 404 && gone_status == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not expired: {kept} {gone}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Downsampled: the aggregates still answer, from the rollups.
    let (status, body) = get(&c, None, avg).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["values"], json!([43.0 / 3.0]));
    let (_, body) = get(&c, None, count).await;
    let total: f64 = body["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert_eq!(total, 3.0);
}

/// Geo parameters keep the values recorded while the entity's `location`
/// matched (QuantumLeap filters each stored state by its location); `lastN`
/// applies to what matched; a half-given geo query is 400.
#[tokio::test]
async fn geo_parameters_filter_by_the_location_at_each_time() {
    let server = Server::start();
    let c = server.client();
    // Madrid, Madrid, Barcelona, Madrid.
    let places = [
        (-3.70, 40.42),
        (-3.71, 40.41),
        (2.17, 41.39),
        (-3.69, 40.43),
    ];
    for (i, (lon, lat)) in places.iter().enumerate() {
        let mut e = room("Bus:1", &at(3, i as u32), 10.0 + i as f64, 1);
        e["type"] = json!("Bus");
        e["location"] = json!({"type": "geo:json",
                               "value": {"type": "Point", "coordinates": [lon, lat]}});
        let (status, _) = notify(&c, None, vec![e]).await;
        assert_eq!(status, 200);
    }
    let near_madrid = "georel=near;maxDistance:20000&geometry=point&coords=40.4168,-3.7038";
    let (status, body) = get(
        &c,
        None,
        &format!("/ql/v2/entities/Bus:1/attrs/temperature?{near_madrid}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["values"], json!([10.0, 11.0, 13.0]));
    let (_, body) = get(
        &c,
        None,
        &format!("/ql/v2/entities/Bus:1/attrs/temperature?lastN=2&{near_madrid}"),
    )
    .await;
    assert_eq!(body["values"], json!([11.0, 13.0]));
    let in_catalonia = "georel=coveredBy&geometry=box&coords=40.5,0.1;42.9,3.4";
    let (_, body) = get(&c, None, &format!("/ql/v2/types/Bus?{in_catalonia}")).await;
    let attrs = &body["entities"][0]["attributes"];
    let temperature = attrs
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["attrName"] == "temperature")
        .unwrap();
    assert_eq!(temperature["values"], json!([12.0]));
    let (status, _) = get(
        &c,
        None,
        "/ql/v2/entities/Bus:1/attrs/temperature?geometry=point&coords=40.4,-3.7",
    )
    .await;
    assert_eq!(status, 400, "georel missing");
}

/// A QuantumLeap delete request, with the tenant's service path.
async fn delete(c: &Client, path: &str, service_path: Option<&str>) -> (u16, Value) {
    let mut req = c.http.delete(format!("{}{}", c.url, path));
    if let Some(p) = service_path {
        req = req.header("Fiware-ServicePath", p);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The temperatures of `id` that the history still holds.
async fn temperatures(c: &Client, id: &str) -> Vec<f64> {
    let (status, body) = get(
        c,
        None,
        &format!("/ql/v2/entities/{id}/attrs/temperature/value"),
    )
    .await;
    if status == 404 {
        return Vec::new();
    }
    assert_eq!(status, 200, "{body}");
    body["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

/// `fromDate` and `toDate` bound a delete as they bound a query, both
/// inclusive (QuantumLeap's `time_index >= fromDate AND time_index <=
/// toDate`): the rows outside the range, and other entities, survive; a
/// delete under another service path, or of a range holding nothing, is a
/// 404; a malformed date is QuantumLeap's 422 naming the parameters and deletes
/// nothing.
#[tokio::test]
async fn a_delete_with_a_range_removes_only_that_range() {
    let server = Server::start();
    let c = server.client();
    for second in 0..6 {
        let (status, body) = notify(
            &c,
            None,
            vec![
                room("Room:1", &at(5, second), second as f64, 700),
                room("Room:2", &at(5, second), 100.0 + second as f64, 700),
            ],
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let all = vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
    assert_eq!(temperatures(&c, "Room:1").await, all);

    // Malformed dates: QuantumLeap's 422 naming the parameters, nothing
    // deleted.
    for (path, param) in [
        ("/ql/v2/entities/Room:1?fromDate=yesterday", "fromDate"),
        (
            &format!(
                "/ql/v2/entities/Room:1?fromDate={}&toDate=2026-13-45",
                at(5, 1)
            ) as &str,
            "toDate",
        ),
        ("/ql/v2/types/Room?toDate=not-a-date", "toDate"),
    ] {
        let (status, body) = delete(&c, path, None).await;
        assert_eq!(status, 422, "{path}: {body}");
        let text = body.to_string();
        assert!(text.contains(param), "{path}: {body}");
    }
    assert_eq!(temperatures(&c, "Room:1").await, all);
    assert_eq!(
        temperatures(&c, "Room:2").await,
        vec![100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    );

    // Seconds 1 to 3, both bounds included.
    let (status, body) = delete(
        &c,
        &format!(
            "/ql/v2/entities/Room:1?type=Room&fromDate={}&toDate={}",
            at(5, 1),
            at(5, 3)
        ),
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(temperatures(&c, "Room:1").await, vec![0.0, 4.0, 5.0]);
    assert_eq!(
        temperatures(&c, "Room:2").await,
        vec![100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    );
    // The same range again holds nothing: 404.
    let (status, _) = delete(
        &c,
        &format!(
            "/ql/v2/entities/Room:1?fromDate={}&toDate={}",
            at(5, 1),
            at(5, 3)
        ),
        None,
    )
    .await;
    assert_eq!(status, 404);
    // Another service path holds none of these rooms: 404, nothing gone.
    let (status, _) = delete(
        &c,
        &format!("/ql/v2/types/Room?toDate={}", at(5, 4)),
        Some("/elsewhere"),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(temperatures(&c, "Room:1").await, vec![0.0, 4.0, 5.0]);

    // The type, up to second 4 (inclusive): both rooms lose those rows.
    let (status, body) = delete(
        &c,
        &format!("/ql/v2/types/Room?toDate={}", at(5, 4)),
        Some("/"),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(temperatures(&c, "Room:1").await, vec![5.0]);
    assert_eq!(temperatures(&c, "Room:2").await, vec![105.0]);
    // The aggregate agrees with what is left.
    let (status, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:2/attrs/temperature/value?aggrMethod=count&aggrPeriod=hour",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["values"], json!([1]));

    // No range: the whole history of the type.
    let (status, _) = delete(&c, "/ql/v2/types/Room", None).await;
    assert_eq!(status, 204);
    assert!(temperatures(&c, "Room:1").await.is_empty());
}

/// A request with extra headers: status, content type and JSON body.
async fn send(
    c: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, String, Value) {
    let mut req = c
        .http
        .request(method.parse().unwrap(), format!("{}{path}", c.url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    (
        status,
        content_type,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// QuantumLeap's load script against weft: 30 clients posting 3,000
/// notifications of one entity without a time index of their own, so
/// many arrive in the same millisecond. QuantumLeap stores one row per
/// notification; so must weft: every value sent comes back.
#[tokio::test]
async fn every_concurrent_notification_of_one_entity_is_a_row() {
    // The load, not the key's rate limit, is what is tested.
    let server = Server::start_with_env(&[("WEFT_HTTP__RATE_LIMIT", "0")]);
    let c = server.client();
    const CLIENTS: u32 = 30;
    const EACH: u32 = 100;
    let mut tasks = Vec::new();
    for w in 0..CLIENTS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let n = w * EACH + i;
                let e = json!({"id": "Room:1", "type": "Room",
                               "temperature": {"value": 23.3, "type": "Number"},
                               "pressure": {"value": n, "type": "Integer"}});
                let (status, body) = notify(&c, None, vec![e]).await;
                assert_eq!(status, 200, "{body}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (status, body) = get(&c, None, "/ql/v2/entities/Room:1/attrs/pressure").await;
    assert_eq!(status, 200, "{body}");
    let mut got: Vec<u64> = body["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(body["index"].as_array().unwrap().len(), got.len());
    got.sort_unstable();
    let sent: Vec<u64> = (0..u64::from(CLIENTS * EACH)).collect();
    assert_eq!(got.len(), sent.len(), "one row per notification");
    assert_eq!(got, sent);
    // A replayed notification is a row of its own too, as in QuantumLeap.
    let e = room("Room:2", &at(1, 0), 20.0, 1);
    notify(&c, None, vec![e.clone()]).await;
    notify(&c, None, vec![e]).await;
    let (_, body) = get(&c, None, "/ql/v2/entities/Room:2/attrs/temperature/value").await;
    assert_eq!(body["values"], json!([20.0, 20.0]));
}

/// Every query endpoint answers QuantumLeap 1.0's shape (`entityId`,
/// `entityType`, `values` in the type-wide value endpoints) and, where
/// nothing matches, its 404; the meta endpoints answer at QuantumLeap's
/// root under `/ql`, and `/ql/v2/notify` is QuantumLeap's notify.
#[tokio::test]
async fn every_endpoint_answers_quantumleap_1_0_shapes() {
    let server = Server::start();
    let c = server.client();
    let (status, _, body) = send(
        &c,
        "POST",
        "/ql/v2/notify",
        &[("Fiware-Service", "shapes")],
        Some(json!({"data": [
            room("Room:1", &at(1, 0), 20.0, 700),
            room("Room:2", &at(1, 1), 21.0, 710),
        ]})),
    )
    .await;
    assert_eq!(
        (status, body),
        (200, json!("Notification successfully processed"))
    );
    notify(
        &c,
        Some("shapes"),
        vec![room("Room:1", &at(2, 0), 22.0, 720)],
    )
    .await;
    let t = |m: u32, s: u32| at(m, s).replace('Z', "+00:00");
    let ok = |path: &'static str| {
        let c = c.clone();
        async move {
            let (status, body) = get(&c, Some("shapes"), path).await;
            assert_eq!(status, 200, "{path}: {body}");
            body
        }
    };
    let attributes = |pressure: Value, temperature: Value, times: Value| {
        json!([
            {"attrName": "TimeInstant", "values": times},
            {"attrName": "pressure", "values": pressure},
            {"attrName": "temperature", "values": temperature},
        ])
    };
    let room1 = attributes(
        json!([700, 720]),
        json!([20.0, 22.0]),
        json!([t(1, 0), t(2, 0)]),
    );
    let room2 = attributes(json!([710]), json!([21.0]), json!([t(1, 1)]));
    assert_eq!(
        ok("/ql/v2/entities").await,
        json!([
            {"entityId": "Room:1", "entityType": "Room", "index": t(2, 0)},
            {"entityId": "Room:2", "entityType": "Room", "index": t(1, 1)},
        ])
    );
    assert_eq!(
        ok("/ql/v2/entities/Room:1").await,
        json!({"entityId": "Room:1", "entityType": "Room",
               "index": [t(1, 0), t(2, 0)], "attributes": room1})
    );
    assert_eq!(
        ok("/ql/v2/entities/Room:1/value").await,
        json!({"index": [t(1, 0), t(2, 0)], "attributes": room1})
    );
    assert_eq!(
        ok("/ql/v2/entities/Room:1/attrs/temperature").await,
        json!({"entityId": "Room:1", "entityType": "Room", "attrName": "temperature",
               "index": [t(1, 0), t(2, 0)], "values": [20.0, 22.0]})
    );
    assert_eq!(
        ok("/ql/v2/entities/Room:1/attrs/temperature/value").await,
        json!({"index": [t(1, 0), t(2, 0)], "values": [20.0, 22.0]})
    );
    let entities = json!([
        {"entityId": "Room:1", "index": [t(1, 0), t(2, 0)], "attributes": room1},
        {"entityId": "Room:2", "index": [t(1, 1)], "attributes": room2},
    ]);
    assert_eq!(
        ok("/ql/v2/types/Room").await,
        json!({"entityType": "Room", "entities": entities})
    );
    assert_eq!(
        ok("/ql/v2/types/Room/value").await,
        json!({"values": entities})
    );
    let temperatures = json!([
        {"entityId": "Room:1", "index": [t(1, 0), t(2, 0)], "values": [20.0, 22.0]},
        {"entityId": "Room:2", "index": [t(1, 1)], "values": [21.0]},
    ]);
    assert_eq!(
        ok("/ql/v2/types/Room/attrs/temperature").await,
        json!({"entityType": "Room", "attrName": "temperature", "entities": temperatures})
    );
    assert_eq!(
        ok("/ql/v2/types/Room/attrs/temperature/value").await,
        json!({"values": temperatures})
    );
    let types = json!([{"entityType": "Room", "entities": temperatures}]);
    assert_eq!(
        ok("/ql/v2/attrs/temperature").await,
        json!({"attrName": "temperature", "types": types})
    );
    assert_eq!(
        ok("/ql/v2/attrs/temperature/value").await,
        json!({"values": types})
    );
    assert_eq!(
        ok("/ql/v2/attrs?attrs=temperature").await,
        json!({"attrs": [{"attrName": "temperature", "types": types}]})
    );
    assert_eq!(
        ok("/ql/v2/attrs/value?attrs=temperature").await,
        json!({"values": [{"attrName": "temperature", "types": types}]})
    );
    // One aggregate over the whole range: QuantumLeap's indexes.
    assert_eq!(
        ok("/ql/v2/entities/Room:1/attrs/temperature?aggrMethod=max").await["index"],
        json!([])
    );
    assert_eq!(
        ok("/ql/v2/types/Room?aggrMethod=avg&attrs=temperature").await["entities"][0]["index"],
        json!(["", ""])
    );

    // Nothing there: QuantumLeap 1.0's 404 from every query endpoint.
    for path in [
        "/ql/v2/entities",
        "/ql/v2/entities/Room:1",
        "/ql/v2/entities/Room:1/value",
        "/ql/v2/entities/Room:1/attrs/temperature",
        "/ql/v2/entities/Room:1/attrs/temperature/value",
        "/ql/v2/types/Room",
        "/ql/v2/types/Room/value",
        "/ql/v2/types/Room/attrs/temperature",
        "/ql/v2/types/Room/attrs/temperature/value",
        "/ql/v2/attrs",
        "/ql/v2/attrs/value",
        "/ql/v2/attrs/temperature",
        "/ql/v2/attrs/temperature/value",
    ] {
        let (status, body) = get(&c, Some("empty"), path).await;
        assert_eq!((status, body), (404, no_records()), "{path}");
    }
    for path in [
        "/ql/v2/entities/Room:1?type=Car",
        "/ql/v2/entities/Room:9/attrs/temperature",
        "/ql/v2/entities/Room:1/attrs/nothing",
        "/ql/v2/types/Room?offset=3",
    ] {
        let (status, body) = get(&c, Some("shapes"), path).await;
        assert_eq!((status, body), (404, no_records()), "{path}");
    }

    // The meta endpoints, at QuantumLeap's root.
    let (status, _, body) = send(&c, "GET", "/ql/version", &[], None).await;
    assert_eq!((status, body), (200, json!({"version": "1.0.0"})));
    let (status, _, body) = send(&c, "GET", "/ql/health", &[], None).await;
    assert_eq!((status, body), (200, json!({"status": "pass"})));
    let (status, _, body) = send(&c, "GET", "/ql/v2/", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(body["notify_url"], "/v2/notify");
    assert_eq!(body["attributes_url"], "/v2/attrs");
    let (status, _, body) = send(&c, "POST", "/ql/management/config", &[], None).await;
    assert_eq!(
        (status, body),
        (
            501,
            json!({"error": "Not Implemented", "description": "This API method is not yet implemented."})
        )
    );
    let (status, content_type, body) = send(&c, "POST", "/ql/v2/subscribe", &[], None).await;
    assert_eq!(
        (status, content_type.as_str()),
        (404, "application/problem+json")
    );
    assert_eq!(body["status"], 404);
}

/// `lastN`, `limit` and `offset` count the rows of a whole type on the
/// type-wide endpoints (QuantumLeap's one table per type), of one entity
/// on the entity endpoints; paging past the end is a 404, which is how
/// clients know to stop.
#[tokio::test]
async fn limits_count_the_rows_of_a_type() {
    let server = Server::start();
    let c = server.client();
    // Room:1 at even seconds, Room:2 at odd ones.
    for second in 0..6u32 {
        let id = if second % 2 == 0 { "Room:1" } else { "Room:2" };
        let (status, _) = notify(
            &c,
            None,
            vec![room(id, &at(1, second), f64::from(second), 1)],
        )
        .await;
        assert_eq!(status, 200);
    }
    let temperatures = |body: &Value| -> Vec<(String, Vec<f64>)> {
        body["entities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let values = e["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                (e["entityId"].as_str().unwrap().to_string(), values)
            })
            .collect()
    };
    let of_type = |query: &'static str| {
        let c = c.clone();
        async move {
            let (status, body) = get(
                &c,
                None,
                &format!("/ql/v2/types/Room/attrs/temperature?{query}"),
            )
            .await;
            assert_eq!(status, 200, "{query}: {body}");
            temperatures(&body)
        }
    };
    let pair = |a: &[f64], b: &[f64]| {
        vec![
            ("Room:1".to_string(), a.to_vec()),
            ("Room:2".to_string(), b.to_vec()),
        ]
    };
    assert_eq!(of_type("lastN=2").await, pair(&[4.0], &[5.0]));
    assert_eq!(of_type("limit=3").await, pair(&[0.0, 2.0], &[1.0]));
    assert_eq!(of_type("limit=2&offset=2").await, pair(&[2.0], &[3.0]));
    assert_eq!(of_type("lastN=2&offset=1").await, pair(&[4.0], &[3.0]));
    // On an entity, its own rows.
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature/value?lastN=2",
    )
    .await;
    assert_eq!(body["values"], json!([2.0, 4.0]));
    let (_, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature/value?lastN=1&offset=1",
    )
    .await;
    assert_eq!(body["values"], json!([2.0]), "offset skips the newest");
    // A client paging with offset stops at the 404.
    let (status, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?offset=3&limit=10",
    )
    .await;
    assert_eq!((status, body), (404, no_records()));
}

/// Bad parameters get QuantumLeap's answers, each its own status and
/// body, and change nothing.
#[tokio::test]
async fn bad_parameters_get_quantumleaps_answers() {
    let server = Server::start();
    let c = server.client();
    notify(&c, None, vec![room("Room:1", &at(1, 0), 20.0, 1)]).await;
    let mut car = room("Room:1", &at(1, 0), 5.0, 1);
    car["type"] = json!("Car");
    notify(&c, None, vec![car]).await;
    let bad = |msg: &str| json!({"error": "Bad parameters use", "description": msg});
    let not_implemented = json!({"error": "Not implemented option",
                                 "description": "aggrScope and options are not yet implemented."});
    for (path, status, body) in [
        (
            "/ql/v2/types/Room/attrs/temperature?aggrPeriod=day",
            400,
            bad("aggrMethod is compulsory when using aggrPeriod."),
        ),
        (
            "/ql/v2/types/Room?aggrMethod=sum",
            400,
            bad("Specified aggrMethod = sum but missing attrs parameter."),
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?options=keyValues",
            501,
            not_implemented.clone(),
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?aggrScope=global&aggrMethod=sum",
            501,
            not_implemented,
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?fromDate=someday",
            422,
            json!({"error": "<class 'exceptions.exceptions.InvalidParameterValue'>",
                   "description": "The parameter value 'someday' for parameter **fromDate** or **toDate** is not valid."}),
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?georel=near;maxDistance:10&geometry=point",
            400,
            json!({"error": "ValueError", "description": "Invalid geographical query parameters"}),
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?georel=equals&geometry=point&coords=1,2",
            422,
            json!({"error": "NotSupportedQuery", "description": "This geographical query is not supported"}),
        ),
        (
            "/ql/v2/types/Room/attrs/temperature?aggrMethod=avg&attrs=x&aggrPeriod=hour&limit=1&offset=0&aggrScope=entity&type=Room",
            200,
            Value::Null,
        ),
        (
            "/ql/v2/entities/Room:1/attrs/temperature",
            400,
            json!({"error": "<class 'exceptions.exceptions.AmbiguousNGSIIdError'>",
                   "description": "There are multiple entities with the given entity_id Room:1. Please specify entity_type."}),
        ),
    ] {
        let (got_status, got) = get(&c, None, path).await;
        assert_eq!(got_status, status, "{path}: {got}");
        if !body.is_null() {
            assert_eq!(got, body, "{path}");
        }
    }
    for path in [
        "/ql/v2/types/Room?lastN=0",
        "/ql/v2/types/Room?limit=many",
        "/ql/v2/types/Room?offset=-1",
        "/ql/v2/types/Room?aggrMethod=median&attrs=temperature",
    ] {
        let (status, content_type, body) = send(&c, "GET", path, &[], None).await;
        assert_eq!(
            (status, content_type.as_str()),
            (400, "application/problem+json"),
            "{path}"
        );
        assert_eq!(body["status"], 400, "{path}");
    }
    // A numeric aggregate over text.
    let (status, body) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/TimeInstant?type=Room&aggrMethod=avg",
    )
    .await;
    assert_eq!(
        (status, body),
        (
            404,
            json!({"error": "AggrMethod cannot be applied",
                   "description": "AggrMethod cannot be applied on type TEXT and BOOLEAN."})
        )
    );
    // Deletes: an id of two types needs `type`; dropTable needs the root
    // service path; nothing was deleted by any of these.
    let (status, body) = delete(&c, "/ql/v2/entities/Room:1", None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "AmbiguousNGSIIdError");
    let (status, body) = delete(&c, "/ql/v2/types/Room?dropTable=true", Some("/a")).await;
    assert_eq!(
        (status, body),
        (
            422,
            json!("dropTable requires the root fiware-servicepath: '/'")
        )
    );
    let (status, _) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?type=Room",
    )
    .await;
    assert_eq!(status, 200, "still there");
    let (status, _) = delete(&c, "/ql/v2/types/Room?dropTable=true", None).await;
    assert_eq!(status, 204);
    let (status, _) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?type=Room",
    )
    .await;
    assert_eq!(status, 404, "dropped");
    let (status, _) = get(
        &c,
        None,
        "/ql/v2/entities/Room:1/attrs/temperature?type=Car",
    )
    .await;
    assert_eq!(status, 200, "other types stay");
}

/// `history.quantumleap_master` answers as QuantumLeap's unreleased
/// master: `id`/`type` instead of `entityId`/`entityType`, 200 `[]` where
/// 1.0.0 answers 404.
#[tokio::test]
async fn the_master_variant_names_entities_id_and_type() {
    let server = Server::start_with_env(&[("WEFT_HISTORY__QUANTUMLEAP_MASTER", "true")]);
    let c = server.client();
    notify(&c, None, vec![room("Room:1", &at(1, 0), 20.0, 700)]).await;
    let (status, body) = get(&c, None, "/ql/v2/entities/Room:1/attrs/temperature").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"id": "Room:1", "type": "Room", "attrName": "temperature",
               "index": [at(1, 0).replace('Z', "+00:00")], "values": [20.0]})
    );
    let (_, body) = get(&c, None, "/ql/v2/types/Room/attrs/temperature/value").await;
    assert_eq!(body["values"][0]["id"], "Room:1");
    let (_, body) = get(&c, None, "/ql/v2/entities").await;
    assert_eq!(body[0]["id"], "Room:1");
    assert_eq!(body[0]["type"], "Room");
    for path in [
        "/ql/v2/entities/Room:9/attrs/temperature",
        "/ql/v2/types/Car",
        "/ql/v2/attrs/nothing",
    ] {
        let (status, body) = get(&c, None, path).await;
        assert_eq!((status, body), (200, json!([])), "{path}");
    }
    let (status, body) = delete(&c, "/ql/v2/entities/Room:9", None).await;
    assert_eq!((status, body), (200, json!([])));
}

/// QuantumLeap keeps the service path of every record: a query under a
/// path answers the records notified under it, whatever path the entity
/// was first recorded under.
#[tokio::test]
async fn the_service_path_filters_each_record() {
    let server = Server::start();
    let c = server.client();
    for (path, minute, temperature) in [("/a", 0, 20.0), ("/b", 1, 21.0)] {
        let resp = c
            .http
            .post(format!("{}/v2/notify", c.url))
            .header("Fiware-ServicePath", path)
            .json(&json!({"data": [room("Room:p", &at(minute, 0), temperature, 700)]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    let values = |path: Option<&'static str>| {
        let c = c.clone();
        async move {
            let mut req = c.http.get(format!(
                "{}/ql/v2/entities/Room:p/attrs/temperature/value",
                c.url
            ));
            if let Some(p) = path {
                req = req.header("Fiware-ServicePath", p);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            (status, body["values"].clone())
        }
    };
    assert_eq!(values(Some("/a")).await, (200, json!([20.0])));
    assert_eq!(values(Some("/b")).await, (200, json!([21.0])));
    assert_eq!(values(None).await, (200, json!([20.0, 21.0])));
    assert_eq!(values(Some("/c")).await.0, 404);
}
