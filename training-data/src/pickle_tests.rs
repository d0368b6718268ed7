//! Tests of the unpickler (a child module of `pickle`).

use super::*;

// pickle.dumps({'a': [1, -2, 2**40, 'x', None, True, 1.5, (3, 4)], 'b': b'\x00'}, 4)
const SAMPLE: &[u8] = b"\x80\x04\x959\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01x\x94N\x88G?\xf8\x00\x00\x00\x00\x00\x00K\x03K\x04\x86\x94e\x8c\x01b\x94C\x01\x00\x94u.";

#[test]
fn parses_cpython_output() {
    let p = parse(SAMPLE).unwrap();
    let a: Vec<_> = p.elements(p.get(p.root(), "a").unwrap()).unwrap().collect();
    assert_eq!(p.as_int(a[0]), Some(1));
    assert_eq!(p.as_int(a[1]), Some(-2));
    assert_eq!(p.as_int(a[2]), Some(1 << 40));
    assert_eq!(p.as_str(a[3]), Some("x"));
    assert_eq!(p.val(a[4]), Val::None);
    assert_eq!(p.val(a[5]), Val::Bool(true));
    assert_eq!(p.val(a[6]), Val::Float(1.5));
    let t: Vec<_> = p.elements(a[7]).unwrap().map(|h| p.as_int(h)).collect();
    assert_eq!(t, vec![Some(3), Some(4)]);
    assert_eq!(p.val(p.get(p.root(), "b").unwrap()), Val::Bytes(b"\x00"));
    assert_eq!(p.type_name(p.root()), "dict");
}

#[test]
fn large_and_negative_ints() {
    // pickle.dumps([2**62, -2**62, -1, 2**63-1], 4)
    let d = b"\x80\x04\x95(\x00\x00\x00\x00\x00\x00\x00]\x94(\x8a\x08\x00\x00\x00\x00\x00\x00\x00@\x8a\x08\x00\x00\x00\x00\x00\x00\x00\xc0J\xff\xff\xff\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7fe.";
    let p = parse(d).unwrap();
    let v: Vec<_> = p
        .elements(p.root())
        .unwrap()
        .map(|h| p.as_int(h).unwrap())
        .collect();
    assert_eq!(v, vec![1 << 62, -(1 << 62), -1, i64::MAX]);
    // 2**64 does not fit.
    let e = parse(b"\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap_err();
    assert!(e.to_string().contains("does not fit in 64 bits"), "{e}");
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    for n in 0..SAMPLE.len() {
        let e = parse(&SAMPLE[..n]).expect_err("truncated input must fail");
        assert!(matches!(e, TraceError::Pickle { .. }), "{n}: {e}");
    }
}

#[test]
fn bytes_after_the_pickles_end_are_refused_with_their_offset() {
    let mut d = SAMPLE.to_vec();
    d.extend_from_slice(b"junk");
    let e = parse(&d).expect_err("trailing bytes").to_string();
    assert_eq!(
        e,
        format!(
            "pickle: 4 bytes after the pickle's end (one pickle per file) at byte offset {}",
            SAMPLE.len()
        )
    );
}

#[test]
fn refuses_code_execution_opcodes_with_offset() {
    // pickle.dumps(print, 4) -> STACK_GLOBAL at offset 30
    let evil = b"\x80\x04\x95\x16\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x05print\x94\x93\x94.";
    let e = parse(evil).expect_err("refused").to_string();
    assert!(e.contains("0x93") && e.contains("offset 30"), "{e}");
}

#[test]
fn bad_memo_reference_and_misplaced_marks_are_errors() {
    let e = parse(b"\x80\x04h\x05.").expect_err("bad memo").to_string();
    assert!(e.contains("memo key 5"), "{e}");
    let e = parse(b"\x80\x04(.").expect_err("open mark").to_string();
    assert!(e.contains("MARK"), "{e}");
    let e = parse(b"\x80\x04K\x01(K\x02u.")
        .expect_err("not a dict")
        .to_string();
    assert!(e.contains("SETITEM(S) on a int"), "{e}");
}

#[test]
fn random_mutations_never_panic() {
    for i in 0..SAMPLE.len() {
        for x in [0u8, 0x28, 0x2e, 0x5d, 0x65, 0x73, 0x75, 0x7d, 0x94, 0xff] {
            let mut d = SAMPLE.to_vec();
            d[i] = x;
            if let Ok(p) = parse(&d) {
                // Walking whatever came out must not panic either.
                let _ = p.type_name(p.root());
                if let Some(it) = p.pairs(p.root()) {
                    for (k, v) in it {
                        let _ = (p.val(k), p.val(v));
                    }
                }
            }
        }
    }
}
