//! The harness every test file shares, and the only place that names the library's internals
//! (state, store, config, registry, server, client).
//!
//! - [`TestApp`]: the real server in this process on `127.0.0.1:0`, over a database in a temp
//!   folder it owns (or a fresh PostgreSQL database: [`Backend`]), with a generated tonic
//!   client, a second database connection playing the settings UI, and one method per RPC the
//!   tests call. [`spawn_app`] for the defaults, [`TestApp::builder`] for a changed config,
//!   other manifests or TLS; [`spawn_app_on`] and [`TestApp::builder_on`] for either backend.
//! - [`on_both_backends!`]: a test body run once on SQLite and once on PostgreSQL.
//! - [`Daemon`] and [`run`]: the `toolrouter` binary as a serving process or as one command.
//! - Files and the database as another program sees them: [`set_settings`], [`WriteLock`],
//!   [`stored_members`]; metrics and logs as an operator reads them: [`scrape`], [`sample`],
//!   [`json_lines`].

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Status;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use toolrouter::cli::connection::{Client, Connection};
use toolrouter::config::Config;
use toolrouter::db::Db;
use toolrouter::proto::tool_router_client::ToolRouterClient;
use toolrouter::proto::{
    CheckToolCallRequest, CheckToolCallResponse, DeleteDomainRequest, DeleteDomainResponse,
    InvalidateSettingsRequest, InvalidateSettingsResponse, ListAllToolsRequest, ListAllToolsResponse,
    ListGroupsRequest, ListGroupsResponse, LoadToolGroupRequest, LoadToolGroupResponse, Reason,
    RegistryEvent, ReloadRegistryRequest, ReloadRegistryResponse, ResetConversationRequest,
    ResetConversationResponse, RouteRequest, RouteResponse, SearchToolsRequest, SearchToolsResponse,
    UpsertDomainRequest, UpsertDomainResponse, WatchRegistryRequest,
};
use toolrouter::registry::Registry;
use toolrouter::router::Member;
use toolrouter::state::State;

// Values tests put in the config or compare with, named here with the rest of the library.
pub use toolrouter::config::{ProfileConfig, TierName};
pub use toolrouter::matcher::MatchMode;
pub use toolrouter::router::FallbackPolicy;
pub use toolrouter::search::SearchMode;
pub use toolrouter::telemetry::conversation_hash;

/// The `toolrouter` binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_toolrouter");

// Files and the database.

/// A fresh temp folder for a test's database, manifests or working directory.
pub fn temp_dir() -> TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The database file every test server and daemon uses in `dir`.
pub fn db_path(dir: &Path) -> PathBuf {
    dir.join("toolrouter.db")
}

/// The URL of [`db_path`], as `--database` and the config take it.
pub fn db_url(dir: &Path) -> String {
    sqlite_url(&db_path(dir))
}

/// The `--database` URL of a database file.
pub fn sqlite_url(file: &Path) -> String {
    format!("sqlite://{}", file.display())
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

/// Writes settings into the database in `dir` (creating it when missing) from another
/// connection, as a settings UI would, and closes that connection.
pub async fn set_settings(dir: &Path, settings: &[(&str, &str)]) {
    set_settings_at(&db_url(dir), settings).await;
}

/// Makes the SQLite file `path` as another program would: a table of its own, nothing of
/// this daemon's. Returns its bytes, to tell whether anything changed it.
pub async fn other_programs_database(path: &Path) -> Vec<u8> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE notes (x)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    std::fs::read(path).unwrap()
}

/// [`set_settings`] in the database at `url`.
pub async fn set_settings_at(url: &str, settings: &[(&str, &str)]) {
    let db = Db::connect(url).await.unwrap();
    for (k, v) in settings {
        db.set_setting(k, v).await.unwrap();
    }
    db.close().await;
}

/// A conversation's members as stored in the database in `dir`, read from another connection.
pub async fn stored_members(dir: &Path, conversation: &str) -> Option<Vec<Member>> {
    let db = Db::connect(&db_url(dir)).await.unwrap();
    let found = db.load_conversation(conversation).await.unwrap();
    db.close().await;
    found.map(|c| c.members)
}

/// Whether the database in `dir` holds `domain` as loaded for `conversation`.
pub async fn loaded(dir: &Path, conversation: &str, domain: &str) -> bool {
    stored_members(dir, conversation)
        .await
        .is_some_and(|members| members.iter().any(|m| m.domain == domain && m.loaded))
}

/// Holds the database's write lock from another connection, as a busy settings UI would,
/// until released: SQLite's one write lock, or on PostgreSQL a lock on every table that
/// lets reads through and stops writes.
pub enum WriteLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl WriteLock {
    /// Takes the write lock of the SQLite database in `dir`.
    pub async fn take(dir: &Path) -> WriteLock {
        WriteLock::take_url(&db_url(dir)).await
    }

    /// Takes the write lock of the app's database, whichever the backend.
    pub async fn on(app: &TestApp) -> WriteLock {
        WriteLock::take_url(&app.config.database).await
    }

    async fn take_url(url: &str) -> WriteLock {
        use sqlx::Connection as _;
        if toolrouter::db::is_postgres(url) {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::raw_sql(
                "BEGIN; LOCK TABLE settings, conversations, conversation_domains, domains IN EXCLUSIVE MODE",
            )
            .execute(&mut c)
            .await
            .unwrap();
            return WriteLock::Postgres(c);
        }
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut c).await.unwrap();
        WriteLock::Sqlite(c)
    }

    pub async fn release(self) {
        match self {
            WriteLock::Sqlite(mut c) => sqlx::query("COMMIT").execute(&mut c).await.map(drop),
            WriteLock::Postgres(mut c) => sqlx::query("COMMIT").execute(&mut c).await.map(drop),
        }
        .unwrap();
    }
}

/// Which database a test server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in the app's temp folder (the default).
    Sqlite,
    /// A fresh database of its own on the test server `TOOLROUTER_TEST_POSTGRES_URL` names.
    Postgres,
}

impl Backend {
    /// The PostgreSQL test server's URL. Without one, the PostgreSQL tests skip, and the
    /// first to skip prints one line (for the whole run) saying how to run them; under CI
    /// (`CI=true`) a missing server fails the test instead.
    pub fn postgres_url() -> Option<String> {
        static SKIP_NOTE: std::sync::Once = std::sync::Once::new();
        let url = toolrouter::db::testing::postgres_url();
        if url.is_none() {
            SKIP_NOTE.call_once(|| {
                use std::io::Write as _;
                // Straight to stderr: the test harness captures print macros only.
                let _ = writeln!(
                    std::io::stderr(),
                    "note: the PostgreSQL tests pass without running: set {} (`.ci/postgres.sh cargo test` starts a server and sets it) to run them",
                    toolrouter::db::testing::POSTGRES_URL_VAR
                );
            });
        }
        url
    }
}

/// Declares test bodies (`async fn name(backend: Backend)`) once per backend, as
/// `sqlite::name` and `postgres::name`; the PostgreSQL one passes without running when no
/// test server is named (see [`Backend::postgres_url`]).
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::helpers::Backend::Sqlite).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                if $crate::helpers::Backend::postgres_url().is_some() {
                    super::$name($crate::helpers::Backend::Postgres).await;
                }
            })*
        }
    };
}

/// A database for a test of daemon processes, by URL: the SQLite file in `dir`, or a fresh
/// PostgreSQL database.
pub async fn database_on(backend: Backend, dir: &Path) -> String {
    match backend {
        Backend::Sqlite => db_url(dir),
        Backend::Postgres => fresh_postgres_database().await,
    }
}

/// A fresh PostgreSQL database on the test server, by URL.
///
/// # Panics
/// Without a test server: callers check [`Backend::postgres_url`] first.
pub async fn fresh_postgres_database() -> String {
    let admin = Backend::postgres_url().expect("a PostgreSQL test server");
    toolrouter::db::testing::fresh_postgres_database(&admin).await
}

/// The built-in demo registry, which servers start with unless told otherwise.
pub fn demo_registry() -> Registry {
    Registry::demo()
}

// Requests and answers.

pub fn route_request(message: &str, conversation: &str) -> RouteRequest {
    RouteRequest {
        message: message.into(),
        conversation_id: conversation.into(),
        ..Default::default()
    }
}

pub fn load_request(conversation: &str, group: &str) -> LoadToolGroupRequest {
    LoadToolGroupRequest {
        conversation_id: conversation.into(),
        group_name: group.into(),
        ..Default::default()
    }
}

pub fn search_request(query: &str) -> SearchToolsRequest {
    SearchToolsRequest {
        query: query.into(),
        ..Default::default()
    }
}

/// `(domain, reason name, matched keywords)` of a route answer, for compact assertions.
pub fn decisions(r: &RouteResponse) -> Vec<(String, &'static str, Vec<String>)> {
    r.domains
        .iter()
        .map(|d| {
            let reason = Reason::try_from(d.reason).unwrap().as_str_name();
            (d.domain.clone(), reason, d.matched_keywords.clone())
        })
        .collect()
}

/// `(domain, reason name)` of a route answer.
pub fn reasons(r: &RouteResponse) -> Vec<(String, &'static str)> {
    decisions(r).into_iter().map(|(d, why, _)| (d, why)).collect()
}

/// The domains of a route answer, in order.
pub fn routed(r: &RouteResponse) -> Vec<String> {
    decisions(r).into_iter().map(|(d, _, _)| d).collect()
}

/// The gRPC health status of `service` (`""` for the whole server).
pub async fn health(channel: Channel, service: &str) -> Result<ServingStatus, Status> {
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?
        .into_inner();
    Ok(ServingStatus::try_from(r.status).expect("a known serving status"))
}

/// The services server reflection lists.
pub async fn list_services(channel: Channel) -> Result<Vec<String>, Status> {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await?
        .into_inner();
    let response = stream.message().await?.expect("a reflection answer");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    Ok(list.service.into_iter().map(|s| s.name).collect())
}

/// The next event of a `WatchRegistry` stream, within a few seconds.
pub async fn next_event(stream: &mut tonic::Streaming<RegistryEvent>) -> RegistryEvent {
    use tokio_stream::StreamExt as _;
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream is open")
        .expect("an event, not an error")
}

/// The message of an answer, or its status.
fn inner<T>(answer: Result<tonic::Response<T>, Status>) -> Result<T, Status> {
    answer.map(tonic::Response::into_inner)
}

/// A client connection to `addr` (`host:port` or a URL) without token or TLS.
pub fn plain_connection(addr: &str) -> Connection {
    Connection::plain(addr)
}

// The server in this process.

/// Where a test server's registry comes from; kept so a restart builds the same one.
enum Manifests {
    Demo,
    Sources(Vec<(String, String)>),
    /// The folders in the config.
    Folders,
}

impl Manifests {
    fn registry(&self, config: &Config) -> Registry {
        match self {
            Manifests::Demo => Registry::demo(),
            Manifests::Sources(files) => {
                Registry::from_sources(files.iter().map(|(p, t)| (p.as_str(), t.as_str()))).unwrap()
            }
            Manifests::Folders => Registry::load_dirs(&config.manifests).unwrap(),
        }
    }
}

/// The server in this process, its clients, and the temp folder holding its database.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: ToolRouterClient<Channel>,
    /// A second connection to the same file, as a settings UI would have.
    pub ui: Db,
    /// Owned here so the database lives exactly as long as the app.
    dir: TempDir,
    config: Config,
    manifests: Manifests,
    /// The CA that signed the server's certificate, when it serves TLS.
    tls_ca: Option<PathBuf>,
    shutdown: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

/// A [`TestApp`] before it starts: a fresh temp folder and the test config over it.
pub struct TestAppBuilder {
    dir: TempDir,
    config: Config,
    manifests: Manifests,
    tls_ca: Option<PathBuf>,
}

/// Starts the server on the demo registry with the test config.
pub async fn spawn_app() -> TestApp {
    TestApp::builder().spawn().await
}

/// [`spawn_app`] on `backend`.
pub async fn spawn_app_on(backend: Backend) -> TestApp {
    TestApp::builder_on(backend).spawn().await
}

impl TestApp {
    /// A database file in a fresh temp folder, the demo registry, and a settings TTL long
    /// enough that only an invalidation refreshes settings within a test.
    pub fn builder() -> TestAppBuilder {
        TestApp::builder_on(Backend::Sqlite)
    }

    /// [`TestApp::builder`] on `backend`: on PostgreSQL, a fresh database of its own (made
    /// when it starts; restarts keep it).
    pub fn builder_on(backend: Backend) -> TestAppBuilder {
        let dir = temp_dir();
        let config = Config {
            database: match backend {
                Backend::Sqlite => db_url(dir.path()),
                Backend::Postgres => String::new(),
            },
            settings_ttl: Duration::from_secs(3600),
            ..Config::default()
        };
        TestAppBuilder {
            dir,
            config,
            manifests: Manifests::Demo,
            tls_ca: None,
        }
    }

    /// The app's temp folder, which holds its database (a SQLite file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A TLS client configuration trusting the CA that signed the server's certificate.
    pub fn tls_client(&self) -> tokio_rustls::TlsConnector {
        use tokio_rustls::rustls::pki_types::CertificateDer;
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        let ca = self.tls_ca.as_ref().expect("the app serves TLS");
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config = tokio_rustls::rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    }

    pub fn db_path(&self) -> PathBuf {
        db_path(self.dir())
    }

    /// The folder the app's manifests were written to ([`TestAppBuilder::manifests`]).
    pub fn manifests(&self) -> PathBuf {
        self.config
            .manifests
            .first()
            .expect("started with manifests")
            .clone()
    }

    /// Stops the server gracefully and waits until it has closed the database. Returns the
    /// temp folder, for a look at what the server left on disk.
    pub async fn stop(self) -> TempDir {
        self.shut_down().await.dir
    }

    /// Stops the server and starts a new one on the same database, config and manifests.
    pub async fn restart(self) -> TestApp {
        self.shut_down().await.spawn().await
    }

    /// Stops the server and starts a new one on the same database with a changed config.
    pub async fn restart_with(self, tweak: impl FnOnce(&mut Config)) -> TestApp {
        self.shut_down().await.config(tweak).spawn().await
    }

    /// Stops the server; what is left can start the same app again.
    async fn shut_down(self) -> TestAppBuilder {
        let _ = self.shutdown.send(());
        self.server.await.unwrap();
        drop(self.ui);
        TestAppBuilder {
            dir: self.dir,
            config: self.config,
            manifests: self.manifests,
            tls_ca: self.tls_ca,
        }
    }

    /// A new eager plain connection to the server, for other gRPC services or custom clients.
    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// How the CLI's client reaches this server: `https://localhost` trusting the test CA when
    /// it serves TLS, else plain `http`; no token.
    pub fn connection(&self) -> Connection {
        match &self.tls_ca {
            Some(ca) => Connection {
                tls_ca: Some(ca.clone()),
                ..Connection::plain(format!("https://localhost:{}", self.addr.port()))
            },
            None => plain_connection(&format!("http://{}", self.addr)),
        }
    }

    /// [`TestApp::connection`] sending `token` as the bearer token.
    pub fn connection_with_token(&self, token: &str) -> Connection {
        Connection {
            auth_token: Some(token.into()),
            ..self.connection()
        }
    }

    /// Sets a setting as a settings UI would, then invalidates.
    pub async fn set(&mut self, key: &str, value: &str) {
        self.ui.set_setting(key, value).await.unwrap();
        self.invalidate().await.unwrap();
    }

    pub async fn route(&mut self, message: &str, conversation: &str) -> RouteResponse {
        self.try_route(message, conversation).await.unwrap()
    }

    pub async fn try_route(&mut self, message: &str, conversation: &str) -> Result<RouteResponse, Status> {
        inner(self.client.route(route_request(message, conversation)).await)
    }

    /// A route that decides as usual and records nothing.
    pub async fn dry_run(&mut self, message: &str, conversation: &str) -> RouteResponse {
        let request = RouteRequest {
            dry_run: true,
            ..route_request(message, conversation)
        };
        self.client.route(request).await.unwrap().into_inner()
    }

    pub async fn load(&mut self, conversation: &str, group: &str) -> Result<LoadToolGroupResponse, Status> {
        inner(
            self.client
                .load_tool_group(load_request(conversation, group))
                .await,
        )
    }

    pub async fn list_groups(&mut self) -> Result<ListGroupsResponse, Status> {
        inner(self.client.list_groups(ListGroupsRequest::default()).await)
    }

    /// The group names, in the order listed.
    pub async fn group_names(&mut self) -> Vec<String> {
        let r = self.list_groups().await.unwrap();
        r.groups.into_iter().map(|g| g.name).collect()
    }

    pub async fn list_all_tools(&mut self) -> Result<ListAllToolsResponse, Status> {
        self.list_all_tools_with(ListAllToolsRequest::default()).await
    }

    pub async fn list_all_tools_with(
        &mut self,
        request: ListAllToolsRequest,
    ) -> Result<ListAllToolsResponse, Status> {
        inner(self.client.list_all_tools(request).await)
    }

    /// A `Route` call as given.
    pub async fn route_with(&mut self, request: RouteRequest) -> Result<RouteResponse, Status> {
        inner(self.client.route(request).await)
    }

    /// A `LoadToolGroup` call as given.
    pub async fn load_with(
        &mut self,
        request: LoadToolGroupRequest,
    ) -> Result<LoadToolGroupResponse, Status> {
        inner(self.client.load_tool_group(request).await)
    }

    pub async fn invalidate(&mut self) -> Result<InvalidateSettingsResponse, Status> {
        inner(
            self.client
                .invalidate_settings(InvalidateSettingsRequest {})
                .await,
        )
    }

    pub async fn reset(&mut self, conversation: &str) -> Result<ResetConversationResponse, Status> {
        inner(
            self.client
                .reset_conversation(ResetConversationRequest {
                    conversation_id: conversation.into(),
                })
                .await,
        )
    }

    pub async fn reload(&mut self) -> Result<ReloadRegistryResponse, Status> {
        inner(self.client.reload_registry(ReloadRegistryRequest {}).await)
    }

    pub async fn search(&mut self, request: SearchToolsRequest) -> Result<SearchToolsResponse, Status> {
        inner(self.client.search_tools(request).await)
    }

    /// A `CheckToolCall` for `tool` in `conversation` (may be empty) under `profile`.
    pub async fn check_call(
        &mut self,
        tool: &str,
        conversation: &str,
        profile: &str,
    ) -> Result<CheckToolCallResponse, Status> {
        let request = CheckToolCallRequest {
            tool_name: tool.into(),
            conversation_id: conversation.into(),
            profile: profile.into(),
        };
        inner(self.client.check_tool_call(request).await)
    }

    /// A `WatchRegistry` stream under `profile`.
    pub async fn watch(&mut self, profile: &str) -> Result<tonic::Streaming<RegistryEvent>, Status> {
        let request = WatchRegistryRequest {
            profile: profile.into(),
        };
        inner(self.client.watch_registry(request).await)
    }

    pub async fn upsert_domain(&mut self, manifest_json: &str) -> Result<UpsertDomainResponse, Status> {
        let request = UpsertDomainRequest {
            manifest_json: manifest_json.into(),
        };
        inner(self.client.upsert_domain(request).await)
    }

    pub async fn delete_domain(&mut self, name: &str) -> Result<DeleteDomainResponse, Status> {
        let request = DeleteDomainRequest { name: name.into() };
        inner(self.client.delete_domain(request).await)
    }
}

impl TestAppBuilder {
    /// Changes the test config.
    pub fn config(mut self, tweak: impl FnOnce(&mut Config)) -> Self {
        tweak(&mut self.config);
        self
    }

    /// Serves these manifests, given as (path, contents), instead of the demo.
    pub fn sources(mut self, files: &[(&str, &str)]) -> Self {
        let files = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        self.manifests = Manifests::Sources(files);
        self
    }

    /// Serves manifests written to a folder `manifests` in the app's temp folder, as
    /// `--manifests` would, so a test can change them and reload.
    pub fn manifests(mut self, files: &[(&str, &str)]) -> Self {
        let folder = manifest_dir(self.dir.path(), "manifests", files);
        self.config.manifests = vec![folder];
        self.manifests = Manifests::Folders;
        self
    }

    /// Serves TLS only, with a certificate for `localhost` signed by a CA of its own.
    pub fn tls(mut self) -> Self {
        let (ca, cert, key) = certificates(self.dir.path());
        self.config.tls_cert = Some(cert);
        self.config.tls_key = Some(key);
        self.tls_ca = Some(ca);
        self
    }

    pub async fn spawn(self) -> TestApp {
        init_tracing();
        let TestAppBuilder {
            dir,
            mut config,
            manifests,
            tls_ca,
        } = self;
        if config.database.is_empty() {
            config.database = fresh_postgres_database().await;
        }
        // Bind before spawning, so the client can connect at once.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = State::new(manifests.registry(&config), &config)
            .await
            .expect("state");
        let (shutdown, rx) = oneshot::channel::<()>();
        let server_config = config.clone();
        let tls = toolrouter::server::tls(&config).expect("TLS files");
        let server = tokio::spawn(async move {
            toolrouter::server::serve(listener, state, &server_config, tls, async {
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
            dir,
            config,
            manifests,
            tls_ca,
            shutdown,
            server,
        }
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

/// A CA and a certificate for `localhost` signed by it, written as PEM files:
/// `(ca, cert, key)`.
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

// The binary as a process.

/// Runs the binary with `args` in `cwd`, with no `TOOLROUTER_*` variables from the caller's
/// environment.
pub async fn run(cwd: &Path, args: &[&str]) -> Output {
    run_with_env(cwd, args, &[]).await
}

/// [`run`] with these `TOOLROUTER_*` (or other) variables set.
pub async fn run_with_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).current_dir(cwd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOOLROUTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.kill_on_drop(true).output().await.unwrap()
}

/// A command's exit code, stdout and stderr, for an assertion message.
pub fn shown(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A command's stdout as JSON.
pub fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", shown(out)))
}

/// A running `toolrouter serve`, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    /// Starts the binary on a free loopback port over the database in `dir` and waits until
    /// it logs that it is serving.
    pub fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_with(&db_url(dir), extra, |_| {})
    }

    /// [`Daemon::start`] over the database at `url`.
    pub fn start_on(url: &str, extra: &[&str]) -> Daemon {
        Daemon::start_with(url, extra, |_| {})
    }

    /// Starts the binary with open-files limits `(soft, hard)`.
    pub fn start_with_files(dir: &Path, extra: &[&str], limits: (u64, u64)) -> Daemon {
        Daemon::start_with_limit(dir, extra, libc::RLIMIT_NOFILE, limits)
    }

    /// [`Daemon::start`] with the `(soft, hard)` limit of `resource` (`setrlimit`).
    pub fn start_with_limit(
        dir: &Path,
        extra: &[&str],
        resource: libc::__rlimit_resource_t,
        (soft, hard): (u64, u64),
    ) -> Daemon {
        Daemon::start_with(&db_url(dir), extra, |c| {
            use std::os::unix::process::CommandExt as _;
            let limit = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe,
            // on a value copied into the closure.
            unsafe {
                c.pre_exec(move || {
                    if libc::setrlimit(resource, &raw const limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        })
    }

    /// `serve` on a free loopback port with logs at info on a piped stderr, not started;
    /// JSON logs unless `extra` names a `--log-format`.
    pub fn command(database: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        if !extra.contains(&"--log-format") {
            command.args(["--log-format", "json"]);
        }
        command
            .arg("--database")
            .arg(database)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    fn start_with(database: &str, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Daemon {
        let mut command = Daemon::command(database, extra);
        configure(&mut command);
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["fields"]["message"] == "serving"
                    && let Some(addr) = v["fields"]["addr"].as_str()
                {
                    let _ = tx.send(addr.to_string());
                } else if line.contains(" serving addr=")
                    && let Some(addr) = line
                        .split(" addr=")
                        .nth(1)
                        .and_then(|a| a.split_whitespace().next())
                {
                    // `--log-format text`.
                    let _ = tx.send(addr.to_string());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => panic!("the daemon did not start:\n{}", log.lock().unwrap()),
        };
        Daemon {
            child,
            addr: addr.parse().unwrap(),
            log,
        }
    }

    pub fn connection(&self) -> Connection {
        plain_connection(&format!("http://{}", self.addr))
    }

    pub async fn client(&self) -> Client {
        self.connection().client().await.unwrap()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`.
    pub async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Everything the daemon has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON lines of a daemon's log.
pub fn json_lines(log: &str) -> Vec<Value> {
    log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The per-call log lines of `method` among a daemon's JSON log lines.
pub fn call_lines<'a>(lines: &'a [Value], method: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["fields"]["message"] == "call" && v["fields"]["method"] == method)
        .collect()
}

/// A loopback `host:port` free right now, for a listener the daemon opens itself.
pub fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// `GET /metrics` from the metrics endpoint, as Prometheus would scrape it.
pub fn scrape(addr: &str) -> String {
    let out = http1(addr, "GET /metrics HTTP/1.1");
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out
}

/// The whole answer, head and body, to an HTTP/1.1 request with `request_line` sent to
/// `addr` (which closes the connection after it).
pub fn http1(addr: &str, request_line: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{request_line}\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of one sample line (`name{labels} value`), or 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Calls made over raw HTTP/2 with `h2`, byte by byte, as no gRPC client would send them.
pub mod raw {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::task::JoinHandle;

    /// An HTTP/2 connection to `addr`, driven in the background by the task returned (which
    /// a test may abort to drop the connection).
    pub async fn connect(
        addr: SocketAddr,
    ) -> (
        h2::client::SendRequest<bytes::Bytes>,
        JoinHandle<Result<(), h2::Error>>,
    ) {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, connection) = h2::client::handshake(tcp).await.unwrap();
        let driven = tokio::spawn(connection);
        (send.ready().await.unwrap(), driven)
    }

    /// The head of a gRPC call of `path` (`/package.Service/Method`) at `addr`, as gRPC
    /// clients send it; more headers may be added before `.body(())`.
    pub fn request(addr: SocketAddr, path: &str) -> http::request::Builder {
        http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
    }

    /// Sends `request` on `send` with `body` as the whole request or, unless `end`, its
    /// beginning.
    pub fn send(
        send: &mut h2::client::SendRequest<bytes::Bytes>,
        request: http::request::Builder,
        body: &'static [u8],
        end: bool,
    ) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
        let (answer, mut stream) = send.send_request(request.body(()).unwrap(), false).unwrap();
        stream.send_data(bytes::Bytes::from_static(body), end).unwrap();
        (answer, stream)
    }

    /// The answer's head, within 5 s.
    pub async fn head(answer: h2::client::ResponseFuture) -> http::Response<h2::RecvStream> {
        tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("an answer within 5 s")
            .unwrap()
    }

    /// A `grpc-message` value as text (it travels percent-encoded).
    pub fn message(value: &http::HeaderValue) -> String {
        percent_encoding::percent_decode(value.as_bytes())
            .decode_utf8()
            .unwrap()
            .into_owned()
    }
}
