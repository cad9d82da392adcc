//! Pages: templates in Knot.x 1.x markup whose snippets are filled from
//! services and rendered with Handlebars.
//!
//! A template is split once when it is saved ([`weft_model::page`]) and
//! its snippet bodies compiled once into a Handlebars registry of its own;
//! both are cached. A render makes each distinct service call of the page
//! once (calls of different snippets run concurrently), binds the results
//! into each snippet's context, renders it, and assembles the page from
//! the static parts (byte for byte) and the rendered snippets. A snippet
//! whose service fails, or that fails to render, is replaced by its
//! fallback (`BLANK`, a `<knotx:fallback>` id, or the configured default)
//! and the page still answers 200. Concurrent renders are limited; beyond
//! the limit a render is refused at once (the API answers 503).
//!
//! Pages sit on top of weft's services: they read the context, the alarms
//! and the store through [`service::Sources`] and change nothing but their
//! own templates and services, so nothing below depends on them and the
//! binary builds them last. A template or service changed through another
//! node is reloaded from the store as soon as that node announces it
//! ([`Follower`]).
#![deny(missing_docs)]

mod limits;
#[cfg(test)]
mod proptests;
pub mod service;

use std::collections::HashMap;
use std::sync::Arc;

use handlebars::Handlebars;
use serde_json::{json, Map, Value};
use tokio::sync::Semaphore;
use weft_bus::Bus;
use weft_model::page::{Fragment, Template, TemplateError};
use weft_pipeline::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};
use weft_store::{DocumentKind, NgsiDocument, Store, StoreError};

pub use limits::MAX_TEMPLATE_DEPTH;
pub use service::{PageService, RequestInfo};

/// Tuning of pages.
#[derive(Debug, Clone)]
pub struct PagesConfig {
    /// Pages rendered at once; more are refused (503).
    pub max_concurrent_renders: usize,
    /// What a failed snippet without `data-knotx-fallback` becomes.
    pub default_fallback: String,
    /// Requests that may wait for a render slot; more are refused (503).
    pub max_waiting_renders: usize,
    /// A directory whose `*.html` files (recursively) are loaded as pages
    /// at start, named by their path below it (`site/home.html`). Pages
    /// stored through the API with the same name take precedence.
    pub directory: Option<std::path::PathBuf>,
    /// Services from the configuration file, by name; services stored
    /// through the API with the same name take precedence.
    pub services: Vec<(String, PageService)>,
    /// Whether page requests that need the very same service call while
    /// one is under way share its outcome (request coalescing, as a
    /// caching proxy's cache lock does) instead of calling again.
    pub coalesce_calls: bool,
}

impl Default for PagesConfig {
    fn default() -> Self {
        PagesConfig {
            max_concurrent_renders: 64,
            default_fallback: String::new(),
            max_waiting_renders: 4096,
            directory: None,
            services: Vec::new(),
            coalesce_calls: true,
        }
    }
}

/// Why a page could not be rendered or saved.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// No such page (404).
    #[error("page '{0}' does not exist")]
    NotFound(String),
    /// The template or service definition is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// Too many renders at once (503).
    #[error("too many pages are being rendered; retry later")]
    Busy,
    /// A page loaded at start (from the store or the pages directory)
    /// that cannot be rendered safely — it does not split, a snippet does
    /// not compile, its partials form a cycle, it nests too deep — is
    /// kept so its source can be read and replaced, and every view of it
    /// fails with this (500) instead of rendering.
    #[error("page '{name}' cannot be rendered: {problem}")]
    Broken {
        /// The page.
        name: String,
        /// What is wrong with its template.
        problem: String,
    },
    /// One view of the page went past [`limits::MAX_PAGE_BYTES`] of output
    /// or [`limits::MAX_RENDER_TIME`] (500): its template over the data it
    /// got renders too much; the view fails rather than take the memory
    /// or the thread.
    #[error("page '{name}' could not be rendered: {problem}")]
    OverBudget {
        /// The page.
        name: String,
        /// Which limit it reached.
        problem: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A Handlebars registry that behaves as Knot.x's handlebars.java does
/// where the two differ: a block helper that is not registered
/// (`{{#bold}}…{{/bold}}`) renders nothing instead of failing.
fn knotx_handlebars() -> Handlebars<'static> {
    fn nothing(
        _: &handlebars::Helper<'_>,
        _: &Handlebars<'_>,
        _: &handlebars::Context,
        _: &mut handlebars::RenderContext<'_, '_>,
        _: &mut dyn handlebars::Output,
    ) -> handlebars::HelperResult {
        Ok(())
    }
    let mut h = Handlebars::new();
    h.set_strict_mode(false);
    h.register_helper("blockHelperMissing", Box::new(nothing));
    h
}

/// A saved template, split and compiled.
struct Compiled {
    template: Template,
    handlebars: Handlebars<'static>,
    /// Per snippet, the name its body is registered under: snippets with
    /// the same body share one compiled template.
    names: Vec<String>,
}

/// A page as kept: compiled and checked, or — when it was loaded at start
/// and fails to compile or to pass the checks — its source and what is
/// wrong, so that viewing it fails that request alone.
enum Page {
    Ready(Box<Compiled>),
    Broken { source: String, problem: String },
}

impl Page {
    /// The page from a template loaded at start (`what` says from where,
    /// for the log).
    fn load(name: &str, source: String, what: &str) -> Page {
        match compile(source.clone()) {
            Ok(c) => Page::Ready(Box::new(c)),
            Err(e) => {
                tracing::warn!(page = %name, error = %e, "{what} cannot be rendered; viewing it fails");
                Page::Broken {
                    source,
                    problem: e.to_string(),
                }
            }
        }
    }

    fn source(&self) -> &str {
        match self {
            Page::Ready(c) => &c.template.source,
            Page::Broken { source, .. } => source,
        }
    }
}

/// The pages and their services.
pub struct Pages {
    store: Arc<dyn Store>,
    /// Where changes of templates and services are announced to the other
    /// nodes.
    bus: Arc<dyn Bus>,
    sources: service::Sources,
    config: PagesConfig,
    pages: parking_lot::RwLock<HashMap<String, Arc<Page>>>,
    services: parking_lot::RwLock<HashMap<String, Arc<PageService>>>,
    renders: Arc<Semaphore>,
    waiting: std::sync::atomic::AtomicUsize,
    /// Cached results by call (service, params, forwarded headers).
    cache: parking_lot::Mutex<HashMap<String, (std::time::Instant, Arc<Value>)>>,
    /// Circuit breakers by service name: failures in a row, open until.
    breakers: parking_lot::Mutex<HashMap<String, (u32, Option<std::time::Instant>)>>,
    /// Calls under way, by what they send ([`flight_key`]): a page request
    /// that needs the same call waits for its outcome instead of calling
    /// again.
    in_flight: parking_lot::Mutex<HashMap<String, CallOutcome>>,
}

/// Where a call under way publishes its outcome (`None` until it ends).
type CallOutcome = tokio::sync::watch::Sender<Option<Result<Arc<Value>, String>>>;

/// What identifies a call to its service: the call (`key`: service,
/// parameters, forwarded headers) and every header of the page request,
/// since `{header.x}` placeholders may put any of them into the URL.
/// Only calls identical in all of this share one outcome.
fn flight_key(key: &str, request: &RequestInfo) -> String {
    let mut headers: Vec<(&String, &String)> = request.headers.iter().collect();
    headers.sort_unstable();
    let mut out = String::with_capacity(key.len() + 64);
    out.push_str(key);
    for (name, value) in headers {
        out.push('\u{1}');
        out.push_str(name);
        out.push('\u{0}');
        out.push_str(value);
    }
    out
}

/// Removes a leading call's entry from [`Pages::in_flight`] when it ends,
/// also when its page request is dropped half way (the calls waiting on
/// it then make the call themselves).
struct Flight<'a> {
    in_flight: &'a parking_lot::Mutex<HashMap<String, CallOutcome>>,
    key: String,
}

impl Flight<'_> {
    /// Takes the entry out and publishes `outcome` to whoever waits on it.
    fn land(self, outcome: &Result<Arc<Value>, String>) {
        if let Some(tx) = self.in_flight.lock().remove(&self.key) {
            let _ = tx.send(Some(outcome.clone()));
        }
        std::mem::forget(self);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.in_flight.lock().remove(&self.key);
    }
}

/// Most cached results kept (beyond, an arbitrary one is dropped).
const MAX_CACHED_RESULTS: usize = 10_000;

/// Counts one request waiting for a render slot while it lives.
struct WaitingGuard<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> WaitingGuard<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize, max: usize) -> Option<WaitingGuard<'a>> {
        use std::sync::atomic::Ordering;
        if count.fetch_add(1, Ordering::AcqRel) >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(WaitingGuard(count))
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Splits a template, compiles its snippets into a registry of its own and
/// checks how deep they can make a render go ([`limits`]); what is wrong
/// is a [`PageError::Invalid`] naming it.
fn compile(source: String) -> Result<Compiled, PageError> {
    let template = Template::parse(source).map_err(|TemplateError(e)| PageError::Invalid(e))?;
    let mut handlebars = knotx_handlebars();
    let mut by_body: HashMap<&str, String> = HashMap::new();
    let mut names = Vec::with_capacity(template.snippets.len());
    for (i, s) in template.snippets.iter().enumerate() {
        if let Some(name) = by_body.get(s.body.as_str()) {
            names.push(name.clone());
            continue;
        }
        let name = i.to_string();
        if s.knots.iter().any(|k| k == "handlebars") {
            limits::prescan(&s.body)
                .map_err(|e| PageError::Invalid(format!("snippet {}: {e}", i + 1)))?;
            handlebars
                .register_template_string(&name, &s.body)
                .map_err(|e| PageError::Invalid(format!("snippet {}: {e}", i + 1)))?;
        }
        by_body.insert(&s.body, name.clone());
        names.push(name);
    }
    let registered: Vec<&str> = by_body.values().map(String::as_str).collect();
    limits::check(&handlebars, &registered).map_err(PageError::Invalid)?;
    Ok(Compiled {
        template,
        handlebars,
        names,
    })
}

impl Pages {
    /// Loads the stored pages and services.
    pub async fn load(
        store: Arc<dyn Store>,
        sources: service::Sources,
        config: PagesConfig,
        bus: Arc<dyn Bus>,
    ) -> Result<Arc<Pages>, StoreError> {
        let pages = read_pages(&store, &config).await?;
        let services = read_services(&store, &config).await?;
        Ok(Arc::new(Pages {
            store,
            bus,
            sources,
            renders: Arc::new(Semaphore::new(config.max_concurrent_renders.max(1))),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            cache: parking_lot::Mutex::new(HashMap::new()),
            breakers: parking_lot::Mutex::new(HashMap::new()),
            in_flight: parking_lot::Mutex::new(HashMap::new()),
            config,
            pages: parking_lot::RwLock::new(pages),
            services: parking_lot::RwLock::new(services),
        }))
    }

    /// Tells the other nodes that `name` of `kind` changed.
    fn announce(&self, kind: DefinitionKind, name: &str) {
        self.bus
            .definition_changed(DefinitionChange::new(kind, name));
    }

    async fn put_doc(
        &self,
        kind: DocumentKind,
        name: &str,
        json: String,
    ) -> Result<(), StoreError> {
        self.store
            .put_document(NgsiDocument {
                kind,
                tenant: String::new(),
                id: name.to_string(),
                service_path: "/".to_string(),
                created: weft_model::now_ms() as u64,
                json,
            })
            .await
    }

    /// Saves a template (split and compiled first; an invalid one is
    /// refused and changes nothing). Answers whether it is new.
    pub async fn put_page(&self, name: &str, source: String) -> Result<bool, PageError> {
        weft_model::validate::page_name("name", name)
            .map_err(|e| PageError::Invalid(e.to_string()))?;
        let compiled = compile(source.clone())?;
        self.put_doc(DocumentKind::Page, name, Value::String(source).to_string())
            .await?;
        let new = self
            .pages
            .write()
            .insert(name.to_string(), Arc::new(Page::Ready(Box::new(compiled))))
            .is_none();
        self.announce(DefinitionKind::Page, name);
        Ok(new)
    }

    /// A template's source.
    pub fn page(&self, name: &str) -> Option<String> {
        self.pages.read().get(name).map(|p| p.source().to_string())
    }

    /// Every page name.
    pub fn page_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.pages.read().keys().cloned().collect();
        names.sort();
        names
    }

    /// Deletes a page; `true` if it existed.
    pub async fn delete_page(&self, name: &str) -> Result<bool, StoreError> {
        self.store
            .delete_document(DocumentKind::Page, "", name)
            .await?;
        let existed = self.pages.write().remove(name).is_some();
        self.announce(DefinitionKind::Page, name);
        Ok(existed)
    }

    /// Saves a service definition. Answers whether it is new.
    pub async fn put_service(&self, name: &str, service: PageService) -> Result<bool, PageError> {
        weft_model::validate::object_id("name", name)
            .map_err(|e| PageError::Invalid(e.to_string()))?;
        service.validate().map_err(PageError::Invalid)?;
        let json = serde_json::to_string(&service).expect("services serialise");
        self.put_doc(DocumentKind::PageService, name, json).await?;
        let new = self
            .services
            .write()
            .insert(name.to_string(), Arc::new(service))
            .is_none();
        self.announce(DefinitionKind::PageService, name);
        Ok(new)
    }

    /// A service definition.
    pub fn service(&self, name: &str) -> Option<PageService> {
        self.services.read().get(name).map(|s| (**s).clone())
    }

    /// Deletes a service; `true` if it existed.
    pub async fn delete_service(&self, name: &str) -> Result<bool, StoreError> {
        self.store
            .delete_document(DocumentKind::PageService, "", name)
            .await?;
        let existed = self.services.write().remove(name).is_some();
        self.announce(DefinitionKind::PageService, name);
        Ok(existed)
    }

    /// One service call, shared with the page requests that need the
    /// same call while it is under way (when `coalesce_calls` is on).
    async fn guarded_call(
        &self,
        key: &str,
        svc: &PageService,
        params: &Map<String, Value>,
        request: &RequestInfo,
    ) -> Result<Arc<Value>, String> {
        if !self.config.coalesce_calls {
            return self.call_through_cache(key, svc, params, request).await;
        }
        let flight = flight_key(key, request);
        let waiting = {
            let mut in_flight = self.in_flight.lock();
            match in_flight.get(&flight) {
                Some(tx) => Some(tx.subscribe()),
                None => {
                    in_flight.insert(flight.clone(), tokio::sync::watch::channel(None).0);
                    None
                }
            }
        };
        if let Some(mut rx) = waiting {
            if let Ok(outcome) = rx.wait_for(Option::is_some).await {
                if let Some(outcome) = outcome.as_ref() {
                    return outcome.clone();
                }
            }
            // The leading call's page request went away before it ended.
            return self.call_through_cache(key, svc, params, request).await;
        }
        let flight = Flight {
            in_flight: &self.in_flight,
            key: flight,
        };
        let outcome = self.call_through_cache(key, svc, params, request).await;
        flight.land(&outcome);
        outcome
    }

    /// One service call through its cache and circuit breaker.
    async fn call_through_cache(
        &self,
        key: &str,
        svc: &PageService,
        params: &Map<String, Value>,
        request: &RequestInfo,
    ) -> Result<Arc<Value>, String> {
        let service = key.split('\u{0}').next().unwrap_or_default().to_string();
        let now = std::time::Instant::now();
        // The forwarded headers are part of what is called.
        let mut cache_key = key.to_string();
        if let Some(h) = &svc.http {
            for name in &h.headers {
                cache_key.push('\u{0}');
                cache_key.push_str(
                    request
                        .headers
                        .get(&name.to_ascii_lowercase())
                        .map_or("", String::as_str),
                );
            }
        }
        let cached = self.cache.lock().get(&cache_key).cloned();
        if let (Some(spec), Some((at, value))) = (&svc.cache, &cached) {
            if now.duration_since(*at) < spec.ttl {
                return Ok(value.clone());
            }
        }
        let stale = || match (&svc.cache, &cached) {
            (Some(spec), Some((_, v))) if spec.serve_stale => Some(v.clone()),
            _ => None,
        };
        let breaker = svc.circuit_breaker.clone().unwrap_or_default();
        let open = self
            .breakers
            .lock()
            .get(&service)
            .and_then(|(_, until)| *until)
            .is_some_and(|until| now < until);
        if open {
            return stale().ok_or_else(|| format!("service '{service}' is failing (circuit open)"));
        }
        match self.sources.call(svc, params, request).await {
            Ok(v) => {
                let v = Arc::new(v);
                self.breakers.lock().remove(&service);
                if svc
                    .cache
                    .as_ref()
                    .is_some_and(|c| !c.ttl.is_zero() || c.serve_stale)
                {
                    let mut cache = self.cache.lock();
                    if cache.len() >= MAX_CACHED_RESULTS {
                        if let Some(k) = cache.keys().next().cloned() {
                            cache.remove(&k);
                        }
                    }
                    cache.insert(cache_key, (now, v.clone()));
                }
                Ok(v)
            }
            Err(e) => {
                let mut breakers = self.breakers.lock();
                let entry = breakers.entry(service).or_insert((0, None));
                entry.0 += 1;
                if entry.0 >= breaker.failures.max(1) {
                    entry.1 = Some(std::time::Instant::now() + breaker.open_for);
                    entry.0 = 0;
                }
                stale().ok_or(e)
            }
        }
    }

    /// Renders page `name` for a request.
    pub async fn render(&self, name: &str, request: &RequestInfo) -> Result<String, PageError> {
        let page = self
            .pages
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| PageError::NotFound(name.to_string()))?;
        let page = match &*page {
            Page::Ready(c) => c,
            Page::Broken { problem, .. } => {
                return Err(PageError::Broken {
                    name: name.to_string(),
                    problem: problem.clone(),
                })
            }
        };
        // Up to `max_waiting_renders` requests wait for a render slot (they
        // hold no page memory yet); beyond that the answer is 503 at once.
        let _permit = match self.renders.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let waiting = WaitingGuard::enter(&self.waiting, self.config.max_waiting_renders)
                    .ok_or(PageError::Busy)?;
                let p = self
                    .renders
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| PageError::Busy)?;
                drop(waiting);
                p
            }
        };
        let t = &page.template;

        // Each distinct call once, all concurrently.
        let mut calls: HashMap<String, (Arc<PageService>, Map<String, Value>)> = HashMap::new();
        let mut snippet_calls: Vec<Vec<(Option<String>, Option<String>)>> = Vec::new();
        {
            let services = self.services.read();
            for s in &t.snippets {
                let mut bound = Vec::new();
                if s.knots.iter().any(|k| k == "services") {
                    for b in &s.services {
                        let key = services.get(&b.service).map(|svc| {
                            let params = svc.params_for(s.params.as_ref(), request);
                            let key =
                                format!("{}\u{0}{}", b.service, Value::Object(params.clone()));
                            calls.entry(key.clone()).or_insert((svc.clone(), params));
                            key
                        });
                        bound.push((b.ns.clone(), key));
                    }
                }
                snippet_calls.push(bound);
            }
        }
        let keys: Vec<String> = calls.keys().cloned().collect();
        let results = futures::future::join_all(keys.iter().map(|k| {
            let (svc, params) = &calls[k];
            self.guarded_call(k, svc, params, request)
        }))
        .await;
        let results: HashMap<&str, Option<Arc<Value>>> = keys
            .iter()
            .map(String::as_str)
            .zip(results.into_iter().map(|r| match r {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::debug!(error = %e, "page service failed");
                    None
                }
            }))
            .collect();

        let mut out = String::with_capacity(t.source.len() * 2);
        // Snippets binding the same calls share one render context, and a
        // snippet with the same body over the same context renders to the
        // same HTML: rendered once per page request.
        let mut contexts: HashMap<String, Option<handlebars::Context>> = HashMap::new();
        let mut rendered_once: HashMap<(String, String), Option<Arc<str>>> = HashMap::new();
        let mut budget = limits::RenderBudget::new();
        for f in &t.fragments {
            match f {
                Fragment::Static(r) => {
                    let text = &t.source[r.clone()];
                    budget
                        .take(text.len())
                        .map_err(|problem| PageError::OverBudget {
                            name: name.to_string(),
                            problem,
                        })?;
                    out.push_str(text);
                }
                Fragment::Snippet(i) => {
                    let s = &t.snippets[*i];
                    if !s.knots.iter().any(|k| k == "handlebars") {
                        out.push_str("<!-- SNIPPET UNWRAPED START -->");
                        out.push_str(&s.body);
                        out.push_str("<!-- SNIPPET UNWRAPED STOP -->");
                        continue;
                    }
                    let bound = &snippet_calls[*i];
                    let ctx_key: String = bound
                        .iter()
                        .map(|(ns, k)| format!("{ns:?}={k:?};"))
                        .collect();
                    let snippet = &page.names[*i];
                    let rendered = rendered_once
                        .entry((snippet.clone(), ctx_key.clone()))
                        .or_insert_with(|| {
                            let ctx = contexts
                                .entry(ctx_key)
                                .or_insert_with(|| context(bound, &results))
                                .as_ref()?;
                            let mut output = limits::BudgetedOutput::new(&mut budget);
                            page.handlebars
                                .render_with_context_to_write(snippet, ctx, &mut output)
                                .map_err(|e| tracing::debug!(error = %e, "snippet render failed"))
                                .ok()?;
                            // Handlebars writes only UTF-8 `str`s.
                            String::from_utf8(output.buffer).ok().map(Arc::from)
                        })
                        .clone();
                    if let Some(problem) = budget.exhausted.take() {
                        return Err(PageError::OverBudget {
                            name: name.to_string(),
                            problem,
                        });
                    }
                    match rendered {
                        Some(html) => {
                            budget
                                .take(html.len())
                                .map_err(|problem| PageError::OverBudget {
                                    name: name.to_string(),
                                    problem,
                                })?;
                            out.push_str(&html)
                        }
                        None => out.push_str(match s.fallback.as_deref() {
                            Some("BLANK") => "",
                            Some(id) => t
                                .fallbacks
                                .get(id)
                                .map(String::as_str)
                                .unwrap_or(&self.config.default_fallback),
                            None => &self.config.default_fallback,
                        }),
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Every `*.html` file below `dir` as (path below `dir` with `/`, text);
/// unreadable files and directories are logged and skipped.
fn html_files(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %d.display(), error = %e, "cannot read the pages directory");
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|x| x == "html") {
                let name = path
                    .strip_prefix(dir)
                    .map(|p| {
                        p.components()
                            .map(|c| c.as_os_str().to_string_lossy())
                            .collect::<Vec<_>>()
                            .join("/")
                    })
                    .unwrap_or_default();
                match std::fs::read_to_string(&path) {
                    Ok(text) => out.push((name, text)),
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "cannot read a page file")
                    }
                }
            }
        }
    }
    out
}

/// A snippet's render context, or `None` if one of its services failed
/// (or is not defined).
fn context(
    bound: &[(Option<String>, Option<String>)],
    results: &HashMap<&str, Option<Arc<Value>>>,
) -> Option<handlebars::Context> {
    let mut root = Map::new();
    for (ns, key) in bound {
        let result = results.get(key.as_deref()?)?.as_ref()?;
        let value = json!({"_result": &**result, "_response": {"statusCode": "200"}});
        match ns {
            None => {
                if let Value::Object(m) = value {
                    root.extend(m);
                }
            }
            Some(ns) => {
                root.insert(ns.clone(), value);
            }
        }
    }
    handlebars::Context::wraps(Value::Object(root)).ok()
}

/// The templates as a start loads them: the directory's files, then the
/// stored ones (which take precedence).
async fn read_pages(
    store: &Arc<dyn Store>,
    config: &PagesConfig,
) -> Result<HashMap<String, Arc<Page>>, StoreError> {
    let mut pages = HashMap::new();
    if let Some(dir) = &config.directory {
        for (name, source) in html_files(dir) {
            let page = Page::load(&name, source, "a page file");
            pages.insert(name, Arc::new(page));
        }
    }
    for doc in store.load_documents(DocumentKind::Page).await? {
        let source: String = serde_json::from_str(&doc.json).unwrap_or_default();
        let page = Page::load(&doc.id, source, "a stored page");
        pages.insert(doc.id, Arc::new(page));
    }
    Ok(pages)
}

/// The services as a start loads them: the configured ones, then the
/// stored ones (which take precedence).
async fn read_services(
    store: &Arc<dyn Store>,
    config: &PagesConfig,
) -> Result<HashMap<String, Arc<PageService>>, StoreError> {
    let mut services = HashMap::new();
    for (name, svc) in &config.services {
        match svc.validate() {
            Ok(()) => {
                services.insert(name.clone(), Arc::new(svc.clone()));
            }
            Err(e) => {
                tracing::warn!(service = %name, error = %e, "a configured page service is invalid; skipped")
            }
        }
    }
    for doc in store.load_documents(DocumentKind::PageService).await? {
        if let Ok(s) = serde_json::from_str::<PageService>(&doc.json) {
            services.insert(doc.id, Arc::new(s));
        }
    }
    Ok(services)
}

/// Puts into `held` what `fresh` has for every name `covered` names, and
/// drops what `fresh` no longer has.
fn refresh<V>(
    held: &mut HashMap<String, Arc<V>>,
    mut fresh: HashMap<String, Arc<V>>,
    covered: impl Fn(&str) -> bool,
) {
    held.retain(|name, _| !covered(name) || fresh.contains_key(name));
    for (name, value) in fresh.drain() {
        if covered(&name) {
            held.insert(name, value);
        }
    }
}

impl Follower for Pages {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::Page, DefinitionKind::PageService];

    /// Reads the templates or services again as a start would, and takes
    /// the ones named.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        if what.concerns(&[DefinitionKind::Page]) {
            let fresh = read_pages(&self.store, &self.config).await?;
            refresh(&mut *self.pages.write(), fresh, |name| {
                what.covers(DefinitionKind::Page, "", name)
            });
        }
        if what.concerns(&[DefinitionKind::PageService]) {
            let fresh = read_services(&self.store, &self.config).await?;
            refresh(&mut *self.services.write(), fresh, |name| {
                what.covers(DefinitionKind::PageService, "", name)
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_one(tpl: &str, data: Value) -> Result<String, String> {
        let mut h = knotx_handlebars();
        h.register_template_string("t", tpl)
            .map_err(|e| e.to_string())?;
        h.render("t", &data).map_err(|e| e.to_string())
    }

    /// The handlebars.java paths Knot.x templates use render as they do
    /// there: dashed names, numeric segments, unknown block helpers.
    #[test]
    fn knotx_paths() {
        let data =
            json!({"_result": {"messner-mountains": ["a", "b"], "x": {"1": "one"}, "t": "<b>"}});
        assert_eq!(
            render_one("{{_result.messner-mountains.1}}", data.clone()).unwrap(),
            "b"
        );
        assert_eq!(render_one("{{_result.x.1}}", data.clone()).unwrap(), "one");
        assert_eq!(
            render_one("{{_result.t}}", data.clone()).unwrap(),
            "&lt;b&gt;"
        );
        assert_eq!(
            render_one("[{{#bold}}x{{/bold}}]", data.clone()).unwrap(),
            "[]"
        );
        assert_eq!(
            render_one(
                "{{#each _result.messner-mountains}}{{@index}}={{this}};{{/each}}",
                data.clone()
            )
            .unwrap(),
            "0=a;1=b;"
        );
        assert_eq!(
            render_one("{{#with _result.x}}{{lookup this \"1\"}}{{/with}}", data).unwrap(),
            "one"
        );
    }
}
