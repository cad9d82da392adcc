//! [`HistoryStore`] on two files: the changes feed lives in the main file
//! (queued with the entity changes themselves), everything else in the
//! history's own file — the notifications feed, the recorded states (one
//! row per entity state, keyed by an integer per entity), the entities
//! with history, the minute and hour rollups, and the changes feed's
//! cursor. Its writes are appends of feed moves and chunked deletes; its
//! reads are range scans of the entities a query covers.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};

use super::reader::{cursor, limit, position};
use super::writer::in_savepoint;
use super::{to_i64, Db, SqliteStore};
use crate::history::{
    decode_feed_blob, decode_feed_entry, delete_in_chunks, delete_in_steps, encode_feed_entry,
    feed_states, path_matches, DeleteStep, FeedAttr, FeedSpans, FeedState, MoveTuning,
};
use crate::rollup::RollupPartial;
use crate::{
    AggrMethod, AggrPeriod, FeedFilter, FeedMove, HistoryAggregate, HistoryCutoffs, HistoryDelete,
    HistoryEntity, HistoryFeed, HistoryQuery, HistoryRow, HistoryStates, HistoryStore, Result,
    HISTORY_FEED_CURSOR,
};

/// How the history feed's moves are batched and paced on SQLite.
const MOVE_TUNING: MoveTuning = MoveTuning {
    // A few milliseconds of the history writer, so notifications queued
    // behind a move wait little.
    chunk_rows: 4_096,
    // A commit writes every page it dirtied once, and states of many
    // entities dirty a page each; waiting lets more states share those
    // pages and their rollup buckets (measured: the WAL writes of frequent
    // small commits took most of the history writer's time, and going
    // from 500 ms to 2 s halved its CPU per NGSI update). History then
    // lags by up to this much, except for queries, which wake the mover
    // and wait for what was queued before them.
    interval: Duration::from_secs(2),
};

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn move_history_feed(
        &self,
        feed: HistoryFeed,
        parts: &[u16],
        max_rows: usize,
        keep: &FeedFilter<'_>,
    ) -> Result<FeedMove> {
        // One node, one partition: the changes feed is not split.
        if feed == HistoryFeed::Changes && !parts.contains(&0) {
            return Ok(FeedMove::default());
        }
        self.move_feed_states(feed, max_rows, keep).await
    }

    fn change_feed_partitions(&self) -> u16 {
        1
    }

    async fn read_history_feed(
        &self,
        feed: HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<HistoryRow>)>> {
        let part = match feed {
            HistoryFeed::Changes => &self.main,
            HistoryFeed::Notifications => &self.history,
        };
        part.read(move |c| read_history_feed(c, after, max_rows))
            .await
    }

    async fn append_history_from_feed(
        &self,
        feed: HistoryFeed,
        rows: Vec<HistoryRow>,
        through: &[(u16, u64)],
    ) -> Result<u64> {
        let through = through.iter().map(|(_, seq)| *seq).max();
        self.history
            .write(move |c| in_savepoint(c, |c| append_from_feed(c, feed, &rows, through)))
            .await
    }

    async fn history_feed_cursor(&self, feed: HistoryFeed, part: u16) -> Result<u64> {
        if feed == HistoryFeed::Notifications || part != 0 {
            return Ok(0);
        }
        // Stored as the next position to read, like the pipeline's (1 when
        // nothing was consumed yet).
        let next = self
            .history
            .read(|c| cursor(c, HISTORY_FEED_CURSOR))
            .await?;
        Ok(next.saturating_sub(1))
    }

    async fn prune_history_feed(&self, through: &[(u16, u64)]) -> Result<u64> {
        let Some(through) = through.iter().find(|(part, _)| *part == 0).map(|(_, s)| *s) else {
            return Ok(0);
        };
        self.main.write(move |c| prune_feed(c, through)).await
    }

    async fn changes_moved_through(&self, seq: u64) -> Result<bool> {
        let cursor = self.history_feed_cursor(HistoryFeed::Changes, 0).await?;
        if cursor >= seq {
            return Ok(true);
        }
        // The cursor stops at the last entry moved; entries pruned or
        // never queued between it and `seq` are not waiting.
        self.main
            .read(move |c| {
                c.prepare_cached(
                    "SELECT NOT EXISTS (SELECT 1 FROM history_feed WHERE seq > ?1 AND seq <= ?2)",
                )
                .and_then(|mut st| {
                    st.query_row([to_i64(cursor), to_i64(seq)], |r| r.get::<_, bool>(0))
                })
                .db()
            })
            .await
    }

    async fn queue_history(&self, states: &HistoryStates) -> Result<u64> {
        let entry = HistoryStates::entry([states]);
        self.history.write(move |c| queue_notified(c, &entry)).await
    }

    async fn newest_queued_notification(&self) -> Result<Option<u64>> {
        self.history
            .read(|c| {
                c.prepare_cached("SELECT MAX(seq) FROM history_feed")
                    .and_then(|mut st| st.query_row([], |r| r.get::<_, Option<i64>>(0)))
                    .map(|seq| seq.map(|s| s.max(0) as u64))
                    .db()
            })
            .await
    }

    async fn newest_queued_change(&self) -> Result<Option<u64>> {
        // The changes feed is queued in the main file, with the changes.
        self.main
            .read(|c| {
                c.prepare_cached("SELECT MAX(seq) FROM history_feed")
                    .and_then(|mut st| st.query_row([], |r| r.get::<_, Option<i64>>(0)))
                    .map(|seq| seq.map(|s| s.max(0) as u64))
                    .db()
            })
            .await
    }

    async fn notifications_queued_through(&self, seq: u64) -> Result<bool> {
        self.history
            .read(move |c| {
                c.prepare_cached("SELECT EXISTS (SELECT 1 FROM history_feed WHERE seq <= ?1)")
                    .and_then(|mut st| st.query_row([to_i64(seq)], |r| r.get::<_, bool>(0)))
                    .db()
            })
            .await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<HistoryRow>> {
        let query = query.clone();
        self.history.read(move |c| query_history(c, &query)).await
    }

    async fn aggregate_history(
        &self,
        query: &HistoryQuery,
        method: AggrMethod,
        period: Option<AggrPeriod>,
    ) -> Result<Vec<HistoryAggregate>> {
        let query = query.clone();
        self.history
            .read(move |c| aggregate_history(c, &query, method, period))
            .await
    }

    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<HistoryEntity>> {
        let tenant = tenant.to_string();
        let entity_type = entity_type.map(str::to_string);
        let service_path = service_path.map(str::to_string);
        self.history
            .read(move |c| {
                history_entities(c, &tenant, entity_type.as_deref(), service_path.as_deref())
            })
            .await
    }

    async fn history_attributes(&self, tenant: &str, entity_type: &str) -> Result<Vec<String>> {
        let tenant = tenant.to_string();
        let entity_type = entity_type.to_string();
        self.history
            .read(move |c| history_attributes(c, &tenant, &entity_type))
            .await
    }

    async fn delete_history(&self, target: &HistoryDelete) -> Result<u64> {
        let target = target.clone();
        delete_in_steps(|| {
            let target = target.clone();
            self.history
                .write(move |c| in_savepoint(c, |c| delete_history(c, &target)))
        })
        .await
    }

    async fn expire_history(&self, cutoffs: &[HistoryCutoffs]) -> Result<u64> {
        let mut total = 0;
        for HistoryCutoffs {
            tenant,
            rows_before,
            rollups_before,
        } in cutoffs.iter().cloned()
        {
            total += self
                .delete_in_chunks(move |c| expire_history(c, &tenant, rows_before, rollups_before))
                .await?;
        }
        Ok(total)
    }

    async fn history_tenants(&self) -> Result<Vec<String>> {
        self.history.read(history_tenants).await
    }
}

impl SqliteStore {
    /// [`HistoryStore::move_history_feed`] without copying the feed into
    /// [`HistoryRow`]s: the entries after the feed's cursor (about
    /// `max_rows` rows, whole entries) are read as bytes, their states
    /// ([`FeedSpans`]: where each state's bytes are, nothing decoded
    /// beyond its head) that `keep` accepts ordered by entity and then by
    /// state ([`MoveTuning`]'s page locality, as the shared
    /// [`crate::history::move_feed`] does for rows), and copied into
    /// chunks of about [`MOVE_TUNING`]`.chunk_rows` rows, each stored by
    /// one commit of the history writer, which reads its chunk's states
    /// in place too ([`append_feed_chunk`]); the last chunk marks the feed
    /// consumed. Entries queued as JSON by earlier versions are read as
    /// rows and re-encoded.
    async fn move_feed_states(
        &self,
        feed: HistoryFeed,
        max_rows: usize,
        keep: &FeedFilter<'_>,
    ) -> Result<FeedMove> {
        use std::hash::BuildHasher;
        let after = self.history_feed_cursor(feed, 0).await?;
        let part = match feed {
            HistoryFeed::Changes => &self.main,
            HistoryFeed::Notifications => &self.history,
        };
        let entries = part
            .read(move |c| read_feed_entries(c, after, max_rows))
            .await?;
        let started = std::time::Instant::now();
        let Some(&(through, _)) = entries.last() else {
            return Ok(FeedMove::default());
        };
        let mut spans = Vec::new();
        for (seq, bytes) in &entries {
            let corrupt =
                || crate::StoreError::Corrupt(format!("history feed entry {seq}: not decodable"));
            for span in FeedSpans::of(bytes).ok_or_else(corrupt)? {
                spans.push(span.ok_or_else(corrupt)?);
            }
        }
        let read: usize = spans.iter().map(|s| s.rows).sum();
        let hasher = rustc_hash::FxBuildHasher;
        let mut order: Vec<(u64, i64, i64, u32)> = spans
            .iter()
            .enumerate()
            .filter(|(_, span)| keep(&span.head))
            .map(|(i, span)| {
                let h = &span.head;
                let entity = hasher.hash_one((h.tenant, h.entity_id, h.entity_type));
                (entity, h.time, span.instance, i as u32)
            })
            .collect();
        order.sort_unstable();
        let mut rows = 0u64;
        let mut chunk: Vec<u8> = Vec::new();
        let mut chunk_rows = 0;
        let last = order.len().saturating_sub(1);
        for (n, &(.., i)) in order.iter().enumerate() {
            let span = &spans[i as usize];
            if chunk.is_empty() {
                chunk.reserve(MOVE_TUNING.chunk_rows * 48);
                chunk.push(crate::history::FEED_FORMAT_BYTE);
            }
            // A state's bytes are its encoding: copied, not rebuilt.
            chunk.extend_from_slice(span.bytes);
            chunk_rows += span.rows;
            rows += span.rows as u64;
            if chunk_rows >= MOVE_TUNING.chunk_rows && n < last {
                let bytes = std::mem::take(&mut chunk);
                chunk_rows = 0;
                self.history
                    .write(move |c| in_savepoint(c, |c| append_feed_chunk(c, feed, &bytes, None)))
                    .await?;
            }
        }
        drop(spans);
        if chunk.is_empty() {
            // Every state refused, or the last chunk already stored: an
            // empty chunk still marks the feed consumed.
            chunk.push(crate::history::FEED_FORMAT_BYTE);
        }
        self.history
            .write(move |c| in_savepoint(c, |c| append_feed_chunk(c, feed, &chunk, Some(through))))
            .await?;
        Ok(FeedMove {
            through: Some(through),
            // One partition here, whichever the feed.
            consumed: vec![(0, through)],
            rows,
            more: read >= max_rows,
            // Behind by a whole move or more: no pause until caught up.
            pause: if read >= max_rows {
                Duration::ZERO
            } else {
                MOVE_TUNING.interval.saturating_sub(started.elapsed())
            },
        })
    }

    /// Runs a chunked delete of the history ([`delete_history`],
    /// [`expire_history`]: at most [`HISTORY_DELETE_CHUNK`] rows, in a
    /// savepoint), each chunk a write of its own, until one is not full
    /// ([`crate::history::delete_in_chunks`]).
    async fn delete_in_chunks<F>(&self, chunk: F) -> Result<u64>
    where
        F: Fn(&Connection) -> rusqlite::Result<u64> + Clone + Send + 'static,
    {
        delete_in_chunks(|| {
            let chunk = chunk.clone();
            self.history.write(move |c| in_savepoint(c, chunk))
        })
        .await
    }
}

// --- the stored form of a recorded state --------------------------------
//
// The history's file keeps one row per recorded entity state, not one per
// attribute: `history_states` is keyed by (entity, time, instance), the
// entity an integer (`history_series.key`) and the state's attributes one
// JSON object `{"<attr>": ["<type>", "<value as JSON text>", <number or
// null>], …}`. An NGSI update of three attributes is then one insert with
// an integer key instead of three with four strings each, and a series
// (one attribute of one entity) is read by scanning its entity's states.
// Rollups stay per series, keyed by (entity, attribute, period, bucket).

/// One attribute of a stored state: its type, its value as JSON text, and
/// the value as a number when it is one.
#[derive(Debug, serde::Deserialize)]
struct StoredAttr(String, String, Option<f64>);

/// A stored state's attributes by name.
type StoredAttrs = std::collections::BTreeMap<String, StoredAttr>;

/// The JSON object storing the attributes of one state (the first of two
/// naming the same attribute wins, as the primary key of a
/// row-per-attribute table would have it). Answers it and how many
/// attributes it holds.
fn encode_state(attrs: &[FeedAttr<'_>]) -> (String, usize) {
    encode_attrs(
        attrs
            .iter()
            .map(|a| (a.name, a.attr_type, a.value, a.number)),
    )
}

/// [`encode_state`] of (attribute, type, value, number) items.
fn encode_attrs<'a>(
    attrs: impl Iterator<Item = (&'a str, &'a str, &'a str, Option<f64>)>,
) -> (String, usize) {
    let mut out = Vec::with_capacity(64);
    let mut seen: Vec<&str> = Vec::new();
    out.push(b'{');
    for (attr, attr_type, value, number) in attrs {
        if seen.contains(&attr) {
            continue;
        }
        if !seen.is_empty() {
            out.push(b',');
        }
        seen.push(attr);
        // Writing strings and finite floats into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, attr);
        out.extend_from_slice(b":[");
        let _ = serde_json::to_writer(&mut out, attr_type);
        out.push(b',');
        let _ = serde_json::to_writer(&mut out, value);
        out.push(b',');
        match number.filter(|n| n.is_finite()) {
            Some(n) => {
                let _ = serde_json::to_writer(&mut out, &n);
            }
            None => out.extend_from_slice(b"null"),
        }
        out.push(b']');
    }
    out.push(b'}');
    // Only JSON was written: valid UTF-8.
    (String::from_utf8(out).unwrap_or_default(), seen.len())
}

/// Of a state's attributes (column `index` of a result row), those named
/// in `attrs` that `wanted` asks for, in `attrs`' order: the state's JSON
/// is split into its attributes without reading their values, and only
/// the wanted ones are read (a query of one attribute of an entity with
/// many reads one value per state).
/// The attributes of a state's JSON (column `index`) that are `wanted`
/// among `attrs`, and whether it holds any of `attrs` at all.
fn pick_attrs(
    row: &rusqlite::Row<'_>,
    index: usize,
    attrs: &[String],
    wanted: impl Fn(usize) -> bool,
) -> rusqlite::Result<(Vec<Option<StoredAttr>>, bool)> {
    let text = row.get_ref(index)?.as_str()?;
    let fail = |e: serde_json::Error| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(e))
    };
    // Names with escapes cannot be borrowed: read the whole state then.
    let Ok(raw) = serde_json::from_str::<
        std::collections::BTreeMap<&str, &serde_json::value::RawValue>,
    >(text) else {
        let mut all = state_attrs(row, index)?;
        let any = attrs.iter().any(|a| all.contains_key(a));
        let picked = attrs
            .iter()
            .enumerate()
            .map(|(i, a)| if wanted(i) { all.remove(a) } else { None })
            .collect();
        return Ok((picked, any));
    };
    let any = attrs.iter().any(|a| raw.contains_key(a.as_str()));
    let picked = attrs
        .iter()
        .enumerate()
        .map(|(i, a)| match raw.get(a.as_str()) {
            Some(value) if wanted(i) => serde_json::from_str(value.get()).map(Some).map_err(fail),
            _ => Ok(None),
        })
        .collect::<rusqlite::Result<_>>()?;
    Ok((picked, any))
}

/// A state's attributes, read from column `index` of a result row (a
/// column that is not a state's JSON is a conversion error).
fn state_attrs(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<StoredAttrs> {
    let text = row.get_ref(index)?.as_str()?;
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(e))
    })
}

// --- writes ---------------------------------------------------------------

std::thread_local! {
    /// The changes feed's entry of the transaction the main writer has
    /// open: the states its writes queued, in the compact form.
    static PENDING_FEED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How the main file's writer coalesces the history rows its writes
/// queue ([`queue_history`]) into one feed entry per transaction: an NGSI
/// update then costs the writer a few hundred bytes appended to a buffer
/// instead of an insert (and, later, a delete) of its own row.
pub(super) const CHANGES_FEED_DEFERRAL: super::writer::Deferred = super::writer::Deferred {
    mark: || PENDING_FEED.with(|p| p.borrow().len()),
    truncate: |mark| PENDING_FEED.with(|p| p.borrow_mut().truncate(mark)),
    flush: flush_pending_feed,
};

/// Queues history rows in the changes feed (nothing for none), in the
/// compact form ([`encode_feed_entry`]): in the entry the main writer
/// inserts when it commits the transaction this write is part of
/// ([`CHANGES_FEED_DEFERRAL`]). Only the main file's writer calls it.
pub(super) fn queue_history(_conn: &Connection, rows: &[HistoryRow]) -> rusqlite::Result<()> {
    if !rows.is_empty() {
        pend(|p| crate::history::encode_feed_states(rows, p));
    }
    Ok(())
}

/// [`queue_history`] of states already in the compact form
/// ([`crate::history::encode_feed_states`]): what a change encodes on
/// its own task, so the main writer only copies bytes (and frees none of
/// the rows, which would cost it more than the copy).
pub(super) fn queue_feed_states(states: &[u8]) {
    if !states.is_empty() {
        pend(|p| p.extend_from_slice(states));
    }
}

/// Adds to the transaction's pending changes-feed entry.
fn pend(add: impl FnOnce(&mut Vec<u8>)) {
    PENDING_FEED.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_empty() {
            p.push(crate::history::FEED_FORMAT_BYTE);
        }
        add(&mut p);
    });
}

/// Inserts the transaction's coalesced changes-feed entry, if its writes
/// queued any rows, and empties the buffer.
fn flush_pending_feed(conn: &Connection) -> rusqlite::Result<()> {
    let entry = PENDING_FEED.with(|p| {
        let mut p = p.borrow_mut();
        // Only the format byte: nothing was queued (a truncation may
        // leave it behind).
        if p.len() <= 1 {
            p.clear();
            return None;
        }
        Some(std::mem::take(&mut *p))
    });
    let Some(entry) = entry else { return Ok(()) };
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")?
        .execute([entry])?;
    Ok(())
}

/// Queues notified history rows (their compact form) in this file's
/// feed; answers the entry's `seq`.
fn queue_notified(conn: &Connection, entry: &[u8]) -> rusqlite::Result<u64> {
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")
        .and_then(|mut st| st.insert([entry]))
        .map(|seq| seq as u64)
}

/// Drops consumed changes-feed entries; answers how many.
fn prune_feed(conn: &Connection, through: u64) -> rusqlite::Result<u64> {
    conn.prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")
        .and_then(|mut st| st.execute([to_i64(through)]))
        .map(|n| n as u64)
}

/// Stores history rows taken from a feed and, with `through`, marks the
/// feed consumed that far ([`append_feed_chunk`] of their compact form).
/// Answers how many rows were new.
fn append_from_feed(
    conn: &Connection,
    feed: HistoryFeed,
    rows: &[HistoryRow],
    through: Option<u64>,
) -> rusqlite::Result<u64> {
    append_feed_chunk(conn, feed, &encode_feed_entry(rows), through)
}

/// Stores the states of a compact feed chunk and, with `through`, marks
/// the feed consumed that far (the changes feed's cursor; the
/// notifications feed's entries are deleted, in this same file). Answers
/// how many rows were new.
fn append_feed_chunk(
    conn: &Connection,
    feed: HistoryFeed,
    chunk: &[u8],
    through: Option<u64>,
) -> rusqlite::Result<u64> {
    let n = append_states(conn, &chunk_states(chunk)?)?;
    let Some(through) = through else {
        return Ok(n);
    };
    match feed {
        HistoryFeed::Changes => conn
            .prepare_cached(
                "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            )?
            .execute((HISTORY_FEED_CURSOR, to_i64(through + 1)))?,
        HistoryFeed::Notifications => conn
            .prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")?
            .execute([to_i64(through)])?,
    };
    Ok(n)
}

/// (tenant, entity type, entity id, time, instance): which recorded state
/// a feed state is.
type StateKey<'a> = (&'a str, &'a str, &'a str, i64, i64);

fn state_key<'a>(state: &FeedState<'a>) -> StateKey<'a> {
    (
        state.tenant,
        state.entity_type,
        state.entity_id,
        state.time,
        state.instance,
    )
}

/// Inserts history rows straight into the history ([`append_states`] of
/// their compact form): what tests and the conformance suite append with.
/// Answers how many rows were new.
#[cfg(test)]
pub(super) fn append_history(conn: &Connection, rows: &[HistoryRow]) -> rusqlite::Result<u64> {
    append_states(conn, &chunk_states(&encode_feed_entry(rows))?)
}

/// The states of a compact feed chunk, borrowed (an undecodable chunk is a
/// conversion error, which fails the write).
fn chunk_states(chunk: &[u8]) -> rusqlite::Result<Vec<FeedState<'_>>> {
    feed_states(0, chunk).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
    })
}

/// Inserts the states that are new (the primary key makes a replayed state
/// a no-op; a state met again with attributes it lacks gets them,
/// [`merge_into_stored`]), registering entities seen for the first time
/// (with the service path they first came with), then adds the new rows to
/// their series' minute and hour rollups (one upsert per bucket, not per
/// row). States of one entity usually come together (a feed move orders
/// them so), so the entity is looked up once per run of its states.
///
/// It runs without a savepoint of its own: inside one, SQLite copies every
/// page the operation touches to a sub-journal first, and an append
/// touches one page per entity (its last leaf). The feed's moves, which
/// are large and rare, wrap it in one ([`append_feed_chunk`]); the
/// statements cannot fail on their values, so only an I/O error can stop
/// an append midway.
fn append_states(conn: &Connection, states: &[FeedState<'_>]) -> rusqlite::Result<u64> {
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO history_states (entity, time, instance, service_path, rows, attrs) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut rollups = Rollups::default();
    let mut columns: std::collections::BTreeSet<(&str, &str, &str)> = Default::default();
    let mut new = 0u64;
    let mut entity: Option<(StateKey<'_>, i64, String)> = None;
    for state in states {
        columns.extend(
            state
                .attrs
                .iter()
                .map(|a| (state.tenant, state.entity_type, a.name)),
        );
        let key = state_key(state);
        let same = entity
            .as_ref()
            .is_some_and(|(k, _, _)| (k.0, k.1, k.2) == (key.0, key.1, key.2));
        if !same {
            let (id, path) = entity_key(conn, state)?;
            entity = Some((key, id, path));
        }
        let Some((_, id, path)) = &entity else {
            continue;
        };
        let own_path = (state.service_path != path.as_str()).then_some(state.service_path);
        let (attrs, count) = encode_state(&state.attrs);
        let inserted = insert.execute((
            id,
            state.time,
            state.instance,
            own_path,
            count as i64,
            attrs,
        ))?;
        let added: Vec<&FeedAttr<'_>> = if inserted > 0 {
            state
                .attrs
                .iter()
                .enumerate()
                .filter(|(i, a)| !state.attrs[..*i].iter().any(|b| b.name == a.name))
                .map(|(_, a)| a)
                .collect()
        } else {
            merge_into_stored(conn, *id, state)?
        };
        for attr in added {
            new += 1;
            rollups.add(*id, state.time, attr);
        }
    }
    rollups.store(conn)?;
    let mut column = conn.prepare_cached(
        "INSERT OR IGNORE INTO history_columns (tenant, entity_type, attr) VALUES (?1, ?2, ?3)",
    )?;
    for key in columns {
        column.execute(key)?;
    }
    Ok(new)
}

/// Adds to a stored state the attributes of `state` it does not hold yet:
/// a replay adds nothing, while rows of one state appended in separate
/// calls (rows queued before states had an instance of their own all
/// share instance 0) all stay. Answers the attributes added.
fn merge_into_stored<'s, 'a>(
    conn: &Connection,
    entity: i64,
    state: &'s FeedState<'a>,
) -> rusqlite::Result<Vec<&'s FeedAttr<'a>>> {
    let stored = conn
        .prepare_cached(
            "SELECT attrs FROM history_states WHERE entity = ?1 AND time = ?2 AND instance = ?3",
        )?
        .query_row((entity, state.time, state.instance), |r| state_attrs(r, 0))?;
    let mut added: Vec<&FeedAttr<'_>> = Vec::new();
    for attr in &state.attrs {
        if !stored.contains_key(attr.name) && !added.iter().any(|a| a.name == attr.name) {
            added.push(attr);
        }
    }
    if added.is_empty() {
        return Ok(added);
    }
    let (attrs, count) = encode_attrs(
        stored
            .iter()
            .map(|(attr, StoredAttr(t, v, n))| (attr.as_str(), t.as_str(), v.as_str(), *n))
            .chain(
                added
                    .iter()
                    .map(|a| (a.name, a.attr_type, a.value, a.number)),
            ),
    );
    conn.prepare_cached(
        "UPDATE history_states SET attrs = ?4, rows = ?5 \
         WHERE entity = ?1 AND time = ?2 AND instance = ?3",
    )?
    .execute((entity, state.time, state.instance, attrs, count as i64))?;
    Ok(added)
}

/// The key and recorded service path of a state's entity, registering the
/// entity (with the state's path) when it is new.
fn entity_key(conn: &Connection, state: &FeedState<'_>) -> rusqlite::Result<(i64, String)> {
    let found: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT key, service_path FROM history_series \
             WHERE tenant = ?1 AND entity_type = ?2 AND entity_id = ?3",
        )?
        .query_row((state.tenant, state.entity_type, state.entity_id), |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    if let Some(found) = found {
        return Ok(found);
    }
    let key = conn
        .prepare_cached(
            "INSERT INTO history_series (tenant, entity_type, entity_id, service_path) \
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .insert((
            state.tenant,
            state.entity_type,
            state.entity_id,
            state.service_path,
        ))?;
    Ok((key, state.service_path.to_string()))
}

/// The rollup buckets an append adds to, keyed like `history_rollups`.
#[derive(Default)]
struct Rollups<'a> {
    buckets: std::collections::BTreeMap<RollupKey<'a>, RollupPartial>,
}

/// (entity key, attribute, period, bucket start).
type RollupKey<'a> = (i64, &'a str, i64, i64);

impl<'a> Rollups<'a> {
    fn add(&mut self, entity: i64, time: i64, attr: &FeedAttr<'a>) {
        for period in crate::rollup::ROLLUP_PERIODS {
            let key = (
                entity,
                attr.name,
                period,
                crate::rollup::floor_to(time, period),
            );
            self.buckets.entry(key).or_default().add(attr.number);
        }
    }

    fn store(self, conn: &Connection) -> rusqlite::Result<()> {
        if self.buckets.is_empty() {
            return Ok(());
        }
        let mut upsert = conn.prepare_cached(
            "INSERT INTO history_rollups (entity, attr, period, bucket, \
                 rows, numbers, sum_value, min_value, max_value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT DO UPDATE SET \
                 rows = rows + excluded.rows, \
                 numbers = numbers + excluded.numbers, \
                 sum_value = CASE WHEN sum_value IS NULL THEN excluded.sum_value \
                     WHEN excluded.sum_value IS NULL THEN sum_value \
                     ELSE sum_value + excluded.sum_value END, \
                 min_value = min(coalesce(min_value, excluded.min_value), \
                                 coalesce(excluded.min_value, min_value)), \
                 max_value = max(coalesce(max_value, excluded.max_value), \
                                 coalesce(excluded.max_value, max_value))",
        )?;
        for ((entity, attr, period, bucket), p) in self.buckets {
            upsert.execute((
                entity,
                attr,
                period,
                bucket,
                p.rows as i64,
                p.numbers as i64,
                p.sum(),
                p.min,
                p.max,
            ))?;
        }
        Ok(())
    }
}

pub(super) use crate::HISTORY_DELETE_CHUNK;

/// A stored state as a delete reads it: (time, instance, rows, attributes).
type DoomedState = (i64, i64, u64, StoredAttrs);

/// One step of a history delete: the states of the matching entities in
/// range, entity by entity, until they hold [`HISTORY_DELETE_CHUNK`] rows
/// (at least one state), with their rollups (whole buckets in range
/// deleted, the buckets the range cuts through corrected from the rows
/// deleted and the rows left, [`crate::rollup::after_delete`]); an entity
/// left with neither states nor rollups leaves `history_series`. Steps are
/// idempotent: a bucket is corrected only for rows this step removes, in
/// the same transaction.
fn delete_history(conn: &Connection, d: &HistoryDelete) -> rusqlite::Result<DeleteStep> {
    use crate::rollup::{covered_buckets, cut_buckets, ROLLUP_PERIODS};
    let (from, to) = d.time_range();
    let cut = cut_buckets(d.from, d.to);
    let mut budget = HISTORY_DELETE_CHUNK as u64;
    let mut step = DeleteStep::default();
    for key in delete_targets(conn, d)? {
        let mut attrs = entity_attrs(conn, key)?;
        attrs.retain(|a| d.covers_attr(a));
        for attr in &attrs {
            for period in ROLLUP_PERIODS {
                let (first, last) = covered_buckets(d.from, d.to, period);
                conn.prepare_cached(
                    "DELETE FROM history_rollups WHERE entity = ?1 AND attr = ?2 \
                     AND period = ?3 AND bucket >= ?4 AND bucket <= ?5",
                )?
                .execute((key, attr, period, first, last))?;
            }
        }
        if !d.attrs.is_empty() {
            let rows_doomed = delete_state_attrs(conn, key, d, budget, &attrs, &cut)?;
            step.rows += rows_doomed;
            budget = budget.saturating_sub(rows_doomed);
            if budget == 0 {
                return Ok(step);
            }
            forget_if_empty(conn, key)?;
            continue;
        }
        let mut doomed: Vec<DoomedState> = Vec::new();
        let rows_doomed =
            scan_states(conn, key, (from, to), budget, |time, instance, n, state| {
                doomed.push((time, instance, n, state));
                n
            })?;
        if let Some(&(last, last_instance, _, _)) = doomed.last() {
            // Exactly the states read: up to the last one's (time, instance).
            conn.prepare_cached(
                "DELETE FROM history_states WHERE entity = ?1 AND time >= ?2 AND time <= ?3 \
                 AND (time < ?3 OR instance <= ?4)",
            )?
            .execute((key, from, last, last_instance))?;
            for &(period, bucket) in &cut {
                correct_cut_bucket(conn, key, &attrs, &doomed, period, bucket)?;
            }
        }
        step.rows += rows_doomed;
        budget = budget.saturating_sub(rows_doomed);
        if budget == 0 {
            return Ok(step);
        }
        forget_if_empty(conn, key)?;
    }
    step.done = true;
    Ok(step)
}

/// Reads entity `key`'s states in `range` (inclusive), oldest first,
/// handing each (time, instance, rows, attributes) to `take`, which
/// answers how many rows of it are doomed, until `budget` rows are;
/// answers how many were.
fn scan_states(
    conn: &Connection,
    key: i64,
    (from, to): (i64, i64),
    budget: u64,
    mut take: impl FnMut(i64, i64, u64, StoredAttrs) -> u64,
) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare_cached(
        "SELECT time, instance, rows, attrs FROM history_states \
             WHERE entity = ?1 AND time >= ?2 AND time <= ?3 ORDER BY time, instance",
    )?;
    let mut rows = stmt.query((key, from, to))?;
    let mut doomed = 0u64;
    while doomed < budget {
        let Some(row) = rows.next()? else { break };
        let n = row.get::<_, i64>(2)? as u64;
        doomed += take(row.get(0)?, row.get(1)?, n, state_attrs(row, 3)?);
    }
    Ok(doomed)
}

/// [`delete_history`] of some attributes only (`d.attrs`, those of them
/// the entity has: `attrs`): each state in range that holds one loses
/// them (a state left with none is deleted), about `budget` rows at
/// most; the buckets the range cuts through are corrected for them.
/// Answers the rows deleted.
fn delete_state_attrs(
    conn: &Connection,
    key: i64,
    d: &HistoryDelete,
    budget: u64,
    attrs: &[String],
    cut: &[(i64, i64)],
) -> rusqlite::Result<u64> {
    if attrs.is_empty() {
        return Ok(0);
    }
    let (from, to) = d.time_range();
    let mut doomed: Vec<DoomedState> = Vec::new();
    let mut kept: Vec<(i64, i64, StoredAttrs)> = Vec::new();
    let rows_doomed = scan_states(
        conn,
        key,
        (from, to),
        budget,
        |time, instance, _, mut state| {
            let removed: StoredAttrs = attrs.iter().filter_map(|a| state.remove_entry(a)).collect();
            let n = removed.len() as u64;
            if n > 0 {
                doomed.push((time, instance, n, removed));
                kept.push((time, instance, state));
            }
            n
        },
    )?;
    for (time, instance, state) in &kept {
        if state.is_empty() {
            conn.prepare_cached(
                "DELETE FROM history_states WHERE entity = ?1 AND time = ?2 AND instance = ?3",
            )?
            .execute((key, time, instance))?;
        } else {
            let (text, n) = encode_attrs(
                state
                    .iter()
                    .map(|(a, StoredAttr(t, v, num))| (a.as_str(), t.as_str(), v.as_str(), *num)),
            );
            conn.prepare_cached(
                "UPDATE history_states SET attrs = ?4, rows = ?5 \
                 WHERE entity = ?1 AND time = ?2 AND instance = ?3",
            )?
            .execute((key, time, instance, text, n as i64))?;
        }
    }
    for &(period, bucket) in cut {
        correct_cut_bucket(conn, key, attrs, &doomed, period, bucket)?;
    }
    Ok(rows_doomed)
}

/// Corrects an entity's rollups of the bucket `(period, bucket)` a delete
/// cut through, for the states it just deleted (`doomed`): per attribute,
/// what is left of the bucket, from the stored rollup, the deleted rows and
/// the rows still in the bucket ([`crate::rollup::after_delete`]).
fn correct_cut_bucket(
    conn: &Connection,
    key: i64,
    attrs: &[String],
    doomed: &[DoomedState],
    period: i64,
    bucket: i64,
) -> rusqlite::Result<()> {
    use crate::rollup::{after_delete, floor_to};
    let mut deleted: std::collections::BTreeMap<&str, RollupPartial> = Default::default();
    for (time, _, _, state) in doomed {
        if floor_to(*time, period) != bucket {
            continue;
        }
        for (attr, StoredAttr(_, _, number)) in state {
            deleted.entry(attr.as_str()).or_default().add(*number);
        }
    }
    if deleted.is_empty() {
        return Ok(());
    }
    let mut remaining: std::collections::BTreeMap<String, RollupPartial> = Default::default();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT attrs FROM history_states WHERE entity = ?1 AND time >= ?2 AND time < ?3",
        )?;
        let mut rows = stmt.query((key, bucket, bucket + period))?;
        while let Some(row) = rows.next()? {
            for (attr, StoredAttr(_, _, number)) in state_attrs(row, 0)? {
                remaining.entry(attr).or_default().add(number);
            }
        }
    }
    for attr in attrs {
        let Some(deleted) = deleted.get(attr.as_str()) else {
            continue;
        };
        let stored = conn
            .prepare_cached(
                "SELECT rows, numbers, sum_value, min_value, max_value FROM history_rollups \
                 WHERE entity = ?1 AND attr = ?2 AND period = ?3 AND bucket = ?4",
            )?
            .query_row((key, attr, period, bucket), partial_of)
            .optional()?;
        let Some(stored) = stored else { continue };
        let left = remaining.get(attr).cloned().unwrap_or_default();
        match after_delete(&stored, deleted, &left) {
            None => conn
                .prepare_cached(
                    "DELETE FROM history_rollups \
                     WHERE entity = ?1 AND attr = ?2 AND period = ?3 AND bucket = ?4",
                )?
                .execute((key, attr, period, bucket))?,
            Some(p) => conn
                .prepare_cached(
                    "UPDATE history_rollups SET rows = ?5, numbers = ?6, sum_value = ?7, \
                         min_value = ?8, max_value = ?9 \
                     WHERE entity = ?1 AND attr = ?2 AND period = ?3 AND bucket = ?4",
                )?
                .execute((
                    key,
                    attr,
                    period,
                    bucket,
                    p.rows as i64,
                    p.numbers as i64,
                    p.sum(),
                    p.min,
                    p.max,
                ))?,
        };
    }
    Ok(())
}

/// The rollup partial of a `rows, numbers, sum, min, max` result row.
fn partial_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<RollupPartial> {
    let sum: Option<f64> = r.get(2)?;
    Ok(RollupPartial {
        rows: r.get::<_, i64>(0)? as u64,
        numbers: r.get::<_, i64>(1)? as u64,
        sum: sum.unwrap_or(0.0),
        min: r.get(3)?,
        max: r.get(4)?,
    })
}

/// The keys of the entities a delete covers, in (type, id) order: its
/// tenant's entities with its id and/or type, under its service path.
/// With neither an id nor a type, none.
fn delete_targets(conn: &Connection, d: &HistoryDelete) -> rusqlite::Result<Vec<i64>> {
    if d.entity_id.is_none() && d.entity_type.is_none() {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT key, service_path FROM history_series \
             WHERE tenant = ?1 AND (?2 IS NULL OR entity_id = ?2) \
             AND (?3 IS NULL OR entity_type = ?3) ORDER BY entity_type, entity_id",
    )?;
    let mut rows = stmt.query((&d.tenant, d.entity_id.as_deref(), d.entity_type.as_deref()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let path: String = row.get(1)?;
        if d.covers_path(&path) {
            out.push(row.get(0)?);
        }
    }
    Ok(out)
}

/// Removes an entity from `history_series` once it has neither states nor
/// rollups, and its type's `history_columns` once no entity of the type
/// is left.
fn forget_if_empty(conn: &Connection, key: i64) -> rusqlite::Result<()> {
    let left: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM history_states WHERE entity = ?1) \
             OR EXISTS (SELECT 1 FROM history_rollups WHERE entity = ?1)",
        )?
        .query_row([key], |r| r.get(0))?;
    if !left {
        let (tenant, entity_type): (String, String) = conn
            .prepare_cached("SELECT tenant, entity_type FROM history_series WHERE key = ?1")?
            .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))?;
        conn.prepare_cached("DELETE FROM history_series WHERE key = ?1")?
            .execute([key])?;
        conn.prepare_cached(
            "DELETE FROM history_columns WHERE tenant = ?1 AND entity_type = ?2 \
             AND NOT EXISTS (SELECT 1 FROM history_series WHERE tenant = ?1 AND entity_type = ?2)",
        )?
        .execute((&tenant, &entity_type))?;
    }
    Ok(())
}

/// Deletes a tenant's expired history, entity by entity, about
/// [`HISTORY_DELETE_CHUNK`] rows and buckets: states before
/// `rows_before`, minute and hour buckets that end by `rollups_before`;
/// an entity left with neither states nor rollups leaves
/// `history_series`. Every delete is a primary-key range (entity, then
/// time), so expiring old data costs what it deletes plus a few seeks per
/// entity. Answers the rows and buckets deleted.
fn expire_history(
    conn: &Connection,
    tenant: &str,
    rows_before: Option<i64>,
    rollups_before: Option<i64>,
) -> rusqlite::Result<u64> {
    let entities: Vec<i64> = conn
        .prepare_cached("SELECT key FROM history_series WHERE tenant = ?1")?
        .query_map([tenant], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut budget = HISTORY_DELETE_CHUNK as u64;
    let mut deleted = 0u64;
    for key in entities {
        if budget == 0 {
            return Ok(deleted);
        }
        if let Some(before) = rows_before {
            // Never much more than the budget: up to the state where the
            // rows reach it.
            let mut boundary: Option<(i64, i64)> = None;
            let mut rows = 0u64;
            {
                let mut stmt = conn.prepare_cached(
                    "SELECT time, instance, rows FROM history_states \
                     WHERE entity = ?1 AND time < ?2 ORDER BY time, instance",
                )?;
                let mut states = stmt.query((key, before))?;
                while rows < budget {
                    let Some(state) = states.next()? else { break };
                    boundary = Some((state.get(0)?, state.get(1)?));
                    rows += state.get::<_, i64>(2)? as u64;
                }
            }
            if let Some((time, instance)) = boundary {
                conn.prepare_cached(
                    "DELETE FROM history_states WHERE entity = ?1 \
                     AND (time < ?2 OR (time = ?2 AND instance <= ?3))",
                )?
                .execute((key, time, instance))?;
            }
            deleted += rows;
            budget = budget.saturating_sub(rows);
        }
        if let Some(before) = rollups_before {
            let n =
                conn.prepare_cached(
                    "DELETE FROM history_rollups WHERE entity = ?1 AND period = ?2 \
                     AND bucket <= ?3",
                )?
                .execute((
                    key,
                    crate::rollup::MINUTE_MS,
                    before - crate::rollup::MINUTE_MS,
                ))? + conn
                    .prepare_cached(
                        "DELETE FROM history_rollups WHERE entity = ?1 AND period = ?2 \
                         AND bucket <= ?3",
                    )?
                    .execute((key, crate::rollup::HOUR_MS, before - crate::rollup::HOUR_MS))?;
            deleted += n as u64;
            budget = budget.saturating_sub(n as u64);
        }
        forget_if_empty(conn, key)?;
    }
    Ok(deleted)
}

// --- reads ----------------------------------------------------------------
//
// Every entity's states are one contiguous range of the `history_states`
// primary key, in time order. So a query first decides which entities and
// attributes it covers — entities from `history_series`, attributes from
// the query or by skipping through the rollups' key — and then reads each
// entity's states with one range scan (a backward one for `last_n`),
// picking the attributes asked for out of each state.

/// An entity with history, as queries need it.
struct SeriesEntity {
    key: i64,
    id: String,
    ty: String,
    path: String,
}

/// The entities of `tenant` with history, optionally of one type and under
/// a service-path prefix, ordered by type then id (the key's order).
fn series_entities(
    conn: &Connection,
    tenant: &str,
    entity_type: Option<&str>,
    prefix: Option<&str>,
) -> Result<Vec<SeriesEntity>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, entity_id, entity_type, service_path FROM history_series \
             WHERE tenant = ?1 AND (?2 IS NULL OR entity_type = ?2) \
             ORDER BY entity_type, entity_id",
        )
        .db()?;
    let mut rows = stmt.query((tenant, entity_type)).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let path: String = row.get(3).db()?;
        if prefix.is_none_or(|p| path_matches(p, &path)) {
            out.push(SeriesEntity {
                key: row.get(0).db()?,
                id: row.get(1).db()?,
                ty: row.get(2).db()?,
                path,
            });
        }
    }
    Ok(out)
}

/// The entities of `tenant` with history, as [`HistoryStore::history_entities`]
/// lists them.
fn history_entities(
    conn: &Connection,
    tenant: &str,
    entity_type: Option<&str>,
    prefix: Option<&str>,
) -> Result<Vec<HistoryEntity>> {
    Ok(series_entities(conn, tenant, entity_type, prefix)?
        .into_iter()
        .map(|e| HistoryEntity {
            entity_id: e.id,
            entity_type: e.ty,
            service_path: e.path,
        })
        .collect())
}

/// The entities a query covers, ordered by id then type. With ids, each is
/// looked up (through `history_series_id`); without, the tenant's (or the
/// type's) entities are listed. The service-path filter applies to the
/// path an entity was first recorded under.
fn query_entities(conn: &Connection, q: &HistoryQuery) -> Result<Vec<SeriesEntity>> {
    let prefix = q.service_path.as_deref();
    let mut out = if q.entity_ids.is_empty() {
        series_entities(conn, &q.tenant, q.entity_type.as_deref(), prefix)?
    } else {
        let mut stmt = conn
            .prepare_cached(
                "SELECT key, entity_type, service_path FROM history_series \
                 WHERE tenant = ?1 AND entity_id = ?2 AND (?3 IS NULL OR entity_type = ?3)",
            )
            .db()?;
        let mut out = Vec::new();
        for id in &q.entity_ids {
            let mut rows = stmt.query((&q.tenant, id, q.entity_type.as_deref())).db()?;
            while let Some(row) = rows.next().db()? {
                let path: String = row.get(2).db()?;
                if prefix.is_none_or(|p| path_matches(p, &path)) {
                    out.push(SeriesEntity {
                        key: row.get(0).db()?,
                        id: id.clone(),
                        ty: row.get(1).db()?,
                        path,
                    });
                }
            }
        }
        out
    };
    out.sort_unstable_by(|a, b| (&a.id, &a.ty).cmp(&(&b.id, &b.ty)));
    out.dedup_by_key(|e| e.key);
    Ok(out)
}

/// The attributes an entity has rollups of, in order: every attribute
/// with rows has them (rollups are kept at least as long as rows), and
/// they outlive the rows when a tenant's retention downsamples. Each is
/// found by a seek past the previous one (a skip-scan of the key), so an
/// entity with millions of rows costs a few lookups per attribute.
fn entity_attrs(conn: &Connection, key: i64) -> rusqlite::Result<Vec<String>> {
    let mut next = conn.prepare_cached(
        "SELECT attr FROM history_rollups WHERE entity = ?1 AND attr > ?2 \
             ORDER BY attr LIMIT 1",
    )?;
    let mut out = Vec::new();
    let mut current: Option<String> = next.query_row((key, ""), |r| r.get(0)).optional()?;
    while let Some(attr) = current {
        current = next.query_row((key, &attr), |r| r.get(0)).optional()?;
        out.push(attr);
    }
    Ok(out)
}

/// The attributes recorded for a type (`history_columns`), sorted.
fn history_attributes(conn: &Connection, tenant: &str, entity_type: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = conn
        .prepare_cached("SELECT attr FROM history_columns WHERE tenant = ?1 AND entity_type = ?2")
        .db()?
        .query_map((tenant, entity_type), |r| r.get(0))
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    // By bytes, as Rust orders strings (SQLite's BINARY collation agrees,
    // but the order is part of the answer).
    names.sort_unstable();
    Ok(names)
}

/// The attributes of `e` a query covers, in order.
fn query_attrs(conn: &Connection, q: &HistoryQuery, e: &SeriesEntity) -> Result<Vec<String>> {
    if q.attrs.is_empty() {
        return entity_attrs(conn, e.key).db();
    }
    let mut wanted = q.attrs.clone();
    wanted.sort_unstable();
    wanted.dedup();
    Ok(wanted)
}

/// Rows matching `q`: per entity, one scan of its states in range (a
/// backward one with `last_n`, stopping once every attribute has its N
/// newest rows; a forward one otherwise, stopping once every attribute
/// has `offset` + `limit`), then per series `offset` and `limit` (at most
/// [`MAX_QUERY_ROWS`](super::reader::MAX_QUERY_ROWS), QuantumLeap's cap)
/// in ascending time.
fn query_history(conn: &Connection, q: &HistoryQuery) -> Result<Vec<HistoryRow>> {
    let (from, to) = q.time_range();
    let per_series = limit(q.limit) as usize;
    let mut out = Vec::new();
    if per_series == 0 || q.last_n == Some(0) {
        return Ok(out);
    }
    // One snapshot for every entity, whatever commits meanwhile (a read
    // transaction; dropping it at the end only ends the read).
    let _snapshot = conn.unchecked_transaction().db()?;
    let mut forward = conn
        .prepare_cached(
            "SELECT time, instance, service_path, attrs FROM history_states \
             WHERE entity = ?1 AND time >= ?2 AND time <= ?3 ORDER BY time, instance",
        )
        .db()?;
    let mut backward = conn
        .prepare_cached(
            "SELECT time, instance, service_path, attrs FROM history_states \
             WHERE entity = ?1 AND time >= ?2 AND time <= ?3 \
             ORDER BY time DESC, instance DESC",
        )
        .db()?;
    // The service path filters each state by its own path (QuantumLeap
    // keeps one per row), so every entity is looked at whatever path it
    // was first recorded under.
    let prefix = q.service_path.as_deref();
    let every_path = HistoryQuery {
        service_path: None,
        ..q.clone()
    };
    for e in query_entities(conn, &every_path)? {
        let attrs = query_attrs(conn, q, &e)?;
        if attrs.is_empty() {
            continue;
        }
        // How many rows each series needs from the scan.
        let need = match q.last_n {
            Some(n) => n,
            None => q.offset.saturating_add(per_series),
        };
        // With `every_state`, one more series: the states holding none
        // of the attributes asked.
        let marker = q.every_state && !q.attrs.is_empty();
        let mut series: Vec<Vec<HistoryRow>> = (0..attrs.len() + usize::from(marker))
            .map(|_| Vec::new())
            .collect();
        let mut rows = match q.last_n {
            Some(_) => backward.query((e.key, from, to)),
            None => forward.query((e.key, from, to)),
        }
        .db()?;
        let mut open = series.len();
        // With markers the scan covers the first `need` states: every
        // state after them lies beyond the first `need` records.
        let mut states_left = need;
        while open > 0 && states_left > 0 {
            let Some(row) = rows.next().db()? else { break };
            let path: Option<String> = row.get(2).db()?;
            if prefix.is_some_and(|p| !path_matches(p, path.as_deref().unwrap_or(&e.path))) {
                continue;
            }
            if marker {
                states_left -= 1;
            }
            let (picked, any) = pick_attrs(row, 3, &attrs, |i| series[i].len() < need).db()?;
            let time: i64 = row.get(0).db()?;
            let instance: i64 = row.get(1).db()?;
            if marker && !any && series[attrs.len()].len() < need {
                let rows = &mut series[attrs.len()];
                rows.push(HistoryRow {
                    tenant: q.tenant.clone(),
                    service_path: path.clone().unwrap_or_else(|| e.path.clone()),
                    entity_id: e.id.clone(),
                    entity_type: e.ty.clone(),
                    attr: crate::STATE_MARKER.to_string(),
                    attr_type: String::new(),
                    time,
                    instance,
                    value: "null".to_string(),
                    number: None,
                });
                if rows.len() == need {
                    open -= 1;
                }
            }
            for ((attr, rows), picked) in attrs.iter().zip(series.iter_mut()).zip(picked) {
                let Some(StoredAttr(attr_type, value, number)) = picked else {
                    continue;
                };
                rows.push(HistoryRow {
                    tenant: q.tenant.clone(),
                    service_path: path.clone().unwrap_or_else(|| e.path.clone()),
                    entity_id: e.id.clone(),
                    entity_type: e.ty.clone(),
                    attr: attr.clone(),
                    attr_type,
                    time,
                    instance,
                    value,
                    number,
                });
                if rows.len() == need {
                    open -= 1;
                }
            }
        }
        for mut rows in series {
            if q.last_n.is_some() {
                rows.reverse();
            }
            out.extend(rows.into_iter().skip(q.offset).take(per_series));
        }
    }
    Ok(out)
}

/// The SQL of the start (epoch ms, UTC) of the bucket holding the time in
/// `column`. Fixed-length periods floor it to a multiple of their length
/// (also for times before 1970); months and years use SQLite's calendar.
/// No period: one bucket (0) for everything.
fn bucket_sql(period: Option<AggrPeriod>, column: &str) -> String {
    let fixed = |unit: i64| format!("({column} - (({column} % {unit}) + {unit}) % {unit})");
    let calendar = |start: &str| {
        format!(
            "(CAST(strftime('%s', {column} / 1000.0, 'unixepoch', '{start}') AS INTEGER) * 1000)"
        )
    };
    match period {
        None => "0".to_string(),
        Some(AggrPeriod::Second) => fixed(1_000),
        Some(AggrPeriod::Minute) => fixed(60_000),
        Some(AggrPeriod::Hour) => fixed(3_600_000),
        Some(AggrPeriod::Day) => fixed(86_400_000),
        Some(AggrPeriod::Month) => calendar("start of month"),
        Some(AggrPeriod::Year) => calendar("start of year"),
    }
}

/// Earliest and latest times an aggregation considers: far beyond any
/// real time index, and far enough from `i64`'s ends that bucket
/// arithmetic never overflows.
const AGGREGATE_BOUND: i64 = 1 << 52;

/// Aggregates per series and bucket. Each entity's range is split
/// ([`crate::rollup::plan`]) into whole hours, answered from the hour
/// rollups, whole minutes at the edges, from the minute rollups, and the
/// ragged ends, from the states — so a day of hourly averages reads 24
/// stored buckets per series instead of every row, and aggregates still
/// answer for ranges whose rows a tenant's retention has downsampled away.
/// Seconds are computed from the states. Without a period, one aggregate
/// per series that has rows in range, its bucket the time of the first of
/// them.
fn aggregate_history(
    conn: &Connection,
    q: &HistoryQuery,
    method: AggrMethod,
    period: Option<AggrPeriod>,
) -> Result<Vec<HistoryAggregate>> {
    use crate::rollup::{plan, Level, HOUR_MS, MINUTE_MS};
    let states_sql = format!(
        "SELECT {bucket}, attrs FROM history_states \
         WHERE entity = ?1 AND time >= ?2 AND time < ?3",
        bucket = bucket_sql(period, "time")
    );
    let rollups_sql = format!(
        "SELECT {bucket}, SUM(rows), SUM(numbers), SUM(sum_value), MIN(min_value), MAX(max_value) \
         FROM history_rollups WHERE entity = ?1 AND attr = ?2 AND period = ?5 \
         AND bucket >= ?3 AND bucket < ?4 GROUP BY 1",
        bucket = bucket_sql(period, "bucket")
    );
    let coarsest = match period {
        Some(AggrPeriod::Second) => None,
        Some(AggrPeriod::Minute) => Some(MINUTE_MS),
        _ => Some(HOUR_MS),
    };
    let (from, to) = q.time_range();
    let from = from.clamp(-AGGREGATE_BOUND, AGGREGATE_BOUND);
    let to = to.clamp(-AGGREGATE_BOUND, AGGREGATE_BOUND) + 1;
    let pieces = plan(from, to, coarsest);
    // One snapshot for every entity, as in `query_history`.
    let _snapshot = conn.unchecked_transaction().db()?;
    let mut from_states = conn.prepare_cached(&states_sql).db()?;
    let mut from_rollups = conn.prepare_cached(&rollups_sql).db()?;
    let mut out = Vec::new();
    for e in query_entities(conn, q)? {
        let attrs = query_attrs(conn, q, &e)?;
        if attrs.is_empty() {
            continue;
        }
        let mut buckets: Vec<std::collections::BTreeMap<i64, RollupPartial>> =
            attrs.iter().map(|_| Default::default()).collect();
        for &(level, a, b) in &pieces {
            match level {
                Level::Rows => {
                    let mut rows = from_states.query((e.key, a, b)).db()?;
                    while let Some(row) = rows.next().db()? {
                        let bucket: i64 = row.get(0).db()?;
                        let (picked, _) = pick_attrs(row, 1, &attrs, |_| true).db()?;
                        for (series, picked) in buckets.iter_mut().zip(picked) {
                            if let Some(StoredAttr(_, _, number)) = picked {
                                series.entry(bucket).or_default().add(number);
                            }
                        }
                    }
                }
                Level::Rollup(unit) => {
                    for (attr, series) in attrs.iter().zip(buckets.iter_mut()) {
                        let mut rows = from_rollups.query((e.key, attr, a, b, unit)).db()?;
                        while let Some(row) = rows.next().db()? {
                            let count: i64 = row.get(1).db()?;
                            if count == 0 {
                                continue;
                            }
                            let partial = partial_of_aggregate(row)?;
                            series.entry(row.get(0).db()?).or_default().merge(&partial);
                        }
                    }
                }
            }
        }
        for (attr, series) in attrs.iter().zip(buckets) {
            for (bucket, partial) in series {
                let bucket = match period {
                    Some(_) => bucket,
                    None => first_time(conn, e.key, attr, from, to)?,
                };
                out.push(HistoryAggregate {
                    entity_id: e.id.clone(),
                    entity_type: e.ty.clone(),
                    attr: attr.clone(),
                    bucket,
                    value: partial.value(method),
                });
            }
        }
    }
    Ok(out)
}

/// The partial of a `bucket, rows, numbers, sum, min, max` aggregate row.
fn partial_of_aggregate(row: &rusqlite::Row<'_>) -> Result<RollupPartial> {
    let sum: Option<f64> = row.get(3).db()?;
    Ok(RollupPartial {
        rows: row.get::<_, i64>(1).db()? as u64,
        numbers: row.get::<_, i64>(2).db()? as u64,
        sum: sum.unwrap_or(0.0),
        min: row.get(4).db()?,
        max: row.get(5).db()?,
    })
}

/// The time of a series' first row in `[from, to)`; when the rows are gone
/// (downsampled), the start of its first minute rollup there.
fn first_time(conn: &Connection, key: i64, attr: &str, from: i64, to: i64) -> Result<i64> {
    {
        let mut stmt = conn
            .prepare_cached(
                "SELECT time, attrs FROM history_states \
                 WHERE entity = ?1 AND time >= ?2 AND time < ?3 ORDER BY time, instance",
            )
            .db()?;
        let mut rows = stmt.query((key, from, to)).db()?;
        while let Some(row) = rows.next().db()? {
            let attrs = [attr.to_string()];
            if pick_attrs(row, 1, &attrs, |_| true).db()?.1 {
                return row.get(0).db();
            }
        }
    }
    let bucket: Option<i64> = conn
        .prepare_cached(
            "SELECT MIN(bucket) FROM history_rollups WHERE entity = ?1 AND attr = ?2 \
             AND period = ?3 AND bucket >= ?4 AND bucket < ?5",
        )
        .db()?
        .query_row(
            (
                key,
                attr,
                crate::rollup::MINUTE_MS,
                crate::rollup::floor_to(from, crate::rollup::MINUTE_MS),
                to,
            ),
            |r| r.get(0),
        )
        .db()?;
    Ok(bucket.unwrap_or(from).max(from))
}

/// The feed's entries after `after`, oldest first, as rows, until they
/// hold `max_rows` rows or more ([`read_feed_entries`]).
fn read_history_feed(
    conn: &Connection,
    after: u64,
    max_rows: usize,
) -> Result<Vec<(u64, Vec<HistoryRow>)>> {
    read_feed_entries(conn, after, max_rows)?
        .into_iter()
        .map(|(seq, bytes)| Ok((seq, decode_feed_blob(seq, &bytes)?)))
        .collect()
}

/// The feed's entries after `after`, oldest first, as compact bytes,
/// until they hold `max_rows` rows or more (entries queued as JSON text
/// are read as rows and re-encoded).
fn read_feed_entries(
    conn: &Connection,
    after: u64,
    max_rows: usize,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, rows FROM history_feed WHERE seq > ?1 ORDER BY seq")
        .db()?;
    let mut rows = stmt.query([after as i64]).db()?;
    let mut out = Vec::new();
    let mut total = 0;
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        let bytes = match row.get_ref(1).db()? {
            rusqlite::types::ValueRef::Blob(bytes) => bytes.to_vec(),
            value => {
                let text = value.as_str().map_err(|e| {
                    crate::StoreError::Corrupt(format!("history feed entry {seq}: {e}"))
                })?;
                encode_feed_entry(&decode_feed_entry(seq, text)?)
            }
        };
        total += crate::history::feed_row_count(&bytes).ok_or_else(|| {
            crate::StoreError::Corrupt(format!("history feed entry {seq}: not decodable"))
        })?;
        out.push((seq, bytes));
        if total >= max_rows {
            break;
        }
    }
    Ok(out)
}

/// The tenants that have history.
fn history_tenants(conn: &Connection) -> Result<Vec<String>> {
    conn.prepare_cached("SELECT DISTINCT tenant FROM history_series ORDER BY tenant")
        .and_then(|mut st| {
            st.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
        })
        .db()
}
