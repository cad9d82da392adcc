//! The NGSI context: entities (every device's live state and whatever
//! NGSI clients create) and the documents kept beside them
//! (subscriptions, registrations, and the other JSON documents weft keeps
//! by kind). The store keeps them across restarts; weft serves them from
//! memory, loaded from here at start.

use async_trait::async_trait;

use crate::{HistoryStates, LoggedChange, Result};

/// An NGSI entity as stored: where it lives, its key, its creation order
/// and its JSON (the model's storage form, opaque to the store).
#[derive(Debug, Clone, PartialEq)]
pub struct EntityRecord {
    /// Tenant (`Fiware-Service`, lowercased; empty for the default tenant).
    pub tenant: String,
    /// Service path.
    pub service_path: String,
    /// Entity id.
    pub id: String,
    /// Entity type.
    pub entity_type: String,
    /// Creation order within the tenant, kept across restarts.
    pub created: u64,
    /// The entity.
    pub json: String,
}

/// What an [`NgsiDocument`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentKind {
    /// An NGSI subscription (`/v2/subscriptions`).
    Subscription,
    /// An NGSI registration (`/v2/registrations`).
    Registration,
    /// A channel bridge (`/api/v1/bridges`), kept with tenant "".
    Bridge,
    /// A revoked JWT id (`PUT /admin/jwt/revoke`), kept with tenant "".
    RevokedJwt,
    /// A page template (`/api/v1/pages`), kept with tenant "".
    Page,
    /// A page service (`/api/v1/page-services`), kept with tenant "".
    PageService,
    /// An NGSI-LD `@context` weft hosts or keeps
    /// (`/ngsi-ld/v1/jsonldContexts`), kept with tenant "".
    LdContext,
}

impl DocumentKind {
    /// The name kept in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentKind::Subscription => "subscription",
            DocumentKind::Registration => "registration",
            DocumentKind::Bridge => "bridge",
            DocumentKind::RevokedJwt => "revoked-jwt",
            DocumentKind::Page => "page",
            DocumentKind::PageService => "page-service",
            DocumentKind::LdContext => "ld-context",
        }
    }
}

/// An NGSI subscription or registration as stored: opaque JSON keyed by
/// kind, tenant and id, with the service path it belongs to and its
/// creation order (listings are in creation order).
#[derive(Debug, Clone, PartialEq)]
pub struct NgsiDocument {
    /// Subscription or registration.
    pub kind: DocumentKind,
    /// Tenant (empty for the default tenant).
    pub tenant: String,
    /// The 24-hex id.
    pub id: String,
    /// Service path of the request that created it.
    pub service_path: String,
    /// Creation order, kept across restarts.
    pub created: u64,
    /// The document (the model's storage form).
    pub json: String,
}

/// What [`ContextStore::merge_document`] makes of the stored document.
pub type DocumentMerge = Box<dyn FnOnce(Option<NgsiDocument>) -> Option<NgsiDocument> + Send>;

/// NGSI entities and documents: written through on every change, read back
/// in full at start.
#[async_trait]
pub trait ContextStore: Send + Sync {
    // --- NGSI entities -----------------------------------------------------

    /// Creates or replaces an entity (keyed by tenant, service path, id,
    /// type), queues the history rows of the change in the history feed
    /// and logs the change for the subscriptions (when given), in one
    /// transaction: a change is never stored without its history, nor
    /// without what it owes the subscriptions.
    async fn put_entity(
        &self,
        record: EntityRecord,
        history: HistoryStates,
        change: Option<LoggedChange>,
    ) -> Result<()>;
    /// Deletes an entity and logs the deletion (when given) in one
    /// transaction; `true` if it existed.
    async fn delete_entity(
        &self,
        tenant: &str,
        service_path: &str,
        id: &str,
        entity_type: &str,
        change: Option<LoggedChange>,
    ) -> Result<bool>;
    /// Every stored entity of every tenant, in creation order (loaded once
    /// at start into the in-memory context).
    async fn load_entities(&self) -> Result<Vec<EntityRecord>>;
    /// The stored entities of `tenant` with `id` (any service path and
    /// type), in creation order: what a node of a cluster reads when it
    /// does not hold an entity that another node may have just written.
    async fn load_entities_with_id(&self, tenant: &str, id: &str) -> Result<Vec<EntityRecord>>;

    // --- NGSI subscriptions and registrations -------------------------------

    /// Creates or replaces a document (keyed by kind, tenant, id).
    async fn put_document(&self, document: NgsiDocument) -> Result<()>;
    /// Deletes a document; `true` if it existed.
    async fn delete_document(&self, kind: DocumentKind, tenant: &str, id: &str) -> Result<bool>;
    /// Every stored document of `kind`, in creation order.
    async fn load_documents(&self, kind: DocumentKind) -> Result<Vec<NgsiDocument>>;
    /// Reads document (`kind`, `tenant`, `id`) and stores what `merge`
    /// makes of it (`None` in: there is none; `None` out: write nothing),
    /// in one transaction that no other write, of this node or another,
    /// comes between. Answers what was stored. Lets several nodes add
    /// their own counts to one subscription's counters without losing
    /// each other's, or an edit made meanwhile.
    async fn merge_document(
        &self,
        kind: DocumentKind,
        tenant: &str,
        id: &str,
        merge: DocumentMerge,
    ) -> Result<Option<NgsiDocument>>;
}
