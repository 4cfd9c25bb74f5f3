//! Watch: changes in revision order, resumable from a revision, and a clear
//! error for history that has been compacted.

use agentry::pb;
use futures::StreamExt;
use serde_json::json;

use crate::harness::*;

async fn next_change(stream: &mut tonic::Streaming<pb::WatchResponse>) -> pb::WatchResponse {
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("a change arrives")
        .expect("stream open")
        .expect("no error")
}

#[tokio::test]
async fn watch_replays_history_then_follows_live_changes() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let (a, _) = h.register(Some(ALICE), minimal("w-a")).await.unwrap();
    let first = a["registry"]["revision"].as_u64().unwrap();
    h.register(Some(ALICE), minimal("w-b")).await.unwrap();
    h.set_status(Some(ALICE), "w-a", "inactive", "maintenance")
        .await
        .unwrap();

    let g = Grpc::connect(&s.grpc).await;
    let mut stream = g
        .client
        .clone()
        .watch(pb::WatchRequest {
            from_revision: first,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let c = next_change(&mut stream).await;
        seen.push((c.kind, c.record.unwrap().metadata.unwrap().id, c.revision));
    }
    let kinds: Vec<_> = seen.iter().map(|(k, id, _)| (*k, id.as_str())).collect();
    assert_eq!(
        kinds,
        vec![
            (pb::ChangeKind::Created as i32, "w-a"),
            (pb::ChangeKind::Created as i32, "w-b"),
            (pb::ChangeKind::StatusChanged as i32, "w-a"),
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].2 < w[1].2), "revision order");

    // Live: a change made now arrives on the open stream.
    let del = h.delete(Some(ALICE), "w-b").await.unwrap();
    let c = next_change(&mut stream).await;
    assert_eq!((c.kind, c.revision), (pb::ChangeKind::Deleted as i32, del));

    // Resume from the middle: exactly the changes from that revision on.
    let resume = seen[1].2;
    let mut again = g
        .client
        .clone()
        .watch(pb::WatchRequest {
            from_revision: resume,
        })
        .await
        .unwrap()
        .into_inner();
    let revs = [
        next_change(&mut again).await.revision,
        next_change(&mut again).await.revision,
    ];
    assert_eq!(revs, [seen[1].2, seen[2].2]);
    s.stop().await;
}

#[tokio::test]
async fn compacted_history_names_the_oldest_revision() {
    let s = TestServer::start_with(|c| c.watch_history = 1024).await;
    let g = Grpc::connect(&s.grpc).await;
    // Enough writes to pass a trim step (history is trimmed every 1024
    // revisions), issued 32 at a time.
    let mut written = 0;
    while written < 2100 {
        let batch = (0..32).map(|i| {
            let mut m = minimal(&format!("c-{}", written + i));
            m["tags"] = json!(["compaction"]);
            let g = Grpc {
                client: g.client.clone(),
            };
            async move { g.register(Some(ALICE), m).await.expect("write") }
        });
        futures::future::join_all(batch).await;
        written += 32;
    }
    let err = g
        .client
        .clone()
        .watch(pb::WatchRequest { from_revision: 1 })
        .await
        .expect_err("compacted");
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    let d = agentry::api::error::detail_of(&err);
    assert!(d.message.contains("oldest available is"), "{}", d.message);
    let oldest: u64 = d.message.rsplit(' ').next().unwrap().parse().unwrap();
    // Watching from the oldest available revision works.
    let mut stream = g
        .client
        .clone()
        .watch(pb::WatchRequest {
            from_revision: oldest,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(next_change(&mut stream).await.revision >= oldest);
    s.stop().await;
}

/// The next `n` events of a server-sent event stream: (event, id, data).
async fn sse_events<B: AsRef<[u8]>>(
    body: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
    buffer: &mut String,
    n: usize,
) -> Vec<(String, String, serde_json::Value)> {
    let mut events = Vec::new();
    while events.len() < n {
        if let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .filter_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start().to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let data = field("data:");
            if data.is_empty() {
                continue; // a keep-alive comment
            }
            events.push((
                field("event:"),
                field("id:"),
                serde_json::from_str(&data).expect("JSON data"),
            ));
            continue;
        }
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), body.next())
            .await
            .expect("an event arrives")
            .expect("stream open")
            .expect("no transport error");
        buffer.push_str(std::str::from_utf8(chunk.as_ref()).expect("UTF-8"));
    }
    events
}

/// The change feed over plain HTTP, as server-sent events: history from a
/// revision, resumption after `Last-Event-ID` (what a browser's
/// EventSource sends when it reconnects), live changes, and a clear error
/// for a bad revision.
#[tokio::test]
async fn the_change_feed_is_served_as_server_sent_events() {
    let s = TestServer::start().await;
    let h = Http::new(&s.http);
    let (a, _) = h.register(Some(ALICE), minimal("sse-a")).await.unwrap();
    let first = a["registry"]["revision"].as_u64().unwrap();
    h.register(Some(ALICE), minimal("sse-b")).await.unwrap();
    let client = reqwest::Client::new();
    let open = |query: String, last: Option<u64>| {
        let mut req = client
            .get(format!("{}/changes{query}", s.http))
            .bearer_auth(ALICE)
            .header("accept", "text/event-stream");
        if let Some(last) = last {
            req = req.header("last-event-id", last.to_string());
        }
        req.send()
    };

    let resp = open(format!("?from_revision={first}"), None).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (mut body, mut buffer) = (resp.bytes_stream(), String::new());
    let events = sse_events(&mut body, &mut buffer, 2).await;
    let seen: Vec<(&str, String, &str, &str)> = events
        .iter()
        .map(|(event, id, data)| {
            (
                event.as_str(),
                id.clone(),
                data["kind"].as_str().unwrap(),
                data["record"]["id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("change", first.to_string(), "created", "sse-a"),
            ("change", (first + 1).to_string(), "created", "sse-b"),
        ]
    );
    assert_eq!(events[0].2["revision"], first);
    // Live: a change made now arrives on the open stream.
    h.set_status(Some(ALICE), "sse-a", "inactive", "maintenance")
        .await
        .unwrap();
    let live = sse_events(&mut body, &mut buffer, 1).await;
    assert_eq!(live[0].2["kind"], "status_changed");
    assert_eq!(live[0].2["record"]["status"], "inactive");

    // A reconnecting EventSource resumes right after the last id it saw.
    let resp = open(format!("?from_revision={first}"), Some(first))
        .await
        .unwrap();
    let (mut body, mut buffer) = (resp.bytes_stream(), String::new());
    let resumed = sse_events(&mut body, &mut buffer, 1).await;
    assert_eq!(resumed[0].1, (first + 1).to_string());

    // A hostile client gets nothing it may not read: not without a valid
    // key, and not another owner's private record.
    let resp = client
        .get(format!("{}/changes", s.http))
        .bearer_auth("not-a-key-of-this-registry")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (private, _) = h
        .call(
            reqwest::Method::POST,
            "/agents?visibility=private",
            Some(ALICE),
            Some(minimal("sse-private")),
        )
        .await
        .unwrap();
    assert_eq!(private, 201);
    let (public, _) = h
        .register(Some(ALICE), minimal("sse-public"))
        .await
        .unwrap();
    let resp = client
        .get(format!("{}/changes?from_revision={}", s.http, first + 3))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    let (mut body, mut buffer) = (resp.bytes_stream(), String::new());
    let seen = sse_events(&mut body, &mut buffer, 1).await;
    assert_eq!(seen[0].2["record"]["id"], "sse-public", "{:?}", seen[0]);
    assert_eq!(seen[0].2["revision"], public["registry"]["revision"]);

    let resp = open("?from_revision=soon".into(), None).await.unwrap();
    assert_eq!(resp.status(), 400);
    let problem: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(problem["field"], "/from_revision", "{problem}");
    s.stop().await;
}
