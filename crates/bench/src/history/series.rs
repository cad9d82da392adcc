//! The bookkeeping behind "rows stored = notifications sent": what one
//! entity's series must hold after the bench wrote it, and what every
//! query over it must answer.
//!
//! An entity's notifications are numbered 1, 2, 3, … (`seq`); the `seq`-th
//! carries the time index `origin + seq × step` and `temperature = seq`, so
//! a stored value names its own notification and its time. One writer owns
//! each entity, so the numbers are dense: `1..=sent` were sent. A
//! notification answered 200 is certainly stored; one answered otherwise
//! (or not at all) may or may not be ([`Series::mark_unsure`]): it widens
//! the range of what a count may be rather than counting either way, and a
//! window holding one has no single expected list of values.

use std::collections::BTreeMap;

/// What a query over a series must answer: a number of values in
/// `min..=max` and, when nothing in the window is unsure, exactly `values`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    /// Fewest values the answer may hold.
    pub min: usize,
    /// Most values the answer may hold.
    pub max: usize,
    /// The exact values, in time order, when they are known.
    pub values: Option<Vec<f64>>,
}

impl Expect {
    /// Compares an answer's values (`None` for a JSON `null`) with what is
    /// expected; the error says how they differ.
    pub fn check(&self, got: &[Option<f64>]) -> Result<(), String> {
        if got.len() < self.min || got.len() > self.max {
            let want = if self.min == self.max {
                self.min.to_string()
            } else {
                format!("{}..={}", self.min, self.max)
            };
            return Err(format!("{} values, expected {want}", got.len()));
        }
        if let Some(want) = &self.values {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                match g {
                    Some(g) if (g - w).abs() <= 1e-9 * w.abs().max(1.0) => {}
                    Some(g) => return Err(format!("value {i} is {g}, expected {w}")),
                    None => return Err(format!("value {i} is null, expected {w}")),
                }
            }
        }
        Ok(())
    }
}

/// One entity's series as written: its time grid, how many notifications
/// were sent, and which of them may not be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Time index of `seq = 0` (never sent), epoch ms.
    origin: i64,
    /// Time between consecutive notifications, ms (at least 1).
    step: i64,
    /// Notifications `1..=sent` were sent.
    sent: u64,
    /// Unsure notifications as disjoint inclusive ranges, `lo → hi`.
    unsure: BTreeMap<u64, u64>,
}

impl Series {
    /// An empty series on the grid `origin + seq × step`.
    pub fn new(origin: i64, step: i64) -> Series {
        assert!(step > 0, "a series' step is positive");
        Series {
            origin,
            step,
            sent: 0,
            unsure: BTreeMap::new(),
        }
    }

    /// Numbers the next notification (1, 2, …).
    pub fn next_seq(&mut self) -> u64 {
        self.sent += 1;
        self.sent
    }

    /// Records that notifications `1..=sent` were sent (the preload sends
    /// its batches in parallel, numbered up front).
    pub fn set_sent(&mut self, sent: u64) {
        self.sent = sent;
    }

    /// Notifications sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Marks notifications `lo..=hi` as unsure: not answered 200, so they
    /// may or may not be stored. Each is marked at most once.
    pub fn mark_unsure(&mut self, lo: u64, hi: u64) {
        debug_assert!(lo >= 1 && lo <= hi && hi <= self.sent, "{lo}..={hi}");
        debug_assert_eq!(self.certain_in(lo, hi), hi - lo + 1, "marked twice");
        self.unsure.insert(lo, hi);
    }

    /// Notifications that may or may not be stored.
    pub fn unsure(&self) -> u64 {
        self.sent - self.certain()
    }

    /// Notifications certainly stored (answered 200).
    pub fn certain(&self) -> u64 {
        if self.sent == 0 {
            0
        } else {
            self.certain_in(1, self.sent)
        }
    }

    /// Time between consecutive notifications, ms.
    pub fn step(&self) -> i64 {
        self.step
    }

    /// The time index of notification `seq`.
    pub fn time(&self, seq: u64) -> i64 {
        self.origin + seq as i64 * self.step
    }

    /// The notification a stored `(time, value)` pair came from, when it
    /// is one the bench sent: on the grid, `value = seq`, `1 ≤ seq ≤ sent`.
    pub fn seq_of(&self, time: i64, value: f64) -> Option<u64> {
        let offset = time - self.origin;
        if offset <= 0 || offset % self.step != 0 {
            return None;
        }
        let seq = (offset / self.step) as u64;
        (seq <= self.sent && value == seq as f64).then_some(seq)
    }

    /// Certain notifications among `lo..=hi`.
    fn certain_in(&self, lo: u64, hi: u64) -> u64 {
        if lo > hi {
            return 0;
        }
        // Disjoint ranges sorted by start are sorted by end too: walk back
        // from the last one starting at or before `hi` while they reach `lo`.
        let unsure: u64 = self
            .unsure
            .range(..=hi)
            .rev()
            .take_while(|(_, &end)| end >= lo)
            .map(|(&start, &end)| end.min(hi) - start.max(lo) + 1)
            .sum();
        hi - lo + 1 - unsure
    }

    /// The notifications whose time index lies in `from..=to` (inclusive,
    /// as QuantumLeap's `fromDate`/`toDate`), or `None` when there are none.
    pub fn seqs_in(&self, from: i64, to: i64) -> Option<(u64, u64)> {
        if from > to || self.sent == 0 {
            return None;
        }
        // First grid point at or after `from`, last at or before `to`.
        let lo = -(self.origin - from).div_euclid(self.step);
        let hi = (to - self.origin).div_euclid(self.step);
        let lo = lo.max(1) as u64;
        let hi = hi.min(self.sent as i64);
        (hi >= 1 && lo <= hi as u64).then_some((lo, hi as u64))
    }

    /// Every value, in order, once all stored rows are counted: `min..=max`
    /// of them (what the verify phase compares a full read with).
    pub fn expect_all(&self) -> Expect {
        self.expect_window(i64::MIN / 2, i64::MAX / 2)
    }

    /// A range query `fromDate=from&toDate=to`.
    pub fn expect_window(&self, from: i64, to: i64) -> Expect {
        match self.seqs_in(from, to) {
            None => Expect {
                min: 0,
                max: 0,
                values: Some(Vec::new()),
            },
            Some((lo, hi)) => {
                let possible = hi - lo + 1;
                let certain = self.certain_in(lo, hi);
                Expect {
                    min: certain as usize,
                    max: possible as usize,
                    values: (certain == possible).then(|| (lo..=hi).map(|s| s as f64).collect()),
                }
            }
        }
    }

    /// `lastN=n`: the newest `n` values. Exact when the newest `n`
    /// notifications are all certain, whatever happened before them.
    pub fn expect_last_n(&self, n: u64) -> Expect {
        if self.sent == 0 || n == 0 {
            return Expect {
                min: 0,
                max: 0,
                values: Some(Vec::new()),
            };
        }
        let lo = self.sent.saturating_sub(n) + 1;
        let top = self.sent - lo + 1;
        if self.certain_in(lo, self.sent) == top {
            return Expect {
                min: top as usize,
                max: top as usize,
                values: Some((lo..=self.sent).map(|s| s as f64).collect()),
            };
        }
        Expect {
            min: n.min(self.certain()) as usize,
            max: n.min(self.sent) as usize,
            values: None,
        }
    }

    /// `aggrMethod=avg&aggrPeriod=…` over `from..=to` with fixed-length
    /// buckets of `period` ms (hour, day: weft floors the time to a
    /// multiple of the period): one value per bucket that holds a row, the
    /// mean of its temperatures; exact when no notification in the window
    /// is unsure.
    pub fn expect_avg(&self, from: i64, to: i64, period: i64) -> Expect {
        let mut e = Expect {
            min: 0,
            max: 0,
            values: Some(Vec::new()),
        };
        if from > to {
            return e;
        }
        let mut bucket = from - from.rem_euclid(period);
        while bucket <= to {
            let window = (bucket.max(from), (bucket + period - 1).min(to));
            if let Some((lo, hi)) = self.seqs_in(window.0, window.1) {
                let certain = self.certain_in(lo, hi);
                e.max += 1;
                if certain > 0 {
                    e.min += 1;
                }
                match (&mut e.values, certain == hi - lo + 1) {
                    // The mean of the consecutive integers lo..=hi.
                    (Some(values), true) => values.push((lo + hi) as f64 / 2.0),
                    _ => e.values = None,
                }
            }
            bucket += period;
        }
        e
    }

    /// Checks a full read of the series (`(time, temperature)` pairs in
    /// answer order) against what was written: every pair is one of the
    /// bench's notifications, in time order, none twice, every certain one
    /// present. Returns how many were stored.
    pub fn check_stored(&self, stored: &[(i64, f64)]) -> Result<u64, String> {
        let mut previous = 0;
        let mut certain = 0;
        for &(time, value) in stored {
            let Some(seq) = self.seq_of(time, value) else {
                return Err(format!(
                    "a stored value the bench did not send: {value} at {}",
                    super::payload::iso(time)
                ));
            };
            if seq <= previous {
                return Err(format!("values out of time order or repeated at {seq}"));
            }
            previous = seq;
            if self.certain_in(seq, seq) == 1 {
                certain += 1;
            }
        }
        if certain < self.certain() {
            return Err(format!(
                "{} rows stored, {} notifications answered 200 ({} missing)",
                stored.len(),
                self.certain(),
                self.certain() - certain
            ));
        }
        Ok(stored.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    const HOUR: i64 = 3_600_000;

    /// A series on a one-minute grid from 0 with `sent` notifications.
    fn series(sent: u64) -> Series {
        let mut s = Series::new(0, MIN);
        s.set_sent(sent);
        s
    }

    fn seqs(lo: u64, hi: u64) -> Option<Vec<f64>> {
        Some((lo..=hi).map(|s| s as f64).collect())
    }

    #[test]
    fn numbers_notifications_on_a_time_grid() {
        let mut s = Series::new(1_000, 10);
        assert_eq!((s.next_seq(), s.next_seq(), s.next_seq()), (1, 2, 3));
        assert_eq!(s.sent(), 3);
        assert_eq!(s.time(1), 1_010);
        assert_eq!(s.seq_of(1_030, 3.0), Some(3));
        assert_eq!(s.seq_of(1_030, 2.0), None, "value does not match time");
        assert_eq!(s.seq_of(1_035, 3.0), None, "off the grid");
        assert_eq!(s.seq_of(1_040, 4.0), None, "never sent");
        assert_eq!(s.seq_of(1_000, 0.0), None, "seq 0 is never sent");
    }

    #[test]
    fn unsure_notifications_widen_the_counts() {
        let mut s = series(10);
        assert_eq!((s.certain(), s.unsure()), (10, 0));
        s.mark_unsure(3, 3);
        s.mark_unsure(6, 8);
        assert_eq!((s.certain(), s.unsure()), (6, 4));
        assert_eq!(s.certain_in(1, 2), 2);
        assert_eq!(s.certain_in(2, 7), 3);
        assert_eq!(s.certain_in(7, 7), 0);
        assert_eq!(s.certain_in(9, 10), 2);
        assert_eq!(s.certain_in(5, 4), 0);
        assert_eq!(series(0).certain(), 0);
    }

    #[test]
    fn windows_map_to_notifications() {
        let s = series(100);
        // Inclusive bounds, on and between grid points.
        assert_eq!(s.seqs_in(MIN, 3 * MIN), Some((1, 3)));
        assert_eq!(s.seqs_in(MIN + 1, 3 * MIN - 1), Some((2, 2)));
        assert_eq!(s.seqs_in(MIN + 1, 2 * MIN - 1), None);
        assert_eq!(s.seqs_in(-HOUR, MIN / 2), None, "before the first");
        assert_eq!(s.seqs_in(-HOUR, HOUR), Some((1, 60)));
        assert_eq!(s.seqs_in(HOUR, HOUR + HOUR - 1), Some((60, 100)));
        assert_eq!(s.seqs_in(200 * MIN, 300 * MIN), None, "after the last");
        assert_eq!(series(0).seqs_in(0, HOUR), None);
        let neg = Series {
            origin: -5 * MIN,
            ..series(10)
        };
        assert_eq!(neg.seqs_in(-3 * MIN - 1, 0), Some((2, 5)));
    }

    #[test]
    fn range_queries_expect_the_window() {
        let mut s = series(200);
        let e = s.expect_window(HOUR, 2 * HOUR - 1);
        assert_eq!((e.min, e.max), (60, 60));
        assert_eq!(e.values, seqs(60, 119));
        assert_eq!(s.expect_window(10 * HOUR, 11 * HOUR).max, 0);
        s.mark_unsure(100, 100);
        let e = s.expect_window(HOUR, 2 * HOUR - 1);
        assert_eq!((e.min, e.max, e.values), (59, 60, None));
        // A window without the unsure one stays exact.
        assert_eq!(s.expect_window(0, HOUR).values, seqs(1, 60));
        assert_eq!(s.expect_all().max, 200);
        assert_eq!(s.expect_all().min, 199);
    }

    #[test]
    fn last_n_is_exact_when_the_newest_are_certain() {
        let mut s = series(250);
        let e = s.expect_last_n(100);
        assert_eq!((e.min, e.max, e.values), (100, 100, seqs(151, 250)));
        // Older unsure notifications do not matter.
        s.mark_unsure(10, 20);
        assert_eq!(s.expect_last_n(100).values, seqs(151, 250));
        // One among the newest does.
        s.mark_unsure(200, 200);
        let e = s.expect_last_n(100);
        assert_eq!((e.min, e.max, e.values), (100, 100, None));
        // Fewer than n stored.
        let e = series(30).expect_last_n(100);
        assert_eq!((e.min, e.max, e.values), (30, 30, seqs(1, 30)));
        let mut short = series(30);
        short.mark_unsure(1, 5);
        let e = short.expect_last_n(100);
        assert_eq!((e.min, e.max, e.values), (25, 30, None));
        assert_eq!(series(0).expect_last_n(100).max, 0);
    }

    #[test]
    fn hourly_averages_over_a_day() {
        // 150 minutes of data: hours 0 (1..=59), 1 (60..=119), 2 (120..=150).
        let mut s = series(150);
        let e = s.expect_avg(0, 86_400_000 - 1, HOUR);
        assert_eq!((e.min, e.max), (3, 3));
        assert_eq!(e.values, Some(vec![30.0, 89.5, 135.0]));
        // A window starting mid-hour clips the first bucket.
        let e = s.expect_avg(30 * MIN, 2 * HOUR - 1, HOUR);
        assert_eq!(e.values, Some(vec![44.5, 89.5]));
        // An unsure notification makes the values unknown but not the buckets.
        s.mark_unsure(70, 70);
        let e = s.expect_avg(0, 86_400_000 - 1, HOUR);
        assert_eq!((e.min, e.max, e.values), (3, 3, None));
        // A bucket whose every notification is unsure may be missing.
        s.mark_unsure(120, 150);
        let e = s.expect_avg(0, 86_400_000 - 1, HOUR);
        assert_eq!((e.min, e.max), (2, 3));
        // Nothing in range: no bucket at all.
        assert_eq!(s.expect_avg(10 * HOUR, 11 * HOUR, HOUR).max, 0);
    }

    #[test]
    fn expectations_check_answers() {
        let e = Expect {
            min: 2,
            max: 2,
            values: Some(vec![1.0, 2.5]),
        };
        assert_eq!(e.check(&[Some(1.0), Some(2.5)]), Ok(()));
        assert!(e.check(&[Some(1.0)]).unwrap_err().contains("expected 2"));
        assert!(e
            .check(&[Some(1.0), Some(3.0)])
            .unwrap_err()
            .contains("value 1"));
        assert!(e.check(&[Some(1.0), None]).unwrap_err().contains("null"));
        let loose = Expect {
            min: 1,
            max: 3,
            values: None,
        };
        assert_eq!(loose.check(&[None, None]), Ok(()));
        assert!(loose.check(&[]).unwrap_err().contains("1..=3"));
    }

    #[test]
    fn full_reads_must_hold_every_certain_notification() {
        let mut s = series(5);
        s.mark_unsure(4, 4);
        let read = |seqs: &[u64]| -> Vec<(i64, f64)> {
            seqs.iter().map(|&q| (q as i64 * MIN, q as f64)).collect()
        };
        assert_eq!(s.check_stored(&read(&[1, 2, 3, 5])), Ok(4));
        assert_eq!(s.check_stored(&read(&[1, 2, 3, 4, 5])), Ok(5));
        assert!(s
            .check_stored(&read(&[1, 3, 5]))
            .unwrap_err()
            .contains("1 missing"));
        assert!(s.check_stored(&read(&[1, 2, 2, 3, 5])).is_err());
        assert!(s.check_stored(&read(&[1, 2, 3, 5, 6])).is_err());
        assert!(s
            .check_stored(&[(MIN, 1.0), (2 * MIN, 7.0)])
            .unwrap_err()
            .contains("did not send"));
        assert_eq!(series(0).check_stored(&[]), Ok(0));
    }
}
