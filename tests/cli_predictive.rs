//! End-to-end tests of predictive mode through the CLI: `replay --policy predictive`
//! with each forecaster, `--compare`, the JSON fields every policy reports, options
//! that cannot apply, and a model file that is missing.

mod common;

use common::{bundled, fails, ok};

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("one JSON object")
}

const COMMON: [&str; 14] = [
    "policy",
    "forecaster",
    "peak_requested_bytes",
    "peak_reserved_bytes",
    "reserved_overhead",
    "mean_reserved_bytes",
    "device_allocs",
    "device_frees",
    "critical_path_device_calls",
    "critical_path_device_us",
    "mean_fragmentation",
    "max_fragmentation",
    "events",
    "events_per_sec",
];

/// Each policy of a `--compare memcast,predictive` object reports every `COMMON` metric.
fn assert_every_metric(c: &serde_json::Value) {
    for p in ["memcast", "predictive"] {
        for k in COMMON {
            assert!(c[p].get(k).is_some(), "{p}: missing {k}");
        }
    }
}

#[test]
fn compare_prints_one_object_keyed_by_policy_with_every_metric() {
    let t = bundled("bert_dynseq_b16_train");
    let c = json(&[
        "replay",
        &t,
        "--compare",
        "memcast,predictive",
        "--forecaster",
        "oracle",
        "--json",
    ]);
    assert_every_metric(&c);
    assert_eq!(c["predictive"]["forecaster"], "oracle");
    assert_eq!(c["memcast"]["forecaster"], "none");
    // The oracle's growth ahead of need takes requests off the device-call path, on a
    // dynamic trace after the first iteration too, at no cost in peak reserved bytes.
    let (m, p) = (&c["memcast"], &c["predictive"]);
    let after = |v: &serde_json::Value| {
        v["critical_path_device_calls_after_first_iteration"]
            .as_u64()
            .unwrap()
    };
    assert!(after(p) * 2 <= after(m), "{} vs {}", after(p), after(m));
    assert!(p["ahead_device_calls"].as_u64().unwrap() > 0);
    assert!(
        p["reserved_overhead"].as_f64().unwrap() <= m["reserved_overhead"].as_f64().unwrap() + 1e-9
    );
}

#[test]
fn every_forecaster_replays_and_a_budget_reports_the_tier_metrics() {
    let t = bundled("resnet50_multiscale_b32_train");
    for f in ["lstm", "seasonal", "oracle", "none"] {
        let r = json(&[
            "replay",
            &t,
            "--policy",
            "predictive",
            "--forecaster",
            f,
            "--json",
        ]);
        assert_eq!(r["forecaster"], f);
        assert_eq!(r["policy"], "predictive");
    }
    let c = json(&[
        "replay",
        &t,
        "--compare",
        "memcast,predictive",
        "--budget",
        "60%",
        "--json",
    ]);
    for p in ["memcast", "predictive"] {
        for k in COMMON.iter().chain(&[
            "completed",
            "ooms",
            "compute_us",
            "stall_us",
            "stall_overhead",
            "spilled_bytes",
            "prefetched_bytes",
            "recomputed_bytes",
            "prefetch_hits",
            "prefetch_misses",
            "prefetch_hit_rate",
            "link_floor_us",
            "peak_floor_us",
            "peak_floor_overhead",
            "planned_spills",
        ]) {
            assert!(c[p].get(k).is_some(), "{p} under a budget: missing {k}");
        }
        assert_eq!(c[p]["completed"], true);
    }
    assert_eq!(c["predictive"]["policy"], "predictive");
    assert_eq!(c["predictive"]["forecaster"], "lstm");
    assert_eq!(c["memcast"]["policy"], "reactive");
}

/// `--real-time` replays at the trace's own pace (the wall time covers the trace's
/// span) with the forecast thread in the loop, and reports what an as-fast-as-possible
/// replay reports.
#[test]
fn a_real_time_replay_takes_the_traces_span() {
    let t = bundled("bert_dynseq_b16_train");
    let span = json(&["trace", "stats", &t, "--json"])["duration_us"]
        .as_f64()
        .unwrap();
    let c = json(&[
        "replay",
        &t,
        "--compare",
        "memcast,predictive",
        "--real-time",
        "--json",
    ]);
    assert_every_metric(&c);
    for p in ["memcast", "predictive"] {
        let wall = c[p]["wall_secs"].as_f64().unwrap();
        assert!(wall * 1e6 >= span, "{p}: {wall} s for a span of {span} us");
    }
    assert_eq!(c["predictive"]["forecaster"], "lstm");
    // The forecaster ran on its own thread, as in a job (an ordinary replay: inline).
    assert_eq!(c["predictive"]["extra"]["config"]["forecast_thread"], true);
}

#[test]
fn options_that_cannot_apply_are_errors() {
    let t = bundled("resnet50_b64_train");
    for (args, says) in [
        (vec!["replay", &t, "--forecaster", "oracle"], "--forecaster"),
        (vec!["replay", &t, "--model", "m"], "--model"),
        (
            vec![
                "replay",
                &t,
                "--policy",
                "predictive",
                "--forecaster",
                "seasonal",
                "--model",
                "m",
            ],
            "lstm",
        ),
        (vec!["replay", &t, "--no-prefetch"], "--no-prefetch"),
        (vec!["replay", &t, "--no-arena"], "--no-arena"),
        (vec!["replay", &t, "--no-relocate"], "--no-relocate"),
        (vec!["replay", &t, "--no-step-plans"], "--no-step-plans"),
        (
            vec!["replay", &t, "--no-new-shape-plans"],
            "--no-new-shape-plans",
        ),
        (vec!["replay", &t, "--early-pageable"], "--early-pageable"),
        (
            vec!["replay", &t, "--spill-hysteresis"],
            "--spill-hysteresis",
        ),
        (vec!["replay", &t, "--pinned", "25%"], "--pinned"),
        (
            vec!["replay", &t, "--budget", "60%", "--pinned", "1.5"],
            "--pinned: pinned pool \"1.5\"",
        ),
        (
            vec![
                "replay", &t, "--budget", "60%", "--pinned", "1P", "--device", "host",
            ],
            "pinned staging pool of 1125899906842624 bytes (`staging_bytes`): host out of memory",
        ),
        (vec!["replay", &t, "--spread-waits"], "--spread-waits"),
        (
            vec!["replay", &t, "--watermarks", "0.9,0.8"],
            "--watermarks",
        ),
        (
            vec!["replay", &t, "--budget", "60%", "--watermarks", "0.8,0.9"],
            "--watermarks \"0.8,0.9\"",
        ),
        (
            vec!["replay", &t, "--budget", "60%", "--watermarks", "1.5,0.5"],
            "(0, 1]",
        ),
        (
            vec!["replay", &t, "--budget", "60%", "--watermarks", "0.9"],
            "HIGH,LOW",
        ),
        (vec!["replay", &t, "--policy", "reactive"], "--budget"),
        (
            vec![
                "replay",
                &t,
                "--compare",
                "memcast,reactive",
                "--budget",
                "60%",
            ],
            "under --budget are one replay",
        ),
        (
            vec!["replay", &t, "--budget", "60%", "--pinned", "150%"],
            "more than the peak is written in bytes",
        ),
        (
            vec!["replay", &t, "--conf", "predictive_actions:grow++spill"],
            "names an empty action",
        ),
        (
            vec!["replay", &t, "--conf", "growth_cap:,min_block:512"],
            "growth_cap: no value",
        ),
        (
            vec!["replay", &t, "--budget", "60%", "--real-time"],
            "--real-time",
        ),
        (
            vec!["replay", &t, "--policy", "pytorch", "--conf", "run_scan:4"],
            "--conf",
        ),
        (
            vec!["replay", &t, "--policy", "naive", "--budget", "60%"],
            "--budget",
        ),
        (
            vec![
                "replay",
                &t,
                "--policy",
                "predictive",
                "--conf",
                "predictive_actions:fly",
            ],
            "fly",
        ),
    ] {
        let e = fails(&args);
        assert!(e.contains(says), "{args:?}: {e}");
    }
}

#[test]
fn a_missing_model_is_an_error_naming_it() {
    let t = bundled("resnet50_b64_train");
    let e = fails(&[
        "replay",
        &t,
        "--policy",
        "predictive",
        "--model",
        "/nonexistent/model-dir",
    ]);
    assert!(e.contains("/nonexistent/model-dir"), "{e}");
}

/// The JSON of `memcast replay` of the bundled ResNet-50, reactive tiers at 60% of its
/// peak, with `extra` arguments.
fn resnet_reactive_60(extra: &[&str]) -> serde_json::Value {
    let t = bundled("resnet50_b64_train");
    let mut args = vec![
        "replay", &t, "--policy", "reactive", "--budget", "60%", "--json",
    ];
    args.extend_from_slice(extra);
    json(&args)
}

/// --watermarks sets when spilling starts: at 1,1 nothing spills ahead of an
/// out-of-memory, so the out-of-memory path spills more than with the defaults.
#[test]
fn watermarks_move_the_spills_to_the_out_of_memory_path() {
    let oom_spills = |extra: &[&str]| resnet_reactive_60(extra)["sync_spills"].as_u64().unwrap();
    let (default, late) = (oom_spills(&[]), oom_spills(&["--watermarks", "1,1"]));
    assert!(
        late > default,
        "default {default} spills on the OOM path, 1,1: {late}"
    );
}

/// Under a budget the allocator reserves the budget as one arena unless --no-arena:
/// then, under pressure, it frees and re-creates segments (many more device calls).
#[test]
fn no_arena_brings_back_the_segment_churn() {
    let calls = |extra: &[&str]| {
        let v = resnet_reactive_60(extra);
        v["device_allocs"].as_u64().unwrap() + v["device_frees"].as_u64().unwrap()
    };
    let (arena, churn) = (calls(&[]), calls(&["--no-arena"]));
    assert!(
        arena * 10 <= churn,
        "arena {arena} device calls, --no-arena {churn}"
    );
}

/// Relocation through the CLI: on ResNet-50 at 60% the out-of-memory path opens
/// windows by moving tensors on the device (the JSON counts them), and
/// `--no-relocate` turns it off.
#[test]
fn relocation_is_reported_and_can_be_turned_off() {
    let run = |extra: &[&str]| {
        let v = resnet_reactive_60(extra);
        (
            v["relocations"].as_u64().unwrap(),
            v["relocated_bytes"].as_u64().unwrap(),
        )
    };
    let (on, off) = (run(&[]), run(&["--no-relocate"]));
    assert!(on.0 > 0 && on.1 > 0, "relocations {on:?}");
    assert_eq!(off, (0, 0));
}

/// Spills that nothing waits for go only to the pinned pool: the held-out LoRA
/// Llama at 60%, whose reactive replay fills the pool, sends nothing through pageable
/// memory by default and gigabytes with `--early-pageable`, which stalls more; the
/// JSON and the text report say so.
#[test]
fn early_spills_stay_out_of_pageable_memory_unless_asked() {
    let t = common::repo()
        .join("training-data/corpus/test/llama_lora_b8_s1024_bf16.mctrace")
        .to_string_lossy()
        .into_owned();
    let run = |extra: &[&str]| {
        let mut args = vec!["replay", &t, "--budget", "60%", "--json"];
        args.extend_from_slice(extra);
        json(&args)
    };
    let (on, off) = (run(&[]), run(&["--early-pageable"]));
    let bytes = |v: &serde_json::Value| v["pageable_copied_bytes"].as_u64().unwrap();
    let stall = |v: &serde_json::Value| v["stall_overhead"].as_f64().unwrap();
    assert_eq!(bytes(&on), 0, "{on}");
    assert!(bytes(&off) > 1 << 30, "{off}");
    assert!(off["pageable_copy_us"].as_f64().unwrap() > 0.0);
    assert!(
        stall(&on) < stall(&off),
        "{} against {}",
        stall(&on),
        stall(&off)
    );
    let text = ok(&["replay", &t, "--budget", "60%", "--early-pageable"]);
    assert!(text.contains("pageable copies "), "{text}");
}

/// `--pinned` sizes the pinned pool: the bundled ResNet-50 at 60% sends nothing to
/// pageable memory with the default pool (its peak); with a quarter of it, spills that
/// nothing waits for find the pool full (counted and reported, not issued), the
/// out-of-memory path's go to pageable memory, and the accesses of tensors prefetched
/// from there count as misses.
#[test]
fn the_pinned_pool_is_sized_and_its_refusals_reported() {
    let t = bundled("resnet50_b64_train");
    let run = |extra: &[&str]| {
        let mut args = vec!["replay", &t, "--budget", "60%", "--json"];
        args.extend_from_slice(extra);
        json(&args)
    };
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let (full, quarter) = (run(&[]), run(&["--pinned", "25%"]));
    let peak = u(&full, "peak_requested_bytes");
    assert_eq!(u(&full, "staging_bytes"), peak);
    assert_eq!(u(&quarter, "staging_bytes"), peak / 4);
    assert_eq!(u(&full, "early_spills_refused"), 0, "{full}");
    assert_eq!(u(&full, "pageable_copied_bytes"), 0, "{full}");
    assert!(u(&quarter, "early_spills_refused") > 0, "{quarter}");
    assert!(u(&quarter, "pageable_copied_bytes") > 0, "{quarter}");
    let blocked = u(&quarter, "blocked_prefetches");
    assert!(blocked > 0, "{quarter}");
    assert_eq!(
        u(&quarter, "prefetch_misses"),
        u(&quarter, "faults") + u(&quarter, "late_prefetches") + blocked
    );
    assert_eq!(u(&run(&["--pinned", "1G"]), "staging_bytes"), 1 << 30);
    let text = ok(&["replay", &t, "--budget", "60%", "--pinned", "25%"]);
    assert!(text.contains("pinned pool full "), "{text}");
    assert!(text.contains("from pageable memory"), "{text}");
}

/// The plan guard through the CLI: on the synthetic MLP under 60% (a plan from the
/// last iteration stalls more than none), the text report says how many iterations ran
/// without a plan and the JSON counts them.
#[test]
fn the_plan_guard_is_reported() {
    let dir = common::scratch("plan-guard");
    let t = dir.path().join("mlp.mctrace");
    let t = t.to_str().unwrap();
    ok(&["trace", "gen", "--family", "mlp", "-o", t]);
    let args = [
        "replay",
        t,
        "--policy",
        "predictive",
        "--forecaster",
        "none",
        "--conf",
        "predictive_actions:plan",
        "--budget",
        "60%",
    ];
    let text = ok(&args);
    assert!(text.contains("plan guard "), "{text}");
    let mut with_json = args.to_vec();
    with_json.push("--json");
    assert!(json(&with_json)["planned_suppressed"].as_u64().unwrap() >= 4);
}

/// Predictive mode switched on by the settings is labelled predictive, with and
/// without a budget, and the settings' forecaster is the one that runs unless
/// `--forecaster` names another (with a warning); predictive-only keys given to a
/// replay that runs no predictive mode are named in a warning.
#[test]
fn settings_that_switch_predictive_mode_on_are_labelled_and_their_forecaster_runs() {
    let t = bundled("resnet50_multiscale_b32_train");
    for extra in [&[][..], &["--budget", "60%"][..]] {
        let mut args = vec!["replay", &t, "--conf", "predictive:true", "--json"];
        args.extend_from_slice(extra);
        let r = json(&args);
        assert_eq!(r["policy"], "predictive", "{extra:?}");
        assert_eq!(r["forecaster"], "lstm", "{extra:?}");
        let mut args = vec![
            "replay",
            &t,
            "--policy",
            "predictive",
            "--conf",
            "forecaster:seasonal",
            "--json",
        ];
        args.extend_from_slice(extra);
        assert_eq!(json(&args)["forecaster"], "seasonal", "{extra:?}");
    }
    let out = common::memcast(&[
        "replay",
        &t,
        "--policy",
        "predictive",
        "--forecaster",
        "oracle",
        "--conf",
        "forecaster:seasonal",
        "--json",
    ]);
    assert!(out.status.success());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["forecaster"], "oracle");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--forecaster oracle overrides forecaster:seasonal"),
        "{err}"
    );
    let out = common::memcast(&["replay", &t, "--conf", "model:/nowhere,horizon:5"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--conf sets model, horizon of predictive mode, which this replay does not run"
        ),
        "{err}"
    );
    // A 32-bit setting given more than it holds is an error naming it.
    let e = fails(&["replay", &t, "--conf", "predictive:true,horizon:4294967301"]);
    assert!(
        e.contains("horizon: 4294967301 is above the most it takes"),
        "{e}"
    );
}

/// `memcast replay TRACE --policy predictive --budget 60% --json` with `extra`.
fn predictive_60(t: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "replay",
        t,
        "--policy",
        "predictive",
        "--budget",
        "60%",
        "--json",
    ];
    args.extend_from_slice(extra);
    json(&args)
}

/// Step plans through the CLI: on GPT-2 medium generation at 60% the predictive
/// tiers plan the token steps past the end of an iteration plan (the JSON counts
/// them) and their prefetches hit more often; `--no-step-plans` turns them off.
#[test]
fn step_plans_are_reported_and_can_be_turned_off() {
    let t = common::repo()
        .join("training-data/corpus/train/gpt2_medium_generate_dynamic.mctrace")
        .to_string_lossy()
        .into_owned();
    let (on, off) = (
        predictive_60(&t, &[]),
        predictive_60(&t, &["--no-step-plans"]),
    );
    let plans = |v: &serde_json::Value| v["planned_step_plans"].as_u64().unwrap();
    let hits = |v: &serde_json::Value| v["prefetch_hit_rate"].as_f64().unwrap();
    assert!(plans(&on) > 0, "{on}");
    assert_eq!(plans(&off), 0, "{off}");
    assert!(
        hits(&on) > hits(&off),
        "hit rate {} against {}",
        hits(&on),
        hits(&off)
    );
}

/// Plans for a new shape through the CLI: on GPT-2 with a batch drawn per iteration,
/// at 60%, an iteration of a batch not seen before is re-planned from an earlier one
/// with its bytes mapped (the JSON counts these plans), which lowers the stall;
/// `--no-new-shape-plans` turns them off.
#[test]
fn new_shape_plans_are_reported_and_can_be_turned_off() {
    let t = bundled("gpt2_dynbatch_s512_train_bf16");
    let (on, off) = (
        predictive_60(&t, &[]),
        predictive_60(&t, &["--no-new-shape-plans"]),
    );
    let plans = |v: &serde_json::Value| v["planned_new_shape_plans"].as_u64().unwrap();
    let stall = |v: &serde_json::Value| v["stall_overhead"].as_f64().unwrap();
    assert!(plans(&on) > 0, "{on}");
    assert_eq!(plans(&off), 0, "{off}");
    assert!(
        stall(&on) < stall(&off),
        "stall {} against {}",
        stall(&on),
        stall(&off)
    );
}
