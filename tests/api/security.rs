//! The bearer token (every call but health), TLS, and the limits in front of the service:
//! load shedding at the concurrency limit and the per-request timeout.

use std::time::Duration;

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::helpers::{
    TestApp, WriteLock, health, list_services, load_request, plain_connection, raw, route_request, run, shown,
};

#[tokio::test]
async fn with_a_token_every_call_but_health_needs_it() {
    let mut app = TestApp::builder()
        .config(|c| c.auth_token = Some("s3cret".into()))
        .spawn()
        .await;

    let err = app.try_route("hello", "").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "no token");
    assert!(
        err.message().contains("authorization: Bearer"),
        "{}",
        err.message()
    );
    let err = app.list_groups().await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // The CLI says how to give the token.
    let out = run(
        std::path::Path::new("."),
        &["groups", "--addr", &format!("127.0.0.1:{}", app.addr.port())],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Pass --auth-token (or set TOOLROUTER_AUTH_TOKEN)."),
        "{}",
        shown(&out)
    );

    let wrong = app.connection_with_token("s3cre7");
    let err = wrong
        .client()
        .await
        .unwrap()
        .route(route_request("hello", ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "wrong token");

    let right = app.connection_with_token("s3cret");
    assert!(
        right
            .client()
            .await
            .unwrap()
            .route(route_request("hello", ""))
            .await
            .is_ok()
    );

    // Health answers anyone; reflection is a call like the others.
    assert_eq!(
        health(app.connection().channel().await.unwrap(), "")
            .await
            .unwrap(),
        ServingStatus::Serving
    );
    let err = list_services(app.connection().channel().await.unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    app.stop().await;
}

#[tokio::test]
async fn with_tls_clients_that_trust_the_ca_are_served_and_plaintext_is_not() {
    let app = TestApp::builder().tls().spawn().await;
    let tls = app.connection();
    let mut client = tls.client().await.unwrap();
    let r = client
        .route(route_request("hello", ""))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.tools.is_empty());
    assert_eq!(
        health(tls.channel().await.unwrap(), "").await.unwrap(),
        ServingStatus::Serving
    );

    let plain = plain_connection(&format!("http://127.0.0.1:{}", app.addr.port()));
    let refused = async {
        let mut c = plain.client().await.map_err(|e| e.to_string())?;
        c.route(route_request("hello", ""))
            .await
            .map_err(|s| s.to_string())
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(10), refused)
            .await
            .unwrap()
            .is_err(),
        "plaintext gRPC is not served on a TLS port"
    );
    // `https://` without `--tls-ca` trusts the public web PKI, which did not sign this CA.
    let public = plain_connection(&format!("https://localhost:{}", app.addr.port()));
    let err = public.channel().await.unwrap_err().to_string();
    assert!(err.contains("certificate"), "{err}");
    assert!(err.contains("pass --tls-ca"), "says how to trust it: {err}");

    // `host:port` with a CA means TLS; `http://` with one is a contradiction, said as such.
    let ca = tls.tls_ca.clone();
    let bare = toolrouter::cli::connection::Connection {
        tls_ca: ca.clone(),
        ..plain_connection(&format!("localhost:{}", app.addr.port()))
    };
    let mut client = bare.client().await.unwrap();
    assert!(client.route(route_request("hello", "")).await.is_ok());
    let contradiction = toolrouter::cli::connection::Connection {
        tls_ca: ca,
        ..plain_connection(&format!("http://localhost:{}", app.addr.port()))
    };
    let err = contradiction.channel().await.unwrap_err().to_string();
    assert!(
        err.contains("is for a daemon serving TLS")
            && err.contains(&format!("use https://localhost:{}", app.addr.port())),
        "{err}"
    );
    // The CLI, speaking plain HTTP/2 to it, says what to do, not only that HTTP/2 failed.
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            "health",
            "--addr",
            &format!("http://127.0.0.1:{}", app.addr.port()),
        ],
    )
    .await;
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "serves TLS: use --addr https://127.0.0.1:{}",
            app.addr.port()
        )),
        "{stderr}"
    );
    app.stop().await;
}

#[tokio::test]
async fn calls_over_the_concurrency_limit_are_shed_at_once_and_health_still_answers() {
    let mut app = TestApp::builder()
        .config(|c| {
            c.max_concurrent_requests = 1;
            c.busy_timeout = Duration::from_secs(30);
        })
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    let lock = WriteLock::take(app.dir()).await;
    // This load waits for the lock, holding the only slot.
    let mut slow = app.client.clone();
    let load = tokio::spawn(async move { slow.load_tool_group(load_request("c1", "sonarr")).await });
    let mut shed = None;
    for _ in 0..100 {
        match app.try_route("hello", "").await {
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
    assert_eq!(
        health(app.connection().channel().await.unwrap(), "")
            .await
            .unwrap(),
        ServingStatus::Serving
    );

    lock.release().await;
    let loaded = load.await.unwrap().unwrap().into_inner();
    assert!(!loaded.already_loaded, "the queued load completed");
    assert!(app.try_route("hello", "").await.is_ok(), "the slot is free again");
    app.stop().await;
}

#[tokio::test]
async fn a_call_past_the_request_timeout_is_deadline_exceeded_and_not_applied() {
    let mut app = TestApp::builder()
        .config(|c| {
            c.request_timeout = Duration::from_millis(300);
            c.busy_timeout = Duration::from_secs(30);
        })
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    let lock = WriteLock::take(app.dir()).await;
    let err = app.load("c1", "sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(err.message().contains("300ms"), "{}", err.message());
    // The CLI shows the daemon's answer, not "no answer" (its own deadline is 10 s).
    let addr = app.addr.to_string();
    let out = run(
        app.dir(),
        &["load", "--addr", &addr, "--conversation", "c2", "sonarr"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("The call took longer than the request timeout of 300ms"),
        "{stderr}"
    );
    lock.release().await;
    // As a client would: retry until an answer comes in time. On a loaded machine the first
    // retry can also pass the 300 ms (the abandoned statement still holds its connection
    // until the lock is gone); a timed-out call is never applied, so the first load answered
    // is the one that loads.
    let mut retries = 0;
    let loaded = loop {
        match app.load("c1", "sonarr").await {
            Err(e) if e.code() == Code::DeadlineExceeded && retries < 20 => retries += 1,
            answer => break answer.unwrap(),
        }
    };
    assert!(
        !loaded.already_loaded,
        "the timed-out load was not acknowledged nor applied"
    );
    app.stop().await;
}

/// Whether the daemon closes `socket` within `within` (it reads end of file or an error);
/// whatever the daemon sends before that is read and dropped.
async fn closed_within(socket: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The client's HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test]
async fn a_connection_that_stalls_in_its_handshake_is_closed_at_the_handshake_timeout() {
    use tokio::io::AsyncWriteExt as _;
    let timeout = Duration::from_millis(500);
    let plain = TestApp::builder()
        .config(|c| c.handshake_timeout = timeout)
        .spawn()
        .await;
    let tls = TestApp::builder()
        .config(|c| c.handshake_timeout = timeout)
        .tls()
        .spawn()
        .await;
    // (case, bytes sent before stalling, over TLS)
    let cases: [(&str, &[u8], bool); 5] = [
        ("silent", b"", false),
        ("one byte", b"P", false),
        ("most of the preface", &PREFACE[..20], false),
        ("half a TLS record header", b"\x16\x03", true),
        ("TLS done, no preface", b"", true),
    ];
    for (case, sent, over_tls) in cases {
        let app = if over_tls { &tls } else { &plain };
        let mut tcp = tokio::net::TcpStream::connect(app.addr).await.unwrap();
        let closed = if over_tls && sent.is_empty() {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut stream = app.tls_client().connect(name, tcp).await.unwrap();
            closed_within(&mut stream, Duration::from_secs(5)).await
        } else {
            tcp.write_all(sent).await.unwrap();
            closed_within(&mut tcp, Duration::from_secs(5)).await
        };
        assert!(
            closed,
            "{case}: still open 5 s after a handshake timeout of {timeout:?}"
        );
    }
    // A connection past its preface stays open while idle (HTTP/2 keepalive watches it).
    let mut tcp = tokio::net::TcpStream::connect(plain.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // empty SETTINGS
    assert!(
        !closed_within(&mut tcp, timeout * 4).await,
        "a connection that spoke HTTP/2 was closed while idle"
    );
    plain.stop().await;
    tls.stop().await;
}

#[tokio::test]
async fn a_body_that_cannot_be_decompressed_is_the_callers_error_named_so() {
    let app = TestApp::builder().spawn().await;
    let (mut send, _connection) = raw::connect(app.addr).await;
    for encoding in ["gzip", "zstd"] {
        let request =
            raw::request(app.addr, "/toolrouter.v1.ToolRouter/Route").header("grpc-encoding", encoding);
        // A message flagged compressed whose bytes are no such stream.
        let body: &'static [u8] = &[1, 0, 0, 0, 4, b'n', b'o', b'p', b'e'];
        let (answer, _stream) = raw::send(&mut send, request, body, true);
        let answer = raw::head(answer).await;
        let headers = answer.headers();
        assert_eq!(
            headers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "{encoding}: {headers:?}"
        );
        let message = raw::message(headers.get("grpc-message").unwrap());
        assert!(
            message.starts_with("The request cannot be decompressed: "),
            "{encoding}: {message}"
        );
    }
    app.stop().await;
}

/// A body that is not one gRPC message is the caller's mistake, said as such, on every
/// service: `INTERNAL` is the daemon's own faults.
#[tokio::test]
async fn a_body_that_is_not_one_grpc_message_is_the_callers_error_named_so() {
    let app = TestApp::builder().spawn().await;
    let (mut send, _connection) = raw::connect(app.addr).await;
    // (body, how the message starts, what it says)
    const NOT_ONE: &str = "The request is not a gRPC message: ";
    let cases: [(&'static [u8], &str, &str); 5] = [
        (&[7, 0, 0, 0, 1, 0], NOT_ONE, "compressed flag is neither 0 nor 1"),
        (
            &[0, 0, 0, 0, 9, 1, 2],
            NOT_ONE,
            "ends before the message its length prefix announces",
        ),
        (
            &[0, 0, 0],
            NOT_ONE,
            "ends before the message its length prefix announces",
        ),
        (&[], NOT_ONE, "it holds no message"),
        // One message that is no protobuf of its request (field 1, a string in each, not
        // UTF-8): the daemon's codec and tonic's (health) say so alike.
        (
            &[0, 0, 0, 0, 3, 0x0a, 1, 0xff],
            "The request could not be decoded: ",
            "UTF-8",
        ),
    ];
    for path in [
        "/toolrouter.v1.ToolRouter/Route",
        "/toolrouter.v1.ToolRouter/WatchRegistry",
        "/grpc.health.v1.Health/Check",
    ] {
        for (body, prefix, want) in cases {
            let (answer, _stream) = raw::send(&mut send, raw::request(app.addr, path), body, true);
            let answer = raw::head(answer).await;
            // A trailers-only answer carries the status in its headers; otherwise it is in
            // the trailers.
            let (code, message) = if let Some(code) = answer.headers().get("grpc-status") {
                (code.clone(), answer.headers().get("grpc-message").cloned())
            } else {
                let mut body = answer.into_body();
                let trailers = tokio::time::timeout(Duration::from_secs(5), body.trailers())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                (
                    trailers["grpc-status"].clone(),
                    trailers.get("grpc-message").cloned(),
                )
            };
            let message = raw::message(&message.unwrap());
            assert_eq!(code, "3", "{path} {body:?}: {message}");
            assert!(
                message.starts_with(prefix) && message.contains(want),
                "{path} {body:?}: {message}"
            );
        }
    }
    // Two messages where the call takes one: the service's codec refuses the second (the
    // health service's, tonic's own, reads the first and drops the rest).
    let two: &'static [u8] = &[0, 0, 0, 0, 2, 0x0a, 0, 0, 0, 0, 0, 2, 0x0a, 0];
    for path in [
        "/toolrouter.v1.ToolRouter/Route",
        "/toolrouter.v1.ToolRouter/WatchRegistry",
    ] {
        let (answer, _stream) = raw::send(&mut send, raw::request(app.addr, path), two, true);
        let answer = raw::head(answer).await;
        let headers = answer.headers();
        assert_eq!(
            headers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "{path}: {headers:?}"
        );
        let message = raw::message(&headers["grpc-message"]);
        assert_eq!(
            message,
            "The request is not a gRPC message: it holds more than one message, and each call takes one.",
            "{path}"
        );
    }
    // A message flagged compressed in a call that names no encoding is `INTERNAL`, as gRPC's
    // compression rules require.
    let request = raw::request(app.addr, "/toolrouter.v1.ToolRouter/Route");
    let (answer, _stream) = raw::send(&mut send, request, &[1, 0, 0, 0, 1, 0], true);
    let answer = raw::head(answer).await;
    assert_eq!(
        answer.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"13"[..]),
        "{:?}",
        answer.headers()
    );
    app.stop().await;
}

#[tokio::test]
async fn a_connection_may_open_a_bounded_number_of_streams() {
    // (limit on concurrent calls, streams per connection)
    let cases = [(1, 1024 + 64), (1024, 1024 + 64), (5000, 5000 + 64)];
    for (max_concurrent_requests, streams) in cases {
        let app = TestApp::builder()
            .config(|c| c.max_concurrent_requests = max_concurrent_requests)
            .spawn()
            .await;
        let (mut send, _connection) = raw::connect(app.addr).await;
        // The server's SETTINGS arrive with its first answer.
        let check = raw::request(app.addr, "/grpc.health.v1.Health/Check");
        let (answer, _) = raw::send(&mut send, check, &[0, 0, 0, 0, 0], true);
        let answer = answer.await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            send.current_max_send_streams(),
            streams,
            "max_concurrent_requests {max_concurrent_requests}"
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn a_health_call_whose_request_never_ends_is_answered_at_the_request_timeout() {
    let app = TestApp::builder()
        .config(|c| c.request_timeout = Duration::from_millis(300))
        .spawn()
        .await;
    let (mut send, _connection) = raw::connect(app.addr).await;
    for method in ["Check", "Watch"] {
        // Headers, then half a message, and nothing more.
        let call = raw::request(app.addr, &format!("/grpc.health.v1.Health/{method}"));
        let (answer, body) = raw::send(&mut send, call, &[0, 0, 0, 0, 9, 1], false);
        let answer = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer 5 s after a request timeout of 300 ms"))
            .unwrap();
        assert_eq!(
            answer.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..]),
            "{method}: {answer:?}"
        );
        drop(body);
    }
    // A whole health call still answers.
    assert_eq!(
        health(app.connection().channel().await.unwrap(), "")
            .await
            .unwrap(),
        ServingStatus::Serving
    );
    app.stop().await;
}

/// A request whose content type is not gRPC's is answered HTTP 415 (gRPC's protocol), with
/// the gRPC status saying why, on every service; gRPC's own content types are served.
#[tokio::test]
async fn a_request_that_is_not_grpc_is_answered_unsupported_media_type() {
    let app = TestApp::builder().spawn().await;
    let (mut send, _connection) = raw::connect(app.addr).await;
    // An empty RouteRequest and an empty health check request: one message of 0 bytes.
    let body: &'static [u8] = &[0, 0, 0, 0, 0];
    let cases = [
        (Some("application/json"), 415),
        (Some("text/plain"), 415),
        (None, 415),
        (Some("application/grpc"), 200),
        (Some("application/grpc+proto"), 200),
    ];
    for path in [
        "/toolrouter.v1.ToolRouter/ListGroups",
        "/grpc.health.v1.Health/Check",
    ] {
        for (content_type, want) in cases {
            let mut request =
                http::Request::post(format!("http://{}{path}", app.addr)).header("te", "trailers");
            if let Some(t) = content_type {
                request = request.header("content-type", t);
            }
            let (answer, _stream) = raw::send(&mut send, request, body, true);
            let answer = raw::head(answer).await;
            assert_eq!(answer.status().as_u16(), want, "{path} {content_type:?}");
            if want == 415 {
                let headers = answer.headers();
                assert_eq!(headers["grpc-status"], "3", "{path} {content_type:?}");
                let message = raw::message(&headers["grpc-message"]);
                assert!(
                    message.ends_with("a gRPC call is sent as application/grpc."),
                    "{message}"
                );
            }
        }
    }
}
