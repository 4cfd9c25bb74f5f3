//! The OpenAPI 3.1 document of the facade. It is written by hand, and a test
//! checks that its paths and methods are exactly the router's route table, so
//! the two cannot drift apart unnoticed.

/// The document served at `/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn document_matches_the_routes() {
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI_JSON).expect("openapi.json parses");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if method != "parameters" {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let routed: BTreeSet<(String, String)> = super::super::routes()
            .table
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented, routed, "openapi.json and the router disagree");
    }

    /// A route that always answers with a stream holds one of its
    /// caller's stream slots from the gate; the two that stream when asked
    /// to take theirs in their handlers; `/mcp` answers one event and
    /// closes.
    #[test]
    fn routes_that_stream_hold_a_stream_slot() {
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI_JSON).expect("openapi.json parses");
        let mut streaming = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                let answers = op["responses"].as_object().into_iter().flatten();
                if answers
                    .into_iter()
                    .any(|(_, r)| r["content"].get("text/event-stream").is_some())
                {
                    streaming.insert(format!("{} {path}", method.to_uppercase()));
                }
            }
        }
        for own in [
            "POST /mcp",
            "POST /agents/{id}/invoke",
            "GET /agents/{id}/get_events/{run_id}",
        ] {
            assert!(streaming.remove(own), "{own}");
        }
        for (method, path) in super::super::routes().table {
            let operation = format!("{method} {path}");
            assert_eq!(
                crate::api::gate::http_streams(&operation),
                streaming.contains(&operation),
                "{operation}"
            );
        }
    }

    #[test]
    fn filter_names_are_the_engines() {
        use crate::domain::filter::{names, Surface};
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI_JSON).expect("openapi.json parses");
        let schemas = &doc["components"]["schemas"];
        let documented: BTreeSet<&str> = schemas["SearchRequest"]["properties"]["filters"]
            ["properties"]
            .as_object()
            .expect("search filters")
            .keys()
            .map(String::as_str)
            .collect();
        let accepted: BTreeSet<&str> = names(Surface::AidipSearch).collect();
        assert_eq!(documented, accepted, "POST /agents/search filters");
        // A description that starts with the list of names it accepts,
        // comma-separated, up to the first ';'.
        let listed = |schema: &str, pointer: &str| -> BTreeSet<String> {
            schemas[schema]
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_else(|| panic!("{schema}{pointer} is described"))
                .split(';')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|n| n.trim().to_string())
                .collect()
        };
        let supported =
            |surface| -> BTreeSet<String> { names(surface).map(String::from).collect() };
        assert_eq!(
            listed("DiscoverRequest", "/properties/constraints/description"),
            supported(Surface::AdpConstraint),
            "POST /discover constraints"
        );
        assert_eq!(
            listed("ArdQuery", "/properties/filter/description"),
            supported(Surface::Ard),
            "POST /ard/search filter paths"
        );
    }

    #[test]
    fn every_reference_resolves() {
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI_JSON).expect("openapi.json parses");
        fn walk(v: &serde_json::Value, doc: &serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::String(r)) = m.get("$ref") {
                        let pointer = r.trim_start_matches('#');
                        assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
                    }
                    m.values().for_each(|x| walk(x, doc));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, doc)),
                _ => {}
            }
        }
        walk(&doc, &doc);
    }
}
