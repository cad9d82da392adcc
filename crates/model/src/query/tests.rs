//! Unit tests of the query language. Behaviours taken from Orion cite the
//! functional test case (in Orion's `test/functionalTest/cases/`) they come
//! from.

use std::borrow::Cow;

use serde_json::{json, Value};

use super::*;

fn eval(q: &str, doc: &Value) -> bool {
    let query = Query::parse(q).unwrap();
    query.matches(|p| crate::mapping::get_path(doc, p))
}

fn err(q: &str) -> String {
    Query::parse(q).unwrap_err().description()
}

fn mq_err(q: &str) -> String {
    Query::parse_mq(q).unwrap_err().description()
}

/// An NGSI-like entity in normalized form: `{"A":{"value":…,"type":…,
/// "metadata":{"m":{"value":…,"type":…}}}}`; `DateTime` values are
/// instants, everything else typed JSON.
struct Entity(Value);

fn operand<'a>(typed: &'a Value, path: &[String]) -> Option<Operand<'a>> {
    let value = typed.get("value")?;
    if path.is_empty() && typed.get("type") == Some(&json!("DateTime")) {
        return Some(Operand::DateTime(parse_datetime(value.as_str()?)?));
    }
    Some(Operand::Json(Cow::Borrowed(descend(value, path)?)))
}

impl Resolver for Entity {
    fn attribute(&self, attr: &str, path: &[String]) -> Option<Operand<'_>> {
        operand(self.0.get(attr)?, path)
    }

    fn metadata(&self, attr: &str, md: &str, path: &[String]) -> Option<Operand<'_>> {
        operand(self.0.get(attr)?.get("metadata")?.get(md)?, path)
    }
}

/// Ids of the entities `q` (or `mq`) selects.
fn select(q: &str, mq: bool, entities: &[(&str, Value)]) -> Vec<String> {
    let query = if mq {
        Query::parse_mq(q).unwrap()
    } else {
        Query::parse(q).unwrap()
    };
    entities
        .iter()
        .filter(|(_, e)| query.matches_with(&Entity(e.clone())))
        .map(|(id, _)| id.to_string())
        .collect()
}

fn attr(value: Value) -> Value {
    json!({ "value": value, "type": "x" })
}

// ----- the original behaviour (kept) -----

#[test]
fn comparisons_ranges_lists_and_existence() {
    let d = json!({"temperature": 45.2, "humidity": 50, "status": "ok", "on": true});
    assert!(eval("temperature>45.1", &d));
    assert!(!eval("temperature>45.2", &d));
    assert!(eval("temperature>=45.2", &d));
    assert!(eval("humidity<=50;temperature<46", &d));
    assert!(!eval("humidity<50", &d));
    assert!(eval("humidity==40..60", &d));
    assert!(eval("humidity==1,50,7", &d));
    assert!(eval("humidity!=1,2", &d));
    assert!(eval("status=='ok'", &d));
    assert!(eval("status==ok", &d));
    assert!(eval("on==true", &d));
    assert!(eval("temperature;!pressure", &d));
    assert!(!eval("pressure", &d));
    assert!(!eval("pressure!=3", &d));
    assert!(eval("", &d));
}

#[test]
fn rejects_malformed_statements() {
    assert!(Query::parse("temperature>").is_err());
    assert!(Query::parse(">3").is_err());
    assert!(Query::parse("a..b==3").is_err());
    assert!(Query::parse("a b==3").is_err());
}

#[test]
fn quoted_values_may_hold_separators() {
    let d = json!({"name": "a;b,c"});
    assert!(eval("name=='a;b,c'", &d));
}

// ----- operators -----

#[test]
fn colon_is_equal() {
    // 2086_allow_trailing_semicolon, 1129_strings_in_q_uri_param.
    let d = json!({"humidity": 567});
    assert!(eval("humidity:567", &d));
    assert!(eval("humidity:567;", &d));
    assert!(!eval("humidity:568", &d));
    assert_eq!(Query::parse("a:1").unwrap(), Query::parse("a==1").unwrap());
}

#[test]
fn trailing_semicolon_once_but_not_twice() {
    // 2086_allow_trailing_semicolon
    assert!(Query::parse("humidity:567;").is_ok());
    assert_eq!(err("humidity:567;;"), "empty q-item");
    assert_eq!(err("a;;b"), "empty q-item");
    assert_eq!(err("a; ;"), "empty q-item");
    // Orion's tokenizer skips a leading `;`; a lone one is an empty q, an
    // item of blanks its own text.
    assert!(Query::parse(";a").is_ok());
    assert_eq!(err(";"), "empty q");
    assert_eq!(err("a; ;b"), "empty q-item (only whitespace)");
}

#[test]
fn strings_and_numbers_do_not_mix() {
    // 1595_query_with_q_and_string_values and 1129_strings_in_q_uri_param.
    let es = [
        ("E1", json!({"A1": attr(json!("10"))})),
        ("E2", json!({"A1": attr(json!(10))})),
    ];
    assert_eq!(select("A1==10", false, &es), ["E2"]);
    assert_eq!(select("A1=='10'", false, &es), ["E1"]);
    assert_eq!(select("A1!=10", false, &es), ["E1"]);
    assert_eq!(select("A1!='10'", false, &es), ["E2"]);
    assert_eq!(select("A1:121,10,125", false, &es), ["E2"]);
    assert_eq!(select("A1:'121','10'", false, &es), ["E1"]);
    assert!(select("A1:'121','122'", false, &es).is_empty());
}

#[test]
fn forced_string_errors() {
    // 1595_query_with_q_and_string_values steps 08 and 09.
    assert_eq!(err("A1=='10'x"), "non-terminated forced string");
    assert_eq!(err("A1=='10'x'"), "quote in forced string");
}

#[test]
fn booleans_are_json_literals() {
    // 1594_query_with_q_and_equals_true
    let es = [
        ("E1", json!({"A1": attr(json!(true))})),
        ("E2", json!({"A1": attr(json!(false))})),
        ("E3", json!({"A1": attr(json!(true))})),
        ("E4", json!({"A1": attr(json!("true"))})),
    ];
    assert_eq!(select("A1==true", false, &es), ["E1", "E3"]);
    assert_eq!(select("A1==false", false, &es), ["E2"]);
    assert!(select("A2==true", false, &es).is_empty());
    assert_eq!(select("A1!=true", false, &es), ["E2", "E4"]);
    assert_eq!(select("A1!=false", false, &es), ["E1", "E3", "E4"]);
    assert!(select("A2!=true", false, &es).is_empty());
    assert_eq!(select("A1=='true'", false, &es), ["E4"]);
}

#[test]
fn null_and_lists_with_null() {
    // 4120_string_and_null_mixed_filter, 2998_null_not_working_in_q_and_mq_filter.
    let es = [
        ("E1", json!({"A": attr(Value::Null)})),
        ("E2", json!({"A": attr(json!("foo"))})),
        ("E3", json!({})),
        ("E4", json!({"A": attr(json!("null"))})),
    ];
    assert_eq!(select("A:null", false, &es), ["E1"]);
    assert_eq!(select("A:foo,null", false, &es), ["E1", "E2"]);
    assert_eq!(select("A:null,foo", false, &es), ["E1", "E2"]);
    assert_eq!(select("A!=null", false, &es), ["E2", "E4"]);
    assert_eq!(select("A!=foo,null", false, &es), ["E4"]);
    assert_eq!(select("A!=null,foo", false, &es), ["E4"]);
}

#[test]
fn ranges_only_with_equal_and_not_equal() {
    // 1607_query_with_q_and_ranges_but_invalid_operator
    for q in ["A1>=0..20", "A1>0..20", "A1<=0..20", "A1<0..20"] {
        assert_eq!(
            err(q),
            "ranges only valid for equal and not equal ops",
            "{q}"
        );
    }
    let es = [
        ("E1", json!({"A1": attr(json!(10))})),
        ("E2", json!({"A1": attr(json!(20))})),
        ("E3", json!({"A1": attr(json!(30))})),
    ];
    assert_eq!(select("A1==0..20", false, &es), ["E1", "E2"]);
    assert_eq!(select("A1!=0..20", false, &es), ["E3"]);
    assert_eq!(
        err("A1>1,2"),
        "lists only valid for equal and not equal ops"
    );
}

#[test]
fn range_and_list_type_errors() {
    // 1306_string2double/string2double_not_a_number
    for q in ["A==B..14", "A==0..B", "A!=B..14", "A!=0..B"] {
        assert_eq!(err(q), "invalid range: types mixed", "{q}");
    }
    assert!(Query::parse("A==B").is_ok());
    assert!(Query::parse("A!=B").is_ok());
    // 1039_ngsiv2_date_support/dates_in_q_uri_param_ranges step 07.
    assert_eq!(
        err("birthdate==2016-02-23T10:00:00.000Z..'2016-02-24T10:00:00.000Z'"),
        "invalid range: types mixed"
    );
    assert_eq!(err("speed==99....190"), "invalid range: types mixed");
    assert_eq!(err("speed==99,,,190"), "empty item in list");
    assert_eq!(err("a==1,"), "empty item in list");
    assert_eq!(err("a==1.."), "empty item in range");
    assert_eq!(err("a==true..3"), "invalid data type for /range-from/");
    assert_eq!(err("a==3..null"), "invalid data type for /range-to/");
    assert_eq!(err("a==1,b"), "invalid JSON value type in list");
    assert_eq!(err("a==true,false"), "invalid JSON value type in list");
    assert_eq!(
        err("a>true"),
        "values of type /Bool/ not supported for operator /GreaterThan/"
    );
    assert_eq!(
        err("a<=null"),
        "values of type /Null/ not supported for operator /LessThanOrEqual/"
    );
}

#[test]
fn lhs_and_rhs_errors() {
    // 2106_wrong_text_payload_string_filter_subscription_error
    assert_eq!(err("<speed"), "empty left-hand-side in q-item");
    assert_eq!(err("speed=="), "empty right-hand-side in q-item");
    assert_eq!(err("!"), "empty right-hand-side in q-item");
    assert_eq!(err("a(b)==1"), "invalid character found in URI param /q/");
    assert_eq!(err("!a==1"), "invalid character found in URI param /q/");
    assert_eq!(mq_err("a=b"), "invalid character found in URI param /mq/");
    assert_eq!(err("a..b==3"), "empty name in attribute path");
    let e = Query::parse("x>1;<speed").unwrap_err();
    assert_eq!(e.statement, "<speed");
    assert_eq!(e.reason, "empty left-hand-side in q-item");
    assert_eq!(
        e.to_string(),
        "invalid query '<speed': empty left-hand-side in q-item"
    );
}

#[test]
fn forbidden_characters() {
    // 1994_invalid_chars_in_q_at_sub_creation and 2226_pattern_matching_and_integers.
    for q in [
        "house<flat>",
        "house==flat>",
        "house==flat,flat>",
        "house==flat..flat>",
        "house'flat'",
        "a==house'flat'",
        "A1~='101'",
    ] {
        assert_eq!(err(q), "forbidden characters in String Filter", "{q}");
    }
}

#[test]
fn regex_matches_strings_only() {
    // 2226_pattern_matching_and_integers
    let es = [
        ("E1", json!({"A1": attr(json!(101))})),
        ("E2", json!({"A1": attr(json!("101"))})),
        ("E3", json!({"A1": attr(json!(103))})),
    ];
    assert!(select("A1~=100", false, &es).is_empty());
    assert_eq!(select("A1~=101", false, &es), ["E2"]);
    // 1156_qfilters_and_compounds_string_match
    let e = [("E1", json!({"A1": attr(json!({"s": "test_string"}))}))];
    assert_eq!(select("A1.s~=test", false, &e), ["E1"]);
    assert_eq!(select("A1.s~=ing", false, &e), ["E1"]);
    assert_eq!(select("A1.s~=_", false, &e), ["E1"]);
    assert!(select("A1.s~=fest_string", false, &e).is_empty());
    assert_eq!(select("A1.s~=^t.*g$", false, &e), ["E1"]);
    assert_eq!(err("a~=[x"), "error compiling filter regex: '[x'");
}

#[test]
fn string_ordering_and_ranges() {
    // 1945_filter_string_comparison and 1156_qfilters_and_compounds_greater_than/less_than.
    let e = [("E1", json!({"A1": attr(json!({"s": "test_string"}))}))];
    for (q, hit) in [
        ("A1.s>fest_string", true),
        ("A1.s>uest_string", false),
        ("A1.s>=test_string", true),
        ("A1.s<uest_string", true),
        ("A1.s<test_string", false),
        ("A1.s<=test_string", true),
        ("A1.s:fest_string..test_string", true),
        ("A1.s:fest_string,uest_string,test_string", true),
        ("A1.s!=test_strin", true),
    ] {
        assert_eq!(!select(q, false, &e).is_empty(), hit, "{q}");
    }
}

// ----- compounds and paths -----

#[test]
#[allow(clippy::approx_constant)] // 3.14 is the case's value, not pi
fn compound_paths() {
    // 1156_qfilters_and_compounds (equals_*, greater_than, less_than, existence, deeper).
    let v = json!({"i": 10, "f": 3.14, "s": "test_string", "T": true, "F": false,
                   "N": null, "D": "2016-07-22T10:42:42.000Z"});
    let e = [(
        "E1",
        json!({"A1": attr(json!({"i": 10, "f": 3.14, "s": "test_string", "T": true,
                                  "F": false, "N": null,
                                  "L1": {"L2": v}}))}),
    )];
    for (q, hit) in [
        ("A1.i==10", true),
        ("A1.i:9..10", true),
        ("A1.i!=0,5,10,15", false),
        ("A1.i!=1..9", true),
        ("A1.i>9", true),
        ("A1.i>-1", true),
        ("A1.i>=11", false),
        ("A1.i<11", true),
        ("A1.i<=-1", false),
        ("A1.f:3.14", true),
        ("A1.f==3.14,3.15", true),
        ("A1.f!=3.16..4.16", true),
        ("A1.f>=3.15", false),
        ("A1.f<4.0", true),
        ("A1.T:true", true),
        ("A1.F==false", true),
        ("A1.N:null", true),
        ("A1.N!=null", false),
        ("A1.i", true),
        ("A1.i2", false),
        ("!A1.i2", true),
        ("!A2.i", true),
        ("A1.L1.L2.T==true", true),
        ("A1.L1.L2.f!=3.15", true),
        ("A1.L1.L2.s<uest_string", true),
        ("A1.L1.L2.i<=10", true),
        ("A1.L1.L2.f>3.13", true),
        ("A1.L1.L2.s>=test_string", true),
        ("A1.L1.L2.s~=t_str", true),
        ("A1.L1.L2.s~=f_str", false),
        ("A1.L1.L2.F", true),
        ("A1.L1.L2", true),
        ("!A1.L1.L3", true),
        ("!A1.L1.L2.Not", true),
        ("A1.L1.L2.Not", false),
        // Dates inside compounds are strings to Orion.
        ("A1.L1.L2.D==2016-07-22T10:42:42.000Z", false),
        ("A1.L1.L2.D=='2016-07-22T10:42:42.000Z'", true),
    ] {
        assert_eq!(!select(q, false, &e).is_empty(), hit, "{q}");
    }
}

#[test]
fn quoted_path_segments() {
    // 1490_compound_values_with_dot_in_key and 1217_update_compound_with_dots.
    let es = [
        ("E1", json!({"A1": attr(json!({"C1.x": "Step01_01"}))})),
        (
            "E2",
            json!({"A1.B1": {"value": {"C1": 21, "C2": 22}, "type": "x",
                             "metadata": {"M1": {"value": "M1", "type": "Text"}}}}),
        ),
        (
            "E3",
            json!({"A1": {"value": 1, "type": "x",
                          "metadata": {"M1": {"value": {"MC1.x": "Step02_01"}, "type": "x"},
                                       "M1.x": {"value": "mix", "type": "Text"}}}}),
        ),
        (
            "E4",
            json!({"A.B": {"value": 1, "type": "x",
                           "metadata": {"C": {"value": {"D.E": {"F": {"G.H": "Step04_01"}}},
                                              "type": "x"}}}}),
        ),
    ];
    let none: [&str; 0] = [];
    assert_eq!(select("A1.C1.x", false, &es), none);
    assert_eq!(select("A1.'C1.x'", false, &es), ["E1"]);
    assert_eq!(select("A1.'C1.x'==Step01_01", false, &es), ["E1"]);
    assert_eq!(select("A1.'C1.x'==Step01_02", false, &es), none);
    assert_eq!(select("A1.B1.C1", false, &es), none);
    assert_eq!(select("'A1.B1'.C1", false, &es), ["E2"]);
    assert_eq!(select("'A1.B1'.C1==21", false, &es), ["E2"]);
    assert_eq!(select("'A1.B1'.C1==22", false, &es), none);
    assert_eq!(select("'A1.B1'.M1", false, &es), none);
    assert_eq!(select("'A1.B1'.M1==M1", true, &es), ["E2"]);
    assert_eq!(select("'A1.B1'.M1==M2", true, &es), none);
    assert_eq!(select("A1.M1.MC1.x", true, &es), none);
    assert_eq!(select("A1.M1.'MC1.x'", true, &es), ["E3"]);
    assert_eq!(select("A1.M1.'MC1.x'", false, &es), none);
    assert_eq!(select("A1.M1.'MC1.x'==Step02_01", true, &es), ["E3"]);
    assert_eq!(select("A1.'M1.x'", true, &es), ["E3"]);
    assert_eq!(select("A1.M1.x", true, &es), none);
    assert_eq!(select("A1.'M1.x'==mix", true, &es), ["E3"]);
    assert_eq!(select("A.B.C.D.E.F.G.H", true, &es), none);
    assert_eq!(select("'A.B'.C.'D.E'.F.'G.H'", true, &es), ["E4"]);
    assert_eq!(select("'A.B'.C.'D.E'.F.'G.H'", false, &es), none);
    assert_eq!(
        select("'A.B'.C.'D.E'.F.'G.H'==Step04_01", true, &es),
        ["E4"]
    );
    assert_eq!(select("'A.B'.C.'D.E'.F.'G.H'==Step04_02", true, &es), none);
}

#[test]
fn quoted_names_may_hold_operators() {
    // 2452_q_for_attr_with_colon_in_name
    let es = [
        ("E1", json!({"A:1": attr(json!(1))})),
        ("E2", json!({"A:2": attr(json!(2))})),
    ];
    let none: [&str; 0] = [];
    assert_eq!(select("A:1", false, &es), none);
    assert_eq!(select("'A:1'", false, &es), ["E1"]);
    assert_eq!(select("!'A:1'", false, &es), ["E2"]);
    assert_eq!(select("!'A:2'", false, &es), ["E1"]);
    assert_eq!(select("'A:3'", false, &es), none);
    assert_eq!(select("!'A:3'", false, &es), ["E1", "E2"]);
}

#[test]
fn paths_are_exposed() {
    let q = Query::parse("'a.b'.c>1;d").unwrap();
    let paths: Vec<_> = q.paths().map(|p| p.segments().to_vec()).collect();
    assert_eq!(paths, [vec!["a.b", "c"], vec!["d"]]);
    assert_eq!(q.paths().next().unwrap().dotted(), "a.b.c");
    assert_eq!(q.kind(), QueryKind::Q);
    assert!(Query::parse(" ").unwrap().is_empty());
}

// ----- mq -----

#[test]
fn mq_needs_a_metadata_name() {
    assert_eq!(mq_err("A1"), "no metadata in right-hand-side of q-item");
    assert_eq!(mq_err("!A1"), "no metadata in right-hand-side of q-item");
    assert!(Query::parse_mq("A1.M1").is_ok());
    // A binary item without a metadata name is valid and matches nothing.
    let es = [(
        "E1",
        json!({"A1": {"value": 3, "type": "x", "metadata": {}}}),
    )];
    assert!(select("A1==3", true, &es).is_empty());
}

#[test]
fn mq_on_arrays_matches_any_element() {
    // 2446_mq_and_vector
    let md = |v: Value| {
        json!({"A1": {"value": 1, "type": "x",
                                       "metadata": {"M1": {"value": v, "type": "x"}}}})
    };
    let es = [
        ("E1", md(json!([1, 2]))),
        ("E2", md(json!(["one", "two", "three"]))),
    ];
    assert_eq!(select("A1.M1==1", true, &es), ["E1"]);
    assert_eq!(select("A1.M1==two", true, &es), ["E2"]);
    assert_eq!(select("A1.M1!=two", true, &es), ["E1"]);
    assert_eq!(select("A1.M1>1", true, &es), ["E1"]);
}

#[test]
fn mq_null_and_missing() {
    // 2998_null_not_working_in_q_and_mq_filter, 2496_mq_metadata_not_exist
    let es = [
        (
            "E1",
            json!({"t": {"value": 1, "type": "x",
                            "metadata": {"m": {"value": null, "type": "None"}}}}),
        ),
        (
            "E2",
            json!({"t": {"value": 1, "type": "x",
                            "metadata": {"m": {"value": 4, "type": "Number"}}}}),
        ),
        ("E3", json!({"t": {"value": 1, "type": "x"}})),
    ];
    assert_eq!(select("t.m==null", true, &es), ["E1"]);
    assert_eq!(select("t.m>=20", true, &es), Vec::<String>::new());
    assert_eq!(select("t.m<=20", true, &es), ["E2"]);
}

// ----- dates -----

#[test]
fn datetime_attributes_compare_as_instants() {
    // 1039_ngsiv2_date_support/dates_in_q_uri_param{,_lists,_ranges}.
    let dt = |s: &str| json!({"birthdate": {"value": s, "type": "DateTime"}});
    let es = [
        ("E24", dt("2016-02-24T10:00:00.000Z")),
        ("E23", dt("2016-02-23T10:00:00.000Z")),
        ("E22", dt("2016-02-22T10:00:00.000Z")),
        (
            "E25",
            json!({"birthdate": {"value": "2016-02-25T10:00:00.000Z", "type": "Text"}}),
        ),
    ];
    let none: [&str; 0] = [];
    assert_eq!(
        select("birthdate==2016-02-24T10:00:00.000Z", false, &es),
        ["E24"]
    );
    assert_eq!(
        select("birthdate>2016-02-24T10:00:00.000Z", false, &es),
        none
    );
    assert_eq!(
        select("birthdate<2016-02-25T10:00:00.000Z", false, &es),
        ["E24", "E23", "E22"]
    );
    assert_eq!(
        select("birthdate>=2016-02-23T10:00:00.000Z", false, &es),
        ["E24", "E23"]
    );
    assert_eq!(
        select("birthdate<=2016-02-23T10:00:00.000Z", false, &es),
        ["E23", "E22"]
    );
    assert_eq!(
        select("birthdate=='2016-02-23T10:00:00.000Z'", false, &es),
        none
    );
    assert_eq!(
        select("birthdate==2016-02-25T10:00:00.000Z", false, &es),
        none
    );
    assert_eq!(
        select("birthdate=='2016-02-25T10:00:00.000Z'", false, &es),
        ["E25"]
    );
    assert_eq!(
        select(
            "birthdate==2016-02-22T10:00:00.000Z,2016-02-26T10:00:00.000Z",
            false,
            &es
        ),
        ["E22"]
    );
    assert_eq!(
        select(
            "birthdate==2016-02-23T10:00:00.000Z..2016-02-24T10:00:00.000Z",
            false,
            &es
        ),
        ["E24", "E23"]
    );
    assert_eq!(
        select(
            "birthdate!=2016-02-23T10:00:00.000Z..2016-02-24T10:00:00.000Z",
            false,
            &es
        ),
        ["E22", "E25"]
    );
}

#[test]
fn partial_dates_and_milliseconds() {
    // 2631_partial_datetimes/partial_datetime_filter
    let dt = |s: &str| json!({"D": {"value": s, "type": "DateTime"}});
    let es = [
        ("E1", dt("2016-09-30T22:48:51.000Z")),
        ("E2", dt("2016-10-01T01:23:45.000Z")),
    ];
    assert_eq!(select("D>2016-10-01", false, &es), ["E2"]);
    assert_eq!(select("D<2016-10-01", false, &es), ["E1"]);
    assert_eq!(select("D>2016-10-01T0000Z", false, &es), ["E2"]);
    assert_eq!(select("D<2016-10-01T0000Z", false, &es), ["E1"]);
    // 2670_milliseconds_for_DateTime_attrs/2670_milliseconds_filter_query
    let ts = |s: &str| json!({"ts": {"value": s, "type": "DateTime"}});
    let es = [
        ("E1", ts("2020-05-10T01:02:03.123Z")),
        ("E2", ts("2020-05-10T01:02:03.456Z")),
        ("E3", ts("2020-05-10T01:02:03.789Z")),
    ];
    assert_eq!(
        select("ts>2020-05-10T01:02:03Z", false, &es),
        ["E1", "E2", "E3"]
    );
    assert_eq!(select("ts<2020-05-10T01:02:03.200Z", false, &es), ["E1"]);
    assert_eq!(
        select(
            "ts==2020-05-10T01:02:03.200Z..2020-05-10T01:02:03.600Z",
            false,
            &es
        ),
        ["E2"]
    );
}

#[test]
fn datetime_metadata() {
    // 2443_mq_date_processing
    let e = [(
        "room4",
        json!({"timestamp": {"value": 1, "type": "x", "metadata": {
            "meta_timestamp": {"value": "2017-06-16T07:21:24.000Z", "type": "DateTime"}}}}),
    )];
    assert_eq!(
        select(
            "timestamp.meta_timestamp>=2017-06-15T07:21:24.000Z",
            true,
            &e
        ),
        ["room4"]
    );
    assert_eq!(
        select(
            "timestamp.meta_timestamp==2016-06-16T07:21:24.000Z..2026-06-16T07:21:24.000Z",
            true,
            &e
        ),
        ["room4"]
    );
}

#[test]
fn untyped_values_read_dates_and_numbers_from_strings() {
    // Data units carry no types: strings that read as dates or numbers
    // compare as such (weft's rule for live filters and alarms).
    let d = json!({"birthDate": "2017-06-16T07:21:24.238Z", "level": "12.5", "name": "x"});
    assert!(eval("birthDate<2017-06-17T07:21:24.238Z", &d));
    assert!(eval("birthDate>2017-06-16", &d));
    assert!(!eval("birthDate>2017-06-17", &d));
    assert!(eval("birthDate=='2017-06-16T07:21:24.238Z'", &d));
    assert!(eval("level>12", &d));
    assert!(eval("level==12.5", &d));
    assert!(eval("level=='12.5'", &d));
    assert!(!eval("name>1", &d));
    let r = JsonResolver(&d);
    assert!(Query::parse("birthDate<2017-06-17")
        .unwrap()
        .matches_with(&r));
    assert!(!Query::parse_mq("birthDate.x").unwrap().matches_with(&r));
}

#[test]
fn type_mismatches_never_order() {
    // 2995_q_in_subscriptions: q=t>=20 / t<=20 with t a string or a
    // compound: no notification.
    let es = [
        ("E1", json!({"t": attr(json!("a string"))})),
        ("E2", json!({"t": attr(json!(20))})),
        ("E3", json!({"t": attr(json!({"a": 1}))})),
    ];
    assert_eq!(select("t>=20", false, &es), ["E2"]);
    assert_eq!(select("t<=20", false, &es), ["E2"]);
    assert_eq!(select("t!=20", false, &es), ["E1", "E3"]);
}

#[test]
fn whitespace_around_items_and_operands() {
    let d = json!({"a": 1, "b": "x y"});
    assert!(eval(" a == 1 ; b=='x y' ", &d));
}

#[test]
fn matching_numbers_does_not_allocate_per_item() {
    // Structural check: the parsed query holds ready-made literals, so the
    // evaluation is comparisons only. (Allocation itself is not observable
    // from a unit test without a custom allocator.)
    let q = Query::parse("t>20;t<=30;h==1..5;n==1,2,3").unwrap();
    let d = json!({"t": 25, "h": 3, "n": 2});
    for _ in 0..1000 {
        assert!(q.matches(|p| d.get(p)));
    }
}
