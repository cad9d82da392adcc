//! The scenarios' templates, the mock services' JSON payloads, and each
//! page's expected rendering, computed here independently of weft's
//! renderer (plain string formatting over the same data).
//!
//! Shapes follow Knot.x's published scenarios: scenario 1 is a 3.2 KB
//! template with one snippet over a 750 B JSON; scenario 5 is a 54 KB
//! template with 100 snippets, each `{{#each _result}}` over one shared
//! 111 KB JSON of 50 people with 4 friends each (renders to ~1.6 MB).

use serde_json::{json, Value};

/// One scenario's fixtures.
pub struct Fixture {
    /// The page name (`/pages/{name}`).
    pub page: String,
    /// The template stored at `/api/v1/pages/{name}`.
    pub template: String,
    /// Services: (name, mock path, JSON body).
    pub services: Vec<(String, String, Vec<u8>)>,
    /// The page weft must answer.
    pub expected: Vec<u8>,
}

/// handlebars' HTML escaping.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
        .replace('`', "&#x60;")
        .replace('=', "&#x3D;")
}

/// Static markup of about `bytes` bytes (a page's chrome).
fn filler(label: &str, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 100);
    let mut i = 0;
    while out.len() < bytes {
        out.push_str(&format!(
            "<div class=\"{label}-row\"><a href=\"/{label}/{i}\">Item {i}</a> <span>static text that Knot.x passes through</span></div>\n"
        ));
        i += 1;
    }
    out
}

/// Scenario 1: one snippet, one 750 B service.
pub fn scenario1(mock: &str) -> Fixture {
    let data = json!({
        "message": "Seven highest mountains of the seven continents",
        "mountains": [
            {"name": "Mount Everest", "height": 8848, "continent": "Asia"},
            {"name": "Aconcagua", "height": 6961, "continent": "South America"},
            {"name": "Denali", "height": 6190, "continent": "North America"},
            {"name": "Kilimanjaro", "height": 5895, "continent": "Africa"},
            {"name": "Mount Elbrus", "height": 5642, "continent": "Europe"},
            {"name": "Vinson Massif", "height": 4892, "continent": "Antarctica"},
            {"name": "Puncak Jaya", "height": 4884, "continent": "Oceania"}
        ],
        "source": "https://en.wikipedia.org/wiki/Seven_Summits",
        "note": "Heights in metres above sea level; figures rounded to the metre as published in most atlases and climbing guides for the summits."
    });
    let body = serde_json::to_vec(&data).expect("JSON");
    let head = format!(
        "<!DOCTYPE html>\n<html><head><title>Scenario 1</title></head><body>\n{}",
        filler("s1", 2800)
    );
    let snippet = "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"s1-mountains\" type=\"text/knotx-snippet\">\
<h2>{{_result.message}}</h2><ol>{{#each _result.mountains}}<li>{{name}} ({{height}} m, {{continent}})</li>{{/each}}</ol><p>{{_result.note}}</p></script>";
    let tail = "\n<footer>weft bench pages</footer></body></html>\n";
    let mut expected = head.clone();
    expected.push_str(&format!(
        "<h2>{}</h2><ol>",
        escape(data["message"].as_str().unwrap())
    ));
    for m in data["mountains"].as_array().unwrap() {
        expected.push_str(&format!(
            "<li>{} ({} m, {})</li>",
            escape(m["name"].as_str().unwrap()),
            m["height"],
            escape(m["continent"].as_str().unwrap())
        ));
    }
    expected.push_str(&format!(
        "</ol><p>{}</p>",
        escape(data["note"].as_str().unwrap())
    ));
    expected.push_str(tail);
    Fixture {
        page: "bench/scenario1.html".into(),
        template: format!("{head}{snippet}{tail}"),
        services: vec![(
            "s1-mountains".into(),
            format!("{mock}/s1/mountains.json"),
            body,
        )],
        expected: expected.into_bytes(),
    }
}

/// A small service body of about `bytes` bytes: a message and items.
fn small_service(label: &str, bytes: usize) -> Value {
    let mut items = Vec::new();
    let mut value = json!({"message": format!("Data of {label}"), "items": []});
    while serde_json::to_vec(&value).expect("JSON").len() + 40 < bytes {
        let n = items.len();
        items.push(json!({"name": format!("{label} item {n}"), "n": n}));
        value["items"] = Value::Array(items.clone());
    }
    value
}

/// The snippet markup rendering a [`small_service`] bound under `ns`
/// (empty: at the root), and its expected rendering.
fn small_snippet(ns: &str, data: &Value) -> (String, String) {
    let at = if ns.is_empty() {
        String::new()
    } else {
        format!("{ns}.")
    };
    let markup = format!(
        "<h3>{{{{{at}_result.message}}}}</h3><ul>{{{{#each {at}_result.items}}}}<li>{{{{name}}}} #{{{{n}}}}</li>{{{{/each}}}}</ul>"
    );
    let mut expected = format!("<h3>{}</h3><ul>", escape(data["message"].as_str().unwrap()));
    for item in data["items"].as_array().unwrap() {
        expected.push_str(&format!(
            "<li>{} #{}</li>",
            escape(item["name"].as_str().unwrap()),
            item["n"]
        ));
    }
    expected.push_str("</ul>");
    (markup, expected)
}

fn snippet_element(bindings: &str, body: &str) -> String {
    format!("<script data-knotx-knots=\"services,handlebars\" {bindings} type=\"text/knotx-snippet\">{body}</script>")
}

/// Scenario 2: one snippet over five services (750/191/212/279/174 B).
pub fn scenario2(mock: &str) -> Fixture {
    let sizes = [750, 191, 212, 279, 174];
    let mut services = Vec::new();
    let mut bindings = String::new();
    let mut body = String::new();
    let mut rendered = String::new();
    for (i, size) in sizes.iter().enumerate() {
        let data = small_service(&format!("s2-{i}"), *size);
        let ns = format!("n{i}");
        bindings.push_str(&format!("data-knotx-service-{ns}=\"s2-{i}\" "));
        let (markup, expected) = small_snippet(&ns, &data);
        body.push_str(&markup);
        rendered.push_str(&expected);
        services.push((
            format!("s2-{i}"),
            format!("{mock}/s2/{i}.json"),
            serde_json::to_vec(&data).expect("JSON"),
        ));
    }
    let head = format!("<!DOCTYPE html>\n<html><body>\n{}", filler("s2", 3300));
    let tail = "\n</body></html>\n";
    Fixture {
        page: "bench/scenario2.html".into(),
        template: format!(
            "{head}{}{tail}",
            snippet_element(bindings.trim_end(), &body)
        ),
        services,
        expected: format!("{head}{rendered}{tail}").into_bytes(),
    }
}

/// Scenario 3: five snippets, one service each.
pub fn scenario3(mock: &str) -> Fixture {
    let mut template = String::from("<!DOCTYPE html>\n<html><body>\n");
    let mut expected = template.clone();
    let mut services = Vec::new();
    for i in 0..5 {
        let data = small_service(&format!("s3-{i}"), 300);
        let (markup, rendered) = small_snippet("", &data);
        let chrome = filler(&format!("s3b{i}"), 700);
        template.push_str(&chrome);
        expected.push_str(&chrome);
        template.push_str(&snippet_element(
            &format!("data-knotx-service=\"s3-{i}\""),
            &markup,
        ));
        expected.push_str(&rendered);
        services.push((
            format!("s3-{i}"),
            format!("{mock}/s3/{i}.json"),
            serde_json::to_vec(&data).expect("JSON"),
        ));
    }
    template.push_str("</body></html>\n");
    expected.push_str("</body></html>\n");
    Fixture {
        page: "bench/scenario3.html".into(),
        template,
        services,
        expected: expected.into_bytes(),
    }
}

/// Scenario 4: a 116 KB template with one snippet over a 234 B service.
pub fn scenario4(mock: &str) -> Fixture {
    let data = small_service("s4", 234);
    let (markup, rendered) = small_snippet("", &data);
    let head = format!("<!DOCTYPE html>\n<html><body>\n{}", filler("s4a", 58_000));
    let tail = format!("{}</body></html>\n", filler("s4b", 57_500));
    Fixture {
        page: "bench/scenario4.html".into(),
        template: format!(
            "{head}{}{tail}",
            snippet_element("data-knotx-service=\"s4\"", &markup)
        ),
        services: vec![(
            "s4".into(),
            format!("{mock}/s4/data.json"),
            serde_json::to_vec(&data).expect("JSON"),
        )],
        expected: format!("{head}{rendered}{tail}").into_bytes(),
    }
}

/// 50 people with 4 friends each, about 111 KB of JSON.
pub fn people() -> Value {
    const WORDS: [&str; 12] = [
        "lorem",
        "ipsum",
        "dolor",
        "sit",
        "amet",
        "consectetur",
        "adipiscing",
        "elit",
        "sed",
        "do",
        "eiusmod",
        "tempor",
    ];
    let text = |seed: usize, words: usize| -> String {
        (0..words)
            .map(|w| WORDS[(seed * 7 + w * 5) % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    Value::Array(
        (0..50)
            .map(|i| {
                let eye = ["blue", "brown", "green"][i % 3];
                let fruit = ["apple", "banana", "strawberry"][i % 3];
                json!({
                    "_id": format!("5a1f{:020x}", i * 7919),
                    "index": i,
                    "guid": format!("{:08x}-1b2c-4d3e-8f4a-{:012x}", i * 31, i * 977),
                    "isActive": i % 2 == 0,
                    "balance": format!("${},{:03}.{:02}", 1 + i % 4, (i * 37) % 1000, i % 100),
                    "picture": "http://placehold.it/32x32",
                    "age": 20 + i % 40,
                    "eyeColor": eye,
                    "name": format!("Person {i} Surname{i}"),
                    "gender": if i % 2 == 0 { "female" } else { "male" },
                    "company": format!("COMPANY{i}"),
                    "email": format!("person{i}@company{i}.com"),
                    "phone": format!("+1 (8{:02}) 555-{:04}", i, i * 13),
                    "address": format!("{} Main Street, Town{i}, State, {}", 100 + i, 1000 + i),
                    "about": text(i, 225),
                    "registered": format!("2015-0{}-1{}T04:1{}:55 -01:00", 1 + i % 9, i % 10, i % 10),
                    "latitude": -45.0 + i as f64 * 1.5,
                    "longitude": 120.0 - i as f64 * 2.25,
                    "tags": (0..7).map(|t| WORDS[(i + t * 3) % WORDS.len()]).collect::<Vec<_>>(),
                    "friends": (0..4).map(|f| json!({"id": f, "name": format!("Friend {i}.{f}")})).collect::<Vec<_>>(),
                    "greeting": format!("Hello, Person {i}! You have {} unread messages.", i % 10),
                    "favoriteFruit": fruit,
                })
            })
            .collect(),
    )
}

/// The snippet body of scenario 5 (each of its 100 snippets).
const PEOPLE_SNIPPET: &str = "<section class=\"people\">{{#each _result}}<div class=\"person\" id=\"{{_id}}\"><h3>{{name}}</h3>\
<p>{{company}}, {{email}}</p><p>{{address}}</p><ul>{{#each friends}}<li>{{name}}</li>{{/each}}</ul>\
<p>{{greeting}}</p></div>{{/each}}</section>";

/// [`PEOPLE_SNIPPET`] rendered over `data`, independently of weft.
fn people_rendered(data: &Value) -> String {
    let mut rendered = String::from("<section class=\"people\">");
    for p in data.as_array().unwrap() {
        let s = |k: &str| escape(p[k].as_str().unwrap());
        rendered.push_str(&format!(
            "<div class=\"person\" id=\"{}\"><h3>{}</h3><p>{}, {}</p><p>{}</p><ul>",
            s("_id"),
            s("name"),
            s("company"),
            s("email"),
            s("address")
        ));
        for f in p["friends"].as_array().unwrap() {
            rendered.push_str(&format!("<li>{}</li>", escape(f["name"].as_str().unwrap())));
        }
        rendered.push_str(&format!("</ul><p>{}</p></div>", s("greeting")));
    }
    rendered.push_str("</section>");
    rendered
}

/// Scenario 5: 100 snippets over one shared 111 KB JSON.
pub fn scenario5(mock: &str) -> Fixture {
    let data = people();
    let body = serde_json::to_vec(&data).expect("JSON");
    let rendered = people_rendered(&data);
    let mut template =
        String::from("<!DOCTYPE html>\n<html><head><title>Scenario 5</title></head><body>\n");
    let mut expected = template.clone();
    for i in 0..100 {
        let chrome = format!("<div class=\"block\" id=\"b{i}\">{}", filler("s5", 150));
        template.push_str(&chrome);
        expected.push_str(&chrome);
        template.push_str(&format!(
            "<script data-knotx-knots=\"services,handlebars\" data-knotx-service=\"s5-people\" type=\"text/knotx-snippet\">{PEOPLE_SNIPPET}</script></div>\n"
        ));
        expected.push_str(&rendered);
        expected.push_str("</div>\n");
    }
    template.push_str("</body></html>\n");
    expected.push_str("</body></html>\n");
    Fixture {
        page: "bench/scenario5.html".into(),
        template,
        services: vec![("s5-people".into(), format!("{mock}/s5/people.json"), body)],
        expected: expected.into_bytes(),
    }
}

/// Scenario 6: one big snippet with 72 `#each` blocks over the 111 KB
/// people JSON (renders to about 1.2 MB).
pub fn scenario6(mock: &str) -> Fixture {
    let data = people();
    let rendered = people_rendered(&data);
    let mut body = String::new();
    let mut expected_body = String::new();
    for i in 0..72 {
        let chrome = format!("<h2 id=\"e{i}\">Block {i}</h2>{}", filler("s6", 200));
        body.push_str(&chrome);
        body.push_str(PEOPLE_SNIPPET);
        expected_body.push_str(&chrome);
        expected_body.push_str(&rendered);
    }
    let head = "<!DOCTYPE html>\n<html><body>\n";
    let tail = "\n</body></html>\n";
    Fixture {
        page: "bench/scenario6.html".into(),
        template: format!(
            "{head}{}{tail}",
            snippet_element("data-knotx-service=\"s6-people\"", &body)
        ),
        services: vec![(
            "s6-people".into(),
            format!("{mock}/s6/people.json"),
            serde_json::to_vec(&data).expect("JSON"),
        )],
        expected: format!("{head}{expected_body}{tail}").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures have the published sizes (within a margin).
    #[test]
    fn sizes_match_the_published_scenarios() {
        let s1 = scenario1("http://m");
        assert!(
            (2900..3600).contains(&s1.template.len()),
            "{}",
            s1.template.len()
        );
        assert!(
            (650..900).contains(&s1.services[0].2.len()),
            "{}",
            s1.services[0].2.len()
        );
        let s5 = scenario5("http://m");
        assert!(
            (45_000..65_000).contains(&s5.template.len()),
            "{}",
            s5.template.len()
        );
        assert!(
            (100_000..125_000).contains(&s5.services[0].2.len()),
            "{}",
            s5.services[0].2.len()
        );
        assert!(
            (1_400_000..1_800_000).contains(&s5.expected.len()),
            "{}",
            s5.expected.len()
        );
    }
}
