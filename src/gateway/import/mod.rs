//! Mapping of foreign agent descriptions into the registry's record.
//!
//! Three formats describe agents the registry indexes and the gateway
//! invokes: Web of Agents documents (`/.well-known/woa.json`), A2A Agent
//! Cards and Agent Protocol `AgentDescriptor`s; AI Catalog manifests
//! (`ai_catalog`) point at documents of those formats. Each agent becomes one
//! [`AgentMetadata`](crate::domain::AgentMetadata) (SPECS.md "One agent record"; ADP "Mapping to Existing
//! Formats" gives the table), and the source is kept in the record's
//! `source` member (`{format, url, document}`) so anyone can see what the
//! record was made from.
//!
//! Everything here is pure: the caller fetches the documents (through the
//! outbound guard) and stores the records (through `normalise_and_validate`).
//! Two kinds of problems are told apart:
//! - a source that breaks its own format is refused with a [`FieldError`]
//!   whose pointer leads into the *source* document, so its publisher can
//!   fix it;
//! - a member that is fine in the source but that the registry cannot hold
//!   (an over-long tag, a media type without '/', an example longer than the
//!   registry keeps) is dropped and noted in `source.dropped` as
//!   `{pointer, reason}`, so one oddity does not keep an agent out.
//!
//! Unknown members of a source are not copied into the record (their names
//! could collide with the record's own); they stay in `source.document`.
//!
//! Each format has its own module (`woa`, `a2a`, `agent_protocol`), so a
//! format's mapping and its tests can be read, and changed, alone. This
//! module keeps what all of them share, so the two rules above are applied
//! the same way everywhere: the binding protocol names, reading a source
//! object with pointers (`Obj`, `http_url`), the tag and text checks of the
//! registry (`tag_problem`, `text_problem`, `add_tag`), the notes of what was
//! dropped (`Dropped`) and the record's `source` member.

use serde_json::{json, Map, Value};
use url::Url;

use crate::domain::validate::{MAX_TAGS, MAX_TAG_LEN};
use crate::domain::FieldError;

mod a2a;
mod agent_protocol;
mod ai_catalog;
mod woa;

pub use a2a::a2a_card;
pub use agent_protocol::ap_descriptor;
pub use ai_catalog::{
    map_document, merge, read_catalog, CatalogItem, CatalogRead, EntryFormat, RegistryRef,
};
pub use woa::{is_woa_agent_id, woa_document, woa_token, Skipped, UnsupportedTransport, WoaImport};

type Result<T> = std::result::Result<T, FieldError>;

/// Appends one reference token to a JSON pointer (RFC 6901 escaping).
fn ptr(base: &str, token: impl std::fmt::Display) -> String {
    let token = crate::domain::validate::pointer_token(&token.to_string());
    format!("{base}/{token}")
}

/// A JSON object of a source document with its pointer, so every accessor
/// names the member it refuses.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    at: String,
}

impl<'a> Obj<'a> {
    fn of(value: &'a Value, at: impl Into<String>, what: &str) -> Result<Self> {
        let at = at.into();
        match value.as_object() {
            Some(map) => Ok(Self { map, at }),
            None => Err(FieldError::new(at, format!("must be {what}"))),
        }
    }

    fn at(&self, key: &str) -> String {
        ptr(&self.at, key)
    }

    /// A member; null counts as absent (serialisers often write unset
    /// optional members as null).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A required string that is not blank.
    fn text(&self, key: &str) -> Result<&'a str> {
        match self.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
            Some(Value::String(_)) => Err(FieldError::new(self.at(key), "must not be blank")),
            Some(_) => Err(FieldError::new(self.at(key), "must be a string")),
            None => Err(FieldError::new(
                self.at(key),
                "is required (a non-empty string)",
            )),
        }
    }

    /// An optional string; a blank one counts as absent.
    fn opt_text(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.trim().is_empty())),
            Some(_) => Err(FieldError::new(self.at(key), "must be a string")),
        }
    }

    /// An optional array; empty when absent.
    fn array(&self, key: &str) -> Result<&'a [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(FieldError::new(self.at(key), "must be an array")),
        }
    }

    /// An optional array of strings, each with its pointer.
    fn strings(&self, key: &str) -> Result<Vec<(String, &'a str)>> {
        let at = self.at(key);
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some(s) => Ok((ptr(&at, i), s)),
                None => Err(FieldError::new(ptr(&at, i), "must be a string")),
            })
            .collect()
    }

    /// An optional nested object.
    fn object(&self, key: &str, what: &str) -> Result<Option<Obj<'a>>> {
        self.get(key)
            .map(|v| Obj::of(v, self.at(key), what))
            .transpose()
    }
}

/// A required absolute http(s) URL with a host; plain http only when
/// allowed.
fn http_url(o: &Obj, key: &str, allow_http: bool) -> Result<Url> {
    let refuse = |why: String| FieldError::new(o.at(key), why);
    let text = o.text(key)?;
    let url = Url::parse(text).map_err(|e| refuse(format!("is not an absolute URL ({e})")))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => return Err(refuse("must use https (plain http is not allowed)".into())),
        other => return Err(refuse(format!("must be an http(s) URL, not {other}:"))),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("must name a host".into()));
    }
    Ok(url)
}

/// Members dropped because the registry cannot hold them, as `{pointer,
/// reason}` (pointers into the source document).
#[derive(Default)]
struct Dropped(Vec<Value>);

impl Dropped {
    fn note(&mut self, pointer: String, reason: impl Into<String>) {
        self.0
            .push(json!({"pointer": pointer, "reason": reason.into()}));
    }
}

/// Why the registry would refuse a (trimmed, lower-cased) tag.
fn tag_problem(tag: &str) -> Option<String> {
    if tag.is_empty() {
        Some("it is blank".into())
    } else if tag.chars().count() > MAX_TAG_LEN {
        Some(format!("it is longer than {MAX_TAG_LEN} characters"))
    } else if tag.chars().any(char::is_control) {
        Some("it contains control characters".into())
    } else {
        None
    }
}

/// Why the registry would refuse a required text of at most `max`
/// characters.
fn text_problem(text: &str, max: usize) -> Option<String> {
    if text.trim().is_empty() {
        Some("it is blank".into())
    } else if text.chars().count() > max {
        Some(format!("it is longer than {max} characters"))
    } else if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        Some("it contains control characters".into())
    } else {
        None
    }
}

/// Adds a tag-like value (a tag, a WoA capability) as the registry will
/// store it: trimmed, lower-cased, once; what it would refuse is noted.
fn add_tag(list: &mut Vec<String>, raw: &str, pointer: String, what: &str, dropped: &mut Dropped) {
    let tag = raw.trim().to_lowercase();
    let problem = match tag_problem(&tag) {
        _ if list.contains(&tag) => return,
        None if list.len() >= MAX_TAGS => format!("the registry keeps at most {MAX_TAGS}"),
        None => {
            list.push(tag);
            return;
        }
        Some(problem) => problem,
    };
    dropped.note(pointer, format!("not kept as a {what}: {problem}"));
}

/// The record's `source` member: where it came from and what it said.
fn source(format: &str, url: &Url, document: Value, dropped: Dropped) -> Value {
    let mut source = json!({"format": format, "url": url.as_str(), "document": document});
    if !dropped.0.is_empty() {
        source["dropped"] = Value::Array(dropped.0);
    }
    source
}

/// What the tests of every format share.
#[cfg(test)]
mod test_support {
    use url::Url;

    use crate::domain::validate::normalise_and_validate;
    use crate::domain::{AgentMetadata, Limits};

    pub(super) fn url(s: &str) -> Url {
        Url::parse(s).expect("test URL parses")
    }

    /// The record as the registry stores it, which proves it can.
    pub(super) fn stored(mut meta: AgentMetadata) -> AgentMetadata {
        normalise_and_validate(&mut meta, &Limits::default())
            .unwrap_or_else(|e| panic!("the registry refuses the record: {e}"));
        meta
    }

    pub(super) fn dropped_pointers(meta: &AgentMetadata) -> Vec<String> {
        meta.extra["source"]["dropped"]
            .as_array()
            .map(|d| {
                d.iter()
                    .map(|n| n["pointer"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}
