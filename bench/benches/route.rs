//! `route()` against the bare keyword scan, per workload (see `toolrouter_bench::workload`).
//!
//! One criterion group per workload (`demo`, `seal`, `stb`, `scale-100`, `scale-1000`,
//! `scale-10000`), each with `route` (every message through keyword-only `route()`,
//! `--search off`), `search` (every message through `route()` with the default search,
//! `augment`) and `scan` (every message through `toolrouter_bench::scan`, the automaton
//! floor);
//! throughput is per message. After criterion, a plain timing loop prints per-message
//! times, the route/scan ratio, the median time of one message routed with the caches
//! emptied before it (as between a daemon's turns), the median time of one message routed
//! with search, the time to build the search index, and the route-time slope from
//! `scale-100` to `scale-10000`, for each workload the filter let run.
//!
//! The eval sets are read from `TOOLROUTER_EVAL_DIR`, or `shared/eval` beside the
//! repository; `seal` and `stb` are skipped with a note when they are missing.
//!
//! ```text
//! cargo bench -p toolrouter-bench --bench route            # everything
//! cargo bench -p toolrouter-bench --bench route -- scale   # only the scale workloads
//! ```

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use aho_corasick::automaton::Automaton as _;
use criterion::{Criterion, Throughput};
use toolrouter::matcher::{MatchMode, Matcher};
use toolrouter::router::{Activation, Inputs, Options, route};
use toolrouter::search::{SearchIndex, SearchMode, SearchOptions};
use toolrouter_bench::scan::scan;
use toolrouter_bench::workload::{self, Workload};

/// A workload with its automaton, search index and activation built once.
struct Prepared {
    workload: Workload,
    matcher: Matcher,
    index: SearchIndex,
    /// How long building the search index took.
    index_build: Duration,
    activation: Activation,
}

impl Prepared {
    fn new(workload: Workload) -> Prepared {
        let matcher = Matcher::new(workload.registry.keywords(), MatchMode::Word)
            .unwrap_or_else(|e| panic!("{}: {e}", workload.name));
        let started = Instant::now();
        let index = SearchIndex::new(&workload.registry);
        let index_build = started.elapsed();
        let activation = Activation::new(&workload.registry, &workload.settings);
        Prepared {
            workload,
            matcher,
            index,
            index_build,
            activation,
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            registry: &self.workload.registry,
            matcher: &self.matcher,
            index: &self.index,
        }
    }

    /// One `route()` of one message.
    fn route_one(&self, message: &str, options: &Options) {
        black_box(route(
            self.inputs(),
            &self.activation,
            None,
            black_box(message),
            options,
        ));
    }

    /// One pass of `route()` over every message.
    fn route_pass(&self, options: &Options) {
        for m in &self.workload.messages {
            self.route_one(m, options);
        }
    }

    /// The median over messages of one message's route time (each the mean of `reps` runs).
    fn median_ns_per_message(&self, options: &Options, reps: u32) -> f64 {
        let mut times: Vec<f64> = self
            .workload
            .messages
            .iter()
            .map(|m| {
                let start = Instant::now();
                for _ in 0..reps {
                    self.route_one(m, options);
                }
                start.elapsed().as_nanos() as f64 / f64::from(reps)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }

    /// The median over messages of one message's route time with the caches emptied before
    /// each (8 MiB written), as in the daemon, where each answer's bytes (500 KB for a seal
    /// fallback) pass through the caches between two turns.
    fn cold_median_ns_per_message(&self, options: &Options) -> f64 {
        let source = vec![1u8; 8 << 20];
        let mut evict = vec![0u8; 8 << 20];
        let mut times = Vec::new();
        for _ in 0..2 {
            for m in &self.workload.messages {
                evict.copy_from_slice(&source);
                black_box(&mut evict);
                let start = Instant::now();
                self.route_one(m, options);
                times.push(start.elapsed().as_nanos() as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }

    /// One pass of the bare automaton scan over every message.
    fn scan_pass(&self) {
        for m in &self.workload.messages {
            black_box(scan(&self.matcher, black_box(m.as_str())));
        }
    }
}

fn workloads() -> Vec<Prepared> {
    let dir = toolrouter_bench::eval_dir();
    let mut out = vec![Prepared::new(workload::demo())];
    for (name, load) in [
        (
            "seal",
            workload::seal as fn(&std::path::Path) -> toolrouter::Result<Workload>,
        ),
        ("stb", workload::stb),
    ] {
        match load(&dir) {
            Ok(w) => out.push(Prepared::new(w)),
            Err(e) => eprintln!("note: skipping {name}: {e} (set TOOLROUTER_EVAL_DIR)"),
        }
    }
    out.extend([100, 1000, 10_000].map(|n| Prepared::new(workload::scale(n))));
    out
}

/// Median over `samples` of the time per message, each sample repeating full passes for
/// at least `min_sample` so short workloads are not timer noise.
fn median_ns_per_msg(samples: usize, min_sample: Duration, messages: usize, mut pass: impl FnMut()) -> f64 {
    pass(); // warm-up
    let mut per_msg: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            let mut passes = 0u32;
            while passes == 0 || start.elapsed() < min_sample {
                pass();
                passes += 1;
            }
            start.elapsed().as_nanos() as f64 / (f64::from(passes) * messages as f64)
        })
        .collect();
    per_msg.sort_by(f64::total_cmp);
    per_msg[per_msg.len() / 2]
}

/// True when criterion measures (`cargo bench`), not when it only tests (`cargo test
/// --benches`, `--test`), lists or profiles.
fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    has("--bench")
        && !has("--test")
        && !has("--list")
        && !args.iter().any(|a| a.starts_with("--profile-time"))
}

fn main() {
    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    // `route` is keyword routing (v1, `--search off`); `search` is the default, `augment`.
    let options = Options {
        search: SearchOptions {
            mode: SearchMode::Off,
            ..SearchOptions::default()
        },
        ..Options::default()
    };
    let with_search = Options::default();
    let prepared = workloads();

    for p in &prepared {
        let w = &p.workload;
        println!(
            "workload {}: {} domains, {} tools, {} keywords, {} messages",
            w.name,
            w.registry.domains().len(),
            w.registry.tool_count(),
            w.registry.keywords().count(),
            w.messages.len()
        );
    }

    // Which workloads the filter let run: criterion calls a closure only when its id
    // matches, so the summary below follows the same filter.
    let ran: Vec<Cell<bool>> = prepared.iter().map(|_| Cell::new(false)).collect();
    for (p, ran) in prepared.iter().zip(&ran) {
        let mut group = criterion.benchmark_group(p.workload.name.as_str());
        group.throughput(Throughput::Elements(p.workload.messages.len() as u64));
        group.bench_function("route", |b| {
            ran.set(true);
            b.iter(|| p.route_pass(&options));
        });
        group.bench_function("search", |b| {
            ran.set(true);
            b.iter(|| p.route_pass(&with_search));
        });
        group.bench_function("scan", |b| {
            ran.set(true);
            b.iter(|| p.scan_pass());
        });
        group.finish();
    }
    criterion.final_summary();

    if !measuring() {
        return;
    }
    println!();
    let mut route_ns = Vec::new();
    for (p, ran) in prepared.iter().zip(&ran) {
        if !ran.get() {
            continue;
        }
        let n = p.workload.messages.len();
        let min = Duration::from_millis(5);
        let route = median_ns_per_msg(15, min, n, || p.route_pass(&options));
        let scan = median_ns_per_msg(15, min, n, || p.scan_pass());
        println!(
            "route/scan {}: route {route:.0} ns/msg, scan {scan:.0} ns/msg, ratio {:.2}",
            p.workload.name,
            route / scan
        );
        let cold = p.cold_median_ns_per_message(&options);
        let automaton_kib = p.matcher.automaton().map_or(0, |a| a.memory_usage()) / 1024;
        println!(
            "cold route {}: median {cold:.0} ns per message with the caches emptied before each; automaton {automaton_kib} KiB",
            p.workload.name
        );
        let search = p.median_ns_per_message(&with_search, 5);
        println!(
            "search {}: median {:.1} us per message with search; index built in {:.1} ms",
            p.workload.name,
            search / 1000.0,
            p.index_build.as_secs_f64() * 1000.0
        );
        route_ns.push((p.workload.name.clone(), route));
    }
    let of = |name: &str| route_ns.iter().find(|(n, _)| n == name).map(|&(_, t)| t);
    if let (Some(small), Some(big)) = (of("scale-100"), of("scale-10000")) {
        println!("slope scale-10000/scale-100: {:.2}", big / small);
    }
}
