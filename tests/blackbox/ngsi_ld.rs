//! NGSI-LD (`/ngsi-ld/v1`, ETSI GS CIM 009) over the same entities as
//! `/v2`, section by section of the specification: entities created,
//! retrieved, queried and deleted (5.6.1, 5.7.1, 5.7.2, 5.6.6), their
//! attributes appended, updated and deleted (5.6.2–5.6.5), `@context`s
//! from a `Link` header, from the body and fetched from a server (5.5.7,
//! 6.3.5), the representations (normalized, concise, keyValues,
//! sysAttrs), tenants (`NGSILD-Tenant`), and problem details for what is
//! refused (5.5.2). The same entity is read through both APIs.

use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::util::*;

const LD: &str = "application/ld+json";
const CONTEXT_REL: &str = "http://www.w3.org/ns/json-ld#context";
const CORE: &str = "https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context-v1.8.jsonld";

/// One NGSI-LD call: `body` sent as `content_type`, extra `headers`;
/// status, headers and the JSON answer (`Null` when empty).
async fn ld(
    c: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, &Value)>,
) -> (u16, HeaderMap, Value) {
    call_as(c, method, path, headers, body).await
}

/// A `Link` header naming `url` as the JSON-LD context.
fn link(url: &str) -> String {
    format!("<{url}>; rel=\"{CONTEXT_REL}\"; type=\"{LD}\"")
}

fn vehicle() -> Value {
    json!({
        "id": "urn:ngsi-ld:Vehicle:A4567",
        "type": "Vehicle",
        "brandName": {"type": "Property", "value": "Mercedes"},
        "speed": {"type": "Property", "value": 55, "observedAt": "2018-08-07T12:00:00.000Z",
                  "unitCode": "KMH"},
        "isParked": {"type": "Relationship", "object": "urn:ngsi-ld:OffStreetParking:Downtown1",
                     "providedBy": {"type": "Relationship", "object": "urn:ngsi-ld:Person:Bob"}},
        "location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [-8.5, 41.2]}}
    })
}

/// 5.6.1 and 5.7.1: an entity created as JSON reads back as it was sent,
/// with a `Link` header naming the core context; as JSON-LD it carries
/// its `@context`; 409 for a second creation.
#[tokio::test]
async fn an_entity_created_reads_back_as_sent() {
    let server = Server::start();
    let c = server.client();
    let e = vehicle();
    let (status, headers, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &e)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        headers["location"],
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567"
    );

    let (status, headers, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got, e);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["link"].to_str().unwrap(), link(CORE));

    let (_, headers, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[("accept", LD)],
        None,
    )
    .await;
    assert_eq!(headers["content-type"], LD);
    assert_eq!(got["@context"], json!(CORE));
    assert_eq!(got["speed"], e["speed"]);

    let (status, _, problem) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &e)),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        problem["type"],
        "https://uri.etsi.org/ngsi-ld/errors/AlreadyExists"
    );
    assert!(problem["title"].is_string() && problem["detail"].is_string());
}

/// The same entity through both APIs: created through NGSI-LD, NGSIv2
/// sees its attributes (Relationship and observedAt as NGSIv2 clients
/// write them); created through NGSIv2, NGSI-LD sees Properties and
/// Relationships.
#[tokio::test]
async fn one_entity_two_apis() {
    let server = Server::start();
    let c = server.client();
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &vehicle())),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _, v2) = call(
        &c,
        "GET",
        "/v2/entities?id=urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    let v2 = &v2[0];
    assert_eq!(v2["type"], "Vehicle");
    assert_eq!(v2["speed"]["value"], 55);
    assert_eq!(
        v2["speed"]["metadata"]["observedAt"]["value"],
        "2018-08-07T12:00:00.000Z"
    );
    assert_eq!(v2["speed"]["metadata"]["unitCode"]["value"], "KMH");
    assert_eq!(v2["isParked"]["type"], "Relationship");
    assert_eq!(
        v2["isParked"]["value"],
        "urn:ngsi-ld:OffStreetParking:Downtown1"
    );

    let room = json!({"id": "urn:ngsi-ld:Room:1", "type": "Room",
        "temperature": {"type": "Number", "value": 21.5,
                        "metadata": {"accuracy": {"type": "Number", "value": 0.1}}},
        "refBuilding": {"type": "Relationship", "value": "urn:ngsi-ld:Building:1"}});
    let (status, _, _) = call(&c, "POST", "/v2/entities", &[], Some(&room)).await;
    assert_eq!(status, 201);
    // NGSI-LD names an entity by its id alone: another type is no new one.
    let office = json!({"id": "urn:ngsi-ld:Room:1", "type": "Office"});
    let (status, _, problem) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &office)),
    )
    .await;
    assert_eq!(status, 409, "{problem}");
    let (status, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Room:1",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        got,
        json!({"id": "urn:ngsi-ld:Room:1", "type": "Room",
            "temperature": {"type": "Property", "value": 21.5,
                            "accuracy": {"type": "Property", "value": 0.1}},
            "refBuilding": {"type": "Relationship", "object": "urn:ngsi-ld:Building:1"}})
    );
}

/// The representations of 4.5: keyValues, concise, and sysAttrs with
/// the creation and modification times.
#[tokio::test]
async fn representations() {
    let server = Server::start();
    let c = server.client();
    ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &vehicle())),
    )
    .await;
    let path = "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567";
    let (_, _, kv) = ld(&c, "GET", &format!("{path}?options=keyValues"), &[], None).await;
    assert_eq!(kv["speed"], 55);
    assert_eq!(kv["isParked"], "urn:ngsi-ld:OffStreetParking:Downtown1");
    assert_eq!(
        kv["location"],
        json!({"type": "Point", "coordinates": [-8.5, 41.2]})
    );
    let (_, _, concise) = ld(&c, "GET", &format!("{path}?options=concise"), &[], None).await;
    assert_eq!(concise["brandName"], "Mercedes");
    assert_eq!(
        concise["speed"],
        json!({"value": 55, "observedAt": "2018-08-07T12:00:00.000Z", "unitCode": "KMH"})
    );
    assert_eq!(
        concise["location"],
        json!({"type": "Point", "coordinates": [-8.5, 41.2]})
    );
    // What concise gives, creation reads as the normalized form.
    let mut again = concise.clone();
    again["id"] = json!("urn:ngsi-ld:Vehicle:B1");
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &again)),
    )
    .await;
    assert_eq!(status, 201);
    let (_, _, b1) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:B1",
        &[],
        None,
    )
    .await;
    let mut expected = vehicle();
    expected["id"] = json!("urn:ngsi-ld:Vehicle:B1");
    assert_eq!(b1, expected);

    let (_, _, sys) = ld(
        &c,
        "GET",
        &format!("{path}?options=sysAttrs&attrs=speed"),
        &[],
        None,
    )
    .await;
    assert!(sys["createdAt"].as_str().unwrap().ends_with('Z'));
    assert!(sys["speed"]["modifiedAt"].as_str().unwrap().ends_with('Z'));
    assert!(
        sys.get("brandName").is_none(),
        "attrs=speed shows speed only: {sys}"
    );
}

/// 5.13.2–5.13.5: a context given to weft to host is served at its
/// `Location`, names terms when a `Link` names its URL (with any host),
/// and is kept across a restart, as is a context fetched once, which then
/// reads while its server is gone; a cached one is fetched again with
/// `reload=true`; documents without terms are refused.
#[tokio::test]
async fn hosted_and_fetched_contexts_are_kept_across_a_restart() {
    let mut server = Server::start();
    let c = server.client();
    let doc =
        json!({"@context": {"Bike": "http://example.org/Bike", "gear": "http://example.org/gear"}});
    let (status, headers, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/jsonldContexts",
        &[],
        Some((LD, &doc)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let location = headers["location"].to_str().unwrap().to_string();
    assert!(
        location.starts_with("/ngsi-ld/v1/jsonldContexts/"),
        "{location}"
    );
    let (status, _, served) = ld(&c, "GET", &location, &[], None).await;
    assert_eq!((status, &served), (200, &doc));
    for bad in [
        json!({"gear": 1}),
        json!({"@context": "http://x.example/c.jsonld"}),
    ] {
        let (status, _, problem) = ld(
            &c,
            "POST",
            "/ngsi-ld/v1/jsonldContexts",
            &[],
            Some((LD, &bad)),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {problem}");
    }

    let mut host = Receiver::start().await;
    host.answer(
        200,
        &json!({"@context": {"cadence": "http://example.org/cadence"}}).to_string(),
    );
    let fetched = format!("{}/fetched.jsonld", host.base);
    let hosted = format!("http://weft.example{location}");
    let context = json!([hosted, fetched]);
    let bike = json!({"id": "urn:ngsi-ld:Bike:1", "type": "Bike", "gear": 3, "cadence": 80,
                      "@context": context});
    let (status, _, body) = ld(&c, "POST", "/ngsi-ld/v1/entities", &[], Some((LD, &bike))).await;
    assert_eq!(status, 201, "{body}");
    host.next().await;

    let (_, _, listed) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/jsonldContexts?details=true",
        &[],
        None,
    )
    .await;
    let kinds: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["Hosted", "Cached"], "{listed}");
    assert!(
        listed[0]["URL"].as_str().unwrap().ends_with(&location),
        "{listed}"
    );
    let (_, _, only) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/jsonldContexts?kind=Cached",
        &[],
        None,
    )
    .await;
    assert_eq!(only, json!([fetched]));

    // The context server gone, weft restarted: both still read.
    host.answer(503, "");
    server.restart();
    let c = server.client();
    let (status, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Bike:1?options=keyValues",
        &[("link", &link(&hosted))],
        None,
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["type"], "Bike");
    assert_eq!(got["gear"], 3);
    let (status, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Bike:1?options=keyValues",
        &[("link", &link(&fetched))],
        None,
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["cadence"], 80);
    assert!(host
        .next_within(std::time::Duration::from_millis(300))
        .await
        .is_none());

    // Reloaded: fetched again now, and refused while its server fails.
    let (_, _, listed) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/jsonldContexts?details=true&kind=Cached",
        &[],
        None,
    )
    .await;
    let cached = listed[0]["localId"].as_str().unwrap().to_string();
    let (status, _, problem) = ld(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/jsonldContexts/{cached}?reload=true"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 503, "{problem}");
    host.next().await;
    host.answer(
        200,
        &json!({"@context": {"cadence": "http://example.org/cadence"}}).to_string(),
    );
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/jsonldContexts/{cached}?reload=true"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    host.next().await;
    let hosted_id = location.rsplit('/').next().unwrap();
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/jsonldContexts/{hosted_id}?reload=true"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400, "a hosted context is not reloaded");
    let (status, _, _) = ld(&c, "DELETE", &location, &[], None).await;
    assert_eq!(status, 204);
    let (status, _, _) = ld(&c, "GET", &location, &[], None).await;
    assert_eq!(status, 404);
}

/// 5.5.7 and 6.3.5: a client's own context, given in a `Link` header,
/// in the body (JSON-LD), or fetched from where its URL points; its
/// terms name the entity's type and attributes, which other clients see
/// as full IRIs.
#[tokio::test]
async fn a_clients_context_names_its_terms() {
    let server = Server::start();
    let c = server.client();
    let mut host = Receiver::start().await;
    host.answer(
        200,
        &json!({"@context": {"Car": "http://example.org/Car", "speed": "http://example.org/speed"}}).to_string(),
    );
    let url = format!("{}/context.jsonld", host.base);
    let car = json!({"id": "urn:ngsi-ld:Car:1", "type": "Car", "speed": {"type": "Property", "value": 3}});
    let (status, _, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[("link", &link(&url))],
        Some(("application/json", &car)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(host.next().await.target, "/context.jsonld");

    // Read with the same context: the client's terms.
    let (_, headers, mine) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:1",
        &[("link", &link(&url))],
        None,
    )
    .await;
    assert_eq!(mine, car);
    assert_eq!(headers["link"].to_str().unwrap(), link(&url));
    // Fetched once: the second request did not go to the host.
    host.nothing_more().await;
    // Read with the core context alone: full IRIs.
    let (_, _, theirs) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:1",
        &[],
        None,
    )
    .await;
    assert_eq!(theirs["type"], "http://example.org/Car");
    assert_eq!(theirs["http://example.org/speed"]["value"], 3);
    // Queried by the client's type term.
    let (_, _, found) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Car",
        &[("link", &link(&url))],
        None,
    )
    .await;
    assert_eq!(found.as_array().unwrap().len(), 1);

    // A JSON-LD body carries its context inline.
    let inline = json!({"id": "urn:ngsi-ld:Car:2", "type": "Car", "speed": 4,
        "@context": [{"Car": "http://example.org/Car", "speed": "http://example.org/speed"}, CORE]});
    let (status, _, _) = ld(&c, "POST", "/ngsi-ld/v1/entities", &[], Some((LD, &inline))).await;
    assert_eq!(status, 201);
    let (_, _, two) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=http://example.org/Car&options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(two.as_array().unwrap().len(), 2);

    // The kept contexts, listed and served; forgotten, fetched again.
    let (_, _, urls) = ld(&c, "GET", "/ngsi-ld/v1/jsonldContexts", &[], None).await;
    assert_eq!(urls, json!([url]));
    let (_, _, details) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/jsonldContexts?details=true",
        &[],
        None,
    )
    .await;
    let local = details[0]["localId"]
        .as_str()
        .expect("a local id")
        .to_string();
    let (status, headers, doc) = ld(
        &c,
        "GET",
        &format!("/ngsi-ld/v1/jsonldContexts/{local}"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(doc["@context"]["speed"], "http://example.org/speed");
    let (_, _, core) = ld(&c, "GET", "/ngsi-ld/v1/jsonldContexts/core", &[], None).await;
    assert_eq!(core["@context"]["Property"], "ngsi-ld:Property");
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/jsonldContexts/{local}"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/jsonldContexts/{local}"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:1",
        &[("link", &link(&url))],
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        host.next().await.target,
        "/context.jsonld",
        "fetched again once forgotten"
    );

    // A context that cannot be fetched is 503 LdContextNotAvailable.
    host.answer(404, "");
    let (status, _, problem) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Car",
        &[("link", &link(&format!("{}/gone.jsonld", host.base)))],
        None,
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        problem["type"],
        "https://uri.etsi.org/ngsi-ld/errors/LdContextNotAvailable"
    );
}

/// 5.6.2–5.6.5: append (with `noOverwrite`), update, partial update and
/// delete of attributes; 207 reports what was not done.
#[tokio::test]
async fn attributes_appended_updated_and_deleted() {
    let server = Server::start();
    let c = server.client();
    ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &vehicle())),
    )
    .await;
    let attrs = "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567/attrs";
    let json_ct = "application/json";

    let (status, _, _) = ld(
        &c,
        "POST",
        attrs,
        &[],
        Some((
            json_ct,
            &json!({"color": {"type": "Property", "value": "red"}}),
        )),
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, report) = ld(
        &c,
        "POST",
        &format!("{attrs}?options=noOverwrite"),
        &[],
        Some((
            json_ct,
            &json!({"color": {"type": "Property", "value": "blue"}, "doors": 4}),
        )),
    )
    .await;
    assert_eq!(status, 207, "{report}");
    assert_eq!(report["updated"], json!(["doors"]));
    assert_eq!(report["notUpdated"][0]["attributeName"], "color");

    let (status, _, report) = ld(
        &c,
        "PATCH",
        attrs,
        &[],
        Some((
            json_ct,
            &json!({"speed": {"type": "Property", "value": 80}, "wings": 2}),
        )),
    )
    .await;
    // An attribute the entity lacks is appended (NGSI-LD 1.6 and later).
    assert_eq!(status, 204, "{report}");

    // A partial update changes what it names and keeps the rest.
    let (status, _, _) = ld(
        &c,
        "PATCH",
        &format!("{attrs}/speed"),
        &[],
        Some((json_ct, &json!({"observedAt": "2020-01-01T00:00:00Z"}))),
    )
    .await;
    assert_eq!(status, 204);
    // Replacing takes an attribute's name: not a keyword, not `scope`.
    for name in ["@invalid", "scope"] {
        let (status, _, _) = ld(
            &c,
            "PUT",
            &format!("{attrs}/{name}"),
            &[],
            Some((json_ct, &json!({"type": "Property", "value": 1}))),
        )
        .await;
        assert_eq!(status, 400, "{name}");
    }
    // It does not change what kind of attribute it is.
    let (status, _, _) = ld(
        &c,
        "PATCH",
        &format!("{attrs}/speed"),
        &[],
        Some((
            json_ct,
            &json!({"type": "Relationship", "object": "urn:ngsi-ld:X:1"}),
        )),
    )
    .await;
    assert_eq!(status, 400);
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(got["color"]["value"], "red");
    assert_eq!(got["doors"], json!({"type": "Property", "value": 4}));
    assert_eq!(got["wings"], json!({"type": "Property", "value": 2}));
    assert_eq!(got["speed"]["value"], 80);
    assert_eq!(got["speed"]["observedAt"], "2020-01-01T00:00:00Z");

    let (status, _, _) = ld(&c, "DELETE", &format!("{attrs}/color"), &[], None).await;
    assert_eq!(status, 204);
    let (status, _, problem) = ld(&c, "DELETE", &format!("{attrs}/color"), &[], None).await;
    assert_eq!(status, 404);
    assert_eq!(
        problem["type"],
        "https://uri.etsi.org/ngsi-ld/errors/ResourceNotFound"
    );
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:none/attrs",
        &[],
        Some((json_ct, &json!({"a": 1}))),
    )
    .await;
    assert_eq!(status, 404);

    let (status, _, _) = ld(
        &c,
        "DELETE",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = call(
        &c,
        "GET",
        "/v2/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404);
}

/// 5.7.2: queries by type, id, idPattern, attrs and q; paging and the
/// count; a query naming nothing is refused; tenants are apart.
#[tokio::test]
async fn queries_and_tenants() {
    let server = Server::start();
    let c = server.client();
    for (i, speed) in [(1, 10), (2, 50), (3, 90)] {
        let e = json!({"id": format!("urn:ngsi-ld:Vehicle:{i}"), "type": "Vehicle", "speed": {"type": "Property", "value": speed}});
        let (status, _, _) = ld(
            &c,
            "POST",
            "/ngsi-ld/v1/entities",
            &[],
            Some(("application/json", &e)),
        )
        .await;
        assert_eq!(status, 201);
    }
    let e = json!({"id": "urn:ngsi-ld:Bike:1", "type": "Bike", "speed": {"type": "Property", "value": 20}});
    ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[("ngsild-tenant", "fleet")],
        Some(("application/json", &e)),
    )
    .await;

    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, _, all) = ld(&c, "GET", "/ngsi-ld/v1/entities?type=Vehicle", &[], None).await;
    assert_eq!(ids(&all).len(), 3);
    let (_, _, fast) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Vehicle&q=speed>40",
        &[],
        None,
    )
    .await;
    assert_eq!(
        ids(&fast),
        ["urn:ngsi-ld:Vehicle:2", "urn:ngsi-ld:Vehicle:3"]
    );
    let (_, headers, page) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Vehicle&limit=1&offset=1&count=true",
        &[],
        None,
    )
    .await;
    assert_eq!(ids(&page), ["urn:ngsi-ld:Vehicle:2"]);
    assert_eq!(headers["ngsild-results-count"], "3");
    // The same query by POST (5.7.2).
    let posted = json!({"type": "Query", "entities": [{"type": "Vehicle"}], "q": "speed>0"});
    let (status, _, by_post) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/query?limit=2",
        &[],
        Some(("application/json", &posted)),
    )
    .await;
    assert_eq!(status, 200, "{by_post}");
    assert_eq!(by_post.as_array().unwrap().len(), 2, "{by_post}");
    // 4.23: ordered by a member, here the id, descending.
    let (status, _, ordered) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Vehicle&orderBy=id;desc",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{ordered}");
    assert_eq!(
        ids(&ordered),
        [
            "urn:ngsi-ld:Vehicle:3",
            "urn:ngsi-ld:Vehicle:2",
            "urn:ngsi-ld:Vehicle:1"
        ]
    );
    let (_, _, by_pattern) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Vehicle&idPattern=.*:3$",
        &[],
        None,
    )
    .await;
    assert_eq!(ids(&by_pattern), ["urn:ngsi-ld:Vehicle:3"]);
    let (_, _, by_attr) = ld(&c, "GET", "/ngsi-ld/v1/entities?attrs=speed", &[], None).await;
    assert_eq!(ids(&by_attr).len(), 3, "the Bike is another tenant's");

    let (_, _, fleet) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Bike",
        &[("ngsild-tenant", "fleet")],
        None,
    )
    .await;
    assert_eq!(ids(&fleet), ["urn:ngsi-ld:Bike:1"]);
    // The tenant is Fiware-Service's: NGSIv2 sees it there.
    let (_, _, v2) = call(
        &c,
        "GET",
        "/v2/entities?type=Bike",
        &[("fiware-service", "fleet")],
        None,
    )
    .await;
    assert_eq!(v2[0]["id"], "urn:ngsi-ld:Bike:1");
    // A tenant nothing was ever created in is not there to read from.
    let (status, _, problem) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Bike",
        &[("ngsild-tenant", "nobody")],
        None,
    )
    .await;
    assert_eq!(status, 404, "{problem}");
    assert_eq!(
        problem["type"],
        "https://uri.etsi.org/ngsi-ld/errors/NonexistentTenant"
    );

    let (status, _, problem) = ld(&c, "GET", "/ngsi-ld/v1/entities", &[], None).await;
    assert_eq!(status, 400);
    assert_eq!(
        problem["type"],
        "https://uri.etsi.org/ngsi-ld/errors/BadRequestData"
    );
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Vehicle&limit=5000",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 403);
}

/// What is refused, and how (5.5.2, 6.3.4, 6.3.5): each answer is a
/// problem details object and nothing is stored.
#[tokio::test]
async fn bad_requests_are_problems_and_change_nothing() {
    let server = Server::start();
    let c = server.client();
    let e = vehicle();
    let mut with_context = e.clone();
    with_context["@context"] = json!(CORE);
    for (content_type, body, headers, status, kind) in [
        ("text/plain", e.clone(), vec![], 415, "InvalidRequest"),
        (
            "application/json",
            with_context.clone(),
            vec![],
            400,
            "BadRequestData",
        ),
        (LD, e.clone(), vec![], 400, "BadRequestData"),
        (
            LD,
            with_context.clone(),
            vec![("link", link(CORE))],
            400,
            "BadRequestData",
        ),
        (
            "application/json",
            json!({"id": "not a uri", "type": "T"}),
            vec![],
            400,
            "BadRequestData",
        ),
        (
            "application/json",
            json!({"id": "urn:a:b"}),
            vec![],
            400,
            "BadRequestData",
        ),
        (
            "application/json",
            json!({"id": "urn:a:b", "type": "T", "p": {"type": "Property"}}),
            vec![],
            400,
            "BadRequestData",
        ),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (got, _, problem) = ld(
            &c,
            "POST",
            "/ngsi-ld/v1/entities",
            &headers,
            Some((content_type, &body)),
        )
        .await;
        assert_eq!(got, status, "{content_type} {body}: {problem}");
        assert_eq!(
            problem["type"],
            format!("https://uri.etsi.org/ngsi-ld/errors/{kind}"),
            "{body}"
        );
    }
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404, "nothing was stored");
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:a:b",
        &[("accept", "text/html")],
        None,
    )
    .await;
    assert_eq!(status, 406);
    let (status, _, _) = ld(&c, "GET", "/ngsi-ld/v1/entities/not-a-uri", &[], None).await;
    assert_eq!(status, 400);
}

/// Keys hold NGSI-LD requests to their tenant, by `NGSILD-Tenant`: a
/// key of tenant A writes and reads A, is refused B, and a read key
/// cannot write.
#[tokio::test]
async fn keys_hold_requests_to_their_tenant() {
    let server = Server::start();
    let admin = server.client();
    let mut keys = Vec::new();
    for role in ["write", "read"] {
        let (status, key) = admin
            .send(
                "POST",
                "/api/v1/keys",
                Some(&json!({"name": role, "role": role, "tenant": "a"})),
                None,
            )
            .await;
        assert_eq!(status, 201, "{key}");
        keys.push(key["key"].as_str().unwrap().to_string());
    }
    let writer = server.client_with(Some(&keys[0]));
    let reader = server.client_with(Some(&keys[1]));
    let e = vehicle();
    let (status, _, _) = ld(
        &writer,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &e)),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _, _) = ld(
        &admin,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[("ngsild-tenant", "a")],
        None,
    )
    .await;
    assert_eq!(status, 200, "the key's tenant was filled in");
    let (status, _, _) = ld(
        &writer,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[("ngsild-tenant", "b")],
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = ld(
        &reader,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = ld(
        &reader,
        "DELETE",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 403);
    let anonymous = server.client_with(None);
    let (status, _, _) = ld(
        &anonymous,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Vehicle:A4567",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 401);
}

/// 5.6.7–5.6.10: batch create, upsert, update and delete; what fails is
/// reported beside what succeeded (207), and only that is left undone.
#[tokio::test]
async fn batch_operations() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let car = |i: u32, speed: u32| json!({"id": format!("urn:ngsi-ld:Car:{i}"), "type": "Car", "speed": speed});
    let batch = json!([car(1, 10), car(2, 20), {"id": "no uri", "type": "Car"}]);
    let (status, _, result) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/create",
        &[],
        Some((json_ct, &batch)),
    )
    .await;
    assert_eq!(status, 207, "{result}");
    assert_eq!(
        result["success"],
        json!(["urn:ngsi-ld:Car:1", "urn:ngsi-ld:Car:2"])
    );
    assert_eq!(
        result["errors"][0]["error"]["type"],
        "https://uri.etsi.org/ngsi-ld/errors/BadRequestData"
    );
    let (status, _, created) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/create",
        &[],
        Some((json_ct, &json!([car(3, 30)]))),
    )
    .await;
    assert_eq!((status, created), (201, json!(["urn:ngsi-ld:Car:3"])));

    // Upsert: Car:1 replaced whole (its color goes), Car:4 created.
    let mut one = car(1, 11);
    one.as_object_mut().unwrap().remove("speed");
    one["color"] = json!("red");
    let (status, _, created) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/upsert",
        &[],
        Some((json_ct, &json!([one, car(4, 40)]))),
    )
    .await;
    assert_eq!((status, created), (201, json!(["urn:ngsi-ld:Car:4"])));
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:1?options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(
        got,
        json!({"id": "urn:ngsi-ld:Car:1", "type": "Car", "color": "red"})
    );
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/upsert?options=update",
        &[],
        Some((json_ct, &json!([car(1, 12)]))),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:1?options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(
        got,
        json!({"id": "urn:ngsi-ld:Car:1", "type": "Car", "color": "red", "speed": 12})
    );

    let (status, _, result) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/update",
        &[],
        Some((json_ct, &json!([car(2, 21), car(9, 90)]))),
    )
    .await;
    assert_eq!(status, 207, "{result}");
    assert_eq!(result["errors"][0]["entityId"], "urn:ngsi-ld:Car:9");
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Car:2?options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(got["speed"], 21);

    let ids = json!([
        "urn:ngsi-ld:Car:1",
        "urn:ngsi-ld:Car:2",
        "urn:ngsi-ld:Car:9"
    ]);
    let (status, _, result) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/delete",
        &[],
        Some((json_ct, &ids)),
    )
    .await;
    assert_eq!(status, 207, "{result}");
    assert_eq!(
        result["success"],
        json!(["urn:ngsi-ld:Car:1", "urn:ngsi-ld:Car:2"])
    );
    assert_eq!(
        result["errors"][0]["error"]["type"],
        "https://uri.etsi.org/ngsi-ld/errors/ResourceNotFound"
    );
    let (_, _, left) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Car&options=keyValues",
        &[],
        None,
    )
    .await;
    let left: Vec<&str> = left
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["urn:ngsi-ld:Car:3", "urn:ngsi-ld:Car:4"]);
}

/// 5.7.3 and 5.7.4: the temporal evolution of an entity, from the same
/// history QuantumLeap's API reads: every change, through NGSI-LD or
/// NGSIv2, is an instance; `timerel`, `lastN` and `temporalValues` cut
/// and shape it.
#[tokio::test]
async fn temporal_evolution_from_the_one_history() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let at = |minute: u32| format!("2024-05-01T10:{minute:02}:00Z");
    let sensor = json!({"id": "urn:ngsi-ld:Sensor:1", "type": "Sensor",
        "temperature": {"type": "Property", "value": 20, "observedAt": at(0)}});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some((json_ct, &sensor)),
    )
    .await;
    assert_eq!(status, 201);
    for (minute, value) in [(1, 21), (2, 22)] {
        let patch =
            json!({"temperature": {"type": "Property", "value": value, "observedAt": at(minute)}});
        let (status, _, _) = ld(
            &c,
            "PATCH",
            "/ngsi-ld/v1/entities/urn:ngsi-ld:Sensor:1/attrs",
            &[],
            Some((json_ct, &patch)),
        )
        .await;
        assert_eq!(status, 204);
    }
    // An NGSIv2 client's change is an instance too.
    let v2 = json!({"temperature": {"type": "Property", "value": 23,
        "metadata": {"observedAt": {"type": "DateTime", "value": at(3)}}}});
    let (status, _, _) = call(
        &c,
        "PATCH",
        "/v2/entities/urn:ngsi-ld:Sensor:1/attrs",
        &[],
        Some(&v2),
    )
    .await;
    assert_eq!(status, 204);

    let path = "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Sensor:1";
    let (status, _, got) = ld(&c, "GET", path, &[], None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["type"], "Sensor");
    let instances = got["temperature"].as_array().expect("instances");
    let seen: Vec<(i64, &str)> = instances
        .iter()
        .map(|i| {
            (
                i["value"].as_i64().unwrap(),
                i["observedAt"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (20, at(0).as_str()),
            (21, &at(1)),
            (22, &at(2)),
            (23, &at(3))
        ]
    );
    assert_eq!(instances[0]["type"], "Property");

    let (_, _, simple) = ld(
        &c,
        "GET",
        &format!("{path}?options=temporalValues&lastN=2"),
        &[],
        None,
    )
    .await;
    assert_eq!(
        simple["temperature"],
        json!({"type": "Property", "values": [[22, at(2)], [23, at(3)]]})
    );
    let (_, _, after) = ld(
        &c,
        "GET",
        &format!(
            "{path}?timerel=after&timeAt={}&options=temporalValues",
            at(1)
        ),
        &[],
        None,
    )
    .await;
    assert_eq!(
        after["temperature"]["values"],
        json!([[22, at(2)], [23, at(3)]])
    );
    let (_, _, between) = ld(
        &c,
        "GET",
        &format!(
            "{path}?timerel=between&timeAt={}&endTimeAt={}&options=temporalValues",
            at(1),
            at(3)
        ),
        &[],
        None,
    )
    .await;
    assert_eq!(
        between["temperature"]["values"],
        json!([[21, at(1)], [22, at(2)]])
    );

    // QuantumLeap's API reads the same history.
    let (status, ql) = c
        .send(
            "GET",
            "/ql/v2/entities/urn:ngsi-ld:Sensor:1/attrs/temperature",
            None,
            None,
        )
        .await;
    assert_eq!(status, 200, "{ql}");
    assert_eq!(ql["values"], json!([20, 21, 22, 23]));

    // Aggregated, from the history's rollups.
    let (status, _, aggr) = ld(
        &c,
        "GET",
        &format!("{path}?aggrMethods=avg,max,totalCount&aggrPeriodDuration=PT1H"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{aggr}");
    let hour = ["2024-05-01T10:00:00Z", "2024-05-01T11:00:00Z"];
    assert_eq!(
        aggr["temperature"]["avg"],
        json!([[21.5, hour[0], hour[1]]])
    );
    assert_eq!(
        aggr["temperature"]["max"],
        json!([[23.0, hour[0], hour[1]]])
    );
    assert_eq!(
        aggr["temperature"]["totalCount"],
        json!([[4, hour[0], hour[1]]])
    );
    let (_, _, whole) = ld(
        &c,
        "GET",
        &format!("{path}?aggrMethods=sum&timerel=before&timeAt={}", at(2)),
        &[],
        None,
    )
    .await;
    assert_eq!(whole["temperature"]["sum"][0][0], 41.0, "{whole}");
    // Computed from the instances: the other methods, any duration.
    let (status, _, more) = ld(
        &c,
        "GET",
        &format!("{path}?aggrMethods=distinctCount,sumsq,stddev"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{more}");
    assert_eq!(more["temperature"]["distinctCount"][0][0], 4, "{more}");
    assert_eq!(more["temperature"]["sumsq"][0][0], 1854.0, "{more}");
    let stddev = more["temperature"]["stddev"][0][0].as_f64().unwrap();
    assert!((stddev - (5.0f64 / 3.0).sqrt()).abs() < 1e-9, "{more}");
    let (status, _, two) = ld(
        &c,
        "GET",
        &format!(
            "{path}?aggrMethods=sum&aggrPeriodDuration=PT2M&timerel=between&timeAt={}&endTimeAt={}",
            at(0),
            at(4)
        ),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(
        two["temperature"]["sum"],
        json!([[41.0, at(0), at(2)], [45.0, at(2), at(4)]])
    );
    for (bad, expected) in [
        ("aggrMethods=median", 400),
        ("aggrMethods=avg&aggrPeriodDuration=P1MT1H", 422),
        ("aggrMethods=avg&aggrPeriodDuration=1H", 400),
    ] {
        let (status, _, problem) = ld(&c, "GET", &format!("{path}?{bad}"), &[], None).await;
        assert_eq!(status, expected, "{bad}: {problem}");
    }

    let (_, _, listed) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/temporal/entities?type=Sensor&lastN=1",
        &[],
        None,
    )
    .await;
    assert_eq!(listed[0]["temperature"][0]["value"], 23);
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Sensor:none",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = ld(&c, "GET", &format!("{path}?timerel=after"), &[], None).await;
    assert_eq!(status, 400);
}

/// 4.9: NGSI-LD's query language: `;` and `|`, parentheses, quoted
/// strings, relationships' objects, sub-attributes and parts of values;
/// names read with the request's context.
#[tokio::test]
async fn the_query_language() {
    let server = Server::start();
    let c = server.client();
    let cars = json!([
        {"id": "urn:ngsi-ld:Car:1", "type": "Car", "speed": {"type": "Property", "value": 10, "observedAt": "2024-01-01T00:00:00Z"},
         "brand": "Seat", "parkedIn": {"type": "Relationship", "object": "urn:ngsi-ld:Parking:A"},
         "address": {"type": "Property", "value": {"city": "Porto"}}},
        {"id": "urn:ngsi-ld:Car:2", "type": "Car", "speed": {"type": "Property", "value": 50, "observedAt": "2024-06-01T00:00:00Z"},
         "brand": "Mercedes", "address": {"type": "Property", "value": {"city": "Lisboa"}}},
        {"id": "urn:ngsi-ld:Car:3", "type": "Car", "speed": {"type": "Property", "value": 90, "observedAt": "2024-06-01T00:00:00Z"},
         "brand": "Mercedes", "parkedIn": {"type": "Relationship", "object": "urn:ngsi-ld:Parking:B"}}
    ]);
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/create",
        &[],
        Some(("application/json", &cars)),
    )
    .await;
    assert_eq!(status, 201);
    let found = |q: &'static str| {
        let c = c.clone();
        async move {
            let path = format!("/ngsi-ld/v1/entities?type=Car&q={}", urlencoding(q));
            let (status, _, list) = ld(&c, "GET", &path, &[], None).await;
            assert_eq!(status, 200, "{q}: {list}");
            list.as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    e["id"]
                        .as_str()
                        .unwrap()
                        .trim_start_matches("urn:ngsi-ld:Car:")
                        .to_string()
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(found("speed>40;brand==\"Mercedes\"").await, ["2", "3"]);
    assert_eq!(found("speed<20|speed>80").await, ["1", "3"]);
    assert_eq!(
        found("(speed<20|speed>80);brand==\"Mercedes\"").await,
        ["3"]
    );
    assert_eq!(found("parkedIn==\"urn:ngsi-ld:Parking:A\"").await, ["1"]);
    assert_eq!(found("parkedIn").await, ["1", "3"]);
    assert_eq!(
        found("speed.observedAt>2024-03-01T00:00:00Z").await,
        ["2", "3"]
    );
    assert_eq!(found("address[city]==\"Porto\"").await, ["1"]);
    assert_eq!(found("brand~=\"^Mer\"").await, ["2", "3"]);
    let (status, _, problem) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Car&q=speed%3E40%3B",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400, "{problem}");
}

/// A query-string component, percent-encoded.
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// 5.7.5–5.7.10: the types and attributes a tenant holds, NGSIv2's
/// entities among them, named with the request's context.
#[tokio::test]
async fn types_and_attributes() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some((json_ct, &vehicle())),
    )
    .await;
    let room = json!({"id": "urn:ngsi-ld:Room:1", "type": "Room", "temperature": {"type": "Number", "value": 21}});
    call(&c, "POST", "/v2/entities", &[], Some(&room)).await;

    let (status, _, list) = ld(&c, "GET", "/ngsi-ld/v1/types", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(list["type"], "EntityTypeList");
    assert_eq!(list["typeList"], json!(["Room", "Vehicle"]));
    let (_, _, details) = ld(&c, "GET", "/ngsi-ld/v1/types?details=true", &[], None).await;
    assert_eq!(
        details[0]["id"],
        "https://uri.etsi.org/ngsi-ld/default-context/Room"
    );
    assert_eq!(details[0]["attributeNames"], json!(["temperature"]));
    let (_, _, info) = ld(&c, "GET", "/ngsi-ld/v1/types/Vehicle", &[], None).await;
    assert_eq!(info["type"], "EntityTypeInfo");
    assert_eq!(info["entityCount"], 1);
    let parked = info["attributeDetails"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["attributeName"] == "isParked")
        .expect("isParked listed");
    assert_eq!(parked["attributeTypes"], json!(["Relationship"]));
    let (status, _, _) = ld(&c, "GET", "/ngsi-ld/v1/types/Boat", &[], None).await;
    assert_eq!(status, 404);

    let (_, _, attrs) = ld(&c, "GET", "/ngsi-ld/v1/attributes", &[], None).await;
    assert_eq!(attrs["type"], "AttributeList");
    assert_eq!(
        attrs["attributeList"],
        json!(["brandName", "isParked", "location", "speed", "temperature"])
    );
    let (_, _, speed) = ld(&c, "GET", "/ngsi-ld/v1/attributes/speed", &[], None).await;
    assert_eq!(speed["attributeCount"], 1);
    assert_eq!(speed["typeNames"], json!(["Vehicle"]));
    assert_eq!(speed["attributeTypes"], json!(["Property"]));
    let (status, _, _) = ld(&c, "GET", "/ngsi-ld/v1/attributes/wings", &[], None).await;
    assert_eq!(status, 404);
}

/// 4.10: geo-queries on a GeoProperty (`location` by default, another
/// with `geoproperty`), read as NGSIv2's geo-queries are.
#[tokio::test]
async fn geo_queries() {
    let server = Server::start();
    let c = server.client();
    let point = |lon: f64, lat: f64| json!({"type": "GeoProperty", "value": {"type": "Point", "coordinates": [lon, lat]}});
    let shops = json!([
        {"id": "urn:ngsi-ld:Shop:porto", "type": "Shop", "location": point(-8.61, 41.15), "depot": point(-9.14, 38.72)},
        {"id": "urn:ngsi-ld:Shop:lisboa", "type": "Shop", "location": point(-9.14, 38.72)},
        {"id": "urn:ngsi-ld:Shop:madrid", "type": "Shop", "location": point(-3.70, 40.42)}
    ]);
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/create",
        &[],
        Some(("application/json", &shops)),
    )
    .await;
    assert_eq!(status, 201);
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e["id"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("urn:ngsi-ld:Shop:")
                    .to_string()
            })
            .collect()
    };
    let query = |params: &str| format!("/ngsi-ld/v1/entities?type=Shop&{params}");
    let (status, _, near) = ld(
        &c,
        "GET",
        &query(
            "georel=near%3BmaxDistance%3D%3D5000&geometry=Point&coordinates=%5B-8.62%2C41.16%5D",
        ),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{near}");
    assert_eq!(ids(&near), ["porto"]);
    let portugal = "%5B%5B%5B-10%2C36.9%5D%2C%5B-6%2C36.9%5D%2C%5B-6%2C42.2%5D%2C%5B-10%2C42.2%5D%2C%5B-10%2C36.9%5D%5D%5D";
    let (_, _, within) = ld(
        &c,
        "GET",
        &query(&format!(
            "georel=within&geometry=Polygon&coordinates={portugal}"
        )),
        &[],
        None,
    )
    .await;
    assert_eq!(ids(&within), ["porto", "lisboa"]);
    let (_, _, outside) = ld(
        &c,
        "GET",
        &query(&format!(
            "georel=disjoint&geometry=Polygon&coordinates={portugal}"
        )),
        &[],
        None,
    )
    .await;
    assert_eq!(ids(&outside), ["madrid"]);
    // Another GeoProperty: Porto's depot is in Lisbon.
    let (_, _, depots) = ld(
        &c,
        "GET",
        &query("georel=near%3BmaxDistance%3D%3D5000&geometry=Point&coordinates=%5B-9.14%2C38.72%5D&geoproperty=depot"),
        &[],
        None,
    )
    .await;
    assert_eq!(ids(&depots), ["porto"]);
    let (status, _, problem) = ld(
        &c,
        "GET",
        &query("georel=within&geometry=Polygon"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let (status, _, problem) = ld(
        &c,
        "GET",
        &query("georel=within&geometry=MultiPoint&coordinates=%5B%5B1%2C2%5D%5D"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    // A shop's point lies in Portugal but neither covers nor overlaps it.
    for rel in ["contains", "overlaps"] {
        let (status, _, none) = ld(
            &c,
            "GET",
            &query(&format!(
                "georel={rel}&geometry=Polygon&coordinates={portugal}"
            )),
            &[],
            None,
        )
        .await;
        assert_eq!(status, 200, "{none}");
        assert_eq!(ids(&none), Vec::<String>::new(), "{rel}");
    }
    // An area contains what it covers and overlaps what it shares part of.
    let iberia = json!({"id": "urn:ngsi-ld:Shop:iberia", "type": "Shop", "location": {
        "type": "GeoProperty",
        "value": {"type": "Polygon", "coordinates": [[[-10, 36], [3, 36], [3, 44], [-10, 44], [-10, 36]]]}
    }});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &iberia)),
    )
    .await;
    assert_eq!(status, 201);
    let france =
        "%5B%5B%5B-2%2C43%5D%2C%5B7%2C43%5D%2C%5B7%2C50%5D%2C%5B-2%2C50%5D%2C%5B-2%2C43%5D%5D%5D";
    for (rel, area, found) in [
        ("contains", portugal, vec!["iberia"]),
        ("contains", france, vec![]),
        ("overlaps", france, vec!["iberia"]),
        ("overlaps", portugal, vec![]),
    ] {
        let (_, _, answer) = ld(
            &c,
            "GET",
            &query(&format!("georel={rel}&geometry=Polygon&coordinates={area}")),
            &[],
            None,
        )
        .await;
        assert_eq!(ids(&answer), found, "{rel} {area}");
    }
    // An entity contains a point it covers: Madrid's is its own, Iberia covers it.
    let (status, _, madrid) = ld(
        &c,
        "GET",
        &query("georel=contains&geometry=Point&coordinates=%5B-3.70%2C40.42%5D"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{madrid}");
    assert_eq!(ids(&madrid), ["madrid", "iberia"]);
}

/// 4.5.16 and 4.5.18: entities as GeoJSON (`Accept: application/geo+json`,
/// the geometry from `geometryProperty`), and `lang` picking one string of
/// a LanguageProperty.
#[tokio::test]
async fn geojson_and_languages() {
    let server = Server::start();
    let c = server.client();
    let e = json!({"id": "urn:ngsi-ld:Shop:1", "type": "Shop",
        "location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [-8.61, 41.15]}},
        "name": {"type": "LanguageProperty", "languageMap": {"en": "Bookshop", "pt": "Livraria"}}});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some(("application/json", &e)),
    )
    .await;
    assert_eq!(status, 201);
    let geo = [("accept", "application/geo+json")];
    let (status, headers, feature) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Shop:1?options=keyValues",
        &geo,
        None,
    )
    .await;
    assert_eq!(status, 200, "{feature}");
    assert_eq!(headers["content-type"], "application/geo+json");
    assert_eq!(feature["type"], "Feature");
    assert_eq!(feature["id"], "urn:ngsi-ld:Shop:1");
    assert_eq!(
        feature["geometry"],
        json!({"type": "Point", "coordinates": [-8.61, 41.15]})
    );
    assert_eq!(feature["properties"]["type"], "Shop");
    let (_, _, collection) = ld(&c, "GET", "/ngsi-ld/v1/entities?type=Shop", &geo, None).await;
    assert_eq!(collection["type"], "FeatureCollection");
    assert_eq!(collection["features"][0]["geometry"]["type"], "Point");
    assert_eq!(
        collection["features"][0]["properties"]["location"]["type"],
        "GeoProperty"
    );

    let (_, _, pt) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Shop:1?lang=pt",
        &[],
        None,
    )
    .await;
    assert_eq!(
        pt["name"],
        json!({"type": "Property", "value": "Livraria", "lang": "pt"})
    );
    let (_, _, kv) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Shop:1?lang=en&options=keyValues",
        &[],
        None,
    )
    .await;
    assert_eq!(kv["name"], "Bookshop");
}

/// 5.6.20: batch merge adds attributes or merges them into those an
/// entity has; the attribute kinds of NGSI-LD 1.8 (JSON, vocabulary,
/// lists) are kept and shown back as written.
#[tokio::test]
async fn batch_merge_and_the_newer_attribute_kinds() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let e = json!({"id": "urn:ngsi-ld:Building:1", "type": "Building",
        "height": {"type": "Property", "value": 30, "unitCode": "MTR"},
        "config": {"type": "JsonProperty", "json": {"type": "not an NGSI-LD type", "floors": [1, 2]}},
        "category": {"type": "VocabProperty", "vocab": "office"},
        "sensors": {"type": "ListRelationship", "objectList": [{"object": "urn:ngsi-ld:Sensor:1"}]}});
    let (status, _, _) = ld(&c, "POST", "/ngsi-ld/v1/entities", &[], Some((json_ct, &e))).await;
    assert_eq!(status, 201);
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Building:1",
        &[],
        None,
    )
    .await;
    assert_eq!(got, e);

    let merge = json!([
        {"id": "urn:ngsi-ld:Building:1", "type": "Building", "height": {"type": "Property", "value": 31}, "color": "grey"},
        {"id": "urn:ngsi-ld:Building:9", "type": "Building", "color": "red"}
    ]);
    let (status, _, result) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/merge",
        &[],
        Some((json_ct, &merge)),
    )
    .await;
    assert_eq!(status, 207, "{result}");
    assert_eq!(result["success"], json!(["urn:ngsi-ld:Building:1"]));
    assert_eq!(result["errors"][0]["entityId"], "urn:ngsi-ld:Building:9");
    let (_, _, got) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Building:1",
        &[],
        None,
    )
    .await;
    assert_eq!(
        got["height"],
        json!({"type": "Property", "value": 31, "unitCode": "MTR"}),
        "merged: unitCode kept"
    );
    assert_eq!(got["color"], json!({"type": "Property", "value": "grey"}));
    assert_eq!(got["config"], e["config"]);
}

/// 5.6.11–5.6.13: a temporal representation written directly: its
/// instances recorded in the history at their `observedAt`, more added
/// later, all of it deleted; the current entity is not touched.
#[tokio::test]
async fn temporal_representations_written_and_deleted() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let at = |minute: u32| format!("2024-07-01T08:{minute:02}:00Z");
    let meter = json!({"id": "urn:ngsi-ld:Meter:1", "type": "Meter",
        "energy": [{"type": "Property", "value": 1, "observedAt": at(0)},
                   {"type": "Property", "value": 2, "observedAt": at(1)}]});
    let (status, headers, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities",
        &[],
        Some((json_ct, &meter)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        headers["location"],
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1"
    );
    let more = json!({"power": {"type": "Property", "value": 5, "observedAt": at(2)}});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1/attrs",
        &[],
        Some((json_ct, &more)),
    )
    .await;
    assert_eq!(status, 204);
    let again = json!({"id": "urn:ngsi-ld:Meter:1", "type": "Meter",
        "energy": {"type": "Property", "value": 3, "observedAt": at(3)}});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities",
        &[],
        Some((json_ct, &again)),
    )
    .await;
    assert_eq!(status, 204, "an entity with history is updated");

    let path = "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1?options=temporalValues";
    let (_, _, got) = ld(&c, "GET", path, &[], None).await;
    assert_eq!(
        got["energy"]["values"],
        json!([[1, at(0)], [2, at(1)], [3, at(3)]])
    );
    assert_eq!(got["power"]["values"], json!([[5, at(2)]]));
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities/urn:ngsi-ld:Meter:1",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404, "history only: no current entity was made");

    // One attribute's instances deleted (5.6.13): the other's stay.
    let attr_path = "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1/attrs/power";
    let (status, _, body) = ld(&c, "DELETE", attr_path, &[], None).await;
    assert_eq!(status, 204, "{body}");
    let (_, _, got) = ld(&c, "GET", path, &[], None).await;
    assert!(got.get("power").is_none(), "{got}");
    assert_eq!(got["energy"]["values"].as_array().unwrap().len(), 3);
    let (status, _, _) = ld(&c, "DELETE", attr_path, &[], None).await;
    assert_eq!(status, 404, "nothing left of it");

    let (status, _, _) = ld(
        &c,
        "DELETE",
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = ld(&c, "GET", path, &[], None).await;
    assert_eq!(status, 404);
    let (status, _, _) = ld(
        &c,
        "DELETE",
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:1",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Meter:2/attrs",
        &[],
        Some((json_ct, &more)),
    )
    .await;
    assert_eq!(status, 404);
    let bad = json!({"id": "urn:ngsi-ld:Meter:3", "type": "Meter"});
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities",
        &[],
        Some((json_ct, &bad)),
    )
    .await;
    assert_eq!(status, 400, "no instance");
}

/// 4.5.5: several instances of one attribute, told apart by `datasetId`:
/// created together, shown as an array, each updated and deleted on its
/// own (or all with `deleteAll`); NGSIv2 sees each instance as an
/// attribute of its own.
#[tokio::test]
async fn attribute_instances_by_dataset_id() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let id = "urn:ngsi-ld:Vehicle:D1";
    let vehicle = json!({"id": id, "type": "Vehicle",
        "speed": [{"type": "Property", "value": 50},
                  {"type": "Property", "value": 53, "datasetId": "urn:ngsi-ld:Dataset:gps"}]});
    let (status, _, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entities",
        &[],
        Some((json_ct, &vehicle)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let path = format!("/ngsi-ld/v1/entities/{id}");
    let (_, _, got) = ld(&c, "GET", &path, &[], None).await;
    assert_eq!(got, vehicle);
    let (_, _, v2) = call(&c, "GET", &format!("/v2/entities/{id}"), &[], None).await;
    assert_eq!(v2["speed urn:ngsi-ld:Dataset:gps"]["value"], 53, "{v2}");
    // `datasetId` shows only the instances named (`@none`: the default).
    for (datasets, speed) in [
        (
            "urn:ngsi-ld:Dataset:gps",
            json!({"type": "Property", "value": 53, "datasetId": "urn:ngsi-ld:Dataset:gps"}),
        ),
        ("@none", json!({"type": "Property", "value": 50})),
        ("@none,urn:ngsi-ld:Dataset:gps", vehicle["speed"].clone()),
        ("urn:ngsi-ld:Dataset:radar", Value::Null),
    ] {
        let (_, _, got) = ld(
            &c,
            "GET",
            &format!("/ngsi-ld/v1/entities?type=Vehicle&datasetId={datasets}"),
            &[],
            None,
        )
        .await;
        assert_eq!(got[0]["speed"], speed, "{datasets}: {got}");
    }

    // One instance updated, then deleted; the other stays.
    let update = json!({"type": "Property", "value": 60, "datasetId": "urn:ngsi-ld:Dataset:gps"});
    let (status, _, body) = ld(
        &c,
        "PATCH",
        &format!("{path}/attrs/speed"),
        &[],
        Some((json_ct, &update)),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (_, _, got) = ld(&c, "GET", &path, &[], None).await;
    assert_eq!(got["speed"][0]["value"], 50, "{got}");
    assert_eq!(got["speed"][1], update);
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("{path}/attrs/speed?datasetId=urn:ngsi-ld:Dataset:gps"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, got) = ld(&c, "GET", &path, &[], None).await;
    assert_eq!(got["speed"], json!({"type": "Property", "value": 50}));
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("{path}/attrs/speed?datasetId=urn:ngsi-ld:Dataset:gps"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 404, "gone already");

    // urn:ngsi-ld:null in an update deletes (5.6.2): here the default
    // instance.
    let nulled = json!({"speed": {"type": "Property", "value": "urn:ngsi-ld:null"}});
    let (status, _, body) = ld(
        &c,
        "PATCH",
        &format!("{path}/attrs"),
        &[],
        Some((json_ct, &nulled)),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (_, _, got) = ld(&c, "GET", &path, &[], None).await;
    assert!(got.get("speed").is_none(), "{got}");
    let back = json!({"speed": {"type": "Property", "value": 50}});
    let (status, _, _) = ld(
        &c,
        "POST",
        &format!("{path}/attrs"),
        &[],
        Some((json_ct, &back)),
    )
    .await;
    assert_eq!(status, 204);

    // Appended back, then every instance deleted at once.
    let more = json!({"speed": {"type": "Property", "value": 70, "datasetId": "urn:ngsi-ld:Dataset:radar"}});
    let (status, _, _) = ld(
        &c,
        "POST",
        &format!("{path}/attrs"),
        &[],
        Some((json_ct, &more)),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, got) = ld(&c, "GET", &format!("{path}?options=keyValues"), &[], None).await;
    assert_eq!(got["speed"], json!([50, 70]));
    let (status, _, _) = ld(
        &c,
        "DELETE",
        &format!("{path}/attrs/speed?deleteAll=true"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, got) = ld(&c, "GET", &path, &[], None).await;
    assert!(got.get("speed").is_none(), "{got}");

    for bad in [
        json!({"id": "urn:ngsi-ld:Vehicle:D2", "type": "Vehicle",
               "speed": [{"type": "Property", "value": 1, "datasetId": "urn:a:1"},
                         {"type": "Property", "value": 2, "datasetId": "urn:a:1"}]}),
        json!({"id": "urn:ngsi-ld:Vehicle:D3", "type": "Vehicle",
               "speed": {"type": "Property", "value": 1, "datasetId": "not a uri"}}),
    ] {
        let (status, _, problem) = ld(
            &c,
            "POST",
            "/ngsi-ld/v1/entities",
            &[],
            Some((json_ct, &bad)),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {problem}");
    }
}

/// 4.5.23: linked entities (`join`): inline in the Relationship or listed
/// after the entity, `joinLevel` levels deep, projected by the braces of
/// `pick` and `omit` (4.21); a missing linked entity leaves the
/// Relationship as it is.
#[tokio::test]
async fn linked_entities_joined_inline_and_flat() {
    let server = Server::start();
    let c = server.client();
    let rel = |to: &str| json!({"type": "Relationship", "object": to});
    let entities = json!([
        {"id": "urn:ngsi-ld:Building:B1", "type": "Building", "locatedAt": rel("urn:ngsi-ld:City:Paris")},
        {"id": "urn:ngsi-ld:Building:B2", "type": "Building", "locatedAt": rel("urn:ngsi-ld:City:Nowhere")},
        {"id": "urn:ngsi-ld:City:Paris", "type": "City",
         "name": {"type": "Property", "value": "Paris"}, "isIn": rel("urn:ngsi-ld:Country:France")},
        {"id": "urn:ngsi-ld:Country:France", "type": "Country", "name": {"type": "Property", "value": "France"}}
    ]);
    let (status, _, body) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/create",
        &[],
        Some(("application/json", &entities)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let get = |query: &str| {
        let c = c.clone();
        let path = format!("/ngsi-ld/v1/entities/urn:ngsi-ld:Building:B1?{query}");
        async move { ld(&c, "GET", &path, &[], None).await }
    };
    let city = json!({"id": "urn:ngsi-ld:City:Paris", "type": "City",
        "name": {"type": "Property", "value": "Paris"}, "isIn": rel("urn:ngsi-ld:Country:France")});
    let france = entities[3].clone();

    let (status, _, inline) = get("join=inline").await;
    assert_eq!(status, 200, "{inline}");
    assert_eq!(inline["locatedAt"]["object"], "urn:ngsi-ld:City:Paris");
    assert_eq!(inline["locatedAt"]["entity"], city);
    let (_, _, deep) = get("join=inline&joinLevel=2").await;
    assert_eq!(deep["locatedAt"]["entity"]["isIn"]["entity"], france);
    let (_, _, kv) = get("join=inline&options=keyValues").await;
    assert_eq!(kv["locatedAt"]["id"], "urn:ngsi-ld:City:Paris", "{kv}");
    assert_eq!(kv["locatedAt"]["name"], "Paris");

    let (_, _, flat) = get("join=flat&joinLevel=2").await;
    let ids: Vec<&str> = flat
        .as_array()
        .expect("flat is a list")
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "urn:ngsi-ld:Building:B1",
            "urn:ngsi-ld:City:Paris",
            "urn:ngsi-ld:Country:France"
        ]
    );
    assert!(flat[0]["locatedAt"].get("entity").is_none());

    let (_, _, picked) =
        get("join=inline&joinLevel=2&pick=id,locatedAt%7Bname,isIn%7Bid%7D%7D").await;
    assert_eq!(
        picked,
        json!({"id": "urn:ngsi-ld:Building:B1", "locatedAt": {
            "type": "Relationship", "object": "urn:ngsi-ld:City:Paris",
            "entity": {"name": {"type": "Property", "value": "Paris"},
                       "isIn": {"type": "Relationship", "object": "urn:ngsi-ld:Country:France",
                                "entity": {"id": "urn:ngsi-ld:Country:France"}}}}})
    );
    let (_, _, omitted) = get("join=flat&omit=type,locatedAt%7Bname%7D").await;
    assert_eq!(omitted[0].get("type"), None, "{omitted}");
    assert_eq!(omitted[1].get("name"), None, "{omitted}");
    assert_eq!(omitted[1]["type"], "City");

    // A Relationship to nothing: the entity as it is, an object even flat.
    let b2 = "/ngsi-ld/v1/entities/urn:ngsi-ld:Building:B2";
    for join in ["inline", "flat"] {
        let (status, _, got) = ld(&c, "GET", &format!("{b2}?join={join}"), &[], None).await;
        assert_eq!(status, 200);
        assert_eq!(got, entities[1], "{join}");
    }
    // Queries join each entity; flat lists the linked ones once, after.
    let (_, _, listed) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/entities?type=Building&join=flat",
        &[],
        None,
    )
    .await;
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
    assert_eq!(listed[2], city);
    let query = json!({"type": "Query", "entities": [{"type": "Building"}], "join": "inline"});
    let (_, _, posted) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/entityOperations/query",
        &[],
        Some(("application/json", &query)),
    )
    .await;
    assert_eq!(posted[0]["locatedAt"]["entity"], city, "{posted}");

    for bad in [
        "join=deep",
        "join=inline&joinLevel=0",
        "pick=id,locatedAt%7Bname",
        "omit=a%7B%7D",
    ] {
        let (status, _, problem) = get(bad).await;
        assert_eq!(status, 400, "{bad}: {problem}");
    }
}

/// 5.6.11, 5.7.3, 5.7.4 and 4.5.19 as ETSI's suite reads them: an upsert
/// replaces the instances observed at the same time; aggregation
/// periods start at `timeAt` (or the entity's first instance); `attrs`
/// and `datasetId` choose instances; `pick`, geo-queries and the query
/// by POST.
#[tokio::test]
async fn temporal_instances_replaced_aggregated_and_chosen() {
    let server = Server::start();
    let c = server.client();
    let json_ct = "application/json";
    let at = |minute: u32| format!("2024-07-01T{:02}:{:02}:00Z", 8 + minute / 60, minute % 60);
    let point = |lon: f64| json!({"type": "Point", "coordinates": [lon, 41.0]});
    let car = |id: &str, lon: f64| {
        json!({"id": id, "type": "Car",
            "speed": [{"type": "Property", "value": 10, "observedAt": at(3)},
                      {"type": "Property", "value": 30, "observedAt": at(5)},
                      {"type": "Property", "value": 50, "observedAt": at(70)},
                      {"type": "Property", "value": 7, "observedAt": at(5), "datasetId": "urn:ngsi-ld:Dataset:gps"}],
            "location": {"type": "GeoProperty", "value": point(lon), "observedAt": at(3)}})
    };
    for (id, lon) in [("urn:ngsi-ld:Car:A", -8.6), ("urn:ngsi-ld:Car:B", 2.3)] {
        let (status, _, body) = ld(
            &c,
            "POST",
            "/ngsi-ld/v1/temporal/entities",
            &[],
            Some((json_ct, &car(id, lon))),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    // Sent again with one value changed: replaced, not doubled.
    let mut again = car("urn:ngsi-ld:Car:A", -8.6);
    again["speed"][0]["value"] = json!(11);
    let (status, _, _) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entities",
        &[],
        Some((json_ct, &again)),
    )
    .await;
    assert_eq!(status, 204);
    let path = "/ngsi-ld/v1/temporal/entities/urn:ngsi-ld:Car:A";
    let (_, _, got) = ld(
        &c,
        "GET",
        &format!("{path}?options=temporalValues&datasetId=@none"),
        &[],
        None,
    )
    .await;
    assert_eq!(
        got["speed"]["values"],
        json!([[11, at(3)], [30, at(5)], [50, at(70)]]),
        "{got}"
    );
    // `attrs` names an attribute: each of its instances comes.
    let (_, _, got) = ld(&c, "GET", &format!("{path}?attrs=speed"), &[], None).await;
    assert_eq!(got["speed"].as_array().map(Vec::len), Some(4), "{got}");
    assert!(got.get("location").is_none());
    let (_, _, got) = ld(&c, "GET", &format!("{path}?pick=id,speed"), &[], None).await;
    assert!(
        got.get("type").is_none() && got.get("speed").is_some(),
        "{got}"
    );
    let (status, _, _) = ld(&c, "GET", &format!("{path}?pick=wings"), &[], None).await;
    assert_eq!(status, 404, "nothing picked is there");

    // Hours from the first instance (08:03), or from timeAt.
    let (_, _, got) = ld(
        &c,
        "GET",
        &format!("{path}?options=aggregatedValues&aggrMethods=max&aggrPeriodDuration=PT1H&datasetId=@none&attrs=speed"),
        &[],
        None,
    )
    .await;
    assert_eq!(
        got["speed"]["max"],
        json!([[30.0, at(3), at(63)], [50.0, at(63), at(123)]]),
        "{got}"
    );
    let (_, _, got) = ld(
        &c,
        "GET",
        &format!("{path}?options=aggregatedValues&aggrMethods=max&aggrPeriodDuration=PT1H&attrs=speed&timerel=after&timeAt=2024-07-01T08:00:00Z"),
        &[],
        None,
    )
    .await;
    assert_eq!(
        got["speed"]["max"][0],
        json!([30.0, at(0), at(60)]),
        "{got}"
    );

    // Near Porto, by GET and by POST.
    let near = "georel=near%3BmaxDistance%3D%3D20000&geometry=Point&coordinates=%5B-8.6%2C41.0%5D";
    let (_, _, got) = ld(
        &c,
        "GET",
        &format!("/ngsi-ld/v1/temporal/entities?type=Car&{near}"),
        &[],
        None,
    )
    .await;
    let ids: Vec<&str> = got
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["urn:ngsi-ld:Car:A"], "{got}");
    let query = json!({"type": "Query", "entities": [{"type": "Car"}],
        "temporalQ": {"timerel": "after", "timeAt": at(60)}});
    let (status, _, got) = ld(
        &c,
        "POST",
        "/ngsi-ld/v1/temporal/entityOperations/query",
        &[],
        Some((json_ct, &query)),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got.as_array().map(Vec::len), Some(2));
    assert_eq!(
        got[0]["speed"],
        json!([{"type": "Property", "value": 50, "observedAt": at(70)}])
    );
    // Ids alone are not a temporal query; an id is a URI.
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/temporal/entities?id=urn:ngsi-ld:Car:A",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _, _) = ld(
        &c,
        "GET",
        "/ngsi-ld/v1/temporal/entities/not-a-uri",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400);
}
