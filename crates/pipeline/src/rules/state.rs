//! What rules remember per device ([`RuleState`]), held in memory, and
//! its bounds.
//!
//! Most of a rule's state for a device is a few numbers (`repeat` counts,
//! the start of a `for` run, inactivity's last-seen time). What can grow is
//! a script rule's `state` object, which the script fills as it likes (a
//! window of past values, say). Two limits hold it:
//!
//! - **per device** ([`StateLimits::per_device`], `[rules]
//!   max_state_bytes`): a script whose `state` for one device comes back
//!   larger than this (as JSON) has that state reset to `{}`; the unit's
//!   result still counts, a warning names the rule and the device, and
//!   `weft_rule_state_resets_total` counts it. A script keeping a window
//!   trims it itself (`state.values = state.values.slice(-100)`).
//! - **in total** ([`StateLimits::total`], `[rules] max_total_state_bytes`):
//!   when the `state` objects of all rules and devices together grow past
//!   this, the least recently changed are dropped (reset to `{}`) until
//!   they take at most nine tenths of it, each counted in
//!   `weft_rule_states_evicted_total`, with one warning per pass.
//!
//! `weft_rule_state_bytes` is what the `state` objects take now. The
//! other fields of the state are kept whatever the limits.

use std::collections::HashMap;

use serde_json::Value;

use super::verdict::RuleState;

/// (rule id, device id).
pub type Key = (String, String);

/// The bounds of script rules' `state` objects, in bytes of JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Largest `state` of one rule for one device.
    pub per_device: usize,
    /// Largest sum of every rule's `state` for every device.
    pub total: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            per_device: 64 << 10,
            total: 64 << 20,
        }
    }
}

/// One (rule, device)'s state and what its script part takes.
#[derive(Debug, Default)]
struct Held {
    state: RuleState,
    /// Size of `state.script` as JSON (0 without one).
    script_bytes: usize,
    /// When `state.script` was last set (a counter).
    touched: u64,
}

/// Every (rule, device)'s state.
#[derive(Debug, Default)]
pub struct States {
    map: HashMap<Key, Held>,
    /// Sum of the `script_bytes`.
    script_bytes: usize,
    /// Counter behind `Held::touched`.
    tick: u64,
}

impl States {
    /// States as loaded from the store.
    pub fn from_loaded(loaded: HashMap<Key, RuleState>) -> States {
        let mut states = States::default();
        for (key, mut state) in loaded {
            let script = state.script.take();
            states.map.insert(
                key.clone(),
                Held {
                    state,
                    ..Held::default()
                },
            );
            if let Some(script) = script {
                let bytes = json_size(&script);
                states.set_script(&key, Some(script), bytes);
            }
        }
        states.publish();
        states
    }

    /// The state of `key`, if any.
    pub fn get(&self, key: &Key) -> Option<&RuleState> {
        self.map.get(key).map(|h| &h.state)
    }

    /// The state of `key`, created empty if there is none. Its `script`
    /// is changed only through [`States::set_script`].
    pub fn state_mut(&mut self, key: &Key) -> &mut RuleState {
        &mut self.map.entry(key.clone()).or_default().state
    }

    /// Every state, for changes other than the `script`.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Key, &mut RuleState)> {
        self.map.iter_mut().map(|(k, h)| (k, &mut h.state))
    }

    /// Sets the script `state` of `key` (`bytes`: its size as JSON); an
    /// empty object is no state (the script gets `{}` either way).
    pub fn set_script(&mut self, key: &Key, script: Option<Value>, bytes: usize) {
        let script = script.filter(|s| !matches!(s, Value::Object(o) if o.is_empty()));
        let bytes = if script.is_some() { bytes } else { 0 };
        self.tick += 1;
        let held = self.map.entry(key.clone()).or_default();
        self.script_bytes = self.script_bytes - held.script_bytes + bytes;
        held.script_bytes = bytes;
        held.touched = self.tick;
        held.state.script = script;
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &Key) {
        if let Some(held) = self.map.remove(key) {
            self.script_bytes -= held.script_bytes;
        }
    }

    /// Keeps only the states of the rules `keep` says yes to.
    pub fn retain_rules(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut dropped = 0;
        self.map.retain(|(rule, _), held| {
            let kept = keep(rule);
            if !kept {
                dropped += held.script_bytes;
            }
            kept
        });
        self.script_bytes -= dropped;
        self.publish();
    }

    /// What the script `state` objects take now, in bytes of JSON.
    pub fn script_bytes(&self) -> usize {
        self.script_bytes
    }

    /// (Rule, device) pairs held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no pair is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops the least recently changed script states until they take at
    /// most nine tenths of `limit`, if they take more than `limit`;
    /// answers the pairs whose state was dropped (to store).
    pub fn enforce_total(&mut self, limit: usize) -> Vec<Key> {
        if self.script_bytes <= limit {
            self.publish();
            return Vec::new();
        }
        let target = limit / 10 * 9;
        let mut by_age: Vec<(u64, &Key)> = self
            .map
            .iter()
            .filter(|(_, h)| h.script_bytes > 0)
            .map(|(k, h)| (h.touched, k))
            .collect();
        by_age.sort_unstable();
        let mut freed = 0;
        let mut evicted = Vec::new();
        for (_, key) in by_age {
            if self.script_bytes - freed <= target {
                break;
            }
            freed += self.map[key].script_bytes;
            evicted.push(key.clone());
        }
        for key in &evicted {
            let held = self.map.get_mut(key).expect("listed above");
            self.script_bytes -= held.script_bytes;
            held.script_bytes = 0;
            held.state.script = None;
        }
        metrics::counter!("weft_rule_states_evicted_total").increment(evicted.len() as u64);
        tracing::warn!(
            evicted = evicted.len(),
            limit,
            left = self.script_bytes,
            "rule state over [rules] max_total_state_bytes: the least recently changed script states were reset to {{}}"
        );
        self.publish();
        evicted
    }

    /// Publishes `weft_rule_state_bytes`.
    fn publish(&self) {
        metrics::gauge!("weft_rule_state_bytes").set(self.script_bytes as f64);
    }
}

/// The size of `value` as compact JSON, without building the text.
pub fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(rule: &str, device: &str) -> Key {
        (rule.to_string(), device.to_string())
    }

    fn set(states: &mut States, k: &Key, v: Value) {
        let bytes = json_size(&v);
        states.set_script(k, Some(v), bytes);
    }

    #[test]
    fn sizes_are_json_lengths() {
        for v in [
            json!({}),
            json!({"a": [1, 2, "x"]}),
            json!("é"),
            json!(null),
        ] {
            assert_eq!(json_size(&v), serde_json::to_string(&v).unwrap().len());
        }
    }

    /// The total follows every way a state changes or goes.
    #[test]
    fn the_total_is_kept() {
        let mut s = States::default();
        let a = key("r", "a");
        let b = key("r2", "b");
        set(&mut s, &a, json!({"v": [1, 2, 3]}));
        set(&mut s, &b, json!({"w": "xyz"}));
        let expected = json_size(&json!({"v": [1, 2, 3]})) + json_size(&json!({"w": "xyz"}));
        assert_eq!(s.script_bytes(), expected);
        set(&mut s, &a, json!({}));
        assert_eq!(
            s.get(&a).unwrap().script,
            None,
            "an empty object is no state"
        );
        assert_eq!(s.script_bytes(), json_size(&json!({"w": "xyz"})));
        s.state_mut(&a).matches = 2;
        s.retain_rules(|r| r != "r2");
        assert_eq!(s.script_bytes(), 0);
        assert_eq!(s.len(), 1);
        set(&mut s, &a, json!([1]));
        s.remove(&a);
        assert_eq!((s.script_bytes(), s.len()), (0, 0));
        let loaded = HashMap::from([(
            b.clone(),
            RuleState {
                script: Some(json!({"w": "xyz"})),
                ..RuleState::default()
            },
        )]);
        let s = States::from_loaded(loaded);
        assert_eq!(s.script_bytes(), json_size(&json!({"w": "xyz"})));
    }

    /// Past the total, the least recently changed go first, down to nine
    /// tenths of the limit; the other fields stay.
    #[test]
    fn the_oldest_go_first() {
        let mut s = States::default();
        let value = json!({"pad": "x".repeat(90)}); // 100 bytes
        assert_eq!(json_size(&value), 100);
        for d in 0..10 {
            let k = key("r", &format!("d{d}"));
            s.state_mut(&k).matches = 1;
            set(&mut s, &k, value.clone());
        }
        // Device 0 changed last: it is the newest.
        set(&mut s, &key("r", "d0"), value.clone());
        assert!(
            s.enforce_total(1000).is_empty(),
            "at the limit is within it"
        );
        let evicted = s.enforce_total(500);
        assert_eq!(s.script_bytes(), 400, "down to 9/10 of 500 = 450");
        let names: Vec<&str> = evicted.iter().map(|k| k.1.as_str()).collect();
        assert_eq!(names, ["d1", "d2", "d3", "d4", "d5", "d6"]);
        assert!(s.get(&key("r", "d0")).unwrap().script.is_some());
        assert_eq!(s.get(&key("r", "d1")).unwrap().script, None);
        assert_eq!(s.get(&key("r", "d1")).unwrap().matches, 1, "the rest stays");
    }
}
