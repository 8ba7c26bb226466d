//! The offline tools, etcdutl's: `snapshot restore` and `snapshot status`, `defrag` and
//! `hashkv` — on kvd's files and etcd's, with a stopped member.

use std::path::{Path, PathBuf};

use rpc::snapshot::{Kind, SnapshotError, SnapshotFile, Status};

use crate::config::{self, HashkvFlags, RestoreFlags, WriteOut};
use crate::plan::{initial_cluster, same_urls};

/// What an offline tool could not do.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Flags(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("{path}: {source}")]
    Store { path: PathBuf, source: mvcc::Error },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ToolError + 'a {
    move |source| ToolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn store_err(path: &Path) -> impl FnOnce(mvcc::Error) -> ToolError + '_ {
    move |source| ToolError::Store {
        path: path.to_path_buf(),
        source,
    }
}

/// A member's data file in its data directory.
fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

/// `kvd snapshot restore`: a new member's data directory from a snapshot file.
pub fn restore(f: &RestoreFlags) -> Result<(), ToolError> {
    let data_dir = if f.data_dir.is_empty() {
        PathBuf::from(format!("{}.kvd", f.name))
    } else {
        PathBuf::from(&f.data_dir)
    };
    if !f.wal_dir.is_empty() {
        return Err(ToolError::Flags(
            "--wal-dir: kvd keeps its WAL in the data directory".into(),
        ));
    }
    if (f.bump_revision == 0) == f.mark_compacted {
        return Err(ToolError::Flags(
            "--mark-compacted required if --bump-revision > 0".into(),
        ));
    }
    let exists = data_dir.exists();
    if exists
        && std::fs::read_dir(&data_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(ToolError::Flags(format!(
            "data-dir {:?} not empty or could not be read",
            data_dir.display()
        )));
    }
    // As etcdutl's: the member must be in the cluster it will bootstrap. The raft log starts
    // afresh when the member first starts (with these same flags).
    let peer_urls = config::urls(&f.initial_advertise_peer_urls);
    let initial = initial_cluster(&f.initial_cluster, &f.name, &peer_urls);
    let members = consensus::parse_initial_cluster(&initial, &f.initial_cluster_token)
        .map_err(|e| ToolError::Flags(e.to_string()))?;
    if !members
        .iter()
        .any(|m| m.name == f.name && same_urls(&m.peer_urls, &peer_urls))
    {
        return Err(ToolError::Flags(format!(
            "--initial-cluster {initial} has no member {:?} at --initial-advertise-peer-urls {}",
            f.name, f.initial_advertise_peer_urls
        )));
    }
    let snap = SnapshotFile::open(&f.file, f.skip_hash_check)?;
    let db = db_path(&data_dir);
    let snap_dir = db.parent().expect("a file in a directory");
    let r = std::fs::create_dir_all(snap_dir)
        .map_err(io("create", snap_dir))
        .and_then(|()| {
            let to = snap.restore(&db, &mvcc::StoreOptions::default(), f.bump_revision)?;
            if let Some(to) = to {
                tracing::info!(revision = to, "bumped the revision and marked it compacted");
            }
            Ok(())
        });
    if let Err(e) = r {
        if exists {
            let _ = std::fs::remove_dir_all(data_dir.join("member"));
        } else {
            let _ = std::fs::remove_dir_all(&data_dir);
        }
        return Err(e);
    }
    println!(
        "restored snapshot {} into {}",
        f.file.display(),
        data_dir.display()
    );
    Ok(())
}

/// `kvd snapshot status`.
pub fn status(file: &Path, out: WriteOut) -> Result<(), ToolError> {
    // As etcdutl's: the file is read, its SHA-256 not checked.
    let st = SnapshotFile::open(file, true)?.status()?;
    print(out, &status_row(&st));
    Ok(())
}

/// One row of etcdutl's output: (header, simple text, JSON name, JSON value) per column.
type Row = Vec<(&'static str, String, &'static str, String)>;

fn status_row(st: &Status) -> Row {
    vec![
        (
            "hash",
            format!("{:x}", st.hash),
            "hash",
            st.hash.to_string(),
        ),
        (
            "revision",
            st.revision.to_string(),
            "revision",
            st.revision.to_string(),
        ),
        (
            "total keys",
            st.total_keys.to_string(),
            "totalKey",
            st.total_keys.to_string(),
        ),
        (
            "total size",
            si_bytes(st.total_size),
            "totalSize",
            st.total_size.to_string(),
        ),
        (
            "version",
            st.version.clone(),
            "version",
            serde_json::to_string(&st.version).expect("a string encodes"),
        ),
    ]
}

/// go-humanize's `Bytes`: SI units, one decimal below 10.
fn si_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let v = (n as f64 / 1000f64.powi(e as i32) * 10.0 + 0.5).floor() / 10.0;
    if v < 10.0 {
        format!("{v:.1} {}", UNITS[e])
    } else {
        format!("{v:.0} {}", UNITS[e])
    }
}

fn print(out: WriteOut, row: &Row) {
    match out {
        WriteOut::Simple => {
            let cells: Vec<&str> = row.iter().map(|c| c.1.as_str()).collect();
            println!("{}", cells.join(", "));
        }
        WriteOut::Json => {
            let fields: Vec<String> = row.iter().map(|c| format!("\"{}\":{}", c.2, c.3)).collect();
            println!("{{{}}}", fields.join(","));
        }
        WriteOut::Fields => {
            for c in row {
                println!("\"{}\" : {}", fields_name(c.0), c.3);
            }
        }
        WriteOut::Table => {
            let widths: Vec<usize> = row.iter().map(|c| c.0.len().max(c.1.len()) + 2).collect();
            let line: String = widths
                .iter()
                .map(|w| format!("+{}", "-".repeat(*w)))
                .collect();
            println!("{line}+");
            let head: String = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("|{:^w$}", c.0.to_uppercase(), w = *w))
                .collect();
            println!("{head}|");
            println!("{line}+");
            let cells: String = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("|{:>w$} ", c.1, w = *w - 1))
                .collect();
            println!("{cells}|");
            println!("{line}+");
        }
    }
}

/// etcdutl's `-w fields` names.
fn fields_name(header: &str) -> &str {
    match header {
        "hash" => "Hash",
        "revision" => "Revision",
        "total keys" => "Keys",
        "total size" => "Size",
        "version" => "Version",
        "hash revision" => "Hash revision",
        "compact revision" => "Compact revision",
        other => other,
    }
}

/// `kvd hashkv`: HashKV of a stopped member's data file.
pub fn hashkv(f: &HashkvFlags) -> Result<(), ToolError> {
    let file = match (&f.file, &f.data_dir) {
        (Some(file), None) => file.clone(),
        (None, Some(dir)) => db_path(dir),
        _ => {
            return Err(ToolError::Flags(
                "hashkv: give the data file or --data-dir, one of them".into(),
            ))
        }
    };
    let snap = SnapshotFile::open(&file, true)?;
    let h = match snap.kind() {
        Kind::KvdStore => hash_store(snap.path(), f.rev)?,
        _ => {
            // etcd's file (or kvd's earlier snapshot format): read into a store aside.
            let tmp = tempdir_for(&file)?;
            let db = tmp.join("db");
            snap.restore(&db, &mvcc::StoreOptions::default(), 0)?;
            let h = hash_store(&db, f.rev);
            let _ = std::fs::remove_dir_all(&tmp);
            h?
        }
    };
    print(
        f.write_out,
        &vec![
            ("hash", h.hash.to_string(), "hash", h.hash.to_string()),
            (
                "hash revision",
                h.hash_revision.0.to_string(),
                "hashRevision",
                h.hash_revision.0.to_string(),
            ),
            (
                "compact revision",
                h.compact_revision.0.to_string(),
                "compactRevision",
                h.compact_revision.0.to_string(),
            ),
        ],
    );
    Ok(())
}

fn hash_store(db: &Path, rev: i64) -> Result<mvcc::KvHash, ToolError> {
    let store = mvcc::Store::open(db, mvcc::StoreOptions::default()).map_err(store_err(db))?;
    let h = store.hash_kv(ids::Revision(rev)).map_err(store_err(db))?;
    store.close().map_err(store_err(db))?;
    Ok(h)
}

/// A new directory in the system's temporary directory for a copy of `file`.
fn tempdir_for(file: &Path) -> Result<PathBuf, ToolError> {
    let dir = std::env::temp_dir().join(format!("kvd-hashkv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
    tracing::debug!(file = %file.display(), dir = %dir.display(), "reading the file into a store");
    Ok(dir)
}

/// `kvd defrag --data-dir`: rewrites a stopped member's data file compactly.
pub fn defrag(data_dir: &Path) -> Result<(), ToolError> {
    let db = db_path(data_dir);
    let tmp = db.with_extension("defrag");
    let _ = std::fs::remove_file(&tmp);
    let before = std::fs::metadata(&db).map_err(io("stat", &db))?.len();
    let snap = SnapshotFile::open(&db, true)?;
    let r = match snap.kind() {
        Kind::KvdStore => pager::Db::open(&db, pager::Options::default())
            .and_then(|d| d.compact_to(&tmp))
            .map_err(|e| store_err(&db)(e.into())),
        Kind::Etcd(src) => rewrite_bolt(src, &tmp),
        Kind::KvdDump => Err(ToolError::Flags(format!(
            "{}: a snapshot in kvd's earlier format, not a data file",
            db.display()
        ))),
    };
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &db).map_err(io("rename", &tmp))?;
    if let Some(dir) = db.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", dir))?;
    }
    let after = std::fs::metadata(&db).map_err(io("stat", &db))?.len();
    println!(
        "Finished defragmenting data[{}] ({before} bytes before, {after} after)",
        data_dir.display()
    );
    Ok(())
}

/// An etcd data file written anew, its buckets packed, at `dst`.
fn rewrite_bolt(src: &bbolt::Db, dst: &Path) -> Result<(), ToolError> {
    let buckets = src.buckets().map_err(|e| store_err(src.path())(e.into()))?;
    let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
        let mut w = src.walker();
        for (name, b) in &buckets {
            s.bucket(name)?;
            let mut failed = None;
            w.for_each(b, &mut |k, item| match item {
                bbolt::Item::Value(v) => match s.put(k, v) {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        failed = Some(e);
                        Ok(false)
                    }
                },
                bbolt::Item::Bucket(_) => Err(bbolt::Error::Input(format!(
                    "bucket {:?} holds a bucket, which etcd does not write",
                    String::from_utf8_lossy(name)
                ))),
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    };
    let layout = bbolt::plan(4096, &mut feed).map_err(|e| store_err(src.path())(e.into()))?;
    let f = std::fs::File::create(dst).map_err(io("create", dst))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, f);
    bbolt::write(&layout, &mut out, &mut feed).map_err(|e| store_err(src.path())(e.into()))?;
    let f = out
        .into_inner()
        .map_err(|e| io("write", dst)(e.into_error()))?;
    f.sync_all().map_err(io("fsync", dst))
}

#[cfg(test)]
mod tests {
    use super::si_bytes;

    #[test]
    fn sizes_read_as_go_humanize_prints_them() {
        for (n, s) in [
            (0, "0 B"),
            (9, "9 B"),
            (24576, "25 kB"),
            (4096, "4.1 kB"),
            (1_000_000, "1.0 MB"),
            (8_589_934_592, "8.6 GB"),
        ] {
            assert_eq!(si_bytes(n), s, "{n}");
        }
    }
}
