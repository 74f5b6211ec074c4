//! Authentication and the Status objects of raw HTTP errors.

use testbed::control::ApiServerCmd;

use super::{Env, Identity, NODE_USER};
use crate::common::NODE;

#[tokio::test]
async fn anonymous_and_wrong_token_are_unauthorized() {
    let env = Env::start("anon").await;
    let admin = std::fs::read_to_string(env.path("kubeconfig-admin")).expect("kubeconfig");
    let with_user = |user: &str| -> String {
        admin
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("token:") {
                    format!("    {user}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // No credentials at all: kubectl wants to prompt for them (stdin is closed), so it
    // fails before its first resource request; the raw request below shows the 401.
    std::fs::write(env.path("kubeconfig-anon"), with_user("{}")).expect("write");
    let out = env
        .run(&env.path("kubeconfig-anon"), &["get", "nodes"])
        .await;
    assert!(!out.ok, "anonymous kubectl succeeded: {}", out.stdout);
    // Credentials the server does not accept: basic auth, a wrong token.
    std::fs::write(
        env.path("kubeconfig-basic"),
        with_user("{username: nobody, password: secret}"),
    )
    .expect("write");
    let wrong = admin.replace(&env.token(), "not-the-token");
    std::fs::write(env.path("kubeconfig-wrong"), wrong).expect("write");
    for config in ["kubeconfig-basic", "kubeconfig-wrong"] {
        let out = env.run(&env.path(config), &["get", "nodes"]).await;
        assert!(!out.ok, "{config}: {}", out.stdout);
        // kubectl's wording for a 401 (the message comes from client-go's discovery).
        assert!(
            out.stderr.contains("You must be logged in to the server"),
            "{config}: {}",
            out.stderr
        );
    }

    let raw = env
        .raw("GET", "/api/v1/nodes", Identity::Anonymous, None)
        .await;
    assert_eq!(raw.status, 401);
    let status = raw.json();
    assert_eq!(
        (
            status["kind"].as_str(),
            status["apiVersion"].as_str(),
            status["status"].as_str(),
            status["reason"].as_str(),
            status["code"].as_u64()
        ),
        (
            Some("Status"),
            Some("v1"),
            Some("Failure"),
            Some("Unauthorized"),
            Some(401)
        )
    );
    let raw = env
        .raw(
            "GET",
            &format!("/api/v1/nodes/{NODE}"),
            Identity::Node,
            None,
        )
        .await;
    assert_eq!(raw.status, 200, "{}", raw.body);
    let stats = env.control(ApiServerCmd::STATS).await;
    assert_eq!(stats["by_user"][NODE_USER]["get"], 1, "{stats}");
    assert!(
        stats["by_user"]["system:anonymous"]["list"].as_u64() >= Some(1),
        "{stats}"
    );
}

#[tokio::test]
async fn raw_errors_are_status_objects() {
    let env = Env::start("errors").await;
    let cases = [
        ("GET", "/api/v1/secrets".to_string(), None, 404, "NotFound"),
        (
            "GET",
            "/api/v1/nodes/nope".to_string(),
            None,
            404,
            "NotFound",
        ),
        (
            "DELETE",
            format!("/api/v1/nodes/{NODE}"),
            None,
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/api/v1/nodes".to_string(),
            Some(("application/json", "{}")),
            405,
            "MethodNotAllowed",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/merge-patch+json", "{not json")),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/json-patch+json", r#"{"op":"add"}"#)),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/yaml", "metadata: {}")),
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/apply-patch+yaml", "metadata: {}")),
            422,
            "Invalid",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some((
                "application/merge-patch+json",
                r#"{"metadata":{"annotations":{"a":1}}}"#,
            )),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some((
                "application/merge-patch+json",
                r#"{"metadata":{"name":"other"}}"#,
            )),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/events".to_string(),
            Some(("application/json", r#"{"metadata":{}}"#)),
            422,
            "Invalid",
        ),
        (
            "GET",
            "/api/v1/nodes?watch=maybe".to_string(),
            None,
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?watch=1&resourceVersion=abc".to_string(),
            None,
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?labelSelector=a+b".to_string(),
            None,
            400,
            "BadRequest",
        ),
    ];
    for (method, path, body, code, reason) in cases {
        let raw = env.raw(method, &path, Identity::Admin, body).await;
        assert_eq!(raw.status, code, "{method} {path}: {}", raw.body);
        let status = raw.json();
        assert_eq!(status["kind"], "Status", "{method} {path}");
        assert_eq!(status["reason"], reason, "{method} {path}: {status}");
        assert_eq!(status["code"], code);
    }
    let discovery = env.raw("GET", "/apis", Identity::Admin, None).await;
    assert_eq!(discovery.json()["kind"], "APIGroupList");
    let resources = env
        .raw("GET", "/api/v1", Identity::Admin, None)
        .await
        .json();
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "nodes",
            "nodes/status",
            "events",
            "namespaces",
            "pods",
            "pods/status",
            "pods/eviction"
        ]
    );
}
