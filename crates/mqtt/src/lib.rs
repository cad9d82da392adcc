//! weft's MQTT surfaces, both feeding the same ingest log as the HTTP
//! paths:
//!
//! - [`source`]: weft as a client of brokers named in `[mqtt.sources.*]`
//!   (The Things Stack, ChirpStack, IoT-Agent-style and plain topics),
//!   acknowledging each message only once it is committed.
//! - [`broker`]: the embedded broker devices publish to directly
//!   (`[mqtt] listen`), each authenticated by its device id and key.
//! - [`topics`]: how a topic and payload become uplinks, for both.
//! - [`config`]: the `[mqtt]` configuration.

pub mod broker;
pub mod config;
pub mod source;
pub mod topics;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_pipeline::Services;

pub use config::{MqttConfig, SourceConfig};

/// Starts every configured source and, when `[mqtt] listen` is set, the
/// embedded broker; registers the sources' links with the services. Fails
/// on a bad source configuration or a broker address that cannot be bound.
/// Returns the embedded broker's address, if it runs.
pub async fn start(
    config: &MqttConfig,
    services: &Arc<Services>,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) -> Result<Option<std::net::SocketAddr>, String> {
    // Clustered (a bus shared with other nodes): every node subscribes
    // through a shared subscription, so each message goes to one of them.
    let node = services
        .bus
        .node()
        .is_some()
        .then(|| services.cluster.node().to_string());
    let mut sources = Vec::new();
    for (name, source) in &config.sources {
        sources.push((
            source::Source::new(name, source, node.as_deref())?,
            source.url.clone(),
        ));
    }
    for (source, url) in sources {
        let link = source.start(&url, services.clone(), shutdown.clone(), tracker)?;
        services.mqtt.register(link);
    }
    match config.listen {
        Some(addr) => broker::start(addr, config, services.clone(), shutdown, tracker)
            .await
            .map(Some),
        None => Ok(None),
    }
}
