//! Notices that a stored definition changed, so that every node's
//! in-memory copy of it (the catalog's compiled decoders, the rule
//! engine's rules, the API keys, …) is reloaded from the store the moment
//! another node changes it, never by polling.
//!
//! A notice names what changed, not its new content: the store stays the
//! only source of truth, and a receiving node reads the committed
//! definition from it. So a notice can be lost without leaving a node
//! wrong for good — whenever a backend may have lost notices (the
//! connection to the other nodes dropped, or a follower fell behind) its
//! followers get [`Reload::All`] and reload everything they keep.

use tokio::sync::broadcast;

/// The kinds of stored definitions a node keeps in memory, one per
/// service's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefinitionKind {
    /// A device type and its decoder (the catalog).
    DeviceType,
    /// A device record (the catalog).
    Device,
    /// An alarm rule (the rule engine).
    Rule,
    /// An NGSI subscription (`/v2/subscriptions`).
    Subscription,
    /// An NGSI registration (`/v2/registrations`).
    Registration,
    /// A channel bridge made through the API.
    Bridge,
    /// A revoked channel JWT (`PUT /admin/jwt/revoke`).
    RevokedJwt,
    /// A page template.
    Page,
    /// A page service.
    PageService,
    /// An API key (created or revoked).
    ApiKey,
    /// New messages in a channel (the id is the channel's): not a
    /// definition, but the same kind of notice — the messages are in the
    /// store, and a node with long polls waiting on the channel reads its
    /// head there and wakes them.
    ChannelMessages,
    /// A history query waits for the changes feed to be moved (the id is
    /// empty): not a definition either, but a doorbell — the nodes moving
    /// partitions of the feed move now instead of waiting out their pause.
    HistoryWanted,
}

impl DefinitionKind {
    /// Every kind, for parsing and for tests.
    pub const ALL: [DefinitionKind; 12] = [
        DefinitionKind::DeviceType,
        DefinitionKind::Device,
        DefinitionKind::Rule,
        DefinitionKind::Subscription,
        DefinitionKind::Registration,
        DefinitionKind::Bridge,
        DefinitionKind::RevokedJwt,
        DefinitionKind::Page,
        DefinitionKind::PageService,
        DefinitionKind::ApiKey,
        DefinitionKind::ChannelMessages,
        DefinitionKind::HistoryWanted,
    ];

    /// The kind's name: the last token of its NATS subject.
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionKind::DeviceType => "device-type",
            DefinitionKind::Device => "device",
            DefinitionKind::Rule => "rule",
            DefinitionKind::Subscription => "subscription",
            DefinitionKind::Registration => "registration",
            DefinitionKind::Bridge => "bridge",
            DefinitionKind::RevokedJwt => "revoked-jwt",
            DefinitionKind::Page => "page",
            DefinitionKind::PageService => "page-service",
            DefinitionKind::ApiKey => "api-key",
            DefinitionKind::ChannelMessages => "channel-messages",
            DefinitionKind::HistoryWanted => "history-wanted",
        }
    }

    /// Inverse of [`DefinitionKind::as_str`].
    pub fn parse(s: &str) -> Option<DefinitionKind> {
        DefinitionKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One definition that changed: its kind, its tenant (empty for the
/// default tenant and for kinds without tenants) and its id or name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionChange {
    /// What kind of definition.
    pub kind: DefinitionKind,
    /// Its tenant (`Fiware-Service`), empty when none.
    pub tenant: String,
    /// Its id or name.
    pub id: String,
}

impl DefinitionChange {
    /// A change of `kind` `id` without a tenant.
    pub fn new(kind: DefinitionKind, id: impl Into<String>) -> DefinitionChange {
        DefinitionChange {
            kind,
            tenant: String::new(),
            id: id.into(),
        }
    }

    /// A change of `kind` `id` in `tenant`.
    pub fn in_tenant(
        kind: DefinitionKind,
        tenant: impl Into<String>,
        id: impl Into<String>,
    ) -> DefinitionChange {
        DefinitionChange {
            kind,
            tenant: tenant.into(),
            id: id.into(),
        }
    }
}

/// What a follower is asked to reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// One definition another node changed.
    One(DefinitionChange),
    /// Everything: notices may have been missed (the connection to the
    /// other nodes came back, or this follower fell behind).
    All,
}

impl Reload {
    /// Whether a follower keeping `kinds` has anything to do.
    pub fn concerns(&self, kinds: &[DefinitionKind]) -> bool {
        match self {
            Reload::One(change) => kinds.contains(&change.kind),
            Reload::All => true,
        }
    }

    /// Whether the definition `kind` `tenant`/`id` is to be reloaded.
    pub fn covers(&self, kind: DefinitionKind, tenant: &str, id: &str) -> bool {
        match self {
            Reload::One(c) => c.kind == kind && c.tenant == tenant && c.id == id,
            Reload::All => true,
        }
    }
}

/// How many notices a follower may fall behind before it is told to
/// reload everything instead. Definitions change at human pace; 1024
/// absorbs a script that rewrites every rule at once.
pub const FOLLOWER_CAPACITY: usize = 1024;

/// A service's handle on the definitions other nodes change.
pub struct DefinitionFollower {
    rx: Option<broadcast::Receiver<Reload>>,
}

impl DefinitionFollower {
    /// A follower of `rx`, a backend's broadcast of the notices other
    /// nodes sent (public for backends and test doubles outside this crate).
    pub fn new(rx: broadcast::Receiver<Reload>) -> DefinitionFollower {
        DefinitionFollower { rx: Some(rx) }
    }

    /// A follower with nothing to follow: one node alone.
    pub fn none() -> DefinitionFollower {
        DefinitionFollower { rx: None }
    }

    /// The next thing to reload; `None` once there is nothing more to
    /// follow (one node alone, or the bus shut down). A follower that fell
    /// behind gets [`Reload::All`], since it lost notices.
    pub async fn recv(&mut self) -> Option<Reload> {
        let rx = self.rx.as_mut()?;
        match rx.recv().await {
            Ok(reload) => Some(reload),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Reload::All),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in DefinitionKind::ALL {
            assert_eq!(DefinitionKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(DefinitionKind::parse("devicetype"), None);
    }

    #[test]
    fn a_reload_concerns_only_its_kind_but_all_concerns_everyone() {
        let one = Reload::One(DefinitionChange::in_tenant(
            DefinitionKind::Subscription,
            "t",
            "s1",
        ));
        assert!(one.concerns(&[DefinitionKind::Subscription]));
        assert!(!one.concerns(&[DefinitionKind::Rule, DefinitionKind::ApiKey]));
        assert!(one.covers(DefinitionKind::Subscription, "t", "s1"));
        assert!(!one.covers(DefinitionKind::Subscription, "", "s1"));
        assert!(!one.covers(DefinitionKind::Subscription, "t", "s2"));
        assert!(Reload::All.concerns(&[DefinitionKind::Rule]));
        assert!(Reload::All.covers(DefinitionKind::Rule, "", "any"));
    }

    /// A follower that fell behind must not silently skip notices: it is
    /// told to reload everything.
    #[tokio::test]
    async fn a_lagging_follower_reloads_everything() {
        let (tx, rx) = broadcast::channel(2);
        let mut follower = DefinitionFollower::new(rx);
        for id in ["a", "b", "c"] {
            tx.send(Reload::One(DefinitionChange::new(DefinitionKind::Rule, id)))
                .unwrap();
        }
        assert_eq!(follower.recv().await, Some(Reload::All));
        drop(tx);
        let rest: Vec<_> =
            std::iter::from_fn(|| futures::executor::block_on(follower.recv())).collect();
        assert_eq!(rest.len(), 2, "the notices still buffered follow");
        assert_eq!(DefinitionFollower::none().recv().await, None);
    }
}
