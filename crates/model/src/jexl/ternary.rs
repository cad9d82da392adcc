//! The precedence of `cond ? a : b`, as Orion's manual and JavaScript's
//! JEXL have it: the lowest of all operators, so `A != null ? 1 : 0`
//! tests `A != null` (and gives `0` when `A` is undefined, the manual's
//! own example) and `x ? 1 : 2 + 3` gives `x ? 1 : (2 + 3)`.
//!
//! The engine's grammar binds `?:` tighter than comparisons and
//! arithmetic, and its syntax tree no longer shows the parentheses the
//! client wrote, so the fix is made on the text: every ternary at any
//! nesting level is rewritten with its three parts in parentheses,
//! `(cond)?(a):(b)`, which both grammars read the same way. An expression
//! without `?` is left untouched.

/// The expression with every ternary's parts parenthesised; `None` when
/// it has no `?` outside strings.
pub(super) fn parenthesize(expression: &str) -> Option<String> {
    if !has_question_mark(expression) {
        return None;
    }
    let chars: Vec<char> = expression.chars().collect();
    Some(segment(&chars))
}

fn has_question_mark(expression: &str) -> bool {
    let chars: Vec<char> = expression.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => i = skip_string(&chars, i),
            '?' => return true,
            _ => i += 1,
        }
    }
    false
}

/// The index just past the string literal starting at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// The index of the bracket closing the one opened at `start` (or the
/// end of the text when it is never closed).
fn closing(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => {
                i = skip_string(chars, i);
                continue;
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

/// Positions of the top-level occurrences of `targets` in `chars` (outside
/// strings and brackets).
fn top_level(chars: &[char], targets: &[char]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => {
                i = skip_string(chars, i);
                continue;
            }
            '(' | '[' | '{' => {
                i = closing(chars, i) + 1;
                continue;
            }
            c if targets.contains(&c) => out.push(i),
            _ => {}
        }
        i += 1;
    }
    out
}

/// Rewrites one expression (no top-level commas): its ternary, if any,
/// then every bracket group inside it.
fn segment(chars: &[char]) -> String {
    let marks = top_level(chars, &['?', ':']);
    let Some(&q) = marks.iter().find(|&&m| chars[m] == '?') else {
        return groups(chars);
    };
    // The `:` that pairs with this `?`: nested `?:` pairs in between.
    let mut depth = 0usize;
    let mut colon = None;
    for &m in marks.iter().filter(|&&m| m > q) {
        if chars[m] == '?' {
            depth += 1;
        } else if depth == 0 {
            colon = Some(m);
            break;
        } else {
            depth -= 1;
        }
    }
    let Some(c) = colon else {
        // No `:`: a syntax error the engine will report.
        return groups(chars);
    };
    format!(
        "({})?({}):({})",
        groups(&chars[..q]),
        segment(&chars[q + 1..c]),
        segment(&chars[c + 1..])
    )
}

/// Copies `chars`, rewriting the contents of every bracket group.
fn groups(chars: &[char]) -> String {
    let mut out = String::with_capacity(chars.len() + 8);
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => {
                let end = skip_string(chars, i).min(chars.len());
                out.extend(&chars[i..end]);
                i = end;
            }
            open @ ('(' | '[' | '{') => {
                let close = closing(chars, i);
                out.push(open);
                out.push_str(&group_contents(&chars[i + 1..close.min(chars.len())], open));
                if close < chars.len() {
                    out.push(chars[close]);
                }
                i = close + 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The inside of a bracket group: comma-separated expressions (for `{`,
/// `key: expression` entries).
fn group_contents(chars: &[char], open: char) -> String {
    let mut out = String::with_capacity(chars.len() + 8);
    let mut start = 0;
    let mut ends = top_level(chars, &[',']);
    ends.push(chars.len());
    for (n, end) in ends.into_iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        let item = &chars[start..end];
        if open == '{' {
            match top_level(item, &[':']).first() {
                Some(&k) => {
                    out.extend(&item[..=k]);
                    out.push_str(&segment(&item[k + 1..]));
                }
                None => out.push_str(&segment(item)),
            }
        } else {
            out.push_str(&segment(item));
        }
        start = end + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_expressions_without_ternaries_alone() {
        assert_eq!(parenthesize("a + b"), None);
        assert_eq!(parenthesize("a + '?'"), None);
    }

    #[test]
    fn parenthesizes_every_ternary() {
        assert_eq!(
            parenthesize("A != null ? 1 : 0").unwrap(),
            "(A != null )?( 1 ):( 0)"
        );
        assert_eq!(
            parenthesize("a ? b : c ? d : e").unwrap(),
            "(a )?( b ):(( c )?( d ):( e))"
        );
        assert_eq!(
            parenthesize("a ? (b ? 1 : 2) : 3").unwrap(),
            "(a )?( ((b )?( 1 ):( 2)) ):( 3)"
        );
        assert_eq!(
            parenthesize("{k: x ? 'a:b' : 'c', n: 1}").unwrap(),
            "{k:( x )?( 'a:b' ):( 'c'), n: 1}"
        );
        assert_eq!(
            parenthesize("[x ? 1 : 2, 3]|arrSum").unwrap(),
            "[(x )?( 1 ):( 2), 3]|arrSum"
        );
        assert_eq!(parenthesize("'?'"), None);
    }
}
