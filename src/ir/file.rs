//! Reading the files a user names (graph files, model configs, tokenizers, weights, cache
//! entries) without ever blocking or reading without end.
//!
//! A FIFO blocks `open` until a writer appears, and `/dev/zero` or a pipe on stdin never end, so
//! every such file is checked twice before a byte is read: `stat` on the path (a special file is
//! refused without being opened), then `fstat` on the handle, which is opened with `O_NONBLOCK`
//! (so a FIFO swapped in between the two cannot block us). Reads stop at the limit plus one
//! byte, so a file that grows past its limit while read is refused too.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use thiserror::Error;

/// What a file is for, and the most bytes a sane one of its kind has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimit {
    /// What the file is, for messages: "graph file", "config", ...
    pub what: &'static str,
    pub max_bytes: u64,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum FileError {
    #[error("cannot read {path}: no such file")]
    Missing { path: String },
    #[error("{path}: the {what} is {found}, not a regular file (refused without reading it)")]
    NotRegular {
        path: String,
        what: &'static str,
        found: &'static str,
    },
    #[error("{path}: the {what} has {size} bytes, more than the limit of {limit}")]
    TooLarge {
        path: String,
        what: &'static str,
        /// The size when it was checked (at least `limit + 1` for a file that grew while read).
        size: u64,
        limit: u64,
    },
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
}

/// The kind of a file that is not a regular one, in words.
pub fn describe(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> FileError {
    if e.kind() == std::io::ErrorKind::NotFound {
        FileError::Missing {
            path: path.display().to_string(),
        }
    } else {
        FileError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

fn check(path: &Path, meta: &Metadata, limit: FileLimit) -> Result<(), FileError> {
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.display().to_string(),
            what: limit.what,
            found: describe(meta),
        });
    }
    if meta.len() > limit.max_bytes {
        return Err(FileError::TooLarge {
            path: path.display().to_string(),
            what: limit.what,
            size: meta.len(),
            limit: limit.max_bytes,
        });
    }
    Ok(())
}

/// Opens `path` for reading if it is a regular file (symbolic links followed) within `limit`;
/// returns the handle and the file's size. Never blocks on a special file.
pub fn open_regular(path: &Path, limit: FileLimit) -> Result<(File, u64), FileError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, &e))?;
    check(path, &meta, limit)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io_error(path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    check(path, &meta, limit)?;
    Ok((file, meta.len()))
}

/// The bytes of `path`, a regular file within `limit` (read at most `limit + 1` bytes).
pub fn read_limited(path: &Path, limit: FileLimit) -> Result<Vec<u8>, FileError> {
    let (file, size) = open_regular(path, limit)?;
    let cap = usize::try_from(size).unwrap_or(usize::MAX);
    let mut bytes = Vec::with_capacity(cap);
    file.take(limit.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, &e))?;
    let read = bytes.len() as u64;
    if read > limit.max_bytes {
        return Err(FileError::TooLarge {
            path: path.display().to_string(),
            what: limit.what,
            size: read,
            limit: limit.max_bytes,
        });
    }
    Ok(bytes)
}

/// As [`read_limited`], as UTF-8 text.
pub fn read_text(path: &Path, limit: FileLimit) -> Result<String, FileError> {
    String::from_utf8(read_limited(path, limit)?).map_err(|e| FileError::Io {
        path: path.display().to_string(),
        message: format!("not UTF-8 text: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: FileLimit = FileLimit {
        what: "test file",
        max_bytes: 16,
    };

    fn tmp(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rocmforge-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tmp("special");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let loop_link = dir.join("loop");
        std::os::unix::fs::symlink(&loop_link, &loop_link).unwrap();
        let found = |p: &Path| match read_limited(p, SMALL) {
            Err(FileError::NotRegular { found, .. }) => found,
            other => panic!("{}: {other:?}", p.display()),
        };
        assert_eq!(found(&fifo), "a FIFO");
        assert_eq!(found(Path::new("/dev/zero")), "a character device");
        assert_eq!(found(Path::new("/dev/null")), "a character device");
        assert_eq!(found(&dir), "a directory");
        assert!(matches!(
            read_limited(&loop_link, SMALL),
            Err(FileError::Io { .. })
        ));
        assert!(matches!(
            read_limited(&dir.join("absent"), SMALL),
            Err(FileError::Missing { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn files_past_their_limit_are_refused_and_others_read_whole() {
        let dir = tmp("limit");
        let (fits, big) = (dir.join("fits"), dir.join("big"));
        std::fs::write(&fits, [7u8; 16]).unwrap();
        std::fs::write(&big, [7u8; 17]).unwrap();
        assert_eq!(read_limited(&fits, SMALL).unwrap(), vec![7u8; 16]);
        assert_eq!(
            read_limited(&big, SMALL),
            Err(FileError::TooLarge {
                path: big.display().to_string(),
                what: "test file",
                size: 17,
                limit: 16
            })
        );
        // Through a symbolic link, the target is what counts.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fits, &link).unwrap();
        assert_eq!(read_limited(&link, SMALL).unwrap().len(), 16);
        std::fs::remove_dir_all(&dir).ok();
    }
}
