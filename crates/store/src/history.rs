//! The history: every recorded value of every entity attribute over time
//! (what QuantumLeap's API serves), and the two feeds that rows wait in
//! before the history writer moves them in, in large batches.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::{Result, StoreError, HISTORY_DELETE_CHUNK};

/// Name of the cursor (in the history's file) recording how far the
/// changes feed has been moved into the history: partition 0's, and with
/// `/<n>` appended partition `n`'s ([`crate::partition_cursor`]).
pub const HISTORY_FEED_CURSOR: &str = "history_feed";

/// The changes-feed partition of an entity's states among `partitions`:
/// the changes feed is split by entity, so each partition can be moved by
/// a node of its own (no two nodes then touch the same series or rollup
/// buckets), and the hash is fixed (it decides which cursor covers a
/// queued entry).
pub fn history_partition(tenant: &str, entity_id: &str, entity_type: &str, partitions: u16) -> u16 {
    weft_model::uplink::partition_of_parts(
        &[
            tenant.as_bytes(),
            entity_id.as_bytes(),
            entity_type.as_bytes(),
        ],
        partitions,
    )
}

/// One recorded value of one attribute of one entity at one time index:
/// a row of the history (QuantumLeap's table, narrowed).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HistoryRow {
    /// Tenant (empty for the default tenant).
    pub tenant: String,
    /// Service path of the entity.
    pub service_path: String,
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Attribute name.
    pub attr: String,
    /// Attribute type (`Number`, `Text`, …).
    pub attr_type: String,
    /// The time index, epoch milliseconds.
    pub time: i64,
    /// Which recorded entity state the row belongs to: one value per
    /// notified entity (or recorded change), shared by its attributes'
    /// rows, so two states filed under the same time index (two
    /// notifications arriving in the same millisecond) stay two rows, as
    /// QuantumLeap stores one row per notification. Rows of one time are
    /// ordered by it, so a larger value should mean a later arrival.
    /// Feed entries queued before it existed read as 0.
    #[serde(default)]
    pub instance: i64,
    /// The value as JSON text.
    pub value: String,
    /// The value as a number when it is one (what aggregations use).
    pub number: Option<f64>,
}

/// The two queues history rows wait in before the history writer moves
/// them into the history in large, key-ordered batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryFeed {
    /// Entity changes (`history.record_changes`): queued in the main
    /// file with the change itself; consumption is a cursor in the
    /// history's file, and consumed entries are pruned later.
    Changes,
    /// QuantumLeap notifications (`POST /v2/notify`): queued in the
    /// history's own file ([`HistoryStore::queue_history`]), whose entries
    /// are deleted in the same commit that stores their rows.
    Notifications,
}

/// What one [`HistoryStore::move_history_feed`] did, and when the mover
/// should come back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedMove {
    /// The position of the last feed entry moved (the partitions moved are
    /// consumed through it); `None` when nothing was waiting.
    pub through: Option<u64>,
    /// Each partition moved and the position of its last entry moved
    /// (for the changes feed, what [`HistoryStore::prune_history_feed`]
    /// takes; the notifications feed is one partition, 0).
    pub consumed: Vec<(u16, u64)>,
    /// Rows taken from the feed and stored (replays of stored rows
    /// included, rows the filter refused not).
    pub rows: u64,
    /// Whether the move stopped at its row limit, so more entries may be
    /// waiting.
    pub more: bool,
    /// How long the mover should let the feed fill before moving again:
    /// the backend's pacing of history commits (zero: whenever rows wait).
    pub pause: Duration,
}

/// What a feed move's filter sees of one recorded state (the rows of one
/// entity at one time index), borrowed from the feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedStateRef<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Entity id.
    pub entity_id: &'a str,
    /// Entity type.
    pub entity_type: &'a str,
    /// The time index, epoch milliseconds.
    pub time: i64,
}

/// States a feed move keeps: those it answers `false` for are consumed
/// without being stored (states already past their tenant's retention).
pub type FeedFilter<'a> = dyn Fn(&FeedStateRef<'_>) -> bool + Send + Sync + 'a;

/// How a backend batches and paces its feed moves ([`move_feed`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoveTuning {
    /// Most rows per history commit of a move: a move's rows go in
    /// chunks of this many, each a commit of its own (the last one also
    /// marking the feed consumed), so notifications queued behind a move
    /// wait for one chunk, not the whole move.
    pub chunk_rows: usize,
    /// Shortest time from one move's start to the next: the
    /// [`FeedMove::pause`] a move answers is what is left of it.
    pub interval: Duration,
}

/// A feed entry a move read: its position, its changes-feed partition (0
/// for notifications) and its rows.
pub(crate) type ReadEntry = (u64, u16, Vec<HistoryRow>);

/// [`HistoryStore::move_history_feed`] from the entries a backend read
/// after the feed's cursors (`max_rows` asked for) and its tuning:
/// their rows that `keep` accepts
/// grouped by entity, then by recorded state in time order ([`by_state`]:
/// consecutive inserts then land on the same index pages, far fewer page
/// visits than arrival order), stored in chunks of about
/// `tuning.chunk_rows` (each a commit of its own, never splitting a
/// state, so chunking adds almost no page writes), the last chunk marking
/// the feed consumed. A failure midway leaves the feed unconsumed; the
/// retry's inserts of the rows already stored are no-ops.
pub(crate) async fn move_feed<S: HistoryStore + ?Sized>(
    store: &S,
    feed: HistoryFeed,
    entries: Vec<ReadEntry>,
    max_rows: usize,
    keep: &FeedFilter<'_>,
    tuning: MoveTuning,
) -> Result<FeedMove> {
    let started = Instant::now();
    let Some(&(through, ..)) = entries.last() else {
        return Ok(FeedMove::default());
    };
    let consumed = consumed_through(entries.iter().map(|(seq, part, _)| (*part, *seq)));
    let read: usize = entries.iter().map(|(.., rows)| rows.len()).sum();
    // The entries' rows stay where they were decoded; the order refers to
    // them, and each is moved once, into the chunk that stores it.
    let mut entries: Vec<Vec<HistoryRow>> = entries.into_iter().map(|(.., rows)| rows).collect();
    let order = by_state(&entries, keep);
    let count = order.len() as u64;
    let chunk = tuning.chunk_rows.max(1);
    let mut start = 0;
    while start < order.len() {
        // Up to `chunk` rows, then on to the end of the state cut.
        let mut end = (start + chunk).min(order.len());
        while end < order.len() && order[end].state() == order[end - 1].state() {
            end += 1;
        }
        let part: Vec<HistoryRow> = order[start..end]
            .iter()
            .map(|k| std::mem::take(&mut entries[k.entry as usize][k.row as usize]))
            .collect();
        let last = end == order.len();
        let marks: &[(u16, u64)] = if last { &consumed } else { &[] };
        store.append_history_from_feed(feed, part, marks).await?;
        start = end;
    }
    if order.is_empty() {
        store
            .append_history_from_feed(feed, Vec::new(), &consumed)
            .await?;
    }
    Ok(FeedMove {
        through: Some(through),
        consumed,
        rows: count,
        more: read >= max_rows,
        // Behind by a whole move or more: no pause until caught up.
        pause: if read >= max_rows {
            Duration::ZERO
        } else {
            tuning.interval.saturating_sub(started.elapsed())
        },
    })
}

/// Each partition among `(partition, position)` pairs with its last
/// position, by partition: how far a move consumed each.
pub(crate) fn consumed_through(entries: impl Iterator<Item = (u16, u64)>) -> Vec<(u16, u64)> {
    let mut last = std::collections::BTreeMap::new();
    for (part, seq) in entries {
        let at = last.entry(part).or_insert(seq);
        *at = (*at).max(seq);
    }
    last.into_iter().collect()
}

/// Splits a compact feed entry ([`encode_feed_entry`]) into one entry per
/// changes-feed partition its states fall in ([`history_partition`]
/// among `partitions`), each state's bytes copied as they are; `None`
/// when the entry is not decodable. An entry without states gives none.
pub(crate) fn split_feed_entry(entry: &[u8], partitions: u16) -> Option<Vec<(u16, Vec<u8>)>> {
    let mut parts: std::collections::BTreeMap<u16, Vec<u8>> = std::collections::BTreeMap::new();
    for span in FeedSpans::of(entry)? {
        let span = span?;
        let h = &span.head;
        let part = history_partition(h.tenant, h.entity_id, h.entity_type, partitions);
        parts
            .entry(part)
            .or_insert_with(|| vec![FEED_FORMAT])
            .extend_from_slice(span.bytes);
    }
    Some(parts.into_iter().collect())
}

/// Where one row goes in a feed move's order ([`by_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RowOrder {
    /// Hash of the row's entity (tenant, id, type).
    entity: u64,
    /// The row's time index.
    time: i64,
    /// The row's recorded state.
    instance: i64,
    /// Hash of the row's attribute name.
    attr: u64,
    /// The row's feed entry, among the move's.
    entry: u32,
    /// The row's position in its entry.
    row: u32,
}

impl RowOrder {
    /// The recorded state the row belongs to (as far as hashes tell: two
    /// entities hashing alike only share a chunk).
    fn state(&self) -> (u64, i64, i64) {
        (self.entity, self.time, self.instance)
    }
}

/// The order a move stores the rows `keep` accepts in: grouped by
/// entity, then by recorded state (time, instance), then by attribute.
/// Entities and attributes are compared by hash, so sorting a move of
/// hundreds of thousands of rows compares integers, not four strings per
/// comparison; the groups are what matter to the backends' page
/// locality, not the order between them.
fn by_state(entries: &[Vec<HistoryRow>], keep: &FeedFilter<'_>) -> Vec<RowOrder> {
    use std::hash::BuildHasher;
    let hasher = rustc_hash::FxBuildHasher;
    let mut order: Vec<RowOrder> = Vec::with_capacity(entries.iter().map(Vec::len).sum());
    for (entry, rows) in entries.iter().enumerate() {
        for (row, r) in rows.iter().enumerate() {
            let state = FeedStateRef {
                tenant: &r.tenant,
                entity_id: &r.entity_id,
                entity_type: &r.entity_type,
                time: r.time,
            };
            if !keep(&state) {
                continue;
            }
            order.push(RowOrder {
                entity: hasher.hash_one((&r.tenant, &r.entity_id, &r.entity_type)),
                time: r.time,
                instance: r.instance,
                attr: hasher.hash_one(&r.attr),
                entry: entry as u32,
                row: row as u32,
            });
        }
    }
    order.sort_unstable();
    order
}

/// Which history rows a query wants. Rows come back ordered by entity
/// (id, type), then attribute, then time (and [`HistoryRow::instance`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryQuery {
    /// Tenant.
    pub tenant: String,
    /// Only rows under this service path: the path itself or a sub-path,
    /// segment-wise (`/a` matches `/a` and `/a/b`, not `/ab`; `/` matches
    /// all), compared exactly. Queries compare each row's own path (as
    /// QuantumLeap keeps one per row); aggregates, the entity listing and
    /// deletes the path an entity's first stored row came with. `None`:
    /// every path.
    pub service_path: Option<String>,
    /// Only these entity ids (any of); empty: all.
    pub entity_ids: Vec<String>,
    /// Only this entity type.
    pub entity_type: Option<String>,
    /// Only these attributes (any of); empty: all.
    pub attrs: Vec<String>,
    /// With `attrs`: also, for every recorded state in range holding none
    /// of them, one row of attribute [`STATE_MARKER`] (no value) — so a
    /// reader sees every state (QuantumLeap's rows, whose other columns are
    /// null). SQLite reads only the attributes asked, of the first (with
    /// `last_n`, newest) `offset + limit` states of each entity;
    /// PostgreSQL, storing rows per attribute, reads every attribute with
    /// the query's cuts and keeps the markers of what it read. Either
    /// holds every state among those first states, which is what a reader
    /// cutting records needs. Ignored without `attrs`.
    pub every_state: bool,
    /// Only rows at or after this time (epoch ms).
    pub from: Option<i64>,
    /// Only rows at or before this time (epoch ms).
    pub to: Option<i64>,
    /// Only the last N rows (by time) of each (entity, attribute) series,
    /// still returned in ascending time.
    pub last_n: Option<usize>,
    /// Rows skipped per (entity, attribute) series, after `last_n`.
    pub offset: usize,
    /// Most rows returned per (entity, attribute) series (0: none). The
    /// backend caps it at 10,000, QuantumLeap's maximum; the API passes its
    /// `limit` (default 10,000).
    pub limit: usize,
}

/// The attribute of the rows [`HistoryQuery::every_state`] adds for states
/// holding none of the attributes asked (no NGSI attribute has an empty
/// name).
pub const STATE_MARKER: &str = "";

impl HistoryQuery {
    /// The query's time range as inclusive bounds (unbounded ends as the
    /// extreme times).
    pub(crate) fn time_range(&self) -> (i64, i64) {
        (self.from.unwrap_or(i64::MIN), self.to.unwrap_or(i64::MAX))
    }
}

/// Whether an entity recorded under `path` is under the service-path
/// prefix `prefix`: the path itself or one of its sub-paths, segment-wise
/// (`/a` and `/a/` match `/a` and `/a/b`, not `/ab`; `/` matches every
/// path). Compared exactly in Rust, so `%`, `_` and case mean nothing
/// special, as they would in a `LIKE`: the one rule of every backend.
pub(crate) fn path_matches(prefix: &str, path: &str) -> bool {
    let base = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(base)
            .is_some_and(|rest| (rest.is_empty() && !base.is_empty()) || rest.starts_with('/'))
}

/// First byte of a feed entry in the compact form ([`encode_feed_entry`]):
/// its format version. Entries written as JSON text are still read.
const FEED_FORMAT: u8 = 1;

/// A feed entry's rows in the compact form SQLite's feeds store (a BLOB):
/// rows of one entity state (same tenant, service path, id, type, time
/// index and instance, as a change queues them) share one header, and an
/// attribute is its name, type, value and number, length-prefixed, with
/// no field names and no escaping of the value's JSON. Writing it costs
/// the main writer a fraction of serde_json's objects, and the entry is
/// a fraction of their size.
pub(crate) fn encode_feed_entry(rows: &[HistoryRow]) -> Vec<u8> {
    let bytes: usize = rows
        .iter()
        .map(|r| r.attr.len() + r.attr_type.len() + r.value.len() + 16)
        .sum();
    let mut out = Vec::with_capacity(bytes + 64);
    out.push(FEED_FORMAT);
    encode_feed_states(rows, &mut out);
    out
}

/// The history states of one change (an NGSI create or update), already
/// in the changes feed's compact form ([`encode_feed_states`]): built on
/// the request's own task straight from the entity's attributes, so the
/// change allocates no [`HistoryRow`]s and its store's writer only copies
/// bytes into the feed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryStates {
    bytes: Vec<u8>,
}

impl HistoryStates {
    /// Adds one recorded state: the entity's attributes `attrs` (name,
    /// type, value) at `time` (epoch ms), as state `instance`
    /// ([`HistoryRow::instance`]). A state without attributes adds
    /// nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn push_state<'a>(
        &mut self,
        tenant: &str,
        service_path: &str,
        entity_id: &str,
        entity_type: &str,
        time: i64,
        instance: i64,
        attrs: impl IntoIterator<Item = (&'a str, &'a str, &'a serde_json::Value)>,
    ) {
        let attrs: Vec<_> = attrs.into_iter().collect();
        if attrs.is_empty() {
            return;
        }
        let out = &mut self.bytes;
        let entity = [tenant, service_path, entity_id, entity_type];
        put_state_head(out, entity, time, instance, attrs.len());
        let mut value_text = Vec::new();
        for (name, attr_type, value) in attrs {
            put_str(out, name);
            put_str(out, attr_type);
            value_text.clear();
            // Serialising a JSON value into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut value_text, value);
            put_len(out, value_text.len());
            out.extend_from_slice(&value_text);
            put_number(out, weft_model::history::numeric(value));
        }
    }

    /// Whether no state was added.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The states in the compact form, without an entry's format byte.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The states as rows (for backends that queue rows).
    pub fn rows(&self) -> Vec<HistoryRow> {
        if self.bytes.is_empty() {
            return Vec::new();
        }
        // Only `push_state` and `From` write the bytes: always decodable.
        decode_feed_blob(0, &HistoryStates::entry([self])).unwrap_or_default()
    }

    /// One feed entry in the compact form holding every state of
    /// `states`, in order: the format byte, then their bytes one after
    /// another (just the format byte for none).
    pub(crate) fn entry<'a>(states: impl IntoIterator<Item = &'a HistoryStates>) -> Vec<u8> {
        let mut entry = vec![FEED_FORMAT];
        for s in states {
            entry.extend_from_slice(&s.bytes);
        }
        entry
    }
}

impl From<Vec<HistoryRow>> for HistoryStates {
    fn from(rows: Vec<HistoryRow>) -> HistoryStates {
        let mut bytes = Vec::new();
        encode_feed_states(&rows, &mut bytes);
        HistoryStates { bytes }
    }
}

/// [`FEED_FORMAT`], for backends starting an entry they append states to.
pub(crate) const FEED_FORMAT_BYTE: u8 = FEED_FORMAT;

/// Appends to `out` the rows' states in the compact form, without the
/// format byte that starts an entry: entries are their format byte
/// followed by any number of states, so the states of several changes
/// make one entry by appending them ([`encode_feed_entry`]).
pub(crate) fn encode_feed_states(rows: &[HistoryRow], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < rows.len() {
        let head = &rows[i];
        let n = rows[i..]
            .iter()
            .take_while(|r| {
                r.tenant == head.tenant
                    && r.service_path == head.service_path
                    && r.entity_id == head.entity_id
                    && r.entity_type == head.entity_type
                    && r.time == head.time
                    && r.instance == head.instance
            })
            .count();
        let entity = [
            head.tenant.as_str(),
            &head.service_path,
            &head.entity_id,
            &head.entity_type,
        ];
        put_state_head(out, entity, head.time, head.instance, n);
        for r in &rows[i..i + n] {
            put_str(out, &r.attr);
            put_str(out, &r.attr_type);
            put_str(out, &r.value);
            put_number(out, r.number);
        }
        i += n;
    }
}

/// Appends a state's header in the compact form: its entity, time
/// index, instance and how many attributes follow.
fn put_state_head(
    out: &mut Vec<u8>,
    [tenant, service_path, entity_id, entity_type]: [&str; 4],
    time: i64,
    instance: i64,
    attrs: usize,
) {
    for s in [tenant, service_path, entity_id, entity_type] {
        put_str(out, s);
    }
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(&instance.to_le_bytes());
    put_len(out, attrs);
}

/// Appends an attribute's number in the compact form: a 0 byte for none,
/// else a 1 byte and the float.
fn put_number(out: &mut Vec<u8>, number: Option<f64>) {
    match number {
        Some(x) => {
            out.push(1);
            out.extend_from_slice(&x.to_le_bytes());
        }
        None => out.push(0),
    }
}

/// Appends a length as a LEB128 varint.
fn put_len(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Appends a string, length-prefixed.
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// One recorded state of a compact feed entry, borrowed from its bytes
/// ([`feed_states`]): what SQLite's history writer stores without copying
/// the feed into [`HistoryRow`]s first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FeedState<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Service path.
    pub service_path: &'a str,
    /// Entity id.
    pub entity_id: &'a str,
    /// Entity type.
    pub entity_type: &'a str,
    /// Time index.
    pub time: i64,
    /// Recorded state ([`HistoryRow::instance`]).
    pub instance: i64,
    /// Its attributes, in the order they were queued.
    pub attrs: Vec<FeedAttr<'a>>,
}

/// One attribute of a [`FeedState`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FeedAttr<'a> {
    /// Attribute name.
    pub name: &'a str,
    /// Attribute type.
    pub attr_type: &'a str,
    /// The value as JSON text.
    pub value: &'a str,
    /// The value as a number when it is one.
    pub number: Option<f64>,
}

impl<'a> FeedState<'a> {
    /// Its rows, owned.
    pub fn rows(&self) -> impl Iterator<Item = HistoryRow> + '_ {
        self.attrs.iter().map(|a| HistoryRow {
            tenant: self.tenant.to_string(),
            service_path: self.service_path.to_string(),
            entity_id: self.entity_id.to_string(),
            entity_type: self.entity_type.to_string(),
            attr: a.name.to_string(),
            attr_type: a.attr_type.to_string(),
            time: self.time,
            instance: self.instance,
            value: a.value.to_string(),
            number: a.number,
        })
    }
}

/// Reads a compact feed entry ([`encode_feed_entry`]) without copying.
struct FeedReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> FeedReader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn len(&mut self) -> Option<usize> {
        let mut n = 0usize;
        for shift in (0..64).step_by(7) {
            let b = *self.take(1)?.first()?;
            n |= ((b & 0x7f) as usize) << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn str(&mut self) -> Option<&'a str> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?).ok()
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn states(&mut self) -> Option<Vec<FeedState<'a>>> {
        if *self.take(1)?.first()? != FEED_FORMAT {
            return None;
        }
        let mut states = Vec::new();
        while self.at < self.bytes.len() {
            let tenant = self.str()?;
            let service_path = self.str()?;
            let entity_id = self.str()?;
            let entity_type = self.str()?;
            let time = self.i64()?;
            let instance = self.i64()?;
            let n = self.len()?;
            // Each attribute takes at least four bytes: a bogus count
            // cannot make the reader reserve more than the entry holds.
            let mut attrs = Vec::with_capacity(n.min(self.bytes.len() / 4));
            for _ in 0..n {
                let name = self.str()?;
                let attr_type = self.str()?;
                let value = self.str()?;
                let number = match *self.take(1)?.first()? {
                    0 => None,
                    1 => Some(f64::from_le_bytes(self.take(8)?.try_into().ok()?)),
                    _ => return None,
                };
                attrs.push(FeedAttr {
                    name,
                    attr_type,
                    value,
                    number,
                });
            }
            states.push(FeedState {
                tenant,
                service_path,
                entity_id,
                entity_type,
                time,
                instance,
                attrs,
            });
        }
        Some(states)
    }
}

/// How many rows (attributes) one compact feed entry holds, read through
/// it without building its states (`None`: not decodable).
pub(crate) fn feed_row_count(bytes: &[u8]) -> Option<usize> {
    let mut rows = 0usize;
    for span in FeedSpans::of(bytes)? {
        rows = rows.checked_add(span?.rows)?;
    }
    Some(rows)
}

/// One state of a compact feed entry as the bytes that encode it, with
/// what a move sorts and filters it by: a move copies these bytes into
/// its chunks as they are, without building the state's attributes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedSpan<'a> {
    /// Who and when it is (the service path is not needed to sort).
    pub head: FeedStateRef<'a>,
    /// Recorded state ([`HistoryRow::instance`]).
    pub instance: i64,
    /// How many attributes (rows) it holds.
    pub rows: usize,
    /// Its encoding, head and attributes ([`FeedState::encode`]'s form).
    pub bytes: &'a [u8],
}

/// The states of one compact feed entry as [`FeedSpan`]s, each checked to
/// be decodable; yields `None` at the first that is not.
pub(crate) struct FeedSpans<'a> {
    reader: FeedReader<'a>,
}

impl<'a> FeedSpans<'a> {
    /// The spans of `bytes`, a whole entry (`None`: not a compact entry).
    pub(crate) fn of(bytes: &'a [u8]) -> Option<FeedSpans<'a>> {
        let mut reader = FeedReader { bytes, at: 0 };
        if *reader.take(1)?.first()? != FEED_FORMAT {
            return None;
        }
        Some(FeedSpans { reader })
    }

    fn span(&mut self) -> Option<FeedSpan<'a>> {
        let r = &mut self.reader;
        let start = r.at;
        let tenant = r.str()?;
        r.str()?;
        let entity_id = r.str()?;
        let entity_type = r.str()?;
        let time = r.i64()?;
        let instance = r.i64()?;
        let n = r.len()?;
        for _ in 0..n {
            for _ in 0..3 {
                r.str()?;
            }
            match *r.take(1)?.first()? {
                0 => {}
                1 => {
                    r.take(8)?;
                }
                _ => return None,
            }
        }
        Some(FeedSpan {
            head: FeedStateRef {
                tenant,
                entity_id,
                entity_type,
                time,
            },
            instance,
            rows: n,
            bytes: &r.bytes[start..r.at],
        })
    }
}

impl<'a> Iterator for FeedSpans<'a> {
    type Item = Option<FeedSpan<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.reader.at >= self.reader.bytes.len() {
            return None;
        }
        let span = self.span();
        if span.is_none() {
            // Nothing after an undecodable state can be found.
            self.reader.at = self.reader.bytes.len();
        }
        Some(span)
    }
}

/// The states of one compact history feed entry ([`encode_feed_entry`]),
/// borrowed from its bytes.
pub(crate) fn feed_states(seq: u64, bytes: &[u8]) -> Result<Vec<FeedState<'_>>> {
    FeedReader { bytes, at: 0 }
        .states()
        .ok_or_else(|| StoreError::Corrupt(format!("history feed entry {seq}: not decodable")))
}

/// The rows of one compact history feed entry ([`encode_feed_entry`]).
pub(crate) fn decode_feed_blob(seq: u64, bytes: &[u8]) -> Result<Vec<HistoryRow>> {
    Ok(feed_states(seq, bytes)?
        .iter()
        .flat_map(FeedState::rows)
        .collect())
}

/// The rows of one history feed entry, from the JSON it is stored as.
pub(crate) fn decode_feed_entry(seq: u64, json: &str) -> Result<Vec<HistoryRow>> {
    serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("history feed entry {seq}: {e}")))
}

/// Runs a chunked history delete (each `chunk` one transaction removing at
/// most [`HISTORY_DELETE_CHUNK`] rows and buckets) again until a chunk
/// comes back short; answers the total. A large delete then never holds
/// the history's writer (and every notification waiting on it) for long,
/// and appends keep flowing meanwhile. Deleting is idempotent, so a
/// failure midway leaves a state a retry completes.
pub(crate) async fn delete_in_chunks<F, Fut>(mut chunk: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    loop {
        let deleted = chunk().await?;
        total += deleted;
        if deleted < HISTORY_DELETE_CHUNK as u64 {
            return Ok(total);
        }
    }
}

/// What one transaction of a history delete did: the rows it removed and
/// whether the delete is complete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DeleteStep {
    /// Rows removed by this step.
    pub rows: u64,
    /// Whether nothing matching is left to delete.
    pub done: bool,
}

/// Runs the steps of a history delete ([`HistoryStore::delete_history`]),
/// each one transaction of at most [`HISTORY_DELETE_CHUNK`] rows, until
/// one says it is done; answers the rows removed. As
/// [`delete_in_chunks`], a large delete never holds the history's writer
/// for long, and a failure midway leaves a state a retry completes.
pub(crate) async fn delete_in_steps<F, Fut>(mut step: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<DeleteStep>>,
{
    let mut total = 0;
    loop {
        let DeleteStep { rows, done } = step().await?;
        total += rows;
        if done {
            return Ok(total);
        }
    }
}

/// Which history [`HistoryStore::delete_history`] removes: QuantumLeap's
/// `DELETE /entities/{id}` and `DELETE /types/{type}`, each optionally
/// limited to a time range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryDelete {
    /// Tenant; no delete crosses tenants.
    pub tenant: String,
    /// Only entities under this service-path prefix (as
    /// [`HistoryQuery::service_path`]); `None`: every path.
    pub service_path: Option<String>,
    /// Only this entity (of any type, unless `entity_type` is given).
    pub entity_id: Option<String>,
    /// Only entities of this type. With neither an id nor a type nothing
    /// is deleted: wiping a whole tenant is not an operation of the API.
    pub entity_type: Option<String>,
    /// Only rows at or after this time (epoch ms, inclusive, as
    /// QuantumLeap's `fromDate`).
    pub from: Option<i64>,
    /// Only rows at or before this time (epoch ms, inclusive, as
    /// QuantumLeap's `toDate`).
    pub to: Option<i64>,
    /// Only these attributes' rows (NGSI-LD's "Delete Attribute from
    /// Temporal Representation"); empty: every attribute's.
    pub attrs: Vec<String>,
}

impl HistoryDelete {
    /// Whether the delete covers attribute `attr`.
    pub(crate) fn covers_attr(&self, attr: &str) -> bool {
        self.attrs.is_empty() || self.attrs.iter().any(|a| a == attr)
    }

    /// Whether an entity recorded under `path` is in the delete's scope.
    pub(crate) fn covers_path(&self, path: &str) -> bool {
        self.service_path
            .as_deref()
            .is_none_or(|p| path_matches(p, path))
    }

    /// The delete's range as inclusive bounds (open ends as the extreme
    /// times).
    pub(crate) fn time_range(&self) -> (i64, i64) {
        (self.from.unwrap_or(i64::MIN), self.to.unwrap_or(i64::MAX))
    }
}

/// How values are aggregated (`aggrMethod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggrMethod {
    /// Number of rows (any value type).
    Count,
    /// Sum of numeric values.
    Sum,
    /// Mean of numeric values.
    Avg,
    /// Smallest numeric value.
    Min,
    /// Largest numeric value.
    Max,
}

/// The buckets of an aggregation (`aggrPeriod`), in UTC calendar units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggrPeriod {
    /// Calendar year.
    Year,
    /// Calendar month.
    Month,
    /// Day.
    Day,
    /// Hour.
    Hour,
    /// Minute.
    Minute,
    /// Second.
    Second,
}

impl AggrPeriod {
    /// Where the bucket starting at `start` (epoch ms) ends: the next
    /// bucket's start, in UTC calendar units.
    pub fn bucket_end(self, start: i64) -> i64 {
        use chrono::{DateTime, Months, Utc};
        let months = |n| {
            DateTime::<Utc>::from_timestamp_millis(start)
                .and_then(|t| t.checked_add_months(Months::new(n)))
                .map_or(start, |t| t.timestamp_millis())
        };
        match self {
            AggrPeriod::Second => start + 1_000,
            AggrPeriod::Minute => start + 60_000,
            AggrPeriod::Hour => start + 3_600_000,
            AggrPeriod::Day => start + 86_400_000,
            AggrPeriod::Month => months(1),
            AggrPeriod::Year => months(12),
        }
    }
}

/// One aggregated value: a series' rows in one bucket (or the whole
/// range when no period was asked).
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryAggregate {
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Attribute name.
    pub attr: String,
    /// Start of the bucket (epoch ms); with no period, the time of the
    /// series' first row in range.
    pub bucket: i64,
    /// The aggregate (`None` when no row had a numeric value).
    pub value: Option<f64>,
}

/// What one tenant's retention expires at one moment, for
/// [`HistoryStore::expire_history`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryCutoffs {
    /// Tenant.
    pub tenant: String,
    /// Rows with a time index before this (epoch ms) are deleted; `None`:
    /// rows are kept.
    pub rows_before: Option<i64>,
    /// Minute and hour rollup buckets that end by this (epoch ms) are
    /// deleted; `None`: rollups are kept. Rows going before their rollups
    /// is downsampling.
    pub rollups_before: Option<i64>,
}

/// An entity that has history: what `GET /entities` lists.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntity {
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Service path.
    pub service_path: String,
}

/// The history and its feeds: entity changes and notifications queue their
/// rows in a feed, the history writer moves them into the history, and
/// QuantumLeap's API queries, aggregates and deletes it.
#[async_trait]
pub trait HistoryStore: Send + Sync {
    /// Moves the entries of `feed` after its cursor, at most about
    /// `max_rows` rows (whole entries), into the history (the rows `keep`
    /// accepts) and marks them consumed: what the history writer calls
    /// over and over. Entity changes queue their rows in the changes feed
    /// with the change itself
    /// ([`ContextStore::put_entity`](crate::ContextStore::put_entity),
    /// [`ProcessedBatch::history`](crate::ProcessedBatch::history)) and
    /// notifications theirs in the notifications feed
    /// ([`HistoryStore::queue_history`]), so neither waits for history
    /// inserts and nothing queued is lost. The backend decides how a move
    /// is batched into commits, and answers how long to wait before the
    /// next ([`FeedMove::pause`]); a move that fails midway is repeated
    /// whole, storing nothing twice.
    ///
    /// For the changes feed, only the entries of partitions `parts` (of
    /// [`HistoryStore::change_feed_partitions`]) are moved, each
    /// partition's cursor moving on its own: nodes move partitions side by
    /// side. `parts` means nothing to the notifications feed.
    async fn move_history_feed(
        &self,
        feed: HistoryFeed,
        parts: &[u16],
        max_rows: usize,
        keep: &FeedFilter<'_>,
    ) -> Result<FeedMove>;
    /// How many partitions the changes feed is split into (by entity,
    /// [`history_partition`]): fixed when the store was created, 1 for a
    /// store only one node uses.
    fn change_feed_partitions(&self) -> u16;
    /// The entries of `feed` after `after` (exclusive), oldest first, at
    /// most about `max_rows` rows (whole entries), every partition's: for
    /// looking into a feed without moving it.
    async fn read_history_feed(
        &self,
        feed: HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<HistoryRow>)>>;
    /// Stores history rows taken from `feed` and marks the feed consumed
    /// as far as `through` says (each partition through its position; the
    /// notifications feed, partition 0, through its one), in one commit of
    /// the history's file: one commit of a move. A large move goes in
    /// several calls (only the last with `through`), so notifications
    /// waiting for the same writer are not held up behind it; a crash
    /// between them only repeats idempotent inserts. Answers how many rows
    /// were new.
    async fn append_history_from_feed(
        &self,
        feed: HistoryFeed,
        rows: Vec<HistoryRow>,
        through: &[(u16, u64)],
    ) -> Result<u64>;
    /// How far partition `part` of `feed` has been moved into the history
    /// (0: nothing yet, or, for the notifications feed, whose moved
    /// entries are deleted, always).
    async fn history_feed_cursor(&self, feed: HistoryFeed, part: u16) -> Result<u64>;
    /// Drops changes-feed entries already moved: of each partition, those
    /// up to its position.
    async fn prune_history_feed(&self, through: &[(u16, u64)]) -> Result<u64>;
    /// Whether every changes-feed entry up to `seq`, whichever partition,
    /// has been moved: what a query waits for on a node that does not
    /// move every partition itself.
    async fn changes_moved_through(&self, seq: u64) -> Result<bool>;
    /// Queues notified history states in the notifications feed, already
    /// in the compact form ([`HistoryStates`], built on the request's own
    /// task straight from the notified entities, so a notification
    /// allocates no [`HistoryRow`]s and a retry copies nothing); answers
    /// the entry's position once it is durable.
    async fn queue_history(&self, states: &HistoryStates) -> Result<u64>;
    /// Whether a notifications-feed entry at or below `seq` is still
    /// waiting to be moved: a node that does not move the feed itself
    /// (another node holds history's lease) waits on this before a query.
    async fn notifications_queued_through(&self, seq: u64) -> Result<bool>;
    /// The newest notifications-feed entry still waiting to be moved, if
    /// any (whichever node queued it).
    async fn newest_queued_notification(&self) -> Result<Option<u64>>;
    /// The newest changes-feed entry (moved or not; `None` when the feed
    /// holds none): a query waits until the changes feed's cursor reaches
    /// it, so an entity change acknowledged before the query is in its
    /// answer however long the mover pauses between moves.
    async fn newest_queued_change(&self) -> Result<Option<u64>>;
    /// Rows matching `query`, ordered by entity, attribute, time.
    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<HistoryRow>>;
    /// Aggregates of the rows matching `query` (`last_n`, `limit`,
    /// `offset` ignored) per (entity, attribute) and bucket, ordered by
    /// entity, attribute, bucket.
    async fn aggregate_history(
        &self,
        query: &HistoryQuery,
        method: AggrMethod,
        period: Option<AggrPeriod>,
    ) -> Result<Vec<HistoryAggregate>>;
    /// The entities of `tenant` with history (optionally of one type and
    /// under a service-path prefix), ordered by type then id.
    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<HistoryEntity>>;
    /// Every attribute name recorded for entities of `entity_type` in
    /// `tenant` (whichever entity, whenever), sorted: QuantumLeap's columns
    /// of the type's table, which its answers list for every record (null
    /// where a record has none). Kept as long as the attribute's rollups.
    async fn history_attributes(&self, tenant: &str, entity_type: &str) -> Result<Vec<String>>;
    /// Deletes the history `target` names: the rows of the matching
    /// entities in its time range (all of them without one), and their
    /// rollups — buckets the range covers whole go, buckets it cuts
    /// through are corrected to count only the rows left, so aggregates
    /// agree with the rows afterwards. An entity left with neither rows
    /// nor rollups leaves the listing. Returns the rows deleted. A large
    /// delete may commit in several transactions (appends go on
    /// meanwhile); a failure midway leaves part of it done, which a retry
    /// completes.
    async fn delete_history(&self, target: &HistoryDelete) -> Result<u64>;
    /// Deletes each listed tenant's history older than its cutoffs
    /// ([`HistoryCutoffs`]); tenants not listed keep everything. All
    /// tenants come in one call so that a backend storing time ranges of
    /// every tenant together (PostgreSQL's weekly partitions) can drop a
    /// range whole when no tenant with rows in it keeps them, and delete
    /// row by row only what is left. Commits in chunks so appends go on
    /// meanwhile; returns how many rows and rollup buckets were deleted.
    async fn expire_history(&self, cutoffs: &[HistoryCutoffs]) -> Result<u64>;
    /// The tenants that have history.
    async fn history_tenants(&self) -> Result<Vec<String>>;
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn a_service_path_prefix_matches_itself_and_its_sub_paths_segment_wise() {
        for (prefix, path) in [
            ("/", "/"),
            ("/", "/a/b"),
            ("/a", "/a"),
            ("/a", "/a/b"),
            ("/a/", "/a"),
            ("/a/", "/a/b"),
            ("/a%", "/a%"),
        ] {
            assert!(path_matches(prefix, path), "{prefix} {path}");
        }
        for (prefix, path) in [
            ("/a", "/ab"),
            ("/a", "/"),
            ("/a/b", "/a"),
            ("/a%", "/ab"),
            ("/A", "/a"),
        ] {
            assert!(!path_matches(prefix, path), "{prefix} {path}");
        }
    }
}

#[cfg(test)]
mod feed_tests {
    use super::*;

    #[test]
    fn buckets_end_where_the_next_calendar_unit_starts() {
        // 2024-01-31T00:00:00Z: a month later is February's end, a year
        // later 2025-01-31.
        let jan31 = 1_706_659_200_000;
        assert_eq!(AggrPeriod::Hour.bucket_end(jan31), jan31 + 3_600_000);
        assert_eq!(AggrPeriod::Month.bucket_end(jan31), 1_709_164_800_000);
        assert_eq!(AggrPeriod::Year.bucket_end(jan31), 1_738_281_600_000);
    }

    fn row(id: &str, attr: &str, time: i64, number: Option<f64>) -> HistoryRow {
        HistoryRow {
            tenant: "t".into(),
            service_path: "/p".into(),
            entity_id: id.into(),
            entity_type: "Room".into(),
            attr: attr.into(),
            attr_type: "Number".into(),
            time,
            instance: time * 1000 + 7,
            value: format!("{{\"v\":\"é{attr}\"}}"),
            number,
        }
    }

    #[test]
    fn states_built_from_attributes_read_back_as_their_rows() {
        let (n, t, o) = (
            serde_json::json!(21.5),
            serde_json::json!("on \"x\""),
            serde_json::json!({"a": [1, null]}),
        );
        let mut states = HistoryStates::default();
        states.push_state("t", "/p", "E", "Room", 7, 70, []);
        assert!(states.is_empty());
        states.push_state(
            "t",
            "/p",
            "E",
            "Room",
            7,
            70,
            [
                ("n", "Number", &n),
                ("t", "Text", &t),
                ("o", "StructuredValue", &o),
            ],
        );
        let got: Vec<(String, String, String, Option<f64>, i64, i64)> = states
            .rows()
            .into_iter()
            .map(|r| {
                assert_eq!((r.tenant.as_str(), r.service_path.as_str()), ("t", "/p"));
                assert_eq!(
                    (r.entity_id.as_str(), r.entity_type.as_str()),
                    ("E", "Room")
                );
                (r.attr, r.attr_type, r.value, r.number, r.time, r.instance)
            })
            .collect();
        let want = |a: &str, ty: &str, v: &str, num: Option<f64>| {
            (a.to_string(), ty.to_string(), v.to_string(), num, 7, 70)
        };
        assert_eq!(
            got,
            vec![
                want("n", "Number", "21.5", Some(21.5)),
                want("t", "Text", "\"on \\\"x\\\"\"", None),
                want("o", "StructuredValue", "{\"a\":[1,null]}", None),
            ]
        );
        let rows = vec![row("a", "x", 1, Some(1.5)), row("a", "y", 1, None)];
        assert_eq!(HistoryStates::from(rows.clone()).rows(), rows);
    }

    #[test]
    fn compact_feed_entries_round_trip() {
        let rows = vec![
            row("a", "x", 1, Some(1.5)),
            row("a", "y", 1, None),
            row("b", "x", 1, Some(-2.0)),
            row("a", "x", 2, Some(f64::MAX)),
        ];
        let bytes = encode_feed_entry(&rows);
        assert_eq!(decode_feed_blob(1, &bytes).unwrap(), rows);
        assert_eq!(feed_row_count(&bytes), Some(4));
        assert_eq!(feed_row_count(&bytes[..bytes.len() - 1]), None);
        assert_eq!(
            decode_feed_blob(1, &encode_feed_entry(&[])).unwrap(),
            vec![]
        );
        assert!(decode_feed_blob(1, &bytes[..bytes.len() - 1]).is_err());
        assert!(decode_feed_blob(1, &[]).is_err());
    }

    /// A move copies states by their spans: spans reordered and joined
    /// behind a format byte are an entry of the same states, in the new
    /// order; a truncated entry ends in an undecodable span.
    #[test]
    fn spans_are_whole_states_that_move_as_bytes() {
        let rows = vec![
            row("a", "x", 1, Some(1.5)),
            row("a", "y", 1, None),
            row("b", "x", 1, Some(-2.0)),
            row("a", "x", 2, Some(f64::MAX)),
        ];
        let bytes = encode_feed_entry(&rows);
        let spans: Vec<FeedSpan<'_>> = FeedSpans::of(&bytes).unwrap().map(Option::unwrap).collect();
        let heads: Vec<(&str, i64, i64, usize)> = spans
            .iter()
            .map(|s| (s.head.entity_id, s.head.time, s.instance, s.rows))
            .collect();
        assert_eq!(
            heads,
            vec![("a", 1, 1007, 2), ("b", 1, 1007, 1), ("a", 2, 2007, 1)]
        );
        let mut moved = vec![FEED_FORMAT_BYTE];
        for i in [2, 0, 1] {
            moved.extend_from_slice(spans[i].bytes);
        }
        let want = vec![
            rows[3].clone(),
            rows[0].clone(),
            rows[1].clone(),
            rows[2].clone(),
        ];
        assert_eq!(decode_feed_blob(1, &moved).unwrap(), want);

        let cut: Vec<Option<FeedSpan<'_>>> =
            FeedSpans::of(&bytes[..bytes.len() - 1]).unwrap().collect();
        assert_eq!(cut.len(), 3);
        assert!(cut[2].is_none());
        assert!(FeedSpans::of(&[]).is_none());
    }
}
