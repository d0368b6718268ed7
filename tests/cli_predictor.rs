//! End-to-end tests of the predictor commands: train, eval, export, predict, and their
//! errors on bad input.

mod common;

use common::{bundled, fails, ok, tmp};

#[test]
fn eval_json_compares_the_lstm_with_every_baseline() {
    let out = ok(&[
        "eval",
        "--trace",
        &bundled("gpt2_dynbatch_s512_train_bf16"),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["horizon"], 5);
    for m in ["lstm", "last_value", "moving_average", "seasonal_naive"] {
        for k in ["wape", "mae", "under_rate"] {
            assert!(v["models"][m][k].is_number(), "{m}.{k} in {v}");
        }
    }
}

#[test]
fn train_export_and_eval_a_small_model() {
    let dir = tmp("model");
    ok(&[
        "train",
        "--traces",
        &bundled("resnet50_multiscale_b32_train"),
        &bundled("bert_dynseq_b16_train"),
        "--epochs",
        "2",
        "--hidden",
        "8",
        "-o",
        dir.to_str().unwrap(),
    ]);
    for f in ["config.json", "model.safetensors", "metrics.json"] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    let st = tmp("m.safetensors");
    ok(&[
        "export",
        "--model",
        dir.to_str().unwrap(),
        "--format",
        "safetensors",
        "-o",
        st.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&st).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert!(
        header
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("lstm.0.")),
        "{header}"
    );
    ok(&[
        "eval",
        "--model",
        dir.to_str().unwrap(),
        "--trace",
        &bundled("resnet50_b64_train"),
    ]);
}

#[test]
fn bad_models_and_backends_are_clear_errors() {
    let bad = tmp("bad-model");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("config.json"), "{not json").unwrap();
    std::fs::write(bad.join("model.safetensors"), b"garbage").unwrap();
    let e = fails(&[
        "eval",
        "--model",
        bad.to_str().unwrap(),
        "--trace",
        &bundled("resnet50_b64_train"),
    ]);
    assert!(e.contains("bad-model"), "{e}");
    // This machine (and CI) has no GPU: either the feature is missing or the driver is.
    let e = fails(&[
        "train",
        "--traces",
        &bundled("resnet50_b64_train"),
        "--backend",
        "cuda",
        "-o",
        tmp("x").to_str().unwrap(),
    ]);
    assert!(e.contains("CUDA") || e.contains("cuda"), "{e}");
}

/// A trace too short for any forecast to be scored is an error saying so (it printed a
/// WAPE of 0 for every model and a ratio of NaN, and exited 0).
#[test]
fn eval_of_a_trace_with_nothing_to_score_is_an_error() {
    let d = common::scratch("short");
    let t = d.path().join("short.json");
    common::one_tensor_trace(&t, 2);
    let e = fails(&["eval", "--trace", &t.display().to_string()]);
    assert!(e.contains("nothing to score"), "{e}");
}
