//! The ingest log's appends in the two designs weighed for a cluster
//! (docs/scale-out.md, "Ordering across nodes on PostgreSQL"): weft's
//! PostgreSQL log (every node appends with no lock between them, a group
//! commit per node, each append answered once under the log's horizon),
//! and a NATS JetStream stream with a subject per partition (each append a
//! publish answered by JetStream's acknowledgement, the number JetStream
//! gives it being the order a reader follows).
//!
//! Both take the same uplinks from the same number of writers spread over
//! the same number of "nodes" (store instances, or NATS connections), one
//! design after the other, and the example prints for each the appends a
//! second and the CPU they cost: of the servers (every `postgres` process,
//! or `nats-server`) and of this process, per append, read from `/proc`.
//! On a machine the servers share with the writers, CPU per append is what
//! says how many appends the same hardware would take.
//!
//! ```text
//! cargo run --release -p weft --example log_append -- \
//!     --postgres postgres://postgres@127.0.0.1:25432/postgres \
//!     --nats nats://127.0.0.1:24222 [--nodes 3] [--writers 192] [--seconds 10]
//! ```
//!
//! The PostgreSQL side runs in a database of its own, created for the run
//! and dropped after it; the JetStream side in a stream of its own
//! (`WEFT_LOG_APPEND`), deleted after it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use weft_model::uplink::{partition_of, NewUplink, UplinkFormat, UplinkPins};
use weft_store::{IngestLogStore, PostgresConfig, PostgresStore, Store};

/// What to run.
#[derive(Debug, Parser)]
struct Args {
    /// A PostgreSQL server (its database is used only to create the run's).
    #[arg(long)]
    postgres: String,
    /// A NATS server with JetStream.
    #[arg(long)]
    nats: String,
    /// Nodes appending side by side.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Writers in all, spread over the nodes; each appends one uplink
    /// after the other, as an HTTP connection's requests do.
    #[arg(long, default_value_t = 192)]
    writers: usize,
    /// How long each design is loaded.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Partitions of the log (subjects of the stream).
    #[arg(long, default_value_t = 16)]
    partitions: u16,
}

/// What one design did.
struct Outcome {
    appends: u64,
    elapsed: Duration,
    server_cpu: Duration,
    own_cpu: Duration,
}

impl Outcome {
    fn print(&self, design: &str) {
        let n = self.appends.max(1) as f64;
        println!(
            "{design:<24} {:>9.0} appends/s   server CPU {:>6.1} µs/append   this process {:>6.1} µs/append",
            self.appends as f64 / self.elapsed.as_secs_f64(),
            self.server_cpu.as_secs_f64() * 1e6 / n,
            self.own_cpu.as_secs_f64() * 1e6 / n,
        );
    }
}

/// A decoded sensae uplink of about the bench's size, of device `i`.
fn uplink(i: usize, partitions: u16) -> NewUplink {
    let device = format!("log-dev-{i}");
    let body = format!(
        r#"{{"downlink_url":"https://console.example/api/v1/down/abc/def/0e1c","temperature":21,"humidity":40,"id":"{device}","name":"P00010","reported_at":1764000000000,"uuid":"u-{i}"}}"#
    );
    NewUplink {
        received_at: 1_764_000_000_000,
        format: UplinkFormat::SensaeDecoded,
        channel: Some("log".into()),
        device_type: Some("em300th".into()),
        event: None,
        device_id: None,
        source: None,
        partition: partition_of(&device, partitions),
        pins: UplinkPins::default(),
        body: body.into_bytes(),
    }
}

/// CPU time (user and system) of the processes whose command name is
/// `name` (all of them, or this process with `None`), from `/proc`.
fn cpu_of(name: Option<&str>) -> Duration {
    let ticks_per_second = 100.0; // USER_HZ, 100 on Linux
    let stat = |path: &std::path::Path| -> Option<(String, u64)> {
        let text = std::fs::read_to_string(path).ok()?;
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let comm = text[open + 1..close].to_string();
        let fields: Vec<&str> = text[close + 2..].split(' ').collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((comm, utime + stime))
    };
    let ticks: u64 = match name {
        None => stat(std::path::Path::new("/proc/self/stat")).map_or(0, |(_, t)| t),
        Some(name) => std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| stat(&e.path().join("stat")))
            .filter(|(comm, _)| comm == name || comm.starts_with(name))
            .map(|(_, t)| t)
            .sum(),
    };
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// Runs `writers` appending through `append` (writer index → one append)
/// for `seconds`, measuring the CPU of the `server` processes.
async fn load<F, Fut>(args: &Args, server: &str, append: F) -> anyhow::Result<Outcome>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let append = Arc::new(append);
    let count = Arc::new(AtomicU64::new(0));
    let (server_before, own_before) = (cpu_of(Some(server)), cpu_of(None));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let (append, count) = (append.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while Instant::now() < deadline {
                append(i).await?;
                count.fetch_add(1, Ordering::Relaxed);
                i += 1_000_003;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(Outcome {
        appends: count.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        server_cpu: cpu_of(Some(server)).saturating_sub(server_before),
        own_cpu: cpu_of(None).saturating_sub(own_before),
    })
}

/// The PostgreSQL log: `nodes` stores on a database of the run's own.
async fn postgres(args: &Args) -> anyhow::Result<Outcome> {
    let name = format!("weft_log_append_{}", std::process::id());
    let (admin, connection) = tokio_postgres::connect(&args.postgres, tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let url = with_database(&args.postgres, &name)?;
    let mut stores = Vec::new();
    for _ in 0..args.nodes.max(1) {
        let config = PostgresConfig {
            url: url.clone(),
            partitions: args.partitions,
            ..PostgresConfig::default()
        };
        stores.push(Arc::new(PostgresStore::open(config).await?));
    }
    let stores = Arc::new(stores);
    let partitions = args.partitions;
    let appending = stores.clone();
    let outcome = load(args, "postgres", move |i| {
        let store = appending[i % appending.len()].clone();
        async move {
            store.append_uplink(uplink(i, partitions)).await?;
            Ok(())
        }
    })
    .await;
    for store in stores.iter() {
        store.close().await;
    }
    drop(stores);
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await?;
    outcome
}

/// `url` naming database `name` instead of its own (a URL of the form
/// `postgres://who@host:port/database?options`).
fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let (base, options) = url
        .split_once('?')
        .map_or((url, None), |(b, o)| (b, Some(o)));
    let authority = base.find("://").context("a PostgreSQL URL, postgres://…")? + 3;
    let path = base[authority..]
        .find('/')
        .map_or(base.len(), |at| authority + at);
    let mut out = format!("{}/{name}", &base[..path]);
    if let Some(options) = options {
        out.push('?');
        out.push_str(options);
    }
    Ok(out)
}

/// The JetStream log: `nodes` connections publishing to one stream with a
/// subject per partition, each publish waiting for its acknowledgement.
async fn jetstream(args: &Args) -> anyhow::Result<Outcome> {
    use async_nats::jetstream::{self, stream};
    let mut contexts = Vec::new();
    for _ in 0..args.nodes.max(1) {
        let client = async_nats::connect(&args.nats)
            .await
            .context("connecting to NATS")?;
        contexts.push(jetstream::new(client));
    }
    let js = &contexts[0];
    let _ = js.delete_stream("WEFT_LOG_APPEND").await;
    js.create_stream(stream::Config {
        name: "WEFT_LOG_APPEND".into(),
        subjects: vec!["weft-log-append.>".into()],
        storage: stream::StorageType::File,
        ..stream::Config::default()
    })
    .await?;
    let contexts = Arc::new(contexts);
    let partitions = args.partitions;
    let publishing = contexts.clone();
    let outcome = load(args, "nats-server", move |i| {
        let js = publishing[i % publishing.len()].clone();
        async move {
            let u = uplink(i, partitions);
            // What the log would carry: the uplink's fields and its body.
            let mut message = format!(
                "{}|{:?}|log|em300th|{}|",
                u.received_at, u.format, u.partition
            )
            .into_bytes();
            message.extend_from_slice(&u.body);
            js.publish(format!("weft-log-append.{}", u.partition), message.into())
                .await?
                .await?;
            Ok(())
        }
    })
    .await;
    contexts[0].delete_stream("WEFT_LOG_APPEND").await?;
    outcome
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "{} nodes, {} writers, {} s each, {} partitions",
        args.nodes, args.writers, args.seconds, args.partitions
    );
    postgres(&args).await?.print("PostgreSQL log");
    jetstream(&args).await?.print("JetStream stream");
    Ok(())
}
