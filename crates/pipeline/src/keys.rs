//! The key service: every API key, held in memory by the SHA-256 of its
//! secret, so letting a request in costs a hash and a map lookup, never a
//! database round trip. Creating and revoking a key write the store first
//! and then the memory of this node, so a revocation takes effect here
//! the moment it is answered; the change is then announced on the bus,
//! and every other node reloads the keys from the store as soon as it
//! hears of it ([`Follower`]), never by polling.
//!
//! Each key carries a token bucket: its rate limit (its own, or the
//! configured default) is kept here too, per node.
//!
//! What a key may do on which surface is the HTTP layer's business
//! (`weft_api::auth`); this service only knows keys.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use weft_bus::Bus;
use weft_model::apikey::{
    generate_id, generate_secret, hash_secret, hash_secret_hex, normalize_service_path, parse_hash,
    ApiKey, RateLimit, Role, MAX_NAME_LEN, MIN_GIVEN_SECRET_LEN, SHOWN_PREFIX_LEN,
};
use weft_model::now_ms;
use weft_store::prelude::*;
use weft_store::StoreError;

use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};

/// A token bucket: `rate` tokens a second up to `burst`; each request
/// takes one. Time is passed in, so tests need no clock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`. A `rate` of 0 (or less) never limits.
    pub fn new(limit: RateLimit, now: Instant) -> TokenBucket {
        let burst = f64::from(limit.burst.max(1));
        TokenBucket {
            rate: limit.rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token at `now`; when none is left, how long until one is.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.rate.is_nan() || self.rate <= 0.0 {
            return Ok(());
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// A key as the service holds it: its record, and its bucket.
#[derive(Debug)]
pub struct KeyEntry {
    /// The stored record.
    pub key: ApiKey,
    /// The key's rate limit, kept on this node.
    bucket: Mutex<TokenBucket>,
}

impl KeyEntry {
    fn new(key: ApiKey, default: RateLimit) -> KeyEntry {
        let limit = key.rate_limit.unwrap_or(default);
        KeyEntry {
            key,
            bucket: Mutex::new(TokenBucket::new(limit, Instant::now())),
        }
    }

    /// Counts one request against the key's rate limit: `Err` holds how
    /// long the caller should wait (`Retry-After`).
    pub fn admit(&self) -> Result<(), Duration> {
        self.bucket.lock().take(Instant::now())
    }
}

/// Why a secret does not let its bearer in (each is a 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// No key has this secret.
    Unknown,
    /// The key has expired.
    Expired,
    /// The key was revoked.
    Revoked,
}

impl Rejected {
    /// The reason, for the 401's description.
    pub fn describe(self) -> &'static str {
        match self {
            Rejected::Unknown => "the API key is not valid",
            Rejected::Expired => "the API key has expired",
            Rejected::Revoked => "the API key was revoked",
        }
    }
}

/// What creating a key can fail on.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The request is not a valid key (400).
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a new key is asked to be; `POST /api/v1/keys` takes it as JSON.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewKey {
    /// What the key is for.
    pub name: String,
    /// What it may do; required.
    pub role: Option<Role>,
    /// Its tenant; empty or absent: the default tenant.
    #[serde(default)]
    pub tenant: String,
    /// A service-path limit.
    pub service_path: Option<String>,
    /// Ingest keys: the channel they are pinned to.
    pub channel: Option<String>,
    /// Ingest keys: the device type they are pinned to.
    pub device_type: Option<String>,
    /// The key's own rate limit.
    pub rate_limit: Option<RateLimit>,
    /// When it stops working, epoch ms.
    pub expires_at: Option<i64>,
}

/// Every API key, in memory, and the way to create and revoke them.
pub struct Keys {
    store: Arc<dyn Store>,
    /// Where creations and revocations are announced to the other nodes.
    bus: Arc<dyn Bus>,
    /// Keys by the SHA-256 of their secret. Read on every request; written
    /// only when a key is created, revoked or reloaded.
    by_hash: RwLock<HashMap<[u8; 32], Arc<KeyEntry>>>,
    /// The rate limit of keys without one of their own.
    default_rate: RateLimit,
    /// Whether any live ingest key exists: the ingest paths then want a
    /// credential even when no global ingest key is configured.
    ingest_keys: AtomicBool,
    /// Bumped whenever the keys in memory change (made, revoked,
    /// reloaded), so what a key opened (live streams) can end with it
    /// ([`Keys::until_unusable`]).
    changed: tokio::sync::watch::Sender<u64>,
}

impl Keys {
    /// Loads every key from the store.
    pub async fn load(
        store: Arc<dyn Store>,
        default_rate: RateLimit,
        bus: Arc<dyn Bus>,
    ) -> Result<Keys, StoreError> {
        let keys = Keys {
            store,
            bus,
            by_hash: RwLock::new(HashMap::new()),
            default_rate,
            ingest_keys: AtomicBool::new(false),
            changed: tokio::sync::watch::Sender::new(0),
        };
        keys.refresh().await?;
        Ok(keys)
    }

    /// Reloads the keys from the store, keeping what this node knows
    /// better: a key it revoked stays revoked, and buckets keep their
    /// tokens.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let stored = self.store.list_api_keys().await?;
        let mut map = self.by_hash.write();
        for key in stored {
            let Some(hash) = parse_hash(&key.hash) else {
                tracing::warn!(id = %key.id, "an API key with a malformed hash is ignored");
                continue;
            };
            match map.get(&hash) {
                Some(have) if have.key == key || have.key.revoked_at.is_some() => {}
                _ => {
                    map.insert(hash, Arc::new(KeyEntry::new(key, self.default_rate)));
                }
            }
        }
        self.note_ingest_keys(&map);
        drop(map);
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    fn note_ingest_keys(&self, map: &HashMap<[u8; 32], Arc<KeyEntry>>) {
        let now = now_ms();
        let any = map
            .values()
            .any(|e| e.key.role == Role::Ingest && e.key.is_live(now));
        self.ingest_keys.store(any, Ordering::Relaxed);
    }

    /// The key whose secret is `secret`, if it works now.
    pub fn authenticate(&self, secret: &str) -> Result<Arc<KeyEntry>, Rejected> {
        let hash = hash_secret(secret);
        let entry = self
            .by_hash
            .read()
            .get(&hash)
            .cloned()
            .ok_or(Rejected::Unknown)?;
        if entry.key.revoked_at.is_some() {
            return Err(Rejected::Revoked);
        }
        if entry.key.expires_at.is_some_and(|at| now_ms() >= at) {
            return Err(Rejected::Expired);
        }
        Ok(entry)
    }

    /// Whether `key` (as it was when a request was let in) still works:
    /// `Err` says why not (revoked, expired, or gone).
    pub fn check(&self, key: &ApiKey) -> Result<(), Rejected> {
        let hash = parse_hash(&key.hash).ok_or(Rejected::Unknown)?;
        let map = self.by_hash.read();
        let entry = map.get(&hash).ok_or(Rejected::Unknown)?;
        if entry.key.revoked_at.is_some() {
            return Err(Rejected::Revoked);
        }
        if entry.key.expires_at.is_some_and(|at| now_ms() >= at) {
            return Err(Rejected::Expired);
        }
        Ok(())
    }

    /// Waits until `key` stops working — it is revoked (on this node or,
    /// once announced, on another), or its `expiresAt` passes — and says
    /// why. What a key opened that outlives its request (a websocket, an
    /// SSE stream) ends when this does.
    pub async fn until_unusable(&self, key: &ApiKey) -> Rejected {
        let mut changed = self.changed.subscribe();
        loop {
            if let Err(why) = self.check(key) {
                return why;
            }
            let expiry = key.expires_at.map(|at| {
                let left = u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0);
                tokio::time::Instant::now() + Duration::from_millis(left)
            });
            tokio::select! {
                _ = changed.changed() => {}
                () = async {
                    match expiry {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Whether a live ingest key exists.
    pub fn has_ingest_keys(&self) -> bool {
        self.ingest_keys.load(Ordering::Relaxed)
    }

    /// Whether no key exists at all (a fresh data directory).
    pub fn is_empty(&self) -> bool {
        self.by_hash.read().is_empty()
    }

    /// Every key, by id.
    pub fn list(&self) -> Vec<ApiKey> {
        let mut keys: Vec<ApiKey> = self
            .by_hash
            .read()
            .values()
            .map(|e| e.key.clone())
            .collect();
        keys.sort_by(|a, b| a.id.cmp(&b.id));
        keys
    }

    /// The key with public id `id`.
    pub fn get(&self, id: &str) -> Option<ApiKey> {
        self.by_hash
            .read()
            .values()
            .find(|e| e.key.id == id)
            .map(|e| e.key.clone())
    }

    /// Creates a key from `spec`; answers its record and its secret,
    /// which is never available again.
    pub async fn create(&self, spec: NewKey) -> Result<(ApiKey, String), KeyError> {
        let secret = generate_secret();
        let key = self.record(spec, &secret)?;
        self.insert(key.clone()).await?;
        Ok((key, secret))
    }

    /// Validates `spec` into the record of a key with `secret`.
    fn record(&self, spec: NewKey, secret: &str) -> Result<ApiKey, KeyError> {
        let invalid = |s: String| Err(KeyError::Invalid(s));
        let name = spec.name.trim().to_string();
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return invalid(format!(
                "name must be 1-{MAX_NAME_LEN} printable characters"
            ));
        }
        let Some(role) = spec.role else {
            return invalid("role is required: read, write, admin or ingest".into());
        };
        let tenant = spec.tenant.to_ascii_lowercase();
        if tenant.len() > 50
            || !tenant
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return invalid(format!(
                "tenant '{}' must be at most 50 of [A-Za-z0-9_]",
                spec.tenant
            ));
        }
        let service_path = match spec.service_path.as_deref() {
            None => None,
            Some(p) => match normalize_service_path(p).map_err(KeyError::Invalid)? {
                root if root == "/" => None,
                path => Some(path),
            },
        };
        if role == Role::Ingest {
            if !tenant.is_empty() || service_path.is_some() {
                return invalid(
                    "ingest keys belong to the default tenant, without a service path".into(),
                );
            }
            let pinned = |e: weft_model::validate::Invalid| KeyError::Invalid(e.to_string());
            if let Some(channel) = &spec.channel {
                weft_model::validate::channel("channel", channel).map_err(pinned)?;
            }
            if let Some(device_type) = &spec.device_type {
                weft_model::validate::device_type_name("deviceType", device_type)
                    .map_err(pinned)?;
            }
        } else if spec.channel.is_some() || spec.device_type.is_some() {
            return invalid("channel and deviceType pin ingest keys only".into());
        }
        if let Some(limit) = spec.rate_limit {
            if !limit.rate.is_finite() || limit.rate < 0.0 || limit.burst == 0 {
                return invalid("rateLimit needs a rate >= 0 and a burst >= 1".into());
            }
        }
        let now = now_ms();
        if spec.expires_at.is_some_and(|at| at <= now) {
            return invalid("expiresAt is in the past".into());
        }
        Ok(ApiKey {
            id: generate_id(),
            hash: hash_secret_hex(secret),
            prefix: secret.chars().take(SHOWN_PREFIX_LEN).collect(),
            name,
            role,
            tenant,
            service_path,
            channel: spec.channel,
            device_type: spec.device_type,
            rate_limit: spec.rate_limit,
            created_at: now,
            expires_at: spec.expires_at,
            revoked_at: None,
        })
    }

    /// Stores `key`, then holds it in memory.
    async fn insert(&self, key: ApiKey) -> Result<(), StoreError> {
        self.store.put_api_key(&key).await?;
        let hash = parse_hash(&key.hash).expect("hashes made here are hex");
        let id = key.id.clone();
        let mut map = self.by_hash.write();
        map.insert(hash, Arc::new(KeyEntry::new(key, self.default_rate)));
        self.note_ingest_keys(&map);
        drop(map);
        self.changed.send_modify(|n| *n += 1);
        self.bus
            .definition_changed(DefinitionChange::new(DefinitionKind::ApiKey, id));
        Ok(())
    }

    /// Revokes the key `id` (at once on this node); its record, or `None`
    /// if there is no such key. Revoking twice keeps the first time.
    pub async fn revoke(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let Some(mut key) = self.get(id) else {
            return Ok(None);
        };
        if key.revoked_at.is_none() {
            key.revoked_at = Some(now_ms());
            self.insert(key.clone()).await?;
        }
        Ok(Some(key))
    }

    /// The first start's admin key. With `given` (the `admin_key`
    /// setting) that secret is stored, hashed, as an admin key unless it
    /// is already known; without, a fresh admin key is made when no key
    /// exists at all, and its secret returned — to be shown once.
    pub async fn bootstrap(&self, given: Option<&str>) -> Result<Option<String>, KeyError> {
        if let Some(secret) = given {
            if secret.len() < MIN_GIVEN_SECRET_LEN || secret.chars().any(|c| c.is_whitespace()) {
                return Err(KeyError::Invalid(format!(
                    "admin_key must be at least {MIN_GIVEN_SECRET_LEN} characters without spaces"
                )));
            }
            match self.authenticate(secret) {
                Ok(_) => {}
                Err(Rejected::Unknown) => {
                    let key = self.record(bootstrap_spec(), secret)?;
                    self.insert(key).await?;
                    tracing::info!("stored the configured admin_key as an admin key");
                }
                Err(other) => {
                    tracing::warn!(
                        "the configured admin_key does not work: {}",
                        other.describe()
                    )
                }
            }
            return Ok(None);
        }
        if !self.is_empty() {
            return Ok(None);
        }
        let secret = generate_secret();
        let key = self.record(bootstrap_spec(), &secret)?;
        self.insert(key).await?;
        Ok(Some(secret))
    }
}

impl Follower for Keys {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::ApiKey];

    /// Reloads every key ([`Keys::refresh`]): keys are few, and a reload
    /// keeps what this node knows better.
    async fn reload(&self, _what: &Reload) -> Result<(), StoreError> {
        self.refresh().await
    }
}

fn bootstrap_spec() -> NewKey {
    NewKey {
        name: "bootstrap admin".into(),
        role: Some(Role::Admin),
        ..NewKey::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                rate: 2.0,
                burst: 3,
            },
            t0,
        );
        for _ in 0..3 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500), "one token every 1/2 s");
        assert!(b.take(t0 + Duration::from_millis(499)).is_err());
        assert!(b.take(t0 + Duration::from_millis(1000)).is_ok());
        // A long quiet spell refills to the burst, not beyond it.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(b.take(later).is_ok());
        }
        assert!(b.take(later).is_err());
    }

    fn open(dir: &std::path::Path) -> Arc<dyn Store> {
        Arc::new(
            weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
                path: dir.join("weft.db"),
                ..Default::default()
            })
            .unwrap(),
        )
    }

    const UNLIMITED: RateLimit = RateLimit {
        rate: 0.0,
        burst: 1,
    };

    /// The first start makes one admin key, a restart none; a revoked key
    /// is refused at once and stays revoked through a reload; keys are
    /// found by their secret only.
    #[tokio::test]
    async fn bootstrap_once_revocation_at_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let keys = Keys::load(
            store.clone(),
            UNLIMITED,
            Arc::new(weft_bus::InProcessBus::default()),
        )
        .await
        .unwrap();
        let first = keys
            .bootstrap(None)
            .await
            .unwrap()
            .expect("a new admin key");
        assert!(keys.bootstrap(None).await.unwrap().is_none(), "only once");
        let admin = keys.authenticate(&first).unwrap();
        assert!(admin.key.is_global());
        assert_eq!(
            keys.authenticate("weft_other").unwrap_err(),
            Rejected::Unknown
        );

        let (made, secret) = keys
            .create(NewKey {
                name: "dash".into(),
                role: Some(Role::Read),
                tenant: "City".into(),
                service_path: Some("/parks/".into()),
                ..NewKey::default()
            })
            .await
            .unwrap();
        assert_eq!(made.tenant, "city");
        assert_eq!(made.service_path.as_deref(), Some("/parks"));
        assert_ne!(made.hash, secret, "only the hash is kept");
        let stale = keys.get(&made.id).unwrap();
        keys.revoke(&made.id).await.unwrap().unwrap();
        assert_eq!(keys.authenticate(&secret).unwrap_err(), Rejected::Revoked);
        // Another node's stale view of the key cannot bring it back.
        store.put_api_key(&stale).await.unwrap();
        keys.refresh().await.unwrap();
        assert_eq!(keys.authenticate(&secret).unwrap_err(), Rejected::Revoked);
        store.close().await;

        let store = open(dir.path());
        let keys = Keys::load(
            store.clone(),
            UNLIMITED,
            Arc::new(weft_bus::InProcessBus::default()),
        )
        .await
        .unwrap();
        assert!(keys.bootstrap(None).await.unwrap().is_none(), "not again");
        assert!(keys.authenticate(&first).is_ok());
        let given = "weft_configured_admin_key_0123456789";
        assert!(keys.bootstrap(Some(given)).await.unwrap().is_none());
        assert!(keys.authenticate(given).unwrap().key.is_global());
        assert!(matches!(
            keys.bootstrap(Some("short")).await,
            Err(KeyError::Invalid(_))
        ));
        assert!(!keys.has_ingest_keys());
        keys.create(NewKey {
            name: "ttn".into(),
            role: Some(Role::Ingest),
            channel: Some("farm".into()),
            ..NewKey::default()
        })
        .await
        .unwrap();
        assert!(keys.has_ingest_keys());
        store.close().await;
    }

    #[test]
    fn a_zero_rate_never_limits() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                rate: 0.0,
                burst: 1,
            },
            t0,
        );
        for _ in 0..1000 {
            assert!(b.take(t0).is_ok());
        }
    }
}
