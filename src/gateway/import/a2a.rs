//! A2A: an Agent Card (1.0, or 0.3) mapped into a record, so A2A agents
//! are found by the same discovery as native ones and invoked through the
//! gateway's A2A client. The card's skills, interfaces and security schemes
//! are read here, because only this format has them.
//!
//! A 1.0 card lists its interfaces in `supportedInterfaces` (`url`,
//! `protocolBinding`, `protocolVersion`) and has no top-level `url`; a 0.3
//! card has `url` with `preferredTransport` and `additionalInterfaces`, in
//! the card's `protocolVersion`. Either way every interface becomes a
//! binding with its `transport` and `protocolVersion`, which is what the
//! gateway calls it with.

use std::collections::HashSet;

use serde_json::{json, Map, Value};
use url::Url;

use super::{add_tag, http_url, ptr, source, tag_problem, text_problem, Dropped, Obj, Result};
use crate::domain::validate::{validate_url, MAX_EXAMPLES, MAX_EXAMPLE_TEXT_LEN};
use crate::domain::{
    AgentMetadata, AuthRequirement, Binding, FieldError, Limits, Operation, Protocol, TaskExample,
};

/// Maps an A2A Agent Card into a record.
///
/// Skills give the searchable signals (tags, example tasks) and one
/// operation each; every interface becomes a binding, the card's preferred
/// one first; the first `security` requirement becomes `authentication`.
/// The card's other members (protocolVersion, capabilities,
/// documentationUrl, iconUrl, ...) stay in `source.document`.
pub fn a2a_card(card: &Value, card_url: &Url) -> Result<AgentMetadata> {
    let c = Obj::of(card, "", "a JSON object (an A2A Agent Card)")?;
    let name = c.text("name")?;
    let description = c.text("description")?;
    let version = c.opt_text("version")?;
    let publisher = match c.object("provider", "an object ({organization, url})")? {
        Some(p) => p.opt_text("organization")?,
        None => None,
    };
    let mut dropped = Dropped::default();
    let (tags, examples, operations) = a2a_skills(&c, &mut dropped)?;
    let bindings = a2a_bindings(&c, &mut dropped)?;
    let authentication = a2a_auth(&c)?;
    let mut meta = AgentMetadata {
        id: card_url.to_string(),
        name: name.into(),
        description: description.into(),
        version: version.map(String::from),
        publisher: publisher.map(String::from),
        tags,
        examples,
        operations,
        bindings,
        authentication: Some(authentication),
        ..Default::default()
    };
    meta.extra.insert(
        "source".into(),
        source("a2a", card_url, card.clone(), dropped),
    );
    Ok(meta)
}

/// Tags, example tasks and operations from the card's skills.
fn a2a_skills(
    c: &Obj,
    dropped: &mut Dropped,
) -> Result<(Vec<String>, Vec<TaskExample>, Vec<Operation>)> {
    let mut tags = Vec::new();
    let mut examples = Vec::new();
    let mut operations = Vec::new();
    let mut ids = HashSet::new();
    for (i, skill) in c.array("skills")?.iter().enumerate() {
        let s = Obj::of(skill, ptr("/skills", i), "a skill object")?;
        let id = s.text("id")?;
        if !ids.insert(id) {
            return Err(FieldError::new(
                s.at("id"),
                format!("duplicates the skill id '{id}'"),
            ));
        }
        let skill_name = s.opt_text("name")?;
        let skill_description = s.opt_text("description")?;
        for (p, t) in s.strings("tags")? {
            add_tag(&mut tags, t, p, "tag", dropped);
        }
        add_tag(&mut tags, id, s.at("id"), "tag", dropped);
        let skill_tag = id.trim().to_lowercase();
        let example_tags = match tag_problem(&skill_tag) {
            None => vec![skill_tag],
            Some(_) => Vec::new(),
        };
        for (j, (p, text)) in s.strings("examples")?.into_iter().enumerate() {
            let problem = if examples.len() >= MAX_EXAMPLES {
                Some(format!(
                    "the registry keeps at most {MAX_EXAMPLES} examples"
                ))
            } else {
                text_problem(text, MAX_EXAMPLE_TEXT_LEN)
            };
            if let Some(problem) = problem {
                dropped.note(p, format!("not kept as an example: {problem}"));
                continue;
            }
            examples.push(TaskExample {
                id: Some(format!("{id}/{j}")),
                text: text.into(),
                tags: example_tags.clone(),
                ..Default::default()
            });
        }
        operations.push(Operation {
            name: id.into(),
            description: skill_description.or(skill_name).map(String::from),
            ..Default::default()
        });
    }
    Ok((tags, examples, operations))
}

/// One binding per interface, in the card's order of preference: a 1.0
/// card's `supportedInterfaces`, else a 0.3 card's `url` (priority 0) and
/// each distinct additional interface (1, 2, ...).
fn a2a_bindings(c: &Obj, dropped: &mut Dropped) -> Result<Vec<Binding>> {
    let streaming = match c.object("capabilities", "an object")? {
        None => false,
        Some(caps) => match caps.get("streaming") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(FieldError::new(caps.at("streaming"), "must be a boolean")),
        },
    };
    let mut media_types: Vec<String> = Vec::new();
    for key in ["defaultInputModes", "defaultOutputModes"] {
        for (p, mode) in c.strings(key)? {
            let mode = mode.trim();
            if !mode.contains('/') || mode.chars().any(char::is_control) || mode.len() > 255 {
                dropped.note(
                    p,
                    "not kept as a media type: it is not of the form type/subtype",
                );
            } else if !media_types.iter().any(|m| m == mode) {
                media_types.push(mode.to_string());
            }
        }
    }
    let interaction = if streaming {
        "streaming"
    } else {
        "request-response"
    };
    let binding = |endpoint: &str, transport: String, version: &str, priority: i64| Binding {
        protocol: Protocol::A2a.as_str().into(),
        endpoint: endpoint.into(),
        media_types: media_types.clone(),
        interaction_model: Some(interaction.into()),
        priority: Some(priority),
        extra: Map::from_iter([
            ("transport".to_string(), Value::String(transport)),
            ("protocolVersion".to_string(), json!(version)),
        ]),
    };
    // (pointer of the url, url, transport, version) of each interface.
    let mut interfaces: Vec<(String, String, String, String)> = Vec::new();
    let supported = c.array("supportedInterfaces")?;
    if supported.is_empty() {
        let url = http_url(c, "url", true)?;
        let version = c
            .opt_text("protocolVersion")?
            .unwrap_or("0.3.0")
            .to_string();
        let preferred = c
            .opt_text("preferredTransport")?
            .map_or_else(|| "JSONRPC".to_string(), a2a_transport);
        interfaces.push((c.at("url"), url.into(), preferred, version.clone()));
        for (i, interface) in c.array("additionalInterfaces")?.iter().enumerate() {
            let o = Obj::of(
                interface,
                ptr("/additionalInterfaces", i),
                "an interface object ({url, transport})",
            )?;
            let transport = a2a_transport(o.text("transport")?);
            interfaces.push((
                o.at("url"),
                o.text("url")?.into(),
                transport,
                version.clone(),
            ));
        }
    } else {
        for (i, interface) in supported.iter().enumerate() {
            let o = Obj::of(
                interface,
                ptr("/supportedInterfaces", i),
                "an interface object ({url, protocolBinding, protocolVersion})",
            )?;
            let transport = a2a_transport(o.text("protocolBinding")?);
            let version = o.opt_text("protocolVersion")?.unwrap_or("1.0").to_string();
            interfaces.push((o.at("url"), o.text("url")?.into(), transport, version));
        }
    }
    let mut bindings: Vec<Binding> = Vec::new();
    for (at, raw, transport, version) in interfaces {
        let storable = Url::parse(&raw)
            .map_err(|e| format!("is not an absolute URL ({e})"))
            .and_then(|u| {
                validate_url(u.as_str(), "", &Limits::default())
                    .map(|()| String::from(u))
                    .map_err(|e| e.message)
            });
        let endpoint = match storable {
            Ok(endpoint) => endpoint,
            Err(why) => {
                dropped.note(at, format!("interface not kept: its URL {why}"));
                continue;
            }
        };
        // A2A asks 0.3 cards to repeat the main interface.
        let known = bindings.iter().any(|b| {
            b.endpoint == endpoint
                && b.extra.get("transport").and_then(Value::as_str) == Some(transport.as_str())
        });
        if !known {
            let priority = i64::try_from(bindings.len()).unwrap_or(i64::MAX);
            bindings.push(binding(&endpoint, transport, &version, priority));
        }
    }
    if bindings.is_empty() {
        return Err(FieldError::new(
            "/supportedInterfaces",
            "the card declares no interface the registry can keep",
        ));
    }
    Ok(bindings)
}

/// A2A transport names are upper-case constants (JSONRPC, GRPC, HTTP+JSON).
fn a2a_transport(t: &str) -> String {
    t.trim().to_ascii_uppercase()
}

/// The record's authentication from the card's first security requirement
/// (A2A lists alternatives in order of preference; within one requirement
/// every scheme applies). All requirements are checked against the declared
/// schemes so a broken card is refused rather than half-understood.
fn a2a_auth(c: &Obj) -> Result<AuthRequirement> {
    let schemes = c.object(
        "securitySchemes",
        "an object mapping scheme names to security scheme objects",
    )?;
    // 1.0: `securityRequirements: [{schemes: {name: {list: [scope]}}}]`;
    // 0.3: `security: [{name: [scope]}]`.
    let v1 = !c.array("securityRequirements")?.is_empty();
    let (key, what) = if v1 {
        (
            "securityRequirements",
            "a security requirement object ({schemes: {name: {list}}})",
        )
    } else {
        (
            "security",
            "a security requirement object (scheme name → scopes)",
        )
    };
    let mut chosen: Option<AuthRequirement> = None;
    for (i, requirement) in c.array(key)?.iter().enumerate() {
        let outer = Obj::of(requirement, ptr(&format!("/{key}"), i), what)?;
        let r = if v1 {
            match outer.object("schemes", "an object mapping scheme names to scopes")? {
                Some(r) => r,
                None => continue,
            }
        } else {
            outer
        };
        let mut auth = AuthRequirement::default();
        let mut names = Vec::new();
        for name in r.map.keys() {
            let Some(declared) = schemes.as_ref().and_then(|s| s.get(name)) else {
                return Err(FieldError::new(
                    r.at(name),
                    format!("names the security scheme '{name}', which securitySchemes does not declare"),
                ));
            };
            let scheme = Obj::of(
                declared,
                ptr("/securitySchemes", name),
                "a security scheme object",
            )?;
            let kind = a2a_scheme(&scheme, &mut auth)?;
            auth.kind.get_or_insert(kind);
            let scopes = if v1 {
                match r.object(name, "an object ({list: [scope]})")? {
                    Some(list) => list.strings("list")?,
                    None => Vec::new(),
                }
            } else {
                r.strings(name)?
            };
            for (_, scope) in scopes {
                if !auth.scopes.iter().any(|s| s == scope) {
                    auth.scopes.push(scope.into());
                }
            }
            names.push(json!(name));
        }
        if chosen.is_none() {
            if !names.is_empty() {
                auth.extra.insert("schemes".into(), Value::Array(names));
            }
            chosen = Some(auth);
        }
    }
    // No requirement, or an empty one ({}: anonymous access allowed).
    Ok(chosen
        .filter(|a| a.kind.is_some())
        .unwrap_or_else(|| AuthRequirement {
            kind: Some("none".into()),
            ..Default::default()
        }))
}

/// The record's auth type for one A2A (OpenAPI-style) security scheme. Only
/// the first scheme of a requirement writes its details into `auth`.
fn a2a_scheme(scheme: &Obj, auth: &mut AuthRequirement) -> Result<String> {
    let first = auth.kind.is_none();
    if scheme.get("type").is_none() {
        return a2a_scheme_v1(scheme, auth, first);
    }
    Ok(match scheme.text("type")? {
        "oauth2" | "openIdConnect" => "oauth2_bearer".into(),
        "http" => match scheme.text("scheme")?.to_ascii_lowercase().as_str() {
            "bearer" => "oauth2_bearer".into(),
            other => format!("http_{other}"),
        },
        "apiKey" => {
            let place = scheme.text("in")?;
            let name = scheme.text("name")?;
            if first {
                auth.extra.insert("in".into(), json!(place));
                auth.extra.insert("name".into(), json!(name));
                if place == "header" {
                    auth.extra.insert("header".into(), json!(name));
                }
            }
            "api_key".into()
        }
        "mutualTLS" => "mtls".into(),
        other => other.to_ascii_lowercase(),
    })
}

/// A 1.0 security scheme: an object with one member naming its kind.
fn a2a_scheme_v1(scheme: &Obj, auth: &mut AuthRequirement, first: bool) -> Result<String> {
    if let Some(http) = scheme.object("httpAuthSecurityScheme", "an object ({scheme})")? {
        return Ok(match http.text("scheme")?.to_ascii_lowercase().as_str() {
            "bearer" => "oauth2_bearer".into(),
            other => format!("http_{other}"),
        });
    }
    if let Some(key) = scheme.object("apiKeySecurityScheme", "an object ({location, name})")? {
        let place = key.text("location")?;
        let name = key.text("name")?;
        if first {
            auth.extra.insert("in".into(), json!(place));
            auth.extra.insert("name".into(), json!(name));
            if place == "header" {
                auth.extra.insert("header".into(), json!(name));
            }
        }
        return Ok("api_key".into());
    }
    for (member, kind) in [
        ("oauth2SecurityScheme", "oauth2_bearer"),
        ("openIdConnectSecurityScheme", "oauth2_bearer"),
        ("mtlsSecurityScheme", "mtls"),
    ] {
        if scheme.get(member).is_some() {
            return Ok(kind.into());
        }
    }
    Err(FieldError::new(
        scheme.at.clone(),
        "is not a security scheme this registry knows (httpAuthSecurityScheme, apiKeySecurityScheme, oauth2SecurityScheme, openIdConnectSecurityScheme, mtlsSecurityScheme)",
    ))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{dropped_pointers, stored, url};
    use super::*;

    const CARD_URL: &str = "https://georoute-agent.example.com/.well-known/agent-card.json";

    fn route_planner_card() -> Value {
        json!({
            "protocolVersion": "0.3.0",
            "name": "GeoSpatial Route Planner Agent",
            "description": "Plans driving routes with live traffic and renders custom maps.",
            "url": "https://georoute-agent.example.com/a2a/v1",
            "preferredTransport": "JSONRPC",
            "additionalInterfaces": [
                {"url": "https://georoute-agent.example.com/a2a/v1", "transport": "JSONRPC"},
                {"url": "https://georoute-agent.example.com/a2a/grpc", "transport": "GRPC"},
                {"url": "https://georoute-agent.example.com/a2a/json", "transport": "HTTP+JSON"}
            ],
            "provider": {"organization": "Example Geo Services Inc.", "url": "https://www.examplegeoservices.com"},
            "iconUrl": "https://georoute-agent.example.com/icon.png",
            "version": "1.2.0",
            "documentationUrl": "https://docs.examplegeoservices.com/georoute-agent/api",
            "capabilities": {"streaming": true, "pushNotifications": true, "stateTransitionHistory": false},
            "securitySchemes": {
                "google": {"type": "openIdConnect",
                           "openIdConnectUrl": "https://accounts.google.com/.well-known/openid-configuration"}
            },
            "security": [{"google": ["openid", "profile", "email"]}],
            "defaultInputModes": ["application/json", "text/plain"],
            "defaultOutputModes": ["application/json", "image/png"],
            "skills": [
                {
                    "id": "route-optimizer-traffic",
                    "name": "Traffic-Aware Route Optimizer",
                    "description": "Calculates the fastest driving route between two or more places, using live traffic.",
                    "tags": ["maps", "routing", "navigation", "directions", "traffic"],
                    "examples": [
                        "Plan a route from Mountain View to San Francisco International Airport avoiding tolls.",
                        "{\"origin\": {\"lat\": 37.422, \"lng\": -122.084}, \"destination\": {\"lat\": 37.7749, \"lng\": -122.4194}}"
                    ],
                    "inputModes": ["application/json", "text/plain"],
                    "outputModes": ["application/json", "application/vnd.geo+json", "text/html"]
                },
                {
                    "id": "custom-map-generator",
                    "name": "Personalized Map Generator",
                    "tags": ["maps", "customization", "visualization", "cartography"],
                    "examples": [
                        "Generate a map of my road trip with every planned stop highlighted.",
                        "Show all coffee shops within a mile of Union Square on a map."
                    ],
                    "inputModes": ["application/json"],
                    "outputModes": ["image/png", "image/jpeg"]
                }
            ],
            "supportsAuthenticatedExtendedCard": true
        })
    }

    fn card(v: &Value) -> AgentMetadata {
        a2a_card(v, &url(CARD_URL)).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a2a_card_maps_per_the_adp_table() {
        let m = card(&route_planner_card());
        assert_eq!(m.id, CARD_URL);
        assert_eq!(m.name, "GeoSpatial Route Planner Agent");
        assert_eq!(
            m.description,
            "Plans driving routes with live traffic and renders custom maps."
        );
        assert_eq!(m.version.as_deref(), Some("1.2.0"));
        assert_eq!(m.publisher.as_deref(), Some("Example Geo Services Inc."));
        assert_eq!(
            m.tags,
            vec![
                "maps",
                "routing",
                "navigation",
                "directions",
                "traffic",
                "route-optimizer-traffic",
                "customization",
                "visualization",
                "cartography",
                "custom-map-generator"
            ]
        );

        let examples: Vec<(&str, &str, &[String])> = m
            .examples
            .iter()
            .map(|e| {
                (
                    e.id.as_deref().unwrap_or(""),
                    e.text.as_str(),
                    e.tags.as_slice(),
                )
            })
            .collect();
        assert_eq!(examples.len(), 4);
        assert_eq!(examples[0].0, "route-optimizer-traffic/0");
        assert!(examples[0].1.starts_with("Plan a route"));
        assert_eq!(examples[0].2, ["route-optimizer-traffic"]);
        assert_eq!(examples[3].0, "custom-map-generator/1");
        assert_eq!(examples[3].2, ["custom-map-generator"]);

        let ops: Vec<(&str, Option<&str>)> = m
            .operations
            .iter()
            .map(|o| (o.name.as_str(), o.description.as_deref()))
            .collect();
        assert_eq!(
            ops,
            vec![
                ("route-optimizer-traffic",
                 Some("Calculates the fastest driving route between two or more places, using live traffic.")),
                // No description: the skill's name.
                ("custom-map-generator", Some("Personalized Map Generator")),
            ]
        );
        assert!(m
            .operations
            .iter()
            .all(|o| o.inputs.is_none() && o.outputs.is_none()));

        // The main interface, then the additional ones; the repeated main
        // interface is not bound twice.
        let bound: Vec<(&str, &str, Option<i64>)> = m
            .bindings
            .iter()
            .map(|b| {
                (
                    b.endpoint.as_str(),
                    b.extra["transport"].as_str().unwrap_or(""),
                    b.priority,
                )
            })
            .collect();
        assert_eq!(
            bound,
            vec![
                (
                    "https://georoute-agent.example.com/a2a/v1",
                    "JSONRPC",
                    Some(0)
                ),
                (
                    "https://georoute-agent.example.com/a2a/grpc",
                    "GRPC",
                    Some(1)
                ),
                (
                    "https://georoute-agent.example.com/a2a/json",
                    "HTTP+JSON",
                    Some(2)
                ),
            ]
        );
        for b in &m.bindings {
            assert_eq!(b.protocol, "a2a");
            assert_eq!(b.interaction_model.as_deref(), Some("streaming"));
            assert_eq!(
                b.media_types,
                vec!["application/json", "text/plain", "image/png"]
            );
        }

        let auth = m.authentication.as_ref().unwrap();
        assert_eq!(auth.kind.as_deref(), Some("oauth2_bearer"));
        assert_eq!(auth.scopes, vec!["openid", "profile", "email"]);
        assert_eq!(auth.extra["schemes"], json!(["google"]));

        assert_eq!(
            m.extra["source"],
            json!({"format": "a2a", "url": CARD_URL, "document": route_planner_card()})
        );
        for member in [
            "protocolVersion",
            "capabilities",
            "documentationUrl",
            "iconUrl",
        ] {
            assert!(
                !m.extra.contains_key(member),
                "{member} stays in the source"
            );
        }
        let m = stored(m);
        assert_eq!(m.auth, m.authentication);
    }

    #[test]
    fn a2a_minimal_card_gets_one_jsonrpc_binding_and_no_auth() {
        let m = stored(card(&json!({
            "name": "Echo",
            "description": "Repeats what it is sent.",
            "url": "http://localhost:9999/",
            "preferredTransport": null,
            "skills": []
        })));
        assert_eq!(m.bindings.len(), 1);
        let b = &m.bindings[0];
        assert_eq!(
            (b.protocol.as_str(), b.endpoint.as_str()),
            ("a2a", "http://localhost:9999/")
        );
        assert_eq!(b.extra["transport"], "JSONRPC");
        assert_eq!(b.priority, Some(0));
        assert_eq!(b.interaction_model.as_deref(), Some("request-response"));
        assert!(b.media_types.is_empty());
        assert_eq!(
            m.authentication.and_then(|a| a.kind).as_deref(),
            Some("none")
        );
        assert!(m.tags.is_empty() && m.examples.is_empty() && m.operations.is_empty());
        assert!(m.extra["source"].get("dropped").is_none());
    }

    #[test]
    fn a2a_security_schemes_map_to_auth_types() {
        let cases = [
            (
                json!({"bearer": {"type": "http", "scheme": "Bearer", "bearerFormat": "JWT"}}),
                json!([{"bearer": []}]),
                "oauth2_bearer",
                json!({"schemes": ["bearer"]}),
            ),
            (
                json!({"basic": {"type": "http", "scheme": "basic"}}),
                json!([{"basic": []}]),
                "http_basic",
                json!({"schemes": ["basic"]}),
            ),
            (
                json!({"key": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}),
                json!([{"key": []}]),
                "api_key",
                json!({"in": "header", "name": "X-API-Key", "header": "X-API-Key", "schemes": ["key"]}),
            ),
            (
                json!({"key": {"type": "apiKey", "in": "query", "name": "api_key"}}),
                json!([{"key": []}]),
                "api_key",
                json!({"in": "query", "name": "api_key", "schemes": ["key"]}),
            ),
            (
                json!({"mtls": {"type": "mutualTLS"}}),
                json!([{"mtls": []}]),
                "mtls",
                json!({"schemes": ["mtls"]}),
            ),
            (
                json!({"oauth": {"type": "oauth2", "flows": {"clientCredentials": {
                 "tokenUrl": "https://auth.example.com/token", "scopes": {"routes:read": "Read routes"}}}}}),
                json!([{"oauth": ["routes:read"]}]),
                "oauth2_bearer",
                json!({"schemes": ["oauth"]}),
            ),
            // Declared but not required: anonymous access.
            (
                json!({"bearer": {"type": "http", "scheme": "bearer"}}),
                json!(null),
                "none",
                json!({}),
            ),
            // An empty requirement first: anonymous access is preferred.
            (
                json!({"bearer": {"type": "http", "scheme": "bearer"}}),
                json!([{}, {"bearer": []}]),
                "none",
                json!({}),
            ),
            // Alternatives: the first one; both schemes of it apply.
            (
                json!({"key": {"type": "apiKey", "in": "header", "name": "X-Key"},
                    "oauth": {"type": "oauth2", "flows": {}}}),
                json!([{"oauth": ["a"], "key": []}, {"key": []}]),
                "oauth2_bearer",
                json!({"schemes": ["oauth", "key"]}),
            ),
        ];
        for (schemes, security, kind, extra) in cases {
            let mut c = route_planner_card();
            c["securitySchemes"] = schemes;
            c["security"] = security.clone();
            let m = stored(card(&c));
            let auth = m.authentication.unwrap();
            assert_eq!(auth.kind.as_deref(), Some(kind), "{security}");
            assert_eq!(Value::Object(auth.extra), extra, "{security}");
        }
        let mut c = route_planner_card();
        c["securitySchemes"] = json!({"oauth": {"type": "oauth2", "flows": {}}});
        c["security"] = json!([{"oauth": ["routes:read", "maps:write"]}]);
        assert_eq!(
            card(&c).authentication.unwrap().scopes,
            vec!["routes:read", "maps:write"]
        );
    }

    #[test]
    fn a2a_members_the_registry_cannot_hold_are_dropped_and_noted() {
        let mut c = route_planner_card();
        c["skills"][0]["tags"] = json!(["Maps", "t".repeat(65), "ROUTING"]);
        c["skills"][1]["examples"] =
            json!(["", "e".repeat(MAX_EXAMPLE_TEXT_LEN + 1), "Map my commute."]);
        c["defaultInputModes"] = json!(["text", "text/plain"]);
        c["additionalInterfaces"][1]["url"] = json!("grpc.example.com:443/a2a");
        c["additionalInterfaces"][2]["url"] = json!("ftp://georoute-agent.example.com/a2a");
        let m = stored(card(&c));
        assert_eq!(&m.tags[..2], ["maps", "routing"]);
        assert_eq!(m.examples.len(), 3);
        assert_eq!(m.examples[2].text, "Map my commute.");
        assert_eq!(m.examples[2].id.as_deref(), Some("custom-map-generator/2"));
        assert_eq!(m.bindings.len(), 1);
        assert_eq!(
            m.bindings[0].media_types,
            vec!["text/plain", "application/json", "image/png"]
        );
        assert_eq!(
            dropped_pointers(&m),
            vec![
                "/skills/0/tags/1",
                "/skills/1/examples/0",
                "/skills/1/examples/1",
                "/defaultInputModes/0",
                "/additionalInterfaces/1/url",
                "/additionalInterfaces/2/url",
            ]
        );
    }

    #[test]
    fn a2a_skill_id_that_is_no_valid_tag_is_not_an_example_tag() {
        let mut c = route_planner_card();
        let id = format!("skill-{}", "x".repeat(70));
        c["skills"][1]["id"] = json!(id);
        let m = stored(card(&c));
        assert!(m.examples[2].tags.is_empty());
        assert_eq!(m.operations[1].name, id);
        assert_eq!(dropped_pointers(&m), vec!["/skills/1/id"]);
    }

    #[test]
    fn a_1_0_card_keeps_every_supported_interface_and_its_security() {
        let card = json!({
            "name": "Echo Agent",
            "description": "Echoes every message back as an artifact.",
            "version": "1.2.3",
            "supportedInterfaces": [
                {"url": "https://echo.example/jsonrpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": "https://echo.example/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
                {"url": "https://echo.example/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": true},
            "securitySchemes": {
                "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}},
                "key": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}
            },
            "securityRequirements": [{"schemes": {"key": {"list": []}}}, {"schemes": {"bearer": {}}}],
            "skills": [{"id": "echo", "name": "Echo", "description": "Echoes.", "tags": ["echo"],
                "examples": ["hello"]}]
        });
        let m = a2a_card(
            &card,
            &url("https://echo.example/.well-known/agent-card.json"),
        )
        .unwrap();
        let got: Vec<(&str, &str, &str)> = m
            .bindings
            .iter()
            .map(|b| {
                (
                    b.endpoint.as_str(),
                    b.extra["transport"].as_str().unwrap(),
                    b.extra["protocolVersion"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("https://echo.example/jsonrpc", "JSONRPC", "1.0"),
                ("https://echo.example/rest", "HTTP+JSON", "1.0"),
                ("https://echo.example/grpc", "GRPC", "1.0"),
            ]
        );
        let auth = m.authentication.unwrap();
        assert_eq!(auth.kind.as_deref(), Some("api_key"));
        assert_eq!(auth.extra["header"], "X-Key");
        // A 0.3 card's bindings carry its version.
        let old = a2a_card(&route_planner_card(), &url(CARD_URL)).unwrap();
        assert_eq!(old.bindings[0].extra["protocolVersion"], "0.3.0");
    }

    #[test]
    fn a2a_errors_name_the_member() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |c| {
                    c.as_object_mut().unwrap().remove("name");
                },
                "/name",
            ),
            (|c| c["description"] = json!("  "), "/description"),
            (
                |c| {
                    c.as_object_mut().unwrap().remove("url");
                },
                "/url",
            ),
            (|c| c["url"] = json!("/a2a/v1"), "/url"),
            (
                |c| c["url"] = json!("grpc://georoute-agent.example.com"),
                "/url",
            ),
            (|c| c["version"] = json!(1.2), "/version"),
            (|c| c["provider"] = json!("Example Geo"), "/provider"),
            (
                |c| c["provider"]["organization"] = json!(["Example"]),
                "/provider/organization",
            ),
            (
                |c| c["preferredTransport"] = json!(1),
                "/preferredTransport",
            ),
            (
                |c| c["capabilities"]["streaming"] = json!("yes"),
                "/capabilities/streaming",
            ),
            (
                |c| c["defaultOutputModes"] = json!("image/png"),
                "/defaultOutputModes",
            ),
            (
                |c| c["additionalInterfaces"][1] = json!("https://x.example"),
                "/additionalInterfaces/1",
            ),
            (
                |c| {
                    c["additionalInterfaces"][1]
                        .as_object_mut()
                        .unwrap()
                        .remove("transport");
                },
                "/additionalInterfaces/1/transport",
            ),
            (|c| c["skills"] = json!({}), "/skills"),
            (
                |c| {
                    c["skills"][0].as_object_mut().unwrap().remove("id");
                },
                "/skills/0/id",
            ),
            (
                |c| c["skills"][1]["id"] = json!("route-optimizer-traffic"),
                "/skills/1/id",
            ),
            (|c| c["skills"][0]["tags"] = json!("maps"), "/skills/0/tags"),
            (
                |c| c["skills"][1]["examples"] = json!([{"text": "x"}]),
                "/skills/1/examples/0",
            ),
            (
                |c| c["skills"][0]["description"] = json!(false),
                "/skills/0/description",
            ),
            (|c| c["security"] = json!({"google": []}), "/security"),
            (
                |c| c["security"] = json!([{"github": []}]),
                "/security/0/github",
            ),
            (
                |c| c["security"] = json!([{"google": []}, {"a/b": []}]),
                "/security/1/a~1b",
            ),
            (
                |c| c["security"] = json!([{"google": "openid"}]),
                "/security/0/google",
            ),
            (|c| c["securitySchemes"] = json!([]), "/securitySchemes"),
            (
                |c| c["securitySchemes"]["google"] = json!("oidc"),
                "/securitySchemes/google",
            ),
            (
                |c| {
                    c["securitySchemes"]["google"]
                        .as_object_mut()
                        .unwrap()
                        .remove("type");
                },
                // Without `type` it is read as a 1.0 scheme, and is none.
                "/securitySchemes/google",
            ),
            (
                |c| c["securitySchemes"]["google"] = json!({"type": "apiKey", "in": "header"}),
                "/securitySchemes/google/name",
            ),
            (
                |c| c["securitySchemes"]["google"] = json!({"type": "http"}),
                "/securitySchemes/google/scheme",
            ),
        ];
        for (edit, pointer) in cases {
            let mut c = route_planner_card();
            edit(&mut c);
            let err =
                a2a_card(&c, &url(CARD_URL)).expect_err(&format!("should be refused at {pointer}"));
            assert_eq!(err.pointer, pointer, "{err}");
        }
        assert_eq!(
            a2a_card(&json!("card"), &url(CARD_URL))
                .unwrap_err()
                .pointer,
            ""
        );
    }
}
