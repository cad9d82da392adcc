//! `weft serve`: builds the store, bus and engine from the configuration,
//! starts the services on them ([`Services::start`]) and pages on top of
//! those, serves the API, and shuts down in order.
//!
//! Shutdown order, once `shutdown` is cancelled: stop accepting HTTP
//! requests and let in-flight ones finish; let the ingest consumer process
//! what the ingest log already holds (bounded by [`DRAIN_TIMEOUT`];
//! anything left is processed at the next start) while the other services'
//! tasks finish; then close the store, which commits the writer's last
//! batch, and last the NATS bus (when there is one), which sends what the
//! services published last.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_api::auth::AuthMode;
use weft_api::{AppState, MetricsRender};
use weft_bus::{Bus, InProcessBus, NatsBus, NatsConfig};
use weft_engine::{Engine, EngineConfig};
use weft_model::apikey::RateLimit;
use weft_pages::service::Sources;
use weft_pages::{Pages, PagesConfig};
use weft_pipeline::channels::ChannelsConfig;
use weft_pipeline::definitions::follow;
use weft_pipeline::downlinks::DownlinksConfig;
use weft_pipeline::keys::Keys;
use weft_pipeline::rules::RulesConfig;
use weft_pipeline::subscriptions::sender::SenderConfig;
use weft_pipeline::{IngestConfig, Services, ServicesConfig};
use weft_store::{PostgresConfig, PostgresStore, SqliteConfig, SqliteStore, Store, Synchronous};

use crate::config::Config;
use crate::data_lock::DataLock;

/// Longest the ingest consumer may spend processing the remaining log at
/// shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs weft on `listener` (over TLS with `tls`, and so QuantumLeap's
/// listener too) until `shutdown` is cancelled.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    metrics: MetricsRender,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data)
        .with_context(|| format!("creating data directory {}", config.data.display()))?;
    // Held until `serve` returns, after the store has closed.
    let _lock = DataLock::acquire(&config.data)?;
    // The bus first: a node that cannot reach its NATS stops here, before
    // it has opened anything.
    let (bus, nats) = open_bus(&config).await?;
    let store = open_store(&config).await?;
    let engine = Engine::start(EngineConfig {
        workers: config.engine.workers.max(1),
        time_limit: config.engine.time_limit,
        memory_limit: config.engine.memory_limit_mb.max(1) * 1024 * 1024,
        ..EngineConfig::default()
    });
    let tracker = TaskTracker::new();
    let services_stop = CancellationToken::new();
    let mut services_config = services_config(&config);
    services_config.cluster.node = Some(node_id(&config.data)?);
    let services = Services::start(
        store.clone(),
        bus.clone(),
        engine,
        services_config,
        services_stop.clone(),
        &tracker,
    )
    .await
    .context("starting the services")?;
    let services = Arc::new(services);
    let pages = match Pages::load(
        store.clone(),
        Sources::new(
            store.clone(),
            services.context.clone(),
            services.rules.clone(),
        ),
        pages_config(&config),
        bus.clone(),
    )
    .await
    {
        Ok(pages) => pages,
        Err(e) => {
            stop_services(services_stop, tracker, &store, nats).await;
            return Err(anyhow::Error::new(e).context("loading the pages"));
        }
    };
    follow(pages.clone(), &*bus, services_stop.clone(), &tracker);

    let (auth, keys, first_key) = match start_auth(&config, &store, &bus).await {
        Ok(started) => started,
        Err(e) => {
            stop_services(services_stop, tracker, &store, nats).await;
            return Err(e);
        }
    };
    follow(keys.clone(), &*bus, services_stop.clone(), &tracker);
    match weft_mqtt::start(&config.mqtt, &services, services_stop.clone(), &tracker).await {
        Ok(Some(addr)) => services.mqtt.set_broker(addr),
        Ok(None) => {}
        Err(e) => {
            stop_services(services_stop, tracker, &store, nats).await;
            return Err(anyhow::anyhow!(e).context("starting MQTT"));
        }
    }
    let ingest_key = (!config.ingest_key.is_empty()).then(|| Arc::from(config.ingest_key.as_str()));
    if ingest_key.is_none() && auth != AuthMode::On {
        tracing::warn!(
            "no ingest key configured and keys are not checked: ingest endpoints accept uplinks without Authorization"
        );
    }
    let live_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("weft-live")
        .enable_all()
        .build()
        .context("starting the live runtime")?;
    let state = AppState {
        services,
        pages,
        ingest_key,
        metrics,
        live_runtime: live_runtime.handle().clone(),
        ngsi_multiservice: config.ngsi.multiservice,
        auth,
        keys,
        quantumleap_master: config.history.quantumleap_master,
    };
    // Every listener closes a connection whose request head is not in
    // within this (a zero setting would close every connection at once).
    let header_timeout = config.http.header_timeout.max(Duration::from_millis(100));
    let quantumleap = match config.history.quantumleap_listen {
        Some(addr) => {
            let listener = crate::http::bind(addr)
                .with_context(|| format!("binding QuantumLeap's listener {addr}"))?;
            tracing::info!(addr = %listener.local_addr()?, "serving QuantumLeap's API");
            let app = weft_api::history::quantumleap_router(state.clone());
            Some(tokio::spawn(crate::http::serve(
                listener,
                app,
                tls.clone(),
                header_timeout,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let app = weft_api::app(state);

    tracing::info!(addr = %listener.local_addr()?, data = %config.data.display(), "weft serving");
    if let Some(secret) = first_key {
        // Last thing before the first request is served, after the start's
        // log lines, so it is not lost among them.
        print_first_key(&secret);
    }
    match cors_layer(&config.http.cors_origins)? {
        Some(cors) => {
            let app = tower::Layer::layer(&cors, app);
            crate::http::serve(listener, app, tls, header_timeout, shutdown).await
        }
        None => crate::http::serve(listener, app, tls, header_timeout, shutdown).await,
    }
    if let Some(task) = quantumleap {
        let _ = task.await;
    }

    tracing::info!("HTTP stopped; draining the ingest log");
    stop_services(services_stop, tracker, &store, nats).await;
    live_runtime.shutdown_background();
    tracing::info!("weft stopped");
    Ok(())
}

/// The authentication mode and the keys: loads them and, with auth on,
/// makes sure an admin key exists — the configured `admin_key`, or on a
/// fresh data directory a new one, whose secret is returned to be printed
/// once ([`print_first_key`]).
async fn start_auth(
    config: &Config,
    store: &Arc<dyn Store>,
    bus: &Arc<dyn Bus>,
) -> anyhow::Result<(AuthMode, Arc<Keys>, Option<String>)> {
    let mode = match config.auth.as_str() {
        "on" => AuthMode::On,
        "off" => AuthMode::Off,
        "trust-proxy" => AuthMode::TrustProxy,
        other => anyhow::bail!("auth must be 'on', 'off' or 'trust-proxy', not '{other}'"),
    };
    let rate = RateLimit {
        rate: config.http.rate_limit.max(0.0),
        burst: config.http.rate_burst.max(1),
    };
    let keys = Keys::load(store.clone(), rate, bus.clone())
        .await
        .context("loading the API keys")?;
    let mut first_key = None;
    match mode {
        AuthMode::On => {
            let given = (!config.admin_key.is_empty()).then_some(config.admin_key.as_str());
            if let Some(secret) = keys.bootstrap(given).await.context("the admin key")? {
                tracing::warn!(
                    prefix = %&secret[..weft_model::apikey::SHOWN_PREFIX_LEN],
                    "created the first admin API key (printed once, below)"
                );
                first_key = Some(secret);
            }
        }
        AuthMode::Off => tracing::warn!(
            "auth = \"off\": every surface answers without an API key; for development only"
        ),
        AuthMode::TrustProxy => tracing::warn!(
            "auth = \"trust-proxy\": requests are trusted as authenticated by an upstream PEP proxy; \
             weft must be reachable only through it"
        ),
    }
    Ok((mode, Arc::new(keys), first_key))
}

/// Prints the first admin key's secret on stderr, set apart from the log
/// by rules and blank lines, the secret alone on its line (bold on a
/// terminal, unless `NO_COLOR` is set). stderr, not the log: the secret
/// is shown once, to whoever started weft, and never lands in shipped
/// logs.
fn print_first_key(secret: &str) {
    use std::io::Write;
    let (bold, plain) = if crate::colour_on_stderr() {
        ("\x1b[1m", "\x1b[0m")
    } else {
        ("", "")
    };
    let rule = "=".repeat(72);
    let text = format!(
        "\n{rule}\n\
         {bold}weft: this is the first admin API key. It is shown only this once: keep it.{plain}\n\n\
         \x20   {bold}{secret}{plain}\n\n\
         Send it as 'Authorization: Bearer <key>' (or 'X-Auth-Token: <key>');\n\
         make narrower keys with POST /api/v1/keys (docs/security.md).\n\
         {rule}\n\n"
    );
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// The CORS layer `[http] cors_origins` asks for; `None` when empty.
fn cors_layer(origins: &[String]) -> anyhow::Result<Option<tower_http::cors::CorsLayer>> {
    use axum::http::{header, HeaderName, HeaderValue};
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o)
                    .with_context(|| format!("http.cors_origins: '{o}' is not an origin"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any)
            .expose_headers([
                header::LOCATION,
                header::RETRY_AFTER,
                HeaderName::from_static("fiware-correlator"),
                HeaderName::from_static("fiware-total-count"),
                HeaderName::from_static("x-total-count"),
            ]),
    ))
}

/// Stops the services: lets the ingest consumer process what the log
/// already holds (bounded by [`DRAIN_TIMEOUT`]) and the other tasks
/// finish, then closes the store, which commits the writer's last batch,
/// and the NATS bus, which sends what they published last.
async fn stop_services(
    stop: CancellationToken,
    tracker: TaskTracker,
    store: &Arc<dyn Store>,
    nats: Option<Arc<NatsBus>>,
) {
    stop.cancel();
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "the ingest log did not drain in time; the rest is processed at the next start"
        );
    }
    store.close().await;
    if let Some(nats) = nats {
        nats.close().await;
    }
}

/// The services' tuning, from the configuration.
fn services_config(config: &Config) -> ServicesConfig {
    ServicesConfig {
        ingest: IngestConfig {
            batch_size: config.pipeline.batch_size.max(1),
            max_backlog: config.pipeline.max_backlog,
            log_retention: config.pipeline.log_retention,
        },
        notifications: SenderConfig {
            timeout: config.notifications.timeout,
            lanes: config.notifications.connections_per_endpoint.max(1),
            lane_capacity: config.notifications.queue_per_connection.max(1),
            id_header: config.notifications.id_header,
            retention: config.notifications.retention,
            max_owed: config.notifications.max_owed.max(1),
        },
        record_history: config.history.record_changes,
        history_retention: config.history.retention_policy(),
        channels: ChannelsConfig {
            expire_after: config.channels.expire_after,
            bridges: config.channels.bridges.clone().into_iter().collect(),
            rules: config.channels.rules.clone(),
            admin_tokens: config.channels.admin_tokens.clone(),
            ..Default::default()
        },
        rules: RulesConfig {
            script_time_limit: config.rules.script_time_limit,
            inactivity_check: config.rules.inactivity_check,
            state_limits: weft_pipeline::rules::StateLimits {
                per_device: config.rules.max_state_bytes,
                total: config.rules.max_total_state_bytes,
            },
        },
        forward_timeout: config.ngsi.forward_timeout,
        cluster: weft_pipeline::cluster::ClusterConfig {
            node: None,
            lease_ttl: config
                .cluster
                .lease_ttl
                .max(std::time::Duration::from_millis(300)),
            address: if config.cluster.address.is_empty() {
                config.listen.to_string()
            } else {
                config.cluster.address.clone()
            },
        },
        downlinks: DownlinksConfig {
            retry_initial: config.downlinks.retry_initial,
            retry_max: config
                .downlinks
                .retry_max
                .max(config.downlinks.retry_initial),
            max_attempts: config.downlinks.max_attempts.max(1),
            request_timeout: config.downlinks.request_timeout,
            pending_recheck: config.downlinks.pending_recheck,
            chirpstack: config.downlinks.chirpstack.as_ref().map(|c| c.api()),
            chirpstack_by_type: config
                .downlinks
                .chirpstack_types
                .iter()
                .map(|(name, c)| (name.clone(), c.api()))
                .collect(),
        },
    }
}

/// Pages' tuning, from the configuration.
fn pages_config(config: &Config) -> PagesConfig {
    PagesConfig {
        max_concurrent_renders: config.pages.max_concurrent_renders,
        default_fallback: config.pages.default_fallback.clone(),
        max_waiting_renders: config.pages.max_waiting_renders,
        directory: config.pages.directory.clone(),
        services: config.pages.services.clone().into_iter().collect(),
        coalesce_calls: config.pages.coalesce_calls,
    }
}

/// The bus `[bus]` names: in-process, or NATS JetStream at `[bus] url`
/// (also returned as itself, to be closed last). A NATS that cannot be
/// reached fails the start.
async fn open_bus(config: &Config) -> anyhow::Result<(Arc<dyn Bus>, Option<Arc<NatsBus>>)> {
    match config.bus.backend.as_str() {
        "in-process" => {
            let bus: Arc<dyn Bus> = Arc::new(InProcessBus::default());
            Ok((bus, None))
        }
        "nats" => {
            let nats = NatsBus::connect(NatsConfig {
                url: config.bus.url.clone(),
                cluster: config.bus.cluster.clone(),
            })
            .await
            .context("starting the NATS bus")?;
            let bus: Arc<dyn Bus> = nats.clone();
            Ok((bus, Some(nats)))
        }
        other => anyhow::bail!("bus.backend must be 'in-process' or 'nats', not '{other}'"),
    }
}

/// This node's id in the cluster, kept in the data directory (`node-id`,
/// made at its first start): a node restarted after a crash is the same
/// node, and takes its leases back at once instead of waiting for them to
/// expire. The data directory is locked to one process, so no two live
/// nodes share an id.
fn node_id(data: &std::path::Path) -> anyhow::Result<String> {
    let path = data.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    std::fs::write(&path, format!("{id}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// Opens the backend `[store]` names: SQLite in the data directory, or
/// PostgreSQL at `[store] url`.
pub(crate) async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    match config.store.backend.as_str() {
        "sqlite" => {
            let synchronous = match config.store.synchronous.as_str() {
                "full" => Synchronous::Full,
                "normal" => Synchronous::Normal,
                other => {
                    anyhow::bail!("store.synchronous must be 'full' or 'normal', not '{other}'")
                }
            };
            let store_config = SqliteConfig {
                path: config.data.join("weft.db"),
                read_connections: config.store.read_connections.max(1),
                synchronous,
                ..SqliteConfig::default()
            };
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(store_config))
                .await?
                .context("opening the SQLite store")?;
            Ok(Arc::new(store))
        }
        "postgres" => {
            if config.store.url.is_empty() {
                anyhow::bail!(
                    "store.backend is 'postgres' but store.url is empty: \
                     set WEFT_STORE__URL=postgres://user:password@host/database"
                );
            }
            let store = PostgresStore::open(PostgresConfig {
                url: config.store.url.clone(),
                pool_size: config.store.pool_size.max(1),
                partitions: config.store.partitions,
                ..PostgresConfig::default()
            })
            .await
            .context("opening the PostgreSQL store")?;
            Ok(Arc::new(store))
        }
        other => anyhow::bail!("store.backend must be 'sqlite' or 'postgres', not '{other}'"),
    }
}
