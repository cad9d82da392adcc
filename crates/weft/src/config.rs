//! weft's configuration: one struct, read from (lowest to highest
//! precedence) built-in defaults, a TOML file, `WEFT_*` environment
//! variables (`__` separates sections: `WEFT_ENGINE__TIME_LIMIT=50ms`), and
//! command-line flags. docs/configuration.md lists every key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// Everything `weft serve` can be told.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP listener (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Directory holding weft's database; created if missing.
    pub data: PathBuf,
    /// Key ingest requests must carry in `Authorization`; empty = none.
    pub ingest_key: String,
    /// How requests are authenticated: `on` (API keys, the default),
    /// `off` (development only) or `trust-proxy` (an upstream PEP proxy
    /// did it). docs/security.md explains each.
    pub auth: String,
    /// A secret to store (hashed) as an admin key at start, instead of
    /// having weft make one and print it on a fresh data directory.
    pub admin_key: String,
    /// Log filter (`tracing` env-filter syntax), e.g. `info,weft_pipeline=debug`.
    pub log: String,
    /// The script sandbox.
    pub engine: EngineSection,
    /// The store: SQLite or PostgreSQL.
    pub store: StoreSection,
    /// The event bus: in-process, or NATS JetStream for several nodes.
    pub bus: BusSection,
    /// How a node shares the cluster's work with the others.
    pub cluster: ClusterSection,
    /// The uplink pipeline.
    pub pipeline: PipelineSection,
    /// The NGSI broker's notifications.
    pub notifications: NotificationsSection,
    /// The NGSI broker.
    pub ngsi: NgsiSection,
    /// History and QuantumLeap's API.
    pub history: HistorySection,
    /// The rule engine.
    pub rules: RulesSection,
    /// Durable pull channels (the DSPS API).
    pub channels: ChannelsSection,
    /// Pages (Knot.x-style templates).
    pub pages: PagesSection,
    /// The HTTP listener: rate limits, CORS.
    pub http: HttpSection,
    /// Downlinks: retries, and the network-server APIs they go through.
    pub downlinks: DownlinksSection,
    /// MQTT: brokers weft subscribes to, and the embedded broker.
    pub mqtt: weft_mqtt::MqttConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            data: PathBuf::from("./weft-data"),
            ingest_key: String::new(),
            auth: "on".into(),
            admin_key: String::new(),
            log: "info".into(),
            engine: EngineSection::default(),
            store: StoreSection::default(),
            bus: BusSection::default(),
            cluster: ClusterSection::default(),
            pipeline: PipelineSection::default(),
            notifications: NotificationsSection::default(),
            ngsi: NgsiSection::default(),
            history: HistorySection::default(),
            rules: RulesSection::default(),
            channels: ChannelsSection::default(),
            pages: PagesSection::default(),
            http: HttpSection::default(),
            downlinks: DownlinksSection::default(),
            mqtt: weft_mqtt::MqttConfig::default(),
        }
    }
}

/// `[downlinks]`: how downlinks are sent (docs/downlinks.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownlinksSection {
    /// Wait before the first retry of a failed attempt; doubled per
    /// further attempt up to `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    /// Longest wait between two attempts.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// Attempts before a downlink is marked `failed`.
    pub max_attempts: u32,
    /// How long one HTTP attempt may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How often a `pending` downlink is looked at again (it is also when
    /// its device's route changes).
    #[serde(with = "humantime_serde")]
    pub pending_recheck: Duration,
    /// ChirpStack's REST API, for devices whose uplinks come from the
    /// ChirpStack HTTP integration.
    pub chirpstack: Option<ChirpStackSection>,
    /// ChirpStack's REST API per device type, for types served by another
    /// ChirpStack than the default one (`[downlinks.chirpstack_types.<type>]`).
    pub chirpstack_types: BTreeMap<String, ChirpStackSection>,
}

impl Default for DownlinksSection {
    fn default() -> Self {
        let d = weft_pipeline::downlinks::DownlinksConfig::default();
        DownlinksSection {
            retry_initial: d.retry_initial,
            retry_max: d.retry_max,
            max_attempts: d.max_attempts,
            request_timeout: d.request_timeout,
            pending_recheck: d.pending_recheck,
            chirpstack: None,
            chirpstack_types: BTreeMap::new(),
        }
    }
}

/// One ChirpStack REST API: where it is and the API token weft uses.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChirpStackSection {
    /// Base URL of ChirpStack's REST API (`http://chirpstack-rest-api:8090`).
    pub url: String,
    /// An API key made in ChirpStack (sent as `Grpc-Metadata-Authorization:
    /// Bearer <token>`, and as `Authorization`).
    pub token: String,
}

impl ChirpStackSection {
    /// The pipeline's form.
    pub fn api(&self) -> weft_model::downlink::ChirpStackApi {
        weft_model::downlink::ChirpStackApi {
            url: self.url.clone(),
            token: self.token.clone(),
        }
    }
}

/// `[http]`: what every request meets before its surface.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// Requests per second one API key may sustain (keys may set their
    /// own); 0: unlimited.
    pub rate_limit: f64,
    /// Requests one API key may send at once after a quiet spell.
    pub rate_burst: u32,
    /// Origins browsers may call weft from (CORS), e.g.
    /// `["https://console.example"]`, or `["*"]`; empty: CORS is off.
    pub cors_origins: Vec<String>,
    /// PEM certificate chain (leaf first): with `tls_key`, every listener
    /// (the API's and QuantumLeap's) serves HTTPS instead of HTTP.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// How long a client has to send a request's line and headers (and,
    /// on a kept-alive connection, the next request's) before its
    /// connection is closed, on every listener.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            rate_limit: 1000.0,
            rate_burst: 2000,
            cors_origins: Vec::new(),
            tls_cert: None,
            tls_key: None,
            header_timeout: crate::http::HEADER_TIMEOUT,
        }
    }
}

/// `[engine]`: limits of decoder and rule scripts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// Threads running scripts.
    pub workers: usize,
    /// Longest one script call may run, built-in functions included, before
    /// it is stopped (docs/codecs.md).
    #[serde(with = "humantime_serde")]
    pub time_limit: Duration,
    /// Memory one script call may allocate, in MiB, on top of what the
    /// worker's compiled scripts hold.
    pub memory_limit_mb: usize,
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            workers: 1,
            time_limit: Duration::from_millis(100),
            memory_limit_mb: 32,
        }
    }
}

/// `[store]`: where weft keeps its state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// `sqlite` (embedded, files in the data directory) or `postgres`.
    pub backend: String,
    /// PostgreSQL's URL (`postgres://user:password@host:port/database`);
    /// only with `backend = "postgres"`.
    pub url: String,
    /// PostgreSQL read connections (each writer has one more of its own).
    pub pool_size: usize,
    /// PostgreSQL: how many partitions the pipeline (and the history's
    /// feed of entity changes) is split into, for a new database (one
    /// created before keeps its number, 16 before this setting): at most
    /// this many nodes share the pipeline's work.
    pub partitions: u16,
    /// SQLite: `full`: fsync every commit (an acknowledged write survives
    /// power loss); `normal`: survives a crash of weft, not of the machine.
    pub synchronous: String,
    /// SQLite: read-only connections serving queries.
    pub read_connections: usize,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            backend: "sqlite".into(),
            url: String::new(),
            pool_size: 16,
            partitions: 16,
            synchronous: "full".into(),
            read_connections: 4,
        }
    }
}

/// `[bus]`: how events and changed definitions reach their consumers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusSection {
    /// `in-process` (one node; nothing to install) or `nats` (several
    /// nodes exchange events and definition changes over NATS JetStream;
    /// docs/scale-out.md).
    pub backend: String,
    /// NATS's URL (`nats://host:4222`); only with `backend = "nats"`.
    pub url: String,
    /// The cluster's name on NATS: its subjects start with it and its
    /// JetStream streams are named after it, so several clusters can
    /// share one NATS. Every node of a cluster sets the same.
    pub cluster: String,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            backend: "in-process".into(),
            url: String::new(),
            cluster: "weft".into(),
        }
    }
}

/// `[cluster]`: how a node takes its share of the work done once across
/// the cluster (docs/scale-out.md). One node alone needs none of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// How long a lease on a piece of work lasts unless renewed: how long
    /// a dead node's work waits before another node takes it over.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Where this node's API is reached, as `weft cluster status` shows
    /// it (default: the listen address).
    pub address: String,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            lease_ttl: Duration::from_secs(6),
            address: String::new(),
        }
    }
}

/// `[pipeline]`: uplink processing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineSection {
    /// Most uplinks decoded and committed together.
    pub batch_size: usize,
    /// Accepted-but-unprocessed uplinks beyond which ingest answers 503.
    pub max_backlog: u64,
    /// How long processed uplinks stay in the ingest log.
    #[serde(with = "humantime_serde")]
    pub log_retention: Duration,
}

impl Default for PipelineSection {
    fn default() -> Self {
        let d = weft_pipeline::IngestConfig::default();
        PipelineSection {
            batch_size: d.batch_size,
            max_backlog: d.max_backlog,
            log_retention: d.log_retention,
        }
    }
}

/// `[ngsi]`: the NGSIv2 broker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NgsiSection {
    /// `Fiware-Service` selects a tenant (Orion's `-multiservice`). Off:
    /// one tenant for every request, as an Orion started without that
    /// flag, and the header is only passed on to notifications.
    pub multiservice: bool,
    /// How long a registered context provider has to answer a forwarded
    /// query or update (Orion's `-httpTimeout`, 5 s by default).
    #[serde(with = "humantime_serde")]
    pub forward_timeout: Duration,
}

impl Default for NgsiSection {
    fn default() -> Self {
        NgsiSection {
            multiservice: true,
            forward_timeout: weft_pipeline::forwarding::DEFAULT_TIMEOUT,
        }
    }
}

/// `[history]`: recording, retention and QuantumLeap's API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistorySection {
    /// Record every entity change (from `/v2` and device data) as history.
    /// On by default (users expect every data unit in history); off, only
    /// `POST /v2/notify` feeds the history, as with QuantumLeap behind an
    /// Orion subscription.
    pub record_changes: bool,
    /// A second listen address serving QuantumLeap's API at its own paths
    /// (`/v2/notify`, `/v2/entities/...`), for clients that cannot be given
    /// the `/ql` prefix (QuantumLeap's port is 8668). None: not served.
    pub quantumleap_listen: Option<SocketAddr>,
    /// Answer QuantumLeap's API as its unreleased master does (`id`/`type`
    /// instead of `entityId`/`entityType`, 200 `[]` instead of 404 for no
    /// data), for clients written against it. Off: release 1.0.0, what
    /// deployed clients expect.
    pub quantumleap_master: bool,
    /// Rows and rollups older than this are deleted, for every tenant
    /// without its own setting (e.g. "400d"). None: kept forever.
    #[serde(with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// Rows older than this are deleted but their per-minute and per-hour
    /// aggregates kept (until `retention`): downsampling. None: rows are
    /// kept as long as `retention` says.
    #[serde(with = "humantime_serde")]
    pub downsample_after: Option<Duration>,
    /// How often expired history is deleted.
    #[serde(with = "humantime_serde")]
    pub retention_interval: Duration,
    /// Per tenant (`[history.tenants.<name>]`, the lower-case
    /// `Fiware-Service`): `retention` and `downsample_after` of that
    /// tenant; a key left out takes the value above.
    pub tenants: BTreeMap<String, TenantHistorySection>,
}

impl Default for HistorySection {
    fn default() -> Self {
        HistorySection {
            record_changes: true,
            quantumleap_listen: None,
            quantumleap_master: false,
            retention: None,
            downsample_after: None,
            retention_interval: weft_pipeline::ServicesConfig::default()
                .history_retention
                .interval,
            tenants: BTreeMap::new(),
        }
    }
}

impl HistorySection {
    /// The history recorder's retention policy.
    pub fn retention_policy(&self) -> weft_pipeline::history::RetentionPolicy {
        use weft_pipeline::history::{Retention, RetentionPolicy};
        let default = Retention {
            keep: self.retention,
            downsample_after: self.downsample_after,
        };
        RetentionPolicy {
            default,
            tenants: self
                .tenants
                .iter()
                .map(|(name, t)| {
                    let r = Retention {
                        keep: t.retention.or(default.keep),
                        downsample_after: t.downsample_after.or(default.downsample_after),
                    };
                    (name.to_ascii_lowercase(), r)
                })
                .collect(),
            interval: self.retention_interval.max(Duration::from_millis(10)),
        }
    }
}

/// `[history.tenants.<name>]`: one tenant's history retention.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantHistorySection {
    /// As `history.retention`, for this tenant.
    #[serde(with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// As `history.downsample_after`, for this tenant.
    #[serde(with = "humantime_serde")]
    pub downsample_after: Option<Duration>,
}

/// `[rules]`: the rule engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RulesSection {
    /// Longest one `evaluate(unit, state)` call of a script rule may run;
    /// past it the call is interrupted and the unit counts as not matching.
    #[serde(with = "humantime_serde")]
    pub script_time_limit: Duration,
    /// How often inactivity rules look for silent devices (the precision
    /// of their `inactivity` durations).
    #[serde(with = "humantime_serde")]
    pub inactivity_check: Duration,
    /// Largest `state` (bytes of JSON) a script rule keeps for one device;
    /// a larger one is reset to `{}` (docs/rules.md).
    pub max_state_bytes: usize,
    /// Largest sum of every script rule's `state` for every device; past
    /// it the least recently changed are reset to `{}` (docs/rules.md).
    pub max_total_state_bytes: usize,
}

impl Default for RulesSection {
    fn default() -> Self {
        let d = weft_pipeline::rules::RulesConfig::default();
        RulesSection {
            script_time_limit: d.script_time_limit,
            inactivity_check: d.inactivity_check,
            max_state_bytes: d.state_limits.per_device,
            max_total_state_bytes: d.state_limits.total,
        }
    }
}

/// `[channels]`: durable pull channels (the DSPS API).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelsSection {
    /// Subscribers idle longer than this are removed (a fetch then answers
    /// 404), and channels without subscribers forgotten (DSPS: 30 minutes).
    #[serde(with = "humantime_serde")]
    pub expire_after: Duration,
    /// Bridges publishing weft's events into channels
    /// (`[channels.bridges.<name>]` with `stream`, `channel`, `filter`).
    pub bridges: BTreeMap<String, weft_pipeline::channels::bridge::BridgeSpec>,
    /// Per channel-name pattern (`[[channels.rules]]`): `regex`, `jwt`,
    /// `webhooks`, as DSPS configures them (docs/channels.md).
    pub rules: Vec<weft_pipeline::channels::rules::ChannelRule>,
    /// Bearer tokens accepted by the admin API (`PUT /admin/jwt/revoke`).
    /// None: the admin API answers 403.
    pub admin_tokens: Vec<String>,
}

impl Default for ChannelsSection {
    fn default() -> Self {
        ChannelsSection {
            expire_after: weft_pipeline::channels::ChannelsConfig::default().expire_after,
            bridges: BTreeMap::new(),
            rules: Vec::new(),
            admin_tokens: Vec::new(),
        }
    }
}

/// `[pages]`: page rendering.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PagesSection {
    /// Pages rendered at once; more requests wait (up to
    /// `max_waiting_renders`).
    pub max_concurrent_renders: usize,
    /// What a failed snippet without `data-knotx-fallback` renders as.
    pub default_fallback: String,
    /// Requests that may wait for a render slot; beyond, 503 + Retry-After.
    pub max_waiting_renders: usize,
    /// A directory of `*.html` templates loaded at start (named by their
    /// path below it); pages stored through the API take precedence.
    pub directory: Option<PathBuf>,
    /// Page services (`[pages.services.<name>]`, as the API takes them).
    pub services: BTreeMap<String, weft_pages::PageService>,
    /// Page requests needing the very same service call while one is
    /// under way share its outcome instead of calling again.
    pub coalesce_calls: bool,
}

impl Default for PagesSection {
    fn default() -> Self {
        let d = weft_pages::PagesConfig::default();
        PagesSection {
            max_concurrent_renders: d.max_concurrent_renders,
            default_fallback: d.default_fallback,
            max_waiting_renders: d.max_waiting_renders,
            directory: None,
            services: BTreeMap::new(),
            coalesce_calls: d.coalesce_calls,
        }
    }
}

/// `[notifications]`: how NGSI subscription notifications are sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsSection {
    /// Timeout of a notification request whose subscription sets none.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Parallel connections per notification endpoint.
    pub connections_per_endpoint: usize,
    /// Notifications queued per connection before the subscription is
    /// served from the change log instead.
    pub queue_per_connection: usize,
    /// Whether HTTP notifications carry the `Weft-Notification-Id` header
    /// (the same on every attempt, for receivers to drop duplicates).
    pub id_header: bool,
    /// How long a committed change is kept for a subscription that has
    /// not been served it yet (a receiver down for longer misses it).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// The most changes (of the node's change log) a subscription may be
    /// behind its receiver; the older ones are skipped and counted.
    pub max_owed: u64,
}

impl Default for NotificationsSection {
    fn default() -> Self {
        let d = weft_pipeline::subscriptions::sender::SenderConfig::default();
        NotificationsSection {
            timeout: d.timeout,
            connections_per_endpoint: d.lanes,
            queue_per_connection: d.lane_capacity,
            id_header: d.id_header,
            retention: d.retention,
            max_owed: d.max_owed,
        }
    }
}

/// The top-level keys of [`Config`]. Only `WEFT_*` variables naming one of
/// them are configuration: other tools set `WEFT_*` variables of their own
/// (test harnesses export `WEFT_PORT`, say), and a typo in a file is an
/// error but a stranger's variable in the environment must not be.
const CONFIG_KEYS: [&str; 20] = [
    "mqtt",
    "cluster",
    "auth",
    "downlinks",
    "admin_key",
    "http",
    "pages",
    "channels",
    "history",
    "rules",
    "ngsi",
    "listen",
    "data",
    "ingest_key",
    "log",
    "engine",
    "store",
    "bus",
    "pipeline",
    "notifications",
];

fn is_config_key(key: &figment::value::UncasedStr) -> bool {
    let head = key.as_str().split("__").next().unwrap_or_default();
    let head = head.split('.').next().unwrap_or_default();
    CONFIG_KEYS.iter().any(|k| k.eq_ignore_ascii_case(head))
}

/// Command-line values that override the file and the environment.
#[derive(Debug, Default, Serialize)]
pub struct Overrides {
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// `--data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// `--ingest-key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_key: Option<String>,
    /// `--admin-key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_key: Option<String>,
}

impl Config {
    /// Defaults, then `file` (if given), then `WEFT_*`, then `overrides`.
    // figment's error is large, but it is built once, at start-up.
    #[allow(clippy::result_large_err)]
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: Overrides,
    ) -> Result<Config, figment::Error> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(figment::Error::from(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            fig = fig.merge(Toml::file(file));
        }
        fig.merge(Env::prefixed("WEFT_").filter(is_config_key).split("__"))
            .merge(Serialized::defaults(overrides))
            .extract()
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;

    #[test]
    fn defaults_need_no_file_and_flags_beat_environment_beat_file() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None, Overrides::default())?;
            assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
            assert_eq!(c.data, PathBuf::from("./weft-data"));

            jail.create_file("weft.toml", "listen = \"127.0.0.1:9000\"\ningest_key = \"file\"\n[engine]\ntime_limit = \"50ms\"\n")?;
            jail.set_env("WEFT_INGEST_KEY", "env");
            jail.set_env("WEFT_ENGINE__WORKERS", "2");
            let c = Config::load(Some("weft.toml".as_ref()), Overrides::default())?;
            assert_eq!(c.listen.port(), 9000);
            assert_eq!(c.ingest_key, "env");
            assert_eq!(c.engine.workers, 2);
            assert_eq!(c.engine.time_limit, Duration::from_millis(50));
            assert_eq!(c.store.backend, "sqlite", "SQLite unless told otherwise");

            jail.set_env("WEFT_STORE__BACKEND", "postgres");
            jail.set_env("WEFT_STORE__URL", "postgres://weft@db/weft");
            jail.set_env("WEFT_STORE__POOL_SIZE", "4");
            jail.set_env("WEFT_STORE__PARTITIONS", "64");
            let c = Config::load(Some("weft.toml".as_ref()), Overrides::default())?;
            assert_eq!(c.store.backend, "postgres");
            assert_eq!(c.store.url, "postgres://weft@db/weft");
            assert_eq!(c.store.pool_size, 4);
            assert_eq!(c.store.partitions, 64);

            assert_eq!(
                c.bus.backend, "in-process",
                "one node unless told otherwise"
            );
            jail.set_env("WEFT_BUS__BACKEND", "nats");
            jail.set_env("WEFT_BUS__URL", "nats://127.0.0.1:4222");
            let c = Config::load(Some("weft.toml".as_ref()), Overrides::default())?;
            assert_eq!(c.bus.backend, "nats");
            assert_eq!(c.bus.url, "nats://127.0.0.1:4222");
            assert_eq!(c.bus.cluster, "weft");

            let flags = Overrides {
                ingest_key: Some("flag".into()),
                ..Overrides::default()
            };
            let c = Config::load(Some("weft.toml".as_ref()), flags)?;
            assert_eq!(c.ingest_key, "flag");
            Ok(())
        });
    }

    #[test]
    fn foreign_weft_variables_are_ignored() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("WEFT_PORT", "9999");
            jail.set_env("WEFT_BROKER_ARGS", "-multiservice");
            jail.set_env("WEFT_DATA", "/tmp/x");
            let c = Config::load(None, Overrides::default())?;
            assert_eq!(c.data, PathBuf::from("/tmp/x"));
            Ok(())
        });
    }

    #[test]
    fn auth_settings_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None, Overrides::default())?;
            assert_eq!(c.auth, "on", "keys are required unless told otherwise");
            assert!(c.http.cors_origins.is_empty(), "CORS is off by default");
            jail.set_env("WEFT_AUTH", "off");
            jail.set_env("WEFT_ADMIN_KEY", "weft_given_admin_key_0123456789");
            jail.set_env("WEFT_HTTP__RATE_LIMIT", "5");
            jail.create_file(
                "weft.toml",
                "[http]\ncors_origins = [\"https://a.example\"]\n",
            )?;
            let c = Config::load(Some("weft.toml".as_ref()), Overrides::default())?;
            assert_eq!(c.auth, "off");
            assert_eq!(c.admin_key, "weft_given_admin_key_0123456789");
            assert_eq!(c.http.rate_limit, 5.0);
            assert_eq!(c.http.cors_origins, ["https://a.example"]);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_errors() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("weft.toml", "lisen = \"x\"\n")?;
            assert!(Config::load(Some("weft.toml".as_ref()), Overrides::default()).is_err());
            Ok(())
        });
    }
}
