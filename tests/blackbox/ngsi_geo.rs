//! NGSIv2 locations, geo-queries and `POST /v2/op/query`, seen from a
//! client: what Orion's clients rely on (which entities a query returns,
//! in which order, and Orion's exact 400 answers to bad input).

use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::util::*;

/// Creates an entity, expecting 201.
async fn create(c: &Client, entity: Value) {
    let (status, _, body) = call(c, "POST", "/v2/entities", &[], Some(&entity)).await;
    assert_eq!(status, 201, "{entity}: {body}");
}

/// `GET path`, expecting 200: the ids listed, in order.
async fn list_ids(c: &Client, path: &str) -> Vec<String> {
    let (status, _, body) = call(c, "GET", path, &[], None).await;
    assert_eq!(status, 200, "{path}: {body}");
    ids(&body)
}

/// The ids of a listing, in order.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("a JSON array: {list}"))
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// A `geo:json` point at (lat, lon).
fn point(id: &str, lat: f64, lon: f64) -> Value {
    json!({"id": id, "type": "Place",
           "location": {"type": "geo:json", "value": {"type": "Point", "coordinates": [lon, lat]}}})
}

mod geojson {
    use super::*;

    /// A `Feature` and a `FeatureCollection` of one `Feature` are
    /// locations: stored and rendered exactly as sent, found by the
    /// geometry they carry.
    #[tokio::test]
    async fn features_are_locations_rendered_as_given() {
        let server = Server::start();
        let c = server.client();
        let feature = json!({"type": "Feature", "properties": {"name": "Sol"},
            "geometry": {"type": "Point", "coordinates": [-3.7038, 40.4168]}});
        let collection = json!({"type": "FeatureCollection", "features": [
            {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon",
             "coordinates": [[[-3.70, 40.41], [-3.69, 40.41], [-3.69, 40.42], [-3.70, 40.42], [-3.70, 40.41]]]}}]});
        create(
            &c,
            json!({"id": "F", "type": "Place", "location": {"type": "geo:json", "value": feature}}),
        )
        .await;
        create(&c, json!({"id": "FC", "type": "Place", "location": {"type": "geo:json", "value": collection}})).await;
        create(&c, point("Far", 41.38, 2.17)).await;

        let (status, _, got) = call(&c, "GET", "/v2/entities/F?options=keyValues", &[], None).await;
        assert_eq!(status, 200);
        assert_eq!(got["location"], feature);
        let (_, _, got) = call(&c, "GET", "/v2/entities/FC/attrs/location/value", &[], None).await;
        assert_eq!(got, collection);

        // Sol is 150 m from the square's corner, 500 km from Barcelona.
        let near =
            "/v2/entities?georel=near;maxDistance:2000&geometry=point&coords=40.4168,-3.7038";
        assert_eq!(list_ids(&c, near).await, ["F", "FC"]);
        let inside = "/v2/entities?georel=intersects&geometry=point&coords=40.415,-3.695";
        assert_eq!(list_ids(&c, inside).await, ["FC"]);
        let covered = "/v2/entities?georel=coveredBy&geometry=box&coords=40,-4;41,-3";
        assert_eq!(list_ids(&c, covered).await, ["F", "FC"]);
    }

    /// Bad location values get Orion's status, error name and text, and
    /// nothing is created or changed.
    #[tokio::test]
    async fn bad_locations_get_orions_texts_and_change_nothing() {
        let server = Server::start();
        let c = server.client();
        let p = "error parsing location attribute: ";
        let feature =
            json!({"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}});
        let cases = [
            (
                "geo:json",
                json!({"type": "FeatureCollection", "features": [feature, feature]}),
                format!("{p}features in FeatureCollection has more than 1 item"),
            ),
            (
                "geo:json",
                json!({"type": "FeatureCollection", "features": []}),
                format!("{p}features in FeatureCollection has 0 items"),
            ),
            (
                "geo:json",
                json!({"type": "Feature", "properties": {}}),
                format!("{p}geometry in Feature not found"),
            ),
            (
                "geo:json",
                json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}),
                "Wrong GeoJson".to_string(),
            ),
            (
                "geo:json",
                json!({"type": "Point", "coordinates": [200, 0]}),
                "Wrong GeoJson".to_string(),
            ),
            (
                "geo:json",
                json!("40, -3"),
                "geo:json needs an object or null as value".to_string(),
            ),
            (
                "geo:point",
                json!("91, 0"),
                format!("{p}geo coordinates format error [see Orion user manual]: 91, 0"),
            ),
            (
                "geo:line",
                json!(["1, 2"]),
                format!("{p}geo:line uses at least 2 coordinates"),
            ),
            (
                "geo:box",
                json!(["1, 2", "3, 4", "5, 6"]),
                format!("{p}geo:box uses exactly 2 coordinates"),
            ),
            (
                "geo:box",
                json!(["1, 2", "1, 4"]),
                format!("{p}geo:box coordinates are not defining an actual box"),
            ),
            (
                "geo:polygon",
                json!(["0, 0", "0, 1", "1, 1"]),
                format!("{p}geo:polygon uses at least 4 coordinates"),
            ),
            (
                "geo:polygon",
                json!(["0, 0", "0, 1", "1, 1", "1, 0"]),
                format!("{p}geo:polygon first and last coordinates must match"),
            ),
            (
                "geo:polygon",
                json!("0, 0"),
                format!("{p}geo:line, geo:box and geo:polygon needs array of strings as value"),
            ),
        ];
        for (attr_type, value, text) in cases {
            let e = json!({"id": "E", "type": "T", "loc": {"type": attr_type, "value": value}});
            let (status, _, body) = call(&c, "POST", "/v2/entities", &[], Some(&e)).await;
            assert_eq!(status, 400, "{e}");
            assert_eq!(
                body,
                json!({"error": "BadRequest", "description": text}),
                "{e}"
            );
        }
        assert_eq!(list_ids(&c, "/v2/entities").await, Vec::<String>::new());

        // An update with a bad location leaves the old one in place.
        create(
            &c,
            json!({"id": "E", "type": "T", "loc": {"type": "geo:point", "value": "1, 2"}}),
        )
        .await;
        let bad = json!({"loc": {"type": "geo:point", "value": "1, 200"}});
        let (status, _, body) = call(&c, "PATCH", "/v2/entities/E/attrs", &[], Some(&bad)).await;
        assert_eq!(status, 400);
        assert_eq!(
            body["description"],
            format!("{p}geo coordinates format error [see Orion user manual]: 1, 200")
        );
        let (_, _, got) = call(&c, "GET", "/v2/entities/E/attrs/loc/value", &[], None).await;
        assert_eq!(got, json!("1, 2"));
        let found = "/v2/entities?georel=intersects&geometry=point&coords=1,2";
        assert_eq!(list_ids(&c, found).await, ["E"]);
    }

    /// `near` measures to the nearest point of a line, not to its
    /// vertices; matches keep creation order unless
    /// `orderBy=geo:distance` asks for nearest first.
    #[tokio::test]
    async fn near_measures_to_the_nearest_point_and_keeps_creation_order() {
        let server = Server::start();
        let c = server.client();
        // A road along lat 40.5 from lon -4 to -3: its vertices are 40 km
        // from the query point (40.49, -3.5), the road itself about 1.1 km.
        create(
            &c,
            json!({"id": "Road", "type": "Road", "location": {"type": "geo:json",
            "value": {"type": "LineString", "coordinates": [[-4.0, 40.5], [-3.0, 40.5]]}}}),
        )
        .await;
        create(&c, point("Five", 40.535, -3.5)).await;
        create(&c, point("Here", 40.49, -3.5)).await;
        let q = |rel: &str, extra: &str| {
            format!("/v2/entities?georel={rel}&geometry=point&coords=40.49,-3.5{extra}")
        };
        assert_eq!(
            list_ids(&c, &q("near;maxDistance:2000", "")).await,
            ["Road", "Here"]
        );
        assert_eq!(
            list_ids(&c, &q("near;maxDistance:6000", "&orderBy=geo:distance")).await,
            ["Here", "Road", "Five"]
        );
        assert_eq!(
            list_ids(&c, &q("near;maxDistance:6000", "")).await,
            ["Road", "Five", "Here"]
        );
        assert_eq!(
            list_ids(&c, &q("near;minDistance:2000", "")).await,
            ["Five"]
        );
        assert_eq!(
            list_ids(
                &c,
                &q(
                    "near;maxDistance:6000",
                    "&orderBy=geo:distance&limit=1&offset=1"
                )
            )
            .await,
            ["Road"]
        );
    }

    /// Query edges are great circles, as in Orion's database: the box
    /// lat 30..40, lon -10..10 reaches lat 40.43 at lon 0.
    #[tokio::test]
    async fn box_edges_are_great_circles() {
        let server = Server::start();
        let c = server.client();
        create(&c, point("North", 40.2, 0.0)).await;
        create(&c, point("Beyond", 40.6, 0.0)).await;
        let covered = "/v2/entities?georel=coveredBy&geometry=box&coords=30,-10;40,10";
        assert_eq!(list_ids(&c, covered).await, ["North"]);
        let disjoint = "/v2/entities?georel=disjoint&geometry=box&coords=30,-10;40,10";
        assert_eq!(list_ids(&c, disjoint).await, ["Beyond"]);
    }

    /// `ignoreType` makes a geo attribute plain data: not validated, not
    /// counted against the one-location rule, not queried; so does a null
    /// value.
    #[tokio::test]
    async fn ignore_type_makes_a_location_plain_data() {
        let server = Server::start();
        let c = server.client();
        create(
            &c,
            json!({"id": "E", "type": "T",
            "location": {"type": "geo:point", "value": "10, 10"},
            "seen": {"type": "geo:json", "value": {"type": "Point", "coordinates": [500, 0]},
                     "metadata": {"ignoreType": {"type": "Boolean", "value": true}}}}),
        )
        .await;
        let at =
            |coords: &str| format!("/v2/entities?georel=intersects&geometry=point&coords={coords}");
        assert_eq!(list_ids(&c, &at("10,10")).await, ["E"]);
        let second = json!({"id": "F", "type": "T",
            "a": {"type": "geo:point", "value": "1, 1"}, "b": {"type": "geo:point", "value": "2, 2"}});
        let (status, _, body) = call(&c, "POST", "/v2/entities", &[], Some(&second)).await;
        assert_eq!(status, 413);
        assert_eq!(body["error"], "NoResourcesAvailable");
        // A null location is no location: it neither counts nor matches.
        create(
            &c,
            json!({"id": "G", "type": "T",
            "a": {"type": "geo:point", "value": "3, 3"}, "b": {"type": "geo:json", "value": null}}),
        )
        .await;
        assert_eq!(list_ids(&c, &at("3,3")).await, ["G"]);
    }

    /// Geo-query parameters get Orion's texts, checked in Orion's order;
    /// `geometry` and `coords` without `georel` are accepted and filter
    /// nothing.
    #[tokio::test]
    async fn geo_query_errors_and_georel_less_queries() {
        let server = Server::start();
        let c = server.client();
        create(&c, point("A", 5.0, 5.0)).await;
        let cases = [
            (
                "georel=intersects&geometry=polygon&coords=0,0;0,1;1,1;1,0",
                "Invalid query: First and last point in polygon not the same",
            ),
            (
                "georel=intersects&geometry=polygon&coords=0,0;0,1;0,0",
                "Invalid query: Too few coordinates for polygon",
            ),
            (
                "georel=near;maxDistance:10&geometry=polygon&coords=x",
                "Invalid query: georel /near/ used with geometry different than point",
            ),
            (
                "georel=coveredBy&geometry=box&coords=1,2;1,8",
                "Invalid query: box coordinates are not defining an actual box",
            ),
            (
                "georel=near;maxDistance:10&geometry=point&coords=100,0",
                "Invalid query: invalid coordinates",
            ),
            (
                "geometry=point",
                "Invalid query: URI param /geometry/ used without /coords/",
            ),
            (
                "georel=&geometry=point&coords=1,2",
                "Empty right-hand-side for URI param /georel/",
            ),
            ("q=", "Empty right-hand-side for URI param /q/"),
        ];
        for (params, text) in cases {
            let (status, _, body) =
                call(&c, "GET", &format!("/v2/entities?{params}"), &[], None).await;
            assert_eq!(status, 400, "{params}");
            assert_eq!(
                body,
                json!({"error": "BadRequest", "description": text}),
                "{params}"
            );
        }
        assert_eq!(
            list_ids(&c, "/v2/entities?geometry=point&coords=50,50").await,
            ["A"]
        );
    }
}

mod subscription_geo {
    use super::*;

    /// A subscription's geo `expression` follows the same rules as
    /// op/query's: all three fields or none, Orion's `expression` texts.
    #[tokio::test]
    async fn geo_expression_texts() {
        let server = Server::start();
        let c = server.client();
        let sub = |expression: Value| {
            json!({"subject": {"entities": [{"idPattern": ".*"}], "condition": {"attrs": [], "expression": expression}},
                   "notification": {"http": {"url": "http://127.0.0.1:9/notify"}}})
        };
        let cases = [
            (
                json!({"georel": "near;maxDistance:5", "geometry": "point"}),
                "partial geo expression: geometry, georel and coords have to be provided together",
            ),
            (
                json!({"georel": "coveredBy", "geometry": "polygon", "coords": "0,0;0,1;1,1;1,0"}),
                "error parsing geo-query fields: First and last point in polygon not the same",
            ),
        ];
        for (expression, text) in cases {
            let body = sub(expression);
            let (status, _, got) = call(&c, "POST", "/v2/subscriptions", &[], Some(&body)).await;
            assert_eq!(status, 400, "{body}");
            assert_eq!(
                got,
                json!({"error": "BadRequest", "description": text}),
                "{body}"
            );
        }
        let ok = sub(json!({"georel": "coveredBy", "geometry": "box", "coords": "0,0;1,1"}));
        let (status, _, got) = call(&c, "POST", "/v2/subscriptions", &[], Some(&ok)).await;
        assert_eq!(status, 201, "{got}");
    }
}

mod op_query {
    use super::*;

    /// `POST /v2/op/query` as an Orion client uses it.
    async fn op_query(c: &Client, params: &str, body: &Value) -> (u16, HeaderMap, Value) {
        call(c, "POST", &format!("/v2/op/query{params}"), &[], Some(body)).await
    }

    /// Three rooms with a temperature and a location, and a sensor.
    async fn rooms(c: &Client) {
        for (id, t, lat) in [
            ("Room1", 21, 40.0),
            ("Room2", 25, 40.01),
            ("Room3", 30, 41.0),
        ] {
            create(
                c,
                json!({"id": id, "type": "Room",
                "temperature": {"type": "Number", "value": t},
                "pressure": {"type": "Number", "value": 720},
                "location": {"type": "geo:point", "value": format!("{lat}, -3.7")}}),
            )
            .await;
        }
        create(c, json!({"id": "Sensor1", "type": "Sensor", "temperature": {"type": "Number", "value": 99}})).await;
    }

    /// `entities`, `attrs` and `expression` (q and geo) select and project;
    /// `options=count`, `limit`, `offset` and `orderBy` come from the URL.
    #[tokio::test]
    async fn attrs_and_expression_select_and_project() {
        let server = Server::start();
        let c = server.client();
        rooms(&c).await;
        let body = json!({
            "entities": [{"idPattern": "^Room", "type": "Room"}],
            "attrs": ["temperature"],
            "expression": {"q": "temperature>20", "georel": "near;maxDistance:5000",
                           "geometry": "point", "coords": "40.005,-3.7"}
        });
        let (status, headers, got) =
            op_query(&c, "?options=count,keyValues&orderBy=!temperature", &body).await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(headers["fiware-total-count"], "2");
        assert_eq!(
            got,
            json!([{"id": "Room2", "type": "Room", "temperature": 25},
                   {"id": "Room1", "type": "Room", "temperature": 21}])
        );
        let (_, _, page) = op_query(&c, "?limit=1&offset=1&orderBy=temperature", &body).await;
        assert_eq!(ids(&page), ["Room2"]);

        // Entity items are alternatives; the expression applies to all.
        let body = json!({"entities": [{"id": "Room3"}, {"id": "Sensor1", "type": "Sensor"}],
                          "expression": {"q": "temperature>=30"}});
        let (_, _, got) = op_query(&c, "", &body).await;
        assert_eq!(ids(&got), ["Room3", "Sensor1"]);
        // mq and the metadata projection.
        let body = json!({"expression": {"mq": "temperature.dateCreated>2000-01-01"},
                          "attrs": ["temperature"], "metadata": ["dateCreated"]});
        let (_, _, got) = op_query(&c, "?limit=1", &body).await;
        assert_eq!(ids(&got), ["Room1"]);
        assert_eq!(
            got[0]["temperature"]["metadata"]["dateCreated"]["type"],
            "DateTime"
        );
    }

    /// The deprecated `attributes` renders like `attrs` and keeps only the
    /// entities that have at least one of them.
    #[tokio::test]
    async fn attributes_requires_one_of_them() {
        let server = Server::start();
        let c = server.client();
        rooms(&c).await;
        let (_, _, got) = op_query(
            &c,
            "?options=keyValues",
            &json!({"attributes": ["pressure", "humidity"]}),
        )
        .await;
        assert_eq!(ids(&got), ["Room1", "Room2", "Room3"]);
        assert_eq!(
            got[0],
            json!({"id": "Room1", "type": "Room", "pressure": 720})
        );
        let (_, _, got) = op_query(&c, "", &json!({"attributes": ["humidity"]})).await;
        assert_eq!(got, json!([]));
    }

    /// Bad bodies get Orion's texts; the first mistake in document order
    /// is the one reported.
    #[tokio::test]
    async fn bad_bodies_get_orions_texts() {
        let server = Server::start();
        let c = server.client();
        let cases = [
            (json!({}), "empty payload"),
            (
                json!({"metadata": ["m"]}),
                "Invalid JSON payload, no relevant fields found",
            ),
            (
                json!({"entities": [], "foo": 1}),
                "Unrecognized field in JSON payload: /foo/",
            ),
            (json!({"entities": {}}), "not a JSON array"),
            (
                json!({"entities": [{"type": "Room"}]}),
                "nor /id/ nor /idPattern/ present",
            ),
            (
                json!({"entities": [{"id": "A", "idPattern": "A"}]}),
                "both /id/ and /idPattern/ present",
            ),
            (
                json!({"entities": [{"idPattern": "("}]}),
                "Invalid regex for entity idPattern",
            ),
            (
                json!({"entities": [{"id": 5}]}),
                "Invalid JSON type for entity id",
            ),
            (
                json!({"entities": [{"id": "A", "temp": {}}]}),
                "no attributes allowed in Entity in this payload",
            ),
            (
                json!({"attrs": "temperature"}),
                "the field /attrs/ must be a JSON array",
            ),
            (
                json!({"attrs": [1]}),
                "only JSON Strings allowed in attrs list",
            ),
            (json!({"expression": []}), "expression is not an object"),
            (json!({"expression": {}}), "expression is empty"),
            (json!({"expression": {"q": ""}}), "q is empty"),
            (json!({"expression": {"q": 5}}), "q is not a string"),
            (
                json!({"expression": {"q": "a>true"}}),
                "values of type /Bool/ not supported for operator /GreaterThan/",
            ),
            (
                json!({"expression": {"georel": "near;maxDistance:10", "geometry": "point"}}),
                "partial geo expression: geometry, georel and coords have to be provided together",
            ),
            (
                json!({"expression": {"georel": "near;maxDistance:10", "geometry": "point", "coords": "1,2;3,4"}}),
                "error parsing geo-query fields: invalid number of coordinates for /point/",
            ),
            (
                json!({"expression": {"q": ";"}, "entities": "x"}),
                "empty q",
            ),
        ];
        for (body, text) in cases {
            let (status, _, got) = op_query(&c, "", &body).await;
            assert_eq!(status, 400, "{body}");
            assert_eq!(
                got,
                json!({"error": "BadRequest", "description": text}),
                "{body}"
            );
        }
    }

    /// A `DateTime` attribute with a null value exists, equals `null` and
    /// compares with no date.
    #[tokio::test]
    async fn null_datetime_exists_and_equals_null() {
        let server = Server::start();
        let c = server.client();
        create(
            &c,
            json!({"id": "N", "type": "T", "birth": {"type": "DateTime", "value": null}}),
        )
        .await;
        create(&c, json!({"id": "D", "type": "T", "birth": {"type": "DateTime", "value": "2000-01-02T00:00:00Z"}})).await;
        for (q, expected) in [
            ("birth", vec!["N", "D"]),
            ("!birth", vec![]),
            ("birth==null", vec!["N"]),
            ("birth>1999-01-01", vec!["D"]),
            ("birth!=2000-01-02T00:00:00Z", vec!["N"]),
        ] {
            let (_, _, got) = op_query(&c, "", &json!({"expression": {"q": q}})).await;
            assert_eq!(ids(&got), expected, "{q}");
        }
    }

    /// `q` reaches the builtins: the entity's service path and expiry.
    #[tokio::test]
    async fn q_reaches_builtins() {
        let server = Server::start();
        let c = server.client();
        for (id, path) in [("A", "/park"), ("B", "/street")] {
            let e = json!({"id": id, "type": "T", "dateExpires": {"type": "DateTime", "value": "2090-01-01T00:00:00Z"}});
            let (status, _, _) = call(
                &c,
                "POST",
                "/v2/entities",
                &[("Fiware-ServicePath", path)],
                Some(&e),
            )
            .await;
            assert_eq!(status, 201);
        }
        let all = [("Fiware-ServicePath", "/#")];
        let body = json!({"expression": {"q": "servicePath==/park"}});
        let (_, _, got) = call(&c, "POST", "/v2/op/query", &all, Some(&body)).await;
        assert_eq!(ids(&got), ["A"]);
        let body = json!({"expression": {"q": "dateExpires>2089-12-31"}});
        let (_, _, got) = call(&c, "POST", "/v2/op/query", &all, Some(&body)).await;
        assert_eq!(ids(&got), ["A", "B"]);
        let (_, _, got) = call(
            &c,
            "GET",
            "/v2/entities?q=dateExpires<2089-12-31",
            &all,
            None,
        )
        .await;
        assert_eq!(got, json!([]));
    }
}

mod op_batch {
    use super::*;

    /// `POST /v2/op/notify` checks an Orion notification with Orion's
    /// texts and applies its entities as an `append`.
    #[tokio::test]
    async fn notify_texts_and_append() {
        let server = Server::start();
        let c = server.client();
        let cases = [
            (json!({}), "empty payload"),
            (
                json!({"data": []}),
                "Invalid JSON payload, mandatory field /subscriptionId/ not found",
            ),
            (
                json!({"subscriptionId": "s"}),
                "Invalid JSON payload, mandatory field /data/ not found",
            ),
            (
                json!({"subscriptionId": 1, "data": []}),
                "/subscriptionId/ must be a JSON String",
            ),
            (
                json!({"subscriptionId": "s", "data": {}}),
                "/data/ must be a JSON Array",
            ),
            (
                json!({"subscriptionId": "s", "data": [1]}),
                "notification data vector item must be a JSON Object",
            ),
            (
                json!({"subscriptionId": "s", "data": [], "x": 1}),
                "Unrecognized field in JSON payload: /x/",
            ),
        ];
        for (body, text) in cases {
            let (status, _, got) = call(&c, "POST", "/v2/op/notify", &[], Some(&body)).await;
            assert_eq!(status, 400, "{body}");
            assert_eq!(
                got,
                json!({"error": "BadRequest", "description": text}),
                "{body}"
            );
        }
        assert_eq!(list_ids(&c, "/v2/entities").await, Vec::<String>::new());
        let body = json!({"subscriptionId": "s", "data": [{"id": "E", "type": "T", "A": {"type": "Number", "value": 1}}]});
        let (status, _, _) = call(&c, "POST", "/v2/op/notify", &[], Some(&body)).await;
        assert_eq!(status, 200);
        assert_eq!(list_ids(&c, "/v2/entities").await, ["E"]);
    }

    /// NGSIv1's upper-case action types are still accepted by op/update.
    #[tokio::test]
    async fn upper_case_action_types() {
        let server = Server::start();
        let c = server.client();
        for (action, status) in [
            ("APPEND", 204),
            ("UPDATE", 204),
            ("APPEND_STRICT", 422),
            ("DELETE", 204),
        ] {
            let body = json!({"actionType": action, "entities": [{"id": "E", "type": "T", "A": {"type": "Number", "value": 2}}]});
            let (got, _, reply) = call(&c, "POST", "/v2/op/update", &[], Some(&body)).await;
            assert_eq!(got, status, "{action}: {reply}");
        }
        let (status, _, _) = call(&c, "GET", "/v2/entities/E", &[], None).await;
        assert_eq!(
            status, 200,
            "DELETE with attributes removes the attributes only"
        );
        let (_, _, attrs) = call(&c, "GET", "/v2/entities/E/attrs", &[], None).await;
        assert_eq!(attrs, json!({}));
    }
}
