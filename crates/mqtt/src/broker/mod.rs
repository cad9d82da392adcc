//! The embedded broker (`[mqtt] listen`): devices publish to weft
//! directly, without a broker of their own to run.
//!
//! Each device connects with its device id as user name *and* client id,
//! and its device key (`POST /api/v1/devices/{id}/key`) as password;
//! anything else is refused at CONNECT (CONNACK "bad user name or
//! password"). Devices publish on:
//!
//! - `/json/{apikey}/{device}/attrs` and `/json/{apikey}/{device}/attrs/{attr}`
//!   (IoT Agent JSON), `/ul/{apikey}/{device}/attrs[/{attr}]` (UltraLight
//!   2.0); the API key names the device type through `[mqtt.api_keys]`,
//!   or, when it is not listed there, the registered device's type is used;
//! - `devices/{device}/up`: a JSON object of measures, or a binary payload
//!   for the device type's decoder;
//! - `/json|/ul/{apikey}/{device}/cmdexe` or `/{apikey}/{device}/cmdexe`:
//!   answers to commands.
//!
//! `{device}` must be the device that logged in: a device publishing as
//! another is disconnected and nothing is kept ([`uplinks`]).
//!
//! The broker is ntex-mqtt's MQTT 3.1.1 server, run by ntex on a thread of
//! its own ([`start`]); weft's services live on the tokio runtime, so each
//! PUBLISH is handed to that runtime and the connection waits for the
//! answer ([`session::publish`]). Its completion is what sends the PUBACK:
//! a QoS 1 message is acknowledged only once the ingest log has committed
//! it. The broker relays nothing between devices: what is not weft's is
//! dropped, and weft's commands go only to the device they name
//! ([`commands`]).

mod commands;
mod session;
mod uplinks;

use std::net::SocketAddr;
use std::sync::Arc;

use ntex_mqtt::{v3, MqttServer, MqttServiceConfig, QoS};
use ntex_service::cfg::SharedCfg;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_pipeline::Services;

use crate::config::MqttConfig;

/// The source name the broker's uplinks carry, and its metrics label.
pub const SOURCE: &str = weft_pipeline::mqtt::BROKER_SOURCE;

/// Connections the broker holds at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 10_000;

/// Threads serving connections. Each only parses packets and hands
/// messages to weft's runtime, where the work is done, so one is enough on
/// the 2-core machines weft is measured on.
const WORKERS: usize = 1;

/// A device has this long (seconds) after connecting to send CONNECT.
const CONNECT_TIMEOUT: u16 = 10;

/// What the connections share, on whichever thread they run.
pub(crate) struct Broker {
    /// The device catalog (logins) and the rest of weft.
    services: Arc<Services>,
    /// weft's runtime, where each message is read and committed.
    runtime: tokio::runtime::Handle,
    /// The tokio side of a PUBLISH.
    uplinks: Arc<uplinks::Uplinks>,
    /// The connected devices, for their commands.
    sessions: commands::Sessions,
}

/// Starts the broker on `addr`; it stops when `shutdown` is cancelled.
/// Fails when the address cannot be bound. Returns the bound address (the
/// port chosen when `addr` asks for port 0).
pub async fn start(
    addr: SocketAddr,
    config: &MqttConfig,
    services: Arc<Services>,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) -> Result<SocketAddr, String> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| format!("binding the MQTT broker on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("binding the MQTT broker on {addr}: {e}"))?;
    let broker = Arc::new(Broker {
        services: services.clone(),
        runtime: tokio::runtime::Handle::current(),
        uplinks: Arc::new(uplinks::Uplinks::new(
            services.clone(),
            config.api_keys.clone(),
            shutdown.clone(),
        )),
        sessions: commands::Sessions::default(),
    });

    // ntex runs its own system (a tokio current-thread runtime per thread)
    // on a thread of ours; it hands back the handles that stop it.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let serving = broker.clone();
    let thread = std::thread::Builder::new()
        .name("weft-mqtt-broker".into())
        .spawn(move || {
            let system = ntex_rt::System::build()
                .name("weft-mqtt-broker")
                .disable_signals()
                .build(ntex_net::DefaultRuntime);
            let result = system.run(move || match serve(listener, serving) {
                Ok(server) => {
                    let _ = started_tx.send(Ok((ntex_rt::System::current(), server)));
                    Ok(())
                }
                Err(e) => {
                    let _ = started_tx.send(Err(format!("starting the MQTT broker: {e}")));
                    Err(e)
                }
            });
            if let Err(e) = result {
                tracing::error!(error = %e, "the MQTT broker stopped");
            }
        })
        .map_err(|e| format!("starting the MQTT broker's thread: {e}"))?;
    let started: Result<_, String> = started_rx
        .await
        .unwrap_or_else(|_| Err("the MQTT broker's thread ended at start".to_string()));
    let (system, server) = started?;

    services
        .mqtt
        .set_broker_publish(Box::new(move |topic, payload, wait| {
            let broker = broker.clone();
            Box::pin(async move { broker.sessions.deliver(&topic, payload, wait).await })
        }));
    tracker.spawn(async move {
        shutdown.cancelled().await;
        // Connections close without acknowledging what is not committed;
        // the devices send it again to the next weft.
        server.stop(false).await;
        system.stop();
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    });
    tracing::info!(addr = %bound, "embedded MQTT broker listening");
    Ok(bound)
}

/// Serves MQTT on `listener` (on the broker's system).
fn serve(
    listener: std::net::TcpListener,
    broker: Arc<Broker>,
) -> std::io::Result<ntex_server::net::Server> {
    let mqtt = MqttServiceConfig::new()
        .set_max_qos(QoS::ExactlyOnce)
        // One PUBLISH of a connection at a time: a device's messages are
        // committed in the order it sent them (its latest measure is the
        // entity's), and their PUBACKs go back in that order, as MQTT asks.
        .set_max_receive(1)
        .set_max_size(crate::source::MAX_MESSAGE_BYTES as u32 + 1024)
        .set_connect_timeout(ntex_util::time::Seconds(CONNECT_TIMEOUT));
    let cfg = SharedCfg::new("weft-mqtt-broker").add(mqtt);
    Ok(ntex_server::net::build()
        .workers(WORKERS)
        .maxconn(MAX_CONNECTIONS)
        .disable_signals()
        .listen("weft-mqtt", listener, cfg, async move |_| {
            let on_publish = broker.clone();
            let on_connect = broker.clone();
            MqttServer::new().v3(v3::MqttServer::new(
                async move |s: &v3::Session<session::DeviceSession>, p| {
                    session::publish(on_publish.clone(), s, p).await
                },
            )
            .protocol(session::protocol)
            .control(session::control)
            .build(async move |c: v3::Connect| session::connect(on_connect.clone(), c).await))
        })?
        .run())
}
