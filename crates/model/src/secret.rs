//! Secrets users keep in stored definitions — custom notification
//! headers (where docs/security.md tells them to put a receiver's key),
//! passwords in URLs — and how they are shown to callers who may read the
//! definition but not its secrets: every role but admin sees [`MASK`] in
//! their place.

use serde_json::Value;
use url::Url;

/// What a masked secret reads as.
pub const MASK: &str = "********";

/// `url` with the password of its user information masked; anything
/// that is not a URL with a password comes back as it is.
pub fn mask_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // A URL with a password has an authority, so this holds.
            let _ = parsed.set_password(Some(MASK));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

/// Masks the secrets of an NGSI subscription as rendered (Orion's JSON):
/// the values of `httpCustom.headers` and the passwords of every
/// notification URL.
pub fn mask_subscription(subscription: &mut Value) {
    let Some(notification) = subscription
        .get_mut("notification")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for endpoint in ["http", "httpCustom", "mqtt", "mqttCustom"] {
        let Some(endpoint) = notification
            .get_mut(endpoint)
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        if let Some(Value::String(url)) = endpoint.get_mut("url") {
            *url = mask_url(url);
        }
        if let Some(Value::Object(headers)) = endpoint.get_mut("headers") {
            for value in headers.values_mut() {
                *value = Value::String(MASK.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn url_passwords_are_masked_and_nothing_else() {
        assert_eq!(
            mask_url("https://bob:s3cret@example.com/x?a=1"),
            "https://bob:********@example.com/x?a=1"
        );
        assert_eq!(mask_url("https://example.com/x"), "https://example.com/x");
        assert_eq!(mask_url("not a url"), "not a url");
    }

    #[test]
    fn custom_headers_and_url_passwords_of_a_subscription_are_masked() {
        let mut sub = json!({"id": "s1", "notification": {
            "httpCustom": {"url": "http://u:p@h/n", "headers": {"X-Auth-Token": "weft_abc"}},
            "attrs": ["temperature"],
        }});
        mask_subscription(&mut sub);
        assert_eq!(
            sub["notification"]["httpCustom"]["headers"]["X-Auth-Token"],
            MASK
        );
        assert_eq!(
            sub["notification"]["httpCustom"]["url"],
            "http://u:********@h/n"
        );
        assert_eq!(sub["notification"]["attrs"][0], "temperature");
    }
}
