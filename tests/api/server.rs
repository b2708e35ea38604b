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
