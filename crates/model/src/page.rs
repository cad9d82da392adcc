//! Page templates in Knot.x 1.x markup, split once into what is passed
//! through byte for byte and the dynamic snippets:
//!
//! ```html
//! <script data-knotx-knots="services,handlebars"
//!         data-knotx-service="first-service"
//!         data-knotx-service-mountains="mountains"
//!         data-knotx-params='{"limit":"5"}'
//!         data-knotx-fallback="BLANK"
//!         type="text/knotx-snippet">{{_result.message}}</script>
//! ```
//!
//! and the fallback elements
//! `<knotx:fallback data-knotx-fallback-id="ID">…</knotx:fallback>`, which
//! are taken out of the page and used in place of a snippet that fails.
//! The split is a single pass over the template.

use std::collections::HashMap;
use std::ops::Range;

use serde_json::Value;

/// A service a snippet binds: at the root of its render context (`ns`
/// none) or under `ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// `data-knotx-service-<ns>`; `None` for `data-knotx-service`.
    pub ns: Option<String>,
    /// The service's name.
    pub service: String,
}

/// One dynamic snippet.
#[derive(Debug, Clone, PartialEq)]
pub struct Snippet {
    /// `data-knotx-knots`, in order (`services`, `handlebars`).
    pub knots: Vec<String>,
    /// The services it binds.
    pub services: Vec<Binding>,
    /// `data-knotx-params` (a JSON object), merged over services' params.
    pub params: Option<serde_json::Map<String, Value>>,
    /// `data-knotx-fallback`: `BLANK` or a fallback id.
    pub fallback: Option<String>,
    /// The Handlebars body between the tags.
    pub body: String,
    /// The whole `<script>…</script>` in the source.
    pub raw: Range<usize>,
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq)]
pub enum Fragment {
    /// Source bytes passed through as they are.
    Static(Range<usize>),
    /// A snippet, by index into [`Template::snippets`].
    Snippet(usize),
}

/// A template split into fragments.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The source, as stored.
    pub source: String,
    /// In page order.
    pub fragments: Vec<Fragment>,
    /// The snippets.
    pub snippets: Vec<Snippet>,
    /// Fallback bodies by id.
    pub fallbacks: HashMap<String, String>,
}

/// Why a template could not be split; shown with a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

const FALLBACK_OPEN: &str = "<knotx:fallback";
const FALLBACK_CLOSE: &str = "</knotx:fallback>";

impl Template {
    /// Splits `source`.
    pub fn parse(source: String) -> Result<Template, TemplateError> {
        let lower = source.to_ascii_lowercase();
        let mut fragments = Vec::new();
        let mut snippets = Vec::new();
        let mut fallbacks = HashMap::new();
        let mut pos = 0;
        let mut static_from = 0;
        while pos < source.len() {
            let next_script = lower[pos..].find("<script").map(|i| i + pos);
            let next_fallback = lower[pos..].find(FALLBACK_OPEN).map(|i| i + pos);
            let at = match (next_script, next_fallback) {
                (None, None) => break,
                (Some(s), None) => s,
                (None, Some(f)) => f,
                (Some(s), Some(f)) => s.min(f),
            };
            let tag_end = end_of_tag(&source, at)
                .ok_or_else(|| TemplateError(format!("unclosed tag at byte {at}")))?;
            let attrs = attributes(&source[at..tag_end]);
            if Some(at) == next_fallback {
                let close = lower[tag_end..]
                    .find(FALLBACK_CLOSE)
                    .map(|i| i + tag_end)
                    .ok_or_else(|| TemplateError("unclosed <knotx:fallback>".into()))?;
                let id = attrs
                    .get("data-knotx-fallback-id")
                    .cloned()
                    .ok_or_else(|| {
                        TemplateError("<knotx:fallback> without data-knotx-fallback-id".into())
                    })?;
                fallbacks.insert(id, source[tag_end + 1..close].to_string());
                if static_from < at {
                    fragments.push(Fragment::Static(static_from..at));
                }
                pos = close + FALLBACK_CLOSE.len();
                static_from = pos;
                continue;
            }
            let close = lower[tag_end..]
                .find("</script>")
                .map(|i| i + tag_end)
                .ok_or_else(|| TemplateError(format!("unclosed <script> at byte {at}")))?;
            let end = close + "</script>".len();
            let Some(knots) = attrs.get("data-knotx-knots") else {
                pos = end;
                continue;
            };
            let mut services = Vec::new();
            for (name, value) in &attrs {
                if name == "data-knotx-service" {
                    services.push(Binding {
                        ns: None,
                        service: value.clone(),
                    });
                } else if let Some(ns) = name.strip_prefix("data-knotx-service-") {
                    services.push(Binding {
                        ns: Some(ns.to_string()),
                        service: value.clone(),
                    });
                }
            }
            services.sort_by(|a, b| a.ns.cmp(&b.ns));
            let params = match attrs.get("data-knotx-params") {
                None => None,
                Some(p) => match serde_json::from_str::<Value>(p) {
                    Ok(Value::Object(m)) => Some(m),
                    _ => {
                        return Err(TemplateError(format!(
                            "data-knotx-params is not a JSON object: {p}"
                        )))
                    }
                },
            };
            if static_from < at {
                fragments.push(Fragment::Static(static_from..at));
            }
            fragments.push(Fragment::Snippet(snippets.len()));
            snippets.push(Snippet {
                knots: knots
                    .split(',')
                    .map(|k| k.trim().to_string())
                    .filter(|k| !k.is_empty())
                    .collect(),
                services,
                params,
                fallback: attrs.get("data-knotx-fallback").cloned(),
                body: source[tag_end + 1..close].to_string(),
                raw: at..end,
            });
            pos = end;
            static_from = end;
        }
        if static_from < source.len() {
            fragments.push(Fragment::Static(static_from..source.len()));
        }
        Ok(Template {
            source,
            fragments,
            snippets,
            fallbacks,
        })
    }
}

/// The index of the `>` closing the tag opened at `start`, outside quotes.
fn end_of_tag(s: &str, start: usize) -> Option<usize> {
    let mut quote: Option<u8> = None;
    for (i, b) in s.as_bytes()[start..].iter().enumerate() {
        match (quote, *b) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'"') | (None, b'\'') => quote = Some(*b),
            (None, b'>') => return Some(start + i),
            _ => {}
        }
    }
    None
}

/// The attributes of a start tag (`<name a="1" b='2' c>`), names lowercased.
fn attributes(tag: &str) -> Vec<(String, String)> {
    let bytes = tag.as_bytes();
    let mut out = Vec::new();
    let mut i = tag.find(|c: char| c.is_whitespace()).unwrap_or(tag.len());
    while i < bytes.len() {
        while i < bytes.len()
            && (bytes[i].is_ascii_whitespace() || bytes[i] == b'/' || bytes[i] == b'>')
        {
            i += 1;
        }
        let name_start = i;
        while i < bytes.len()
            && !bytes[i].is_ascii_whitespace()
            && bytes[i] != b'='
            && bytes[i] != b'>'
        {
            i += 1;
        }
        if name_start == i {
            break;
        }
        let name = tag[name_start..i].to_ascii_lowercase();
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            if i < bytes.len() && (bytes[i] == b'"' || bytes[i] == b'\'') {
                let q = bytes[i];
                let v_start = i + 1;
                let v_end = tag[v_start..]
                    .find(q as char)
                    .map_or(tag.len(), |j| j + v_start);
                value = tag[v_start..v_end].to_string();
                i = v_end + 1;
            } else {
                let v_start = i;
                while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'>' {
                    i += 1;
                }
                value = tag[v_start..i].to_string();
            }
        }
        out.push((name, value));
    }
    out
}

trait Get {
    fn get(&self, name: &str) -> Option<&String>;
}

impl Get for Vec<(String, String)> {
    fn get(&self, name: &str) -> Option<&String> {
        self.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Static markup is kept byte for byte around snippets; services with
    /// and without namespace, params and fallbacks are read; fallback
    /// elements leave the page.
    #[test]
    fn splits_knotx_markup() {
        let src = "<html><b>x</b>\n<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"first\" \
                   data-knotx-service-mountains=\"mnt\" data-knotx-params='{\"limit\":\"5\"}' \
                   data-knotx-fallback=\"fb1\" type=\"text/knotx-snippet\">{{_result.a}}</script>\
                   <knotx:fallback data-knotx-fallback-id=\"fb1\"><p>sorry</p></knotx:fallback>\
                   <script src=\"app.js\"></script></html>";
        let t = Template::parse(src.to_string()).unwrap();
        assert_eq!(t.snippets.len(), 1);
        let s = &t.snippets[0];
        assert_eq!(s.knots, ["services", "handlebars"]);
        assert_eq!(
            s.services,
            [
                Binding {
                    ns: None,
                    service: "first".into()
                },
                Binding {
                    ns: Some("mountains".into()),
                    service: "mnt".into()
                }
            ]
        );
        assert_eq!(s.params.as_ref().unwrap()["limit"], "5");
        assert_eq!(s.fallback.as_deref(), Some("fb1"));
        assert_eq!(s.body, "{{_result.a}}");
        assert_eq!(t.fallbacks["fb1"], "<p>sorry</p>");
        let statics: String = t
            .fragments
            .iter()
            .filter_map(|f| match f {
                Fragment::Static(r) => Some(&t.source[r.clone()]),
                Fragment::Snippet(_) => None,
            })
            .collect();
        assert_eq!(
            statics,
            "<html><b>x</b>\n<script src=\"app.js\"></script></html>"
        );
        assert!(Template::parse("<script data-knotx-knots=\"a\">".into()).is_err());
    }
}

/// Property tests of the splitter: whatever a client stores as a
/// template, splitting answers a template or an error and never panics;
/// what it answers covers the source in order with ranges on character
/// boundaries. `PROPTEST_CASES=100000 cargo test -p weft-model proptest`
/// runs longer.
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// Pieces of Knot.x markup, broken and whole, so generated templates
    /// reach every branch of the splitter.
    fn markup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("<script".to_string()),
            Just("<SCRIPT".to_string()),
            Just(" data-knotx-knots=\"services,handlebars\"".to_string()),
            Just(" data-knotx-knots='handlebars'".to_string()),
            Just(" data-knotx-service=\"s\"".to_string()),
            Just(" data-knotx-service-ns=s".to_string()),
            Just(" data-knotx-params='{\"a\":\"1\"}'".to_string()),
            Just(" data-knotx-params='[1]'".to_string()),
            Just(" data-knotx-fallback=\"fb\"".to_string()),
            Just(" type=\"text/knotx-snippet\"".to_string()),
            Just(">".to_string()),
            Just("</script>".to_string()),
            Just("<knotx:fallback".to_string()),
            Just(" data-knotx-fallback-id=\"fb\"".to_string()),
            Just("</knotx:fallback>".to_string()),
            Just("\"".to_string()),
            Just("'".to_string()),
            Just("=".to_string()),
            Just("{{a}}".to_string()),
            Just("<p>".to_string()),
            "\\PC{0,6}",
        ];
        prop::collection::vec(piece, 0..32).prop_map(|p| p.concat())
    }

    /// Splitting `source` never panics; a split covers the source.
    fn check(source: String) -> Result<(), TestCaseError> {
        let Ok(t) = Template::parse(source.clone()) else {
            return Ok(());
        };
        prop_assert_eq!(&t.source, &source);
        let mut at = 0;
        for f in &t.fragments {
            let range = match f {
                Fragment::Static(r) => r.clone(),
                Fragment::Snippet(i) => t.snippets[*i].raw.clone(),
            };
            prop_assert!(range.start >= at && range.end <= source.len());
            prop_assert!(source.is_char_boundary(range.start));
            prop_assert!(source.is_char_boundary(range.end));
            at = range.end;
        }
        for s in &t.snippets {
            prop_assert!(source[s.raw.clone()].contains(&s.body));
        }
        Ok(())
    }

    /// `cases` cases per property, unless `PROPTEST_CASES` asks for another
    /// number (a longer run: `PROPTEST_CASES=100000`).
    fn config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::default();
        if std::env::var_os("PROPTEST_CASES").is_none() {
            config.cases = cases;
        }
        config
    }

    proptest! {
        #![proptest_config(config(1024))]

        /// Any text splits or fails cleanly.
        #[test]
        fn arbitrary_text_never_panics(source in "\\PC{0,256}") {
            check(source)?;
        }

        /// Markup-shaped text splits or fails cleanly.
        #[test]
        fn markup_never_panics(source in markup()) {
            check(source)?;
        }
    }
}
