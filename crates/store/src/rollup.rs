//! The arithmetic of history rollups: per series and bucket, how many rows
//! there were, how many had a numeric value, and their sum, minimum and
//! maximum. Partials of adjacent buckets combine into the partial of their
//! union, which is how a day's hourly average is read from 24 stored
//! buckets instead of 86,400 rows, and how an aggregate over an arbitrary
//! range is assembled from hour and minute buckets plus the raw rows at its
//! ragged edges.

use crate::AggrMethod;

/// A minute, in ms: the finer stored rollup period.
pub(crate) const MINUTE_MS: i64 = 60_000;
/// An hour, in ms: the coarser stored rollup period.
pub(crate) const HOUR_MS: i64 = 3_600_000;
/// The periods rollups are kept for.
pub(crate) const ROLLUP_PERIODS: [i64; 2] = [MINUTE_MS, HOUR_MS];

/// The start of the `unit`-long bucket holding `time` (also for times
/// before 1970).
pub(crate) fn floor_to(time: i64, unit: i64) -> i64 {
    time - time.rem_euclid(unit)
}

/// The first bucket start at or after `time`.
pub(crate) fn ceil_to(time: i64, unit: i64) -> i64 {
    let floor = floor_to(time, unit);
    if floor == time {
        time
    } else {
        floor + unit
    }
}

/// Count, numeric count, sum, min and max of some rows of one series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RollupPartial {
    /// Rows, whatever their value.
    pub rows: u64,
    /// Rows with a numeric value.
    pub numbers: u64,
    /// Sum of the numeric values (0 when there is none).
    pub sum: f64,
    /// Smallest numeric value.
    pub min: Option<f64>,
    /// Largest numeric value.
    pub max: Option<f64>,
}

impl RollupPartial {
    /// Counts one row with value `number` (`None`: not numeric).
    pub fn add(&mut self, number: Option<f64>) {
        self.merge(&RollupPartial {
            rows: 1,
            numbers: u64::from(number.is_some()),
            sum: number.unwrap_or(0.0),
            min: number,
            max: number,
        });
    }

    /// Adds the rows of `other`.
    pub fn merge(&mut self, other: &RollupPartial) {
        self.rows += other.rows;
        self.numbers += other.numbers;
        self.sum += other.sum;
        self.min = pick(self.min, other.min, f64::min);
        self.max = pick(self.max, other.max, f64::max);
    }

    /// The sum as stored: `None` without numeric rows (as SQL's `SUM`).
    pub fn sum(&self) -> Option<f64> {
        (self.numbers > 0).then_some(self.sum)
    }

    /// The aggregate `method` asks for (`None` when it needs numbers and
    /// there are none).
    pub fn value(&self, method: AggrMethod) -> Option<f64> {
        match method {
            AggrMethod::Count => Some(self.rows as f64),
            AggrMethod::Sum => self.sum(),
            AggrMethod::Avg => self.sum().map(|s| s / self.numbers as f64),
            AggrMethod::Min => self.min,
            AggrMethod::Max => self.max,
        }
    }
}

/// What a stored bucket holds once some of its rows are deleted: `None`
/// when none are left (the bucket goes). `stored` is the bucket,
/// `deleted` the rows removed from it, `remaining` the rows of the bucket
/// still stored. Counts and the sum are the stored ones minus the
/// deleted ones; when the remaining rows account for every row the bucket
/// still counts (nothing of it was downsampled away), the bucket is
/// exactly their partial. Otherwise a minimum or maximum the deleted rows
/// held is taken from the remaining rows — the best that can be known,
/// since the downsampled rows' values are gone.
pub(crate) fn after_delete(
    stored: &RollupPartial,
    deleted: &RollupPartial,
    remaining: &RollupPartial,
) -> Option<RollupPartial> {
    let rows = stored.rows.saturating_sub(deleted.rows);
    if rows == 0 {
        return None;
    }
    if remaining.rows >= rows {
        return Some(*remaining);
    }
    let numbers = stored.numbers.saturating_sub(deleted.numbers);
    let extreme = |kept: Option<f64>,
                   gone: Option<f64>,
                   rest: Option<f64>,
                   held: fn(f64, f64) -> bool| {
        match (kept, gone) {
            (Some(k), Some(g)) if held(g, k) => rest,
            _ => kept,
        }
    };
    Some(RollupPartial {
        rows,
        numbers,
        sum: if numbers == 0 {
            0.0
        } else {
            stored.sum - deleted.sum
        },
        min: if numbers == 0 {
            None
        } else {
            extreme(stored.min, deleted.min, remaining.min, |g, k| g <= k)
        },
        max: if numbers == 0 {
            None
        } else {
            extreme(stored.max, deleted.max, remaining.max, |g, k| g >= k)
        },
    })
}

/// The rollup buckets a delete of the inclusive range `[from, to]` cuts
/// through (`None`: unbounded on that side): for each stored period, the
/// buckets holding `from` and `to` unless the range covers them whole.
/// Buckets the range covers whole are deleted outright
/// ([`covered_buckets`]); these are the ones whose rollups must be
/// corrected ([`after_delete`]). Times are clamped to ±2⁵², far beyond
/// any real time index, so bucket arithmetic never overflows.
pub(crate) fn cut_buckets(from: Option<i64>, to: Option<i64>) -> Vec<(i64, i64)> {
    let (lo, hi) = covered_range(from, to);
    let mut out = Vec::new();
    for period in ROLLUP_PERIODS {
        for bound in [from, to].into_iter().flatten() {
            let bucket = floor_to(bound.clamp(-TIME_BOUND, TIME_BOUND), period);
            let whole = bucket >= lo && bucket + period - 1 <= hi;
            if !whole && !out.contains(&(period, bucket)) {
                out.push((period, bucket));
            }
        }
    }
    out
}

/// For `period`, the range of bucket starts `[first, last]` a delete of
/// `[from, to]` covers whole; empty (`first > last`) when it covers none.
pub(crate) fn covered_buckets(from: Option<i64>, to: Option<i64>, period: i64) -> (i64, i64) {
    let (lo, hi) = covered_range(from, to);
    (ceil_to(lo, period), floor_to(hi + 1, period) - period)
}

/// Earliest and latest times the rollup arithmetic of a delete considers.
const TIME_BOUND: i64 = 1 << 52;

/// A delete's range with its open ends at ±[`TIME_BOUND`].
fn covered_range(from: Option<i64>, to: Option<i64>) -> (i64, i64) {
    (
        from.unwrap_or(-TIME_BOUND).clamp(-TIME_BOUND, TIME_BOUND),
        to.unwrap_or(TIME_BOUND).clamp(-TIME_BOUND, TIME_BOUND),
    )
}

fn pick(a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(f(x, y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Which stored level answers one piece of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// The rows themselves.
    Rows,
    /// Stored buckets of this many ms.
    Rollup(i64),
}

/// Splits the half-open range `[from, to)` into pieces, each answered by
/// the coarsest level allowed (`finest_rollup`: the longest rollup period
/// whose buckets never straddle a requested bucket; `None`: rows only):
/// whole hours from hour rollups, whole minutes at the edges from minute
/// rollups, and the ragged ends from the rows.
pub(crate) fn plan(from: i64, to: i64, coarsest: Option<i64>) -> Vec<(Level, i64, i64)> {
    let mut out = Vec::new();
    split(from, to, coarsest, &mut out);
    out.retain(|(_, a, b)| a < b);
    out
}

fn split(from: i64, to: i64, coarsest: Option<i64>, out: &mut Vec<(Level, i64, i64)>) {
    if from >= to {
        return;
    }
    let Some(unit) = coarsest else {
        out.push((Level::Rows, from, to));
        return;
    };
    let finer = ROLLUP_PERIODS.iter().copied().filter(|p| *p < unit).max();
    let (start, end) = (ceil_to(from, unit), floor_to(to, unit));
    if start >= end {
        split(from, to, finer, out);
        return;
    }
    split(from, start, finer, out);
    out.push((Level::Rollup(unit), start, end));
    split(end, to, finer, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_and_ceils_also_before_1970() {
        assert_eq!(floor_to(125_000, MINUTE_MS), 120_000);
        assert_eq!(floor_to(-1, MINUTE_MS), -60_000);
        assert_eq!(ceil_to(120_000, MINUTE_MS), 120_000);
        assert_eq!(ceil_to(120_001, MINUTE_MS), 180_000);
        assert_eq!(ceil_to(-59_999, MINUTE_MS), 0);
    }

    #[test]
    fn partials_combine_like_the_rows() {
        let mut a = RollupPartial::default();
        for v in [Some(3.0), None, Some(-1.0)] {
            a.add(v);
        }
        let mut b = RollupPartial::default();
        b.add(Some(10.0));
        a.merge(&b);
        assert_eq!(a.value(AggrMethod::Count), Some(4.0));
        assert_eq!(a.value(AggrMethod::Sum), Some(12.0));
        assert_eq!(a.value(AggrMethod::Avg), Some(4.0));
        assert_eq!(a.value(AggrMethod::Min), Some(-1.0));
        assert_eq!(a.value(AggrMethod::Max), Some(10.0));
        let mut text = RollupPartial::default();
        text.add(None);
        assert_eq!(text.value(AggrMethod::Avg), None);
        assert_eq!(text.value(AggrMethod::Count), Some(1.0));
    }

    #[test]
    fn a_bucket_after_a_delete_is_its_remaining_rows_or_the_difference() {
        let partial = |values: &[Option<f64>]| {
            let mut p = RollupPartial::default();
            for v in values {
                p.add(*v);
            }
            p
        };
        let stored = partial(&[Some(1.0), Some(5.0), Some(9.0), None]);
        // Rows intact: exactly what remains.
        let got = after_delete(
            &stored,
            &partial(&[Some(9.0)]),
            &partial(&[Some(1.0), Some(5.0), None]),
        );
        assert_eq!(got, Some(partial(&[Some(1.0), Some(5.0), None])));
        // Everything deleted: the bucket goes.
        assert_eq!(
            after_delete(&stored, &stored, &RollupPartial::default()),
            None
        );
        // Some rows downsampled away (only 5 and 9 left as rows), 9
        // deleted: counts and sum by difference, the max from what is left,
        // the min (1, downsampled, not deleted) kept.
        let got = after_delete(&stored, &partial(&[Some(9.0)]), &partial(&[Some(5.0)])).unwrap();
        assert_eq!((got.rows, got.numbers, got.sum), (3, 2, 6.0));
        assert_eq!((got.min, got.max), (Some(1.0), Some(5.0)));
    }

    #[test]
    fn a_delete_cuts_the_buckets_holding_its_bounds_unless_it_covers_them() {
        let (m, h) = (MINUTE_MS, HOUR_MS);
        // 00:00:30 ..= 02:00:59.999: cuts minute 0 and hour 0, covers the
        // rest (the minute 02:00 and hours 01 whole, hour 02 not).
        assert_eq!(
            cut_buckets(Some(30_000), Some(2 * h + m - 1)),
            vec![(m, 0), (h, 0), (h, 2 * h)]
        );
        assert_eq!(
            covered_buckets(Some(30_000), Some(2 * h + m - 1), m),
            (m, 2 * h)
        );
        assert_eq!(
            covered_buckets(Some(30_000), Some(2 * h + m - 1), h),
            (h, h)
        );
        // Aligned bounds cut nothing; open ends cut nothing.
        assert!(cut_buckets(Some(0), Some(h - 1)).is_empty());
        assert!(cut_buckets(None, None).is_empty());
        assert_eq!(cut_buckets(None, Some(10)), vec![(m, 0), (h, 0)]);
        // Inside one minute: covers nothing.
        let (first, last) = covered_buckets(Some(1_000), Some(2_000), m);
        assert!(first > last);
    }

    #[test]
    fn ranges_split_into_hours_minutes_and_rows() {
        let h = HOUR_MS;
        let m = MINUTE_MS;
        // 00:00:30 .. 02:01:10 → rows, minutes, hours, minute, rows.
        let pieces = plan(30_000, 2 * h + m + 10_000, Some(h));
        assert_eq!(
            pieces,
            vec![
                (Level::Rows, 30_000, m),
                (Level::Rollup(m), m, h),
                (Level::Rollup(h), h, 2 * h),
                (Level::Rollup(m), 2 * h, 2 * h + m),
                (Level::Rows, 2 * h + m, 2 * h + m + 10_000),
            ]
        );
        // Aligned day: hours only.
        assert_eq!(
            plan(0, 24 * h, Some(h)),
            vec![(Level::Rollup(h), 0, 24 * h)]
        );
        // Minute buckets asked: never hours.
        assert_eq!(plan(0, 2 * h, Some(m)), vec![(Level::Rollup(m), 0, 2 * h)]);
        // Inside one minute: rows only.
        assert_eq!(
            plan(1_000, 2_000, Some(h)),
            vec![(Level::Rows, 1_000, 2_000)]
        );
        assert!(plan(5, 5, Some(h)).is_empty());
    }
}
