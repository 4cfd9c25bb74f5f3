//! Federation between three organisations on loopback — a.example (a
//! 3-node cluster), b.example and c.example (one node each) — plus d.example,
//! a hostile peer served by this test, that sends tampered records, records
//! signed by unpinned and revoked keys, and records claiming other
//! authorities or ids that are not its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agentry::crypto::keys::{public_key_of, Signer};
use agentry::crypto::signature::{served_form, sign_record, verify_served};
use agentry::crypto::{Identity, IdentityChange, KeyFile, NewKey};
use agentry::domain::{AgentMetadata, AgentRecord, Envelope};
use agentry::pb;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::harness::{agent, Cluster, Options, ADMIN};

struct Org {
    authority: &'static str,
    key: NewKey,
    public: String,
}

impl Org {
    fn new(authority: &'static str) -> Self {
        let key = NewKey::generate().expect("key");
        let public = public_key_of(&key.secret).expect("public key");
        Self {
            authority,
            key,
            public,
        }
    }

    fn key_file(&self, dir: &std::path::Path) -> String {
        let path = dir.join(format!("{}.keys.json", self.authority));
        let file = KeyFile {
            authority: Some(self.authority.into()),
            keys: vec![self.key.clone()],
        };
        std::fs::write(&path, serde_json::to_string(&file).expect("json")).expect("key file");
        path.display().to_string()
    }
}

fn identity(authority: &str, keys: Vec<NewKey>) -> Identity {
    Identity::apply(
        None,
        &IdentityChange::Establish {
            authority: authority.into(),
            keys,
            imported: true,
        },
        "2026-01-01T00:00:00Z",
    )
    .expect("identity")
    .0
    .expect("established")
}

fn peer_toml(authority: &str, port: u16, key: &str, sync: bool) -> String {
    format!(
        "[[federation.peers]]\nauthority = \"{authority}\"\nendpoint = \"http://127.0.0.1:{port}\"\nkeys = [\"{key}\"]\nsync = {sync}\n"
    )
}

/// Starts the nodes of `c` (reserved) with `toml` and the org's identity.
fn launch(c: &mut Cluster, org: &Org, toml: &str) {
    let key_file = org.key_file(c.dir());
    c.configure(&format!("[federation]\ndeadline_ms = 3000\n{toml}"));
    let members = c.member_list();
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    for id in ids {
        c.spawn(
            id,
            &[
                "--initial-members",
                &members,
                "--authority",
                org.authority,
                "--key-file",
                &key_file,
            ],
        );
    }
}

async fn discover(c: &Cluster, node: u64, scope: &str) -> Value {
    let resp = c
        .http
        .post(format!("{}/discover", c.http_url(node)))
        .bearer_auth(ADMIN)
        .json(&json!({
            "query": "find an agent for this task",
            "preferred_tags": ["cluster-test"],
            "limit": 50,
            "detail": "full",
            "scope": scope,
        }))
        .send()
        .await
        .expect("discover");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("discover json")
}

fn candidates(r: &Value) -> BTreeMap<String, Value> {
    r["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| (c["id"].as_str().unwrap_or_default().to_string(), c.clone()))
        .collect()
}

fn warnings(r: &Value) -> String {
    r["warnings"].to_string()
}

/// Polls `check` until it holds.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Description of agent `id` on node `node`, if it is live there.
async fn description(c: &Cluster, node: u64, id: &str) -> Option<String> {
    c.contents(node)
        .await
        .get(id)
        .map(|v| v.split(" | ").next().unwrap_or_default().to_string())
}

/// The feed a peer served by the test answers with.
type Feed =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::FollowEvent, tonic::Status>> + Send>>;

/// Serves `peer` on a loopback port of its own; returns the port.
async fn serve_peer<P: pb::peering_server::Peering>(peer: P) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::peering_server::PeeringServer::new(peer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    port
}

/// The hostile peer: a real Peering server with crafted answers.
#[derive(Clone)]
struct Hostile {
    candidates: Vec<pb::PeerCandidate>,
    feed: Vec<pb::FollowEvent>,
    info: pb::RegistryInfo,
    /// The feed is held back until the test opens it (after a.example
    /// registered the id the feed tries to take).
    gate: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl pb::peering_server::Peering for Hostile {
    async fn get_registry_info(
        &self,
        _: tonic::Request<pb::GetRegistryInfoRequest>,
    ) -> Result<tonic::Response<pb::RegistryInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn discover(
        &self,
        _: tonic::Request<pb::PeerDiscoverRequest>,
    ) -> Result<tonic::Response<pb::PeerDiscoverResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::PeerDiscoverResponse {
            authority: "d.example".into(),
            candidates: self.candidates.clone(),
            warnings: Vec::new(),
            registry: Some(self.info.clone()),
        }))
    }

    type FollowStream = Feed;

    async fn follow(
        &self,
        req: tonic::Request<pb::FollowRequest>,
    ) -> Result<tonic::Response<Self::FollowStream>, tonic::Status> {
        let from = req.get_ref().from_revision;
        let events: Vec<_> = self
            .feed
            .iter()
            .filter(|e| e.revision >= from)
            .cloned()
            .map(Ok)
            .collect();
        let mut gate = self.gate.clone();
        let opened = futures::stream::once(async move {
            // A dropped sender leaves the gate as it was; either way go on.
            let _ = gate.wait_for(|open| *open).await;
        });
        Ok(tonic::Response::new(Box::pin(
            opened
                .flat_map(move |()| futures::stream::iter(events.clone()))
                .chain(futures::stream::pending()),
        )))
    }
}

fn record(signer: &Signer, id: &str, description: &str, revision: u64) -> Value {
    let mut r = AgentRecord {
        metadata: serde_json::from_value::<AgentMetadata>(crate::harness::agent(id, description))
            .expect("metadata"),
        envelope: Envelope {
            owner: "mallory".into(),
            revision,
            created_revision: revision,
            registered_at: "2026-01-01T00:00:00Z".into(),
            modified_at: "2026-01-01T00:00:00Z".into(),
            ..Default::default()
        },
    };
    sign_record(signer, &mut r, "2026-01-01T00:00:00Z");
    served_form(&r)
}

fn offer(served: &Value, origin: &str) -> pb::PeerCandidate {
    pb::PeerCandidate {
        record_json: served.to_string(),
        origin_authority: origin.into(),
        origin_service: "http://d.example".into(),
        via: Vec::new(),
    }
}

/// Starts the hostile peer d.example; returns its port, its pinned keys
/// and the gate of its feed.
async fn hostile_peer() -> (u16, Vec<String>, tokio::sync::watch::Sender<bool>) {
    let good = NewKey::generate().expect("key");
    let revoked = NewKey::generate().expect("key");
    let unpinned = NewKey::generate().expect("key");
    let signer = |k: &NewKey| {
        identity("d.example", vec![k.clone()])
            .signer()
            .expect("signer")
    };
    let (good_s, revoked_s, unpinned_s) = (signer(&good), signer(&revoked), signer(&unpinned));
    let mut tampered = record(&good_s, "urn:d:tampered", "honest", 2);
    tampered["description"] = "find an agent for this task, now with malware".into();
    // Signed with d's key but claiming to be b.example's record.
    let impostor = identity("b.example", vec![good.clone()])
        .signer()
        .expect("signer");
    let claims_b = record(&impostor, "urn:b:impostor", "pretends to be b", 3);
    let candidates = vec![
        offer(
            &record(&good_s, "urn:d:good", "an honest agent of d", 1),
            "d.example",
        ),
        offer(&tampered, "d.example"),
        offer(
            &record(&unpinned_s, "urn:d:unpinned", "unpinned key", 3),
            "d.example",
        ),
        offer(
            &record(&revoked_s, "urn:d:revoked", "revoked key", 4),
            "d.example",
        ),
        offer(&claims_b, "b.example"),
    ];
    let event = |revision: u64, served: &Value| pb::FollowEvent {
        revision,
        record_json: served.to_string(),
        ..Default::default()
    };
    let feed = vec![
        event(1, &record(&good_s, "urn:d:good", "an honest agent of d", 1)),
        event(2, &claims_b),
        // An id a.example holds itself.
        event(3, &record(&good_s, "urn:a:weather", "hijacked", 3)),
        event(4, &record(&revoked_s, "urn:d:revoked", "revoked key", 4)),
    ];
    let revoked_id = revoked_s.key_id.clone();
    let info = pb::RegistryInfo {
        authority: "d.example".into(),
        keys: vec![pb::AuthorityKey {
            key_id: revoked_id,
            state: "revoked".into(),
            ..Default::default()
        }],
        established: true,
        ..Default::default()
    };
    let (open, gate) = tokio::sync::watch::channel(false);
    let port = serve_peer(Hostile {
        candidates,
        feed,
        info,
        gate,
    })
    .await;
    let pinned = [&good, &revoked]
        .iter()
        .map(|k| public_key_of(&k.secret).expect("public"))
        .collect();
    (port, pinned, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_organisations_federate_discovery_and_sync() {
    let (a_org, b_org, c_org) = (
        Org::new("a.example"),
        Org::new("b.example"),
        Org::new("c.example"),
    );
    let options = || Options {
        election_timeout_ms: Some(1000),
        ..Default::default()
    };
    let mut a = Cluster::new(options());
    let mut b = Cluster::new(options());
    let mut c = Cluster::new(options());
    for id in 1..=3 {
        a.reserve(id);
    }
    b.reserve(1);
    c.reserve(1);
    let (d_port, d_keys, open_feed) = hostile_peer().await;
    let a_peer = a.nodes[&1].peer;
    let (b_peer, c_peer) = (b.nodes[&1].peer, c.nodes[&1].peer);

    // Everyone peers with everyone (loops must not form); a.example also
    // keeps b.example's and d.example's records.
    let d_toml = format!(
        "[[federation.peers]]\nauthority = \"d.example\"\nendpoint = \"http://127.0.0.1:{d_port}\"\nkeys = [\"{}\", \"{}\"]\nsync = true\n",
        d_keys[0], d_keys[1]
    );
    launch(
        &mut a,
        &a_org,
        &format!(
            "{}{}{d_toml}",
            peer_toml("b.example", b_peer, &b_org.public, true),
            peer_toml("c.example", c_peer, &c_org.public, false)
        ),
    );
    launch(
        &mut b,
        &b_org,
        &format!(
            "{}{}",
            peer_toml("a.example", a_peer, &a_org.public, false),
            peer_toml("c.example", c_peer, &c_org.public, false)
        ),
    );
    launch(
        &mut c,
        &c_org,
        &format!(
            "{}{}",
            peer_toml("a.example", a_peer, &a_org.public, false),
            peer_toml("b.example", b_peer, &b_org.public, false)
        ),
    );
    let a_leader = a.wait_for_leader(Duration::from_secs(30)).await;
    for (cl, node) in [(&a, a_leader), (&b, 1), (&c, 1)] {
        cl.registry_info(node).await;
    }
    assert_eq!(
        a.register(
            a_leader,
            "urn:a:weather",
            "find an agent for this task: weather"
        )
        .await
        .0,
        201
    );
    assert_eq!(
        b.register(
            1,
            "urn:b:translate",
            "find an agent for this task: translation"
        )
        .await
        .0,
        201
    );
    assert_eq!(
        b.register(1, "urn:b:old", "find an agent for this task: to be deleted")
            .await
            .0,
        201
    );
    assert_eq!(
        c.register(1, "urn:c:currency", "find an agent for this task: currency")
            .await
            .0,
        201
    );
    open_feed.send_replace(true);
    // Each organisation's index follows its applied state asynchronously:
    // wait until each finds its own agent before asking across them.
    for (cl, node, id) in [
        (&a, a_leader, "urn:a:weather"),
        (&b, 1, "urn:b:translate"),
        (&c, 1, "urn:c:currency"),
    ] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !candidates(&discover(cl, node, "local").await).contains_key(id) {
            assert!(
                std::time::Instant::now() < deadline,
                "{id} was never indexed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Federated discovery at any node of a.example: all three organisations,
    // d.example's honest record only, provenance that verifies.
    let r = discover(&a, 2, "federated").await;
    assert_eq!(r["scope"], "federated");
    let found = candidates(&r);
    for id in [
        "urn:a:weather",
        "urn:b:translate",
        "urn:c:currency",
        "urn:d:good",
    ] {
        assert!(found.contains_key(id), "{id} missing: {r:#}");
    }
    for refused in [
        "urn:d:tampered",
        "urn:d:unpinned",
        "urn:d:revoked",
        "urn:b:impostor",
    ] {
        assert!(!found.contains_key(refused), "{refused} accepted: {r:#}");
    }
    assert!(
        warnings(&r).contains("peer d.example: 4 record(s) refused"),
        "{}",
        warnings(&r)
    );
    let b_key = agentry::crypto::keys::decode_public(&b_org.public).expect("key");
    let c_key = agentry::crypto::keys::decode_public(&c_org.public).expect("key");
    for (id, authority, key) in [
        ("urn:b:translate", "b.example", &b_key),
        ("urn:c:currency", "c.example", &c_key),
    ] {
        let cand = &found[id];
        assert_eq!(cand["origin_authority"], authority, "{cand:#}");
        assert_eq!(cand["origin_signature"]["authority"], authority);
        assert!(cand["received_at"].is_string() && cand["origin_service"].is_string());
        let sig = verify_served(&cand["record"], key).expect("origin signature verifies");
        assert_eq!(json!(sig.value), cand["origin_signature"]["value"]);
    }
    assert!(found["urn:a:weather"].get("origin_authority").is_none());
    // Each agent once, however many routes (b's also arrives as a synced copy).
    let ids: Vec<&str> = r["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "{ids:?}");
    // Local scope asks nobody.
    let local = candidates(&discover(&a, 1, "local").await);
    assert!(!local.contains_key("urn:c:currency"));

    // Sync: b.example's records are kept on every node of a.example,
    // read-only, with provenance whose origin signature verifies.
    eventually(
        "b's records synced to a",
        Duration::from_secs(30),
        || async {
            let mut all = true;
            for node in 1..=3 {
                all &= description(&a, node, "urn:b:translate").await.is_some()
                    && description(&a, node, "urn:d:good").await.is_some();
            }
            all
        },
    )
    .await;
    let copy = a.get(3, "urn:b:translate").await;
    let provenance = &copy["registry"]["provenance"];
    assert_eq!(provenance["origin_authority"], "b.example");
    assert_eq!(copy["registry"]["owner"], "peer:b.example");
    let mut as_origin = copy.clone();
    as_origin["registry"] = provenance["origin_envelope"].clone();
    verify_served(&as_origin, &b_key).expect("the copy carries b's verifiable signature");
    let put = a
        .http
        .put(format!("{}/agents/urn:b:translate", a.http_url(1)))
        .bearer_auth(ADMIN)
        .json(&crate::harness::agent(
            "urn:b:translate",
            "overwritten locally",
        ))
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 409);
    // The hostile feed: nothing under b's name, a's own record untouched.
    assert_eq!(
        description(&a, 1, "urn:a:weather").await.as_deref(),
        Some("find an agent for this task: weather")
    );
    assert!(description(&a, 1, "urn:b:impostor").await.is_none());
    assert!(description(&a, 1, "urn:d:revoked").await.is_none());

    // A peer that is down: partial results and a warning.
    c.kill(1);
    let r = discover(&a, 1, "federated").await;
    let found = candidates(&r);
    assert!(found.contains_key("urn:b:translate") && found.contains_key("urn:a:weather"));
    assert!(!found.contains_key("urn:c:currency"));
    assert!(warnings(&r).contains("peer c.example"), "{}", warnings(&r));

    // b.example restarts and changes while a.example follows: updates,
    // deletions and new records converge.
    b.kill(1);
    b.restart(1);
    b.registry_info(1).await;
    assert_eq!(
        b.register(
            1,
            "urn:b:translate",
            "find an agent for this task: translation v2"
        )
        .await
        .0,
        200
    );
    assert_eq!(
        b.register(1, "urn:b:new", "find an agent for this task: new")
            .await
            .0,
        201
    );
    let del = b
        .http
        .delete(format!("{}/agents/urn:b:old", b.http_url(1)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("delete");
    assert!(del.status().is_success());
    let converged = |node: u64| {
        let a = &a;
        async move {
            description(a, node, "urn:b:translate").await.as_deref()
                == Some("find an agent for this task: translation v2")
                && description(a, node, "urn:b:new").await.is_some()
                && description(a, node, "urn:b:old").await.is_none()
        }
    };
    eventually(
        "sync after b restarted",
        Duration::from_secs(30),
        || async { converged(1).await && converged(2).await && converged(3).await },
    )
    .await;

    // a.example's leader is cut off from its cluster; the majority elects
    // another leader, which resumes the feed from the replicated cursor.
    // After the partition heals every node holds the same records.
    let old_leader = a.wait_for_leader(Duration::from_secs(30)).await;
    let others: Vec<u64> = (1..=3).filter(|n| *n != old_leader).collect();
    a.partition(&[&[old_leader], &others]).await;
    assert_eq!(
        b.register(1, "urn:b:during", "find an agent for this task: partition")
            .await
            .0,
        201
    );
    eventually(
        "majority side syncs during the partition",
        Duration::from_secs(30),
        || async { description(&a, others[0], "urn:b:during").await.is_some() },
    )
    .await;
    a.heal().await;
    eventually(
        "every node converges after the partition",
        Duration::from_secs(30),
        || async {
            let first = a.contents(1).await;
            first.contains_key("urn:b:during")
                && a.contents(2).await == first
                && a.contents(3).await == first
        },
    )
    .await;

    // A restart of the whole follower cluster resumes where it was: the
    // copies stay and later changes arrive.
    for node in 1..=3 {
        a.kill(node);
    }
    assert_eq!(
        b.register(
            1,
            "urn:b:after",
            "find an agent for this task: after restart"
        )
        .await
        .0,
        201
    );
    for node in 1..=3 {
        a.restart(node);
    }
    a.wait_for_leader(Duration::from_secs(30)).await;
    eventually(
        "sync resumes after a.example restarts",
        Duration::from_secs(30),
        || async {
            description(&a, 1, "urn:b:after").await.is_some()
                && description(&a, 1, "urn:b:new").await.is_some()
        },
    )
    .await;
}

/// The ids of b.example's records live on a.example's node 1.
/// a.example's one-node cluster, not started yet, and b.example's, up
/// with its identity established.
async fn a_and_running_b(b_org: &Org) -> (Cluster, Cluster) {
    // a.example's sync says what each listing kept.
    let mut a = Cluster::new(Options {
        log: Some("warn,agentry::federation::sync=info"),
        ..Default::default()
    });
    let mut b = Cluster::new(Options::default());
    a.reserve(1);
    b.reserve(1);
    launch(&mut b, b_org, "");
    b.registry_info(1).await;
    (a, b)
}

async fn copies_of_b(a: &Cluster) -> Vec<String> {
    a.contents(1)
        .await
        .into_keys()
        .filter(|id| id.starts_with("urn:b:"))
        .collect()
}

/// How many times node `node`'s log says it refused a record of the feed.
fn refusals(c: &Cluster, node: u64) -> usize {
    c.log(node)
        .matches("refused a record from the peer's feed")
        .count()
}

/// What a.example keeps of b.example follows a.example's trust settings
/// as they change between restarts: records signed by a key pinned only
/// later arrive (the feed had moved past them), copies outside a tightened
/// policy are withdrawn and come back when it is loosened, and a peer
/// removed from the configuration leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_follow_the_trust_in_the_peer_across_restarts() {
    let (a_org, b_org, stranger) = (
        Org::new("a.example"),
        Org::new("b.example"),
        Org::new("b.example"),
    );
    let (mut a, b) = a_and_running_b(&b_org).await;
    let b_peer = b.nodes[&1].peer;
    let weather = json!({
        "id": "urn:b:weather", "name": "Weather", "tags": ["cluster-test", "weather"],
        "description": "find an agent for this task: weather",
        "bindings": [{"protocol": "https", "endpoint": "https://agents.example/w"}],
    });
    let put = b
        .http
        .post(format!("{}/agents", b.http_url(1)))
        .bearer_auth(ADMIN)
        .json(&weather)
        .send()
        .await
        .expect("register");
    assert_eq!(put.status(), 201);
    assert_eq!(
        b.register(1, "urn:b:plain", "find an agent for this task: plain")
            .await
            .0,
        201
    );

    // a.example pins a key b.example does not sign with: the listing and
    // a later live change are refused, and the feed moves past them.
    launch(
        &mut a,
        &a_org,
        &peer_toml("b.example", b_peer, &stranger.public, true),
    );
    a.registry_info(1).await;
    eventually("the listing refused", Duration::from_secs(30), || async {
        refusals(&a, 1) >= 2
    })
    .await;
    assert_eq!(
        b.register(1, "urn:b:live", "find an agent for this task: live")
            .await
            .0,
        201
    );
    eventually(
        "the live change refused",
        Duration::from_secs(30),
        || async { refusals(&a, 1) >= 3 },
    )
    .await;
    assert!(a
        .contents(1)
        .await
        .keys()
        .all(|id| !id.starts_with("urn:b:")));

    let restart_with = |a: &mut Cluster, toml: &str| {
        a.kill(1);
        a.configure(&format!("[federation]\ndeadline_ms = 3000\n{toml}"));
        a.restart(1);
    };
    // The right key pinned: everything arrives.
    let right = peer_toml("b.example", b_peer, &b_org.public, true);
    restart_with(&mut a, &right);
    eventually(
        "copies after pinning the key",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == ["urn:b:live", "urn:b:plain", "urn:b:weather"] },
    )
    .await;

    // Only weather agents accepted: the others are withdrawn...
    restart_with(&mut a, &format!("{right}accept_tags = [\"weather\"]\n"));
    eventually(
        "copies outside the policy withdrawn",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == ["urn:b:weather"] },
    )
    .await;
    // ...and come back, unchanged at b.example, when the policy is lifted.
    restart_with(&mut a, &right);
    eventually(
        "copies back with the policy lifted",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == ["urn:b:live", "urn:b:plain", "urn:b:weather"] },
    )
    .await;

    // b.example removed from the configuration: nothing of it stays.
    restart_with(&mut a, "");
    eventually(
        "copies of a removed peer withdrawn",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await.is_empty() },
    )
    .await;
}

/// The value of node `node`'s sample `name` whose labels include every
/// one of `labels` (0 when there is none: a counter not counted yet).
async fn sample(c: &Cluster, node: u64, name: &str, labels: &[&str]) -> u64 {
    c.sample(node, name, labels).await.unwrap_or(0)
}

/// The records of b.example's feed a.example's limit refused (on the
/// running process: counters start again at a restart).
async fn refused_at_limit(c: &Cluster, node: u64) -> u64 {
    let labels = ["peer=\"b.example\"", "reason=\"quota\""];
    sample(c, node, "agentry_federation_refused_records_total", &labels).await
}

/// Waits until a.example has read b.example's feed up to b.example's
/// current revision (its sync cursor, on `/metrics`).
async fn cursor_caught_up(a: &Cluster, b: &Cluster) {
    let at_b = sample(b, 1, "agentry_registry_applied_revision", &[]).await;
    assert!(at_b > 0, "b.example's revision on /metrics");
    eventually(
        "a.example's cursor at b.example's revision",
        Duration::from_secs(30),
        || async {
            let labels = ["peer=\"b.example\""];
            sample(a, 1, "agentry_federation_cursor_revision", &labels).await == at_b
        },
    )
    .await;
}

/// A peer's `max_records` bounds what its feed makes a.example keep: new
/// records past it are refused (counted, and logged once), also after a
/// restart that counts the copies again from storage; a withdrawn copy
/// frees a place; lifting the limit lists the peer again and brings
/// what was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peers_copies_are_kept_up_to_its_record_limit() {
    let (a_org, b_org) = (Org::new("a.example"), Org::new("b.example"));
    let (mut a, b) = a_and_running_b(&b_org).await;
    let b_peer = b.nodes[&1].peer;
    let describe = |n: u32| format!("find an agent for this task: {n}");
    for n in 1..=3 {
        let (status, _) = b.register(1, &format!("urn:b:{n}"), &describe(n)).await;
        assert_eq!(status, 201);
    }

    let peer = peer_toml("b.example", b_peer, &b_org.public, true);
    let limited = format!("{peer}max_records = 2\n");
    launch(&mut a, &a_org, &limited);
    a.registry_info(1).await;
    let at_limit = "the peer's live copies are at its max_records";
    eventually(
        "the listing refused at the limit",
        Duration::from_secs(30),
        || async { a.log(1).contains(at_limit) },
    )
    .await;
    let first = copies_of_b(&a).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(refused_at_limit(&a, 1).await >= 1);
    // The listing noted only the ids it kept, not the one refused.
    let done = |log: String| {
        log.lines()
            .any(|l| l.contains("the peer's listing is done") && l.contains("noted=2 copies=2"))
    };
    eventually("the listing done", Duration::from_secs(30), || async {
        done(a.log(1))
    })
    .await;
    // /metrics shows how close the peer is to its limit.
    let b_label = ["peer=\"b.example\""];
    assert_eq!(
        sample(&a, 1, "agentry_federation_copies", &b_label).await,
        2
    );
    assert_eq!(
        sample(&a, 1, "agentry_federation_max_records", &b_label).await,
        2
    );

    // A live record past the limit is refused too, and counted.
    let before = refused_at_limit(&a, 1).await;
    assert_eq!(b.register(1, "urn:b:4", &describe(4)).await.0, 201);
    eventually(
        "the live record refused",
        Duration::from_secs(30),
        || async { refused_at_limit(&a, 1).await > before },
    )
    .await;
    assert_eq!(copies_of_b(&a).await, first);
    // The cursor moves past the refused record (refused without a Raft
    // write) once the feed is quiet, so a reconnection does not read it
    // again.
    cursor_caught_up(&a, &b).await;

    // After a restart the copies are counted from storage, and only the
    // new record is refused: the one refused before is behind the cursor.
    a.kill(1);
    a.restart(1);
    assert_eq!(b.register(1, "urn:b:5", &describe(5)).await.0, 201);
    cursor_caught_up(&a, &b).await;
    assert_eq!(refused_at_limit(&a, 1).await, 1);
    assert_eq!(copies_of_b(&a).await, first);

    // A copy withdrawn at b.example frees its place for the next record.
    let gone = &first[0];
    let deleted = b
        .http
        .delete(format!("{}/agents/{gone}", b.http_url(1)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    assert_eq!(b.register(1, "urn:b:6", &describe(6)).await.0, 201);
    let kept = vec![first[1].clone(), "urn:b:6".to_string()];
    eventually("the freed place taken", Duration::from_secs(30), || async {
        copies_of_b(&a).await == kept
    })
    .await;

    // No limit: the peer is listed again and every live record arrives.
    a.kill(1);
    a.configure(&format!(
        "[federation]\ndeadline_ms = 3000\n{peer}max_records = 0\n"
    ));
    a.restart(1);
    let mut all: Vec<String> = (1..=6).map(|n| format!("urn:b:{n}")).collect();
    all.retain(|id| id != gone);
    eventually(
        "every record with no limit",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == all },
    )
    .await;
    let copies = sample(&a, 1, "agentry_federation_copies", &b_label).await;
    assert_eq!(copies, all.len() as u64);
    assert_eq!(
        sample(&a, 1, "agentry_federation_max_records", &b_label).await,
        0
    );

    // A lowered limit: the peer is listed again and the copies past the
    // limit are withdrawn, the first two of the listing (the peer's id
    // order) staying.
    a.kill(1);
    a.configure(&format!(
        "[federation]\ndeadline_ms = 3000\n{peer}max_records = 2\n"
    ));
    a.restart(1);
    eventually(
        "the copies past the lowered limit withdrawn",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == all[..2] },
    )
    .await;
    assert!(a.log(1).contains("withdrawing those past it"));
}

/// b.example's listing is read and sent a page at a time: a.example,
/// peering once b.example holds several pages of records, public and
/// private interleaved, keeps every public one and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_of_many_pages_brings_every_public_record_and_no_other() {
    let (a_org, b_org) = (Org::new("a.example"), Org::new("b.example"));
    let (mut a, b) = a_and_running_b(&b_org).await;
    let mut public = Vec::new();
    for i in 0..400 {
        let id = format!("urn:b:{i:03}");
        let query = if i % 3 == 0 {
            "?visibility=private"
        } else {
            public.push(id.clone());
            ""
        };
        let status = b
            .http
            .post(format!("{}/agents{query}", b.http_url(1)))
            .bearer_auth(ADMIN)
            .json(&agent(&id, "listed"))
            .send()
            .await
            .expect("register")
            .status();
        assert_eq!(status, 201, "{id}");
    }
    launch(
        &mut a,
        &a_org,
        &peer_toml("b.example", b.nodes[&1].peer, &b_org.public, true),
    );
    eventually(
        "a holds b's public records",
        Duration::from_secs(60),
        || async { copies_of_b(&a).await == public },
    )
    .await;
}

/// b.example is restored from a backup taken before some of its changes,
/// so its revisions go back below what a.example has followed: a.example
/// gets a full listing, drops what b.example lost, and keeps following.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_restored_from_a_backup_is_listed_again() {
    let (a_org, b_org) = (Org::new("a.example"), Org::new("b.example"));
    let (mut a, mut b) = a_and_running_b(&b_org).await;
    assert_eq!(b.register(1, "urn:b:kept", "kept").await.0, 201);
    b.kill(1);
    let backup = b.dir().join("b.backup");
    let data = b.data_dir(1);
    let (ok, out) = crate::backup::agentry(&[
        "snapshot",
        "save",
        backup.to_str().expect("path"),
        "--data-dir",
        data.to_str().expect("path"),
    ]);
    assert!(ok, "{out}");
    b.restart(1);
    for lost in ["urn:b:lost-1", "urn:b:lost-2", "urn:b:lost-3"] {
        assert_eq!(b.register(1, lost, "lost in the restore").await.0, 201);
    }
    launch(
        &mut a,
        &a_org,
        &peer_toml("b.example", b.nodes[&1].peer, &b_org.public, true),
    );
    eventually("a follows b", Duration::from_secs(30), || async {
        copies_of_b(&a).await.len() == 4
    })
    .await;

    b.kill(1);
    std::fs::remove_dir_all(&data).expect("old data removed");
    let (ok, out) = crate::backup::restore(&backup, &data, 1, &b.member_list());
    assert!(ok, "{out}");
    b.restart(1);
    b.registry_info(1).await;
    assert_eq!(
        b.register(1, "urn:b:after", "after the restore").await.0,
        201
    );
    eventually(
        "a matches the restored b",
        Duration::from_secs(30),
        || async { copies_of_b(&a).await == ["urn:b:after", "urn:b:kept"] },
    )
    .await;
}

/// e.example, served by the test: its one key can be revoked mid-run (its
/// registry info says so from then on), and its feed lists one record
/// signed by that key, then stays open.
#[derive(Clone)]
struct Revoking {
    record: Value,
    key_id: String,
    revoked: tokio::sync::watch::Receiver<bool>,
}

impl Revoking {
    fn info(&self) -> pb::RegistryInfo {
        let state = if *self.revoked.borrow() {
            "revoked"
        } else {
            "active"
        };
        pb::RegistryInfo {
            authority: "e.example".into(),
            keys: vec![pb::AuthorityKey {
                key_id: self.key_id.clone(),
                state: state.into(),
                ..Default::default()
            }],
            established: true,
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl pb::peering_server::Peering for Revoking {
    async fn get_registry_info(
        &self,
        _: tonic::Request<pb::GetRegistryInfoRequest>,
    ) -> Result<tonic::Response<pb::RegistryInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info()))
    }

    async fn discover(
        &self,
        _: tonic::Request<pb::PeerDiscoverRequest>,
    ) -> Result<tonic::Response<pb::PeerDiscoverResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::PeerDiscoverResponse {
            authority: "e.example".into(),
            candidates: Vec::new(),
            warnings: Vec::new(),
            registry: Some(self.info()),
        }))
    }

    type FollowStream = Feed;

    async fn follow(
        &self,
        req: tonic::Request<pb::FollowRequest>,
    ) -> Result<tonic::Response<Self::FollowStream>, tonic::Status> {
        // From the start, a full listing; from later on, nothing new.
        let events = if req.get_ref().from_revision == 0 {
            vec![
                pb::FollowEvent {
                    revision: 1,
                    record_json: self.record.to_string(),
                    listing: true,
                    ..Default::default()
                },
                pb::FollowEvent {
                    revision: 1,
                    listing_done: true,
                    ..Default::default()
                },
            ]
        } else {
            Vec::new()
        };
        Ok(tonic::Response::new(Box::pin(
            futures::stream::iter(events.into_iter().map(Ok)).chain(futures::stream::pending()),
        )))
    }
}

/// A key the peer revokes while this registry follows its feed: the
/// revocation, learned from a discovery answer, withdraws the copies that
/// key signed at once, not at the feed's next connection (which here never
/// comes: the peer keeps the stream open).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_signed_by_a_key_revoked_while_following_are_withdrawn_at_once() {
    let key = NewKey::generate().expect("key");
    let signer = identity("e.example", vec![key.clone()])
        .signer()
        .expect("signer");
    let (revoke, revoked) = tokio::sync::watch::channel(false);
    let peer = Revoking {
        record: record(&signer, "urn:e:kept", "an agent of e", 1),
        key_id: signer.key_id.clone(),
        revoked,
    };
    let port = serve_peer(peer).await;
    let a_org = Org::new("a.example");
    let mut a = Cluster::new(Options {
        election_timeout_ms: Some(1000),
        ..Default::default()
    });
    a.reserve(1);
    let public = public_key_of(&key.secret).expect("public");
    launch(&mut a, &a_org, &peer_toml("e.example", port, &public, true));
    let leader = a.wait_for_leader(Duration::from_secs(30)).await;
    eventually("the copy arrives", Duration::from_secs(30), || async {
        description(&a, leader, "urn:e:kept").await.is_some()
    })
    .await;

    revoke.send_replace(true);
    discover(&a, leader, "federated").await;
    eventually("the copy is withdrawn", Duration::from_secs(15), || async {
        description(&a, leader, "urn:e:kept").await.is_none()
    })
    .await;
    assert!(
        a.log(leader).contains("which e.example has revoked"),
        "listed again under the new trust:\n{}",
        a.log(leader)
    );
}
