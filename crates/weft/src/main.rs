//! The `weft` command line: `weft serve` runs the platform, `weft bench`
//! drives a running one with the seed workloads. Everything else lives in
//! the library crates; this binary is configuration and wiring.

mod cluster_status;
mod config;
mod data_lock;
mod http;
mod server;
mod tls;
mod uri_escape;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use config::{Config, Overrides};

/// mimalloc instead of the system allocator: the hot path allocates many
/// small, short-lived buffers (request bodies, JSON values, frames) across
/// threads, which glibc's allocator serves measurably slower (it also
/// trims and regrows its heap on every engine batch).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// weft: one program for the whole job of an IoT data platform.
#[derive(Debug, Parser)]
#[command(name = "weft", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run weft: the HTTP API, the uplink pipeline and the store.
    Serve {
        /// TOML configuration file (every key can also be set as WEFT_<KEY>).
        #[arg(long, env = "WEFT_CONFIG")]
        config: Option<PathBuf>,
        /// Listen address, e.g. 127.0.0.1:8080 (port 0 picks a free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Data directory (created if missing).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Key ingest requests must send in Authorization.
        #[arg(long)]
        ingest_key: Option<String>,
        /// Secret stored (hashed) as an admin API key at start, instead of
        /// a generated one printed on a fresh data directory.
        #[arg(long)]
        admin_key: Option<String>,
    },
    /// Reproduce a seed workload against a running weft (or --spawn one).
    #[command(subcommand)]
    Bench(weft_bench::BenchCommand),
    /// Prints every route of every listener and who may call it, as the
    /// rows of the route table in docs/security.md.
    Routes,
    /// The nodes sharing this configuration's store.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Prints every node (up or silent, its address, its version) and the
    /// work each does; exits with 1 when a node heard of is silent.
    Status {
        /// The configuration the nodes run with (its `[store]` is read).
        #[arg(long, env = "WEFT_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve {
            config,
            listen,
            data,
            ingest_key,
            admin_key,
        } => {
            let config = Config::load(
                config.as_deref(),
                Overrides {
                    listen,
                    data,
                    ingest_key,
                    admin_key,
                },
            )
            .context("reading the configuration")?;
            init_logging(&config.log);
            runtime.block_on(run_server(config))
        }
        Command::Cluster(ClusterCommand::Status { config }) => {
            let config = Config::load(config.as_deref(), Overrides::default())
                .context("reading the configuration")?;
            init_logging("warn");
            let all_up = runtime.block_on(cluster_status::print(&config))?;
            std::process::exit(if all_up { 0 } else { 1 });
        }
        Command::Routes => {
            println!("| listener | method | path | who may call |");
            println!("|---|---|---|---|");
            for (listener, route) in weft_api::route_table() {
                println!(
                    "| {listener} | {} | `{}` | {} |",
                    route.method, route.path, route.access
                );
            }
            Ok(())
        }
        Command::Bench(cmd) => {
            init_logging("warn");
            let passed = runtime.block_on(weft_bench::run(cmd))?;
            std::process::exit(if passed { 0 } else { 1 });
        }
    }
}

/// Logs to stderr at `filter`. The embedded MQTT broker's framework (ntex)
/// narrates its threads starting and stopping at `info`; it logs warnings
/// and errors only, unless the filter names an `ntex` target itself.
fn init_logging(filter: &str) {
    let filter = if filter.contains("ntex") {
        tracing_subscriber::EnvFilter::new(filter)
    } else {
        tracing_subscriber::EnvFilter::new(format!(
            "{filter},ntex_rt=warn,ntex_server=warn,ntex_net=warn,ntex_io=warn,ntex_mqtt=warn"
        ))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .init();
}

/// Whether what goes to stderr may be coloured: only when it is a
/// terminal, and `NO_COLOR` (no-color.org) is unset or empty. Logs piped
/// to a file or a collector carry no escape codes.
pub(crate) fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Upper bounds of the buckets of every `…_seconds` histogram: from half
/// a millisecond (a commit) to ten seconds (a stalled request).
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the buckets of every `…_size` histogram (batch sizes,
/// up to the writers' largest batch).
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// The Prometheus recorder. Timings and sizes are exposed as histograms
/// with fixed buckets, not as the exporter's default summaries: a summary's
/// quantiles describe only its last minute or so and cannot be added up
/// over nodes, while buckets count every observation since the start, so a
/// scrape after a load test, or `histogram_quantile` over a cluster, sees
/// the whole tail.
fn metrics_recorder() -> anyhow::Result<metrics_exporter_prometheus::PrometheusBuilder> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_size".into()), SIZE_BUCKETS))
        .context("setting the metrics' buckets")
}

async fn run_server(config: Config) -> anyhow::Result<()> {
    let handle = metrics_recorder()?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let tls = match (&config.http.tls_cert, &config.http.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        (None, None) => None,
        _ => anyhow::bail!("[http] tls_cert and tls_key go together: set both or neither"),
    };
    let listener =
        crate::http::bind(config.listen).with_context(|| format!("binding {}", config.listen))?;
    // Scripts and tests read this line to learn the address when port 0 was asked for.
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("weft listening on {scheme}://{}", listener.local_addr()?);
    std::io::stdout().flush()?;

    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    server::serve(
        config,
        listener,
        tls,
        Arc::new(move || handle.render()),
        shutdown,
    )
    .await
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
