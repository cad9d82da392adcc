//! The result of a bench run and its two renderings: a k6-style text
//! summary (so weft's figures read side by side with the seeds' k6 outputs)
//! and a JSON object with the same data for scripts and `docs/`.
//!
//! Scenarios fill a [`Summary`] with checks (each a pass/fail tally, like
//! k6's `check()`) and metrics (counters, rates, trends from HDR
//! histograms); this module owns the layout so every scenario prints alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::ceiling::{Calibration, Throughput};
use crate::common::Session;
use crate::memory::PeakMemory;

/// One scenario run, ready to print.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The scenario's name (`ingest`, …).
    pub scenario: String,
    /// True when every check passed; what `weft bench` turns into its exit code.
    pub ok: bool,
    /// The server driven.
    pub target: String,
    /// Whether the bench started that server itself.
    pub spawned: bool,
    /// The scenario's parameters, as given or defaulted.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Wall-clock length of each phase in seconds, in the order they ran.
    #[serde(serialize_with = "ordered_map")]
    pub phases: Vec<(String, f64)>,
    /// Human lines describing the load, shown under the scenario name.
    #[serde(skip)]
    pub description: Vec<String>,
    /// Checks in the order they should be read.
    pub checks: Vec<Check>,
    /// Metrics by name; sorted like k6 sorts them.
    pub metrics: BTreeMap<String, Metric>,
    /// Warnings a reader must see (dropped sends, a closed socket, …).
    pub notes: Vec<String>,
    /// This machine's HTTP ceiling, measured in the same run before the
    /// load (absent with `--calibration 0s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// The scenario's headline throughput as a share of that ceiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Throughput>,
    /// The peak memory of the processes the run drove: the spawned server,
    /// and those given with `--watch-pid` (a peer, its database).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<PeakMemory>,
}

/// A pass/fail tally, printed `✓ name` or `✗ name` with its ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked, in words.
    pub name: String,
    /// How many times it held.
    pub passes: u64,
    /// How many times it did not.
    pub fails: u64,
    /// `fails == 0`.
    pub ok: bool,
}

impl Check {
    /// A check from its tallies.
    pub fn new(name: impl Into<String>, passes: u64, fails: u64) -> Check {
        Check {
            name: name.into(),
            passes,
            fails,
            ok: fails == 0,
        }
    }
}

/// One line of the metrics block.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Metric {
    /// A count, with its per-second rate over the phase it belongs to.
    Counter {
        /// The total.
        count: u64,
        /// `count` per second, when a rate means something.
        #[serde(skip_serializing_if = "Option::is_none")]
        rate: Option<f64>,
    },
    /// The share of events that were "true" (k6's `Rate`, e.g. `http_req_failed`).
    Rate {
        /// `trues / (trues + falses)`, 0 when there were none.
        rate: f64,
        /// Events counted as true.
        trues: u64,
        /// Events counted as false.
        falses: u64,
    },
    /// A distribution of durations.
    Trend(Trend),
    /// Counts by label (status codes, error kinds).
    Tally {
        /// Count per label.
        values: BTreeMap<String, u64>,
    },
}

impl Metric {
    /// A counter with a rate over `seconds`.
    pub fn counter(count: u64, seconds: f64) -> Metric {
        Metric::Counter {
            count,
            rate: Some(if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            }),
        }
    }

    /// A bare count.
    pub fn count(count: u64) -> Metric {
        Metric::Counter { count, rate: None }
    }

    /// A rate from its true/false tallies.
    pub fn rate(trues: u64, falses: u64) -> Metric {
        let total = trues + falses;
        Metric::Rate {
            rate: if total > 0 {
                trues as f64 / total as f64
            } else {
                0.0
            },
            trues,
            falses,
        }
    }

    /// The text cells of this metric's line, aligned by column later.
    fn cells(&self) -> Vec<String> {
        match self {
            Metric::Counter {
                count,
                rate: Some(rate),
            } => vec![count.to_string(), format!("{rate:.6}/s")],
            Metric::Counter { count, rate: None } => vec![count.to_string()],
            Metric::Rate {
                rate,
                trues,
                falses,
            } => {
                vec![
                    format!("{:.2}%", rate * 100.0),
                    format!("✓ {trues}"),
                    format!("✗ {falses}"),
                ]
            }
            Metric::Trend(t) => t.cells(),
            Metric::Tally { values } => {
                if values.is_empty() {
                    vec!["none".to_string()]
                } else {
                    values.iter().map(|(k, v)| format!("{k}={v}")).collect()
                }
            }
        }
    }
}

/// A latency distribution's summary, in milliseconds (JSON) and printed as
/// k6 prints durations (`740.53µs`, `1.06ms`, `2.5s`, `5m0s`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trend {
    /// Number of values.
    pub count: u64,
    /// Mean, ms.
    pub avg: f64,
    /// Smallest, ms.
    pub min: f64,
    /// Median, ms.
    pub med: f64,
    /// Largest, ms.
    pub max: f64,
    /// 90th percentile, ms.
    #[serde(rename = "p(90)")]
    pub p90: f64,
    /// 95th percentile, ms.
    #[serde(rename = "p(95)")]
    pub p95: f64,
    /// 99th percentile, ms.
    #[serde(rename = "p(99)")]
    pub p99: f64,
}

impl Trend {
    /// Summarises a histogram of microseconds. HDR histograms keep three
    /// significant digits at any magnitude, so a p99 of a million samples
    /// costs nothing to record and is exact to 0.1%.
    pub fn from_micros(h: &Histogram<u64>) -> Trend {
        if h.is_empty() {
            return Trend {
                count: 0,
                avg: 0.0,
                min: 0.0,
                med: 0.0,
                max: 0.0,
                p90: 0.0,
                p95: 0.0,
                p99: 0.0,
            };
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Trend {
            count: h.len(),
            avg: h.mean() / 1000.0,
            min: ms(h.min()),
            med: ms(h.value_at_quantile(0.5)),
            max: ms(h.max()),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
        }
    }

    fn cells(&self) -> Vec<String> {
        let d = |ms: f64| format_duration_us(ms * 1000.0);
        vec![
            format!("avg={}", d(self.avg)),
            format!("min={}", d(self.min)),
            format!("med={}", d(self.med)),
            format!("max={}", d(self.max)),
            format!("p(90)={}", d(self.p90)),
            format!("p(95)={}", d(self.p95)),
            format!("p(99)={}", d(self.p99)),
        ]
    }
}

/// A histogram of microseconds up to `max` (larger values are clamped to
/// it), with three significant digits.
///
/// The range is fixed on purpose: hdrhistogram's auto-resizing histograms
/// lose track of the minimum when they grow (recording only values of a
/// millisecond or more reported a 2µs minimum), and a fixed range of a
/// minute costs about 140 KB.
pub fn micros_histogram(max: Duration) -> Histogram<u64> {
    let max = (max.as_micros() as u64).max(2);
    Histogram::new_with_bounds(1, max, 3).expect("1µs..max at 3 digits is a valid range")
}

/// Formats microseconds the way k6 (Go's `time.Duration`) does, rounded to
/// two decimals with trailing zeros dropped: `740.53µs`, `1.06ms`, `2.5s`,
/// `5m0s`, `1h2m3s`.
pub fn format_duration_us(us: f64) -> String {
    if !us.is_finite() || us <= 0.0 {
        return "0s".to_string();
    }
    if us < 999.995 {
        return format!("{}µs", two_decimals(us));
    }
    if us < 999_995.0 {
        return format!("{}ms", two_decimals(us / 1e3));
    }
    let secs = us / 1e6;
    if secs < 59.995 {
        return format!("{}s", two_decimals(secs));
    }
    // Minutes and up: round to centiseconds first so 119.999s prints 2m0s.
    let centis = (secs * 100.0).round() as u64;
    let (hours, rest) = (centis / 360_000, centis % 360_000);
    let (minutes, rest) = (rest / 6_000, rest % 6_000);
    let seconds = two_decimals(rest as f64 / 100.0);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else {
        format!("{minutes}m{seconds}s")
    }
}

/// `x` with at most two decimals and no trailing zeros.
fn two_decimals(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

impl Summary {
    /// An empty summary of `scenario` run against `session`'s server;
    /// the scenario fills in the rest.
    pub fn new(
        scenario: impl Into<String>,
        session: &Session,
        params: serde_json::Map<String, serde_json::Value>,
    ) -> Summary {
        Summary {
            scenario: scenario.into(),
            ok: false,
            target: session.base.to_string(),
            spawned: session.spawned(),
            params,
            phases: Vec::new(),
            description: Vec::new(),
            checks: Vec::new(),
            metrics: BTreeMap::new(),
            notes: Vec::new(),
            calibration: None,
            throughput: None,
            memory: Vec::new(),
        }
    }

    /// The per-second rate of the counter `metric`, if the summary has one.
    pub fn rate_of(&self, metric: &str) -> Option<f64> {
        match self.metrics.get(metric)? {
            Metric::Counter { rate, .. } => *rate,
            _ => None,
        }
    }

    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.ok
    }

    /// Adds the k6 `checks` rate over all checks and sets `ok`; call once
    /// all checks are in.
    pub fn seal(&mut self) {
        let passes: u64 = self.checks.iter().map(|c| c.passes).sum();
        let fails: u64 = self.checks.iter().map(|c| c.fails).sum();
        self.metrics
            .insert("checks".to_string(), Metric::rate(passes, fails));
        self.ok = self.checks.iter().all(|c| c.ok);
    }

    /// The JSON rendering, one object, newline-terminated.
    pub fn to_json_string(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a summary always serialises");
        s.push('\n');
        s
    }

    /// The k6-style text rendering.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out);
        let _ = writeln!(out, "  scenario: {}", self.scenario);
        for line in &self.description {
            let _ = writeln!(out, "            {line}");
        }
        let _ = writeln!(
            out,
            "    target: {}{}",
            self.target,
            if self.spawned { " (spawned)" } else { "" }
        );
        if !self.phases.is_empty() {
            let phases: Vec<String> = self
                .phases
                .iter()
                .map(|(name, secs)| format!("{name} {}", format_duration_us(secs * 1e6)))
                .collect();
            let _ = writeln!(out, "    phases: {}", phases.join(", "));
        }
        for peak in &self.memory {
            let _ = writeln!(out, "    memory: {}", peak.describe());
        }
        if let Some(c) = &self.calibration {
            let _ = writeln!(out, "   ceiling: {}", c.describe());
        }
        if let Some(t) = &self.throughput {
            let _ = writeln!(out, "     ratio: {}", t.describe());
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out);
            for note in &self.notes {
                let _ = writeln!(out, "  WARN {note}");
            }
        }
        let _ = writeln!(out);
        for check in &self.checks {
            let mark = if check.ok { '✓' } else { '✗' };
            let _ = writeln!(out, "     {mark} {}", check.name);
            if !check.ok {
                let total = check.passes + check.fails;
                let pct = if total > 0 {
                    check.passes as f64 * 100.0 / total as f64
                } else {
                    0.0
                };
                let _ = writeln!(
                    out,
                    "      ↳  {}% — ✓ {} / ✗ {}",
                    two_decimals(pct),
                    check.passes,
                    check.fails
                );
            }
        }
        let _ = writeln!(out);
        out.push_str(&render_metrics(&self.metrics));
        let _ = writeln!(out);
        out
    }
}

/// The metrics block: `name....: cells`, each column padded to its widest
/// cell, as k6 does. Trends are aligned among themselves and everything
/// else among itself, so a long `avg=…` does not push counters apart.
fn render_metrics(metrics: &BTreeMap<String, Metric>) -> String {
    let rows: Vec<(&str, bool, Vec<String>)> = metrics
        .iter()
        .map(|(n, m)| (n.as_str(), matches!(m, Metric::Trend(_)), m.cells()))
        .collect();
    let name_width = rows
        .iter()
        .map(|(n, ..)| n.chars().count())
        .max()
        .unwrap_or(0)
        + 3;
    // Column widths for [non-trend rows, trend rows].
    let mut widths: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for (_, trend, cells) in &rows {
        let widths = &mut widths[usize::from(*trend)];
        for (i, cell) in cells.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) => *max = (*max).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for (name, trend, cells) in rows {
        let widths = &widths[usize::from(trend)];
        let mut line = format!(
            "     {name}{}: ",
            ".".repeat(name_width - name.chars().count())
        );
        for (i, cell) in cells.iter().enumerate() {
            line.push_str(cell);
            let pad = widths[i] - cell.chars().count() + 1;
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Serialises `(name, value)` pairs as a JSON object in their order.
fn ordered_map<S: serde::Serializer>(pairs: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_k6() {
        assert_eq!(format_duration_us(0.0), "0s");
        assert_eq!(format_duration_us(740.53), "740.53µs");
        assert_eq!(format_duration_us(362.35), "362.35µs");
        assert_eq!(format_duration_us(999.999), "1ms");
        assert_eq!(format_duration_us(1_060.0), "1.06ms");
        assert_eq!(format_duration_us(54_410.0), "54.41ms");
        assert_eq!(format_duration_us(9_000.0), "9ms");
        assert_eq!(format_duration_us(1_280_000.0), "1.28s");
        assert_eq!(format_duration_us(2_500_000.0), "2.5s");
        assert_eq!(format_duration_us(300_000_000.0), "5m0s");
        assert_eq!(format_duration_us(195_000_000.0), "3m15s");
        assert_eq!(format_duration_us(119_999_000.0), "2m0s");
        assert_eq!(format_duration_us(3_723_500_000.0), "1h2m3.5s");
    }

    #[test]
    fn trend_percentiles_from_a_histogram() {
        let mut h = micros_histogram(Duration::from_secs(60));
        for us in 1..=1000u64 {
            h.record(us * 1000).unwrap(); // 1ms ..= 1000ms
        }
        let t = Trend::from_micros(&h);
        assert_eq!(t.count, 1000);
        assert_eq!(t.min, 1.0);
        // Three significant digits: within 0.1% of the exact ranks.
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(close(t.med, 500.0), "med {}", t.med);
        assert!(close(t.p90, 900.0), "p90 {}", t.p90);
        assert!(close(t.p95, 950.0), "p95 {}", t.p95);
        assert!(close(t.p99, 990.0), "p99 {}", t.p99);
        assert!(close(t.max, 1000.0), "max {}", t.max);
        assert!(close(t.avg, 500.5), "avg {}", t.avg);
        let cells = t.cells();
        assert_eq!(cells[1], "min=1ms");
        assert_eq!(cells[0], "avg=500.5ms");
        assert!(cells[4].starts_with("p(90)=90"), "{}", cells[4]);
        assert!(cells[6].starts_with("p(99)=99"), "{}", cells[6]);
        assert_eq!(
            Trend::from_micros(&micros_histogram(Duration::from_secs(60))).cells()[0],
            "avg=0s"
        );
    }

    #[test]
    fn histograms_keep_their_minimum_and_clamp_outliers() {
        let mut h = micros_histogram(Duration::from_secs(60));
        for us in [1759, 1801, 2393, 2148, 1015] {
            h.saturating_record(us);
        }
        assert_eq!(h.min(), 1015);
        h.saturating_record(3_600_000_000);
        assert_eq!(h.len(), 6);
        assert!(h.max() >= 60_000_000 && h.max() < 60_100_000, "{}", h.max());
    }

    fn sample() -> Summary {
        let mut s = Summary {
            scenario: "ingest".into(),
            ok: false,
            target: "http://127.0.0.1:8080".into(),
            spawned: true,
            params: serde_json::Map::new(),
            phases: vec![("load".to_string(), 60.0), ("drain".to_string(), 0.5)],
            description: vec!["500 devices".into()],
            checks: vec![
                Check::new("status was 202", 30000, 0),
                Check::new("stored", 29990, 10),
            ],
            metrics: BTreeMap::new(),
            notes: vec![],
            calibration: None,
            throughput: None,
            memory: Vec::new(),
        };
        s.metrics
            .insert("http_reqs".into(), Metric::counter(30004, 304.3));
        s.metrics
            .insert("http_req_failed".into(), Metric::rate(0, 30004));
        s.seal();
        s
    }

    #[test]
    fn text_layout_is_k6_like() {
        let text = sample().to_text();
        assert!(text.contains("     ✓ status was 202\n"), "{text}");
        assert!(
            text.contains("     ✗ stored\n      ↳  99.97% — ✓ 29990 / ✗ 10\n"),
            "{text}"
        );
        assert!(
            text.contains("    target: http://127.0.0.1:8080 (spawned)\n"),
            "{text}"
        );
        assert!(
            text.contains("    phases: load 1m0s, drain 500ms\n"),
            "{text}"
        );
        // Names padded with dots to one width, values in aligned columns.
        assert!(
            text.contains("     checks............: 99.98% ✓ 59990     ✗ 10\n"),
            "{text}"
        );
        assert!(
            text.contains("     http_req_failed...: 0.00%  ✓ 0         ✗ 30004\n"),
            "{text}"
        );
        assert!(
            text.contains("     http_reqs.........: 30004  98.600066/s\n"),
            "{text}"
        );
    }

    #[test]
    fn peak_memory_is_printed_and_carried_in_json() {
        let mut s = sample();
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("memory").is_none(), "no processes, no key");
        s.memory = vec![
            PeakMemory {
                name: "weft".into(),
                pid: 42,
                peak_rss_bytes: Some(96 * 1024 * 1024 + 512 * 1024),
            },
            PeakMemory {
                name: "orion".into(),
                pid: 7,
                peak_rss_bytes: None,
            },
        ];
        let text = s.to_text();
        assert!(
            text.contains("    memory: weft (pid 42): peak RSS 96.5 MiB\n"),
            "{text}"
        );
        assert!(
            text.contains("    memory: orion (pid 7): peak RSS not readable\n"),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["memory"],
            serde_json::json!([
                {"name": "weft", "pid": 42, "peak_rss_bytes": 101_187_584},
                {"name": "orion", "pid": 7}
            ])
        );
    }

    fn calibrated() -> Summary {
        use crate::ceiling::{Calibration, Rate, Reference, Throughput};
        let mut s = sample();
        let c = Calibration {
            concurrency: 512,
            bare_get: Rate::new(240_000, 0, 3.0),
            bare_post: Rate::new(180_000, 0, 3.0),
            target_path: "/version".into(),
            target_get: Rate::new(192_000, 0, 3.0),
        };
        let rate = s.rate_of("http_reqs").unwrap();
        s.throughput = Some(Throughput::new("http_reqs", rate, Reference::Post, &c));
        s.calibration = Some(c);
        s
    }

    #[test]
    fn text_carries_the_ceiling_and_the_ratio() {
        let text = calibrated().to_text();
        assert!(
            text.contains(
                "   ceiling: 512 connections, 3s each in turns: bare GET 80,000 req/s, \
                 bare POST 60,000 req/s; target GET /version 64,000 req/s = 80.0% of the bare GET\n"
            ),
            "{text}"
        );
        // 30004 requests over 304.3 s against a POST ceiling of 60,000/s.
        assert!(
            text.contains(
                "     ratio: http_reqs 99/s = 0.2% of the bare POST ceiling (60,000 req/s)\n"
            ),
            "{text}"
        );
        // Without a calibration neither line is printed.
        let plain = sample().to_text();
        assert!(
            !plain.contains("ceiling:") && !plain.contains("ratio:"),
            "{plain}"
        );
    }

    #[test]
    fn json_carries_the_ceiling_and_the_ratio() {
        let v: serde_json::Value = serde_json::from_str(&calibrated().to_json_string()).unwrap();
        assert_eq!(v["calibration"]["concurrency"], 512);
        assert_eq!(v["calibration"]["bare_get"]["per_second"], 80_000.0);
        assert_eq!(v["calibration"]["bare_post"]["ok"], 180_000);
        assert_eq!(v["calibration"]["target_path"], "/version");
        assert_eq!(v["throughput"]["metric"], "http_reqs");
        assert_eq!(v["throughput"]["reference"], "POST");
        assert_eq!(v["throughput"]["ceiling"], 60_000.0);
        let ratio = v["throughput"]["ratio"].as_f64().unwrap();
        assert!(
            (ratio - 30004.0 / 304.3 / 60_000.0).abs() < 1e-12,
            "{ratio}"
        );
        let plain: serde_json::Value = serde_json::from_str(&sample().to_json_string()).unwrap();
        assert!(plain.get("calibration").is_none() && plain.get("throughput").is_none());
    }

    #[test]
    fn json_has_the_same_data() {
        let s = sample();
        assert!(!s.passed());
        let v: serde_json::Value = serde_json::from_str(&s.to_json_string()).unwrap();
        assert_eq!(v["ok"], false);
        assert_eq!(v["checks"][1]["fails"], 10);
        assert_eq!(v["metrics"]["http_reqs"]["type"], "counter");
        assert_eq!(v["metrics"]["http_reqs"]["count"], 30004);
        assert_eq!(v["metrics"]["checks"]["type"], "rate");
        assert_eq!(v["phases"]["drain"], 0.5);
        let mut h = micros_histogram(Duration::from_secs(60));
        h.record(1500).unwrap();
        let t = serde_json::to_value(Metric::Trend(Trend::from_micros(&h))).unwrap();
        assert_eq!(t["type"], "trend");
        assert_eq!(t["p(95)"], 1.5);
    }
}
