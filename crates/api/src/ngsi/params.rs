//! The inputs of a request besides tenancy: URI parameters (decoded and
//! checked for Orion's forbidden characters), `options`, paging,
//! `orderBy`, and the JSON or text body with its media type.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi::parse::MAX_NESTING;
use weft_model::ngsi::{parse_body, AttrMap, AttrsBody, NgsiError};

use super::error::{Error, Result};

/// Characters Orion refuses in URI parameter values (outside the query
/// languages) and in path segments.
const FORBIDDEN: &[char] = &['<', '>', '"', '\'', '=', ';', '(', ')'];

/// Parameters whose values are expressions and may hold those characters.
const FREE_PARAMS: &[&str] = &[
    "q",
    "mq",
    "georel",
    "geometry",
    "coords",
    "idPattern",
    "typePattern",
];

/// Default page size of listings.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest page size Orion serves.
pub const MAX_LIMIT: usize = 1000;

/// The decoded URI parameters of a request, in order.
#[derive(Debug, Default, Clone)]
pub struct Params(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self> {
        Params::parse(parts.uri.query().unwrap_or(""))
    }
}

/// Percent-decodes a URI component (`+` stays `+`, as in Orion).
pub fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Params {
    /// Splits and decodes a query string, refusing forbidden characters
    /// and, as Orion does for every parameter, an empty value (`q=`).
    pub fn parse(query: &str) -> Result<Params> {
        let mut out = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k), decode(v));
            if v.is_empty() {
                return Err(Error::bad_request(format!(
                    "Empty right-hand-side for URI param /{k}/"
                )));
            }
            if !FREE_PARAMS.contains(&k.as_str()) && v.contains(FORBIDDEN) {
                return Err(Error::bad_request("invalid character in URI parameter"));
            }
            out.push((k, v));
        }
        Ok(Params(out))
    }

    /// Parameters already decoded, taken as they are (NGSI-LD's, which
    /// Orion's checks do not apply to).
    pub(crate) fn from_pairs(pairs: Vec<(String, String)>) -> Params {
        Params(pairs)
    }

    /// The parameters, in order.
    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A comma list (`attrs=A,B`), `None` when absent.
    pub fn list(&self, key: &str) -> Option<Vec<String>> {
        self.get(key).map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
    }

    /// The `options` words.
    pub fn options(&self) -> Result<Options> {
        let mut o = Options::default();
        for word in self.list("options").unwrap_or_default() {
            match word.as_str() {
                "keyValues" => o.key_values = true,
                "values" => o.values = true,
                "unique" => o.unique = true,
                "count" => o.count = true,
                "append" => o.append = true,
                "upsert" => o.upsert = true,
                "overrideMetadata" => o.override_metadata = true,
                "forcedUpdate" => o.forced_update = true,
                "noAttrDetail" => o.no_attr_detail = true,
                "dateCreated" => o.date_created = true,
                "dateModified" => o.date_modified = true,
                "skipForwarding" => o.skip_forwarding = true,
                "normalized" | "flowControl" | "skipInitialNotification" | "fullCounters" => {}
                _ => return Err(Error::bad_request("Invalid value for URI param /options/")),
            }
        }
        // Two of the representations at once is no representation (as
        // the real Orion 4.7.0 answers; `normalized` beside one is not
        // counted).
        if [o.key_values, o.values, o.unique]
            .iter()
            .filter(|on| **on)
            .count()
            > 1
        {
            return Err(Error::bad_request("Invalid value for URI param /options/"));
        }
        Ok(o)
    }

    /// `limit` and `offset` with Orion's checks.
    pub fn paging(&self) -> Result<(usize, usize)> {
        let limit = match self.get("limit") {
            None => DEFAULT_LIMIT,
            Some(s) => {
                let n: usize = s.parse().map_err(|_| {
                    Error::bad_request(format!(
                        "Bad pagination limit: /{s}/ [must be a decimal number]"
                    ))
                })?;
                if n > MAX_LIMIT {
                    return Err(Error::bad_request(format!(
                        "Bad pagination limit: /{s}/ [max: {MAX_LIMIT}]"
                    )));
                }
                n
            }
        };
        let offset = match self.get("offset") {
            None => 0,
            Some(s) => s.parse().map_err(|_| {
                Error::bad_request(format!(
                    "Bad pagination offset: /{s}/ [must be a decimal number]"
                ))
            })?,
        };
        Ok((limit, offset))
    }
}

/// The `options` URI parameter.
#[derive(Debug, Default, Clone, Copy)]
pub struct Options {
    /// `keyValues`.
    pub key_values: bool,
    /// `values`.
    pub values: bool,
    /// `unique`.
    pub unique: bool,
    /// `count`: add `Fiware-Total-Count`.
    pub count: bool,
    /// `append`: strict append on POST attrs.
    pub append: bool,
    /// `upsert`: POST /v2/entities updates an existing entity.
    pub upsert: bool,
    /// `overrideMetadata`.
    pub override_metadata: bool,
    /// `forcedUpdate`.
    pub forced_update: bool,
    /// `noAttrDetail` (types).
    pub no_attr_detail: bool,
    /// `dateCreated`: Orion's deprecated way to ask for the builtin
    /// attribute, as `attrs=dateCreated,*` does.
    pub date_created: bool,
    /// `dateModified`: likewise for the builtin `dateModified`.
    pub date_modified: bool,
    /// `skipForwarding`: a query answers from local entities only.
    pub skip_forwarding: bool,
}

impl Options {
    /// The representation asked for (`values` wins over `unique`, which
    /// wins over `keyValues`, as in Orion).
    pub fn format(&self) -> weft_model::ngsi::Format {
        use weft_model::ngsi::Format;
        if self.values {
            Format::Values
        } else if self.unique {
            Format::Unique
        } else if self.key_values {
            Format::KeyValues
        } else {
            Format::Normalized
        }
    }

    /// The `attrs` list to render once the deprecated `options=dateCreated`
    /// and `options=dateModified` are read as `attrs` entries: the builtins
    /// are added to the list, which means every user attribute (`*`) when
    /// there was none (Orion's "Filtering out attributes and metadata").
    pub fn attrs_with_dates(&self, attrs: Option<Vec<String>>) -> Option<Vec<String>> {
        if !self.date_created && !self.date_modified {
            return attrs;
        }
        let mut list = attrs
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| vec!["*".to_string()]);
        for (asked, name) in [
            (self.date_created, "dateCreated"),
            (self.date_modified, "dateModified"),
        ] {
            if asked && !list.iter().any(|a| a == name) {
                list.push(name.to_string());
            }
        }
        Some(list)
    }

    /// The update options these carry.
    pub fn update(&self) -> weft_model::ngsi::UpdateOptions {
        weft_model::ngsi::UpdateOptions {
            append_strict: self.append,
            override_metadata: self.override_metadata,
            forced: self.forced_update,
            unique_id: false,
        }
    }
}

/// One `orderBy` key: an attribute (or `id`, `type`, one of the builtins
/// `dateCreated`, `dateModified`, `dateExpires`, `servicePath`, or
/// `geo:distance`), descending with a leading `!`.
#[derive(Debug, Clone)]
pub struct OrderKey {
    /// What to sort by.
    pub name: String,
    /// `!name`.
    pub descending: bool,
}

/// Parses `orderBy`, refusing a key given twice.
pub fn order_by(params: &Params) -> Result<Vec<OrderKey>> {
    let Some(list) = params.list("orderBy") else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<OrderKey> = Vec::new();
    for item in list {
        let (name, descending) = match item.strip_prefix('!') {
            Some(n) => (n.to_string(), true),
            None => (item, false),
        };
        if keys.iter().any(|k| k.name == name) {
            return Err(Error::bad_request("duplicate orderBy token detected"));
        }
        keys.push(OrderKey { name, descending });
    }
    Ok(keys)
}

/// The media type of the body, without parameters (`charset=…`).
pub fn content_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(media_type)
}

/// A media type without its parameters, lowercased: `Application/JSON;
/// charset=utf-8` is `application/json` (a `Content-Type`, or one entry
/// of an `Accept`).
pub fn media_type(entry: &str) -> String {
    entry
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A JSON body: checks the media type, then parses with Orion's errors.
pub fn json_body(headers: &HeaderMap, body: &Bytes) -> Result<Value> {
    parse_json(headers, body, parse_body)
}

/// Checks a JSON body's media type and reads its text with `parse`; a
/// parse error caused by nesting deeper than Orion allows says so.
fn parse_json<T>(
    headers: &HeaderMap,
    body: &Bytes,
    parse: impl FnOnce(&str) -> std::result::Result<T, NgsiError>,
) -> Result<T> {
    if let Some(ct) = content_type(headers) {
        if ct != "application/json" {
            return Err(Error::unsupported_media_type(&ct));
        }
    }
    let text = std::str::from_utf8(body).map_err(|_| Error(NgsiError::parse_error()))?;
    parse(text).map_err(|e| {
        if e.error == "ParseError" && nesting(text) > MAX_NESTING {
            Error(NgsiError::new(
                400,
                "ParseError",
                format!("attribute or metadata value has overpassed maximum nesting limit: {MAX_NESTING}"),
            ))
        } else {
            Error(e)
        }
    })
}

/// The deepest bracket nesting of a JSON text (outside strings), to tell
/// Orion's nesting error from other syntax errors when parsing failed
/// (serde_json stops at its own recursion limit first).
fn nesting(text: &str) -> usize {
    let (mut depth, mut max, mut in_str, mut escaped) = (0usize, 0usize, false, false);
    for c in text.chars() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => {
                depth += 1;
                max = max.max(depth);
            }
            '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The attributes of a `/v2/entities/{id}/attrs` body (POST, PATCH,
/// PUT), read straight from the text: an empty object is refused before
/// the attributes are checked, as Orion does.
pub fn attrs_body(headers: &HeaderMap, body: &Bytes, key_values: bool) -> Result<AttrMap> {
    let parsed = parse_json(headers, body, |text| AttrsBody::parse(text, key_values))?;
    if parsed.is_empty_object() {
        return Err(Error::empty_payload());
    }
    Ok(parsed.into_attrs()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_characters_only_outside_expressions() {
        assert!(Params::parse("w1=a%3C").is_err());
        assert!(Params::parse("q=a==%3C").is_ok());
        let p = Params::parse("attrs=A,B&limit=3").unwrap();
        assert_eq!(p.list("attrs").unwrap(), ["A", "B"]);
        assert_eq!(p.paging().unwrap(), (3, 0));
    }

    #[test]
    fn empty_values_are_refused() {
        for query in ["q=", "georel=&geometry=point", "options"] {
            let key = query.split(['=', '&']).next().unwrap();
            assert_eq!(
                Params::parse(query).unwrap_err().0.description,
                format!("Empty right-hand-side for URI param /{key}/")
            );
        }
    }

    #[test]
    fn order_by_refuses_duplicates() {
        let p = Params::parse("orderBy=A,!A").unwrap();
        assert_eq!(
            order_by(&p).unwrap_err().0.description,
            "duplicate orderBy token detected"
        );
    }
}
