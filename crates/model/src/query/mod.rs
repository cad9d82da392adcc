//! The NGSI Simple Query Language (`q`): `;`-separated statements, all of
//! which must hold. One parser and evaluator serves live-stream filters,
//! NGSI queries and rule conditions, so a condition means the same thing
//! everywhere.
//!
//! Supported today: `attr` (exists), `!attr` (does not exist), `==`, `!=`
//! with single values, `a,b` lists and `a..b` ranges, `>`, `>=`, `<`, `<=`.
//! Values are numbers, `true`/`false`, `null`, `'quoted'` or bare strings.

use std::cmp::Ordering;

use serde_json::Value;
use thiserror::Error;

/// A parsed query, ready to be evaluated many times.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    statements: Vec<Statement>,
}

#[derive(Debug, Clone, PartialEq)]
struct Statement {
    path: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    NotExists,
    Equal(Target),
    NotEqual(Target),
    /// `>` (strict) or `>=`.
    Greater(Literal, bool),
    /// `<` (strict) or `<=`.
    Less(Literal, bool),
}

#[derive(Debug, Clone, PartialEq)]
enum Target {
    Values(Vec<Literal>),
    Range(Literal, Literal),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Number(f64),
    Bool(bool),
    Null,
    Text(String),
}

/// Why a `q` string was rejected; the text is shown to the user.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid query '{statement}': {reason}")]
pub struct QueryError {
    /// The offending statement.
    pub statement: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Query {
    /// Parses `q`. An empty string is a query that matches everything.
    pub fn parse(q: &str) -> Result<Query, QueryError> {
        let mut statements = Vec::new();
        for raw in split_outside_quotes(q, ';') {
            let s = raw.trim();
            if s.is_empty() {
                continue;
            }
            statements.push(parse_statement(s)?);
        }
        Ok(Query { statements })
    }

    /// Whether every statement holds, with `lookup` giving an attribute's
    /// value by (dotted) name.
    pub fn matches<'a>(&self, lookup: impl Fn(&str) -> Option<&'a Value>) -> bool {
        self.statements.iter().all(|st| {
            let v = lookup(&st.path);
            match (&st.op, v) {
                (Op::Exists, v) => v.is_some(),
                (Op::NotExists, v) => v.is_none(),
                (_, None) => false,
                (Op::Equal(t), Some(v)) => target_matches(t, v),
                (Op::NotEqual(t), Some(v)) => !target_matches(t, v),
                (Op::Greater(l, strict), Some(v)) => match compare(v, l) {
                    Some(Ordering::Greater) => true,
                    Some(Ordering::Equal) => !strict,
                    _ => false,
                },
                (Op::Less(l, strict), Some(v)) => match compare(v, l) {
                    Some(Ordering::Less) => true,
                    Some(Ordering::Equal) => !strict,
                    _ => false,
                },
            }
        })
    }
}

fn target_matches(t: &Target, v: &Value) -> bool {
    match t {
        Target::Values(vals) => vals.iter().any(|l| compare(v, l) == Some(Ordering::Equal)),
        Target::Range(lo, hi) => {
            matches!(compare(v, lo), Some(Ordering::Greater | Ordering::Equal))
                && matches!(compare(v, hi), Some(Ordering::Less | Ordering::Equal))
        }
    }
}

/// Compares a JSON value with a literal; `None` when they are not comparable.
fn compare(v: &Value, l: &Literal) -> Option<Ordering> {
    match (v, l) {
        (Value::Number(n), Literal::Number(x)) => n.as_f64()?.partial_cmp(x),
        (Value::String(s), Literal::Text(t)) => Some(s.as_str().cmp(t)),
        (Value::String(s), Literal::Number(x)) => s.parse::<f64>().ok()?.partial_cmp(x),
        (Value::Bool(b), Literal::Bool(x)) => Some(b.cmp(x)),
        (Value::Null, Literal::Null) => Some(Ordering::Equal),
        _ => None,
    }
}

fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        if c == '\'' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_statement(s: &str) -> Result<Statement, QueryError> {
    let err = |reason| QueryError {
        statement: s.to_string(),
        reason,
    };
    const OPS: [&str; 6] = ["==", "!=", ">=", "<=", ">", "<"];
    let found = OPS
        .iter()
        .filter_map(|op| s.find(op).map(|i| (i, *op)))
        .min_by_key(|(i, op)| (*i, std::cmp::Reverse(op.len())));
    let Some((at, op)) = found else {
        let (negated, path) = match s.strip_prefix('!') {
            Some(p) => (true, p.trim()),
            None => (false, s),
        };
        if !valid_path(path) {
            return Err(err("bad attribute name"));
        }
        let op = if negated { Op::NotExists } else { Op::Exists };
        return Ok(Statement {
            path: path.to_string(),
            op,
        });
    };
    let path = s[..at].trim();
    let rhs = s[at + op.len()..].trim();
    if !valid_path(path) {
        return Err(err("bad attribute name"));
    }
    if rhs.is_empty() {
        return Err(err("missing value"));
    }
    let op = match op {
        "==" | "!=" => {
            let target = parse_target(rhs).ok_or_else(|| err("bad value"))?;
            if op == "==" {
                Op::Equal(target)
            } else {
                Op::NotEqual(target)
            }
        }
        ">" => Op::Greater(parse_literal(rhs).ok_or_else(|| err("bad value"))?, true),
        ">=" => Op::Greater(parse_literal(rhs).ok_or_else(|| err("bad value"))?, false),
        "<" => Op::Less(parse_literal(rhs).ok_or_else(|| err("bad value"))?, true),
        _ => Op::Less(parse_literal(rhs).ok_or_else(|| err("bad value"))?, false),
    };
    Ok(Statement {
        path: path.to_string(),
        op,
    })
}

fn parse_target(rhs: &str) -> Option<Target> {
    if let Some((a, b)) = rhs.split_once("..") {
        return Some(Target::Range(parse_literal(a)?, parse_literal(b)?));
    }
    let vals = split_outside_quotes(rhs, ',')
        .into_iter()
        .map(parse_literal)
        .collect::<Option<Vec<_>>>()?;
    Some(Target::Values(vals))
}

fn parse_literal(s: &str) -> Option<Literal> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Some(inner) = s.strip_prefix('\'') {
        return Some(Literal::Text(inner.strip_suffix('\'')?.to_string()));
    }
    Some(match s {
        "true" => Literal::Bool(true),
        "false" => Literal::Bool(false),
        "null" => Literal::Null,
        _ => match s.parse::<f64>() {
            Ok(n) => Literal::Number(n),
            Err(_) => Literal::Text(s.to_string()),
        },
    })
}

fn valid_path(p: &str) -> bool {
    !p.is_empty() && p.split('.').all(|seg| !seg.is_empty()) && !p.contains(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(q: &str, doc: &Value) -> bool {
        let query = Query::parse(q).unwrap();
        query.matches(|p| crate::mapping::get_path(doc, p))
    }

    #[test]
    fn comparisons_ranges_lists_and_existence() {
        let d = json!({"temperature": 45.2, "humidity": 50, "status": "ok", "on": true});
        assert!(eval("temperature>45.1", &d));
        assert!(!eval("temperature>45.2", &d));
        assert!(eval("temperature>=45.2", &d));
        assert!(eval("humidity<=50;temperature<46", &d));
        assert!(!eval("humidity<50", &d));
        assert!(eval("humidity==40..60", &d));
        assert!(eval("humidity==1,50,7", &d));
        assert!(eval("humidity!=1,2", &d));
        assert!(eval("status=='ok'", &d));
        assert!(eval("status==ok", &d));
        assert!(eval("on==true", &d));
        assert!(eval("temperature;!pressure", &d));
        assert!(!eval("pressure", &d));
        assert!(!eval("pressure!=3", &d));
        assert!(eval("", &d));
    }

    #[test]
    fn rejects_malformed_statements() {
        assert!(Query::parse("temperature>").is_err());
        assert!(Query::parse(">3").is_err());
        assert!(Query::parse("a..b==3").is_err());
        assert!(Query::parse("a b==3").is_err());
    }

    #[test]
    fn quoted_values_may_hold_separators() {
        let d = json!({"name": "a;b,c"});
        assert!(eval("name=='a;b,c'", &d));
    }
}
