//! The bookkeeping behind "every notification owed is received": which
//! entity each subscription watches, how many notifications each is owed
//! after the load, and how what the sink received compares.
//!
//! Subscription `i` watches entity `i mod E`, and Orion sends one
//! notification per subscription for every update that actually changes
//! its entity. Every update the bench sends changes the entity (see
//! [`super::stamp`]), so a subscription is owed one notification per update
//! of its entity answered 204. An update answered otherwise (or not at
//! all) may or may not have been applied: it widens the range of what is
//! owed rather than counting either way.

use crate::ngsi_update::load::Owned;

/// The entity subscription `subscription` watches, among `entities`.
pub fn watched_entity(subscription: usize, entities: usize) -> usize {
    subscription % entities
}

/// How many notifications one subscription is owed: at least `min` (its
/// entity's updates answered 204), at most `max` (plus those whose fate is
/// unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwedRange {
    /// Notifications certainly owed.
    pub min: u64,
    /// Notifications possibly owed.
    pub max: u64,
}

/// What each of `subscriptions` subscriptions is owed after the load, from
/// the entities' update tallies (`owned`, indexed by entity, as the load
/// report gives them).
pub fn owed(subscriptions: usize, owned: &[Owned]) -> Vec<OwedRange> {
    (0..subscriptions)
        .map(|i| {
            let o = &owned[watched_entity(i, owned.len())];
            debug_assert_eq!(o.entity, watched_entity(i, owned.len()));
            OwedRange {
                min: o.updated,
                max: o.updated + o.unsure,
            }
        })
        .collect()
}

/// Whether every subscription has received at least what it is certainly
/// owed (the drain's stopping condition).
pub fn all_received(owed: &[OwedRange], received: impl Fn(usize) -> u64) -> bool {
    owed.iter()
        .enumerate()
        .all(|(i, range)| received(i) >= range.min)
}

/// How the notifications received compare with those owed, summed over
/// the subscriptions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Notifications certainly owed (sum of `min`).
    pub owed: u64,
    /// Notifications possibly owed beyond that (sum of `max - min`).
    pub unsure: u64,
    /// Notifications received for the subscriptions' own entities.
    pub received: u64,
    /// Received and owed, up to what each subscription was owed at most.
    pub expected: u64,
    /// Owed and not received (sum of `min - received` where short).
    pub missing: u64,
    /// Received beyond what was possibly owed (sum of `received - max`).
    pub extra: u64,
    /// Subscriptions that received an amount within their owed range.
    pub subscriptions_ok: u64,
    /// Subscriptions that received too few or too many.
    pub subscriptions_off: u64,
    /// The first few subscriptions off, as `(index, received, owed range)`.
    pub off_examples: Vec<(usize, u64, OwedRange)>,
}

/// Most subscriptions quoted in [`Reconciled::off_examples`].
const MAX_EXAMPLES: usize = 5;

/// Compares `received[i]` (notifications subscription `i` got for its own
/// entity) with `owed[i]`.
pub fn reconcile(owed: &[OwedRange], received: &[u64]) -> Reconciled {
    debug_assert_eq!(owed.len(), received.len());
    let mut r = Reconciled::default();
    for (i, (range, &got)) in owed.iter().zip(received).enumerate() {
        r.owed += range.min;
        r.unsure += range.max - range.min;
        r.received += got;
        r.expected += got.min(range.max);
        let missing = range.min.saturating_sub(got);
        let extra = got.saturating_sub(range.max);
        r.missing += missing;
        r.extra += extra;
        if missing == 0 && extra == 0 {
            r.subscriptions_ok += 1;
        } else {
            r.subscriptions_off += 1;
            if r.off_examples.len() < MAX_EXAMPLES {
                r.off_examples.push((i, got, *range));
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(entity: usize, updated: u64, unsure: u64) -> Owned {
        Owned {
            entity,
            last: vec![],
            updated,
            unsure,
        }
    }

    #[test]
    fn subscriptions_wrap_around_the_entities() {
        assert_eq!(watched_entity(0, 1000), 0);
        assert_eq!(watched_entity(999, 1000), 999);
        assert_eq!(watched_entity(7, 3), 1);
        // One entity: every subscription watches it.
        assert!((0..5).all(|i| watched_entity(i, 1) == 0));
    }

    #[test]
    fn owes_one_notification_per_update_per_subscription() {
        let owned = [entity(0, 3, 0), entity(1, 5, 2), entity(2, 0, 0)];
        // Fewer subscriptions than entities: entity 2 owes nothing.
        assert_eq!(
            owed(2, &owned),
            [OwedRange { min: 3, max: 3 }, OwedRange { min: 5, max: 7 }]
        );
        // More subscriptions than entities: each one is owed its own.
        let o = owed(5, &owned);
        assert_eq!(o[3], o[0]);
        assert_eq!(o[4], OwedRange { min: 5, max: 7 });
        // Entity 2 has no subscription, so its updates owe nothing.
        assert_eq!(o.iter().map(|r| r.min).sum::<u64>(), 3 + 5 + 3 + 5);
    }

    #[test]
    fn stops_draining_once_every_subscription_has_its_minimum() {
        let o = [OwedRange { min: 2, max: 2 }, OwedRange { min: 1, max: 4 }];
        assert!(!all_received(&o, |i| [2, 0][i]));
        assert!(all_received(&o, |i| [2, 1][i]));
        assert!(all_received(&o, |i| [3, 9][i]));
        assert!(all_received(&[], |_| 0));
    }

    #[test]
    fn reconciles_received_with_owed() {
        let o = [
            OwedRange { min: 2, max: 2 }, // exact
            OwedRange { min: 3, max: 3 }, // one short
            OwedRange { min: 1, max: 2 }, // within the unsure range
            OwedRange { min: 0, max: 0 }, // one too many
        ];
        let r = reconcile(&o, &[2, 2, 2, 1]);
        assert_eq!(
            r,
            Reconciled {
                owed: 6,
                unsure: 1,
                received: 7,
                expected: 6,
                missing: 1,
                extra: 1,
                subscriptions_ok: 2,
                subscriptions_off: 2,
                off_examples: vec![(1, 2, o[1]), (3, 1, o[3])],
            }
        );
        let all_good = reconcile(&o[..1], &[2]);
        assert_eq!((all_good.missing, all_good.extra), (0, 0));
        assert_eq!(all_good.subscriptions_off, 0);
    }
}
