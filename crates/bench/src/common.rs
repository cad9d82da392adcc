//! What every scenario shares: the common flags ([`CommonArgs`], flattened
//! into each scenario's arguments) and the [`Session`] that finds or starts
//! the server, waits until it is healthy, and stops it at the end.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::http;
use crate::target::{BaseUrl, SpawnedServer};

/// How long a spawned server may take to answer `GET /health` with 200.
const SPAWNED_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long to retry an external server's health before giving up: short,
/// as it should already be running.
const EXTERNAL_READY_TIMEOUT: Duration = Duration::from_secs(5);

/// Flags shared by every `weft bench` scenario.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Base URL of the server to drive (plain HTTP): a weft, or a peer
    /// that speaks the scenario's API (see --peer). Repeated, for the
    /// nodes of a cluster: the load's connections are spread over them
    /// round robin (ingest, ngsi-update, ngsi-notify; other scenarios and every
    /// setup and check use the first).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: Vec<String>,

    /// The server at --url is not weft but a peer speaking the scenario's
    /// API (DSPS, an NGSIv2 broker, QuantumLeap, a page server): setup and
    /// checks that need weft's own `/api/v1` are done another way or left
    /// out, and the summary says which.
    #[arg(long, conflicts_with = "spawn")]
    pub peer: bool,

    /// Readiness probe: the path that answers 2xx once the server takes
    /// requests (`/health` for weft; DSPS `/probe/readiness`, Orion
    /// `/version`, QuantumLeap `/health`). Also the trivial endpoint the
    /// calibration drives on a peer.
    #[arg(long, default_value = "/health")]
    pub probe: String,

    /// Start a `weft serve` on an ephemeral port with a temporary data
    /// directory for this run, and stop it at the end (ignores --url).
    #[arg(long)]
    pub spawn: bool,

    /// How long to generate load, e.g. 60s, 5m.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Print the summary as one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,

    /// The ingest key, sent as `Authorization` on uplinks (and passed to
    /// the server with --spawn).
    #[arg(long, env = "WEFT_INGEST_KEY", hide_env_values = true)]
    pub ingest_key: Option<String>,

    /// An API key sent as `X-Auth-Token` with every request (and as
    /// `access_token` to the live websocket); with --spawn the bench makes
    /// the server's admin key itself.
    #[arg(long, env = "WEFT_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// How long each of the calibration's three measurements runs before
    /// the load (a bare HTTP handler's GET and POST, then the target's
    /// trivial GET, at the scenario's concurrency); 0s skips it, and the
    /// summary then carries no ratio.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub calibration: Duration,

    /// Draw no progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,

    /// Reports this process's peak memory in the summary, as `NAME=PID`
    /// (or `PID`): a server started by hand, a peer, its database. Give it
    /// once per process; a spawned server is reported without it.
    #[arg(long, value_name = "NAME=PID", value_parser = crate::memory::parse_watched)]
    pub watch_pid: Vec<crate::memory::Watched>,
}

/// The server a run drives, ready to take requests.
pub struct Session {
    /// Where to send requests: the first `--url`.
    pub base: BaseUrl,
    /// Every `--url` (the first is `base`), for the load's connections.
    pub bases: Vec<BaseUrl>,
    /// Whether the progress bar is drawn.
    pub show_progress: bool,
    /// The server is a peer, not weft (`--peer`).
    pub peer: bool,
    /// The readiness probe's path.
    probe: String,
    /// The server the bench started, stopped by [`Session::finish`].
    spawned: Option<SpawnedServer>,
}

impl Session {
    /// Parses `--url` or starts a server (`--spawn`), then waits for
    /// `GET /health` to answer 200, so no scenario measures a server that
    /// is still starting.
    pub async fn start(args: &CommonArgs) -> anyhow::Result<Session> {
        if let (Some(key), false) = (&args.api_key, args.spawn) {
            crate::http::use_api_key(key.clone());
        }
        let (bases, spawned) = if args.spawn {
            let (server, base) = SpawnedServer::start(args.ingest_key.as_deref()).await?;
            (vec![base], Some(server))
        } else {
            let bases = args
                .url
                .iter()
                .map(|u| BaseUrl::parse(u))
                .collect::<anyhow::Result<Vec<_>>>()?;
            if bases.is_empty() {
                bail!("--url: give at least one");
            }
            (bases, None)
        };
        let session = Session {
            base: bases[0].clone(),
            bases,
            show_progress: crate::progress::enabled(args.no_progress),
            peer: args.peer,
            probe: args.probe.clone(),
            spawned,
        };
        if let Err(e) = session.wait_ready().await {
            session.finish().await;
            return Err(e);
        }
        Ok(session)
    }

    /// The `host:port` of every target, for the load's connections
    /// (connection `i` goes to the `i % n`-th).
    pub fn connects(&self) -> Vec<String> {
        self.bases.iter().map(|b| b.connect.clone()).collect()
    }

    /// The targets as the summary names them (comma-separated).
    pub fn targets(&self) -> String {
        self.bases
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether the bench started the server itself.
    pub fn spawned(&self) -> bool {
        self.spawned.is_some()
    }

    /// The target's trivial endpoint, driven by the calibration: weft's
    /// `GET /version`, or the readiness probe of a peer.
    pub fn trivial_path(&self) -> &str {
        if self.peer {
            &self.probe
        } else {
            crate::ceiling::WEFT_TRIVIAL_PATH
        }
    }

    /// The peak memory of the spawned server (as `weft`) and of
    /// `watched`, read now.
    pub fn peak_memory(
        &self,
        watched: &[crate::memory::Watched],
    ) -> Vec<crate::memory::PeakMemory> {
        let spawned =
            self.spawned
                .as_ref()
                .and_then(|s| s.pid())
                .map(|pid| crate::memory::Watched {
                    name: "weft".to_string(),
                    pid,
                });
        spawned
            .iter()
            .chain(watched)
            .map(crate::memory::PeakMemory::of)
            .collect()
    }

    /// Stops a spawned server; nothing for one given with `--url`.
    pub async fn finish(self) {
        if let Some(server) = self.spawned {
            server.stop().await;
        }
    }

    /// Polls the readiness probe (`GET /health` by default) until it
    /// answers 2xx or the ready timeout passes.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        for base in &self.bases {
            self.wait_ready_at(base).await?;
        }
        Ok(())
    }

    async fn wait_ready_at(&self, base: &BaseUrl) -> anyhow::Result<()> {
        let timeout = if self.spawned() {
            SPAWNED_READY_TIMEOUT
        } else {
            EXTERNAL_READY_TIMEOUT
        };
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < timeout {
            match http::request(base, "GET", &self.probe, &[], None, Duration::from_secs(5)).await {
                Ok(r) if (200..300).contains(&r.status) => return Ok(()),
                Ok(r) => {
                    last = format!(
                        "GET {} answered {}: {}",
                        self.probe,
                        r.status,
                        r.text().trim()
                    )
                }
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let hint = if self.spawned() || self.peer {
            ""
        } else {
            " (start `weft serve`, or pass --spawn)"
        };
        bail!(
            "{base} is not ready after {}s: {last}{hint}",
            timeout.as_secs()
        )
    }
}
