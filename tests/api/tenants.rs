//! Tenants and entitlements: principals of one tenant walk every read path
//! and find exactly the records shared with them; publishers write only in
//! their tenant's namespaces and within its quota.

use std::collections::BTreeSet;
use std::time::Duration;

use agentry::config::ApiKeyConfig;
use agentry::pb::{self, peering_client::PeeringClient};
use agentry::service::TenantConfig;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{minimal, Grpc, Http, TestServer, Transport, ADMIN, ALICE};

const ACME_PUB: &str = "acme-publisher-key-00001";
const DAVE: &str = "globex-reader-dave-00001";
const GINA: &str = "globex-publisher-gina-01";
const FRANK: &str = "initech-reader-frank-001";
const IVY: &str = "initech-publisher-ivy-001";

const OPEN: &str = "urn:acme:open";
const SECRET: &str = "urn:acme:secret";
const FOR_GLOBEX: &str = "urn:acme:for-globex";
const FOR_DAVE: &str = "urn:acme:for-dave";
const ALL: [&str; 4] = [OPEN, SECRET, FOR_GLOBEX, FOR_DAVE];

fn key(name: &str, role: &str, key: &str, tenant: &str) -> ApiKeyConfig {
    ApiKeyConfig {
        name: name.into(),
        role: agentry::domain::Role::parse(role).unwrap(),
        key: Some(key.into()),
        key_sha256: None,
        tenant: Some(tenant.into()),
    }
}

fn tenant(name: &str, namespace: &str, max_records: Option<u64>) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        namespaces: vec![namespace.into()],
        max_records,
    }
}

async fn start() -> TestServer {
    TestServer::start_with(|c| {
        c.tenants = vec![
            tenant("acme", "urn:acme:", None),
            tenant("globex", "urn:globex:", None),
            tenant("initech", "urn:initech:", Some(1)),
        ];
        c.api_keys.extend([
            key("pat", "publisher", ACME_PUB, "acme"),
            key("dave", "reader", DAVE, "globex"),
            key("gina", "publisher", GINA, "globex"),
            key("frank", "reader", FRANK, "initech"),
            key("ivy", "publisher", IVY, "initech"),
        ]);
    })
    .await
}

fn invoice_agent(id: &str) -> Value {
    json!({
        "id": id,
        "name": format!("Invoice translator {id}"),
        "description": "Translates invoices between currencies and languages.",
        "tags": ["invoice", "finance"],
        "capabilities": ["invoice-translation"],
        "examples": [{"text": "Translate this invoice into euros"}],
        "bindings": [{"protocol": "https", "endpoint": "https://invoices.example/run"}],
    })
}

/// Which of the four records a response mentions (ids may be URL-encoded).
fn mentioned(doc: &Value) -> BTreeSet<&'static str> {
    let text = doc.to_string().replace("%3A", ":");
    ALL.into_iter()
        .filter(|id| {
            text.match_indices(id).any(|(at, _)| {
                text[at + id.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
            })
        })
        .collect()
}

fn set(ids: &[&'static str]) -> BTreeSet<&'static str> {
    ids.iter().copied().collect()
}

async fn ok(h: &Http, method: Method, path: &str, key: &str, body: Option<Value>) -> Value {
    h.call(method, path, Some(key), body)
        .await
        .unwrap_or_else(|f| panic!("{path}: {f:?}"))
        .1
}

/// Every read path, as the principal of `key`: the records it saw on each.
async fn walk(s: &TestServer, key: &str) -> Vec<(String, BTreeSet<&'static str>)> {
    let h = Http::new(&s.http);
    let mut seen = Vec::new();
    let mut got = BTreeSet::new();
    for id in ALL {
        match h.get(Some(key), id).await {
            Ok(_) => {
                got.insert(id);
            }
            Err(f) => assert_eq!(f.http, 404, "{id}: hidden records are not found"),
        }
    }
    seen.push(("get".to_string(), got));
    seen.push((
        "list".into(),
        mentioned(&ok(&h, Method::GET, "/agents?page_size=100", key, None).await),
    ));
    let search = json!({"query": "translate invoices", "top": 50});
    seen.push((
        "search".into(),
        mentioned(&ok(&h, Method::POST, "/agents/search", key, Some(search)).await),
    ));
    let list_search = json!({"filters": {"tags": ["invoice"]}});
    seen.push((
        "search (filters only)".into(),
        mentioned(&ok(&h, Method::POST, "/agents/search", key, Some(list_search)).await),
    ));
    for scope in ["local", "federated"] {
        let body = json!({"query": "translate an invoice", "scope": scope, "limit": 50});
        seen.push((
            format!("discover {scope}"),
            mentioned(&ok(&h, Method::POST, "/discover", key, Some(body)).await),
        ));
    }
    let resolve = json!({"intent": "translate an invoice", "policy": {"max_candidates": 50}});
    seen.push((
        "resolve".into(),
        mentioned(&ok(&h, Method::POST, "/resolve", key, Some(resolve)).await),
    ));
    let mut invocable = BTreeSet::new();
    let mut describable = BTreeSet::new();
    for id in ALL {
        let path = format!("/agents/{}", Http::url_id(id));
        let input = json!({"text": "hello"});
        match h
            .call(
                Method::POST,
                &format!("{path}/invoke"),
                Some(key),
                Some(input),
            )
            .await
        {
            Err(f) if f.http == 404 => {}
            // Visible: the gateway tries the agent (which is not there).
            _ => {
                invocable.insert(id);
            }
        }
        match h
            .call(Method::GET, &format!("{path}/describe"), Some(key), None)
            .await
        {
            Err(f) if f.http == 404 => {}
            _ => {
                describable.insert(id);
            }
        }
    }
    seen.push(("invoke".into(), invocable));
    seen.push(("AP describe".into(), describable));
    seen.push((
        "AP agent list".into(),
        mentioned(&ok(&h, Method::GET, "/ap", key, None).await),
    ));
    seen.push((
        "woa.json".into(),
        mentioned(&ok(&h, Method::GET, "/.well-known/woa.json", key, None).await),
    ));
    seen.push(("watch".into(), watched(s, key).await));
    seen
}

/// The records a watch from the first revision delivers, up to the marker
/// record registered last.
async fn watched(s: &TestServer, key: &str) -> BTreeSet<&'static str> {
    let g = Grpc::connect(&s.grpc).await;
    let mut req = tonic::Request::new(pb::WatchRequest { from_revision: 1 });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let mut stream = g.client.clone().watch(req).await.unwrap().into_inner();
    let mut seen = BTreeSet::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the watch delivers up to the marker")
            .unwrap()
            .expect("stream open");
        let id = msg.record.unwrap().metadata.unwrap().id;
        if id == "urn:acme:zz-marker" {
            return seen;
        }
        seen.extend(ALL.into_iter().filter(|a| *a == id));
    }
}

#[tokio::test]
async fn every_read_path_shows_another_tenant_only_what_is_shared_with_it() {
    let s = start().await;
    let h = Http::new(&s.http);
    let publish = |id: &'static str, query: &'static str| {
        let h = &h;
        async move {
            h.call(
                Method::POST,
                &format!("/agents{query}"),
                Some(ACME_PUB),
                Some(invoice_agent(id)),
            )
            .await
            .unwrap_or_else(|f| panic!("{id}: {f:?}"));
        }
    };
    publish(OPEN, "").await;
    publish(SECRET, "?visibility=private").await;
    publish(FOR_GLOBEX, "?reader=tenant:globex").await;
    publish(FOR_DAVE, "?visibility=private&reader=principal:globex/dave").await;
    publish("urn:acme:zz-marker", "").await;
    let stored = h.get(Some(ACME_PUB), FOR_GLOBEX).await.unwrap();
    assert_eq!(stored["registry"]["visibility"], "private");
    assert_eq!(stored["registry"]["readers"], json!(["tenant:globex"]));
    assert_eq!(stored["registry"]["owner_tenant"], "acme");

    // A reader of another tenant (initech) sees the public record only; a
    // reader of globex also what is shared with globex and with him.
    for (who, key, expected) in [
        ("frank@initech", FRANK, set(&[OPEN])),
        ("dave@globex", DAVE, set(&[OPEN, FOR_GLOBEX, FOR_DAVE])),
        ("the owner", ACME_PUB, set(&ALL)),
    ] {
        for (path, seen) in walk(&s, key).await {
            // The WoA document and the AP list show public records only.
            let expected = if path == "woa.json" || path == "AP agent list" {
                set(&[OPEN])
            } else {
                expected.clone()
            };
            assert_eq!(seen, expected, "{who} through {path}");
        }
    }

    // The peer feed carries public records only, whoever asks.
    let peer = format!("http://{}", s.server.as_ref().unwrap().peer_addr);
    let mut feed = PeeringClient::connect(peer)
        .await
        .unwrap()
        .follow(pb::FollowRequest { from_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut shared = BTreeSet::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), feed.message())
            .await
            .unwrap()
            .unwrap()
            .expect("listing");
        if e.listing_done {
            break;
        }
        if !e.record_json.is_empty() {
            let v: Value = serde_json::from_str(&e.record_json).unwrap();
            shared.extend(mentioned(&v));
        }
    }
    assert_eq!(shared, set(&[OPEN]), "peer feed");

    // Live, the feed leaves out changes to records peers never saw (it
    // once withdrew each of them, naming the private id to anyone), and
    // withdraws a record that stops being public.
    let h = Http::new(&s.http);
    let mut changed = invoice_agent(SECRET);
    changed["description"] = json!("Translates invoices, now into yen as well.");
    let path = |id: &str| format!("/agents/{}", Http::url_id(id));
    let (status, _, _) = h
        .send(
            Method::PUT,
            &path(SECRET),
            Some(ACME_PUB),
            Some(changed),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    let (status, _, _) = h
        .send(Method::DELETE, &path(FOR_GLOBEX), Some(ACME_PUB), None, &[])
        .await;
    assert_eq!(status, 200);
    let (status, _, _) = h
        .send(
            Method::PUT,
            &format!("{}?visibility=private", path(OPEN)),
            Some(ACME_PUB),
            Some(invoice_agent(OPEN)),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    const MARKER: &str = "urn:acme:marker";
    let (status, _, _) = h
        .send(
            Method::POST,
            "/agents",
            Some(ACME_PUB),
            Some(invoice_agent(MARKER)),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let mut withdrawn = BTreeSet::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), feed.message())
            .await
            .expect("the marker arrives")
            .unwrap()
            .expect("live feed");
        if !e.withdrawn_id.is_empty() {
            withdrawn.insert(e.withdrawn_id.clone());
        }
        if e.record_json.contains(MARKER) {
            break;
        }
    }
    assert_eq!(
        withdrawn,
        [OPEN.to_string()].into_iter().collect::<BTreeSet<_>>(),
        "withdrawals"
    );
    s.stop().await;
}

#[tokio::test]
async fn publishers_write_only_in_their_namespaces_and_within_quota() {
    let s = start().await;
    let h = Http::new(&s.http);
    // Globex's publisher cannot take an id in Acme's namespace.
    let e = h
        .register(Some(GINA), invoice_agent("urn:acme:hijack"))
        .await
        .unwrap_err();
    assert_eq!((e.http, e.code.as_str()), (403, "forbidden"));
    assert_eq!(e.field.as_deref(), Some("/id"));
    assert_eq!(
        h.get(Some(ADMIN), "urn:acme:hijack")
            .await
            .unwrap_err()
            .http,
        404
    );
    // Nor over gRPC, the same way.
    let g = Grpc::connect(&s.grpc).await;
    let e = Transport::register(&g, Some(GINA), invoice_agent("urn:acme:x"))
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (403, Some("/id")));
    // A publisher of no tenant registers nothing once tenants exist.
    let e = h
        .register(Some(ALICE), minimal("loose-id"))
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (403, Some("/id")));
    // In its own namespace it may.
    h.register(Some(GINA), invoice_agent("urn:globex:ok"))
        .await
        .expect("own namespace");
    // Nor may it claim another tenant's namespace for a publisher key.
    let e = h
        .call(
            Method::POST,
            "/publisher-keys",
            Some(GINA),
            Some(json!({
                "public_key": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
                "namespaces": ["urn:acme:"],
            })),
        )
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (403, Some("/namespaces")));

    // Initech may hold one record: the second is refused and not stored.
    h.register(Some(IVY), invoice_agent("urn:initech:one"))
        .await
        .expect("within quota");
    let e = h
        .register(Some(IVY), invoice_agent("urn:initech:two"))
        .await
        .unwrap_err();
    assert_eq!((e.http, e.code.as_str()), (403, "forbidden"));
    assert_eq!(
        h.get(Some(ADMIN), "urn:initech:two")
            .await
            .unwrap_err()
            .http,
        404
    );
    // Refreshing the record it has is not a new record.
    h.register(Some(IVY), invoice_agent("urn:initech:one"))
        .await
        .expect("a refresh is within quota");
    // Deleting frees the place.
    h.delete(Some(IVY), "urn:initech:one").await.unwrap();
    h.register(Some(IVY), invoice_agent("urn:initech:two"))
        .await
        .expect("a freed place");

    // Examples per record are bounded by the quota too.
    s.stop().await;
    let s = TestServer::start_with(|c| c.quotas.max_examples_per_record = 2).await;
    let h = Http::new(&s.http);
    let mut meta = invoice_agent("many-examples");
    meta["examples"] = json!([{"text": "a"}, {"text": "b"}, {"text": "c"}]);
    let e = h.register(Some(ALICE), meta).await.unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/examples")));
    assert_eq!(
        h.get(Some(ADMIN), "many-examples").await.unwrap_err().http,
        404
    );
    s.stop().await;
}
