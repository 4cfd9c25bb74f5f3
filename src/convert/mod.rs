//! Conversions between the generated protobuf types and the domain types.
//! `TryFrom<pb>` checks shape (enum values in range); meaning-level checks
//! stay in `domain::validate` so gRPC and JSON share them.

use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

use crate::domain::{self, FieldError};
use crate::pb;

pub mod discovery;

/// JSON value to protobuf `Value`.
pub fn json_to_pb(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_pb).collect(),
        }),
        Value::Object(m) => Kind::StructValue(map_to_struct(m)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Largest integer a double holds exactly; integral numbers up to it come
/// back as JSON integers, so `10` does not turn into `10.0`.
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

/// Protobuf `Value` to JSON value.
pub fn pb_to_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() <= EXACT_INT {
                Value::Number(Number::from(*n as i64))
            } else {
                Number::from_f64(*n)
                    .map(Value::Number)
                    .unwrap_or(Value::Null)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(pb_to_json).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_map(s)),
    }
}

pub fn map_to_struct(m: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), json_to_pb(v))).collect(),
    }
}

pub fn struct_to_map(s: &prost_types::Struct) -> Map<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), pb_to_json(v)))
        .collect()
}

fn opt_struct(m: &Map<String, Value>) -> Option<prost_types::Struct> {
    (!m.is_empty()).then(|| map_to_struct(m))
}

/// A client's protobuf `Value` as JSON, refusing a number JSON has no form
/// for. A double may be NaN or infinite and a JSON number may not (proto3's
/// JSON mapping refuses them as well); `pb_to_json` would store null in its
/// place, something other than what the client sent, and sign it.
pub fn value_from_client(v: &prost_types::Value, pointer: &str) -> Result<Value, FieldError> {
    let mut at = pointer.to_owned();
    finite(v, &mut at)?;
    Ok(pb_to_json(v))
}

/// `value_from_client` for a `Struct` whose members sit at `pointer`.
pub fn struct_from_client(
    s: &prost_types::Struct,
    pointer: &str,
) -> Result<Map<String, Value>, FieldError> {
    let mut at = pointer.to_owned();
    finite_members(s, &mut at)?;
    Ok(struct_to_map(s))
}

/// Refuses the first NaN or infinite number in `v`, naming it by its
/// pointer (built onto `pointer`). Depth is bounded by prost's decoding
/// limit.
fn finite(v: &prost_types::Value, pointer: &mut String) -> Result<(), FieldError> {
    match &v.kind {
        Some(Kind::NumberValue(n)) if !n.is_finite() => {
            let shown = match (n.is_nan(), n.is_sign_positive()) {
                (true, _) => "NaN",
                (false, true) => "Infinity",
                (false, false) => "-Infinity",
            };
            Err(FieldError::new(
                pointer.clone(),
                format!("{shown} is not a JSON number, and the registry stores JSON; send a finite number or a string"),
            ))
        }
        Some(Kind::ListValue(l)) => {
            let len = pointer.len();
            for (i, item) in l.values.iter().enumerate() {
                pointer.push('/');
                pointer.push_str(&i.to_string());
                finite(item, pointer)?;
                pointer.truncate(len);
            }
            Ok(())
        }
        Some(Kind::StructValue(s)) => finite_members(s, pointer),
        _ => Ok(()),
    }
}

fn finite_members(s: &prost_types::Struct, pointer: &mut String) -> Result<(), FieldError> {
    let len = pointer.len();
    for (key, v) in &s.fields {
        pointer.push('/');
        pointer.push_str(&domain::validate::pointer_token(key));
        finite(v, pointer)?;
        pointer.truncate(len);
    }
    Ok(())
}

/// The unknown members a client sent in the `extensions` of the message at
/// `pointer` (named as the gRPC message has them, as `clashing_member`
/// does).
fn extras(
    s: &Option<prost_types::Struct>,
    pointer: &str,
) -> Result<Map<String, Value>, FieldError> {
    s.as_ref()
        .map(|s| struct_from_client(s, &format!("{pointer}/extensions")))
        .transpose()
        .map(Option::unwrap_or_default)
}

pub fn status_to_pb(s: Option<domain::AgentStatus>) -> pb::AgentStatus {
    match s {
        None => pb::AgentStatus::Unspecified,
        Some(domain::AgentStatus::Active) => pb::AgentStatus::Active,
        Some(domain::AgentStatus::Deprecated) => pb::AgentStatus::Deprecated,
        Some(domain::AgentStatus::Inactive) => pb::AgentStatus::Inactive,
        Some(domain::AgentStatus::Deleted) => pb::AgentStatus::Deleted,
    }
}

pub fn status_from_pb(v: i32, pointer: &str) -> Result<Option<domain::AgentStatus>, FieldError> {
    match pb::AgentStatus::try_from(v) {
        Ok(pb::AgentStatus::Unspecified) => Ok(None),
        Ok(pb::AgentStatus::Active) => Ok(Some(domain::AgentStatus::Active)),
        Ok(pb::AgentStatus::Deprecated) => Ok(Some(domain::AgentStatus::Deprecated)),
        Ok(pb::AgentStatus::Inactive) => Ok(Some(domain::AgentStatus::Inactive)),
        Ok(pb::AgentStatus::Deleted) => Ok(Some(domain::AgentStatus::Deleted)),
        Err(_) => Err(FieldError::new(
            pointer,
            format!("unknown status value {v}"),
        )),
    }
}

pub fn visibility_to_pb(v: domain::Visibility) -> pb::Visibility {
    match v {
        domain::Visibility::Public => pb::Visibility::Public,
        domain::Visibility::Private => pb::Visibility::Private,
    }
}

/// Who may read a record, from a write request: `readers` imply private;
/// None when neither is given (an update keeps what is stored).
pub fn sharing_from_pb(
    visibility: i32,
    readers: &[String],
) -> Result<Option<domain::Sharing>, FieldError> {
    let readers = readers
        .iter()
        .enumerate()
        .map(|(i, r)| {
            domain::ReadGrant::try_from(r.trim().to_string())
                .map_err(|e| FieldError::new(format!("/readers/{i}"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match (visibility_from_pb(visibility)?, readers.is_empty()) {
        (None, true) => Ok(None),
        (Some(domain::Visibility::Public), false) => Err(FieldError::new(
            "/readers",
            "a public record is readable by everyone; readers apply to private records",
        )),
        (v, _) => Ok(Some(domain::Sharing {
            visibility: v.unwrap_or(domain::Visibility::Private),
            readers,
        })),
    }
}

pub fn visibility_from_pb(v: i32) -> Result<Option<domain::Visibility>, FieldError> {
    match pb::Visibility::try_from(v) {
        Ok(pb::Visibility::Unspecified) => Ok(None),
        Ok(pb::Visibility::Public) => Ok(Some(domain::Visibility::Public)),
        Ok(pb::Visibility::Private) => Ok(Some(domain::Visibility::Private)),
        Err(_) => Err(FieldError::new(
            "/visibility",
            format!("unknown visibility value {v}"),
        )),
    }
}

fn auth_to_pb(a: &domain::AuthRequirement) -> pb::AuthRequirement {
    pb::AuthRequirement {
        r#type: a.kind.clone(),
        instructions: a.instructions.clone(),
        scopes: a.scopes.clone(),
        extensions: opt_struct(&a.extra),
    }
}

fn auth_from_pb(
    a: pb::AuthRequirement,
    pointer: &str,
) -> Result<domain::AuthRequirement, FieldError> {
    Ok(domain::AuthRequirement {
        extra: extras(&a.extensions, pointer)?,
        kind: a.r#type,
        instructions: a.instructions,
        scopes: a.scopes,
    })
}

/// A record's bindings as the wire carries them.
pub fn bindings_to_pb(bindings: &[domain::Binding]) -> Vec<pb::Binding> {
    bindings
        .iter()
        .map(|b| pb::Binding {
            protocol: b.protocol.clone(),
            endpoint: b.endpoint.clone(),
            media_types: b.media_types.clone(),
            interaction_model: b.interaction_model.clone(),
            priority: b.priority,
            extensions: opt_struct(&b.extra),
        })
        .collect()
}

impl From<&domain::AgentMetadata> for pb::AgentMetadata {
    fn from(m: &domain::AgentMetadata) -> Self {
        m.clone().into()
    }
}

/// Moves the strings rather than copying them: a discovery answer builds
/// each candidate's visible metadata only to encode it.
impl From<domain::AgentMetadata> for pb::AgentMetadata {
    fn from(m: domain::AgentMetadata) -> Self {
        let schema = |v: &Option<Value>| v.as_ref().map(json_to_pb);
        pb::AgentMetadata {
            authentication: m.authentication.as_ref().map(auth_to_pb),
            auth: m.auth.as_ref().map(auth_to_pb),
            status: status_to_pb(m.status) as i32,
            operations: m
                .operations
                .into_iter()
                .map(|o| pb::Operation {
                    inputs: schema(&o.inputs),
                    outputs: schema(&o.outputs),
                    examples: o
                        .examples
                        .iter()
                        .map(|e| pb::OperationExample {
                            input: schema(&e.input),
                            output: schema(&e.output),
                            extensions: opt_struct(&e.extra),
                        })
                        .collect(),
                    extensions: opt_struct(&o.extra),
                    name: o.name,
                    description: o.description,
                })
                .collect(),
            inputs: schema(&m.inputs),
            outputs: schema(&m.outputs),
            examples: m
                .examples
                .into_iter()
                .map(|e| pb::TaskExample {
                    input_schema: schema(&e.input_schema),
                    output_schema: schema(&e.output_schema),
                    extensions: opt_struct(&e.extra),
                    id: e.id,
                    text: e.text,
                    tags: e.tags,
                    language: e.language,
                })
                .collect(),
            bindings: bindings_to_pb(&m.bindings),
            constraints: m.constraints.as_ref().map(map_to_struct),
            signature: m.signature.as_ref().map(map_to_struct),
            extensions: opt_struct(&m.extra),
            id: m.id,
            name: m.name,
            description: m.description,
            version: m.version,
            publisher: m.publisher,
            capabilities: m.capabilities,
            tags: m.tags,
            endpoint: m.endpoint,
            supported_languages: m.supported_languages,
            expires_at: m.expires_at,
            updated_at: m.updated_at,
        }
    }
}

impl TryFrom<pb::AgentMetadata> for domain::AgentMetadata {
    type Error = FieldError;

    fn try_from(m: pb::AgentMetadata) -> Result<Self, FieldError> {
        let schema = |v: Option<prost_types::Value>, pointer: &str| {
            v.as_ref()
                .map(|v| value_from_client(v, pointer))
                .transpose()
        };
        let object = |s: Option<prost_types::Struct>, pointer: &str| {
            s.as_ref()
                .map(|s| struct_from_client(s, pointer))
                .transpose()
        };
        let auth = |a: Option<pb::AuthRequirement>, pointer: &str| {
            a.map(|a| auth_from_pb(a, pointer)).transpose()
        };
        Ok(domain::AgentMetadata {
            status: status_from_pb(m.status, "/status")?,
            authentication: auth(m.authentication, "/authentication")?,
            auth: auth(m.auth, "/auth")?,
            operations: m
                .operations
                .into_iter()
                .enumerate()
                .map(|(i, o)| {
                    let at = format!("/operations/{i}");
                    Ok(domain::Operation {
                        extra: extras(&o.extensions, &at)?,
                        inputs: schema(o.inputs, &format!("{at}/inputs"))?,
                        outputs: schema(o.outputs, &format!("{at}/outputs"))?,
                        examples: o
                            .examples
                            .into_iter()
                            .enumerate()
                            .map(|(j, e)| {
                                let at = format!("{at}/examples/{j}");
                                Ok(domain::OperationExample {
                                    extra: extras(&e.extensions, &at)?,
                                    input: schema(e.input, &format!("{at}/input"))?,
                                    output: schema(e.output, &format!("{at}/output"))?,
                                })
                            })
                            .collect::<Result<_, FieldError>>()?,
                        name: o.name,
                        description: o.description,
                    })
                })
                .collect::<Result<_, FieldError>>()?,
            inputs: schema(m.inputs, "/inputs")?,
            outputs: schema(m.outputs, "/outputs")?,
            examples: m
                .examples
                .into_iter()
                .enumerate()
                .map(|(i, e)| {
                    let at = format!("/examples/{i}");
                    Ok(domain::TaskExample {
                        extra: extras(&e.extensions, &at)?,
                        input_schema: schema(e.input_schema, &format!("{at}/input_schema"))?,
                        output_schema: schema(e.output_schema, &format!("{at}/output_schema"))?,
                        id: e.id,
                        text: e.text,
                        tags: e.tags,
                        language: e.language,
                    })
                })
                .collect::<Result<_, FieldError>>()?,
            bindings: m
                .bindings
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    Ok(domain::Binding {
                        extra: extras(&b.extensions, &format!("/bindings/{i}"))?,
                        protocol: b.protocol,
                        endpoint: b.endpoint,
                        media_types: b.media_types,
                        interaction_model: b.interaction_model,
                        priority: b.priority,
                    })
                })
                .collect::<Result<_, FieldError>>()?,
            constraints: object(m.constraints, "/constraints")?,
            signature: object(m.signature, "/signature")?,
            extra: extras(&m.extensions, "")?,
            id: m.id,
            name: m.name,
            description: m.description,
            version: m.version,
            publisher: m.publisher,
            capabilities: m.capabilities,
            tags: m.tags,
            endpoint: m.endpoint,
            supported_languages: m.supported_languages,
            expires_at: m.expires_at,
            updated_at: m.updated_at,
        })
    }
}

/// A stored record as sent to clients; `expired` is judged at `now`.
pub fn record_to_pb(r: &domain::AgentRecord, now: time::OffsetDateTime) -> pb::AgentRecord {
    let e = &r.envelope;
    pb::AgentRecord {
        metadata: Some((&r.metadata).into()),
        envelope: Some(pb::RecordEnvelope {
            owner: e.owner.clone(),
            revision: e.revision,
            created_revision: e.created_revision,
            registered_at: e.registered_at.clone(),
            modified_at: e.modified_at.clone(),
            status_reason: e.status_reason.clone(),
            visibility: visibility_to_pb(e.visibility) as i32,
            deleted: e.deleted,
            expired: r.metadata.is_expired_at(now),
            publisher: e.publisher.as_ref().map(|p| pb::PublisherVerification {
                state: discovery::verification_name(p.state).into(),
                key_id: p.key_id.clone(),
                reason: p.reason.clone(),
            }),
            signature: e.signature.as_ref().map(signature_to_pb),
            provenance: e.provenance.as_ref().map(provenance_to_pb),
            owner_tenant: e.owner_tenant.clone().unwrap_or_default(),
            readers: e.readers.iter().cloned().map(String::from).collect(),
            freshness_floor: e.freshness_floor.as_ref().map(|f| pb::FreshnessFloor {
                updated_at: f.updated_at.clone(),
                version: f.version.clone(),
            }),
        }),
    }
}

pub fn signature_to_pb(s: &domain::RegistrySignature) -> pb::RegistrySignature {
    pb::RegistrySignature {
        alg: s.alg.clone(),
        authority: s.authority.clone(),
        key_id: s.key_id.clone(),
        signed_at: s.signed_at.clone(),
        value: s.value.clone(),
    }
}

fn signature_pb_to_json(sig: &pb::RegistrySignature) -> Value {
    let mut v = serde_json::json!({
        "alg": sig.alg,
        "authority": sig.authority,
        "key_id": sig.key_id,
        "signed_at": sig.signed_at,
    });
    if !sig.value.is_empty() {
        v["value"] = Value::String(sig.value.clone());
    }
    v
}

pub fn provenance_to_pb(p: &domain::Provenance) -> pb::Provenance {
    pb::Provenance {
        origin_service: p.origin_service.clone(),
        origin_authority: p.origin_authority.clone(),
        origin_signature: Some(signature_to_pb(&p.origin_signature)),
        received_at: p.received_at.clone(),
        origin_revision: p.origin_revision,
        origin_envelope_json: if p.origin_envelope.is_null() {
            String::new()
        } else {
            p.origin_envelope.to_string()
        },
        via: p.via.clone(),
    }
}

/// The JSON form of a provenance, as `domain::Provenance` serialises
/// (for stored records) plus `via` on discovery candidates.
pub fn provenance_pb_to_json(p: &pb::Provenance) -> Value {
    let mut v = serde_json::json!({
        "origin_service": p.origin_service,
        "origin_authority": p.origin_authority,
        "origin_signature": p.origin_signature.as_ref().map(signature_pb_to_json),
        "received_at": p.received_at,
        "origin_revision": p.origin_revision,
    });
    if !p.origin_envelope_json.is_empty() {
        v["origin_envelope"] = serde_json::from_str(&p.origin_envelope_json).unwrap_or(Value::Null);
    }
    if !p.via.is_empty() {
        v["via"] = serde_json::json!(p.via);
    }
    v
}

pub fn change_kind_to_pb(k: domain::ChangeKind) -> pb::ChangeKind {
    match k {
        domain::ChangeKind::Created => pb::ChangeKind::Created,
        domain::ChangeKind::Updated => pb::ChangeKind::Updated,
        domain::ChangeKind::StatusChanged => pb::ChangeKind::StatusChanged,
        domain::ChangeKind::Deleted => pb::ChangeKind::Deleted,
    }
}

/// The JSON form of a stored record: the metadata with the drafts' field
/// names, plus the read-only envelope under `registry`.
pub fn record_pb_to_json(r: &pb::AgentRecord) -> Result<Value, FieldError> {
    let meta: domain::AgentMetadata = r.metadata.clone().unwrap_or_default().try_into()?;
    let mut obj = match serde_json::to_value(&meta) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if let Some(e) = &r.envelope {
        let visibility = match pb::Visibility::try_from(e.visibility) {
            Ok(pb::Visibility::Private) => "private",
            _ => "public",
        };
        let mut env = serde_json::json!({
            "owner": e.owner,
            "revision": e.revision,
            "created_revision": e.created_revision,
            "registered_at": e.registered_at,
            "modified_at": e.modified_at,
            "visibility": visibility,
            "deleted": e.deleted,
            "expired": e.expired,
        });
        if let Some(reason) = &e.status_reason {
            env["status_reason"] = Value::String(reason.clone());
        }
        if !e.owner_tenant.is_empty() {
            env["owner_tenant"] = Value::String(e.owner_tenant.clone());
        }
        if !e.readers.is_empty() {
            env["readers"] = serde_json::json!(e.readers);
        }
        if let Some(p) = &e.publisher {
            let mut v = serde_json::json!({"state": p.state});
            if let Some(k) = &p.key_id {
                v["key_id"] = Value::String(k.clone());
            }
            if let Some(r) = &p.reason {
                v["reason"] = Value::String(r.clone());
            }
            env["publisher"] = v;
        }
        if let Some(sig) = &e.signature {
            env["signature"] = signature_pb_to_json(sig);
        }
        if let Some(p) = &e.provenance {
            env["provenance"] = provenance_pb_to_json(p);
        }
        if let Some(f) = &e.freshness_floor {
            let mut floor = Map::new();
            for (k, v) in [("updated_at", &f.updated_at), ("version", &f.version)] {
                if let Some(v) = v {
                    floor.insert(k.into(), Value::String(v.clone()));
                }
            }
            env["freshness_floor"] = Value::Object(floor);
        }
        obj.insert(domain::ENVELOPE_MEMBER.to_string(), env);
    }
    Ok(Value::Object(obj))
}

/// Converts a serde path such as `bindings[0].endpoint` to a JSON pointer.
fn serde_path_to_pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push('/');
                out.push_str(&domain::validate::pointer_token(key));
            }
            Segment::Unknown => {}
        }
    }
    out
}

/// Deserialises JSON into `T`; a member of the wrong type is named by its
/// JSON pointer.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let pointer = serde_path_to_pointer(e.path());
        FieldError::new(pointer, e.into_inner().to_string())
    })
}

/// Parses agent metadata from its JSON form (the drafts' field names). A
/// member of the wrong type is named by its JSON pointer.
pub fn metadata_from_json(v: Value) -> Result<pb::AgentMetadata, FieldError> {
    if !v.is_object() {
        return Err(FieldError::new(
            "",
            "the agent metadata must be a JSON object",
        ));
    }
    // An id that is present must be one: an empty string would otherwise
    // read as "assign one", and a client that retries would register
    // duplicates. Leaving `id` out still asks the registry for one (AIDIP).
    if v.get("id")
        .and_then(Value::as_str)
        .is_some_and(|id| id.trim().is_empty())
    {
        return Err(FieldError::new(
            "/id",
            "must not be empty; leave it out to have the registry assign one",
        ));
    }
    domain::validate::exact_integers(&v)?;
    let meta: domain::AgentMetadata = from_json(v)?;
    Ok(pb::AgentMetadata::from(&meta))
}

/// A labelled set's agent id as registered: unchanged when it is a valid
/// id, else with every character an id may not hold replaced by '-'
/// (MetaTool's `PDF&URLTool` becomes `PDF-URLTool`). Labels must be mapped
/// the same way.
pub fn dataset_id(id: &str) -> String {
    if domain::validate::validate_id(id, "/id").is_ok() {
        return id.to_string();
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '~' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Shapes one line of a labelled agent set (such as MetaTool's) into
/// agent metadata JSON: plain-string `examples` become ADP example objects,
/// a function's `parameters` (BFCL's) become `inputs`, and an agent with no binding or endpoint gets a placeholder binding under
/// the reserved `.invalid` domain (it is found, never called).
pub fn dataset_agent_json(mut v: Value) -> Result<Value, FieldError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| FieldError::new("", "an agent line must be a JSON object"))?;
    if let Some(Value::String(id)) = obj.get_mut("id") {
        *id = dataset_id(id);
    }
    // A function's `parameters` (BFCL's shape) are the agent's input schema.
    if !obj.contains_key("inputs") {
        if let Some(parameters) = obj.remove("parameters") {
            obj.insert("inputs".into(), parameters);
        }
    }
    if let Some(Value::Array(examples)) = obj.get_mut("examples") {
        for e in examples.iter_mut() {
            if let Value::String(s) = e {
                *e = serde_json::json!({ "text": s });
            }
        }
    }
    if !obj.contains_key("bindings") && !obj.contains_key("endpoint") {
        let id = obj.get("id").and_then(Value::as_str).unwrap_or("agent");
        let slug: String = id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        obj.insert(
            "bindings".into(),
            serde_json::json!([{"protocol": "https", "endpoint": format!("https://{slug}.eval.invalid/invoke")}]),
        );
    }
    Ok(v)
}

/// The JSON form of a cluster status, shared by `GET /cluster` and
/// `agentry cluster status --json`.
/// `POST /cluster/check`'s body: the gRPC report's fields, with empty
/// ones left out.
pub fn cluster_check_to_json(r: &pb::ClusterCheckReport) -> Value {
    serde_json::json!({
        "index": r.index,
        "revision": r.revision,
        "outcome": r.outcome,
        "members": r.members.iter().map(|m| {
            let mut member = serde_json::json!({
                "id": m.id,
                "raft_addr": m.raft_addr,
                "role": m.role,
                "state": m.state,
                "sections": m.sections.iter().map(|s| serde_json::json!({
                    "name": s.name,
                    "entries": s.entries,
                    "sha256": s.sha256,
                })).collect::<Vec<_>>(),
                "took_ms": m.took_ms,
            });
            if !m.differing.is_empty() {
                member["differing"] = serde_json::json!(m.differing);
            }
            if !m.error.is_empty() {
                member["error"] = serde_json::json!(m.error);
            }
            member
        }).collect::<Vec<_>>(),
    })
}

pub fn cluster_status_to_json(s: &pb::ClusterStatus) -> Value {
    let node = s.node.clone().unwrap_or_default();
    serde_json::json!({
        "node": {
            "id": node.id,
            "raft_addr": node.raft_addr,
            "role": node.role,
            "initialized": node.initialized,
            "cluster_id": (!node.cluster_id.is_empty()).then_some(&node.cluster_id),
            "term": node.term,
            "commit_index": node.commit_index,
            "applied_index": node.applied_index,
            "last_log_index": node.last_log_index,
            "snapshot_index": node.snapshot_index,
            "purged_index": node.purged_index,
            "snapshots_built": node.snapshots_built,
            "snapshots_installed": node.snapshots_installed,
            "last_snapshot_at": (!node.last_snapshot_at.is_empty()).then_some(node.last_snapshot_at),
        },
        "leader_id": (s.leader_id != 0).then_some(s.leader_id),
        "leader_raft_addr": (!s.leader_raft_addr.is_empty()).then_some(&s.leader_raft_addr),
        "replication_known": s.replication_known,
        "members": s.members.iter().map(|m| serde_json::json!({
            "id": m.id,
            "raft_addr": m.raft_addr,
            "role": m.role,
            "leader": m.leader,
            "matched_index": m.matched_index,
            "lag": m.lag,
            "refused": m.refused,
            "unreachable": m.unreachable,
        })).collect::<Vec<_>>(),
    })
}

/// An audit entry for the wire.
pub fn audit_to_pb(e: &crate::domain::audit::AuditEntry) -> pb::AuditEntry {
    pb::AuditEntry {
        seq: e.seq,
        at: e.at.clone(),
        principal: e.principal.clone().unwrap_or_default(),
        role: e.role.map(|r| r.as_str().to_string()).unwrap_or_default(),
        tenant: e.tenant.clone().unwrap_or_default(),
        address: e.address.clone().unwrap_or_default(),
        operation: e.operation.clone(),
        target: e.target.clone().unwrap_or_default(),
        outcome: e.outcome.clone(),
        message: e.message.clone().unwrap_or_default(),
        correlation_id: e.correlation_id.clone(),
        revision: e.revision,
        node: e.node,
    }
}

/// The JSON form of an audit entry (the stored entry's).
pub fn audit_pb_to_json(e: &pb::AuditEntry) -> Value {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let entry = crate::domain::audit::AuditEntry {
        seq: e.seq,
        at: e.at.clone(),
        principal: text(&e.principal),
        role: domain::Role::parse(&e.role),
        tenant: text(&e.tenant),
        address: text(&e.address),
        operation: e.operation.clone(),
        target: text(&e.target),
        outcome: e.outcome.clone(),
        message: text(&e.message),
        correlation_id: e.correlation_id.clone(),
        revision: e.revision,
        node: e.node,
    };
    serde_json::to_value(entry).unwrap_or(Value::Null)
}

/// An audit listing's filters, checked.
pub fn audit_query_from_pb(
    r: &pb::ListAuditRequest,
) -> Result<crate::domain::audit::AuditQuery, FieldError> {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let time = |s: &str, field: &str| -> Result<Option<time::OffsetDateTime>, FieldError> {
        if s.is_empty() {
            return Ok(None);
        }
        domain::time::parse(s)
            .map(Some)
            .ok_or_else(|| FieldError::new(field, format!("'{s}' is not an RFC 3339 time")))
    };
    let outcome = text(&r.outcome);
    if let Some(o) = &outcome {
        if !domain::audit::OUTCOMES.contains(&o.as_str()) {
            return Err(FieldError::new(
                "/outcome",
                format!(
                    "'{o}' is no outcome; one of {}",
                    domain::audit::OUTCOMES.join(", ")
                ),
            ));
        }
    }
    Ok(crate::domain::audit::AuditQuery {
        principal: text(&r.principal),
        target: text(&r.target),
        operation: text(&r.operation),
        outcome,
        since: time(&r.since, "/since")?,
        until: time(&r.until, "/until")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An outcome filter names a recorded outcome, or is refused with the
    /// list of those it could name.
    #[test]
    fn an_audit_outcome_filter_must_name_an_outcome() {
        let query = |outcome: &str| {
            audit_query_from_pb(&pb::ListAuditRequest {
                outcome: outcome.into(),
                ..Default::default()
            })
        };
        assert_eq!(
            query("forbidden").unwrap().outcome.as_deref(),
            Some("forbidden")
        );
        assert_eq!(query("").unwrap().outcome, None);
        let e = query("denied").unwrap_err();
        assert_eq!(e.pointer, "/outcome");
        assert!(
            e.message.contains("'denied'") && e.message.contains("cancelled"),
            "{}",
            e.message
        );
    }

    /// Signatures cover the record as served; the facade's JSON (built
    /// from protobuf) must therefore be exactly `crypto`'s served form.
    #[test]
    fn the_served_json_is_what_signatures_cover() {
        let metadata: domain::AgentMetadata = serde_json::from_value(json!({
            "id": "urn:a:1", "name": "A", "description": "d",
            "bindings": [{"protocol": "https", "endpoint": "https://a.example/x", "priority": 2}],
            "constraints": {"rate": 1.5, "n": 3}, "x-deep": {"list": [1, 2.5, null, "s"]},
            "signature": {"alg": "Ed25519", "key_id": "k", "value": "v"}
        }))
        .unwrap();
        let mut record = domain::AgentRecord {
            metadata,
            envelope: domain::Envelope {
                owner: "alice".into(),
                owner_tenant: Some("acme".into()),
                revision: 7,
                created_revision: 5,
                registered_at: "2026-01-01T00:00:00Z".into(),
                modified_at: "2026-01-02T00:00:00Z".into(),
                status_reason: Some("why".into()),
                visibility: domain::Visibility::Private,
                readers: vec![domain::ReadGrant::Tenant("globex".into())],
                deleted: false,
                publisher: Some(domain::PublisherVerification::self_asserted("unsigned")),
                signature: Some(domain::RegistrySignature {
                    alg: "Ed25519".into(),
                    authority: "r.example".into(),
                    key_id: "ed25519-00".into(),
                    signed_at: "2026-01-02T00:00:00Z".into(),
                    value: "sig".into(),
                }),
                provenance: Some(domain::Provenance {
                    origin_service: "http://b.example:8473".into(),
                    origin_authority: "b.example".into(),
                    origin_signature: domain::RegistrySignature {
                        alg: "Ed25519".into(),
                        authority: "b.example".into(),
                        key_id: "ed25519-01".into(),
                        signed_at: "2026-01-01T00:00:00Z".into(),
                        value: "osig".into(),
                    },
                    received_at: "2026-01-02T00:00:00Z".into(),
                    origin_revision: 12,
                    origin_envelope: json!({"owner": "bob", "revision": 12, "x": [1.5, null]}),
                    via: Vec::new(),
                }),
                freshness_floor: Some(domain::FreshnessFloor {
                    updated_at: Some("2026-01-01T00:00:00Z".into()),
                    version: None,
                }),
            },
        };
        let now = time::OffsetDateTime::now_utc();
        for unsigned in [false, true] {
            if unsigned {
                record.envelope.publisher = None;
                record.envelope.signature = None;
                record.envelope.provenance = None;
                record.envelope.freshness_floor = Some(domain::FreshnessFloor {
                    updated_at: None,
                    version: Some("1.2".into()),
                });
            }
            let mut served = record_pb_to_json(&record_to_pb(&record, now)).unwrap();
            if let Some(registry) = served["registry"].as_object_mut() {
                registry.remove("expired");
            }
            assert_eq!(served, crate::crypto::signature::served_form(&record));
        }
    }

    #[test]
    fn metadata_round_trips_through_protobuf() {
        let v = json!({
            "id": "agent-12345", "name": "Translator", "description": "Translates.",
            "version": "1.2.0", "publisher": "ExampleAI", "capabilities": ["translation"],
            "tags": ["nlp"], "endpoint": "https://api.example.com/t", "supported_languages": ["en", "zh"],
            "authentication": {"type": "api_key", "instructions": "X-API-Key", "x-extra": true},
            "status": "active",
            "operations": [{"name": "translateText", "inputs": {"type": "object", "maxProperties": 10},
                            "examples": [{"input": {"text": "hi"}, "output": {"t": "salut"}}]}],
            "examples": [{"id": "ex-1", "text": "Translate a menu", "tags": ["menu"]}],
            "bindings": [{"protocol": "https", "endpoint": "https://api.example.com/t", "priority": 1}],
            "constraints": {"region": "apac", "rate": 1.5},
            "updated_at": "2026-05-08T00:00:00Z",
            "signature": {"alg": "EdDSA"},
            "com.example/rating": {"stars": 5, "list": [1, "two", null]}
        });
        let meta: domain::AgentMetadata = serde_json::from_value(v.clone()).unwrap();
        let back: domain::AgentMetadata = pb::AgentMetadata::from(&meta).try_into().unwrap();
        assert_eq!(back, meta);
        let again = serde_json::to_value(&back).unwrap();
        assert_eq!(again, v, "JSON survives the protobuf encoding");
    }

    #[test]
    fn wrong_types_are_named_by_pointer() {
        let v = json!({"id": "a", "name": "n", "description": "d", "bindings": [{"protocol": "https", "endpoint": 5}]});
        assert_eq!(
            metadata_from_json(v).unwrap_err().pointer,
            "/bindings/0/endpoint"
        );
        let v = json!({"id": "a", "name": "n", "description": "d", "tags": "nlp"});
        assert_eq!(metadata_from_json(v).unwrap_err().pointer, "/tags");
        let v = json!({"id": "a", "name": "n", "description": "d", "status": "sleeping"});
        assert_eq!(metadata_from_json(v).unwrap_err().pointer, "/status");
    }

    #[test]
    fn integral_numbers_stay_integers() {
        assert_eq!(pb_to_json(&json_to_pb(&json!(10))), json!(10));
        assert_eq!(pb_to_json(&json_to_pb(&json!(-3))), json!(-3));
        assert_eq!(pb_to_json(&json_to_pb(&json!(2.5))), json!(2.5));
    }

    #[test]
    fn a_clients_non_finite_number_is_refused_where_it_is() {
        let finite = json!({"a": [1, 2.5, {"b": -1e300}], "c/d": null});
        assert_eq!(
            value_from_client(&json_to_pb(&finite), "/inputs").unwrap(),
            finite
        );
        for (n, shown) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            let mut v = json_to_pb(&json!({"a": [1, {"c/d": 0}]}));
            let Some(Kind::StructValue(top)) = &mut v.kind else {
                panic!("an object")
            };
            let Some(Kind::ListValue(list)) = &mut top.fields.get_mut("a").unwrap().kind else {
                panic!("a list")
            };
            let Some(Kind::StructValue(inner)) = &mut list.values[1].kind else {
                panic!("an object")
            };
            inner.fields.insert(
                "c/d".into(),
                prost_types::Value {
                    kind: Some(Kind::NumberValue(n)),
                },
            );
            let e = value_from_client(&v, "/inputs").unwrap_err();
            assert_eq!(e.pointer, "/inputs/a/1/c~1d");
            assert!(e.message.starts_with(shown), "{}", e.message);
            let Some(Kind::StructValue(top)) = &v.kind else {
                panic!("an object")
            };
            let e = struct_from_client(top, "/constraints").unwrap_err();
            assert_eq!(e.pointer, "/constraints/a/1/c~1d");
        }
    }
}
