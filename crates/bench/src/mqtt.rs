//! The `mqtt` scenario: the `ingest` scenario's devices and uplinks, but
//! published over MQTT through a real broker into weft's MQTT source, with
//! the same live subscriber (`time_lapse`: from the uplink's `reportedAt`
//! to the socket) and the same read-back of the store. With `--with-http`
//! the HTTP ingest scenario runs first with the same flags, and its
//! figures are printed beside the MQTT ones, prefixed `http_`.
//!
//! weft must have a source reading the bench's topics:
//!
//! ```toml
//! [mqtt.sources.bench]
//! url = "mqtt://127.0.0.1:1883"        # the --broker
//! format = "plain"
//! topic = "weftbench/+/+"              # weftbench/<channel>/<device id>
//! channel_level = 1
//! device_level = 2
//! device_type = "em300th"
//! ```
//!
//! With `--spawn` the bench configures its server so. Each device
//! publishes its sensae body (decoded values, or an encoded payload) with
//! QoS 1, once per `--interval` (devices spread evenly over the interval,
//! as in the HTTP scenario), on its own topic; an uplink counts as
//! accepted once the broker acknowledged it (PUBACK).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use parking_lot::Mutex;
use rand::distr::{Alphanumeric, SampleString};
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use tokio::time::Instant;

use crate::common::Session;
use crate::ingest::live::{now_ms, Live};
use crate::ingest::payload::{self, device_form, Device, Heads, Reading, Renderer};
use crate::ingest::schedule::{device_phase, next_due};
use crate::ingest::verify::{read_store, retain_missing, tally};
use crate::ingest::IngestArgs;
use crate::summary::{micros_histogram, Check, Metric, Summary, Trend};

/// The topic prefix the bench publishes under.
pub const TOPIC_PREFIX: &str = "weftbench";

/// Flags of `weft bench mqtt`.
#[derive(Debug, Clone, clap::Args)]
pub struct MqttArgs {
    /// The ingest scenario's flags (devices, interval, duration, …).
    #[command(flatten)]
    pub load: IngestArgs,

    /// The broker the devices publish to, and weft's source reads from.
    #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
    pub broker: String,

    /// MQTT connections the devices share.
    #[arg(long, default_value_t = 4)]
    pub mqtt_connections: usize,

    /// Run the HTTP ingest scenario first with the same flags and print its
    /// figures beside the MQTT ones.
    #[arg(long)]
    pub with_http: bool,
}

impl MqttArgs {
    fn host_port(&self) -> anyhow::Result<(String, u16)> {
        let rest = self
            .broker
            .strip_prefix("mqtt://")
            .context("--broker must be mqtt://host:port")?;
        let rest = rest.trim_end_matches('/');
        Ok(match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().context("--broker's port")?),
            None => (rest.to_string(), 1883),
        })
    }
}

/// With `--spawn`: the environment that gives the spawned weft its source
/// on `--broker` (the spawned process inherits the bench's environment).
pub fn configure_spawn(args: &MqttArgs) {
    let vars = [
        ("URL", args.broker.as_str()),
        ("FORMAT", "plain"),
        ("TOPIC", "weftbench/+/+"),
        ("CHANNEL_LEVEL", "1"),
        ("DEVICE_LEVEL", "2"),
        ("DEVICE_TYPE", payload::DEVICE_TYPE),
    ];
    for (key, value) in vars {
        // Set before any thread of the bench reads the environment.
        std::env::set_var(format!("WEFT_MQTT__SOURCES__BENCH__{key}"), value);
    }
    std::env::set_var(
        "WEFT_MQTT__SOURCES__BENCH__CLIENT_ID",
        format!("weft-bench-{}", uuid::Uuid::new_v4().simple()),
    );
}

/// What the publishers did.
#[derive(Default)]
struct Published {
    sent: u64,
    accepted: Vec<u128>,
    /// Publish → PUBACK, microseconds.
    puback: Vec<u64>,
    errors: u64,
}

/// Runs the scenario.
pub async fn run(args: &MqttArgs, session: &Session) -> anyhow::Result<Summary> {
    ensure!(
        args.mqtt_connections >= 1,
        "--mqtt-connections must be at least 1"
    );
    ensure!(!args.load.interval.is_zero(), "--interval must be positive");
    let http = if args.with_http {
        Some(crate::ingest::run(&args.load, session).await?)
    } else {
        None
    };
    let (host, port) = args.host_port()?;
    let channel = format!("mq{}", Alphanumeric.sample_string(&mut rand::rng(), 8));
    crate::http::put_setup(
        &session.base,
        &format!("/api/v1/device-types/{}", payload::DEVICE_TYPE),
        &payload::device_type_body(),
        "registering the em300th device type",
    )
    .await?;
    let live = Live::subscribe(&session.base, &channel).await?;

    let started = Instant::now();
    let published = publish(args, &host, port, &channel).await?;
    let load_elapsed = started.elapsed();

    let drain_started = Instant::now();
    let mut pending = published.accepted.clone();
    while drain_started.elapsed() < args.load.drain_timeout {
        retain_missing(&mut pending, &live.lock().seen);
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live_state = live.finish().await;
    let drain_elapsed = drain_started.elapsed();
    let accepted: HashSet<u128> = published.accepted.iter().copied().collect();
    let bar = indicatif::ProgressBar::hidden();
    let stored = read_store(&session.base, &channel, &bar).await;
    let ws = tally(&accepted, &live_state.seen);

    let mut s = Summary {
        scenario: "mqtt".into(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: params(args, &channel),
        phases: vec![
            ("load".into(), load_elapsed.as_secs_f64()),
            ("drain".into(), drain_elapsed.as_secs_f64()),
        ],
        description: vec![
            format!(
                "{} devices × 1 uplink every {} for {} over MQTT QoS 1 through {} ({} connections)",
                args.load.devices,
                humantime::format_duration(args.load.interval),
                humantime::format_duration(args.load.common.duration),
                args.broker,
                args.mqtt_connections
            ),
            format!("em300th uplinks on channel {channel}, read by weft's `plain` MQTT source"),
        ],
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };
    // Rates over the publishing time, not the wait for the last PUBACKs.
    let secs = args.load.common.duration.as_secs_f64();
    let acked = published.accepted.len() as u64;
    s.checks.push(Check::new(
        "publish acknowledged by the broker",
        acked,
        published.sent - acked,
    ));
    s.checks.push(Check::new(
        "every acknowledged uplink delivered on the socket",
        ws.once + ws.repeated,
        ws.missing,
    ));
    match &stored {
        Ok(stored) => {
            let t = tally(&accepted, &stored.counts);
            s.checks.push(Check::new(
                "every acknowledged uplink stored exactly once",
                t.once,
                t.missing + t.repeated,
            ));
        }
        Err(e) => s.notes.push(format!("the store could not be read: {e:#}")),
    }
    let m = &mut s.metrics;
    m.insert(
        "mqtt_publishes".into(),
        Metric::counter(published.sent, secs),
    );
    m.insert("uplinks_accepted".into(), Metric::counter(acked, secs));
    let mut puback = micros_histogram(Duration::from_secs(60));
    for us in &published.puback {
        puback.saturating_record(*us);
    }
    m.insert(
        "mqtt_puback_duration".into(),
        Metric::Trend(Trend::from_micros(&puback)),
    );
    m.insert("mqtt_errors".into(), Metric::count(published.errors));
    m.insert(
        "time_lapse".into(),
        Metric::Trend(Trend::from_micros(&live_state.time_lapse)),
    );
    m.insert(
        "delivery_lapse".into(),
        Metric::Trend(Trend::from_micros(&live_state.delivery_lapse)),
    );
    m.insert("ws_missing".into(), Metric::count(ws.missing));
    m.insert("ws_duplicates".into(), Metric::count(ws.repeated));
    if let Some(http) = http {
        for (name, metric) in http.metrics {
            if matches!(
                name.as_str(),
                "uplinks_accepted"
                    | "time_lapse"
                    | "delivery_lapse"
                    | "http_req_duration"
                    | "ws_missing"
            ) {
                let name = if name.starts_with("http_") {
                    name
                } else {
                    format!("http_{name}")
                };
                s.metrics.insert(name, metric);
            }
        }
        for check in http.checks {
            s.checks.push(Check {
                name: format!("http: {}", check.name),
                ..check
            });
        }
    }
    if let Some(failure) = &live_state.failure {
        s.notes.push(format!("live socket: {failure}"));
    }
    s.seal();
    Ok(s)
}

/// The load: every device publishes once per interval for the duration,
/// spread over the connections; returns what the broker acknowledged.
async fn publish(
    args: &MqttArgs,
    host: &str,
    port: u16,
    channel: &str,
) -> anyhow::Result<Published> {
    let mut rng = rand::rng();
    let devices: Vec<Device> = (0..args.load.devices)
        .map(|i| Device::new(i, device_form(i, args.load.encoded_ratio), &mut rng))
        .collect();
    let heads = Heads::new("", "bench", channel, None);
    let result = Arc::new(Mutex::new(Published::default()));
    let deadline = Instant::now() + args.load.common.duration;
    let mut tasks = Vec::new();
    let per = devices.len().div_ceil(args.mqtt_connections);
    let total = devices.len();
    for (n, chunk) in devices.chunks(per.max(1)).enumerate() {
        let first = n * per.max(1);
        let mut options = MqttOptions::new(
            format!("weft-bench-pub-{n}-{}", uuid::Uuid::new_v4().simple()),
            host,
            port,
        );
        options.set_keep_alive(Duration::from_secs(30));
        options.set_inflight(1000);
        let (client, mut events) = AsyncClient::new(options, 4096);
        // Publish order → packet id → uplink id, to match the PUBACKs.
        let queued: Arc<Mutex<VecDeque<(u128, Instant)>>> = Arc::default();
        let in_flight: Arc<Mutex<HashMap<u16, (u128, Instant)>>> = Arc::default();
        let (q, f, r) = (queued.clone(), in_flight.clone(), result.clone());
        let poller = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                        if let Some(entry) = q.lock().pop_front() {
                            f.lock().insert(pkid, entry);
                        }
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        if let Some((id, at)) = f.lock().remove(&ack.pkid) {
                            let mut r = r.lock();
                            r.accepted.push(id);
                            r.puback.push(at.elapsed().as_micros() as u64);
                        }
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(e) => {
                        r.lock().errors += 1;
                        if matches!(e, rumqttc::ConnectionError::RequestsDone) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let chunk = chunk.to_vec();
        let heads = heads.clone();
        let (q, r) = (queued.clone(), result.clone());
        let interval = args.load.interval;
        let channel = channel.to_string();
        let publisher = tokio::spawn(async move {
            let mut renderer = Renderer::default();
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            // Every device on its own phase of the interval, as in the
            // HTTP ingest scenario (not the whole fleet at one tick, which
            // would measure a burst's queue instead of the path).
            let start = Instant::now();
            let mut due: std::collections::BinaryHeap<std::cmp::Reverse<(Duration, usize)>> = (0
                ..chunk.len())
                .map(|i| std::cmp::Reverse((device_phase(first + i, total, interval), i)))
                .collect();
            while let Some(std::cmp::Reverse((at, i))) = due.pop() {
                if start + at >= deadline {
                    break;
                }
                tokio::time::sleep_until(start + at).await;
                due.push(std::cmp::Reverse((
                    next_due(at, start.elapsed(), interval),
                    i,
                )));
                {
                    let device = &chunk[i];
                    let id = payload::uplink_id(&mut rng);
                    let reading = Reading::random(&mut rng);
                    renderer.render(&heads, device, &reading, now_ms() as u64, id);
                    let topic = format!("{TOPIC_PREFIX}/{channel}/{}", device.id());
                    q.lock().push_back((id.as_u128(), Instant::now()));
                    if client
                        .publish(topic, QoS::AtLeastOnce, false, renderer.body().to_vec())
                        .await
                        .is_err()
                    {
                        r.lock().errors += 1;
                        continue;
                    }
                    r.lock().sent += 1;
                }
            }
            // Let the last PUBACKs arrive.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let _ = client.disconnect().await;
        });
        tasks.push((publisher, poller));
    }
    for (publisher, poller) in tasks {
        let _ = publisher.await;
        let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
    }
    let published = std::mem::take(&mut *result.lock());
    Ok(published)
}

/// The parameters as JSON.
fn params(args: &MqttArgs, channel: &str) -> serde_json::Map<String, serde_json::Value> {
    let v = serde_json::json!({
        "devices": args.load.devices,
        "interval": humantime::format_duration(args.load.interval).to_string(),
        "duration": humantime::format_duration(args.load.common.duration).to_string(),
        "broker": args.broker,
        "mqtt_connections": args.mqtt_connections,
        "encoded_ratio": args.load.encoded_ratio,
        "with_http": args.with_http,
        "channel": channel,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn flags_parse() {
        let cmd = crate::parse_command(&[
            "mqtt",
            "--broker",
            "mqtt://127.0.0.1:21883",
            "--with-http",
            "--devices",
            "10",
        ]);
        let crate::BenchCommand::Mqtt(args) = cmd else {
            panic!("not parsed as mqtt");
        };
        assert!(args.with_http);
        assert_eq!(args.load.devices, 10);
        assert_eq!(args.host_port().unwrap(), ("127.0.0.1".to_string(), 21883));
    }
}
