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
    /// Base URL of the weft server to drive (plain HTTP).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,

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

    /// Draw no progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

/// The server a run drives, ready to take requests.
pub struct Session {
    /// Where to send requests.
    pub base: BaseUrl,
    /// Whether the progress bar is drawn.
    pub show_progress: bool,
    /// The server the bench started, stopped by [`Session::finish`].
    spawned: Option<SpawnedServer>,
}

impl Session {
    /// Parses `--url` or starts a server (`--spawn`), then waits for
    /// `GET /health` to answer 200, so no scenario measures a server that
    /// is still starting.
    pub async fn start(args: &CommonArgs) -> anyhow::Result<Session> {
        let (base, spawned) = if args.spawn {
            let (server, base) = SpawnedServer::start(args.ingest_key.as_deref()).await?;
            (base, Some(server))
        } else {
            (BaseUrl::parse(&args.url)?, None)
        };
        let session = Session {
            base,
            show_progress: crate::progress::enabled(args.no_progress),
            spawned,
        };
        if let Err(e) = session.wait_ready().await {
            session.finish().await;
            return Err(e);
        }
        Ok(session)
    }

    /// Whether the bench started the server itself.
    pub fn spawned(&self) -> bool {
        self.spawned.is_some()
    }

    /// Stops a spawned server; nothing for one given with `--url`.
    pub async fn finish(self) {
        if let Some(server) = self.spawned {
            server.stop().await;
        }
    }

    /// Polls `GET /health` until it answers 200 or the ready timeout passes.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let timeout = if self.spawned() {
            SPAWNED_READY_TIMEOUT
        } else {
            EXTERNAL_READY_TIMEOUT
        };
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < timeout {
            match http::request(
                &self.base,
                "GET",
                "/health",
                &[],
                None,
                Duration::from_secs(5),
            )
            .await
            {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => last = format!("GET /health answered {}: {}", r.status, r.text().trim()),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let hint = if self.spawned() {
            ""
        } else {
            " (start `weft serve`, or pass --spawn)"
        };
        bail!(
            "{} is not ready after {}s: {last}{hint}",
            self.base,
            timeout.as_secs()
        )
    }
}
