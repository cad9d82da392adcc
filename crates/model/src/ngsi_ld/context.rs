//! JSON-LD `@context`s as NGSI-LD uses them: a map from the short terms
//! a client writes (`temperature`, `Vehicle`) to the IRIs they stand for,
//! used to expand a request's names and to compact the names of an
//! answer.
//!
//! NGSI-LD needs only the term-definition part of JSON-LD: which IRI a
//! term, a compact IRI (`schema:name`) or a vocabulary-relative name
//! expands to, and which term an IRI compacts back to. That part is
//! implemented here, over `serde_json`, instead of running a full JSON-LD
//! processor on every request (a full expansion is an RDF round trip
//! per body; brokers that do it spend most of their time there).
//!
//! The NGSI-LD core context is built in ([`Context::core`]) and is never
//! fetched: every URL of the form
//! `https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context*.jsonld` names it.
//! It is applied after a client's own contexts, so its protected terms
//! keep their meaning whatever a client defines.
//!
//! **Stored names.** weft keeps one entity store for NGSIv2 and NGSI-LD.
//! An attribute or type name is stored as its IRI compacted with the core
//! context alone ([`Context::to_stored`]): a name in the default
//! vocabulary (`https://uri.etsi.org/ngsi-ld/default-context/temperature`)
//! is stored as `temperature`, exactly the name an NGSIv2 client gives,
//! and a name a client's context maps elsewhere is stored as its full IRI.
//! Reading compacts the stored name's expansion with the reader's context
//! ([`Context::from_stored`]), so each client sees its own terms.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use super::LdError;

/// The URL weft names the core context by in its answers.
pub const CORE_CONTEXT_URL: &str =
    "https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context-v1.8.jsonld";

/// The relation of a `Link` header naming a JSON-LD context.
pub const CONTEXT_REL: &str = "http://www.w3.org/ns/json-ld#context";

/// The media type of JSON-LD bodies.
pub const LD_JSON: &str = "application/ld+json";

/// The `Link` header value naming the context at `url`, as answers and
/// notifications send it.
pub fn link_header(url: &str) -> String {
    format!("<{url}>; rel=\"{CONTEXT_REL}\"; type=\"{LD_JSON}\"")
}

/// The core context's vocabulary: where a name no context defines
/// expands to.
pub const DEFAULT_VOCAB: &str = "https://uri.etsi.org/ngsi-ld/default-context/";

/// The core context's document (ETSI GS CIM 009, annex B).
pub const CORE_CONTEXT_JSON: &str = include_str!("core-context.jsonld");

/// The deepest a context may nest (contexts naming contexts, scoped
/// contexts): a bound, so that a hostile document cannot recurse forever.
const MAX_NESTING: usize = 16;

/// Whether `url` names the core context (any of its published versions):
/// it is never fetched.
pub fn is_core_url(url: &str) -> bool {
    url.starts_with("https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context")
        && url.ends_with(".jsonld")
}

/// The URLs of remote contexts `value` (an `@context` value: a URL, an
/// object or an array of them) names directly, without the core's.
/// Documents fetched for them may name more: resolve until
/// [`Context::build`] stops answering [`LdError`]s of kind
/// `LdContextNotAvailable` for a missing document, or collect with this
/// function on each fetched document's `@context`.
pub fn remote_urls(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_urls(value, &mut out, 0);
    out
}

fn collect_urls(value: &Value, out: &mut Vec<String>, depth: usize) {
    if depth > MAX_NESTING {
        return;
    }
    match value {
        Value::String(url) if !is_core_url(url) && !out.contains(url) => out.push(url.clone()),
        Value::Array(items) => items.iter().for_each(|v| collect_urls(v, out, depth + 1)),
        Value::Object(map) => {
            for def in map.values() {
                // A scoped context inside a term definition.
                if let Some(scoped) = def.get("@context") {
                    collect_urls(scoped, out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// An active context: the terms a request's names are read with.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Term → absolute IRI (or keyword).
    terms: HashMap<String, String>,
    /// Absolute IRI → the term it compacts to (the shortest, then the
    /// least, of those defining it).
    reverse: HashMap<String, String>,
    /// Terms usable as prefixes of compact IRIs: (term, IRI), the IRI
    /// ending in `/` or `#`; longest IRI first.
    prefixes: Vec<(String, String)>,
    /// `@vocab`.
    vocab: Option<String>,
    /// What the client gave as its context (without the core), as
    /// answers repeat it; `None` for the core context alone.
    given: Option<Value>,
}

impl Context {
    /// The core context alone: what a request without a context of its
    /// own is read with.
    pub fn core() -> Arc<Context> {
        static CORE: OnceLock<Arc<Context>> = OnceLock::new();
        CORE.get_or_init(|| {
            let doc: Value =
                serde_json::from_str(CORE_CONTEXT_JSON).expect("the core context is JSON");
            let mut ctx = Context::default();
            ctx.process(&doc["@context"], &|_: &str| None, 0)
                .expect("the core context is valid");
            ctx.index();
            Arc::new(ctx)
        })
        .clone()
    }

    /// The context a client gave (`value`: the `@context` of a body, or a
    /// `Link` header's URL as a string), with the core context applied
    /// after it. `document` gives the fetched document of each remote
    /// context [`remote_urls`] names; a URL it does not know is an
    /// `LdContextNotAvailable` error.
    pub fn build(
        value: &Value,
        document: &dyn Fn(&str) -> Option<Value>,
    ) -> Result<Context, LdError> {
        let mut ctx = Context::default();
        ctx.process(value, document, 0)?;
        let core = Context::core();
        for (term, iri) in &core.terms {
            ctx.terms.insert(term.clone(), iri.clone());
        }
        ctx.vocab = core.vocab.clone();
        ctx.given = Some(value.clone());
        ctx.index();
        Ok(ctx)
    }

    /// What answers name as their `@context`: the context the client gave,
    /// as it gave it (the core applies after it anyway), or the core's URL.
    pub fn answer_context(&self) -> Value {
        match &self.given {
            None => Value::String(CORE_CONTEXT_URL.to_string()),
            Some(given) => given.clone(),
        }
    }

    /// The URL an answer's `Link` header names: the client's context when
    /// it was given by one URL (alone, or in a list beside the core's),
    /// else the core's.
    pub fn link_url(&self) -> &str {
        match &self.given {
            Some(Value::String(url)) => url,
            Some(Value::Array(items)) => {
                let mut urls = items
                    .iter()
                    .filter(|i| i.as_str() != Some(CORE_CONTEXT_URL));
                match (urls.next().and_then(Value::as_str), urls.next()) {
                    (Some(url), None) => url,
                    _ => CORE_CONTEXT_URL,
                }
            }
            _ => CORE_CONTEXT_URL,
        }
    }

    /// Whether this is the core context alone.
    pub fn is_core(&self) -> bool {
        self.given.is_none()
    }

    /// The IRI `term` stands for (JSON-LD's vocabulary-relative IRI
    /// expansion): a defined term's IRI; a compact IRI's prefix replaced
    /// by its IRI; an absolute IRI as it is; anything else appended to
    /// `@vocab`.
    pub fn expand<'a>(&self, term: &'a str) -> Cow<'a, str> {
        if term.starts_with('@') {
            return Cow::Borrowed(term);
        }
        if let Some(iri) = self.terms.get(term) {
            return Cow::Owned(iri.clone());
        }
        if let Some((prefix, suffix)) = term.split_once(':') {
            if !suffix.starts_with("//") {
                if let Some(iri) = self.terms.get(prefix) {
                    return Cow::Owned(format!("{iri}{suffix}"));
                }
            }
            return Cow::Borrowed(term);
        }
        match &self.vocab {
            Some(vocab) => Cow::Owned(format!("{vocab}{term}")),
            None => Cow::Borrowed(term),
        }
    }

    /// The shortest name `iri` can be written with in this context (JSON-
    /// LD's IRI compaction, vocabulary-relative): a term defined as it,
    /// else the part after `@vocab`, else a compact IRI, else the IRI.
    pub fn compact<'a>(&self, iri: &'a str) -> Cow<'a, str> {
        if let Some(term) = self.reverse.get(iri) {
            return Cow::Owned(term.clone());
        }
        if let Some(vocab) = &self.vocab {
            if let Some(rest) = iri.strip_prefix(vocab.as_str()) {
                if !rest.is_empty() && !rest.contains(':') && !self.terms.contains_key(rest) {
                    return Cow::Owned(rest.to_string());
                }
            }
        }
        for (term, prefix) in &self.prefixes {
            if let Some(rest) = iri.strip_prefix(prefix.as_str()) {
                if !rest.is_empty() {
                    return Cow::Owned(format!("{term}:{rest}"));
                }
            }
        }
        Cow::Borrowed(iri)
    }

    /// The name a client's `term` is stored under: its IRI compacted with
    /// the core context alone (see the module's documentation).
    pub fn to_stored(&self, term: &str) -> String {
        let iri = self.expand(term);
        Context::core().compact(&iri).into_owned()
    }

    /// The full IRI a stored name stands for, whoever asks.
    pub fn iri_of_stored(name: &str) -> String {
        Context::core().expand(name).into_owned()
    }

    /// The name a stored name is shown under to a client of this context.
    pub fn from_stored(&self, name: &str) -> String {
        if self.is_core() {
            return name.to_string();
        }
        let iri = Context::iri_of_stored(name);
        self.compact(&iri).into_owned()
    }

    /// What the client gave as its context (without the core), if
    /// anything: a URL, an object or an array of them.
    pub fn given(&self) -> Option<&Value> {
        self.given.as_ref()
    }

    /// The client's term definitions, resolved: one context object
    /// mapping each term the client defined (and the core does not, or
    /// defines otherwise) to its absolute IRI. With [`Context::restore`]
    /// it rebuilds this context without fetching anything, which is what
    /// a subscription keeps so that it reads and notifies the same after
    /// a restart, whether or not the client's context can be fetched then.
    pub fn definitions(&self) -> Value {
        let core = Context::core();
        let mut out = Map::new();
        let mut terms: Vec<(&String, &String)> = self
            .terms
            .iter()
            .filter(|(term, iri)| core.terms.get(*term) != Some(*iri))
            .collect();
        terms.sort();
        for (term, iri) in terms {
            out.insert(term.clone(), Value::String(iri.clone()));
        }
        Value::Object(out)
    }

    /// The context [`Context::definitions`] describes, answering with
    /// `given` as the client's own.
    pub fn restore(given: Option<Value>, definitions: &Value) -> Result<Context, LdError> {
        let Some(given) = given else {
            return Ok(Context::core().as_ref().clone());
        };
        let mut ctx = Context::build(definitions, &|_: &str| None)?;
        ctx.given = Some(given);
        Ok(ctx)
    }

    /// Applies an `@context` value to this context, in order.
    fn process(
        &mut self,
        value: &Value,
        document: &dyn Fn(&str) -> Option<Value>,
        depth: usize,
    ) -> Result<(), LdError> {
        if depth > MAX_NESTING {
            return Err(LdError::bad_request("the @context nests too deeply"));
        }
        match value {
            Value::Null => {
                // JSON-LD: a null context clears what came before.
                self.terms.clear();
                self.vocab = None;
                Ok(())
            }
            Value::String(url) if is_core_url(url) => {
                let core = Context::core();
                self.terms
                    .extend(core.terms.iter().map(|(k, v)| (k.clone(), v.clone())));
                self.vocab = core.vocab.clone();
                Ok(())
            }
            Value::String(url) => {
                let doc = document(url).ok_or_else(|| LdError::context_not_available(url))?;
                let inner = doc.get("@context").ok_or_else(|| {
                    LdError::context_not_available(format!("{url}: the document has no @context"))
                })?;
                self.process(inner, document, depth + 1)
            }
            Value::Array(items) => {
                for item in items {
                    self.process(item, document, depth + 1)?;
                }
                Ok(())
            }
            Value::Object(map) => self.define_all(map, document, depth),
            _ => Err(LdError::bad_request(
                "an @context is a URL, an object or an array of them",
            )),
        }
    }

    /// Applies one context object: `@vocab` and every term definition,
    /// terms that name other terms of the same object resolved in any
    /// order.
    fn define_all(
        &mut self,
        map: &Map<String, Value>,
        document: &dyn Fn(&str) -> Option<Value>,
        depth: usize,
    ) -> Result<(), LdError> {
        if let Some(import) = map.get("@import").and_then(Value::as_str) {
            self.process(&Value::String(import.to_string()), document, depth + 1)?;
        }
        if let Some(vocab) = map.get("@vocab") {
            self.vocab = match vocab {
                Value::Null => None,
                Value::String(v) => Some(self.expand(v).into_owned()),
                _ => return Err(LdError::bad_request("@vocab is an IRI")),
            };
        }
        let mut defining = HashSet::new();
        let mut defined = HashSet::new();
        for term in map.keys() {
            self.define(map, term, &mut defining, &mut defined)?;
        }
        Ok(())
    }

    /// Defines `term` from `map`, first defining the terms of `map` its
    /// IRI uses.
    fn define(
        &mut self,
        map: &Map<String, Value>,
        term: &str,
        defining: &mut HashSet<String>,
        defined: &mut HashSet<String>,
    ) -> Result<(), LdError> {
        if term.starts_with('@') || defined.contains(term) {
            return Ok(());
        }
        if !defining.insert(term.to_string()) {
            return Err(LdError::bad_request(format!(
                "the @context defines {term} in a cycle"
            )));
        }
        let raw = match &map[term] {
            Value::Null => None,
            Value::String(iri) => Some(iri.as_str()),
            Value::Object(def) => match def.get("@id") {
                Some(Value::String(iri)) => Some(iri.as_str()),
                Some(Value::Null) => None,
                None => Some(term),
                Some(_) => {
                    return Err(LdError::bad_request(format!(
                        "the @id of {term} in the @context is not a string"
                    )))
                }
            },
            _ => {
                return Err(LdError::bad_request(format!(
                    "the definition of {term} in the @context is not a string or an object"
                )))
            }
        };
        let Some(raw) = raw else {
            self.terms.remove(term);
            defined.insert(term.to_string());
            return Ok(());
        };
        // The IRI may use a term of the same object as its prefix (or be
        // one): define that first.
        let head = raw.split_once(':').map_or(raw, |(p, _)| p);
        if head != term && map.contains_key(head) {
            self.define(map, head, defining, defined)?;
        }
        let iri = if raw == term && !raw.contains(':') {
            // A term defined without an IRI of its own.
            match &self.vocab {
                Some(vocab) => format!("{vocab}{term}"),
                None => term.to_string(),
            }
        } else {
            self.expand(raw).into_owned()
        };
        self.terms.insert(term.to_string(), iri);
        defined.insert(term.to_string());
        Ok(())
    }

    /// Builds the reverse map and the prefixes from the terms.
    fn index(&mut self) {
        self.reverse.clear();
        self.prefixes.clear();
        for (term, iri) in &self.terms {
            if iri.starts_with('@') {
                continue;
            }
            let better = match self.reverse.get(iri) {
                None => true,
                Some(old) => (term.len(), term.as_str()) < (old.len(), old.as_str()),
            };
            if better {
                self.reverse.insert(iri.clone(), term.clone());
            }
            if iri.ends_with('/') || iri.ends_with('#') {
                self.prefixes.push((term.clone(), iri.clone()));
            }
        }
        self.prefixes
            .sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_docs(_: &str) -> Option<Value> {
        None
    }

    #[test]
    fn the_core_context_expands_its_terms_and_the_default_vocabulary() {
        let core = Context::core();
        assert_eq!(
            core.expand("Property"),
            "https://uri.etsi.org/ngsi-ld/Property"
        );
        assert_eq!(
            core.expand("observedAt"),
            "https://uri.etsi.org/ngsi-ld/observedAt"
        );
        assert_eq!(
            core.expand("value"),
            "https://uri.etsi.org/ngsi-ld/hasValue"
        );
        assert_eq!(core.expand("id"), "@id");
        assert_eq!(core.expand("Point"), "https://purl.org/geojson/vocab#Point");
        assert_eq!(
            core.expand("temperature"),
            "https://uri.etsi.org/ngsi-ld/default-context/temperature"
        );
        assert_eq!(core.expand("urn:ngsi-ld:Car:1"), "urn:ngsi-ld:Car:1");
        assert_eq!(core.expand("http://example.org/a"), "http://example.org/a");
        assert_eq!(
            core.expand("ngsi-ld:foo"),
            "https://uri.etsi.org/ngsi-ld/foo"
        );
    }

    #[test]
    fn the_core_context_compacts_back() {
        let core = Context::core();
        for term in [
            "Property",
            "observedAt",
            "location",
            "temperature",
            "value",
            "unitCode",
        ] {
            assert_eq!(core.compact(&core.expand(term)), term, "{term}");
        }
        assert_eq!(
            core.compact("https://uri.etsi.org/ngsi-ld/foo"),
            "ngsi-ld:foo"
        );
        assert_eq!(core.compact("http://example.org/a"), "http://example.org/a");
    }

    #[test]
    fn a_client_context_maps_its_terms_and_keeps_the_core_protected() {
        let ctx = Context::build(
            &json!({
                "schema": "https://schema.org/",
                "name": "schema:name",
                "Vehicle": {"@id": "http://example.org/vehicle/Vehicle"},
                "location": "http://example.org/not-the-core-location",
                "speed": {"@id": "http://example.org/speed", "@type": "@id"}
            }),
            &no_docs,
        )
        .unwrap();
        assert_eq!(ctx.expand("name"), "https://schema.org/name");
        assert_eq!(ctx.expand("schema:brand"), "https://schema.org/brand");
        assert_eq!(ctx.expand("Vehicle"), "http://example.org/vehicle/Vehicle");
        assert_eq!(
            ctx.expand("location"),
            "https://uri.etsi.org/ngsi-ld/location"
        );
        assert_eq!(ctx.compact("http://example.org/speed"), "speed");
        assert_eq!(ctx.compact("https://schema.org/brand"), "schema:brand");
    }

    #[test]
    fn stored_names_are_the_core_compaction_and_read_back_per_client() {
        let mine = Context::build(&json!({"speed": "http://example.org/speed"}), &no_docs).unwrap();
        let core = Context::core();
        // A default-vocabulary name is stored as an NGSIv2 client names it.
        assert_eq!(mine.to_stored("temperature"), "temperature");
        assert_eq!(
            core.to_stored("https://uri.etsi.org/ngsi-ld/default-context/temperature"),
            "temperature"
        );
        // A name the client maps elsewhere is stored as its IRI...
        assert_eq!(mine.to_stored("speed"), "http://example.org/speed");
        // ...shown as the client's term to that client, as the IRI to others.
        assert_eq!(mine.from_stored("http://example.org/speed"), "speed");
        assert_eq!(
            core.from_stored("http://example.org/speed"),
            "http://example.org/speed"
        );
        assert_eq!(mine.from_stored("temperature"), "temperature");
        assert_eq!(mine.to_stored("location"), "location");
    }

    #[test]
    fn remote_contexts_come_from_the_documents_given() {
        let docs = |url: &str| {
            (url == "http://example.org/ctx.jsonld")
                .then(|| json!({"@context": {"speed": "http://example.org/speed"}}))
        };
        let value = json!(["http://example.org/ctx.jsonld", CORE_CONTEXT_URL]);
        assert_eq!(remote_urls(&value), vec!["http://example.org/ctx.jsonld"]);
        let ctx = Context::build(&value, &docs).unwrap();
        assert_eq!(ctx.expand("speed"), "http://example.org/speed");
        assert_eq!(ctx.answer_context(), value);
        let missing = Context::build(&json!("http://example.org/none.jsonld"), &docs).unwrap_err();
        assert_eq!(missing.kind, super::super::ErrorKind::LdContextNotAvailable);
    }

    #[test]
    fn bad_contexts_are_refused_not_followed() {
        assert!(Context::build(&json!(42), &no_docs).is_err());
        assert!(Context::build(&json!({"a": "b:x", "b": "a:y"}), &no_docs).is_err());
        let mut deep = json!({"x": "http://example.org/x"});
        for _ in 0..40 {
            deep = json!([deep]);
        }
        assert!(Context::build(&deep, &no_docs).is_err());
    }
}
