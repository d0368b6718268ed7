//! Where `-o` writes: a symlink's target (the link stays), a FIFO or a device in place
//! (never replaced by a regular file), a regular file through a temporary file and a
//! rename, nothing in /dev, and nothing outside the named output touched. Everything is
//! made in a scratch directory, except `/dev/full`, which is only ever opened for writing
//! in place (the write fails with ENOSPC; nothing can replace it).

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use common::*;

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn is_native(p: &Path) -> bool {
    std::fs::read(p).unwrap().starts_with(b"MEMCAST\0")
}

#[test]
fn a_symlink_is_followed_and_stays_a_link() {
    let d = scratch("symlink");
    let target = d.path().join("target.mctrace");
    std::fs::write(&target, b"old").unwrap();
    let link = d.path().join("link.mctrace");
    std::os::unix::fs::symlink("target.mctrace", &link).unwrap();
    let t = bundled("resnet50_b64_train");
    ok(&["trace", "import", &t, "-o", &s(&link)]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(is_native(&target), "the link's target was written");
    // A dangling link: its target is created, the link kept.
    let dangling = d.path().join("dangling.mctrace");
    std::os::unix::fs::symlink("new.mctrace", &dangling).unwrap();
    ok(&["trace", "import", &t, "-o", &s(&dangling)]);
    assert!(std::fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(is_native(&d.path().join("new.mctrace")));
    let names: Vec<_> = listing(d.path()).into_iter().map(|e| e.0).collect();
    assert_eq!(names.len(), 4, "no temporary file left: {names:?}");
}

#[test]
fn a_fifo_is_written_in_place() {
    let d = scratch("fifo");
    let fifo = d.path().join("out.fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // The read end, opened without blocking before memcast runs: memcast's open for
    // writing finds a reader, the 9 KB trace fits the pipe's buffer, and a memcast that
    // replaced the FIFO instead leaves this end empty (a failure, not a hang).
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let t = bundled("resnet50_b64_train");
    ok(&["trace", "import", &t, "-o", &s(&fifo)]);
    let mut got = Vec::new();
    let _ = reader.read_to_end(&mut got);
    assert!(got.starts_with(b"MEMCAST\0"), "{} bytes read", got.len());
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(listing(d.path()).len(), 1, "nothing else created");
}

#[test]
fn dev_full_is_written_in_place_and_fails_cleanly() {
    let before = std::fs::metadata("/dev/full").unwrap();
    assert!(before.file_type().is_char_device());
    let t = bundled("resnet50_b64_train");
    let m = measured(&["trace", "import", &t, "-o", "/dev/full"], &[], false);
    m.clean_failure("-o /dev/full", &["/dev/full", "No space left on device"]);
    let after = std::fs::metadata("/dev/full").unwrap();
    assert!(
        after.file_type().is_char_device(),
        "/dev/full is still the device"
    );
    // A new file in /dev is refused before anything is drawn or written.
    let name = format!("/dev/memcast-test-{}.png", std::process::id());
    let m = measured(&["trace", "plot", &t, "-o", &name], &[], false);
    let created = Path::new(&name).exists();
    if created {
        std::fs::remove_file(&name).unwrap();
    }
    m.clean_failure(
        "-o /dev/new.png",
        &["refusing to create a new file in /dev"],
    );
    assert!(!created, "{name} was created");
}

/// A file whose folder takes no new file (`/proc/self`): the error names the temporary
/// file that could not be made, not a bare "No such file or directory".
#[test]
fn a_file_in_a_folder_that_takes_no_new_file_names_the_temporary_file() {
    let t = bundled("resnet50_b64_train");
    let m = measured(
        &["trace", "features", &t, "-o", "/proc/self/status"],
        &[],
        false,
    );
    m.clean_failure(
        "-o /proc/self/status",
        &[
            "/proc/self/status",
            "cannot create the temporary file /proc/self/.status.tmp",
        ],
    );
    // Found before the input is read: a missing input is not what the error names.
    let m = measured(
        &[
            "trace",
            "import",
            "no-such.pickle",
            "-o",
            "/proc/self/status",
        ],
        &[],
        false,
    );
    m.clean_failure(
        "-o /proc/self/status, missing input",
        &["cannot create the temporary file"],
    );
    assert!(!m.stderr.contains("no-such.pickle"), "{}", m.stderr);
}

#[test]
fn a_regular_file_is_replaced_whole_and_a_folder_is_refused() {
    let d = scratch("regular");
    let t = bundled("resnet50_b64_train");
    let out = d.path().join("t.mctrace");
    std::fs::write(&out, b"old").unwrap();
    ok(&["trace", "import", &t, "-o", &s(&out)]);
    assert!(is_native(&out));
    let before = listing(d.path());
    let m = measured(&["trace", "import", &t, "-o", &s(d.path())], &[], false);
    m.clean_failure("-o a folder", &["is a directory"]);
    let missing = d.path().join("no/such/folder/x.csv");
    let m = measured(&["trace", "features", &t, "-o", &s(&missing)], &[], false);
    m.clean_failure("-o in a missing folder", &["does not exist"]);
    assert_eq!(listing(d.path()), before, "nothing touched");
}

#[test]
fn every_output_option_writes_the_named_file_only() {
    let d = scratch("outputs");
    let t = bundled("bert_dynseq_b16_train");
    let p = |n: &str| d.path().join(n);
    ok(&[
        "train",
        "--traces",
        &t,
        "--epochs",
        "1",
        "--max-windows-per-trace",
        "2",
        "-o",
        &s(&p("model")),
    ]);
    let before = listing(d.path());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["trace".into(), "import".into(), t.clone()],
            "a.mctrace",
        ),
        (vec!["trace".into(), "features".into(), t.clone()], "b.csv"),
        (
            vec![
                "trace".into(),
                "export".into(),
                t.clone(),
                "--format".into(),
                "csv".into(),
            ],
            "c.txt",
        ),
        (vec!["trace".into(), "plot".into(), t.clone()], "d.png"),
        (
            vec![
                "trace".into(),
                "gen".into(),
                "--family".into(),
                "mlp".into(),
                "--iterations".into(),
                "2".into(),
            ],
            "e.mctrace",
        ),
        (
            vec![
                "export".into(),
                "--model".into(),
                s(&p("model")),
                "--format".into(),
                "burn".into(),
            ],
            "out.bin",
        ),
        (
            vec![
                "export".into(),
                "--model".into(),
                s(&p("model")),
                "--format".into(),
                "safetensors".into(),
            ],
            "w.st",
        ),
    ];
    let mut expect = before.iter().map(|e| e.0.clone()).collect::<Vec<_>>();
    for (args, name) in &cases {
        let o = s(&p(name));
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["-o", &o]);
        ok(&a);
        expect.push(p(name));
        expect.sort();
        let now: Vec<_> = listing(d.path()).into_iter().map(|e| e.0).collect();
        assert_eq!(now, expect, "{a:?} wrote exactly {name}");
    }
    // The untouched entries kept their size and time.
    let after = listing(d.path());
    for e in &before {
        assert!(after.contains(e), "{e:?} changed");
    }
    // predict --plot: the plot is the named file.
    let plot = s(&p("f.svg"));
    ok(&["predict", "--trace", &t, "--plot", &plot]);
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));
}

/// `-o` naming the file the command reads (by its name, another path or a link) is
/// refused before anything is written, and the input keeps its bytes: an export to CSV
/// over the trace replaced it, and an export of a model over its own weights made the
/// model unloadable.
#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_kept() {
    let d = scratch("self");
    let t = d.path().join("t.mctrace");
    std::fs::copy(bundled("bert_dynseq_b16_train"), &t).unwrap();
    let before = std::fs::read(&t).unwrap();
    let link = d.path().join("l.csv");
    std::os::unix::fs::symlink("t.mctrace", &link).unwrap();
    let other = d.path().join(".").join("t.mctrace");
    for out in [&t, &link, &other] {
        for cmd in [
            &["trace", "export", "--format", "csv"][..],
            &["trace", "features"][..],
            &["trace", "import"][..],
        ] {
            let mut args = cmd.to_vec();
            let (ts, os) = (s(&t), s(out));
            args.extend_from_slice(&[&ts, "-o", &os]);
            let e = fails(&args);
            assert!(e.contains("which this command reads"), "{args:?}: {e}");
        }
    }
    assert_eq!(std::fs::read(&t).unwrap(), before);
    let m = d.path().join("mdl");
    std::fs::create_dir(&m).unwrap();
    for f in std::fs::read_dir(repo().join("training-data/models/default")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, m.join(f.file_name().unwrap())).unwrap();
    }
    let w = m.join("model.safetensors");
    let weights = std::fs::read(&w).unwrap();
    for model in [s(&m), s(&w)] {
        let e = fails(&[
            "export",
            "--model",
            &model,
            "--format",
            "burn",
            "-o",
            &s(&w),
        ]);
        assert!(e.contains("is a file of the model"), "{e}");
    }
    assert_eq!(std::fs::read(&w).unwrap(), weights);
    ok(&[
        "export",
        "--model",
        &s(&m),
        "--format",
        "burn",
        "-o",
        &s(&d.path().join("x.mpk")),
    ]);
}
