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
