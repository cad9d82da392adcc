//! `weft bench`: load generators that reproduce the seed systems' published
//! workloads against a running weft (or one started in a temp dir with
//! `--spawn`) and print a k6-style summary, so weft's figures can be read
//! side by side with the seeds' k6 outputs.
//!
//! The crate is a map of small parts, each with one job:
//!
//! - [`common`]: the flags every scenario shares ([`CommonArgs`]) and the
//!   [`Session`](common::Session) that owns the target server for a run.
//! - [`target`]: where the server is: a base URL, or a `weft serve` child
//!   process the bench started itself.
//! - [`http`]: a lean HTTP/1.1 client (one keep-alive connection per worker,
//!   pre-rendered requests, no per-request allocation) — the generator shares
//!   a 2-core machine with the server, so every cycle it spends is one the
//!   server does not get.
//! - [`ceiling`]: the calibration: this machine's HTTP ceiling (a bare
//!   handler's GET and POST) and the target's trivial GET, measured before
//!   each scenario's load so its throughput reads as a ratio.
//! - [`summary`]: the result of a run (checks and metrics) and its k6-style
//!   text and JSON renderings.
//! - [`progress`]: the progress bar shown on a terminal during long runs.
//! - [`ingest`]: the `ingest` scenario (seed 000's throughput and
//!   availability tests).
//! - [`alarms`]: the `alarms` scenario (seed 000's test suite 2): the
//!   ingest load with one alarm rule, the socket watching its alarms.
//! - [`channels`]: the `channels` scenario (seed 001, DSPS's k6 test):
//!   publishers and polling subscribers on many channels.
//! - [`ngsi_update`]: the `ngsi-update` scenario (seed 002's NGSIv2 update
//!   stress tests).
//! - [`ngsi_notify`]: the `ngsi-notify` scenario (seed 002's notification
//!   stress tests): `ngsi-update`'s load with subscriptions and a
//!   notification sink in the bench process.
//! - [`pages`]: the `pages` scenario (seed 004, Knot.x scenarios 1-6 and the soak mix).
//! - [`console`]: the `console` scenario: the web console's requests
//!   (device list pages, a search, the device page) with 100,000 devices.
//! - [`history`]: the `history` scenario (seed 003's QuantumLeap load
//!   test): notifications to `/v2/notify`, every row read back, then
//!   `lastN`, range and aggregation queries.
//!
//! Adding a scenario is a new module with an `Args` struct (flattening
//! [`CommonArgs`]) and a `run` returning a [`summary::Summary`], plus one
//! variant of [`BenchCommand`].

#![warn(missing_docs)]

pub mod alarms;
pub mod ceiling;
pub mod channels;
pub mod common;
pub mod console;
pub mod history;
pub mod http;
pub mod ingest;
pub mod memory;
pub mod mqtt;
pub mod ngsi_notify;
pub mod ngsi_update;
pub mod pages;
pub mod progress;
pub mod summary;
pub mod target;

pub use alarms::AlarmsArgs;
pub use ceiling::CeilingArgs;
pub use channels::ChannelsArgs;
pub use common::CommonArgs;
pub use console::ConsoleArgs;
pub use history::HistoryArgs;
pub use ingest::IngestArgs;
pub use mqtt::MqttArgs;
pub use ngsi_notify::NgsiNotifyArgs;
pub use ngsi_update::NgsiUpdateArgs;
pub use pages::PagesArgs;

use std::io::Write;

use ceiling::{Reference, Throughput};

/// The `weft bench <scenario>` subcommands, one per reproduced seed workload.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Seed 000's throughput/availability test: N devices POST em300th
    /// uplinks (half encoded, half decoded) while one websocket subscriber
    /// watches the live stream; checks every accepted uplink is delivered
    /// on the socket and stored exactly once.
    Ingest(IngestArgs),
    /// The ingest load published over MQTT (QoS 1) through a real broker
    /// into weft's MQTT source; checks every acknowledged uplink is
    /// delivered on the socket and stored once, and measures `time_lapse`
    /// (with `--with-http`, beside the HTTP ingest scenario's).
    Mqtt(MqttArgs),
    /// Seed 000's alarm test (suite 2): the ingest load (100 devices × 1/s
    /// by default) with one rule `temperature>45.1`; checks every matching
    /// uplink's alarm arrives on the websocket and measures how fast.
    Alarms(AlarmsArgs),
    /// Seed 002's NGSIv2 update stress (scenarios 1, 2, 4): C clients PATCH
    /// a random number of attributes of random `Room` entities back to
    /// back; checks every update got 204 and the final entity state is the
    /// last value written.
    NgsiUpdate(NgsiUpdateArgs),
    /// Seed 002's NGSIv2 notification stress (scenarios 5, 6): the
    /// `ngsi-update` load with 1000 subscriptions notifying a sink inside
    /// the bench; checks every update got 204 and every subscription
    /// received exactly the notifications owed for its entity's updates,
    /// and measures their delay.
    NgsiNotify(NgsiNotifyArgs),
    /// Seed 003's QuantumLeap load test: C clients POST notifications of
    /// `Room` entities to `/v2/notify`; checks every acknowledged
    /// notification is stored (3 rows, values as sent), then measures and
    /// checks `lastN`, range and hourly-average queries (optionally over a
    /// preloaded `Room:big` of millions of rows).
    History(HistoryArgs),
    /// Seed 001's DSPS load test: per channel one publisher (3 messages a
    /// second) and 3 polling subscribers (fetch, sleep, ack, sleep);
    /// checks every message reaches every subscriber and none comes back
    /// after its ack.
    Channels(ChannelsArgs),
    /// Seed 004's Knot.x scenarios: C clients GET a page whose snippets
    /// are filled from mock services in the bench; checks every body is
    /// the expected rendering.
    Pages(PagesArgs),
    /// The web console's requests with a large fleet: registers
    /// `--devices` devices (100,000 by default), gives the last one a
    /// history, then measures the device list's first and last page, a
    /// search and the device page's requests, a fixed number of each;
    /// checks every answer is what the console needs.
    Console(ConsoleArgs),
    /// The calibration alone: a bare hyper handler's GET and small POST,
    /// then the target's trivial GET (`/version`, or the `--probe` of a
    /// peer), each driven by the bench's client for `--calibration`.
    Ceiling(CeilingArgs),
}

impl BenchCommand {
    /// The flags shared by every scenario, whichever was chosen.
    fn common(&self) -> &CommonArgs {
        match self {
            BenchCommand::Ingest(args) => &args.common,
            BenchCommand::Mqtt(args) => &args.load.common,
            BenchCommand::Alarms(args) => &args.load.common,
            BenchCommand::NgsiUpdate(args) => &args.common,
            BenchCommand::NgsiNotify(args) => &args.common,
            BenchCommand::History(args) => &args.common,
            BenchCommand::Channels(args) => &args.common,
            BenchCommand::Pages(args) => &args.common,
            BenchCommand::Console(args) => &args.common,
            BenchCommand::Ceiling(args) => &args.common,
        }
    }

    /// How many connections the scenario drives at once: the calibration
    /// drives the ceiling at the same concurrency.
    fn concurrency(&self) -> usize {
        match self {
            BenchCommand::Ingest(args) => args.connections,
            BenchCommand::Mqtt(args) => args.load.connections,
            BenchCommand::Alarms(args) => args.load.connections,
            BenchCommand::NgsiUpdate(args) => args.clients(),
            BenchCommand::NgsiNotify(args) => args.clients(),
            BenchCommand::History(args) => args.clients(),
            BenchCommand::Channels(args) => args.channels * (1 + args.subscribers),
            BenchCommand::Pages(args) => args.concurrency,
            BenchCommand::Console(args) => args.concurrency,
            BenchCommand::Ceiling(args) => args.concurrency,
        }
        .max(1)
    }

    /// The summary metric that is the scenario's throughput, and the
    /// ceiling it is read against.
    fn headline(&self) -> (&'static str, Reference) {
        match self {
            BenchCommand::Ingest(_) | BenchCommand::Alarms(_) | BenchCommand::Mqtt(_) => {
                ("uplinks_accepted", Reference::Post)
            }
            BenchCommand::NgsiUpdate(_) | BenchCommand::NgsiNotify(_) => {
                ("updates", Reference::Post)
            }
            BenchCommand::History(_) => ("notifications_stored", Reference::Post),
            BenchCommand::Channels(_) => ("messages_received", Reference::Post),
            BenchCommand::Pages(_) => ("pages", Reference::Get),
            BenchCommand::Console(_) => ("console_reqs", Reference::Get),
            BenchCommand::Ceiling(_) => ("target_get_reqs", Reference::Get),
        }
    }
}

/// Runs one scenario and prints its summary (text, or JSON with `--json`)
/// on stdout.
///
/// Returns `Ok(true)` when every check passed; the binary exits 1 otherwise,
/// so a benchmark can gate a CI job. `Err` means the run itself could not
/// be carried out (no server, setup refused, …), not that a check failed.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<bool> {
    let common = cmd.common().clone();
    if common.peer {
        if let BenchCommand::Console(_) = cmd {
            anyhow::bail!(
                "the console scenario measures weft's own /api/v1: it cannot drive a peer"
            );
        }
        if let BenchCommand::Ingest(_) | BenchCommand::Alarms(_) | BenchCommand::Mqtt(_) = cmd {
            anyhow::bail!(
                "ingest and alarms cannot drive a peer: their setup (device type, rule), \
                 their live socket and their read-back of stored data units are weft's own /api/v1"
            );
        }
    }
    if let (BenchCommand::Mqtt(args), true) = (&cmd, common.spawn) {
        mqtt::configure_spawn(args);
    }
    let session = common::Session::start(&common).await?;
    let calibration = if common.calibration.is_zero() {
        None
    } else {
        match ceiling::calibrate(&session, cmd.concurrency(), common.calibration).await {
            Ok(c) => Some(c),
            Err(e) => {
                session.finish().await;
                return Err(e.context("calibrating"));
            }
        }
    };
    let outcome = match &cmd {
        BenchCommand::Ingest(args) => ingest::run(args, &session).await,
        BenchCommand::Mqtt(args) => mqtt::run(args, &session).await,
        BenchCommand::Alarms(args) => alarms::run(args, &session).await,
        BenchCommand::NgsiUpdate(args) => ngsi_update::run(args, &session).await,
        BenchCommand::NgsiNotify(args) => ngsi_notify::run(args, &session).await,
        BenchCommand::History(args) => history::run(args, &session).await,
        BenchCommand::Channels(args) => channels::run(args, &session).await,
        BenchCommand::Pages(args) => pages::run(args, &session).await,
        BenchCommand::Console(args) => console::run(args, &session).await,
        BenchCommand::Ceiling(args) => match calibration.clone() {
            Some(c) => Ok(ceiling::summary(args, &session, c)),
            None => Err(anyhow::anyhow!(
                "weft bench ceiling needs a positive --calibration"
            )),
        },
    };
    // Peaks are read while the processes still live.
    let memory = session.peak_memory(&common.watch_pid);
    // Stop a spawned server whatever happened, then report.
    session.finish().await;
    let mut summary = outcome?;
    summary.memory = memory;
    if let Some(c) = calibration {
        let (metric, reference) = cmd.headline();
        if let Some(rate) = summary.rate_of(metric) {
            summary.throughput = Some(Throughput::new(metric, rate, reference, &c));
        }
        summary.calibration = Some(c);
    }
    let rendered = if common.json {
        summary.to_json_string()
    } else {
        summary.to_text()
    };
    let mut out = std::io::stdout().lock();
    out.write_all(rendered.as_bytes())?;
    out.flush()?;
    Ok(summary.passed())
}

/// Parses `weft bench <args…>` as the command line would, for the
/// scenarios' tests of their flags.
#[cfg(test)]
pub(crate) fn try_parse_command(args: &[&str]) -> Result<BenchCommand, clap::Error> {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: BenchCommand,
    }

    Cli::try_parse_from([&["bench"], args].concat()).map(|cli| cli.cmd)
}

/// [`try_parse_command`] for flags that must parse.
#[cfg(test)]
pub(crate) fn parse_command(args: &[&str]) -> BenchCommand {
    try_parse_command(args).expect("flags parse")
}
