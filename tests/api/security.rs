//! The bearer token (every call but health), TLS, and the limits in front of the service:
//! load shedding at the concurrency limit and the per-request timeout.

use std::time::Duration;

use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use toolrouter::cli::connection::Connection;
use toolrouter::config::Config;
use toolrouter::proto::{ListGroupsRequest, RouteRequest};

use crate::helpers::{WriteLock, config, spawn_app, temp_dir};

fn route_request() -> RouteRequest {
    RouteRequest {
        message: "hello".into(),
        conversation_id: String::new(),
        ..Default::default()
    }
}

async fn health(conn: &Connection) -> ServingStatus {
    let mut h = HealthClient::new(conn.channel().await.unwrap());
    h.check(HealthCheckRequest {
        service: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .status()
}

#[tokio::test]
async fn with_a_token_every_call_but_health_needs_it() {
    let dir = temp_dir();
    let mut app = spawn_app(Config {
        auth_token: Some("s3cret".into()),
        ..config(dir.path())
    })
    .await;
    let addr = format!("http://{}", app.addr);

    let err = app.client.route(route_request()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "no token");
    assert!(
        err.message().contains("authorization: Bearer"),
        "{}",
        err.message()
    );
    let err = app.client.list_groups(ListGroupsRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let wrong = Connection {
        auth_token: Some("s3cre7".into()),
        ..Connection::plain(&addr)
    };
    let err = wrong
        .client()
        .await
        .unwrap()
        .route(route_request())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "wrong token");

    let right = Connection {
        auth_token: Some("s3cret".into()),
        ..Connection::plain(&addr)
    };
    assert!(right.client().await.unwrap().route(route_request()).await.is_ok());

    // Health answers anyone; reflection is a call like the others.
    assert_eq!(health(&Connection::plain(&addr)).await, ServingStatus::Serving);
    let mut reflection = tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(
        Connection::plain(&addr).channel().await.unwrap(),
    );
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let err = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    app.stop().await;
}

/// A CA and a certificate for `localhost` signed by it, written as PEM files.
fn certificates(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
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

#[tokio::test]
async fn with_tls_clients_that_trust_the_ca_are_served_and_plaintext_is_not() {
    let dir = temp_dir();
    let (ca, cert, key) = certificates(dir.path());
    let app = spawn_app(Config {
        tls_cert: Some(cert),
        tls_key: Some(key),
        ..config(dir.path())
    })
    .await;
    let port = app.addr.port();
    let tls = Connection {
        tls_ca: Some(ca),
        ..Connection::plain(format!("https://localhost:{port}"))
    };
    let mut client = tls.client().await.unwrap();
    let r = client.route(route_request()).await.unwrap().into_inner();
    assert!(!r.tools.is_empty());
    assert_eq!(health(&tls).await, ServingStatus::Serving);

    let plain = Connection::plain(format!("http://127.0.0.1:{port}"));
    let refused = async {
        let mut c = plain.client().await?;
        c.route(route_request())
            .await
            .map_err(|s| toolrouter::Error::Unavailable(s.to_string()))
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(10), refused)
            .await
            .unwrap()
            .is_err(),
        "plaintext gRPC is not served on a TLS port"
    );
    app.stop().await;
}

#[tokio::test]
async fn calls_over_the_concurrency_limit_are_shed_at_once_and_health_still_answers() {
    let dir = temp_dir();
    let mut app = spawn_app(Config {
        max_concurrent_requests: 1,
        busy_timeout: Duration::from_secs(30),
        ..config(dir.path())
    })
    .await;
    app.set("sonarr_url", "x").await;
    let lock = WriteLock::take(dir.path()).await;
    // This load waits for the lock, holding the only slot.
    let mut slow = app.client.clone();
    let load = tokio::spawn(async move {
        slow.load_tool_group(toolrouter::proto::LoadToolGroupRequest {
            conversation_id: "c1".into(),
            group_name: "sonarr".into(),
        })
        .await
    });
    let mut shed = None;
    for _ in 0..100 {
        match app.client.route(route_request()).await {
            Err(s) => {
                shed = Some(s);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let shed = shed.expect("a call beyond the limit is refused while the slot is taken");
    assert_eq!(shed.code(), Code::ResourceExhausted);
    assert!(
        shed.message().contains("limit of 1 concurrent"),
        "{}",
        shed.message()
    );
    let addr = format!("http://{}", app.addr);
    assert_eq!(health(&Connection::plain(&addr)).await, ServingStatus::Serving);

    lock.release().await;
    let loaded = load.await.unwrap().unwrap().into_inner();
    assert!(!loaded.already_loaded, "the queued load completed");
    assert!(
        app.client.route(route_request()).await.is_ok(),
        "the slot is free again"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_call_past_the_request_timeout_is_deadline_exceeded_and_not_applied() {
    let dir = temp_dir();
    let mut app = spawn_app(Config {
        request_timeout: Duration::from_millis(300),
        busy_timeout: Duration::from_secs(30),
        ..config(dir.path())
    })
    .await;
    app.set("sonarr_url", "x").await;
    let lock = WriteLock::take(dir.path()).await;
    let err = app.load("c1", "sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(err.message().contains("300ms"), "{}", err.message());
    lock.release().await;
    let loaded = app.load("c1", "sonarr").await.unwrap();
    assert!(
        !loaded.already_loaded,
        "the timed-out load was not acknowledged nor applied"
    );
    app.stop().await;
}
