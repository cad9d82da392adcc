//! The console in a real browser: headless Chromium driven through
//! chromedriver (Debian's `chromium` and `chromium-driver`, started by
//! `scripts/test-services`, which exports `WEFT_TEST_WEBDRIVER_URL`),
//! against the real weft binary started as the black-box tests start it.
//!
//! - sign in with an API key (a wrong one is refused where it was typed);
//! - create a device type with a codec, see a bad codec refused next to
//!   the form, and test the codec on a hex payload;
//! - test a type's encoder (saved or in the editor) on a downlink object;
//! - send an uplink and see it arrive live on the device page, in its
//!   latest values and in its chart;
//! - queue a downlink through the type's encodeDownlink and see it listed;
//! - a rule raises an alarm, it appears live on the alarms screen and is
//!   acked there;
//! - see a channel subscriber's backlog on the Channels screen;
//! - page and search through 100,000 devices;
//! - every other screen opens and lists what it should, without errors.
//!
//! A failing case saves a screenshot of the browser under the target
//! directory and prints its path. With `WEFT_CONSOLE_SCREENSHOTS=<dir>` the
//! cases also save the screenshots docs/console.md shows.

#[allow(dead_code)]
#[path = "../blackbox/util.rs"]
mod util;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use util::*;

/// What a case answers: `Err` with what went wrong, so the harness can
/// take a screenshot before failing.
type Outcome = Result<(), String>;

/// How long any one expectation may take to come true in the browser.
const WAIT: Duration = Duration::from_secs(20);

/// A browser session on chromedriver: headless Chromium at a desktop size.
async fn browser() -> Client {
    let url = std::env::var("WEFT_TEST_WEBDRIVER_URL").expect(
        "WEFT_TEST_WEBDRIVER_URL names the chromedriver the console's browser tests use: \
         scripts/test starts one (eval \"$(scripts/test-services start)\")",
    );
    let chromium =
        std::env::var("WEFT_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,900", "--hide-scrollbars", "--force-device-scale-factor=1"]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("a Chromium session on chromedriver at {url}: {e}"))
}

/// Runs `case` in a fresh browser; on failure saves a screenshot (its path
/// printed) and fails the test with the case's message.
async fn run<F>(name: &str, case: F)
where
    F: for<'a> FnOnce(&'a Client) -> Pin<Box<dyn Future<Output = Outcome> + 'a>>,
{
    let client = browser().await;
    let outcome = case(&client).await;
    if let Err(why) = &outcome {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{name}.png"));
        match client.screenshot().await {
            Ok(png) if std::fs::write(&path, &png).is_ok() => {
                eprintln!("console test {name} failed; screenshot: {}", path.display())
            }
            _ => eprintln!("console test {name} failed; no screenshot could be taken"),
        }
        let _ = client.close().await;
        panic!("{name}: {why}");
    }
    let _ = client.close().await;
}

/// Saves a screenshot for the docs when `WEFT_CONSOLE_SCREENSHOTS` names
/// a directory.
async fn doc_shot(client: &Client, name: &str) {
    let Ok(dir) = std::env::var("WEFT_CONSOLE_SCREENSHOTS") else {
        return;
    };
    if let Ok(png) = client.screenshot().await {
        let path = PathBuf::from(dir).join(format!("{name}.png"));
        std::fs::write(&path, png).expect("the screenshot directory is writable");
    }
}

/// Waits until `css` matches an element whose text satisfies `ok`;
/// answers that text.
async fn wait_text(
    client: &Client,
    css: &str,
    ok: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("(no such element)");
    loop {
        if let Ok(found) = client.find_all(Locator::Css(css)).await {
            for el in found {
                if let Ok(text) = el.text().await {
                    if ok(&text) {
                        return Ok(text);
                    }
                    last = text;
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "'{css}' did not show what was expected within {WAIT:?}; last text: {last:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `css` matches an element; answers it.
async fn wait_for(client: &Client, css: &str) -> Result<fantoccini::elements::Element, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(el) = client.find(Locator::Css(css)).await {
            return Ok(el);
        }
        if Instant::now() > deadline {
            return Err(format!("'{css}' did not appear within {WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the attribute `attr` of `css` satisfies `ok`.
async fn wait_attr(
    client: &Client,
    css: &str,
    attr: &str,
    ok: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    loop {
        if let Ok(el) = client.find(Locator::Css(css)).await {
            if let Ok(Some(v)) = el.attr(attr).await {
                if ok(&v) {
                    return Ok(v);
                }
                last = Some(v);
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{attr} of '{css}' not as expected within {WAIT:?}; last: {last:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn fail<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Clicks the element `css` matches.
async fn click(client: &Client, css: &str) -> Outcome {
    // Live screens re-render their lists when the server pushes a change,
    // so the element found can be replaced before the click lands; a user
    // would click the new one, and so does this, until the deadline.
    let deadline = Instant::now() + WAIT;
    loop {
        match wait_for(client, css).await?.click().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline && e.to_string().contains("stale element") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(fail("click")(e)),
        }
    }
}

/// Types `text` into the (cleared) field `css`.
async fn type_into(client: &Client, css: &str, text: &str) -> Outcome {
    let el = wait_for(client, css).await?;
    el.clear().await.map_err(fail("clear"))?;
    el.send_keys(text).await.map_err(fail("type"))
}

/// Sets a long text (a script) into the field `css` at once, as a paste
/// would, and lets the page hear it.
async fn paste(client: &Client, css: &str, text: &str) -> Outcome {
    client
        .execute(
            "const el = document.querySelector(arguments[0]); el.value = arguments[1]; \
             el.dispatchEvent(new Event('input', {bubbles: true}));",
            vec![json!(css), json!(text)],
        )
        .await
        .map(drop)
        .map_err(fail("paste"))
}

/// Opens the console at `hash` (`#/…`).
async fn open(client: &Client, server: &Server, hash: &str) -> Outcome {
    client
        .goto(&format!("{}/{hash}", server.url))
        .await
        .map_err(fail("navigate"))
}

/// Signs in with the admin key through the form.
async fn sign_in(client: &Client, server: &Server) -> Outcome {
    open(client, server, "").await?;
    type_into(client, "#api-key", ADMIN_KEY).await?;
    click(client, "#sign-in button[type=submit]").await?;
    wait_for(client, "#ov-uplinks").await.map(drop)
}

/// Signing in: the console asks for a key, says so where it was typed
/// when the key is wrong, and opens the overview with the right one; the
/// key stays for the tab, so a reload stays signed in; at phone width
/// the navigation folds behind a menu button that opens it.
#[tokio::test]
async fn signs_in_with_an_api_key() {
    let server = Server::start();
    run("signs_in_with_an_api_key", |b| {
        Box::pin(async move {
            open(b, &server, "").await?;
            wait_for(b, "#sign-in").await?;
            doc_shot(b, "sign-in").await;
            type_into(b, "#api-key", "weft_not-a-key-at-all-0000000000000000").await?;
            click(b, "#sign-in button[type=submit]").await?;
            wait_text(b, "#sign-in .error", |t| t.contains("not valid")).await?;
            type_into(b, "#api-key", ADMIN_KEY).await?;
            click(b, "#sign-in button[type=submit]").await?;
            wait_text(b, "#ov-uplinks", |t| !t.is_empty()).await?;
            b.refresh().await.map_err(fail("reload"))?;
            wait_for(b, "#ov-uplinks").await?;
            let who = wait_text(b, "#who", |t| t.starts_with("key ")).await?;
            if who.contains(&ADMIN_KEY[10..]) {
                return Err(format!("the whole key is shown: {who}"));
            }
            // At phone width the navigation folds behind a menu button.
            b.set_window_size(390, 844).await.map_err(fail("resize"))?;
            let alarms = wait_for(b, "nav a[href='#/alarms']").await?;
            if alarms.is_displayed().await.map_err(fail("displayed"))? {
                return Err("the navigation is not folded at phone width".into());
            }
            click(b, "#menu-toggle").await?;
            click(b, "nav a[href='#/alarms']").await?;
            wait_text(b, "h1", |t| t == "Alarms").await?;
            doc_shot(b, "phone").await;
            Ok(())
        })
    })
    .await;
}

/// A device type made in the console: a codec that does not compile is
/// refused with the engine's message next to the form; a good one is
/// saved, and its test on a hex payload shows the decoded measures, and
/// a payload the codec rejects shows its error; a TTN codec definition's
/// examples run against it, each marked pass or differs; and Test runs
/// an edited decoder before it is saved, saving nothing.
#[tokio::test]
async fn creates_a_device_type_and_tests_its_codec() {
    let server = Server::start();
    run("creates_a_device_type_and_tests_its_codec", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/types/+new").await?;
            type_into(b, "#type-name", "em300th").await?;
            paste(
                b,
                "#type-script",
                "function decodeUplink(input) { return {data: ",
            )
            .await?;
            click(b, "#type-save").await?;
            wait_text(b, "#type-form .error", |t| t.contains("InvalidScript")).await?;
            paste(b, "#type-script", EM300TH_JS).await?;
            click(b, "#type-save").await?;
            wait_text(b, "#type-saved", |t| t.contains("Saved")).await?;
            wait_for(b, "#test-form").await?;
            // The saved type is the server's now.
            let (status, saved) = server
                .client()
                .send("GET", "/api/v1/device-types/em300th", None, None)
                .await;
            if status != 200 || saved["decoder"]["script"] != json!(EM300TH_JS) {
                return Err(format!(
                    "the type was not stored as typed: {status} {saved}"
                ));
            }
            // The editor shows the script highlighted.
            wait_for(b, ".editor pre .tok-k").await?;
            type_into(b, "#test-input", "01755C0367340104 6865").await?;
            click(b, "#test-run").await?;
            wait_text(b, "#test-result [data-measure=battery]", |t| t == "92").await?;
            wait_text(b, "#test-result [data-measure=temperature]", |t| {
                t == "30.8"
            })
            .await?;
            doc_shot(b, "device-type").await;
            type_into(b, "#test-input", "0175").await?;
            click(b, "#test-run").await?;
            wait_text(b, "#test-errors", |t| t.contains("truncated")).await?;
            // A TTN codec definition's examples, run against the codec.
            let ttn = json!({"uplinkDecoder": {"examples": [
                {"description": "battery", "input": {"fPort": 85, "bytes": [1, 117, 92]},
                 "output": {"data": {"battery": 92}}},
                {"description": "truncated", "input": {"fPort": 85, "bytes": [1, 117]},
                 "output": {"errors": ["truncated record at byte 2"]}},
                {"description": "wrong on purpose", "input": {"fPort": 85, "bytes": [1, 117, 1]},
                 "output": {"data": {"battery": 2}}}
            ]}});
            paste(b, "#ttn-import", &ttn.to_string()).await?;
            click(b, "#ttn-run").await?;
            wait_text(b, "#ttn-results", |t| t.contains("wrong on purpose")).await?;
            let marks = b
                .find_all(Locator::Css("#ttn-results [data-pass]"))
                .await
                .map_err(fail("find"))?;
            let mut passed = Vec::new();
            for m in marks {
                passed.push(
                    m.attr("data-pass")
                        .await
                        .map_err(fail("attr"))?
                        .unwrap_or_default(),
                );
            }
            if passed != ["true", "true", "false"] {
                return Err(format!("examples marked {passed:?}"));
            }
            // Test runs what is in the editor, saved or not.
            paste(
                b,
                "#type-script",
                "function decodeUplink(input) { return {data: {battery: input.bytes[2] * 2}}; }",
            )
            .await?;
            type_into(b, "#test-input", "01755C").await?;
            click(b, "#test-run").await?;
            wait_text(b, "#test-result [data-measure=battery]", |t| t == "184").await?;
            wait_for(b, "#test-unsaved").await?;
            let (_, stored) = server
                .client()
                .send("GET", "/api/v1/device-types/em300th", None, None)
                .await;
            if stored["decoder"]["script"] != json!(EM300TH_JS) {
                return Err(format!("testing saved the editor's decoder: {stored}"));
            }
            Ok(())
        })
    })
    .await;
}

/// A device type's encoder tested from its editor: a downlink object
/// encodes to the bytes (hex and base64) and port of the saved
/// `encodeDownlink`; an object it refuses shows its own errors; and the
/// editor's encoder runs before it is saved, with the variables typed,
/// saving nothing.
#[tokio::test]
async fn the_type_editor_tests_its_encoder() {
    let server = Server::start();
    let c = server.client();
    let actuator = json!({"decoder": {"script": ACTUATOR_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/actuator", Some(&actuator))
        .await;
    run("the_type_editor_tests_its_encoder", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/types/actuator").await?;
            wait_for(b, "#enc-form").await?;
            paste(b, "#enc-data", r#"{"command": "ring", "duration": 7}"#).await?;
            click(b, "#enc-run").await?;
            wait_text(b, "#enc-hex", |t| t == "0107").await?;
            wait_text(b, "#enc-base64", |t| t == "AQc=").await?;
            wait_text(b, "#enc-fport", |t| t == "10").await?;
            // The codec's own errors for an object it refuses.
            paste(b, "#enc-data", r#"{"command": "explode"}"#).await?;
            click(b, "#enc-run").await?;
            wait_text(b, "#enc-errors", |t| {
                t.contains("EncodeFailed") && t.contains("unknown command explode")
            })
            .await?;
            // The editor's encoder, not saved, with the variables typed.
            paste(
                b,
                "#type-script",
                "function encodeDownlink(input) { return {bytes: [9, Number(input.variables.level)], fPort: 3}; }",
            )
            .await?;
            paste(b, "#enc-data", r#"{"command": "level"}"#).await?;
            paste(b, "#enc-variables", r#"{"level": "66"}"#).await?;
            click(b, "#enc-run").await?;
            wait_text(b, "#enc-hex", |t| t == "0942").await?;
            wait_text(b, "#enc-fport", |t| t == "3").await?;
            wait_for(b, "#enc-unsaved").await?;
            b.execute(
                "document.querySelector('#enc-form').scrollIntoView()",
                vec![],
            )
            .await
            .map_err(fail("scroll"))?;
            doc_shot(b, "device-type-encode").await;
            let (_, stored) = server
                .client()
                .send("GET", "/api/v1/device-types/actuator", None, None)
                .await;
            if stored["decoder"]["script"] != json!(ACTUATOR_JS) {
                return Err(format!("testing saved the editor's encoder: {stored}"));
            }
            Ok(())
        })
    })
    .await;
}

/// An uplink sent while the device page is open shows up there live: in
/// the event log, as the latest value and as a new point of the chart of
/// its measure; reopened, the page draws the chart from history.
#[tokio::test]
async fn an_uplink_appears_live_on_the_device_page_and_its_chart() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let device = json!({"name": "P00010", "type": "em300th", "channel": "farm"});
    c.expect(201, "PUT", "/api/v1/devices/dev-live", Some(&device))
        .await;
    run(
        "an_uplink_appears_live_on_the_device_page_and_its_chart",
        |b| {
            Box::pin(async move {
                sign_in(b, &server).await?;
                open(b, &server, "#/device/dev-live").await?;
                wait_text(b, "#live-state", |t| t.contains("live")).await?;
                let now = 1_700_000_000_000i64;
                for (i, t) in [21, 23, 22].into_iter().enumerate() {
                    let body = decoded_body(
                        &format!("live-{i}"),
                        "dev-live",
                        t,
                        40 + i as i64,
                        now + i as i64 * 60_000,
                    );
                    c.uplink("farm", "decoded", "em300th", &body).await;
                }
                wait_text(b, "#event-log", |t| t.lines().count() >= 3).await?;
                wait_text(b, "#latest [data-measure=temperature]", |t| t == "22").await?;
                wait_attr(b, "[data-chart=temperature]", "data-points", |n| n == "3").await?;
                wait_for(b, "[data-chart=temperature] canvas").await?;
                doc_shot(b, "device").await;
                // From history, once the history writer has recorded them.
                eventually(Duration::from_secs(20), || async {
                    let (status, h) = c
                        .send(
                            "GET",
                            "/ql/v2/entities/dev-live/attrs/temperature",
                            None,
                            None,
                        )
                        .await;
                    (status == 200 && h["values"].as_array().is_some_and(|v| v.len() == 3))
                        .then_some(())
                })
                .await;
                b.refresh().await.map_err(fail("reload"))?;
                wait_attr(b, "[data-chart=temperature]", "data-points", |n| n == "3").await?;
                Ok(())
            })
        },
    )
    .await;
}

/// The actuator codec of the downlink tests: `encodeDownlink` from
/// `{data}` and `decodeDownlink` back.
const ACTUATOR_JS: &str = include_str!("../../crates/engine/codecs/actuator-v3.js");

/// A downlink pushed from the device page: a JSON object goes through the
/// type's `encodeDownlink` and is listed with its status and encoded
/// bytes (pending: the device has sent no uplink yet, so weft knows no
/// route to it); an object the codec refuses shows the codec's own
/// errors next to the form and queues nothing; flushing empties the queue.
#[tokio::test]
async fn a_downlink_is_queued_from_the_device_page() {
    let server = Server::start();
    let c = server.client();
    let actuator = json!({"decoder": {"script": ACTUATOR_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/actuator", Some(&actuator))
        .await;
    let device = json!({"name": "Bell", "type": "actuator", "channel": "farm"});
    c.expect(201, "PUT", "/api/v1/devices/bell-1", Some(&device))
        .await;
    run("a_downlink_is_queued_from_the_device_page", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/device/bell-1").await?;
            wait_text(b, "#downlink-list", |t| t.contains("No downlinks")).await?;
            // The codec refuses an unknown command: its errors by the form.
            b.find(Locator::Css("#dl-format option[value=json]"))
                .await
                .map_err(fail("format"))?
                .click()
                .await
                .map_err(fail("select"))?;
            paste(b, "#dl-payload", r#"{"command": "explode"}"#).await?;
            click(b, "#dl-send").await?;
            wait_text(b, "#dl-error", |t| {
                t.contains("EncodeFailed") && t.contains("unknown command explode")
            })
            .await?;
            // A command it knows is queued, encoded, and listed.
            paste(b, "#dl-payload", r#"{"command": "ring", "duration": 7}"#).await?;
            click(b, "#dl-confirmed").await?;
            click(b, "#dl-send").await?;
            wait_text(b, "#dl-done", |t| t.contains("Queued")).await?;
            wait_text(b, "#downlink-list", |t| t.contains("0107")).await?;
            // Queued, then pending once the delivery worker finds no route.
            wait_text(b, "#downlink-list [data-status]", |t| t == "pending").await?;
            wait_text(b, "#downlink-list", |t| t.contains("route")).await?;
            let (code, listed) = c
                .send("GET", "/api/v1/devices/bell-1/downlinks", None, None)
                .await;
            let queued = &listed["downlinks"];
            if code != 200
                || queued.as_array().map(Vec::len) != Some(1)
                || queued[0]["fPort"] != json!(10)
                || queued[0]["confirmed"] != json!(true)
                || queued[0]["data"] != json!({"command": "ring", "duration": 7})
            {
                return Err(format!("the server holds another queue: {code} {listed}"));
            }
            b.execute(
                "document.getElementById('downlink').scrollIntoView();",
                vec![],
            )
            .await
            .map_err(fail("scroll"))?;
            doc_shot(b, "downlinks").await;
            click(b, "#dl-flush").await?;
            wait_text(b, "#dl-done", |t| t.contains("Flushed 1")).await?;
            let (_, listed) = c
                .send("GET", "/api/v1/devices/bell-1/downlinks", None, None)
                .await;
            let open = listed["downlinks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| matches!(d["status"].as_str(), Some("queued" | "pending")))
                .count();
            if open != 0 {
                return Err(format!("flushing left open downlinks: {listed}"));
            }
            Ok(())
        })
    })
    .await;
}

/// A rule raises an alarm while the alarms screen is open: it appears
/// there live, acking it there acks it on the server, and clearing it
/// clears it.
#[tokio::test]
async fn an_alarm_raised_by_a_rule_is_acked_in_the_console() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let rule = json!({"name": "Hot", "condition": "temperature>30",
                      "alarm": {"type": "hot", "severity": "major",
                                "description": "{{device.id}} at {{temperature}}"}});
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule)).await;
    run("an_alarm_raised_by_a_rule_is_acked_in_the_console", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/alarms").await?;
            wait_text(b, "#alarm-list", |t| t.contains("No alarms")).await?;
            let body = decoded_body("hot-1", "boiler-7", 35, 40, 1_700_000_000_000);
            c.uplink("farm", "decoded", "em300th", &body).await;
            wait_text(b, "#alarm-list", |t| {
                t.contains("boiler-7") && t.contains("hot")
            })
            .await?;
            doc_shot(b, "alarms").await;
            click(b, "#alarm-list button[data-ack]").await?;
            wait_text(b, "#alarm-list", |t| t.contains("acked")).await?;
            let (status, alarms) = c
                .send("GET", "/api/v1/alarms?state=active", None, None)
                .await;
            let acked = alarms
                .as_array()
                .and_then(|a| a.first())
                .map(|a| a["acked"].clone());
            if status != 200 || acked != Some(json!(true)) {
                return Err(format!(
                    "the alarm is not acked on the server: {status} {alarms}"
                ));
            }
            // Cleared, it leaves the list of active alarms.
            click(b, "#alarm-list button[data-clear]").await?;
            wait_text(b, "#alarm-list", |t| t.contains("No alarms")).await?;
            let (_, cleared) = c
                .send("GET", "/api/v1/alarms?state=cleared", None, None)
                .await;
            if cleared.as_array().map(Vec::len) != Some(1) {
                return Err(format!("the alarm is not cleared on the server: {cleared}"));
            }
            Ok(())
        })
    })
    .await;
}

/// The Channels screen lists each channel's subscribers with their
/// backlogs: one that pulled and acknowledged has none, one that did not
/// has every message published since it subscribed.
#[tokio::test]
async fn the_channels_screen_shows_a_subscribers_backlog() {
    let server = Server::start();
    let c = server.client();
    for sub in ["dashboard", "archiver"] {
        let path = format!("/channel/alarm-feed/subscription/polling/{sub}");
        let (status, body) = c.send("PUT", &path, None, None).await;
        assert_eq!(status, 200, "{body}");
    }
    for i in 0..2 {
        let path = format!("/channel/alarm-feed/message/a{i}");
        let (status, body) = c.send("PUT", &path, Some(&json!({"n": i})), None).await;
        assert_eq!(status, 200, "{body}");
    }
    let pull = "/channel/alarm-feed/subscription/polling/dashboard";
    let (_, fetched) = c.send("GET", pull, None, None).await;
    let handle = fetched["ackHandle"]
        .as_str()
        .expect("an ack handle")
        .to_string();
    let ack = format!("{pull}/message?ackHandle={handle}");
    assert_eq!(c.send("DELETE", &ack, None, None).await.0, 204);
    run("the_channels_screen_shows_a_subscribers_backlog", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/channels").await?;
            wait_text(b, "[data-range]", |t| t == "channels 1–1 of 1").await?;
            wait_text(b, "[data-backlog='alarm-feed/archiver']", |t| {
                t.starts_with("2 ")
            })
            .await?;
            wait_text(b, "[data-backlog='alarm-feed/dashboard']", |t| t == "0").await?;
            wait_text(b, "[data-channel-backlog='alarm-feed']", |t| {
                t.starts_with("2 ")
            })
            .await?;
            doc_shot(b, "channels").await;
            Ok(())
        })
    })
    .await;
}

/// Every screen opens and shows what it lists without an error: NGSI
/// entities (found by a `q` query), subscriptions with their status,
/// rules, channels, pages and the overview's figures; a rule the server
/// refuses shows its message by the form.
#[tokio::test]
async fn every_screen_opens_without_errors() {
    let server = Server::start();
    let c = server.client();
    for i in 0..3 {
        let room = json!({"id": format!("Room{i}"), "type": "Room",
                          "temperature": {"type": "Number", "value": 20 + i}});
        let (status, body) = c.send("POST", "/v2/entities", Some(&room), None).await;
        assert_eq!(status, 201, "{body}");
    }
    let sub = json!({"description": "rooms", "subject": {"entities": [{"idPattern": ".*"}]},
                     "notification": {"http": {"url": "http://127.0.0.1:9/nowhere"}}});
    let (status, body) = c.send("POST", "/v2/subscriptions", Some(&sub), None).await;
    assert_eq!(status, 201, "{body}");
    let rule = json!({"condition": "temperature>30", "alarm": {"type": "hot"}});
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule)).await;
    run("every_screen_opens_without_errors", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            wait_text(b, "#ov-alarms", |t| t == "0").await?;
            let screens = [
                ("#/entities?q=temperature%3E20", "NGSI entities", "Room2"),
                ("#/subscriptions", "Subscriptions", "rooms"),
                ("#/subscriptions", "Subscriptions", "live"),
                ("#/rules", "Rules", "temperature>30"),
                ("#/rules/hot", "Rule hot", "temperature>30"),
                ("#/channels", "Channels", "Bridges"),
                ("#/pages", "Pages", "No pages yet"),
                ("#/types", "Device types", "New device type"),
                ("#/devices", "Devices", "No devices yet"),
            ];
            // A rule the server refuses: its message shows by the form.
            open(b, &server, "#/rules/+new").await?;
            type_into(b, "#rule-id", "broken").await?;
            paste(
                b,
                "#rule-json",
                r#"{"condition": "temperature>>", "alarm": {"type": "x"}}"#,
            )
            .await?;
            click(b, "#rule-save").await?;
            wait_text(b, "#rule-form .error", |t| t.starts_with("BadRequest")).await?;
            for (hash, heading, shows) in screens {
                open(b, &server, hash).await?;
                wait_text(b, "h1", |t| t == heading).await?;
                wait_text(b, "main", |t| t.contains(shows)).await?;
                let text = b
                    .find(Locator::Css("main"))
                    .await
                    .map_err(fail("main"))?
                    .text()
                    .await
                    .map_err(fail("text"))?;
                if hash.starts_with("#/entities") && text.contains("Room0") {
                    return Err(format!("q was not applied: {text}"));
                }
                for el in b
                    .find_all(Locator::Css("main .error"))
                    .await
                    .map_err(fail("errors"))?
                {
                    if el.is_displayed().await.map_err(fail("displayed"))? {
                        let why = el.text().await.unwrap_or_default();
                        return Err(format!("{hash} shows an error: {why}"));
                    }
                }
            }
            Ok(())
        })
    })
    .await;
}

/// How many devices the paging case makes.
const MANY: usize = 100_000;

/// Fills weft's stopped database with `MANY` devices in one transaction,
/// as fast as a test can (the HTTP API would take minutes).
fn insert_devices(data: &std::path::Path) {
    let mut db = rusqlite::Connection::open(data.join("weft.db")).expect("weft.db opens");
    let tx = db.transaction().unwrap();
    {
        let mut insert = tx
            .prepare("INSERT INTO devices (id, device_type, channel, json) VALUES (?1, ?2, ?3, ?4)")
            .unwrap();
        for i in 0..MANY {
            let id = format!("dev-{i:06}");
            let json = json!({"id": id, "name": format!("Sensor {i}"), "type": "em300th",
                              "channel": "farm", "records": {}, "static": {}, "subDevices": []});
            insert
                .execute((&id, "em300th", "farm", json.to_string()))
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// 100,000 devices: the list opens on its first page with the total,
/// pages forward and to the end, finds one device by name and opens it.
#[tokio::test]
async fn pages_through_100000_devices() {
    let mut server = Server::start();
    server.client().create_em300th().await;
    assert!(server.terminate(), "weft stops cleanly");
    insert_devices(server.data_dir());
    server.restart();
    run("pages_through_100000_devices", |b| {
        Box::pin(async move {
            sign_in(b, &server).await?;
            open(b, &server, "#/devices").await?;
            wait_text(b, "[data-range]", |t| t == "devices 1–50 of 100000").await?;
            wait_text(b, "main table", |t| {
                t.contains("dev-000000") && t.contains("dev-000049")
            })
            .await?;
            doc_shot(b, "devices").await;
            click(b, "button[data-page=next]").await?;
            wait_text(b, "[data-range]", |t| t == "devices 51–100 of 100000").await?;
            wait_text(b, "main table", |t| t.contains("dev-000050")).await?;
            open(b, &server, "#/devices?offset=99950").await?;
            wait_text(b, "[data-range]", |t| t == "devices 99951–100000 of 100000").await?;
            let next = wait_for(b, "button[data-page=next]").await?;
            if next.attr("disabled").await.map_err(fail("attr"))?.is_none() {
                return Err("Next is enabled on the last page".into());
            }
            type_into(b, "#device-search", "sensor 99999").await?;
            client_submit(b, "#device-search").await?;
            wait_text(b, "[data-range]", |t| t == "devices 1–1 of 1").await?;
            click(b, "a[href='#/device/dev-099999']").await?;
            wait_text(b, "h1", |t| t == "Device dev-099999").await?;
            Ok(())
        })
    })
    .await;
}

/// Submits the form that holds `css` (as Enter would).
async fn client_submit(client: &Client, css: &str) -> Outcome {
    client
        .execute(
            "document.querySelector(arguments[0]).form.requestSubmit();",
            vec![Value::String(css.into())],
        )
        .await
        .map(drop)
        .map_err(fail("submit"))
}
