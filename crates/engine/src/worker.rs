//! One script worker: an OS thread that owns a QuickJS runtime and runs the
//! items of its slot's jobs one at a time (`watchdog.rs` keeps the job, and
//! replaces the thread when a call will not stop). All of rquickjs stays in
//! here and in `convert.rs`.
//!
//! The runtime carries the three limits (ChirpStack's shape, minus its
//! gaps): a memory limit, a stack limit, and an interrupt handler that stops
//! a call once its thread has run for its time limit (CPU time, see
//! [`Clock`]); a result a call produced past its limit (the interrupt
//! handler is not polled inside built-ins) counts as a timeout too. Each script is compiled
//! once into a context of its own (so scripts never see each other's
//! globals) and kept in a bounded cache keyed by the script id.
//!
//! A codec call (`decodeUplink`, `encodeDownlink`, `decodeDownlink`, TTN
//! v2's `Decoder`/`Encoder`, `convert`) starts from fresh state, as
//! TTN's and ChirpStack's runners give it: the script is also compiled as
//! the body of a function, and every codec call runs that function — the
//! script's top level afresh, its `var`s and functions new — then the entry
//! point it defined; globals earlier calls created (sloppy assignments to
//! undeclared names, `globalThis.x = …`) are deleted first. So a codec
//! that keeps a byte pointer in a top-level `var` decodes every uplink from
//! byte 0, and one device's uplink cannot change how another's is decoded.
//! Only compiling happens once. Other calls (`Call::Function`, JS rules)
//! run in the script's global scope, whose state persists. A call that
//! times out or runs out of memory drops its script's context (its globals
//! may be half updated, or hold the memory), so the next call starts from a
//! fresh compile and the other scripts on the worker are unaffected. If not
//! even a fresh context can be allocated, the whole runtime is rebuilt.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::convert::{self, Undefined};
use crate::meter::{Meter, MeteredAllocator};
use crate::watchdog::{this_thread_cpu, Answer, Done, Item, Next, Slot, Supervision, Watch};
use crate::{Call, CodecError, Script, ScriptKind};
use rquickjs::context::EvalOptions;
use rquickjs::{Context, Ctx, Function, Object, Persistent, Runtime, Value};

/// Compiled scripts kept per worker. Far more than the codecs and rules a
/// deployment has in active use, while bounding the memory of stale ones.
const CACHE_CAPACITY: usize = 256;

/// Stack for the worker thread on top of the JavaScript stack limit: the
/// Rust frames around the interpreter and the JSON conversion need room too.
const THREAD_STACK_HEADROOM: usize = 4 * 1024 * 1024;

/// The smallest JavaScript stack a worker accepts.
const MIN_STACK: usize = 64 * 1024;

/// How close to the memory limit a call must have come for a thrown `null`
/// to be QuickJS failing to allocate its error, not the script's own
/// `throw null`: an error object with its message and stack fits well
/// within it.
const EXHAUSTED_MARGIN: usize = 64 * 1024;

/// The file name scripts are compiled under; it shows up in stack traces
/// (`at decodeUplink (script.js:5:11)`).
const FILE_NAME: &str = "script.js";

/// Makes `console.*` harmless no-ops: many vendor codecs log, and a missing
/// `console` would turn every call into a `ReferenceError`.
const PRELUDE: &str = "globalThis.console = (function () {
  function ignore() {}
  return { log: ignore, info: ignore, warn: ignore, error: ignore, debug: ignore, trace: ignore };
})();";

/// Builds the `Buffer` global (see `buffer.js`): a function returning it.
/// About 75 KB of heap once built, so it is built only in the contexts of
/// scripts that use it, by [`LAZY_BUFFER`].
const BUFFER: &str = include_str!("buffer.js");

/// Defines the global `Buffer` as a non-enumerable accessor that builds
/// the real one (`install`, which evaluates [`BUFFER`]) the first time it
/// is read, in the call that reads it and so under that call's limits, and
/// returns the same one from then on. Assigning `Buffer` replaces the
/// accessor with the value (the codec calls' reset puts it back).
const LAZY_BUFFER: &str = "(function (g, install) {
  var real;
  Object.defineProperty(g, 'Buffer', {
    get: function () { if (real === undefined) real = install(); return real; },
    set: function (value) {
      Object.defineProperty(g, 'Buffer', { value: value, writable: true, configurable: true, enumerable: false });
    },
    configurable: true,
    enumerable: false
  });
})";

/// Opens the function a codec's source becomes the body of (see the module
/// doc). On the source's first line, so error positions keep their lines.
const FRESH_OPEN: &str = "(function () {";

/// Closes that function: it returns the entry points the top level
/// defined, in the order of [`EntryPoint`].
const FRESH_CLOSE: &str = "\n;return [
  typeof decodeUplink === 'function' ? decodeUplink : undefined,
  typeof convert === 'function' ? convert : undefined,
  typeof Decoder === 'function' ? Decoder : undefined,
  typeof encodeDownlink === 'function' ? encodeDownlink : undefined,
  typeof Encoder === 'function' ? Encoder : undefined,
  typeof decodeDownlink === 'function' ? decodeDownlink : undefined];\n})";

/// The entry points a codec's fresh run returns ([`FRESH_CLOSE`]), by
/// their index there.
#[derive(Clone, Copy)]
enum EntryPoint {
    DecodeUplink = 0,
    Convert = 1,
    /// The Things Network v2's `Decoder(bytes, port)`.
    Decoder = 2,
    EncodeDownlink = 3,
    /// The Things Network v2's `Encoder(object, port)`.
    Encoder = 4,
    DecodeDownlink = 5,
}

impl EntryPoint {
    fn name(self) -> &'static str {
        match self {
            EntryPoint::DecodeUplink => "decodeUplink",
            EntryPoint::Convert => "convert",
            EntryPoint::Decoder => "Decoder",
            EntryPoint::EncodeDownlink => "encodeDownlink",
            EntryPoint::Encoder => "Encoder",
            EntryPoint::DecodeDownlink => "decodeDownlink",
        }
    }
}

/// The port a legacy `Encoder(object, port)` is called with when the
/// downlink names none: LoRaWAN's first application port.
const LEGACY_DEFAULT_PORT: u32 = 1;

/// Deletes the globals codec calls added: `Object.keys` lists only
/// enumerable own properties, which the builtins are not, so the check is
/// a short array and a length comparison in the common case. `Buffer` is
/// not enumerable, so a call that assigns it changes it for the script's
/// later calls, as a change to any builtin does (checking it on every
/// call cost a decode about a fifth of its time).
const GLOBALS_RESET: &str = "(function (g) {
  var kept = Object.keys(g);
  var known = new Set(kept);
  return function () {
    var now = Object.keys(g);
    if (now.length === kept.length) return;
    for (var i = 0; i < now.length; i++) {
      if (!known.has(now[i])) delete g[now[i]];
    }
  };
})";

/// Builds TTN's `{bytes, fPort, recvTime}` (plus ChirpStack's
/// `variables`) in JavaScript: an object literal
/// of fixed shape is cheaper to make there than property by property from
/// Rust. It closes over the context's own `Date`, taken before the script
/// runs, so a script that shadows `Date` still gets a real Date.
///
/// Without variables (the usual case) `variables` is one frozen empty
/// object, made once: a new one for every decode cost it measurably.
const INPUT_MAKER: &str = "(function (RealDate) {
  var none = Object.freeze({});
  return function (bytes, fPort, ms, variables) {
    return { bytes: bytes, fPort: fPort, recvTime: new RealDate(ms),
             variables: variables === undefined ? none : variables };
  };
})";

/// The limits a worker's runtime enforces, copied from `EngineConfig`.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub time: Duration,
    pub memory: usize,
    pub stack: usize,
}

/// Starts a thread for `slot`: thread number `generation` of the slot,
/// reporting its calls' deadlines to the watchdog through `watch`.
pub(crate) fn spawn(
    slot: Arc<Slot>,
    supervision: Arc<Supervision>,
    generation: u64,
    watch: Arc<Watch>,
) -> io::Result<()> {
    let limits = &supervision.limits;
    thread::Builder::new()
        .name(format!("weft-engine-{}", slot.index))
        .stack_size(
            limits
                .stack
                .max(MIN_STACK)
                .saturating_add(THREAD_STACK_HEADROOM),
        )
        .spawn(move || serve(&slot, &supervision, generation, watch))?;
    Ok(())
}

/// A worker thread: runs the slot's items one at a time until the queue
/// closes or the watchdog abandons the thread.
fn serve(slot: &Slot, supervision: &Supervision, generation: u64, watch: Arc<Watch>) {
    watch.record_thread();
    let limits = supervision.limits.clone();
    let mut sandbox = match Sandbox::new(limits.clone(), Arc::clone(&watch)) {
        Ok(sandbox) => sandbox,
        Err(error) => {
            tracing::error!(%error, "could not create a QuickJS runtime; script worker not started");
            slot.close(generation);
            return;
        }
    };
    let mut done = None;
    let abandoned = loop {
        let (item, skip) = match slot.next(generation, done.take(), supervision) {
            Next::Item(item, skip) => (item, skip),
            Next::Abandoned => break true,
            Next::Closed => break false,
        };
        let result = match skip {
            Some(error) => Err(error),
            None => match panic::catch_unwind(AssertUnwindSafe(|| sandbox.run(item))) {
                Ok(result) => result,
                Err(_) => {
                    // A panic here is a bug in weft, not in a script. The
                    // runtime may be in any state, so it is leaked rather
                    // than freed, and replaced.
                    tracing::error!("script worker panicked; replacing its runtime");
                    match Sandbox::new(limits.clone(), Arc::clone(&watch)) {
                        Ok(fresh) => std::mem::forget(std::mem::replace(&mut sandbox, fresh)),
                        Err(error) => {
                            tracing::error!(%error, "could not recreate a QuickJS runtime; script worker stopped");
                            std::mem::forget(sandbox);
                            slot.close(generation);
                            return;
                        }
                    }
                    Err(CodecError::Stopped)
                }
            },
        };
        done = Some(Done {
            result,
            took: sandbox.clock.take_spent(),
        });
    };
    if abandoned {
        // The watchdog answered the stuck call and gave the slot a new
        // thread; this one only frees its runtime (allocations work again
        // for that) and lets its script run again.
        watch.unpoison();
        drop(sandbox);
        supervision.release(&watch);
        tracing::info!(
            worker = slot.index,
            "an abandoned script worker thread has wound down and exited"
        );
    }
}

/// The deadline of the call that is running, shared with the runtime's
/// interrupt handler and, through the thread's [`Watch`], with the
/// watchdog. A call's time is the CPU time its thread runs, not the wall
/// clock's: on a loaded machine (or under a CPU quota) the OS may leave
/// the thread waiting, and that is not the script's doing. The wall clock
/// answers first, cheaply: the thread's CPU time is read only once the
/// wall deadline has passed, and it is never ahead of the wall clock.
struct Clock {
    deadline: Cell<Option<Instant>>,
    /// The thread's CPU time when the running call started.
    cpu_started: Cell<Duration>,
    /// The running call's time limit.
    limit: Cell<Duration>,
    /// When the running call's timing started.
    started: Cell<Option<Instant>>,
    /// Time scripts ran since [`Clock::take_spent`] was last called.
    spent: Cell<Duration>,
    /// Set when the handler interrupted the script, so the resulting
    /// exception is reported as a timeout rather than as an error.
    fired: Cell<bool>,
    watch: Arc<Watch>,
}

impl Clock {
    fn new(watch: Arc<Watch>) -> Clock {
        Clock {
            deadline: Cell::new(None),
            cpu_started: Cell::new(Duration::ZERO),
            limit: Cell::new(Duration::ZERO),
            started: Cell::new(None),
            spent: Cell::new(Duration::ZERO),
            fired: Cell::new(false),
            watch,
        }
    }

    fn arm(&self, limit: Duration) {
        self.fired.set(false);
        let now = Instant::now();
        let cpu = this_thread_cpu();
        let deadline = now.checked_add(limit);
        self.started.set(Some(now));
        self.cpu_started.set(cpu);
        self.limit.set(limit);
        self.deadline.set(deadline);
        self.watch.arm(deadline, cpu);
    }

    /// Ends the call's timing; true when it ran past its limit, which a
    /// call can only do without being interrupted when its last steps ran
    /// in a built-in that does not poll the interrupt handler.
    fn disarm(&self) -> bool {
        self.watch.disarm();
        let now = Instant::now();
        if let Some(started) = self.started.take() {
            self.spent
                .set(self.spent.get() + now.saturating_duration_since(started));
        }
        self.deadline
            .take()
            .is_some_and(|deadline| now > deadline && self.ran_past_limit())
    }

    /// Whether the running call's thread has run longer than its limit.
    fn ran_past_limit(&self) -> bool {
        this_thread_cpu().saturating_sub(self.cpu_started.get()) >= self.limit.get()
    }

    /// The time scripts ran since the last call of this (the items of a
    /// job are charged with it when they hit a limit).
    fn take_spent(&self) -> Duration {
        self.spent.replace(Duration::ZERO)
    }

    /// The interrupt handler: QuickJS polls it every few thousand
    /// instructions, so the check must stay this cheap.
    fn expired(&self) -> bool {
        match self.deadline.get() {
            Some(deadline) if Instant::now() >= deadline && self.ran_past_limit() => {
                self.fired.set(true);
                true
            }
            _ => false,
        }
    }
}

/// A script compiled into its own context, with its entry points looked up
/// once instead of on every call.
struct Compiled {
    // The persistent values are declared before the context so that they
    // are freed first.
    /// Values of the context taken before the script ran, so a script that
    /// shadows a global cannot change how weft talks to it.
    handles: Handles,
    kind: ScriptKind,
    context: Context,
}

/// What `load` keeps of a context for its calls.
struct Handles {
    /// Runs the script's top level afresh and returns its
    /// `[decodeUplink, convert]`; see the module doc.
    fresh: Option<Persistent<Function<'static>>>,
    /// Deletes the globals codec calls added.
    reset: Option<Persistent<Function<'static>>>,
    /// Builds `decodeUplink`'s input from (bytes, fPort, recvTime ms) with
    /// the real `Date`; see [`INPUT_MAKER`].
    make_input: Persistent<Function<'static>>,
    /// `Object.prototype`, which tells plain objects from others when
    /// results are converted.
    object_prototype: Persistent<Object<'static>>,
}

/// A cache slot: a compiled script, or the error its top level ended in
/// (remembered so a broken codec is not recompiled for every uplink).
enum Cached {
    Ready(Box<Compiled>),
    Broken(CodecError),
}

struct Entry {
    source: Arc<str>,
    last_used: u64,
    slot: Cached,
}

/// A worker's runtime and everything compiled in it.
struct Sandbox {
    limits: Limits,
    // Declared before the runtime so that cached contexts are freed first.
    cache: HashMap<u64, Entry>,
    clock: Rc<Clock>,
    runtime: Runtime,
    /// Bytes the runtime holds, kept by its allocator.
    meter: Rc<Meter>,
    /// The memory limit last set on the runtime.
    memory_limit: Cell<usize>,
    /// Monotonic use counter for LRU eviction.
    uses: u64,
}

impl Sandbox {
    fn new(limits: Limits, watch: Arc<Watch>) -> rquickjs::Result<Sandbox> {
        let (allocator, meter) = MeteredAllocator::new(Arc::clone(&watch));
        let runtime = Runtime::new_with_alloc(allocator)?;
        let clock = Rc::new(Clock::new(watch));
        let handler_clock = Rc::clone(&clock);
        runtime.set_interrupt_handler(Some(Box::new(move || handler_clock.expired())));
        // QuickJS reads 0 as "no limit", which would let recursion overflow
        // the thread's stack; never go below a small floor.
        runtime.set_max_stack_size(limits.stack.max(MIN_STACK));
        let sandbox = Sandbox {
            limits,
            cache: HashMap::new(),
            clock,
            runtime,
            meter,
            memory_limit: Cell::new(0),
            uses: 0,
        };
        sandbox.update_memory_limit();
        Ok(sandbox)
    }

    /// Replaces the runtime and drops every compiled script: the way back to
    /// a known-good state after the heap ran out.
    fn rebuild(&mut self) {
        match Sandbox::new(self.limits.clone(), Arc::clone(&self.clock.watch)) {
            Ok(fresh) => *self = fresh,
            Err(error) => {
                // Keep the old runtime without its contexts; it is still usable.
                tracing::error!(%error, "could not recreate a QuickJS runtime after running out of memory");
                self.cache.clear();
                self.runtime.run_gc();
                self.update_memory_limit();
            }
        }
    }

    /// The memory limit counts only what scripts allocate while they run:
    /// what the cached contexts hold (read after each compile and eviction,
    /// not per call) is added on top.
    fn update_memory_limit(&self) {
        let limit = self.meter.held().saturating_add(self.limits.memory);
        self.memory_limit.set(limit);
        self.runtime.set_memory_limit(limit);
    }

    /// Whether the call that just failed came close enough to the memory
    /// limit that QuickJS may have had no room left for an error object.
    fn exhausted(&self) -> bool {
        self.meter.peak().saturating_add(EXHAUSTED_MARGIN) >= self.memory_limit.get()
    }

    /// Runs one item of a job.
    fn run(&mut self, item: Item) -> Result<Answer, CodecError> {
        match item {
            Item::Check(script) => self
                .prepare(&script)
                .and_then(|()| self.ready(script.id))
                .map(|compiled| Answer::Kind(compiled.kind)),
            Item::Call(call) => self.call(call).map(Answer::Value),
        }
    }

    /// Runs one call under the time limit, then repairs the worker if the
    /// call hit a limit.
    fn call(&mut self, call: Call) -> Result<serde_json::Value, CodecError> {
        let id = call.script().id;
        self.prepare(call.script())?;
        let compiled = self.ready(id)?;
        let limit = self.limits.time;
        let clock = &self.clock;
        self.meter.reset_peak();
        clock.arm(limit);
        let result = compiled.context.with(|ctx| {
            invoke(&ctx, &compiled.handles, call)
                .map_err(|fault| fault.into_error(&ctx, clock, limit, self.exhausted()))
        });
        // A result that came after the limit is no result: the limit
        // bounds everything a call runs.
        let result = match (clock.disarm(), result) {
            (true, Ok(_)) => Err(CodecError::Timeout(limit)),
            (_, result) => result,
        };
        if let Err(CodecError::OutOfMemory | CodecError::Timeout(_)) = result {
            self.evict(id);
        }
        result
    }

    /// Makes sure `script` is in the cache, compiling it on a miss, and
    /// marks it as just used.
    fn prepare(&mut self, script: &Script) -> Result<(), CodecError> {
        self.uses += 1;
        match self.cache.get_mut(&script.id) {
            Some(entry) if same_source(&entry.source, &script.source) => {
                entry.last_used = self.uses;
            }
            _ => {
                let slot = self.compile(script)?;
                self.insert(script, slot);
            }
        }
        Ok(())
    }

    /// The cached compiled script `id`, or the error its loading ended in.
    fn ready(&self, id: u64) -> Result<&Compiled, CodecError> {
        match self.cache.get(&id).map(|entry| &entry.slot) {
            Some(Cached::Ready(compiled)) => Ok(compiled),
            Some(Cached::Broken(error)) => Err(error.clone()),
            None => Err(CodecError::Stopped),
        }
    }

    /// Compiles `script` into a fresh context and runs its top level.
    /// Returns the slot to cache, or an error that must not be cached
    /// (a limit was hit, and the worker has been repaired).
    fn compile(&mut self, script: &Script) -> Result<Cached, CodecError> {
        let context = match Context::full(&self.runtime) {
            Ok(context) => context,
            Err(_) => {
                self.rebuild();
                return Err(CodecError::OutOfMemory);
            }
        };
        let limit = self.limits.time;
        let clock = &self.clock;
        self.meter.reset_peak();
        clock.arm(limit);
        let result = context.with(|ctx| {
            load(&ctx, &script.source)
                .map_err(|fault| fault.into_compile_error(&ctx, clock, limit, self.exhausted()))
        });
        let result = match (clock.disarm(), result) {
            (true, Ok(_)) => Err(CodecError::Timeout(limit)),
            (_, result) => result,
        };
        match result {
            Ok((handles, kind)) => Ok(Cached::Ready(Box::new(Compiled {
                handles,
                kind,
                context,
            }))),
            Err(error @ (CodecError::Compile { .. } | CodecError::Exception { .. })) => {
                Ok(Cached::Broken(error))
            }
            Err(error) => {
                drop(context);
                self.runtime.run_gc();
                Err(error)
            }
        }
    }

    fn insert(&mut self, script: &Script, slot: Cached) {
        if self.cache.len() >= CACHE_CAPACITY && !self.cache.contains_key(&script.id) {
            let oldest = self
                .cache
                .iter()
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                self.cache.remove(&id);
            }
        }
        self.cache.insert(
            script.id,
            Entry {
                source: Arc::clone(&script.source),
                last_used: self.uses,
                slot,
            },
        );
        self.update_memory_limit();
    }

    fn evict(&mut self, id: u64) {
        if self.cache.remove(&id).is_some() {
            self.runtime.run_gc();
            self.update_memory_limit();
        }
    }
}

/// Cache hits compare the source too, so a hash collision can never run one
/// script's code for another. The pointer check makes the common case free.
fn same_source(cached: &Arc<str>, wanted: &Arc<str>) -> bool {
    Arc::ptr_eq(cached, wanted) || cached == wanted
}

/// Runs the prelude and the script's top level in a fresh context, then
/// finds the entry points it defined.
fn load<'js>(ctx: &Ctx<'js>, source: &str) -> Result<(Handles, ScriptKind), Fault> {
    let globals = ctx.globals();
    let make_input: Function = ctx
        .eval::<Function, _>(INPUT_MAKER)?
        .call((globals.get::<_, Value>("Date")?,))?;
    let object: Object = globals.get("Object")?;
    let object_prototype: Object = object.get("prototype")?;
    ctx.eval::<(), _>(PRELUDE)?;
    let install = Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>| -> rquickjs::Result<Value<'js>> {
            ctx.eval::<Function, _>(BUFFER)?.call(())
        },
    )?;
    ctx.eval::<Function, _>(LAZY_BUFFER)?
        .call::<_, ()>((globals.clone(), install))?;
    let mut options = EvalOptions::default();
    // Vendor codecs are written for sloppy mode (undeclared variables,
    // `arguments.callee`); TTN's and ChirpStack's runners accept them.
    options.strict = false;
    options.backtrace_barrier = true;
    options.filename = Some(FILE_NAME.to_string());
    ctx.eval_with_options::<(), _>(source.as_bytes(), options)?;

    let function = |name: &str| -> Result<Option<Function<'js>>, Fault> {
        let value: Value = globals.get(name)?;
        Ok(value.into_function())
    };
    let kind = if function("decodeUplink")?.is_some() || function("Decoder")?.is_some() {
        ScriptKind::DecodeUplink
    } else if function("convert")?.is_some() {
        ScriptKind::Convert
    } else if function("encodeDownlink")?.is_some() || function("Encoder")?.is_some() {
        ScriptKind::EncodeDownlink
    } else if function("evaluate")?.is_some() {
        ScriptKind::Evaluate
    } else {
        ScriptKind::Unknown
    };
    // A codec also becomes the body of a function its calls run afresh.
    // It compiled as a script, so it compiles as a body (a top-level
    // `return` would have failed above).
    let codec = matches!(
        kind,
        ScriptKind::DecodeUplink | ScriptKind::Convert | ScriptKind::EncodeDownlink
    );
    let (fresh, reset) = if codec {
        let mut wrapped = String::with_capacity(source.len() + 160);
        wrapped.push_str(FRESH_OPEN);
        wrapped.push_str(source);
        wrapped.push_str(FRESH_CLOSE);
        let mut options = EvalOptions::default();
        options.strict = false;
        options.backtrace_barrier = true;
        options.filename = Some(FILE_NAME.to_string());
        let fresh: Function = ctx.eval_with_options(wrapped.into_bytes(), options)?;
        let reset: Function = ctx
            .eval::<Function, _>(GLOBALS_RESET)?
            .call((globals.clone(),))?;
        (
            Some(Persistent::save(ctx, fresh)),
            Some(Persistent::save(ctx, reset)),
        )
    } else {
        (None, None)
    };
    let handles = Handles {
        fresh,
        reset,
        make_input: Persistent::save(ctx, make_input),
        object_prototype: Persistent::save(ctx, object_prototype),
    };
    Ok((handles, kind))
}

/// Runs one call in its script's context and returns the result as JSON.
/// The Things Stack's codec calls render `undefined` properties as
/// `null`, as its engine does; sensae's `convert` and rules keep JSON's
/// rules.
fn invoke<'js>(ctx: &Ctx<'js>, handles: &Handles, call: Call) -> Result<serde_json::Value, Fault> {
    let object_prototype = handles.object_prototype.clone().restore(ctx)?;
    let result = |returned: Value<'js>, undefined| {
        convert::to_json(ctx, returned, &object_prototype, undefined).map_err(|fault| match fault {
            // A value JSON cannot express (a cycle, a BigInt) is the script's
            // output being wrong, not the script failing.
            Fault::Js(rquickjs::Error::Exception) => Fault::Output,
            other => other,
        })
    };
    let codec = |returned| result(returned, Undefined::Null);
    let (call, given) = call.into_parts();
    // ChirpStack's `input.variables`: the device's, or an empty object.
    let variables = || -> serde_json::Value {
        let map = given
            .iter()
            .flat_map(|variables| variables.iter())
            .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
            .collect();
        serde_json::Value::Object(map)
    };
    match call {
        Call::DecodeUplink {
            bytes,
            f_port,
            recv_time_ms,
            ..
        } => {
            let defined = fresh_entry_points(ctx, handles)?;
            let make_input = handles.make_input.clone().restore(ctx)?;
            let variables = match &given {
                None => Value::new_undefined(ctx.clone()),
                Some(_) => convert::to_js(ctx, &variables())?,
            };
            let input =
                convert::uplink_input(ctx, &bytes, f_port, recv_time_ms, variables, &make_input)?;
            if let Some(decode) = entry(&defined, EntryPoint::DecodeUplink)? {
                return codec(decode.call((input,))?);
            }
            // TTN v2: `Decoder(bytes, port)` returns the data itself.
            let decoder = required(&defined, EntryPoint::Decoder, EntryPoint::DecodeUplink)?;
            let input = input.as_object().ok_or(Fault::Output)?;
            let returned: Value = decoder.call((
                input.get::<_, Value>("bytes")?,
                input.get::<_, Value>("fPort")?,
            ))?;
            Ok(serde_json::json!({ "data": codec(returned)? }))
        }
        Call::EncodeDownlink { data, f_port, .. } => {
            let defined = fresh_entry_points(ctx, handles)?;
            if let Some(encode) = entry(&defined, EntryPoint::EncodeDownlink)? {
                let mut input = serde_json::json!({ "data": data, "variables": variables() });
                if let Some(port) = f_port {
                    input["fPort"] = port.into();
                }
                return codec(encode.call((convert::to_js(ctx, &input)?,))?);
            }
            // TTN v2: `Encoder(object, port)` returns the bytes themselves.
            let encoder = required(&defined, EntryPoint::Encoder, EntryPoint::EncodeDownlink)?;
            let port = f_port.unwrap_or(LEGACY_DEFAULT_PORT);
            let returned: Value = encoder.call((convert::to_js(ctx, &data)?, port))?;
            Ok(serde_json::json!({ "bytes": codec(returned)?, "fPort": port }))
        }
        Call::DecodeDownlink { bytes, f_port, .. } => {
            let defined = fresh_entry_points(ctx, handles)?;
            let decode = required(
                &defined,
                EntryPoint::DecodeDownlink,
                EntryPoint::DecodeDownlink,
            )?;
            let input =
                serde_json::json!({ "bytes": bytes, "fPort": f_port, "variables": variables() });
            codec(decode.call((convert::to_js(ctx, &input)?,))?)
        }
        Call::Convert { input, .. } => {
            let defined = fresh_entry_points(ctx, handles)?;
            let convert = required(&defined, EntryPoint::Convert, EntryPoint::Convert)?;
            // sensae's converters ran under Node: JSON's rules, `undefined`
            // members dropped.
            result(
                convert.call((convert::to_js(ctx, &input)?,))?,
                Undefined::Omit,
            )
        }
        // `into_parts` above unwrapped it.
        Call::WithVariables { .. } => Err(Fault::Codec(CodecError::Stopped)),
        Call::Function { name, args, .. } => {
            let value: Value = ctx.globals().get(name.as_str())?;
            let Some(function) = value.into_function() else {
                return Err(Fault::Codec(CodecError::MissingFunction(name)));
            };
            let mut js_args = rquickjs::function::Args::new(ctx.clone(), args.len());
            for arg in &args {
                js_args.push_arg(convert::to_js(ctx, arg)?)?;
            }
            result(function.call_arg(js_args)?, Undefined::Omit)
        }
    }
}

/// Deletes the globals earlier codec calls added (before the call, so a
/// call that threw is cleaned up too), runs the codec's top level afresh
/// and returns the entry points it defined ([`FRESH_CLOSE`]). A script
/// that is no codec (a rule) has none: every codec call on it then names
/// the function it lacks.
fn fresh_entry_points<'js>(
    ctx: &Ctx<'js>,
    handles: &Handles,
) -> Result<Option<rquickjs::Array<'js>>, Fault> {
    let Some(fresh) = &handles.fresh else {
        return Ok(None);
    };
    reset_globals(ctx, handles)?;
    let fresh = fresh.clone().restore(ctx)?;
    Ok(Some(fresh.call(())?))
}

/// The entry point `which` among those a fresh run defined, if it did.
fn entry<'js>(
    defined: &Option<rquickjs::Array<'js>>,
    which: EntryPoint,
) -> Result<Option<Function<'js>>, Fault> {
    let Some(defined) = defined else {
        return Ok(None);
    };
    let value: Value = defined.get(which as usize)?;
    Ok(value.into_function())
}

/// The entry point `which`, or the error naming `named`, the function the
/// caller asked for (`decodeUplink` when neither it nor `Decoder` exists).
fn required<'js>(
    defined: &Option<rquickjs::Array<'js>>,
    which: EntryPoint,
    named: EntryPoint,
) -> Result<Function<'js>, Fault> {
    entry(defined, which)?
        .ok_or_else(|| Fault::Codec(CodecError::MissingFunction(named.name().to_string())))
}

/// Deletes the globals codec calls added since the script was compiled.
fn reset_globals(ctx: &Ctx<'_>, handles: &Handles) -> Result<(), Fault> {
    if let Some(reset) = &handles.reset {
        let reset = reset.clone().restore(ctx)?;
        reset.call::<_, ()>(())?;
    }
    Ok(())
}

/// A failure inside a context, turned into a [`CodecError`] while the
/// context (and its pending exception) is still at hand.
pub(crate) enum Fault {
    /// QuickJS reported an error; a thrown exception is pending in the context.
    Js(rquickjs::Error),
    /// The returned value could not be turned into JSON; the exception
    /// explaining why is pending in the context.
    Output,
    /// Already decided.
    Codec(CodecError),
}

impl From<rquickjs::Error> for Fault {
    fn from(error: rquickjs::Error) -> Fault {
        Fault::Js(error)
    }
}

impl From<CodecError> for Fault {
    fn from(error: CodecError) -> Fault {
        Fault::Codec(error)
    }
}

impl Fault {
    /// `exhausted`: the call came near the memory limit, so a thrown
    /// `null` means QuickJS ran out of memory (see [`EXHAUSTED_MARGIN`]).
    fn into_error(
        self,
        ctx: &Ctx<'_>,
        clock: &Clock,
        limit: Duration,
        exhausted: bool,
    ) -> CodecError {
        let (error, output) = match self {
            Fault::Codec(error) => return error,
            Fault::Js(error) => (error, false),
            Fault::Output => (rquickjs::Error::Exception, true),
        };
        // Always take the pending exception, so it cannot leak into the
        // next call on this context.
        let thrown = match error {
            rquickjs::Error::Exception => Some(ctx.catch()),
            _ => None,
        };
        if clock.fired.get() {
            return CodecError::Timeout(limit);
        }
        let described = match (thrown, error) {
            (Some(thrown), _) => convert::describe_thrown(ctx, thrown, exhausted),
            (None, rquickjs::Error::Allocation) => CodecError::OutOfMemory,
            (None, other) => CodecError::Exception {
                message: other.to_string(),
                stack: None,
            },
        };
        match described {
            CodecError::Exception { message, .. } if output => CodecError::InvalidOutput(format!(
                "the returned value cannot be converted to JSON: {message}"
            )),
            other => other,
        }
    }

    /// Like `into_error`, but the parser's `SyntaxError` is a compile error
    /// with the line it points at. (A `SyntaxError` the top level throws
    /// while running, say from `JSON.parse`, stays an exception.)
    fn into_compile_error(
        self,
        ctx: &Ctx<'_>,
        clock: &Clock,
        limit: Duration,
        exhausted: bool,
    ) -> CodecError {
        match self.into_error(ctx, clock, limit, exhausted) {
            CodecError::Exception { message, stack } if message.starts_with("SyntaxError") => {
                match stack.as_deref().and_then(parser_position) {
                    Some(line) => CodecError::Compile {
                        message,
                        line: Some(line),
                    },
                    None => CodecError::Exception { message, stack },
                }
            }
            other => other,
        }
    }
}

/// The line of a parser error, whose stack is the bare position
/// `    at script.js:3:5` with no function frame.
fn parser_position(stack: &str) -> Option<u32> {
    let first = stack.lines().next()?.trim();
    let rest = first.strip_prefix("at ")?.strip_prefix(FILE_NAME)?;
    let digits: String = rest
        .strip_prefix(':')?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    /// Spins this thread for `d` of CPU time.
    fn spin(d: Duration) {
        let started = this_thread_cpu();
        let mut x = 0u64;
        while this_thread_cpu().saturating_sub(started) < d {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    /// A call is timed by the CPU time its thread runs: a thread that
    /// waits past the wall deadline (a loaded machine, a CPU quota) has
    /// not run out of time; one that runs past its limit has.
    #[test]
    fn a_call_is_timed_by_the_cpu_time_it_runs() {
        let clock = Clock::new(Watch::new(Instant::now()));
        let limit = Duration::from_millis(40);
        clock.arm(limit);
        std::thread::sleep(limit * 2);
        assert!(!clock.expired(), "expired while waiting, not running");
        spin(limit / 4);
        assert!(!clock.disarm(), "over its limit after a quarter of it");

        clock.arm(limit);
        std::thread::sleep(limit);
        spin(limit + Duration::from_millis(5));
        assert!(clock.expired(), "ran past its limit, not interrupted");
        assert!(clock.disarm());
    }
}
