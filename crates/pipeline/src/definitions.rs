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
