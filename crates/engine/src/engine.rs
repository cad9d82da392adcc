//! The engine handle: a cloneable front for a few worker threads. It only
//! routes work — batches go round-robin into each worker's bounded queue and
//! the answer comes back on a oneshot — so no script ever runs on a tokio
//! thread, and an overloaded engine says [`CodecError::Busy`] at once
//! instead of letting queues grow.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::watchdog::{self, Job, Slot, Supervision};
use crate::worker::Limits;
use crate::{Call, CodecError, Script, ScriptKind};

/// How the engine runs scripts. Passed in by the binary's config, never read
/// from a global, so tests can run engines with different limits side by side.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Worker threads, each with its own QuickJS runtime and script cache.
    /// One saturates a core; scripts are CPU-bound, so more than the cores
    /// left over by the rest of weft only adds contention. At least 1.
    pub workers: usize,
    /// How long one call may run before it is stopped (ChirpStack's
    /// default is 100 ms), built-in functions included: one stuck in a
    /// native loop is given up a quarter of the limit later and its worker
    /// thread replaced. A decoder needs microseconds; the limit exists for
    /// broken ones, so one stuck codec costs a batch about this once: its
    /// later calls in the batch are not run ([`CodecError::Skipped`]).
    pub time_limit: Duration,
    /// Heap, in bytes, that scripts may allocate on a worker on top of what
    /// its cached compiled scripts hold. Stops a runaway script before it
    /// takes the process's memory.
    pub memory_limit: usize,
    /// JavaScript stack, in bytes, so deep or infinite recursion ends in a
    /// catchable `RangeError` instead of overflowing the thread's stack.
    pub stack_limit: usize,
    /// Batches each worker may have waiting. Beyond it `run` and `check`
    /// return [`CodecError::Busy`]; with batches of a few hundred calls the
    /// default holds seconds of work, enough to absorb bursts.
    pub queue_capacity: usize,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            workers: 1,
            time_limit: Duration::from_millis(100),
            memory_limit: 32 * 1024 * 1024,
            stack_limit: 1024 * 1024,
            queue_capacity: 1024,
        }
    }
}

/// A handle on the running script workers.
///
/// Cloning is cheap (one reference count), and every clone feeds the same
/// workers. The workers stop when the last clone is dropped and their queues
/// have drained.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

struct Shared {
    /// One bounded queue per worker; empty if no worker could start.
    queues: Vec<SyncSender<Job>>,
    /// Round-robin cursor over `queues`.
    next: AtomicUsize,
}

impl Engine {
    /// Spawns `config.workers` OS threads, each owning a QuickJS runtime with
    /// the configured limits, and returns the handle that feeds them.
    ///
    /// A worker that cannot start is logged and left out; if none starts,
    /// every call returns [`CodecError::Stopped`].
    pub fn start(config: EngineConfig) -> Engine {
        Engine::start_with(config, watchdog::MAX_ABANDONED)
    }

    /// [`Engine::start`] with at most `max_abandoned` threads left winding
    /// down at once (see the `watchdog` module).
    pub(crate) fn start_with(config: EngineConfig, max_abandoned: usize) -> Engine {
        let limits = Limits {
            time: config.time_limit,
            memory: config.memory_limit,
            stack: config.stack_limit,
        };
        let supervision = Supervision::new(limits, max_abandoned);
        let mut queues = Vec::new();
        let mut slots = Vec::new();
        for index in 0..config.workers.max(1) {
            let (tx, rx) = mpsc::sync_channel(config.queue_capacity.max(1));
            match Slot::start(index, rx, &supervision) {
                Ok(slot) => {
                    queues.push(tx);
                    slots.push(slot);
                }
                Err(error) => {
                    tracing::error!(%error, index, "could not start a script engine worker")
                }
            }
        }
        if !slots.is_empty() {
            let watched = std::thread::Builder::new()
                .name("weft-engine-watchdog".into())
                .spawn(move || watchdog::run(slots, supervision));
            if let Err(error) = watched {
                // The limits still hold for every script the interrupt
                // handler and the memory limit stop; only the backstop for
                // built-ins that ignore both is missing.
                tracing::error!(%error, "could not start the script engine's watchdog");
            }
        }
        Engine {
            shared: Arc::new(Shared {
                queues,
                next: AtomicUsize::new(0),
            }),
        }
    }

    /// Compiles `script` and tells which entry point it defines, so a codec
    /// can be rejected when it is saved rather than when its first uplink
    /// arrives. The compiled script stays cached on the worker that checked it.
    ///
    /// The script's top level runs (that is how its functions get defined),
    /// under the same limits as a call.
    pub async fn check(&self, script: &Script) -> Result<ScriptKind, CodecError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Check {
            script: script.clone(),
            reply,
        })?;
        answer.await.map_err(|_| CodecError::Stopped)?
    }

    /// Runs a batch of calls on one worker and returns one result per call,
    /// in the same order.
    ///
    /// The outer error is only about the engine: [`CodecError::Busy`] when
    /// every worker's queue is full, [`CodecError::Stopped`] when no worker
    /// runs. Each call's own failure (exception, timeout, …) is its inner
    /// result and does not affect the other scripts' calls in the batch;
    /// once a script has spent its time limit on calls that hit a limit,
    /// its own later calls in the batch fail at once with
    /// [`CodecError::Skipped`].
    pub async fn run(
        &self,
        calls: Vec<Call>,
    ) -> Result<Vec<Result<serde_json::Value, CodecError>>, CodecError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Run { calls, reply })?;
        answer.await.map_err(|_| CodecError::Stopped)
    }

    /// Queues `job` on the next worker in turn; when that queue is full the
    /// other workers are tried before giving up with `Busy`, so one worker
    /// stuck on slow scripts does not refuse work the others could take.
    fn submit(&self, job: Job) -> Result<(), CodecError> {
        let queues = &self.shared.queues;
        if queues.is_empty() {
            return Err(CodecError::Stopped);
        }
        let start = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let mut job = job;
        let mut any_alive = false;
        for offset in 0..queues.len() {
            match queues[(start + offset) % queues.len()].try_send(job) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) => {
                    any_alive = true;
                    job = back;
                }
                Err(TrySendError::Disconnected(back)) => job = back,
            }
        }
        Err(if any_alive {
            CodecError::Busy
        } else {
            CodecError::Stopped
        })
    }
}
