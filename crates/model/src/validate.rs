//! What a name, label or field of a definition may be, in one place, so
//! that every way in (the admin API, MQTT, the configuration file) refuses
//! the same things the same way, and every refusal names its field.
//!
//! The services that own a definition (the catalog, the rule engine,
//! bridges, channels, pages, keys) call these before they store anything;
//! the HTTP handlers only turn a refusal into a 400. docs/api.md ("Names")
//! states the rules.
//!
//! The predicates (`is_…`) are the rules themselves; the checks return an
//! [`Invalid`] naming the field and what it must be.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A field that broke its rule: 400 with this text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field, as the client wrote it (`name`, `static.location.lat`,
    /// `scope.channels[1]`).
    pub field: String,
    /// What is wrong, starting with the value when there is one.
    pub problem: String,
}

impl Invalid {
    /// `field` `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Invalid {
        Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The same problem, of a field inside `outer` (`processor.mappings[0]`
    /// + `from`).
    pub fn within(mut self, outer: &str) -> Invalid {
        self.field = if self.field.is_empty() {
            outer.to_string()
        } else if self.field.starts_with('[') {
            format!("{outer}{}", self.field)
        } else {
            format!("{outer}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

impl std::error::Error for Invalid {}

/// A value as an error message quotes it: escaped, at most 64 characters.
pub fn shown(value: &str) -> String {
    let mut out: String = value
        .chars()
        .take(64)
        .flat_map(char::escape_default)
        .collect();
    if value.chars().count() > 64 {
        out.push('…');
    }
    format!("'{out}'")
}

/// Longest human name or label (a device's `name`, a record label, a
/// rule's `name`, an alarm's `type`), in characters.
pub const MAX_NAME: usize = 256;

/// Longest free text (an alarm's description template), in characters.
pub const MAX_TEXT: usize = 4096;

/// Longest URL, in bytes.
pub const MAX_URL: usize = 2048;

// --- the rules -------------------------------------------------------------

/// Whether `s` is a valid sensae channel or device-type name in an ingest
/// path: `[a-zA-Z0-9]{2,15}`.
pub fn is_sensae_name(s: &str) -> bool {
    (2..=15).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `s` may name a device type: 1–64 of `[A-Za-z0-9_.-]`, starting
/// with a letter or digit. Wide enough for The Things Stack's model ids
/// (`em300-th`), which name a type in its uplinks; sensae's path takes
/// only the types that are also [`is_sensae_name`].
pub fn is_device_type_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=64).contains(&b.len())
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Whether `s` may name a device, device type or other weft object in an
/// `/api/v1` path, or an uplink's channel: 1–256 bytes of printable ASCII
/// without `/`, `?`, `#`, `%`, `\`, whitespace or quotes, so it is safe in
/// URLs, SQL parameters and NGSI ids.
pub fn is_object_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes().all(|b| {
            b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'"' | b'\'' | b'\\' | b'%')
        })
}

/// Whether `id` is a valid durable-channel, subscriber, message or bridge
/// id: `^[0-9a-z][0-9a-z_-]{0,62}$`, as DSPS checks them.
pub fn is_dsps_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_digit() || bytes[0].is_ascii_lowercase())
        && bytes[1..]
            .iter()
            .all(|&b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'_' || b == b'-')
}

/// Whether `name` may name a page: 1–256 bytes of `/`-separated segments,
/// each an [`is_object_id`] other than `.` and `..` (`site/home.html`).
pub fn is_page_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .split('/')
            .all(|seg| is_object_id(seg) && seg != "." && seg != "..")
}

/// Whether `s` is an HTTP header name (RFC 9110's token, at most 256 bytes).
pub fn is_header_name(s: &str) -> bool {
    (1..=256).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

// --- the checks --------------------------------------------------------------

/// `Ok` when `holds`; else the refusal of `s` in `field`: the value as
/// shown, then `what` it fails to be.
fn require(field: &str, s: &str, holds: bool, what: &str) -> Result<(), Invalid> {
    if holds {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("{} {what}", shown(s))))
    }
}

/// An HTTP header's name ([`is_header_name`]).
pub fn header_name(field: &str, s: &str) -> Result<(), Invalid> {
    require(field, s, is_header_name(s), "is not an HTTP header name")
}

/// A device type's name ([`is_device_type_name`]).
pub fn device_type_name(field: &str, s: &str) -> Result<(), Invalid> {
    require(
        field,
        s,
        is_device_type_name(s),
        "is not a device type name: 1 to 64 of A-Z a-z 0-9 _ . -, starting with a letter or digit",
    )
}

/// An uplink channel ([`is_object_id`]), as devices, rules and ingest keys
/// name it.
pub fn channel(field: &str, s: &str) -> Result<(), Invalid> {
    require(field, s, is_object_id(s), "is not a channel name: 1 to 256 printable ASCII characters without spaces, quotes, / ? # % or \\")
}

/// A weft object's id ([`is_object_id`]).
pub fn object_id(field: &str, s: &str) -> Result<(), Invalid> {
    require(
        field,
        s,
        is_object_id(s),
        "is not an id: 1 to 256 printable ASCII characters without spaces, quotes, / ? # % or \\",
    )
}

/// A durable channel's, subscriber's, message's or bridge's id
/// ([`is_dsps_id`]).
pub fn dsps_id(field: &str, s: &str) -> Result<(), Invalid> {
    require(
        field,
        s,
        is_dsps_id(s),
        "must match ^[0-9a-z][0-9a-z_-]{0,62}$",
    )
}

/// A page's name ([`is_page_name`]).
pub fn page_name(field: &str, s: &str) -> Result<(), Invalid> {
    require(field, s, is_page_name(s), "is not a page name: 1 to 256 characters of /-separated segments, none empty, . or .., without spaces, quotes, ? # % or \\")
}

/// A human name or label: not empty (or only spaces), at most [`MAX_NAME`]
/// characters, no control characters.
pub fn label(field: &str, s: &str) -> Result<(), Invalid> {
    if s.trim().is_empty() {
        return Err(Invalid::new(field, "must not be empty"));
    }
    name(field, s)
}

/// Like [`label`], but may be empty (an optional name).
pub fn name(field: &str, s: &str) -> Result<(), Invalid> {
    text_within(field, s, MAX_NAME, false)
}

/// Free text of at most [`MAX_TEXT`] characters: line breaks and tabs are
/// fine, other control characters are not.
pub fn text(field: &str, s: &str) -> Result<(), Invalid> {
    text_within(field, s, MAX_TEXT, true)
}

fn text_within(field: &str, s: &str, max: usize, lines: bool) -> Result<(), Invalid> {
    if s.chars().count() > max {
        return Err(Invalid::new(
            field,
            format!("is longer than {max} characters"),
        ));
    }
    let allowed = |c: char| lines && matches!(c, '\n' | '\r' | '\t');
    if s.chars().any(|c| c.is_control() && !allowed(c)) {
        return Err(Invalid::new(
            field,
            format!("{} holds a control character", shown(s)),
        ));
    }
    Ok(())
}

/// A latitude: a number from -90 to 90.
pub fn latitude(field: &str, v: &Value) -> Result<(), Invalid> {
    coordinate(field, v, 90.0, "latitude")
}

/// A longitude: a number from -180 to 180.
pub fn longitude(field: &str, v: &Value) -> Result<(), Invalid> {
    coordinate(field, v, 180.0, "longitude")
}

fn coordinate(field: &str, v: &Value, max: f64, what: &str) -> Result<(), Invalid> {
    match v.as_f64() {
        Some(x) if (-max..=max).contains(&x) => Ok(()),
        Some(x) => Err(Invalid::new(
            field,
            format!("{x} is not a {what}: it must be from -{max} to {max}"),
        )),
        None => Err(Invalid::new(
            field,
            format!("{v} is not a {what}: it must be a number from -{max} to {max}"),
        )),
    }
}

/// An absolute `http://` or `https://` URL with a host.
pub fn http_url(field: &str, s: &str) -> Result<(), Invalid> {
    let bad = |why: String| {
        Err(Invalid::new(
            field,
            format!("{} is not an http(s) URL: {why}", shown(s)),
        ))
    };
    if s.len() > MAX_URL {
        return bad(format!("longer than {MAX_URL} bytes"));
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("it holds spaces or control characters".into());
    }
    match url::Url::parse(s) {
        Err(e) => bad(e.to_string()),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            bad(format!("the scheme is '{}'", u.scheme()))
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => bad("it names no host".into()),
        Ok(_) => Ok(()),
    }
}

/// An `http(s)` URL template whose `{param.x}` / `{header.x}` placeholders
/// are filled per call: a URL once each placeholder stands for a value.
pub fn http_url_template(field: &str, s: &str) -> Result<(), Invalid> {
    let mut filled = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find('{') {
        filled.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) => {
                filled.push_str("value");
                rest = &after[end + 1..];
            }
            None => {
                filled.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    filled.push_str(rest);
    http_url(field, &filled).map_err(|_| {
        Invalid::new(
            field,
            format!(
                "{} is not an http(s) URL (placeholders such as {{param.id}} allowed)",
                shown(s)
            ),
        )
    })
}

/// A definition's JSON body as `T`: a value of the wrong type, a missing
/// or unknown field is named (`decoder: invalid type: integer `5`, …`).
pub fn parse_definition<T: DeserializeOwned>(body: &[u8]) -> Result<T, Invalid> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize(&mut de).map_err(named)?;
    de.end()
        .map_err(|e| Invalid::new("body", format!("is not a valid definition: {e}")))?;
    Ok(parsed)
}

/// A JSON value as `T`, errors named as [`parse_definition`] names them.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, Invalid> {
    serde_path_to_error::deserialize(value).map_err(named)
}

fn named(e: serde_path_to_error::Error<serde_json::Error>) -> Invalid {
    let path = e.path().to_string();
    let problem = e.inner().to_string();
    if !e.inner().is_data() {
        Invalid::new("body", format!("is not JSON: {problem}"))
    } else if matches!(path.as_str(), "." | "?" | "") {
        Invalid::new("body", format!("is not a valid definition: {problem}"))
    } else {
        Invalid::new(path, format!(": {problem}")).tidy()
    }
}

impl Invalid {
    /// `field : x` reads `field: x`.
    fn tidy(mut self) -> Invalid {
        if let Some(rest) = self.problem.strip_prefix(": ") {
            self.field.push(':');
            self.problem = rest.to_string();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sensae_names_follow_the_spec_pattern() {
        assert!(is_sensae_name("em300th"));
        assert!(is_sensae_name("ab"));
        assert!(is_sensae_name("abcdefghijklmno"));
        assert!(!is_sensae_name("a"));
        assert!(!is_sensae_name("abcdefghijklmnop"));
        assert!(!is_sensae_name("em-300"));
        assert!(!is_sensae_name("ém300"));
    }

    #[test]
    fn object_ids_reject_url_and_quote_characters() {
        assert!(is_object_id("0e1c6ab8-1234"));
        assert!(is_object_id("urn:ngsi:Device:1"));
        assert!(!is_object_id(""));
        assert!(!is_object_id("a/b"));
        assert!(!is_object_id("a b"));
        assert!(!is_object_id("a\"b"));
    }

    #[test]
    fn device_type_names() {
        for ok in ["em300th", "em300-th", "x", "lht65n_v1.2", &"a".repeat(64)] {
            assert!(is_device_type_name(ok), "{ok}");
        }
        for bad in [
            "",
            "[]",
            "-a",
            ".a",
            "a b",
            "a/b",
            "ém",
            "a(b)",
            &"a".repeat(65),
        ] {
            assert!(!is_device_type_name(bad), "{bad}");
        }
        let e = device_type_name("name", "[]").unwrap_err();
        assert!(e.to_string().starts_with("name '[]' is not"), "{e}");
    }

    /// DSPS's id rule: lower-case alphanumerics, `_` and `-`, not leading,
    /// at most 63 characters.
    #[test]
    fn dsps_ids() {
        for ok in ["a", "0", "abc-12_x", "sbsc-5", &"a".repeat(63)] {
            assert!(is_dsps_id(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "A", "a b", "a.b", "ä", &"a".repeat(64)] {
            assert!(!is_dsps_id(bad), "{bad}");
        }
    }

    #[test]
    fn header_names() {
        assert!(is_header_name("Accept-Language"));
        assert!(!is_header_name("Accept Language"));
        assert!(!is_header_name(""));
        assert!(!is_header_name("a:b"));
    }

    #[test]
    fn page_names() {
        for ok in ["home", "site/home.html", "a/b/c"] {
            assert!(is_page_name(ok), "{ok}");
        }
        for bad in [
            "", "/a", "a/", "a//b", "a/../b", ".", "a b", "a?b", "a\u{1}",
        ] {
            assert!(!is_page_name(bad), "{bad}");
        }
    }

    #[test]
    fn labels_and_text() {
        assert!(label("name", "Soil 1").is_ok());
        assert!(label("name", "  ").is_err());
        assert!(name("name", "").is_ok());
        assert!(name("name", "a\u{7}b").is_err());
        assert!(name("name", &"é".repeat(MAX_NAME)).is_ok());
        assert!(name("name", &"é".repeat(MAX_NAME + 1)).is_err());
        assert!(text("description", "line 1\nline 2\ttab").is_ok());
        assert!(text("description", "bell\u{7}").is_err());
        let e = name("records key", "a\u{0}").unwrap_err().to_string();
        assert!(e.starts_with("records key 'a\\u{0}'"), "{e}");
    }

    #[test]
    fn coordinates() {
        assert!(latitude("lat", &json!(41.15)).is_ok());
        assert!(latitude("lat", &json!(-90)).is_ok());
        assert!(latitude("lat", &json!(999)).is_err());
        assert!(latitude("lat", &json!("41")).is_err());
        assert!(longitude("lon", &json!(180)).is_ok());
        assert!(longitude("lon", &json!(-180.5)).is_err());
        let e = latitude("static.location.lat", &json!(999)).unwrap_err();
        assert!(e.to_string().starts_with("static.location.lat 999"), "{e}");
    }

    #[test]
    fn urls() {
        assert!(http_url("endpoint", "https://device.example/down").is_ok());
        assert!(http_url("endpoint", "http://127.0.0.1:8080/x?y=1").is_ok());
        for bad in [
            "not a url",
            "http://",
            "ftp://host/x",
            "http://a b/",
            "/relative",
        ] {
            assert!(http_url("endpoint", bad).is_err(), "{bad}");
        }
        assert!(
            http_url_template("http.url", "http://127.0.0.1:3000/services/{param.id}.json").is_ok()
        );
        assert!(http_url_template("http.url", "http://{param.host}/x").is_ok());
        let e = http_url_template("http.url", "not a url").unwrap_err();
        assert!(e.to_string().starts_with("http.url 'not a url'"), "{e}");
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
        #[serde(default)]
        list: Vec<u32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    #[test]
    fn definitions_parse_with_the_field_named() {
        let e = parse_definition::<Outer>(br#"{"inner":{"n":"3"}}"#).unwrap_err();
        assert_eq!(e.field, "inner.n:", "{e}");
        let e = parse_definition::<Outer>(br#"{"inner":{"n":1},"list":[1,"x"]}"#).unwrap_err();
        assert_eq!(e.field, "list[1]:", "{e}");
        let e = parse_definition::<Outer>(br#"{"inner":{"n":1},"nope":1}"#).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = parse_definition::<Outer>(b"{").unwrap_err();
        assert_eq!(e.field, "body", "{e}");
        let e = parse_definition::<Outer>(br#"{"inner":{"n":1}} x"#).unwrap_err();
        assert_eq!(e.field, "body", "{e}");
        assert!(parse_definition::<Outer>(br#"{"inner":{"n":1}}"#).is_ok());
    }
}
