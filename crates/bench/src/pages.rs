//! The `pages` scenario: Knot.x's published performance scenarios (seed
//! 004) with templates and mock service payloads of the same shapes. The
//! mock services run in the bench process on loopback; the bench stores
//! the scenario's services and template, then C clients GET the page back
//! to back. Every response is checked against the rendering the bench
//! computes itself.
//!
//! - `1`: a 3.2 KB template with 1 snippet over one 750 B JSON service.
//! - `5`: a 54 KB template with 100 snippets, each `{{#each _result}}` over
//!   the people of one shared 111 KB JSON (50 people × 4 friends); the page
//!   renders to ~1.6 MB.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::http::{render_request, Conn};
use crate::summary::{micros_histogram, Check, Metric, Summary, Trend};

/// Flags of `weft bench pages`.
#[derive(Debug, Clone, clap::Args)]
pub struct PagesArgs {
    /// The flags every scenario takes.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Knot.x scenario: 1 (one snippet, small service) or 5 (100
    /// snippets over one 111 KB service).
    #[arg(long, default_value_t = 1)]
    pub scenario: u8,

    /// Concurrent clients, each on its own keep-alive connection.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
}

/// A person of scenario 5's service.
fn people() -> Value {
    let people: Vec<Value> = (0..50)
        .map(|i| {
            json!({
                "id": i, "firstName": format!("First{i}"), "lastName": format!("Last{i}"),
                "email": format!("person{i}@example.com"), "company": format!("Company {}", i % 7),
                "about": "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id est laborum. Sed ut perspiciatis unde omnis iste natus error sit voluptatem accusantium doloremque laudantium, totam rem aperiam, eaque ipsa quae ab illo inventore veritatis et quasi architecto beatae vitae dicta sunt explicabo. Nemo enim ipsam voluptatem quia voluptas sit aspernatur aut odit aut fugit, sed quia consequuntur magni dolores eos qui ratione voluptatem sequi nesciunt. Neque porro quisquam est, qui dolorem ipsum quia dolor sit amet, consectetur, adipisci velit, sed quia non numquam eius modi tempora incidunt ut labore et dolore magnam aliquam quaerat voluptatem. Ut enim ad minima veniam, quis nostrum exercitationem ullam corporis suscipit laboriosam, nisi ut aliquid ex ea commodi consequatur? Quis autem vel eum iure reprehenderit qui in ea voluptate velit esse quam nihil molestiae consequatur, vel illum qui dolorem eum fugiat quo voluptas nulla pariatur? At vero eos et accusamus et iusto odio dignissimos ducimus qui blanditiis praesentium voluptatum deleniti atque corrupti quos dolores et quas molestias excepturi sint occaecati cupiditate non provident.",
                "tags": ["alpha", "beta", "gamma", "delta", "epsilon"],
                "friends": (0..4).map(|f| json!({"id": f, "name": format!("Friend {i}-{f}")})).collect::<Vec<_>>()
            })
        })
        .collect();
    Value::Array(people)
}

/// Scenario 1's service body (~750 B).
fn small() -> Value {
    json!({"message": "Hello from the mock service",
           "items": (0..12).map(|i| json!({"name": format!("Item number {i}"), "value": i * 7})).collect::<Vec<_>>()})
}

/// A scenario: its template, its services (name → body) and the
/// rendering the server must answer with.
type Scenario = (String, Vec<(&'static str, Value)>, String);

/// The scenario's template, services and expected rendering, computed
/// here independently of the server.
fn scenario(n: u8) -> anyhow::Result<Scenario> {
    match n {
        1 => {
            let filler =
                "<p>Static content of the page, passed through byte for byte.</p>\n".repeat(45);
            let snippet = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"small\" \
                           type=\"text/knotx-snippet\"><h2>{{_result.message}}</h2><ul>{{#each _result.items}}\
                           <li>{{name}}: {{value}}</li>{{/each}}</ul></script>";
            let template = format!("<html><body>\n{filler}{snippet}\n</body></html>");
            let body = small();
            let mut rendered = format!(
                "<h2>{}</h2><ul>",
                body["message"].as_str().unwrap_or_default()
            );
            for item in body["items"].as_array().into_iter().flatten() {
                rendered.push_str(&format!(
                    "<li>{}: {}</li>",
                    item["name"].as_str().unwrap_or_default(),
                    item["value"]
                ));
            }
            rendered.push_str("</ul>");
            let expected = format!("<html><body>\n{filler}{rendered}\n</body></html>");
            Ok((template, vec![("small", body)], expected))
        }
        5 => {
            let snippet = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"people\" \
                           type=\"text/knotx-snippet\"><ul>{{#each _result}}<li>{{firstName}} {{lastName}} \
                           ({{email}}, {{company}}){{#each friends}} {{name}}{{/each}}<p>{{about}}</p></li>{{/each}}</ul></script>";
            let filler =
                "<div class=\"static\">Section of the page between snippets.</div>\n".repeat(2);
            let template: String = (0..100).map(|_| format!("{filler}{snippet}")).collect();
            let body = people();
            let mut rendered = String::from("<ul>");
            for p in body.as_array().into_iter().flatten() {
                rendered.push_str(&format!(
                    "<li>{} {} ({}, {})",
                    p["firstName"].as_str().unwrap_or_default(),
                    p["lastName"].as_str().unwrap_or_default(),
                    p["email"].as_str().unwrap_or_default(),
                    p["company"].as_str().unwrap_or_default()
                ));
                for f in p["friends"].as_array().into_iter().flatten() {
                    rendered.push_str(&format!(" {}", f["name"].as_str().unwrap_or_default()));
                }
                rendered.push_str(&format!(
                    "<p>{}</p></li>",
                    p["about"].as_str().unwrap_or_default()
                ));
            }
            rendered.push_str("</ul>");
            let expected: String = (0..100).map(|_| format!("{filler}{rendered}")).collect();
            Ok((template, vec![("people", body)], expected))
        }
        other => bail!("--scenario {other}: only 1 and 5 are reproduced so far"),
    }
}

/// Serves each service body at `/<name>` on loopback.
async fn mock_services(bodies: Vec<(&'static str, Value)>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let bodies: Arc<BTreeMap<String, Bytes>> = Arc::new(
        bodies
            .into_iter()
            .map(|(n, v)| (format!("/{n}"), Bytes::from(v.to_string())))
            .collect(),
    );
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let bodies = bodies.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let body = bodies.get(req.uri().path()).cloned().unwrap_or_default();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("Content-Type", "application/json")
                                .body(body_text(body))
                                .expect("a valid response"),
                        )
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// A response body as text (hyper serves `String` bodies as they are).
fn body_text(b: Bytes) -> String {
    String::from_utf8(b.to_vec()).unwrap_or_default()
}

/// Runs the scenario against the session's server.
pub async fn run(args: &PagesArgs, session: &Session) -> anyhow::Result<Summary> {
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    let (template, services, expected) = scenario(args.scenario)?;
    let mock = mock_services(services.clone()).await?;
    let base = &session.base;
    for (name, _) in &services {
        let def = json!({"http": {"url": format!("http://{mock}/{name}"), "timeout": "5s"}});
        let path = format!("/api/v1/page-services/{name}");
        crate::http::put_setup(
            base,
            &path,
            def.to_string().as_bytes(),
            "storing a page service",
        )
        .await?;
    }
    let page = format!("bench/scenario-{}.html", args.scenario);
    {
        let mut conn = Conn::connect(&base.connect).await.context("connecting")?;
        let path = base.path(&format!("/api/v1/pages/{page}"));
        let mut req = format!("PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n", base.host, template.len()).into_bytes();
        req.extend_from_slice(template.as_bytes());
        let head = conn.round_trip(&req, None).await?;
        if !matches!(head.status, 200 | 201) {
            bail!("storing the template answered {}", head.status);
        }
    }
    let expected = Arc::new(expected);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let base = base.clone();
        let page = page.clone();
        let expected = expected.clone();
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut latency = micros_histogram(Duration::from_secs(60));
            let (mut ok, mut bad, mut mismatched) = (0u64, 0u64, 0u64);
            let request = render_request(
                "GET",
                &base.path(&format!("/pages/{page}")),
                &base.host,
                &[],
                None,
            );
            let mut conn: Option<Conn> = None;
            let mut body = Vec::with_capacity(expected.len() + 1024);
            while !stop.load(Ordering::Relaxed) {
                if conn.is_none() {
                    conn = Conn::connect(&base.connect).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    bad += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                body.clear();
                let sent = Instant::now();
                match c.round_trip(&request, Some(&mut body)).await {
                    Ok(head) if head.status == 200 => {
                        latency.saturating_record(sent.elapsed().as_micros() as u64);
                        if body == expected.as_bytes() {
                            ok += 1;
                        } else {
                            mismatched += 1;
                        }
                    }
                    _ => {
                        bad += 1;
                        conn = None;
                    }
                }
            }
            (latency, ok, bad, mismatched)
        }));
    }
    tokio::time::sleep(args.common.duration).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut latency: Histogram<u64> = micros_histogram(Duration::from_secs(60));
    let (mut ok, mut bad, mut mismatched) = (0, 0, 0);
    for c in clients {
        let (l, o, b, m) = c.await?;
        let _ = latency.add(&l);
        ok += o;
        bad += b;
        mismatched += m;
    }
    let secs = elapsed.as_secs_f64();
    let mut s = Summary {
        scenario: "pages".to_string(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: match json!({"scenario": args.scenario, "clients": args.clients,
                             "template_bytes": template.len(), "page_bytes": expected.len()}) {
            Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        },
        phases: vec![("load".to_string(), secs)],
        description: vec![format!(
            "Knot.x scenario {}: {} clients GET /pages/{page} back to back ({} B template → {} B page)",
            args.scenario,
            args.clients,
            template.len(),
            expected.len()
        )],
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
    };
    s.checks
        .push(Check::new("status was 200", ok + mismatched, bad));
    s.checks.push(Check::new(
        "body matches the expected rendering",
        ok,
        mismatched,
    ));
    s.metrics.insert("pages".into(), Metric::counter(ok, secs));
    s.metrics.insert(
        "page_duration".into(),
        Metric::Trend(Trend::from_micros(&latency)),
    );
    s.seal();
    Ok(s)
}
