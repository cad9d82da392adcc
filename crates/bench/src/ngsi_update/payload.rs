//! The pure parts of `ngsi-update`: the `--attrs` range, entity ids and the
//! request bodies, rendered into reusable buffers so the hot path does not
//! allocate.

use std::fmt;
use std::io::Write as _;

use rand::Rng;

/// The entity type every bench entity has.
pub const ENTITY_TYPE: &str = "Room";

/// Most attributes an update may carry (`--attrs` upper bound).
pub const MAX_ATTRS: usize = 1000;

/// How many attributes one update carries: a count drawn uniformly from
/// `min..=max`, among the attributes `a1..a{max}` every entity has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttrRange {
    /// Fewest attributes per update (at least 1).
    pub min: usize,
    /// Most attributes per update; also the attributes each entity has.
    pub max: usize,
}

impl AttrRange {
    /// Parses `1-6`, `1-20`, or a single count `6` (= `6-6`).
    pub fn parse(s: &str) -> Result<AttrRange, String> {
        let s = s.trim();
        let number = |part: &str| {
            part.trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?}: expected a count or a range like 1-6"))
        };
        let (min, max) = match s.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => {
                let n = number(s)?;
                (n, n)
            }
        };
        if min == 0 {
            return Err(format!("{s:?}: an update carries at least 1 attribute"));
        }
        if min > max {
            return Err(format!("{s:?}: the range is empty ({min} > {max})"));
        }
        if max > MAX_ATTRS {
            return Err(format!("{s:?}: at most {MAX_ATTRS} attributes"));
        }
        Ok(AttrRange { min, max })
    }

    /// Draws the attributes of one update: a count in the range, then that
    /// many distinct attribute indexes (0-based, `a{i+1}`), in ascending order.
    pub fn draw(&self, rng: &mut impl Rng, out: &mut Vec<usize>) {
        out.clear();
        let count = rng.random_range(self.min..=self.max);
        if count == self.max {
            out.extend(0..self.max);
            return;
        }
        out.extend(rand::seq::index::sample(rng, self.max, count).iter());
        out.sort_unstable();
    }
}

impl fmt::Display for AttrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

/// The API the updates go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Api {
    /// NGSIv2 (Orion's): `PATCH /v2/entities/{id}/attrs`, the tenant in
    /// `Fiware-Service`.
    #[default]
    V2,
    /// NGSI-LD: one attribute per update is a partial attribute update
    /// (`PATCH /ngsi-ld/v1/entities/{id}/attrs/{attr}`, Stellio's k6
    /// scenario), more an update of the entity's attributes (`PATCH
    /// …/attrs`); the tenant in `NGSILD-Tenant`.
    Ld,
}

impl Api {
    /// Where entities are created and read (`{prefix}` before it).
    pub fn entities_path(self) -> &'static str {
        match self {
            Api::V2 => "/v2/entities",
            Api::Ld => "/ngsi-ld/v1/entities",
        }
    }

    /// The header naming the tenant.
    pub fn tenant_header(self) -> &'static str {
        match self {
            Api::V2 => "Fiware-Service",
            Api::Ld => "NGSILD-Tenant",
        }
    }

    /// What comes before an entity's number in its id.
    fn id_prefix(self) -> &'static str {
        match self {
            Api::V2 => ENTITY_TYPE,
            Api::Ld => "urn:ngsi-ld:Room:",
        }
    }

    /// The id of entity `i`: `Room<i>`, or `urn:ngsi-ld:Room:<i>`.
    pub fn entity_id(self, i: usize) -> String {
        format!("{}{i}", self.id_prefix())
    }

    /// The creation body of entity `i`, every attribute `a1..a{attrs}` at
    /// 0: keyValues for NGSIv2 (`POST /v2/entities?options=keyValues`),
    /// Properties for NGSI-LD.
    pub fn create_body(self, i: usize, attrs: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + attrs * 32);
        let _ = write!(
            out,
            r#"{{"id":"{}{i}","type":"{ENTITY_TYPE}""#,
            self.id_prefix()
        );
        for a in 1..=attrs {
            match self {
                Api::V2 => {
                    let _ = write!(out, r#","a{a}":0"#);
                }
                Api::Ld => {
                    let _ = write!(out, r#","a{a}":{{"type":"Property","value":0}}"#);
                }
            }
        }
        out.push(b'}');
        out
    }
}

/// The id of entity `i` through NGSIv2: `Room<i>`.
pub fn entity_id(i: usize) -> String {
    Api::V2.entity_id(i)
}

/// The creation body (keyValues) of entity `i`: every attribute `a1..a{attrs}` at 0.
pub fn create_body(i: usize, attrs: usize) -> Vec<u8> {
    Api::V2.create_body(i, attrs)
}

/// Renders a normalized update body into `out` (cleared first):
/// `{"a1":{"value":7,"type":"Number"},…}` for each (attribute index, value).
pub fn render_update_body(out: &mut Vec<u8>, attrs: &[(usize, u64)]) {
    out.clear();
    out.push(b'{');
    for (n, (a, value)) in attrs.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let _ = write!(out, r#""a{}":{{"value":{value},"type":"Number"}}"#, a + 1);
    }
    out.push(b'}');
}

/// Renders an NGSI-LD update body into `out` (cleared first): the
/// fragment `{"value":7}` of a partial attribute update for one
/// attribute, `{"a1":{"type":"Property","value":7},…}` for more.
pub fn render_ld_update_body(out: &mut Vec<u8>, attrs: &[(usize, u64)]) {
    out.clear();
    if let [(_, value)] = attrs {
        let _ = write!(out, r#"{{"value":{value}}}"#);
        return;
    }
    out.push(b'{');
    for (n, (a, value)) in attrs.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let _ = write!(out, r#""a{}":{{"type":"Property","value":{value}}}"#, a + 1);
    }
    out.push(b'}');
}

/// The fixed parts of a PATCH request, rendered once per run.
#[derive(Debug, Clone)]
pub struct PatchHead {
    /// The API the updates go through.
    api: Api,
    /// `PATCH {prefix}/v2/entities/{id prefix}`.
    start: Vec<u8>,
    /// ` HTTP/1.1` and the headers up to `Content-Length: `.
    middle: Vec<u8>,
}

impl PatchHead {
    /// The heads for a server under path `prefix`, `Host: host`, in
    /// `tenant`, through `api`.
    pub fn new(prefix: &str, host: &str, tenant: &str, api: Api) -> PatchHead {
        PatchHead {
            api,
            start: format!("PATCH {prefix}{}/{}", api.entities_path(), api.id_prefix())
                .into_bytes(),
            middle: format!(
                " HTTP/1.1\r\nHost: {host}\r\n{}: {tenant}\r\n{key}\
                 Content-Type: application/json\r\nContent-Length: ",
                api.tenant_header(),
                key = crate::http::api_key_line(),
            )
            .into_bytes(),
        }
    }

    /// Renders the complete PATCH of `values` (attribute index, value) of
    /// entity `entity` into `out`, its body into `body`.
    pub fn render(
        &self,
        out: &mut Vec<u8>,
        body: &mut Vec<u8>,
        entity: usize,
        values: &[(usize, u64)],
    ) {
        out.clear();
        out.extend_from_slice(&self.start);
        let _ = write!(out, "{entity}/attrs");
        match (self.api, values) {
            (Api::V2, _) => render_update_body(body, values),
            (Api::Ld, [(a, _)]) => {
                let _ = write!(out, "/a{}", a + 1);
                render_ld_update_body(body, values);
            }
            (Api::Ld, _) => render_ld_update_body(body, values),
        }
        out.extend_from_slice(&self.middle);
        let _ = write!(out, "{}\r\n\r\n", body.len());
        out.extend_from_slice(body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn parses_ranges() {
        assert_eq!(AttrRange::parse("1-6"), Ok(AttrRange { min: 1, max: 6 }));
        assert_eq!(AttrRange::parse("1-20"), Ok(AttrRange { min: 1, max: 20 }));
        assert_eq!(
            AttrRange::parse(" 3 - 3 "),
            Ok(AttrRange { min: 3, max: 3 })
        );
        assert_eq!(AttrRange::parse("6"), Ok(AttrRange { min: 6, max: 6 }));
        for bad in ["", "0-6", "7-6", "a-6", "1-", "-6", "1-2-3", "1-1001", "x"] {
            assert!(AttrRange::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(AttrRange::parse("2-9").unwrap().to_string(), "2-9");
    }

    #[test]
    fn draws_distinct_sorted_attributes_in_range() {
        let range = AttrRange::parse("1-6").unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut out = Vec::new();
        let mut counts = [0u32; 7];
        for _ in 0..5000 {
            range.draw(&mut rng, &mut out);
            assert!((1..=6).contains(&out.len()), "{out:?}");
            assert!(out.windows(2).all(|w| w[0] < w[1]), "{out:?}");
            assert!(out.iter().all(|&a| a < 6));
            counts[out.len()] += 1;
        }
        // Every count is drawn.
        assert!(counts[1..].iter().all(|&n| n > 0), "{counts:?}");
        let fixed = AttrRange::parse("4").unwrap();
        fixed.draw(&mut rng, &mut out);
        assert_eq!(out, [0, 1, 2, 3]);
    }

    #[test]
    fn renders_bodies() {
        assert_eq!(
            create_body(3, 2),
            br#"{"id":"Room3","type":"Room","a1":0,"a2":0}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&create_body(0, 20)).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 22);
        let mut out = b"junk".to_vec();
        render_update_body(&mut out, &[(0, 7), (5, 12)]);
        assert_eq!(
            out,
            br#"{"a1":{"value":7,"type":"Number"},"a6":{"value":12,"type":"Number"}}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["a6"]["value"], 12);
    }

    #[test]
    fn renders_patch_requests() {
        let head = PatchHead::new("/pre", "h:1", "benchabc", Api::V2);
        let (mut out, mut body) = (b"junk".to_vec(), Vec::new());
        head.render(&mut out, &mut body, 42, &[(0, 3)]);
        let body = r#"{"a1":{"value":3,"type":"Number"}}"#;
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "PATCH /pre/v2/entities/Room42/attrs HTTP/1.1\r\nHost: h:1\r\nFiware-Service: benchabc\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        );
    }

    #[test]
    fn renders_ngsi_ld_updates() {
        let head = PatchHead::new("", "h:1", "t", Api::Ld);
        let (mut out, mut body) = (Vec::new(), Vec::new());
        head.render(&mut out, &mut body, 7, &[(2, 5)]);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.starts_with("PATCH /ngsi-ld/v1/entities/urn:ngsi-ld:Room:7/attrs/a3 HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(
            text.contains("NGSILD-Tenant: t\r\n") && text.ends_with("\r\n\r\n{\"value\":5}"),
            "{text}"
        );
        head.render(&mut out, &mut body, 7, &[(0, 1), (1, 2)]);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("PATCH /ngsi-ld/v1/entities/urn:ngsi-ld:Room:7/attrs HTTP/1.1"),
            "{text}"
        );
        assert!(text.ends_with(
            r#"{"a1":{"type":"Property","value":1},"a2":{"type":"Property","value":2}}"#
        ));
        let created: serde_json::Value =
            serde_json::from_slice(&Api::Ld.create_body(4, 2)).unwrap();
        assert_eq!(created["id"], "urn:ngsi-ld:Room:4");
        assert_eq!(
            created["a2"],
            serde_json::json!({"type": "Property", "value": 0})
        );
    }
}
