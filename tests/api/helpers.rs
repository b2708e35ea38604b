//! `spawn_app()`: the real server on `127.0.0.1:0` over a fresh database file, with a
//! generated tonic client and a second database connection playing the settings UI.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use toolrouter::config::Config;
use toolrouter::db::Db;
use toolrouter::proto::tool_router_client::ToolRouterClient;
use toolrouter::registry::Registry;
use toolrouter::state::State;

pub struct TestApp {
    pub addr: std::net::SocketAddr,
    pub client: ToolRouterClient<Channel>,
    /// A second connection to the same file, as a settings UI would have.
    pub ui: Db,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

/// A fresh temp folder for a test's database (and manifests).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A config over a database file in `dir`, with a settings TTL long enough that only an
/// invalidation refreshes settings within a test.
pub fn config(dir: &Path) -> Config {
    Config {
        database: format!("sqlite://{}", dir.join("toolrouter.db").display()),
        settings_ttl: Duration::from_secs(3600),
        ..Config::default()
    }
}

fn init_tracing() {
    // Test logs only on request: TEST_LOG=1 cargo test.
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_test_writer()
            .try_init();
    }
}

/// Starts the server on the demo registry.
pub async fn spawn_app(config: Config) -> TestApp {
    spawn_app_with(config, Registry::demo()).await
}

/// Starts the server on a given registry.
pub async fn spawn_app_with(config: Config, registry: Registry) -> TestApp {
    init_tracing();
    // Bind before spawning, so the client can connect at once.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = State::new(registry, &config).await.expect("state");
    let (tx, rx) = oneshot::channel::<()>();
    let server_config = config.clone();
    let server = tokio::spawn(async move {
        toolrouter::server::serve(listener, state, &server_config, async {
            let _ = rx.await;
        })
        .await
        .expect("server");
    });
    // Lazy: a test of a TLS or token-protected server makes its own client.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let client = ToolRouterClient::new(channel);
    let ui = Db::connect(&config.database).await.unwrap();
    TestApp {
        addr,
        client,
        ui,
        shutdown: Some(tx),
        server: Some(server),
    }
}

impl TestApp {
    /// Stops the server gracefully and waits until it has closed the database.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.server.take() {
            h.await.unwrap();
        }
    }

    /// Sets a setting as a settings UI would, then invalidates.
    pub async fn set(&mut self, key: &str, value: &str) {
        self.ui.set_setting(key, value).await.unwrap();
        self.client
            .invalidate_settings(toolrouter::proto::InvalidateSettingsRequest {})
            .await
            .unwrap();
    }

    pub async fn route(&mut self, message: &str, conversation: &str) -> toolrouter::proto::RouteResponse {
        self.client
            .route(toolrouter::proto::RouteRequest {
                message: message.into(),
                conversation_id: conversation.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn load(
        &mut self,
        conversation: &str,
        group: &str,
    ) -> Result<toolrouter::proto::LoadToolGroupResponse, tonic::Status> {
        self.client
            .load_tool_group(toolrouter::proto::LoadToolGroupRequest {
                conversation_id: conversation.into(),
                group_name: group.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }
}

/// `(domain, reason name, matched keywords)` of a route answer, for compact assertions.
pub fn decisions(r: &toolrouter::proto::RouteResponse) -> Vec<(String, &'static str, Vec<String>)> {
    r.domains
        .iter()
        .map(|d| {
            let reason = toolrouter::proto::Reason::try_from(d.reason)
                .unwrap()
                .as_str_name();
            (d.domain.clone(), reason, d.matched_keywords.clone())
        })
        .collect()
}

/// Writes manifests into a new folder under `dir`.
pub fn manifest_dir(dir: &Path, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    for (file, text) in files {
        std::fs::write(d.join(file), text).unwrap();
    }
    d
}

/// Holds the database's write lock from another connection, as a busy settings UI would,
/// until released.
pub struct WriteLock(sqlx::SqliteConnection);

impl WriteLock {
    pub async fn take(dir: &Path) -> WriteLock {
        use sqlx::Connection as _;
        let url = format!("sqlite://{}", dir.join("toolrouter.db").display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut c).await.unwrap();
        WriteLock(c)
    }

    pub async fn release(mut self) {
        sqlx::query("COMMIT").execute(&mut self.0).await.unwrap();
    }
}
