//! Parsing of `q`/`mq` strings into [`Query`] values, with Orion's
//! validation rules and texts (see [`QueryErrorKind`]).

use super::{
    parse_datetime, Item, Literal, Op, Path, Pattern, Query, QueryError, QueryErrorKind, QueryKind,
    Rhs,
};

/// Characters Orion forbids in unquoted string values and regexes.
const FORBIDDEN: &[char] = &['<', '>', '"', '\'', '=', ';', '(', ')'];

/// Splits `q` into items the way Orion does: `;` alone is an empty
/// query; `;;` anywhere, or a `;` left at the end once one trailing `;` is
/// dropped (2086_allow_trailing_semicolon), is an empty item; a leading
/// `;` is skipped; an item of blanks is an empty item "(only whitespace)".
/// Unlike Orion, a `;` inside quotes does not split.
pub(super) fn parse(q: &str, kind: QueryKind) -> Result<Query, QueryError> {
    let mut items = Vec::new();
    if q.trim().is_empty() {
        return Ok(Query { kind, items });
    }
    if q.trim() == ";" {
        return Err(QueryError::new(q, QueryErrorKind::EmptyQuery));
    }
    if find_outside_quotes(q, ";;").is_some() {
        return Err(QueryError::new(q, QueryErrorKind::EmptyItem));
    }
    let body = q.strip_suffix(';').unwrap_or(q).trim();
    if body.ends_with(';') {
        return Err(QueryError::new(q, QueryErrorKind::EmptyItem));
    }
    let body = body.strip_prefix(';').unwrap_or(body);
    for piece in split_outside_quotes(body, ';') {
        let item = piece.trim();
        if item.is_empty() {
            return Err(QueryError::new(q, QueryErrorKind::WhitespaceItem));
        }
        items.push(parse_item(item, kind).map_err(|k| QueryError::new(item, k))?);
    }
    Ok(Query { kind, items })
}

/// The operators, as found by [`find_op`].
#[derive(Clone, Copy, PartialEq)]
enum OpToken {
    Exists,
    NotExists,
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Match,
}

impl OpToken {
    fn orion_name(self) -> &'static str {
        match self {
            OpToken::Gt => "GreaterThan",
            OpToken::Ge => "GreaterThanOrEqual",
            OpToken::Lt => "LessThan",
            _ => "LessThanOrEqual",
        }
    }
}

/// Splits an item into left-hand side, operator and right-hand side: a
/// leading `!` is "does not exist"; otherwise the first operator outside
/// quotes (`==`, `~=`, `!=`, `>=`, `<=`, `<`, `>`, `:`) splits the item;
/// without one the item is "exists".
fn find_op(item: &str) -> (&str, OpToken, &str) {
    if let Some(rest) = item.strip_prefix('!') {
        return (rest, OpToken::NotExists, "");
    }
    let b = item.as_bytes();
    let mut quoted = false;
    for i in 0..b.len() {
        let c = b[i];
        if c == b'\'' {
            quoted = !quoted;
            continue;
        }
        if quoted {
            continue;
        }
        let next = b.get(i + 1).copied();
        let found = if next == Some(b'=') {
            match c {
                b'=' => Some((OpToken::Eq, 2)),
                b'~' => Some((OpToken::Match, 2)),
                b'!' => Some((OpToken::Ne, 2)),
                b'>' => Some((OpToken::Ge, 2)),
                b'<' => Some((OpToken::Le, 2)),
                _ => None,
            }
        } else {
            match c {
                b'<' => Some((OpToken::Lt, 1)),
                b'>' => Some((OpToken::Gt, 1)),
                b':' => Some((OpToken::Eq, 1)),
                _ => None,
            }
        };
        if let Some((op, len)) = found {
            return (&item[..i], op, &item[i + len..]);
        }
    }
    (item, OpToken::Exists, "")
}

fn parse_item(item: &str, kind: QueryKind) -> Result<Item, QueryErrorKind> {
    let (lhs, tok, rhs) = find_op(item);
    let (lhs, rhs) = (lhs.trim(), rhs.trim());
    let unary = matches!(tok, OpToken::Exists | OpToken::NotExists);
    if lhs.is_empty() && !unary {
        return Err(QueryErrorKind::EmptyLhs);
    }
    if lhs
        .chars()
        .any(|c| (c != '\'' && FORBIDDEN.contains(&c)) || c.is_whitespace())
    {
        return Err(QueryErrorKind::BadLhsChar(kind));
    }
    // Orion reports an empty unary item (`!`) as an empty right-hand side.
    if (unary && lhs.is_empty()) || (!unary && rhs.is_empty()) {
        return Err(QueryErrorKind::EmptyRhs);
    }
    let path = parse_path(lhs)?;
    // Orion asks for the metadata name of unary `mq` items only; a binary
    // item without one is valid and matches nothing.
    if kind == QueryKind::Mq && unary && path.segments.len() < 2 {
        return Err(QueryErrorKind::NoMetadata);
    }
    let op = match tok {
        OpToken::Exists => Op::Exists,
        OpToken::NotExists => Op::NotExists,
        OpToken::Match => {
            if rhs.contains(FORBIDDEN) {
                return Err(QueryErrorKind::ForbiddenChars);
            }
            let re =
                regex::Regex::new(rhs).map_err(|_| QueryErrorKind::BadRegex(rhs.to_string()))?;
            Op::Matches(Pattern(re))
        }
        OpToken::Eq | OpToken::Ne => {
            let target = parse_rhs(rhs)?;
            if tok == OpToken::Eq {
                Op::Equal(target)
            } else {
                Op::NotEqual(target)
            }
        }
        OpToken::Gt | OpToken::Ge | OpToken::Lt | OpToken::Le => {
            if find_outside_quotes(rhs, "..").is_some() {
                return Err(QueryErrorKind::RangeWithOrderOp);
            }
            if find_outside_quotes(rhs, ",").is_some() {
                return Err(QueryErrorKind::ListWithOrderOp);
            }
            let l = literal(rhs)?;
            let value_type = match l {
                Literal::Bool(_) => Some("Bool"),
                Literal::Null => Some("Null"),
                _ => None,
            };
            if let Some(value_type) = value_type {
                let op = tok.orion_name();
                return Err(QueryErrorKind::OrderOpType { value_type, op });
            }
            match tok {
                OpToken::Gt => Op::Greater(l),
                OpToken::Ge => Op::GreaterEq(l),
                OpToken::Lt => Op::Less(l),
                _ => Op::LessEq(l),
            }
        }
    };
    Ok(Item { path, op })
}

/// `'a.b'.c.d` → `["a.b", "c", "d"]`. A segment is either plain (no
/// quotes) or wholly quoted.
fn parse_path(lhs: &str) -> Result<Path, QueryErrorKind> {
    let mut segments = Vec::new();
    let mut rest = lhs;
    loop {
        let (seg, after) = if let Some(inner) = rest.strip_prefix('\'') {
            let end = inner.find('\'').ok_or(QueryErrorKind::ForbiddenChars)?;
            (&inner[..end], &inner[end + 1..])
        } else {
            let end = rest.find('.').unwrap_or(rest.len());
            if rest[..end].contains('\'') {
                return Err(QueryErrorKind::ForbiddenChars);
            }
            (&rest[..end], &rest[end..])
        };
        if seg.is_empty() {
            return Err(QueryErrorKind::EmptyName);
        }
        segments.push(seg.to_string());
        if after.is_empty() {
            break;
        }
        rest = after
            .strip_prefix('.')
            .ok_or(QueryErrorKind::ForbiddenChars)?;
        if rest.is_empty() {
            return Err(QueryErrorKind::EmptyName);
        }
    }
    let dotted = segments.join(".");
    Ok(Path { segments, dotted })
}

/// The right-hand side of `==`/`!=`: a range, a list or one value.
fn parse_rhs(rhs: &str) -> Result<Rhs, QueryErrorKind> {
    if let Some(at) = find_outside_quotes(rhs, "..") {
        let (from, to) = (rhs[..at].trim(), rhs[at + 2..].trim());
        if from.is_empty() || to.is_empty() {
            return Err(QueryErrorKind::EmptyRangeItem);
        }
        let from = literal(from)?;
        if !rangeable(&from) {
            return Err(QueryErrorKind::BadRangeFrom);
        }
        let to = literal(to)?;
        if !rangeable(&to) {
            return Err(QueryErrorKind::BadRangeTo);
        }
        if std::mem::discriminant(&from) != std::mem::discriminant(&to) {
            return Err(QueryErrorKind::RangeTypesMixed);
        }
        return Ok(Rhs::Range(from, to));
    }
    if find_outside_quotes(rhs, ",").is_some() {
        let mut list: Vec<Literal> = Vec::new();
        for raw in split_outside_quotes(rhs, ',') {
            let raw = raw.trim();
            if raw.is_empty() {
                return Err(QueryErrorKind::EmptyListItem);
            }
            let l = literal(raw)?;
            // Lists hold strings, numbers or dates, one kind per list, and
            // may hold `null` too (4120_string_and_null_mixed_filter).
            let same_kind = match &l {
                Literal::Null => true,
                Literal::Bool(_) => false,
                l => list.iter().all(|o| {
                    matches!(o, Literal::Null)
                        || std::mem::discriminant(o) == std::mem::discriminant(l)
                }),
            };
            if !same_kind {
                return Err(QueryErrorKind::ListTypesMixed);
            }
            list.push(l);
        }
        return Ok(Rhs::List(list));
    }
    Ok(Rhs::One(literal(rhs)?))
}

fn rangeable(l: &Literal) -> bool {
    matches!(l, Literal::Number(_) | Literal::Date(_) | Literal::Text(_))
}

/// One value: `'forced string'`, number, date-time, `true`, `false`,
/// `null`, or else a bare string.
fn literal(s: &str) -> Result<Literal, QueryErrorKind> {
    if let Some(inner) = s.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or(QueryErrorKind::NonTerminatedString)?;
        if inner.contains('\'') {
            return Err(QueryErrorKind::QuoteInString);
        }
        // Unlike Orion, a forced string may hold the other forbidden
        // characters (`'a;b'`): the quotes make them unambiguous.
        return Ok(Literal::Text(inner.to_string()));
    }
    if let Some(n) = number(s) {
        return Ok(Literal::Number(n));
    }
    if let Some(ms) = parse_datetime(s) {
        return Ok(Literal::Date(ms));
    }
    Ok(match s {
        "true" => Literal::Bool(true),
        "false" => Literal::Bool(false),
        "null" => Literal::Null,
        _ if s.contains(FORBIDDEN) => return Err(QueryErrorKind::ForbiddenChars),
        _ => Literal::Text(s.to_string()),
    })
}

/// A decimal number (`10`, `-1.5`, `3e2`); not `inf`, `NaN` or hex.
pub(super) fn number(s: &str) -> Option<f64> {
    let plausible = s.bytes().any(|c| c.is_ascii_digit())
        && s.bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.' | b'e' | b'E'));
    if !plausible {
        return None;
    }
    s.parse::<f64>().ok().filter(|n| n.is_finite())
}

fn find_outside_quotes(s: &str, needle: &str) -> Option<usize> {
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        if c == '\'' {
            quoted = !quoted;
        } else if !quoted && s[i..].starts_with(needle) {
            return Some(i);
        }
    }
    None
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
