//! The `@context`s NGSI-LD requests name: each remote document fetched
//! once and kept, each context built once and shared by every request
//! that names it the same way; and the contexts weft hosts.
//!
//! The core context never leaves the binary
//! ([`weft_model::ngsi_ld::context`]). A client's own context is fetched
//! the first time a request names it (a `Link` header or a body's
//! `@context`), with the outbound client's rules (no redirects, a
//! timeout, a size limit), and kept (`Cached`): NGSI-LD clients send the
//! same context URL on every request, and a broker that fetched it each
//! time would be as slow as that server and down when it is. A client may
//! also give weft a context to host (`Hosted`, `POST
//! /ngsi-ld/v1/jsonldContexts`): it is served at
//! `/ngsi-ld/v1/jsonldContexts/{localId}`, and a request naming that URL
//! reads it here, whatever the host part, without a fetch.
//!
//! Both kinds are stored (documents of kind `ld-context`) and loaded at
//! start, so a context fetched once still reads after a restart when its
//! server is gone. On a node of a cluster, a hosted context another node
//! took is read from the store the first time it is named.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use weft_model::ngsi_ld::context::{remote_urls, Context};
use weft_model::ngsi_ld::{ErrorKind, LdError};
use weft_store::{DocumentKind, NgsiDocument, Store};

use crate::outbound;

/// How long fetching one remote context may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest context document weft reads or hosts.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// How many built contexts and fetched documents are kept; when either
/// is full it starts over (contexts are few in practice; this bounds
/// what a client inventing new ones can make weft hold).
pub const MAX_KEPT: usize = 1024;

/// How many contexts weft hosts at most.
pub const MAX_HOSTED: usize = 1024;

/// Where weft serves the contexts it keeps: a URL whose path is this
/// followed by a hosted context's local identifier names that context.
pub const SERVED_AT: &str = "/ngsi-ld/v1/jsonldContexts/";

/// How many remote documents one context may pull in, nested ones
/// included.
const MAX_DOCUMENTS_PER_CONTEXT: usize = 32;

/// Whether a context was given to weft to host or fetched and kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Given by a client (`POST /jsonldContexts`); kept until deleted.
    Hosted,
    /// Fetched from its URL when a request named it.
    Cached,
}

impl Kind {
    /// The name `/jsonldContexts` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hosted => "Hosted",
            Kind::Cached => "Cached",
        }
    }
}

/// The kept contexts and documents.
pub struct LdContexts {
    /// Built contexts by the JSON text of what named them.
    built: Mutex<HashMap<String, Arc<Context>>>,
    /// Documents by local identifier.
    documents: Mutex<HashMap<String, Kept>>,
    /// Where documents are kept across restarts (none: in memory only).
    store: Option<Arc<dyn Store>>,
    client: reqwest::Client,
}

/// A document and what `/jsonldContexts` says of it.
struct Kept {
    doc: Arc<Value>,
    /// The URL it was fetched from (`Cached`), or none (`Hosted`).
    url: Option<String>,
    kind: Kind,
    created_at: i64,
}

/// A kept context, as `/ngsi-ld/v1/jsonldContexts` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptContext {
    /// Where it was fetched from; for a hosted one, the path weft serves
    /// it at ([`SERVED_AT`] and its local identifier).
    pub url: String,
    /// weft's identifier of it (`/jsonldContexts/{local_id}`).
    pub local_id: String,
    /// Hosted or cached.
    pub kind: Kind,
    /// When it was fetched or given, epoch milliseconds.
    pub created_at: i64,
}

impl Default for LdContexts {
    fn default() -> Self {
        LdContexts::new()
    }
}

impl LdContexts {
    /// Nothing kept yet, and nothing stored.
    pub fn new() -> LdContexts {
        LdContexts {
            built: Mutex::new(HashMap::new()),
            documents: Mutex::new(HashMap::new()),
            store: None,
            client: outbound::http(),
        }
    }

    /// The contexts kept in `store`, which keeps those fetched or hosted
    /// from now on.
    pub async fn load(store: Arc<dyn Store>) -> Result<LdContexts, weft_store::StoreError> {
        let mut contexts = LdContexts::new();
        contexts.store = Some(store);
        contexts.take_stored().await?;
        Ok(contexts)
    }

    /// Takes every stored document this node does not hold.
    async fn take_stored(&self) -> Result<(), weft_store::StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let docs = store.load_documents(DocumentKind::LdContext).await?;
        let mut documents = self.documents.lock().expect("contexts lock");
        for d in docs {
            if documents.contains_key(&d.id) {
                continue;
            }
            match from_storage(&d.json) {
                Some(kept) => {
                    documents.insert(d.id, kept);
                }
                None => tracing::warn!(id = %d.id, "a stored @context could not be read; skipped"),
            }
        }
        Ok(())
    }

    /// The context `value` names (a `Link` header's URL as a string, or a
    /// body's `@context`), with the core applied after it; the core alone
    /// for `None`. Remote documents are fetched the first time.
    pub async fn resolve(&self, value: Option<&Value>) -> Result<Arc<Context>, LdError> {
        let Some(value) = value else {
            return Ok(Context::core());
        };
        let key = value.to_string();
        if let Some(ctx) = self.built.lock().expect("contexts lock").get(&key) {
            return Ok(ctx.clone());
        }
        let mut pending = remote_urls(value);
        let mut fetched = 0;
        while let Some(url) = pending.pop() {
            if self.document(&url).is_some() {
                continue;
            }
            if hosted_id(&url).is_some() {
                // Perhaps hosted through another node.
                if let Err(e) = self.take_stored().await {
                    tracing::warn!(error = %e, "reading the stored @contexts failed");
                }
                if self.document(&url).is_some() {
                    continue;
                }
            }
            fetched += 1;
            if fetched > MAX_DOCUMENTS_PER_CONTEXT {
                return Err(LdError::bad_request(format!(
                    "the @context names more than {MAX_DOCUMENTS_PER_CONTEXT} remote contexts"
                )));
            }
            let doc = self.fetch(&url).await?;
            if let Some(inner) = doc.get("@context") {
                pending.extend(remote_urls(inner));
            }
            self.keep(Some(url), Kind::Cached, doc).await?;
        }
        let ctx = Arc::new(Context::build(value, &|url: &str| {
            self.document(url).map(|d| (*d).clone())
        })?);
        let mut built = self.built.lock().expect("contexts lock");
        if built.len() >= MAX_KEPT {
            built.clear();
        }
        built.insert(key, ctx.clone());
        Ok(ctx)
    }

    /// The document `url` names: one fetched from it, or one hosted here
    /// when its path names a hosted context.
    pub fn document(&self, url: &str) -> Option<Arc<Value>> {
        let documents = self.documents.lock().expect("contexts lock");
        if let Some(id) = hosted_id(url) {
            if let Some(k) = documents.get(id).filter(|k| k.kind == Kind::Hosted) {
                return Some(k.doc.clone());
            }
        }
        documents
            .values()
            .find(|k| k.url.as_deref() == Some(url))
            .map(|k| k.doc.clone())
    }

    /// The contexts kept, hosted ones first, then by URL.
    pub fn kept(&self) -> Vec<KeptContext> {
        let mut kept: Vec<KeptContext> = self
            .documents
            .lock()
            .expect("contexts lock")
            .iter()
            .map(|(id, k)| KeptContext {
                url: k.url.clone().unwrap_or_else(|| format!("{SERVED_AT}{id}")),
                local_id: id.clone(),
                kind: k.kind,
                created_at: k.created_at,
            })
            .collect();
        kept.sort_by(|a, b| (a.kind.as_str(), &a.url).cmp(&(b.kind.as_str(), &b.url)));
        kept.sort_by_key(|k| k.kind != Kind::Hosted);
        kept
    }

    /// The kept document with identifier `local_id`, and what is known of
    /// it.
    pub fn by_local_id(&self, local_id: &str) -> Option<(KeptContext, Arc<Value>)> {
        self.documents
            .lock()
            .expect("contexts lock")
            .get(local_id)
            .map(|k| {
                let info = KeptContext {
                    url: k
                        .url
                        .clone()
                        .unwrap_or_else(|| format!("{SERVED_AT}{local_id}")),
                    local_id: local_id.to_string(),
                    kind: k.kind,
                    created_at: k.created_at,
                };
                (info, k.doc.clone())
            })
    }

    /// Hosts `doc` (a JSON-LD document: an object with an `@context`,
    /// which must read as one); answers what `/jsonldContexts` says of it.
    pub async fn host(&self, doc: Value) -> Result<KeptContext, LdError> {
        let context = doc
            .get("@context")
            .filter(|_| doc.is_object())
            .ok_or_else(|| LdError::bad_request("a context to host is an object with an @context"))?
            .clone();
        if matches!(context, Value::String(_)) {
            return Err(LdError::bad_request(
                "a context to host defines terms: its @context is an object or an array",
            ));
        }
        self.resolve(Some(&context)).await?;
        let hosted = self
            .documents
            .lock()
            .expect("contexts lock")
            .values()
            .filter(|k| k.kind == Kind::Hosted)
            .count();
        if hosted >= MAX_HOSTED {
            return Err(LdError::new(
                ErrorKind::OperationNotSupported,
                format!("weft hosts {MAX_HOSTED} contexts at most: delete one first"),
            ));
        }
        let local_id = self.keep(None, Kind::Hosted, doc).await?;
        Ok(self.by_local_id(&local_id).expect("just kept").0)
    }

    /// Fetches the cached context `local_id` again from its URL (`None`:
    /// there is no such cached context).
    pub async fn reload(&self, local_id: &str) -> Result<Option<()>, LdError> {
        let Some((info, _)) = self.by_local_id(local_id) else {
            return Ok(None);
        };
        if info.kind != Kind::Cached {
            return Ok(None);
        }
        let doc = self.fetch(&info.url).await?;
        self.forget(local_id).await?;
        self.keep(Some(info.url), Kind::Cached, doc).await?;
        Ok(Some(()))
    }

    /// Forgets the kept document with identifier `local_id` and every
    /// context built from it (a cached one is fetched again when next
    /// named); whether it was kept.
    pub async fn forget(&self, local_id: &str) -> Result<bool, LdError> {
        let was = self
            .documents
            .lock()
            .expect("contexts lock")
            .remove(local_id)
            .is_some();
        if let Some(store) = &self.store {
            store
                .delete_document(DocumentKind::LdContext, "", local_id)
                .await
                .map_err(|e| LdError::new(ErrorKind::InternalError, e.to_string()))?;
        }
        if was {
            self.built.lock().expect("contexts lock").clear();
        }
        Ok(was)
    }

    /// Keeps `doc` (and stores it); answers its local identifier. Full of
    /// cached documents, the cached ones are dropped first.
    async fn keep(&self, url: Option<String>, kind: Kind, doc: Value) -> Result<String, LdError> {
        let local_id = uuid::Uuid::new_v4().simple().to_string();
        let kept = Kept {
            doc: Arc::new(doc),
            url,
            kind,
            created_at: weft_model::now_ms(),
        };
        let json = to_storage(&kept);
        let dropped: Vec<String> = {
            let mut documents = self.documents.lock().expect("contexts lock");
            let cached = documents
                .values()
                .filter(|k| k.kind == Kind::Cached)
                .count();
            let dropped = if kind == Kind::Cached && cached >= MAX_KEPT {
                let ids: Vec<String> = documents
                    .iter()
                    .filter(|(_, k)| k.kind == Kind::Cached)
                    .map(|(id, _)| id.clone())
                    .collect();
                documents.retain(|_, k| k.kind != Kind::Cached);
                ids
            } else {
                Vec::new()
            };
            documents.insert(local_id.clone(), kept);
            dropped
        };
        let Some(store) = &self.store else {
            return Ok(local_id);
        };
        for id in dropped {
            if let Err(e) = store
                .delete_document(DocumentKind::LdContext, "", &id)
                .await
            {
                tracing::warn!(error = %e, "dropping a stored @context failed");
            }
        }
        let stored = store
            .put_document(NgsiDocument {
                kind: DocumentKind::LdContext,
                tenant: String::new(),
                id: local_id.clone(),
                service_path: String::new(),
                created: 0,
                json,
            })
            .await;
        match (stored, kind) {
            (Ok(()), _) => {}
            // A fetched one serves from memory meanwhile.
            (Err(e), Kind::Cached) => {
                tracing::warn!(error = %e, "storing a fetched @context failed; kept in memory")
            }
            (Err(e), Kind::Hosted) => {
                self.documents
                    .lock()
                    .expect("contexts lock")
                    .remove(&local_id);
                return Err(LdError::new(ErrorKind::InternalError, e.to_string()));
            }
        }
        Ok(local_id)
    }

    /// Fetches one remote context document.
    async fn fetch(&self, url: &str) -> Result<Value, LdError> {
        let unavailable = |why: &dyn std::fmt::Display| {
            LdError::new(
                weft_model::ngsi_ld::ErrorKind::LdContextNotAvailable,
                format!("the @context {url} could not be retrieved: {why}"),
            )
        };
        let parsed = url::Url::parse(url).map_err(|e| unavailable(&e))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(LdError::bad_request(format!(
                "the @context {url} is not an http(s) URL"
            )));
        }
        let response = self
            .client
            .get(parsed)
            .header("accept", "application/ld+json, application/json")
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| unavailable(&outbound::describe(&e)))?;
        if !response.status().is_success() {
            return Err(unavailable(&format!("status {}", response.status())));
        }
        let body = outbound::read_body(response, MAX_DOCUMENT_BYTES)
            .await
            .map_err(|e| unavailable(&e))?;
        let doc: Value = serde_json::from_slice(&body).map_err(|e| unavailable(&e))?;
        if doc.get("@context").is_none() {
            return Err(unavailable(&"the document has no @context"));
        }
        Ok(doc)
    }
}

/// The local identifier a URL names when its path is where weft serves
/// its contexts.
fn hosted_id(url: &str) -> Option<&str> {
    let (_, id) = url.split_once(SERVED_AT)?;
    (!id.is_empty() && !id.contains(['/', '?', '#'])).then_some(id)
}

/// The stored form of a kept document.
fn to_storage(k: &Kept) -> String {
    json!({
        "url": k.url,
        "kind": k.kind.as_str(),
        "createdAt": k.created_at,
        "document": *k.doc,
    })
    .to_string()
}

/// Reads [`to_storage`] back.
fn from_storage(text: &str) -> Option<Kept> {
    let v: Value = serde_json::from_str(text).ok()?;
    let kind = match v.get("kind")?.as_str()? {
        "Hosted" => Kind::Hosted,
        "Cached" => Kind::Cached,
        _ => return None,
    };
    Some(Kept {
        doc: Arc::new(v.get("document")?.clone()),
        url: v.get("url").and_then(Value::as_str).map(str::to_string),
        kind,
        created_at: v.get("createdAt").and_then(Value::as_i64).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_model::ngsi_ld::ErrorKind;

    #[tokio::test]
    async fn no_context_is_the_core_and_inline_ones_need_no_fetch() {
        let contexts = LdContexts::new();
        assert!(contexts.resolve(None).await.unwrap().is_core());
        let inline = json!({"speed": "http://example.org/speed"});
        let ctx = contexts.resolve(Some(&inline)).await.unwrap();
        assert_eq!(ctx.expand("speed"), "http://example.org/speed");
        // Built once: the same context is handed out again.
        assert!(Arc::ptr_eq(
            &ctx,
            &contexts.resolve(Some(&inline)).await.unwrap()
        ));
        assert!(contexts.kept().is_empty());
    }

    #[tokio::test]
    async fn a_context_that_cannot_be_fetched_is_not_available() {
        let contexts = LdContexts::new();
        // Nothing listens on port 1.
        let url = json!("http://127.0.0.1:1/context.jsonld");
        let e = contexts.resolve(Some(&url)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::LdContextNotAvailable);
        let e = contexts
            .resolve(Some(&json!("file:///etc/passwd")))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequestData);
    }

    #[tokio::test]
    async fn kept_documents_are_listed_served_and_forgotten() {
        let contexts = LdContexts::new();
        let url = "http://example.org/c.jsonld".to_string();
        contexts
            .keep(
                Some(url.clone()),
                Kind::Cached,
                json!({"@context": {"a": "http://example.org/a"}}),
            )
            .await
            .unwrap();
        let kept = contexts.kept();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (kept[0].url.as_str(), kept[0].kind),
            (url.as_str(), Kind::Cached)
        );
        let (found, doc) = contexts.by_local_id(&kept[0].local_id).unwrap();
        assert_eq!(found.url, url);
        assert_eq!(doc["@context"]["a"], "http://example.org/a");
        // A kept document resolves without a fetch.
        let ctx = contexts.resolve(Some(&json!(url))).await.unwrap();
        assert_eq!(ctx.expand("a"), "http://example.org/a");
        assert!(contexts.forget(&kept[0].local_id).await.unwrap());
        assert!(!contexts.forget(&kept[0].local_id).await.unwrap());
        assert!(contexts.kept().is_empty());
    }

    #[tokio::test]
    async fn a_hosted_context_is_named_by_its_url_whatever_the_host() {
        let contexts = LdContexts::new();
        let hosted = contexts
            .host(json!({"@context": {"b": "http://example.org/b"}}))
            .await
            .unwrap();
        assert_eq!(hosted.kind, Kind::Hosted);
        assert_eq!(hosted.url, format!("{SERVED_AT}{}", hosted.local_id));
        for base in ["http://localhost:8080", "https://broker.example"] {
            let url = json!(format!("{base}{}", hosted.url));
            let ctx = contexts.resolve(Some(&url)).await.unwrap();
            assert_eq!(ctx.expand("b"), "http://example.org/b");
        }
        // Only documents with an @context of terms are hosted.
        for bad in [
            json!({"b": 1}),
            json!({"@context": "http://x.example/c"}),
            json!([1]),
        ] {
            let e = contexts.host(bad).await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadRequestData);
        }
    }
}
