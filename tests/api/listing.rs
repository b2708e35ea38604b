//! ListGroups and ListAllTools: every domain and tool of the registry whatever the settings,
//! which groups are active, and the prompt section.

use crate::helpers::{Backend, demo_registry, spawn_app_on};

crate::on_both_backends!(
    list_groups_gives_every_domain_by_name_and_the_prompt_section,
    list_all_tools_gives_every_tool_whatever_the_settings_core_first,
);

async fn list_groups_gives_every_domain_by_name_and_the_prompt_section(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let empty = app.list_groups().await.unwrap();
    assert_eq!(empty.prompt_section, "", "no active non-core group yet");

    app.set("sonarr_url", "x").await;
    app.set("docker_host", "x").await;
    let r = app.list_groups().await.unwrap();
    let registry = demo_registry();
    let names: Vec<&str> = r.groups.iter().map(|g| g.name.as_str()).collect();
    let expected: Vec<&str> = registry.domains().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, expected);
    assert!(names.windows(2).all(|w| w[0] < w[1]));
    let active: Vec<&str> = r
        .groups
        .iter()
        .filter(|g| g.active)
        .map(|g| g.name.as_str())
        .collect();
    assert_eq!(active, ["docker", "sonarr", "system"]);
    let docker = registry.domain(registry.find("docker").unwrap());
    let sonarr = registry.domain(registry.find("sonarr").unwrap());
    assert_eq!(
        r.prompt_section,
        format!(
            "## Available Tool Groups\n\nUse `load_tool_group` to load tools from a group before using them.\n\n- docker: {}\n- sonarr: {}",
            docker.description, sonarr.description
        )
    );
    assert_eq!(r.registry_version, registry.version());
    let g = r.groups.iter().find(|g| g.name == "sonarr").unwrap();
    assert_eq!(g.settings_keys, sonarr.settings_keys);
    assert_eq!(g.keywords, sonarr.keywords);
    assert_eq!(g.tool_count as usize, sonarr.tools.len());
    app.stop().await;
}

async fn list_all_tools_gives_every_tool_whatever_the_settings_core_first(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let r = app.list_all_tools().await.unwrap();
    let registry = demo_registry();
    assert_eq!(r.tools.len(), registry.tool_count());
    assert!(r.tools.iter().all(|t| t.name != "load_tool_group"));
    let mut domains: Vec<&str> = r.tools.iter().map(|t| t.domain.as_str()).collect();
    domains.dedup();
    let mut expected = vec!["system"];
    expected.extend(
        registry
            .domains()
            .iter()
            .filter(|d| !d.core)
            .map(|d| d.name.as_str()),
    );
    assert_eq!(domains, expected);
    assert_eq!(r.groups.len(), registry.domains().len());
    assert_eq!(
        r.groups.iter().filter(|g| g.active).count(),
        1,
        "only the core domain is active"
    );
    for t in &r.tools {
        let schema: serde_json::Value = serde_json::from_str(&t.input_schema_json).unwrap();
        assert_eq!(schema["type"], "object");
        assert!(!t.input_schema_json.contains('\n'), "compact JSON");
        assert!(["read", "modify", "destructive"].contains(&t.tier.as_str()));
    }
    app.stop().await;
}
