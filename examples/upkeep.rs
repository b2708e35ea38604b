//! Conversation clocks to flush: loads a group into each of N new conversations (which
//! writes each one's row), then routes a message that hits nothing in each (which moves its
//! idle clock in memory only), so N clocks are due at the next upkeep or at shutdown.
//!
//! ```sh
//! cargo run --release --example upkeep -- http://127.0.0.1:PORT GROUP [N=20000]
//! ```
//! `benches/upkeep.sh` starts the daemon, runs this and times the shutdown that follows.

use std::time::Instant;

use toolrouter::cli::connection::Connection;
use toolrouter::proto::{LoadToolGroupRequest, RouteRequest};

/// Workers sending at once.
const CONCURRENCY: usize = 8;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, group) = (&args[0], &args[1]);
    let n: usize = args.get(2).map_or(20_000, |v| v.parse().expect("N"));
    let client = Connection::plain(addr.clone()).client().await.expect("connect");
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CONCURRENCY {
        let (mut client, group) = (client.clone(), group.clone());
        workers.push(tokio::spawn(async move {
            for i in (w..n).step_by(CONCURRENCY) {
                let id = format!("u{i}");
                let load = LoadToolGroupRequest {
                    conversation_id: id.clone(),
                    group_name: group.clone(),
                    ..Default::default()
                };
                client.load_tool_group(load).await.expect("load");
                let route = RouteRequest {
                    message: "thanks".into(),
                    conversation_id: id,
                    ..Default::default()
                };
                client.route(route).await.expect("route");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    println!(
        "{n} conversations with a clock due in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}
