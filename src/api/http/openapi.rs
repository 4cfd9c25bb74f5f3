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
        let constraints = schemas["DiscoverRequest"]["properties"]["constraints"]["description"]
            .as_str()
            .expect("constraints description");
        let listed: BTreeSet<&str> = constraints
            .split(';')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .collect();
        let supported: BTreeSet<&str> = names(Surface::AdpConstraint).collect();
        assert_eq!(listed, supported, "POST /discover constraints");
        let ard = schemas["ArdQuery"]["properties"]["filter"]["description"]
            .as_str()
            .expect("ARD filter description");
        let listed: BTreeSet<&str> = ard
            .split(';')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .collect();
        let supported: BTreeSet<&str> = names(Surface::Ard).collect();
        assert_eq!(listed, supported, "POST /ard/search filter paths");
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
