//! Writing an output file (every `-o` of memcast goes through here) without replacing
//! what it should not:
//!
//! - a symbolic link is followed: its target is written and the link stays a link;
//! - an existing file that is not a regular file (a FIFO, a character device such as
//!   `/dev/null`) is opened and written in place, never replaced: a write error there
//!   (`/dev/full`: no space left) is an error naming the path;
//! - a regular file (or a new one) is written to a temporary file in the same folder and
//!   renamed over the target, so an interrupted write never leaves half a file under the
//!   final name; an existing file's permissions are kept;
//! - a directory is refused, and so is a new file in `/dev` (a device folder, where a
//!   regular file is never what was meant).
//!
//! [`check`] tells in advance whether [`write_with`] can write a path, for commands that
//! do long work before they write.

use std::fs::{self, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::TraceError;

/// Most symbolic links followed from one path (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// Where a write to `path` goes.
enum Target {
    /// A regular file, existing or not: temporary file and rename.
    Regular {
        path: PathBuf,
        perms: Option<fs::Permissions>,
    },
    /// An existing non-regular file: written in place.
    InPlace(PathBuf),
}

fn err(path: &Path, what: impl Into<String>) -> TraceError {
    TraceError::io(path, io::Error::other(what.into()))
}

/// Follows symbolic links from `path` (a dangling one resolves to the path it names).
fn resolve(path: &Path) -> Result<PathBuf, TraceError> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p).map_err(|e| TraceError::io(&p, e))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(err(
        path,
        format!("more than {MAX_LINKS} symbolic links to follow"),
    ))
}

fn target(path: &Path) -> Result<Target, TraceError> {
    let p = resolve(path)?;
    match fs::metadata(&p) {
        Ok(m) if m.is_dir() => Err(err(path, "is a directory, not a file")),
        Ok(m) if m.is_file() => Ok(Target::Regular {
            path: p,
            perms: Some(m.permissions()),
        }),
        Ok(_) => Ok(Target::InPlace(p)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let canon = fs::canonicalize(&dir)
                .map_err(|_| err(path, format!("the folder {} does not exist", dir.display())))?;
            if !canon.is_dir() {
                return Err(err(path, format!("{} is not a folder", dir.display())));
            }
            if canon.starts_with("/dev") {
                return Err(err(
                    path,
                    "refusing to create a new file in /dev (name an existing device to write into it, or another folder)",
                ));
            }
            Ok(Target::Regular {
                path: p,
                perms: None,
            })
        }
        Err(e) => Err(TraceError::io(path, e)),
    }
}

/// Checks that [`write_with`] can write `path` (it resolves, is not a directory, its
/// folder exists and takes the temporary file, which is made and removed again), without
/// writing to `path` itself.
pub fn check(path: &Path) -> Result<(), TraceError> {
    match target(path)? {
        Target::Regular { path: p, .. } => {
            let tmp = temporary(&p);
            create_temporary(&tmp).map_err(|e| TraceError::io(path, e))?;
            fs::remove_file(&tmp).map_err(|e| TraceError::io(&tmp, e))
        }
        Target::InPlace(_) => Ok(()),
    }
}

/// The temporary file a write to the regular file `p` goes through, in its folder.
fn temporary(p: &Path) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// Creates the temporary file `tmp` (never an existing one). A folder where the file
/// exists but no new one can be made (`/proc`, a folder the user cannot write holding a
/// file they can) gets an error naming the temporary file.
fn create_temporary(tmp: &Path) -> io::Result<fs::File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot create the temporary file {} beside it (the output is written there, then renamed over it): {e}",
                    tmp.display()
                ),
            )
        })
}

/// Refuses an output `path` that is the file `input` (by any name: a link, another
/// path to it, a hard link), which the write would replace: `what` names the input in
/// the error (`t.mctrace: is the trace (t.mctrace), which this command reads: ...`).
/// Paths that do not both exist are different files. Then checks that the output can be
/// written ([`check`]), so that a command reads its input only when it can write.
pub fn check_not_input(path: &Path, input: &Path, what: &str) -> Result<(), TraceError> {
    if same_file(path, input) {
        return Err(err(
            path,
            format!(
                "is {what} ({}), which this command reads: writing it would replace it (name another file)",
                input.display()
            ),
        ));
    }
    check(path)
}

/// Whether `a` and `b` name one existing file (links followed).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (fs::metadata(a), fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    }
}

/// Writes `bytes` to `path` (see the module documentation).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), TraceError> {
    write_with(path, |w| w.write_all(bytes))
}

/// Writes to `path` what `f` writes into a buffered writer (see the module
/// documentation). Errors name `path` as given.
pub fn write_with(
    path: &Path,
    f: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), TraceError> {
    match target(path)? {
        Target::InPlace(p) => {
            let file = OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(|e| TraceError::io(path, e))?;
            let mut w = BufWriter::new(file);
            f(&mut w)
                .and_then(|()| w.flush())
                .map_err(|e| TraceError::io(path, e))
        }
        Target::Regular { path: p, perms } => {
            let tmp = temporary(&p);
            let write = || -> io::Result<()> {
                let file = create_temporary(&tmp)?;
                let mut w = BufWriter::new(file);
                f(&mut w)?;
                let file = w.into_inner().map_err(|e| e.into_error())?;
                if let Some(perms) = perms {
                    file.set_permissions(perms)?;
                }
                file.sync_all()?;
                fs::rename(&tmp, &p)
            };
            write().map_err(|e| {
                let _ = fs::remove_file(&tmp);
                TraceError::io(path, e)
            })
        }
    }
}

/// Creates `dir` (and its parents) for an output folder, refusing an existing path that
/// is not a folder.
pub fn create_dir(dir: &Path) -> Result<(), TraceError> {
    let p = resolve(dir)?;
    match fs::metadata(&p) {
        Ok(m) if !m.is_dir() => Err(err(dir, "exists and is not a folder")),
        _ => fs::create_dir_all(&p).map_err(|e| TraceError::io(dir, e)),
    }
}
