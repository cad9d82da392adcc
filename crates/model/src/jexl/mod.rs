//! JEXL expressions as Orion evaluates them: the `${…}` macros of custom
//! notifications and `subject.condition.jexlExpression`.
//!
//! The engine is Mozilla's Rust JEXL (`jexl-eval`), whose grammar has
//! exactly the gaps Orion's manual lists for its JEXL build: no unary
//! minus (`A||-1` fails, `A||0-1` works), no `!`, attribute names with `-`
//! or `:` read as operators. What this module adds:
//!
//! - `literals`: string literals with backslashes (regular
//!   expressions), which the engine's lexer would refuse;
//! - `ternary`: `?:` with the lowest precedence, as in the manual's
//!   examples (the engine's grammar binds it tighter than comparisons);
//!
//! - [`transforms`]: Orion's transformations (`uppercase`, `split`,
//!   `thMapper`, `toIsoString`, …), registered once on a shared evaluator;
//! - [`template`]: finding `${…}` in a string and replacing it, by text or
//!   by JSON value;
//! - the fail-safe: any failure (syntax error, unknown transformation, an
//!   operation on an identifier the context lacks, a transformation given
//!   the wrong input) makes the result `null`, never an error for the
//!   client;
//! - number normalisation: the engine computes in doubles; a result that
//!   is integral is given back as an integer (`10`, not `10.0`), and one
//!   that is not is rounded to nine decimals (`2.1 + -3.8` is `-1.7`), as
//!   Orion writes doubles.
//!
//! The context is a JSON object built by the caller (the notifier knows
//! the entity, the tenant and the request); identifiers missing from it are
//! undefined, which is not the same as `null` (`A||0` works on an undefined
//! `A`, `A==null` does not).

mod literals;
pub mod template;
mod ternary;
pub mod transforms;

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

/// Evaluates `expression` against `context` (a JSON object); any failure
/// gives `null`, as Orion's fail-safe does.
pub fn evaluate(expression: &str, context: &Map<String, Value>) -> Value {
    try_evaluate(expression, context).unwrap_or(Value::Null)
}

/// Evaluates `expression`, keeping the reason of a failure (for tests and
/// for diagnostics; notifications use [`evaluate`]).
pub fn try_evaluate(expression: &str, context: &Map<String, Value>) -> Result<Value, String> {
    check_size(expression)?;
    let (text, lifted) = match literals::lift(expression) {
        None => (Cow::Borrowed(expression), Vec::new()),
        Some((rewritten, lifted)) => (Cow::Owned(rewritten), lifted),
    };
    let text = match ternary::parenthesize(&text) {
        Some(rewritten) => Cow::Owned(rewritten),
        None => text,
    };
    let evaluator = transforms::evaluator();
    let value = if lifted.is_empty() {
        evaluator.eval_in_context(&text, context)
    } else {
        let mut context = context.clone();
        context.extend(lifted);
        evaluator.eval_in_context(&text, &context)
    }
    .map_err(|e| e.to_string())?;
    Ok(normalize(value))
}

/// Longest expression evaluated, in characters. The engine parses and
/// evaluates recursively, one stack frame per operator and bracket, so a
/// hostile subscription could otherwise exhaust the notifier's stack; real
/// expressions are a few dozen characters.
pub const MAX_EXPRESSION_CHARS: usize = 1024;

/// Deepest nesting of brackets evaluated, for the same reason.
pub const MAX_NESTING: usize = 32;

/// Refuses expressions past [`MAX_EXPRESSION_CHARS`] or [`MAX_NESTING`].
fn check_size(expression: &str) -> Result<(), String> {
    if expression.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(format!(
            "expression longer than {MAX_EXPRESSION_CHARS} characters"
        ));
    }
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expression.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(format!("expression nested deeper than {MAX_NESTING}"));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Whether a condition expression holds: only a result of exactly `true`
/// does (`1`, `"true"` or a failed evaluation do not), as Orion's
/// `jexlExpression` filter.
pub fn holds(expression: &str, context: &Map<String, Value>) -> bool {
    evaluate(expression, context) == Value::Bool(true)
}

/// Gives doubles back as Orion writes them: integral values as integers,
/// others rounded to nine decimals; recursively inside arrays and objects.
pub fn normalize(value: Value) -> Value {
    match value {
        Value::Number(n) => Value::Number(normalize_number(n)),
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalize(v))).collect())
        }
        other => other,
    }
}

/// Largest magnitude below which a double is written as an integer; past
/// it (2^53) doubles stop being exact integers anyway.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

fn normalize_number(n: Number) -> Number {
    if n.is_i64() || n.is_u64() {
        return n;
    }
    let Some(f) = n.as_f64() else { return n };
    if !f.is_finite() {
        return n;
    }
    if f.fract() == 0.0 && f.abs() < MAX_EXACT_INTEGER {
        return Number::from(f as i64);
    }
    let rounded = (f * 1e9).round() / 1e9;
    if rounded.fract() == 0.0 && rounded.abs() < MAX_EXACT_INTEGER {
        return Number::from(rounded as i64);
    }
    Number::from_f64(rounded).unwrap_or(n)
}

/// A value spliced into text: strings bare, numbers as Orion writes them,
/// everything else (`null`, booleans, arrays, objects) as JSON.
pub fn as_text(value: &Value) -> String {
    crate::ngsi::number::value_as_text(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn eval(expr: &str, context: Value) -> Value {
        evaluate(expr, &ctx(context))
    }

    #[test]
    fn literals_and_identifiers() {
        assert_eq!(eval("1", json!({})), json!(1));
        assert_eq!(eval("1.5", json!({})), json!(1.5));
        assert_eq!(eval("'a'", json!({})), json!("a"));
        assert_eq!(eval("\"a\"", json!({})), json!("a"));
        assert_eq!(eval("true", json!({})), json!(true));
        assert_eq!(eval("null", json!({})), json!(null));
        assert_eq!(eval("A", json!({"A": {"x": 1}})), json!({"x": 1}));
        assert_eq!(eval("[1, 'b']", json!({})), json!([1, "b"]));
        assert_eq!(
            eval("{a: 1, 'b': A}", json!({"A": 2})),
            json!({"a": 1, "b": 2})
        );
    }

    #[test]
    fn member_and_index_access() {
        let c = json!({"o": {"a": [10, {"b": "x"}]}, "k": "a"});
        assert_eq!(eval("o.a[0]", c.clone()), json!(10));
        assert_eq!(eval("o.a[1].b", c.clone()), json!("x"));
        assert_eq!(eval("o[k][0]", c.clone()), json!(10));
        assert_eq!(eval("o['a'][1]['b']", c.clone()), json!("x"));
        assert_eq!(eval("o.missing", c.clone()), json!(null));
        assert_eq!(eval("o.a[5]", c), json!(null));
    }

    #[test]
    fn arithmetic() {
        let c = json!({"A": 10, "B": 4});
        assert_eq!(eval("A+B", c.clone()), json!(14));
        assert_eq!(eval("A-B", c.clone()), json!(6));
        assert_eq!(eval("A*B", c.clone()), json!(40));
        assert_eq!(eval("A/B", c.clone()), json!(2.5));
        assert_eq!(eval("A//B", c.clone()), json!(2));
        assert_eq!(eval("A%B", c.clone()), json!(2));
        assert_eq!(eval("B^2", c.clone()), json!(16));
        assert_eq!(eval("2+3*4", c.clone()), json!(14));
        assert_eq!(eval("(2+3)*4", c.clone()), json!(20));
        assert_eq!(eval("'a'+'b'", c), json!("ab"));
        // Doubles come back as Orion writes them.
        assert_eq!(eval("2.1+(0-3.8)", json!({})), json!(-1.7));
    }

    #[test]
    fn comparison_and_logic() {
        let c = json!({"A": 10, "S": "foo"});
        assert_eq!(eval("A==10", c.clone()), json!(true));
        assert_eq!(eval("A!=10", c.clone()), json!(false));
        assert_eq!(eval("A>9", c.clone()), json!(true));
        assert_eq!(eval("A>=10", c.clone()), json!(true));
        assert_eq!(eval("A<10", c.clone()), json!(false));
        assert_eq!(eval("A<=10", c.clone()), json!(true));
        assert_eq!(eval("S=='foo' && A==10", c.clone()), json!(true));
        assert_eq!(eval("S=='bar' || A==10", c.clone()), json!(true));
        assert_eq!(eval("'oo' in S", c.clone()), json!(true));
        assert_eq!(eval("2 in [1,2]", c.clone()), json!(true));
        assert_eq!(eval("'x' in {x: 1}", c), json!(true));
    }

    #[test]
    fn ternary_and_filters() {
        let c = json!({"v": 14, "max": 50, "l": [{"a": 1, "n": "x"}, {"a": 5, "n": "y"}]});
        assert_eq!(eval("(v>max)?'nok':'ok'", c.clone()), json!("ok"));
        // `?:` has the lowest precedence, as in Orion's manual.
        assert_eq!(eval("v>max?'nok':'ok'", c.clone()), json!("ok"));
        assert_eq!(eval("v<max ? 1 : 2 + 3", c.clone()), json!(1));
        assert_eq!(eval("v>max ? 1 : 2 + 3", c.clone()), json!(5));
        assert_eq!(eval("v>max ? 1 : v>10 ? 2 : 3", c.clone()), json!(2));
        assert_eq!(
            eval("{a: v>10 ? 'big' : 'small'}", c.clone()),
            json!({"a": "big"})
        );
        assert_eq!(eval("l[.a > 2]", c.clone()), json!([{"a": 5, "n": "y"}]));
        assert_eq!(eval("l[.a > 2][0].n", c.clone()), json!("y"));
        assert_eq!(eval("l[.n == 'x'][0].a", c), json!(1));
    }

    #[test]
    fn orion_manual_example() {
        let c = json!({"speed": "10 m/s", "count": {"count": 5, "sum": 100},
                       "code": null, "value": 14, "max": 50});
        assert_eq!(eval("(speed|split(' '))[0]|parseInt", c.clone()), json!(10));
        assert_eq!(eval("count.sum/count.count", c.clone()), json!(20));
        assert_eq!(eval("code||'invalid'", c.clone()), json!("invalid"));
        assert_eq!(
            eval(
                "{count:count.count+1, sum:count.sum+((speed|split(' '))[0]|parseInt)}",
                c
            ),
            json!({"count": 6, "sum": 110})
        );
    }

    #[test]
    fn failures_are_null() {
        // Undefined identifier in an operation.
        assert_eq!(eval("(A==null)?0:A", json!({})), json!(null));
        assert_eq!(eval("A+1", json!({})), json!(null));
        // `||` is not an operation on its left side, and a condition that
        // fails is false (the manual's `!=` example).
        assert_eq!(eval("A||0", json!({})), json!(0));
        assert_eq!(eval("A != null ? 1 : 0", json!({})), json!(0));
        assert_eq!(eval("A != null ? 1 : 0", json!({"A": 5})), json!(1));
        // Unknown transformation, syntax errors, Orion's known gaps.
        assert_eq!(eval("A|undefinedTransform", json!({"A": 1})), json!(null));
        assert_eq!(eval("A[0|uppercase", json!({"A": ["a"]})), json!(null));
        assert_eq!(eval("A||-1", json!({})), json!(null));
        assert_eq!(eval("A||0-1", json!({})), json!(-1));
        assert_eq!(eval("!A", json!({"A": true})), json!(null));
        assert!(try_evaluate("A+", &Map::new()).is_err());
    }

    #[test]
    fn oversized_expressions_are_null_not_a_crash() {
        let long = vec!["A"; MAX_EXPRESSION_CHARS].join("+");
        assert!(try_evaluate(&long, &ctx(json!({"A": 1}))).is_err());
        let deep = format!(
            "{}1{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        assert!(try_evaluate(&deep, &Map::new()).is_err());
        let fine = format!("{}1{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        assert_eq!(eval(&fine, json!({})), json!(1));
        // Brackets inside strings do not count.
        assert_eq!(
            eval(&format!("'{}'|len", "(".repeat(100)), json!({})),
            json!(100)
        );
    }

    #[test]
    fn holds_only_on_true() {
        assert!(holds("A==1", &ctx(json!({"A": 1}))));
        assert!(!holds("A", &ctx(json!({"A": 1}))));
        assert!(!holds("A==1", &ctx(json!({}))));
        assert!(!holds("syntax error (", &ctx(json!({}))));
    }

    #[test]
    fn text_of_values() {
        assert_eq!(as_text(&json!("x")), "x");
        assert_eq!(as_text(&json!(10.0)), "10");
        assert_eq!(as_text(&json!(2.5)), "2.5");
        assert_eq!(as_text(&json!(null)), "null");
        assert_eq!(as_text(&json!([1, "a"])), "[1,\"a\"]");
    }
}
