use super::*;

#[tokio::test]
async fn run_time_domains_that_cannot_be_read_after_a_notice_are_tried_again_later_and_later() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let config = Config {
        database: format!("sqlite://{}", path.display()),
        ..Config::default()
    };
    let state = State::new(Registry::demo(), &config).await.unwrap();
    assert_eq!(state.take_runtime_domains(None).await, None, "read: done");
    std::fs::rename(&path, dir.path().join("moved.db")).unwrap();
    let first = state.take_runtime_domains(None).await.expect("a retry");
    assert_eq!(first.1, crate::db::NOTICE_RETRY);
    let second = state.take_runtime_domains(Some(first)).await.expect("another");
    assert_eq!(second.1, crate::db::NOTICE_RETRY * 2);
    assert!(second.0 > first.0);
    std::fs::rename(dir.path().join("moved.db"), &path).unwrap();
    assert_eq!(state.take_runtime_domains(Some(second)).await, None);
}

/// Two daemons on one PostgreSQL database, the second not yet told of the first's new
/// domain: its upsert of a domain with the same tool name is refused, as on one daemon,
/// instead of both being stored and one of them served by neither.
#[tokio::test]
async fn on_postgres_an_upsert_clashing_with_one_another_daemon_just_stored_is_refused() {
    let Some(admin) = crate::db::testing::postgres_url() else {
        return;
    };
    let config = Config {
        database: crate::db::testing::fresh_postgres_database(&admin).await,
        ..Config::default()
    };
    let a = State::new(Registry::demo(), &config).await.unwrap();
    let b = State::new(Registry::demo(), &config).await.unwrap();
    let lab = |name: &str| {
        format!(r#"{{"name": "{name}", "tools": [{{"name": "lab_probe", "description": "Probe the lab"}}]}}"#)
    };
    a.upsert_domain(&lab("lab_one")).await.unwrap();
    let refused = b.upsert_domain(&lab("lab_two")).await.unwrap_err();
    let status = tonic::Status::from(refused);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("lab_probe"), "{}", status.message());
    let stored: Vec<String> = a
        .inner
        .db
        .read_domains()
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(stored, ["lab_one"]);
    // Replacing a domain by itself is no clash.
    b.upsert_domain(&lab("lab_one")).await.unwrap();
}

/// A change that lets a stored domain back in (first in name order, it wins a clash)
/// would push out one served now, on every daemon that composes the stored rows: it is
/// refused, naming what would be lost, and nothing changes. A change that loses nothing
/// is made.
#[tokio::test]
async fn a_domain_change_that_would_stop_serving_another_domain_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let domain = |name: &str, tools: &[&str]| {
        let tools: Vec<String> = tools
            .iter()
            .map(|t| format!(r#"{{"name": "{t}", "description": "Does {t}"}}"#))
            .collect();
        format!(r#"{{"name": "{name}", "tools": [{}]}}"#, tools.join(", "))
    };
    let state = demo_state(dir.path()).await;
    state.upsert_domain(&domain("a_old", &["xtool"])).await.unwrap();
    state.upsert_domain(&domain("c_new", &["ytool"])).await.unwrap();
    // A row that clashes with both, as an older daemon could leave behind.
    state
        .inner
        .db
        .upsert_domain("b_mid", &domain("b_mid", &["xtool", "ytool"]), 1)
        .await
        .unwrap();
    drop(state);
    let state = demo_state(dir.path()).await;
    let served = |state: &State| {
        let view = state.inner.view.load();
        ["a_old", "b_mid", "c_new"]
            .into_iter()
            .filter(|n| view.registry.find(n).is_some())
            .collect::<Vec<_>>()
    };
    assert_eq!(served(&state), ["a_old", "c_new"], "b_mid is left out");
    let version = state.inner.view.load().registry.version();
    let refused = |e: Error, verb: &str| {
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert_eq!(
            status.message(),
            format!(
                "{verb} domain 'a_old' would stop serving c_new: a stored domain it lets back in clashes with it. \
                 Nothing changed; delete or fix the clashing domain first."
            )
        );
    };
    refused(
        state
            .upsert_domain(&domain("a_old", &["ztool"]))
            .await
            .unwrap_err(),
        "Upserting",
    );
    refused(state.delete_domain("a_old").await.unwrap_err(), "Deleting");
    assert_eq!(
        state.inner.view.load().registry.version(),
        version,
        "nothing changed"
    );
    assert_eq!(state.inner.db.read_domains().await.unwrap().len(), 3);
    // Without the left-out row, both are made.
    state.delete_domain("b_mid").await.unwrap();
    state.upsert_domain(&domain("a_old", &["ztool"])).await.unwrap();
    state.delete_domain("a_old").await.unwrap();
    assert_eq!(served(&state), ["c_new"]);
}

/// The demo registry over a SQLite database in `dir`.
async fn demo_state(dir: &std::path::Path) -> State {
    let config = Config {
        database: format!("sqlite://{}", dir.join("s.db").display()),
        ..Config::default()
    };
    State::new(Registry::demo(), &config).await.unwrap()
}

/// Writes the setting that activates the Sonarr domain, as a settings UI does.
async fn configure_sonarr(state: &State) {
    let db = &state.inner.db;
    db.set_setting("sonarr_url", "http://nas:8989").await.unwrap();
}

/// Whether `view` serves the Sonarr domain (active once `sonarr_url` is set).
fn sonarr_active(view: &View) -> bool {
    let sonarr = view.registry.find("sonarr").expect("a demo domain");
    view.activation.is_active(sonarr)
}

/// A caller that took the settings before an invalidation re-read them answers from its
/// own view, but never puts the older settings back for everyone (nor tells watchers).
#[tokio::test]
async fn a_snapshot_older_than_the_newest_read_is_never_served_to_others() {
    let dir = tempfile::tempdir().unwrap();
    let state = demo_state(dir.path()).await;
    let (mut watcher, _) = state.watch();
    let older = state.inner.settings.get().await;
    configure_sonarr(&state).await;
    let newer = state.invalidate_settings().await.unwrap();
    assert!(sonarr_active(&newer));
    assert!(watcher.has_changed().unwrap());
    assert!(sonarr_active(&watcher.borrow_and_update()));

    let own = state.view_for(older);
    assert!(
        !sonarr_active(&own),
        "the caller answers from the settings it took"
    );
    assert!(
        sonarr_active(&state.inner.view.load()),
        "the others keep the newest"
    );
    assert!(!watcher.has_changed().unwrap(), "watchers are told nothing");
    assert!(sonarr_active(&*state.view().await));
}

/// A reload hands the memory of the registry it replaced back to the system once the last
/// call reading that registry ends, not while one still does; also when a later reload
/// replaced the next registry first (that one's trim ran while the call still read the
/// first).
#[tokio::test]
async fn a_replaced_registry_is_released_once_the_last_call_reading_it_ends() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    static TRIMS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    fn trim_0() {
        TRIMS[0].fetch_add(1, SeqCst);
    }
    fn trim_1() {
        TRIMS[1].fetch_add(1, SeqCst);
    }
    async fn trims_reach(case: usize, want: usize) {
        for _ in 0..250 {
            if TRIMS[case].load(SeqCst) >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(TRIMS[case].load(SeqCst), want, "case {case}");
    }
    // (counted by, reloads while the call holds the first registry)
    let cases = [(trim_0 as fn(), 1), (trim_1, 2)];
    for (case, (trim, reloads)) in cases.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let state = demo_state(dir.path()).await;
        state.inner.trims.count_with(trim);
        // A call that took the view before the reloads, and is still answering from it.
        let call = state.inner.view.load_full();
        for _ in 0..reloads {
            state.reload().await.unwrap();
        }
        assert!(!Arc::ptr_eq(&state.inner.view.load().registry, &call.registry));
        // The registries between the first and the last are read by no call.
        trims_reach(case, reloads - 1).await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(
            TRIMS[case].load(SeqCst),
            reloads - 1,
            "the call still reads the first registry"
        );
        drop(call);
        trims_reach(case, reloads).await;
    }
}

/// Trims asked for back to back run at most once a second: the first at once, the others
/// together once the second is up, each after it was asked for.
#[tokio::test(start_paused = true)]
async fn trims_asked_for_back_to_back_run_at_most_once_a_second() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    static TRIMS: AtomicUsize = AtomicUsize::new(0);
    fn trim() {
        TRIMS.fetch_add(1, SeqCst);
    }
    let trims = Arc::new(view::Trims::new());
    trims.count_with(trim);
    let ask = |trims: &Arc<view::Trims>| {
        let trims = trims.clone();
        tokio::spawn(async move { trims.soon().await })
    };
    ask(&trims).await.unwrap();
    assert_eq!(TRIMS.load(SeqCst), 1, "the first at once");
    let started = tokio::time::Instant::now();
    let asked: Vec<_> = (0..5).map(|_| ask(&trims)).collect();
    for a in asked {
        a.await.unwrap();
    }
    assert_eq!(TRIMS.load(SeqCst), 2, "five asks made while one waits: one trim");
    assert!(
        started.elapsed() >= Duration::from_millis(990),
        "a second after the first"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = tokio::time::Instant::now();
    ask(&trims).await.unwrap();
    assert_eq!(TRIMS.load(SeqCst), 3);
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "none for a second: at once"
    );
}

/// Settings re-read while a registry is swapped in reach every caller and watcher over
/// the new registry, whichever swap comes first.
#[tokio::test]
async fn settings_read_while_a_registry_is_swapped_in_are_served_over_it_and_told() {
    let dir = tempfile::tempdir().unwrap();
    let state = demo_state(dir.path()).await;
    let (watcher, _) = state.watch();
    // An invalidation takes the view served and re-reads the table; a reload swaps a
    // registry in before the invalidation's view is swapped in.
    let taken = state.inner.view.load_full();
    configure_sonarr(&state).await;
    let snapshot = state.inner.settings.invalidate().await.unwrap();
    state.reload().await.unwrap();
    let reloaded = state.inner.view.load_full();
    assert!(!Arc::ptr_eq(&reloaded, &taken));

    state.settle(taken, snapshot.clone());
    let served = state.inner.view.load_full();
    assert!(
        Arc::ptr_eq(&served.settings, &snapshot),
        "the settings re-read are served"
    );
    assert!(
        Arc::ptr_eq(&served.registry, &reloaded.registry),
        "over the registry reloaded"
    );
    assert!(sonarr_active(&served));
    assert!(sonarr_active(&watcher.borrow()), "and watchers are told");
}

/// A registry change its caller gave up on while its write waited for another writer's
/// lock still ends as one: the domain is gone from the database and from the registry
/// served, or from neither.
#[tokio::test]
async fn a_domain_change_cut_at_its_callers_deadline_is_stored_and_served_alike() {
    use sqlx::{Connection as _, Executor as _};
    let dir = tempfile::tempdir().unwrap();
    let state = demo_state(dir.path()).await;
    state
        .upsert_domain(
            r#"{"name": "weather", "keywords": ["forecast"],
                "tools": [{"name": "get_forecast", "description": "The forecast"}]}"#,
        )
        .await
        .unwrap();
    // A settings UI holds the write lock for a while.
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let mut ui = sqlx::SqliteConnection::connect(&url).await.unwrap();
    ui.execute("BEGIN IMMEDIATE").await.unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(200), state.delete_domain("weather")).await;
    assert!(cut.is_err(), "the caller gave up while the write waited");
    ui.execute("COMMIT").await.unwrap();
    let stored = || async {
        state
            .inner
            .db
            .read_domains()
            .await
            .unwrap()
            .iter()
            .any(|(name, _)| name == "weather")
    };
    let served = || state.inner.view.load().registry.find("weather").is_some();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stored().await && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the change finish what it started, if it did.
    let _ = state.inner.sources.lock().await;
    assert_eq!(
        served(),
        stored().await,
        "the database and the registry served agree"
    );
    assert!(
        !served(),
        "the delete, once its write went through, went through whole"
    );
}

/// A settings swap that publishes after a reload swapped in and published a newer view
/// (the two run on different threads) leaves watchers at the newer view.
#[tokio::test]
async fn a_swap_that_publishes_late_does_not_tell_watchers_an_older_view() {
    let dir = tempfile::tempdir().unwrap();
    let state = demo_state(dir.path()).await;
    let (watcher, _) = state.watch();
    configure_sonarr(&state).await;
    let snapshot = state.inner.settings.invalidate().await.unwrap();
    // The settings swap, up to its publish: its view is served.
    let taken = state.inner.view.load_full();
    let settled = Arc::new(View::new(
        taken.parts(),
        snapshot,
        &state.inner.options,
        state.inner.profiles.clone(),
    ));
    state.inner.view.store(settled.clone());
    // A run-time domain swaps a new registry in over it, and publishes.
    state
        .upsert_domain(
            r#"{"name": "weather", "description": "Forecasts",
                "tools": [{"name": "get_forecast", "description": "The forecast"}]}"#,
        )
        .await
        .unwrap();
    let newest = state.inner.view.load_full().registry.version();
    assert_ne!(newest, settled.registry.version());
    // Then the settings swap publishes.
    state.publish();
    let seen = watcher.borrow().clone();
    assert_eq!(
        seen.registry.version(),
        newest,
        "watchers keep the newest registry"
    );
    assert!(sonarr_active(&seen));
}

/// A notice that another daemon changed the run-time domains serves them beside the
/// manifests as last loaded: a manifest broken on this machine meanwhile (mid-edit)
/// neither keeps the change out nor goes live without a reload.
#[tokio::test]
async fn another_daemons_domains_are_served_without_reading_the_manifests_again() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let config = Config {
        database: format!("sqlite://{}", dir.path().join("s.db").display()),
        manifests: vec![manifests.clone()],
        ..Config::default()
    };
    let state = State::new(Registry::demo(), &config).await.unwrap();
    let other = State::new(Registry::demo(), &config).await.unwrap();
    std::fs::write(manifests.join("mid_edit.json"), "{").unwrap();
    other
        .upsert_domain(
            r#"{"name": "weather", "description": "Forecasts", "keywords": ["forecast"],
                "tools": [{"name": "get_forecast", "description": "The forecast",
                           "input_schema": {"type": "object"}}]}"#,
        )
        .await
        .unwrap();
    let demo = state.view().await.registry.domains().len();
    assert_eq!(state.take_runtime_domains(None).await, None);
    let registry = state.view().await.registry.clone();
    assert!(
        registry.find("weather").is_some(),
        "the other daemon's domain is served"
    );
    assert_eq!(
        registry.domains().len(),
        demo + 1,
        "and the manifests as last loaded"
    );
    // Read under the registry lock, an unchanged store changes nothing.
    let version = registry.version();
    assert_eq!(state.take_runtime_domains(None).await, None);
    assert_eq!(state.view().await.registry.version(), version);
}
