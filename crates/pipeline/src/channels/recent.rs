//! A channel's latest messages, kept in memory so that a long poll woken
//! by a publish is answered without reading the store.
//!
//! Every subscriber of a busy channel fetches what was just published, a
//! moment after it was published: with many channels, those reads (one per
//! subscriber per message burst, each on the blocking pool) were the
//! largest single cost of the server. The messages are still written to
//! the store first and answered only once committed; this is a copy of
//! the newest of them, for one node that alone publishes to its channels
//! (clustered, other nodes publish too, and the store stays the only
//! truth).
//!
//! The copy answers a fetch only when it holds *every* message of the
//! channel after the subscriber's cursor. Positions (`seq`) are shared by
//! all channels, so a gap cannot be seen from the numbers; instead the
//! copy claims a range `(base, last]` and counts the publishes in flight:
//! messages are added only when none is in flight, all at once and in
//! order, so no message committed inside the range can be missing from
//! it. A publish that fails may still have committed (a lost answer): the
//! claim is then dropped, and starts again just below the next message
//! added, which comes after anything such a publish could have stored.
//!
//! Memory stays bounded: [`MAX_MESSAGES`] and [`MAX_BYTES`] per channel
//! (the oldest are dropped, and `base` moves past them), and a budget
//! shared by all channels ([`Budget`]). What the copy does not hold is
//! read from the store, as before.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use weft_store::ChannelMessage;

/// Messages kept per channel: a fetch's default `max`, so one fetch of a
/// subscriber that keeps up is always answered here.
pub const MAX_MESSAGES: usize = 64;

/// Bytes of messages kept per channel.
pub const MAX_BYTES: usize = 256 * 1024;

/// Bytes of messages kept over all channels, by default.
pub const DEFAULT_BUDGET: usize = 64 * 1024 * 1024;

/// Bytes a message is counted for: its text and its bookkeeping.
fn size_of(m: &ChannelMessage) -> usize {
    m.content.len() + m.message_id.len() + std::mem::size_of::<ChannelMessage>()
}

/// The bytes all channels' copies may hold together; shared by them.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Takes `n` bytes if they fit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + n <= self.limit).then_some(used + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// How a publish counted by [`Recent::begin`] ended.
pub enum Outcome {
    /// Committed as this message.
    Stored(ChannelMessage),
    /// Its id was already in the channel: nothing new.
    Duplicate,
    /// The store failed; it may or may not have committed.
    Failed,
}

/// One channel's copy; see the module doc.
#[derive(Debug)]
pub struct Recent {
    /// Every message of the channel with `base < seq <= last` is in
    /// `messages` (`last`: the newest there, or `base`). `None`: nothing
    /// is claimed, every fetch reads the store.
    base: Option<u64>,
    messages: VecDeque<ChannelMessage>,
    bytes: usize,
    /// Publishes begun and not yet ended.
    in_flight: usize,
    /// Messages of ended publishes, added once none is in flight.
    ended: Vec<ChannelMessage>,
    /// A publish failed since the last settling: drop the claim then.
    failed: bool,
    budget: Arc<Budget>,
}

impl Recent {
    /// A copy claiming nothing after `base`: every message up to `base`
    /// is in the store, none after it exists yet (a channel loaded at
    /// start, its head as `base`). `None` for a channel whose stored
    /// messages are not known.
    pub fn new(base: Option<u64>, budget: Arc<Budget>) -> Recent {
        Recent {
            base,
            messages: VecDeque::new(),
            bytes: 0,
            in_flight: 0,
            ended: Vec::new(),
            failed: false,
            budget,
        }
    }

    /// Counts a publish about to be queued to the store.
    pub fn begin(&mut self) {
        self.in_flight += 1;
    }

    /// Ends a publish counted by [`Recent::begin`].
    pub fn end(&mut self, outcome: Outcome) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            // Publishes that keep overlapping never leave none in flight:
            // past a bound, what ended is dropped with the claim.
            Outcome::Stored(_) if self.ended.len() >= MAX_MESSAGES => {
                self.ended.clear();
                self.failed = true;
            }
            Outcome::Stored(m) => self.ended.push(m),
            Outcome::Duplicate => {}
            Outcome::Failed => self.failed = true,
        }
        if self.in_flight == 0 {
            self.settle();
        }
    }

    /// With no publish in flight: adds the ended messages in order, or
    /// drops the claim after a failure.
    fn settle(&mut self) {
        let mut ended = std::mem::take(&mut self.ended);
        if std::mem::take(&mut self.failed) {
            self.clear();
            self.base = None;
            return;
        }
        ended.sort_unstable_by_key(|m| m.seq);
        for m in ended {
            // The first message after a dropped claim starts a new one
            // just below itself.
            let base = *self.base.get_or_insert(m.seq.saturating_sub(1));
            if m.seq <= self.messages.back().map_or(base, |l| l.seq) {
                continue;
            }
            self.push(m);
        }
    }

    fn push(&mut self, m: ChannelMessage) {
        let size = size_of(&m);
        while !self.messages.is_empty()
            && (self.messages.len() >= MAX_MESSAGES || self.bytes + size > MAX_BYTES)
        {
            self.pop_oldest();
        }
        if size > MAX_BYTES || !self.budget.take(size) {
            // Not kept: the claim moves past it (what it covered is in
            // the store).
            self.clear();
            self.base = Some(m.seq);
            return;
        }
        self.bytes += size;
        self.messages.push_back(m);
    }

    fn pop_oldest(&mut self) {
        if let Some(old) = self.messages.pop_front() {
            let size = size_of(&old);
            self.bytes -= size;
            self.budget.give_back(size);
            self.base = Some(old.seq);
        }
    }

    /// Forgets every message, keeping the claim's end as its start.
    fn clear(&mut self) {
        if let Some(last) = self.messages.back() {
            self.base = Some(last.seq);
        }
        self.budget.give_back(self.bytes);
        self.bytes = 0;
        self.messages.clear();
    }

    /// The first `n` messages after `cursor` when this copy holds every
    /// message after it up to `head` (the channel's committed head the
    /// caller saw); `None` when the store must be read.
    pub fn after(&self, cursor: u64, head: u64, n: usize) -> Option<Vec<ChannelMessage>> {
        let base = self.base?;
        let last = self.messages.back().map_or(base, |m| m.seq);
        if cursor < base || head > last {
            return None;
        }
        let start = self.messages.partition_point(|m| m.seq <= cursor);
        Some(self.messages.range(start..).take(n).cloned().collect())
    }

    /// Drops the messages up to `seq` (deleted from the store once every
    /// subscriber acknowledged them).
    pub fn prune(&mut self, seq: u64) {
        while self.messages.front().is_some_and(|m| m.seq <= seq) {
            self.pop_oldest();
        }
        if let Some(base) = &mut self.base {
            *base = (*base).max(seq);
        }
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64) -> ChannelMessage {
        ChannelMessage {
            seq,
            message_id: format!("m{seq}"),
            content: format!("{{\"n\":{seq}}}"),
        }
    }

    fn seqs(found: Option<Vec<ChannelMessage>>) -> Option<Vec<u64>> {
        found.map(|ms| ms.iter().map(|m| m.seq).collect())
    }

    fn stored(recent: &mut Recent, seq: u64) {
        recent.begin();
        recent.end(Outcome::Stored(message(seq)));
    }

    /// A channel loaded at start holds what comes after its head, and
    /// sends a subscriber behind the head to the store.
    #[test]
    fn answers_after_its_base_and_sends_older_cursors_to_the_store() {
        let mut recent = Recent::new(Some(10), Budget::new(DEFAULT_BUDGET));
        assert_eq!(seqs(recent.after(10, 10, 64)), Some(vec![]));
        stored(&mut recent, 14);
        stored(&mut recent, 20);
        assert_eq!(seqs(recent.after(10, 20, 64)), Some(vec![14, 20]));
        assert_eq!(seqs(recent.after(14, 20, 64)), Some(vec![20]));
        assert_eq!(seqs(recent.after(10, 20, 1)), Some(vec![14]));
        assert_eq!(seqs(recent.after(9, 20, 64)), None, "9 < base: the store");
        assert_eq!(
            seqs(recent.after(14, 21, 64)),
            None,
            "a head beyond what is held: the store"
        );
    }

    /// A channel whose stored messages are unknown claims nothing until
    /// a message is added, and then only from just below it.
    #[test]
    fn an_unknown_channel_claims_from_its_first_message_on() {
        let mut recent = Recent::new(None, Budget::new(DEFAULT_BUDGET));
        assert_eq!(seqs(recent.after(0, 0, 64)), None);
        stored(&mut recent, 7);
        assert_eq!(seqs(recent.after(6, 7, 64)), Some(vec![7]));
        assert_eq!(seqs(recent.after(0, 7, 64)), None, "before 6: unknown");
    }

    /// Publishes that end out of order are added only when none is in
    /// flight, sorted: a fetch in between reads the store rather than
    /// miss the one still committing.
    #[test]
    fn messages_ending_out_of_order_wait_for_the_publishes_in_flight() {
        let mut recent = Recent::new(Some(0), Budget::new(DEFAULT_BUDGET));
        recent.begin();
        recent.begin();
        recent.end(Outcome::Stored(message(2)));
        assert_eq!(
            seqs(recent.after(0, 2, 64)),
            None,
            "1 may still be committing"
        );
        recent.end(Outcome::Stored(message(1)));
        assert_eq!(seqs(recent.after(0, 2, 64)), Some(vec![1, 2]));
        recent.begin();
        recent.end(Outcome::Duplicate);
        assert_eq!(seqs(recent.after(0, 2, 64)), Some(vec![1, 2]));
    }

    /// A failed publish may have committed anyway: the claim is dropped,
    /// and starts again below the next message.
    #[test]
    fn a_failed_publish_drops_the_claim() {
        let mut recent = Recent::new(Some(0), Budget::new(DEFAULT_BUDGET));
        stored(&mut recent, 1);
        recent.begin();
        recent.begin();
        recent.end(Outcome::Stored(message(3)));
        recent.end(Outcome::Failed);
        assert_eq!(seqs(recent.after(0, 3, 64)), None);
        assert_eq!(seqs(recent.after(1, 3, 64)), None, "2 may be stored");
        stored(&mut recent, 5);
        assert_eq!(seqs(recent.after(4, 5, 64)), Some(vec![5]));
        assert_eq!(seqs(recent.after(3, 5, 64)), None);
    }

    /// Publishes that never stop overlapping do not pile up: past the
    /// bound the claim is dropped, and the store answers until a message
    /// ends with none in flight.
    #[test]
    fn overlapping_publishes_do_not_pile_up() {
        let mut recent = Recent::new(Some(0), Budget::new(DEFAULT_BUDGET));
        recent.begin();
        for seq in 1..=(2 * MAX_MESSAGES as u64) {
            recent.begin();
            recent.end(Outcome::Stored(message(seq)));
            assert!(recent.ended.len() <= MAX_MESSAGES);
        }
        recent.end(Outcome::Duplicate);
        assert_eq!(seqs(recent.after(0, 2 * MAX_MESSAGES as u64, 64)), None);
        stored(&mut recent, 1000);
        assert_eq!(seqs(recent.after(999, 1000, 64)), Some(vec![1000]));
    }

    /// The oldest messages go beyond the per-channel bound, and with
    /// them the claim on what they covered; a message too big for the
    /// budget is not kept and moves the claim past itself.
    #[test]
    fn bounds_drop_the_oldest_and_move_the_base() {
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut recent = Recent::new(Some(0), budget.clone());
        for seq in 1..=(MAX_MESSAGES as u64 + 3) {
            stored(&mut recent, seq);
        }
        let last = MAX_MESSAGES as u64 + 3;
        assert_eq!(seqs(recent.after(2, last, 1)), None, "1..=3 were dropped");
        assert_eq!(seqs(recent.after(3, last, 1)), Some(vec![4]));
        assert!(budget.used() > 0);
        drop(recent);
        assert_eq!(budget.used(), 0, "a forgotten channel gives its bytes back");

        let small = Budget::new(size_of(&message(1)) * 2);
        let mut recent = Recent::new(Some(0), small.clone());
        stored(&mut recent, 1);
        stored(&mut recent, 2);
        stored(&mut recent, 3);
        assert_eq!(seqs(recent.after(0, 3, 64)), None);
        assert_eq!(
            seqs(recent.after(3, 3, 64)),
            Some(vec![]),
            "the claim moved past what did not fit"
        );
        stored(&mut recent, 4);
        assert_eq!(seqs(recent.after(3, 4, 64)), Some(vec![4]));
        assert!(small.used() <= size_of(&message(1)) * 2);
    }

    /// Pruning drops what every subscriber acknowledged.
    #[test]
    fn pruning_drops_the_acknowledged() {
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut recent = Recent::new(Some(0), budget.clone());
        for seq in 1..=4 {
            stored(&mut recent, seq);
        }
        recent.prune(2);
        assert_eq!(seqs(recent.after(2, 4, 64)), Some(vec![3, 4]));
        assert_eq!(seqs(recent.after(1, 4, 64)), None);
        recent.prune(9);
        assert_eq!(budget.used(), 0);
    }
}
