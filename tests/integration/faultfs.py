#!/usr/bin/python3
"""faultfs.py ROOT MOUNT TRIGGER FILE: a read-only passthrough FUSE file
system (fusepy) over ROOT at MOUNT that, once the file TRIGGER exists,
answers EIO to every read of FILE (a path under ROOT) that overlaps its
middle 64 KiB: what a failing disk sector looks like to a reader, without
device-mapper. Runs in the foreground until unmounted (fusermount -u or
umount MOUNT)."""
import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations


class FaultFS(Operations):
    def __init__(self, root, trigger, bad):
        self.root, self.trigger, self.bad = root, trigger, bad
        size = os.path.getsize(os.path.join(root, bad))
        self.start, self.end = size // 2 - 32768, size // 2 + 32768

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._p(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in (
            "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
            "st_nlink", "st_size", "st_uid", "st_ino")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._p(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        if (path.lstrip("/") == self.bad and os.path.exists(self.trigger)
                and offset < self.end and offset + size > self.start):
            raise FuseOSError(errno.EIO)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)
        return 0


if __name__ == "__main__":
    root, mount, trigger, bad = sys.argv[1:5]
    FUSE(FaultFS(root, trigger, bad), mount, foreground=True, ro=True,
         allow_other=True, nothreads=False)
