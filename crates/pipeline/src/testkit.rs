//! What the pipeline's in-process tests share: the services started on a
//! temporary SQLite store and the in-process bus, as the binary starts
//! them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_engine::{Engine, EngineConfig};
use weft_store::Store;

use crate::{Services, ServicesConfig};

/// Services running in process; their tasks stop when this is dropped.
pub struct Running {
    /// The services.
    pub services: Services,
    /// Their store.
    pub store: Arc<dyn Store>,
    /// Stops their tasks.
    pub shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts the services with `config` on a fresh temporary store.
pub async fn start(config: ServicesConfig) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let (services, store, shutdown) = start_in(dir.path(), config).await;
    Running {
        services,
        store,
        shutdown,
        _dir: dir,
    }
}

/// Starts the services with `config` on the store in `dir` (created if
/// missing): a second start on the same directory is a restart.
pub async fn start_in(
    dir: &std::path::Path,
    config: ServicesConfig,
) -> (Services, Arc<dyn Store>, CancellationToken) {
    let store: Arc<dyn Store> = Arc::new(
        weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
            path: dir.join("weft.db"),
            ..Default::default()
        })
        .unwrap(),
    );
    let bus = Arc::new(weft_bus::in_process::InProcessBus::default());
    let shutdown = CancellationToken::new();
    let services = Services::start(
        store.clone(),
        bus,
        Engine::start(EngineConfig::default()),
        config,
        shutdown.clone(),
        &TaskTracker::new(),
    )
    .await
    .unwrap();
    (services, store, shutdown)
}
