//! Memory of the conversation cache: sends one `Route` in each of N new conversations to a
//! running daemon and prints the daemon's resident memory before and after.
//!
//! ```sh
//! cargo run --release --example conversations_rss -- PID http://127.0.0.1:PORT [N=200000] [ID_BYTES=16]
//! ```
//! The message hits no keyword, so the conversations stay empty and nothing is written:
//! what grows is the cache alone.

use std::time::Instant;

use toolrouter::cli::connection::Connection;
use toolrouter::proto::RouteRequest;

/// Workers sending at once.
const CONCURRENCY: usize = 8;

fn rss_kib(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (pid, addr) = (&args[0], &args[1]);
    let n: usize = args.get(2).map_or(200_000, |v| v.parse().expect("N"));
    let id_bytes: usize = args.get(3).map_or(16, |v| v.parse().expect("ID_BYTES"));
    let client = Connection::plain(addr.clone()).client().await.expect("connect");
    // Warm the daemon up without conversations, so the first figure is its steady base.
    for _ in 0..1000 {
        client
            .clone()
            .route(RouteRequest {
                message: "thanks".into(),
                conversation_id: String::new(),
                ..Default::default()
            })
            .await
            .expect("route");
    }
    let before = rss_kib(pid);
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CONCURRENCY {
        let mut client = client.clone();
        workers.push(tokio::spawn(async move {
            for i in (w..n).step_by(CONCURRENCY) {
                let id = format!("{i:0>id_bytes$}");
                client
                    .route(RouteRequest {
                        message: "thanks".into(),
                        conversation_id: id,
                        ..Default::default()
                    })
                    .await
                    .expect("route");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let after = rss_kib(pid);
    println!(
        "{n} conversations ({id_bytes}-byte ids) in {:.1} s: RSS {:.1} MiB -> {:.1} MiB (+{:.1} MiB, {} bytes per conversation)",
        start.elapsed().as_secs_f64(),
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after.saturating_sub(before)) as f64 / 1024.0,
        after.saturating_sub(before) * 1024 / n as u64
    );
}
