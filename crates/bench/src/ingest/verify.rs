//! The checks after the load: which accepted uplinks reached the live
//! socket, and which reached the store (read back page by page from
//! `GET /api/v1/data`), each exactly once.
//!
//! dataIds are handled as 128-bit integers (they are the uuids the bench
//! generated), so a million-uplink run needs tens of megabytes, not
//! hundreds, and set operations are plain integer hashing.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use serde::Deserialize;
use uuid::Uuid;

use crate::http;
use crate::target::BaseUrl;

/// The largest page `GET /api/v1/data` serves.
const PAGE: usize = 10_000;

/// How long one page may take to arrive.
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How accepted uplinks compare with what was observed somewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Accepted dataIds observed exactly once.
    pub once: u64,
    /// Accepted dataIds never observed.
    pub missing: u64,
    /// Accepted dataIds observed more than once.
    pub repeated: u64,
    /// Observed dataIds that were never accepted (an uplink refused or
    /// timed out that the server processed anyway).
    pub unexpected: u64,
}

/// Compares the accepted dataIds with how often each was observed.
pub fn tally(accepted: &HashSet<u128>, observed: &HashMap<u128, u32>) -> Tally {
    let mut t = Tally::default();
    for id in accepted {
        match observed.get(id).copied().unwrap_or(0) {
            0 => t.missing += 1,
            1 => t.once += 1,
            _ => t.repeated += 1,
        }
    }
    t.unexpected = observed.keys().filter(|id| !accepted.contains(id)).count() as u64;
    t
}

/// Removes from `pending` the ids that have been observed; what remains is
/// still missing. Cheap to repeat while waiting, as `pending` only shrinks.
pub fn retain_missing(pending: &mut Vec<u128>, observed: &HashMap<u128, u32>) {
    pending.retain(|id| !observed.contains_key(id));
}

/// A page of `GET /api/v1/data`, reduced to the dataIds.
#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    units: Vec<UnitHead<'a>>,
    #[serde(default, borrow)]
    next: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct UnitHead<'a> {
    #[serde(rename = "dataId", borrow)]
    data_id: Cow<'a, str>,
}

/// What the store holds for the run's channel.
#[derive(Debug, Default)]
pub struct Stored {
    /// Data units read.
    pub units: u64,
    /// Times each (uuid) dataId was stored.
    pub counts: HashMap<u128, u32>,
    /// Units whose dataId is not a uuid (so not the bench's).
    pub foreign: u64,
}

/// Reads every data unit of `channel`, oldest first, until the last page.
pub async fn read_store(
    base: &BaseUrl,
    channel: &str,
    bar: &ProgressBar,
) -> anyhow::Result<Stored> {
    let mut stored = Stored::default();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!(
            "/api/v1/data?channel={}&limit={PAGE}",
            http::encode_query_value(channel)
        );
        if let Some(cursor) = &after {
            path.push_str("&after=");
            path.push_str(&http::encode_query_value(cursor));
        }
        let response = http::request(base, "GET", &path, &[], None, PAGE_TIMEOUT).await?;
        if response.status != 200 {
            bail!(
                "GET {path} answered {}: {}",
                response.status,
                response.text().trim()
            );
        }
        let page: Page = serde_json::from_slice(&response.body)
            .with_context(|| format!("GET {path}: unexpected body"))?;
        let empty = page.units.is_empty();
        for unit in &page.units {
            stored.units += 1;
            match Uuid::try_parse(&unit.data_id) {
                Ok(id) => *stored.counts.entry(id.as_u128()).or_insert(0) += 1,
                Err(_) => stored.foreign += 1,
            }
        }
        bar.set_message(format!("{} units read from the store", stored.units));
        match page.next {
            Some(next) if !empty => after = Some(next.into_owned()),
            _ => return Ok(stored),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_missing_repeated_and_unexpected() {
        let accepted: HashSet<u128> = [1, 2, 3, 4].into();
        let observed: HashMap<u128, u32> = [(1, 1), (2, 3), (4, 1), (9, 1)].into();
        assert_eq!(
            tally(&accepted, &observed),
            Tally {
                once: 2,
                missing: 1,
                repeated: 1,
                unexpected: 1
            }
        );
        assert_eq!(tally(&HashSet::new(), &HashMap::new()), Tally::default());
    }

    #[test]
    fn pending_shrinks_as_ids_arrive() {
        let mut pending = vec![1, 2, 3];
        retain_missing(&mut pending, &[(2, 1)].into());
        assert_eq!(pending, [1, 3]);
        retain_missing(&mut pending, &[(1, 1), (2, 1), (3, 2)].into());
        assert!(pending.is_empty());
    }

    #[test]
    fn reads_pages_minimally() {
        let body = br#"{"units":[{"dataId":"0e1c6ab8-1111-4222-8333-444455556666","reportedAt":1,"measures":{"t":{"c":1}}}],"next":"42"}"#;
        let page: Page = serde_json::from_slice(body).unwrap();
        assert_eq!(page.units.len(), 1);
        assert_eq!(page.next.as_deref(), Some("42"));
        let page: Page = serde_json::from_slice(br#"{"units":[],"next":null}"#).unwrap();
        assert!(page.units.is_empty() && page.next.is_none());
    }
}
