//! weft's services wired together, once: the value the binary builds at
//! start and the API holds.
//!
//! Each service owns its state and its tasks; [`Services::start`] loads
//! them in the order they depend on each other and starts the ingest
//! consumer last, once everything it feeds is running. Pages are not
//! here: they live in a crate of their own on top of this one, and the
//! binary builds them from the context and the rules it finds here.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_bus::Bus;
use weft_engine::Engine;
use weft_store::{Store, StoreError};

use crate::catalog::Catalog;
use crate::channels::bridge::Bridges;
use crate::channels::{Channels, ChannelsConfig};
use crate::cluster::{work, Cluster, ClusterConfig};
use crate::context::{self, Context};
use crate::definitions::follow;
use crate::downlinks::{Downlinks, DownlinksConfig};
use crate::forwarding::{Forwarder, Providers};
use crate::history::{History, RetentionPolicy};
use crate::ingest::{Ingest, IngestConfig};
use crate::ld_contexts::LdContexts;
use crate::ngsi_write::NgsiWriter;
use crate::registrations::Registrations;
use crate::rules::{RuleEngine, RulesConfig};
use crate::subscriptions::sender::SenderConfig;
use crate::subscriptions::Subscriptions;

/// Tuning of every service; the defaults carry the seed workloads.
#[derive(Debug, Clone)]
pub struct ServicesConfig {
    /// The ingest consumer's tuning.
    pub ingest: IngestConfig,
    /// How NGSI notifications are sent.
    pub notifications: SenderConfig,
    /// Whether entity changes are recorded as history.
    pub record_history: bool,
    /// How long each tenant's history is kept.
    pub history_retention: RetentionPolicy,
    /// The rule engine's tuning.
    pub rules: RulesConfig,
    /// Durable channels' tuning.
    pub channels: ChannelsConfig,
    /// How long a context provider has to answer a forwarded request.
    pub forward_timeout: Duration,
    /// How this node takes its share of the cluster's work.
    pub cluster: ClusterConfig,
    /// How downlinks are sent.
    pub downlinks: DownlinksConfig,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        ServicesConfig {
            ingest: IngestConfig::default(),
            notifications: Default::default(),
            record_history: false,
            history_retention: RetentionPolicy {
                interval: Duration::from_secs(60),
                ..RetentionPolicy::default()
            },
            rules: RulesConfig::default(),
            channels: ChannelsConfig::default(),
            forward_timeout: crate::forwarding::DEFAULT_TIMEOUT,
            cluster: ClusterConfig::default(),
            downlinks: DownlinksConfig::default(),
        }
    }
}

/// The running services, each behind an `Arc` so a surface takes the one
/// it needs. Built once by [`Services::start`]; the fields are the
/// services themselves, not views of one another.
pub struct Services {
    /// The ingest consumer: accepts uplinks into the log and turns the log
    /// into data units, entities and events.
    pub ingest: Arc<Ingest>,
    /// Device types and devices.
    pub catalog: Arc<Catalog>,
    /// The NGSI context: the entities of every tenant.
    pub context: Arc<Context>,
    /// The NGSI registrations of every tenant.
    pub registrations: Arc<Registrations>,
    /// Which context providers a query reaches, and what their answers
    /// add to the local entities.
    pub providers: Arc<Providers>,
    /// The NGSI write: every change clients make to entities.
    pub ngsi_writer: Arc<NgsiWriter>,
    /// The NGSI subscriptions of every tenant, and their notifications.
    pub subscriptions: Arc<Subscriptions>,
    /// The history recorder and its retention.
    pub history: Arc<History>,
    /// The rule engine: rules and alarms.
    pub rules: Arc<RuleEngine>,
    /// Durable pull channels (the DSPS API).
    pub channels: Arc<Channels>,
    /// The bridges publishing weft's events into channels.
    pub bridges: Arc<Bridges>,
    /// Downlink queues, their delivery, and NGSI commands.
    pub downlinks: Arc<Downlinks>,
    /// The store, for the API's read-only queries.
    pub store: Arc<dyn Store>,
    /// The bus, for live subscribers.
    pub bus: Arc<dyn Bus>,
    /// This node among the others: its id and the work it does now.
    pub cluster: Arc<Cluster>,
    /// The running MQTT ingest sources: their state for `/health`, and a
    /// handle per source to publish back on its connection. Empty until
    /// the MQTT surface registers its sources.
    pub mqtt: Arc<crate::mqtt::Links>,
    /// The `@context`s NGSI-LD requests name, fetched once and kept.
    pub ld_contexts: Arc<LdContexts>,
}

impl Services {
    /// Loads and starts every service, in order: the catalog; the context,
    /// brought up to date with the units stored after its entities; the
    /// registrations and subscriptions; history; the subscriptions
    /// listening to the context; the rules; the channels and their
    /// bridges; the reloads of definitions other nodes change; and last
    /// the ingest consumer. Tasks run on `tracker` and stop when
    /// `shutdown` is cancelled.
    pub async fn start(
        store: Arc<dyn Store>,
        bus: Arc<dyn Bus>,
        engine: Engine,
        config: ServicesConfig,
        shutdown: CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<Services, StoreError> {
        let node = config
            .cluster
            .node
            .clone()
            .or_else(|| bus.node().map(str::to_string))
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let cluster = Cluster::new(store.clone(), node, config.cluster.clone());
        tracker.spawn(cluster.clone().heartbeat_loop(shutdown.clone()));
        let catalog = Arc::new(Catalog::load(store.clone(), engine.clone(), bus.clone()).await?);
        // Alone, the change log is the one node's; in a cluster each node
        // logs (and serves its subscriptions from) its own.
        let log_node = if bus.node().is_some() {
            cluster.node().to_string()
        } else {
            String::new()
        };
        let changes = crate::changes::Changes::new(bus.clone(), log_node.clone());
        let log_head = store.change_log_head(&log_node).await?;
        changes.resume_after(log_head);
        let context = Arc::new(context::Context::load(store.clone(), changes).await?);
        let all: Vec<u16> = (0..store.partitions().max(1)).collect();
        crate::partitions::replay_units_into_context(&store, &catalog, &context, &all).await?;
        tracker.spawn(context.clone().follow_remote(bus.clone(), shutdown.clone()));
        if bus.node().is_some() {
            tracker.spawn(context.clone().forget_expired_loop(shutdown.clone()));
        }
        {
            let context = context.clone();
            cluster.run_leased(work::EXPIRY, shutdown.clone(), tracker, move |stop| {
                context.clone().expiry_loop(stop)
            });
        }
        let registrations = Arc::new(Registrations::load(store.clone(), bus.clone()).await?);
        let ld_contexts = Arc::new(LdContexts::load(store.clone()).await?);
        let subscriptions = Subscriptions::load(
            store.clone(),
            config.notifications.clone(),
            bus.clone(),
            &log_node,
            log_head,
        )
        .await?;
        context.set_record_history(config.record_history);
        let history = History::new(store.clone(), config.history_retention.clone());
        history.set_clustered(bus.node().is_some());
        if bus.node().is_some() {
            history.ring_movers_through(bus.clone());
        }
        {
            let history = history.clone();
            cluster.run_leased(work::HISTORY, shutdown.clone(), tracker, move |stop| {
                history.clone().run(stop)
            });
        }
        {
            let history = history.clone();
            let count = store.change_feed_partitions();
            cluster.run_partitioned(
                work::HISTORY_CHANGES,
                count,
                crate::balance::WorkCounts::new(count),
                shutdown.clone(),
                tracker,
                move |held, stop| history.clone().move_changes(held, stop),
            );
        }
        context.changes().add_listener(subscriptions.clone());
        if bus.node().is_some() {
            let (subscriptions, serving) = (subscriptions.clone(), cluster.clone());
            cluster.run_leased(work::OUTBOX, shutdown.clone(), tracker, move |stop| {
                subscriptions.clone().serve_orphans(serving.clone(), stop)
            });
        }
        tracker.spawn(subscriptions.clone().flush_loop(shutdown.clone()));
        {
            let (subscriptions, context) = (subscriptions.clone(), context.clone());
            cluster.run_leased(work::PERIODIC, shutdown.clone(), tracker, move |stop| {
                subscriptions.clone().periodic_loop(context.clone(), stop)
            });
        }
        let rules = RuleEngine::start(
            store.clone(),
            bus.clone(),
            context.clone(),
            config.rules.clone(),
        )
        .await?;
        tracker.spawn(rules.clone().follow_remote_alarms(shutdown.clone()));
        let channels = Channels::start(
            store.clone(),
            config.channels.clone(),
            bus.clone(),
            &log_node,
            shutdown.clone(),
        )
        .await?;
        let bridges = Bridges::start(
            store.clone(),
            bus.clone(),
            channels.clone(),
            config.channels.bridges.clone(),
        )
        .await
        .map_err(|e| StoreError::Database(format!("starting the channel bridges: {e}")))?;
        {
            let bridges = bridges.clone();
            cluster.run_leased(work::BRIDGES, shutdown.clone(), tracker, move |stop| {
                bridges.clone().run(stop)
            });
        }
        let mqtt: Arc<crate::mqtt::Links> = Arc::default();
        let downlinks = Arc::new(Downlinks::new(
            store.clone(),
            catalog.clone(),
            context.clone(),
            engine.clone(),
            config.downlinks.clone(),
            mqtt.clone(),
        ));
        tracker.spawn(downlinks.clone().run(shutdown.clone()));
        let ingest = Ingest::load(
            store.clone(),
            bus.clone(),
            engine,
            catalog.clone(),
            context.clone(),
            rules.clone(),
            config.ingest,
        )
        .await?;
        // What other nodes change reaches these caches from now on.
        follow(catalog.clone(), &*bus, shutdown.clone(), tracker);
        follow(rules.clone(), &*bus, shutdown.clone(), tracker);
        follow(subscriptions.clone(), &*bus, shutdown.clone(), tracker);
        follow(registrations.clone(), &*bus, shutdown.clone(), tracker);
        follow(bridges.clone(), &*bus, shutdown.clone(), tracker);
        follow(channels.clone(), &*bus, shutdown.clone(), tracker);
        follow(history.clone(), &*bus, shutdown.clone(), tracker);
        tracker.spawn(ingest.clone().follow_cursor(shutdown.clone()));
        {
            let ingest = ingest.clone();
            let rules = rules.clone();
            let shutdown_ = shutdown.clone();
            let count = ingest.partition_count();
            cluster.run_partitioned(
                work::PIPELINE,
                count,
                ingest.work_counts(),
                shutdown,
                tracker,
                move |held, stop| {
                    let ingest = ingest.clone();
                    let rules = rules.clone();
                    let shutdown = shutdown_.clone();
                    async move {
                        tokio::join!(
                            rules.run(held.clone(), count, stop.clone()),
                            ingest.run(held, stop, shutdown)
                        );
                    }
                },
            );
        }
        let providers = Arc::new(Providers::new(
            context.clone(),
            registrations.clone(),
            Arc::new(Forwarder::new(config.forward_timeout)),
        ));
        let ngsi_writer = Arc::new(NgsiWriter::new(
            context.clone(),
            downlinks.clone(),
            providers.clone(),
        ));
        Ok(Services {
            ingest,
            catalog,
            context,
            registrations,
            providers,
            ngsi_writer,
            subscriptions,
            history,
            rules,
            channels,
            bridges,
            downlinks,
            store,
            bus,
            cluster,
            mqtt,
            ld_contexts,
        })
    }
}
