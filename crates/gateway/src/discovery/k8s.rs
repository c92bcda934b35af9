//! Reading the Kubernetes objects discovery needs: an InferencePool's selector and port (in the
//! extension's v1 and v1alpha2 shapes) and which pods of a list are ready.

use serde_json::Value;

/// The extension's v1 API.
pub(super) const V1: &str = "inference.networking.k8s.io/v1";
/// Its earlier alpha API.
pub(super) const V1ALPHA2: &str = "inference.networking.x-k8s.io/v1alpha2";

/// The pool's label selector and target port: v1 has `selector.matchLabels` and
/// `targetPorts[0].number`, v1alpha2 a plain `selector` map and `targetPortNumber`.
pub(super) fn pool_selector(pool: &Value) -> Result<(Vec<(String, String)>, u16), String> {
    let spec = &pool["spec"];
    let selector = &spec["selector"];
    let labels = selector
        .get("matchLabels")
        .unwrap_or(selector)
        .as_object()
        .ok_or("the InferencePool has no selector")?;
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    if labels.is_empty() {
        return Err("the InferencePool's selector has no labels".into());
    }
    labels.sort();
    let port = spec["targetPorts"][0]["number"]
        .as_u64()
        .or_else(|| spec["targetPortNumber"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or("the InferencePool has no target port")?;
    Ok((labels, port))
}

/// `k=v,k=v`, percent-encoded for a query string.
pub(super) fn label_selector(labels: &[(String, String)]) -> String {
    let encode = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    labels
        .iter()
        .map(|(k, v)| format!("{}%3D{}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("%2C")
}

/// The IPs of the pods that can serve: running, ready, with an IP, not being deleted.
pub(super) fn ready_pod_ips(pods: &Value) -> Vec<String> {
    let Some(items) = pods["items"].as_array() else {
        return Vec::new();
    };
    let mut ips: Vec<String> = items
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| p["status"]["phase"] == "Running")
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .filter_map(|p| p["status"]["podIP"].as_str().filter(|ip| !ip.is_empty()))
        .map(str::to_owned)
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_api_versions_give_selector_and_port() {
        let v1 = json!({"spec": {"selector": {"matchLabels": {"app": "vllm", "tier": "a/b"}},
            "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "epp"}}});
        let (labels, port) = pool_selector(&v1).unwrap();
        assert_eq!(port, 8000);
        assert_eq!(label_selector(&labels), "app%3Dvllm%2Ctier%3Da%2Fb");
        let alpha = json!({"spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8001,
            "extensionRef": {"name": "epp"}}});
        assert_eq!(
            pool_selector(&alpha).unwrap(),
            (vec![("app".into(), "vllm".into())], 8001)
        );
        assert!(pool_selector(&json!({"spec": {"selector": {}}})).is_err());
        assert!(pool_selector(&json!({"spec": {"selector": {"app": "x"}}})).is_err());
    }

    #[test]
    fn only_running_ready_pods_with_an_ip_count() {
        let pod = |ip: &str, phase: &str, ready: &str, deleting: bool| {
            let mut p = json!({"metadata": {"name": ip}, "status": {"phase": phase, "podIP": ip,
                "conditions": [{"type": "Ready", "status": ready}]}});
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
            }
            p
        };
        let list = json!({"items": [
            pod("10.0.0.2", "Running", "True", false),
            pod("10.0.0.1", "Running", "True", false),
            pod("10.0.0.3", "Running", "False", false),
            pod("10.0.0.4", "Pending", "True", false),
            pod("10.0.0.5", "Running", "True", true),
            pod("", "Running", "True", false),
        ]});
        assert_eq!(ready_pod_ips(&list), vec!["10.0.0.1", "10.0.0.2"]);
        assert!(ready_pod_ips(&json!({"kind": "Status"})).is_empty());
    }
}
