//! What keeps one script from holding up the others: the worker slots, the
//! job each is working on, and the watchdog thread that replaces a worker
//! whose call will not stop.
//!
//! QuickJS stops a script at its time limit through the interrupt handler,
//! which the interpreter polls as it runs bytecode, and at its memory limit
//! when an allocation fails. Neither reaches every built-in: some run a
//! native loop that neither polls nor allocates once its first allocation
//! failed (`new Array(1e9).join("x")`, `reverse`, `slice`, `concat`,
//! `splice`, `flat`, `copyWithin` and `sort` on a huge sparse array,
//! `String()` of a huge BigInt), for seconds to minutes. A native loop
//! cannot be unwound from outside, and an OS thread cannot be killed
//! safely, so the watchdog does what remains:
//!
//! - a call still running `grace` past its deadline is answered with
//!   [`CodecError::Timeout`], and its slot gets a new thread with a new
//!   runtime, which goes on with the rest of the job and the queue;
//! - the old thread is *abandoned*: its runtime's allocations fail from then
//!   on (which ends the loops that allocate, such as those over an
//!   array-like's indices past 2³¹), it is moved to the idle scheduling
//!   class (it runs only on a core nothing else wants), and once its call
//!   returns it frees its runtime and exits without touching the slot;
//! - while it winds down its script is held back: calls of that script fail
//!   at once with [`CodecError::HeldBack`] rather than strand another thread;
//! - at most [`MAX_ABANDONED`] threads may be winding down at once; past that
//!   the watchdog waits for the stuck call instead, so a flood of distinct
//!   hostile scripts costs queueing, never unbounded threads and memory.
//!
//! Within a job (a batch of calls), once a script's calls have spent its
//! time limit on calls that hit a limit (one timeout does), its remaining
//! calls in the job fail at once with [`CodecError::Skipped`]: a device
//! type whose codec hangs costs the other types' uplinks of a batch at most
//! about one time limit, however many of its own uplinks the batch holds.
//!
//! The job in progress lives here, in the slot, not on the worker thread's
//! stack, so a replacement can finish it: the thread puts each call's
//! result back and takes the next call in one round trip of the slot's
//! (uncontended) lock, nanoseconds against a decode's microseconds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::worker::{self, Limits};
use crate::{Call, CodecError, Script, ScriptKind};

/// Most abandoned threads that may be winding down at once (per engine).
/// Each holds up to its runtime's memory until its call returns.
pub(crate) const MAX_ABANDONED: usize = 16;

/// The shortest wait the watchdog allows a call past its deadline.
const MIN_GRACE: Duration = Duration::from_millis(20);

/// The longest.
const MAX_GRACE: Duration = Duration::from_secs(1);

/// How long after its deadline a call may still be running before the
/// watchdog gives up on its thread: a quarter of the limit, within
/// [`MIN_GRACE`]..=[`MAX_GRACE`]. The interrupt handler normally ends a
/// call microseconds after its deadline; the grace covers a thread the OS
/// did not schedule in time on a loaded machine. (Were such a thread
/// abandoned all the same, nothing is lost: its call was past its deadline
/// and fails as a timeout either way, and its script is held back only
/// for the moments the thread needs to notice.)
pub(crate) fn grace(limit: Duration) -> Duration {
    (limit / 4).clamp(MIN_GRACE, MAX_GRACE)
}

/// Work queued for a worker.
pub(crate) enum Job {
    /// Compile a script and report which entry point it defines.
    Check {
        script: Script,
        reply: oneshot::Sender<Result<ScriptKind, CodecError>>,
    },
    /// Run a batch of calls.
    Run {
        calls: Vec<Call>,
        reply: oneshot::Sender<Vec<Result<serde_json::Value, CodecError>>>,
    },
}

/// One unit of a job, run under the time limit.
pub(crate) enum Item {
    Check(Script),
    Call(Call),
}

impl Item {
    pub(crate) fn script(&self) -> &Script {
        match self {
            Item::Check(script) => script,
            Item::Call(call) => call.script(),
        }
    }
}

/// What an item produced.
pub(crate) enum Answer {
    Kind(ScriptKind),
    Value(serde_json::Value),
}

enum Reply {
    Check(oneshot::Sender<Result<ScriptKind, CodecError>>),
    Run(oneshot::Sender<Vec<Result<serde_json::Value, CodecError>>>),
}

/// A job in progress.
struct Work {
    /// A check job's script, until it is taken.
    check: Option<Script>,
    /// A run job's calls not taken yet.
    calls: std::vec::IntoIter<Call>,
    results: Vec<Result<serde_json::Value, CodecError>>,
    /// What a check found.
    kind: Option<ScriptKind>,
    /// The script of the item a thread is running now.
    running: Option<Script>,
    /// Per script id, what its calls that hit a limit cost in this job;
    /// empty unless one did.
    strikes: HashMap<u64, Strike>,
    reply: Reply,
}

#[derive(Default)]
struct Strike {
    spent: Duration,
    /// Set once `spent` reached the time limit: the rest of the script's
    /// calls in the job fail with it.
    tripped: Option<CodecError>,
}

impl Work {
    /// `None` when the caller has gone already.
    fn new(job: Job) -> Option<Work> {
        let (check, calls, reply) = match job {
            Job::Check { script, reply } => {
                if reply.is_closed() {
                    return None;
                }
                (Some(script), Vec::new(), Reply::Check(reply))
            }
            Job::Run { calls, reply } => {
                if reply.is_closed() {
                    return None;
                }
                (None, calls, Reply::Run(reply))
            }
        };
        Some(Work {
            results: Vec::with_capacity(calls.len().max(1)),
            check,
            calls: calls.into_iter(),
            kind: None,
            running: None,
            strikes: HashMap::new(),
            reply,
        })
    }

    fn take(&mut self) -> Option<Item> {
        match self.check.take() {
            Some(script) => Some(Item::Check(script)),
            None => self.calls.next().map(Item::Call),
        }
    }

    /// Records an item's result; a limit it hit counts against its script.
    fn record(&mut self, result: Result<Answer, CodecError>, took: Duration, limit: Duration) {
        let running = self.running.take();
        let result = match result {
            Ok(Answer::Value(value)) => Ok(value),
            Ok(Answer::Kind(kind)) => {
                self.kind = Some(kind);
                Ok(serde_json::Value::Null)
            }
            Err(error) => {
                if let (Some(script), CodecError::Timeout(_) | CodecError::OutOfMemory) =
                    (running, &error)
                {
                    let strike = self.strikes.entry(script.id).or_default();
                    strike.spent = strike.spent.saturating_add(took);
                    if strike.spent >= limit && strike.tripped.is_none() {
                        strike.tripped = Some(error.clone());
                    }
                }
                Err(error)
            }
        };
        self.results.push(result);
    }

    /// Why the next call of `script` is not to run, if it is not.
    fn skip(&self, script: &Script) -> Option<CodecError> {
        if self.strikes.is_empty() {
            return None;
        }
        let earlier = self.strikes.get(&script.id)?.tripped.clone()?;
        Some(CodecError::Skipped {
            earlier: Box::new(earlier),
        })
    }

    fn answer(self) {
        match self.reply {
            Reply::Check(reply) => {
                let result = match (self.results.into_iter().next(), self.kind) {
                    (Some(Err(error)), _) => Err(error),
                    (Some(Ok(_)), Some(kind)) => Ok(kind),
                    _ => Err(CodecError::Stopped),
                };
                let _ = reply.send(result);
            }
            Reply::Run(reply) => {
                let _ = reply.send(self.results);
            }
        }
    }
}

/// How long past its deadline, by the wall clock, a call may still be
/// running however little CPU time it got, before the watchdog gives up on
/// its thread: a call is timed by the CPU time its thread runs (a thread
/// the OS leaves waiting on a loaded machine is not stuck), and this
/// bounds one that waits without running.
fn wall_ceiling(limit: Duration) -> Duration {
    (limit * 20).max(Duration::from_secs(10))
}

/// What one worker thread shares with the watchdog. A new one per thread,
/// so an abandoned thread's last writes never touch its replacement's.
pub(crate) struct Watch {
    epoch: Instant,
    /// Deadline of the running call, in nanoseconds since `epoch` plus
    /// one; 0 while no script runs.
    deadline: AtomicU64,
    /// The thread's CPU time when the running call started, in
    /// nanoseconds plus one; 0 while no script runs.
    cpu_started: AtomicU64,
    /// The thread's CPU-time clock ([`NO_CLOCK`] until the thread records
    /// it, or where there is none).
    cpu_clock: AtomicI64,
    /// The thread's OS id, to lower an abandoned thread's priority.
    tid: AtomicI64,
    /// Set when the thread is abandoned: its runtime's allocations fail.
    poisoned: AtomicBool,
    /// The script the thread was abandoned in, held back until it exits.
    holding: Mutex<Option<Script>>,
}

impl Watch {
    pub(crate) fn new(epoch: Instant) -> Arc<Watch> {
        Arc::new(Watch {
            epoch,
            deadline: AtomicU64::new(0),
            cpu_started: AtomicU64::new(0),
            cpu_clock: AtomicI64::new(NO_CLOCK),
            tid: AtomicI64::new(0),
            poisoned: AtomicBool::new(false),
            holding: Mutex::new(None),
        })
    }

    /// Publishes the running call's deadline and the thread's CPU time
    /// when it started (two relaxed stores).
    pub(crate) fn arm(&self, deadline: Option<Instant>, cpu_started: Duration) {
        let nanos = deadline.map_or(u64::MAX, |d| {
            u64::try_from(d.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX - 1)
                .saturating_add(1)
        });
        let cpu = u64::try_from(cpu_started.as_nanos()).unwrap_or(u64::MAX - 1);
        self.cpu_started
            .store(cpu.saturating_add(1), Ordering::Relaxed);
        self.deadline.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn disarm(&self) {
        self.deadline.store(0, Ordering::Relaxed);
        self.cpu_started.store(0, Ordering::Relaxed);
    }

    /// The CPU time the running call's thread has run since the call
    /// started; `None` when no call runs or the thread's clock is unknown.
    fn cpu_spent(&self) -> Option<Duration> {
        let started = match self.cpu_started.load(Ordering::Relaxed) {
            0 => return None,
            nanos => Duration::from_nanos(nanos - 1),
        };
        let clock = self.cpu_clock.load(Ordering::Relaxed);
        if clock == NO_CLOCK {
            return None;
        }
        Some(cpu_time(clock as libc::clockid_t)?.saturating_sub(started))
    }

    fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Relaxed) {
            0 => None,
            nanos => self.epoch.checked_add(Duration::from_nanos(nanos - 1)),
        }
    }

    /// Whether allocations must fail (the thread was abandoned).
    pub(crate) fn poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }

    /// Lets an abandoned thread's runtime allocate again, to free itself.
    pub(crate) fn unpoison(&self) {
        self.poisoned.store(false, Ordering::Relaxed);
    }

    /// Called on the worker thread itself when it starts.
    pub(crate) fn record_thread(&self) {
        self.tid.store(os_thread_id(), Ordering::Relaxed);
        self.cpu_clock
            .store(this_thread_cpu_clock(), Ordering::Relaxed);
    }
}

/// What every slot of one engine and its watchdog share.
pub(crate) struct Supervision {
    pub(crate) limits: Limits,
    grace: Duration,
    epoch: Instant,
    /// Scripts whose call is stuck on an abandoned thread, by id: the
    /// source (a hash collision must not hold back another script) and
    /// how many threads hold it.
    held: Mutex<HashMap<u64, (Arc<str>, usize)>>,
    /// `held`'s length, read without the lock on every call.
    held_count: AtomicUsize,
    /// Abandoned threads still running.
    abandoned: AtomicUsize,
    /// At most this many at once ([`MAX_ABANDONED`] but in tests).
    max_abandoned: usize,
}

impl Supervision {
    pub(crate) fn new(limits: Limits, max_abandoned: usize) -> Arc<Supervision> {
        Arc::new(Supervision {
            grace: grace(limits.time),
            limits,
            epoch: Instant::now(),
            held: Mutex::new(HashMap::new()),
            held_count: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
            max_abandoned,
        })
    }

    /// Why a call of `script` is not to run now, if its last call is
    /// stuck on an abandoned thread.
    fn held_back(&self, script: &Script) -> Option<CodecError> {
        if self.held_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let held = lock(&self.held);
        match held.get(&script.id) {
            Some((source, _)) if **source == *script.source => Some(CodecError::HeldBack {
                earlier: Box::new(CodecError::Timeout(self.limits.time)),
            }),
            _ => None,
        }
    }

    fn hold(&self, script: &Script) {
        let mut held = lock(&self.held);
        held.entry(script.id)
            .or_insert_with(|| (Arc::clone(&script.source), 0))
            .1 += 1;
        self.held_count.store(held.len(), Ordering::Relaxed);
    }

    /// An abandoned thread is done: its script may run again.
    pub(crate) fn release(&self, watch: &Watch) {
        if let Some(script) = lock(&watch.holding).take() {
            let mut held = lock(&self.held);
            if let Some(entry) = held.get_mut(&script.id) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    held.remove(&script.id);
                }
            }
            self.held_count.store(held.len(), Ordering::Relaxed);
        }
        self.abandoned.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One worker slot: its queue, the job in progress and the thread serving
/// it now.
pub(crate) struct Slot {
    pub(crate) index: usize,
    /// The queue. Only the live thread takes from it, and never while it
    /// holds `state`; `None` once the slot cannot be served any more.
    jobs: Mutex<Option<Receiver<Job>>>,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// Counts the threads the slot has had; a thread whose number is not
    /// this one was abandoned and must leave.
    generation: u64,
    /// The live thread's watch.
    watch: Arc<Watch>,
    work: Option<Work>,
    /// The live thread left: the queue closed (or no thread could start).
    closed: bool,
    /// The watchdog already said it cannot abandon this call.
    stall_logged: bool,
}

/// What a worker thread is to do next.
pub(crate) enum Next {
    /// Run this item, or fail it at once with the error.
    Item(Item, Option<CodecError>),
    /// The thread was abandoned: free the runtime and exit.
    Abandoned,
    /// The queue closed: exit.
    Closed,
}

impl Slot {
    /// Creates slot `index` serving `jobs`, with its first thread.
    pub(crate) fn start(
        index: usize,
        jobs: Receiver<Job>,
        supervision: &Arc<Supervision>,
    ) -> std::io::Result<Arc<Slot>> {
        let watch = Watch::new(supervision.epoch);
        let slot = Arc::new(Slot {
            index,
            jobs: Mutex::new(Some(jobs)),
            state: Mutex::new(SlotState {
                generation: 0,
                watch: Arc::clone(&watch),
                work: None,
                closed: false,
                stall_logged: false,
            }),
        });
        worker::spawn(Arc::clone(&slot), Arc::clone(supervision), 0, watch)?;
        Ok(slot)
    }

    /// Records the result of the item thread `generation` ran last, if
    /// any, and hands it the next: from the job in progress, else from the
    /// queue (waiting for one). Answers a finished job. One lock round
    /// trip per item.
    pub(crate) fn next(
        &self,
        generation: u64,
        done: Option<Done>,
        supervision: &Supervision,
    ) -> Next {
        let mut done = done;
        loop {
            let mut state = lock(&self.state);
            if state.generation != generation {
                // Abandoned: the watchdog answered the item already.
                return Next::Abandoned;
            }
            if let Some(work) = state.work.as_mut() {
                if let Some(done) = done.take() {
                    work.record(done.result, done.took, supervision.limits.time);
                }
                if let Some(item) = work.take() {
                    let script = item.script();
                    let skip = work.skip(script).or_else(|| supervision.held_back(script));
                    work.running = skip.is_none().then(|| script.clone());
                    return Next::Item(item, skip);
                }
                let finished = state.work.take().expect("checked above");
                drop(state);
                finished.answer();
                continue;
            }
            drop(state);
            let job = match lock(&self.jobs).as_ref() {
                Some(jobs) => jobs.recv().ok(),
                None => None,
            };
            let mut state = lock(&self.state);
            match job {
                Some(job) => state.work = Work::new(job),
                None => {
                    state.closed = true;
                    return Next::Closed;
                }
            }
        }
    }

    /// Thread `generation` cannot go on (it could not create a runtime):
    /// the job in progress and everything queued are answered `Stopped`
    /// (their answers dropped), and new work goes to the other workers.
    pub(crate) fn close(&self, generation: u64) {
        let mut state = lock(&self.state);
        if state.generation == generation {
            close(self, &mut state);
        }
    }
}

/// What a thread's last item produced, and the time it ran scripts for.
pub(crate) struct Done {
    pub(crate) result: Result<Answer, CodecError>,
    pub(crate) took: Duration,
}

/// The watchdog: wakes when the earliest running call's grace ends (at
/// least every time limit, to see calls that started since), and abandons
/// the threads of calls still running then. Returns once every slot has
/// closed.
pub(crate) fn run(slots: Vec<Arc<Slot>>, supervision: Arc<Supervision>) {
    let period = supervision.limits.time.max(MIN_GRACE);
    loop {
        let now = Instant::now();
        let mut wake = now + period;
        let mut open = false;
        for slot in &slots {
            let mut state = lock(&slot.state);
            if state.closed {
                continue;
            }
            open = true;
            let Some(deadline) = state.watch.deadline() else {
                continue;
            };
            // Past its limit and the grace in CPU time (by the wall clock
            // where the thread's CPU time is unknown), or past the wall
            // clock's ceiling however little it ran.
            let allowed = supervision.limits.time + supervision.grace;
            let ceiling = deadline + wall_ceiling(supervision.limits.time);
            let due = match state.watch.cpu_spent() {
                // CPU time never runs faster than the wall clock: not due
                // before the rest of its allowance has passed.
                Some(spent) => now + allowed.saturating_sub(spent),
                None => deadline + supervision.grace,
            };
            if now >= due.min(ceiling) {
                abandon(slot, &mut state, &supervision);
            } else {
                wake = wake.min(due).min(ceiling);
            }
        }
        if !open {
            return;
        }
        thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}

/// Answers the stuck call with a timeout, gives the slot a new thread and
/// leaves the old one to wind down (see the module doc).
fn abandon(
    slot: &Arc<Slot>,
    state: &mut MutexGuard<'_, SlotState>,
    supervision: &Arc<Supervision>,
) {
    let limit = supervision.limits.time;
    let Some(script) = state.work.as_ref().and_then(|w| w.running.clone()) else {
        return;
    };
    let abandoned = supervision.abandoned.load(Ordering::Relaxed);
    if abandoned >= supervision.max_abandoned {
        if !state.stall_logged {
            state.stall_logged = true;
            tracing::error!(
                worker = slot.index,
                script = script.id,
                abandoned,
                "a script has run past its time limit in a built-in that cannot be interrupted, and {abandoned} abandoned script threads are still winding down: this worker waits for it"
            );
        }
        return;
    }
    supervision.abandoned.fetch_add(1, Ordering::Relaxed);
    state.generation += 1;
    state.stall_logged = false;
    let fresh = Watch::new(supervision.epoch);
    let old = std::mem::replace(&mut state.watch, Arc::clone(&fresh));
    old.poisoned.store(true, Ordering::Relaxed);
    lower_priority(old.tid.load(Ordering::Relaxed));
    supervision.hold(&script);
    *lock(&old.holding) = Some(script.clone());
    let took = old.deadline().map_or(limit, |deadline| {
        limit + Instant::now().saturating_duration_since(deadline)
    });
    if let Some(work) = state.work.as_mut() {
        work.record(Err(CodecError::Timeout(limit)), took, limit);
    }
    tracing::warn!(
        worker = slot.index,
        script = script.id,
        "a script ran past its {}ms time limit in a built-in that cannot be interrupted: its call failed with Timeout, its worker thread was replaced and is left to wind down at idle priority; the script is held back until then",
        limit.as_millis()
    );
    if let Err(error) = worker::spawn(
        Arc::clone(slot),
        Arc::clone(supervision),
        state.generation,
        fresh,
    ) {
        tracing::error!(%error, worker = slot.index, "could not start a replacement script worker; this worker is stopped");
        close(slot, state);
    }
}

/// Stops serving `slot`: its callers get `Stopped` (their answers are
/// dropped), and new work goes to the other workers.
fn close(slot: &Slot, state: &mut SlotState) {
    state.closed = true;
    state.work = None;
    lock(&slot.jobs).take();
}

/// Locks `mutex`, whose data stays consistent even if a holder panicked
/// (every update under these locks is a single step).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`Watch::cpu_clock`] when the thread's CPU-time clock is unknown.
const NO_CLOCK: i64 = i64::MIN;

/// The CPU time the thread of CPU-time clock `clock` has run; `None` if
/// the clock cannot be read (the thread has exited).
fn cpu_time(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; a clock id that is
    // no longer valid makes the call fail, not misbehave.
    let read = unsafe { libc::clock_gettime(clock, &mut ts) };
    (read == 0).then(|| Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.max(0) as u32))
}

/// The CPU time the calling thread has run (zero if it cannot be read).
pub(crate) fn this_thread_cpu() -> Duration {
    cpu_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

/// The calling thread's CPU-time clock, which another thread can read.
#[cfg(target_os = "linux")]
fn this_thread_cpu_clock() -> i64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `pthread_self` is always a valid thread; `clock` is a valid
    // place to write its clock id.
    match unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } {
        0 => i64::from(clock),
        _ => NO_CLOCK,
    }
}

#[cfg(not(target_os = "linux"))]
fn this_thread_cpu_clock() -> i64 {
    NO_CLOCK
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> i64 {
    // SAFETY: gettid has no preconditions.
    i64::from(unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t)
}

#[cfg(not(target_os = "linux"))]
fn os_thread_id() -> i64 {
    0
}

/// Moves an abandoned thread to the idle scheduling class, or failing
/// that to the lowest priority, so its winding down takes only CPU time
/// nothing else wants.
#[cfg(target_os = "linux")]
fn lower_priority(tid: i64) {
    let Ok(tid) = libc::pid_t::try_from(tid) else {
        return;
    };
    if tid == 0 {
        return;
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on a thread id of this process; a thread that
    // has exited meanwhile makes them fail harmlessly.
    unsafe {
        if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_tid: i64) {}
