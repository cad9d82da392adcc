//! Forwarding to context providers: the HTTP half of Orion's
//! registrations. A query or an update that reaches a registration (see
//! [`crate::registrations::Registrations::providers`]) is sent to the
//! provider as NGSIv2 (`POST <url>/op/query`, `POST <url>/op/update`) by a
//! [`Forwarder`], and the answer is read back into entities or an update
//! outcome. Deciding what to forward and merging the answers is
//! [`providers`]'s job; this file only talks to providers.
//!
//! A provider is someone else's server: every request has a deadline
//! ([`Forwarder::timeout`]), an answer is read up to
//! [`MAX_ANSWER_BYTES`], and whatever comes back that is not what NGSIv2
//! promises is a [`ForwardError`], never a panic.

mod providers;

pub use providers::{ForwardedUpdate, Providers, MAX_FORWARDS};

use std::time::Duration;

use serde_json::Value;
use weft_model::ngsi::{parse_entity, Entity};

use crate::outbound::NGSI_USER_AGENT;

/// How long a provider has to answer, as Orion's default `-httpTimeout`
/// (5 s): a slow or dead provider holds the client's request up to this,
/// not longer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The page size NGSIv2 servers use when no `limit` is given: a listing
/// needing more entities than this asks the provider for them.
pub const DEFAULT_PAGE: usize = 20;

/// The largest page NGSIv2 servers give (Orion's maximum `limit`).
pub const MAX_PAGE: usize = 1000;

/// The largest answer read from a provider; a bigger one is refused (8 MiB
/// is far beyond what one forwarded query returns, and bounds memory).
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// The longest chain of forwards weft takes part in: a request whose
/// correlator already carries this many `cbfwd` marks (one per broker it
/// was forwarded through) is not forwarded again. A registration whose
/// provider is weft itself, or two brokers registered with each other,
/// would otherwise forward one request for ever — and a query can reach
/// a provider more than once per hop, so the requests of such a loop
/// multiply with its depth. Federations chain two or three brokers.
pub const MAX_FORWARD_DEPTH: usize = 8;

/// The number of `cbfwd=` marks in `correlator`.
pub fn forward_depth(correlator: &str) -> usize {
    correlator
        .split(';')
        .skip(1)
        .filter(|part| part.trim_start().starts_with("cbfwd="))
        .count()
}

/// What a forwarded request repeats of the request that caused it, as
/// Orion does: the tenant, the service path as received, the caller's
/// `X-Auth-Token` and its correlator.
#[derive(Debug, Clone, Default)]
pub struct ForwardContext {
    /// `Fiware-Service`, when the request had one.
    pub service: Option<String>,
    /// `Fiware-ServicePath` as received, when the request had one (`/`
    /// is sent otherwise).
    pub service_path: Option<String>,
    /// `X-Auth-Token`, when the request had one.
    pub auth_token: Option<String>,
    /// The request's correlator; forwards send `<it>; cbfwd=<n>`.
    pub correlator: String,
}

/// Why a forward gave nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// No answer: refused connection, timeout, bad URL.
    Unreachable(String),
    /// An answer with a status NGSIv2 does not give for success.
    Status(u16),
    /// A successful status with a body that is not what NGSIv2 promises.
    BadAnswer(String),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::Unreachable(why) => write!(f, "provider unreachable: {why}"),
            ForwardError::Status(code) => write!(f, "provider answered {code}"),
            ForwardError::BadAnswer(why) => write!(f, "bad answer from provider: {why}"),
        }
    }
}

impl std::error::Error for ForwardError {}

/// How a provider answered a forwarded update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateAnswer {
    /// 204, NGSIv2's answer to an applied update.
    Applied,
    /// 404 or 422: the provider does not have (all of) it; Orion reports
    /// these attributes as not updated.
    NotFound,
}

/// Sends forwarded requests. weft's one outbound client (and so one
/// connection pool) serves every provider; no redirect is followed.
pub struct Forwarder {
    client: reqwest::Client,
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder whose requests give up after `timeout` (connecting,
    /// sending and reading the answer), on weft's outbound client
    /// ([`crate::outbound::http`]).
    pub fn new(timeout: Duration) -> Forwarder {
        Forwarder {
            client: crate::outbound::http(),
            timeout,
        }
    }

    /// The deadline of every forwarded request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `POST <url>/op/query` with `body`; the entities the provider
    /// returns (normalized NGSIv2). `seq` numbers the forwards of one
    /// request (`cbfwd=<seq>`). `limit`, when given, asks for more than
    /// the provider's default page (`?limit=<n>`).
    pub async fn query(
        &self,
        url: &str,
        context: &ForwardContext,
        seq: usize,
        body: &Value,
        limit: Option<usize>,
    ) -> Result<Vec<Entity>, ForwardError> {
        let operation = match limit {
            Some(n) => format!("/op/query?limit={n}"),
            None => "/op/query".to_string(),
        };
        let (status, answer) = self.post(url, &operation, context, seq, body).await?;
        if !(200..300).contains(&status) {
            return Err(ForwardError::Status(status));
        }
        parse_entities(&answer)
    }

    /// `POST <url>/op/update` with `body` (an `actionType: update`
    /// batch); how the provider took it. As in Orion, only 204 means
    /// applied; any other status is an error.
    pub async fn update(
        &self,
        url: &str,
        context: &ForwardContext,
        seq: usize,
        body: &Value,
    ) -> Result<UpdateAnswer, ForwardError> {
        let (status, _) = self.post(url, "/op/update", context, seq, body).await?;
        match status {
            204 => Ok(UpdateAnswer::Applied),
            404 | 422 => Ok(UpdateAnswer::NotFound),
            other => Err(ForwardError::Status(other)),
        }
    }

    /// Sends one forward; the status and the body (bounded).
    async fn post(
        &self,
        url: &str,
        operation: &str,
        context: &ForwardContext,
        seq: usize,
        body: &Value,
    ) -> Result<(u16, Vec<u8>), ForwardError> {
        if forward_depth(&context.correlator) >= MAX_FORWARD_DEPTH {
            return Err(ForwardError::Unreachable(format!(
                "not forwarded: the request has been forwarded {MAX_FORWARD_DEPTH} times already"
            )));
        }
        let target = format!("{}{operation}", url.trim_end_matches('/'));
        let mut request = self
            .client
            .post(&target)
            .timeout(self.timeout)
            .header("Content-Type", "application/json; charset=utf-8")
            .header("Accept", "application/json")
            .header("User-Agent", NGSI_USER_AGENT)
            .header(
                "Fiware-Correlator",
                format!("{}; cbfwd={seq}", context.correlator),
            );
        if let Some(service) = context.service.as_deref().filter(|s| !s.is_empty()) {
            request = request.header("Fiware-Service", service);
        }
        // Orion always sends a service path: the one received, else `/`.
        let path = context.service_path.as_deref().unwrap_or("/");
        request = request.header("Fiware-ServicePath", path);
        if let Some(token) = &context.auth_token {
            request = request.header("X-Auth-Token", token);
        }
        let response = request
            .body(body.to_string())
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let answer = crate::outbound::read_body(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| match e {
                crate::outbound::BodyError::TooLarge => ForwardError::BadAnswer(e.to_string()),
                crate::outbound::BodyError::Failed(why) => ForwardError::Unreachable(why),
            })?;
        Ok((status, answer))
    }
}

fn unreachable(e: reqwest::Error) -> ForwardError {
    ForwardError::Unreachable(crate::outbound::describe(&e))
}

/// Reads an `op/query` answer: a JSON array of normalized entities, each
/// checked as an entity sent to weft would be.
pub fn parse_entities(answer: &[u8]) -> Result<Vec<Entity>, ForwardError> {
    let value: Value =
        serde_json::from_slice(answer).map_err(|_| ForwardError::BadAnswer("not JSON".into()))?;
    let Value::Array(items) = value else {
        return Err(ForwardError::BadAnswer("not an array of entities".into()));
    };
    items
        .iter()
        .map(|item| parse_entity(item, false).map_err(|e| ForwardError::BadAnswer(e.description)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_arrays_of_entities() {
        let ok = br#"[{"id":"E1","type":"T","A":{"value":1,"type":"Number"}}]"#;
        let entities = parse_entities(ok).unwrap();
        assert_eq!(entities.len(), 1);
        assert_eq!(entities[0].attrs.get("A").unwrap().value, 1);
        assert!(matches!(
            parse_entities(b"{\"id\":\"E1\"}"),
            Err(ForwardError::BadAnswer(_))
        ));
        assert!(matches!(
            parse_entities(b"<html>"),
            Err(ForwardError::BadAnswer(_))
        ));
        assert!(matches!(
            parse_entities(br#"[{"type":"T"}]"#),
            Err(ForwardError::BadAnswer(_))
        ));
        assert_eq!(parse_entities(b"[]").unwrap(), Vec::<Entity>::new());
    }

    /// A request forwarded 8 times is not forwarded again, without a
    /// connection being made.
    #[tokio::test]
    async fn deep_forward_chains_stop() {
        assert_eq!(forward_depth("abc"), 0);
        assert_eq!(forward_depth("abc; cbfwd=1; cbnotif=2; cbfwd=1"), 2);
        let context = ForwardContext {
            correlator: format!("abc{}", "; cbfwd=1".repeat(MAX_FORWARD_DEPTH)),
            ..ForwardContext::default()
        };
        let err = Forwarder::new(Duration::from_secs(2))
            .query(
                "http://192.0.2.1:9/v2",
                &context,
                1,
                &serde_json::json!({}),
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ForwardError::Unreachable(why) if why.contains("forwarded 8 times")),
            "{err}"
        );
    }

    /// A port nobody listens on is an error, not a hang or a panic.
    #[tokio::test]
    async fn a_dead_provider_is_unreachable() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let f = Forwarder::new(Duration::from_secs(2));
        let err = f
            .query(
                &format!("http://127.0.0.1:{port}/v2"),
                &ForwardContext::default(),
                1,
                &serde_json::json!({}),
                None,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ForwardError::Unreachable(_)), "{err}");
    }
}
