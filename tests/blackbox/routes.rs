//! The route table: every route of every listener, as the binary's own
//! routers declare it (`weft routes`), is the table of docs/security.md
//! row for row, and every route answers each kind of caller — no key, a
//! read, write or admin key, another tenant's admin key, an ingest key, a
//! revoked key — as its declaration says: refused by the guard (401/403)
//! or let through to its handler (whatever the handler then answers).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::Server;

/// The rows of `weft routes`: (listener, method, path, who may call).
fn declared_routes() -> BTreeSet<Row> {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .arg("routes")
        .output()
        .expect("weft routes runs");
    assert!(out.status.success(), "weft routes failed");
    rows(&String::from_utf8(out.stdout).expect("UTF-8"))
}

/// One row of the route table.
type Row = (String, String, String, String);

/// The rows of every markdown table in `text` whose header is the route
/// table's (`| listener | method | path | who may call |`).
fn rows(text: &str) -> BTreeSet<Row> {
    let mut rows = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line == "| listener | method | path | who may call |" {
            inside = true;
            continue;
        }
        if !inside || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        if !line.starts_with('|') || cells.len() != 4 {
            inside = false;
            continue;
        }
        rows.insert((
            cells[0].to_string(),
            cells[1].to_string(),
            cells[2].to_string(),
            cells[3].to_string(),
        ));
    }
    rows
}

/// The kinds of caller every route is tried with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    NoKey,
    Read,
    Write,
    Admin,
    OtherTenantAdmin,
    Ingest,
    Revoked,
}

const CALLERS: [Caller; 7] = [
    Caller::NoKey,
    Caller::Read,
    Caller::Write,
    Caller::Admin,
    Caller::OtherTenantAdmin,
    Caller::Ingest,
    Caller::Revoked,
];

/// What the guard answers `caller` on a route declared `access`: `None`
/// lets the request through to the handler.
fn expected(access: &str, caller: Caller) -> Option<u16> {
    use Caller::*;
    if access == "open" {
        return None;
    }
    if access == "ingest" {
        return match caller {
            Admin | Ingest => None,
            NoKey | Revoked => Some(401),
            Read | Write | OtherTenantAdmin => Some(403),
        };
    }
    let (role, scope) = access.split_once(' ').expect("role and scope");
    let rank = |r: &str| match r {
        "read" => 1,
        "write" => 2,
        "admin" => 3,
        other => panic!("unknown role {other}"),
    };
    match caller {
        NoKey | Revoked => Some(401),
        Ingest => Some(403),
        Read if rank(role) > 1 => Some(403),
        Write if rank(role) > 2 => Some(403),
        Read | Write | Admin => None,
        // It names the default tenant (`Fiware-Service` and
        // `NGSILD-Tenant` empty), which is
        // not its own: only the surfaces that hold each request to the
        // key themselves let it in.
        OtherTenantAdmin => match scope {
            "keys" | "live" => None,
            "own" | "ngsi" | "quantumleap" | "ngsi-ld" => Some(403),
            other => panic!("unknown scope {other}"),
        },
    }
}

/// `path` with its parameters filled in; the fallback's `*` becomes a
/// path no route has.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            if seg == "*" {
                "no-such-route".to_string()
            } else if seg.starts_with("{*") {
                "p1/p2".to_string()
            } else if seg.starts_with('{') {
                "x1".to_string()
            } else {
                seg.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether an answer is the guard's refusal (`expected` 401/403) rather
/// than whatever the handler made of the probe.
fn is_guard_refusal(status: u16, body: &Value) -> bool {
    let text = body["description"].as_str().unwrap_or_default();
    match status {
        401 => true,
        403 => {
            text.starts_with("this API key")
                || text.starts_with("this ingest key")
                || text.contains("may not post uplinks")
        }
        _ => false,
    }
}

/// Every declared route is in docs/security.md's table and every row of
/// the table is a declared route: the documented roles are the ones the
/// code enforces, and a new route cannot land undocumented.
#[test]
fn the_route_table_is_documented_row_for_row() {
    let declared = declared_routes();
    assert!(declared.len() > 80, "only {} routes", declared.len());
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/security.md"
    ))
    .expect("docs/security.md");
    let documented = rows(&doc);
    let undocumented: Vec<_> = declared.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&declared).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "routes declared but not in docs/security.md: {undocumented:#?}\n\
         rows of docs/security.md no route declares: {stale:#?}\n\
         (`weft routes` prints the table)"
    );
}

/// Each route of each listener, tried by every kind of caller, is
/// refused or let through exactly as its declaration says.
#[tokio::test]
async fn every_route_answers_each_caller_as_declared() {
    // A burst enough for every probe of one key.
    let (server, ql_url) =
        Server::start_with_quantumleap_listener(&[("WEFT_HTTP__RATE_BURST", "100000")]).await;
    let admin = server.client();
    let mut secrets = Vec::new();
    for caller in CALLERS {
        let spec = match caller {
            Caller::NoKey | Caller::Admin => None,
            Caller::Read => Some(json!({"name": "r", "role": "read"})),
            Caller::Write => Some(json!({"name": "w", "role": "write"})),
            Caller::OtherTenantAdmin => {
                Some(json!({"name": "o", "role": "admin", "tenant": "othertenant"}))
            }
            Caller::Ingest => Some(json!({"name": "i", "role": "ingest"})),
            Caller::Revoked => Some(json!({"name": "x", "role": "admin"})),
        };
        let secret = match (caller, spec) {
            (Caller::Admin, _) => Some(crate::util::ADMIN_KEY.to_string()),
            (_, Some(spec)) => {
                let made = admin.expect(201, "POST", "/api/v1/keys", Some(&spec)).await;
                if caller == Caller::Revoked {
                    let id = made["id"].as_str().unwrap();
                    admin
                        .expect(204, "DELETE", &format!("/api/v1/keys/{id}"), None)
                        .await;
                }
                Some(made["key"].as_str().unwrap().to_string())
            }
            (_, None) => None,
        };
        secrets.push((caller, secret));
    }

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut wrong = Vec::new();
    let mut tried = 0;
    for (listener, method, path, access) in declared_routes() {
        let base = match listener.as_str() {
            "main" => server.url.clone(),
            "quantumleap" => ql_url.clone(),
            other => panic!("unknown listener {other}"),
        };
        let method = if method == "*" {
            "GET"
        } else {
            method.as_str()
        };
        let url = format!("{base}{}", concrete(&path));
        for (caller, secret) in &secrets {
            let mut req = http.request(method.parse().unwrap(), &url);
            if let Some(secret) = secret {
                // Ingest reads `Authorization`; every other surface takes
                // it too.
                req = req.header("Authorization", format!("Bearer {secret}"));
            }
            if *caller == Caller::OtherTenantAdmin {
                req = req.header("Fiware-Service", "").header("NGSILD-Tenant", "");
            }
            if method != "GET" && method != "DELETE" {
                req = req.header("Content-Type", "application/json").body("{}");
            }
            let resp = req.send().await.expect("request sent");
            let status = resp.status().as_u16();
            // Streams (SSE) are let through and never end: only the
            // head is read.
            let body: Value = if resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
            {
                Value::Null
            } else {
                serde_json::from_slice(&resp.bytes().await.unwrap_or_default())
                    .unwrap_or(Value::Null)
            };
            tried += 1;
            let refused = is_guard_refusal(status, &body);
            let ok = match expected(&access, *caller) {
                None => !refused,
                Some(want) => refused && status == want,
            };
            if !ok {
                wrong.push(format!(
                    "{listener} {method} {path} ({access}) as {caller:?}: {status} {body}"
                ));
            }
        }
    }
    assert!(tried > 500, "only {tried} requests");
    assert!(
        wrong.is_empty(),
        "{} answers differ from the declarations:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
