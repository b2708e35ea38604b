//! Every statement of both backends, through the one interface. Each test body runs on a
//! SQLite file and, when `TOOLROUTER_TEST_POSTGRES_URL` names a server, on a fresh
//! PostgreSQL database (the API tests print the one line saying how to run those).

use std::sync::Arc;
use std::time::Duration;

use super::*;

/// A database of the backend, and what keeps it alive (a SQLite file's folder).
struct Fixture {
    db: Db,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite_fixture() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    Some(Fixture {
        db: Db::connect(&url).await.unwrap(),
        url,
        _dir: Some(dir),
    })
}

async fn postgres_fixture() -> Option<Fixture> {
    let admin = testing::postgres_url()?;
    let url = testing::fresh_postgres_database(&admin).await;
    Some(Fixture {
        db: Db::connect(&url).await.unwrap(),
        url,
        _dir: None,
    })
}

/// Declares each test body (an `async fn(Fixture)`) once per backend: `sqlite::name` and
/// `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                let fixture = super::sqlite_fixture().await.unwrap();
                super::$name(fixture).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                if let Some(fixture) = super::postgres_fixture().await {
                    super::$name(fixture).await;
                }
            })*
        }
    };
}

on_both_backends!(
    settings_can_be_set_replaced_read_and_unset,
    members_are_saved_in_join_order_and_flags_only_turn_on,
    conversations_are_deleted_one_by_one_or_when_idle,
    clocks_are_written_in_batches_and_never_move_back,
    an_idle_conversation_is_forgotten_only_while_no_later_use_is_recorded,
    a_stamp_tells_a_current_copy_from_a_stale_one,
    a_write_happens_only_on_top_of_the_version_its_writer_read,
    domains_are_stored_replaced_read_by_name_and_deleted,
    settings_are_read_from_a_url_without_changing_the_database,
);

/// `eval`'s read: the rows of a database with a settings table; one without is refused and
/// stays without (no migration runs).
async fn settings_are_read_from_a_url_without_changing_the_database(f: Fixture) {
    f.db.set_setting("k", "v").await.unwrap();
    assert_eq!(
        read_settings_only(&f.url).await.unwrap(),
        [("k".to_string(), "v".to_string())]
    );
    let bare = match testing::postgres_url() {
        Some(admin) if f._dir.is_none() => testing::fresh_postgres_database(&admin).await,
        _ => {
            let dir = f._dir.as_ref().unwrap().path();
            let path = dir.join("bare.db");
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            sqlx::SqlitePool::connect_with(options)
                .await
                .unwrap()
                .close()
                .await;
            format!("sqlite://{}", path.display())
        }
    };
    let gone = format!(
        "sqlite://{}",
        std::env::temp_dir().join("no-such-folder-x/t.db").display()
    );
    let err = read_settings_only(&gone).await.unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("cannot read the settings of {gone}: ")),
        "{err}"
    );
    for _ in 0..2 {
        let err = read_settings_only(&bare).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains("has no settings table"), "{err}");
    }
}

/// The version `id` is stored at, as a writer that just read it expects.
async fn version(db: &Session, id: &str) -> Option<i64> {
    db.conversation_stamp(id).await.unwrap().map(|s| s.version)
}

fn member(domain: &str, loaded: bool, hit: bool) -> Member {
    Member {
        domain: domain.into(),
        loaded,
        hit,
    }
}

async fn settings_can_be_set_replaced_read_and_unset(f: Fixture) {
    let db = f.db.session().await.unwrap();
    db.set_setting("a", "1").await.unwrap();
    db.set_setting("a", "2").await.unwrap();
    db.set_setting("b", "x").await.unwrap();
    let mut rows = db.read_settings().await.unwrap();
    rows.sort();
    assert_eq!(rows, vec![("a".into(), "2".into()), ("b".into(), "x".into())]);
    assert!(db.unset_setting("a").await.unwrap());
    assert!(!db.unset_setting("a").await.unwrap());
    assert_eq!(db.read_settings().await.unwrap().len(), 1);
}

async fn members_are_saved_in_join_order_and_flags_only_turn_on(f: Fixture) {
    let db = f.db.session().await.unwrap();
    assert_eq!(db.load_conversation("c").await.unwrap(), None);
    db.save_members(
        "c",
        10,
        &[(0, member("b", true, false)), (1, member("a", false, true))],
        None,
    )
    .await
    .unwrap();
    db.save_members("c", 5, &[(0, member("b", false, true))], version(&db, "c").await)
        .await
        .unwrap();
    let stored = db.load_conversation("c").await.unwrap().unwrap();
    assert_eq!(stored.last_seen, 10, "last_seen never moves back");
    assert_eq!(
        stored.members,
        vec![member("b", true, true), member("a", false, true)]
    );
    db.touch_conversations(&[("c", 20)]).await.unwrap();
    assert_eq!(db.load_conversation("c").await.unwrap().unwrap().last_seen, 20);
    db.touch_conversations(&[("c", 15)]).await.unwrap();
    assert_eq!(db.load_conversation("c").await.unwrap().unwrap().last_seen, 20);
}

async fn clocks_are_written_in_batches_and_never_move_back(f: Fixture) {
    let db = f.db.session().await.unwrap();
    let ids: Vec<String> = (0..TOUCH_BATCH * 2 + 7).map(|i| format!("c{i}")).collect();
    for id in &ids {
        db.save_members(id, 100, &[(0, member("a", true, false))], None)
            .await
            .unwrap();
    }
    // Every id once at 200, the first one again at 300 and at 150 (its latest counts), a
    // later one back at 50 (no move back), and an id no row has.
    let mut clocks: Vec<(&str, i64)> = ids.iter().map(|id| (id.as_str(), 200)).collect();
    clocks.extend([
        (ids[0].as_str(), 300),
        (ids[0].as_str(), 150),
        (ids[9].as_str(), 50),
        ("none", 400),
    ]);
    db.touch_conversations(&clocks).await.unwrap();
    let seen = async |id: &str| db.conversation_stamp(id).await.unwrap().map(|s| s.last_seen);
    assert_eq!(seen(&ids[0]).await, Some(300));
    assert_eq!(seen(&ids[9]).await, Some(200));
    assert_eq!(
        seen(ids.last().unwrap()).await,
        Some(200),
        "past the first batches"
    );
    assert_eq!(seen("none").await, None, "a clock makes no row");
    assert_eq!(
        db.delete_idle_conversations(250).await.unwrap(),
        ids.len() as u64 - 1
    );
    assert_eq!(seen(&ids[0]).await, Some(300));
    db.touch_conversations(&[]).await.unwrap();
}

async fn conversations_are_deleted_one_by_one_or_when_idle(f: Fixture) {
    let db = f.db.session().await.unwrap();
    for (id, seen) in [("old", 1), ("new", 100), ("gone", 100)] {
        db.save_members(id, seen, &[(0, member("a", true, false))], None)
            .await
            .unwrap();
    }
    db.delete_conversation("gone").await.unwrap();
    assert_eq!(db.load_conversation("gone").await.unwrap(), None);
    assert_eq!(db.delete_idle_conversations(50).await.unwrap(), 1);
    assert_eq!(db.load_conversation("old").await.unwrap(), None);
    assert!(db.load_conversation("new").await.unwrap().is_some());
    // Re-created after a delete, a conversation starts empty.
    db.save_members("gone", 100, &[(0, member("b", false, true))], None)
        .await
        .unwrap();
    let members = db.load_conversation("gone").await.unwrap().unwrap().members;
    assert_eq!(members, vec![member("b", false, true)]);
}

async fn an_idle_conversation_is_forgotten_only_while_no_later_use_is_recorded(f: Fixture) {
    let db = f.db.session().await.unwrap();
    db.save_members("c", 10, &[(0, member("a", true, false))], None)
        .await
        .unwrap();
    // Another daemon recorded a use at 30: idle since before 20 no longer holds.
    db.touch_conversations(&[("c", 30)]).await.unwrap();
    assert!(!db.forget_idle_conversation("c", 20).await.unwrap());
    assert!(db.load_conversation("c").await.unwrap().is_some());
    assert!(db.forget_idle_conversation("c", 31).await.unwrap());
    assert_eq!(db.load_conversation("c").await.unwrap(), None);
    assert_eq!(db.conversation_stamp("c").await.unwrap(), None);
    assert!(!db.forget_idle_conversation("never", 31).await.unwrap());
}

async fn a_stamp_tells_a_current_copy_from_a_stale_one(f: Fixture) {
    let db = f.db.session().await.unwrap();
    assert_eq!(db.conversation_stamp("c").await.unwrap(), None);
    let first = db
        .save_members("c", 10, &[(0, member("a", true, false))], None)
        .await
        .unwrap();
    let stored = db.load_conversation("c").await.unwrap().unwrap();
    let stamp = db.conversation_stamp("c").await.unwrap().unwrap();
    assert_eq!(stamp.version, stored.version);
    assert_eq!(stamp.last_seen, 10);
    db.touch_conversations(&[("c", 40)]).await.unwrap();
    let touched = db.conversation_stamp("c").await.unwrap().unwrap();
    assert_eq!(touched.last_seen, 40);
    assert_eq!(touched.version, stamp.version, "a use alone keeps the version");
    let second = db
        .save_members("c", 50, &[(1, member("b", false, true))], Some(stamp.version))
        .await
        .unwrap();
    match (first, second) {
        // SQLite: one daemon per file, no versions.
        (Saved::Done(None), Saved::Done(None)) => assert!(!f.db.shared()),
        (Saved::Done(Some(first)), Saved::Done(Some(second))) => {
            assert!(f.db.shared());
            assert_eq!(first, stored.version);
            assert_ne!(second, first);
            let now = db.conversation_stamp("c").await.unwrap().unwrap();
            assert_eq!(now.version, second);
            // A delete and a new write never bring an old version back.
            db.delete_conversation("c").await.unwrap();
            let again = db
                .save_members("c", 60, &[(0, member("a", true, false))], None)
                .await
                .unwrap();
            let Saved::Done(Some(again)) = again else {
                panic!("{again:?}")
            };
            assert!(again != first && again != second);
        }
        other => panic!("versions on one write and not the other: {other:?}"),
    }
}

async fn a_write_happens_only_on_top_of_the_version_its_writer_read(f: Fixture) {
    let db = f.db.session().await.unwrap();
    let a = [(0, member("a", true, false))];
    let b = [(1, member("b", false, true))];
    db.save_members("c", 10, &a, None).await.unwrap();
    let read = version(&db, "c").await;
    let stored = db.load_conversation("c").await.unwrap();
    // Another daemon writes (or forgets the conversation) after `read`.
    let other = [(1, member("z", true, false))];
    db.save_members("c", 20, &other, read).await.unwrap();
    let moved = db.load_conversation("c").await.unwrap();
    let (stale, gone, taken) = (
        db.save_members("c", 30, &b, read).await.unwrap(),
        async {
            db.delete_conversation("g").await.unwrap();
            db.save_members("g", 10, &a, None).await.unwrap();
            let read = version(&db, "g").await;
            db.delete_conversation("g").await.unwrap();
            db.save_members("g", 30, &b, read).await.unwrap()
        }
        .await,
        db.save_members("c", 30, &b, None).await.unwrap(),
    );
    if !f.db.shared() {
        // SQLite: one daemon per file, whose calls on a conversation take turns.
        assert_eq!([stale, gone, taken], [Saved::Done(None); 3]);
        return;
    }
    assert_ne!(stored, moved, "the other write went through");
    assert_eq!(stale, Saved::Stale, "a version another daemon replaced");
    assert_eq!(gone, Saved::Stale, "a conversation another daemon forgot");
    assert_eq!(taken, Saved::Stale, "a conversation another daemon created");
    assert_eq!(db.load_conversation("c").await.unwrap(), moved, "nothing written");
    assert_eq!(db.load_conversation("g").await.unwrap(), None, "nothing written");
    // On top of the version now stored, the write goes through.
    let now = version(&db, "c").await;
    assert!(matches!(
        db.save_members("c", 30, &b, now).await.unwrap(),
        Saved::Done(Some(_))
    ));
    let members = db.load_conversation("c").await.unwrap().unwrap().members;
    assert_eq!(
        members,
        vec![
            member("a", true, false),
            member("z", true, false),
            member("b", false, true)
        ]
    );
}

async fn domains_are_stored_replaced_read_by_name_and_deleted(f: Fixture) {
    let db = f.db.session().await.unwrap();
    assert!(db.read_domains().await.unwrap().is_empty());
    let fits = |_: Vec<(String, String)>| Ok(());
    assert!(
        db.upsert_domain("b", "{\"name\":\"b\"}", 1, fits).await.unwrap(),
        "new"
    );
    // What the check is shown is every other stored domain; its refusal writes nothing.
    let shown = std::sync::Mutex::new(Vec::new());
    let refused = db
        .upsert_domain("a", "{\"name\":\"a\"}", 2, |others| {
            *shown.lock().unwrap() = others;
            Err(crate::Error::Internal("no".into()))
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        crate::Error::Internal("no".into()).to_string()
    );
    assert_eq!(
        *shown.lock().unwrap(),
        vec![("b".to_string(), "{\"name\":\"b\"}".to_string())]
    );
    assert_eq!(db.read_domains().await.unwrap().len(), 1, "nothing written");
    assert!(
        db.upsert_domain("a", "{\"name\":\"a\"}", 2, fits).await.unwrap(),
        "new"
    );
    assert!(
        !db.upsert_domain("b", "{\"name\":\"b\",\"core\":true}", 3, fits)
            .await
            .unwrap(),
        "replaced"
    );
    assert_eq!(
        db.read_domains().await.unwrap(),
        vec![
            ("a".into(), "{\"name\":\"a\"}".into()),
            ("b".into(), "{\"name\":\"b\",\"core\":true}".into())
        ]
    );
    assert!(db.delete_domain("a", fits).await.unwrap());
    assert!(!db.delete_domain("a", fits).await.unwrap(), "already gone");
    assert_eq!(db.read_domains().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_missing_file_is_unavailable_and_counted_once_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let db = Db::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let before = DATABASE_ERRORS.get();
    let err = db.read_settings().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("cannot be opened"), "{err}");
    // Other tests in this process may count too, so only a lower bound holds.
    assert!(DATABASE_ERRORS.get() > before);
}

/// SQLite keeps whatever a settings UI binds: a number or bytes is still a value, and one
/// such row neither fails the read nor hides the other rows.
#[tokio::test]
async fn a_setting_stored_as_bytes_or_a_number_is_read_as_text() {
    let f = sqlite_fixture().await.unwrap();
    f.db.set_setting("plain", "text").await.unwrap();
    let ui = sqlx::SqlitePool::connect(&f.url).await.unwrap();
    let insert = "INSERT INTO settings VALUES (?1, ?2)";
    for (key, bytes) in [("bytes", &b"hello"[..]), ("invalid_utf8", &b"\xffa"[..])] {
        sqlx::query(insert)
            .bind(key)
            .bind(bytes)
            .execute(&ui)
            .await
            .unwrap();
    }
    sqlx::query(insert)
        .bind("number")
        .bind(8080_i64)
        .execute(&ui)
        .await
        .unwrap();
    let types: Vec<(String,)> = sqlx::query_as("SELECT typeof(value) FROM settings ORDER BY key")
        .fetch_all(&ui)
        .await
        .unwrap();
    assert_eq!(
        types.into_iter().map(|(t,)| t).collect::<Vec<_>>(),
        ["blob", "blob", "text", "text"],
        "stored as bound (a number takes the column's TEXT affinity)"
    );
    ui.close().await;
    let mut rows = f.db.read_settings().await.unwrap();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("bytes", "hello"),
            ("invalid_utf8", "\u{fffd}a"),
            ("number", "8080"),
            ("plain", "text"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    // A key stored as bytes is the setting of that name: set replaces it, unset removes it.
    let ui = sqlx::SqlitePool::connect(&f.url).await.unwrap();
    for key in [&b"blob_key"[..], b"blob_gone"] {
        sqlx::query(insert)
            .bind(key)
            .bind("old")
            .execute(&ui)
            .await
            .unwrap();
    }
    ui.close().await;
    f.db.set_setting("blob_key", "new").await.unwrap();
    assert!(f.db.unset_setting("blob_gone").await.unwrap());
    let rows = f.db.read_settings().await.unwrap();
    let blob: Vec<_> = rows.iter().filter(|(k, _)| k.starts_with("blob")).collect();
    assert_eq!(blob, [&("blob_key".to_string(), "new".to_string())], "{rows:?}");
}

/// A full disk makes SQLite refuse a COMMIT and end the transaction itself, and sqlx's count
/// of open transactions on that connection then stays one too high: pooled again, the
/// connection ran every later write inside a transaction that never committed (loads
/// acknowledged, then lost) and held the write lock. Such a connection is closed instead.
/// (Checked by hand on a full 3 MB tmpfs: RELIABILITY.md.)
#[tokio::test]
async fn a_connection_whose_transaction_failed_is_not_pooled_again() {
    let dir = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("t.db"))
        .create_if_missing(true);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let cache_size = async |pool: &sqlx::SqlitePool| -> i64 {
        let (size,): (i64,) = sqlx::query_as("PRAGMA cache_size").fetch_one(pool).await.unwrap();
        size
    };
    let default = cache_size(&pool).await;
    // A setting of the connection, not of the transaction, marks it.
    sqlx::query("PRAGMA cache_size = -1234")
        .execute(&pool)
        .await
        .unwrap();
    // The transaction ends under sqlx's feet, as a refused COMMIT ends it: COMMIT fails.
    let failed = super::sqlite::in_transaction(&pool, async |c| {
        sqlx::query("ROLLBACK").execute(&mut *c).await.map(drop)
    })
    .await;
    assert!(failed.is_err());
    assert_eq!(cache_size(&pool).await, default, "a fresh connection");
    // And transactions work on.
    super::sqlite::in_transaction(&pool, async |c| {
        sqlx::query("CREATE TABLE t (x)").execute(&mut *c).await.map(drop)
    })
    .await
    .unwrap();
    let reader = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("t.db").display()))
        .await
        .unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM sqlite_master WHERE name = 't'")
        .fetch_one(&reader)
        .await
        .unwrap();
    assert_eq!(n, 1, "committed");
}

/// `tests/fixtures/before-postgres.db` was written by the daemon before the migrations moved
/// to `migrations/sqlite/` (main at 769962f: a setting, and a conversation with a loaded
/// group). sqlx refuses a database whose recorded migrations do not match the embedded
/// ones, so opening it proves versions and checksums are unchanged.
#[tokio::test]
async fn a_database_written_before_the_migrations_moved_opens_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/before-postgres.db"),
        &path,
    )
    .unwrap();
    let db = Db::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert_eq!(
        db.read_settings().await.unwrap(),
        vec![("sonarr_url".to_string(), "http://nas:8989".to_string())]
    );
    let stored = db.load_conversation("c1").await.unwrap().unwrap();
    assert_eq!(stored.members, vec![member("sonarr", true, false)]);
    db.close().await;
}

/// A path SQLite could only call "unable to open database file" says why.
#[tokio::test]
async fn a_database_path_that_is_a_directory_or_has_no_folder_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-folder");
    for (path, why) in [
        (dir.path().to_path_buf(), "it is a directory".to_string()),
        (
            missing.join("t.db"),
            format!("its folder {} does not exist", missing.display()),
        ),
    ] {
        let e = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Unavailable(m) if *m == format!("cannot open the database file {}: {why}", path.display())),
            "{e:?}"
        );
    }
}

/// A database a newer daemon migrated further is refused, saying so.
#[tokio::test]
async fn a_database_from_a_newer_daemon_is_refused_naming_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    let url = format!("sqlite://{}", path.display());
    Db::connect(&url).await.unwrap().close().await;
    let newer = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'later', 1, x'00', 0)",
    )
    .execute(&newer)
    .await
    .unwrap();
    newer.close().await;
    let e = Db::connect(&url).await.unwrap_err().to_string();
    assert!(
        e.contains(&format!("cannot open the database file {}", path.display()))
            && e.contains(
                "the database holds migration 9999, which this build does not have: a newer toolrouter wrote it"
            ),
        "{e}"
    );
}

#[test]
fn credentials_are_removed_from_database_urls() {
    for (url, shown) in [
        ("sqlite://toolrouter.db", "sqlite://toolrouter.db"),
        (
            "sqlite:///var/lib/t.db?mode=rwc",
            "sqlite:///var/lib/t.db?mode=rwc",
        ),
        ("postgres://u:s3cret@db:5432/tr", "postgres://db:5432/tr"),
        ("postgresql://u@db/tr", "postgresql://db/tr"),
        (
            "postgres://db/tr?sslmode=require&password=s3cret&application_name=x",
            "postgres://db/tr?sslmode=require&application_name=x",
        ),
        ("postgres://db/tr?PASSWORD=s3cret", "postgres://db/tr"),
        (
            "postgres://db/tr?user=alice&sslmode=require",
            "postgres://db/tr?sslmode=require",
        ),
        ("postgres://u:p@w@db/tr?sslpassword=k", "postgres://db/tr"),
        ("postgres://u:s3cret@db", "postgres://db"),
        // Passwords a URL parser would refuse are still not shown.
        ("postgres://tr:pa/ss@db:5432/tr", "postgres://db:5432/tr"),
        ("postgres://tr:pa?ss@db/tr", "postgres://db/tr"),
        (
            "postgresql://tr:a/b?c@d@db/tr?sslmode=disable",
            "postgresql://db/tr?sslmode=disable",
        ),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}

#[test]
fn postgres_urls_name_the_same_database_whatever_their_credentials_and_parameters() {
    let same = [
        "postgres://u:p@db:5432/tr",
        "postgres://db/tr",
        "postgresql://other@DB:5432/tr?sslmode=disable&application_name=x",
        "postgres://u:pa/ss@db/tr",
    ];
    for url in same {
        assert_eq!(postgres_database(url), "postgres://db:5432/tr", "{url}");
    }
    for other in ["postgres://db:5433/tr", "postgres://db/tr2", "postgres://db2/tr"] {
        assert_ne!(postgres_database(other), "postgres://db:5432/tr", "{other}");
    }
    assert_eq!(
        postgres_database("postgres://[::1]/tr"),
        "postgres://[::1]:5432/tr"
    );
    assert_eq!(
        postgres_database("postgres://[::1]:6000/tr"),
        "postgres://[::1]:6000/tr"
    );
}

#[test]
fn the_backend_is_chosen_by_the_scheme() {
    assert!(is_postgres("postgres://db/tr"));
    assert!(is_postgres("PostgreSQL://db/tr"));
    assert!(!is_postgres("sqlite://postgres.db"));
    assert!(!is_postgres("toolrouter.db"));
    assert_eq!(database_file("postgres://db/tr").unwrap(), None);
    assert!(database_file("sqlite://t.db").unwrap().unwrap().is_absolute());
    assert_eq!(
        testing::with_database("postgres://u@h:1/postgres?sslmode=disable", "t1"),
        "postgres://u@h:1/t1?sslmode=disable"
    );
    assert_eq!(
        testing::with_database("postgres://u@h:1", "t1"),
        "postgres://u@h:1/t1"
    );
}

/// Waits for the next notice, at most `limit`.
async fn next_notice(rx: &mut mpsc::Receiver<Notice>, limit: Duration) -> Option<Notice> {
    tokio::time::timeout(limit, rx.recv()).await.ok().flatten()
}

/// A TCP proxy that can stop forwarding on the connections open so far while keeping them
/// open, as a NAT or a firewall that forgot a flow does (no reset, no error: silence).
struct ForgetfulProxy {
    addr: std::net::SocketAddr,
    /// Connections numbered below this forward nothing more.
    forgotten_below: Arc<std::sync::atomic::AtomicUsize>,
    opened: Arc<std::sync::atomic::AtomicUsize>,
}

impl ForgetfulProxy {
    async fn start(upstream: String) -> ForgetfulProxy {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forgotten_below = Arc::new(AtomicUsize::new(0));
        let opened = Arc::new(AtomicUsize::new(0));
        let (forgotten, count) = (forgotten_below.clone(), opened.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = count.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [(cr, sw), (sr, cw)].map(|(r, w)| (tokio::io::BufReader::new(r), w))
                {
                    let forgotten = forgotten.clone();
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if id >= forgotten.load(Ordering::SeqCst)
                                && to.write_all(&buf[..n]).await.is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            }
        });
        ForgetfulProxy {
            addr,
            forgotten_below,
            opened,
        }
    }

    /// Forgets every connection open now.
    fn forget(&self) {
        use std::sync::atomic::Ordering;
        self.forgotten_below
            .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_listening_connection_the_network_forgot_is_found_out_and_made_again() {
    let Some(f) = postgres_fixture().await else {
        return;
    };
    let options = crate::db::postgres::connect_options(&f.url).unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = ForgetfulProxy::start(upstream.clone()).await;
    let url = f.url.replacen(&upstream, &proxy.addr.to_string(), 1);
    assert_ne!(url, f.url);
    // A short busy timeout: the connection is asked to answer after a second of silence.
    let db = Db::connect_with(&url, Duration::from_millis(200)).await.unwrap();
    let mut notices = db.notices(Topic::Settings).expect("PostgreSQL listens");
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Resumed)
    );
    proxy.forget();
    f.db.announce_settings().await.unwrap();
    // The announcement is lost with the flow; the silence is noticed, the connection made
    // again (through the proxy, a new flow), and the re-read it asks for covers what was lost.
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Resumed),
        "the forgotten connection is found out and made again"
    );
    f.db.announce_settings().await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed),
        "and heard on"
    );
    db.close().await;
}

#[tokio::test]
async fn a_settings_write_by_anyone_is_heard_and_an_own_announcement_is_not() {
    let Some(f) = postgres_fixture().await else {
        return;
    };
    let mut notices = f.db.notices(Topic::Settings).expect("PostgreSQL listens");
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Resumed),
        "listening starts with one re-read"
    );
    // A settings UI on its own connection.
    let ui = Db::connect(&f.url).await.unwrap();
    ui.set_setting("k", "v").await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    ui.unset_setting("k").await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    // This daemon's announcement is for the others; theirs is for this one.
    f.db.announce_settings().await.unwrap();
    ui.announce_settings().await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    assert_eq!(
        next_notice(&mut notices, Duration::from_millis(300)).await,
        None,
        "one notice for the two announcements"
    );
    assert!(
        Db::connect(&f.url)
            .await
            .unwrap()
            .notices(Topic::Settings)
            .is_some()
    );
    assert!(
        sqlite_fixture()
            .await
            .unwrap()
            .db
            .notices(Topic::Settings)
            .is_none()
    );
    ui.close().await;
    f.db.close().await;
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        None,
        "closing the database ends the listening"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_is_unavailable_instead_of_a_hang() {
    // A listening socket that never answers: connecting succeeds, the handshake never does.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("postgres://u@{}/db", silent.local_addr().unwrap());
    let connect = Db::connect_with(&url, Duration::from_millis(300));
    // The bound only tells a hang from an answer; the busy timeout is 300 ms.
    let err = tokio::time::timeout(Duration::from_secs(60), connect)
        .await
        .expect("an answer, not a hang")
        .unwrap_err();
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
}

#[test]
fn a_url_parameter_sqlx_does_not_take_is_left_out_without_printing_its_value() {
    let (logs, _default) = crate::settings::tests::Captured::on_this_thread();
    let options = crate::db::postgres::connect_options(
        "postgres://u@db.example:6000/tr?sslpassword=s3cret&sslmode=disable&application_name=x",
    )
    .unwrap();
    assert_eq!(
        (options.get_host(), options.get_port(), options.get_database()),
        ("db.example", 6000, Some("tr"))
    );
    assert!(matches!(
        options.get_ssl_mode(),
        sqlx::postgres::PgSslMode::Disable
    ));
    let text = logs.text();
    assert!(text.contains("sslpassword"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    // Nothing unknown: the URL as it is, nothing logged.
    let (logs, _default) = crate::settings::tests::Captured::on_this_thread();
    crate::db::postgres::connect_options("postgres://u:pw@h/db?sslmode=require").unwrap();
    assert_eq!(logs.text(), "");
}

#[tokio::test]
async fn a_call_waits_for_an_unreachable_server_once_not_once_per_statement() {
    // A call's first statement waits out the busy timeout against a server that never
    // answers; its next ones (a conversation read, then its write) fail at once, so the
    // call answers UNAVAILABLE within the request timeout instead of running into it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("postgres://u@{}/db", silent.local_addr().unwrap());
    let busy = Duration::from_millis(400);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(busy)
        .connect_lazy(&url)
        .unwrap();
    let session = Session {
        pool: Pool::Postgres(pool),
        bound: busy * 2,
        reach: Arc::default(),
        admitted: std::time::Instant::now(),
    };
    let started = std::time::Instant::now();
    let first = session.load_conversation("c").await.unwrap_err();
    assert!(started.elapsed() >= busy, "the first statement tries the server");
    assert_eq!(tonic::Status::from(first).code(), tonic::Code::Unavailable);
    let then = std::time::Instant::now();
    let second = session
        .save_members("c", 1, &[(0, member("d", true, false))], None)
        .await
        .unwrap_err();
    assert!(
        then.elapsed() < busy / 2,
        "the next fails at once: {:?}",
        then.elapsed()
    );
    assert!(second.to_string().contains("cannot be reached"), "{second}");
}

#[tokio::test]
async fn a_backup_moved_over_the_file_in_use_is_reopened_intact() {
    // The daemon's connections hold the write-ahead log of the file it opened; a backup
    // moved into place must not be handed that log.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let url = format!("sqlite://{}", path.display());
    let db = Db::connect(&url).await.unwrap();
    db.set_setting("k", "before").await.unwrap();
    let backup = dir.path().join("backup.db");
    let s = db.session().await.unwrap();
    let Pool::Sqlite(pool) = &s.pool else {
        unreachable!()
    };
    sqlx::query("VACUUM INTO ?1")
        .bind(backup.to_str().unwrap())
        .execute(pool)
        .await
        .unwrap();
    for i in 0..300 {
        s.save_members(&format!("c{i}"), i, &[(0, member("d", true, false))], None)
            .await
            .unwrap();
    }
    std::fs::rename(&backup, &path).unwrap();
    // The next call finds the file replaced, and works on the backup.
    let s = db.session().await.unwrap();
    assert_eq!(
        s.load_conversation("c1").await.unwrap(),
        None,
        "the backup's state"
    );
    s.save_members("after", 1, &[(0, member("d", true, false))], None)
        .await
        .unwrap();
    assert_eq!(
        db.read_settings().await.unwrap(),
        [("k".to_string(), "before".to_string())]
    );
    db.close().await;
    let check = Db::connect(&url).await.unwrap();
    let s = check.session().await.unwrap();
    let Pool::Sqlite(pool) = &s.pool else {
        unreachable!()
    };
    let (integrity,): (String,) = sqlx::query_as("PRAGMA integrity_check")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(integrity, "ok");
    assert!(s.load_conversation("after").await.unwrap().is_some());
    assert_eq!(s.load_conversation("c1").await.unwrap(), None);
    check.close().await;
}

#[cfg(unix)]
#[tokio::test]
async fn a_file_restored_over_the_claimed_one_is_claimed_before_it_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let url = format!("sqlite://{}", path.display());
    let db = Db::connect(&url).await.unwrap();
    db.claim().unwrap();
    db.set_setting("k", "v").await.unwrap();
    let restore = |name: &str| {
        let backup = dir.path().join(name);
        std::fs::copy(&path, &backup).unwrap();
        std::fs::rename(&backup, &path).unwrap();
    };
    let refused = |e: Error, why: &str| {
        assert!(matches!(&e, Error::Unavailable(m) if m.contains(why)), "{e:?}");
    };
    // Restored while this daemon runs: it claims the new file as it reopens it, so a second
    // daemon cannot start on it.
    restore("one.db");
    db.session().await.unwrap();
    let second = Db::connect(&url).await.unwrap();
    refused(
        second.claim().unwrap_err(),
        "another toolrouter daemon is serving the database file",
    );
    second.close().await;
    // Restored, and another daemon claims it first: this one does not use it while it is
    // held, and takes it once it is free.
    restore("two.db");
    let other = Db::connect(&url).await.unwrap();
    other.claim().unwrap();
    for _ in 0..2 {
        refused(
            db.session().await.err().unwrap(),
            "the database file was replaced and cannot be reopened: another toolrouter daemon",
        );
    }
    other.close().await;
    drop(other);
    db.set_setting("after", "w").await.unwrap();
    assert!(
        db.read_settings()
            .await
            .unwrap()
            .contains(&("after".to_string(), "w".to_string())),
        "the restored file is used"
    );
    let third = Db::connect(&url).await.unwrap();
    refused(
        third.claim().unwrap_err(),
        "another toolrouter daemon is serving the database file",
    );
    third.close().await;
    db.close().await;
}

#[tokio::test]
async fn a_server_that_refuses_connections_is_named_with_why() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let url = format!("postgres://u:s3cret@{addr}/db");
    let err = Db::connect_with(&url, Duration::from_millis(300))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("postgres://{addr}/db")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn a_domain_change_by_any_daemon_is_heard_its_own_included() {
    let Some(f) = postgres_fixture().await else {
        return;
    };
    let mut notices = f.db.notices(Topic::Domains).expect("PostgreSQL listens");
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Resumed)
    );
    let other = Db::connect(&f.url).await.unwrap();
    other.upsert_domain("a", "{}", 1).await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    // Its own write is heard too: a write it cut past its bound may still commit, and the
    // notice is what tells it so.
    f.db.upsert_domain("b", "{}", 2).await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    other.delete_domain("b").await.unwrap();
    assert_eq!(
        next_notice(&mut notices, Duration::from_secs(10)).await,
        Some(Notice::Changed)
    );
    other.close().await;
}

/// The spans of the statements never carry a conversation id (SPEC §11: a short hash of it,
/// never the id, is all a log line may hold), so an event inside one, like sqlx's warning
/// about a slow statement, cannot log it.
#[test]
fn statement_spans_do_not_record_conversation_ids() {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Every span opened, with its fields.
    struct Spans(Arc<Mutex<Vec<String>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut shown = attrs.metadata().name().to_string();
            attrs.record(
                &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                    shown.push_str(&format!(" {}={value:?}", field.name()));
                },
            );
            self.0.lock().unwrap().push(shown);
        }
    }
    let spans = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Spans(spans.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let f = sqlite_fixture().await.unwrap();
            let id = "alice@example.com";
            let s = f.db.session().await.unwrap();
            s.save_members(id, 1, &[(0, member("d", true, false))], None)
                .await
                .unwrap();
            s.load_conversation(id).await.unwrap().unwrap();
            s.conversation_stamp(id).await.unwrap();
            s.touch_conversations(&[(id, 2)]).await.unwrap();
            s.forget_idle_conversation(id, 0).await.unwrap();
            s.delete_conversation(id).await.unwrap();
        });
    });
    let spans = spans.lock().unwrap();
    for name in [
        "save_members",
        "load_conversation",
        "conversation_stamp",
        "touch_conversations",
        "forget_idle_conversation",
        "delete_conversation",
    ] {
        assert!(spans.iter().any(|s| s.starts_with(name)), "{name}: {spans:?}");
    }
    assert!(!spans.iter().any(|s| s.contains("alice")), "{spans:?}");
}

#[tokio::test]
async fn reading_settings_from_a_server_that_refuses_says_why() {
    // A port that refuses: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://u:pw@127.0.0.1:{port}/db");
    let e = crate::db::postgres::stored_only(&url, Duration::from_millis(300))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "cannot connect to the database server at postgres://127.0.0.1:{port}/db"
        )) && e.contains("refused")
            && !e.contains("pw"),
        "{e}"
    );
}

/// Two replicas flushing clocks of the same conversations at once, in opposite orders, while
/// a third deletes the idle ones: each waits for the others, none deadlocks (PostgreSQL
/// aborts one of a deadlocked pair, which would fail its upkeep).
#[tokio::test]
async fn replicas_flushing_and_deleting_the_same_conversations_at_once_do_not_deadlock() {
    let Some(f) = postgres_fixture().await else {
        return;
    };
    let replicas = [
        Db::connect(&f.url).await.unwrap(),
        Db::connect(&f.url).await.unwrap(),
        Db::connect(&f.url).await.unwrap(),
    ];
    let ids: Vec<String> = (0..TOUCH_BATCH).map(|i| format!("c{i:04}")).collect();
    for round in 0..20_i64 {
        let s = f.db.session().await.unwrap();
        for id in &ids {
            s.save_members(
                id,
                round * 10,
                &[(0, member("a", true, false))],
                version(&s, id).await,
            )
            .await
            .unwrap();
        }
        let forward: Vec<(&str, i64)> = ids.iter().map(|id| (id.as_str(), round * 10 + 5)).collect();
        let backward: Vec<(&str, i64)> = forward.iter().rev().copied().collect();
        let (a, b, c) = tokio::join!(
            async { replicas[0].session().await?.touch_conversations(&forward).await },
            async { replicas[1].session().await?.touch_conversations(&backward).await },
            async {
                replicas[2]
                    .session()
                    .await?
                    .delete_idle_conversations(round * 10 + 1)
                    .await
            },
        );
        a.unwrap();
        b.unwrap();
        c.unwrap();
    }
}

/// TLS to PostgreSQL as the URL asks (libpq's `sslmode`): `require` encrypts, `verify-full`
/// with the CA that signed the server's certificate (`sslrootcert`) also verifies it, and
/// `verify-full` without that CA is refused at start, naming the certificate.
#[tokio::test]
async fn postgres_connections_use_tls_as_the_url_asks() {
    let Some(admin) = testing::postgres_url() else {
        return;
    };
    let Some(ca) = testing::cluster_var("TOOLROUTER_TEST_POSTGRES_CA") else {
        println!("skipped: the test PostgreSQL server has no TLS (TOOLROUTER_TEST_POSTGRES_CA is unset)");
        return;
    };
    let url = testing::fresh_postgres_database(&admin).await;
    let base = url.split('?').next().unwrap().to_string();
    let encrypted = async |db: &Db| {
        let session = db.session().await.unwrap();
        let Pool::Postgres(pool) = &session.pool else {
            unreachable!()
        };
        sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let cases = [
        ("sslmode=disable".to_string(), false),
        ("sslmode=require".to_string(), true),
        (format!("sslmode=verify-full&sslrootcert={ca}"), true),
    ];
    for (query, tls) in cases {
        let db = Db::connect(&format!("{base}?{query}")).await.unwrap();
        assert_eq!(encrypted(&db).await, tls, "{query}");
        db.set_setting("k", &query).await.unwrap();
        db.close().await;
    }
    let refused = Db::connect(&format!("{base}?sslmode=verify-full"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("certificate"), "{refused}");
}
