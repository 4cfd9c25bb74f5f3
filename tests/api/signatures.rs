//! Record signatures against a real server: every record is signed by the
//! registry, verifies from what a client can fetch (the record and
//! `/.well-known/agentry.json`), over both transports and with the
//! `agentry verify` command; key rotation, retirement and revocation keep
//! every served record verifiable.

use std::time::Duration;

use agentry::crypto::signature::verify_with_identity;
use agentry::crypto::{CryptoError, Identity};
use agentry::pb::{federation_client::FederationClient, GetRegistryInfoRequest};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;

/// Polls `/.well-known/agentry.json` until the cluster has its identity.
async fn established(h: &Http) -> (Value, Identity) {
    for _ in 0..100 {
        let (_, info) = h
            .call(Method::GET, "/.well-known/agentry.json", None, None)
            .await
            .expect("registry info answers without credentials");
        if info["established"] == true {
            let identity: Identity =
                serde_json::from_value(info.clone()).expect("registry info is an identity");
            return (info, identity);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the registry never established its identity");
}

fn signature(record: &Value) -> &Value {
    &record["registry"]["signature"]
}

async fn verify_cli(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("verify")
        .args(args)
        .env("AGENTRY_LOG", "error")
        .output()
        .await
        .expect("agentry verify runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn every_record_is_signed_and_verifies_from_what_a_client_can_fetch() {
    let s = TestServer::start_with(|c| c.identity.authority = Some("registry.test".into())).await;
    let h = Http::new(&s.http);
    // Written at once, likely before the identity exists: the write waits
    // for it, so even the first answer carries a signature.
    let (early, _) = h
        .register(Some(ALICE), translator("urn:agent:early"))
        .await
        .expect("registered");
    let (info, identity) = established(&h).await;
    verify_with_identity(&early, &identity).expect("the first answer is signed");
    assert_eq!(info["authority"], "registry.test");
    assert_eq!(info["adp_level"], "D2");
    assert_eq!(identity.keys.len(), 1);
    assert!(
        info["keys"][0].get("secret").is_none(),
        "no secret is published"
    );
    h.register(Some(ALICE), translator("urn:agent:later"))
        .await
        .expect("registered");

    let grpc = Grpc::connect(&s.grpc).await;
    for id in ["urn:agent:early", "urn:agent:later"] {
        let over_http = h.get(None, id).await.expect("get");
        assert_eq!(signature(&over_http)["authority"], "registry.test");
        assert_eq!(
            signature(&over_http)["key_id"],
            identity.signing_key.as_str()
        );
        verify_with_identity(&over_http, &identity).expect("the HTTP record verifies");
        let over_grpc = grpc.get(None, id).await.expect("get");
        assert_eq!(
            over_grpc, over_http,
            "both transports serve the same record"
        );
        verify_with_identity(&over_grpc, &identity).expect("the gRPC record verifies");
    }

    // Every change is signed again; a listing serves the same signatures.
    let mut changed = translator("urn:agent:later");
    changed["description"] = json!("Translates between Chinese and English, now with glossaries.");
    changed["updated_at"] = json!("2026-06-01T00:00:00Z");
    let updated = h
        .update(Some(ALICE), "urn:agent:later", changed)
        .await
        .expect("updated");
    verify_with_identity(&updated, &identity).expect("the update's answer verifies");
    let status = h
        .set_status(Some(ALICE), "urn:agent:later", "deprecated", "replaced")
        .await
        .expect("status set");
    verify_with_identity(&status, &identity).expect("a status change is signed");

    // Altered in transit: refused, whatever was touched.
    let record = h.get(None, "urn:agent:later").await.expect("get");
    for (pointer, value) in [
        ("/description", json!("Sends your text elsewhere.")),
        ("/registry/owner", json!("bob")),
        (
            "/registry/signature/signed_at",
            json!("2030-01-01T00:00:00Z"),
        ),
        ("/status", json!("active")),
    ] {
        let mut t = record.clone();
        *t.pointer_mut(pointer).expect(pointer) = value;
        assert_eq!(
            verify_with_identity(&t, &identity),
            Err(CryptoError::BadSignature),
            "{pointer}"
        );
    }

    // gRPC Federation.GetRegistryInfo publishes the same keys.
    let mut fed = FederationClient::connect(s.grpc.clone()).await.unwrap();
    let pb_info = fed
        .get_registry_info(GetRegistryInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pb_info.authority, "registry.test");
    assert_eq!(pb_info.signing_key, identity.signing_key);
    assert_eq!(pb_info.keys[0].public_key, identity.keys[0].public_key);
    assert!(!pb_info.federation_endpoint.is_empty());

    // `agentry verify`, offline, with the key or the saved registry info.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("record.json");
    let info_file = dir.path().join("agentry.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    std::fs::write(&info_file, serde_json::to_vec(&info).unwrap()).unwrap();
    let f = file.to_str().unwrap();
    let (ok, out) = verify_cli(&[f, "--key", &identity.keys[0].public_key]).await;
    assert!(ok, "{out}");
    assert!(out.contains("valid: signed by registry.test"), "{out}");
    let (ok, out) = verify_cli(&[f, "--registry-info", info_file.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let mut tampered = record.clone();
    tampered["endpoint"] = json!("https://attacker.example/agent");
    std::fs::write(&file, serde_json::to_vec(&tampered).unwrap()).unwrap();
    let (ok, out) = verify_cli(&[f, "--key", &identity.keys[0].public_key]).await;
    assert!(!ok, "a tampered record must not verify: {out}");
    assert!(out.contains("does not match"), "{out}");
    let (ok, out) = verify_cli(&[f]).await;
    assert!(!ok && out.contains("--key"), "{out}");
    s.stop().await;
}

#[tokio::test]
async fn rotation_keeps_records_valid_and_retired_or_revoked_keys_leave_no_record_behind() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let (_, first) = established(&h).await;
    h.register(Some(ALICE), minimal("old-record"))
        .await
        .unwrap();
    let old = h.get(None, "old-record").await.unwrap();
    assert_eq!(signature(&old)["key_id"], first.signing_key.as_str());

    // Only admins manage keys; bad input changes nothing.
    for key in [None, Some(ALICE)] {
        let e = h
            .call(Method::POST, "/admin/keys", key, None)
            .await
            .unwrap_err();
        assert!(e.http == 401 || e.http == 403, "{e:?}");
    }
    let e = h
        .call(
            Method::POST,
            "/admin/keys",
            Some(ADMIN),
            Some(json!({"not_after": "next tuesday"})),
        )
        .await
        .unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/not_after")));
    let e = h
        .call(
            Method::POST,
            &format!("/admin/keys/{}/retire", first.signing_key),
            Some(ADMIN),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 400, "the signing key cannot be retired");
    let e = h
        .call(
            Method::POST,
            "/admin/keys/ed25519-nope/revoke",
            Some(ADMIN),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 404);
    assert_eq!(established(&h).await.1, first, "refusals changed nothing");

    // Rotate: new records use the new key, the old one still verifies.
    let (_, rotated) = h
        .call(Method::POST, "/admin/keys", Some(ADMIN), None)
        .await
        .unwrap();
    assert_eq!(rotated["resigned"], 0);
    let (_, second) = established(&h).await;
    assert_ne!(second.signing_key, first.signing_key);
    assert_eq!(second.keys.len(), 2);
    verify_with_identity(&old, &second).expect("old records verify after rotation");
    h.register(Some(ALICE), minimal("new-record"))
        .await
        .unwrap();
    let new = h.get(None, "new-record").await.unwrap();
    assert_eq!(signature(&new)["key_id"], second.signing_key.as_str());

    // Retire the first key: the copy a client kept no longer verifies, and
    // the registry serves the record signed again.
    let (_, retired) = h
        .call(
            Method::POST,
            &format!("/admin/keys/{}/retire", first.signing_key),
            Some(ADMIN),
            None,
        )
        .await
        .unwrap();
    assert_eq!(retired["resigned"], 1);
    let (info, third) = established(&h).await;
    assert_eq!(info["keys"][0]["state"], "retired");
    assert!(matches!(
        verify_with_identity(&old, &third),
        Err(CryptoError::KeyNotValid { .. })
    ));
    let served = h.get(None, "old-record").await.unwrap();
    assert_eq!(signature(&served)["key_id"], third.signing_key.as_str());
    verify_with_identity(&served, &third).expect("re-signed record verifies");
    assert_eq!(
        served["registry"]["revision"], old["registry"]["revision"],
        "re-signing is not a change of the record"
    );

    // Revoke the retired key: allowed, and published as revoked.
    h.call(
        Method::POST,
        &format!("/admin/keys/{}/revoke", first.signing_key),
        Some(ADMIN),
        None,
    )
    .await
    .unwrap();
    let (info, _) = established(&h).await;
    assert_eq!(info["keys"][0]["state"], "revoked");
    let e = h
        .call(
            Method::POST,
            &format!("/admin/keys/{}/retire", first.signing_key),
            Some(ADMIN),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 400, "a revoked key cannot be retired");
    s.stop().await;
}

#[tokio::test]
async fn an_operator_key_file_signs_and_survives_a_restart() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["keys", "generate", "--authority", "agents.example.org"])
        .output()
        .await
        .expect("agentry keys generate runs");
    assert!(out.status.success());
    let file: Value = serde_json::from_slice(&out.stdout).expect("a JSON key file");
    let keys_dir = tempfile::tempdir().unwrap();
    let path = keys_dir.path().join("keys.json");
    std::fs::write(&path, &out.stdout).unwrap();
    assert_eq!(file["authority"], "agents.example.org");

    let data = tempfile::tempdir().unwrap();
    let config = |c: &mut agentry::config::Config| {
        c.data_dir = data.path().to_path_buf();
        c.identity.key_file = Some(path.clone());
    };
    let s = TestServer::start_with(config).await;
    let h = Http::new(&s.http);
    let (info, identity) = established(&h).await;
    assert_eq!(info["authority"], "agents.example.org");
    let expected =
        agentry::crypto::keys::public_key_id(file["keys"][0]["secret"].as_str().unwrap());
    assert_eq!(Some(identity.signing_key.clone()), expected);
    h.register(Some(ALICE), minimal("keyed")).await.unwrap();
    s.stop().await;

    // Same data directory, same key file: the same identity, no new key.
    let s = TestServer::start_with(config).await;
    let h = Http::new(&s.http);
    let (_, again) = established(&h).await;
    assert_eq!(again, identity);
    let record = h.get(None, "keyed").await.unwrap();
    verify_with_identity(&record, &again).expect("verifies after restart");
    s.stop().await;
}

#[tokio::test]
async fn publisher_signatures_mark_metadata_verified_and_discovery_can_require_it() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    established(&h).await;
    // Alice's key file, and its public key registered for her namespace.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["keys", "generate"])
        .output()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("alice.json");
    std::fs::write(&key_file, &out.stdout).unwrap();
    let file: Value = serde_json::from_slice(&out.stdout).unwrap();
    let secret = file["keys"][0]["secret"].as_str().unwrap().to_string();
    let public = agentry::crypto::keys::public_key_of(&secret).unwrap();

    // Bad key registrations are refused and change nothing.
    for (body, field) in [
        (
            json!({"public_key": "short", "namespaces": ["urn:alice:"]}),
            "/public_key",
        ),
        (
            json!({"public_key": public, "namespaces": []}),
            "/namespaces",
        ),
        (json!({"public_key": public}), "/namespaces"),
    ] {
        let e = h
            .call(Method::POST, "/publisher-keys", Some(ALICE), Some(body))
            .await
            .unwrap_err();
        assert_eq!((e.http, e.field.as_deref()), (400, Some(field)));
    }
    let e = h
        .call(
            Method::POST,
            "/publisher-keys",
            Some(CAROL_READER),
            Some(json!({"public_key": public, "namespaces": ["urn:alice:"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 403, "readers register no keys");
    let (status, key) = h
        .call(
            Method::POST,
            "/publisher-keys",
            Some(ALICE),
            Some(json!({"public_key": public, "namespaces": ["urn:alice:"]})),
        )
        .await
        .unwrap();
    assert_eq!(status, 201);
    assert_eq!(key["principal"], "alice");
    let key_id = key["key_id"].as_str().unwrap().to_string();
    let e = h
        .call(
            Method::POST,
            "/publisher-keys",
            Some(BOB),
            Some(json!({"public_key": public, "namespaces": ["urn:bob:"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 409, "another publisher cannot claim Alice's key");
    let (_, listed) = h
        .call(Method::GET, "/publisher-keys", Some(BOB), None)
        .await
        .unwrap();
    assert_eq!(listed["keys"], json!([]), "Bob sees only his own keys");

    // Signed metadata, via the CLI: verified. The same unsigned: self-asserted.
    let sign = |meta: Value| {
        let key_file = key_file.clone();
        async move {
            let meta_file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(meta_file.path(), serde_json::to_vec(&meta).unwrap()).unwrap();
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
                .args(["keys", "sign-metadata"])
                .arg(meta_file.path())
                .arg("--key-file")
                .arg(&key_file)
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        }
    };
    let mut signed_meta = translator("urn:alice:translate");
    signed_meta["tags"] = json!(["translation", "signed"]);
    let signed_meta = sign(signed_meta).await;
    assert_eq!(signed_meta["signature"]["key_id"], key_id.as_str());
    let (record, _) = h.register(Some(ALICE), signed_meta.clone()).await.unwrap();
    assert_eq!(record["registry"]["publisher"]["state"], "verified");
    assert_eq!(record["registry"]["publisher"]["key_id"], key_id.as_str());
    let mut plain = translator("urn:alice:plain");
    plain["tags"] = json!(["translation", "signed"]);
    let (record, _) = h.register(Some(ALICE), plain).await.unwrap();
    assert_eq!(record["registry"]["publisher"]["state"], "self_asserted");
    // Bob registering metadata signed with Alice's key: self-asserted.
    let mut bobs = translator("urn:alice:by-bob");
    bobs["tags"] = json!(["translation", "signed"]);
    let bobs = sign(bobs).await;
    let (record, _) = h.register(Some(BOB), bobs).await.unwrap();
    assert_eq!(record["registry"]["publisher"]["state"], "self_asserted");
    assert!(record["registry"]["publisher"]["reason"]
        .as_str()
        .unwrap()
        .contains("another publisher"));
    // Altered after signing: refused, nothing stored.
    let mut altered = signed_meta.clone();
    altered["id"] = json!("urn:alice:altered");
    let e = h.register(Some(ALICE), altered).await.unwrap_err();
    assert_eq!((e.http, e.field.as_deref()), (400, Some("/signature")));
    assert_eq!(
        h.get(None, "urn:alice:altered").await.unwrap_err().http,
        404
    );

    // Discovery: `verified_only` is a hard filter; every candidate says
    // which it is; a full-detail candidate carries the signed record.
    let discover = |constraints: Value| {
        let h = &h;
        async move {
            h.call(
                Method::POST,
                "/discover",
                Some(ADMIN),
                Some(
                    json!({"query": "translate chinese text", "required_tags": ["signed"],
                            "constraints": constraints, "detail": "full"}),
                ),
            )
            .await
            .unwrap()
            .1
        }
    };
    let all = discover(json!({})).await;
    let states: std::collections::BTreeMap<String, String> = all["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["verification"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(states.len(), 3, "{all}");
    assert_eq!(states["urn:alice:translate"], "verified");
    assert_eq!(states["urn:alice:plain"], "self_asserted");
    let (_, info) = h
        .call(Method::GET, "/.well-known/agentry.json", None, None)
        .await
        .unwrap();
    let identity: Identity = serde_json::from_value(info).unwrap();
    for c in all["candidates"].as_array().unwrap() {
        verify_with_identity(&c["record"], &identity).expect("a full candidate's record verifies");
    }
    let verified = discover(json!({"verified_only": true})).await;
    let ids: Vec<&str> = verified["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["urn:alice:translate"]);
    assert_eq!(verified["applied_filters"]["verified_only"], true);
    assert!(verified["unsupported_filters"]
        .as_array()
        .unwrap()
        .is_empty());
    let e = h
        .call(
            Method::POST,
            "/discover",
            None,
            Some(json!({"query": "x", "constraints": {"verified_only": "yes"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("/constraints/verified_only"));

    // Removing the key: the record it verified becomes self-asserted (a
    // change, so discovery follows at once).
    let e = h
        .call(
            Method::DELETE,
            &format!("/publisher-keys/{key_id}"),
            Some(BOB),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 403);
    let (_, removed) = h
        .call(
            Method::DELETE,
            &format!("/publisher-keys/{key_id}"),
            Some(ALICE),
            None,
        )
        .await
        .unwrap();
    assert_eq!(removed["downgraded"], 1);
    let record = h.get(None, "urn:alice:translate").await.unwrap();
    assert_eq!(record["registry"]["publisher"]["state"], "self_asserted");
    verify_with_identity(&record, &identity).expect("the downgraded record is signed");
    let verified = discover(json!({"verified_only": true})).await;
    assert!(
        verified["candidates"].as_array().unwrap().is_empty(),
        "{verified}"
    );
    s.stop().await;
}

/// ADP: a stale update must not replace a newer record. A write that
/// leaves `updated_at` and `version` out keeps the bar where the record
/// had it (`registry.freshness_floor`, signed with the rest), so a delayed
/// older write after it is still refused and changes nothing.
#[tokio::test]
async fn leaving_freshness_out_does_not_let_an_older_write_through() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let (_, identity) = established(&h).await;
    let id = "urn:agent:floor";
    h.register(Some(ALICE), translator(id))
        .await
        .expect("registered");
    let mut bare = translator(id);
    bare["description"] = json!("Translates, and says nothing of how new this is.");
    let obj = bare.as_object_mut().unwrap();
    obj.remove("updated_at");
    obj.remove("version");
    let held = h.update(Some(ALICE), id, bare).await.expect("updated");
    assert_eq!(
        held["registry"]["freshness_floor"],
        json!({"updated_at": "2026-05-08T00:00:00Z", "version": "1.2.0"})
    );
    verify_with_identity(&held, &identity).expect("the floor is signed with the record");
    let over_grpc = Grpc::connect(&s.grpc)
        .await
        .get(None, id)
        .await
        .expect("get");
    assert_eq!(over_grpc, h.get(None, id).await.expect("get"));
    verify_with_identity(&over_grpc, &identity).expect("the gRPC record verifies");

    for (member, older) in [("updated_at", "2026-05-01T00:00:00Z"), ("version", "1.1.0")] {
        let mut delayed = translator(id);
        delayed[member] = json!(older);
        if member == "version" {
            delayed.as_object_mut().unwrap().remove("updated_at");
        }
        let (status, _, body) = h
            .send(
                Method::PUT,
                &format!("/agents/{id}"),
                Some(ALICE),
                Some(delayed),
                &[],
            )
            .await;
        assert_eq!(status, 409, "{member} {older}: {body}");
        assert_eq!(body["error"]["code"], "stale_metadata", "{body}");
        let now = h.get(None, id).await.expect("get");
        assert_eq!(now, over_grpc, "a refused write changes nothing");
    }

    // Newer metadata goes through, and with both members back the floor goes.
    let mut newer = translator(id);
    newer["updated_at"] = json!("2026-05-09T00:00:00Z");
    let fresh = h.update(Some(ALICE), id, newer).await.expect("updated");
    assert!(
        fresh["registry"].get("freshness_floor").is_none(),
        "{fresh}"
    );
    verify_with_identity(&fresh, &identity).expect("verifies");
    s.stop().await;
}
