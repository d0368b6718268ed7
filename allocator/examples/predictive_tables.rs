//! The tables of docs/predictive.md: every bundled real trace and the three synthetic
//! family presets (8 iterations, seed 0), replayed on the simulated H200 through
//! memcast reactive and in predictive mode with each forecaster; without a budget,
//! under a budget, and the ablation of the actions; `recompute`: the synthetic presets
//! (the traces with producers and recompute costs) with and without recomputation,
//! after the synthetic BERT and MobileNet presets the default was chosen on;
//! `presplit`: the default actions with and without `presplit`, by forecaster.
//!
//! `cargo run --release -p memcast-alloc --example predictive_tables [nobudget|budget|ablation|recompute|presplit] [BUDGET] [occupancy] [nodefer] [byaddr|noaddr]`
//! (`BUDGET`: a share of each trace's peak, default `60%`; `occupancy`: the `budget`
//! table with plans that model the link's occupancy, `TierConfig::plan_occupancy`;
//! `nodefer`: plans bring wrapped moves back within their iteration,
//! `TierConfig::plan_defer_wraps` off; `byaddr` / `noaddr`: `TierConfig::oom_by_address`
//! on / off).

use memcast_alloc::config::Actions;
use memcast_alloc::replay::{replay, Policy, ReplayForecaster, ReplayOptions};

#[path = "shared/no_budget.rs"]
mod shared;
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions, TierReport};
use memcast_trace::synth::{generate, Family, SynthConfig};
use memcast_trace::Trace;
use shared::no_budget;

const FORECASTERS: [ReplayForecaster; 4] = [
    ReplayForecaster::Oracle,
    ReplayForecaster::Lstm,
    ReplayForecaster::Seasonal,
    ReplayForecaster::None,
];

fn traces() -> Result<Vec<Trace>, Box<dyn std::error::Error>> {
    let mut v = Vec::new();
    for b in memcast_trace::bundled::ALL {
        v.push(b.load()?);
    }
    for (fam, name) in [
        (Family::Mlp, "synth mlp"),
        (Family::Cnn, "synth cnn (ResNet-50)"),
        (Family::Transformer, "synth transformer (GPT-2)"),
    ] {
        let mut t = generate(&SynthConfig::preset(fam))?;
        t.meta.name = name.into();
        v.push(t);
    }
    Ok(v)
}

fn budgeted(
    t: &Trace,
    budget: Budget,
    p: Option<(ReplayForecaster, Actions)>,
) -> Result<TierReport, Box<dyn std::error::Error>> {
    let mut opts = TierReplayOptions {
        budget,
        predictive: p,
        ..Default::default()
    };
    let flag = |f: &str| std::env::args().skip(3).any(|a| a == f);
    opts.tier.plan_occupancy = flag("occupancy");
    opts.tier.plan_defer_wraps = !flag("nodefer");
    if flag("byaddr") || flag("noaddr") {
        opts.tier.oom_by_address = flag("byaddr");
    }
    Ok(replay_budgeted(t, &opts)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "nobudget".into());
    let budget: Budget = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "60%".into())
        .parse()?;
    let traces = traces()?;
    match what.as_str() {
        "nobudget" => {
            println!("| trace | policy | overhead | mean reserved | device calls in requests (after iteration 1) | ahead | mean frag. | device ms in requests |");
            println!("|---|---|---:|---:|---:|---:|---:|---:|");
            for t in &traces {
                let rows = std::iter::once(None).chain(FORECASTERS.map(Some));
                for f in rows {
                    let r = no_budget(t, f)?;
                    println!(
                        "| {} | {} | {:.2}% | {:.3} GB | {} ({}) | {} | {:.3} | {:.1} |",
                        t.meta.name,
                        f.map_or("reactive".to_string(), |f| format!(
                            "predictive, {}",
                            f.name()
                        )),
                        100.0 * r.reserved_overhead,
                        r.mean_reserved_bytes / 1e9,
                        r.critical_path_device_calls,
                        r.critical_path_device_calls_after_first_iteration,
                        r.ahead_device_calls,
                        r.mean_fragmentation,
                        r.critical_path_device_us / 1e3,
                    );
                }
            }
        }
        "budget" => {
            println!("| trace | policy | completed | stall overhead | peak floor | link-bound floor | spilled | prefetched | hit rate | ahead batches |");
            println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
            let plan = Actions {
                plan: true,
                ..Actions::none()
            };
            for t in &traces {
                let rows = std::iter::once((None, "reactive".to_string()))
                    .chain(FORECASTERS.map(|f| {
                        (
                            Some((f, Actions::default())),
                            format!("predictive, {}", f.name()),
                        )
                    }))
                    .chain([
                        (
                            Some((ReplayForecaster::Oracle, plan)),
                            "plan, oracle".to_string(),
                        ),
                        (
                            Some((ReplayForecaster::None, plan)),
                            "plan, same shape".to_string(),
                        ),
                    ]);
                for (p, label) in rows {
                    let r = budgeted(t, budget, p)?;
                    println!(
                        "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} GB | {:.1} GB | {:.2} | {} |",
                        t.meta.name,
                        label,
                        r.completed,
                        r.stall_overhead,
                        r.peak_floor_overhead,
                        r.link_floor_overhead,
                        r.spilled_bytes as f64 / 1e9,
                        r.prefetched_bytes as f64 / 1e9,
                        r.prefetch_hit_rate,
                        r.ahead_spills,
                    );
                }
            }
        }
        "ablation" => {
            // Without a budget the actions are grow and release; under one, spill and
            // prefetch. Each alone, then all, with the lstm and the oracle.
            let sets: [(&str, Actions); 9] = [
                ("none", Actions::none()),
                (
                    "grow",
                    Actions {
                        grow: true,
                        ..Actions::none()
                    },
                ),
                (
                    "presplit",
                    Actions {
                        presplit: true,
                        ..Actions::none()
                    },
                ),
                (
                    "release",
                    Actions {
                        release: true,
                        ..Actions::none()
                    },
                ),
                (
                    "spill",
                    Actions {
                        spill: true,
                        ..Actions::none()
                    },
                ),
                (
                    "prefetch",
                    Actions {
                        prefetch: true,
                        ..Actions::none()
                    },
                ),
                (
                    "plan",
                    Actions {
                        plan: true,
                        ..Actions::none()
                    },
                ),
                (
                    "recompute",
                    Actions {
                        recompute: true,
                        ..Actions::none()
                    },
                ),
                ("all", Actions::all()),
            ];
            println!("| trace | actions | forecaster | overhead | mean reserved | calls in requests after it. 1 | stall overhead at the budget |");
            println!("|---|---|---|---:|---:|---:|---:|");
            for t in &traces {
                for (name, a) in sets {
                    for f in [ReplayForecaster::Lstm, ReplayForecaster::Oracle] {
                        let cfg = memcast_alloc::AllocConfig {
                            predictive_actions: a,
                            ..Default::default()
                        };
                        let r = replay(
                            t,
                            &ReplayOptions {
                                policy: Policy::Predictive,
                                forecaster: f,
                                config: cfg,
                                ..Default::default()
                            },
                        )?;
                        let b = budgeted(t, budget, Some((f, a)))?;
                        println!(
                            "| {} | {} | {} | {:.2}% | {:.3} GB | {} | {:.2} |",
                            t.meta.name,
                            name,
                            f.name(),
                            100.0 * r.reserved_overhead,
                            r.mean_reserved_bytes / 1e9,
                            r.critical_path_device_calls_after_first_iteration,
                            b.stall_overhead,
                        );
                    }
                }
            }
        }
        "recompute" => recompute_table(budget)?,
        "presplit" => {
            println!("| trace | actions, forecaster | overhead | mean reserved | device calls in requests (after iteration 1) | mean frag. | events/s |");
            println!("|---|---|---:|---:|---:|---:|---:|");
            let presplit = Actions {
                presplit: true,
                ..Actions::default()
            };
            for t in &traces {
                for (label, a, f) in [
                    ("default, lstm", Actions::default(), ReplayForecaster::Lstm),
                    (
                        "default, oracle",
                        Actions::default(),
                        ReplayForecaster::Oracle,
                    ),
                    ("+presplit, lstm", presplit, ReplayForecaster::Lstm),
                    ("+presplit, seasonal", presplit, ReplayForecaster::Seasonal),
                    ("+presplit, oracle", presplit, ReplayForecaster::Oracle),
                ] {
                    let r = replay(
                        t,
                        &ReplayOptions {
                            policy: Policy::Predictive,
                            forecaster: f,
                            config: memcast_alloc::AllocConfig {
                                predictive_actions: a,
                                ..Default::default()
                            },
                            ..Default::default()
                        },
                    )?;
                    println!(
                        "| {} | {} | {:.2}% | {:.3} GB | {} ({}) | {:.3} | {:.1} M |",
                        t.meta.name,
                        label,
                        100.0 * r.reserved_overhead,
                        r.mean_reserved_bytes / 1e9,
                        r.critical_path_device_calls,
                        r.critical_path_device_calls_after_first_iteration,
                        r.mean_fragmentation,
                        r.events_per_sec / 1e6,
                    );
                }
            }
        }
        other => {
            return Err(format!(
                "unknown table {other:?} (nobudget, budget, ablation, recompute, presplit)"
            )
            .into())
        }
    }
    Ok(())
}

/// Reactive and predictive tiers with and without recomputation, on the synthetic
/// presets: first those the default was chosen on (BERT, MobileNet), then the three
/// the other tables report.
fn recompute_table(budget: Budget) -> Result<(), Box<dyn std::error::Error>> {
    let with = |a: Actions| Actions {
        recompute: true,
        ..a
    };
    let plan = Actions {
        plan: true,
        ..Actions::none()
    };
    let recompute = with(Actions::none());
    // (label, recompute on reactive tiers, predictive tiers)
    type Row = (&'static str, bool, Option<(ReplayForecaster, Actions)>);
    let rows: [Row; 8] = [
        ("reactive", false, None),
        ("reactive + recompute", true, None),
        (
            "predictive (default less recompute), lstm",
            false,
            Some((
                ReplayForecaster::Lstm,
                Actions {
                    recompute: false,
                    ..Actions::default()
                },
            )),
        ),
        (
            "predictive (default, with recompute), lstm",
            false,
            Some((ReplayForecaster::Lstm, Actions::default())),
        ),
        (
            "recompute alone, lstm",
            false,
            Some((ReplayForecaster::Lstm, recompute)),
        ),
        (
            "plan alone, same shape",
            false,
            Some((ReplayForecaster::None, plan)),
        ),
        (
            "plan + recompute, same shape",
            false,
            Some((ReplayForecaster::None, with(plan))),
        ),
        (
            "plan + recompute, oracle",
            false,
            Some((ReplayForecaster::Oracle, with(plan))),
        ),
    ];
    let sets = [
        (
            "chosen on",
            [
                (Family::Bert, "synth bert"),
                (Family::MobileNet, "synth mobilenet"),
            ]
            .as_slice(),
        ),
        (
            "reported",
            [
                (Family::Mlp, "synth mlp"),
                (Family::Cnn, "synth cnn (ResNet-50)"),
                (Family::Transformer, "synth transformer (GPT-2)"),
            ]
            .as_slice(),
        ),
    ];
    for (what, fams) in sets {
        println!("\n{what}:\n");
        println!("| trace | tiers | completed | stall overhead | peak floor | recompute share | drops (planned) | recomputes | recomputed | spilled |");
        println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
        let mut logs = vec![0.0f64; rows.len()];
        for &(fam, name) in fams {
            let mut t = generate(&SynthConfig::preset(fam))?;
            t.meta.name = name.into();
            for (i, &(label, reactive_recompute, p)) in rows.iter().enumerate() {
                let mut opts = TierReplayOptions {
                    budget,
                    predictive: p,
                    ..Default::default()
                };
                opts.tier.recompute = reactive_recompute;
                let flag = |f: &str| std::env::args().skip(3).any(|a| a == f);
                if flag("byaddr") || flag("noaddr") {
                    opts.tier.oom_by_address = flag("byaddr");
                }
                let r = replay_budgeted(&t, &opts)?;
                logs[i] += r.stall_overhead.max(1e-9).ln();
                println!(
                    "| {} | {} | {} | {:.2} | {:.2} | {:.3} | {} ({}) | {} | {:.2} GB | {:.1} GB |",
                    name,
                    label,
                    r.completed,
                    r.stall_overhead,
                    r.peak_floor_overhead,
                    if r.compute_us > 0.0 {
                        r.recompute_us / r.compute_us
                    } else {
                        0.0
                    },
                    r.drops,
                    r.planned_drops,
                    r.recomputes,
                    r.recomputed_bytes as f64 / 1e9,
                    r.spilled_bytes as f64 / 1e9,
                );
            }
        }
        let n = fams.len() as f64;
        println!();
        for (i, (label, _, _)) in rows.iter().enumerate() {
            println!(
                "- {what}, geometric mean stall overhead, {label}: {:.3}",
                (logs[i] / n).exp()
            );
        }
    }
    Ok(())
}
