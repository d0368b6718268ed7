//! Text export of traces for people and other tools: CSV or JSON Lines.
//!
//! One row per static block (kind `static`, time 0, index empty) then one per event.
//! Columns: `index,time_us,kind,id,bytes,stream` where kind is one of `static`, `alloc`,
//! `free`, `read`, `write`, `iteration`; fields that do not apply are empty (CSV) or
//! absent (JSON Lines).

use std::io::Write;

use crate::model::{EventKind, Trace};

/// Text formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    Csv,
    JsonLines,
}

struct Row {
    index: Option<usize>,
    time_us: u64,
    kind: &'static str,
    id: Option<u64>,
    bytes: Option<u64>,
    stream: Option<u32>,
}

fn rows(t: &Trace) -> impl Iterator<Item = Row> + '_ {
    let statics = t.static_blocks.iter().map(|b| Row {
        index: None,
        time_us: 0,
        kind: "static",
        id: Some(b.id),
        bytes: Some(b.bytes),
        stream: Some(b.stream),
    });
    let events = t.events.iter().enumerate().map(|(i, e)| {
        let (kind, id, bytes, stream) = match e.kind {
            EventKind::Alloc { id, bytes, stream } => {
                ("alloc", Some(id), Some(bytes), Some(stream))
            }
            EventKind::Free { id } => ("free", Some(id), None, None),
            EventKind::Access { id, write } => {
                (if write { "write" } else { "read" }, Some(id), None, None)
            }
            EventKind::IterationBoundary => ("iteration", None, None, None),
        };
        Row {
            index: Some(i),
            time_us: e.time_us,
            kind,
            id,
            bytes,
            stream,
        }
    });
    statics.chain(events)
}

/// Writes the trace as text to `out`.
pub fn write_text(t: &Trace, format: TextFormat, out: &mut dyn Write) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(out);
    fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
        v.map(|x| x.to_string()).unwrap_or_default()
    }
    match format {
        TextFormat::Csv => {
            writeln!(out, "index,time_us,kind,id,bytes,stream")?;
            for r in rows(t) {
                writeln!(
                    out,
                    "{},{},{},{},{},{}",
                    opt(r.index),
                    r.time_us,
                    r.kind,
                    opt(r.id),
                    opt(r.bytes),
                    opt(r.stream)
                )?;
            }
        }
        TextFormat::JsonLines => {
            for r in rows(t) {
                let mut line = String::with_capacity(96);
                line.push('{');
                if let Some(i) = r.index {
                    line.push_str(&format!("\"index\":{i},"));
                }
                line.push_str(&format!(
                    "\"time_us\":{},\"kind\":\"{}\"",
                    r.time_us, r.kind
                ));
                for (k, v) in [
                    ("id", r.id),
                    ("bytes", r.bytes),
                    ("stream", r.stream.map(u64::from)),
                ] {
                    if let Some(v) = v {
                        line.push_str(&format!(",\"{k}\":{v}"));
                    }
                }
                line.push('}');
                writeln!(out, "{line}")?;
            }
        }
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, StaticBlock};

    fn t() -> Trace {
        Trace {
            static_blocks: vec![StaticBlock {
                id: 0,
                bytes: 8,
                stream: 0,
            }],
            events: vec![
                Event {
                    time_us: 1,
                    kind: EventKind::Alloc {
                        id: 1,
                        bytes: 16,
                        stream: 0,
                    },
                },
                Event {
                    time_us: 2,
                    kind: EventKind::Access {
                        id: 1,
                        write: false,
                    },
                },
                Event {
                    time_us: 3,
                    kind: EventKind::Free { id: 1 },
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn csv_rows() {
        let mut out = Vec::new();
        write_text(&t(), TextFormat::Csv, &mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s,
            "index,time_us,kind,id,bytes,stream\n,0,static,0,8,0\n0,1,alloc,1,16,0\n1,2,read,1,,\n2,3,free,1,,\n"
        );
    }

    #[test]
    fn jsonl_rows_parse_as_json() {
        let mut out = Vec::new();
        write_text(&t(), TextFormat::JsonLines, &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1]["bytes"], 16);
        assert_eq!(lines[3]["kind"], "free");
        assert!(lines[0].get("index").is_none());
    }
}
