//! API keys: the credentials of every surface but ingest and `/health`.
//! The store keeps each key's record (its SHA-256, never the secret); the
//! pipeline's key service loads them all at start and answers requests
//! from memory, so a request never waits for the database to be let in.
//!
//! Keys are never deleted, only revoked, so a revocation cannot be
//! undone by a node that read the key before it was revoked.

use async_trait::async_trait;
use weft_model::apikey::ApiKey;

use crate::Result;

/// Where API keys are kept.
#[async_trait]
pub trait KeyStore: Send + Sync {
    /// Creates or replaces the key with `key.id`; `true` if it was created.
    async fn put_api_key(&self, key: &ApiKey) -> Result<bool>;
    /// Every key, revoked and expired ones included, ordered by id.
    async fn list_api_keys(&self) -> Result<Vec<ApiKey>>;
}
