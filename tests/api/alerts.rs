//! The Helm chart's alerts (`helm/agentry/alerts/agentry.rules.yaml`),
//! checked by Prometheus' own `promtool` (from Debian's `prometheus`
//! package, fetched by `scripts/fetch-promtool.sh`, which `scripts/test.sh`
//! runs): the file must load as Prometheus
//! would load it, and its unit tests (`tests/fixtures/alerts.test.yaml`)
//! must pass — a healthy cluster raises nothing, and every alert fires on
//! the series that should raise it, after its wait, with its labels and
//! rendered messages. No server is needed: the series a node exports are
//! checked against the same file by a unit test in `src/api/http/metrics.rs`.

use std::path::Path;
use std::process::Command;

fn promtool(args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // scripts/test.sh says where scripts/fetch-promtool.sh put it.
    let tool = std::env::var("AGENTRY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let out = Command::new(tool)
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}); run scripts/test.sh, which fetches it")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_charts_alert_rules_load_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "helm/agentry/alerts/agentry.rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "tests/fixtures/alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert is tested both ways: silent on the healthy cluster and
    // firing in a case of its own, so a new alert cannot go untested.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let rules = read("helm/agentry/alerts/agentry.rules.yaml");
    let tests = read("tests/fixtures/alerts.test.yaml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        let silent = format!("alertname: {alert}, exp_alerts: []}}");
        let firing = format!("alertname: {alert}\n        exp_alerts:\n          - exp_labels");
        assert!(
            tests.contains(&silent),
            "{alert} has no case where it stays silent"
        );
        assert!(
            tests.contains(&firing),
            "{alert} has no case where it fires"
        );
    }
}
