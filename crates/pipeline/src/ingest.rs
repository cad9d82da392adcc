//! The ingest consumer: ingest log → decode → process → enrich → store →
//! publish.
//!
//! - [`Ingest::accept`] is the only way in: it appends an uplink to the
//!   durable ingest log and returns once it has committed (the HTTP 202).
//! - A consumer task tails the log from its stored cursor in two stages:
//!   the reader decodes a batch ([`decode`]) while the committer stores the
//!   previous one together with the new cursor, then publishes the units
//!   that were new on the bus. A crash between the two replays the batch;
//!   `dataId` uniqueness makes the replay store nothing twice.
//! - The committer hands the stored units to the [`rules`] engine, which
//!   evaluates alarm rules on them and keeps the alarms.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Event, Payload, Stream};
use weft_engine::Engine;
use weft_model::{FailedUplink, NewUplink, Uplink, UplinkFormat};
use weft_store::{ProcessedBatch, Store, StoreError, UnitRecord};

use crate::balance::WorkCounts;
use crate::catalog::Catalog;
use crate::decode::{self, Produced};
use crate::partitions::partition_cursors;
use crate::{context, rules};

/// The consumer name under which the pipeline's log cursor is stored.
pub const CONSUMER: &str = "pipeline";

/// Tuning of the ingest consumer; the defaults carry the seed workloads.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Most log entries decoded and committed as one batch. Larger batches
    /// amortise commits under load; under light load batches are as small
    /// as what has arrived, so latency does not wait for a full batch.
    pub batch_size: usize,
    /// Most accepted-but-unprocessed uplinks before `accept` answers
    /// `Overloaded` (503): the log is durable, but a backlog this deep
    /// means the consumer cannot keep up and clients should back off.
    pub max_backlog: u64,
    /// Processed log entries older than this are pruned.
    pub log_retention: Duration,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            batch_size: 1024,
            max_backlog: 500_000,
            log_retention: Duration::from_secs(3600),
        }
    }
}

/// Why an uplink was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// Too much is queued; retry later (503 + Retry-After).
    #[error("weft is overloaded; retry later")]
    Overloaded,
    /// The store failed (500).
    #[error(transparent)]
    Store(StoreError),
    /// The device the uplink names lies outside the pins of the ingest key
    /// it came with (403): nothing was stored.
    #[error("{0}")]
    Forbidden(String),
}

/// The ingest consumer: the way uplinks come in ([`Ingest::accept`]) and
/// the task that turns the ingest log into data units, entities and bus
/// events. It holds only what that path uses; the API reaches it through
/// [`crate::Services`].
pub struct Ingest {
    /// Where the log, the units and the cursor are kept.
    store: Arc<dyn Store>,
    /// Where stored units are published for live subscribers.
    bus: Arc<dyn Bus>,
    /// Runs the device types' codecs.
    engine: Engine,
    /// Device types and devices, read on every uplink.
    catalog: Arc<Catalog>,
    /// The entities device data updates.
    context: Arc<context::Context>,
    /// Fed the units each batch stored, to evaluate alarm rules on.
    rules: Arc<rules::RuleEngine>,
    /// When the entities changed by device data were last stored.
    entities_flushed: parking_lot::Mutex<std::time::Instant>,
    /// `dataId`s of units decoded but not yet committed. A resend of one of
    /// them is a duplicate before the store can know it; an id leaves the
    /// set only once its unit is committed, and so findable in the store.
    in_flight: parking_lot::Mutex<HashSet<String>>,
    config: IngestConfig,
    /// Next log `seq` the committer has not yet stored (everything below
    /// is processed).
    processed: Arc<AtomicU64>,
    /// Whether the consumer runs on this node now for every partition
    /// (then `processed` is its own position; otherwise it is read from
    /// the store, see [`Ingest::follow_cursor`]).
    runs_all: std::sync::atomic::AtomicBool,
    /// How many partitions the pipeline is split into (the store's).
    partitions: u16,
    /// How many times the consumer was started here: every start after
    /// the first is a takeover.
    runs: AtomicU64,
    /// Uplinks read here, by partition: the load the cluster shares the
    /// partitions by ([`crate::balance`]).
    work_counts: Arc<WorkCounts>,
}

/// A decoded batch on its way from the reader to the committer.
struct Decoded {
    batch: Arc<ProcessedBatch>,
    /// The entity changes its units make, announced once it is committed.
    changes: Vec<context::PendingChange>,
}

/// How often a consumer whose partitions got nothing new stores how far it
/// read.
const IDLE_CURSOR_INTERVAL: Duration = Duration::from_secs(1);

/// What a run of the consumer reads: its partitions and their cursors.
struct Reading {
    /// The partitions read, when not all of them.
    filter: Option<Arc<[u16]>>,
    /// Partition → its stored cursor, while some partition's is ahead of
    /// where reading starts (entries below it are skipped).
    floors: std::collections::HashMap<u16, u64>,
    /// The cursors a batch moves: one per partition read.
    consumers: Vec<(u16, String)>,
    /// The partitions' entities cursors.
    entity_cursors: Vec<String>,
}

impl Reading {
    /// An empty batch moving the cursors to `next_seq` (never back: a
    /// partition whose cursor is further keeps it).
    fn batch(&self, next_seq: u64) -> Decoded {
        let consumers = self
            .consumers
            .iter()
            .filter(|(p, _)| self.floors.get(p).is_none_or(|f| *f <= next_seq))
            .map(|(_, name)| name.clone())
            .collect();
        Decoded {
            batch: Arc::new(ProcessedBatch {
                consumers,
                entity_cursors: self.entity_cursors.clone(),
                next_seq,
                ..ProcessedBatch::default()
            }),
            changes: Vec::new(),
        }
    }
}

/// The cluster's position in the log: the least cursor of all
/// `partitions` (everything below it is processed, whichever node did it).
async fn cluster_cursor(store: &dyn Store, partitions: u16) -> Result<u64, StoreError> {
    let all: Vec<u16> = (0..partitions.max(1)).collect();
    Ok(partition_cursors(store, CONSUMER, &all)
        .await?
        .into_values()
        .min()
        .unwrap_or(1))
}

/// How often entities changed by device data are stored (in bulk, with a
/// pipeline batch). Between two writes a crash loses nothing: the units
/// stored since are applied again at start ([`crate::Services::start`]).
pub const ENTITY_FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// Capacity of the reader → committer queue: two batches, so decoding the
/// next batch overlaps with committing the current one and no more.
const STAGE_QUEUE: usize = 2;

impl Ingest {
    /// Reads where the consumer stopped (its cursor) and builds it on the
    /// services it feeds; [`Ingest::run`] then runs it. Two steps, so
    /// the wiring ([`crate::Services::start`]) decides when the consumer
    /// starts: last, once everything it feeds is running.
    pub async fn load(
        store: Arc<dyn Store>,
        bus: Arc<dyn Bus>,
        engine: Engine,
        catalog: Arc<Catalog>,
        context: Arc<context::Context>,
        rules: Arc<rules::RuleEngine>,
        config: IngestConfig,
    ) -> Result<Arc<Ingest>, StoreError> {
        let partitions = store.partitions();
        let cursor = cluster_cursor(&*store, partitions).await?;
        Ok(Arc::new(Ingest {
            store,
            bus,
            engine,
            catalog,
            context,
            rules,
            entities_flushed: parking_lot::Mutex::new(std::time::Instant::now()),
            in_flight: parking_lot::Mutex::new(HashSet::new()),
            config,
            processed: Arc::new(AtomicU64::new(cursor)),
            runs_all: Default::default(),
            partitions,
            runs: AtomicU64::new(0),
            work_counts: WorkCounts::new(partitions),
        }))
    }

    /// The uplinks read here so far, by partition.
    pub fn work_counts(&self) -> Arc<WorkCounts> {
        self.work_counts.clone()
    }

    /// How many partitions the pipeline is split into.
    pub fn partition_count(&self) -> u16 {
        self.partitions
    }

    /// Runs the consumer on the log entries of `partitions` from their
    /// stored cursors until `stop` is cancelled: at once when the node
    /// gave partitions up or lost them (another node goes on from the
    /// stored cursors), or, when `shutdown` is what cancelled it, after
    /// processing what was committed by then. Run again each time the
    /// partitions this node holds change ([`crate::cluster`]); on a
    /// takeover the units stored after the last bulk write of entities of
    /// these partitions are applied to this node's entities first.
    pub async fn run(
        self: Arc<Self>,
        partitions: Arc<[u16]>,
        stop: CancellationToken,
        shutdown: CancellationToken,
    ) {
        let floors = loop {
            match partition_cursors(&*self.store, CONSUMER, &partitions).await {
                Ok(floors) => break floors,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the pipeline's cursor failed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        };
        let cursor = floors.values().copied().min().unwrap_or(1);
        let all = partitions.len() >= usize::from(self.partitions);
        if self.runs.fetch_add(1, Ordering::Relaxed) > 0 {
            if let Err(e) = crate::partitions::replay_units_into_context(
                &self.store,
                &self.catalog,
                &self.context,
                &partitions,
            )
            .await
            {
                tracing::warn!(error = %e, "applying the previous holder's last units to the entities failed");
            }
        }
        self.in_flight.lock().clear();
        if all {
            self.processed.store(cursor, Ordering::Relaxed);
        }
        let reading = Reading {
            filter: (!all).then(|| partitions.clone()),
            floors,
            consumers: partitions
                .iter()
                .map(|&p| (p, weft_store::partition_cursor(CONSUMER, p)))
                .collect(),
            entity_cursors: partitions
                .iter()
                .map(|&p| weft_store::partition_cursor(weft_store::ENTITIES_CURSOR, p))
                .collect(),
        };
        let (tx, rx) = mpsc::channel(STAGE_QUEUE);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let stages = self.clone();
        // The pipeline runs on a thread and runtime of its own. On the
        // shared runtime its many short hops (read pool, engine, writer)
        // would each wait behind every ready HTTP connection task, which
        // under load adds tens of milliseconds per batch; here the OS
        // scheduler gives it its turn directly.
        let spawned = std::thread::Builder::new()
            .name("weft-pipeline".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the pipeline's runtime starts");
                runtime.block_on(async move {
                    let reader = tokio::spawn(stages.clone().read_loop(
                        cursor,
                        reading,
                        tx,
                        stop.clone(),
                        shutdown,
                    ));
                    let committer = tokio::spawn(stages.clone().commit_loop(rx, all));
                    let pruner = tokio::spawn(stages.prune_loop(stop));
                    let _ = tokio::join!(reader, committer, pruner);
                });
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = done_rx.await;
            }
            Err(e) => tracing::error!(error = %e, "starting the pipeline thread failed"),
        }
    }

    /// Keeps [`Ingest::backlog`] true on a node that does not run every
    /// partition of the consumer (other nodes hold some or all): the
    /// cluster's position, the least of the partitions' cursors, is read
    /// from the store every second while `runs_all` says it is not all
    /// here, so this node's 503s reflect the cluster's backlog.
    pub async fn follow_cursor(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if self.runs_all.load(Ordering::Relaxed) {
                continue;
            }
            if let Ok(cursor) = cluster_cursor(&*self.store, self.partitions).await {
                if !self.runs_all.load(Ordering::Relaxed) {
                    self.processed.store(cursor, Ordering::Relaxed);
                }
            }
        }
    }

    /// Durably appends an uplink to the ingest log, in the partition of
    /// the device it names; `Ok` means it is committed and will be
    /// processed, even across a crash.
    pub async fn accept(&self, mut uplink: NewUplink) -> Result<u64, AcceptError> {
        if self.partitions > 1 || !uplink.pins.is_empty() {
            let device = crate::uplink::device_key(&uplink, None);
            self.check_pins(&uplink, device.as_deref())?;
            uplink.partition =
                weft_model::uplink::partition_of(&device.unwrap_or_default(), self.partitions);
        }
        self.append(uplink).await
    }

    /// [`Ingest::accept`] for an uplink whose body the caller has already
    /// parsed (`body`), so that it is not parsed again to find its device.
    pub async fn accept_parsed(
        &self,
        mut uplink: NewUplink,
        body: &Value,
    ) -> Result<u64, AcceptError> {
        if self.partitions > 1 || !uplink.pins.is_empty() {
            let device = crate::uplink::device_key(&uplink, Some(body));
            self.check_pins(&uplink, device.as_deref())?;
            uplink.partition =
                weft_model::uplink::partition_of(&device.unwrap_or_default(), self.partitions);
        }
        self.append(uplink).await
    }

    /// Refuses an uplink whose device — as its transport or envelope names
    /// it, before any decoding — is registered outside the pins of the
    /// ingest key it came with. What only decoding tells is checked by the
    /// consumer ([`decode`]), which fails the uplink then.
    fn check_pins(&self, uplink: &NewUplink, device: Option<&str>) -> Result<(), AcceptError> {
        if uplink.pins.is_empty() {
            return Ok(());
        }
        let Some(known) = device.and_then(|d| self.catalog.device(d)) else {
            return Ok(());
        };
        match uplink.pins.refusal(&known) {
            Some(why) => {
                metrics::counter!("weft_uplinks_rejected_total", "reason" => "pins").increment(1);
                Err(AcceptError::Forbidden(why))
            }
            None => Ok(()),
        }
    }

    /// Appends an uplink whose partition is set, unless the backlog is
    /// too deep.
    async fn append(&self, uplink: NewUplink) -> Result<u64, AcceptError> {
        let committed = *self.store.committed_seq().borrow();
        let processed = self.processed.load(Ordering::Relaxed);
        if committed.saturating_add(1).saturating_sub(processed) > self.config.max_backlog {
            metrics::counter!("weft_uplinks_rejected_total", "reason" => "backlog").increment(1);
            return Err(AcceptError::Overloaded);
        }
        match self.store.append_uplink(uplink).await {
            Ok(seq) => {
                metrics::counter!("weft_uplinks_accepted_total").increment(1);
                Ok(seq)
            }
            Err(StoreError::Overloaded) => {
                metrics::counter!("weft_uplinks_rejected_total", "reason" => "queue").increment(1);
                Err(AcceptError::Overloaded)
            }
            Err(e) => Err(AcceptError::Store(e)),
        }
    }

    /// Runs a sample uplink of type `type_name` through decode and process
    /// without storing or registering anything (the `decode` dry run). A
    /// body with `payload` or `bytes` is treated as encoded, otherwise as
    /// decoded. It needs no device id. A failure comes with the codec's own
    /// `errors` and `warnings` when it returned errors. `candidate`, a
    /// type entry not saved (see [`crate::catalog::Catalog::candidate`]),
    /// decodes instead of the saved type when given.
    pub async fn dry_run(
        &self,
        type_name: &str,
        channel: Option<String>,
        body: &Value,
        candidate: Option<&Arc<crate::catalog::TypeEntry>>,
    ) -> Result<Produced, (FailedUplink, Option<decode::CodecReport>)> {
        let encoded = body.get("payload").is_some() || body.get("bytes").is_some();
        let uplink = Uplink {
            seq: 0,
            uplink: NewUplink {
                partition: 0,
                received_at: weft_model::now_ms(),
                format: if encoded {
                    UplinkFormat::SensaeEncoded
                } else {
                    UplinkFormat::SensaeDecoded
                },
                channel,
                device_type: Some(type_name.to_string()),
                body: serde_json::to_vec(body).unwrap_or_default(),
                event: None,
                device_id: None,
                source: None,
                pins: Default::default(),
            },
        };
        let mut ignored = Vec::new();
        let mut out = decode::process_reporting_as(
            std::slice::from_ref(&uplink),
            &self.catalog,
            &self.engine,
            &mut ignored,
            false,
            candidate,
        )
        .await;
        let (outcome, report) = out.pop().expect("one outcome per uplink");
        outcome.map_err(|failed| (failed, report))
    }

    /// Accepted uplinks not yet processed.
    pub fn backlog(&self) -> u64 {
        let committed = *self.store.committed_seq().borrow();
        (committed + 1).saturating_sub(self.processed.load(Ordering::Relaxed))
    }

    /// Reader stage: waits for committed log entries past `next`, decodes
    /// them in batches and hands them to the committer. Ends at once when
    /// `stop` is cancelled alone (the lease was lost); at `shutdown`, once
    /// what was committed by then is read.
    async fn read_loop(
        self: Arc<Self>,
        mut next: u64,
        mut reading: Reading,
        tx: mpsc::Sender<Decoded>,
        stop: CancellationToken,
        shutdown: CancellationToken,
    ) {
        self.runs_all
            .store(reading.filter.is_none(), Ordering::Relaxed);
        let mut committed = self.store.committed_seq();
        let mut drain_to = None;
        let mut sent_at = std::time::Instant::now();
        loop {
            let mut head = *committed.borrow_and_update();
            if stop.is_cancelled() {
                if !shutdown.is_cancelled() {
                    break;
                }
                head = head.min(*drain_to.get_or_insert(head));
            }
            if head < next {
                if stop.is_cancelled() {
                    break;
                }
                tokio::select! {
                    changed = committed.changed() => if changed.is_err() { break },
                    _ = stop.cancelled() => {}
                }
                continue;
            }
            let read = self
                .store
                .read_uplinks(next, self.config.batch_size, reading.filter.as_deref())
                .await;
            let mut uplinks = match read {
                Ok(u) => u,
                Err(e) => {
                    tracing::error!(error = %e, next, "reading the ingest log failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Some(last) = uplinks.last().map(|u| u.seq) else {
                // Entries below `head` were pruned, never existed or are
                // other partitions': skip ahead. The cursors move with the
                // next batch, or within a second if none comes (so the
                // cluster's backlog and the log's pruning see this
                // partition's position).
                next = head + 1;
                if sent_at.elapsed() >= IDLE_CURSOR_INTERVAL {
                    let batch = reading.batch(next);
                    if tx.send(batch).await.is_err() {
                        break;
                    }
                    sent_at = std::time::Instant::now();
                }
                continue;
            };
            if !reading.floors.is_empty() {
                // A partition whose cursor is ahead of the others' skips
                // what it already processed.
                uplinks.retain(|u| {
                    reading
                        .floors
                        .get(&u.uplink.partition)
                        .is_none_or(|floor| u.seq >= *floor)
                });
                reading.floors.retain(|_, floor| *floor > last + 1);
            }
            for u in &uplinks {
                self.work_counts.add(u.uplink.partition, 1);
            }
            metrics::histogram!("weft_pipeline_batch_size").record(uplinks.len() as f64);
            let started = std::time::Instant::now();
            let batch = self.decode_batch(&uplinks, reading.batch(last + 1)).await;
            metrics::histogram!("weft_pipeline_decode_seconds")
                .record(started.elapsed().as_secs_f64());
            if tx.send(batch).await.is_err() {
                break;
            }
            sent_at = std::time::Instant::now();
            next = last + 1;
        }
        // The entities these partitions changed since their last bulk
        // write go with a last batch: another node may hold the partitions
        // next, and must not find this node's older copies written later.
        let dirty = self.context.take_dirty();
        if !dirty.is_empty() {
            let mut last = reading.batch(next);
            if let Some(batch) = Arc::get_mut(&mut last.batch) {
                batch.entities = dirty;
            }
            let _ = tx.send(last).await;
        }
        self.runs_all.store(false, Ordering::Relaxed);
    }

    async fn decode_batch(&self, uplinks: &[Uplink], empty: Decoded) -> Decoded {
        let mut batch = Arc::into_inner(empty.batch).expect("a new batch is not shared");
        let outcomes = decode::process(
            uplinks,
            &self.catalog,
            &self.engine,
            &mut batch.new_devices,
            true,
        )
        .await;
        let mut entity_types = Vec::new();
        for (outcome, uplink) in outcomes.into_iter().zip(uplinks) {
            match outcome {
                Ok(produced) => {
                    if let Some(event) = produced.event {
                        // Known kinds only as labels: a sender inventing names must not
                        // grow the metrics without bound.
                        let kind = match event.kind() {
                            k @ ("join" | "status" | "ack" | "txack" | "log" | "location"
                            | "integration") => k.to_string(),
                            _ => "other".to_string(),
                        };
                        metrics::counter!("weft_device_events_total", "kind" => kind).increment(1);
                        batch.events.push(event);
                    }
                    for unit in produced.units {
                        let entity_type = self
                            .catalog
                            .device_type(&unit.device.device_type)
                            .and_then(|t| t.def.entity_type.clone())
                            .unwrap_or_else(|| unit.device.device_type.clone());
                        entity_types.push(entity_type);
                        let json = serde_json::to_string(&unit).expect("data units serialise");
                        batch.units.push(UnitRecord {
                            unit: Arc::new(unit),
                            json: json.into(),
                            partition: uplink.uplink.partition,
                        });
                    }
                }
                Err(failure) => {
                    metrics::counter!("weft_uplinks_failed_total", "reason" => failure.reason.as_str())
                        .increment(1);
                    tracing::debug!(
                        seq = failure.seq,
                        reason = failure.reason.as_str(),
                        "{}",
                        failure.description
                    );
                    batch.failures.push(failure);
                }
            }
        }
        self.drop_duplicates(&mut batch.units, &mut entity_types)
            .await;
        let now = weft_model::now_ms();
        let applied = self.context.apply_units(
            batch
                .units
                .iter()
                .map(|r| &*r.unit)
                .zip(entity_types.iter().map(String::as_str)),
            now,
        );
        batch.history = applied.history;
        batch.changes = applied.changes.iter().filter_map(|c| c.log()).collect();
        let mut last_flush = self.entities_flushed.lock();
        if last_flush.elapsed() >= ENTITY_FLUSH_INTERVAL {
            batch.entities = self.context.take_dirty();
            *last_flush = std::time::Instant::now();
        }
        Decoded {
            batch: Arc::new(batch),
            changes: applied.changes,
        }
    }

    /// Drops the units whose `dataId` is already stored, on its way to the
    /// store, or earlier in the same batch: a resent uplink must not touch
    /// the live entity, the history or the socket, so it goes before the
    /// batch reaches the context, not only at its insert. The units kept
    /// join the in-flight set until the committer has stored them.
    async fn drop_duplicates(&self, units: &mut Vec<UnitRecord>, entity_types: &mut Vec<String>) {
        if units.is_empty() {
            return;
        }
        // The in-flight set first, then the store: an id missing from the
        // set is either new or already committed, and then the store has it.
        let mut keep = vec![true; units.len()];
        let mut unknown = Vec::with_capacity(units.len());
        {
            let in_flight = self.in_flight.lock();
            let mut seen = HashSet::with_capacity(units.len());
            for (i, record) in units.iter().enumerate() {
                let id = record.unit.data_id.as_str();
                if in_flight.contains(id) || !seen.insert(id) {
                    keep[i] = false;
                } else {
                    unknown.push(id.to_string());
                }
            }
        }
        let mut delay = Duration::from_millis(5);
        let stored = loop {
            match self.store.stored_data_ids(unknown.clone()).await {
                Ok(stored) => break stored,
                // Shutting down: the batch will not be committed either.
                Err(StoreError::Closed) => break HashSet::new(),
                Err(e) => {
                    tracing::warn!(error = %e, "looking up stored data ids failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        };
        for (i, record) in units.iter().enumerate() {
            if keep[i] && stored.contains(&record.unit.data_id) {
                keep[i] = false;
            }
        }
        let dropped = keep.iter().filter(|k| !**k).count();
        if dropped > 0 {
            metrics::counter!("weft_units_duplicate_total").increment(dropped as u64);
            let mut kept = keep.iter();
            units.retain(|_| *kept.next().unwrap_or(&true));
            let mut kept = keep.iter();
            entity_types.retain(|_| *kept.next().unwrap_or(&true));
        }
        let mut in_flight = self.in_flight.lock();
        in_flight.extend(units.iter().map(|r| r.unit.data_id.clone()));
    }

    /// Committer stage: stores each batch with its cursor, then publishes
    /// the units that were new. Retries store failures: the batch is not
    /// dropped, because the cursor must not move past unstored units.
    async fn commit_loop(self: Arc<Self>, mut rx: mpsc::Receiver<Decoded>, all: bool) {
        while let Some(Decoded { batch, changes }) = rx.recv().await {
            let next_seq = batch.next_seq;
            let mut delay = Duration::from_millis(5);
            let started = std::time::Instant::now();
            let outcome = loop {
                match self.store.commit_processed(Arc::clone(&batch)).await {
                    Ok(outcome) => break Some(outcome),
                    Err(StoreError::Closed) => break None,
                    Err(e) => {
                        tracing::warn!(error = %e, "committing processed uplinks failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                }
            };
            let Some(outcome) = outcome else { break };
            metrics::histogram!("weft_pipeline_commit_seconds")
                .record(started.elapsed().as_secs_f64());
            if started.elapsed() > Duration::from_millis(20) {
                tracing::debug!(took = ?started.elapsed(), "slow pipeline commit");
            }
            let mut stored = 0u64;
            let now = weft_model::now_ms();
            let mut fresh = Vec::with_capacity(batch.units.len());
            for ((record, inserted), seq) in batch
                .units
                .iter()
                .zip(outcome.inserted)
                .zip(outcome.seqs.iter().copied().chain(std::iter::repeat(0)))
            {
                if inserted && seq > 0 {
                    fresh.push(rules::FedUnit {
                        seq,
                        partition: record.partition,
                        unit: Arc::clone(&record.unit),
                    });
                }
                if !inserted {
                    metrics::counter!("weft_units_duplicate_total").increment(1);
                    continue;
                }
                stored += 1;
                let lag_ms = (now - record.unit.received_at).max(0) as f64;
                metrics::histogram!("weft_pipeline_latency_seconds").record(lag_ms / 1000.0);
                self.bus.publish(Event {
                    stream: Stream::Data,
                    payload: Payload::Data(Arc::clone(&record.unit)),
                    json: record.json.clone(),
                });
            }
            {
                let mut in_flight = self.in_flight.lock();
                for record in &batch.units {
                    in_flight.remove(&record.unit.data_id);
                }
            }
            // Committed: now the entity changes may be seen. Listeners that
            // cannot keep up slow the committer, and so the pipeline.
            for change in changes {
                for wait in change.announce() {
                    wait.await;
                }
            }
            self.rules.feed(Arc::new(fresh));
            metrics::counter!("weft_units_stored_total").increment(stored);
            if all {
                self.processed.store(next_seq, Ordering::Relaxed);
            }
            metrics::gauge!("weft_pipeline_backlog").set(self.backlog() as f64);
        }
    }

    /// Deletes processed log entries older than the retention: every 10 s,
    /// or every 100 ms while there is more to delete (the store deletes in
    /// bounded chunks so the writer is never held for long).
    async fn prune_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut wait = Duration::from_secs(10);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => break,
            }
            // Below every partition's cursor, whichever node holds it.
            let below = if self.runs_all.load(Ordering::Relaxed) {
                self.processed.load(Ordering::Relaxed)
            } else {
                match cluster_cursor(&*self.store, self.partitions).await {
                    Ok(cursor) => cursor,
                    Err(_) => continue,
                }
            };
            let before = weft_model::now_ms() - self.config.log_retention.as_millis() as i64;
            wait = match self.store.prune_uplinks(below, before).await {
                Ok(n) if n > 0 => {
                    tracing::debug!(pruned = n, "pruned the ingest log");
                    Duration::from_millis(100)
                }
                Ok(_) => Duration::from_secs(10),
                Err(e) => {
                    tracing::warn!(error = %e, "pruning the ingest log failed");
                    Duration::from_secs(10)
                }
            };
        }
    }
}

#[cfg(test)]
#[path = "ingest_tests.rs"]
mod tests;
