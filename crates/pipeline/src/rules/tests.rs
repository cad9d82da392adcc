//! The rule engine in process: a temporary SQLite store, the in-process
//! bus, units handed straight to a lane's evaluation step.

use std::sync::Arc;

use serde_json::{json, Value};
use weft_bus::{Bus, InProcessBus};
use weft_model::{DataUnit, DeviceInfo, RuleSpec};
use weft_store::Store;

use super::state::json_size;
use super::*;
use crate::changes::Changes as ContextChanges;

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    engine: Arc<RuleEngine>,
}

async fn setup(limits: StateLimits) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
            path: dir.path().join("weft.db"),
            ..Default::default()
        })
        .unwrap(),
    );
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::default());
    let context = Arc::new(
        Context::load(store.clone(), ContextChanges::new(bus.clone(), ""))
            .await
            .unwrap(),
    );
    let engine = RuleEngine::start(
        store.clone(),
        bus,
        context,
        RulesConfig {
            // Generous: a debug build on a busy machine is slow.
            script_time_limit: Duration::from_secs(2),
            state_limits: limits,
            ..RulesConfig::default()
        },
    )
    .await
    .unwrap();
    Setup {
        _dir: dir,
        store,
        engine,
    }
}

/// A script rule whose `state` keeps every unit's `dataId`, forever.
fn hoarder() -> RuleSpec {
    serde_json::from_value(json!({
        "script": "function evaluate(unit, state) { \
                   state.n = (state.n || 0) + 1; \
                   state.seen = (state.seen || []).concat([unit.dataId]); \
                   return false; }",
        "alarm": {"type": "hoard"}
    }))
    .unwrap()
}

fn unit(seq: u64, device: &str) -> FedUnit {
    FedUnit {
        seq,
        partition: 0,
        unit: Arc::new(DataUnit {
            data_id: format!("unit-{seq:06}"),
            reported_at: seq as i64,
            received_at: seq as i64,
            channel: "c".into(),
            device: DeviceInfo {
                id: device.into(),
                ..DeviceInfo::default()
            },
            measures: serde_json::Map::new(),
        }),
    }
}

/// Evaluates `units` on the script lane, `batch` at a time.
async fn feed(engine: &RuleEngine, units: &[FedUnit], batch: usize) {
    for chunk in units.chunks(batch) {
        engine
            .evaluate(Lane::Scripts, chunk)
            .await
            .expect("the store is open");
    }
}

/// The stored state of (`rule`, `device`), as JSON text.
async fn stored(store: &dyn Store, rule: &str, device: &str) -> Option<String> {
    store
        .load_rule_states()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.rule == rule && s.device == device)
        .and_then(|s| s.json)
}

/// One device's script state never goes past the per-device limit, in
/// memory or in the store: at the limit it starts again from `{}`.
#[tokio::test]
async fn a_devices_state_stays_within_its_limit() {
    let limit = 1024;
    let s = setup(StateLimits {
        per_device: limit,
        total: 1 << 20,
    })
    .await;
    s.engine.put_rule("hoard", hoarder()).await.unwrap();
    let units: Vec<FedUnit> = (1..=400).map(|seq| unit(seq, "d1")).collect();
    feed(&s.engine, &units, 25).await;
    let key = ("hoard".to_string(), "d1".to_string());
    let (script, total) = {
        let inner = s.engine.inner.lock();
        (
            inner.states.get(&key).and_then(|st| st.script.clone()),
            inner.states.script_bytes(),
        )
    };
    let script = script.expect("the script keeps a state");
    assert!(json_size(&script) <= limit, "{}", json_size(&script));
    assert_eq!(total, json_size(&script));
    // Reset along the way: fewer units counted than were fed.
    let n = script["n"].as_u64().unwrap();
    assert!(n < 400, "the state was reset at the limit (n = {n})");
    let json = stored(&*s.store, "hoard", "d1").await.expect("stored");
    assert!(json.len() <= limit + 64, "stored {} bytes", json.len());
    let back: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(back["script"], script, "the store has what memory has");
    s.store.close().await;
}

/// Many devices: the states together stay within the total limit, the
/// devices heard from least recently losing theirs first.
#[tokio::test]
async fn all_states_stay_within_the_total_limit() {
    let total = 8 << 10;
    let s = setup(StateLimits {
        per_device: 1024,
        total,
    })
    .await;
    s.engine.put_rule("hoard", hoarder()).await.unwrap();
    // 40 devices, 30 units each (≈ 500 bytes of state per device, 20 KB
    // in all), one device after the other.
    let mut seq = 0;
    let mut units = Vec::new();
    for d in 0..40 {
        for _ in 0..30 {
            seq += 1;
            units.push(unit(seq, &format!("dev{d:02}")));
        }
    }
    feed(&s.engine, &units, 30).await;
    let (bytes, oldest, newest) = {
        let inner = s.engine.inner.lock();
        let script = |d: &str| {
            inner
                .states
                .get(&("hoard".to_string(), d.to_string()))
                .and_then(|st| st.script.clone())
        };
        (
            inner.states.script_bytes(),
            script("dev00"),
            script("dev39"),
        )
    };
    assert!(bytes <= total, "{bytes} > {total}");
    assert!(bytes > 0);
    assert_eq!(
        oldest, None,
        "the least recently heard device lost its state"
    );
    assert_eq!(newest.unwrap()["n"], 30, "the latest device kept its state");
    // What was dropped is dropped in the store too.
    assert_eq!(stored(&*s.store, "hoard", "dev00").await, None);
    // After a restart, the loaded states are within the limit as well.
    let loaded = s.store.load_rule_states().await.unwrap();
    let sum: usize = loaded
        .iter()
        .filter_map(|st| st.json.as_deref())
        .map(|j| {
            let v: Value = serde_json::from_str(j).unwrap();
            v.get("script").map_or(0, json_size)
        })
        .sum();
    assert!(sum <= total, "{sum} > {total}");
    s.store.close().await;
}

/// Deleting a rule gives back what its states took.
#[tokio::test]
async fn deleting_a_rule_frees_its_states() {
    let s = setup(StateLimits::default()).await;
    s.engine.put_rule("hoard", hoarder()).await.unwrap();
    let units: Vec<FedUnit> = (1..=20).map(|seq| unit(seq, "d1")).collect();
    feed(&s.engine, &units, 10).await;
    assert!(s.engine.inner.lock().states.script_bytes() > 0);
    s.engine.delete_rule("hoard").await.unwrap();
    {
        let inner = s.engine.inner.lock();
        assert_eq!(inner.states.script_bytes(), 0);
        assert!(inner.states.is_empty());
    }
    s.store.close().await;
}
