//! Validation and normalisation of agent metadata, done once when a record is
//! accepted and never at query time. Errors name the offending member with a
//! JSON pointer so publishers can fix their document without guessing.

use std::collections::HashSet;

use serde_json::Value;

use super::record::{AgentMetadata, AuthRequirement, Binding, ENVELOPE_MEMBER};

/// A rejected member: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON pointer (RFC 6901) to the member; empty for the whole document.
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pointer.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.pointer, self.message)
        }
    }
}

type Result<T = ()> = std::result::Result<T, FieldError>;

/// Bounds a record must stay within. Operators tune `max_record_bytes` and the
/// allowed endpoint schemes; the rest are fixed by design.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Size of the record's canonical JSON, in bytes.
    pub max_record_bytes: usize,
    /// URL schemes accepted for endpoints.
    pub allowed_schemes: Vec<String>,
    /// ADP examples one record may hold (at most `MAX_EXAMPLES`).
    pub max_examples: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_record_bytes: 256 * 1024,
            allowed_schemes: ["https", "http", "grpc", "grpcs", "wss", "ws"]
                .map(String::from)
                .to_vec(),
            max_examples: MAX_EXAMPLES,
        }
    }
}

pub const MAX_ID_LEN: usize = 512;
pub const MAX_NAME_LEN: usize = 256;
pub const MAX_DESCRIPTION_LEN: usize = 16 * 1024;
pub const MAX_TAGS: usize = 64;
pub const MAX_TAG_LEN: usize = 64;
pub const MAX_EXAMPLES: usize = 256;
pub const MAX_EXAMPLE_TEXT_LEN: usize = 2048;
pub const MAX_OPERATIONS: usize = 128;
pub const MAX_BINDINGS: usize = 32;
pub const MAX_URL_LEN: usize = 2048;
pub const MAX_SHORT_TEXT_LEN: usize = 1024;
/// How far a publisher's `updated_at` may run ahead of the registry's clock.
/// A later one is refused: stored, it would make every honest refresh until
/// that date "older than what is stored" (`stale_metadata`), locking the
/// owner out of their own record. Five minutes covers clocks that are merely
/// unsynchronised.
pub const MAX_CLOCK_SKEW_SECS: i64 = 300;

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Checks an agent id: an absolute URI, or a DNS-style name / registry-local
/// token of unreserved characters.
pub fn validate_id(id: &str, pointer: &str) -> Result {
    if id.is_empty() {
        return Err(FieldError::new(pointer, "must not be empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(FieldError::new(
            pointer,
            format!("must be at most {MAX_ID_LEN} bytes"),
        ));
    }
    if has_control(id) || id.chars().any(char::is_whitespace) {
        return Err(FieldError::new(
            pointer,
            "must not contain whitespace or control characters",
        ));
    }
    // A path of `.` or `..` is removed by every URL resolver (RFC 3986
    // 5.2.4): `/agents/..` would never reach the record.
    if id == "." || id == ".." {
        return Err(FieldError::new(pointer, "must not be '.' or '..'"));
    }
    if id.contains(':') {
        let uri = url::Url::parse(id).map_err(|e| {
            FieldError::new(
                pointer,
                format!("contains ':' but is not an absolute URI ({e})"),
            )
        })?;
        if id.len() <= uri.scheme().len() + 1 {
            return Err(FieldError::new(
                pointer,
                "is a URI with nothing after its scheme",
            ));
        }
        return Ok(());
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '~' | '-'))
    {
        return Err(FieldError::new(
            pointer,
            "must be an absolute URI, a DNS-style name or a token of letters, digits, '.', '_', '~' and '-'",
        ));
    }
    Ok(())
}

/// Whether `value` may stand in a record's short text member (such as
/// `instructions`).
pub(crate) fn short_text(value: &str) -> bool {
    validate_text(value, "", MAX_SHORT_TEXT_LEN, false).is_ok()
}

fn validate_text(value: &str, pointer: &str, max: usize, required: bool) -> Result {
    if required && value.trim().is_empty() {
        return Err(FieldError::new(
            pointer,
            "is required and must not be blank",
        ));
    }
    if value.chars().count() > max {
        return Err(FieldError::new(
            pointer,
            format!("must be at most {max} characters"),
        ));
    }
    if value
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return Err(FieldError::new(
            pointer,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Trims, lower-cases and de-duplicates a tag list in place, keeping first
/// occurrences in order.
pub fn normalise_tags(tags: &mut Vec<String>, pointer: &str) -> Result {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(tags.len());
    for (i, tag) in tags.iter().enumerate() {
        let t = tag.trim().to_lowercase();
        let p = format!("{pointer}/{i}");
        if t.is_empty() {
            return Err(FieldError::new(p, "must not be blank"));
        }
        if t.chars().count() > MAX_TAG_LEN {
            return Err(FieldError::new(
                p,
                format!("must be at most {MAX_TAG_LEN} characters"),
            ));
        }
        if has_control(&t) {
            return Err(FieldError::new(p, "must not contain control characters"));
        }
        if seen.insert(t.clone()) {
            out.push(t);
        }
    }
    if out.len() > MAX_TAGS {
        return Err(FieldError::new(
            pointer,
            format!("must hold at most {MAX_TAGS} distinct entries"),
        ));
    }
    *tags = out;
    Ok(())
}

/// Checks that an endpoint is an absolute URL with an allowed scheme.
pub fn validate_url(value: &str, pointer: &str, limits: &Limits) -> Result {
    if value.len() > MAX_URL_LEN {
        return Err(FieldError::new(
            pointer,
            format!("must be at most {MAX_URL_LEN} bytes"),
        ));
    }
    let url = url::Url::parse(value)
        .map_err(|e| FieldError::new(pointer, format!("is not an absolute URL ({e})")))?;
    if !limits.allowed_schemes.iter().any(|s| s == url.scheme()) {
        return Err(FieldError::new(
            pointer,
            format!(
                "scheme '{}' is not allowed (allowed: {})",
                url.scheme(),
                limits.allowed_schemes.join(", ")
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::new(pointer, "must name a host"));
    }
    Ok(())
}

fn validate_time(value: &Option<String>, pointer: &str) -> Result {
    if let Some(v) = value {
        if super::time::parse(v).is_none() {
            return Err(FieldError::new(
                pointer,
                "must be an RFC 3339 timestamp such as 2026-05-08T00:00:00Z",
            ));
        }
    }
    Ok(())
}

/// Refuses a timestamp later than the registry's clock allows for skew.
fn not_ahead_of_now(value: &Option<String>, pointer: &str) -> Result {
    let Some(t) = value.as_deref().and_then(super::time::parse) else {
        return Ok(());
    };
    let latest = time::OffsetDateTime::now_utc() + time::Duration::seconds(MAX_CLOCK_SKEW_SECS);
    if t > latest {
        return Err(FieldError::new(
            pointer,
            format!(
                "is later than the registry's clock ({}) by more than the {MAX_CLOCK_SKEW_SECS} s \
                 of skew allowed; a record dated in the future would refuse its own refreshes \
                 as stale until then",
                super::time::now()
            ),
        ));
    }
    Ok(())
}

/// Compiles a JSON Schema as a 2020-12 document. External references are not
/// fetched, so a schema that needs one is rejected rather than resolved.
pub fn compile_schema(schema: &Value, pointer: &str) -> Result<jsonschema::Validator> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(FieldError::new(
            pointer,
            "must be a JSON Schema (an object or a boolean)",
        ));
    }
    jsonschema::draft202012::new(schema).map_err(|e| {
        FieldError::new(
            pointer,
            format!("is not a valid JSON Schema 2020-12 document: {e}"),
        )
    })
}

/// Validates `instance` against a compiled schema; the error names the first
/// failing member inside the instance.
pub fn check_instance(
    validator: &jsonschema::Validator,
    instance: &Value,
    pointer: &str,
) -> Result {
    /// Longest failing value quoted in the message. The message quotes it,
    /// and the error body carries the message several times: a client's
    /// 100 KB string came back as 600 KB. The pointer names it anyway.
    const MAX_QUOTED: usize = 256;
    match validator.validate(instance) {
        Ok(()) => Ok(()),
        Err(e) => {
            let message = if e.instance().to_string().len() > MAX_QUOTED {
                e.masked_with("the value").to_string()
            } else {
                e.to_string()
            };
            Err(FieldError::new(
                format!("{pointer}{}", e.instance_path().as_str()),
                format!("does not match its schema: {message}"),
            ))
        }
    }
}

fn validate_binding(b: &mut Binding, pointer: &str, limits: &Limits) -> Result {
    b.protocol = b.protocol.trim().to_ascii_lowercase();
    if b.protocol.is_empty() {
        return Err(FieldError::new(
            format!("{pointer}/protocol"),
            "is required",
        ));
    }
    if b.protocol.len() > 64
        || !b
            .protocol
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '+' | '_' | '/'))
    {
        return Err(FieldError::new(
            format!("{pointer}/protocol"),
            "must be a short protocol identifier such as 'https'",
        ));
    }
    if b.endpoint.is_empty() {
        return Err(FieldError::new(
            format!("{pointer}/endpoint"),
            "is required",
        ));
    }
    validate_url(&b.endpoint, &format!("{pointer}/endpoint"), limits)?;
    for (i, m) in b.media_types.iter().enumerate() {
        if !m.contains('/') || has_control(m) || m.len() > 255 {
            return Err(FieldError::new(
                format!("{pointer}/media_types/{i}"),
                "must be a media type such as application/json",
            ));
        }
    }
    if let Some(im) = &b.interaction_model {
        validate_text(im, &format!("{pointer}/interaction_model"), 64, true)?;
    }
    binding_headers(b)
        .map_err(|e| FieldError::new(format!("{pointer}{}", e.pointer), e.message))?;
    Ok(())
}

/// Most headers one binding may declare.
pub const MAX_BINDING_HEADERS: usize = 16;
/// Longest value of a declared header.
pub const MAX_HEADER_VALUE_LEN: usize = 1024;

/// The headers a binding declares for every request to its endpoint (its
/// `headers` member, `{"X-Region": "eu"}`: settings the agent needs that
/// are no secret, such as a server.json remote's fixed headers), each a
/// name `agent_header` accepts with a value an HTTP header can carry.
/// Refusals point into the binding (`/headers/X-Region`).
pub fn binding_headers(b: &Binding) -> Result<Vec<(String, String)>> {
    let Some(declared) = b.extra.get("headers") else {
        return Ok(Vec::new());
    };
    let declared = declared.as_object().ok_or_else(|| {
        FieldError::new(
            "/headers",
            "must be an object of header names and their values",
        )
    })?;
    if declared.len() > MAX_BINDING_HEADERS {
        return Err(FieldError::new(
            "/headers",
            format!("must hold at most {MAX_BINDING_HEADERS} headers"),
        ));
    }
    declared
        .iter()
        .map(|(name, value)| {
            let at = format!("/headers/{}", pointer_token(name));
            let value = value
                .as_str()
                .ok_or_else(|| FieldError::new(&at, "must be a string"))?;
            declared_header(name, value).map_err(|m| FieldError::new(&at, m))?;
            Ok((name.clone(), value.to_string()))
        })
        .collect()
}

/// True for a value any HTTP request and gRPC call can carry in a header:
/// visible ASCII, spaces and tabs (`http` alone would also pass bytes past
/// ASCII, which gRPC metadata cannot carry and many servers misread).
pub fn header_value(value: &str) -> bool {
    value.is_ascii() && http::HeaderValue::from_str(value).is_ok()
}

/// Checks one header a binding declares: a name `agent_header` accepts,
/// and a value an HTTP header can carry.
pub fn declared_header(name: &str, value: &str) -> std::result::Result<(), String> {
    agent_header(name)?;
    if value.len() > MAX_HEADER_VALUE_LEN || !header_value(value) {
        return Err(format!(
            "must be a string of at most {MAX_HEADER_VALUE_LEN} visible ASCII characters and spaces"
        ));
    }
    Ok(())
}

/// Headers the gateway sends nothing else in (a credential, a binding's
/// declared header): those that frame the message or its connection, and
/// those it sets itself for a protocol (MCP's session, A2A's version, the
/// caller's idempotency key). Sent in one of them, a credential or setting
/// would replace what the call needs, or be replaced by it.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "accept",
    "accept-encoding",
    "user-agent",
    "idempotency-key",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "a2a-version",
];

/// Checks the name of a header the gateway sends to an agent: the one its
/// credential travels in (a record's `authentication.header`, a server.json
/// remote's secret header, `[[gateway.credentials]] header`) or one a
/// binding declares (`binding_headers`), so a name no HTTP request or gRPC
/// call can carry is refused where it is written, not at every call.
pub fn agent_header(name: &str) -> std::result::Result<(), String> {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() || name.len() > 128 {
        return Err(format!(
            "'{name}' is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, at most 128)"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("grpc-") {
        return Err(format!(
            "'{name}' is a header the gateway sets itself for the call; nothing else can travel in it"
        ));
    }
    Ok(())
}

fn validate_auth(a: &AuthRequirement, pointer: &str) -> Result {
    if let Some(kind) = &a.kind {
        validate_text(kind, &format!("{pointer}/type"), 64, true)?;
    }
    if let Some(header) = a.extra.get("header") {
        let at = format!("{pointer}/header");
        let name = header.as_str().ok_or_else(|| {
            FieldError::new(
                &at,
                "must be a string: the HTTP header the credential is sent in",
            )
        })?;
        agent_header(name).map_err(|m| FieldError::new(&at, m))?;
    }
    if let Some(i) = &a.instructions {
        validate_text(
            i,
            &format!("{pointer}/instructions"),
            MAX_SHORT_TEXT_LEN,
            false,
        )?;
    }
    Ok(())
}

/// A member name as a JSON pointer token (RFC 6901).
pub fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Refuses agent metadata (as JSON) holding an integer beyond ±2^53, named
/// by its pointer. Checked on a JSON request before it becomes protobuf
/// (`convert::metadata_from_json`), where it would be rounded silently,
/// and on every record validated (those a service builds, by import, say).
pub fn exact_integers(metadata: &Value) -> Result {
    let mut pointer = String::new();
    match inexact_integer(metadata, &mut pointer) {
        Some(n) => Err(FieldError::new(
            pointer,
            format!("{n} is an integer beyond 2^53, which the registry cannot keep exactly (schemas and extension members travel through its gRPC core as protobuf Struct, whose numbers are doubles); send it as a string"),
        )),
        None => Ok(()),
    }
}

/// The first integer in `v` beyond ±2^53, leaving its JSON pointer in
/// `pointer`. Past 2^53 a double holds only some integers, and those come
/// back in exponent form: stored as a double, the integer would come back
/// as another number than the client sent, signed as if it were what the
/// client sent. A binding's `priority` is a typed integer and kept exactly.
fn inexact_integer(v: &Value, pointer: &mut String) -> Option<serde_json::Number> {
    let len = pointer.len();
    let binding = pointer
        .strip_prefix("/bindings/")
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    let mut within = |key: &str, v: &Value| {
        pointer.push('/');
        pointer.push_str(&pointer_token(key));
        let found = inexact_integer(v, pointer);
        if found.is_none() {
            pointer.truncate(len);
        }
        found
    };
    match v {
        Value::Number(n) => {
            const EXACT: u64 = 1 << 53;
            let magnitude = n.as_u64().or(n.as_i64().map(i64::unsigned_abs));
            magnitude.is_some_and(|m| m > EXACT).then(|| n.clone())
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| within(&i.to_string(), item)),
        Value::Object(m) => m
            .iter()
            .filter(|(k, _)| !(binding && *k == "priority"))
            .find_map(|(k, v)| within(k, v)),
        _ => None,
    }
}

/// Whether serialised JSON has a run of 16 digits (2^53 has 16): only then
/// can it hold an integer beyond 2^53, which is looked for exactly. Most
/// records have none, and are spared building their JSON tree.
fn may_hold_long_integer(json: &[u8]) -> bool {
    json.split(|b| !b.is_ascii_digit())
        .any(|run| run.len() >= 16)
}

/// Normalises a record (tags, protocols, the AIDIP endpoint as a binding, auth
/// and authentication in step) and validates it. The id must already be set.
pub fn normalise_and_validate(meta: &mut AgentMetadata, limits: &Limits) -> Result {
    // The envelope member is the registry's and read-only; a client that PUTs
    // back what it got from GET must not be refused for it.
    meta.extra.shift_remove(ENVELOPE_MEMBER);
    if let Some(pointer) = meta.clashing_member() {
        return Err(FieldError::new(
            &pointer,
            "an unknown member may not reuse the name of a member the record defines; set that field instead",
        ));
    }

    validate_id(&meta.id, "/id")?;
    validate_text(&meta.name, "/name", MAX_NAME_LEN, true)?;
    validate_text(&meta.description, "/description", MAX_DESCRIPTION_LEN, true)?;
    if let Some(v) = &meta.version {
        validate_text(v, "/version", 128, true)?;
    }
    if let Some(p) = &meta.publisher {
        validate_text(p, "/publisher", MAX_NAME_LEN, true)?;
    }
    normalise_tags(&mut meta.tags, "/tags")?;
    normalise_tags(&mut meta.capabilities, "/capabilities")?;
    normalise_tags(&mut meta.supported_languages, "/supported_languages")?;
    validate_time(&meta.updated_at, "/updated_at")?;
    validate_time(&meta.expires_at, "/expires_at")?;
    not_ahead_of_now(&meta.updated_at, "/updated_at")?;

    // ADP auth and AIDIP authentication are one concept: keep both in step.
    match (&meta.auth, &meta.authentication) {
        (Some(a), None) => meta.authentication = Some(a.clone()),
        (None, Some(a)) => meta.auth = Some(a.clone()),
        // Storing both would leave ADP and AIDIP readers told different
        // things about the same agent.
        (Some(a), Some(b)) if a != b => {
            return Err(FieldError::new(
                "/auth",
                "differs from /authentication: they are one requirement under ADP's and AIDIP's \
                 names; send one of them, or both the same",
            ))
        }
        _ => {}
    }
    if let Some(a) = &meta.authentication {
        validate_auth(a, "/authentication")?;
    }
    if let Some(a) = &meta.auth {
        validate_auth(a, "/auth")?;
    }

    if meta.bindings.len() > MAX_BINDINGS {
        return Err(FieldError::new(
            "/bindings",
            format!("must hold at most {MAX_BINDINGS} entries"),
        ));
    }
    for (i, b) in meta.bindings.iter_mut().enumerate() {
        validate_binding(b, &format!("/bindings/{i}"), limits)?;
    }
    if let Some(ep) = &meta.endpoint {
        validate_url(ep, "/endpoint", limits)?;
        if !meta.bindings.iter().any(|b| &b.endpoint == ep) {
            meta.bindings.push(Binding {
                protocol: "https".into(),
                endpoint: ep.clone(),
                ..Default::default()
            });
        }
    }
    if meta.bindings.is_empty() {
        return Err(FieldError::new(
            "/bindings",
            "at least one binding (or an AIDIP endpoint) is required",
        ));
    }

    if let Some(s) = &meta.inputs {
        compile_schema(s, "/inputs")?;
    }
    if let Some(s) = &meta.outputs {
        compile_schema(s, "/outputs")?;
    }
    if meta.operations.len() > MAX_OPERATIONS {
        return Err(FieldError::new(
            "/operations",
            format!("must hold at most {MAX_OPERATIONS} entries"),
        ));
    }
    let mut names = HashSet::new();
    for (i, op) in meta.operations.iter().enumerate() {
        let p = format!("/operations/{i}");
        validate_text(&op.name, &format!("{p}/name"), MAX_NAME_LEN, true)?;
        if !names.insert(op.name.as_str()) {
            return Err(FieldError::new(
                format!("{p}/name"),
                format!("duplicates operation name '{}'", op.name),
            ));
        }
        if let Some(d) = &op.description {
            validate_text(d, &format!("{p}/description"), MAX_DESCRIPTION_LEN, false)?;
        }
        let inputs = op
            .inputs
            .as_ref()
            .map(|s| compile_schema(s, &format!("{p}/inputs")))
            .transpose()?;
        let outputs = op
            .outputs
            .as_ref()
            .map(|s| compile_schema(s, &format!("{p}/outputs")))
            .transpose()?;
        for (j, ex) in op.examples.iter().enumerate() {
            let ep = format!("{p}/examples/{j}");
            if let (Some(v), Some(input)) = (&inputs, &ex.input) {
                check_instance(v, input, &format!("{ep}/input"))?;
            }
            if let (Some(v), Some(output)) = (&outputs, &ex.output) {
                check_instance(v, output, &format!("{ep}/output"))?;
            }
        }
    }

    let max_examples = limits.max_examples.min(MAX_EXAMPLES);
    if meta.examples.len() > max_examples {
        return Err(FieldError::new(
            "/examples",
            format!("must hold at most {max_examples} entries"),
        ));
    }
    for (i, ex) in meta.examples.iter_mut().enumerate() {
        let p = format!("/examples/{i}");
        validate_text(&ex.text, &format!("{p}/text"), MAX_EXAMPLE_TEXT_LEN, true)?;
        normalise_tags(&mut ex.tags, &format!("{p}/tags"))?;
        if let Some(s) = &ex.input_schema {
            compile_schema(s, &format!("{p}/input_schema"))?;
        }
        if let Some(s) = &ex.output_schema {
            compile_schema(s, &format!("{p}/output_schema"))?;
        }
    }

    let stored = serde_json::to_vec(meta).ok();
    if stored.as_deref().is_some_and(may_hold_long_integer) {
        exact_integers(&serde_json::to_value(&*meta).unwrap_or_default())?;
    }
    let size = stored.as_ref().map_or(usize::MAX, Vec::len);
    if size > limits.max_record_bytes {
        return Err(FieldError::new(
            "",
            format!(
                "record is {size} bytes, larger than the limit of {} bytes",
                limits.max_record_bytes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_a_double_cannot_hold_are_refused_by_pointer() {
        let check = |v: Value| {
            let mut meta: AgentMetadata = serde_json::from_value(v).unwrap();
            normalise_and_validate(&mut meta, &Limits::default())
        };
        let meta = |extra: Value| {
            let mut v = json!({"id": "a", "name": "n", "description": "d",
                "bindings": [{"protocol": "https", "endpoint": "https://a.example", "priority": 9_007_199_254_740_993_i64}]});
            if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
                m.extend(e);
            }
            check(v)
        };
        // Up to 2^53 (and any fraction, already a double) is kept; so is
        // a binding's typed priority, and long digit runs in strings.
        meta(json!({"x-max": 9_007_199_254_740_992_u64, "x-f": 1.5e300, "x-phone": "12345678901234567"}))
            .unwrap();
        let refused =
            meta(json!({"x-schema": {"a/b": [1, {"maximum": 9_007_199_254_740_993_u64}]}}))
                .unwrap_err();
        assert_eq!(refused.pointer, "/x-schema/a~1b/1/maximum");
        assert!(
            refused.message.contains("9007199254740993"),
            "{}",
            refused.message
        );
        let refused = meta(json!({"x-min": -9_007_199_254_740_993_i64})).unwrap_err();
        assert_eq!(refused.pointer, "/x-min");
        let v = json!({"id": "a", "name": "n", "description": "d",
            "bindings": [{"protocol": "https", "endpoint": "https://a.example", "x-n": u64::MAX}]});
        assert_eq!(check(v).unwrap_err().pointer, "/bindings/0/x-n");
    }

    fn meta(v: Value) -> AgentMetadata {
        serde_json::from_value(v).expect("test fixture parses")
    }

    fn minimal() -> Value {
        json!({
            "id": "https://example.net/agents/minimal",
            "name": "Minimal Agent",
            "description": "Answers short factual questions.",
            "bindings": [{"protocol": "https", "endpoint": "https://example.net/agent/invoke"}]
        })
    }

    fn check(v: Value) -> Result<AgentMetadata> {
        let mut m = meta(v);
        normalise_and_validate(&mut m, &Limits::default()).map(|_| m)
    }

    #[test]
    fn adp_d0_minimal_record_is_accepted() {
        assert!(check(minimal()).is_ok());
    }

    #[test]
    fn tags_are_trimmed_lowercased_and_deduplicated() {
        let mut v = minimal();
        v["tags"] = json!([" NLP ", "nlp", "Translation", "translation "]);
        let m = check(v).unwrap();
        assert_eq!(m.tags, vec!["nlp", "translation"]);
    }

    #[test]
    fn aidip_endpoint_becomes_a_binding_and_auth_is_mirrored() {
        let v = json!({
            "id": "agent-12345", "name": "T", "description": "d",
            "endpoint": "https://api.example.com/agents/translate",
            "authentication": {"type": "api_key"}
        });
        let m = check(v).unwrap();
        assert_eq!(m.bindings.len(), 1);
        assert_eq!(m.bindings[0].protocol, "https");
        assert_eq!(
            m.auth.as_ref().and_then(|a| a.kind.as_deref()),
            Some("api_key")
        );
    }

    #[test]
    fn a_credential_header_must_be_one_a_call_can_carry() {
        let with = |header: Value| {
            let mut v = minimal();
            v["authentication"] = json!({"type": "api_key", "header": header});
            check(v)
        };
        let m = with(json!("X-API-Key")).unwrap();
        assert_eq!(m.auth.unwrap().extra["header"], "X-API-Key");
        for (header, says) in [
            (json!("X API Key"), "not an HTTP header name"),
            (json!("X-Key\r\nX-Injected: 1"), "not an HTTP header name"),
            (json!(""), "not an HTTP header name"),
            (json!("Content-Type"), "sets itself"),
            (json!("host"), "sets itself"),
            (json!("Mcp-Session-Id"), "sets itself"),
            (json!("grpc-timeout"), "sets itself"),
            (json!(["X-Key"]), "must be a string"),
        ] {
            let e = with(header.clone()).expect_err("refused");
            assert_eq!(e.pointer, "/authentication/header", "{header}");
            assert!(e.message.contains(says), "{header}: {}", e.message);
        }
    }

    #[test]
    fn a_binding_declares_headers_a_call_can_carry() {
        let with = |headers: Value| {
            let mut v = minimal();
            v["bindings"][0]["headers"] = headers;
            check(v)
        };
        let m = with(json!({"X-Region": "eu", "X-Client": "agentry registry"})).unwrap();
        assert_eq!(
            binding_headers(&m.bindings[0]).unwrap(),
            [
                ("X-Region".to_string(), "eu".to_string()),
                ("X-Client".to_string(), "agentry registry".to_string())
            ]
        );
        let many: serde_json::Map<String, Value> =
            (0..17).map(|i| (format!("X-H{i}"), json!("v"))).collect();
        for (headers, pointer) in [
            (json!(["X-Region", "eu"]), "/bindings/0/headers"),
            (Value::Object(many), "/bindings/0/headers"),
            (json!({"X Region": "eu"}), "/bindings/0/headers/X Region"),
            (json!({"Host": "other.example"}), "/bindings/0/headers/Host"),
            (json!({"X-Region": 5}), "/bindings/0/headers/X-Region"),
            (
                json!({"X-Region": "eu\r\nX-Injected: 1"}),
                "/bindings/0/headers/X-Region",
            ),
            (json!({"X-Region": "é"}), "/bindings/0/headers/X-Region"),
            (
                json!({"X-Region": "e".repeat(1025)}),
                "/bindings/0/headers/X-Region",
            ),
            (json!({"a/b": "v"}), "/bindings/0/headers/a~1b"),
        ] {
            let e = with(headers.clone()).expect_err("refused");
            assert_eq!(e.pointer, pointer, "{headers}");
        }
    }

    #[test]
    fn conflicting_auth_and_authentication_are_refused() {
        let mut v = minimal();
        v["auth"] = json!({"type": "api_key"});
        v["authentication"] = json!({"type": "api_key"});
        assert!(check(v.clone()).is_ok(), "the same requirement twice");
        v["authentication"] = json!({"type": "oauth2"});
        let e = check(v).expect_err("two requirements");
        assert_eq!(e.pointer, "/auth");
    }

    #[test]
    fn endpoint_already_bound_is_not_duplicated() {
        let mut v = minimal();
        v["endpoint"] = json!("https://example.net/agent/invoke");
        assert_eq!(check(v).unwrap().bindings.len(), 1);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"id": "bad id", "name": "n", "description": "d", "endpoint": "https://a.b/"}),
                "/id",
            ),
            (
                json!({"id": "a\u{7}b", "name": "n", "description": "d", "endpoint": "https://a.b/"}),
                "/id",
            ),
            (
                json!({"id": "x", "name": "", "description": "d", "endpoint": "https://a.b/"}),
                "/name",
            ),
            (
                json!({"id": "x", "name": "n", "description": " ", "endpoint": "https://a.b/"}),
                "/description",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d"}),
                "/bindings",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "ftp://a.b/"}),
                "/endpoint",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "bindings": [{"protocol": "https", "endpoint": "not a url"}]}),
                "/bindings/0/endpoint",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "bindings": [{"protocol": "", "endpoint": "https://a.b"}]}),
                "/bindings/0/protocol",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/", "tags": ["ok", ""]}),
                "/tags/1",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/", "updated_at": "yesterday"}),
                "/updated_at",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/", "updated_at": "9999-12-31T23:59:59Z"}),
                "/updated_at",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/",
                    "operations": [{"name": "op", "inputs": {"type": "nonsense"}}]}),
                "/operations/0/inputs",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/",
                    "operations": [{"name": "op", "inputs": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                                    "examples": [{"input": {"text": 5}}]}]}),
                "/operations/0/examples/0/input/text",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/",
                    "operations": [{"name": "op"}, {"name": "op"}]}),
                "/operations/1/name",
            ),
            (
                json!({"id": "x", "name": "n", "description": "d", "endpoint": "https://a.b/", "examples": [{"text": ""}]}),
                "/examples/0/text",
            ),
        ];
        for (v, pointer) in cases {
            let err = check(v.clone()).expect_err(&format!("{v} should be rejected"));
            assert_eq!(err.pointer, pointer, "{v}: {err}");
        }
    }

    #[test]
    fn too_many_tags_rejected() {
        let mut v = minimal();
        v["tags"] = Value::Array((0..=MAX_TAGS).map(|i| json!(format!("t{i}"))).collect());
        assert_eq!(check(v).unwrap_err().pointer, "/tags");
    }

    #[test]
    fn oversize_record_rejected() {
        let mut v = minimal();
        v["x-blob"] = json!("a".repeat(300 * 1024));
        let err = check(v).unwrap_err();
        assert!(err.message.contains("larger than the limit"), "{err}");
    }

    #[test]
    fn unknown_fields_are_kept_and_envelope_member_dropped() {
        let mut v = minimal();
        v["com.example/rating"] = json!({"stars": 5});
        v["registry"] = json!({"owner": "someone"});
        let m = check(v).unwrap();
        assert_eq!(
            m.extra.get("com.example/rating"),
            Some(&json!({"stars": 5}))
        );
        assert!(!m.extra.contains_key("registry"));
    }

    #[test]
    fn id_forms() {
        for ok in [
            "agent-12345",
            "translator.example.com",
            "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
            "https://a.example/x",
        ] {
            assert!(validate_id(ok, "/id").is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "x:",
            ".",
            "..",
            &"a".repeat(MAX_ID_LEN + 1),
        ] {
            assert!(validate_id(bad, "/id").is_err(), "{bad}");
        }
    }
}
