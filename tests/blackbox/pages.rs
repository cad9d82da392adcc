//! Pages: Knot.x markup rendered from external services and weft's own
//! data; static markup byte for byte; failing or slow services fall back
//! while the page answers 200; identical calls are made once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// A mock service on an ephemeral port: `/first` and `/people` answer
/// JSON (counting calls), `/fail` 500, `/slow` after 3 s.
async fn mock() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new()
        .route(
            "/first",
            axum::routing::get(
                move |q: axum::extract::Query<std::collections::HashMap<String, String>>| {
                    let counted = counted.clone();
                    async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        axum::Json(json!({
                            "message": "Hello <world>",
                            "limit": q.get("limit").cloned().unwrap_or_default(),
                            "items": [{"name": "Everest"}, {"name": "K2"}],
                            "messner-mountains": ["Nanga Parbat", "Manaslu"]
                        }))
                    }
                },
            ),
        )
        .route(
            "/fail",
            axum::routing::get(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no") }),
        )
        .route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                axum::Json(json!({"late": true}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

async fn put_text(c: &Client, path: &str, body: &str) -> u16 {
    c.http
        .put(format!("{}{path}", c.url))
        .header("Content-Type", "text/html")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn get_page(c: &Client, path: &str) -> (u16, String) {
    let resp = c.http.get(format!("{}{path}", c.url)).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Page requests that need the very same service call while it is under
/// way share it: eight concurrent views of a page whose service answers
/// after 400 ms make one call; views that differ in a request header
/// (which a `{header.x}` placeholder could send on) each make their own.
#[tokio::test]
async fn concurrent_identical_calls_are_made_once() {
    let server = Server::start();
    let c = server.client();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/gate",
        axum::routing::get(move || {
            let counted = counted.clone();
            async move {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                axum::Json(json!({"n": n}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let svc = json!({"http": {"url": format!("{mock_url}/gate")}});
    c.expect(201, "PUT", "/api/v1/page-services/gate", Some(&svc))
        .await;
    let template = "<p><script data-knotx-knots=\"services,handlebars\" \
                    data-knotx-service=\"gate\" type=\"text/knotx-snippet\">\
                    call {{_result.n}}</script></p>";
    assert_eq!(put_text(&c, "/api/v1/pages/gate", template).await, 201);

    let same = futures::future::join_all((0..8).map(|_| get_page(&c, "/pages/gate"))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{same:?}");
    for (status, html) in &same {
        assert_eq!((*status, html.as_str()), (200, "<p>call 0</p>"));
    }

    let differing = futures::future::join_all((0..4).map(|i| {
        let c = &c;
        async move {
            c.http
                .get(format!("{}/pages/gate", c.url))
                .header("X-User", format!("user-{i}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    }))
    .await;
    assert_eq!(differing, vec![200; 4]);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// The services of a page are called all at once, whether one snippet
/// binds several (under their names) or several snippets bind one each:
/// the mock answers none of the four calls until all four are under way
/// (a barrier; a call left waiting 3 s fails and its snippet falls back),
/// so a page calling them one after the other renders fallbacks.
#[tokio::test]
async fn a_pages_services_are_called_concurrently() {
    let server = Server::start();
    let c = server.client();
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let app = axum::Router::new().route(
        "/together/{name}",
        axum::routing::get(
            move |axum::extract::Path(name): axum::extract::Path<String>| {
                let barrier = barrier.clone();
                async move {
                    match tokio::time::timeout(Duration::from_secs(3), barrier.wait()).await {
                        Ok(_) => Ok(axum::Json(json!({"name": name}))),
                        Err(_) => Err(axum::http::StatusCode::GATEWAY_TIMEOUT),
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    for name in ["a", "b", "c", "d"] {
        let svc = json!({"http": {"url": format!("{mock_url}/together/{name}"), "timeout": "5s"}});
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/page-services/together-{name}"),
            Some(&svc),
        )
        .await;
    }
    let template = "<p><script data-knotx-knots=\"services,handlebars\" \
                    data-knotx-service-x=\"together-a\" data-knotx-service-y=\"together-b\" \
                    data-knotx-fallback=\"BLANK\" type=\"text/knotx-snippet\">\
                    {{x._result.name}}{{y._result.name}}</script>\
                    <script data-knotx-knots=\"services,handlebars\" \
                    data-knotx-service=\"together-c\" data-knotx-fallback=\"BLANK\" \
                    type=\"text/knotx-snippet\">{{_result.name}}</script>\
                    <script data-knotx-knots=\"services,handlebars\" \
                    data-knotx-service=\"together-d\" data-knotx-fallback=\"BLANK\" \
                    type=\"text/knotx-snippet\">{{_result.name}}</script></p>";
    assert_eq!(put_text(&c, "/api/v1/pages/together", template).await, 201);
    assert_eq!(
        get_page(&c, "/pages/together").await,
        (200, "<p>abcd</p>".to_string())
    );
}

/// A Knot.x template renders exactly the expected HTML: markup outside
/// snippets untouched, root and namespaced bindings, params, each/@index,
/// if, with, lookups, dashed paths, escaping; a failing service uses its
/// fallback element, a slow one BLANK, one without a fallback the default;
/// an unprocessed snippet is unwrapped; the page answers 200.
#[tokio::test]
async fn a_knotx_template_renders_with_fallbacks() {
    let server = Server::start();
    let c = server.client();
    let (mock_url, calls) = mock().await;
    for (name, url, timeout) in [
        (
            "first",
            format!("{mock_url}/first?limit={{param.limit}}"),
            "2s",
        ),
        ("broken", format!("{mock_url}/fail"), "2s"),
        ("slow", format!("{mock_url}/slow"), "200ms"),
    ] {
        let svc = json!({"http": {"url": url, "timeout": timeout}});
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/page-services/{name}"),
            Some(&svc),
        )
        .await;
    }
    let template = concat!(
        "<!DOCTYPE html>\n<html><head><script src=\"app.js\"></script></head><body>\n",
        "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"first\" ",
        "data-knotx-service-again=\"first\" data-knotx-params='{\"limit\":\"5\"}' type=\"text/knotx-snippet\">",
        "<h2>{{_result.message}}</h2><ul>{{#each _result.items}}<li>{{@index}}:{{name}}</li>{{/each}}</ul>",
        "<p>{{_result.messner-mountains.1}} {{again._result.limit}} {{_response.statusCode}}</p>",
        "{{#if _result.items}}yes{{/if}}{{#with _result}}[{{limit}}]{{/with}}{{#bold}}no{{/bold}}",
        "</script>\n",
        "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"broken\" ",
        "data-knotx-fallback=\"fb\" type=\"text/knotx-snippet\">{{_result.x}}</script>",
        "<knotx:fallback data-knotx-fallback-id=\"fb\"><p class=\"err\">unavailable</p></knotx:fallback>\n",
        "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"slow\" ",
        "data-knotx-fallback=\"BLANK\" type=\"text/knotx-snippet\">{{_result.late}}</script>|",
        "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"nope\" ",
        "type=\"text/knotx-snippet\">{{x}}</script>|",
        "<script data-knotx-knots=\"other\" type=\"text/knotx-snippet\"><i>raw</i></script>\n",
        "</body></html>"
    );
    assert_eq!(
        put_text(&c, "/api/v1/pages/site/home.html", template).await,
        201
    );
    assert_eq!(
        put_text(&c, "/api/v1/pages/site/home.html", template).await,
        200
    );
    let (status, html) = get_page(&c, "/pages/site/home.html").await;
    assert_eq!(status, 200);
    let expected = concat!(
        "<!DOCTYPE html>\n<html><head><script src=\"app.js\"></script></head><body>\n",
        "<h2>Hello &lt;world&gt;</h2><ul><li>0:Everest</li><li>1:K2</li></ul>",
        "<p>Manaslu 5 200</p>yes[5]",
        "\n",
        "<p class=\"err\">unavailable</p>",
        "\n",
        "|",
        "|",
        "<!-- SNIPPET UNWRAPED START --><i>raw</i><!-- SNIPPET UNWRAPED STOP -->\n",
        "</body></html>"
    );
    assert_eq!(html, expected);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "two bindings of the same call: one call"
    );
    let source = get_page(&c, "/api/v1/pages/site/home.html").await.1;
    assert_eq!(source, template);
    let names = c.expect(200, "GET", "/api/v1/pages", None).await;
    assert_eq!(names, json!(["site/home.html"]));
}

/// 100 snippets on one service make one call per page request; weft's own
/// data (alarms, entities, data units) feeds snippets; unknown pages are
/// 404, bad templates and services 400.
#[tokio::test]
async fn one_call_for_many_snippets_and_internal_sources() {
    let server = Server::start();
    let c = server.client();
    let (mock_url, calls) = mock().await;
    let svc = json!({"http": {"url": format!("{mock_url}/first")}});
    c.expect(201, "PUT", "/api/v1/page-services/first", Some(&svc))
        .await;
    let snippet = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"first\" \
                   type=\"text/knotx-snippet\">{{#each _result.items}}{{name}}{{/each}}</script>";
    let template: String = (0..100)
        .map(|i| format!("<div>{i}</div>{snippet}"))
        .collect();
    assert_eq!(put_text(&c, "/api/v1/pages/many", &template).await, 201);
    let (status, html) = get_page(&c, "/pages/many").await;
    assert_eq!(status, 200);
    let expected: String = (0..100)
        .map(|i| format!("<div>{i}</div>EverestK2"))
        .collect();
    assert_eq!(html, expected);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    c.create_em300th().await;
    let rule =
        json!({"condition": "temperature>45", "alarm": {"type": "hot", "severity": "major"}});
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule)).await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("p-1", "dev-p", 50, 40, now_ms()),
    )
    .await;
    c.unit_eventually("p-1").await;
    for (name, def) in [
        ("alarms", json!({"alarms": {"state": "active"}})),
        (
            "sensors",
            json!({"entities": {"type": "{param.type}", "q": "temperature>40"}}),
        ),
        (
            "recent",
            json!({"data": {"device": "{param.device}", "limit": 5}}),
        ),
    ] {
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/page-services/{name}"),
            Some(&def),
        )
        .await;
    }
    let dashboard = concat!(
        "<script data-knotx-knots=\"services,handlebars\" data-knotx-service-a=\"alarms\" ",
        "data-knotx-service-s=\"sensors\" data-knotx-service-d=\"recent\" type=\"text/knotx-snippet\">",
        "{{#each a._result}}{{device.id}}:{{severity}};{{/each}}",
        "{{#each s._result}}{{id}}={{temperature}};{{/each}}",
        "{{#each d._result}}{{dataId}};{{/each}}</script>"
    );
    assert_eq!(
        put_text(&c, "/api/v1/pages/dashboard", dashboard).await,
        201
    );
    let html = eventually(Duration::from_secs(5), || async {
        let (_, html) = get_page(&c, "/pages/dashboard?type=TemperatureSensor&device=dev-p").await;
        html.starts_with("dev-p:major;").then_some(html)
    })
    .await;
    assert_eq!(html, "dev-p:major;dev-p=50;p-1;");

    assert_eq!(get_page(&c, "/pages/nope").await.0, 404);
    assert_eq!(
        put_text(
            &c,
            "/api/v1/pages/bad",
            "<script data-knotx-knots=\"handlebars\">{{#each}}"
        )
        .await,
        400
    );
    let (s, _) = c
        .send(
            "PUT",
            "/api/v1/page-services/bad",
            Some(&json!({"params": {}})),
            None,
        )
        .await;
    assert_eq!(s, 400);
    let _: Value = c.expect(204, "DELETE", "/api/v1/pages/many", None).await;
    assert_eq!(get_page(&c, "/pages/many").await.0, 404);
}

/// Templates in the configured directory are pages from the start, named
/// by their path below it, and services can be given in the configuration.
#[tokio::test]
async fn templates_and_services_from_the_configuration() {
    let (mock_url, _) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("site")).unwrap();
    std::fs::write(
        dir.path().join("site/about.html"),
        "<p>about us</p><script data-knotx-knots=\"services,handlebars\" \
         data-knotx-service=\"first\" type=\"text/knotx-snippet\">{{_result.message}}</script>",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a page").unwrap();
    let config = dir.path().join("weft.toml");
    std::fs::write(
        &config,
        format!(
            "[pages]\ndirectory = {:?}\n[pages.services.first.http]\nurl = \"{mock_url}/first\"\n",
            dir.path().to_str().unwrap()
        ),
    )
    .unwrap();
    let server = Server::start_with_env(&[("WEFT_CONFIG", config.to_str().unwrap())]);
    let c = server.client();
    assert_eq!(
        get_page(&c, "/pages/site/about.html").await,
        (200, "<p>about us</p>Hello &lt;world&gt;".to_string())
    );
    assert_eq!(get_page(&c, "/pages/notes.txt").await.0, 404);
}

/// A cached result is served without a call until its TTL passes; when
/// the service fails, the last result is served stale; a service failing
/// `failures` times in a row is not called while its breaker is open.
#[tokio::test]
async fn cache_serve_stale_and_circuit_breaker() {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let (f, n) = (failing.clone(), calls.clone());
    let app = axum::Router::new().route(
        "/flaky",
        axum::routing::get(move || {
            let (f, n) = (f.clone(), n.clone());
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                if f.load(Ordering::SeqCst) {
                    Err(axum::http::StatusCode::BAD_GATEWAY)
                } else {
                    Ok(axum::Json(json!({"v": "fresh"})))
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/flaky", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let server = Server::start();
    let c = server.client();
    for (name, spec) in [
        (
            "cached",
            json!({"http": {"url": url}, "cache": {"ttl": "1h"}}),
        ),
        (
            "stale",
            json!({"http": {"url": url}, "cache": {"ttl": "0s", "serveStale": true},
                         "circuitBreaker": {"failures": 100}}),
        ),
        (
            "guarded",
            json!({"http": {"url": url}, "circuitBreaker": {"failures": 2, "openFor": "1h"}}),
        ),
    ] {
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/page-services/{name}"),
            Some(&spec),
        )
        .await;
        let template = format!(
            "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"{name}\" \
             data-knotx-fallback=\"BLANK\" type=\"text/knotx-snippet\">{{{{_result.v}}}}</script>"
        );
        assert_eq!(
            put_text(&c, &format!("/api/v1/pages/{name}"), &template).await,
            201
        );
    }
    let page = |name: &'static str| {
        let c = c.clone();
        async move { get_page(&c, &format!("/pages/{name}")).await.1 }
    };
    assert_eq!(page("cached").await, "fresh");
    assert_eq!(page("cached").await, "fresh");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the second render came from the cache"
    );

    assert_eq!(page("stale").await, "fresh");
    failing.store(true, Ordering::SeqCst);
    assert_eq!(
        page("stale").await,
        "fresh",
        "served stale while the service fails"
    );

    let before = calls.load(Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(page("guarded").await, "", "the fallback");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        2,
        "open after two failures: not called again"
    );
}

/// Each of Knot.x's six scenario shapes (templates and service payloads of
/// the published sizes and JSON shapes) renders exactly the page computed
/// independently by the benchmark's fixtures.
#[tokio::test]
async fn each_knotx_scenario_shape_renders_exactly() {
    use weft_bench::pages::{mock::Mock, payload};
    let server = Server::start();
    let c = server.client();
    let (listener, mock_url) = Mock::bind().await.unwrap();
    let fixtures = [
        payload::scenario1(&mock_url),
        payload::scenario2(&mock_url),
        payload::scenario3(&mock_url),
        payload::scenario4(&mock_url),
        payload::scenario5(&mock_url),
        payload::scenario6(&mock_url),
    ];
    let mut bodies = std::collections::HashMap::new();
    for f in &fixtures {
        for (_, url, body) in &f.services {
            let path = url.strip_prefix(&mock_url).unwrap().to_string();
            bodies.insert(path, hyper::body::Bytes::from(body.clone()));
        }
    }
    let _mock = Mock::serve(listener, mock_url.clone(), bodies);
    for (i, f) in fixtures.iter().enumerate() {
        for (name, url, _) in &f.services {
            let def = json!({"http": {"url": url, "timeout": "5s"}});
            let (s, _) = c
                .send(
                    "PUT",
                    &format!("/api/v1/page-services/{name}"),
                    Some(&def),
                    None,
                )
                .await;
            assert!(
                s == 200 || s == 201,
                "scenario {}: service {name}: {s}",
                i + 1
            );
        }
        assert_eq!(
            put_text(&c, &format!("/api/v1/pages/{}", f.page), &f.template).await,
            201
        );
        let (status, html) = get_page(&c, &format!("/pages/{}", f.page)).await;
        assert_eq!(status, 200, "scenario {}", i + 1);
        assert!(
            html.as_bytes() == f.expected.as_slice(),
            "scenario {} differs",
            i + 1
        );
    }
}

/// A snippet of markup processed by Handlebars only (no services).
fn hbs_snippet(body: &str) -> String {
    format!("<script data-knotx-knots=\"handlebars\" type=\"text/knotx-snippet\">{body}</script>")
}

/// Status and JSON body of a template `PUT`.
async fn put_template(c: &Client, name: &str, body: &str) -> (u16, Value) {
    let resp = c
        .http
        .put(format!("{}/api/v1/pages/{name}", c.url))
        .header("Content-Type", "text/html")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Templates that would recurse without end or nest thousands deep when
/// rendered — a partial including itself, two snippets including each
/// other, an inline partial calling itself, 2,000 nested blocks, a
/// partial named by an expression — or whose compiling would nest as
/// deep (2,000 nested subexpressions, 20,000 `{{else if}}`) are refused
/// when stored, with a 400
/// naming the problem; the page stored before stays as it was and still
/// renders, and weft keeps answering.
#[tokio::test]
async fn templates_that_recurse_or_nest_too_deep_are_refused() {
    let server = Server::start();
    let c = server.client();
    let good = format!("<p>{}</p>", hbs_snippet("fine"));
    let deep = "{{#unless x}}".repeat(2_000) + "deep" + &"{{/unless}}".repeat(2_000);
    let parens = format!(
        "{{{{len {}a{}}}}}",
        "(len ".repeat(2_000),
        ")".repeat(2_000)
    );
    let else_ifs = format!(
        "{{{{#if a}}}}{}x{{{{/if}}}}",
        "{{else if b}}".repeat(20_000)
    );
    let chain: String = (0..300)
        .map(|i| hbs_snippet(&format!("{i}{{{{> {}}}}}", i + 1)))
        .collect();
    let cases = [
        ("self", hbs_snippet("a{{> 0}}"), "partial cycle"),
        (
            "pair",
            hbs_snippet("a{{> 1}}") + &hbs_snippet("b{{> 0}}"),
            "partial cycle",
        ),
        (
            "inline",
            hbs_snippet("{{#*inline \"me\"}}x{{> me}}{{/inline}}{{> me}}"),
            "partial cycle",
        ),
        ("deep", hbs_snippet(&deep), "deeper than 64 levels"),
        (
            "deep100",
            hbs_snippet(&("{{#each a}}".repeat(100) + &"{{/each}}".repeat(100))),
            "snippet 1 is nested deeper than 64 levels",
        ),
        ("chain", chain, "deeper than 64 levels"),
        (
            "dynamic",
            hbs_snippet("{{> (lookup this \"p\")}}"),
            "named by an expression",
        ),
        // Nested while compiling, before any render.
        ("parens", hbs_snippet(&parens), "at most 256"),
        ("elseif", hbs_snippet(&else_ifs), "block tags"),
    ];
    for (name, template, says) in cases {
        assert_eq!(
            put_text(&c, &format!("/api/v1/pages/{name}"), &good).await,
            201
        );
        let (status, reply) = put_template(&c, name, &template).await;
        assert_eq!(status, 400, "{name}: {reply}");
        assert!(
            reply["description"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{name}: {reply}"
        );
        assert_eq!(
            get_page(&c, &format!("/api/v1/pages/{name}")).await,
            (200, good.clone()),
            "{name}: the stored template is unchanged"
        );
        assert_eq!(
            get_page(&c, &format!("/pages/{name}")).await,
            (200, "<p>fine</p>".to_string()),
            "{name}"
        );
        c.expect(200, "GET", "/health", None).await;
    }
}

/// Template files that would recurse or nest too deep are not pages that
/// crash weft: viewing one is a 500 naming the problem, the other pages
/// of the directory render, and weft keeps answering.
#[tokio::test]
async fn template_files_that_recurse_fail_only_their_own_view() {
    let dir = tempfile::tempdir().unwrap();
    let deep = "{{#unless x}}".repeat(5_000) + "deep" + &"{{/unless}}".repeat(5_000);
    for (file, body) in [
        (
            "loop.html",
            hbs_snippet("a{{> 1}}") + &hbs_snippet("b{{> 0}}"),
        ),
        ("deep.html", hbs_snippet(&deep)),
        ("fine.html", format!("<p>{}</p>", hbs_snippet("fine"))),
    ] {
        std::fs::write(dir.path().join(file), body).unwrap();
    }
    let config = dir.path().join("weft.toml");
    std::fs::write(
        &config,
        format!("[pages]\ndirectory = {:?}\n", dir.path().to_str().unwrap()),
    )
    .unwrap();
    let server = Server::start_with_env(&[("WEFT_CONFIG", config.to_str().unwrap())]);
    let c = server.client();
    for (page, says) in [
        ("loop.html", "partial cycle"),
        ("deep.html", "deeper than 64 levels"),
    ] {
        let (status, body) = get_page(&c, &format!("/pages/{page}")).await;
        assert_eq!(status, 500, "{page}: {body}");
        assert!(body.contains(says), "{page}: {body}");
        c.expect(200, "GET", "/health", None).await;
    }
    assert_eq!(
        get_page(&c, "/pages/fine.html").await,
        (200, "<p>fine</p>".to_string())
    );
}

/// A mock service recording the path and raw query of every request it
/// gets; answers `{"path": …}`.
async fn recording_mock() -> (String, Arc<std::sync::Mutex<Vec<(String, String)>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let record = record.clone();
        async move {
            let path = uri.path().to_string();
            record
                .lock()
                .unwrap()
                .push((path.clone(), uri.query().unwrap_or_default().to_string()));
            axum::Json(json!({"path": path}))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// Values a page viewer sends reach a service's URL percent-encoded, as
/// data: they never add path segments, climb out of the path, add query
/// parameters or end the query; a value that would still change the path
/// (a whole segment `..`) fails that call (its snippet falls back) and
/// weft makes no request for it.
#[tokio::test]
async fn viewer_values_cannot_change_a_service_url() {
    let server = Server::start();
    let c = server.client();
    let (mock_url, seen) = recording_mock().await;
    let svc = json!({"http": {"url": format!("{mock_url}/items/{{param.id}}.json?lang={{param.lang}}&fixed=1")}});
    c.expect(201, "PUT", "/api/v1/page-services/items", Some(&svc))
        .await;
    let template = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"items\" \
                    data-knotx-fallback=\"BLANK\" type=\"text/knotx-snippet\">{{_result.path}}</script>";
    assert_eq!(put_text(&c, "/api/v1/pages/items", template).await, 201);

    let cases = [
        // (id, lang) as the viewer sends them (already URL-encoded), and
        // the path and query the service must see.
        ("7", "en", "/items/7.json", "lang=en&fixed=1"),
        (
            "..%2F..%2Fadmin%3Fall%3D1%23",
            "en%26admin%3Dtrue",
            "/items/..%2F..%2Fadmin%3Fall%3D1%23.json",
            "lang=en%26admin%3Dtrue&fixed=1",
        ),
        (
            "a%20b%2Bc%25d",
            "x%23y%3Bz",
            "/items/a%20b%2Bc%25d.json",
            "lang=x%23y%3Bz&fixed=1",
        ),
        (
            "%C5%BC%C3%B3%C5%82w",
            "pl",
            "/items/%C5%BC%C3%B3%C5%82w.json",
            "lang=pl&fixed=1",
        ),
    ];
    for (id, lang, path, query) in cases {
        seen.lock().unwrap().clear();
        let (status, html) = get_page(&c, &format!("/pages/items?id={id}&lang={lang}")).await;
        assert_eq!((status, html.as_str()), (200, path), "id={id} lang={lang}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(path.to_string(), query.to_string())],
            "id={id} lang={lang}"
        );
    }

    // A whole segment `..` would be resolved by any URL parser: refused.
    let svc = json!({"http": {"url": format!("{mock_url}/items/{{param.id}}/detail")}});
    c.expect(200, "PUT", "/api/v1/page-services/items", Some(&svc))
        .await;
    for id in ["..", ".", "%2E%2E"] {
        seen.lock().unwrap().clear();
        let (status, html) = get_page(&c, &format!("/pages/items?id={id}")).await;
        assert_eq!((status, html.as_str()), (200, ""), "id={id}: the fallback");
        let got = seen.lock().unwrap().clone();
        assert!(got.is_empty(), "id={id}: {got:?}");
    }
    seen.lock().unwrap().clear();
    assert_eq!(
        get_page(&c, "/pages/items?id=...").await,
        (200, "/items/.../detail".to_string())
    );
    c.expect(200, "GET", "/health", None).await;
}

/// Hostile page inputs — a template that is not UTF-8, tags left open,
/// `data-knotx-params` nested 10,000 deep or not an object, a snippet
/// that does not compile, a service with two sources, an unknown field or
/// a query that does not parse — each get a 400, change nothing (the
/// page and service stored before are still served as they were), and
/// weft keeps answering.
#[tokio::test]
async fn hostile_page_inputs_are_refused_and_change_nothing() {
    let server = Server::start();
    let c = server.client();
    let good = format!("<p>{}</p>", hbs_snippet("fine"));
    assert_eq!(put_text(&c, "/api/v1/pages/p", &good).await, 201);
    let svc = json!({"alarms": {"state": "active"}});
    c.expect(201, "PUT", "/api/v1/page-services/s", Some(&svc))
        .await;
    let stored = c.expect(200, "GET", "/api/v1/page-services/s", None).await;

    let deep_params = "[".repeat(10_000) + &"]".repeat(10_000);
    let templates: Vec<Vec<u8>> = vec![
        b"<p>\xff\xfe</p>".to_vec(),
        b"<script data-knotx-knots=\"handlebars\">{{x}}".to_vec(),
        b"<script data-knotx-knots=\"handlebars\" data-knotx-params='1".to_vec(),
        b"<knotx:fallback data-knotx-fallback-id=\"f\">never closed".to_vec(),
        format!(
            "<script data-knotx-knots=\"handlebars\" data-knotx-params='{deep_params}'>x</script>"
        )
        .into_bytes(),
        b"<script data-knotx-knots=\"handlebars\" data-knotx-params='[1]'>x</script>".to_vec(),
        hbs_snippet("{{#each a}}never closed").into_bytes(),
        hbs_snippet("{{#if a}}x{{/each}}").into_bytes(),
    ];
    for body in templates {
        let resp = c
            .http
            .put(format!("{}/api/v1/pages/p", c.url))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let reply: Value = resp.json().await.unwrap_or(Value::Null);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        assert_eq!(status, 400, "{shown}: {reply}");
        assert_eq!(reply["error"], "BadRequest", "{shown}: {reply}");
        assert_eq!(
            get_page(&c, "/api/v1/pages/p").await,
            (200, good.clone()),
            "{shown}"
        );
        assert_eq!(
            get_page(&c, "/pages/p").await,
            (200, "<p>fine</p>".to_string())
        );
    }

    for bad in [
        json!({"alarms": {}, "data": {}}),
        json!({"alarms": {"state": "active", "nope": 1}}),
        json!({"entities": {"q": "a==(("}}),
        json!({"http": {"url": "http://127.0.0.1:9/x", "timeout": "forever"}}),
        json!([1, 2]),
    ] {
        let (status, reply) = c
            .send("PUT", "/api/v1/page-services/s", Some(&bad), Some(KEY))
            .await;
        assert_eq!(status, 400, "{bad}: {reply}");
        assert_eq!(
            c.expect(200, "GET", "/api/v1/page-services/s", None).await,
            stored,
            "{bad}"
        );
    }
    assert_eq!(
        c.expect(200, "GET", "/api/v1/pages", None).await,
        json!(["p"])
    );
    c.expect(200, "GET", "/health", None).await;
}

/// A template whose output multiplies (an `{{#each}}` over 1,000 entities
/// inside another) fails its view with a 500 naming the limit it reached,
/// instead of taking gigabytes or the thread; other pages and weft keep
/// answering, and a viewer's value in an entities source's `q` stays one
/// literal (`a,b` does not list two ids).
#[tokio::test]
async fn a_page_that_renders_too_much_fails_only_its_view() {
    let server = Server::start();
    let c = server.client();
    let entities: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"id": format!("room-{i:04}-with-a-longer-name"), "type": "Room",
                         "temperature": {"value": i, "type": "Number"}})
        })
        .collect();
    c.expect(
        204,
        "POST",
        "/v2/op/update",
        Some(&json!({"actionType": "append", "entities": entities})),
    )
    .await;
    let all = json!({"entities": {"type": "Room", "limit": 1000}});
    c.expect(201, "PUT", "/api/v1/page-services/rooms", Some(&all))
        .await;
    let one = json!({"entities": {"q": "temperature=={param.t}"}});
    c.expect(201, "PUT", "/api/v1/page-services/room", Some(&one))
        .await;
    let squared = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"rooms\" \
                   type=\"text/knotx-snippet\">{{#each _result}}{{#each ../_result}}{{id}}\
                   {{/each}}{{/each}}</script>";
    assert_eq!(put_text(&c, "/api/v1/pages/squared", squared).await, 201);
    let lookup = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"room\" \
                  type=\"text/knotx-snippet\">{{#each _result}}{{id}};{{/each}}</script>";
    assert_eq!(put_text(&c, "/api/v1/pages/lookup", lookup).await, 201);

    let resp = c
        .http
        .get(format!("{}/pages/squared", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    let reply: Value = resp.json().await.unwrap();
    assert_eq!(reply["error"], "PageOverBudget", "{reply}");

    assert_eq!(
        get_page(&c, "/pages/lookup?t=7").await,
        (200, "room-0007-with-a-longer-name;".to_string())
    );
    assert_eq!(
        get_page(&c, "/pages/lookup?t=7,8").await,
        (200, String::new())
    );
    c.expect(200, "GET", "/health", None).await;
}
