//! The device catalog: device types (with their compiled codec handles) and
//! devices, cached in memory in front of the store so the pipeline never
//! reads the database per uplink. Every change made through the API goes
//! through here, so the cache is always as fresh as the store.
//!
//! In a scale-out deployment each node holds its own cache: a change made
//! here is announced on the bus once stored, and a change announced by
//! another node is reloaded from the store ([`Follower`]), so the next
//! uplink on any node uses the new decoder. Devices the pipeline meets for
//! the first time are not announced: each node registers them as it meets
//! them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use weft_bus::Bus;
use weft_engine::{CodecError, Engine, Script, ScriptKind};
use weft_model::validate::Invalid;
use weft_model::{Device, DeviceType};
use weft_store::{DeviceFilter, Store, StoreError};

use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};

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
    /// A field of the definition breaks its rule (400 naming the field).
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// The decoder does not compile, or defines no known entry point.
    #[error("{0}")]
    Script(CodecError),
    /// The decoder's language is not supported.
    #[error("decoder.language '{0}' is not supported: only 'javascript' is")]
    Language(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cached device types and devices, backed by the store.
pub struct Catalog {
    store: Arc<dyn Store>,
    engine: Engine,
    /// Where changes made here are announced to the other nodes.
    bus: Arc<dyn Bus>,
    types: RwLock<HashMap<String, Arc<TypeEntry>>>,
    devices: RwLock<HashMap<String, Arc<Device>>>,
}

impl Catalog {
    /// Loads every type and device from the store. Stored types whose
    /// script no longer compiles are kept without a codec (their uplinks
    /// fail with the reason) rather than refusing to start.
    pub async fn load(
        store: Arc<dyn Store>,
        engine: Engine,
        bus: Arc<dyn Bus>,
    ) -> Result<Catalog, StoreError> {
        let catalog = Catalog {
            store: store.clone(),
            engine,
            bus,
            types: RwLock::default(),
            devices: RwLock::default(),
        };
        for (name, def) in store.list_device_types().await? {
            let entry = catalog.compile_stored(&name, def).await;
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

    /// A stored type's entry; a decoder that no longer compiles leaves the
    /// type without a codec (its uplinks fail with the reason).
    async fn compile_stored(&self, name: &str, def: DeviceType) -> TypeEntry {
        match self.compile(name, def.clone()).await {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(device_type = %name, error = %e, "stored decoder does not compile");
                TypeEntry {
                    name: name.to_string(),
                    def,
                    codec: None,
                }
            }
        }
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
                if !matches!(
                    kind,
                    ScriptKind::DecodeUplink | ScriptKind::Convert | ScriptKind::EncodeDownlink
                ) {
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

    /// `def` compiled and checked as a `PUT` of type `name` would be, but
    /// neither stored nor cached: what the dry run of an unsaved codec
    /// decodes with. A decoder that does not compile is refused as a save
    /// would be.
    pub async fn candidate(&self, name: &str, def: DeviceType) -> Result<TypeEntry, CatalogError> {
        self.compile(name, def).await
    }

    /// The cached type entry.
    pub fn device_type(&self, name: &str) -> Option<Arc<TypeEntry>> {
        self.types.read().get(name).cloned()
    }

    /// Checks the type's name and fields ([`DeviceType::check`]) and that
    /// its decoder compiles, stores the type, then swaps the cached entry
    /// so the next uplink uses it. `true` if created. A refused type
    /// changes nothing.
    pub async fn put_device_type(&self, name: &str, def: DeviceType) -> Result<bool, CatalogError> {
        def.check(name)?;
        let entry = self.compile(name, def).await?;
        let created = self.store.put_device_type(name, &entry.def).await?;
        self.types.write().insert(name.to_string(), Arc::new(entry));
        self.announce(DefinitionKind::DeviceType, name);
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
        self.announce(DefinitionKind::DeviceType, name);
        Ok(existed)
    }

    /// The cached device.
    pub fn device(&self, id: &str) -> Option<Arc<Device>> {
        self.devices.read().get(id).cloned()
    }

    /// Checks a device's fields ([`Device::check`]), stores it and caches
    /// it; `true` if created. A refused device changes nothing.
    pub async fn put_device(&self, device: Device) -> Result<bool, CatalogError> {
        device.check()?;
        Ok(self.store_device(device).await?)
    }

    /// Gives device `id` the key of hash `key_hash` (none: no key),
    /// keeping the rest of its definition as stored; `None` if there is
    /// no such device, else whether it had a key.
    pub async fn set_device_key(
        &self,
        id: &str,
        key_hash: Option<String>,
    ) -> Result<Option<bool>, StoreError> {
        let Some(mut device) = self.device(id).map(|d| (*d).clone()) else {
            return Ok(None);
        };
        let had = std::mem::replace(&mut device.key_hash, key_hash).is_some();
        self.store_device(device).await?;
        Ok(Some(had))
    }

    async fn store_device(&self, device: Device) -> Result<bool, StoreError> {
        let created = self.store.put_device(&device).await?;
        let id = device.id.clone();
        self.devices
            .write()
            .insert(device.id.clone(), Arc::new(device));
        self.announce(DefinitionKind::Device, &id);
        Ok(created)
    }

    /// Deletes a device; `true` if it existed.
    pub async fn delete_device(&self, id: &str) -> Result<bool, StoreError> {
        let existed = self.store.delete_device(id).await?;
        self.devices.write().remove(id);
        self.announce(DefinitionKind::Device, id);
        Ok(existed)
    }

    fn announce(&self, kind: DefinitionKind, id: &str) {
        self.bus.definition_changed(DefinitionChange::new(kind, id));
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

impl Follower for Catalog {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::DeviceType, DefinitionKind::Device];

    /// Recompiles a type whose stored definition differs from the cached
    /// one (an unchanged type keeps its compiled codec) and drops types
    /// and devices the store no longer has.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        if what.concerns(&[DefinitionKind::DeviceType]) {
            let stored = self.store.list_device_types().await?;
            for (name, def) in &stored {
                if !what.covers(DefinitionKind::DeviceType, "", name) {
                    continue;
                }
                let cached = self.device_type(name);
                if cached.is_none_or(|c| c.def != *def) {
                    let entry = self.compile_stored(name, def.clone()).await;
                    self.types.write().insert(name.clone(), Arc::new(entry));
                }
            }
            self.types.write().retain(|name, _| {
                !what.covers(DefinitionKind::DeviceType, "", name)
                    || stored.iter().any(|(n, _)| n == name)
            });
        }
        if what.concerns(&[DefinitionKind::Device]) {
            let stored = self.store.list_devices(&DeviceFilter::default()).await?;
            let mut map = self.devices.write();
            for d in &stored {
                if what.covers(DefinitionKind::Device, "", &d.id) {
                    map.insert(d.id.clone(), Arc::new(d.clone()));
                }
            }
            map.retain(|id, _| {
                !what.covers(DefinitionKind::Device, "", id) || stored.iter().any(|d| &d.id == id)
            });
        }
        Ok(())
    }
}
