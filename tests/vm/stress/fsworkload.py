#!/usr/bin/env python3
"""A seeded, bounded random file workload with a self-checking model (an fsstress stand-in:
xfstests' fsstress is not packaged in Debian bookworm and the build machine has no network).

    fsworkload.py run DIR --seed S --ops N --manifest FILE [--max-bytes B]
    fsworkload.py verify DIR --manifest FILE

`run` applies N random operations under DIR (create, overwrite at random offsets, append,
truncate, rename, unlink, mkdir, rmdir, hardlink, symlink, fsync, fdatasync, read-back), keeps an
in-memory model of every file's expected contents (hard links share one inode), checks every
fsync'd file against the model right after its fsync, then syncs, checks the whole tree against
the model and writes FILE: every regular file's size and sha256, every symlink's target and every
directory. `verify` checks DIR against FILE exactly (nothing missing, nothing extra), e.g. after
umount and mount, so what is compared there was read back from the device.

Exit status: 0 when every check holds, 1 on the first mismatch (printed), 2 on bad usage.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time

MAX_FILE = 4 << 20  # largest file the workload grows
MAX_IO = 256 << 10  # largest single write


class Mismatch(Exception):
    pass


class Model:
    """Expected state of the tree: paths -> inode number (ours), inode -> contents."""

    def __init__(self, root, rng, max_bytes):
        self.root = root
        self.rng = rng
        self.max_bytes = max_bytes
        self.files = {}  # relative path -> inode id
        self.inodes = {}  # inode id -> bytearray
        self.links = {}  # relative path -> symlink target
        self.dirs = {""}  # relative dirs ("" = root)
        self.next_ino = 0
        self.counts = {}
        self.bytes_written = 0

    def p(self, rel):
        return os.path.join(self.root, rel)

    def live_bytes(self):
        return sum(len(b) for b in self.inodes.values())

    def data(self, n):
        return self.rng.randbytes(n)

    def new_name(self, prefix):
        d = self.rng.choice(sorted(self.dirs))
        for _ in range(100):
            rel = os.path.join(d, "%s%d" % (prefix, self.rng.randrange(1 << 20)))
            if rel not in self.files and rel not in self.links and rel not in self.dirs:
                return rel
        raise Mismatch("no free name under %r" % d)

    def pick_file(self):
        return self.rng.choice(sorted(self.files)) if self.files else None

    def write_at(self, rel, off, buf):
        fd = os.open(self.p(rel), os.O_WRONLY)
        try:
            os.pwrite(fd, buf, off)
        finally:
            os.close(fd)
        b = self.inodes[self.files[rel]]
        if off > len(b):
            b.extend(bytes(off - len(b)))
        b[off : off + len(buf)] = buf
        self.bytes_written += len(buf)

    def check_file(self, rel, what):
        want = self.inodes[self.files[rel]]
        with open(self.p(rel), "rb") as f:
            got = f.read()
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
            raise Mismatch(
                "%s: %s: %d bytes read, %d expected, first difference at %s"
                % (what, rel, len(got), len(want), first)
            )

    # --- operations -------------------------------------------------------------------
    def op_create(self):
        if self.live_bytes() >= self.max_bytes:
            return self.op_unlink()
        rel = self.new_name("f")
        size = self.rng.choice([0, 1, 4096, self.rng.randrange(1, 64 << 10), self.rng.randrange(1, MAX_FILE)])
        buf = self.data(size)
        with open(self.p(rel), "xb") as f:
            f.write(buf)
        ino = self.next_ino
        self.next_ino += 1
        self.inodes[ino] = bytearray(buf)
        self.files[rel] = ino
        self.bytes_written += size

    def op_overwrite(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_create()
        size = len(self.inodes[self.files[rel]])
        off = self.rng.randrange(size + 1)
        if self.rng.random() < 0.5:
            off -= off % 4096  # block-aligned half the time
        n = self.rng.randrange(1, MAX_IO)
        n = min(n, max(1, MAX_FILE - off))
        self.write_at(rel, off, self.data(n))

    def op_append(self):
        rel = self.pick_file()
        if rel is None or self.live_bytes() >= self.max_bytes:
            return self.op_overwrite()
        size = len(self.inodes[self.files[rel]])
        if size >= MAX_FILE:
            return self.op_truncate()
        self.write_at(rel, size, self.data(self.rng.randrange(1, min(MAX_IO, MAX_FILE - size) + 1)))

    def op_truncate(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_create()
        b = self.inodes[self.files[rel]]
        n = self.rng.randrange(min(len(b) + (64 << 10), MAX_FILE) + 1)
        os.truncate(self.p(rel), n)
        if n <= len(b):
            del b[n:]
        else:
            b.extend(bytes(n - len(b)))

    def op_rename(self):
        if not self.files:
            return self.op_create()
        rel = self.pick_file()
        dst = self.new_name("r")
        os.rename(self.p(rel), self.p(dst))
        self.files[dst] = self.files.pop(rel)

    def op_unlink(self):
        if self.links and self.rng.random() < 0.2:
            rel = self.rng.choice(sorted(self.links))
            os.unlink(self.p(rel))
            del self.links[rel]
            return
        rel = self.pick_file()
        if rel is None:
            return
        os.unlink(self.p(rel))
        ino = self.files.pop(rel)
        if ino not in self.files.values():
            del self.inodes[ino]

    def op_mkdir(self):
        if len(self.dirs) >= 40:
            return self.op_rmdir()
        rel = self.new_name("d")
        os.mkdir(self.p(rel))
        self.dirs.add(rel)

    def op_rmdir(self):
        used = {os.path.dirname(x) for x in list(self.files) + list(self.links) + list(self.dirs)}
        empty = sorted(d for d in self.dirs if d and d not in used)
        if not empty:
            return self.op_mkdir() if len(self.dirs) < 40 else None
        rel = self.rng.choice(empty)
        os.rmdir(self.p(rel))
        self.dirs.discard(rel)

    def op_link(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_create()
        dst = self.new_name("h")
        os.link(self.p(rel), self.p(dst))
        self.files[dst] = self.files[rel]

    def op_symlink(self):
        dst = self.new_name("s")
        target = self.pick_file() or "nowhere"
        os.symlink(target, self.p(dst))
        self.links[dst] = target

    def op_fsync(self):
        rel = self.pick_file()
        if rel is None:
            return
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            (os.fdatasync if self.rng.random() < 0.5 else os.fsync)(fd)
        finally:
            os.close(fd)
        self.check_file(rel, "after fsync")

    def op_read(self):
        rel = self.pick_file()
        if rel is not None:
            self.check_file(rel, "read-back")

    OPS = [
        ("create", 14),
        ("overwrite", 30),
        ("append", 8),
        ("truncate", 6),
        ("rename", 6),
        ("unlink", 8),
        ("mkdir", 3),
        ("rmdir", 2),
        ("link", 4),
        ("symlink", 3),
        ("fsync", 10),
        ("read", 6),
    ]

    def run(self, ops):
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        for i in range(ops):
            name = self.rng.choices(names, weights)[0]
            self.counts[name] = self.counts.get(name, 0) + 1
            try:
                getattr(self, "op_" + name)()
            except OSError as e:
                raise Mismatch("operation %d (%s): %s" % (i, name, e)) from e

    def fsync_all(self):
        """fsync every file and directory: unlike sync(2), fsync reports writeback errors
        (an ENOSPC or EIO the device returned while the page cache still looks right)."""
        for rel in sorted(self.files) + sorted(self.dirs):
            fd = os.open(self.p(rel), os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError as e:
                raise Mismatch("final fsync of %r: %s" % (rel or ".", e)) from e
            finally:
                os.close(fd)

    def manifest(self):
        files = {}
        for rel, ino in self.files.items():
            b = self.inodes[ino]
            files[rel] = [len(b), hashlib.sha256(b).hexdigest()]
        return {"files": files, "links": dict(self.links), "dirs": sorted(d for d in self.dirs if d)}


def scan(root):
    """The tree as it is: the manifest's shape, read from the filesystem."""
    files, links, dirs = {}, {}, []
    for d, subdirs, names in os.walk(root):
        reld = os.path.relpath(d, root)
        reld = "" if reld == "." else reld
        for s in subdirs:
            rel = os.path.join(reld, s)
            if os.path.islink(os.path.join(root, rel)):
                links[rel] = os.readlink(os.path.join(root, rel))
            else:
                dirs.append(rel)
        for n in names:
            rel = os.path.join(reld, n)
            full = os.path.join(root, rel)
            if os.path.islink(full):
                links[rel] = os.readlink(full)
                continue
            h = hashlib.sha256()
            size = 0
            with open(full, "rb") as f:
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    size += len(chunk)
                    h.update(chunk)
            files[rel] = [size, h.hexdigest()]
    return {"files": files, "links": links, "dirs": sorted(dirs)}


def compare(want, got):
    errs = []
    for kind in ("files", "links"):
        for rel in sorted(set(want[kind]) | set(got[kind])):
            w, g = want[kind].get(rel), got[kind].get(rel)
            if w != g:
                errs.append("%s %s: expected %s, found %s" % (kind[:-1], rel, w, g))
    if want["dirs"] != got["dirs"]:
        errs.append("dirs differ: missing %s, extra %s" % (
            sorted(set(want["dirs"]) - set(got["dirs"])), sorted(set(got["dirs"]) - set(want["dirs"]))))
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--ops", type=int, required=True)
    r.add_argument("--manifest", required=True)
    r.add_argument("--max-bytes", type=int, default=192 << 20)
    v = sub.add_parser("verify")
    v.add_argument("dir")
    v.add_argument("--manifest", required=True)
    a = ap.parse_args()

    if a.cmd == "run":
        if a.ops < 0 or a.max_bytes <= 0 or not os.path.isdir(a.dir):
            print("fsworkload: bad arguments (ops >= 0, max-bytes > 0, DIR must exist)", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        m = Model(a.dir, random.Random(a.seed), a.max_bytes)
        try:
            m.run(a.ops)
            m.fsync_all()
            want = m.manifest()
            errs = compare(want, scan(a.dir))
            if errs:
                raise Mismatch("tree differs from the model after the run:\n  " + "\n  ".join(errs[:20]))
        except Mismatch as e:
            print("fsworkload: MISMATCH: %s" % e, file=sys.stderr)
            return 1
        with open(a.manifest, "w") as f:
            json.dump(want, f)
        print(
            "fsworkload: %d ops in %.1f s (seed %d): %s; %d MiB written, %d files (%d MiB live), %d symlinks, %d dirs"
            % (a.ops, time.monotonic() - t0, a.seed,
               " ".join("%s=%d" % kv for kv in sorted(m.counts.items())),
               m.bytes_written >> 20, len(want["files"]), m.live_bytes() >> 20, len(want["links"]), len(want["dirs"]))
        )
        return 0

    with open(a.manifest) as f:
        want = json.load(f)
    errs = compare(want, scan(a.dir))
    if errs:
        print("fsworkload: MISMATCH after remount (%d):\n  %s" % (len(errs), "\n  ".join(errs[:20])), file=sys.stderr)
        return 1
    print("fsworkload: verified %d files, %d symlinks, %d dirs" % (len(want["files"]), len(want["links"]), len(want["dirs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
