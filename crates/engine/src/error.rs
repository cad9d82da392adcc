//! The one error type of the engine. Its `Display` texts end up in front of
//! users (a failed uplink's reason, a rule's status), so each says in plain
//! words what the script did and, where QuickJS told us, where.

use std::time::Duration;

/// Why a script could not produce a value.
///
/// Every failure of a script is reported through this type and never as a
/// panic: a broken codec fails its own uplink and nothing else. The
/// variants let the pipeline tell "the codec is broken" (compile errors,
/// exceptions, limits) from "the engine is overloaded" ([`CodecError::Busy`]),
/// which is answered with a retryable 503 instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The source is not valid JavaScript. `line` is the 1-based line QuickJS
    /// points at, when it gave one, so a user can find the typo.
    #[error("{message}{}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Compile {
        /// The parser's message, e.g. `SyntaxError: unexpected token in expression: ')'`.
        message: String,
        /// 1-based line of the error in the script.
        line: Option<u32>,
    },
    /// The script threw. `message` is `Name: text` as JavaScript prints it;
    /// `stack` holds the frames (`at decodeUplink (codec.js:5:11)`) when the
    /// thrown value was an `Error`.
    #[error("{message}{}", stack.as_deref().map(|s| format!("\n{}", s.trim_end())).unwrap_or_default())]
    Exception {
        /// `Error: boom` for `throw new Error("boom")`.
        message: String,
        /// The JavaScript stack trace, one frame per line.
        stack: Option<String>,
    },
    /// The script ran past its time limit and was stopped. QuickJS's
    /// interrupt cannot be caught by the script, so this always ends it.
    #[error("script ran longer than its {}ms limit and was interrupted", .0.as_millis())]
    Timeout(Duration),
    /// The script allocated more than its memory limit (or recursed past its
    /// stack limit while allocating) and was stopped.
    #[error("script ran out of memory: it allocated more than its memory limit and was stopped")]
    OutOfMemory,
    /// A `decodeUplink` or `encodeDownlink` codec returned a non-empty
    /// `errors` array: the codec itself says the payload cannot be decoded
    /// (or the downlink encoded).
    #[error("codec reported errors: {}", .0.join("; "))]
    Reported(Vec<String>),
    /// The script returned something that is not the expected shape, or not
    /// representable as JSON (a cycle, a BigInt).
    #[error("{0}")]
    InvalidOutput(String),
    /// The script does not define the function the call needs.
    #[error("script does not define a function named `{0}`")]
    MissingFunction(String),
    /// The call was not run: an earlier call of the same script in the same
    /// batch already hit its time or memory limit (`earlier` is that call's
    /// error), so running this one too could cost the other scripts' calls
    /// of the batch the limit again. See [`CodecError::root`].
    #[error("not run: an earlier call of this script in the same batch failed: {earlier}")]
    Skipped {
        /// The error that stopped the script earlier in the batch.
        earlier: Box<CodecError>,
    },
    /// The call was not run: an earlier call of the same script ran past its
    /// time limit inside a built-in function that cannot be interrupted
    /// (`new Array(1e9).join()`), and the thread it left behind has not
    /// wound down yet. The script runs again once it has. `earlier` is that
    /// call's error, a [`CodecError::Timeout`].
    #[error("not run: an earlier call of this script ran past its time limit inside a built-in function that cannot be interrupted and is still winding down; the script runs again once it has ({earlier})")]
    HeldBack {
        /// The error the stuck call was answered with.
        earlier: Box<CodecError>,
    },
    /// Every worker's queue is full. Retry later; the caller should answer
    /// 503 with `Retry-After` rather than wait.
    #[error("script engine is busy: its queue is full, retry later")]
    Busy,
    /// The engine's workers are gone (the engine was shut down or a worker
    /// could not start), so no script can run.
    #[error("script engine has stopped")]
    Stopped,
}

impl CodecError {
    /// The error that decided this call's fate: for a call that was not
    /// run ([`CodecError::Skipped`], [`CodecError::HeldBack`]), the earlier
    /// call's error, so a caller that classifies failures (a failed
    /// uplink's `Timeout` or `OutOfMemory`) files it with the limit that
    /// was hit; for every other error, itself.
    pub fn root(&self) -> &CodecError {
        match self {
            CodecError::Skipped { earlier } | CodecError::HeldBack { earlier } => earlier.root(),
            other => other,
        }
    }
}
