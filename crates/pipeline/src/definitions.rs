//! Keeping this node's in-memory copies of stored definitions in step
//! with what other nodes change: each service that keeps definitions in
//! memory (the catalog, the rules, the NGSI subscriptions and
//! registrations, the bridges, the revoked channel tokens, the API keys,
//! the pages) is a [`Follower`], and [`follow`] runs one task per follower
//! that reloads, from the store, what the bus says another node changed.
//!
//! The other half is in each service: a change made through it is
//! announced with [`Bus::definition_changed`] once the store has
//! committed it. With the in-process bus nobody else holds a copy, the
//! announcement goes nowhere and the follower task ends at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_bus::Bus;
use weft_store::StoreError;

pub use weft_bus::{DefinitionChange, DefinitionKind, Reload};

/// How many times a failed reload is tried before it is given up (and
/// logged as an error: that node keeps a stale copy until the next notice
/// or restart).
const RELOAD_ATTEMPTS: u32 = 6;

/// A service that keeps stored definitions in memory and reloads them
/// when another node changes them.
pub trait Follower: Send + Sync + 'static {
    /// The kinds of definitions it keeps.
    const KINDS: &'static [DefinitionKind];

    /// Reloads from the store what `what` names ([`Reload::All`]: every
    /// definition of its kinds), replacing or dropping the copies in
    /// memory. What only this node knows (counters, rate-limit buckets,
    /// running tasks) is kept where the definition still exists.
    fn reload(&self, what: &Reload) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Runs `follower`'s reloads on `tracker` until `shutdown`: one task,
/// handling notices in the order they came.
pub fn follow<F: Follower>(
    follower: Arc<F>,
    bus: &dyn Bus,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) {
    let mut notices = bus.follow_definitions();
    tracker.spawn(async move {
        loop {
            let what = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = notices.recv() => match next {
                    Some(what) => what,
                    None => return,
                },
            };
            if !what.concerns(F::KINDS) {
                continue;
            }
            let mut delay = Duration::from_millis(100);
            for attempt in 1..=RELOAD_ATTEMPTS {
                match follower.reload(&what).await {
                    Ok(()) => break,
                    Err(e) if attempt < RELOAD_ATTEMPTS => {
                        tracing::warn!(error = %e, ?what, "reloading a definition another node changed failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, ?what, "reloading a definition another node changed failed; this node keeps its old copy");
                    }
                }
            }
        }
    });
}

/// Two nodes in one process, sharing one store: what one changes through
/// its services, the other's caches pick up through [`follow`]. The NATS
/// transport itself is tested in `weft-bus` and end to end in the
/// black-box `scale_out` tests.
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::broadcast;
    use weft_bus::{DefinitionFollower, Event, InProcessBus, Stream, Subscription};
    use weft_engine::{Engine, EngineConfig};
    use weft_model::DeviceType;
    use weft_store::Store;

    use crate::catalog::Catalog;
    use crate::subscriptions::Subscriptions;

    /// A node's bus: events stay in the node; definition changes go to the
    /// peer's followers.
    struct NodeBus {
        local: InProcessBus,
        to_peer: broadcast::Sender<Reload>,
        from_peer: broadcast::Sender<Reload>,
    }

    impl Bus for NodeBus {
        fn publish(&self, event: Event) {
            self.local.publish(event);
        }
        fn subscribe(&self, stream: Stream) -> Subscription {
            self.local.subscribe(stream)
        }
        fn definition_changed(&self, change: DefinitionChange) {
            let _ = self.to_peer.send(Reload::One(change));
        }
        fn follow_definitions(&self) -> DefinitionFollower {
            DefinitionFollower::new(self.from_peer.subscribe())
        }
    }

    fn pair() -> (Arc<NodeBus>, Arc<NodeBus>) {
        let (ab, _) = broadcast::channel(64);
        let (ba, _) = broadcast::channel(64);
        let a = NodeBus {
            local: InProcessBus::default(),
            to_peer: ab.clone(),
            from_peer: ba.clone(),
        };
        let b = NodeBus {
            local: InProcessBus::default(),
            to_peer: ba,
            from_peer: ab,
        };
        (Arc::new(a), Arc::new(b))
    }

    fn store(dir: &std::path::Path) -> Arc<dyn Store> {
        Arc::new(
            weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
                path: dir.join("weft.db"),
                ..Default::default()
            })
            .unwrap(),
        )
    }

    /// Polls `check` for 5 s at most.
    async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn probe(offset: i64) -> DeviceType {
        serde_json::from_value(json!({"decoder": {"language": "javascript", "script": format!(
            "function decodeUplink(input) {{ return {{ data: {{ t: input.bytes[0] + {offset} }} }}; }}"
        )}}))
        .unwrap()
    }

    /// A decoder put or deleted through one node's catalog is compiled on,
    /// or gone from, the other's; the node that made the change has it at
    /// once.
    #[tokio::test]
    async fn the_catalog_follows_the_other_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let engine = Engine::start(EngineConfig::default());
        let (bus_a, bus_b) = pair();
        let a = Catalog::load(store.clone(), engine.clone(), bus_a)
            .await
            .unwrap();
        let b = Arc::new(
            Catalog::load(store.clone(), engine, bus_b.clone())
                .await
                .unwrap(),
        );
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        follow(b.clone(), &*bus_b, stop.clone(), &tracker);

        a.put_device_type("probe", probe(0)).await.unwrap();
        assert_eq!(a.device_type("probe").unwrap().def, probe(0));
        eventually("b compiles the new type", || {
            b.device_type("probe")
                .is_some_and(|t| t.def == probe(0) && t.codec.is_some())
        })
        .await;
        a.put_device_type("probe", probe(100)).await.unwrap();
        eventually("b takes the edited decoder", || {
            b.device_type("probe").is_some_and(|t| t.def == probe(100))
        })
        .await;
        a.delete_device_type("probe").await.unwrap();
        eventually("b forgets the type", || b.device_type("probe").is_none()).await;
        stop.cancel();
        store.close().await;
    }

    /// An NGSI subscription created, patched and deleted through one node
    /// is there, changed and gone on the other, in its tenant only.
    #[tokio::test]
    async fn subscriptions_follow_the_other_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let (bus_a, bus_b) = pair();
        let config = crate::subscriptions::sender::SenderConfig::default();
        let a = Subscriptions::load(store.clone(), config.clone(), bus_a, "a", 0)
            .await
            .unwrap();
        let b = Subscriptions::load(store.clone(), config, bus_b.clone(), "b", 0)
            .await
            .unwrap();
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        follow(b.clone(), &*bus_b, stop.clone(), &tracker);

        let body = json!({
            "subject": {"entities": [{"id": "Room1", "type": "Room"}]},
            "notification": {"http": {"url": "http://127.0.0.1:9/notify"}}
        });
        let id = a.create("smart", Vec::new(), &body).await.unwrap();
        eventually("b has the subscription", || b.get("smart", &id).is_ok()).await;
        assert!(b.get("", &id).is_err(), "in its tenant only");
        a.patch("smart", &id, &json!({"throttling": 7}))
            .await
            .unwrap();
        eventually("b has the patch", || {
            b.get("smart", &id)
                .is_ok_and(|s| s["throttling"] == json!(7))
        })
        .await;
        a.delete("smart", &id, crate::subscriptions::Api::NgsiV2)
            .await
            .unwrap();
        eventually("b drops it", || b.get("smart", &id).is_err()).await;
        stop.cancel();
        store.close().await;
    }
}
