//! Property tests of compiling and rendering pages: whatever template a
//! client stores — nested blocks, partials that call each other, inline
//! partials, subexpressions, broken tags — compiling answers a page or an
//! error naming the problem, and rendering what compiled, over any data,
//! answers HTML or a failed snippet; nothing panics or overflows the
//! stack. The cases per property are bounded so `cargo test` takes
//! seconds; `PROPTEST_CASES=100000 cargo test -p weft-pages proptest`
//! runs longer.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

/// Pieces of Handlebars, whole and broken, that nest and call partials.
fn handlebars_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{#if a}}".to_string()),
        Just("{{/if}}".to_string()),
        Just("{{#unless x}}".to_string()),
        Just("{{/unless}}".to_string()),
        Just("{{#each a}}".to_string()),
        Just("{{/each}}".to_string()),
        Just("{{#with a}}".to_string()),
        Just("{{/with}}".to_string()),
        Just("{{else}}".to_string()),
        Just("{{else if a}}".to_string()),
        Just("{{^}}".to_string()),
        Just("{{> 0}}".to_string()),
        Just("{{> 1}}".to_string()),
        Just("{{> p}}".to_string()),
        Just("{{#> 1}}".to_string()),
        Just("{{/1}}".to_string()),
        Just("{{> @partial-block}}".to_string()),
        Just("{{#*inline \"p\"}}".to_string()),
        Just("{{/inline}}".to_string()),
        Just("{{lookup a \"b\"}}".to_string()),
        Just("{{lookup (lookup a \"b\") \"c\"}}".to_string()),
        Just("{{eq (len a) (len (lookup a 0))}}".to_string()),
        Just("{{a.b}}".to_string()),
        Just("{{{a}}}".to_string()),
        Just("{{@index}}".to_string()),
        Just("{{#bold}}".to_string()),
        Just("{{/bold}}".to_string()),
        Just("{{".to_string()),
        Just("}}".to_string()),
        Just("(".to_string()),
        "\\PC{0,4}",
    ]
}

/// A snippet body: pieces, or the same block nested `n` deep.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(handlebars_piece(), 0..16).prop_map(|p| p.concat()),
        (
            0usize..3_000,
            prop::sample::select(vec!["if a", "unless x", "each a", "with a"])
        )
            .prop_map(|(n, block)| {
                let name = block.split(' ').next().unwrap_or_default();
                format!(
                    "{}x{}",
                    format!("{{{{#{block}}}}}").repeat(n),
                    format!("{{{{/{name}}}}}").repeat(n)
                )
            }),
        (0usize..3_000).prop_map(|n| format!(
            "{{{{len {}a{}}}}}",
            "(len ".repeat(n),
            ")".repeat(n)
        )),
        (0usize..12_000)
            .prop_map(|n| format!("{{{{#if a}}}}{}x{{{{/if}}}}", "{{else if b}}".repeat(n))),
    ]
}

/// A page of one to three snippets (which may call each other by their
/// names `0`, `1`, `2`).
fn page() -> impl Strategy<Value = String> {
    prop::collection::vec(body(), 1..4).prop_map(|bodies| {
        bodies
            .iter()
            .map(|b| {
                format!(
                    "<p><script data-knotx-knots=\"handlebars\" type=\"text/knotx-snippet\">{b}</script>"
                )
            })
            .collect()
    })
}

/// JSON data for the render context, deeply nested included.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "\\PC{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(24, 128, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[abcx0-9]{1,2}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Compiles `source`; renders each snippet of what compiled over `data`.
fn compile_and_render(source: String, data: &Value) -> Result<(), TestCaseError> {
    let Ok(compiled) = compile(source) else {
        return Ok(());
    };
    let context = handlebars::Context::wraps(data).unwrap();
    for (i, s) in compiled.template.snippets.iter().enumerate() {
        if s.knots.iter().any(|k| k == "handlebars") {
            let _ = compiled
                .handlebars
                .render_with_context(&compiled.names[i], &context);
        }
    }
    Ok(())
}

/// `cases` cases per property, unless `PROPTEST_CASES` asks for another
/// number (a longer run: `PROPTEST_CASES=100000`).
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config
}

proptest! {
    #![proptest_config(config(512))]

    /// Handlebars-shaped pages compile or fail cleanly and render within
    /// the stack.
    #[test]
    fn templates_never_panic_or_overflow(source in page(), data in json()) {
        compile_and_render(source, &data)?;
    }

    /// Any text as a whole page compiles or fails cleanly.
    #[test]
    fn arbitrary_pages_never_panic(source in "\\PC{0,200}", data in json()) {
        compile_and_render(source, &data)?;
    }

    /// Pages escape values exactly as Handlebars' own escaping does.
    #[test]
    fn escaping_is_handlebars_own(text in "(\\PC|[<>\"&'`=]){0,64}") {
        prop_assert_eq!(escape_html(&text), handlebars::html_escape(&text));
    }
}

/// What the checks allow renders: nesting right at the limit compiles and
/// renders; one level more is refused, naming the limit.
#[test]
fn nesting_at_the_limit_renders_one_more_is_refused() {
    let nest = |n: usize| {
        format!(
            "<script data-knotx-knots=\"handlebars\" type=\"text/knotx-snippet\">{}x{}</script>",
            "{{#unless x}}".repeat(n),
            "{{/unless}}".repeat(n)
        )
    };
    let c = compile(nest(MAX_TEMPLATE_DEPTH)).unwrap();
    assert_eq!(
        c.handlebars
            .render_with_context(&c.names[0], &handlebars::Context::null())
            .unwrap(),
        "x"
    );
    let Err(PageError::Invalid(e)) = compile(nest(MAX_TEMPLATE_DEPTH + 1)) else {
        panic!("one level more compiles");
    };
    assert!(e.contains("nested deeper than 64"), "{e}");
}
