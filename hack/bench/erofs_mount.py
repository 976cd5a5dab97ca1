"""Mounts the EROFS image FILE read-only at DIR straight from the file, with
the new mount API (fsopen/fsconfig/fsmount/move_mount; Linux 6.12 and later
mount a regular file without a loop device), for hack/bench/delivery.sh:
FILE DIR. Exits non-zero, saying which call failed, when the kernel refuses."""
import ctypes, os, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# x86_64 system call numbers.
MOVE_MOUNT, FSOPEN, FSCONFIG, FSMOUNT = 429, 430, 431, 432
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 0, 1, 6
MOUNT_ATTR_RDONLY, MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 1, 4, -100


def call(name, *args):
    rc = libc.syscall(*args)
    if rc < 0:
        err = ctypes.get_errno()
        sys.exit(f"erofs_mount: {name}: {os.strerror(err)}")
    return rc


image, target = sys.argv[1].encode(), sys.argv[2].encode()
fs = call("fsopen", FSOPEN, b"erofs", 0)
call("fsconfig source", FSCONFIG, fs, FSCONFIG_SET_STRING, b"source", image, 0)
call("fsconfig ro", FSCONFIG, fs, FSCONFIG_SET_FLAG, b"ro", None, 0)
call("fsconfig create", FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0)
mnt = call("fsmount", FSMOUNT, fs, 0, MOUNT_ATTR_RDONLY)
call("move_mount", MOVE_MOUNT, mnt, b"", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)
