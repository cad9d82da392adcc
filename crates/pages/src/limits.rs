//! How deep a page's Handlebars may make a render go.
//!
//! Handlebars renders recursively: every block (`{{#if}}…{{/if}}`), every
//! subexpression (`{{f (g x)}}`) and every partial (`{{> name}}`) is a
//! level of the native stack. A snippet including itself through a
//! partial, two snippets including each other, or a few thousand nested
//! blocks would overflow the stack of the thread rendering the page, and
//! a stack overflow aborts the whole process, not just the request.
//!
//! So the compiled snippets of a page are checked before the page is
//! kept, whatever brought it (`PUT`, the store at start, the pages
//! directory): partials must not form a cycle, a partial's name must be
//! written out (one computed by an expression could be anything), and
//! the deepest render the snippets can make — blocks, subexpressions and
//! partials expanded — must stay within [`MAX_TEMPLATE_DEPTH`]. The
//! snippets of a page are the only templates its registry holds, so what
//! a render can reach is exactly what was checked. Everything here walks
//! the compiled templates with explicit stacks: no input nests this code.
//!
//! Compiling is recursive too: Handlebars builds nested subexpressions
//! recursively, and drops `{{else if}}` chains and nested blocks
//! recursively. So before a snippet body is compiled, [`prescan`] counts
//! what could nest in it — every `(`, every block or inverse tag — which
//! bounds the nesting whatever the body says (a count cannot be fooled by
//! quotes or escapes the way matching openers with closers could).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use handlebars::template::{Parameter, TemplateElement};
use handlebars::{Handlebars, JsonRender, Path, Template};

/// The deepest nesting of blocks, subexpressions and partials (expanded)
/// a page's Handlebars may reach. Real templates nest a handful of levels;
/// 64 leaves room for generous ones while a render stays far from the
/// end of a thread's stack (a few thousand levels overflow 2 MiB).
pub const MAX_TEMPLATE_DEPTH: usize = 64;

/// Most `(` a snippet body may hold: Handlebars compiles nested
/// subexpressions recursively, and a few hundred nested levels are still
/// far from the end of a thread's stack (about a thousand overflow it).
pub const MAX_PARENS: usize = 256;

/// Most block and inverse tags (`{{#…}}`, `{{^…}}`, `{{else…}}`) a
/// snippet body may hold: each can add a level to the compiled template
/// (an `{{else if}}` chain nests), which Handlebars drops recursively.
pub const MAX_BLOCK_TAGS: usize = 1_000;

/// Most bytes one page view may render. A few `{{#each}}` over large
/// sources nested in one another multiply: without a bound, one view could
/// take all the memory there is.
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;

/// Longest the snippets of one page view may take to render (the service
/// calls before it have their own timeouts). Rendering runs on the
/// runtime's thread; past this the view fails instead of holding it.
pub const MAX_RENDER_TIME: Duration = Duration::from_secs(2);

/// What is left of one page view's output and time, shared by all its
/// snippets: every write a render makes takes from it, and the write that
/// would go past either limit fails the render.
pub(crate) struct RenderBudget {
    bytes_left: usize,
    deadline: Instant,
    /// Takes left before the clock is read again: reading it on every
    /// write was a noticeable share of a render (a big page makes tens of
    /// thousands of small writes), and a few dozen writes take far less
    /// than the time limit's precision needs.
    takes_until_clock: u32,
    /// What ran out, once something did.
    pub(crate) exhausted: Option<String>,
}

impl RenderBudget {
    /// A fresh budget of [`MAX_PAGE_BYTES`] and [`MAX_RENDER_TIME`].
    pub(crate) fn new() -> RenderBudget {
        RenderBudget::with(MAX_PAGE_BYTES, MAX_RENDER_TIME)
    }

    fn with(bytes: usize, time: Duration) -> RenderBudget {
        RenderBudget {
            bytes_left: bytes,
            deadline: Instant::now() + time,
            takes_until_clock: 0,
            exhausted: None,
        }
    }

    /// Takes `n` bytes of the page's output; the reason it cannot, once
    /// it cannot.
    pub(crate) fn take(&mut self, n: usize) -> Result<(), String> {
        self.check(n)?;
        self.bytes_left -= n;
        Ok(())
    }

    /// Gives back `n` bytes taken for output that was thrown away (a
    /// snippet that failed half way renders its fallback instead).
    pub(crate) fn give_back(&mut self, n: usize) {
        self.bytes_left += n;
    }

    /// Whether `n` more bytes would still fit, and time is left (the
    /// clock is read on the first check and every [`CLOCK_EVERY`]th).
    fn check(&mut self, n: usize) -> Result<(), String> {
        if let Some(reason) = &self.exhausted {
            return Err(reason.clone());
        }
        let read_clock = self.takes_until_clock == 0;
        self.takes_until_clock = if read_clock {
            CLOCK_EVERY - 1
        } else {
            self.takes_until_clock - 1
        };
        let reason = if n > self.bytes_left {
            format!("its output passed {MAX_PAGE_BYTES} bytes")
        } else if read_clock && Instant::now() > self.deadline {
            format!("rendering took longer than {MAX_RENDER_TIME:?}")
        } else {
            return Ok(());
        };
        self.exhausted = Some(reason.clone());
        Err(reason)
    }
}

/// How many budget checks share one reading of the clock.
const CLOCK_EVERY: u32 = 64;

/// Where a snippet renders to: straight into the page, every write taken
/// from the page view's [`RenderBudget`] (and given back if the snippet
/// fails and its output is dropped).
pub(crate) struct BudgetedOutput<'a> {
    page: &'a mut Vec<u8>,
    budget: &'a mut RenderBudget,
}

impl<'a> BudgetedOutput<'a> {
    pub(crate) fn new(page: &'a mut Vec<u8>, budget: &'a mut RenderBudget) -> Self {
        BudgetedOutput { page, budget }
    }
}

impl std::io::Write for BudgetedOutput<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.budget
            .take(bytes.len())
            .map_err(std::io::Error::other)?;
        self.page.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks that a snippet body cannot nest deep enough to overflow the
/// stack while it is compiled: at most [`MAX_PARENS`] `(` and
/// [`MAX_BLOCK_TAGS`] block tags. Counting bounds nesting whatever is in
/// the body. The error names the problem.
pub(crate) fn prescan(body: &str) -> Result<(), String> {
    let parens = body.bytes().filter(|b| *b == b'(').count();
    if parens > MAX_PARENS {
        return Err(format!(
            "holds {parens} '(' — subexpressions could nest deeper than \
             {MAX_TEMPLATE_DEPTH} levels; at most {MAX_PARENS} are allowed"
        ));
    }
    let bytes = body.as_bytes();
    let mut blocks = 0;
    // Every `{{`, overlapping ones too (`{{{{`).
    for i in (1..bytes.len()).filter(|&i| bytes[i - 1] == b'{' && bytes[i] == b'{') {
        let i = i - 1;
        // `{{`, whitespace, an optional `~`, whitespace, then the tag's
        // kind, as the Handlebars grammar reads a block or inverse tag.
        let mut j = i + 2;
        let skip = |j: &mut usize| {
            while bytes.get(*j).is_some_and(u8::is_ascii_whitespace) {
                *j += 1;
            }
        };
        skip(&mut j);
        if bytes.get(j) == Some(&b'~') {
            j += 1;
            skip(&mut j);
        }
        if matches!(bytes.get(j), Some(b'#' | b'^')) || bytes[j..].starts_with(b"else") {
            blocks += 1;
        }
    }
    if blocks > MAX_BLOCK_TAGS {
        return Err(format!(
            "holds {blocks} block tags — they could nest deeper than \
             {MAX_TEMPLATE_DEPTH} levels; at most {MAX_BLOCK_TAGS} are allowed"
        ));
    }
    Ok(())
}

/// A template the render could reach by name: one of the page's snippets
/// (registered under its name) or an inline partial
/// (`{{#*inline "name"}}…{{/inline}}`, visible by name to what it calls).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Node {
    Snippet(String),
    Inline(String),
}

impl Node {
    /// How a problem names it: snippets by their 1-based position, as the
    /// compile errors do.
    fn describe(&self) -> String {
        match self {
            Node::Snippet(name) => match name.parse::<usize>() {
                Ok(i) => format!("snippet {}", i + 1),
                Err(_) => format!("template '{name}'"),
            },
            Node::Inline(name) => format!("inline partial '{name}'"),
        }
    }
}

/// What one template does without following its partials.
#[derive(Debug, Default)]
struct Shape {
    /// Its own deepest nesting.
    depth: usize,
    /// Partial calls: the nesting at the call, and the name called.
    calls: Vec<(usize, String)>,
}

/// Checks the templates registered under `names` in `handlebars` (a
/// page's snippets): no partial cycle, no partial named by an expression,
/// no render deeper than [`MAX_TEMPLATE_DEPTH`]. The error names the
/// problem, for a 400 or a page that cannot be rendered.
pub(crate) fn check(handlebars: &Handlebars<'_>, names: &[&str]) -> Result<(), String> {
    let mut shapes: HashMap<Node, Shape> = HashMap::new();
    for name in names {
        if let Some(t) = handlebars.get_template(name) {
            walk(Node::Snippet(name.to_string()), t, &mut shapes)?;
        }
    }
    let depth = expanded_depths(&shapes)?;
    if let Some((node, d)) = depth
        .iter()
        .filter(|(_, d)| **d > MAX_TEMPLATE_DEPTH)
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
    {
        return Err(format!(
            "{} is nested deeper than {MAX_TEMPLATE_DEPTH} levels (blocks, \
             subexpressions and partials; it reaches {d})",
            node.describe()
        ));
    }
    Ok(())
}

/// Records the shape of `template` under `node`, and of every inline
/// partial it defines under their own nodes (inline partials with the
/// same name share one node: a call may reach any of them).
fn walk(node: Node, template: &Template, shapes: &mut HashMap<Node, Shape>) -> Result<(), String> {
    // (what, nesting of its elements, whose shape it adds to)
    let mut pending: Vec<(&Template, usize, Node)> = vec![(template, 0, node)];
    let mut params: Vec<(&Parameter, usize, Node)> = Vec::new();
    while let Some((t, depth, owner)) = pending.pop() {
        {
            let shape = shapes.entry(owner.clone()).or_default();
            shape.depth = shape.depth.max(depth);
        }
        for element in &t.elements {
            match element {
                TemplateElement::RawString(_) | TemplateElement::Comment(_) => {}
                TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                    collect_params(&h.name, &h.params, &h.hash, depth, &owner, &mut params);
                }
                TemplateElement::HelperBlock(h) => {
                    collect_params(&h.name, &h.params, &h.hash, depth, &owner, &mut params);
                    for inner in [&h.template, &h.inverse].into_iter().flatten() {
                        pending.push((inner, depth + 1, owner.clone()));
                    }
                }
                TemplateElement::DecoratorExpression(d) => {
                    collect_params(&d.name, &d.params, &d.hash, depth, &owner, &mut params);
                }
                TemplateElement::DecoratorBlock(d) => {
                    collect_params(&d.name, &d.params, &d.hash, depth, &owner, &mut params);
                    let Some(body) = &d.template else { continue };
                    if name_of(&d.name).as_deref() == Some("inline") {
                        let Some(name) = d.params.first().and_then(name_of) else {
                            return Err(format!(
                                "{}: an inline partial named by an expression cannot be \
                                 checked for cycles; name it",
                                owner.describe()
                            ));
                        };
                        // Rendered only when called, from the caller's level.
                        pending.push((body, 0, Node::Inline(name)));
                    } else {
                        pending.push((body, depth + 1, owner.clone()));
                    }
                }
                TemplateElement::PartialExpression(d) | TemplateElement::PartialBlock(d) => {
                    let Some(name) = name_of(&d.name) else {
                        return Err(format!(
                            "{}: a partial named by an expression cannot be checked \
                             for cycles; name it",
                            owner.describe()
                        ));
                    };
                    if name != "@partial-block" {
                        let shape = shapes.entry(owner.clone()).or_default();
                        shape.calls.push((depth + 1, name));
                    }
                    collect_params(&d.name, &d.params, &d.hash, depth, &owner, &mut params);
                    if let Some(body) = &d.template {
                        pending.push((body, depth + 1, owner.clone()));
                    }
                }
                _ => {
                    return Err(format!(
                        "{}: uses Handlebars weft cannot check",
                        owner.describe()
                    ))
                }
            }
            // Subexpressions: each a level deeper than what holds it.
            while let Some((p, depth, owner)) = params.pop() {
                if let Parameter::Subexpression(s) = p {
                    let shape = shapes.entry(owner.clone()).or_default();
                    shape.depth = shape.depth.max(depth + 1);
                    match s.element.as_ref() {
                        TemplateElement::Expression(h)
                        | TemplateElement::HtmlExpression(h)
                        | TemplateElement::HelperBlock(h) => {
                            collect_params(
                                &h.name,
                                &h.params,
                                &h.hash,
                                depth + 1,
                                &owner,
                                &mut params,
                            );
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(())
}

/// Queues the subexpressions among a tag's name, params and hash, found
/// at nesting `depth`.
fn collect_params<'t>(
    name: &'t Parameter,
    list: &'t [Parameter],
    hash: &'t HashMap<String, Parameter>,
    depth: usize,
    owner: &Node,
    out: &mut Vec<(&'t Parameter, usize, Node)>,
) {
    for p in std::iter::once(name).chain(list).chain(hash.values()) {
        if matches!(p, Parameter::Subexpression(_)) {
            out.push((p, depth, owner.clone()));
        }
    }
}

/// The name a tag's name parameter stands for, as Handlebars reads it
/// when rendering; `None` when an expression computes it.
fn name_of(p: &Parameter) -> Option<String> {
    match p {
        Parameter::Name(n) => Some(n.clone()),
        Parameter::Path(Path::Relative((_, raw))) | Parameter::Path(Path::Local((_, _, raw))) => {
            Some(raw.clone())
        }
        Parameter::Literal(j) => Some(j.render()),
        _ => None,
    }
}

/// A node on the path a depth-first search explores: the node, its calls
/// (the nesting at the call, the node called) and how many of them have
/// been looked at.
type Step = (Node, Vec<(usize, Node)>, usize);

/// Every node's depth with its partials expanded, or the first partial
/// cycle found. A depth-first search with an explicit stack.
fn expanded_depths(shapes: &HashMap<Node, Shape>) -> Result<HashMap<Node, usize>, String> {
    // What a call to `name` may reach: the inline partials of that name
    // (looked up first) and the snippet registered under it.
    let targets = |name: &str| -> Vec<Node> {
        [
            Node::Inline(name.to_string()),
            Node::Snippet(name.to_string()),
        ]
        .into_iter()
        .filter(|n| shapes.contains_key(n))
        .collect()
    };
    let mut done: HashMap<Node, usize> = HashMap::new();
    let mut nodes: Vec<&Node> = shapes.keys().collect();
    nodes.sort();
    for start in nodes {
        if done.contains_key(start) {
            continue;
        }
        // The path being explored: a node and how many of its calls'
        // targets have been looked at.
        let mut path: Vec<Step> = Vec::new();
        let edges = |n: &Node| -> Vec<(usize, Node)> {
            shapes[n]
                .calls
                .iter()
                .flat_map(|(d, name)| targets(name).into_iter().map(move |t| (*d, t)))
                .collect()
        };
        path.push((start.clone(), edges(start), 0));
        while let Some((node, out, next)) = path.last_mut() {
            if let Some((_, target)) = out.get(*next).cloned() {
                *next += 1;
                if done.contains_key(&target) {
                    continue;
                }
                if let Some(i) = path.iter().position(|(n, _, _)| *n == target) {
                    let cycle: Vec<String> = path[i..]
                        .iter()
                        .map(|(n, _, _)| n.describe())
                        .chain(std::iter::once(target.describe()))
                        .collect();
                    return Err(format!("partial cycle: {}", cycle.join(" → ")));
                }
                let e = edges(&target);
                path.push((target, e, 0));
                continue;
            }
            let depth = out
                .iter()
                .map(|(d, t)| d.saturating_add(done[t]))
                .fold(shapes[node].depth, usize::max);
            let node = node.clone();
            path.pop();
            done.insert(node, depth);
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_render_budget_refuses_the_write_past_its_bytes_and_then_everything() {
        let mut budget = RenderBudget::with(10, Duration::from_secs(60));
        assert!(budget.take(6).is_ok());
        assert!(budget.take(4).is_ok());
        assert!(budget.take(1).unwrap_err().contains("bytes"));
        assert!(budget.take(0).is_err(), "stays exhausted");
    }

    #[test]
    fn a_render_budget_refuses_writes_past_its_deadline() {
        let mut budget = RenderBudget::with(10, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(budget.take(1).unwrap_err().contains("longer than"));
    }

    /// The clock is read once every [`CLOCK_EVERY`] takes, so a deadline
    /// passed between two readings is seen at the next one at the latest.
    #[test]
    fn a_render_budget_reads_the_clock_every_so_many_takes() {
        let mut budget = RenderBudget::with(1000, Duration::from_millis(1));
        assert!(
            budget.take(1).is_ok(),
            "the first take reads the clock in time"
        );
        std::thread::sleep(Duration::from_millis(2));
        let refused = (1..=CLOCK_EVERY).find(|_| budget.take(1).is_err());
        assert_eq!(refused, Some(CLOCK_EVERY), "refused at the next reading");
    }

    /// Bytes given back can be taken again.
    #[test]
    fn a_render_budget_takes_back_what_is_given_back() {
        let mut budget = RenderBudget::with(10, Duration::from_secs(60));
        assert!(budget.take(10).is_ok());
        budget.give_back(4);
        assert!(budget.take(4).is_ok());
        assert!(budget.take(1).is_err());
    }

    /// Registers `bodies` as snippets `0`, `1`, … and checks them.
    fn check_bodies(bodies: &[&str]) -> Result<(), String> {
        let mut h = Handlebars::new();
        let names: Vec<String> = (0..bodies.len()).map(|i| i.to_string()).collect();
        for (name, body) in names.iter().zip(bodies) {
            h.register_template_string(name, body).unwrap();
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        check(&h, &names)
    }

    /// Partials that call each other, directly or through inline
    /// partials and partial blocks, are a cycle, named in order.
    #[test]
    fn partial_cycles_are_found_and_named() {
        let cases: [(&[&str], &str); 6] = [
            (&["{{> 0}}"], "partial cycle: snippet 1 → snippet 1"),
            (&["{{> 1}}", "{{#if a}}{{> 0}}{{/if}}"], "partial cycle: snippet 1 → snippet 2 → snippet 1"),
            (&["x", "{{> 2}}", "{{#> 1}}y{{/1}}"], "partial cycle: snippet 2 → snippet 3 → snippet 2"),
            (
                &["{{#*inline \"me\"}}{{> me}}{{/inline}}{{> me}}"],
                "partial cycle: inline partial 'me' → inline partial 'me'",
            ),
            (
                &["{{#*inline \"a\"}}{{> b}}{{/inline}}{{#*inline \"b\"}}{{> a}}{{/inline}}{{> a}}"],
                "partial cycle: inline partial 'a' → inline partial 'b' → inline partial 'a'",
            ),
            // An inline partial defined in one snippet is seen by another.
            (
                &["{{#*inline \"p\"}}{{> 1}}{{/inline}}{{> 1}}", "{{> p}}"],
                "partial cycle: snippet 2 → inline partial 'p' → snippet 2",
            ),
        ];
        for (bodies, says) in cases {
            assert_eq!(check_bodies(bodies).unwrap_err(), says, "{bodies:?}");
        }
    }

    /// Partials without a cycle pass, however they are shared; a call to
    /// a partial that does not exist is the render's (failed) business.
    #[test]
    fn acyclic_partials_pass() {
        for bodies in [
            &["{{> 1}}{{> 1}}", "{{> 2}}", "leaf"][..],
            &["{{#*inline \"row\"}}<tr>{{> cell}}</tr>{{/inline}}{{#*inline \"cell\"}}td{{/inline}}{{#each a}}{{> row}}{{/each}}"],
            &["{{> missing}}{{#> missing}}fallback{{/missing}}"],
            &["{{#> 1}}inside{{/1}}", "{{> @partial-block}}"],
        ] {
            assert_eq!(check_bodies(bodies), Ok(()), "{bodies:?}");
        }
    }

    /// Blocks, subexpressions and partials all count towards the depth,
    /// partials with the depth of what they include.
    #[test]
    fn depth_counts_blocks_subexpressions_and_partials() {
        let blocks = |n: usize| "{{#if a}}".repeat(n) + &"{{/if}}".repeat(n);
        let subexpressions =
            |n: usize| format!("{{{{len {}a{}}}}}", "(len ".repeat(n), ")".repeat(n));
        assert_eq!(check_bodies(&[&blocks(MAX_TEMPLATE_DEPTH)]), Ok(()));
        assert_eq!(check_bodies(&[&subexpressions(MAX_TEMPLATE_DEPTH)]), Ok(()));
        let too_deep = format!("snippet 1 is nested deeper than {MAX_TEMPLATE_DEPTH} levels");
        for body in [
            blocks(MAX_TEMPLATE_DEPTH + 1),
            subexpressions(MAX_TEMPLATE_DEPTH + 1),
        ] {
            let e = check_bodies(&[&body]).unwrap_err();
            assert!(e.starts_with(&too_deep), "{e}");
        }
        // Two snippets of 40 levels, one including the other inside its
        // blocks: 81 levels.
        let outer = "{{#if a}}".repeat(40) + "{{> 1}}" + &"{{/if}}".repeat(40);
        let e = check_bodies(&[&outer, &blocks(40)]).unwrap_err();
        assert!(e.contains("it reaches 81"), "{e}");
        // A chain of 100 partials, each a level.
        let chain: Vec<String> = (0..100).map(|i| format!("{{{{> {}}}}}", i + 1)).collect();
        let chain: Vec<&str> = chain.iter().map(String::as_str).collect();
        let e = check_bodies(&chain).unwrap_err();
        assert!(e.starts_with(&too_deep), "{e}");
    }

    /// A partial or an inline partial named by an expression could be
    /// any, so it is refused.
    #[test]
    fn computed_partial_names_are_refused() {
        for body in [
            "{{> (lookup this \"p\")}}",
            "{{#*inline (lookup this \"p\")}}x{{/inline}}",
        ] {
            let e = check_bodies(&[body]).unwrap_err();
            assert!(e.contains("named by an expression"), "{body}: {e}");
        }
    }

    /// What could nest while compiling is counted before: `(` and block
    /// tags, however they are spelt, in strings or not.
    #[test]
    fn prescan_counts_what_could_nest() {
        let parens = |n: usize| format!("{{{{len {}a{}}}}}", "(len ".repeat(n), ")".repeat(n));
        assert_eq!(prescan(&parens(MAX_PARENS)), Ok(()));
        assert!(prescan(&parens(MAX_PARENS + 1))
            .unwrap_err()
            .contains("at most 256"));
        // Closers in strings do not hide openers.
        let hidden = "{{f ".to_string()
            + &"(f \")\" ".repeat(MAX_PARENS + 1)
            + &")".repeat(MAX_PARENS + 1)
            + "}}";
        assert!(prescan(&hidden).is_err());
        for tag in [
            "{{#if a}}",
            "{{ ~ #if a}}",
            "{{~^}}",
            "{{else if b}}",
            "{{  else}}",
            "{{{{#raw}}",
        ] {
            let body = tag.repeat(MAX_BLOCK_TAGS + 1);
            assert!(prescan(&body).unwrap_err().contains("block tags"), "{tag}");
            assert_eq!(prescan(&tag.repeat(MAX_BLOCK_TAGS)), Ok(()), "{tag}");
        }
        assert_eq!(prescan(&"{{a}}{{/if}}{{> p}}".repeat(5_000)), Ok(()));
    }
}
