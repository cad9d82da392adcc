//! NGSIv2 registrations (`/v2/registrations`) seen from a client: created,
//! retrieved, listed with paging and count, scoped by tenant and service
//! path, deleted, refused with Orion's texts, and kept across a crash.

use serde_json::{json, Value};

use crate::util::*;

fn registration(entity: &str, attr: &str) -> Value {
    json!({
        "description": format!("provider of {entity}"),
        "dataProvided": {"entities": [{"id": entity, "type": "Room"}], "attrs": [attr]},
        "provider": {"http": {"url": "http://localhost:1028/v2"}}
    })
}

/// Creates a registration and returns its id (from `Location`).
async fn create(c: &Client, headers: &[(&str, &str)], body: &Value) -> String {
    let (status, h, reply) = call(c, "POST", "/v2/registrations", headers, Some(body)).await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply, Value::Null, "201 has no body");
    let location = h["location"].to_str().unwrap();
    let id = location
        .strip_prefix("/v2/registrations/")
        .expect("Location: /v2/registrations/{id}");
    assert!(
        id.len() == 24 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    id.to_string()
}

fn ids(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("a JSON array")
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect()
}

/// The life of registrations: create, retrieve (Orion's rendering with
/// its defaults), list in creation order with paging and count, filter by
/// service path, isolate tenants, delete; PATCH is Orion's 405.
#[tokio::test]
async fn registrations_are_stored_listed_and_deleted() {
    let server = Server::start();
    let c = server.client();
    let tenant = [("Fiware-Service", "reg_t")];
    let a = create(&c, &tenant, &registration("R1", "temperature")).await;
    let b = create(
        &c,
        &[
            ("Fiware-Service", "reg_t"),
            ("Fiware-ServicePath", "/floor1"),
        ],
        &registration("R2", "humidity"),
    )
    .await;
    let third = json!({
        "dataProvided": {"entities": [{"idPattern": ".*", "type": "Room"}]},
        "provider": {"http": {"url": "http://cp.example.org"},
                     "supportedForwardingMode": "query"},
        "expires": "2040-01-01T14:00:00Z",
        "status": "inactive"
    });
    let c3 = create(&c, &tenant, &third).await;

    let (status, _, got) = call(&c, "GET", &format!("/v2/registrations/{a}"), &tenant, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        got,
        json!({
            "id": a,
            "description": "provider of R1",
            "dataProvided": {"entities": [{"id": "R1", "type": "Room"}], "attrs": ["temperature"]},
            "provider": {"http": {"url": "http://localhost:1028/v2"},
                         "supportedForwardingMode": "all", "legacyForwarding": false},
            "status": "active"
        })
    );
    let (_, _, got) = call(&c, "GET", &format!("/v2/registrations/{c3}"), &tenant, None).await;
    assert_eq!(got["expires"], "2040-01-01T14:00:00.000Z");
    assert_eq!(got["status"], "inactive");
    assert_eq!(got["provider"]["supportedForwardingMode"], "query");
    assert_eq!(got["dataProvided"]["attrs"], json!([]));

    // Creation order, paging, count.
    let (status, h, list) = call(&c, "GET", "/v2/registrations", &tenant, None).await;
    assert_eq!(status, 200);
    assert_eq!(ids(&list), [&a, &b, &c3]);
    assert!(!h.contains_key("fiware-total-count"));
    let (_, h, list) = call(
        &c,
        "GET",
        "/v2/registrations?options=count&limit=1&offset=1",
        &tenant,
        None,
    )
    .await;
    assert_eq!(ids(&list), [&b]);
    assert_eq!(h["fiware-total-count"], "3");
    let (_, _, list) = call(&c, "GET", "/v2/registrations?limit=0", &tenant, None).await;
    assert_eq!(list, json!([]));
    let (status, _, err) = call(&c, "GET", "/v2/registrations?limit=-1", &tenant, None).await;
    assert_eq!(status, 400, "{err}");

    // Service paths scope listings, not lookups by id.
    let floor1 = [
        ("Fiware-Service", "reg_t"),
        ("Fiware-ServicePath", "/floor1"),
    ];
    let (_, _, list) = call(&c, "GET", "/v2/registrations", &floor1, None).await;
    assert_eq!(ids(&list), [&b]);
    let (status, _, _) = call(&c, "GET", &format!("/v2/registrations/{a}"), &floor1, None).await;
    assert_eq!(status, 200);

    // Tenants are isolated.
    for other in [&[][..], &[("Fiware-Service", "other")][..]] {
        let (_, _, list) = call(&c, "GET", "/v2/registrations", other, None).await;
        assert_eq!(list, json!([]));
        let (status, _, err) =
            call(&c, "GET", &format!("/v2/registrations/{a}"), other, None).await;
        assert_eq!(status, 404);
        assert_eq!(
            err,
            json!({"error": "NotFound",
                   "description": "The requested registration has not been found. Check id"})
        );
    }

    // Orion 3.10 has no PATCH for registrations.
    let (status, h, err) = call(
        &c,
        "PATCH",
        &format!("/v2/registrations/{a}"),
        &tenant,
        Some(&json!({"status": "inactive"})),
    )
    .await;
    assert_eq!(status, 405);
    assert_eq!(h["allow"], "GET, DELETE");
    assert_eq!(err["error"], "MethodNotAllowed");

    // Delete, then it is gone; an id of any shape is a 404.
    let path = format!("/v2/registrations/{a}");
    let (status, _, body) = call(&c, "DELETE", &path, &tenant, None).await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, _, _) = call(&c, "DELETE", &path, &tenant, None).await;
    assert_eq!(status, 404);
    let (status, _, _) = call(&c, "GET", &path, &tenant, None).await;
    assert_eq!(status, 404);
    let (status, _, _) = call(&c, "GET", "/v2/registrations/inexistentid", &tenant, None).await;
    assert_eq!(status, 404);
    let (_, _, list) = call(&c, "GET", "/v2/registrations", &tenant, None).await;
    assert_eq!(ids(&list), [&b, &c3]);
}

/// Bad bodies get Orion's 400 texts, patterns Orion does not implement
/// get 501, and none of them creates anything.
#[tokio::test]
async fn bad_registrations_are_refused() {
    let server = Server::start();
    let c = server.client();
    let cases = [
        (
            json!({"dataProvided": {"entities": [{"id": "E1", "type": "T1"}],
                                    "attrs": ["brandName ", "speed"]},
                   "provider": {"http": {"url": "http://contextsource.example.org"}}}),
            400,
            "forbidden characters in attribute name",
        ),
        (
            json!({"description": "DESC"}),
            400,
            "the field /dataProvided/ is missing in payload",
        ),
        (
            json!({"dataProvided": {"entities": [{"id": "E1"}]}}),
            400,
            "the field /provider/ is missing in payload",
        ),
        (
            json!({"dataProvided": {"entities": [{"id": "E1"}]},
                   "provider": {"http": {"url": "www:/abc"}}}),
            400,
            "/url/ field of /http/ is invalid",
        ),
        (
            json!({"dataProvided": {"entities": [{"idPattern": "E.*"}]},
                   "provider": {"http": {"url": "http://cp.example.org"}}}),
            501,
            "Unsupported idPattern",
        ),
    ];
    for (body, want_status, want_text) in cases {
        let (status, _, err) = call(&c, "POST", "/v2/registrations", &[], Some(&body)).await;
        assert_eq!(status, want_status, "{body}");
        assert_eq!(err["description"], want_text, "{body}");
    }
    let resp = c
        .http
        .post(format!("{}/v2/registrations", c.url))
        .header("Content-Type", "application/json")
        .body("{{")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(
        err,
        json!({"error": "BadRequest", "description": "Errors found in incoming JSON buffer"})
    );
    let (_, _, list) = call(&c, "GET", "/v2/registrations", &[], None).await;
    assert_eq!(list, json!([]));
}

/// An acknowledged registration survives a crash (kill -9), and the ids
/// and order continue after it.
#[tokio::test]
async fn registrations_survive_a_crash() {
    let mut server = Server::start();
    let c = server.client();
    let a = create(&c, &[], &registration("R1", "temperature")).await;
    let b = create(&c, &[], &registration("R2", "temperature")).await;
    let (status, _, _) = call(&c, "DELETE", &format!("/v2/registrations/{a}"), &[], None).await;
    assert_eq!(status, 204);
    server.restart();
    let c = server.client();
    let (_, _, list) = call(&c, "GET", "/v2/registrations", &[], None).await;
    assert_eq!(ids(&list), [&b]);
    let d = create(&c, &[], &registration("R3", "temperature")).await;
    assert_ne!(d, b);
    let (_, _, list) = call(&c, "GET", "/v2/registrations", &[], None).await;
    assert_eq!(ids(&list), [&b, &d]);
}
