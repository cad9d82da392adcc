//! The progress bar shown on stderr during a run, so a long benchmark is
//! visibly alive; hidden with `--no-progress` or when stderr is not a
//! terminal (CI logs and `2>file` stay clean).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a scenario refreshes the bar's message from its counters.
pub const REFRESH: Duration = Duration::from_millis(250);

/// Whether to draw at all.
pub fn enabled(no_progress: bool) -> bool {
    !no_progress && std::io::stderr().is_terminal()
}

/// A bar over a timed phase, in milliseconds, with a free-form message
/// (the scenario's live counters). Hidden when `show` is false, so callers
/// update it unconditionally.
pub fn timed_bar(show: bool, label: &str, length: Duration) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(
        Some(length.as_millis().max(1) as u64),
        ProgressDrawTarget::stderr_with_hz(4),
    );
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:30}] {elapsed:>4} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

/// A spinner for a phase of unknown length (draining, verifying).
pub fn spinner(show: bool, label: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} {spinner} {elapsed:>4} {msg}")
            .expect("a valid template"),
    );
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(REFRESH);
    bar
}
