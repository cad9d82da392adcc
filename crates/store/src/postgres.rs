//! The PostgreSQL backend, for users who outgrow one SQLite file (and,
//! later, for several weft nodes sharing one database).
//!
//! Shape, mirroring the SQLite backend so both keep the same promises:
//!
//! - **Writes** go through five writers (`postgres/writer.rs`), one per
//!   log whose `seq` order consumers rely on — the ingest log, the main
//!   state (data units, entities, alarms, the changes feed, the change
//!   log), the notifications feed, the history's rows and the channels —
//!   each one task on one connection committing what is queued as one
//!   transaction, and answering after the commit. Every node's writers
//!   commit side by side; readers that follow a log forward read it only
//!   up to its horizon (`postgres/horizon.rs`), so none passes an entry
//!   another node commits late.
//! - **Reads** go through a connection pool (`deadpool-postgres`) of
//!   `pool_size` connections.
//! - **Schema**: versioned migrations applied at open under an advisory
//!   lock (`postgres/schema.rs`); history partitioned by week.
//!
//! The client is `tokio-postgres` (with `deadpool-postgres` for the pool)
//! rather than sqlx: the store's SQL is fixed and few, a writer needs to
//! own one connection for its whole life and drive savepoints itself, and
//! tokio-postgres pipelines statements on one connection; sqlx's
//! compile-time checked queries would need a database (or checked-in query
//! metadata) at build time, which `cargo build` on a fresh machine must
//! not.

mod alarms;
mod catalog;
mod channels;
mod cluster;
mod combine;
mod conn;
mod context;
mod downlinks;
mod history;
mod horizon;
mod ingest;
mod keys;
mod outbox;
mod schema;
mod units;
mod writer;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls};

pub(crate) use crate::{to_i64, MAX_QUERY_ROWS};
use crate::{Result, StoreError};
use schema::db;
use writer::{Writer, WriterConfig};

/// How to reach the database and how much of it to use.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A libpq-style URL, e.g. `postgres://weft:secret@db:5432/weft`.
    pub url: String,
    /// Connections of the read pool (the five writers have one each).
    pub pool_size: usize,
    /// Writes waiting per writer before new ones are refused as overloaded.
    pub queue_capacity: usize,
    /// Most writes per transaction.
    pub max_batch: usize,
    /// How long opening waits for the database to accept connections
    /// (a database started together with weft may need a few seconds).
    pub connect_timeout: Duration,
    /// How many partitions the pipeline is split into, for a new database
    /// (see [`ingest::settle_partitions`]).
    pub partitions: u16,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: String::new(),
            pool_size: 16,
            queue_capacity: 65_536,
            max_batch: 4_096,
            connect_timeout: Duration::from_secs(30),
            partitions: ingest::DEFAULT_PARTITIONS,
        }
    }
}

/// Opens connections of one database; shared by the pool and the writers.
pub(super) struct Connector {
    config: tokio_postgres::Config,
}

impl Connector {
    fn new(url: &str) -> Result<Connector> {
        let config = url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| StoreError::Database(format!("invalid PostgreSQL URL: {e}")))?;
        Ok(Connector { config })
    }

    /// A new connection, its I/O driven by a task of its own.
    async fn connect(&self) -> Result<Client> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(db)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "a PostgreSQL connection ended");
            }
        });
        Ok(client)
    }

    /// Connects, retrying until `timeout` while the database is not up.
    async fn connect_patiently(&self, timeout: Duration) -> Result<Client> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.connect().await {
                Ok(client) => return Ok(client),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::info!(error = %e, "waiting for PostgreSQL");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

/// The PostgreSQL store: the read pool and the five writers.
pub struct PostgresStore {
    pool: Pool,
    log: Writer,
    /// The ingest log's appends waiting to go to `log` together.
    appends: combine::Combined<ingest::Append>,
    /// The NGSI entity writes waiting to go to `main` together.
    entity_puts: combine::Combined<context::EntityPut>,
    /// The QuantumLeap notifications waiting to go to `notified` together.
    notifications: combine::Combined<history::QueuedNotification>,
    main: Writer,
    /// Queues QuantumLeap notifications in their feed.
    notified: Writer,
    /// Moves the feeds into the history, and deletes and expires it.
    history: Writer,
    /// The notifications feed's horizon (see `postgres/horizon.rs`).
    notified_through: watch::Receiver<u64>,
    /// The newest notification this store queued (committed).
    notified_last: std::sync::atomic::AtomicU64,
    /// How far this store moved the notifications feed.
    notified_moved: std::sync::atomic::AtomicU64,
    channels: Writer,
    committed: watch::Receiver<u64>,
    /// The ingest log's horizon (read through `committed`), followed while
    /// the store lives.
    _log_horizon: horizon::Tracked,
    /// The notifications feed's (read through `notified_through`).
    _notified_horizon: horizon::Tracked,
    /// The horizon of the logs the main writer appends to
    /// (`context::MAIN`), read up to by their forward readers.
    main_logs: horizon::Tracked,
    /// The channel messages' horizon (`channels::PUBLISHED`).
    channel_messages: horizon::Tracked,
    /// The weekly history partitions known to exist.
    partitions: history::Partitions,
    /// How many partitions the pipeline is split into (fixed in the
    /// database when it was created).
    pipeline_partitions: u16,
    /// The history series ids known (committed).
    series: history::SeriesIds,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("committed_seq", &*self.committed.borrow())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects, migrates the schema, and starts the writers.
    pub async fn open(config: PostgresConfig) -> Result<PostgresStore> {
        let connector = Arc::new(Connector::new(&config.url)?);
        let mut client = connector.connect_patiently(config.connect_timeout).await?;
        let version = schema::migrate(&mut client).await?;
        let partitions = ingest::settle_partitions(&client, config.partitions).await?;
        // Where readers of the ingest log may read up to (see
        // `postgres/horizon.rs`).
        let horizon = horizon::settle(&client, &ingest::LOG).await?;
        let notified_horizon = horizon::settle(&client, &history::NOTIFIED).await?;
        let main_horizon = horizon::settle(&client, &context::MAIN).await?;
        let published_horizon = horizon::settle(&client, &channels::PUBLISHED).await?;
        drop(client);

        let manager = Manager::from_config(
            connector.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .build()
            .map_err(|e| StoreError::Database(format!("building the connection pool: {e}")))?;

        let last_seq = horizon.through[0];
        let (committed_tx, committed) = watch::channel(last_seq);
        let log_committed = Arc::new(tokio::sync::Notify::new());
        let writer = |name| WriterConfig {
            name,
            queue_capacity: config.queue_capacity,
            max_batch: config.max_batch,
            opening: None,
            session: None,
        };
        // The log's writers of several nodes append side by side: see
        // `postgres/horizon.rs` for how readers never pass an entry that
        // commits late.
        let log = Writer::start(
            connector.clone(),
            WriterConfig {
                opening: Some(ingest::LOG.opening),
                session: Some(ingest::LOG.session),
                ..writer("log")
            },
            Some(log_committed.clone()),
        )
        .await?;
        let log_horizon = horizon::Tracked::start(
            pool.clone(),
            &ingest::LOG,
            horizon,
            log_committed,
            Some(committed_tx),
        );
        // The main writer appends to logs read forward from a cursor too
        // (data units, alarm events, the changes feed of history): every
        // node's side by side, read up to their horizon like the ingest
        // log's, looked at when a reader asks (`context::MAIN`).
        let main = Writer::start(
            connector.clone(),
            WriterConfig {
                opening: Some(context::MAIN.opening),
                session: Some(context::MAIN.session),
                ..writer("main")
            },
            None,
        )
        .await?;
        let main_horizon = horizon::Tracked::start(
            pool.clone(),
            &context::MAIN,
            main_horizon,
            Arc::new(tokio::sync::Notify::new()),
            None,
        );
        // Each node's notifications writer queues QuantumLeap
        // notifications, which several nodes append side by side: the
        // notifications feed has a horizon like the ingest log's, its
        // writers these (`history::NOTIFIED`). Nobody waits on it but the
        // mover's read (answers go at commit), so it is looked at on its
        // interval only, not after every commit. The history writer moves
        // the feeds into the history on a connection of its own, so
        // notifications are not held up by a move; the history recorder
        // holds a node's acknowledgements back when its mover falls
        // behind (`weft_pipeline::History`).
        let (notified_tx, notified_through) = watch::channel(notified_horizon.through[0]);
        let notified = Writer::start(
            connector.clone(),
            WriterConfig {
                opening: Some(history::NOTIFIED.opening),
                session: Some(history::NOTIFIED.session),
                ..writer("notifications")
            },
            None,
        )
        .await?;
        let notified_horizon = horizon::Tracked::start(
            pool.clone(),
            &history::NOTIFIED,
            notified_horizon,
            Arc::new(tokio::sync::Notify::new()),
            Some(notified_tx),
        );
        let history = Writer::start(connector.clone(), writer("history"), None).await?;
        // Channel messages too are read forward from a cursor (a
        // subscriber's), up to their horizon (`channels::PUBLISHED`).
        let channels = Writer::start(
            connector,
            WriterConfig {
                opening: Some(channels::PUBLISHED.opening),
                session: Some(channels::PUBLISHED.session),
                ..writer("channels")
            },
            None,
        )
        .await?;
        let published_horizon = horizon::Tracked::start(
            pool.clone(),
            &channels::PUBLISHED,
            published_horizon,
            Arc::new(tokio::sync::Notify::new()),
            None,
        );
        tracing::info!(
            schema_version = version,
            last_seq,
            "opened the PostgreSQL store"
        );
        Ok(PostgresStore {
            pool,
            log,
            appends: combine::Combined::new(config.queue_capacity, Some(committed.clone())),
            entity_puts: combine::Combined::new(config.queue_capacity, None),
            notifications: combine::Combined::new(config.queue_capacity, None),
            main,
            notified,
            history,
            notified_through,
            notified_last: std::sync::atomic::AtomicU64::new(0),
            notified_moved: std::sync::atomic::AtomicU64::new(0),
            channels,
            committed,
            _log_horizon: log_horizon,
            _notified_horizon: notified_horizon,
            main_logs: main_horizon,
            channel_messages: published_horizon,
            partitions: history::Partitions::default(),
            pipeline_partitions: partitions,
            series: history::SeriesIds::default(),
        })
    }

    /// How far `log`, one of those the main writer appends to, may be read
    /// forward: its horizon, once past everything committed before this
    /// call (`horizon::Tracked::caught_up`).
    async fn main_horizon(&self, log: context::MainLog) -> u64 {
        self.main_logs
            .caught_up()
            .await
            .get(log as usize)
            .copied()
            .unwrap_or(0)
    }

    /// How far channel messages may be read forward (as
    /// [`PostgresStore::main_horizon`]).
    async fn published_horizon(&self) -> u64 {
        let through = self.channel_messages.caught_up().await;
        through.first().copied().unwrap_or(0)
    }

    /// A connection of the read pool.
    // The domain stores' reads (added domain by domain) go through it.
    #[allow(dead_code)]
    async fn reader(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Database(format!("no PostgreSQL connection: {e}")))
    }
}

/// A stored position (`seq`, cursor) as `u64`; they are never negative.
pub(super) fn position(row: &tokio_postgres::Row, index: usize) -> Result<u64> {
    let n: i64 = row.try_get(index).map_err(db)?;
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative position {n}")))
}

#[async_trait::async_trait]
impl crate::Store for PostgresStore {
    /// Commits an empty write through the main writer: `Ok` means the
    /// database takes writes right now.
    async fn ping(&self) -> Result<()> {
        self.main.write(|_| Box::pin(async { Ok(()) })).await
    }

    /// Stops accepting writes, commits what is queued, and stops the
    /// writers; the pool closes.
    async fn close(&self) {
        self.log.close().await;
        self.main.close().await;
        self.notified.close().await;
        self.history.close().await;
        self.channels.close().await;
        self.pool.close();
    }
}
