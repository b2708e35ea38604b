use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

use crate::helpers::{TestApp, config, spawn_app, temp_dir};

async fn channel(app: &TestApp) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn health_is_serving_for_the_server_and_the_service() {
    let dir = temp_dir();
    let app = spawn_app(config(dir.path())).await;
    let mut health = HealthClient::new(channel(&app).await);
    for service in ["", "toolrouter.v1.ToolRouter"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_tool_router_service() {
    let dir = temp_dir();
    let app = spawn_app(config(dir.path())).await;
    let mut client = ServerReflectionClient::new(channel(&app).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
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
    use toolrouter::proto::{RouteRequest, tool_router_client::ToolRouterClient};
    let dir = temp_dir();
    let app = spawn_app(config(dir.path())).await;
    let mut client = ToolRouterClient::new(channel(&app).await)
        .send_compressed(Gzip)
        .accept_compressed(Gzip)
        .max_decoding_message_size(64 * 1024 * 1024);
    let route = |message: String| RouteRequest {
        message,
        conversation_id: String::new(),
        ..Default::default()
    };
    let r = client.route(route("check the disk space".into())).await.unwrap();
    assert_eq!(
        r.metadata().get("grpc-encoding").map(|v| v.to_str().unwrap()),
        Some("gzip")
    );
    assert!(!r.into_inner().tools.is_empty());
    // Over the field limit, under the transport limit: the field limit is named. Compressed
    // and not.
    let plain = ToolRouterClient::new(channel(&app).await);
    for mut c in [client.clone(), plain.clone()] {
        for size in [65_537, 70_000, 1_000_000] {
            let e = c.route(route("x".repeat(size))).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{size}: {e:?}");
            assert!(e.message().contains("65536"), "{size}: {e:?}");
        }
        // Over the transport limit.
        let e = c.route(route("x".repeat(5 * 1024 * 1024))).await.unwrap_err();
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
async fn the_registry_version_is_the_same_across_restarts() {
    let dir = temp_dir();
    let c = config(dir.path());
    let mut app = spawn_app(c.clone()).await;
    let v1 = app.route("hi", "").await.registry_version;
    app.stop().await;
    let mut app = spawn_app(c).await;
    assert_eq!(app.route("hi", "").await.registry_version, v1);
    app.stop().await;
}
