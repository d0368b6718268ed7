//! How much memcast's own replay depends on the order of a trace's static blocks (for an
//! imported snapshot, PyTorch's final layout): each corpus trace of a split replayed with
//! its static blocks in the trace's order and in `StaticOrder::SizeDesc`.
//!
//! cargo run --release -p memcast-alloc --example static_order -- training-data/corpus/manifest.tsv test
use memcast_alloc::replay::warmup::{creation_order, StaticOrder};
use memcast_alloc::replay::{replay, ReplayForecaster, ReplayOptions};
use memcast_trace::corpus::{Corpus, Split};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let corpus = Corpus::load(args[1].as_ref()).unwrap();
    let split: Split = args[2].parse().unwrap();
    println!("| trace | memcast overhead, trace order | size-desc order |");
    println!("|---|---|---|");
    for e in corpus.split(split) {
        let t = memcast_trace::io::load_trace(&e.path).unwrap();
        let mut sorted = t.clone();
        sorted.static_blocks = creation_order(&t, StaticOrder::SizeDesc)
            .into_iter()
            .map(|i| t.static_blocks[i])
            .collect();
        let o = ReplayOptions {
            forecaster: ReplayForecaster::None,
            ..Default::default()
        };
        let a = replay(&t, &o).unwrap().reserved_overhead;
        let b = replay(&sorted, &o).unwrap().reserved_overhead;
        println!("| {} | {:.2}% | {:.2}% |", e.workload, 100.0 * a, 100.0 * b);
    }
}
