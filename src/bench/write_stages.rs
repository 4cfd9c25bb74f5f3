//! Where a committed write's time and CPU go: the nodes' own stage
//! instruments (`/metrics`: request, commit wait, log append and sync,
//! replication round trips, apply) and each process's CPU time from
//! `/proc`, read before and after a measured level and divided by the
//! writes it committed. Averages, not percentiles: they add up.

use std::collections::HashMap;
use std::time::Duration;

/// Linux reports process CPU time in ticks of `USER_HZ`, which is 100 on
/// every architecture the kernel ABI fixes it for.
const USER_HZ: f64 = 100.0;

/// Total CPU time (user + system, all threads, living and exited) of a
/// process, or None off Linux or once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it do not.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(Duration::from_secs_f64(ticks / USER_HZ))
}

/// Bytes a process has caused to be written to storage (`write_bytes` of
/// `/proc/<pid>/io`: the file pages it dirtied for the disk — WAL, tables,
/// snapshots), or None off Linux or once it is gone.
pub fn disk_written(pid: u32) -> Option<u64> {
    write_bytes(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

/// The `write_bytes` field of a `/proc/<pid>/io` text.
fn write_bytes(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// One process at one moment: its exposition's samples, its CPU time and
/// the bytes it has written to storage.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    metrics: HashMap<String, f64>,
    cpu: Duration,
    disk: u64,
}

/// Reads a node's `/metrics` (Prometheus text) and its CPU time.
pub async fn sample(http: &str, key: &str, pid: u32) -> Sample {
    let text = match reqwest::Client::new()
        .get(format!("{http}/metrics"))
        .bearer_auth(key)
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    Sample {
        metrics: parse(&text),
        ..cpu_sample(pid)
    }
}

/// A process that exposes no metrics (etcd here): CPU time and disk
/// writes only.
pub fn cpu_sample(pid: u32) -> Sample {
    Sample {
        metrics: HashMap::new(),
        cpu: cpu_time(pid).unwrap_or_default(),
        disk: disk_written(pid).unwrap_or_default(),
    }
}

/// Sample name with its labels → value; comments skipped.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The change of one sample between two reads, summed over every sample
/// whose name (labels included) starts with `name` and contains `label`.
fn delta(before: &Sample, after: &Sample, name: &str, label: &str) -> f64 {
    let total = |s: &Sample| -> f64 {
        s.metrics
            .iter()
            .filter(|(k, _)| {
                (k.as_str() == name || k.starts_with(&format!("{name}{{"))) && k.contains(label)
            })
            .map(|(_, v)| v)
            .sum()
    };
    total(after) - total(before)
}

/// Mean of a histogram over the interval, in µs (0 when nothing was seen).
fn mean_us(before: &Sample, after: &Sample, histogram: &str, label: &str) -> f64 {
    let count = delta(before, after, &format!("{histogram}_count"), label);
    if count <= 0.0 {
        return 0.0;
    }
    delta(before, after, &format!("{histogram}_sum"), label) / count * 1e6
}

/// One node's stage figures over a measured level, per committed write
/// unless said otherwise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStages {
    /// Server-side time of a Register request (leader).
    pub request_us: f64,
    /// Propose → committed and applied (leader).
    pub commit_us: f64,
    /// One log append (the write, not the sync), and entries per append.
    pub append_us: f64,
    pub entries_per_append: f64,
    /// One WAL sync, and syncs per write.
    pub sync_us: f64,
    pub syncs_per_write: f64,
    /// One AppendEntries round trip with entries (leader), and entries per
    /// round trip.
    pub replicate_us: f64,
    pub entries_per_replicate: f64,
    /// One AppendEntries with entries, arrival to answer (follower): the
    /// part of the leader's round trip spent on the follower.
    pub handling_us: f64,
    /// Client writes gathered into one log entry by the batcher (leader).
    pub writes_per_entry: f64,
    /// Applying, per entry.
    pub apply_us_per_entry: f64,
    /// CPU time per committed write.
    pub cpu_us: f64,
    /// Bytes written to storage per committed write.
    pub disk_bytes: f64,
}

/// The stage figures of a node between two samples, `writes` committed.
pub fn stages(before: &Sample, after: &Sample, writes: usize) -> NodeStages {
    const REQUEST: &str = "agentry_request_duration_seconds";
    const REGISTER: &str = "Registry/Register";
    let per = |x: f64| if writes == 0 { 0.0 } else { x / writes as f64 };
    let ratio = |a: f64, b: f64| if b <= 0.0 { 0.0 } else { a / b };
    let appended = delta(before, after, "agentry_raft_log_appended_entries_total", "");
    let appends = delta(
        before,
        after,
        "agentry_raft_log_append_duration_seconds_count",
        "",
    );
    let replicated = delta(before, after, "agentry_raft_replicated_entries_total", "");
    let replications = delta(
        before,
        after,
        "agentry_raft_replicate_duration_seconds_count",
        "",
    );
    let applied = delta(before, after, "agentry_raft_applied_entries_total", "");
    let apply_s = delta(before, after, "agentry_raft_apply_duration_seconds_sum", "");
    NodeStages {
        request_us: mean_us(before, after, REQUEST, REGISTER),
        commit_us: mean_us(before, after, "agentry_raft_commit_duration_seconds", ""),
        append_us: mean_us(
            before,
            after,
            "agentry_raft_log_append_duration_seconds",
            "",
        ),
        entries_per_append: ratio(appended, appends),
        sync_us: mean_us(before, after, "agentry_raft_log_sync_duration_seconds", ""),
        syncs_per_write: per(delta(
            before,
            after,
            "agentry_raft_log_sync_duration_seconds_count",
            "",
        )),
        replicate_us: mean_us(before, after, "agentry_raft_replicate_duration_seconds", ""),
        entries_per_replicate: ratio(replicated, replications),
        handling_us: mean_us(
            before,
            after,
            "agentry_raft_append_handling_duration_seconds",
            "",
        ),
        writes_per_entry: ratio(
            delta(before, after, "agentry_batched_writes_total", ""),
            delta(before, after, "agentry_write_entries_total", ""),
        ),
        apply_us_per_entry: ratio(apply_s * 1e6, applied),
        cpu_us: per((after.cpu.saturating_sub(before.cpu)).as_secs_f64() * 1e6),
        disk_bytes: per(after.disk.saturating_sub(before.disk) as f64),
    }
}

/// The stage table of one level: leader and follower side by side.
pub fn render(clients: usize, leader: &NodeStages, follower: &NodeStages) -> String {
    // A stage the node does not take part in (a follower answers no
    // client and sends no AppendEntries) shows as "-".
    let cell = |v: f64| {
        if v == 0.0 {
            "-".to_string()
        } else {
            format!("{v:.1}")
        }
    };
    let row =
        |name: &str, l: f64, f: f64| format!("  {name:<34} {:>10} {:>10}\n", cell(l), cell(f));
    let mut out = format!(
        "agentry stages at {clients} clients (mean per write unless noted)   leader   follower\n"
    );
    out.push_str(&row(
        "request, server side (µs)",
        leader.request_us,
        follower.request_us,
    ));
    out.push_str(&row(
        "propose -> applied (µs)",
        leader.commit_us,
        follower.commit_us,
    ));
    out.push_str(&row(
        "log append, per append (µs)",
        leader.append_us,
        follower.append_us,
    ));
    out.push_str(&row(
        "entries per append",
        leader.entries_per_append,
        follower.entries_per_append,
    ));
    out.push_str(&row(
        "log sync, per sync (µs)",
        leader.sync_us,
        follower.sync_us,
    ));
    out.push_str(&row(
        "syncs per write",
        leader.syncs_per_write,
        follower.syncs_per_write,
    ));
    out.push_str(&row(
        "replication round trip (µs)",
        leader.replicate_us,
        follower.replicate_us,
    ));
    out.push_str(&row(
        "AppendEntries handled in (µs)",
        leader.handling_us,
        follower.handling_us,
    ));
    out.push_str(&row(
        "entries per round trip",
        leader.entries_per_replicate,
        follower.entries_per_replicate,
    ));
    out.push_str(&row(
        "client writes per entry",
        leader.writes_per_entry,
        follower.writes_per_entry,
    ));
    out.push_str(&row(
        "apply, per entry (µs)",
        leader.apply_us_per_entry,
        follower.apply_us_per_entry,
    ));
    out.push_str(&row("CPU per write (µs)", leader.cpu_us, follower.cpu_us));
    out.push_str(&row(
        "disk written per write (KB)",
        leader.disk_bytes / 1e3,
        follower.disk_bytes / 1e3,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, cpu_ms: u64) -> Sample {
        Sample {
            metrics: parse(text),
            cpu: Duration::from_millis(cpu_ms),
            disk: cpu_ms * 1_000,
        }
    }

    #[test]
    fn stage_means_come_from_histogram_deltas() {
        let before = sample(
            "# HELP x\n\
             agentry_raft_commit_duration_seconds_sum 1.0\n\
             agentry_raft_commit_duration_seconds_count 100\n\
             agentry_request_duration_seconds_sum{transport=\"grpc\",route=\"agentry.v1.Registry/Register\",code=\"OK\"} 2.0\n\
             agentry_request_duration_seconds_count{transport=\"grpc\",route=\"agentry.v1.Registry/Register\",code=\"OK\"} 100\n\
             agentry_request_duration_seconds_sum{transport=\"http\",route=\"GET /healthz\",code=\"200\"} 9.0\n\
             agentry_raft_applied_entries_total 100\n\
             agentry_write_entries_total 10\n\
             agentry_batched_writes_total 10\n\
             agentry_raft_apply_duration_seconds_sum 0.1\n\
             agentry_raft_append_handling_duration_seconds_sum 0.2\n\
             agentry_raft_append_handling_duration_seconds_count 10\n",
            1_000,
        );
        let after = sample(
            "agentry_raft_commit_duration_seconds_sum 1.5\n\
             agentry_raft_commit_duration_seconds_count 200\n\
             agentry_request_duration_seconds_sum{transport=\"grpc\",route=\"agentry.v1.Registry/Register\",code=\"OK\"} 2.8\n\
             agentry_request_duration_seconds_count{transport=\"grpc\",route=\"agentry.v1.Registry/Register\",code=\"OK\"} 200\n\
             agentry_request_duration_seconds_sum{transport=\"http\",route=\"GET /healthz\",code=\"200\"} 99.0\n\
             agentry_raft_applied_entries_total 300\n\
             agentry_write_entries_total 30\n\
             agentry_batched_writes_total 90\n\
             agentry_raft_apply_duration_seconds_sum 0.2\n\
             agentry_raft_append_handling_duration_seconds_sum 0.6\n\
             agentry_raft_append_handling_duration_seconds_count 20\n",
            1_500,
        );
        let s = stages(&before, &after, 100);
        assert!((s.commit_us - 5_000.0).abs() < 1e-6, "{s:?}");
        // Only the Register route counts.
        assert!((s.request_us - 8_000.0).abs() < 1e-6, "{s:?}");
        assert!((s.apply_us_per_entry - 500.0).abs() < 1e-6, "{s:?}");
        // 80 writes in 20 entries.
        assert!((s.writes_per_entry - 4.0).abs() < 1e-6, "{s:?}");
        assert!((s.cpu_us - 5_000.0).abs() < 1e-6, "{s:?}");
        // 500,000 bytes over 100 writes.
        assert!((s.disk_bytes - 5_000.0).abs() < 1e-6, "{s:?}");
        // 0.4 s over 10 AppendEntries handled.
        assert!((s.handling_us - 40_000.0).abs() < 1e-6, "{s:?}");
        // Nothing seen: zero, not a division by zero.
        assert_eq!(s.replicate_us, 0.0);
    }

    #[test]
    fn this_process_has_cpu_time() {
        let spin: u64 = (0..2_000_000u64).fold(0, |a, x| a.wrapping_add(x * x));
        assert!(spin > 0);
        assert!(cpu_time(std::process::id()).is_some());
    }

    #[test]
    fn storage_writes_are_read_from_the_io_accounting() {
        let io = "rchar: 972865265\nwchar: 2243120497\nsyscr: 140243\nsyscw: 241312\n\
                  read_bytes: 4096\nwrite_bytes: 1841201152\ncancelled_write_bytes: 176128\n";
        assert_eq!(write_bytes(io), Some(1_841_201_152));
        assert_eq!(write_bytes("rchar: 1\n"), None);
    }
}
