//! Watchers for the soak run: `WatchRegistry` streams held open on a daemon until it stops,
//! as MCP servers would hold them, counting the events each one reads.

use std::time::Duration;

use toolrouter::proto::WatchRegistryRequest;
use toolrouter::proto::tool_router_client::ToolRouterClient;
use toolrouter::service::WATCH_ENDED_BY_SHUTDOWN;
use toolrouter::{Error, Result};

/// What the watchers saw.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    /// Streams opened.
    pub streams: usize,
    /// Events read, over every stream.
    pub events: u64,
    /// The fewest events one stream read.
    pub fewest: u64,
}

/// Opens `streams` streams on the daemon at `addr` and reads them until the daemon ends
/// them (it starts draining: UNAVAILABLE, saying so), reading each event `pause` after the previous one (a slow
/// consumer). A stream that fails with an error, or ends before its first event, fails all.
///
/// # Errors
/// `Unavailable` naming the first stream that failed.
pub async fn watch(addr: &str, streams: usize, pause: Duration) -> Result<Watched> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string())
        .map_err(|e| Error::Config(format!("{addr:?} is not a daemon address: {e}")))?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Error::Unavailable(format!("cannot reach {addr}: {e}")))?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..streams {
        let mut client = ToolRouterClient::new(channel.clone());
        tasks.spawn(async move {
            let mut stream = client
                .watch_registry(WatchRegistryRequest::default())
                .await
                .map_err(|s| format!("stream {i}: {:?}: {}", s.code(), s.message()))?
                .into_inner();
            let mut events = 0u64;
            loop {
                match stream.message().await {
                    Ok(Some(_)) => events += 1,
                    Ok(None) => break,
                    // How the daemon ends each stream when it starts draining.
                    Err(s)
                        if s.code() == tonic::Code::Unavailable && s.message() == WATCH_ENDED_BY_SHUTDOWN =>
                    {
                        break;
                    }
                    Err(s) => return Err(format!("stream {i}: {:?}: {}", s.code(), s.message())),
                }
                tokio::time::sleep(pause).await;
            }
            if events == 0 {
                return Err(format!("stream {i} ended before its first event"));
            }
            Ok(events)
        });
    }
    let mut watched = Watched {
        streams,
        events: 0,
        fewest: u64::MAX,
    };
    while let Some(joined) = tasks.join_next().await {
        let events = joined
            .map_err(|e| Error::Internal(format!("a watcher failed: {e}")))?
            .map_err(Error::Unavailable)?;
        watched.events += events;
        watched.fewest = watched.fewest.min(events);
    }
    Ok(watched)
}
