use super::*;

#[test]
fn method_labels_are_the_served_calls_and_unknown_for_anything_else() {
    // Every RPC of the proto has its label, and no other.
    let proto = include_str!("../../proto/toolrouter/v1/router.proto");
    let rpcs: Vec<&str> = proto
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .filter_map(|l| l.split(['(', ' ']).next())
        .collect();
    assert_eq!(rpcs, METHODS);
    for m in METHODS {
        assert_eq!(method_label(&format!("/toolrouter.v1.ToolRouter/{m}")), *m);
    }
    assert_eq!(
        method_label("/grpc.health.v1.Health/Check"),
        "/grpc.health.v1.Health/Check"
    );
    for path in [
        "/toolrouter.v1.ToolRouter/Bogus",
        "/x.y/Z",
        "/",
        "",
        "/toolrouter.v1.ToolRouter/",
    ] {
        assert_eq!(method_label(path), "unknown", "{path}");
    }
}

#[test]
fn a_logged_method_is_the_served_name_or_the_callers_path_cut_and_escaped() {
    assert_eq!(logged_method("/toolrouter.v1.ToolRouter/Route"), "Route");
    assert_eq!(
        logged_method("/grpc.health.v1.Health/Check"),
        "/grpc.health.v1.Health/Check"
    );
    let long = format!("/{}/x", "A".repeat(15_000));
    assert_eq!(logged_method(&long), format!("/{}…", "A".repeat(127)));
    let forged = "/x\n{\"level\":\"ERROR\"}";
    assert!(!logged_method(forged).contains('\n'), "{}", logged_method(forged));
    assert!(logged_method("/toolrouter.v1.ToolRouter/Nope").starts_with("/toolrouter.v1.ToolRouter/"));
}

#[test]
fn a_conversation_hash_is_short_stable_and_not_the_id() {
    let h = conversation_hash("user-42");
    assert_eq!(h.len(), 8);
    assert_eq!(h, conversation_hash("user-42"));
    assert_ne!(h, conversation_hash("user-43"));
    assert!(!h.contains("user"));
    // Ids one character apart get hashes apart in most digits, not in one.
    for (a, b) in [
        ("conv-1", "conv-2"),
        ("user-42", "user-43"),
        ("a", "b"),
        ("db0", "db1"),
    ] {
        let (a, b) = (conversation_hash(a), conversation_hash(b));
        let differ = a.chars().zip(b.chars()).filter(|(x, y)| x != y).count();
        assert!(differ >= 5, "{a} {b}");
    }
}

#[test]
fn routed_domains_are_logged_as_a_json_array_of_name_and_reason() {
    let registry = Arc::new(crate::registry::Registry::demo());
    let first = registry.domain_ids().next().unwrap();
    let last = registry.domain_ids().last().unwrap();
    let routed = RoutedDomains::new(
        Arc::clone(&registry),
        vec![(first, Reason::Core), (last, Reason::Fallback)],
    );
    let want = serde_json::json!([
        format!("{}:core", registry.domain(first).name),
        format!("{}:fallback", registry.domain(last).name),
    ]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(routed.json()).unwrap(),
        want
    );
    assert_eq!(routed.json(), routed.to_json(), "written once, the same text");
    let none = RoutedDomains::new(registry, Vec::new());
    assert_eq!(none.json(), "[]");
}
