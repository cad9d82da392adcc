//! The `pages` scenario: seed 004's Knot.x benchmarks. The bench starts
//! mock data services on loopback, stores the scenario's template and
//! services in weft, then C closed-loop clients (one keep-alive connection
//! each) GET the page back to back for `--duration`; every answer is
//! compared byte for byte with the rendering computed in [`payload`].
//!
//! Scenarios (Knot.x's numbering, shapes in [`payload`]): 1 (3.2 KB
//! template, one snippet, one 750 B service), 2 (one snippet, five
//! services), 3 (five snippets, one service each), 4 (116 KB template),
//! 5 (100 snippets on one 111 KB JSON, 1.6 MB page), 6 (one snippet with
//! 72 `#each` blocks, 1.2 MB page).

pub mod mock;
pub mod payload;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure};
use hdrhistogram::Histogram;
use hyper::body::Bytes;
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::http::{self, render_request, Conn};
use crate::progress;
use crate::summary::{micros_histogram, Check, Metric, Summary, Trend};

/// Longest latency recorded.
const LATENCY_RANGE: Duration = Duration::from_secs(60);
/// How long a setup request may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one page request may take before the client counts an error
/// and reconnects.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `weft bench pages` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PagesArgs {
    #[command(flatten)]
    /// Flags every scenario shares.
    pub common: CommonArgs,

    /// Knot.x scenario number, 1 to 6, or `soak`: Knot.x's soak mix
    /// (40/25/25/5/5 % of scenarios 1, 2, 3, 4, 6, chosen per request).
    #[arg(long, default_value = "1")]
    pub scenario: String,

    /// Concurrent clients (k6 virtual users), each on its own connection.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,

    /// Where the server renders a page: `{page}` is replaced by the
    /// fixture's page name (Knot.x serves templates from its repository,
    /// e.g. `/content/{page}`).
    #[arg(long, default_value = "/pages/{page}")]
    pub page_path: String,

    /// Address of the mock services (an ephemeral port by default); fix it
    /// when a peer's configuration names the services' URLs.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub mock_listen: String,

    /// Write each fixture's template (`<page>.html`), expected page
    /// (`<page>.expected.html`) and services (`services.json`: name → URL)
    /// into this directory, to configure a peer with.
    #[arg(long)]
    pub export_fixtures: Option<std::path::PathBuf>,
}

/// What the load phase counted.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    matched: AtomicU64,
    mismatched: AtomicU64,
    unavailable: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

/// Runs the scenario.
pub async fn run(args: &PagesArgs, session: &Session) -> anyhow::Result<Summary> {
    ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    ensure!(
        args.page_path.starts_with('/') && args.page_path.contains("{page}"),
        "--page-path must start with '/' and contain {{page}}"
    );
    let (listener, mock_url) = mock::Mock::bind_at(&args.mock_listen).await?;
    let mix: Vec<(u32, payload::Fixture)> = match args.scenario.as_str() {
        "1" => vec![(1, payload::scenario1(&mock_url))],
        "2" => vec![(1, payload::scenario2(&mock_url))],
        "3" => vec![(1, payload::scenario3(&mock_url))],
        "4" => vec![(1, payload::scenario4(&mock_url))],
        "5" => vec![(1, payload::scenario5(&mock_url))],
        "6" => vec![(1, payload::scenario6(&mock_url))],
        "soak" => vec![
            (40, payload::scenario1(&mock_url)),
            (25, payload::scenario2(&mock_url)),
            (25, payload::scenario3(&mock_url)),
            (5, payload::scenario4(&mock_url)),
            (5, payload::scenario6(&mock_url)),
        ],
        other => bail!("--scenario {other}: Knot.x's scenarios are 1 to 6, or soak"),
    };
    let bodies: HashMap<String, Bytes> = mix
        .iter()
        .flat_map(|(_, f)| f.services.iter())
        .map(|(_, url, body)| {
            let path = url.strip_prefix(&mock_url).unwrap_or(url).to_string();
            (path, Bytes::from(body.clone()))
        })
        .collect();
    let mock = mock::Mock::serve(listener, mock_url, bodies);

    if let Some(dir) = &args.export_fixtures {
        export(dir, &mix)?;
    }
    let setup_started = Instant::now();
    if !session.peer {
        for (_, fixture) in &mix {
            store(session, fixture).await?;
        }
    }
    let setup_elapsed = setup_started.elapsed();

    let pages: Arc<[Target]> = mix
        .iter()
        .map(|(weight, f)| Target {
            weight: *weight,
            request: render_request(
                "GET",
                &session
                    .base
                    .path(&args.page_path.replace("{page}", &f.page)),
                &session.base.host,
                &[],
                None,
            ),
            expected: f.expected.clone(),
        })
        .collect();
    let tally = Arc::new(Tally::default());
    let bar = progress::timed_bar(session.show_progress, "pages", args.common.duration);
    let started = Instant::now();
    let deadline = started + args.common.duration;
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let connect = session.base.connect.clone();
        let pages = pages.clone();
        let tally = tally.clone();
        clients.spawn(client(connect, pages, tally, deadline));
    }
    let mut latency = micros_histogram(LATENCY_RANGE);
    let mut tick = tokio::time::interval(progress::REFRESH);
    loop {
        tokio::select! {
            joined = clients.join_next() => match joined {
                Some(Ok(h)) => latency.add(&h).expect("same range"),
                Some(Err(e)) => bail!("a client failed: {e}"),
                None => break,
            },
            _ = tick.tick() => bar.set_position(started.elapsed().as_millis() as u64),
        }
    }
    bar.finish_and_clear();
    let load_secs = started.elapsed().as_secs_f64();

    let sent = tally.sent.load(Ordering::Relaxed);
    let matched = tally.matched.load(Ordering::Relaxed);
    let mismatched = tally.mismatched.load(Ordering::Relaxed);
    let unavailable = tally.unavailable.load(Ordering::Relaxed);
    let errors = tally.errors.load(Ordering::Relaxed);
    let mut params = serde_json::Map::new();
    params.insert("scenario".into(), json!(args.scenario));
    params.insert("concurrency".into(), json!(args.concurrency));
    params.insert(
        "duration".into(),
        json!(humantime::format_duration(args.common.duration).to_string()),
    );
    let pages_param: Vec<serde_json::Value> = mix
        .iter()
        .map(|(weight, f)| {
            json!({
                "page": f.page,
                "weight": weight,
                "template_bytes": f.template.len(),
                "page_bytes": f.expected.len(),
                "service_bytes": f.services.iter().map(|s| s.2.len()).collect::<Vec<_>>(),
            })
        })
        .collect();
    params.insert("pages".into(), json!(pages_param));
    let mut s = Summary {
        scenario: format!("pages (Knot.x scenario {})", args.scenario),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params,
        phases: vec![
            ("setup".to_string(), setup_elapsed.as_secs_f64()),
            ("load".to_string(), load_secs),
        ],
        description: mix
            .iter()
            .map(|(weight, f)| describe(args, *weight, f))
            .collect(),
        checks: vec![Check::new(
            "page is the expected rendering",
            matched,
            mismatched + errors,
        )],
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };
    let m = &mut s.metrics;
    m.insert("http_reqs".into(), Metric::counter(sent, load_secs));
    m.insert("pages".into(), Metric::counter(matched, load_secs));
    m.insert(
        "http_req_duration".into(),
        Metric::Trend(Trend::from_micros(&latency)),
    );
    m.insert(
        "http_req_failed".into(),
        Metric::rate(sent - matched, matched),
    );
    m.insert("http_503".into(), Metric::count(unavailable));
    m.insert(
        "data_received".into(),
        Metric::counter(tally.bytes.load(Ordering::Relaxed), load_secs),
    );
    m.insert(
        "service_calls".into(),
        Metric::count(mock.calls.load(Ordering::Relaxed)),
    );
    if session.peer {
        s.notes.push(format!(
            "peer: no setup sent; the peer serves {} with the fixtures' templates and services at {}",
            args.page_path, mock.url
        ));
    }
    if unavailable > 0 {
        s.notes.push(format!(
            "{unavailable} requests were answered 503 (render limit); not counted as mismatches"
        ));
    }
    s.seal();
    Ok(s)
}

/// One line of the summary's description: what the clients GET, at the
/// path the server renders it (`--page-path`, `/content/{page}` for Knot.x).
fn describe(args: &PagesArgs, weight: u32, f: &payload::Fixture) -> String {
    format!(
        "{} clients GET {} ({} B template, {} B page; weight {weight}) back to back; services mocked in the bench",
        args.concurrency,
        args.page_path.replace("{page}", &f.page),
        f.template.len(),
        f.expected.len()
    )
}

/// Writes the fixtures where a peer can be configured from them. A page
/// name may hold `/` (`bench/scenario1.html`): its files go in that
/// subdirectory.
fn export(dir: &std::path::Path, mix: &[(u32, payload::Fixture)]) -> anyhow::Result<()> {
    use anyhow::Context;
    let write = |path: std::path::PathBuf, bytes: &[u8]| -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
    };
    let mut services = serde_json::Map::new();
    for (_, f) in mix {
        write(dir.join(format!("{}.html", f.page)), f.template.as_bytes())?;
        write(dir.join(format!("{}.expected.html", f.page)), &f.expected)?;
        for (name, url, _) in &f.services {
            services.insert(name.clone(), url.clone().into());
        }
    }
    write(
        dir.join("services.json"),
        &serde_json::to_vec_pretty(&services)?,
    )
}

/// Stores a fixture's services and template in weft (a peer is
/// configured in advance instead: `--peer`, `--export-fixtures`).
async fn store(session: &Session, fixture: &payload::Fixture) -> anyhow::Result<()> {
    for (name, url, _) in &fixture.services {
        let def = serde_json::to_vec(&json!({"http": {"url": url, "timeout": "5s"}}))?;
        let r = http::request(
            &session.base,
            "PUT",
            &format!("/api/v1/page-services/{name}"),
            &[],
            Some(&def),
            SETUP_TIMEOUT,
        )
        .await?;
        ensure!(
            r.status < 300,
            "storing service {name}: {} {}",
            r.status,
            r.text()
        );
    }
    let r = http::request(
        &session.base,
        "PUT",
        &format!("/api/v1/pages/{}", fixture.page),
        &[],
        Some(fixture.template.as_bytes()),
        SETUP_TIMEOUT,
    )
    .await?;
    ensure!(
        r.status < 300,
        "storing {}: {} {}",
        fixture.page,
        r.status,
        r.text()
    );
    Ok(())
}

/// A page the clients request, with its share of the requests.
struct Target {
    weight: u32,
    request: Vec<u8>,
    expected: Vec<u8>,
}

/// One closed-loop client: GET a page (picked by weight), compare, repeat
/// until `deadline`.
async fn client(
    connect: String,
    pages: Arc<[Target]>,
    tally: Arc<Tally>,
    deadline: Instant,
) -> Histogram<u64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::from_os_rng();
    let total: u32 = pages.iter().map(|p| p.weight).sum();
    let largest = pages.iter().map(|p| p.expected.len()).max().unwrap_or(0);
    let mut latency = micros_histogram(LATENCY_RANGE);
    let mut body = Vec::with_capacity(largest);
    let mut conn: Option<Conn> = None;
    while Instant::now() < deadline {
        let c = match conn.as_mut() {
            Some(c) if c.reusable() => c,
            _ => match Conn::connect(&connect).await {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let mut pick = rng.random_range(0..total);
        let page = pages
            .iter()
            .find(|p| {
                if pick < p.weight {
                    true
                } else {
                    pick -= p.weight;
                    false
                }
            })
            .expect("weights sum to total");
        body.clear();
        let sent_at = Instant::now();
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let result = tokio::time::timeout(
            REQUEST_TIMEOUT,
            c.round_trip(&page.request, Some(&mut body)),
        )
        .await;
        let micros = sent_at.elapsed().as_micros() as u64;
        match result {
            Ok(Ok(head)) => {
                let _ = latency.record(micros.max(1));
                tally.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                if head.status == 503 {
                    tally.unavailable.fetch_add(1, Ordering::Relaxed);
                } else if head.status == 200 && body == page.expected {
                    tally.matched.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.mismatched.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                conn = None;
            }
        }
    }
    latency
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The description names the path the pages are requested at.
    #[test]
    fn description_names_the_page_path() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pages: PagesArgs,
        }
        let fixture = payload::scenario1("http://127.0.0.1:3091");
        let default = Cli::parse_from(["bench"]).pages;
        assert!(describe(&default, 1, &fixture)
            .starts_with("64 clients GET /pages/bench/scenario1.html ("));
        let knotx = Cli::parse_from(["bench", "--page-path", "/content/{page}"]).pages;
        assert!(describe(&knotx, 1, &fixture)
            .starts_with("64 clients GET /content/bench/scenario1.html ("));
    }

    /// Page names hold `/`: the export makes their subdirectories, and
    /// writes every template, expected page and service URL.
    #[test]
    fn export_writes_pages_below_their_subdirectories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("fixtures");
        let mix = vec![
            (1, payload::scenario1("http://127.0.0.1:3091")),
            (1, payload::scenario3("http://127.0.0.1:3091")),
        ];
        export(&out, &mix).expect("export");
        for (_, f) in &mix {
            assert!(f.page.contains('/'), "{}", f.page);
            let template = std::fs::read(out.join(format!("{}.html", f.page))).expect("template");
            assert_eq!(template, f.template.as_bytes());
            let expected =
                std::fs::read(out.join(format!("{}.expected.html", f.page))).expect("expected");
            assert_eq!(expected, f.expected);
        }
        let services: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("services.json")).expect("services"))
                .expect("JSON");
        assert_eq!(
            services["s1-mountains"],
            "http://127.0.0.1:3091/s1/mountains.json"
        );
        assert_eq!(services["s3-4"], "http://127.0.0.1:3091/s3/4.json");
        assert_eq!(services.as_object().expect("object").len(), 6);
    }
}
