//! String literals with backslashes (`'\d+'`, the regular expressions of
//! `replaceRegex` and `matchRegex` in Orion's manual).
//!
//! The engine's lexer accepts a backslash only before the closing quote
//! (`'it\'s'`), so `'\d+'` would be a syntax error; JavaScript's JEXL, whose
//! documentation Orion's manual follows, keeps such a backslash as it is.
//! Each literal that has one is lifted out of the expression: it is
//! replaced by an identifier bound, in the context, to the literal's value.
//! Expressions without backslashes in strings are evaluated untouched.

use serde_json::Value;

/// Prefix of the identifiers that stand for lifted literals; no NGSI
/// attribute name can clash with it in practice (and a clash only shadows
/// that attribute inside this one expression).
const PREFIX: &str = "__weft_literal_";

/// The expression with its backslashed literals replaced, and the values
/// they stand for; `None` when there is nothing to lift.
pub(super) fn lift(expression: &str) -> Option<(String, Vec<(String, Value)>)> {
    if !expression.contains('\\') {
        return None;
    }
    let mut out = String::with_capacity(expression.len());
    let mut lifted: Vec<(String, Value)> = Vec::new();
    let mut chars = expression.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c != '\'' && c != '"' {
            out.push(c);
            continue;
        }
        // Scan to the closing quote, `\<quote>` being an escaped quote.
        let mut value = String::new();
        let mut raw_end = None;
        let mut has_backslash = false;
        while let Some((i, ch)) = chars.next() {
            if ch == '\\' {
                has_backslash = true;
                match chars.peek() {
                    Some(&(_, next)) if next == c => {
                        value.push(c);
                        chars.next();
                    }
                    _ => value.push('\\'),
                }
            } else if ch == c {
                raw_end = Some(i);
                break;
            } else {
                value.push(ch);
            }
        }
        let Some(end) = raw_end else {
            // Unterminated: leave it to the parser to reject.
            out.push_str(&expression[start..]);
            break;
        };
        if has_backslash {
            let name = format!("{PREFIX}{}", lifted.len());
            out.push_str(&name);
            lifted.push((name, Value::String(value)));
        } else {
            out.push_str(&expression[start..=end]);
        }
    }
    (!lifted.is_empty()).then_some((out, lifted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lifts_only_literals_with_backslashes() {
        assert_eq!(lift("A|replaceStr('a','b')"), None);
        let (expr, values) = lift(r"c|replaceRegex('\d+','X')").unwrap();
        assert_eq!(expr, "c|replaceRegex(__weft_literal_0,'X')");
        assert_eq!(
            values,
            vec![("__weft_literal_0".to_string(), json!(r"\d+"))]
        );
        let (expr, values) = lift(r#"a + "x\"y\w" + 'it\'s'"#).unwrap();
        assert_eq!(expr, "a + __weft_literal_0 + __weft_literal_1");
        assert_eq!(values[0].1, json!(r#"x"y\w"#));
        assert_eq!(values[1].1, json!("it's"));
    }
}
