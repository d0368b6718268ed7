//! A small, safe, fast unpickler for the data-only subset of Python's pickle format.
//!
//! Why our own: PyTorch snapshots are plain data (dicts, lists, strings, ints, floats,
//! tuples) but large — `gpt2_generate_dynamic` is 47 MB, ~17 million opcodes. A tree of
//! `Rc<RefCell<..>>` values spends most of its time in malloc; `serde-pickle` needs ~2 s.
//! This parser allocates nothing per object: every value is an 8-byte tagged [`Handle`]
//! (small ints inline, strings as offset+length into the input, containers as an index
//! into one table whose items live in one shared vector). See docs/trace-format.md for
//! the side-by-side figures against Python's C unpickler.
//!
//! Safety: opcodes that import or call Python objects (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`,
//! `BUILD`, `NEWOBJ`, `INST`, `OBJ`, `EXT*`, persistent ids) are refused with an error
//! naming the opcode and its offset: a snapshot never needs them, and executing them is
//! how pickles run arbitrary code.

use crate::error::TraceError;

/// A value in a parsed pickle: 3 tag bits, 61 payload bits.
///
/// Encoding: small ints are `i << 3` (|i| < 2^60); strings and bytes are
/// `offset << 3 | len << 39` (offset < 2^36, len < 2^25) into the input; containers and
/// out-of-line scalars are table indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(u64);

const TAG_INT: u64 = 0;
const TAG_BIG: u64 = 1; // index into `scalars`
const TAG_STR: u64 = 2;
const TAG_BYTES: u64 = 3;
const TAG_CONST: u64 = 4; // payload: 0 None, 1 False, 2 True
const TAG_CONTAINER: u64 = 5;
const NONE: Handle = Handle(TAG_CONST);
const FALSE: Handle = Handle(TAG_CONST | 1 << 3);
const TRUE: Handle = Handle(TAG_CONST | 2 << 3);
const NIL: u32 = u32::MAX;

impl Handle {
    #[inline]
    fn tag(self) -> u64 {
        self.0 & 7
    }
    #[inline]
    fn payload(self) -> u64 {
        self.0 >> 3
    }
}

/// Kind of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    List,
    Tuple,
    Dict,
    Set,
}

/// A decoded view of one [`Handle`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'p> {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'p str),
    Bytes(&'p [u8]),
    Container(Kind, u32),
}

#[derive(Debug, Clone, Copy)]
enum Scalar {
    Int(i64),
    Float(f64),
}

/// Items of a container, as a linked list of chunks in `Pickle::items` (one chunk per
/// APPENDS/SETITEMS batch; most containers have exactly one).
#[derive(Debug, Clone, Copy)]
struct Container {
    kind: Kind,
    // Invariant: head == NIL <=> tail == NIL <=> the container is empty.
    head: u32,
    tail: u32,
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    start: u32,
    len: u32,
    next: u32,
}

/// A parsed pickle: the input plus the tables its handles point into.
#[derive(Debug)]
pub struct Pickle<'a> {
    data: &'a [u8],
    root: Handle,
    scalars: Vec<Scalar>,
    containers: Vec<Container>,
    chunks: Vec<Chunk>,
    items: Vec<Handle>,
}

impl<'a> Pickle<'a> {
    /// The value STOP returned.
    pub fn root(&self) -> Handle {
        self.root
    }

    /// Decodes a handle.
    pub fn val(&self, h: Handle) -> Val<'a> {
        let p = h.payload();
        match h.tag() {
            TAG_INT => Val::Int((h.0 as i64) >> 3),
            TAG_BIG => match self.scalars[p as usize] {
                Scalar::Int(i) => Val::Int(i),
                Scalar::Float(f) => Val::Float(f),
            },
            TAG_STR => Val::Str(std::str::from_utf8(self.slice(h)).unwrap_or("")),
            TAG_BYTES => Val::Bytes(self.slice(h)),
            TAG_CONST => match p {
                0 => Val::None,
                1 => Val::Bool(false),
                _ => Val::Bool(true),
            },
            _ => Val::Container(self.containers[p as usize].kind, p as u32),
        }
    }

    fn slice(&self, h: Handle) -> &'a [u8] {
        let off = (h.0 >> 3) & ((1 << 36) - 1);
        let len = h.0 >> 39;
        &self.data[off as usize..(off + len) as usize]
    }

    /// Raw bytes of a string handle (no UTF-8 check: for key comparisons).
    #[inline]
    pub fn str_bytes(&self, h: Handle) -> Option<&'a [u8]> {
        (h.tag() == TAG_STR).then(|| self.slice(h))
    }

    pub fn as_int(&self, h: Handle) -> Option<i64> {
        match self.val(h) {
            Val::Int(i) => Some(i),
            Val::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    pub fn as_str(&self, h: Handle) -> Option<&'a str> {
        match self.val(h) {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Short type name for error messages.
    pub fn type_name(&self, h: Handle) -> &'static str {
        match self.val(h) {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Float(_) => "float",
            Val::Str(_) => "str",
            Val::Bytes(_) => "bytes",
            Val::Container(Kind::List, _) => "list",
            Val::Container(Kind::Tuple, _) => "tuple",
            Val::Container(Kind::Dict, _) => "dict",
            Val::Container(Kind::Set, _) => "set",
        }
    }

    fn container(&self, h: Handle, want: &[Kind]) -> Option<Container> {
        if h.tag() != TAG_CONTAINER {
            return None;
        }
        let c = self.containers[h.payload() as usize];
        want.contains(&c.kind).then_some(c)
    }

    fn chunk_iter(&self, c: Container) -> impl Iterator<Item = &[Handle]> + '_ {
        let mut at = c.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let ch = self.chunks[at as usize];
            at = ch.next;
            Some(&self.items[ch.start as usize..(ch.start + ch.len) as usize])
        })
    }

    /// Elements of a list, tuple or set; `None` for other values.
    pub fn elements(&self, h: Handle) -> Option<impl Iterator<Item = Handle> + '_> {
        let c = self.container(h, &[Kind::List, Kind::Tuple, Kind::Set])?;
        Some(self.chunk_iter(c).flat_map(|s| s.iter().copied()))
    }

    /// Key/value pairs of a dict in insertion order; `None` for other values.
    pub fn pairs(&self, h: Handle) -> Option<impl Iterator<Item = (Handle, Handle)> + '_> {
        let c = self.container(h, &[Kind::Dict])?;
        Some(
            self.chunk_iter(c)
                .flat_map(|s| s.chunks_exact(2).map(|kv| (kv[0], kv[1]))),
        )
    }

    /// Looks up a string key in a dict (last write wins, as in Python).
    pub fn get(&self, dict: Handle, key: &str) -> Option<Handle> {
        self.pairs(dict)?
            .filter(|(k, _)| self.str_bytes(*k) == Some(key.as_bytes()))
            .last()
            .map(|(_, v)| v)
    }
}

/// Parses one pickle from `data`.
pub fn parse(data: &[u8]) -> Result<Pickle<'_>, TraceError> {
    let mut p = Parser {
        data,
        pos: 0,
        stack: Vec::with_capacity(1024),
        marks: Vec::with_capacity(16),
        // Capacity guesses from the shared snapshots (~70 input bytes per event dict of
        // ~7 items, ~2.6 memo entries per dict): growing by doubling cost ~15% of the parse.
        memo: Vec::with_capacity(data.len() / 24),
        out: Pickle {
            data,
            root: NONE,
            scalars: Vec::new(),
            containers: Vec::with_capacity(data.len() / 48),
            chunks: Vec::with_capacity(data.len() / 48),
            items: Vec::with_capacity(data.len() / 4),
        },
    };
    p.out.root = p.run()?;
    // A snapshot file holds one pickle: bytes after its STOP are a damaged or
    // concatenated file, not something to drop silently.
    if p.pos < data.len() {
        return Err(TraceError::Pickle {
            offset: p.pos as u64,
            what: format!(
                "{} bytes after the pickle's end (one pickle per file)",
                data.len() - p.pos
            ),
        });
    }
    Ok(p.out)
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Handle>,
    // Invariant: marks are positions in `stack`, increasing (CPython's metastack).
    marks: Vec<usize>,
    // Invariant: memo[k] is the handle stored under memo key k, or NIL_HANDLE if unset.
    memo: Vec<Handle>,
    out: Pickle<'a>,
}

const UNSET: Handle = Handle(u64::MAX);

impl<'a> Parser<'a> {
    fn err(&self, at: usize, what: impl Into<String>) -> TraceError {
        TraceError::Pickle {
            offset: at as u64,
            what: what.into(),
        }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], TraceError> {
        let start = self.pos;
        match start.checked_add(n) {
            Some(end) if end <= self.data.len() => {
                self.pos = end;
                Ok(&self.data[start..end])
            }
            _ => Err(self.err(start, format!("truncated: needs {n} more bytes"))),
        }
    }

    #[inline]
    fn arg<const N: usize>(&mut self) -> Result<[u8; N], TraceError> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }

    /// Stack position of the last MARK (0 without one): values below it are not
    /// reachable by the current opcode.
    #[inline]
    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, at: usize) -> Result<Handle, TraceError> {
        if !self.marks.is_empty() && self.stack.len() <= self.base() {
            return Err(self.err(at, "found a MARK where a value was expected"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err(at, "stack underflow"))
    }

    #[inline]
    fn top(&self, at: usize) -> Result<Handle, TraceError> {
        match self.stack.last() {
            Some(&h) if self.marks.is_empty() || self.stack.len() > self.base() => Ok(h),
            _ => Err(self.err(at, "no value on the stack")),
        }
    }

    fn pop_mark(&mut self, at: usize) -> Result<usize, TraceError> {
        self.marks
            .pop()
            .ok_or_else(|| self.err(at, "no MARK on the stack"))
    }

    fn int(&mut self, v: i64) -> Handle {
        if (-(1i64 << 60)..(1i64 << 60)).contains(&v) {
            Handle((v << 3) as u64 | TAG_INT)
        } else {
            self.scalar(Scalar::Int(v))
        }
    }

    fn scalar(&mut self, s: Scalar) -> Handle {
        self.out.scalars.push(s);
        Handle(((self.out.scalars.len() - 1) as u64) << 3 | TAG_BIG)
    }

    fn text(&mut self, n: usize, at: usize, tag: u64) -> Result<Handle, TraceError> {
        let off = self.pos;
        let bytes = self.take(n)?;
        if tag == TAG_STR {
            if let Err(e) = std::str::from_utf8(bytes) {
                return Err(self.err(at, format!("string is not UTF-8: {e}")));
            }
        }
        if off >= 1 << 36 || n >= 1 << 25 {
            return Err(self.err(at, format!("string of {n} bytes is too long")));
        }
        Ok(Handle((off as u64) << 3 | (n as u64) << 39 | tag))
    }

    fn new_container(&mut self, kind: Kind) -> Handle {
        self.out.containers.push(Container {
            kind,
            head: NIL,
            tail: NIL,
        });
        Handle(((self.out.containers.len() - 1) as u64) << 3 | TAG_CONTAINER)
    }

    /// Moves `stack[from..]` into container `h` as one new chunk.
    fn extend(&mut self, h: Handle, from: usize, want: Kind, at: usize) -> Result<(), TraceError> {
        let ok = h.tag() == TAG_CONTAINER && {
            let k = self.out.containers[h.payload() as usize].kind;
            k == want || (want == Kind::List && k == Kind::Set)
        };
        if !ok {
            let name = match want {
                Kind::Dict => "SETITEM(S)",
                _ => "APPEND(S)/ADDITEMS",
            };
            return Err(self.err(at, format!("{name} on a {}", self.out.type_name(h))));
        }
        let n = self.stack.len() - from;
        if want == Kind::Dict && !n.is_multiple_of(2) {
            return Err(self.err(at, "SETITEMS with an odd number of items"));
        }
        if n == 0 {
            return Ok(());
        }
        let start = self.out.items.len();
        if start + n > u32::MAX as usize {
            return Err(self.err(at, "too many items"));
        }
        self.out.items.extend(self.stack.drain(from..));
        let chunk = self.out.chunks.len() as u32;
        self.out.chunks.push(Chunk {
            start: start as u32,
            len: n as u32,
            next: NIL,
        });
        let c = &mut self.out.containers[h.payload() as usize];
        if c.tail == NIL {
            c.head = chunk;
        } else {
            self.out.chunks[c.tail as usize].next = chunk;
        }
        c.tail = chunk;
        Ok(())
    }

    /// Builds a tuple from `stack[from..]`.
    fn tuple_from(&mut self, from: usize, at: usize) -> Result<(), TraceError> {
        let h = self.new_container(Kind::Tuple);
        self.extend(h, from, Kind::Tuple, at)?;
        self.stack.push(h);
        Ok(())
    }

    fn memo_put(&mut self, key: usize, at: usize) -> Result<(), TraceError> {
        let v = self.top(at)?;
        if key >= self.memo.len() {
            // Picklers number memo keys 0, 1, 2, ... and each store takes at least one
            // byte, so a key beyond the bytes read so far is not from a pickler (and
            // would make a small file ask for a huge memo table).
            if key > self.pos {
                return Err(self.err(
                    at,
                    format!("memo key {key}: more keys than the bytes before it can store"),
                ));
            }
            self.memo.resize(key + 1, UNSET);
        }
        self.memo[key] = v;
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, key: usize, at: usize) -> Result<(), TraceError> {
        match self.memo.get(key) {
            Some(&h) if h != UNSET => {
                self.stack.push(h);
                Ok(())
            }
            _ => Err(self.err(at, format!("memo key {key} was never stored"))),
        }
    }

    /// Python's two's-complement little-endian long (LONG1/LONG4).
    fn long(&mut self, n: usize, at: usize) -> Result<Handle, TraceError> {
        let b = self.take(n)?;
        if n == 0 {
            return Ok(self.int(0));
        }
        let neg = b[n - 1] & 0x80 != 0;
        if n > 8 {
            let sign = if neg { 0xff } else { 0 };
            if b[8..].iter().any(|&x| x != sign) || (b[7] & 0x80 != 0) != neg {
                return Err(self.err(at, format!("integer of {n} bytes does not fit in 64 bits")));
            }
        }
        let mut buf = if neg { [0xffu8; 8] } else { [0u8; 8] };
        buf[..n.min(8)].copy_from_slice(&b[..n.min(8)]);
        Ok(self.int(i64::from_le_bytes(buf)))
    }

    fn run(&mut self) -> Result<Handle, TraceError> {
        loop {
            let at = self.pos;
            let op = self.arg::<1>()?[0];
            // Hot path: the opcodes that make up >95% of a snapshot come first.
            let h = match op {
                b'j' => {
                    let k = u32::from_le_bytes(self.arg()?) as usize;
                    self.memo_get(k, at)?;
                    continue;
                }
                b'h' => {
                    let k = self.arg::<1>()?[0] as usize;
                    self.memo_get(k, at)?;
                    continue;
                }
                0x94 => {
                    let k = self.memo.len();
                    self.memo_put(k, at)?;
                    continue;
                }
                0x8a => {
                    let n = self.arg::<1>()?[0] as usize;
                    self.long(n, at)?
                }
                b'K' => Handle((self.arg::<1>()?[0] as u64) << 3),
                b'M' => Handle((u16::from_le_bytes(self.arg()?) as u64) << 3),
                b'J' => {
                    let v = i32::from_le_bytes(self.arg()?) as i64;
                    self.int(v)
                }
                b'(' => {
                    self.marks.push(self.stack.len());
                    continue;
                }
                b'}' => self.new_container(Kind::Dict),
                b']' => self.new_container(Kind::List),
                0x8f => self.new_container(Kind::Set),
                b')' => self.new_container(Kind::Tuple),
                0x8c => {
                    let n = self.arg::<1>()?[0] as usize;
                    self.text(n, at, TAG_STR)?
                }
                b'u' | b'e' | 0x90 => {
                    // SETITEMS, APPENDS, ADDITEMS
                    let from = self.pop_mark(at)?;
                    let target = match from.checked_sub(1).map(|i| self.stack[i]) {
                        Some(t) if self.marks.is_empty() || from > self.base() => t,
                        _ => return Err(self.err(at, "no container below the MARK")),
                    };
                    let kind = if op == b'u' { Kind::Dict } else { Kind::List };
                    self.extend(target, from, kind, at)?;
                    continue;
                }
                b's' | b'a' => {
                    // SETITEM, APPEND
                    let n = if op == b's' { 2 } else { 1 };
                    let base = self.base();
                    if self.stack.len() < base + n + 1 {
                        return Err(self.err(at, "stack underflow"));
                    }
                    let from = self.stack.len() - n;
                    let target = self.stack[from - 1];
                    let kind = if op == b's' { Kind::Dict } else { Kind::List };
                    self.extend(target, from, kind, at)?;
                    continue;
                }
                0x80 => {
                    let v = self.arg::<1>()?[0];
                    if v > 5 {
                        return Err(self.err(at, format!("pickle protocol {v} is not supported")));
                    }
                    continue;
                }
                0x95 => {
                    // FRAME: a length hint only; frames are contiguous in the stream.
                    self.arg::<8>()?;
                    continue;
                }
                b'.' => {
                    let v = self.pop(at)?;
                    if !self.marks.is_empty() {
                        return Err(self.err(at, "STOP with an open MARK"));
                    }
                    return Ok(v);
                }
                b'N' => NONE,
                0x88 => TRUE,
                0x89 => FALSE,
                0x8b => {
                    let n = u32::from_le_bytes(self.arg()?) as usize;
                    self.long(n, at)?
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.arg()?);
                    self.scalar(Scalar::Float(v))
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.arg()?) as usize;
                    self.text(n, at, TAG_STR)?
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.arg()?);
                    let n = usize::try_from(n).map_err(|_| self.err(at, "length too large"))?;
                    self.text(n, at, TAG_STR)?
                }
                b'C' => {
                    let n = self.arg::<1>()?[0] as usize;
                    self.text(n, at, TAG_BYTES)?
                }
                b'B' => {
                    let n = u32::from_le_bytes(self.arg()?) as usize;
                    self.text(n, at, TAG_BYTES)?
                }
                0x8e => {
                    let n = u64::from_le_bytes(self.arg()?);
                    let n = usize::try_from(n).map_err(|_| self.err(at, "length too large"))?;
                    self.text(n, at, TAG_BYTES)?
                }
                b'q' => {
                    let k = self.arg::<1>()?[0] as usize;
                    self.memo_put(k, at)?;
                    continue;
                }
                b'r' => {
                    let k = u32::from_le_bytes(self.arg()?) as usize;
                    self.memo_put(k, at)?;
                    continue;
                }
                b't' | 0x91 => {
                    // TUPLE, FROZENSET (read as a tuple)
                    let from = self.pop_mark(at)?;
                    self.tuple_from(from, at)?;
                    continue;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let base = self.base();
                    if self.stack.len() < base + n {
                        return Err(self.err(at, "stack underflow"));
                    }
                    let from = self.stack.len() - n;
                    self.tuple_from(from, at)?;
                    continue;
                }
                b'0' => {
                    self.pop(at)?;
                    continue;
                }
                b'1' => {
                    let from = self.pop_mark(at)?;
                    self.stack.truncate(from);
                    continue;
                }
                b'2' => self.top(at)?,
                b'c'
                | 0x93
                | b'R'
                | b'b'
                | 0x81
                | 0x92
                | b'i'
                | b'o'
                | 0x82..=0x84
                | b'P'
                | b'Q' => {
                    return Err(self.err(
                        at,
                        format!(
                            "opcode 0x{op:02x} would import or call Python code; \
                             only plain data pickles (like PyTorch memory snapshots) are read"
                        ),
                    ));
                }
                other => {
                    return Err(
                        self.err(at, format!("unknown or unsupported opcode 0x{other:02x}"))
                    );
                }
            };
            self.stack.push(h);
        }
    }
}

#[cfg(test)]
#[path = "pickle_tests.rs"]
mod tests;
