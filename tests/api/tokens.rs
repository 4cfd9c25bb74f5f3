//! OIDC / JWT bearer tokens against a real JWKS: keys made with openssl in
//! the test, tokens signed here (RS256, ES256, EdDSA), accepted on both
//! transports; expired, not-yet-valid, wrong-issuer, wrong-audience,
//! `alg: none`, HMAC-with-the-public-key, tampered and unknown-key tokens
//! refused with 401 and nothing stored. The issuer's JWKS URL is fetched
//! again when a token names a key it has not seen.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry::api::jwt::JwtConfig;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Method;
use serde_json::{json, Value};

use crate::certs::openssl;
use crate::harness::*;

const ISSUER: &str = "https://id.example.test";
const AUDIENCE: &str = "agentry";

struct Keys {
    rsa_pem: Vec<u8>,
    rsa_public_pem: Vec<u8>,
    ec_pem: Vec<u8>,
    ed_pem: Vec<u8>,
    jwks: Value,
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// An RSA, a P-256 and an Ed25519 key, and their JWKS.
async fn keys(d: &Path) -> Keys {
    openssl(d, &["genrsa", "-out", "rsa.pem", "2048"]).await;
    openssl(
        d,
        &["rsa", "-in", "rsa.pem", "-pubout", "-out", "rsa.pub.pem"],
    )
    .await;
    openssl(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ec1.pem",
        ],
    )
    .await;
    openssl(
        d,
        &[
            "pkcs8", "-topk8", "-nocrypt", "-in", "ec1.pem", "-out", "ec.pem",
        ],
    )
    .await;
    openssl(
        d,
        &[
            "ec",
            "-in",
            "ec1.pem",
            "-pubout",
            "-outform",
            "DER",
            "-out",
            "ec.pub.der",
        ],
    )
    .await;
    openssl(d, &["genpkey", "-algorithm", "ed25519", "-out", "ed.pem"]).await;
    openssl(
        d,
        &[
            "pkey",
            "-in",
            "ed.pem",
            "-pubout",
            "-outform",
            "DER",
            "-out",
            "ed.pub.der",
        ],
    )
    .await;
    let modulus = tokio::process::Command::new("openssl")
        .args(["rsa", "-in", "rsa.pem", "-noout", "-modulus"])
        .current_dir(d)
        .output()
        .await
        .unwrap();
    let modulus = String::from_utf8(modulus.stdout).unwrap();
    let n = hex_bytes(modulus.trim().trim_start_matches("Modulus="));
    let ec_pub = std::fs::read(d.join("ec.pub.der")).unwrap();
    let point = &ec_pub[ec_pub.len() - 65..];
    let ed_pub = std::fs::read(d.join("ed.pub.der")).unwrap();
    let jwks = json!({"keys": [
        {"kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig",
         "n": B64.encode(&n), "e": "AQAB"},
        {"kty": "EC", "kid": "ec-1", "crv": "P-256", "use": "sig",
         "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])},
        {"kty": "OKP", "kid": "ed-1", "crv": "Ed25519", "use": "sig",
         "x": B64.encode(&ed_pub[ed_pub.len() - 32..])},
    ]});
    Keys {
        rsa_pem: std::fs::read(d.join("rsa.pem")).unwrap(),
        rsa_public_pem: std::fs::read(d.join("rsa.pub.pem")).unwrap(),
        ec_pem: std::fs::read(d.join("ec.pem")).unwrap(),
        ed_pem: std::fs::read(d.join("ed.pem")).unwrap(),
        jwks,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now() + 600,
           "nbf": now() - 10, "roles": ["publisher"]})
}

fn sign(alg: Algorithm, kid: &str, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

fn config(jwks_file: Option<&Path>, jwks_url: Option<String>) -> JwtConfig {
    JwtConfig {
        issuer: ISSUER.into(),
        audiences: vec![AUDIENCE.into()],
        jwks_file: jwks_file.map(Path::to_path_buf),
        jwks_url,
        principal_claim: "sub".into(),
        role_claim: Some("roles".into()),
        default_role: agentry::domain::Role::Reader,
        tenant_claim: Some("org".into()),
        leeway_secs: 5,
        jwks_min_refresh_secs: 1,
    }
}

/// A gRPC `Get` of `id` sent with `token` as its bearer credential.
fn get_as(id: &str, token: &str) -> tonic::Request<agentry::pb::GetRequest> {
    let mut req = tonic::Request::new(agentry::pb::GetRequest {
        id: id.into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

#[tokio::test]
async fn tokens_of_the_issuer_are_principals_and_bad_tokens_get_401() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d).await;
    std::fs::write(d.join("jwks.json"), k.jwks.to_string()).unwrap();
    let s =
        TestServer::start_with(|c| c.jwt = Some(config(Some(&d.join("jwks.json")), None))).await;
    let h = Http::new(&s.http);

    let rsa = EncodingKey::from_rsa_pem(&k.rsa_pem).unwrap();
    let ec = EncodingKey::from_ec_pem(&k.ec_pem).unwrap();
    let ed = EncodingKey::from_ed_pem(&k.ed_pem).unwrap();
    for (alg, kid, key, who) in [
        (Algorithm::RS256, "rsa-1", &rsa, "rita"),
        (Algorithm::ES256, "ec-1", &ec, "eve"),
        (Algorithm::EdDSA, "ed-1", &ed, "ed"),
    ] {
        let token = sign(alg, kid, key, &claims(who));
        let (status, body) = h
            .call(
                Method::POST,
                "/agents",
                Some(&token),
                Some(minimal(&format!("by-{who}"))),
            )
            .await
            .unwrap_or_else(|f| panic!("{alg:?}: {f:?}"));
        assert_eq!(status, 201);
        assert_eq!(body["registry"]["owner"], who, "{body}");
    }
    // The same token over gRPC.
    let token = sign(Algorithm::RS256, "rsa-1", &rsa, &claims("rita"));
    let mut g = agentry::pb::registry_client::RegistryClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let mut req = tonic::Request::new(agentry::pb::DeleteRequest {
        id: "by-rita".into(),
        expected_revision: None,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    g.delete(req)
        .await
        .expect("rita deletes her own agent over gRPC");

    let count = |h: &Http| {
        let h = Http::new(&h.base);
        async move {
            h.call(Method::GET, "/agents?page_size=1", Some(ADMIN), None)
                .await
                .unwrap()
                .1["total_count"]
                .as_u64()
                .unwrap()
        }
    };
    let before = count(&h).await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims("mallory");
        f(&mut c);
        c
    };
    let tampered = {
        let t = sign(Algorithm::RS256, "rsa-1", &rsa, &claims("mallory"));
        let parts: Vec<&str> = t.split('.').collect();
        let mut payload: Value = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
        payload["roles"] = json!(["admin"]);
        format!(
            "{}.{}.{}",
            parts[0],
            B64.encode(payload.to_string()),
            parts[2]
        )
    };
    let none = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","typ":"JWT","kid":"rsa-1"}"#),
        B64.encode(claims("mallory").to_string())
    );
    // HMAC keyed with the issuer's public key: the classic confusion.
    let confused = sign(
        Algorithm::HS256,
        "rsa-1",
        &EncodingKey::from_secret(&k.rsa_public_pem),
        &claims("mallory"),
    );
    let bad = [
        (
            "expired",
            sign(
                Algorithm::RS256,
                "rsa-1",
                &rsa,
                &with(&|c| c["exp"] = json!(now() - 600)),
            ),
        ),
        (
            "not yet valid",
            sign(
                Algorithm::RS256,
                "rsa-1",
                &rsa,
                &with(&|c| c["nbf"] = json!(now() + 600)),
            ),
        ),
        (
            "wrong issuer",
            sign(
                Algorithm::RS256,
                "rsa-1",
                &rsa,
                &with(&|c| c["iss"] = json!("https://evil.test")),
            ),
        ),
        (
            "wrong audience",
            sign(
                Algorithm::RS256,
                "rsa-1",
                &rsa,
                &with(&|c| c["aud"] = json!("someone-else")),
            ),
        ),
        (
            "no expiry",
            sign(
                Algorithm::RS256,
                "rsa-1",
                &rsa,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("exp");
                }),
            ),
        ),
        ("alg none", none),
        ("hmac with the public key", confused),
        ("tampered", tampered),
        (
            "unknown kid",
            sign(Algorithm::RS256, "rsa-9", &rsa, &claims("mallory")),
        ),
        (
            "key of another type",
            sign(Algorithm::ES256, "rsa-1", &ec, &claims("mallory")),
        ),
    ];
    for (what, token) in bad {
        let e = h
            .call(
                Method::POST,
                "/agents",
                Some(&token),
                Some(minimal("by-mallory")),
            )
            .await
            .expect_err(what);
        assert_eq!((e.http, e.code.as_str()), (401, "unauthorized"), "{what}");
        let e = g.get(get_as("by-eve", &token)).await.expect_err(what);
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{what}");
    }
    assert_eq!(count(&h).await, before, "a refused token stored something");
    s.stop().await;
}

#[tokio::test]
async fn the_issuers_jwks_url_is_fetched_again_for_an_unknown_key() {
    let dir = tempfile::tempdir().unwrap();
    let k = keys(dir.path()).await;
    // The issuer at first publishes only its EC key.
    let published = Arc::new(Mutex::new(json!({"keys": [k.jwks["keys"][1].clone()]})));
    let served = published.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let v = served.lock().unwrap().clone();
            async move { axum::Json(v) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let s = TestServer::start_with(|c| {
        c.jwt = Some(config(None, Some(url)));
        c.gateway.outbound.allow = vec!["127.0.0.1".into()];
        c.gateway.outbound.allow_http = true;
    })
    .await;
    let h = Http::new(&s.http);
    let rsa = EncodingKey::from_rsa_pem(&k.rsa_pem).unwrap();
    let ec = EncodingKey::from_ec_pem(&k.ec_pem).unwrap();
    let ok = h
        .call(
            Method::POST,
            "/agents",
            Some(&sign(Algorithm::ES256, "ec-1", &ec, &claims("eve"))),
            Some(minimal("by-eve")),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    let rsa_token = sign(Algorithm::RS256, "rsa-1", &rsa, &claims("rita"));
    let e = h
        .call(
            Method::POST,
            "/agents",
            Some(&rsa_token),
            Some(minimal("by-rita")),
        )
        .await
        .unwrap_err();
    assert_eq!(e.http, 401);
    // The issuer rotates in its RSA key; the next token naming it makes the
    // registry fetch the set again.
    *published.lock().unwrap() = k.jwks.clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, body) = h
        .call(
            Method::POST,
            "/agents",
            Some(&rsa_token),
            Some(minimal("by-rita")),
        )
        .await
        .expect("the new key is fetched");
    assert_eq!(status, 201);
    assert_eq!(body["registry"]["owner"], "rita");
    s.stop().await;
}

#[tokio::test]
async fn an_issuer_that_does_not_answer_holds_a_request_only_to_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let k = keys(dir.path()).await;
    // The issuer's host accepts connections and never answers: the
    // outbound client would wait its own 30 s for the key set.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", silent.local_addr().unwrap());
    let accepted = Arc::new(Mutex::new(0usize));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            *counted.lock().unwrap() += 1;
            held.push(socket);
        }
    });
    let s = TestServer::start_with(|c| {
        c.jwt = Some(config(None, Some(url)));
        c.gateway.outbound.allow = vec!["127.0.0.1".into()];
        c.gateway.outbound.allow_http = true;
        c.request_timeout_secs = 2;
    })
    .await;
    let h = Http::new(&s.http);
    let rsa = EncodingKey::from_rsa_pem(&k.rsa_pem).unwrap();
    let token = sign(Algorithm::RS256, "rsa-1", &rsa, &claims("rita"));

    let started = std::time::Instant::now();
    let e = h
        .call(
            Method::POST,
            "/agents",
            Some(&token),
            Some(minimal("by-rita")),
        )
        .await
        .expect_err("no key could be fetched");
    let waited = started.elapsed();
    assert_eq!((e.http, e.code.as_str()), (504, "timeout"));
    assert!(
        waited < Duration::from_secs(15),
        "answered after {waited:?}, not at the 2 s deadline"
    );
    let mut g = agentry::pb::registry_client::RegistryClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let status = g
        .get(get_as("by-rita", &token))
        .await
        .expect_err("no key could be fetched");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // The fetch the first request started outlived it and is not started
    // again by the next request with the same unknown key.
    assert_eq!(*accepted.lock().unwrap(), 1, "one fetch at a time");

    // Callers with API keys are not held up by the silent issuer.
    let (status, _) = h
        .call(
            Method::POST,
            "/agents",
            Some(ALICE),
            Some(minimal("by-alice")),
        )
        .await
        .unwrap();
    assert_eq!(status, 201);
    // Nothing was stored for the refused write, and the trail says why.
    assert_eq!(
        h.call(Method::GET, "/agents/by-rita", Some(ALICE), None)
            .await
            .unwrap_err()
            .http,
        404
    );
    let (_, page) = h
        .call(Method::GET, "/audit?outcome=timeout", Some(ADMIN), None)
        .await
        .unwrap();
    let entry = &page["entries"][0];
    assert_eq!(entry["operation"], "POST /agents", "{page}");
    assert_eq!(entry["principal"].as_str().unwrap_or(""), "", "{entry}");
    s.stop().await;
}
