//! Per channel-name pattern configuration, as DSPS has it: a `regex` over
//! the whole channel name (named groups become `{{.channel.<name>}}` in
//! templates), an optional JWT check every call on such a channel must
//! pass, and outgoing webhooks called for every new message.
//!
//! JWT: `Authorization: Bearer <jwt>`, signed with one of the configured
//! keys for its `alg` (HS* keys are base64, RS*/ES*/PS* keys PEM public
//! keys; a value naming an existing file is read from it), `iss` one of
//! the list, `aud` (if configured) one of the list, `exp`/`nbf` checked
//! with `clock_skew_leeway`, each configured claim equal to its template
//! (or one of a list), and its `jti` not revoked.
//!
//! Webhooks never hold up a publish: a new message's calls are queued in
//! the store with it, in the same transaction ([`WebhookSender`]), and
//! sent by a background task with DSPS's retry policy (count, interval ×
//! multiplier^n ± jitter, each wait at most five minutes), on weft's
//! outbound client (no redirects). A call is forgotten once delivered or
//! given up, so the calls a crash interrupts are sent after the restart
//! (at least once: a call under way at the crash is sent again).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use weft_store::Store;

/// One `[[channels.rules]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelRule {
    /// Matched against the whole channel name.
    pub regex: String,
    /// Callers must present a JWT passing this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtRule>,
    /// Called for every new message.
    #[serde(default)]
    pub webhooks: Vec<WebhookRule>,
}

/// A claim's expected value: one template, or any of several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClaimRule {
    /// Must equal this.
    One(String),
    /// Must equal one of these.
    Any(Vec<String>),
}

/// JWT validation of a channel rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtRule {
    /// Accepted issuers (`iss` must be one).
    pub iss: Vec<String>,
    /// Accepted audiences (one of `aud` must be one); empty: not checked.
    #[serde(default)]
    pub aud: Vec<String>,
    /// Keys by algorithm name (`HS256`, `RS256`, `ES256`, …).
    pub keys: BTreeMap<String, Vec<String>>,
    /// Claims that must have these values (templates).
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimRule>,
    /// Tolerated clock skew for `exp` and `nbf`.
    #[serde(default = "default_leeway", with = "humantime_serde")]
    pub clock_skew_leeway: Duration,
}

fn default_leeway() -> Duration {
    Duration::from_secs(300)
}

/// An outgoing webhook of a channel rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookRule {
    /// HTTP method.
    #[serde(default = "default_method")]
    pub method: String,
    /// URL template (`http://host/room/{{.channel.id}}`).
    pub url: String,
    /// Timeout of one attempt.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Retries after a failed attempt.
    #[serde(default)]
    pub retry: RetryRule,
    /// Extra headers (values are templates).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

fn default_method() -> String {
    "PUT".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

/// DSPS's retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryRule {
    /// Retries (0: none).
    #[serde(default = "default_count")]
    pub count: u32,
    /// First retry interval.
    #[serde(default = "default_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Each further interval is the previous times this.
    #[serde(default = "default_multiplier")]
    pub interval_multiplier: f64,
    /// Random ± added to each interval.
    #[serde(default = "default_jitter", with = "humantime_serde")]
    pub interval_jitter: Duration,
}

fn default_count() -> u32 {
    3
}
fn default_interval() -> Duration {
    Duration::from_secs(3)
}
fn default_multiplier() -> f64 {
    1.5
}
fn default_jitter() -> Duration {
    Duration::from_millis(1500)
}

impl Default for RetryRule {
    fn default() -> Self {
        RetryRule {
            count: default_count(),
            interval: default_interval(),
            interval_multiplier: default_multiplier(),
            interval_jitter: default_jitter(),
        }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(pub String);

struct CompiledJwt {
    rule: JwtRule,
    keys: Vec<(Algorithm, DecodingKey)>,
}

struct Compiled {
    regex: Regex,
    jwt: Option<CompiledJwt>,
    webhooks: Vec<WebhookRule>,
}

/// One webhook call to make, as queued in the store.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Delivery {
    hook: WebhookRule,
    url: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// Queued calls read from the store at a time.
const WEBHOOK_BATCH: usize = 256;

/// Webhook calls in flight at once.
const WEBHOOK_CONCURRENCY: usize = 64;

/// The compiled channel rules, the revoked JWT ids and the webhook sender.
pub struct ChannelRules {
    rules: Vec<Compiled>,
    revoked: parking_lot::RwLock<HashMap<String, i64>>,
    /// Whether any rule has webhooks.
    webhooks: bool,
}

impl ChannelRules {
    /// Compiles `rules` (a bad regex or key is an error naming it).
    pub fn new(rules: &[ChannelRule]) -> Result<ChannelRules, String> {
        let mut compiled = Vec::new();
        for r in rules {
            let regex = Regex::new(&format!("^(?:{})$", r.regex))
                .map_err(|e| format!("channels.rules regex '{}': {e}", r.regex))?;
            let jwt = match &r.jwt {
                None => None,
                Some(j) => Some(
                    compile_jwt(j).map_err(|e| format!("channels.rules '{}' jwt: {e}", r.regex))?,
                ),
            };
            compiled.push(Compiled {
                regex,
                jwt,
                webhooks: r.webhooks.clone(),
            });
        }
        let webhooks = compiled.iter().any(|c| !c.webhooks.is_empty());
        Ok(ChannelRules {
            rules: compiled,
            revoked: parking_lot::RwLock::new(HashMap::new()),
            webhooks,
        })
    }

    /// Whether any rule has webhooks (publishes then keep their content).
    pub fn has_webhooks(&self) -> bool {
        self.webhooks
    }

    /// Marks `jti` revoked until `exp` (epoch seconds).
    pub fn revoke(&self, jti: &str, exp: i64) {
        self.revoked.write().insert(jti.to_string(), exp);
    }

    /// Checks a call on `channel` carrying `authorization` (the header).
    pub fn authorize(&self, channel: &str, authorization: Option<&str>) -> Result<(), Rejected> {
        for rule in &self.rules {
            let (Some(jwt), Some(caps)) = (&rule.jwt, rule.regex.captures(channel)) else {
                continue;
            };
            let token = authorization
                .and_then(|h| {
                    h.strip_prefix("Bearer ")
                        .or_else(|| h.strip_prefix("bearer "))
                })
                .map(str::trim)
                .ok_or_else(|| Rejected("missing bearer token".into()))?;
            let claims = self.verify(jwt, token)?;
            for (name, expected) in &jwt.rule.claims {
                let got = match claims.get(name) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Bool(b)) => b.to_string(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => return Err(Rejected(format!("claim '{name}' missing"))),
                };
                let ok = match expected {
                    ClaimRule::One(t) => fill(t, &rule.regex, &caps) == got,
                    ClaimRule::Any(ts) => ts.iter().any(|t| fill(t, &rule.regex, &caps) == got),
                };
                if !ok {
                    return Err(Rejected(format!("claim '{name}' does not match")));
                }
            }
        }
        Ok(())
    }

    fn verify(
        &self,
        jwt: &CompiledJwt,
        token: &str,
    ) -> Result<serde_json::Map<String, Value>, Rejected> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Rejected(format!("malformed JWT: {e}")))?;
        let mut last = Rejected(format!("no key for alg {:?}", header.alg));
        for (alg, key) in jwt.keys.iter().filter(|(a, _)| *a == header.alg) {
            let mut v = Validation::new(*alg);
            v.set_issuer(&jwt.rule.iss);
            if jwt.rule.aud.is_empty() {
                v.validate_aud = false;
            } else {
                v.set_audience(&jwt.rule.aud);
            }
            v.leeway = jwt.rule.clock_skew_leeway.as_secs();
            v.set_required_spec_claims(&["iss"]);
            v.validate_nbf = true;
            match jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, key, &v) {
                Ok(data) => {
                    if let Some(Value::String(jti)) = data.claims.get("jti") {
                        if self.revoked.read().contains_key(jti) {
                            return Err(Rejected("JWT revoked".into()));
                        }
                    }
                    return Ok(data.claims);
                }
                Err(e) => last = Rejected(format!("JWT rejected: {e}")),
            }
        }
        Err(last)
    }

    /// The webhook calls a new message `message_id` of `channel` owes (the
    /// webhooks of the rules matching the channel), in the form
    /// [`WebhookSender`] reads back, to queue with the message.
    pub fn webhook_calls(&self, channel: &str, message_id: &str, content: &str) -> Vec<String> {
        let mut calls = Vec::new();
        if !self.webhooks {
            return calls;
        }
        for rule in &self.rules {
            if rule.webhooks.is_empty() {
                continue;
            }
            let Some(caps) = rule.regex.captures(channel) else {
                continue;
            };
            let body = format!(
                "{{\"type\":\"dsps.channel.outgoing-webhook\",\"channelID\":{},\"messageID\":{},\"content\":{}}}",
                Value::from(channel),
                Value::from(message_id),
                content
            );
            for hook in &rule.webhooks {
                let delivery = Delivery {
                    url: fill(&hook.url, &rule.regex, &caps),
                    headers: hook
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), fill(v, &rule.regex, &caps)))
                        .collect(),
                    hook: hook.clone(),
                    body: body.clone(),
                };
                calls.push(serde_json::to_string(&delivery).expect("a call serialises"));
            }
        }
        calls
    }
}

/// `{{.channel.<group>}}` → the group's capture.
fn fill(template: &str, regex: &Regex, caps: &regex::Captures<'_>) -> String {
    let mut out = template.to_string();
    for name in regex.capture_names().flatten() {
        let value = caps.name(name).map_or("", |m| m.as_str());
        for pattern in [
            format!("{{{{.channel.{name}}}}}"),
            format!("{{{{ .channel.{name} }}}}"),
        ] {
            out = out.replace(&pattern, value);
        }
    }
    out
}

fn compile_jwt(rule: &JwtRule) -> Result<CompiledJwt, String> {
    if rule.iss.is_empty() {
        return Err("iss must list at least one issuer".into());
    }
    let mut keys = Vec::new();
    for (alg_name, values) in &rule.keys {
        let alg: Algorithm = alg_name
            .parse()
            .map_err(|_| format!("unknown algorithm '{alg_name}'"))?;
        for value in values {
            let material = match std::fs::read_to_string(value) {
                Ok(text) => text,
                Err(_) => value.clone(),
            };
            let key = match alg {
                Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                    DecodingKey::from_base64_secret(material.trim())
                        .map_err(|e| format!("{alg_name} key is not base64: {e}"))?
                }
                Algorithm::ES256 | Algorithm::ES384 => {
                    DecodingKey::from_ec_pem(material.as_bytes())
                        .map_err(|e| format!("{alg_name} key is not a PEM EC public key: {e}"))?
                }
                Algorithm::EdDSA => DecodingKey::from_ed_pem(material.as_bytes())
                    .map_err(|e| format!("{alg_name} key is not a PEM Ed25519 key: {e}"))?,
                _ => DecodingKey::from_rsa_pem(material.as_bytes())
                    .map_err(|e| format!("{alg_name} key is not a PEM RSA public key: {e}"))?,
            };
            keys.push((alg, key));
        }
    }
    Ok(CompiledJwt {
        rule: rule.clone(),
        keys,
    })
}

/// Sends the webhook calls this node queued with new messages, in queue
/// order, at most [`WEBHOOK_CONCURRENCY`] at once, each retried per its
/// policy on weft's outbound client ([`crate::outbound::http`]), and
/// forgets each once delivered or given up. It reads the queue from its
/// start when it starts, so the calls a crash interrupted are sent then.
pub struct WebhookSender {
    store: Arc<dyn Store>,
    node: String,
    wake: Notify,
}

impl WebhookSender {
    /// Starts sending `node`'s queued calls on the current runtime.
    pub fn start(store: Arc<dyn Store>, node: String) -> Arc<WebhookSender> {
        let sender = Arc::new(WebhookSender {
            store,
            node,
            wake: Notify::new(),
        });
        tokio::spawn(sender.clone().run());
        sender
    }

    /// The node whose queued calls it sends.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Calls were queued: look now rather than at the next second.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    async fn run(self: Arc<Self>) {
        let client = crate::outbound::http();
        let permits = Arc::new(Semaphore::new(WEBHOOK_CONCURRENCY));
        let mut after = 0;
        loop {
            let calls = match self
                .store
                .pending_webhook_calls(&self.node, after, WEBHOOK_BATCH)
                .await
            {
                Ok(calls) => calls,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the queued webhook calls failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if calls.is_empty() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            for (seq, text) in calls {
                after = seq;
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (client, me) = (client.clone(), self.clone());
                tokio::spawn(async move {
                    match serde_json::from_str::<Delivery>(&text) {
                        Ok(d) => deliver(&client, &d).await,
                        Err(e) => {
                            tracing::error!(seq, error = %e, "a queued webhook call could not be read; dropped")
                        }
                    }
                    me.finish(seq).await;
                    drop(permit);
                });
            }
        }
    }

    /// Forgets call `seq`, retrying while the store fails.
    async fn finish(&self, seq: u64) {
        let mut wait = Duration::from_millis(100);
        while let Err(e) = self.store.finish_webhook_call(seq).await {
            tracing::warn!(error = %e, "forgetting a finished webhook call failed; retrying");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}

impl RetryRule {
    /// DSPS's policy as weft's [`Backoff`](crate::outbound::Backoff):
    /// `interval` × `interval_multiplier`^n ± `interval_jitter`, each wait
    /// at most [`WEBHOOK_MAX_WAIT`](crate::outbound::WEBHOOK_MAX_WAIT).
    pub fn backoff(&self) -> crate::outbound::Backoff {
        crate::outbound::Backoff {
            initial: self.interval,
            multiplier: self.interval_multiplier,
            max: crate::outbound::WEBHOOK_MAX_WAIT,
            jitter: crate::outbound::Jitter::Absolute(self.interval_jitter),
        }
    }
}

async fn deliver(client: &reqwest::Client, d: &Delivery) {
    let method =
        reqwest::Method::from_bytes(d.hook.method.as_bytes()).unwrap_or(reqwest::Method::PUT);
    let backoff = d.hook.retry.backoff();
    for attempt in 0..=d.hook.retry.count {
        let mut req = client
            .request(method.clone(), &d.url)
            .timeout(d.hook.timeout)
            .header("Content-Type", "application/json")
            .body(d.body.clone());
        for (k, v) in &d.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                metrics::counter!("weft_channel_webhooks_sent_total").increment(1);
                return;
            }
            // DSPS retries server errors and transport failures, not 4xx.
            Ok(r) if r.status().is_client_error() => break,
            _ => {}
        }
        if attempt < d.hook.retry.count {
            tokio::time::sleep(backoff.delay(attempt + 1)).await;
        }
    }
    metrics::counter!("weft_channel_webhooks_failed_total").increment(1);
    tracing::warn!(url = %d.url, "webhook failed after its retries");
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    fn rules(claims: Value) -> ChannelRules {
        let rule: ChannelRule = serde_json::from_value(json!({
            "regex": "room-(?P<id>\\d+)",
            "jwt": {"iss": ["https://issuer"], "aud": ["weft"],
                    "keys": {"HS256": ["c2VjcmV0LWtleS0xMjM0NTY3ODkw"]},
                    "claims": claims}
        }))
        .unwrap();
        ChannelRules::new(&[rule]).unwrap()
    }

    fn token(claims: Value, secret: &[u8]) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    /// A valid token passes; a wrong issuer, audience, key, claim, a
    /// missing token or a revoked jti are refused; other channels are open.
    #[test]
    fn jwt_rules() {
        let r = rules(json!({"room": "{{.channel.id}}"}));
        let secret = b"secret-key-1234567890";
        let exp = weft_model::now_ms() / 1000 + 600;
        let good = token(
            json!({"iss":"https://issuer","aud":"weft","room":"7","exp":exp,"jti":"t1"}),
            secret,
        );
        let auth = format!("Bearer {good}");
        assert_eq!(r.authorize("room-7", Some(&auth)), Ok(()));
        assert!(
            r.authorize("room-8", Some(&auth)).is_err(),
            "claim bound to the channel"
        );
        assert!(r.authorize("room-7", None).is_err());
        assert_eq!(r.authorize("lobby", None), Ok(()));
        for bad in [
            token(
                json!({"iss":"https://other","aud":"weft","room":"7","exp":exp}),
                secret,
            ),
            token(
                json!({"iss":"https://issuer","aud":"else","room":"7","exp":exp}),
                secret,
            ),
            token(
                json!({"iss":"https://issuer","aud":"weft","room":"7","exp":exp}),
                b"another-secret-000000",
            ),
            token(
                json!({"iss":"https://issuer","aud":"weft","room":"7","exp":exp - 3600}),
                secret,
            ),
        ] {
            assert!(r
                .authorize("room-7", Some(&format!("Bearer {bad}")))
                .is_err());
        }
        r.revoke("t1", exp);
        assert_eq!(
            r.authorize("room-7", Some(&auth)),
            Err(Rejected("JWT revoked".into()))
        );
    }

    /// Bad configuration is refused with what is wrong.
    #[test]
    fn bad_rules_are_refused() {
        let bad: ChannelRule = serde_json::from_value(json!({"regex": "("})).unwrap();
        assert!(ChannelRules::new(&[bad]).is_err());
        let bad: ChannelRule = serde_json::from_value(json!({
            "regex": "a", "jwt": {"iss": ["x"], "keys": {"RS256": ["not a pem"]}}}))
        .unwrap();
        let Err(e) = ChannelRules::new(&[bad]) else {
            panic!("a bad key was accepted");
        };
        assert!(e.contains("RS256"), "{e}");
    }
}
