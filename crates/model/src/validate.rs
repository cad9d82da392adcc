//! Name rules of the compatible surfaces, kept in one place so that every
//! surface rejects the same names the same way.

/// Whether `s` is a valid sensae channel or device-type name in an ingest
/// path: `[a-zA-Z0-9]{2,15}`.
pub fn is_sensae_name(s: &str) -> bool {
    (2..=15).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `s` may name a device, device type or other weft object in an
/// `/api/v1` path: 1–256 bytes of printable ASCII without `/`, `?`, `#`,
/// whitespace or quotes, so it is safe in URLs, SQL parameters and NGSI ids.
pub fn is_object_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes().all(|b| {
            b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'"' | b'\'' | b'\\' | b'%')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
