//! The pure part of the rule engine: what one rule's outcome on one data
//! unit does to that rule's state for the device, and whether it raises,
//! updates or clears the device's alarm. No I/O and no clock here, so
//! `for`, `repeat` and `clear` are tested by plain unit tests.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use weft_model::alarm::Severity;
use weft_model::Rule;

/// What a rule said about one data unit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// The condition held (or the script returned `true`).
    pub fire: bool,
    /// The clear condition held (or the script asked to clear).
    pub clear: bool,
    /// A script's severity for this firing, overriding the rule's.
    pub severity: Option<Severity>,
    /// A script's description for this firing, overriding the template.
    pub description: Option<String>,
}

impl Verdict {
    /// Reads what `evaluate(unit, state)` returned: `true` fires; `false`,
    /// `null` or nothing does nothing; `"clear"` clears; an object may say
    /// `{"raise": bool, "clear": bool, "severity": "…", "description": "…"}`.
    pub fn from_script(returned: &Value) -> Verdict {
        match returned {
            Value::Bool(b) => Verdict {
                fire: *b,
                ..Verdict::default()
            },
            Value::String(s) if s == "clear" => Verdict {
                clear: true,
                ..Verdict::default()
            },
            Value::Object(o) => Verdict {
                fire: o.get("raise").and_then(Value::as_bool).unwrap_or(false),
                clear: o.get("clear").and_then(Value::as_bool).unwrap_or(false),
                severity: o
                    .get("severity")
                    .and_then(Value::as_str)
                    .and_then(Severity::parse),
                description: o
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
            _ => Verdict::default(),
        }
    }
}

/// What a rule remembers about one device between data units. Stored
/// (as JSON) with the alarms of the same evaluation step, so it survives
/// restarts exactly as far as the alarms it led to.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleState {
    /// Consecutive units meeting the condition (capped at `repeat`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub matches: u32,
    /// `reportedAt` of the first unit of the current run of matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    /// Inactivity rules: when the device was last heard from (`receivedAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<i64>,
    /// Inactivity rules: the device's name, for the alarm.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Inactivity rules: an alarm was raised for the current silence.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alarmed: bool,
    /// Inactivity rules: the pipeline partition the device was last heard
    /// through; only the node holding it watches the device's silence.
    #[serde(default, skip_serializing_if = "is_zero_u16")]
    pub partition: u16,
    /// Script rules: the `state` object the script keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Value>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u16(n: &u16) -> bool {
    *n == 0
}

impl RuleState {
    /// Whether there is nothing worth storing.
    pub fn is_empty(&self) -> bool {
        *self == RuleState::default()
    }
}

/// What to do with the device's alarm after a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Raise it, or update the active one.
    Fire,
    /// Clear the active one, if any.
    Clear,
}

/// Whether a rule needs per-device state at all: a plain threshold
/// (`repeat` 1, `for` 0s, no script) decides from each unit alone, and
/// then nothing is stored per unit.
pub fn is_stateless(rule: &Rule) -> bool {
    rule.spec.repeat <= 1 && rule.hold.is_zero() && rule.spec.script.is_none()
}

/// Applies `verdict` on a unit reported at `reported_at` to `state`:
/// a firing counts towards `repeat` and starts or continues the `for`
/// run; anything else resets both. Fires once both are satisfied (and on
/// every further firing unit, which updates the alarm).
pub fn step(rule: &Rule, state: &mut RuleState, verdict: &Verdict, reported_at: i64) -> Action {
    if verdict.fire {
        state.matches = (state.matches + 1).min(rule.spec.repeat);
        if !rule.hold.is_zero() {
            state.since.get_or_insert(reported_at);
        }
        let held = match state.since {
            Some(since) => reported_at.saturating_sub(since) >= rule.hold.as_millis() as i64,
            None => true,
        };
        if state.matches >= rule.spec.repeat && held {
            return Action::Fire;
        }
        return Action::None;
    }
    state.matches = 0;
    state.since = None;
    if verdict.clear {
        Action::Clear
    } else {
        Action::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_model::RuleSpec;

    fn rule(extra: Value) -> Rule {
        let mut spec = json!({"condition": "t>1", "alarm": {"type": "hot"}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        Rule::new("r", serde_json::from_value::<RuleSpec>(spec).unwrap()).unwrap()
    }

    fn fire() -> Verdict {
        Verdict {
            fire: true,
            ..Verdict::default()
        }
    }

    /// `repeat: 3` fires on the third consecutive match, and a miss starts over.
    #[test]
    fn repeat_counts_consecutive_matches() {
        let r = rule(json!({"repeat": 3}));
        let mut s = RuleState::default();
        assert_eq!(step(&r, &mut s, &fire(), 0), Action::None);
        assert_eq!(step(&r, &mut s, &fire(), 1), Action::None);
        assert_eq!(step(&r, &mut s, &Verdict::default(), 2), Action::None);
        assert_eq!(step(&r, &mut s, &fire(), 3), Action::None);
        assert_eq!(step(&r, &mut s, &fire(), 4), Action::None);
        assert_eq!(step(&r, &mut s, &fire(), 5), Action::Fire);
        assert_eq!(step(&r, &mut s, &fire(), 6), Action::Fire);
        assert_eq!(s.matches, 3, "capped, so the state stops changing");
    }

    /// `for: 5s` fires only once the run of matches spans 5 s of reports.
    #[test]
    fn for_needs_the_condition_held_that_long() {
        let r = rule(json!({"for": "5s"}));
        let mut s = RuleState::default();
        for t in [0, 1000, 4999] {
            assert_eq!(step(&r, &mut s, &fire(), t), Action::None, "at {t}");
        }
        assert_eq!(step(&r, &mut s, &fire(), 5000), Action::Fire);
        assert_eq!(step(&r, &mut s, &Verdict::default(), 6000), Action::None);
        assert_eq!(s.since, None);
        assert_eq!(step(&r, &mut s, &fire(), 7000), Action::None);
    }

    /// A clear verdict on a non-firing unit clears; plain thresholds are stateless.
    #[test]
    fn clear_and_stateless() {
        let r = rule(json!({}));
        assert!(is_stateless(&r));
        assert!(!is_stateless(&rule(json!({"repeat": 2}))));
        let mut s = RuleState::default();
        assert_eq!(step(&r, &mut s, &fire(), 0), Action::Fire);
        let clear = Verdict {
            clear: true,
            ..Verdict::default()
        };
        assert_eq!(step(&r, &mut s, &clear, 1), Action::Clear);
        assert!(s.is_empty());
    }

    /// Script results of every documented shape.
    #[test]
    fn script_results() {
        assert!(Verdict::from_script(&json!(true)).fire);
        assert_eq!(Verdict::from_script(&json!(null)), Verdict::default());
        assert_eq!(Verdict::from_script(&json!(3)), Verdict::default());
        assert!(Verdict::from_script(&json!("clear")).clear);
        let v =
            Verdict::from_script(&json!({"raise": true, "severity": "major", "description": "x"}));
        assert!(v.fire && !v.clear);
        assert_eq!(v.severity, Some(Severity::Major));
        assert_eq!(v.description.as_deref(), Some("x"));
    }
}
