//! When each uplink is sent: the timing math of both load models, kept
//! free of I/O so it can be tested exactly. Times are offsets from the
//! start of the load phase.
//!
//! - Closed loop (default, like seed 000's k6 VUs): each device sends one
//!   uplink per `--interval`, devices evenly phased across the interval, at
//!   most one uplink in flight per device. A device that falls behind does
//!   not burst to catch up: a slow server lowers the offered rate, as it
//!   did for the seed's VUs.
//! - Open loop (`--rate`): uplink `i` is due at `i / rate` whatever the
//!   server does. Free connections claim the next due slot from a shared
//!   counter; a slot that no connection could take within a grace period
//!   is dropped by the generator and counted, so an overloaded run reports
//!   what it failed to offer instead of silently sending less.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Closed loop: when device `index` of `devices` sends its first uplink,
/// spreading the fleet evenly over one interval.
pub fn device_phase(index: usize, devices: usize, interval: Duration) -> Duration {
    let nanos = interval.as_nanos() * index as u128 / devices.max(1) as u128;
    Duration::from_nanos(nanos as u64)
}

/// Closed loop: a device's next send after one due at `due` that actually
/// started at `started`. Keeps the nominal cadence when the send was late
/// by less than an interval (timer jitter), and restarts the cadence from
/// the actual send otherwise, so a device never sends twice to catch up.
pub fn next_due(due: Duration, started: Duration, interval: Duration) -> Duration {
    let nominal = due + interval;
    if started < nominal {
        nominal
    } else {
        started + interval
    }
}

/// Open loop: the fixed clock, `rate` uplinks per second for a duration.
#[derive(Debug, Clone, Copy)]
pub struct OpenSchedule {
    rate: f64,
    slots: u64,
}

impl OpenSchedule {
    /// The slots of `duration` at `rate` per second (`rate` > 0).
    pub fn new(rate: f64, duration: Duration) -> OpenSchedule {
        // The epsilon keeps 5s × 20000/s at exactly 100000 slots.
        let slots = (duration.as_secs_f64() * rate + 1e-9).floor() as u64;
        OpenSchedule { rate, slots }
    }

    /// How many uplinks the run offers in total.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// When slot `i` is due.
    pub fn offset(&self, slot: u64) -> Duration {
        Duration::from_secs_f64(slot as f64 / self.rate)
    }

    /// The first slot due at or after `offset`.
    pub fn first_slot_at(&self, offset: Duration) -> u64 {
        (offset.as_secs_f64() * self.rate - 1e-9).ceil().max(0.0) as u64
    }
}

/// What a connection gets when it asks for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The slot to send and when it is due, or `None` when the run is over.
    pub slot: Option<(u64, Duration)>,
    /// Slots this claim skipped because they were overdue by more than the
    /// grace period: no connection was free to send them in time.
    pub dropped: u64,
}

/// Open loop: the shared position in the schedule. Connections that are
/// free claim slots in order; an idle connection claims ahead and sleeps
/// until its slot is due, so a slot still unclaimed when it is due means
/// every connection was busy.
#[derive(Debug)]
pub struct OpenClock {
    schedule: OpenSchedule,
    next: AtomicU64,
}

impl OpenClock {
    /// A clock at slot 0.
    pub fn new(schedule: OpenSchedule) -> OpenClock {
        OpenClock {
            schedule,
            next: AtomicU64::new(0),
        }
    }

    /// Claims the next slot for a connection that is free at `elapsed`.
    /// Slots overdue by more than `grace` are skipped in one step and
    /// reported as dropped; the returned slot may still be a little late
    /// (within `grace`) or in the future.
    pub fn claim(&self, elapsed: Duration, grace: Duration) -> Claim {
        let mut dropped = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.schedule.slots {
                return Claim {
                    slot: None,
                    dropped,
                };
            }
            let due = self.schedule.offset(i);
            if due + grace >= elapsed {
                return Claim {
                    slot: Some((i, due)),
                    dropped,
                };
            }
            // Slot i is overdue: drop it and every slot up to the first one
            // that is still within the grace period. Others may be claiming
            // concurrently; only the range this call moved past is ours.
            let first_ok = self
                .schedule
                .first_slot_at(elapsed - grace)
                .min(self.schedule.slots);
            let before = self.next.fetch_max(first_ok, Ordering::Relaxed);
            dropped += 1 + first_ok.saturating_sub(before);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn devices_are_phased_across_the_interval() {
        let second = Duration::from_secs(1);
        assert_eq!(device_phase(0, 500, second), Duration::ZERO);
        assert_eq!(device_phase(250, 500, second), 500 * MS);
        assert_eq!(device_phase(499, 500, second), 998 * MS);
        assert_eq!(
            device_phase(1, 3, second),
            Duration::from_nanos(333_333_333)
        );
    }

    #[test]
    fn a_late_device_keeps_cadence_or_restarts_it() {
        let s = Duration::from_secs(1);
        // On time or slightly late: the nominal next.
        assert_eq!(next_due(s, s, s), 2 * s);
        assert_eq!(next_due(s, s + 300 * MS, s), 2 * s);
        // Late by an interval or more: from the actual send, no burst.
        assert_eq!(next_due(s, 2 * s, s), 3 * s);
        assert_eq!(next_due(s, 3 * s + 500 * MS, s), 4 * s + 500 * MS);
    }

    #[test]
    fn open_schedule_math() {
        let s = OpenSchedule::new(20_000.0, Duration::from_secs(5));
        assert_eq!(s.slots(), 100_000);
        assert_eq!(s.offset(0), Duration::ZERO);
        assert_eq!(s.offset(1), Duration::from_micros(50));
        assert_eq!(s.offset(20_000), Duration::from_secs(1));
        for k in [0u64, 1, 7, 19_999, 20_000, 99_999, 1_200_000] {
            assert_eq!(s.first_slot_at(s.offset(k)), k, "slot {k}");
            assert_eq!(
                s.first_slot_at(s.offset(k) + Duration::from_nanos(1)),
                k + 1,
                "slot {k}"
            );
        }
        // Fractional rates.
        let s = OpenSchedule::new(2.5, Duration::from_secs(10));
        assert_eq!(s.slots(), 25);
        assert_eq!(s.offset(5), Duration::from_secs(2));
        assert_eq!(s.first_slot_at(Duration::from_millis(2001)), 6);
    }

    #[test]
    fn idle_connections_claim_in_order() {
        let clock = OpenClock::new(OpenSchedule::new(1000.0, Duration::from_secs(1)));
        for i in 0..5 {
            let c = clock.claim(Duration::ZERO, 10 * MS);
            assert_eq!(c.slot, Some((i, Duration::from_millis(i))));
            assert_eq!(c.dropped, 0);
        }
    }

    #[test]
    fn overdue_slots_are_dropped_and_counted() {
        let clock = OpenClock::new(OpenSchedule::new(1000.0, Duration::from_secs(2)));
        for _ in 0..5 {
            clock.claim(Duration::ZERO, 10 * MS);
        }
        // Slot 5 was due at 5ms; a connection only frees up at 1s.
        let c = clock.claim(Duration::from_secs(1), 10 * MS);
        // Slots 5..990 found no connection within 10ms.
        assert_eq!(c.slot, Some((990, 990 * MS)));
        assert_eq!(c.dropped, 985);
        // Within the grace period: sent late, not dropped.
        let c = clock.claim(Duration::from_secs(1), 10 * MS);
        assert_eq!(c.slot, Some((991, 991 * MS)));
        assert_eq!(c.dropped, 0);
    }

    #[test]
    fn the_end_drops_what_was_never_sent() {
        let clock = OpenClock::new(OpenSchedule::new(100.0, Duration::from_secs(1)));
        clock.claim(Duration::ZERO, 10 * MS);
        // Long after the end: slots 1..100 are all overdue.
        let c = clock.claim(Duration::from_secs(5), 10 * MS);
        assert_eq!(c.slot, None);
        assert_eq!(c.dropped, 99);
        assert_eq!(
            clock.claim(Duration::from_secs(5), 10 * MS),
            Claim {
                slot: None,
                dropped: 0
            }
        );
    }

    #[test]
    fn concurrent_claims_account_for_every_slot() {
        let schedule = OpenSchedule::new(10_000.0, Duration::from_secs(1));
        let clock = std::sync::Arc::new(OpenClock::new(schedule));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let clock = clock.clone();
                std::thread::spawn(move || {
                    let (mut sent, mut dropped) = (0u64, 0u64);
                    let mut now = Duration::ZERO;
                    loop {
                        // Each "connection" pretends to be slow on some sends.
                        let c = clock.claim(now, 10 * MS);
                        dropped += c.dropped;
                        let Some((i, due)) = c.slot else { break };
                        sent += 1;
                        now = now.max(due)
                            + if (i + t) % 97 == 0 {
                                25 * MS
                            } else {
                                Duration::from_micros(300)
                            };
                    }
                    (sent, dropped)
                })
            })
            .collect();
        let (sent, dropped) = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!(sent + dropped, schedule.slots());
        assert!(dropped > 0);
    }
}
