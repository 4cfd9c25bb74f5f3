//! Stopping and restarting nodes the way an operator does: SIGTERM on the
//! leader hands leadership over before the process exits, leadership moves
//! on request, and a rolling restart of every node under a steady write
//! load loses nothing. The
//! longest time no write succeeded is printed (the figure is reported in
//! docs/operations.md; timing is not asserted here).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::scenarios::{cli, SERIAL};

/// Three nodes that log Agentry's consensus info lines (the hand-off).
async fn three_nodes() -> Cluster {
    Cluster::start(
        3,
        Options {
            log: Some("warn,agentry::consensus=info"),
            ..Default::default()
        },
    )
    .await
}

/// SIGHUP, which logrotate's `postrotate` or an operator's "reload"
/// sends, would end the process by default, without the leader's
/// hand-off: the node ignores it, says so, and keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_hang_up_signal_leaves_the_node_serving() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(
        1,
        Options {
            log: Some("warn,agentry::server=info"),
            ..Default::default()
        },
    )
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    c.signal(leader, "-HUP");
    assert!(
        c.wait_exit(leader, Duration::from_secs(2)).is_none(),
        "the node stopped on SIGHUP:\n{}",
        c.log(leader)
    );
    let (status, body) = c
        .register(leader, "after-hup", "Written after SIGHUP.")
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(
        c.log(leader).contains("SIGHUP ignored"),
        "{}",
        c.log(leader)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_on_the_leader_hands_leadership_over() {
    let _serial = SERIAL.lock().await;
    let mut c = three_nodes().await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    // A leader grants a successor its vote once its own election is older
    // than the leader lease (the maximum election timeout).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 0..20 {
        let (status, body) = c.register(leader, &format!("before-{i}"), "Kept.").await;
        assert_eq!(status, 201, "{body}");
    }
    c.terminate(leader);
    let exit = c
        .wait_exit(leader, Duration::from_secs(20))
        .expect("the leader stops on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    let log = c.log(leader);
    assert!(
        log.contains("handed leadership over before stopping"),
        "no hand-off:\n{log}"
    );
    // Everything let go of the database before the node closed it: the
    // stop did not wait out its grace for a holder that was never going
    // to let go.
    assert!(
        !log.contains("the database was still in use"),
        "the stop waited for its database:\n{log}"
    );
    let next = c.wait_for_leader(Duration::from_secs(10)).await;
    assert_ne!(next, leader);
    let (status, body) = c.register(next, "after", "Written after.").await;
    assert_eq!(status, 201, "{body}");
    c.restart(leader);
    c.wait_for_leader(Duration::from_secs(10)).await;
    c.wait_applied_as(next, Duration::from_secs(20)).await;
    let contents = c.contents(leader).await;
    assert!(contents.contains_key("after") && contents.contains_key("before-19"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_under_write_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut c = three_nodes().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // A client that writes one record after another and, like any client
    // given every node's address, moves to the next node when one does not
    // answer.
    let urls: Vec<String> = (1..=3).map(|id| c.http_url(id)).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let writer = {
        let (stop, acked) = (stop.clone(), acked.clone());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        tokio::spawn(async move {
            let (mut i, mut node) = (0usize, 0usize);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("load-{i}");
                let r = http
                    .post(format!("{}/agents", urls[node % urls.len()]))
                    .bearer_auth(ADMIN)
                    .json(&agent(&id, "Written during the rolling restart."))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => {
                        acked.lock().unwrap().push((id, Instant::now()));
                        i += 1;
                    }
                    // A retried write may meet its own first attempt.
                    Ok(r) if r.status() == 409 => i += 1,
                    _ => {
                        node += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        })
    };
    let started = Instant::now();
    for id in 1..=3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.terminate(id);
        let exit = c
            .wait_exit(id, Duration::from_secs(20))
            .expect("stops on SIGTERM");
        assert!(exit.success(), "node {id}: {exit:?}");
        c.restart(id);
        c.wait_for_leader(Duration::from_secs(20)).await;
        // Caught up before the next one goes (what a readiness gate does).
        let leader = c.wait_for_leader(Duration::from_secs(20)).await;
        c.wait_applied_as(leader, Duration::from_secs(20)).await;
        // Restarted nodes must be past the leader lease before the next
        // hand-off can pick them.
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    let mut longest = Duration::ZERO;
    let mut last = started;
    for (_, at) in &acked {
        if *at > last {
            longest = longest.max(*at - last);
        }
        last = last.max(*at);
    }
    eprintln!(
        "rolling restart of 3 nodes: {} writes acknowledged in {:.1} s; longest time without a successful write: {} ms",
        acked.len(),
        started.elapsed().as_secs_f64(),
        longest.as_millis()
    );
    assert!(acked.len() > 50, "only {} writes", acked.len());
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    c.wait_applied_as(leader, Duration::from_secs(20)).await;
    for id in 1..=3 {
        let contents = c.contents(id).await;
        for (agent, _) in &acked {
            assert!(contents.contains_key(agent), "node {id} lacks {agent}");
        }
    }
}

/// `POST /cluster/transfer-leader` (any node) and `agentry cluster
/// transfer-leader` hand leadership to the voter asked for, or to the most
/// caught-up one, while a client writes; no acknowledged write is lost, a
/// request that cannot be met is refused with the error body, and the
/// trail records each transfer.
#[tokio::test(flavor = "multi_thread")]
async fn leadership_is_transferred_on_request_under_writes() {
    let _serial = SERIAL.lock().await;
    let c = three_nodes().await;
    let leader = c.wait_for_leader(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (via, target) = (followers[0], followers[1]);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, url) = (stop.clone(), c.http_url(via));
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acked = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("during-{i}");
                i += 1;
                let r = http
                    .post(format!("{url}/agents"))
                    .bearer_auth(ADMIN)
                    .json(&agent(&id, "Written during a transfer."))
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status() == 201) {
                    acked.push((id, Instant::now()));
                }
            }
            acked
        })
    };
    let http = reqwest::Client::new();
    let transfer = |node: u64, body: Option<serde_json::Value>, key: Option<&str>| {
        let mut req = http.post(format!("{}/cluster/transfer-leader", c.http_url(node)));
        if let Some(body) = body {
            req = req.json(&body);
        }
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        async move {
            let r = req.send().await.expect("answered");
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };

    // To the voter asked for, through a follower.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = transfer(via, Some(serde_json::json!({"id": target})), Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leader_id"], target, "{body}");
    assert_eq!(c.wait_for_leader(Duration::from_secs(10)).await, target);

    // Refused, with the error body, and nothing moves: a node that is not
    // a voter, a node id of 0, a caller without the admin key.
    for (body, key, code) in [
        (serde_json::json!({"id": 9}), Some(ADMIN), 409),
        (serde_json::json!({"id": 0}), Some(ADMIN), 400),
        (serde_json::json!({"id": leader}), None, 401),
    ] {
        let (status, answer) = transfer(via, Some(body.clone()), key).await;
        assert_eq!(status, code, "{body}: {answer}");
        assert!(answer["code"].is_string(), "{answer}");
    }
    assert_eq!(c.wait_for_leader(Duration::from_secs(10)).await, target);

    // Without a voter named, from the CLI: the most caught-up voter takes
    // over (the new leader grants its vote once its lease has passed).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grpc = c.grpc_url(target);
    cli(&["cluster", "transfer-leader", "--server", &grpc]).await;
    let now = c.wait_for_leader(Duration::from_secs(10)).await;
    assert_ne!(now, target);

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 10, "only {} writes", acked.len());
    let longest = acked
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .max()
        .unwrap_or_default();
    eprintln!(
        "two leadership transfers: {} writes acknowledged; longest time between two: {} ms",
        acked.len(),
        longest.as_millis()
    );
    let acked: Vec<String> = acked.into_iter().map(|(id, _)| id).collect();
    c.wait_applied_as(now, Duration::from_secs(20)).await;
    for id in 1..=3 {
        let contents = c.contents(id).await;
        let lost: Vec<&String> = acked
            .iter()
            .filter(|a| !contents.contains_key(*a))
            .collect();
        assert!(lost.is_empty(), "node {id} lacks {lost:?}");
    }
    let trail = http
        .get(format!(
            "{}/audit?operation=cluster.transfer_leader",
            c.http_url(now)
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answered")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    let outcomes: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["outcome"].as_str())
        .collect();
    assert!(
        outcomes.iter().filter(|o| **o == "ok").count() >= 2,
        "{trail}"
    );
}
