#!/usr/bin/env python3
"""What a durable 300-byte WAL append costs on this disk, three ways: pwrite + fdatasync,
an O_DSYNC pwrite, and an O_DIRECT|O_DSYNC pwrite of the 4 KiB block holding it, each into a
preallocated (zero-filled, fsynced) 64 MiB file. Prints wall time and CPU per append.
Then what a write of a three-member cluster on one shared disk waits for at least: appends
with fdatasync to two files one after the other (the leader's, then a follower's), and to
two or three files at once (the members of a cluster syncing in parallel: each append waits
for all of them), the floor under put1's latency on three members.
Usage: fsync-modes.py [DIR]   (default: a directory under the current one; removed after)"""
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time

SIZE = 64 << 20
N = 2000
RECORD = b"x" * 300


def preallocate(path):
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    zeros = b"\0" * (1 << 20)
    for _ in range(SIZE >> 20):
        os.write(fd, zeros)
    os.fsync(fd)
    os.close(fd)


def run(d, name, flags, direct=False, sync=True):
    path = os.path.join(d, name)
    preallocate(path)
    fd = os.open(path, os.O_RDWR | flags)
    block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
    off = 0
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(N):
        if direct:
            os.pwrite(fd, block, off & ~4095)
        else:
            os.pwrite(fd, RECORD, off)
        off += len(RECORD)
        if sync:
            os.fdatasync(fd)
    t1, c1 = time.perf_counter(), os.times()
    cpu = c1.user - c0.user + c1.system - c0.system
    print(f"{name:18s} {1e6 * (t1 - t0) / N:7.1f} us wall  {1e6 * cpu / N:6.1f} us cpu per append")
    os.close(fd)
    os.unlink(path)


def together(d, name, files, parallel):
    """N appends to each of `files` files, each append + fdatasync; all files' appends of
    one round at once (parallel, a thread per file) or one after another."""
    fds = []
    for i in range(files):
        path = os.path.join(d, f"{name}-{i}")
        preallocate(path)
        fds.append(os.open(path, os.O_RDWR))

    def append(fd, off):
        os.pwrite(fd, RECORD, off)
        os.fdatasync(fd)

    t0 = time.perf_counter()
    if parallel:
        start, done = threading.Barrier(files + 1), threading.Barrier(files + 1)

        def member(fd):
            for k in range(N):
                start.wait()
                append(fd, k * len(RECORD))
                done.wait()

        threads = [threading.Thread(target=member, args=(fd,)) for fd in fds]
        for t in threads:
            t.start()
        for _ in range(N):
            start.wait()
            done.wait()
        for t in threads:
            t.join()
    else:
        for k in range(N):
            for fd in fds:
                append(fd, k * len(RECORD))
    t1 = time.perf_counter()
    per = (t1 - t0) / N
    print(f"{name:18s} {1e6 * per:7.1f} us wall per round  ({1 / per:6.0f} rounds/s)")
    for i, fd in enumerate(fds):
        os.close(fd)
        os.unlink(os.path.join(d, f"{name}-{i}"))


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "."
    d = tempfile.mkdtemp(dir=base, prefix="fsync-modes-")
    try:
        for _ in range(2):
            run(d, "write+fdatasync", 0)
            run(d, "O_DSYNC", os.O_DSYNC, sync=False)
            run(d, "O_DIRECT|O_DSYNC", os.O_DIRECT | os.O_DSYNC, direct=True, sync=False)
        for _ in range(2):
            together(d, "1 file", 1, parallel=False)
            together(d, "2 in sequence", 2, parallel=False)
            together(d, "2 at once", 2, parallel=True)
            together(d, "3 at once", 3, parallel=True)
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
