//! deploy/kubernetes/ and the Dockerfile agree with kvgate and with each other. The schemas
//! (scripts/validate-manifests.sh) say each document is well formed Kubernetes; this says the
//! kvgate configuration each ConfigMap carries loads as `kvgate serve --config` and `kvgate epp
//! --config` load it, that the ports, probes, pool name and mounted file the Deployments, the
//! Services and the InferencePool name are those the configurations use, and that the Roles
//! grant what discovery asks the API server for, no more.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents of deploy/kubernetes/`name`.
fn documents(name: &str) -> Vec<Value> {
    let path = root().join("deploy/kubernetes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn port_of(listen: &str) -> u64 {
    listen.rsplit(':').next().unwrap().parse().unwrap()
}

/// The one container of a Deployment.
fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

/// The configuration as kvgate builds it from the Deployment's container: the ConfigMap's file
/// (checked on its own, as `--config` loads it), then `--admin-listen` from the arguments and
/// the admin token from `KVGATE_ADMIN_TOKEN` if the container sets it from a Secret, checked
/// again. Also checks that the Deployment mounts that ConfigMap where `--config` reads it.
fn config_of(docs: &[Value], app: &str, file: &str) -> kvgate_gateway::Config {
    let deployment = find(docs, "Deployment", app);
    let c = container(deployment);
    let mount = &c["volumeMounts"][0];
    let volume = &deployment["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(mount["name"], volume["name"]);
    assert_eq!(volume["configMap"]["name"], app);
    let path = format!("{}/{file}", mount["mountPath"].as_str().unwrap());
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--config", &path]),
        "{args:?}"
    );
    let text = find(docs, "ConfigMap", app)["data"][file].as_str().unwrap();
    let mut config =
        kvgate_gateway::Config::from_yaml(text).unwrap_or_else(|e| panic!("{app}'s {file}: {e}"));
    if let Some(w) = args.windows(2).find(|w| w[0] == "--admin-listen") {
        config.admin_listen = Some(w[1].to_owned());
    }
    let env = c["env"].as_array().map(Vec::as_slice).unwrap_or_default();
    if let Some(token) = env.iter().find(|e| e["name"] == "KVGATE_ADMIN_TOKEN") {
        assert!(token["valueFrom"]["secretKeyRef"]["name"].is_string());
        config.admin_token = Some("from the Secret".into());
    }
    config
        .validate()
        .unwrap_or_else(|e| panic!("{app} with its flags: {e}"));
    config
}

/// The Service's port named `name` leads to the container port of that name, `port`.
fn service_reaches(docs: &[Value], app: &str, name: &str, port: u64) {
    let service = &find(docs, "Service", app)["spec"];
    assert_eq!(service["selector"]["app.kubernetes.io/name"], app);
    let ports = service["ports"].as_array().unwrap();
    let by_name = ports.iter().find(|p| p["name"] == name).unwrap();
    assert_eq!(by_name["port"], port);
    assert_eq!(by_name["targetPort"], name);
    let deployment = find(docs, "Deployment", app);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/name"], app);
    let declared = container(deployment)["ports"].as_array().unwrap();
    let declared = declared.iter().find(|p| p["name"] == name).unwrap();
    assert_eq!(declared["containerPort"], port);
}

/// The Role grants `get` on inferencepools and `list` on pods, nothing else, to the
/// Deployment's service account.
fn role_is_what_discovery_needs(docs: &[Value], app: &str) {
    let mut granted = BTreeSet::new();
    for rule in find(docs, "Role", app)["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert(format!("{group}/{resource}/{verb}").replace('"', ""));
                }
            }
        }
    }
    let needed = BTreeSet::from([
        "inference.networking.k8s.io/inferencepools/get".to_owned(),
        "/pods/list".to_owned(),
    ]);
    assert_eq!(granted, needed);
    let binding = find(docs, "RoleBinding", app);
    assert_eq!(binding["roleRef"]["name"], app);
    assert_eq!(binding["subjects"][0]["name"], app);
    let spec = &find(docs, "Deployment", app)["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], app);
}

fn discovered_pool(config: &kvgate_gateway::Config) -> &str {
    let pool = config.discovery.inference_pool.as_ref().expect("discovery");
    assert_eq!(pool.api_version, "inference.networking.k8s.io/v1");
    &pool.name
}

#[test]
fn the_gateway_manifest_matches_its_configuration() {
    let docs = documents("gateway.yaml");
    let pools = documents("inferencepool.yaml");
    let config = config_of(&docs, "kvgate-gateway", "gateway.yaml");
    let port = port_of(&config.listen);
    service_reaches(&docs, "kvgate-gateway", "http", port);
    let c = container(find(&docs, "Deployment", "kvgate-gateway"));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    role_is_what_discovery_needs(&docs, "kvgate-gateway");
    find(&pools, "InferencePool", discovered_pool(&config));
    let grace = &find(&docs, "Deployment", "kvgate-gateway")["spec"]["template"]["spec"]
        ["terminationGracePeriodSeconds"];
    assert!(grace.as_u64().unwrap() > config.shutdown_grace_secs);
}

#[test]
fn the_picker_manifest_matches_its_configuration_and_the_pool() {
    let docs = documents("epp.yaml");
    let pools = documents("inferencepool.yaml");
    let config = config_of(&docs, "kvgate-epp", "epp.yaml");
    let grpc = port_of(&config.listen);
    service_reaches(&docs, "kvgate-epp", "grpc", grpc);
    service_reaches(
        &docs,
        "kvgate-epp",
        "metrics",
        port_of(config.admin_listen.as_deref().unwrap()),
    );
    let c = container(find(&docs, "Deployment", "kvgate-epp"));
    assert_eq!(c["readinessProbe"]["grpc"]["port"], grpc);
    assert_eq!(c["readinessProbe"]["grpc"]["service"], "readiness");
    assert_eq!(c["livenessProbe"]["grpc"]["service"], "liveness");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    role_is_what_discovery_needs(&docs, "kvgate-epp");
    let pool = find(&pools, "InferencePool", discovered_pool(&config));
    let picker = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker["name"], "kvgate-epp");
    assert_eq!(picker["port"]["number"], grpc);
    let route = find(&pools, "HTTPRoute", "llama-route");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["name"], pool["metadata"]["name"]);
}

/// The Dockerfile's default command listens on the port it exposes and its health check probes.
#[test]
fn the_image_listens_where_it_is_checked() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line"))
            .to_owned()
    };
    assert_eq!(line("EXPOSE "), "EXPOSE 8080");
    assert_eq!(line("USER "), "USER 65532:65532");
    assert!(line("CMD ").contains(r#""--listen", "0.0.0.0:8080""#));
    assert!(text.contains(r#""probe", "http://127.0.0.1:8080/health""#));
}
