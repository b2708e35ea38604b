//! The server around the service: health, reflection, compression, the transport and field
//! size limits, a registry version stable across restarts, and requests no client would send.

use tonic_health::pb::health_check_response::ServingStatus;
use toolrouter::proto::tool_router_client::ToolRouterClient;

use crate::helpers::{TestApp, health, list_services, route_request, spawn_app};

#[tokio::test]
async fn health_is_serving_for_the_server_and_the_service() {
    let app = spawn_app().await;
    let channel = app.channel().await;
    for service in ["", "toolrouter.v1.ToolRouter"] {
        let status = health(channel.clone(), service).await.unwrap();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_tool_router_service() {
    let app = spawn_app().await;
    let names = list_services(app.channel().await).await.unwrap();
    assert!(
        names.contains(&"toolrouter.v1.ToolRouter".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"grpc.health.v1.Health".to_string()), "{names:?}");
    app.stop().await;
}

#[tokio::test]
async fn gzip_requests_and_answers_work_and_oversized_messages_get_the_documented_codes() {
    use tonic::codec::CompressionEncoding::Gzip;
    let app = spawn_app().await;
    let mut client = ToolRouterClient::new(app.channel().await)
        .send_compressed(Gzip)
        .accept_compressed(Gzip)
        .max_decoding_message_size(64 * 1024 * 1024);
    let r = client
        .route(route_request("check the disk space", ""))
        .await
        .unwrap();
    assert_eq!(
        r.metadata().get("grpc-encoding").map(|v| v.to_str().unwrap()),
        Some("gzip")
    );
    assert!(!r.into_inner().tools.is_empty());
    // Over the field limit, under the transport limit: the field limit is named. Compressed
    // and not.
    let plain = ToolRouterClient::new(app.channel().await);
    for mut c in [client.clone(), plain.clone()] {
        for size in [65_537, 70_000, 1_000_000] {
            let e = c.route(route_request(&"x".repeat(size), "")).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{size}: {e:?}");
            assert!(e.message().contains("65536"), "{size}: {e:?}");
        }
        // Over the transport limit.
        let e = c
            .route(route_request(&"x".repeat(5 * 1024 * 1024), ""))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        // The plain request gets this daemon's text; tonic's decompressor names the limit.
        assert!(
            e.message().contains("transport limit of 4194304 bytes") || e.message().contains("4194304 bytes"),
            "{e:?}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn health_and_reflection_take_compressed_requests_too() {
    use tonic::codec::CompressionEncoding::{Gzip, Zstd};
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let app = spawn_app().await;
    for encoding in [Gzip, Zstd] {
        let r = HealthClient::new(app.channel().await)
            .send_compressed(encoding)
            .accept_compressed(encoding)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("{encoding:?}: {e:?}"));
        assert!(r.metadata().get("grpc-encoding").is_some(), "{encoding:?}");
        assert_eq!(r.into_inner().status, ServingStatus::Serving as i32);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = ServerReflectionClient::new(app.channel().await)
            .send_compressed(encoding)
            .accept_compressed(encoding)
            .server_reflection_info(tokio_stream::once(request))
            .await
            .unwrap_or_else(|e| panic!("{encoding:?}: {e:?}"))
            .into_inner();
        assert!(stream.message().await.unwrap().is_some(), "{encoding:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn requests_over_a_services_decoding_limit_are_told_that_limit() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    // Health takes no token and is never shed: its requests, a service name, are decoded
    // up to 4 KiB only (each of a connection's streams could hold 4 MiB for the timeout).
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel().await);
    let e = health
        .check(HealthCheckRequest {
            service: "x".repeat(5_000),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.message(),
        "The request is over the transport limit of 4096 bytes."
    );
    // Compressed under the limit, past it once decompressed: the same answer, said so.
    let mut health =
        HealthClient::new(app.channel().await).send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let e = health
        .check(HealthCheckRequest {
            service: "x".repeat(5_000),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.message(),
        "The request is over the transport limit of 4096 bytes once decompressed."
    );
    app.stop().await;
    // A raised --max-message-bytes raises the ToolRouter limit, and the answer names it.
    let app = TestApp::builder()
        .config(|c| c.max_message_bytes = 1024 * 1024)
        .spawn()
        .await;
    let mut client = ToolRouterClient::new(app.channel().await);
    let e = client
        .route(route_request(&"x".repeat(17 * 1024 * 1024), ""))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let limit: usize = e
        .message()
        .strip_prefix("The request is over the transport limit of ")
        .and_then(|m| m.strip_suffix(" bytes."))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{e:?}"));
    assert!((16 * 1024 * 1024..17 * 1024 * 1024).contains(&limit), "{limit}");
    app.stop().await;
}

#[tokio::test]
async fn zstd_and_gzip_compress_requests_and_answers_each_way() {
    use tonic::codec::CompressionEncoding::{Gzip, Zstd};
    let app = spawn_app().await;
    // (request encoding, accepted answer encoding, the answer's grpc-encoding)
    let cases = [
        (Some(Zstd), Some(Zstd), Some("zstd")),
        (Some(Zstd), None, None),
        (None, Some(Zstd), Some("zstd")),
        (Some(Gzip), Some(Zstd), Some("zstd")),
        (Some(Zstd), Some(Gzip), Some("gzip")),
    ];
    for (send, accept, want) in cases {
        let mut client = ToolRouterClient::new(app.channel().await);
        if let Some(e) = send {
            client = client.send_compressed(e);
        }
        if let Some(e) = accept {
            client = client.accept_compressed(e);
        }
        let case = format!("send {send:?}, accept {accept:?}");
        let r = client
            .route(route_request("check the disk space", ""))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e:?}"));
        assert_eq!(
            r.metadata().get("grpc-encoding").map(|v| v.to_str().unwrap()),
            want,
            "{case}"
        );
        assert!(!r.into_inner().tools.is_empty(), "{case}");
        // A compressed request over the field limit still gets the field limit named.
        let e = client
            .route(route_request(&"x".repeat(70_000), ""))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{case}: {e:?}");
        assert!(e.message().contains("65536"), "{case}: {e:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn the_registry_version_is_the_same_across_restarts() {
    let mut app = spawn_app().await;
    let v1 = app.route("hi", "").await.registry_version;
    let mut app = app.restart().await;
    assert_eq!(app.route("hi", "").await.registry_version, v1);
    app.stop().await;
}

/// Sends bytes as they are: a request body no generated client would produce.
#[derive(Default)]
struct RawCodec;

struct Raw;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_not_internal() {
    let app = spawn_app().await;
    let mut grpc = tonic::client::Grpc::new(app.channel().await);
    let route = "/toolrouter.v1.ToolRouter/Route";
    let load = "/toolrouter.v1.ToolRouter/LoadToolGroup";
    let cases: &[(&str, &str, &[u8])] = &[
        ("message not UTF-8", route, &[0x0a, 0x02, 0xff, 0xfe]),
        (
            "conversation_id not UTF-8",
            route,
            &[0x0a, 0x01, b'a', 0x12, 0x01, 0xc3],
        ),
        (
            "group_name not UTF-8",
            load,
            &[0x0a, 0x02, b'c', b'1', 0x12, 0x01, 0xff],
        ),
        ("not protobuf", route, &[0xff, 0xff, 0xff, 0xff]),
        ("a length past the end", route, &[0x0a, 0x10, b'a']),
        (
            "a string field sent as a varint",
            route,
            &[0x0a, 0x01, b'a', 0x0a],
        ),
        ("an invalid wire type", route, &[0x0f]),
    ];
    for &(what, path, body) in cases {
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(
                tonic::Request::new(body.to_vec()),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                RawCodec,
            )
            .await
            .expect_err(what);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().starts_with("The request could not be decoded"),
            "{what}: {status:?}"
        );
    }
    // The same raw path with a well-formed body is served.
    grpc.ready().await.unwrap();
    let ok = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 0x06, b't', b'h', b'a', b'n', b'k', b's']),
            tonic::codegen::http::uri::PathAndQuery::from_static(route),
            RawCodec,
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    app.stop().await;
}
