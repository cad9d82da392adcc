//! The console's HTTP side: its files served at `/` and `/console/…`
//! without a key, with their types, ETag revalidation and a
//! Content-Security-Policy; NGSI's answers for other paths unchanged; and
//! the paged device listing the console reads (`limit`, `offset`, `q`,
//! `X-Total-Count`, `lastSeen`, `state`) with its 400s. The browser tests
//! are in `tests/console/`.

use serde_json::{json, Value};

use crate::util::*;

/// `GET /` is the console's page, and its scripts and styles come with
/// their types, a strong ETag (304 when the browser holds the file) and a
/// policy that lets the page reach this origin only — all without a key.
/// A file the console does not have is a 404; NGSI's own root paths
/// answer as before.
#[tokio::test]
async fn console_files_are_served_with_types_tags_and_policy() {
    let server = Server::start();
    let anonymous = server.client_with(None).http;
    let get = |path: &str| anonymous.get(format!("{}{}", server.url, path)).send();
    let page = get("/").await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script type="module" src="/console/app.js">"#));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from the internet"
    );

    for (path, kind) in [
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/views/device.js", "text/javascript; charset=utf-8"),
        ("/console/style.css", "text/css; charset=utf-8"),
        (
            "/console/vendor/uplot/uPlot.iife.min.js",
            "text/javascript; charset=utf-8",
        ),
    ] {
        let resp = get(path).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.headers()["content-type"], kind, "{path}");
        assert_eq!(resp.headers()["cache-control"], "no-cache", "{path}");
        let tag = resp.headers()["etag"].clone();
        let again = anonymous
            .get(format!("{}{}", server.url, path))
            .header("If-None-Match", tag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{path}");
    }
    assert_eq!(get("/console/nothing.js").await.unwrap().status(), 404);
    assert_eq!(get("/console/..%2FCargo.toml").await.unwrap().status(), 404);

    // The rest still needs a key, and NGSI's paths answer as Orion does.
    assert_eq!(get("/api/v1/devices").await.unwrap().status(), 401);
    let c = server.client();
    let (status, body) = c.send("GET", "/v2/nothing/here", None, None).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["description"],
        "Service not found. Check your URL as probably it is wrong."
    );
    let (status, version) = c.send("GET", "/version", None, None).await;
    assert_eq!(status, 200);
    assert!(version["orion"]["version"].is_string(), "{version}");
}

/// The console's device listing: pages in id order with the total in
/// `X-Total-Count`, a search over ids and names, `lastSeen` from the
/// device's latest unit and `state` from its events; bad paging
/// parameters are 400s that name the parameter. Without paging
/// parameters the listing is whole, as before.
#[tokio::test]
async fn devices_page_with_search_total_and_last_seen() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    for i in 0..30 {
        let name = if i == 17 {
            "Greenhouse North"
        } else {
            "sensor"
        };
        let device = json!({"name": name, "type": "em300th", "channel": "farm"});
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/devices/d{i:03}"),
            Some(&device),
        )
        .await;
    }
    let page = |query: &'static str| {
        let c = c.clone();
        async move {
            let resp = c
                .http
                .get(format!("{}/api/v1/devices?{query}", c.url))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{query}");
            let total: u64 = resp.headers()["x-total-count"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let body: Vec<Value> = resp.json().await.unwrap();
            let ids: Vec<String> = body
                .iter()
                .map(|d| d["id"].as_str().unwrap().to_string())
                .collect();
            (total, ids, body)
        }
    };
    let (total, ids, _) = page("limit=5").await;
    assert_eq!(
        (total, ids),
        (
            30,
            vec![
                "d000".into(),
                "d001".into(),
                "d002".into(),
                "d003".into(),
                "d004".into()
            ]
        )
    );
    let (total, ids, _) = page("limit=5&offset=27").await;
    assert_eq!(
        (total, ids),
        (30, vec!["d027".into(), "d028".into(), "d029".into()])
    );
    let (total, ids, _) = page("q=GREENHOUSE").await;
    assert_eq!((total, ids), (1, vec!["d017".into()]));
    let (total, ids, _) = page("q=d02&limit=2&type=em300th").await;
    assert_eq!((total, ids), (10, vec!["d020".into(), "d021".into()]));
    let (total, ids, _) = page("type=other&limit=5").await;
    assert_eq!((total, ids), (0, Vec::<String>::new()));

    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("u-1", "d003", 21, 40, 1_700_000_000_000),
    )
    .await;
    c.unit_eventually("u-1").await;
    let (_, _, body) = page("limit=2&offset=2").await;
    assert_eq!(body[0]["lastSeen"], Value::Null);
    assert_eq!(body[1]["id"], "d003");
    assert_eq!(body[1]["lastSeen"], 1_700_000_000_000i64);
    assert_eq!(body[1]["state"], json!({}));

    let (total, ids, _) = page("channel=farm").await;
    assert_eq!((total, ids.len()), (30, 30), "unpaged: the whole list");

    for (query, names) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("offset=-1", "offset"),
        ("sort=id", "sort"),
    ] {
        let (status, body) = c
            .send("GET", &format!("/api/v1/devices?{query}"), None, None)
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["description"].as_str().unwrap().contains(names),
            "{query}: {body}"
        );
    }
    let long = "x".repeat(300);
    let (status, _) = c
        .send("GET", &format!("/api/v1/devices?q={long}"), None, None)
        .await;
    assert_eq!(status, 400);

    // What the listing adds is read-only: a device read and written back
    // keeps its fields.
    let (_, _, body) = page("limit=1&offset=3").await;
    let mut back = body[0].clone();
    back.as_object_mut().unwrap().remove("id");
    c.expect(200, "PUT", "/api/v1/devices/d003", Some(&back))
        .await;
}
