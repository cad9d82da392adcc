//! API keys: what a key is (its role, tenant, service-path prefix, ingest
//! pins, expiry and revocation), how its secret is made and hashed, and
//! the pure checks the HTTP layer asks of it. The keys themselves are
//! kept by the store and cached by the pipeline's key service; nothing
//! here does I/O.
//!
//! A secret is `weft_` followed by 32 random bytes in unpadded base64url
//! (256 bits from the thread-local CSPRNG). Only its SHA-256 is ever
//! stored: a secret that random cannot be guessed from its hash, so the
//! slow, salted hashes passwords need (bcrypt, argon2) would buy nothing
//! and cost every request milliseconds.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What every secret starts with, so a leaked one is recognisable (secret
/// scanners, logs) and a key is told apart from a JWT or a raw ingest key.
pub const SECRET_PREFIX: &str = "weft_";

/// Characters of the secret shown in listings (`weft_` and four more),
/// enough for a person to tell their keys apart, far too few to guess
/// the rest.
pub const SHOWN_PREFIX_LEN: usize = 9;

/// Longest key name accepted.
pub const MAX_NAME_LEN: usize = 100;

/// Shortest secret weft accepts from configuration (`admin_key`): a
/// short one could be guessed despite the hash.
pub const MIN_GIVEN_SECRET_LEN: usize = 24;

/// What a key may do. `Read` < `Write` < `Admin`; `Ingest` stands apart:
/// it may only post uplinks, so a network server's webhook key cannot
/// read or write anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Post uplinks on the ingest paths, nothing else.
    Ingest,
    /// GET/HEAD (and queries sent as POST), the live websocket and SSE.
    Read,
    /// Read, plus writes of data: NGSI entities, subscriptions and
    /// registrations, QuantumLeap notifications, alarm acks, channel
    /// messages.
    Write,
    /// Write, plus definitions (device types, devices, rules, bridges,
    /// pages, channel admin) and the keys themselves.
    Admin,
}

impl Role {
    /// Whether a key of this role may do what `needed` allows.
    pub fn allows(self, needed: Role) -> bool {
        match (self, needed) {
            (Role::Ingest, Role::Ingest) => true,
            (Role::Ingest, _) => false,
            (_, Role::Ingest) => self == Role::Admin,
            (have, need) => have.rank() >= need.rank(),
        }
    }

    fn rank(self) -> u8 {
        match self {
            Role::Ingest => 0,
            Role::Read => 1,
            Role::Write => 2,
            Role::Admin => 3,
        }
    }

    /// The role's name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// A key's own rate limit, overriding the configured default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests per second the key may sustain; 0: unlimited.
    pub rate: f64,
    /// Requests it may send at once after a quiet spell.
    pub burst: u32,
}

/// An API key as stored: everything but the secret, which only its
/// creator ever sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    /// The key's public id, used to list, show and revoke it.
    pub id: String,
    /// SHA-256 of the secret, hex: how a request's key is found.
    pub hash: String,
    /// The first [`SHOWN_PREFIX_LEN`] characters of the secret.
    pub prefix: String,
    /// What the key is for, chosen by its creator.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The tenant (`Fiware-Service`, lower case) it acts on; empty: the
    /// default tenant.
    #[serde(default)]
    pub tenant: String,
    /// Service paths it is limited to (this path and those below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_path: Option<String>,
    /// Ingest keys only: the channel its uplinks must name (or are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Ingest keys only: the device type its uplinks must name (or are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_type: Option<String>,
    /// Its own rate limit; none: the configured default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// When it was created, epoch ms.
    pub created_at: i64,
    /// When it stops working, epoch ms; none: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// When it was revoked, epoch ms; a revoked key never works again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

impl ApiKey {
    /// Whether the key works at `now_ms`: neither revoked nor expired.
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now_ms < at)
    }

    /// Whether the key acts on every tenant: an admin key of the default
    /// tenant without a service-path limit (the bootstrap key is one).
    pub fn is_global(&self) -> bool {
        self.role == Role::Admin && self.tenant.is_empty() && self.service_path.is_none()
    }

    /// The key as the API shows it: no hash, and never the secret.
    pub fn public_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("hash");
        }
        v
    }
}

/// A new secret: [`SECRET_PREFIX`] and 256 random bits in base64url.
pub fn generate_secret() -> String {
    // ThreadRng is a CSPRNG reseeded from the operating system.
    let bytes: [u8; 32] = rand::random();
    let mut s = String::with_capacity(SECRET_PREFIX.len() + 43);
    s.push_str(SECRET_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(bytes, &mut s);
    s
}

/// A new public key id (`key_` and 16 hex digits).
pub fn generate_id() -> String {
    let bytes: [u8; 8] = rand::random();
    format!("key_{}", hex::encode(bytes))
}

/// The SHA-256 of a secret: the form keys are stored and looked up in.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// [`hash_secret`] in hex, as stored.
pub fn hash_secret_hex(secret: &str) -> String {
    hex::encode(hash_secret(secret))
}

/// Parses a stored hex hash back into bytes; `None` if it is not one.
pub fn parse_hash(hex_hash: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_hash, &mut out).ok()?;
    Some(out)
}

/// Normalises a service path given as a key's limit (`/a/b/` → `/a/b`),
/// refusing what `Fiware-ServicePath` would refuse: it must be absolute,
/// have no wildcard and only `[A-Za-z0-9_]` levels.
pub fn normalize_service_path(path: &str) -> Result<String, String> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("servicePath '{path}' must start with '/'"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok("/".into());
    }
    for c in rest.split('/') {
        if c.is_empty()
            || c.len() > 50
            || !c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(format!(
                "servicePath '{path}': each level must be 1-50 of [A-Za-z0-9_]"
            ));
        }
    }
    Ok(format!("/{rest}"))
}

/// Whether the service path `path` (one entry of `Fiware-ServicePath`,
/// possibly `…/#`) lies at or below `prefix` (a normalised key limit).
pub fn path_within(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    let path = path.trim();
    let path = path.strip_suffix('/').unwrap_or(path);
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_long_random_and_hash_to_their_stored_form() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(a.len(), SECRET_PREFIX.len() + 43, "256 bits in base64url");
        assert!(a[5..]
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        let hex = hash_secret_hex(&a);
        assert_eq!(hex.len(), 64);
        assert_eq!(parse_hash(&hex), Some(hash_secret(&a)));
        assert_ne!(hash_secret(&a), hash_secret(&b));
        // SHA-256 of "abc", the FIPS 180-2 test vector.
        assert_eq!(
            hash_secret_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_hash("zz"), None);
    }

    #[test]
    fn roles_allow_their_own_and_lower_ones_and_ingest_stands_apart() {
        use Role::*;
        assert!(Read.allows(Read));
        assert!(!Read.allows(Write));
        assert!(Write.allows(Read) && Write.allows(Write) && !Write.allows(Admin));
        assert!(Admin.allows(Read) && Admin.allows(Write) && Admin.allows(Admin));
        assert!(Ingest.allows(Ingest));
        assert!(!Ingest.allows(Read), "a webhook key reads nothing");
        assert!(!Read.allows(Ingest) && !Write.allows(Ingest));
        assert!(Admin.allows(Ingest));
    }

    fn key(role: Role, tenant: &str, path: Option<&str>) -> ApiKey {
        ApiKey {
            id: "key_1".into(),
            hash: String::new(),
            prefix: "weft_abcd".into(),
            name: "k".into(),
            role,
            tenant: tenant.into(),
            service_path: path.map(str::to_string),
            channel: None,
            device_type: None,
            rate_limit: None,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn liveness_and_global_scope() {
        let mut k = key(Role::Admin, "", None);
        assert!(k.is_global());
        assert!(k.is_live(5));
        k.expires_at = Some(10);
        assert!(k.is_live(9) && !k.is_live(10));
        k.expires_at = None;
        k.revoked_at = Some(1);
        assert!(!k.is_live(0));
        assert!(!key(Role::Admin, "t", None).is_global());
        assert!(!key(Role::Admin, "", Some("/a")).is_global());
        assert!(!key(Role::Write, "", None).is_global());
        let shown = key(Role::Read, "", None).public_json();
        assert!(shown.get("hash").is_none());
        assert_eq!(shown["role"], "read");
    }

    #[test]
    fn service_path_limits() {
        assert_eq!(normalize_service_path("/a/b/").unwrap(), "/a/b");
        assert_eq!(normalize_service_path("/").unwrap(), "/");
        assert!(normalize_service_path("a").is_err());
        assert!(normalize_service_path("/a/#").is_err());
        assert!(normalize_service_path("/a//b").is_err());
        assert!(path_within("/a", "/a"));
        assert!(path_within("/a", "/a/b"));
        assert!(path_within("/a", "/a/#"));
        assert!(path_within("/a", " /a/b/ "));
        assert!(!path_within("/a", "/ab"));
        assert!(!path_within("/a", "/#"));
        assert!(!path_within("/a", "/"));
        assert!(path_within("/", "/anything"));
    }
}
