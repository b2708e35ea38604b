//! Answer assembly against one copy of its bytes (SPEC §9: answers are assembled from
//! pre-rendered bytes). For each workload, the largest answer (every domain, the fallback of
//! a registry whose every domain is active), in the OpenAI chat format and native:
//!
//! - `assemble`: what the service does per `Route`: the pieces (meta-tools, one span per
//!   domain), then the `RouteResponse` encoded from them into a buffer of its length
//!   ([`toolrouter::wire::Spliced`], as the gRPC encoder does);
//! - `copy`: one `to_vec` of a buffer of the same length, the floor.
//!
//! After criterion, a plain timing loop prints both medians and their ratio (target ≤ 1.5).
//!
//! ```text
//! cargo bench -p toolrouter-bench --bench assemble
//! ```

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use prost::Message as _;
use toolrouter::proto;
use toolrouter::render::{Format, LazyRenders, Renders};
use toolrouter::router::Activation;
use toolrouter::wire::{ROUTE_TOOLS_JSON, RouteResponse, Spliced};
use toolrouter_bench::workload::{self, Workload};

struct Prepared {
    name: String,
    renders: Renders,
    /// The meta-tools, rendered and encoded on first use, as a view keeps them.
    meta: LazyRenders,
    activation: Activation,
    workload: Workload,
}

impl Prepared {
    fn new(workload: Workload) -> Prepared {
        let renders = Renders::new(&workload.registry);
        let activation = Activation::new(&workload.registry, &workload.settings);
        Prepared {
            name: workload.name.clone(),
            renders,
            meta: LazyRenders::default(),
            activation,
            workload,
        }
    }

    /// The fallback answer, as the service builds it: meta-tools, then every domain.
    fn answer(&self, format: Option<Format>) -> RouteResponse {
        let registry = &self.workload.registry;
        let mut pieces = Vec::with_capacity(registry.domains().len() + 1);
        let message = proto::RouteResponse::default();
        let meta_tools = || self.activation.meta_tools().collect();
        match format {
            Some(f) => {
                let r = self.renders.get(registry, f);
                pieces.push(self.meta.get(f, meta_tools).all());
                pieces.extend(registry.domain_ids().map(|d| r.span(registry.tool_range(d))));
                Spliced::new(message).with_array(ROUTE_TOOLS_JSON, pieces)
            }
            None => {
                let e = self.renders.native(registry);
                pieces.push(self.meta.native(meta_tools));
                pieces.extend(registry.domain_ids().map(|d| e.span(registry.tool_range(d))));
                Spliced::new(message).with_entries(pieces)
            }
        }
    }
}

/// Builds the answer and encodes it into a buffer of its length.
fn encode(p: &Prepared, format: Option<Format>) -> Vec<u8> {
    let answer = p.answer(format);
    let mut buf = Vec::with_capacity(answer.encoded_len());
    answer.encode_raw(&mut buf);
    buf
}

const FORMATS: [(&str, Option<Format>); 2] = [("openai_chat", Some(Format::OpenAiChat)), ("native", None)];

fn workloads() -> Vec<Prepared> {
    let dir = toolrouter_bench::eval_dir();
    let mut out = vec![Prepared::new(workload::demo())];
    match workload::seal(&dir) {
        Ok(w) => out.push(Prepared::new(w)),
        Err(e) => eprintln!("seal skipped: {e}"),
    }
    out
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let prepared = workloads();
    let mut c = Criterion::default().configure_from_args();
    for p in &prepared {
        for (name, format) in FORMATS {
            let flat = encode(p, format);
            let mut group = c.benchmark_group(format!("assemble/{}/{name}", p.name));
            group.throughput(Throughput::Bytes(flat.len() as u64));
            group.bench_function("assemble", |b| b.iter(|| black_box(encode(black_box(p), format))));
            group.bench_function("copy", |b| b.iter(|| black_box(black_box(&flat).to_vec())));
            group.finish();
        }
    }
    c.final_summary();
    for p in &prepared {
        for (name, format) in FORMATS {
            report(p, name, format);
        }
    }
}

/// Prints the medians of the answer's assembly and of one copy of its bytes, and their ratio.
fn report(p: &Prepared, name: &str, format: Option<Format>) {
    let flat = encode(p, format);
    let time = |f: &dyn Fn()| {
        let runs: Vec<f64> = (0..201)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        median(runs)
    };
    let a = time(&|| {
        black_box(encode(black_box(p), format));
    });
    let copy = time(&|| {
        black_box(black_box(&flat).to_vec());
    });
    println!(
        "{} {name}: {} bytes: assemble {a:.1} µs, one copy {copy:.1} µs, ratio {:.2}",
        p.name,
        flat.len(),
        a / copy
    );
}
