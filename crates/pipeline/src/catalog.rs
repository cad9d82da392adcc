//! The device catalog: device types (with their compiled codec handles) and
//! devices, cached in memory in front of the store so the pipeline never
//! reads the database per uplink. Every change made through the API goes
//! through here, so the cache is always as fresh as the store.
//!
//! In a scale-out deployment each process holds its own cache; changes
//! made by another process are picked up when that process's catalog
//! events reach it over the bus (not needed while one process owns the
//! store).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use weft_engine::{CodecError, Engine, Script, ScriptKind};
use weft_model::{Device, DeviceType};
use weft_store::{DeviceFilter, Store, StoreError};

/// A device type as the pipeline uses it: the definition plus its codec,
/// compiled-checked and identified for the engine's cache.
#[derive(Debug, Clone)]
pub struct TypeEntry {
    /// The type's name.
    pub name: String,
    /// The stored definition.
    pub def: DeviceType,
    /// The decoder script and which function it defines, if the type has one.
    pub codec: Option<(Script, ScriptKind)>,
}

/// Why a catalog change was refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The decoder does not compile, or defines no known entry point.
    #[error("{0}")]
    Script(CodecError),
    /// The decoder's language is not supported.
    #[error("unsupported decoder language '{0}': only 'javascript' is supported")]
    Language(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cached device types and devices, backed by the store.
pub struct Catalog {
    store: Arc<dyn Store>,
    engine: Engine,
    types: RwLock<HashMap<String, Arc<TypeEntry>>>,
    devices: RwLock<HashMap<String, Arc<Device>>>,
}

impl Catalog {
    /// Loads every type and device from the store. Stored types whose
    /// script no longer compiles are kept without a codec (their uplinks
    /// fail with the reason) rather than refusing to start.
    pub async fn load(store: Arc<dyn Store>, engine: Engine) -> Result<Catalog, StoreError> {
        let catalog = Catalog {
            store: store.clone(),
            engine,
            types: RwLock::default(),
            devices: RwLock::default(),
        };
        for (name, def) in store.list_device_types().await? {
            let entry = match catalog.compile(&name, def.clone()).await {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(device_type = %name, error = %e, "stored decoder does not compile");
                    TypeEntry {
                        name: name.clone(),
                        def,
                        codec: None,
                    }
                }
            };
            catalog.types.write().insert(name, Arc::new(entry));
        }
        let devices = store.list_devices(&DeviceFilter::default()).await?;
        let mut map = catalog.devices.write();
        for d in devices {
            map.insert(d.id.clone(), Arc::new(d));
        }
        drop(map);
        Ok(catalog)
    }

    async fn compile(&self, name: &str, def: DeviceType) -> Result<TypeEntry, CatalogError> {
        let codec = match &def.decoder {
            None => None,
            Some(d) if d.language != "javascript" => {
                return Err(CatalogError::Language(d.language.clone()))
            }
            Some(d) => {
                let script = Script::new(&d.script);
                let kind = self
                    .engine
                    .check(&script)
                    .await
                    .map_err(CatalogError::Script)?;
                if !matches!(kind, ScriptKind::DecodeUplink | ScriptKind::Convert) {
                    return Err(CatalogError::Script(CodecError::MissingFunction(
                        "decodeUplink(input) or convert(object)".into(),
                    )));
                }
                Some((script, kind))
            }
        };
        Ok(TypeEntry {
            name: name.to_string(),
            def,
            codec,
        })
    }

    /// The cached type entry.
    pub fn device_type(&self, name: &str) -> Option<Arc<TypeEntry>> {
        self.types.read().get(name).cloned()
    }

    /// Checks the decoder compiles, stores the type, then swaps the cached
    /// entry so the next uplink uses it. `true` if created.
    pub async fn put_device_type(&self, name: &str, def: DeviceType) -> Result<bool, CatalogError> {
        let entry = self.compile(name, def).await?;
        let created = self.store.put_device_type(name, &entry.def).await?;
        self.types.write().insert(name.to_string(), Arc::new(entry));
        Ok(created)
    }

    /// All types, ordered by name.
    pub fn device_types(&self) -> Vec<Arc<TypeEntry>> {
        let mut all: Vec<_> = self.types.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Deletes a type; `true` if it existed.
    pub async fn delete_device_type(&self, name: &str) -> Result<bool, StoreError> {
        let existed = self.store.delete_device_type(name).await?;
        self.types.write().remove(name);
        Ok(existed)
    }

    /// The cached device.
    pub fn device(&self, id: &str) -> Option<Arc<Device>> {
        self.devices.read().get(id).cloned()
    }

    /// Stores a device and caches it; `true` if created.
    pub async fn put_device(&self, device: Device) -> Result<bool, StoreError> {
        let created = self.store.put_device(&device).await?;
        self.devices
            .write()
            .insert(device.id.clone(), Arc::new(device));
        Ok(created)
    }

    /// Deletes a device; `true` if it existed.
    pub async fn delete_device(&self, id: &str) -> Result<bool, StoreError> {
        let existed = self.store.delete_device(id).await?;
        self.devices.write().remove(id);
        Ok(existed)
    }

    /// Caches a device seen for the first time by the pipeline, unless one
    /// with that id is known; `true` if it was new. The pipeline stores it
    /// with the batch that first saw it.
    pub(crate) fn register_seen(&self, device: &Device) -> bool {
        let mut map = self.devices.write();
        if map.contains_key(&device.id) {
            return false;
        }
        map.insert(device.id.clone(), Arc::new(device.clone()));
        true
    }
}
