//! The one JSON reader for what arrives from outside: request bodies, and
//! documents fetched for an import or a mirror.
//!
//! It differs from `serde_json::from_slice::<Value>` in one rule: an object
//! may not name a member twice. serde_json keeps the last of two, other
//! parsers the first, so `{"id": "a", "id": "b"}` means one thing to a proxy
//! or policy engine in front of the registry and another to the registry
//! (the split behind CouchDB's CVE-2017-12635). RFC 8259 leaves such
//! objects' meaning open, I-JSON (RFC 7493) forbids them, and the record
//! signatures are over RFC 8785's canonical form, which is defined for
//! I-JSON only. So a duplicate is refused with its name and position,
//! never resolved by a guess.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// `bytes` as one JSON value, every object's member names unique.
pub fn parse_json(bytes: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice::<Unique>(bytes).map(|u| u.0)
}

/// About what a JSON value holds in memory: its texts, and a word for
/// each value. What the gateway's caches count a value as.
pub fn json_bytes(v: &Value) -> usize {
    8 + match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(json_bytes).sum(),
        Value::Object(m) => m.iter().map(|(k, v)| k.len() + json_bytes(v)).sum(),
        _ => 0,
    }
}

/// A value read with duplicate member names refused at any depth.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // serde_json reads only finite numbers; a non-finite one would be
        // null, as `Value` itself makes it.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Unique::deserialize(d).map(|u| u.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom(format_args!(
                    "duplicate member name {name:?}"
                )));
            }
            let Unique(v) = map.next_value()?;
            members.insert(name, v);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_serde_json_reads() {
        let text = r#"{"a": [1, -2, 3.5, 18446744073709551615, 1e300, true, null, "\u00e9\ud83d\ude00"],
                       "b": {"c": {}, "d": []}, "z": 0, "e": "x"}"#;
        let strict = parse_json(text.as_bytes()).unwrap();
        let loose: Value = serde_json::from_str(text).unwrap();
        assert_eq!(strict, loose);
        // Member order is kept, as `preserve_order` keeps it.
        let names: Vec<&String> = strict.as_object().unwrap().keys().collect();
        assert_eq!(names, ["a", "b", "z", "e"]);
    }

    #[test]
    fn refuses_a_member_named_twice_at_any_depth() {
        for text in [
            r#"{"id": "a", "id": "b"}"#,
            r#"{"id": "a", "name": "n", "id": "a"}"#,
            r#"{"x": [{"k": 1, "k": 2}]}"#,
            r#"[{"outer": {"inner": 1, "inner": 1}}]"#,
            // The same name however it is escaped.
            r#"{"id": 1, "\u0069d": 2}"#,
        ] {
            let e = parse_json(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("duplicate member name"), "{text}: {e}");
            assert!(e.contains("line 1 column"), "{text}: {e}");
        }
        let e = parse_json(br#"{"id": "a", "id": "b"}"#).unwrap_err();
        assert!(e.to_string().contains("\"id\""), "{e}");
    }

    #[test]
    fn keeps_serde_json_s_other_refusals() {
        assert!(parse_json(b"{\"a\": 1} x").is_err(), "trailing text");
        assert!(parse_json(b"{\"a\": 1e400}").is_err(), "out of range");
        assert!(parse_json(b"").is_err(), "empty");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let e = parse_json(deep.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("recursion limit"), "{e}");
        assert_eq!(parse_json(b" 7 ").unwrap(), json!(7));
    }
}
