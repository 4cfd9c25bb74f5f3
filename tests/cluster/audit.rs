//! The audit trail on a real three-node cluster: committed attempts are the
//! same on every node, refusals stay with the node that refused them.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::scenarios::SERIAL;

const BOB: &str = "bob-cluster-publisher-key";

async fn post(c: &Cluster, via: u64, key: Option<&str>, body: Value, request_id: &str) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("{}/agents", c.http_url(via)))
        .header("x-request-id", request_id)
        .json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.expect("answered").status().as_u16()
}

async fn trail(c: &Cluster, node: u64, query: &str) -> Value {
    let resp = reqwest::Client::new()
        .get(format!("{}/audit?{query}", c.http_url(node)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

fn committed(page: &Value) -> Vec<Value> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.get("node").is_none())
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_committed_trail_is_identical_on_every_node_and_refusals_stay_local() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(
        3,
        Options {
            extra_config: format!(
                "[[api_keys]]\nname = \"bob\"\nrole = \"publisher\"\nkey = \"{BOB}\"\n"
            ),
            ..Default::default()
        },
    )
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    let follower = *c.running().iter().find(|&&n| n != leader).unwrap();

    // Accepted through a follower (forwarded), refused in apply (someone
    // else's id), refused before proposing (no key; a wrong key).
    let mine = agent("audited-1", "Translates audit reports.");
    assert_eq!(
        post(&c, follower, Some(ADMIN), mine.clone(), "req-1").await,
        201
    );
    let mut theirs = mine.clone();
    theirs["bindings"] = json!([{"protocol": "https", "endpoint": "https://bob.example/x"}]);
    assert_eq!(post(&c, leader, Some(BOB), theirs, "req-2").await, 409);
    assert_eq!(
        post(&c, follower, None, agent("anon", "x"), "req-3").await,
        401
    );
    assert_eq!(
        post(
            &c,
            follower,
            Some("not-a-key"),
            agent("guess", "x"),
            "req-4"
        )
        .await,
        401
    );
    assert_eq!(
        post(
            &c,
            leader,
            Some(ADMIN),
            agent("audited-2", "Second."),
            "req-5"
        )
        .await,
        201
    );

    // Every node holds the same committed trail once it has applied it.
    let mut trails = Vec::new();
    for node in c.running() {
        let mut got = Vec::new();
        for _ in 0..100 {
            got = committed(&trail(&c, node, "page_size=1000").await);
            if got.len() >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        trails.push(got);
    }
    assert!(trails.iter().all(|t| t == &trails[0]), "{trails:#?}");
    let t = &trails[0];
    let summary: Vec<_> = t
        .iter()
        .map(|e| {
            (
                e["operation"].as_str().unwrap(),
                e["target"].as_str().unwrap(),
                e["principal"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
                e["correlation_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("register", "audited-1", "admin", "ok", "req-1"),
            ("register", "audited-1", "bob", "conflict", "req-2"),
            ("register", "audited-2", "admin", "ok", "req-5"),
        ]
    );
    assert!(t[0]["revision"].as_u64().unwrap() > 0);
    assert!(t[1].get("revision").is_none(), "a refusal changed nothing");
    assert_eq!(t[0]["address"], "127.0.0.1");
    assert_eq!(t[0]["role"], "admin");

    // The refusals before proposing are the follower's own.
    let local = |page: &Value| -> Vec<(String, String)> {
        page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e.get("node").is_some())
            .map(|e| {
                (
                    e["correlation_id"].as_str().unwrap().to_string(),
                    e["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let on_follower = local(&trail(&c, follower, "outcome=unauthorized").await);
    assert_eq!(
        on_follower,
        vec![
            ("req-3".to_string(), "unauthorized".to_string()),
            ("req-4".to_string(), "unauthorized".to_string()),
        ]
    );
    assert!(local(&trail(&c, leader, "page_size=1000").await).is_empty());

    // Filters and pages.
    let bobs = trail(&c, leader, "principal=bob").await;
    assert_eq!(bobs["entries"].as_array().unwrap().len(), 1);
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = trail(&c, follower, &format!("page_size=2&page_token={token}")).await;
        seen.extend(page["entries"].as_array().unwrap().iter().cloned());
        token = page["next_page_token"].as_str().unwrap().to_string();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 5, "three committed and two local, each once");

    // Nothing a refusal touched changed: audited-1 is still the admin's.
    let stored = c.get(leader, "audited-1").await;
    assert_eq!(stored["registry"]["owner"], "admin");
    // The trail is for admins.
    let resp = reqwest::Client::new()
        .get(format!("{}/audit", c.http_url(leader)))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}
