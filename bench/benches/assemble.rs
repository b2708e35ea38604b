//! Answer assembly against one copy of its bytes (SPEC §9: answers are assembled from
//! pre-rendered bytes). For each workload, the largest answer (every domain, the fallback of
//! a registry whose every domain is active) in the OpenAI chat format:
//!
//! - `assemble`: `render::assemble` over the meta-tools and one span per domain, what the
//!   service does per `Route`;
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
use toolrouter::render::{Format, Renders, assemble};
use toolrouter::router::Activation;
use toolrouter_bench::workload::{self, Workload};

struct Prepared {
    name: String,
    renders: Renders,
    meta: toolrouter::render::Rendered,
    workload: Workload,
}

impl Prepared {
    fn new(workload: Workload) -> Prepared {
        let renders = Renders::new(&workload.registry);
        let activation = Activation::new(&workload.registry, &workload.settings);
        let meta = toolrouter::render::Rendered::new(activation.meta_tools(), Format::OpenAiChat);
        Prepared {
            name: workload.name.clone(),
            renders,
            meta,
            workload,
        }
    }

    /// The fallback answer's pieces: meta-tools, then every domain.
    fn pieces(&self) -> Vec<&[u8]> {
        let r = self.renders.get(&self.workload.registry, Format::OpenAiChat);
        let mut pieces = vec![self.meta.all()];
        pieces.extend(
            self.workload
                .registry
                .domain_ids()
                .map(|d| r.span(self.workload.registry.tool_range(d))),
        );
        pieces
    }
}

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
        let pieces = p.pieces();
        let flat: Vec<u8> = pieces.concat();
        let mut group = c.benchmark_group(format!("assemble/{}", p.name));
        group.throughput(Throughput::Bytes(flat.len() as u64));
        group.bench_function("assemble", |b| b.iter(|| black_box(assemble(black_box(&pieces)))));
        group.bench_function("copy", |b| b.iter(|| black_box(black_box(&flat).to_vec())));
        group.finish();
    }
    c.final_summary();
    for p in &prepared {
        let pieces = p.pieces();
        let flat: Vec<u8> = pieces.concat();
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
            black_box(assemble(black_box(&pieces)));
        });
        let copy = time(&|| {
            black_box(black_box(&flat).to_vec());
        });
        println!(
            "{}: {} bytes in {} pieces: assemble {a:.1} µs, one copy {copy:.1} µs, ratio {:.2}",
            p.name,
            flat.len() + 1,
            pieces.len(),
            a / copy
        );
    }
}
