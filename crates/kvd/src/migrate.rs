//! `kvd migrate --data-dir DIR`: a stopped etcd member's data directory made kvd's, in place.
//!
//! etcd's data file becomes kvd's store (every revision, lease and user kept, at the raft
//! index etcd applied it to); etcd's log — its snapshot files and WAL — becomes kvd's: the same
//! member and cluster ids, term, vote and commit index, and the entries etcd had not applied,
//! carried over to be applied as etcd would. kvd's files are made beside etcd's, then etcd's
//! `member/` is renamed `member.etcd/` and kvd's put in its place: a crash leaves one or the
//! other, and etcd's files stay for going back. Anything not fully understood is refused with
//! nothing changed.

use std::path::{Path, PathBuf};

use crate::tools::ToolError;

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ToolError + 'a {
    move |source| ToolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn refuse(dir: &Path, why: impl std::fmt::Display) -> ToolError {
    ToolError::Flags(format!(
        "{}: not migrated: {why}; nothing was changed",
        dir.display()
    ))
}

/// Whether `member_dir` holds an etcd member's data (its data file is bbolt's).
pub fn is_etcd_member(member_dir: &Path) -> bool {
    let mut head = [0u8; 24];
    std::fs::File::open(member_dir.join("snap").join("db"))
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| bbolt::looks_like_bolt_file(&head))
}

pub fn migrate(data_dir: &Path) -> Result<(), ToolError> {
    let member = data_dir.join("member");
    let kept = data_dir.join("member.etcd");
    let building = data_dir.join("member.kvd");
    // A migration interrupted between its two renames left etcd's files aside: finish it.
    if !member.exists() && kept.exists() && building.join("wal").exists() {
        return put_in_place(data_dir, &member, &kept, &building);
    }
    if !member.exists() {
        return Err(refuse(data_dir, "it holds no member directory (member/)"));
    }
    if !is_etcd_member(&member) {
        return Err(refuse(
            data_dir,
            "member/snap/db is not an etcd data file (bbolt): is it kvd's already?",
        ));
    }
    if kept.exists() {
        return Err(refuse(
            data_dir,
            format!("{} exists already", kept.display()),
        ));
    }
    let db_path = member.join("snap").join("db");
    // etcd holds an exclusive lock on its data file while it runs.
    let db_file = std::fs::File::open(&db_path).map_err(io("open", &db_path))?;
    if db_file.try_lock().is_err() {
        return Err(refuse(
            data_dir,
            "etcd is running on it (its data file is locked): stop it first",
        ));
    }
    let log = consensus::etcd_log::read_etcd_log(&member).map_err(|e| refuse(data_dir, e))?;
    if let Some((segment, at)) = &log.torn {
        tracing::warn!(segment = %segment.display(), offset = at, "a record torn by a crash ends the WAL: left out, as etcd repairs it");
    }
    let src = bbolt::Db::open(&db_path).map_err(|e| refuse(data_dir, e))?;
    if building.exists() {
        std::fs::remove_dir_all(&building).map_err(io("remove", &building))?;
    }
    let store = building.join("snap").join("db");
    std::fs::create_dir_all(building.join("snap")).map_err(io("create", &building))?;
    let r = (|| {
        let imported = mvcc::etcd_file::import(&src, &store).map_err(|e| refuse(data_dir, e))?;
        check_pending_snapshot(&member, imported.consistent_index, data_dir)?;
        let kvd_log = rpc::migrate::member_log(&log, &imported).map_err(|e| refuse(data_dir, e))?;
        // The store opens (its index rebuilt: every entry read and checked).
        mvcc::Store::open(&store, mvcc::StoreOptions::default())
            .and_then(|s| s.close())
            .map_err(|e| refuse(data_dir, e))?;
        consensus::write_imported_log(&building, &kvd_log).map_err(|e| refuse(data_dir, e))?;
        Ok((imported, kvd_log))
    })();
    let (imported, kvd_log) = match r {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&building);
            return Err(e);
        }
    };
    drop(db_file);
    put_in_place(data_dir, &member, &kept, &building)?;
    println!(
        "migrated etcd member {} of cluster {} in {}: {} members, data at raft index {} (term {}), {} entries of etcd's log carried over (commit {}, term {}); etcd's storage version {}",
        kvd_log.member,
        kvd_log.cluster,
        data_dir.display(),
        kvd_log.snapshot.members.len(),
        kvd_log.snapshot.index,
        kvd_log.snapshot.term,
        kvd_log.entries.len(),
        kvd_log.hard_state.commit,
        kvd_log.hard_state.term,
        imported.etcd.storage_version.as_deref().unwrap_or("3.5 or older"),
    );
    println!(
        "etcd's files are kept in {}: to go back to etcd (before kvd took writes), stop kvd, remove {} and rename {} to {}",
        kept.display(),
        member.display(),
        kept.display(),
        member.display()
    );
    Ok(())
}

/// Refuses a member stopped while installing a snapshot from its leader (a `.snap.db` newer
/// than its data file): etcd finishes that at its next start.
fn check_pending_snapshot(member: &Path, applied: u64, data_dir: &Path) -> Result<(), ToolError> {
    let snap = member.join("snap");
    for e in std::fs::read_dir(&snap).map_err(io("read", &snap))? {
        let name = e.map_err(io("read", &snap))?.file_name();
        let name = name.to_string_lossy();
        let index = name
            .strip_suffix(".snap.db")
            .and_then(|i| u64::from_str_radix(i, 16).ok());
        if index.is_some_and(|i| i > applied) {
            return Err(refuse(
                data_dir,
                format!("{name} is a snapshot from the leader etcd had not installed: start etcd once, stop it, then migrate"),
            ));
        }
    }
    Ok(())
}

/// Renames etcd's `member/` to `member.etcd/` and kvd's `member.kvd/` to `member/`.
fn put_in_place(
    data_dir: &Path,
    member: &PathBuf,
    kept: &PathBuf,
    building: &PathBuf,
) -> Result<(), ToolError> {
    if member.exists() {
        std::fs::rename(member, kept).map_err(io("rename", member))?;
    }
    std::fs::rename(building, member).map_err(io("rename", building))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", data_dir))
}
