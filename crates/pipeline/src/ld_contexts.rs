//! The `@context`s NGSI-LD requests name: each remote document fetched
//! once and kept, each context built once and shared by every request
//! that names it the same way.
//!
//! The core context never leaves the binary
//! ([`weft_model::ngsi_ld::context`]). A client's own context is fetched
//! the first time a request names it (a `Link` header or a body's
//! `@context`), with the outbound client's rules (no redirects, a
//! timeout, a size limit), and kept in memory: NGSI-LD clients send the
//! same context URL on every request, and a broker that fetched it each
//! time would be as slow as that server and down when it is. The
//! documents kept are what `/ngsi-ld/v1/jsonldContexts` lists, each under
//! a local identifier ([`LdContexts::kept`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use weft_model::ngsi_ld::context::{remote_urls, Context};
use weft_model::ngsi_ld::LdError;

use crate::outbound;

/// How long fetching one remote context may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest remote context document weft reads.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// How many built contexts and fetched documents are kept; when either
/// is full it starts over (contexts are few in practice; this bounds
/// what a client inventing new ones can make weft hold).
pub const MAX_KEPT: usize = 1024;

/// How many remote documents one context may pull in, nested ones
/// included.
const MAX_DOCUMENTS_PER_CONTEXT: usize = 32;

/// The kept contexts and documents.
pub struct LdContexts {
    /// Built contexts by the JSON text of what named them.
    built: Mutex<HashMap<String, Arc<Context>>>,
    /// Fetched documents by URL.
    documents: Mutex<HashMap<String, Kept>>,
    /// The next local identifier.
    next_id: AtomicU64,
    client: reqwest::Client,
}

/// A fetched document and what `/jsonldContexts` says of it.
struct Kept {
    doc: Arc<Value>,
    local_id: String,
    fetched_at: i64,
}

/// A kept remote context, as `/ngsi-ld/v1/jsonldContexts` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptContext {
    /// Where it was fetched from.
    pub url: String,
    /// weft's identifier of it (`/jsonldContexts/{local_id}`).
    pub local_id: String,
    /// When it was fetched, epoch milliseconds.
    pub fetched_at: i64,
}

impl Default for LdContexts {
    fn default() -> Self {
        LdContexts::new()
    }
}

impl LdContexts {
    /// Nothing kept yet.
    pub fn new() -> LdContexts {
        LdContexts {
            built: Mutex::new(HashMap::new()),
            documents: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            client: outbound::http(),
        }
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
            self.keep_document(url, doc);
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

    /// A kept document.
    pub fn document(&self, url: &str) -> Option<Arc<Value>> {
        self.documents
            .lock()
            .expect("contexts lock")
            .get(url)
            .map(|k| k.doc.clone())
    }

    /// The documents kept, by URL.
    pub fn kept(&self) -> Vec<KeptContext> {
        let mut kept: Vec<KeptContext> = self
            .documents
            .lock()
            .expect("contexts lock")
            .iter()
            .map(|(url, k)| KeptContext {
                url: url.clone(),
                local_id: k.local_id.clone(),
                fetched_at: k.fetched_at,
            })
            .collect();
        kept.sort_by(|a, b| a.url.cmp(&b.url));
        kept
    }

    /// The kept document with identifier `local_id`, and its URL.
    pub fn by_local_id(&self, local_id: &str) -> Option<(String, Arc<Value>)> {
        self.documents
            .lock()
            .expect("contexts lock")
            .iter()
            .find(|(_, k)| k.local_id == local_id)
            .map(|(url, k)| (url.clone(), k.doc.clone()))
    }

    /// Forgets the kept document with identifier `local_id` and every
    /// context built from it (it is fetched again when next named);
    /// whether it was kept.
    pub fn forget(&self, local_id: &str) -> bool {
        let mut documents = self.documents.lock().expect("contexts lock");
        let before = documents.len();
        documents.retain(|_, k| k.local_id != local_id);
        let was = documents.len() < before;
        drop(documents);
        if was {
            self.built.lock().expect("contexts lock").clear();
        }
        was
    }

    fn keep_document(&self, url: String, doc: Value) {
        let local_id = format!("{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut documents = self.documents.lock().expect("contexts lock");
        if documents.len() >= MAX_KEPT {
            documents.clear();
        }
        documents.insert(
            url,
            Kept {
                doc: Arc::new(doc),
                local_id,
                fetched_at: weft_model::now_ms(),
            },
        );
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
        contexts.keep_document(
            url.clone(),
            json!({"@context": {"a": "http://example.org/a"}}),
        );
        let kept = contexts.kept();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].url, url);
        let (found, doc) = contexts.by_local_id(&kept[0].local_id).unwrap();
        assert_eq!(found, url);
        assert_eq!(doc["@context"]["a"], "http://example.org/a");
        // A kept document resolves without a fetch.
        let ctx = contexts.resolve(Some(&json!(url))).await.unwrap();
        assert_eq!(ctx.expand("a"), "http://example.org/a");
        assert!(contexts.forget(&kept[0].local_id));
        assert!(!contexts.forget(&kept[0].local_id));
        assert!(contexts.kept().is_empty());
    }
}
