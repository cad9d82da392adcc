//! Alarm rules, as configured through `/api/v1/rules`: which data units a
//! rule looks at ([`Scope`]), when it raises an alarm (a Simple Query
//! Language `condition`, a JS `script`, or `inactivity`), how long or how
//! often the condition must hold first (`for`, `repeat`), what clears the
//! alarm, and the alarm it raises ([`AlarmTemplate`]).
//!
//! [`RuleSpec`] is what users send and read back; [`Rule`] is the validated
//! form with its queries parsed and durations read once, so evaluating a
//! rule on every data unit parses nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::alarm::Severity;
use crate::query::Query;
use crate::DataUnit;

/// Which data units (and, for `inactivity`, which devices) a rule watches.
/// Empty lists and an empty `records` object mean "any".
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// Device type names.
    #[serde(default)]
    pub types: Vec<String>,
    /// Channels.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Device ids.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Device record labels that must all be present with these values
    /// (compared as JSON values, so `"1"` and `1` differ).
    #[serde(default)]
    pub records: Map<String, Value>,
}

impl Scope {
    /// Whether a device with this id, type, channel and records is in scope.
    pub fn covers(
        &self,
        device: &str,
        device_type: &str,
        channel: &str,
        records: &Map<String, Value>,
    ) -> bool {
        (self.types.is_empty() || self.types.iter().any(|t| t == device_type))
            && (self.channels.is_empty() || self.channels.iter().any(|c| c == channel))
            && (self.devices.is_empty() || self.devices.iter().any(|d| d == device))
            && self
                .records
                .iter()
                .all(|(k, v)| records.get(k).is_some_and(|r| r == v))
    }

    /// Whether a data unit is in scope.
    pub fn covers_unit(&self, unit: &DataUnit) -> bool {
        self.covers(
            &unit.device.id,
            &unit.device.device_type,
            &unit.channel,
            &unit.device.records,
        )
    }
}

/// The alarm a rule raises. `description` is a template: `{{path}}` is
/// replaced by the value at that dotted path of the triggering data unit
/// (`{{dataId}}`, `{{reportedAt}}`, `{{device.id}}`,
/// `{{measures.temperature.celsius}}`), or by the measure's value for a
/// bare measure name (`{{temperature}}`, read as conditions read it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlarmTemplate {
    /// The alarm type: at most one active alarm per (device, type).
    #[serde(rename = "type")]
    pub alarm_type: String,
    /// Free grouping shown with the alarm.
    #[serde(default)]
    pub category: String,
    /// Free sub-grouping shown with the alarm.
    #[serde(default)]
    pub sub_category: String,
    /// How bad it is.
    #[serde(default)]
    pub severity: Severity,
    /// Text template, see the type's doc.
    #[serde(default)]
    pub description: String,
}

/// A rule as users write it (`PUT /api/v1/rules/{id}`) and read it back.
/// Durations are humantime strings (`"0s"`, `"5s"`, `"10m"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// Human name.
    #[serde(default)]
    pub name: String,
    /// A disabled rule evaluates nothing and raises nothing.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// What the rule watches.
    #[serde(default)]
    pub scope: Scope,
    /// Simple Query Language over the unit's measures: raises when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// A JS rule instead of `condition`: `function evaluate(unit, state)`,
    /// see docs/rules.md for what it may return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// How long the condition must hold (over a device's consecutive units)
    /// before the alarm is raised.
    #[serde(default = "zero", rename = "for")]
    pub hold: String,
    /// How many consecutive units of a device must meet the condition
    /// before the alarm is raised.
    #[serde(default = "one")]
    pub repeat: u32,
    /// Simple Query Language: clears the device's active alarm when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<String>,
    /// Raise when a device in scope sends nothing for this long; its next
    /// data unit clears that alarm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactivity: Option<String>,
    /// The alarm raised.
    pub alarm: AlarmTemplate,
}

fn yes() -> bool {
    true
}

fn zero() -> String {
    "0s".to_string()
}

fn one() -> u32 {
    1
}

impl RuleSpec {
    /// Checks the names and texts of a rule about to be stored as `id`
    /// (its queries, script and durations are checked by [`Rule::new`]):
    /// the id; the name; every scoped type, channel, device and record
    /// label as [`crate::validate`] has them; the alarm's type (not empty),
    /// category and sub-category (names) and description (text). The
    /// refusal names the field.
    pub fn check(&self, id: &str) -> Result<(), crate::validate::Invalid> {
        use crate::validate::{self, Invalid};
        validate::object_id("id", id)?;
        validate::name("name", &self.name)?;
        for (i, t) in self.scope.types.iter().enumerate() {
            validate::device_type_name(&format!("scope.types[{i}]"), t)?;
        }
        for (i, c) in self.scope.channels.iter().enumerate() {
            validate::channel(&format!("scope.channels[{i}]"), c)?;
        }
        for (i, d) in self.scope.devices.iter().enumerate() {
            crate::device::check_device_id(d).map_err(|e| {
                Invalid::new(
                    format!("scope.devices[{i}]"),
                    e.strip_prefix("device id ").unwrap_or(&e).to_string(),
                )
            })?;
        }
        for label in self.scope.records.keys() {
            validate::label("scope.records", label).map_err(|e| {
                Invalid::new(
                    "scope.records",
                    format!("label {}: {}", validate::shown(label), e.problem),
                )
            })?;
        }
        validate::label("alarm.type", &self.alarm.alarm_type)?;
        validate::name("alarm.category", &self.alarm.category)?;
        validate::name("alarm.subCategory", &self.alarm.sub_category)?;
        validate::text("alarm.description", &self.alarm.description)?;
        Ok(())
    }
}

/// A validated rule: the spec as given plus everything evaluation needs,
/// parsed once.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule's id (from the path).
    pub id: String,
    /// As the user gave it (returned by the API unchanged).
    pub spec: RuleSpec,
    /// Parsed `condition`.
    pub condition: Option<Query>,
    /// Parsed `clear`.
    pub clear: Option<Query>,
    /// Parsed `for`.
    pub hold: Duration,
    /// Parsed `inactivity`.
    pub inactivity: Option<Duration>,
}

/// Why a rule was refused; the text is shown to the user with a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// Longest rule id, as for device ids.
pub const MAX_RULE_ID: usize = 256;

impl Rule {
    /// Validates `spec` as rule `id`.
    pub fn new(id: &str, spec: RuleSpec) -> Result<Rule, RuleError> {
        let bad = |m: String| Err(RuleError(m));
        if id.is_empty() || id.len() > MAX_RULE_ID || id.chars().any(|c| c.is_control()) {
            return bad(format!(
                "rule id must be 1 to {MAX_RULE_ID} characters without control characters"
            ));
        }
        if spec.alarm.alarm_type.trim().is_empty() {
            return bad("alarm.type must not be empty".into());
        }
        let parse = |field: &str, q: &Option<String>| -> Result<Option<Query>, RuleError> {
            match q.as_deref().map(str::trim) {
                None => Ok(None),
                Some("") => Err(RuleError(format!("{field} must not be empty"))),
                Some(q) => Query::parse(q)
                    .map(Some)
                    .map_err(|e| RuleError(format!("{field}: {}", e.description()))),
            }
        };
        let condition = parse("condition", &spec.condition)?;
        let clear = parse("clear", &spec.clear)?;
        let script = spec.script.as_deref().map(str::trim);
        if script == Some("") {
            return bad("script must not be empty".into());
        }
        if condition.is_some() && script.is_some() {
            return bad("give either condition or script, not both".into());
        }
        let hold = duration("for", &spec.hold)?;
        let inactivity = match spec.inactivity.as_deref() {
            None => None,
            Some(d) => {
                let d = duration("inactivity", d)?;
                if d.is_zero() {
                    return bad("inactivity must be longer than 0s".into());
                }
                Some(d)
            }
        };
        if inactivity.is_some() && (condition.is_some() || script.is_some()) {
            return bad(
                "an inactivity rule takes no condition or script (make a second rule)".into(),
            );
        }
        if condition.is_none() && script.is_none() && inactivity.is_none() {
            return bad("a rule needs a condition, a script or an inactivity duration".into());
        }
        if spec.repeat == 0 {
            return bad("repeat must be at least 1".into());
        }
        Ok(Rule {
            id: id.to_string(),
            spec,
            condition,
            clear,
            hold,
            inactivity,
        })
    }

    /// Whether the rule looks at data units at all (a pure inactivity rule
    /// only watches the clock).
    pub fn evaluates_units(&self) -> bool {
        self.condition.is_some() || self.spec.script.is_some()
    }
}

/// Reads a humantime duration (`"500ms"`, `"5s"`, `"10m"`, `"1h 30m"`).
fn duration(field: &str, text: &str) -> Result<Duration, RuleError> {
    humantime::parse_duration(text.trim())
        .map_err(|e| RuleError(format!("{field}: '{text}' is not a duration ({e})")))
}

/// Fills a description template from a data unit: `{{path}}` becomes the
/// value at that path of the unit's JSON (strings without quotes), or of
/// its measures read as conditions read them; unknown paths become empty.
pub fn render_description(template: &str, unit: &DataUnit) -> String {
    if !template.contains("{{") {
        return template.to_string();
    }
    let json = serde_json::to_value(unit).unwrap_or(Value::Null);
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let path = after[..end].trim();
        let value = crate::mapping::get_path(&json, path).or_else(|| unit.attribute(path));
        match value {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Null) | None => {}
            Some(v) => out.push_str(&v.to_string()),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> RuleSpec {
        serde_json::from_value(v).unwrap()
    }

    fn unit() -> DataUnit {
        serde_json::from_value(json!({
            "dataId": "d-1", "reportedAt": 1700000000123i64, "receivedAt": 1700000000200i64,
            "channel": "irrigation",
            "device": {"id": "dev-1", "name": "Soil 1", "type": "em300th", "records": {"zone": "a"}},
            "measures": {"temperature": {"celsius": 46.5}, "humidity": {"relativePercentage": 40}}
        }))
        .unwrap()
    }

    /// The spec's example rule is accepted with its defaults.
    #[test]
    fn the_spec_example_validates() {
        let rule = Rule::new(
            "hot-soil",
            spec(json!({"name":"Hot soil","enabled":true,
                "scope":{"types":["em300th"],"channels":[],"devices":[],"records":{}},
                "condition":"temperature>45.1;humidity","for":"0s","repeat":1,
                "clear":"temperature<40","inactivity":null,
                "alarm":{"type":"perfTest","category":"perfTest","subCategory":"alarmPerformance",
                         "severity":"critical","description":"{{dataId}};{{reportedAt}};{{device.id}}"}})),
        )
        .unwrap();
        assert!(rule.condition.is_some() && rule.clear.is_some());
        assert_eq!(rule.hold, Duration::ZERO);
        assert_eq!(rule.spec.alarm.severity, Severity::Critical);
        let u = unit();
        assert!(rule.condition.as_ref().unwrap().matches(|p| u.attribute(p)));
        assert!(rule.spec.scope.covers_unit(&u));
    }

    /// Malformed rules are refused with a message naming the field.
    #[test]
    fn bad_rules_are_refused() {
        let cases = [
            (
                json!({"condition":"temperature>>","alarm":{"type":"t"}}),
                "condition",
            ),
            (
                json!({"condition":"a>1","script":"x","alarm":{"type":"t"}}),
                "either",
            ),
            (
                json!({"condition":"a>1","for":"soon","alarm":{"type":"t"}}),
                "for",
            ),
            (
                json!({"condition":"a>1","repeat":0,"alarm":{"type":"t"}}),
                "repeat",
            ),
            (json!({"alarm":{"type":"t"}}), "needs"),
            (json!({"condition":"a>1","alarm":{"type":""}}), "alarm.type"),
            (
                json!({"inactivity":"0s","alarm":{"type":"t"}}),
                "inactivity",
            ),
            (
                json!({"inactivity":"1m","condition":"a>1","alarm":{"type":"t"}}),
                "inactivity",
            ),
        ];
        for (body, needle) in cases {
            let err = Rule::new("r", spec(body.clone())).unwrap_err();
            assert!(err.0.contains(needle), "{body}: {err}");
        }
        assert!(serde_json::from_value::<RuleSpec>(
            json!({"condition":"a>1","alarm":{"type":"t","severity":"fatal"}})
        )
        .is_err());
    }

    /// Names and texts are checked before a rule is stored, the field named.
    #[test]
    fn names_in_rules_are_checked() {
        let ok = spec(
            json!({"name":"Hot","scope":{"types":["em300th","em300-th"],"channels":["irrigation"],
            "devices":["dev-1"],"records":{"zone":"a"}},"condition":"a>1",
            "alarm":{"type":"hot","description":"line 1\nline 2"}}),
        );
        assert_eq!(ok.check("hot-soil"), Ok(()));
        let cases = [
            (
                "r",
                json!({"scope":{"channels":["bad chan!"]}}),
                "scope.channels[0] 'bad chan!'",
            ),
            (
                "r",
                json!({"scope":{"types":["ok","[]"]}}),
                "scope.types[1] '[]'",
            ),
            (
                "r",
                json!({"scope":{"devices":["a b"]}}),
                "scope.devices[0] 'a b'",
            ),
            (
                "r",
                json!({"scope":{"records":{"":"x"}}}),
                "scope.records label ''",
            ),
            ("r", json!({"name":"a\u{0}"}), "name "),
            ("a b", json!({}), "id 'a b'"),
        ];
        for (id, extra, start) in cases {
            let mut body = json!({"condition":"a>1","alarm":{"type":"t"}});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let e = spec(body.clone()).check(id).unwrap_err().to_string();
            assert!(e.starts_with(start), "{body}: {e}");
        }
        let e = spec(json!({"condition":"a>1","alarm":{"type":"t","category":"c\u{1}"}}))
            .check("r")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("alarm.category "), "{e}");
    }

    /// Templates read unit fields, nested paths and bare measure names.
    #[test]
    fn descriptions_are_filled_from_the_unit() {
        let u = unit();
        assert_eq!(
            render_description("{{dataId}};{{reportedAt}};{{device.id}}", &u),
            "d-1;1700000000123;dev-1"
        );
        assert_eq!(
            render_description(
                "{{ temperature }} °C at {{device.records.zone}}{{nope}}",
                &u
            ),
            "46.5 °C at a"
        );
        assert_eq!(render_description("open {{ end", &u), "open {{ end");
    }

    /// Scope lists and records all have to match.
    #[test]
    fn scope_matches_every_dimension() {
        let u = unit();
        let scope = |v: Value| serde_json::from_value::<Scope>(v).unwrap();
        assert!(scope(json!({})).covers_unit(&u));
        assert!(scope(json!({"records":{"zone":"a"},"channels":["irrigation"]})).covers_unit(&u));
        assert!(!scope(json!({"records":{"zone":"b"}})).covers_unit(&u));
        assert!(!scope(json!({"devices":["dev-2"]})).covers_unit(&u));
        assert!(!scope(json!({"types":["other"]})).covers_unit(&u));
    }
}
