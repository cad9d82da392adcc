//! Creating the run's subscriptions before the load and deleting them
//! after it, so a long-lived server is left as it was found.
//!
//! Subscription `i` watches entity `Room<i mod E>` with Orion's defaults:
//! no condition attributes (it fires on every actual change of the
//! entity), every attribute notified (`attrs: []`), `normalized` format.

use serde_json::json;

use super::owed::watched_entity;
use crate::common::Session;
use crate::http::render_request;
use crate::ngsi_update::payload::{entity_id, ENTITY_TYPE};
use crate::ngsi_update::{batch, SETUP_PARALLEL};
use crate::progress;

/// The path subscriptions are created under, and their ids listed after.
const SUBSCRIPTIONS: &str = "/v2/subscriptions";

/// The `description` of every bench subscription, so a leftover one (a run
/// killed midway) is recognisable on a long-lived server.
const DESCRIPTION: &str = "weft bench ngsi-notify";

/// The creation body of a subscription to `entity` notifying `url`.
pub fn body(entity: usize, url: &str) -> Vec<u8> {
    json!({
        "description": DESCRIPTION,
        "subject": {"entities": [{"id": entity_id(entity), "type": ENTITY_TYPE}]},
        "notification": {"http": {"url": url}, "attrs": []},
    })
    .to_string()
    .into_bytes()
}

/// The subscription id in a `Location` header: what follows
/// `/v2/subscriptions/` (Orion sends the path; a full URL or a proxy's
/// prefix is accepted too).
pub fn id_from_location(location: &str) -> Option<&str> {
    let marker = "/v2/subscriptions/";
    let start = location.rfind(marker)? + marker.len();
    let id = &location[start..];
    (!id.is_empty() && !id.contains(['/', '?', '#'])).then_some(id)
}

/// Creates `count` subscriptions in `tenant`, subscription `i` watching
/// entity `i mod entities`, all notifying `url`. Returns the ids created
/// (by subscription index, as far as creation got) and whether every one
/// was: on error the caller still deletes those created.
pub async fn create(
    session: &Session,
    tenant: &str,
    count: usize,
    entities: usize,
    url: &str,
) -> (Vec<String>, anyhow::Result<()>) {
    let base = &session.base;
    let target = base.path(SUBSCRIPTIONS);
    let headers = [("Fiware-Service", tenant)];
    let requests: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            let body = body(watched_entity(i, entities), url);
            render_request("POST", &target, &base.host, &headers, Some(&body))
        })
        .collect();
    let bar = progress::spinner(session.show_progress, "subscribe");
    bar.set_message(format!("{count} subscriptions"));
    let results = batch::exchange_all(&base.connect, requests, SETUP_PARALLEL, &bar).await;
    bar.finish_and_clear();
    let mut ids = Vec::with_capacity(count);
    let mut first_error = None;
    for (i, result) in results.into_iter().enumerate() {
        let outcome = match result {
            Ok(r) if r.status == 201 => match r.location.as_deref().and_then(id_from_location) {
                Some(id) => Ok(id.to_string()),
                None => Err(format!(
                    "201 without a usable Location header ({:?})",
                    r.location
                )),
            },
            Ok(r) if matches!(r.status, 404 | 405 | 501) => Err(format!(
                "answered {} (does this server support subscriptions?): {}",
                r.status,
                r.text().trim()
            )),
            Ok(r) => Err(format!("answered {}: {}", r.status, r.text().trim())),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(id) => ids.push(id),
            Err(why) => {
                first_error.get_or_insert_with(|| {
                    format!("creating subscription {i}: POST {target} {why}")
                });
            }
        }
    }
    match first_error {
        Some(e) => (ids, Err(anyhow::anyhow!(e))),
        None => (ids, Ok(())),
    }
}

/// What deleting the subscriptions gave.
#[derive(Debug, Default)]
pub struct Deleted {
    /// Subscriptions deleted (204).
    pub ok: u64,
    /// Subscriptions whose DELETE was answered otherwise, or not at all.
    pub failed: u64,
    /// Why the first failure failed.
    pub first_error: Option<String>,
}

/// Deletes the subscriptions `ids` of `tenant` (`DELETE
/// /v2/subscriptions/{id}`, 204 each).
pub async fn delete(session: &Session, tenant: &str, ids: &[String]) -> Deleted {
    let mut d = Deleted::default();
    if ids.is_empty() {
        return d;
    }
    let base = &session.base;
    let headers = [("Fiware-Service", tenant)];
    let targets: Vec<String> = ids
        .iter()
        .map(|id| base.path(&format!("{SUBSCRIPTIONS}/{id}")))
        .collect();
    let requests: Vec<Vec<u8>> = targets
        .iter()
        .map(|target| render_request("DELETE", target, &base.host, &headers, None))
        .collect();
    let bar = progress::spinner(session.show_progress, "unsub");
    bar.set_message(format!("deleting {} subscriptions", ids.len()));
    let results = batch::exchange_all(&base.connect, requests, SETUP_PARALLEL, &bar).await;
    bar.finish_and_clear();
    for (target, result) in targets.iter().zip(results) {
        let why = match result {
            Ok(r) if r.status == 204 => {
                d.ok += 1;
                continue;
            }
            Ok(r) => format!("answered {}: {}", r.status, r.text().trim()),
            Err(e) => e,
        };
        d.failed += 1;
        d.first_error
            .get_or_insert_with(|| format!("DELETE {target} {why}"));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_orion_subscriptions() {
        let v: serde_json::Value =
            serde_json::from_slice(&body(7, "http://127.0.0.1:9/notify")).unwrap();
        assert_eq!(
            v,
            json!({
                "description": "weft bench ngsi-notify",
                "subject": {"entities": [{"id": "Room7", "type": "Room"}]},
                "notification": {"http": {"url": "http://127.0.0.1:9/notify"}, "attrs": []},
            })
        );
    }

    #[test]
    fn reads_ids_from_location() {
        assert_eq!(
            id_from_location("/v2/subscriptions/5f0e1c6ab811114222833344"),
            Some("5f0e1c6ab811114222833344")
        );
        assert_eq!(
            id_from_location("http://h:1/weft/v2/subscriptions/abc"),
            Some("abc")
        );
        assert_eq!(id_from_location("/v2/subscriptions/"), None);
        assert_eq!(id_from_location("/v2/subscriptions/a/b"), None);
        assert_eq!(id_from_location("/v2/entities/Room1"), None);
    }
}
