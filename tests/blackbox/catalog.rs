//! Device types and devices: CRUD, filters, and the enrichment of data
//! units with device records; unknown devices are registered on first sight.

use std::time::Duration;

use serde_json::json;

use crate::util::*;

/// Types and devices can be created, listed, filtered, replaced and deleted.
#[tokio::test]
async fn device_types_and_devices_crud() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    c.expect(
        200,
        "PUT",
        "/api/v1/device-types/em300th",
        Some(&em300th_type()),
    )
    .await;
    let list = c.expect(200, "GET", "/api/v1/device-types", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], "em300th");
    assert_eq!(list[0]["entityType"], "TemperatureSensor");
    assert_eq!(
        c.send(
            "PUT",
            "/api/v1/device-types/x",
            Some(&json!({"decoder": 5})),
            Some(KEY)
        )
        .await
        .0,
        400
    );

    let dev = json!({"name":"P1","type":"em300th","channel":"irrigation","records":{"Project":"perf"},
                     "static":{"location":{"lat":41.15,"lon":-8.61}}});
    let created = c
        .expect(201, "PUT", "/api/v1/devices/dev-1", Some(&dev))
        .await;
    assert_eq!(created["id"], "dev-1");
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/dev-2",
        Some(&json!({"name":"P2","type":"other","records":{"Project":"x"}})),
    )
    .await;
    let by_record = c
        .expect(200, "GET", "/api/v1/devices?record.Project=perf", None)
        .await;
    assert_eq!(by_record.as_array().unwrap().len(), 1);
    assert_eq!(by_record[0]["id"], "dev-1");
    let by_type = c
        .expect(200, "GET", "/api/v1/devices?type=other", None)
        .await;
    assert_eq!(by_type[0]["id"], "dev-2");
    assert_eq!(
        c.expect(200, "GET", "/api/v1/devices/dev-1", None).await["records"],
        json!({"Project":"perf"})
    );

    c.expect(204, "DELETE", "/api/v1/devices/dev-2", None).await;
    c.expect(404, "GET", "/api/v1/devices/dev-2", None).await;
    c.expect(404, "DELETE", "/api/v1/devices/dev-2", None).await;
    c.expect(204, "DELETE", "/api/v1/device-types/em300th", None)
        .await;
    c.expect(404, "GET", "/api/v1/device-types/em300th", None)
        .await;
}

/// A registered device's records and static data ride on every unit; a
/// device never seen before is registered by its first uplink.
#[tokio::test]
async fn units_carry_device_records_and_unknown_devices_are_registered() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    c.expect(201, "PUT", "/api/v1/devices/known",
        Some(&json!({"name":"K","type":"em300th","records":{"Project":"perf"},"static":{"location":{"lat":1.5,"lon":2.5}}}))).await;
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("k1", "known", 20, 30, now_ms()),
    )
    .await;
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("n1", "newcomer", 20, 30, now_ms()),
    )
    .await;

    let k = c.unit_eventually("k1").await;
    assert_eq!(k["device"]["records"], json!({"Project":"perf"}));
    assert_eq!(
        k["device"]["static"],
        json!({"location":{"lat":1.5,"lon":2.5}})
    );
    let n = eventually(Duration::from_secs(10), || async {
        let (s, v) = c.send("GET", "/api/v1/devices/newcomer", None, None).await;
        (s == 200).then_some(v)
    })
    .await;
    assert_eq!(n["type"], "em300th");
    assert_eq!(n["channel"], "irrigation");
    assert_eq!(n["name"], "P00010");
}

/// The example type file the README's walkthrough uploads embeds the
/// shipped codec and the seed's mappings.
#[test]
fn the_readme_example_type_embeds_the_shipped_codec() {
    let file = em300th_type();
    assert_eq!(file["decoder"]["script"], EM300TH_JS);
    assert_eq!(
        file["processor"]["mappings"][0],
        json!({"from":"temperature","to":"temperature.celsius"})
    );
    assert_eq!(file["processor"]["mappings"].as_array().unwrap().len(), 6);
}
