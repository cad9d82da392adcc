//! Limits on the JSON documents weft takes in and gives back, one check for
//! every surface that keeps a client's JSON as it was sent (channel
//! messages today): a document nested deeper than ordinary JSON parsers go,
//! or holding a number no IEEE double can carry (`1e400`), would be stored
//! and then handed to every reader, none of which could parse it.

use serde_json::Value;

/// The deepest nesting of arrays and objects accepted. Ordinary parsers
/// give up at 128 (serde_json) or 1,000–10,000 (others); 64 levels is far
/// beyond any real message and well inside all of them.
pub const MAX_DEPTH: usize = 64;

/// Why a document was refused; the text is for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonLimitError {
    /// Not JSON at all (syntax), with serde_json's message.
    #[error("invalid JSON: {0}")]
    Syntax(String),
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("JSON nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A number outside what a double can hold.
    #[error("JSON number out of range: {0}")]
    NumberOutOfRange(String),
}

/// Checks `bytes` is one JSON document within the limits and returns it
/// parsed. The depth is checked on the raw bytes first, so a hostile
/// document costs one linear scan and never a deep recursion.
pub fn parse_within_limits(bytes: &[u8]) -> Result<Value, JsonLimitError> {
    if nesting_depth(bytes) > MAX_DEPTH {
        return Err(JsonLimitError::TooDeep);
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let text = e.to_string();
        if text.starts_with("number out of range") {
            JsonLimitError::NumberOutOfRange(text)
        } else {
            JsonLimitError::Syntax(text)
        }
    })
}

/// The deepest nesting of `[` and `{` in `bytes`, skipping strings (and the
/// escapes inside them). Meaningful for valid JSON; for anything else it
/// only bounds the work a parser would do.
pub fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(nesting_depth(br#"1"#), 0);
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":2}]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a":"[[[{{\"[[["}"#), 1);
        assert_eq!(nesting_depth(br#"["\\",[]]"#), 2);
    }

    #[test]
    fn hostile_documents_are_refused_and_ordinary_ones_parse() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert_eq!(
            parse_within_limits(deep.as_bytes()),
            Err(JsonLimitError::TooDeep)
        );
        let at_limit = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse_within_limits(at_limit.as_bytes()).is_ok());
        assert!(matches!(
            parse_within_limits(br#"{"v":1e400}"#),
            Err(JsonLimitError::NumberOutOfRange(_))
        ));
        assert!(matches!(
            parse_within_limits(br#"{"v":"#),
            Err(JsonLimitError::Syntax(_))
        ));
        assert_eq!(
            parse_within_limits(br#"{"v":[1.5e300,-2,"x"]}"#).unwrap()["v"][2],
            "x"
        );
    }
}
