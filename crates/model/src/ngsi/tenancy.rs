//! Orion's rules for tenant names (`Fiware-Service`) and service paths
//! (`Fiware-ServicePath`), with its texts: the API checks its headers
//! with them, and `/admin/metrics` files requests under them.

use super::NgsiError;

/// Longest tenant name Orion accepts.
const MAX_TENANT_LEN: usize = 50;
/// Most service paths a read may list.
const MAX_SERVICE_PATHS: usize = 10;
/// Most levels one service path may have.
const MAX_COMPONENTS: usize = 10;
/// Longest level name.
const MAX_COMPONENT_LEN: usize = 50;

/// Orion's text for a tenant name with other characters than letters,
/// digits and `_`.
pub const BAD_TENANT_CHAR: &str =
    "bad character in tenant name - only underscore and alphanumeric characters are allowed";

/// Orion's text for a service path with a character it does not take.
pub const ILLEGAL_CHAR: &str = "a component of ServicePath contains an illegal character";

/// Validates a tenant name and returns it lowercased.
pub fn check_tenant(name: &str) -> Result<String, NgsiError> {
    if name.len() > MAX_TENANT_LEN {
        return Err(NgsiError::bad_request(
            "bad length - a tenant name can be max 50 characters long",
        ));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(NgsiError::bad_request(BAD_TENANT_CHAR));
    }
    Ok(name.to_ascii_lowercase())
}

/// Parses a `Fiware-ServicePath` value into normalized paths (no trailing
/// `/` except for the root).
pub fn parse_service_paths(raw: &str) -> Result<Vec<String>, NgsiError> {
    let paths: Vec<&str> = raw.split(',').map(str::trim).collect();
    if paths.len() > MAX_SERVICE_PATHS {
        return Err(NgsiError::bad_request(
            "too many service paths - a maximum of ten service paths is allowed",
        ));
    }
    paths.into_iter().map(parse_one).collect()
}

fn parse_one(path: &str) -> Result<String, NgsiError> {
    if path.is_empty() {
        return Ok("/".to_string());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(NgsiError::bad_request(
            "Only /absolute/ Service Paths allowed [a service path must begin with /]",
        ));
    };
    if rest.is_empty() {
        return Ok("/".to_string());
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let components: Vec<&str> = rest.split('/').collect();
    if components.len() > MAX_COMPONENTS {
        return Err(NgsiError::bad_request("too many components in ServicePath"));
    }
    let last = components.len() - 1;
    for (i, c) in components.iter().enumerate() {
        if c.is_empty() {
            return Err(NgsiError::bad_request("empty component in ServicePath"));
        }
        if c.len() > MAX_COMPONENT_LEN {
            return Err(NgsiError::bad_request(
                "component-name too long in ServicePath",
            ));
        }
        let wildcard = i == last && *c == "#";
        if !wildcard && !c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(NgsiError::bad_request(ILLEGAL_CHAR));
        }
    }
    Ok(format!("/{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_paths_follow_orions_rules() {
        assert_eq!(parse_service_paths("/a/b/").unwrap(), ["/a/b"]);
        assert_eq!(parse_service_paths("/a, /b/#").unwrap(), ["/a", "/b/#"]);
        assert_eq!(parse_service_paths("/").unwrap(), ["/"]);
        let err = |s: &str| parse_service_paths(s).unwrap_err().description;
        assert_eq!(err("//a"), "empty component in ServicePath");
        assert_eq!(err("/a/b//"), "empty component in ServicePath");
        assert_eq!(
            err("/test.2"),
            "a component of ServicePath contains an illegal character"
        );
        assert!(err("a").starts_with("Only /absolute/"));
    }

    #[test]
    fn tenant_names() {
        assert_eq!(check_tenant("Tenant_1").unwrap(), "tenant_1");
        assert!(check_tenant("a-b").is_err());
        assert!(check_tenant(&"x".repeat(51)).is_err());
    }
}
