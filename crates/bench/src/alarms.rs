//! The `alarms` scenario: seed 000's test suite 2. The `ingest` load (by
//! default the seed's 100 devices × 1 uplink/s, temperature uniform on
//! 1..50) with one rule `temperature>45.1` on the run's channel; the
//! websocket subscriber watches the rule's alarms instead of the data.
//!
//! Checks: every matching uplink (≈10%) raised or updated its alarm on the
//! socket exactly once, and no other uplink did. Metrics, with the seed's
//! names: `time_lapse` (socket receive − the alarm's change) and
//! `time_lapse_full` (socket receive − the uplink's `reportedAt`).

use crate::common::Session;
use crate::ingest::{self, IngestArgs, Watch};
use crate::summary::Summary;

/// Flags of `weft bench alarms`: those of `ingest` (with the seed's 100
/// devices by default) and the rule's threshold.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("devices", |a| a.default_value("100")))]
pub struct AlarmsArgs {
    /// The load: as `weft bench ingest`.
    #[command(flatten)]
    pub load: IngestArgs,

    /// The rule raises an alarm for every uplink hotter than this (°C).
    #[arg(long, default_value_t = 45.1)]
    pub threshold: f64,
}

/// Runs the scenario against the session's server.
pub async fn run(args: &AlarmsArgs, session: &Session) -> anyhow::Result<Summary> {
    anyhow::ensure!(args.threshold.is_finite(), "--threshold must be a number");
    ingest::run_watching(
        &args.load,
        session,
        Watch::Alarms {
            threshold: args.threshold,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use crate::{try_parse_command, BenchCommand};

    /// The seed's shape is the default: 100 devices, one uplink a second,
    /// threshold 45.1; every ingest flag is accepted.
    #[test]
    fn defaults_are_the_seed_shape() {
        let BenchCommand::Alarms(args) = try_parse_command(&["alarms"]).unwrap() else {
            panic!("parsed as another scenario");
        };
        assert_eq!(args.load.devices, 100);
        assert_eq!(args.load.interval, std::time::Duration::from_secs(1));
        assert_eq!(args.threshold, 45.1);
        let BenchCommand::Alarms(args) =
            try_parse_command(&["alarms", "--rate", "10000", "--devices", "1000"]).unwrap()
        else {
            panic!("parsed as another scenario");
        };
        assert_eq!(args.load.rate, Some(10000.0));
        assert_eq!(args.load.devices, 1000);
    }
}
