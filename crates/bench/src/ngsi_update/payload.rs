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

/// The id of entity `i`: `Room<i>`.
pub fn entity_id(i: usize) -> String {
    format!("{ENTITY_TYPE}{i}")
}

/// The creation body (keyValues) of entity `i`: every attribute `a1..a{attrs}` at 0.
pub fn create_body(i: usize, attrs: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + attrs * 8);
    let _ = write!(out, r#"{{"id":"{ENTITY_TYPE}{i}","type":"{ENTITY_TYPE}""#);
    for a in 1..=attrs {
        let _ = write!(out, r#","a{a}":0"#);
    }
    out.push(b'}');
    out
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

/// The fixed parts of a PATCH request, rendered once per run.
#[derive(Debug, Clone)]
pub struct PatchHead {
    /// `PATCH {prefix}/v2/entities/`.
    start: Vec<u8>,
    /// `/attrs HTTP/1.1` and the headers up to `Content-Length: `.
    middle: Vec<u8>,
}

impl PatchHead {
    /// The heads for a server under path `prefix`, `Host: host`, in `tenant`.
    pub fn new(prefix: &str, host: &str, tenant: &str) -> PatchHead {
        PatchHead {
            start: format!("PATCH {prefix}/v2/entities/").into_bytes(),
            middle: format!(
                "/attrs HTTP/1.1\r\nHost: {host}\r\nFiware-Service: {tenant}\r\n{key}\
                 Content-Type: application/json\r\nContent-Length: ",
                key = crate::http::api_key_line(),
            )
            .into_bytes(),
        }
    }

    /// Renders the complete PATCH of entity `entity` with `body` into `out`.
    pub fn render(&self, out: &mut Vec<u8>, entity: usize, body: &[u8]) {
        out.clear();
        out.extend_from_slice(&self.start);
        let _ = write!(out, "{ENTITY_TYPE}{entity}");
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
        let head = PatchHead::new("/pre", "h:1", "benchabc");
        let mut out = b"junk".to_vec();
        head.render(&mut out, 42, b"{}");
        assert_eq!(
            out,
            b"PATCH /pre/v2/entities/Room42/attrs HTTP/1.1\r\nHost: h:1\r\nFiware-Service: benchabc\r\n\
              Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                .as_slice()
        );
    }
}
