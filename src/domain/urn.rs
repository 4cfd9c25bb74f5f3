//! ARD identifiers for records: `urn:air:<publisher>:<namespace>:<name>`
//! (ARD §4.2.1, RFC 8141), in the form the AI Catalog schema accepts:
//! `^urn:air:[a-zA-Z0-9.-]+(:[a-zA-Z0-9._-]+)+$`.
//!
//! The rule (one mapping, stable and reversible):
//! - a record whose id already is such a URN keeps it;
//! - every other id `X` becomes `urn:air:<authority>:agents:<X'>`, where
//!   `<authority>` is this registry's signing authority (the domain its
//!   published keys are bound to) and `X'` is `X` with `_` written `__` and
//!   every byte outside `A-Z a-z 0-9 . -` written `_` plus two upper-case
//!   hex digits (UTF-8 bytes): `get_weather` → `get__weather`,
//!   `https://a.example/x` → `https_3A_2F_2Fa.example_2Fx`. The schema's
//!   name characters leave no room for RFC 3986 percent-encoding.
//!
//! Back from a URN: one of this registry's own (`<authority>`, namespace
//! `agents`) decodes to the id; any other is the id itself. A record whose
//! id is literally `urn:air:<authority>:agents:…` could collide with a
//! minted one, so a lookup tries the URN as an id first (`ids_for`).

/// The namespace segment of URNs this registry mints.
pub const NAMESPACE: &str = "agents";

/// A parsed `urn:air:` identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AirUrn<'a> {
    pub publisher: &'a str,
    pub namespace: &'a str,
    /// The rest, which may hold further `:`-separated segments.
    pub name: &'a str,
}

/// Parses `urn:air:<publisher>:<namespace>:<name>` as the catalog schema
/// writes it, with the publisher a domain name of at least two labels (so
/// `localhost` is refused, as the naming guide asks).
pub fn parse(s: &str) -> Option<AirUrn<'_>> {
    let rest = s.strip_prefix("urn:air:")?;
    let (publisher, rest) = rest.split_once(':')?;
    let (namespace, name) = rest.split_once(':')?;
    let segment = |seg: &str| {
        !seg.is_empty()
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    (is_domain(publisher) && segment(namespace) && name.split(':').all(segment)).then_some(AirUrn {
        publisher,
        namespace,
        name,
    })
}

/// The URN a record with `id` is known by in this registry's catalog.
pub fn for_id(id: &str, authority: &str) -> String {
    if parse(id).is_some() {
        return id.to_string();
    }
    let mut out = format!("urn:air:{authority}:{NAMESPACE}:");
    for b in id.bytes() {
        match b {
            b'_' => out.push_str("__"),
            b if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-') => out.push(b as char),
            b => out.push_str(&format!("_{b:02X}")),
        }
    }
    out
}

/// The record ids a URN may name, in the order to look them up: the URN
/// itself when it could be an id, then the id it was minted from when it is
/// one of this registry's. Empty for a malformed URN.
pub fn ids_for(urn: &str, authority: &str) -> Vec<String> {
    let Some(parsed) = parse(urn) else {
        return Vec::new();
    };
    let mut ids = vec![urn.to_string()];
    if parsed.publisher.eq_ignore_ascii_case(authority) && parsed.namespace == NAMESPACE {
        if let Some(id) = decode(parsed.name) {
            ids.push(id);
        }
    }
    ids
}

fn is_domain(s: &str) -> bool {
    let labels: Vec<&str> = s.split('.').collect();
    s.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Undoes `for_id`'s escaping; `None` for a name it could not have made.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' if bytes.get(i + 1) == Some(&b'_') => {
                out.push(b'_');
                i += 2;
            }
            b'_' => {
                let hex = s.get(i + 1..i + 3)?;
                if !hex
                    .bytes()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(&h))
                {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b':' => return None,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTH: &str = "registry.example.org";

    #[test]
    fn urn_ids_are_kept_and_others_minted_reversibly() {
        let urn = "urn:air:acme.com:finance:tax-agent";
        assert_eq!(for_id(urn, AUTH), urn);
        assert_eq!(ids_for(urn, AUTH), [urn]);
        for id in [
            "weather",
            "acme.weather-v2",
            "https://agents.example.net/a?b=c",
            "did:web:acme.com:agents:x",
            "ünïcode~",
            "100%",
        ] {
            let minted = for_id(id, AUTH);
            assert!(minted.starts_with("urn:air:registry.example.org:agents:"));
            let parsed = parse(&minted).unwrap_or_else(|| panic!("{minted} parses"));
            assert_eq!(parsed.namespace, NAMESPACE);
            assert_eq!(ids_for(&minted, AUTH).last().map(String::as_str), Some(id));
            // Stable: the same id always mints the same URN.
            assert_eq!(for_id(id, AUTH), minted);
        }
        assert_eq!(
            for_id("https://a.example/x", AUTH),
            "urn:air:registry.example.org:agents:https_3A_2F_2Fa.example_2Fx"
        );
        assert_eq!(
            for_id("get_weather", AUTH),
            "urn:air:registry.example.org:agents:get__weather"
        );
        // The catalog schema's pattern holds for every minted URN.
        let pattern = regex_lite_pattern();
        for id in ["a b", "ünïcode", "x_y:z", "100%"] {
            assert!(pattern(&for_id(id, AUTH)), "{id}");
        }
        // Another registry's URN is only ever an id.
        assert_eq!(
            ids_for("urn:air:other.example:agents:weather", AUTH),
            ["urn:air:other.example:agents:weather"]
        );
    }

    #[test]
    fn malformed_urns_are_refused() {
        for bad in [
            "",
            "weather",
            "urn:air:localhost:agent:assistant",
            "urn:air:acme.com:finance",
            "urn:air:acme.com::x",
            "urn:air:acme.com:ns:",
            "urn:air:-acme.com:ns:x",
            "urn:isbn:acme.com:ns:x",
            "urn:air:acme.com:ns:a b",
            "urn:air:acme.com:ns:%41",
            "urn:air:acme.com:ns:x~",
            "URN:AIR:acme.com:ns:x",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
            assert!(ids_for(bad, AUTH).is_empty(), "{bad:?}");
        }
        assert!(parse("urn:air:Acme.com:ns:x:y").is_some());
        // Names this registry could not have minted decode to nothing.
        for odd in ["a_", "a_4", "a_zz", "a_4a"] {
            let urn = format!("urn:air:{AUTH}:agents:{odd}");
            assert_eq!(ids_for(&urn, AUTH), vec![urn.clone()], "{odd}");
        }
    }

    /// `^urn:air:[a-zA-Z0-9.-]+(:[a-zA-Z0-9._-]+)+$`, by hand.
    fn regex_lite_pattern() -> impl Fn(&str) -> bool {
        |s: &str| {
            let Some(rest) = s.strip_prefix("urn:air:") else {
                return false;
            };
            let mut parts = rest.split(':');
            let first = parts.next().unwrap_or_default();
            let rest: Vec<&str> = parts.collect();
            !first.is_empty()
                && first
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-".contains(&b))
                && !rest.is_empty()
                && rest.iter().all(|p| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                })
        }
    }
}
