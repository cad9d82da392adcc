//! Commands from weft to devices connected to the embedded broker: which
//! device is connected where, and how a command reaches its connection.
//!
//! A connection lives on one of the broker's threads and its sink may only
//! be used there, so each connected device is known here by a bounded
//! channel to a task on its connection's thread ([`Sessions::register`]).
//! weft's downlink service, on the tokio runtime, hands a command to that
//! channel and waits for the outcome ([`Sessions::deliver`]): the device's
//! PUBACK when it subscribed at QoS 1, the write when at QoS 0.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

/// Commands waiting for one connection's thread; more than this and the
/// downlink is retried later rather than queued without end.
pub(super) const COMMANDS_PER_CONNECTION: usize = 16;

/// One command for a connection's thread to publish.
pub(super) struct Command {
    /// `/{apikey}/{device}/cmd`.
    pub(super) topic: String,
    pub(super) payload: Vec<u8>,
    /// Told `Ok` once the device has it (its PUBACK, or the write for a
    /// QoS 0 subscription), or why not.
    pub(super) done: oneshot::Sender<Result<(), String>>,
}

/// The devices connected to this node's broker, by device id.
#[derive(Default)]
pub(super) struct Sessions {
    by_device: Mutex<HashMap<String, Connected>>,
    next_id: AtomicU64,
}

/// One connected device: its connection's number (to tell a stale
/// connection's goodbye from the current one) and its command channel.
struct Connected {
    id: u64,
    commands: mpsc::Sender<Command>,
}

impl Sessions {
    /// Records `device` as connected; returns the connection's number and
    /// the commands it is to publish. A connection the device had before
    /// is closed (its channel dropped), as MQTT asks of a broker when a
    /// client id connects twice.
    pub(super) fn register(&self, device: &str) -> (u64, mpsc::Receiver<Command>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(COMMANDS_PER_CONNECTION);
        self.by_device
            .lock()
            .insert(device.to_string(), Connected { id, commands: tx });
        (id, rx)
    }

    /// Forgets connection `id` of `device`, unless a newer one replaced it.
    pub(super) fn unregister(&self, device: &str, id: u64) {
        let mut by_device = self.by_device.lock();
        if by_device.get(device).is_some_and(|c| c.id == id) {
            by_device.remove(device);
        }
    }

    /// Publishes a command on `topic` to the device it names, if that
    /// device is connected here; `Ok` once the device has it, within
    /// `wait`. An `Err` leaves the downlink queued for a later attempt.
    pub(super) async fn deliver(
        &self,
        topic: &str,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<(), String> {
        let device = command_device(topic)
            .ok_or_else(|| format!("'{topic}' is not a command topic of the embedded broker"))?;
        let commands = self
            .by_device
            .lock()
            .get(device)
            .map(|c| c.commands.clone())
            .ok_or_else(|| format!("device '{device}' is not connected to the embedded broker"))?;
        let (done, outcome) = oneshot::channel();
        commands
            .try_send(Command {
                topic: topic.to_string(),
                payload,
                done,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    format!("device '{device}' has too many commands in flight")
                }
                mpsc::error::TrySendError::Closed(_) => {
                    format!("device '{device}' disconnected from the embedded broker")
                }
            })?;
        match tokio::time::timeout(wait, outcome).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!(
                "device '{device}' disconnected before acknowledging its command"
            )),
            Err(_) => Err(format!("no PUBACK from device '{device}' within {wait:?}")),
        }
    }
}

/// The device a command topic (`/{apikey}/{device}/cmd`, or with the
/// protocol first, `/json/{apikey}/{device}/cmd`) is for.
fn command_device(topic: &str) -> Option<&str> {
    let mut levels = topic.strip_prefix('/')?.rsplit('/');
    if levels.next()? != "cmd" {
        return None;
    }
    levels.next().filter(|d| !d.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_topics_name_their_device() {
        assert_eq!(command_device("/k1/lamp/cmd"), Some("lamp"));
        assert_eq!(command_device("/json/k1/lamp/cmd"), Some("lamp"));
        assert_eq!(command_device("/k1//cmd"), None);
        assert_eq!(command_device("/k1/lamp/cmdexe"), None);
        assert_eq!(command_device("k1/lamp/cmd"), None);
    }

    /// A second connection of a device replaces the first, whose late
    /// goodbye does not forget the second.
    #[tokio::test]
    async fn a_device_connected_twice_keeps_its_newest_connection() {
        let sessions = Sessions::default();
        let (first, mut first_rx) = sessions.register("d");
        let (_second, mut second_rx) = sessions.register("d");
        assert!(first_rx.recv().await.is_none(), "the first is closed");
        sessions.unregister("d", first);
        let delivery = sessions.deliver("/k/d/cmd", b"x".to_vec(), Duration::from_secs(5));
        let device = async {
            let command = second_rx.recv().await.expect("a command");
            assert_eq!(command.topic, "/k/d/cmd");
            command.done.send(Ok(())).unwrap();
        };
        let (delivered, ()) = tokio::join!(delivery, device);
        assert_eq!(delivered, Ok(()));
        let unknown = sessions
            .deliver("/k/e/cmd", b"x".to_vec(), Duration::from_secs(1))
            .await;
        assert!(unknown.unwrap_err().contains("not connected"));
    }
}
