//! The uplink journey: what a device (or its network server) sends, from
//! the bytes a transport hands in to what the ingest log keeps, and the
//! command results devices answer with.
//!
//! The steps, in order:
//!
//! 1. **Credential.** The transport checks who sent it and says what that
//!    credential holds it to ([`UplinkPins`]: an ingest key's channel and
//!    device type; nothing for the global ingest key, an admin key, MQTT).
//! 2. **Accept.** [`crate::Ingest::accept`] finds the device the transport
//!    or the envelope names (before any decoding) and refuses an uplink
//!    whose registered device lies outside the pins; otherwise it appends
//!    the uplink, pins included, to the ingest log.
//! 3. **Decode** (the consumer, [`crate::decode`]): a registered device
//!    keeps its type (`TypeMismatch`), a device only the decoded payload
//!    names is held to the pins (`Forbidden`), a reported time that is no
//!    time fails (`InvalidUplink`) — each a failed uplink with its reason.
//!
//! Command results ([`command_result`]) are the way back of commands: a
//! device's answer lands on its entity only with a credential whose pins
//! hold that device.

use serde_json::{Map, Value};
use weft_model::{DownlinkRoute, NewUplink, UplinkPins};

use crate::downlinks::DownlinkError;
use crate::{AcceptError, Services};

/// Why a command result was refused.
#[derive(Debug, thiserror::Error)]
pub enum CommandResultRefused {
    /// The device lies outside the credential's pins.
    #[error("{0}")]
    Forbidden(String),
    /// The downlink service refused it (an unknown device, the store).
    #[error(transparent)]
    Downlink(#[from] DownlinkError),
}

/// A device's answer to its commands (`{"<command>": <result>}`), sent
/// with a credential pinned to `pins`: each command of the device named
/// gets `<command>_status` `OK` and `<command>_info` the result. Answers
/// the commands answered; refused for an unknown device or one registered
/// outside the pins.
pub async fn command_result(
    services: &Services,
    device_id: &str,
    answers: &Map<String, Value>,
    pins: &UplinkPins,
) -> Result<Vec<String>, CommandResultRefused> {
    let Some(device) = services.catalog.device(device_id) else {
        return Err(DownlinkError::UnknownDevice(device_id.to_string()).into());
    };
    if let Some(why) = pins.refusal(&device) {
        metrics::counter!("weft_command_results_refused_total").increment(1);
        return Err(CommandResultRefused::Forbidden(why));
    }
    Ok(services
        .downlinks
        .command_answer(device_id, answers)
        .await?)
}

/// How long [`accept`] keeps at an ingest log that does not take an
/// uplink (overloaded, or its store failing).
#[derive(Debug, Clone)]
pub enum Patience {
    /// Not at all: the first refusal is the answer (HTTP, whose client
    /// retries on the 503).
    Once,
    /// Again and again, waiting 50 ms and doubling up to `max_delay`
    /// between tries, until committed, until `stop` is cancelled, or until
    /// `give_up_after` has passed (MQTT, whose message stays
    /// unacknowledged when it was not committed, so the broker or the
    /// device sends it again).
    Retry {
        /// Stops the retries (weft is stopping).
        stop: tokio_util::sync::CancellationToken,
        /// The longest wait between two tries.
        max_delay: std::time::Duration,
        /// How long to keep trying, if not until `stop`.
        give_up_after: Option<std::time::Duration>,
    },
}

/// What a transport hands in: the uplinks one message holds (an
/// UltraLight message may hold several measure groups), and the way back
/// to their device when the transport tells it (learnt once they are
/// committed).
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The uplinks, appended in order.
    pub uplinks: Vec<NewUplink>,
    /// The body of the (single) uplink already parsed by the transport,
    /// so accept does not parse it again to find its device.
    pub parsed: Option<Value>,
    /// The device the uplinks are from and how it is reached back.
    pub route: Option<(String, DownlinkRoute)>,
}

/// Accepts what a transport received: each uplink is held to its pins
/// and appended to the ingest log ([`crate::Ingest::accept`]), with the
/// `patience` the transport has; once all are committed, the downlink
/// route the transport told is learnt ([`crate::downlinks::Downlinks::observe_route`]).
/// `Err` when one was not committed: `Forbidden` at once (nothing of the
/// message is kept), else the last refusal once the patience ran out.
pub async fn accept(
    services: &Services,
    arrival: Arrival,
    patience: &Patience,
) -> Result<(), AcceptError> {
    let started = std::time::Instant::now();
    let single = arrival.uplinks.len() == 1;
    let mut parsed = arrival.parsed.filter(|_| single);
    for uplink in arrival.uplinks {
        let mut delay = std::time::Duration::from_millis(50);
        loop {
            let tried = match parsed.take() {
                Some(body) => services.ingest.accept_parsed(uplink.clone(), &body).await,
                None => services.ingest.accept(uplink.clone()).await,
            };
            let error = match tried {
                Ok(_) => break,
                Err(e @ AcceptError::Forbidden(_)) => return Err(e),
                Err(e) => e,
            };
            let Patience::Retry {
                stop,
                max_delay,
                give_up_after,
            } = patience
            else {
                return Err(error);
            };
            if matches!(error, AcceptError::Store(_)) {
                tracing::warn!(%error, "appending to the ingest log failed; retrying");
            }
            if stop.is_cancelled() || give_up_after.is_some_and(|g| started.elapsed() >= g) {
                return Err(error);
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return Err(error),
            }
            delay = (delay * 2).min(*max_delay);
        }
    }
    if let Some((device, route)) = arrival.route {
        services.downlinks.observe_route(&device, route).await;
    }
    Ok(())
}
