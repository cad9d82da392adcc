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
    h.register_escape_fn(escape_html);
    h
}

/// Handlebars' HTML escaping — the same characters to the same entities
/// as [`handlebars::html_escape`] — without its pushes char by char into
/// a growing string: the runs between characters to escape are copied
/// whole into a string sized once. Every value a page shows passes here.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut plain = 0;
    for (i, byte) in text.bytes().enumerate() {
        let entity = match byte {
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'&' => "&amp;",
            b'\'' => "&#x27;",
            b'`' => "&#x60;",
            b'=' => "&#x3D;",
            _ => continue,
        };
        // Every escaped character is ASCII, so `i` is a char boundary.
        out.push_str(&text[plain..i]);
        out.push_str(entity);
        plain = i + 1;
    }
    out.push_str(&text[plain..]);
    out
}

/// A saved template, split and compiled.
struct Compiled {
    template: Template,
    handlebars: Handlebars<'static>,
    /// Per snippet, the name its body is registered under: snippets with
    /// the same body share one compiled template.
    names: Vec<String>,
    /// Per snippet, its group: snippets binding the same services under
    /// the same names with the same `data-knotx-params` make the same
    /// calls in any request, so they share one render context.
    groups: Vec<usize>,
    /// Per group, one of its snippets (whose bindings stand for all).
    group_snippets: Vec<usize>,
    /// Per snippet rendered with Handlebars, where its rendering is kept
    /// for the view: snippets with the same body in the same group render
    /// to the same HTML, so once per view.
    slots: Vec<Option<usize>>,
    /// How many distinct renderings a view of the page makes at most.
    slot_count: usize,
}

impl Compiled {
    /// Works out once, when the template is saved, what every view needs:
    /// which snippets share a render context and which share a rendering.
    fn new(template: Template, handlebars: Handlebars<'static>, names: Vec<String>) -> Compiled {
        let mut groups = Vec::with_capacity(template.snippets.len());
        let mut group_snippets = Vec::new();
        let mut slots = Vec::with_capacity(template.snippets.len());
        let mut group_of: HashMap<String, usize> = HashMap::new();
        let mut slot_of: HashMap<(&str, usize), usize> = HashMap::new();
        for (i, s) in template.snippets.iter().enumerate() {
            let calls = s.knots.iter().any(|k| k == "services");
            let bindings: Vec<(&Option<String>, &str)> = s
                .services
                .iter()
                .filter(|_| calls)
                .map(|b| (&b.ns, b.service.as_str()))
                .collect();
            let key = format!(
                "{bindings:?}{}",
                s.params
                    .as_ref()
                    .map(|p| Value::Object(p.clone()).to_string())
                    .unwrap_or_default()
            );
            let next = group_snippets.len();
            let group = *group_of.entry(key).or_insert(next);
            if group == next {
                group_snippets.push(i);
            }
            groups.push(group);
            slots.push(s.knots.iter().any(|k| k == "handlebars").then(|| {
                let next = slot_of.len();
                *slot_of.entry((names[i].as_str(), group)).or_insert(next)
            }));
        }
        let slot_count = slot_of.len();
        Compiled {
            template,
            handlebars,
            names,
            groups,
            group_snippets,
            slots,
            slot_count,
        }
    }
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
    cache: parking_lot::Mutex<HashMap<String, (std::time::Instant, Bound)>>,
    /// Circuit breakers by service name: failures in a row, open until.
    breakers: parking_lot::Mutex<HashMap<String, (u32, Option<std::time::Instant>)>>,
    /// Calls under way, by what they send ([`flight_key`]): a page request
    /// that needs the same call waits for its outcome instead of calling
    /// again.
    in_flight: parking_lot::Mutex<HashMap<String, CallOutcome>>,
}

/// Where a call under way publishes its outcome (`None` until it ends).
type CallOutcome = tokio::sync::watch::Sender<Option<Result<Bound, String>>>;

/// A service's answer bound as Knot.x binds it
/// (`{"_result": <answer>, "_response": {"statusCode": "200"}}`), kept as
/// a render context from the moment it is parsed: a snippet binding it
/// alone at the root renders over it as it is, and the snippets and page
/// requests sharing the call share it, instead of copying it into a
/// context of their own per view.
type Bound = Arc<handlebars::Context>;

/// `answer` as a [`Bound`] result (moved, not copied).
fn bound(answer: Value) -> Bound {
    let mut bound = Map::with_capacity(2);
    bound.insert("_result".to_string(), answer);
    bound.insert("_response".to_string(), json!({"statusCode": "200"}));
    Arc::new(handlebars::Context::from(Value::Object(bound)))
}

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
    fn land(self, outcome: &Result<Bound, String>) {
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
    Ok(Compiled::new(template, handlebars, names))
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
    ) -> Result<Bound, String> {
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
    ) -> Result<Bound, String> {
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
                let v = bound(v);
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

        // Each distinct call once, all concurrently: the calls of each
        // group of snippets, as (namespace, call) per binding.
        let mut calls: HashMap<String, (Arc<PageService>, Map<String, Value>)> = HashMap::new();
        let mut group_calls: Vec<Vec<(Option<&str>, Option<String>)>> =
            Vec::with_capacity(page.group_snippets.len());
        {
            let services = self.services.read();
            for &i in &page.group_snippets {
                let s = &t.snippets[i];
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
                        bound.push((b.ns.as_deref(), key));
                    }
                }
                group_calls.push(bound);
            }
        }
        let keys: Vec<String> = calls.keys().cloned().collect();
        let outcomes = futures::future::join_all(keys.iter().map(|k| {
            let (svc, params) = &calls[k];
            self.guarded_call(k, svc, params, request)
        }))
        .await;
        let mut results: HashMap<&str, Option<Bound>> = keys
            .iter()
            .map(String::as_str)
            .zip(outcomes.into_iter().map(|r| match r {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::debug!(error = %e, "page service failed");
                    None
                }
            }))
            .collect();

        // The render context of each group whose snippets render; the
        // last context needing a result takes it instead of copying it.
        let renders: Vec<bool> = {
            let mut renders = vec![false; page.group_snippets.len()];
            for (i, slot) in page.slots.iter().enumerate() {
                if slot.is_some() {
                    renders[page.groups[i]] = true;
                }
            }
            renders
        };
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for (bound, _) in group_calls.iter().zip(&renders).filter(|(_, r)| **r) {
            for key in bound.iter().filter_map(|(_, k)| k.as_deref()) {
                *uses.entry(key).or_default() += 1;
            }
        }
        let contexts: Vec<Option<Bound>> = group_calls
            .iter()
            .zip(&renders)
            .map(|(bound, renders)| {
                renders
                    .then(|| context(bound, &mut results, &mut uses))
                    .flatten()
            })
            .collect();

        let mut out: Vec<u8> = Vec::with_capacity(t.source.len() * 2);
        // Each distinct rendering once per view, straight into the page:
        // where it stands in `out` (`None`: it failed).
        let mut rendered: Vec<Option<Option<std::ops::Range<usize>>>> = vec![None; page.slot_count];
        let mut budget = limits::RenderBudget::new();
        let over_budget = |problem| PageError::OverBudget {
            name: name.to_string(),
            problem,
        };
        for f in &t.fragments {
            match f {
                Fragment::Static(r) => {
                    let text = &t.source[r.clone()];
                    budget.take(text.len()).map_err(over_budget)?;
                    out.extend_from_slice(text.as_bytes());
                }
                Fragment::Snippet(i) => {
                    let s = &t.snippets[*i];
                    let Some(slot) = page.slots[*i] else {
                        out.extend_from_slice(b"<!-- SNIPPET UNWRAPED START -->");
                        out.extend_from_slice(s.body.as_bytes());
                        out.extend_from_slice(b"<!-- SNIPPET UNWRAPED STOP -->");
                        continue;
                    };
                    let html = match &rendered[slot] {
                        Some(done) => done.clone().map(|earlier| {
                            budget.take(earlier.len()).map(|()| {
                                let start = out.len();
                                out.extend_from_within(earlier);
                                start..out.len()
                            })
                        }),
                        None => {
                            let html = contexts[page.groups[*i]].as_ref().and_then(|ctx| {
                                let start = out.len();
                                let mut output = limits::BudgetedOutput::new(&mut out, &mut budget);
                                match page.handlebars.render_with_context_to_write(
                                    &page.names[*i],
                                    ctx,
                                    &mut output,
                                ) {
                                    Ok(()) => Some(start..out.len()),
                                    Err(e) => {
                                        tracing::debug!(error = %e, "snippet render failed");
                                        budget.give_back(out.len() - start);
                                        out.truncate(start);
                                        None
                                    }
                                }
                            });
                            if let Some(problem) = budget.exhausted.take() {
                                return Err(over_budget(problem));
                            }
                            rendered[slot] = Some(html.clone());
                            html.map(Ok)
                        }
                    };
                    if html.transpose().map_err(over_budget)?.is_none() {
                        out.extend_from_slice(
                            match s.fallback.as_deref() {
                                Some("BLANK") => "",
                                Some(id) => t
                                    .fallbacks
                                    .get(id)
                                    .map(String::as_str)
                                    .unwrap_or(&self.config.default_fallback),
                                None => &self.config.default_fallback,
                            }
                            .as_bytes(),
                        );
                    }
                }
            }
        }
        // Every piece written is a `str`: the static parts, the fallbacks
        // and what Handlebars renders (it writes only `str`s).
        Ok(String::from_utf8(out).expect("a page is assembled from UTF-8 pieces"))
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

/// The render context of a group of snippets binding `bound` (namespace,
/// call), or `None` if one of its services failed (or is not defined).
/// A result bound alone at the root is the context as it is; otherwise
/// the results are put together under their names, each taken out of
/// `results` by the last context that needs it (`uses` counts what is
/// left), so it is moved rather than copied unless the cache or another
/// page request shares it too.
fn context(
    bound: &[(Option<&str>, Option<String>)],
    results: &mut HashMap<&str, Option<Bound>>,
    uses: &mut HashMap<&str, usize>,
) -> Option<Bound> {
    if let [(None, Some(key))] = bound {
        return results.get(key.as_str())?.clone();
    }
    let mut root = Map::new();
    for (ns, key) in bound {
        let key = key.as_deref()?;
        let left = uses.get_mut(key)?;
        *left -= 1;
        let value = if *left == 0 {
            match Arc::try_unwrap(results.get_mut(key)?.take()?) {
                Ok(mut only) => std::mem::take(only.data_mut()),
                Err(shared) => shared.data().clone(),
            }
        } else {
            results.get(key)?.as_ref()?.data().clone()
        };
        match ns {
            None => {
                if let Value::Object(m) = value {
                    root.extend(m);
                }
            }
            Some(ns) => {
                root.insert(ns.to_string(), value);
            }
        }
    }
    Some(Arc::new(handlebars::Context::from(Value::Object(root))))
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

    fn snippet(attributes: &str, body: &str) -> String {
        format!("<script data-knotx-knots=\"services,handlebars\" {attributes} type=\"text/knotx-snippet\">{body}</script>")
    }

    /// Snippets binding the same services under the same names with the
    /// same params share a render context; those with the same body in
    /// the same group share a rendering; anything else tells them apart.
    #[test]
    fn snippets_are_grouped_once_when_compiled() {
        let page = [
            snippet(r#"data-knotx-service="a""#, "{{x}}"),
            snippet(r#"data-knotx-service="a""#, "{{x}}"),
            snippet(r#"data-knotx-service="a""#, "{{y}}"),
            snippet(r#"data-knotx-service="a" data-knotx-params='{"n":"1"}'"#, "{{x}}"),
            snippet(r#"data-knotx-service-a="a""#, "{{x}}"),
            snippet(r#"data-knotx-service="b""#, "{{x}}"),
            "<script data-knotx-knots=\"services\" data-knotx-service=\"a\" type=\"text/knotx-snippet\">{{x}}</script>".to_string(),
        ]
        .concat();
        let c = compile(page).unwrap();
        assert_eq!(c.groups, [0, 0, 0, 1, 2, 3, 0]);
        assert_eq!(c.group_snippets, [0, 3, 4, 5]);
        assert_eq!(
            c.slots,
            [Some(0), Some(0), Some(1), Some(2), Some(3), Some(4), None]
        );
        assert_eq!(c.slot_count, 5);
    }

    /// A result bound alone at the root is the context itself; results put
    /// together are moved out by the last context needing them (the same
    /// string buffer), and copied while another context still needs them
    /// or something else (the cache, another page request) holds them.
    #[test]
    fn contexts_share_or_take_results_instead_of_copying_them() {
        let text = |c: &Bound, ns: &str| c.data()[ns]["_result"]["s"].as_str().unwrap().as_ptr();
        let a = bound(json!({"s": "a"}));
        let b = bound(json!({"s": "b"}));
        let (a_text, b_text) = (
            a.data()["_result"]["s"].as_str().unwrap().as_ptr(),
            b.data()["_result"]["s"].as_str().unwrap().as_ptr(),
        );
        let elsewhere = b.clone();
        let (ka, kb) = ("a".to_string(), "b".to_string());
        let mut results: HashMap<&str, Option<Bound>> =
            HashMap::from([("a", Some(a.clone())), ("b", Some(b))]);
        let mut uses = HashMap::from([("a", 2), ("b", 1)]);

        let alone = context(&[(None, Some(ka.clone()))], &mut results, &mut uses).unwrap();
        assert!(Arc::ptr_eq(&alone, &a), "the result itself");
        drop((alone, a));

        let both = [(Some("x"), Some(ka.clone())), (Some("y"), Some(kb))];
        let first = context(&both, &mut results, &mut uses).unwrap();
        assert_eq!(
            first.data(),
            &json!({"x": {"_result": {"s": "a"}, "_response": {"statusCode": "200"}},
                    "y": {"_result": {"s": "b"}, "_response": {"statusCode": "200"}}})
        );
        assert_ne!(text(&first, "x"), a_text, "a is still needed: copied");
        assert!(results["b"].is_none(), "b was needed last here");
        assert_ne!(text(&first, "y"), b_text, "b is held elsewhere: copied");
        drop(elsewhere);

        let last = context(&[(Some("x"), Some(ka.clone()))], &mut results, &mut uses).unwrap();
        assert!(results["a"].is_none());
        assert_eq!(
            text(&last, "x"),
            a_text,
            "needed last and held nowhere else: moved"
        );

        // A failed or undefined call fails the context.
        let mut results: HashMap<&str, Option<Bound>> = HashMap::from([("a", None)]);
        assert!(context(&[(None, Some(ka))], &mut results, &mut uses).is_none());
        assert!(context(&[(None, None)], &mut results, &mut uses).is_none());
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
